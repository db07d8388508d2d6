"""``pgcdc slot create|drop|list``, ``pgcdc publication ensure`` and ``pgcdc status``.

``status`` is also a library call, :func:`slot_status`: the slot's health (lag in bytes
and time, retained WAL, ``wal_status``) and, with a store URL, the last committed window
and the windows not yet merged, read from the committed window manifests under
``{prefix}/{slot}/changes/`` (a window exists if and only if its ``_manifest.json``
does). Merge progress is each Delta table's app transaction: with ``--delta``,
``merged_through`` is the lowest last-merged window over the slot's tables; without it
(or when a table has none merged), every committed window counts as not merged. With
``--delta``, ``delta_tables`` lists every Delta table of the pipeline (history tables
included) with its latest version, the versions its log keeps, its live data files and
bytes, and the last ``pgcdc maintain`` of it (:func:`delta_tables`).

Tables that left the pipeline (dropped, or let go with ``pgcdc drain --forget-table``)
are listed one by one (``left_pipeline``): a table the pipeline knew (the snapshot, a
resync, the merge's tables index, the newest window) that the newest window's
``pipeline_tables`` no longer holds. ``slot_status`` tells dropped from forgotten on the
server (``to_regclass``); with ``--delta`` each shows its last merged window, and such
tables do not hold ``merged_through`` back (they get no commit again).

A partitioned table copied through its root (``publish_via_partition_root = true``): its
copy records its leaves; ``partitions_changed`` lists partitions attached (after their
creation) or detached/dropped since, whose rows PostgreSQL never streams, with the
``pgcdc resync`` to run (exit 1).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

# -- argument helpers ---------------------------------------------------------------


def _split_unquoted(text: str, sep: str, maxsplit: int = -1) -> list[str]:
    """Split on ``sep`` outside double quotes (quotes are kept for the name parser)."""
    parts, cur, quoted = [], [], False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        if ch == sep and not quoted and (maxsplit < 0 or len(parts) < maxsplit):
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur))
    return parts


def _unquote(name: str) -> str:
    name = name.strip()
    if len(name) >= 2 and name[0] == name[-1] == '"':
        return name[1:-1].replace('""', '"')
    return name


def _table_option(values: list[str] | None, what: str, parser: argparse.ArgumentParser) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values or ():
        parts = _split_unquoted(value, "=", maxsplit=1)
        if len(parts) != 2 or not parts[0] or not parts[1]:
            parser.error(f"{what} takes SCHEMA.TABLE=VALUE, not {value!r}")
        out[parts[0]] = parts[1]
    return out


def _human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit} ({n} B)"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def _human_seconds(s: float | None) -> str:
    if s is None:
        return "unknown"
    s = float(s)
    if s < 120:
        return f"{s:.1f}s"
    if s < 7200:
        return f"{s / 60:.1f}min"
    return f"{s / 3600:.1f}h"


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


# -- registration -------------------------------------------------------------------


def register(subparsers) -> None:
    from airflow_pgcdc.cli import add_dsn_argument

    slot = subparsers.add_parser(
        "slot", help="create, drop or list replication slots",
        description="Manage logical replication slots (the role needs REPLICATION).",
    )
    slot_sub = slot.add_subparsers(dest="slot_command", metavar="ACTION", title="actions")
    slot_sub.required = True

    p = slot_sub.add_parser(
        "create", help="create a logical slot (no snapshot)",
        description=(
            "Create a logical replication slot without an exported snapshot (use "
            "`pgcdc snapshot` to create a slot together with the initial copy). Prints the "
            "slot and its consistent point as JSON."
        ),
    )
    add_dsn_argument(p, "of the slot's database")
    p.add_argument("--slot", required=True, help="slot name ([a-z0-9_], at most 63 bytes)")
    p.add_argument("--plugin", default="pgoutput", help="output plugin (default pgoutput)")
    p.add_argument("--two-phase", action="store_true", help="decode prepared transactions at PREPARE")
    p.add_argument("--failover", action="store_true", help="a failover slot, synced to standbys (PostgreSQL 17+)")
    p.set_defaults(handler=run_slot_create)

    p = slot_sub.add_parser("drop", help="drop a slot", description="Drop a replication slot.")
    add_dsn_argument(p, 'of the database')
    p.add_argument("--slot", required=True, help="slot name")
    p.add_argument("--no-wait", dest="wait", action="store_false",
                   help="fail if the slot is in use (default: wait until it is released)")
    p.add_argument("--if-exists", action="store_true", help="a missing slot is not an error")
    p.set_defaults(handler=run_slot_drop)

    p = slot_sub.add_parser("list", help="list the cluster's slots with their lag",
                            description="List every replication slot with its lag and WAL status.")
    add_dsn_argument(p, 'of the database')
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run_slot_list)

    pub = subparsers.add_parser("publication", help="ensure a publication",
                                description="Manage publications.")
    pub_sub = pub.add_subparsers(dest="publication_command", metavar="ACTION", title="actions")
    pub_sub.required = True
    p = pub_sub.add_parser(
        "ensure", help="create a publication or add missing tables (never drops)",
        description=(
            "Make a publication publish at least the given tables (or all tables): create it "
            "when missing, add the tables it lacks. Nothing is ever dropped or narrowed; a "
            "table published already with another column list or row filter is reported and "
            "left alone. Column lists and row filters need PostgreSQL 15+; a row filter is an "
            "SQL expression used as given. Prints what was done as JSON."
        ),
    )
    add_dsn_argument(p, 'of the database')
    p.add_argument("--name", required=True, help="publication name (any characters; quoted)")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--tables", nargs="+", metavar="SCHEMA.TABLE",
                       help='tables; "double quotes" protect dots and case; no schema means public')
    group.add_argument("--all-tables", action="store_true", help="FOR ALL TABLES")
    p.add_argument("--columns", action="append", metavar="SCHEMA.TABLE=COL,COL",
                   help="column list of a table (repeatable; 15+)")
    p.add_argument("--row-filter", action="append", metavar="SCHEMA.TABLE=EXPR",
                   help="row filter of a table (repeatable; 15+)")
    p.add_argument("--replica-identity-full", action="store_true",
                   help="also set REPLICA IDENTITY FULL on the tables")
    p.set_defaults(handler=run_publication_ensure, _parser=p)

    p = subparsers.add_parser(
        "status", help="a slot's lag, retained WAL, health and store progress",
        description=(
            "Show a slot's lag (bytes of WAL not yet acknowledged, and how long the oldest "
            "change has waited when the server can tell), retained WAL, wal_status and, with "
            "--from, the last committed window and the windows not yet merged. Exits 1 if the "
            "slot is lost, about to be (unreserved) or missing. S3 settings come from the "
            "environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...)."
        ),
    )
    add_dsn_argument(p, "of the slot's database")
    p.add_argument("--slot", required=True, help="slot name")
    p.add_argument("--publication", help="also check that this publication exists")
    p.add_argument("--from", dest="store", metavar="S3_URL", help="the store, s3://bucket/prefix")
    p.add_argument("--delta", metavar="S3_URL",
                   help="the Delta root (s3://bucket/lake): count windows merged into every table, and "
                        "show each Delta table's version, versions kept in its log, live data files "
                        "and bytes, and its last pgcdc maintain")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run_status)


# -- slot ---------------------------------------------------------------------------


def run_slot_create(args: argparse.Namespace) -> int:
    from airflow_pgcdc.pg.slots import create_slot

    created = create_slot(
        args.dsn, args.slot, plugin=args.plugin, two_phase=args.two_phase, failover=args.failover
    )
    _print_json(created.to_dict())
    return 0


def run_slot_drop(args: argparse.Namespace) -> int:
    from airflow_pgcdc.pg.slots import drop_slot

    dropped = drop_slot(args.dsn, args.slot, wait=args.wait, missing_ok=args.if_exists)
    _print_json({"slot": args.slot, "dropped": dropped})
    return 0


def run_slot_list(args: argparse.Namespace) -> int:
    from airflow_pgcdc.pg.slots import list_slots

    slots = list_slots(args.dsn)
    if args.json:
        _print_json([s.to_dict() for s in slots])
        return 0
    header = ("slot", "type", "plugin", "database", "active", "wal_status", "pending", "retained")
    rows = [
        (
            s.slot, s.slot_type or "", s.plugin or "", s.database or "",
            f"pid {s.active_pid}" if s.active else "no", s.wal_status or "",
            "-" if s.pending_bytes is None else str(s.pending_bytes),
            "-" if s.retained_bytes is None else str(s.retained_bytes),
        )
        for s in slots
    ]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    return 0


# -- publication ----------------------------------------------------------------------


def run_publication_ensure(args: argparse.Namespace) -> int:
    import psycopg

    from airflow_pgcdc.pg.slots import ensure_publication, set_replica_identity_full

    parser = args._parser
    columns = {
        table: [_unquote(c) for c in _split_unquoted(cols, ",")]
        for table, cols in _table_option(args.columns, "--columns", parser).items()
    }
    filters = _table_option(args.row_filter, "--row-filter", parser)
    if args.all_tables and (columns or filters or args.replica_identity_full):
        parser.error("--columns, --row-filter and --replica-identity-full need --tables")
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        result = ensure_publication(
            conn, args.name, args.tables, all_tables=args.all_tables,
            column_lists=columns or None, row_filters=filters or None,
        )
        out = result.to_dict()
        if args.replica_identity_full:
            out["replica_identity_full"] = set_replica_identity_full(conn, args.tables)
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    _print_json(out)
    return 0


# -- status ---------------------------------------------------------------------------


def committed_windows(client: Any, store_url: str, slot: str, delta_url: str | None = None) -> dict[str, Any]:
    """What the store holds for ``slot``: ``windows_committed``, ``last_window`` (the
    newest committed manifest's ``window_seq``, ``start_lsn``, ``end_lsn`` and the rest of
    its top-level scalar fields), ``uncommitted_folders`` (window folders without a
    manifest: a window being written, or one a crashed drain left), ``merged_through``
    and ``windows_not_merged``.

    Windows are written one at a time, in order, so every window folder before the
    newest committed one is committed: the manifests are checked from the newest back.
    """
    from airflow_pgcdc.store import s3 as s3store
    from airflow_pgcdc.store.layout import Layout, LayoutError

    layout = Layout.parse(store_url)
    prefix = layout.changes_prefix(slot)
    seqs: list[int] = []
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=layout.bucket, Prefix=prefix, Delimiter="/"):
        for cp in page.get("CommonPrefixes", ()) or ():
            folder = cp["Prefix"][len(prefix):].rstrip("/")
            try:
                seqs.append(layout.parse_window_key(slot, prefix + folder + "/"))
            except LayoutError:
                continue  # not a window folder
    seqs.sort()
    last = None
    uncommitted: list[int] = []
    for seq in reversed(seqs):
        key = layout.window_manifest(slot, seq)
        if s3store.exists(client, layout.bucket, key):
            doc = s3store.get_json(client, layout.bucket, key)
            last = {"window_seq": seq, "manifest": layout.url(key)}
            if isinstance(doc, dict):
                for name, value in doc.items():
                    if name not in last and (value is None or isinstance(value, (str, int, float, bool))):
                        last[name] = value
            break
        uncommitted.append(seq)
    committed = 0 if last is None else sum(1 for s in seqs if s <= last["window_seq"])
    left: list[dict[str, Any]] = []
    without_copy: list[tuple[str, str]] = []
    if last is not None:
        left = _left_pipeline(client, layout, slot, doc)
        without_copy = _without_copy(client, layout, slot, doc)
    gone = {t["table"] for t in left}
    merged_through = None
    per_table = None
    if delta_url and last is not None:
        per_table = _merged_per_table(client, layout, slot, delta_url, last["window_seq"],
                                      extra=[(t["schema"], t["name"]) for t in left])
        for t in left:
            t["merged_through"] = per_table.get(t["table"])
            t["delta_url"] = _delta_url(delta_url, t["schema"], t["name"])
        done = [w for name, w in per_table.items() if name not in gone]
        merged_through = None if not done or None in done else min(done)
    not_merged = committed if merged_through is None else max(last["window_seq"] - merged_through, 0)
    out = {
        "store": layout.root.url,
        "windows_committed": committed,
        "last_window": last,
        "uncommitted_folders": sorted(uncommitted),
        "merged_through": merged_through,
        "windows_not_merged": not_merged,
    }
    if per_table is not None:
        out["merged_per_table"] = per_table
    if delta_url:
        out["delta_tables"] = delta_tables(client, layout, slot, delta_url, last_seq=(last or {}).get("window_seq"),
                                           extra=[(t["schema"], t["name"]) for t in left])
    out["left_pipeline"] = left
    out["without_copy"] = [f"{a}.{b}" for a, b in without_copy]
    out["without_copy_hint"] = None
    if without_copy:
        import shlex

        from airflow_pgcdc.protocol.quoting import quote_qualified

        out["without_copy_hint"] = "pgcdc resync --tables " + " ".join(
            shlex.quote(quote_qualified(a, b)) for a, b in without_copy)
    return out


def _without_copy(client: Any, layout: Any, slot: str, newest: Any) -> list[tuple[str, str]]:
    """The tables the newest window's ``pipeline_tables`` holds that neither the snapshot nor
    a resync copied (added to the publication, or a partition attached to a root published
    per leaf, not resynced yet): their Delta table would miss the rows they held then; the
    merge refuses their changes (``NeedsSnapshot``) until ``pgcdc resync``."""
    from airflow_pgcdc.store.manifest import committed_snapshot
    from airflow_pgcdc.store.resyncs import committed_resyncs

    if not isinstance(newest, dict) or newest.get("pipeline_tables") is None:
        return []
    copied: set[tuple[str, str]] = set()
    snapshot = committed_snapshot(client, layout, slot)
    if snapshot is None:
        return []  # a store without a snapshot: nothing to compare with
    copied |= {(t.schema, t.table) for t in snapshot.tables}
    for r in committed_resyncs(client, layout, slot):
        copied |= {(t.schema, t.table) for t in r.manifest.tables}
    return sorted({(str(a), str(b)) for a, b in newest["pipeline_tables"]} - copied)


def _delta_url(delta_url: str, schema: str, table: str) -> str:
    from airflow_pgcdc.merge.plan import delta_table_url

    return delta_table_url(delta_url, schema, table)


def _left_pipeline(client: Any, layout: Any, slot: str, newest: Any) -> list[dict[str, Any]]:
    """The tables the pipeline knew that the newest committed window (``newest``, its
    manifest document) no longer covers: ``[{table, schema, name, last_window}]``, where
    ``last_window`` is the last window holding its changes as far as the merge's tables
    index knows (``None``: not known)."""
    from airflow_pgcdc.store import s3 as s3store
    from airflow_pgcdc.store.manifest import committed_snapshot
    from airflow_pgcdc.store.resyncs import committed_resyncs

    if not isinstance(newest, dict) or newest.get("pipeline_tables") is None:
        return []  # a window written before pipeline_tables existed: nothing to tell
    pipeline = {(str(a), str(b)) for a, b in newest["pipeline_tables"]}
    known: dict[tuple[str, str], int | None] = {}
    snapshot = committed_snapshot(client, layout, slot)
    for t in snapshot.tables if snapshot is not None else ():
        known[(t.schema, t.table)] = None
    for r in committed_resyncs(client, layout, slot):
        for t in r.manifest.tables:
            known.setdefault((t.schema, t.table), None)
    try:
        index = s3store.get_json(client, layout.bucket, layout.merge_tables_index(slot))
        for t in index.get("tables", ()) if isinstance(index, dict) else ():
            w = t.get("last_window")
            known[(str(t["schema"]), str(t["table"]))] = w if isinstance(w, int) and w >= 0 else None
    except s3store.ObjectNotFound:
        pass
    except Exception:  # noqa: BLE001 - a cache: never fail status on it
        pass
    for t in newest.get("tables", ()) or ():
        if isinstance(t, dict) and "schema" in t and "table" in t:
            known[(str(t["schema"]), str(t["table"]))] = int(newest["window_seq"])
    return [
        {"table": f"{schema}.{table}", "schema": schema, "name": table, "last_window": w}
        for (schema, table), w in sorted(known.items()) if (schema, table) not in pipeline
    ]


HISTORY_KINDS = (("", "table"), ("__changelog", "changelog"), ("__scd2", "scd2"))  # merge/job.py's suffixes


def _pipeline_tables(client: Any, layout: Any, slot: str, last_seq: int | None,
                     extra: list[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """Every table the pipeline knows: the snapshot's, the resyncs', the merge's tables
    index, the newest window's and ``extra``, in that order, once each."""
    from airflow_pgcdc.store import s3 as s3store
    from airflow_pgcdc.store.manifest import committed_snapshot
    from airflow_pgcdc.store.resyncs import committed_resyncs
    from airflow_pgcdc.store.window import read_window

    tables: dict[tuple[str, str], None] = {}
    snapshot = committed_snapshot(client, layout, slot)
    for t in snapshot.tables if snapshot is not None else ():
        tables[(t.schema, t.table)] = None
    for r in committed_resyncs(client, layout, slot):
        for t in r.manifest.tables:
            tables[(t.schema, t.table)] = None
    try:
        index = s3store.get_json(client, layout.bucket, layout.merge_tables_index(slot))
        for t in index.get("tables", ()) if isinstance(index, dict) else ():
            tables[(str(t["schema"]), str(t["table"]))] = None
    except Exception:  # noqa: BLE001 - a cache: never fail status on it
        pass
    if last_seq is not None:
        for t in read_window(client, layout, slot, last_seq).tables:
            tables[(t["schema"], t["table"])] = None
    for t in extra:
        tables[t] = None
    return list(tables)


