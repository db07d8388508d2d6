"""The pipeline's state as ``pgcdc status`` shows it, as library calls: :func:`slot_status`
(the slot's health and, with a store URL, the windows committed and merged),
:func:`committed_windows`, :func:`delta_tables` (each Delta table's figures and last
maintenance) and :func:`partition_changes` (see :mod:`airflow_pgcdc.cli.slots` for what
each field means)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_pgcdc.store.slot import SlotStore

__all__ = [
    "committed_windows",
    "delta_tables",
    "partition_changes",
    "slot_status",
]

def committed_windows(client: Any, store: str, slot: str, delta: str | None = None, *,
                      folder: SlotStore | None = None) -> dict[str, Any]:
    """What the store holds for ``slot``: ``windows_committed``, ``last_window`` (the
    newest committed manifest's ``window_seq``, ``start_lsn``, ``end_lsn`` and the rest of
    its top-level scalar fields), ``uncommitted_folders`` (window folders without a
    manifest: a window being written, or one a crashed drain left), ``merged_through``
    and ``windows_not_merged`` (``None`` without ``delta`` once a window is committed:
    the merge progress is in the Delta tables, not in the store).

    Windows are written one at a time, in order, so every window folder before the
    newest committed one is committed: the manifests are checked from the newest back.
    ``folder``: the slot's folder already opened (its reads are shared with the caller's).
    """
    from airflow_pgcdc.store import s3 as s3store
    from airflow_pgcdc.store.layout import Layout, LayoutError
    from airflow_pgcdc.store.slot import SlotStore

    layout = Layout.parse(store)
    folder = folder or SlotStore(client, layout, slot)
    prefix = layout.changes_prefix(slot)
    seqs: list[int] = []
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=layout.bucket, Prefix=prefix, Delimiter="/"):
        for cp in page.get("CommonPrefixes", ()) or ():
            name = cp["Prefix"][len(prefix):].rstrip("/")
            try:
                seqs.append(layout.parse_window_key(slot, prefix + name + "/"))
            except LayoutError:
                continue  # not a window folder
    seqs.sort()
    last = None
    uncommitted: list[int] = []
    for seq in reversed(seqs):
        key = layout.window_manifest(slot, seq)
        raw = folder.window_document(seq)  # one GET, shared with the reads of the window below
        if raw is not None:
            doc = s3store.json_document(raw, layout.bucket, key)
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
        left = _left_pipeline(folder, doc)
        without_copy = _without_copy(folder, doc)
    gone = {t["table"] for t in left}
    merged_through = None
    per_table = None
    if delta and last is not None:
        per_table = _merged_per_table(folder, delta, last["window_seq"],
                                      extra=[(t["schema"], t["name"]) for t in left])
        for t in left:
            t["merged_through"] = per_table.get(t["table"])
            t["delta_url"] = _delta_url(delta, t["schema"], t["name"])
        done = [w for name, w in per_table.items() if name not in gone]
        merged_through = None if not done or None in done else min(done)
    if merged_through is not None:
        not_merged: int | None = max(last["window_seq"] - merged_through, 0)
    elif delta or not committed:
        not_merged = committed  # a table with none merged yet (or nothing to merge)
    else:
        not_merged = None  # unknown: the merge progress is in the Delta tables

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
    if delta:
        out["delta_tables"] = delta_tables(client, layout, slot, delta, last_seq=(last or {}).get("window_seq"),
                                           extra=[(t["schema"], t["name"]) for t in left], folder=folder)
    out["left_pipeline"] = left
    out["without_copy"] = [f"{a}.{b}" for a, b in without_copy]
    out["without_copy_hint"] = None
    if without_copy:
        import shlex

        from airflow_pgcdc.protocol.quoting import quote_qualified

        out["without_copy_hint"] = "pgcdc resync --tables " + " ".join(
            shlex.quote(quote_qualified(a, b)) for a, b in without_copy)
    return out


def _without_copy(folder: SlotStore, newest: Any) -> list[tuple[str, str]]:
    """The tables the newest window's ``pipeline_tables`` holds that neither the snapshot nor
    a resync copied (added to the publication, or a partition attached to a root published
    per leaf, not resynced yet): their Delta table would miss the rows they held then; the
    merge refuses their changes (``NeedsSnapshot``) until ``pgcdc resync``."""
    if not isinstance(newest, dict) or newest.get("pipeline_tables") is None:
        return []
    if folder.snapshot is None:
        return []  # a store without a snapshot: nothing to compare with
    return sorted({(str(a), str(b)) for a, b in newest["pipeline_tables"]} - set(folder.copied_tables))


def _delta_url(delta_url: str, schema: str, table: str, storage: dict[str, str] | None = None) -> str:
    from airflow_pgcdc.lake.tables import delta_table_url

    if storage is None:
        return delta_table_url(delta_url, schema, table)
    from airflow_pgcdc.lake.inspect import table_url

    return table_url(delta_url, schema, table, storage)


def _left_pipeline(folder: SlotStore, newest: Any) -> list[dict[str, Any]]:
    """The tables the pipeline knew that the newest committed window (``newest``, its
    manifest document) no longer covers: ``[{table, schema, name, last_window}]``, where
    ``last_window`` is the last window holding its changes as far as the merge's tables
    index knows (``None``: not known)."""
    if not isinstance(newest, dict) or newest.get("pipeline_tables") is None:
        return []  # a window written before pipeline_tables existed: nothing to tell
    pipeline = {(str(a), str(b)) for a, b in newest["pipeline_tables"]}
    known: dict[tuple[str, str], int | None] = dict.fromkeys(folder.copied_tables)
    for t in (folder.tables_index or {}).get("tables", ()):
        w = t.get("last_window")
        known[(str(t["schema"]), str(t["table"]))] = w if isinstance(w, int) and w >= 0 else None
    for t in newest.get("tables", ()) or ():
        if isinstance(t, dict) and "schema" in t and "table" in t:
            known[(str(t["schema"]), str(t["table"]))] = int(newest["window_seq"])
    return [
        {"table": f"{schema}.{table}", "schema": schema, "name": table, "last_window": w}
        for (schema, table), w in sorted(known.items()) if (schema, table) not in pipeline
    ]


HISTORY_KINDS = (("", "table"), ("__changelog", "changelog"), ("__scd2", "scd2"))  # merge/job.py's suffixes


def _pipeline_tables(folder: SlotStore, last_seq: int | None,
                     extra: list[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """Every table the pipeline knows: the snapshot's, the resyncs', the merge's tables
    index, the newest window's and ``extra``, in that order, once each."""
    tables: dict[tuple[str, str], None] = dict.fromkeys(folder.copied_tables)
    for t in (folder.tables_index or {}).get("tables", ()):
        tables[(str(t["schema"]), str(t["table"]))] = None
    if last_seq is not None:
        for t in folder.window(last_seq).tables:
            tables[(t["schema"], t["table"])] = None
    for t in extra:
        tables[t] = None
    return list(tables)


