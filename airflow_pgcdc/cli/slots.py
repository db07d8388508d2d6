"""``pgcdc slot create|drop|list``, ``pgcdc publication ensure`` and ``pgcdc status``.

``status`` is also a library call, :func:`airflow_pgcdc.status.job.slot_status`: the slot's health (lag in bytes
and time, retained WAL, ``wal_status``) and, with a store URL, the last committed window
and the windows not yet merged, read from the committed window manifests under
``{prefix}/{slot}/changes/`` (a window exists if and only if its ``_manifest.json``
does). Merge progress is each Delta table's app transaction: with ``--delta``,
``merged_through`` is the lowest last-merged window over the slot's tables (a table with
none merged: every committed window counts as not merged); without it the store cannot
tell, and ``windows_not_merged`` is ``null`` (unknown) once a window is committed. With
``--delta``, ``delta_tables`` lists every Delta table of the pipeline (history tables
included) with its latest version, the versions its log keeps, its live data files and
bytes, and the last ``pgcdc maintain`` of it (:func:`airflow_pgcdc.status.job.delta_tables`).

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

from airflow_pgcdc.status.job import slot_status

__all__ = [
    "register",
    "run_publication_ensure",
    "run_slot_create",
    "run_slot_drop",
    "run_slot_list",
    "run_status",
]

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
            "--store, the last committed window and, with --delta too, the windows not yet "
            "merged into the Delta tables. Exits 1 if the "
            "slot is lost, about to be (unreserved) or missing. S3 settings come from the "
            "environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...)."
        ),
    )
    add_dsn_argument(p, "of the slot's database")
    p.add_argument("--slot", required=True, help="slot name")
    p.add_argument("--publication", action="append", metavar="NAME",
                   help="also check that this publication exists (repeatable)")
    p.add_argument("--store", "--from", dest="store", metavar="S3_URL",
                   help="the change store, s3://bucket/prefix (--from: its 0.1 name)")
    p.add_argument("--delta", metavar="S3_URL",
                   help="the Delta root (s3://bucket/lake): count windows merged into every table, and "
                        "show each Delta table's version, versions kept in its log, live data files "
                        "and bytes, and its last pgcdc maintain")
    p.add_argument("--max-lag-seconds", type=float, metavar="N",
                   help="with --store and --delta: exit 1 when the Delta tables are more than N seconds behind "
                        "the source (now minus the commit time of the oldest change not merged yet, in the store "
                        "or, as far as the server can tell, in the WAL): an alert for cron or a check")
    p.add_argument("--history", type=float, metavar="DAYS",
                   help="with --store: the windows of the last DAYS days, one line each: rows, bytes, drain "
                        "seconds, how old the oldest change was once stored and once merged (from the merge jobs' "
                        "records, kept 7 days)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="with --history: draw it (lag, rows, drain and merge seconds per window; needs matplotlib)")
    p.add_argument("--prometheus", action="store_true",
                   help="print Prometheus' text format (for node-exporter's textfile folder): the slot's lag in "
                        "bytes and seconds, retained WAL, windows not merged, each table's lag")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run_status)


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


def run_publication_ensure(args: argparse.Namespace) -> int:
    import psycopg

    from airflow_pgcdc.pg.publications import ensure_publication, set_replica_identity_full

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


def _partitions_line(t: dict[str, Any]) -> str:
    what = []
    if t["attached"]:
        what.append(f"attached {', '.join(t['attached'])}")
    if t["detached"]:
        what.append(f"detached or dropped {', '.join(t['detached'])}")
    return (f"{t['table']}: {'; '.join(what)} since its copy at {t['copied_at']}: the rows they held then "
            f"are not in the stream, its Delta table differs; run {t['hint']}")


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
        not_merged = store["windows_not_merged"]
        lines.append(("windows", f"{store['windows_committed']} committed, "
                      + ("how many merged: unknown without --delta" if not_merged is None
                         else f"{not_merged} not yet merged")
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
        fresh = store.get("freshness")
        if fresh:
            stale = sorted(((t["lag_seconds"], n) for n, t in fresh["tables"].items() if t["lag_seconds"]),
                           reverse=True)
            lines.append(("freshness", f"{'at least ' if not fresh['lag_known'] else ''}"
                          f"{_human_seconds(fresh['lag_seconds'])} behind the source"
                          + (f" (oldest change waiting in the store: {stale[0][1]}, {_human_seconds(stale[0][0])}"
                             f"; {len(stale)} table(s) waiting)" if stale else "; every table merged")))
        for t in store.get("delta_tables") or ():
            lines.append(("delta table", _delta_table_line(t)))
    if status["problem"]:
        lines.append(("PROBLEM", status["problem"]["message"]))
        if status["problem"].get("hint"):
            lines.append(("hint", status["problem"]["hint"]))
    width = max(len(k) for k, _ in lines)
    for k, v in lines:
        print(f"{k.ljust(width)}  {v}")


def _print_history(rows: list[dict[str, Any]]) -> None:
    print(f"\n{'window':>8}  {'ended (UTC)':19}  {'rows':>10}  {'bytes':>9}  {'drain':>8}  {'stored at':>10}  "
          f"{'in Delta at':>11}  merge job")
    for r in rows:
        ended = (r["finished_at"] or "")[:19].replace("T", " ")
        print(f"{r['window_seq']:>8}  {ended:19}  {r['rows']:>10,}  {_human_bytes(r['bytes']):>9}  "
              f"{_human_seconds(r['drain_seconds']):>8}  {_human_seconds(r['stored_lag_seconds']):>10}  "
              f"{_human_seconds(r['lag_seconds']) if r['lag_seconds'] is not None else 'not yet':>11}  "
              f"{_human_seconds(r['merge_seconds']) if r['merge_seconds'] is not None else '-'}")
    if not rows:
        print("no window committed in that time")


def run_status(args: argparse.Namespace) -> int:
    status = slot_status(args.dsn, args.slot, publications=args.publication, store=args.store,
                         delta=args.delta)
    if args.history is not None or args.plot:
        from airflow_pgcdc.cli import error

        if not args.store or args.history is None or args.history <= 0:
            error("--history DAYS (more than 0) needs --store; --plot needs --history",
                  "e.g. pgcdc status --slot S --store s3://bucket/cdc --history 1 --plot lag.png")
            return 1
        from airflow_pgcdc.status.history import plot_history, window_history
        from airflow_pgcdc.store.s3 import make_s3_client

        status["history"] = window_history(make_s3_client(), args.store, args.slot, days=args.history)
        if args.plot:
            plot_history(status["history"], args.plot, title=f"pgcdc slot {args.slot}: last {args.history:g} days")
    if args.prometheus:
        from airflow_pgcdc.status.prometheus import prometheus_text

        sys.stdout.write(prometheus_text(status))
    elif args.json:
        _print_json(status)
    else:
        _print_status(status)
        if status.get("history") is not None:
            _print_history(status["history"])
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
    if status.get("store", {}).get("slot_vs_store") == "store_empty":
        error(
            f"{status['store']['store']} holds no snapshot and no window of slot {args.slot}: a mistyped "
            "store, or a pipeline not started",
            "check the store URL; a drain refuses such a store unless --start-without-snapshot says "
            "to start it on purpose",
        )
        return 1
    if args.max_lag_seconds is not None:
        fresh = status.get("store", {}).get("freshness")
        if fresh is None:
            error("--max-lag-seconds needs --store and --delta", "give the pipeline's store and Delta root")
            return 1
        late = {n: t["lag_seconds"] for n, t in fresh["tables"].items() if t["lag_seconds"] > args.max_lag_seconds}
        if fresh["lag_seconds"] > args.max_lag_seconds:
            error(f"the pipeline is {fresh['lag_seconds']:,.0f} s behind the source, past --max-lag-seconds "
                  f"{args.max_lag_seconds:g}" + (": " + ", ".join(f"{n} {s:,.0f} s" for n, s in sorted(late.items()))
                                                  if late else " (changes waiting in the WAL)"),
                  "run the drain and the merge (or see why they fail: pgcdc status shows their last windows)")
            return 1
    if status.get("store", {}).get("slot_vs_store") == "slot_ahead":
        error(
            "the slot was acknowledged beyond the store's last window: the changes between "
            "them are not in the store",
            f"pgcdc recover --slot {args.slot} --store {status['store']['store']} (copies every table into the "
            "existing Delta tables; the pipeline then goes on), or re-snapshot with a new slot",
        )
        return 1
    return 0