def delta_tables(client: Any, layout: Any, slot: str, delta_url: str, *, last_seq: int | None = None,
                 extra: list[tuple[str, str]] = ()) -> list[dict[str, Any]]:
    """Per Delta table of the pipeline (each source table's, and its ``__changelog`` /
    ``__scd2`` history tables when they exist), whichever engine wrote it: ``version``,
    ``versions_kept``, ``oldest_version``, ``checkpoint_version``, live data ``files`` and
    their ``bytes``, ``log_bytes``, ``stored_bytes``
    (:func:`airflow_pgcdc.maintain.delta.table_figures`) and ``last_maintenance``: the record
    ``pgcdc maintain`` wrote for it (``{slot}/maintain/tables/``), or None. A source table
    without a Delta table yet is listed with ``exists: false``; one that cannot be read
    gets ``error``."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    from airflow_pgcdc.maintain.delta import table_figures
    from airflow_pgcdc.maintain.store import last_maintenance
    from airflow_pgcdc.store.s3 import S3Settings, delta_storage_options, settings_of

    storage = delta_storage_options(settings_of(client) or S3Settings.from_env())
    out: list[dict[str, Any]] = []
    for schema, table in _pipeline_tables(client, layout, slot, last_seq, extra):
        base = _delta_url(delta_url, schema, table)
        for suffix, kind in HISTORY_KINDS:
            url = base + suffix
            entry: dict[str, Any] = {"table": f"{schema}.{table}{suffix}", "kind": kind, "delta_url": url}
            try:
                dt = DeltaTable(url, storage_options=storage)
            except TableNotFoundError:
                if not suffix:
                    out.append({**entry, "exists": False})
                continue
            entry["exists"] = True
            try:
                entry.update(table_figures(url, storage_options=storage, client=client, dt=dt))
            except Exception as exc:  # noqa: BLE001 - one table's trouble is reported, status goes on
                entry["error"] = f"{type(exc).__name__}: {exc}"
            try:
                entry["last_maintenance"] = last_maintenance(client, layout, slot, url)
            except Exception as exc:  # noqa: BLE001
                entry["last_maintenance"] = None
                entry["error"] = f"{type(exc).__name__}: {exc}"
            out.append(entry)
    return out


def _merged_per_table(client: Any, layout: Any, slot: str, delta_url: str, last_seq: int,
                      extra: list[tuple[str, str]] = ()) -> dict:
    from airflow_pgcdc.merge.deltars import merge_progress
    from airflow_pgcdc.store.manifest import committed_snapshot
    from airflow_pgcdc.store.s3 import S3Settings, delta_storage_options
    from airflow_pgcdc.store.window import read_window

    tables: dict[tuple[str, str], None] = {}
    snapshot = committed_snapshot(client, layout, slot)
    for t in snapshot.tables if snapshot is not None else ():
        tables[(t.schema, t.table)] = None
    for t in read_window(client, layout, slot, last_seq).tables:
        tables[(t["schema"], t["table"])] = None
    for t in extra:
        tables[t] = None
    return merge_progress(delta_url, slot, list(tables),
                          storage_options=delta_storage_options(S3Settings.from_env()))


def slot_status(
    dsn: str,
    slot: str,
    *,
    publication: str | None = None,
    store_url: str | None = None,
    s3_client: Any = None,
    delta_url: str | None = None,
) -> dict[str, Any]:
    """The status of ``slot`` (and of its windows in the store at ``store_url``).

    ``problem`` is None when the slot can be drained, else ``{"error", "message", "hint"}``
    (lost, unreserved, mismatched, publication missing); an active slot (a drain running)
    is not a problem: ``slot.active`` and ``slot.active_pid`` show it. A missing slot raises
    :class:`~airflow_pgcdc.pg.slots.SlotMissing`.
    """
    from airflow_pgcdc.pg.slots import (
        PublicationMissing,
        SlotError,
        SlotMissing,
        check_slot_usable,
        slot_health,
    )
    from airflow_pgcdc.protocol.lsn import LSN

    health = slot_health(dsn, slot, publication=publication)
    problem = None
    try:
        check_slot_usable(health, plugin=None, allow_active=True)  # active: a drain is running
    except SlotMissing:
        raise
    except (SlotError, PublicationMissing) as e:
        problem = {"error": e.kind, "message": str(e), "hint": getattr(e, "hint", None)}
    out: dict[str, Any] = {"slot": health.to_dict(), "problem": problem}
    if store_url:
        if s3_client is None:
            from airflow_pgcdc.store.s3 import S3Settings, make_s3_client

            s3_client = make_s3_client(S3Settings.from_env())
        store = committed_windows(s3_client, store_url, slot, delta_url)
        last = store["last_window"]
        agreement = None
        if last and isinstance(last.get("end_lsn"), str) and health.confirmed_flush_lsn is not None:
            end = LSN.parse(last["end_lsn"])
            if end == health.confirmed_flush_lsn:
                agreement = "in_sync"
            elif end > health.confirmed_flush_lsn:
                agreement = "ack_pending"  # the last window's ack was lost: the next drain sends it
            else:
                agreement = "slot_ahead"  # acknowledged beyond the store: changes are missing
        store["slot_vs_store"] = agreement
        if store["left_pipeline"]:
            _why_left(dsn, store["left_pipeline"])
        store["partitions_changed"] = partition_changes(dsn, s3_client, store_url, slot)
        out["store"] = store
    return out


_LEAVES_NOW_SQL = """
SELECT n.nspname::text, c.relname::text,
       NOT (i.xmin = COALESCE(ty.xmin, c.xmin)) AS attached_later