def delta_tables(client: Any, layout: Any, slot: str, delta: str, *, last_seq: int | None = None,
                 extra: list[tuple[str, str]] = (), folder: SlotStore | None = None) -> list[dict[str, Any]]:
    """Per Delta table of the pipeline (each source table's, and its ``__changelog`` /
    ``__scd2`` history tables when they exist), whichever engine wrote it: ``version``,
    ``versions_kept``, ``oldest_version``, ``checkpoint_version``, live data ``files`` and
    their ``bytes``, ``log_bytes``, ``stored_bytes``
    (:func:`airflow_pgcdc.maintain.tables.table_figures`) and ``last_maintenance``: the record
    ``pgcdc maintain`` wrote for it (``{slot}/maintain/tables/``), or None. A source table
    without a Delta table yet is listed with ``exists: false``; one that cannot be read
    gets ``error``."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    from airflow_pgcdc.lake.inspect import table_figures
    from airflow_pgcdc.store.maintenance import last_maintenance
    from airflow_pgcdc.store.s3 import S3Settings, delta_storage_options, settings_of

    storage = delta_storage_options(settings_of(client) or S3Settings.from_env())
    out: list[dict[str, Any]] = []
    from airflow_pgcdc.store.slot import SlotStore

    for schema, table in _pipeline_tables(folder or SlotStore(client, layout, slot), last_seq, extra):
        base = _delta_url(delta, schema, table, storage)
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


def _merged_per_table(folder: SlotStore, delta_url: str, last_seq: int | None,
                      extra: list[tuple[str, str]] = (), *, raw: bool = False) -> dict:
    from airflow_pgcdc.lake.inspect import merge_progress
    from airflow_pgcdc.store.s3 import S3Settings, delta_storage_options, settings_of

    tables: dict[tuple[str, str], None] = {}
    for t in folder.snapshot.tables if folder.snapshot is not None else ():
        tables[(t.schema, t.table)] = None
    for t in folder.window(last_seq).tables if last_seq is not None else ():
        tables[(t["schema"], t["table"])] = None
    for t in extra:
        tables[t] = None
    return merge_progress(delta_url, folder.slot, list(tables),
                          storage_options=delta_storage_options(settings_of(folder.client) or S3Settings.from_env()),
                          raw=raw)


def freshness(folder: SlotStore, marks: dict[str, int | None], last_seq: int | None,
              wal_wait: float | None, pending_bytes: int | None, now: datetime | None = None) -> dict[str, Any]:
    """How stale each Delta table is, in seconds: now minus the commit time of the oldest
    change of the table the store holds and the merge has not applied (0 when none waits).
    A window's changes are dated by its first commit (``commit_times``; a window written
    before that field existed by its drain's start, which gives a lower bound); a copy no
    merge has applied, by its consistent point. ``marks``: ``{"schema.table": its Delta
    table's app transaction version}`` (``NONE_MERGED``: the copy alone; None: nothing). The pipeline's ``lag_seconds`` also
    counts the changes still in the WAL (``wal_wait``: what the server can prove, see
    :func:`~airflow_pgcdc.pg.slots.oldest_pending_age`); ``lag_known`` is False when WAL is
    pending and its age is unknown (the figure is then a lower bound)."""
    from airflow_pgcdc.lake.inspect import NONE_MERGED
    from airflow_pgcdc.store.manifest import POINT_TIME
    from airflow_pgcdc.store.window import COMMIT_TIMES_FIELD

    now = now or datetime.now(UTC)
    merged = {n: None if m is None or m <= NONE_MERGED else m for n, m in marks.items()}
    waiting: dict[str, str | None] = {}
    if last_seq is not None and merged:
        # where each table's unmerged windows can start: after its last merged one, or after
        # the merge's tables index when no window up to the index's holds it since (a quiet
        # table of a long-running slot is not looked for in every window)
        index_through, index_last = _tables_index(folder, last_seq)
        starts = {}
        for name, through in merged.items():
            m = -1 if through is None else through
            if m >= last_seq:
                continue
            quiet = index_through >= 0 and index_last.get(name, -1) <= m  # none of 0..through holds it after m
            starts[name] = max(m, index_through) + 1 if quiet else m + 1
        for seq in range(min(starts.values(), default=last_seq + 1), last_seq + 1):  # oldest first
            if len(waiting) == len(starts):
                break
            w = folder.window(seq)
            held = {f"{t['schema']}.{t['table']}" for t in w.tables}
            times = w.extra.get(COMMIT_TIMES_FIELD) or {}
            when = times.get("first") or (w.timings or {}).get("started_at")
            for name, start in starts.items():
                if name not in waiting and name in held and seq >= start:
                    waiting[name] = when
    snap = folder.snapshot
    copied = {f"{t.schema}.{t.table}" for t in snap.tables} if snap is not None else set()
    tables = {}
    for name, through in sorted(merged.items()):
        when = waiting.get(name)
        if when is None and marks.get(name) is None and name in copied:  # the copy waits for its first merge
            when = snap.extra.get(POINT_TIME)
        lag = max((now - datetime.fromisoformat(when)).total_seconds(), 0.0) if when else 0.0
        tables[name] = {"merged_through": through, "oldest_unmerged_commit": when, "lag_seconds": round(lag, 3)}
    wal_pending = bool(pending_bytes) and pending_bytes > 0
    lags = [t["lag_seconds"] for t in tables.values()] + ([wal_wait] if wal_wait is not None else [])
    return {
        "as_of": now.isoformat(),
        "lag_seconds": round(max(lags, default=0.0), 3),
        "lag_known": wal_wait is not None or not wal_pending,
        "wal_wait_seconds": wal_wait,
        "tables": tables,
    }


def _tables_index(folder: SlotStore, last_seq: int) -> tuple[int, dict[str, int]]:
    """``(through, {"schema.table": the last window up to through holding it})`` from the
    merge's tables index when it still describes the store's windows, else ``(-1, {})``."""
    doc = folder.tables_index or {}
    try:
        through = int(doc["through"])
        last = {f"{t['schema']}.{t['table']}": int(t["last_window"]) for t in doc["tables"]}
        if not 0 <= through <= last_seq or folder.window(through).end_lsn != doc["end_lsn"]:
            return -1, {}
    except Exception:  # noqa: BLE001 - a cache: read the windows instead
        return -1, {}
    return through, last


def _recovered(client, store_url: str, slot: str, end, last: dict, confirmed) -> bool:
    """A slot ahead of the store that ``pgcdc recover`` covered (the next drain resumes)."""
    from airflow_pgcdc.store.layout import Layout
    from airflow_pgcdc.store.recoveries import committed_recoveries, covering

    seq = last.get("window_seq")
    if not isinstance(seq, int):
        return False
    return covering(committed_recoveries(client, Layout.parse(store_url), slot), store_end=end, next_seq=seq + 1,
                    confirmed=confirmed) is not None


def slot_status(
    dsn: str,
    slot: str,
    *,
    publications: Sequence[str] | str | None = None,
    store: str | None = None,
    delta: str | None = None,
    s3: Any = None,
    **old: Any,
) -> dict[str, Any]:
    """The status of ``slot`` (and of its windows in the store at ``store``, read with ``s3``:
    S3Settings or a client; of its Delta tables under ``delta``); ``publications`` (one name
    or several) are checked to exist. ``store_url``, ``delta_url``, ``publication`` and
    ``s3_client``: their 0.1 names (warn).

    ``problem`` is None when the slot can be drained, else ``{"error", "message", "hint"}``
    (lost, unreserved, mismatched, publication missing); an active slot (a drain running)
    is not a problem: ``slot.active`` and ``slot.active_pid`` show it. A missing slot raises
    :class:`~airflow_pgcdc.pg.slots.SlotMissing`.
    """
    from airflow_pgcdc.options import publications_argument, renamed_parameter
    from airflow_pgcdc.pg.slots import (
        PublicationMissing,
        SlotError,
        SlotMissing,
        check_slot_usable,
        slot_health,
    )
    from airflow_pgcdc.protocol.lsn import LSN
    from airflow_pgcdc.store import s3 as s3store

    store_url = renamed_parameter("slot_status", "store", store, "store_url", old.pop("store_url", None))
    delta_url = renamed_parameter("slot_status", "delta", delta, "delta_url", old.pop("delta_url", None))
    pubs = publications_argument("slot_status", publications, old)
    settings, s3_client = s3store.s3_argument("slot_status", s3, old)
    if old:
        raise TypeError(f"slot_status() got unexpected keyword argument(s) {', '.join(map(repr, sorted(old)))}")
    health = slot_health(dsn, slot, publications=pubs)
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
            s3_client = s3store.make_s3_client(settings)
        from airflow_pgcdc.store.layout import Layout
        from airflow_pgcdc.store.slot import SlotStore

        folder = SlotStore(s3_client, Layout.parse(store_url), slot)  # every read below made once
        store = committed_windows(s3_client, store_url, slot, delta_url, folder=folder)
        last = store["last_window"]
        agreement = None
        if last and isinstance(last.get("end_lsn"), str) and health.confirmed_flush_lsn is not None:
            end = LSN.parse(last["end_lsn"])
            if end == health.confirmed_flush_lsn:
                agreement = "in_sync"
            elif end > health.confirmed_flush_lsn:
                agreement = "ack_pending"  # the last window's ack was lost: the next drain sends it
            elif _recovered(s3_client, store_url, slot, end, last, health.confirmed_flush_lsn):
                agreement = "recovered"  # pgcdc recover copied every table: the next drain resumes
            else:
                agreement = "slot_ahead"  # acknowledged beyond the store: changes are missing
        elif last is None and folder.snapshot is None:
            agreement = "store_empty"  # nothing of this slot here: a mistyped store, or not started
        store["slot_vs_store"] = agreement
        if store["left_pipeline"]:
            _why_left(dsn, store["left_pipeline"])
        store["partitions_changed"] = partition_changes(dsn, s3_client, store_url, slot, folder=folder)
        if delta_url and (last is not None or folder.snapshot is not None):
            from airflow_pgcdc.pg.slots import oldest_pending_age

            seq = (last or {}).get("window_seq")
            marks = _merged_per_table(folder, delta_url, seq, raw=True)  # the copy's merge too
            store["freshness"] = freshness(folder, marks, seq, oldest_pending_age(health), health.pending_bytes)
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


def partition_changes(dsn: str, client: Any, store: str, slot: str, *,
                      folder: SlotStore | None = None) -> list[dict[str, Any]]:
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
    from airflow_pgcdc.store.slot import SlotStore

    folder = folder or SlotStore(client, Layout.parse(store), slot)
    copies: dict[tuple[str, str], tuple[Any, str]] = {}
    snapshot = folder.snapshot
    for t in snapshot.tables if snapshot is not None else ():
        copies[(t.schema, t.table)] = (t, snapshot.consistent_point)
    for r in folder.resyncs():  # oldest first: the newest copy wins
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


def _why_left(dsn: str, left: list[dict[str, Any]]) -> None:
    """Set ``reason`` on each table of ``left``: ``dropped`` (no such table on the server)
    or ``forgotten`` (it exists: let go with ``--forget-table``)."""
    import psycopg

    from airflow_pgcdc.protocol.quoting import quote_qualified

    with psycopg.connect(dsn, autocommit=True) as conn:
        for t in left:
            gone = conn.execute("SELECT to_regclass(%s) IS NULL", (quote_qualified(t["schema"], t["name"]),)).fetchone()[0]
            t["reason"] = "dropped" if gone else "forgotten"