FROM pg_catalog.pg_partition_tree(%s::oid::regclass) t
JOIN pg_catalog.pg_class c ON c.oid = t.relid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_catalog.pg_type ty ON ty.oid = c.reltype
LEFT JOIN pg_catalog.pg_inherits i ON i.inhrelid = c.oid
WHERE t.isleaf
"""


def partition_changes(dsn: str, client: Any, store_url: str, slot: str) -> list[dict[str, Any]]:
    """Partitioned tables copied through their root (a snapshot or resync records the leaves
    its copy holds) whose partitions changed since: leaves ATTACHed after they were created
    (the rows they held then were never streamed), and leaves DETACHed or dropped (their
    rows left the root without a delete in the stream). A leaf created as a partition
    (``CREATE TABLE … PARTITION OF``, created and attached in one transaction: its rows
    were all streamed) is not reported. Each: ``{table, copied_at, attached, detached, hint}``."""
    import shlex

    import psycopg

    from airflow_pgcdc.protocol.quoting import quote_qualified
    from airflow_pgcdc.store.layout import Layout
    from airflow_pgcdc.store.manifest import committed_snapshot
    from airflow_pgcdc.store.resyncs import committed_resyncs

    layout = Layout.parse(store_url)
    copies: dict[tuple[str, str], tuple[Any, str]] = {}
    snapshot = committed_snapshot(client, layout, slot)
    for t in snapshot.tables if snapshot is not None else ():
        copies[(t.schema, t.table)] = (t, snapshot.consistent_point)
    for r in committed_resyncs(client, layout, slot):  # oldest first: the newest copy wins
        for t in r.manifest.tables:
            copies[(t.schema, t.table)] = (t, r.manifest.consistent_point)
    if not any(isinstance(t.extra.get("partitions"), list) for t, _ in copies.values()):
        return []  # nothing copied through a root (the usual case)
    out = []
    with psycopg.connect(dsn, autocommit=True, application_name="pgcdc-status") as conn:
        for (schema, table), (entry, copied_at) in sorted(copies.items()):
            recorded = entry.extra.get("partitions")
            if not isinstance(recorded, list):
                continue
            row = conn.execute(
                "SELECT c.oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relname = %s AND c.relkind = 'p'", (schema, table)).fetchone()
            if row is None:
                continue  # dropped, or no longer partitioned: not this check's business
            then = {(str(a), str(b)) for a, b in recorded}
            now = {(a, b): later for a, b, later in conn.execute(_LEAVES_NOW_SQL, (row[0],)).fetchall()}
            attached = sorted(k for k, later in now.items() if k not in then and later)
            detached = sorted(then - set(now))
            if attached or detached:
                out.append({
                    "table": f"{schema}.{table}", "copied_at": copied_at,
                    "attached": [f"{a}.{b}" for a, b in attached], "detached": [f"{a}.{b}" for a, b in detached],
                    "hint": f"pgcdc resync --tables {shlex.quote(quote_qualified(schema, table))}",
                })
    return out


def _partitions_line(t: dict[str, Any]) -> str:
    what = []
    if t["attached"]:
        what.append(f"attached {', '.join(t['attached'])}")
    if t["detached"]:
        what.append(f"detached or dropped {', '.join(t['detached'])}")
    return (f"{t['table']}: {'; '.join(what)} since its copy at {t['copied_at']}: the rows they held then "
            f"are not in the stream, its Delta table differs; run {t['hint']}")


def _why_left(dsn: str, left: list[dict[str, Any]]) -> None:
    """Set ``reason`` on each table of ``left``: ``dropped`` (no such table on the server)
    or ``forgotten`` (it exists: let go with ``--forget-table``)."""
    import psycopg

    from airflow_pgcdc.protocol.quoting import quote_qualified

    with psycopg.connect(dsn, autocommit=True) as conn:
        for t in left:
            gone = conn.execute("SELECT to_regclass(%s) IS NULL", (quote_qualified(t["schema"], t["name"]),)).fetchone()[0]
            t["reason"] = "dropped" if gone else "forgotten"


def _left_line(t: dict[str, Any]) -> str:
    why = {"dropped": "dropped", "forgotten": "out of the publication (--forget-table)"}.get(t.get("reason"), "left")
    text = f"{t['table']}: {why}; its Delta table keeps its last state"
    if "merged_through" in t:
        text += (", nothing merged" if t["merged_through"] is None
                 else f", merged through window {t['merged_through']}")
    if t.get("last_window") is not None:
        text += f" (last changes in window {t['last_window']})"
    return text


def _maintenance_text(m: dict[str, Any] | None) -> str:
    if not m:
        return "never maintained"
    when = m.get("finished_at") or m.get("started_at")
    if m.get("action") == "failed":
        return f"last maintain {when} FAILED: {m.get('error')}"
    what = []
    c = m.get("compaction") or {}
    if "files_removed" in c:
        what.append(f"{c.get('mode', 'compact')} {c['files_removed']} -> {c.get('files_added', 0)} files")
    v = m.get("vacuum") or {}
    if "files" in v:
        what.append(f"vacuum {v['files']} files, {_human_bytes(v.get('bytes'))} "
                    f"(retention {v.get('retention_hours')} h)")
    lg = m.get("log") or {}
    if "checkpoint_version" in lg:
        what.append(f"checkpoint at v{lg['checkpoint_version']}, {lg.get('log_files_removed', 0)} log files removed")
    return f"last maintain {when}: " + "; ".join(what)


def _delta_table_line(t: dict[str, Any]) -> str:
    if not t.get("exists"):
        return f"{t['table']}: no Delta table yet"
    if "version" not in t:
        return f"{t['table']}: cannot be read: {t.get('error')}"
    return (f"{t['table']}: version {t['version']} ({t['versions_kept']} versions in the log from "
            f"{t['oldest_version']}), {t['files']} data files, {_human_bytes(t['bytes'])} "
            f"(stored {_human_bytes(t['stored_bytes'])}); {_maintenance_text(t.get('last_maintenance'))}")


def _print_status(status: dict[str, Any]) -> None:
    s = status["slot"]
    state = f"active (pid {s['active_pid']})" if s["active"] else "inactive"
    lines = [
        ("slot", f"{s['slot']} ({s['slot_type']}, plugin {s['plugin']}, database {s['database']}, {state})"),
        ("wal_status", f"{s['wal_status']}"
         + ("" if s["safe_wal_size"] is None else f" (safe_wal_size {_human_bytes(s['safe_wal_size'])})")),
        ("lag", f"{_human_bytes(s['pending_bytes'])} not acknowledged; oldest change waiting "
         f"{'at least ' if s['pending_age_seconds'] else ''}{_human_seconds(s['pending_age_seconds'])}"),
        ("confirmed_flush", f"{s['confirmed_flush_lsn']} (server at {s['current_lsn']})"),
        ("retained WAL", f"{_human_bytes(s['retained_bytes'])} since restart_lsn {s['restart_lsn']}"),
    ]
    if s.get("publication"):
        lines.append(("publication", f"{s['publication']} ({'exists' if s['publication_exists'] else 'MISSING'})"))
    store = status.get("store")
    if store:
        last = store["last_window"]
        lines.append(("store", store["store"]))
        lines.append((
            "last window",
            "none" if not last
            else f"{last['window_seq']} [{last.get('start_lsn')}, {last.get('end_lsn')})",
        ))
        merged = store.get("merged_through")
        lines.append(("windows", f"{store['windows_committed']} committed, "
                      f"{store['windows_not_merged']} not yet merged"
                      + (f" (merged through window {merged})" if merged is not None else "")))
        if store["uncommitted_folders"]:
            lines.append(("uncommitted", ", ".join(map(str, store["uncommitted_folders"]))
                          + " (being written, or left by a crashed drain)"))
        if store.get("slot_vs_store"):
            lines.append(("slot vs store", store["slot_vs_store"]))
        for t in store.get("left_pipeline") or ():
            lines.append(("left pipeline", _left_line(t)))
        if store.get("without_copy"):
            lines.append(("NO COPY", ", ".join(store["without_copy"]) + ": in the pipeline but never copied "
                          "(their rows from before are not in Delta; the merge refuses their changes): run "
                          + store["without_copy_hint"]))
        for t in store.get("partitions_changed") or ():
            lines.append(("PARTITIONS", _partitions_line(t)))
        for t in store.get("delta_tables") or ():
            lines.append(("delta table", _delta_table_line(t)))
    if status["problem"]:
        lines.append(("PROBLEM", status["problem"]["message"]))
        if status["problem"].get("hint"):
            lines.append(("hint", status["problem"]["hint"]))
    width = max(len(k) for k, _ in lines)
    for k, v in lines:
        print(f"{k.ljust(width)}  {v}")


def run_status(args: argparse.Namespace) -> int:
    status = slot_status(args.dsn, args.slot, publication=args.publication, store_url=args.store,
                         delta_url=args.delta)
    if args.json:
        _print_json(status)
    else:
        _print_status(status)
    from airflow_pgcdc.cli import error

    problem = status["problem"]
    if problem and problem["error"] in ("slot_lost", "slot_mismatch", "publication_missing"):
        error(problem["message"], problem.get("hint"))
        return 1
    changed = status.get("store", {}).get("partitions_changed")
    if changed:
        error(
            "partitions attached, detached or dropped since the copy of "
            + ", ".join(t["table"] for t in changed) + ": their rows are not in the stream",
            "; ".join(t["hint"] for t in changed),
        )
        return 1
    if status.get("store", {}).get("slot_vs_store") == "slot_ahead":
        error(
            "the slot was acknowledged beyond the store's last window: the changes between "
            "them are not in the store",
            "re-snapshot with a new slot",
        )
        return 1
    return 0
