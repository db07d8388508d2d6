"""The merge job: Delta tables bootstrapped from the slot's snapshot, then kept in step
with its change windows, in order, exactly once. Runs on the Spark driver
(:func:`merge_slot`, called by :mod:`.spark_app` under ``spark-submit`` or by
``pgcdc merge`` in-process).

Per source table (``{delta}/{schema}.{table}``, one Delta table each):

1. **Bootstrap** (no Delta table yet, the table is in the snapshot): the snapshot parts
   are read by Spark (:mod:`.spark_io`), staged, and written as the table's first commit,
   whose metadata records ``pgcdc.snapshot_id`` and ``pgcdc.consistent_point``.
2. **Merge**: the committed windows after the table's last merged window (the app
   transaction ``pgcdc:{slot}:{schema}.{table}`` of the Delta table; none merged yet:
   window 0, which must start at the snapshot's consistent point), contiguous and
   tiling (:mod:`.plan`), at most ``max_windows`` per commit. Their change rows are
   compacted in Spark (:mod:`.compact`), staged by the executors, and merged in one
   commit that records app transaction version = the last window's ``window_seq`` and
   ``pgcdc.window_first``/``window_last``/``start_lsn``/``end_lsn`` in its metadata.
3. **Schema**: a new source column is added to the Delta table (nullable) before the
   merge; a dropped one stays (NULL from then on); a column whose type changed stops
   the merge (:class:`IncompatibleSchemaChange`).

A table with no change in the pending windows gets no commit (its app transaction
version stays where it was; the next run looks at those windows again, finds nothing,
and moves on once a window holds a change for it).

Crash safety: a job killed before a table's commit leaves that table at its previous
version (a Delta commit is one conditional put of the log entry); the rerun merges the
same windows again. Killed after the commit, the rerun finds the app transaction
version at the window and does nothing. Test hooks: ``PGCDC_FAULT=merge-after-stage``
and ``merge-after-commit`` (:mod:`airflow_pgcdc.testing.faults`).

Staged files live under ``{prefix}/{slot}/merge-staging/{run_id}/`` and are removed after
each commit; debris of a killed job older than :data:`STAGING_TTL_HOURS` is removed by
the next job.
"""

from __future__ import annotations

import json
import logging
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

from airflow_pgcdc.changes.columns import COMMIT_LSN, COMMIT_TS, OP, SEQ, UNCHANGED_TOAST, XID
from airflow_pgcdc.changes.rows import (
    META_NAMES,
    OLD_PREFIX,
    REWRITTEN_FIELD,
    decode_missing_values,
)
from airflow_pgcdc.merge import deltars, pruning
from airflow_pgcdc.merge.clauses import MATCH_PREFIX, build_merge_spec, keep_column
from airflow_pgcdc.merge.compact import compact, toastable
from airflow_pgcdc.merge.context import (
    META,
    JobContext,
    read_changes,
    read_files,
    read_parts,
    remove_old_staging,
    spark_commit_once,
    stage,
    window_metadata,
)
from airflow_pgcdc.merge.delta_types import to_delta_batch, to_delta_schema
from airflow_pgcdc.merge.errors import (
    IncompatibleSchemaChange,
    KeylessChange,
    NeedsSnapshot,
    PartitionsChanged,
    ReservedColumnName,
    TableRewritten,
    TablesFailed,
    WindowsExpired,
)
from airflow_pgcdc.merge.plan import (
    MergeError,
    TablePlan,
    WindowGap,
    WindowOrderError,
    app_id,
    delta_table_url,
    plan_table,
    select_windows,
)
from airflow_pgcdc.merge.spark_io import register, s3_options
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.quoting import quote_qualified
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout, new_run_id
from airflow_pgcdc.store.manifest import committed_snapshot
from airflow_pgcdc.store.partitions import (
    changes_since_copy,
    copied_leaves,
    window_partition_leaves,
)
from airflow_pgcdc.store.resyncs import committed_resyncs, latest_resync
from airflow_pgcdc.store.window import REFUSED_FIELD, read_window, window_folders
from airflow_pgcdc.testing.faults import fault_point

__all__ = [  # the errors are merge/errors.py's, importable from here as before
    "IncompatibleSchemaChange", "KeylessChange", "MergeResult", "NeedsSnapshot", "PartitionsChanged",
    "ReservedColumnName", "TableResult", "TableRewritten", "TablesFailed", "WindowsExpired", "merge_slot",
]

log = logging.getLogger(__name__)
ENGINES = ("delta-rs", "delta-spark")
HISTORIES = (None, "changelog", "scd2")
READERS = ("python", "s3a")


@dataclass
class TableResult:
    table: str
    delta_url: str
    # bootstrapped[+merged] | resynced[+merged] | merged | merged-by-concurrent-job |
    # up-to-date | no-changes | failed
    action: str
    app_id: str = ""
    bootstrap_rows: int = 0
    first_window: int | None = None
    last_window: int | None = None
    start_lsn: str | None = None
    end_lsn: str | None = None
    change_rows: int = 0
    merged_rows: int = 0
    truncates: int = 0
    added_columns: list[str] = field(default_factory=list)
    delta_version: int | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    history: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None  # action "failed": what went wrong, and what to do
    hint: str | None = None
    # the table is no longer in the pipeline (dropped, or out of the publication) as of the
    # newest window read: its Delta table keeps its last state
    left_pipeline: bool = False


@dataclass
class MergeResult:
    slot: str
    source: str
    delta: str
    tables: list[TableResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> list[TableResult]:
        return [t for t in self.tables if t.action == "failed"]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def merge_slot(
    spark,
    *,
    source: str,
    slot: str,
    delta: str,
    tables: Sequence[str] | None = None,
    keys: Mapping[str, Sequence[str]] | None = None,
    max_windows: int | None = None,
    settings: s3store.S3Settings | None = None,
    engine: str = "delta-rs",
    history: str | None = None,
    reader: str = "python",
    target_file_mb: float | None = None,
) -> MergeResult:
    """Bootstrap and merge every table of ``slot`` (or only ``tables``, ``schema.table``)
    from the store at ``source`` (``s3://bucket/prefix``) into Delta tables under
    ``delta`` (``s3://bucket/lake``). ``keys`` overrides merge keys per table.
    ``engine``: ``delta-rs`` (default) or ``delta-spark`` (needs the Delta and hadoop-aws
    jars on the cluster). ``history="changelog"`` also appends every change row to
    ``{schema}.{table}__changelog``; ``history="scd2"`` keeps ``{schema}.{table}__scd2``
    (SCD type 2: one row per version of a row, with its LSN validity). ``reader``:
    ``python`` (default: a Spark Python Data Source on pyarrow's S3 filesystem) or
    ``s3a`` (Spark's own Parquet reader through hadoop-aws, for clusters that have it).
    ``target_file_mb``: the data files' size when a table is bootstrapped or replaced by a
    resync (rows sorted by the key; default :data:`~.pruning.DEFAULT_TARGET_FILE_MB`)."""
    target_file_mb = pruning.DEFAULT_TARGET_FILE_MB if target_file_mb is None else float(target_file_mb)
    if not target_file_mb > 0:
        raise MergeError(f"the target file size must be positive, got {target_file_mb} MB")
    if reader not in READERS:
        raise MergeError(f"unknown reader {reader!r}", hint=f"one of {', '.join(READERS)}")
    if engine not in ENGINES:
        raise MergeError(f"unknown engine {engine!r}", hint=f"one of {', '.join(ENGINES)}")
    if history not in HISTORIES:
        raise MergeError(f"unknown history {history!r}", hint="history is 'changelog', 'scd2' or none")
    t0 = time.monotonic()
    settings = settings or s3store.S3Settings.from_env()
    layout = Layout.parse(source)
    client = s3store.make_s3_client(settings)
    ctx = JobContext(
        spark=spark, layout=layout, client=client, fs=s3store.make_pyarrow_fs(settings),
        storage=s3store.delta_storage_options(settings), slot=slot, delta=delta,
        run_id=new_run_id(), s3_options=s3_options(settings), engine=engine, history=history,
        reader=reader, target_file_mb=target_file_mb,
    )
    register(spark)
    if ctx.engine == "delta-spark" or ctx.reader == "s3a":
        from airflow_pgcdc.merge.jars import configure_s3a

        configure_s3a(spark, settings)
        spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")  # see SPARK_CONF
    if ctx.reader == "s3a":  # Parquet TIME columns: read, then turned into int64 µs
        spark.conf.set("spark.sql.timeType.enabled", "true")
    remove_old_staging(ctx)
    snapshot = committed_snapshot(client, layout, slot)
    ctx.resyncs = committed_resyncs(client, layout, slot)
    ctx.expired = _read_expired(ctx)
    manifests, wanted = _load_windows(ctx, snapshot, tables)
    result = MergeResult(slot=slot, source=source, delta=delta)
    try:
        for schema, table in wanted:
            # one table's trouble never stops the others: it is reported, they are merged
            try:
                res = _one_table(ctx, schema, table, snapshot, manifests, keys or {}, max_windows)
            except (WindowGap, WindowOrderError):  # the store's windows, not this table: stop
                raise
            except Exception as exc:  # noqa: BLE001 - reported per table, raised below
                log.error("%s.%s: not merged: %s", schema, table, exc, exc_info=not isinstance(exc, MergeError))
                res = TableResult(
                    table=f"{schema}.{table}", delta_url=_target(ctx, schema, table)[0], action="failed",
                    error=f"{type(exc).__name__}: {exc}", hint=getattr(exc, "hint", None),
                )
            res.left_pipeline = _left_pipeline(manifests, schema, table)
            result.tables.append(res)
    finally:
        s3store.delete_prefix(client, layout.bucket, layout.merge_staging_prefix(slot, ctx.run_id))
    result.seconds = round(time.monotonic() - t0, 3)
    if result.failed:
        raise TablesFailed(
            f"{len(result.failed)} of {len(result.tables)} table(s) not merged (the others were): "
            + "; ".join(f"{t.table}: {t.error}" for t in result.failed),
            hint=" | ".join(f"{t.table}: {t.hint}" for t in result.failed if t.hint) or None,
            result=result,
        )
    return result


MANIFEST_READERS = 16
"""Window manifests read at once (the S3 client pools 32 connections): a slot with months
of windows has thousands, and one GET after the other would cost the job minutes."""


def _read_windows(client, layout: Layout, slot: str, seqs: Sequence[int]) -> list:
    """The committed window manifests among ``seqs``, in that order (read concurrently;
    boto3 clients are thread-safe); a folder without a manifest (a crashed attempt, a
    drain in progress) is left out."""

    def read(seq: int):
        try:
            return read_window(client, layout, slot, seq)
        except s3store.ObjectNotFound:
            return None

    if len(seqs) <= 1:
        found = [read(s) for s in seqs]
    else:
        from concurrent.futures import ThreadPoolExecutor

        workers = min(MANIFEST_READERS, len(seqs))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pgcdc-manifests") as pool:
            found = list(pool.map(read, seqs))
    return [m for m in found if m is not None]


TABLES_INDEX_FORMAT = 1


def _load_windows(ctx: JobContext, snapshot, only: Sequence[str] | None) -> tuple[list, list[tuple[str, str]]]:
    """The window manifests this job needs and the tables to merge, without reading every
    manifest of a slot that has run for months.

    A merge needs, per table, the windows after its last merged one that hold it; the
    tables are the snapshot's and every table some window holds. The tables index
    (:meth:`Layout.merge_tables_index`, written by the previous job) says which tables
    windows ``0..through`` hold and the last of those windows holding each. This job
    reads the manifests after ``through``; a table that no window up to ``through`` holds
    after its last merged one is anchored at ``through`` (``ctx.anchors``: it needs
    nothing before); the others need the windows from their last merged one, so the
    manifests from the lowest of those (the floor) up to ``through`` are read too. A
    missing, unreadable or stale index (its ``through`` window no longer ends where it
    did) means reading them all."""
    client, layout, slot = ctx.client, ctx.layout, ctx.slot
    folders = window_folders(client, layout, slot)
    through, last_seen = _read_tables_index(ctx, folders)
    newer = _read_windows(client, layout, slot, [s for s in folders if s > through])
    names: dict[tuple[str, str], None] = {}
    if snapshot is not None:
        for t in snapshot.tables:
            names[(t.schema, t.table)] = None
    for name in last_seen:
        names[name] = None
    for r in ctx.resyncs:
        for t in r.manifest.tables:
            names[(t.schema, t.table)] = None
    for m in newer:
        for held in _held_tables(m):
            names[held] = None
    wanted = _select_tables(names, only)
    floor = _merged_floor(ctx, wanted, through, last_seen) if through >= 0 else 0
    for schema, table in wanted:  # a resync to apply moves the table back: it needs every window
        if _pending_resync(ctx, schema, table) is not None:
            ctx.anchors.pop(f"{schema}.{table}", None)
            floor = 0
    older = _read_windows(client, layout, slot, [s for s in folders if floor <= s <= through])
    manifests = older + newer
    seen = {m.window_seq: m for m in newer}
    new_through = through
    while new_through + 1 in seen:  # only a gapless run extends what the index covers
        new_through += 1
        for held in _held_tables(seen[new_through]):
            last_seen[held] = new_through
    for name in names:
        last_seen.setdefault(name, -1)
    if new_through > through:
        _write_tables_index(ctx, new_through, seen[new_through].end_lsn, last_seen)
    log.info(
        "slot %s: %d window folder(s); read %d manifest(s) (index through window %d, floor %d, "
        "%d table(s) anchored)", slot, len(folders), len(manifests), through, floor, len(ctx.anchors),
    )
    return manifests, wanted


def _left_pipeline(manifests, schema: str, table: str) -> bool:
    """Whether the newest window read says the table is no longer in the pipeline (its
    ``pipeline_tables``, recorded since the drain checks publications)."""
    if not manifests:
        return False
    newest = max(manifests, key=lambda m: m.window_seq)
    return newest.pipeline_tables is not None and (schema, table) not in newest.pipeline_tables


def _held_tables(m) -> set[tuple[str, str]]:
    """The tables a window holds changes or a truncate of, and the partitioned roots whose
    leaves it says changed (so that the tables index never lets a merge skip that window:
    the root is refused from it on, see :func:`_check_partitions`)."""
    out = {(t["schema"], t["table"]) for t in m.tables}
    out |= {root for root, e in window_partition_leaves(m).items() if e.changed}
    for tr in m.truncates:
        for name in tr.get("tables", ()):
            schema, _, table = name.partition(".")
            out.add((schema, table))
    return out


def _read_tables_index(ctx: JobContext, folders: list[int]) -> tuple[int, dict[tuple[str, str], int]]:
    """``(through, {table: last window up to through holding it, -1: none})`` from the
    index, or ``(-1, {})`` when there is none usable."""
    key = ctx.layout.merge_tables_index(ctx.slot)
    try:
        doc = s3store.get_json(ctx.client, ctx.layout.bucket, key)
        if doc.get("format") != TABLES_INDEX_FORMAT:
            raise ValueError(f"format {doc.get('format')!r}")
        through = int(doc["through"])
        tables = {(str(t["schema"]), str(t["table"])): int(t["last_window"]) for t in doc["tables"]}
        if through not in folders or read_window(ctx.client, ctx.layout, ctx.slot, through).end_lsn != doc["end_lsn"]:
            raise ValueError(f"window {through} is not the one the index saw")
        return through, tables
    except s3store.ObjectNotFound:
        return -1, {}
    except Exception as exc:  # a cache: never trust a doubtful one, never fail on it
        log.warning("ignoring the merge tables index s3://%s/%s: %s", ctx.layout.bucket, key, exc)
        return -1, {}


def _write_tables_index(ctx: JobContext, through: int, end_lsn: str, last_seen: dict) -> None:
    doc = {
        "format": TABLES_INDEX_FORMAT,
        "slot": ctx.slot,
        "through": through,
        "end_lsn": end_lsn,
        "tables": [{"schema": s, "table": t, "last_window": w} for (s, t), w in sorted(last_seen.items())],
    }
    try:
        s3store.put_bytes(ctx.client, ctx.layout.bucket, ctx.layout.merge_tables_index(ctx.slot),
                          json.dumps(doc, indent=1), content_type="application/json")
    except Exception as exc:  # only a cache: the next job reads more manifests
        log.warning("could not write the merge tables index: %s", exc)


def _merged_floor(ctx: JobContext, wanted: list[tuple[str, str]], through: int, last_seen: dict) -> int:
    """The lowest window the tables in ``wanted`` need read (and set ``ctx.anchors``): a
    table's last merged window (over it and its history tables; ``0`` when one has
    merged none), or ``through`` when no window up to ``through`` holds it after that."""
    floor = through
    for schema, table in wanted:
        targets = [_target(ctx, schema, table)]
        if ctx.history:
            targets.append(_target(ctx, schema, table, ctx.history))
        merged = []
        for url, app in targets:
            ctx.loaded[url] = deltars.open_table(url, ctx.storage)
            merged.append(deltars.merged_version(ctx.loaded[url], app))
        lowest = min(-1 if v is None else v for v in merged)
        if last_seen.get((schema, table), -1) <= lowest:
            ctx.anchors[f"{schema}.{table}"] = through
        else:
            floor = min(floor, max(lowest, 0))
    return floor


def _target(ctx: JobContext, schema: str, table: str, history: str | None = None) -> tuple[str, str]:
    """``(url, app id)`` of a table's Delta table, or of its ``history`` table
    (``changelog`` or ``scd2``, whose app id ends in ``:changelog``/``:scd2``)."""
    app = app_id(ctx.slot, schema, table)
    if history is None:
        return delta_table_url(ctx.delta, schema, table), app
    url = (changelog_url if history == "changelog" else scd2_url)(ctx.delta, schema, table)
    return url, f"{app}:{history}"


def _select_tables(names: dict, only: Sequence[str] | None) -> list[tuple[str, str]]:
    if only:
        known = {f"{s}.{t}": (s, t) for s, t in names}
        missing = [n for n in only if n not in known]
        if missing:
            raise MergeError(
                f"table(s) {missing} are neither in the slot's snapshot nor in any committed window",
                hint="check --tables against `pgcdc status` and the publication",
            )
        return [known[n] for n in only]
    return list(names)


RESYNC_APP_SUFFIX = ":resync"
"""A Delta table's app transaction ``{app}:resync`` holds the consistent point (as an
integer LSN) of the resync it was last replaced from."""


def _pending_resync(ctx: JobContext, schema: str, table: str):
    """``(resync, entry)`` when the table's newest resync is not in its Delta table yet."""
    found = latest_resync(ctx.resyncs, schema, table)
    if found is None:
        return None
    url, app = _target(ctx, schema, table)
    if url not in ctx.loaded:
        ctx.loaded[url] = deltars.open_table(url, ctx.storage)
    applied = deltars.merged_version(ctx.loaded[url], app + RESYNC_APP_SUFFIX)
    if applied is not None and applied >= int(found[0].consistent_point):
        return None
    return found


def _covered_windows(manifests, point: LSN) -> int:
    """The last window whose every transaction committed before ``point`` (its end is at or
    before it), or -1: the windows a copy taken at ``point`` already holds."""
    return max((m.window_seq for m in manifests if m.end <= point), default=-1)


def _one_table(ctx: JobContext, schema: str, table: str, snapshot, manifests, keys, max_windows) -> TableResult:
    t0 = time.monotonic()
    name = f"{schema}.{table}"
    url, app = _target(ctx, schema, table)
    res = TableResult(table=name, delta_url=url, action="up-to-date", app_id=app)
    entry = None
    if snapshot is not None:
        entry = next((t for t in snapshot.tables if t.schema == schema and t.table == table), None)
    found = latest_resync(ctx.resyncs, schema, table)
    pending = _pending_resync(ctx, schema, table) if found else None
    dt = ctx.open(url)
    since = None
    main_entry = entry  # the history tables start from the pipeline's snapshot (a resync does not rebuild them)
    if found is not None:
        resync, entry = found  # the newest copy: its columns and key are the table's
        since = int(resync.consistent_point)
        if pending is not None:
            covered = _covered_windows(manifests, resync.consistent_point)
            res.bootstrap_rows = _resync_replace(ctx, resync, entry, url, app, covered,
                                                 _key_columns(name, entry, (), keys))
            res.action = "resynced"
            dt = deltars.open_table(url, ctx.storage)
    elif dt is None and entry is not None:
        # the windows the new table will need, before copying it for nothing
        _check_expired(ctx, schema, table, select_windows(
            manifests, after=ctx.after(name, None), consistent_point=snapshot.consistent_point,
            limit=max_windows), None, url, None)
        res.bootstrap_rows = _bootstrap(ctx, snapshot, entry, url, _key_columns(name, entry, (), keys))
        res.action = "bootstrapped"
        dt = deltars.open_table(url, ctx.storage)
    elif entry is None and snapshot is not None and _holds(manifests, schema, table):
        raise NeedsSnapshot(
            f"table {name} has changes in the windows but is not in the slot's snapshot "
            f"({snapshot.snapshot_id}) nor in any resync: its Delta table would hold only the rows "
            "changed since it joined the publication",
            hint=f"pgcdc resync --slot {ctx.slot} --publication <publication> --to s3://{ctx.layout.bucket}/"
                 f"{ctx.layout.root.prefix} --tables {name}; the next merge then creates it",
        )
    last_merged = deltars.merged_version(dt, app)
    merged = ctx.after(name, last_merged)  # anchored: windows up to there hold nothing for it
    consistent = snapshot.consistent_point if (merged is None and entry is not None and since is None) else None
    windows = select_windows(manifests, after=merged, consistent_point=consistent, limit=max_windows)
    # partitions attached or detached since the copy: refused, history included
    copied_at = since if since is not None else (
        int(LSN.parse(snapshot.consistent_point)) if snapshot is not None and entry is main_entry else None)
    _check_partitions(ctx, schema, table, windows, entry, copied_at)
    _check_expired(ctx, schema, table, windows, since, url, last_merged)
    # history first: its own app transaction, committed before the table's merge, so a
    # crash between the two leaves the history ahead, never behind
    if ctx.history == "changelog":
        res.history = _changelog(ctx, schema, table, manifests, keys, main_entry, max_windows)
    elif ctx.history == "scd2":
        res.history = _scd2(ctx, schema, table, snapshot, main_entry, manifests, keys, max_windows)
    if not windows or not _holds(windows, schema, table):
        if (windows or merged != last_merged) and res.action == "up-to-date":
            res.action = "no-changes"
        res.delta_version = dt.version() if dt is not None else None
        res.seconds = round(time.monotonic() - t0, 3)
        return res
    _check_refused(name, windows, since)
    key_columns = _key_columns(name, entry, windows, keys)
    plan = plan_table(
        windows, schema=schema, table=table, key_columns=key_columns,
        window_prefix=lambda seq: ctx.layout.window_prefix(ctx.slot, seq), keyless=not key_columns,
        since_lsn=since,
    )
    if since is not None:
        plan = _after_point(ctx, plan, windows, since)
    _check_rewritten(ctx, name, windows, plan, dt)
    res.first_window, res.last_window = plan.first_window, plan.last_window
    res.start_lsn, res.end_lsn = plan.start_lsn, plan.end_lsn
    res.change_rows, res.truncates = plan.rows, plan.truncates
    if not plan.has_work:
        res.action = "no-changes" if res.action == "up-to-date" else res.action
        res.delta_version = dt.version() if dt is not None else None
        res.seconds = round(time.monotonic() - t0, 3)
        return res
    merge = _merge if plan.key_columns else _append_only
    metrics, dt, added = merge(ctx, plan, url, dt, app)
    res.metrics = metrics
    res.added_columns = added
    res.merged_rows = int(metrics.get("num_source_rows", 0))
    res.action = f"{res.action}+merged" if res.action in ("bootstrapped", "resynced") else "merged"
    if metrics.get("concurrent_commit"):
        res.action = "merged-by-concurrent-job"
    res.delta_version = deltars.open_table(url, ctx.storage).version()
    res.seconds = round(time.monotonic() - t0, 3)
    log.info(
        "%s: windows %s..%s (%s..%s), %d change rows -> %d merged rows, Delta version %s, %.1fs",
        name, plan.first_window, plan.last_window, plan.start_lsn, plan.end_lsn,
        plan.rows, res.merged_rows, res.delta_version, res.seconds,
    )
    return res


def _holds(windows, schema: str, table: str) -> bool:
    """Whether one of ``windows`` holds changes or a truncate of the table: a table
    without any has nothing to merge, and a table that appeared after the snapshot has no
    key to merge on but in the windows that hold it."""
    return any((schema, table) in _held_tables(m) for m in windows)


def _key_columns(name: str, entry, windows, keys) -> tuple[str, ...]:
    """The merge key; ``()`` for a table without one (appended, see :func:`_append_only`)."""
    if name in keys:
        return tuple(keys[name])
    if entry is not None:
        return tuple(entry.key_columns)
    # a table that appeared after the snapshot: its replica identity, from the windows
    for m in windows:
        for t in m.tables:
            if f"{t['schema']}.{t['table']}" != name:
                continue
            for rv in t["relation_versions"]:
                if rv.get("replica_identity") in ("d", "i"):
                    return tuple(c["name"] for c in rv["columns"] if c.get("key"))
    return ()  # FULL or NOTHING: no key (appended)


# --------------------------------------------------------------------------- schemas


def _table_fields(schema: pa.Schema) -> list[pa.Field]:
    """A part's table columns: all but the change metadata (a table's own column may start
    with ``_pgcdc_``; only the metadata names are reserved, see changes.rows.META_NAMES)."""
    return [f for f in schema if f.name not in META_NAMES and not f.name.startswith(OLD_PREFIX)]


def _check_refused(name: str, windows, since: int | None) -> None:
    """The drain left the table's changes out of a window (a column named like the change
    metadata): merging the rest would lose them. Changes before a resync's point are in
    its copy."""
    for m in windows:
        for t in m.tables:
            refused = t.get(REFUSED_FIELD)
            if refused and f"{t['schema']}.{t['table']}" == name and (
                since is None or int(LSN.parse(refused["last_commit_lsn"])) >= since
            ):
                raise ReservedColumnName(
                    f"table {name}: the drain could not store {refused['changes']} change(s) of window "
                    f"{m.window_seq} (from commit {refused['first_commit_lsn']}): {refused['error']}",
                    hint=f"rename the column(s) in PostgreSQL, then take the table again: pgcdc resync "
                         f"--tables {name} (the other tables are not affected)",
                )


def _check_partitions(ctx: JobContext, schema: str, table: str, windows, entry, copied_at: int | None) -> None:
    """A partitioned root published through it whose leaves changed since its copy
    (``entry``, taken at ``copied_at``): refused from the first window that says so
    (:mod:`airflow_pgcdc.store.partitions`). A window records the root's leaves as the
    catalog showed them when it committed and what changed since the window before (the
    drain judges a leaf attached when it first sees it, by its partition link's
    transaction). A window is refused when a leaf of the copy is gone (by name), or when it
    lists a change (an ATTACH after the copy, a partition created after the copy and then
    detached or dropped, a leaf detached and attached again). The window in which the copy
    was taken (it starts before ``copied_at``) is compared with the copy alone, attached
    leaves included: what changed in it before the copy's point is in the copy. Windows
    written before the field existed say nothing and pass."""
    copied = copied_leaves(entry) if entry is not None else None
    name = f"{schema}.{table}"
    for m in windows:
        rec = window_partition_leaves(m).get((schema, table))
        if rec is None:
            continue
        attached: set = set()
        detached: set = set()
        spans_copy = copied_at is not None and int(m.start) < copied_at
        if copied is not None:
            a, d = changes_since_copy(rec.leaves, copied)
            detached |= set(d)
            if spans_copy:  # judged once, here; later a rename or ALTER ... OWNER would fake an ATTACH
                attached |= set(a)
        if rec.changed and not spans_copy:
            attached |= set(rec.attached)
            detached |= set(rec.detached)
        if not attached and not detached:
            continue
        what = []
        if attached:
            what.append("attached " + ", ".join(quote_qualified(*n) for n in sorted(attached)))
        if detached:
            what.append("detached or dropped " + ", ".join(quote_qualified(*n) for n in sorted(detached)))
        raise PartitionsChanged(
            f"table {name} is published through its partitioned root and its partitions changed in window "
            f"{m.window_seq} ({m.start_lsn}..{m.end_lsn}) or just before it was committed: {'; '.join(what)}. "
            "PostgreSQL streams neither the rows an attached partition already held nor a delete for a "
            "detached one's, so its Delta table would silently miss or keep them: nothing merged from that "
            "window on",
            hint=f"pgcdc resync --slot {ctx.slot} --publication <publication> --to s3://{ctx.layout.bucket}/"
                 f"{ctx.layout.root.prefix} --tables {shlex.quote(quote_qualified(schema, table))} (a copy of "
                 "the root with its partitions now; the next merge replaces the Delta table from it and goes "
                 "on; the other tables are not affected)",
        )


def _read_expired(ctx: JobContext) -> frozenset[int]:
    """The windows ``pgcdc maintain`` removed the parts of (``expired.json``; none when
    there is no such file)."""
    from airflow_pgcdc.maintain.store import read_expired

    return frozenset(read_expired(ctx.client, ctx.layout, ctx.slot))


def _ranges_text(seqs: Sequence[int]) -> str:
    out: list[list[int]] = []
    for s in sorted(seqs):
        if out and out[-1][1] == s - 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


def _check_expired(ctx: JobContext, schema: str, table: str, windows, since: int | None, url: str,
                   merged: int | None, *, history: str | None = None) -> None:
    """Raise :class:`WindowsExpired` when one of ``windows`` whose change parts the table
    needs was expired by ``pgcdc maintain``: its parts are gone, and merging without them
    would skip changes. A window holding only a truncate of the table needs no part (the
    truncate is in the manifest). With ``since`` (a resync's point), a window whose every
    transaction committed before it is not needed (in the copy)."""
    if not ctx.expired:
        return
    needed = []
    for m in windows:
        if m.window_seq not in ctx.expired:
            continue
        if since is not None and m.last_commit_lsn and int(LSN.parse(m.last_commit_lsn)) < since:
            continue
        for t in m.tables:
            if (t["schema"], t["table"]) == (schema, table) and any(
                rv.get("parts") for rv in t.get("relation_versions", ())
            ):
                needed.append(m)
                break
    if not needed:
        return
    name = f"{schema}.{table}"
    seqs = [m.window_seq for m in needed]
    start, end = needed[0].start_lsn, needed[-1].end_lsn
    what = f"{history} table of {name}" if history else f"table {name}"
    state = (f"its Delta table {url} has merged through window {merged}" if merged is not None else
             f"its Delta table {url} has merged no window yet (missing, or rebuilt from the copy)")
    store = f"s3://{ctx.layout.bucket}/{ctx.layout.root.prefix}"
    if history:
        hint = (f"the {history} table cannot get those changes back (pgcdc resync does not rebuild history "
                f"tables): keep windows longer where history tables may be added or rebuilt (pgcdc maintain "
                f"--retention-hours N, or --no-windows); merge without --history {history} meanwhile")
    else:
        hint = (f"pgcdc resync --slot {ctx.slot} --publication <publication> --to {store} --tables "
                f"{shlex.quote(name)} (a new copy: the next merge replaces the Delta table from it and needs "
                "only the windows after it), or keep windows longer where rebuilds from the store must be "
                "possible (pgcdc maintain --retention-hours N, or --no-windows)")
    raise WindowsExpired(
        f"{what} needs the changes of window(s) {_ranges_text(seqs)} ({start}..{end}), but pgcdc maintain "
        f"removed their parts (listed in s3://{ctx.layout.bucket}/{ctx.layout.changes_prefix(ctx.slot)[:-len('changes/')]}"
        f"maintain/expired.json): {state}. Nothing of this table was read or merged",
        hint=hint, table=name, windows=seqs, start_lsn=start, end_lsn=end,
    )


def _after_point(ctx: JobContext, plan: TablePlan, windows, since: int) -> TablePlan:
    """After a resync: ``plan`` without the relation versions whose every change committed
    before its consistent point (their rows are in the copy, and so is what DDL did to the
    table then: an older column type, a rewritten column). A window that spans the point
    is read per version from its parts' ``_pgcdc_commit_lsn`` statistics."""
    import dataclasses

    import pyarrow.parquet as pq

    by_seq = {m.window_seq: m for m in windows}

    def newest(v) -> int | None:  # the version's last commit LSN, None when unknown
        top = None
        for key in v.parts:
            meta = pq.read_metadata(f"{ctx.layout.bucket}/{key}", filesystem=ctx.fs)
            idx = next((j for j in range(meta.num_columns) if meta.schema.column(j).path == COMMIT_LSN), -1)
            for i in range(meta.num_row_groups):
                stats = meta.row_group(i).column(idx).statistics if idx >= 0 else None
                if stats is None or not stats.has_min_max:
                    return None
                top = stats.max if top is None else max(top, stats.max)
        return top

    keep = []
    for v in plan.versions:
        m = by_seq[v.window_seq]
        if m.first_commit_lsn and int(LSN.parse(m.first_commit_lsn)) >= since:
            keep.append(v)
        elif m.last_commit_lsn and int(LSN.parse(m.last_commit_lsn)) < since:
            continue
        elif v.parts and (top := newest(v)) is not None and top < since:
            continue
        else:
            keep.append(v)
    if len(keep) == len(plan.versions):
        return plan
    log.info("%s: %d relation version(s) committed before the resync's point left out (in the copy)",
             plan.qualified_name, len(plan.versions) - len(keep))
    return dataclasses.replace(plan, versions=tuple(keep))


def _check_rewritten(ctx: JobContext, name: str, windows, plan: TablePlan, dt) -> None:
    """A relation version of the batch has a column the drain saw filled by a table
    rewrite (``rewritten_columns``) and the Delta table has not got it yet: adding it
    would leave its rows already there NULL, not the values PostgreSQL wrote. A column
    the Delta table has (from a copy taken after the DDL: a resync) is fine."""
    if dt is None:
        return
    have = set(pa.schema(dt.schema().to_arrow()).names)
    kept = {(v.window_seq, v.version) for v in plan.versions}
    for m in windows:
        for t in m.tables:
            if f"{t['schema']}.{t['table']}" != name:
                continue
            for rv in t["relation_versions"]:
                cols = [c for c in rv.get(REWRITTEN_FIELD, ()) if c["name"] not in have]
                if cols and (m.window_seq, int(rv["version"])) in kept:
                    raise TableRewritten(
                        f"table {name}: PostgreSQL rewrote the table to fill column(s) "
                        + ", ".join(f"{c['name']!r} ({c.get('expression', '?')})" for c in cols)
                        + f" in the rows already there (window {m.window_seq}), and logical decoding "
                        "carries none of those values: the Delta table cannot follow",
                        hint=f"pgcdc resync --slot {ctx.slot} --publication <publication> --to "
                             f"s3://{ctx.layout.bucket}/{ctx.layout.root.prefix} --tables {name} (a copy "
                             "taken after the DDL; the next merge replaces the Delta table from it; the "
                             "other tables are not affected)",
                    )


def _check_internal_names(name: str, columns: list[str], keys, toast: list[str]) -> None:
    """Names the compaction adds beside the table's columns must not be the table's own."""
    internal = {keep_column(c) for c in toast} | {MATCH_PREFIX + k for k in keys}
    clash = sorted(set(columns) & internal)
    if clash:
        raise ReservedColumnName(
            f"table {name}: column(s) {clash} have the name of a column the merge adds while it "
            "compacts the changes", hint="rename the column(s) in PostgreSQL, then pgcdc resync the table",
        )


def _nullable_type(t: pa.DataType) -> pa.DataType:
    """``t`` with every nested field nullable (Spark hands back a NULL struct's children
    as NULLs, e.g. an interval's ``months``)."""
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_nullable_type(f.type)).with_nullable(True) for f in t])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_nullable_type(t.value_type)).with_nullable(True))
    return t


def _delta_fields(fields: list[pa.Field]) -> list[pa.Field]:
    """Type-map fields → the Delta table's fields: Delta storage types, all nullable."""
    return [
        f.with_type(_nullable_type(f.type)).with_nullable(True)
        for f in to_delta_schema(pa.schema(fields))
    ]


def _unsafe_for_stats(t: pa.DataType) -> bool:
    """Whether a column of type ``t`` must be left out of the statistics: ``date`` and
    ``timestamp`` without time zone (delta-rs panics computing them for the ±infinity
    sentinels), and the types Delta's Spark engine refuses statistics for (bool, binary,
    arrays, maps), nested or not."""
    if pa.types.is_date32(t) or (pa.types.is_timestamp(t) and t.tz is None):
        return True
    if pa.types.is_boolean(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        return True
    if pa.types.is_struct(t):
        return any(_unsafe_for_stats(f.type) for f in t)
    return False


def table_configuration(fields: list[pa.Field]) -> dict[str, str] | None:
    """Delta table properties for a new table: statistics are collected for every column
    but those :func:`_unsafe_for_stats` names (docs/types.md), so both engines can write
    the table."""
    from airflow_pgcdc.merge.clauses import quote_ident

    if not any(_unsafe_for_stats(f.type) for f in fields):
        return None
    safe = [quote_ident(f.name, "spark") for f in fields if not _unsafe_for_stats(f.type)]
    return {"delta.dataSkippingStatsColumns": ",".join(safe)}


def _part_schema(ctx: JobContext, key: str) -> pa.Schema:
    import pyarrow.parquet as pq

    return pq.read_schema(f"{ctx.layout.bucket}/{key}", filesystem=ctx.fs)


def _spark_type(t: pa.DataType) -> str:
    from pyspark.sql.pandas.types import from_arrow_type

    return from_arrow_type(t).simpleString()


def _union_fields(name: str, schemas: list[tuple[str, pa.Schema]]) -> list[pa.Field]:
    """The table's columns over every relation version, first appearance first; a column
    whose type differs between versions is an incompatible change."""
    out: dict[str, pa.Field] = {}
    seen_in: dict[str, str] = {}
    for where, schema in schemas:
        for f in _table_fields(schema):
            old = out.get(f.name)
            if old is None:
                out[f.name] = f
                seen_in[f.name] = where
            elif _spark_type(old.type) != _spark_type(f.type):
                raise IncompatibleSchemaChange(
                    f"table {name}, column {f.name!r}: type changed from "
                    f"{_pg_type(old)} ({old.type}) in {seen_in[f.name]} to {_pg_type(f)} "
                    f"({f.type}) in {where}; the Delta table cannot follow",
                    hint=_type_change_hint(name),
                )
    return list(out.values())


def _pg_type(f: pa.Field) -> str:
    md = f.metadata or {}
    return (md.get(b"pg_type") or b"?").decode()


def _check_case(name: str, names: Sequence[str]) -> None:
    """Delta (and Spark) resolve column names without regard to case: ``"Name"`` and
    ``name``, two columns in PostgreSQL, cannot both live in one Delta table."""
    seen: dict[str, list[str]] = {}
    for n in names:
        seen.setdefault(n.casefold(), []).append(n)
    dups = [group for group in seen.values() if len(group) > 1]
    if dups:
        raise IncompatibleSchemaChange(
            f"table {name}: column names {'; '.join(', '.join(repr(n) for n in g) for g in dups)} differ "
            "only in case, and a Delta table's column names are case-insensitive",
            hint="rename one of them in PostgreSQL (then pgcdc resync the table), or leave it out of "
                 "the publication's column list",
        )


def _check_target(name: str, target: pa.Schema, fields: list[pa.Field]) -> list[pa.Field]:
    """New fields to add to the target; raises on a type the target cannot hold."""
    _check_case(name, sorted({f.name for f in fields} | set(target.names)))
    have = {f.name: f for f in target}
    new = []
    for f in fields:
        old = have.get(f.name)
        if old is None:
            new.append(f)
        elif _spark_type(old.type) != _spark_type(f.type):
            raise IncompatibleSchemaChange(
                f"table {name}, column {f.name!r}: the Delta table has {old.type} but the "
                f"source now sends {_pg_type(f)} ({f.type})",
                hint=_type_change_hint(name),
            )
    return new


def _type_change_hint(name: str) -> str:
    """A type change rewrote the table (``ALTER COLUMN … TYPE … USING``): no change carries
    the rows' new values, so the table is taken again."""
    return (f"pgcdc resync --tables {name} (with the pipeline's --slot, --publication and --to): a copy "
            "with the new type, the next merge replaces the Delta table from it; or cast back in "
            "PostgreSQL to the old type")


# --------------------------------------------------------------------------- bootstrap


def _snapshot_input(ctx: JobContext, snapshot, entry) -> tuple[list[str], list[pa.Field]]:
    """A snapshot table's part keys and its columns as Delta stores them."""
    base = ctx.layout.snapshot_prefix(ctx.slot, snapshot.snapshot_id)
    parts = [base + p.path for p in entry.parts]
    if not parts:
        raise MergeError(f"table {entry.qualified_name}: the snapshot {snapshot.snapshot_id} lists no part")
    _check_case(entry.qualified_name, [c.name for c in entry.columns])
    return parts, _delta_fields(_table_fields(_part_schema(ctx, parts[0])))


def _sorted_by_key(df, keys: Sequence[str]):
    """``df`` sorted by the merge key (range partitions, each sorted): the staged files,
    read in partition order, stream the rows in key order (see :mod:`.pruning`)."""
    from airflow_pgcdc.merge.compact import col

    return df.orderBy(*[col(k) for k in keys]) if keys else df


def _staged_in_order(paths: list[str]) -> list[str]:
    """The staged files in Spark partition order (``part-{partition:05d}-…``)."""
    return sorted(paths, key=lambda p: p.rsplit("/", 1)[-1])


def _resync_replace(ctx: JobContext, resync, entry, url: str, app: str, covered: int,
                    keys: Sequence[str] = ()) -> int:
    """Replace (or create) the table's Delta table from a resync's copy, in one commit that
    also records the windows the copy covers (app version ``covered``) and the resync
    itself (``{app}:resync`` = its consistent point): readers see the old table or the new
    one, never a half-built or empty one; a crash before the commit leaves the old table
    and the rerun replaces it again. Written through delta-rs whatever the engine (the
    driver streams the files that the executors staged)."""
    name = entry.qualified_name
    parts = [resync.prefix + p.path for p in entry.parts]
    if not parts:
        raise MergeError(f"table {name}: the resync {resync.url} lists no part")
    _check_case(name, [c.name for c in entry.columns])
    fields = _delta_fields(_table_fields(_part_schema(ctx, parts[0])))
    schema = pa.schema(fields)
    staging = ctx.staging(entry.schema, entry.table, "resync")
    stage(ctx, _sorted_by_key(read_parts(ctx, parts, schema), keys), staging, schema)
    paths, rows = deltars.read_staged(ctx.fs, staging)
    paths = _staged_in_order(paths)
    fault_point("merge-after-stage", log)
    point = int(resync.consistent_point)
    deltars.replace(
        url, deltars.staged_reader(ctx.fs, paths, schema), storage_options=ctx.storage,
        configuration=table_configuration(fields), target_file_size=pruning.target_bytes(ctx.target_file_mb),
        transactions={app: covered, app + RESYNC_APP_SUFFIX: point},
        metadata={"pgcdc.slot": ctx.slot, "pgcdc.resync": resync.url,
                  "pgcdc.consistent_point": resync.manifest.consistent_point,
                  "pgcdc.windows_covered": str(covered)},
    )
    log.info("%s: replaced %s from the resync at %s (%d rows; windows through %d are in the copy)",
             name, url, resync.manifest.consistent_point, rows, covered)
    return rows


def _bootstrap(ctx: JobContext, snapshot, entry, url: str, keys: Sequence[str] = ()) -> int:
    """Create the Delta table from the snapshot: rows sorted by ``keys`` (the merge key)
    in files of about ``ctx.target_file_mb`` (see :mod:`.pruning`)."""
    name = entry.qualified_name
    parts, fields = _snapshot_input(ctx, snapshot, entry)
    schema = pa.schema(fields)
    metadata = {
        "pgcdc.slot": ctx.slot,
        "pgcdc.snapshot_id": snapshot.snapshot_id,
        "pgcdc.consistent_point": snapshot.consistent_point,
    }
    df = read_parts(ctx, parts, schema)
    try:
        if ctx.engine == "delta-spark":  # executors write the files, the driver commits
            from airflow_pgcdc.merge import deltaspark
            from airflow_pgcdc.merge.compact import col

            files = pruning.file_count(sum(p.bytes for p in entry.parts), ctx.target_file_mb)
            rows = deltaspark.bootstrap(ctx.spark, df, path=deltaspark.s3a(url), metadata=metadata,
                                        configuration=table_configuration(fields),
                                        sort_by=[col(k) for k in keys], files=files)
        else:
            staging = ctx.staging(entry.schema, entry.table, "bootstrap")
            stage(ctx, _sorted_by_key(df, keys), staging, schema)
            paths, rows = deltars.read_staged(ctx.fs, staging)
            deltars.bootstrap(
                url, deltars.staged_reader(ctx.fs, _staged_in_order(paths), schema), storage_options=ctx.storage,
                configuration=table_configuration(fields), metadata=metadata,
                target_file_size=pruning.target_bytes(ctx.target_file_mb),
            )
    except deltars.TableExists:
        log.info("%s: Delta table created meanwhile by another job; not bootstrapping again", name)
        return 0
    log.info("%s: bootstrapped %s from snapshot %s (%d rows)", name, url, snapshot.snapshot_id, rows)
    return rows


# --------------------------------------------------------------------------- merge


def _batch_fields(ctx: JobContext, plan: TablePlan) -> list[pa.Field]:
    """The table's columns over the batch's relation versions, as Delta stores them."""
    schemas = []
    for v in plan.versions:
        if v.parts:
            schemas.append((f"window {v.window_seq} version {v.version}", _part_schema(ctx, v.parts[0])))
    return _delta_fields(_union_fields(plan.qualified_name, schemas))


def _missing_values(plan: TablePlan) -> dict[str, Any]:
    """``{column: pyarrow scalar in its Delta type}``: what rows older than an ``ADD COLUMN
    … DEFAULT`` read, from the batch's relation versions (the drain records them)."""
    out: dict[str, Any] = {}
    for v in plan.versions:
        if v.missing_values:
            batch = to_delta_batch(decode_missing_values(v.missing_values))
            for col_name, column in zip(batch.schema.names, batch.columns, strict=True):
                out.setdefault(col_name, column[0])
    return out


def _evolve(ctx: JobContext, name: str, url: str, dt, fields: list[pa.Field], created: dict[str, str],
            missing: dict[str, Any] | None = None):
    """The Delta table at ``url`` with every column of ``fields``: created empty when
    missing, new columns added (rows already there read ``missing[column]`` when
    PostgreSQL gives them one: ``ADD COLUMN … DEFAULT``, else NULL). Returns ``(table,
    added column names)``."""
    if dt is None:
        deltars.bootstrap(
            url, pa.RecordBatchReader.from_batches(pa.schema(fields), iter(())),
            storage_options=ctx.storage, configuration=table_configuration(fields),
            metadata={"pgcdc.slot": ctx.slot, **created},
        )
        return deltars.open_table(url, ctx.storage), []
    new = _check_target(name, pa.schema(dt.schema().to_arrow()), fields)
    if not new:
        return dt, []
    fill = {f.name: missing[f.name] for f in new if missing and f.name in missing}
    if fill:
        deltars.add_filled_columns(dt, new, fill, metadata={"pgcdc.slot": ctx.slot, "pgcdc.filled": ",".join(fill)})
    else:
        deltars.add_columns(dt, new)
    return deltars.open_table(url, ctx.storage), [f.name for f in new]


def _merge(ctx: JobContext, plan: TablePlan, url: str, dt, app: str):
    name = plan.qualified_name
    fields = _batch_fields(ctx, plan)
    dt, added = _evolve(ctx, name, url, dt, fields, {"pgcdc.created": name}, _missing_values(plan))
    target = pa.schema(dt.schema().to_arrow())
    keys = list(plan.key_columns)
    columns, toast, read_schema = _change_inputs(plan, fields, keys)
    _check_internal_names(name, columns, keys, toast)
    df = read_changes(ctx, plan, read_schema)
    # key-changing updates left TOAST values unsent: match such rows on their old key
    rekey = plan.key_moves > 0 and bool(toast)
    compacted = compact(
        df, table_columns=columns, key_columns=keys, toast_columns=toast, truncate_at=plan.truncate_at,
        rekey=rekey,
    )
    spec_args = dict(
        target_columns=target.names, source_columns=columns, key_columns=keys,
        keep_columns=toast, truncated=plan.truncate_at is not None, rekeyed=rekey,
    )
    if rekey:
        log.info("%s: %d key-changing update(s) without their TOAST values: matching them on the old key",
                 name, plan.key_moves)
    # the target bound (see .pruning): one integer key, no truncate, not rekeyed
    bound_key = None if (rekey or plan.truncate_at is not None) else pruning.prunable_key(
        keys, {f.name: f.type for f in fields})
    if ctx.engine == "delta-spark":
        from airflow_pgcdc.merge import deltaspark

        spec = build_merge_spec(**spec_args, dialect="spark")
        ranges: list = []
        if bound_key is not None:  # the batch is computed once: its keys, then the MERGE
            from pyspark import StorageLevel

            from airflow_pgcdc.merge.compact import col

            compacted = compacted.persist(StorageLevel.MEMORY_AND_DISK)
            ranges = pruning.key_ranges(compacted.select(col(bound_key)).toArrow().column(0).to_pylist())
            spec = pruning.bounded(spec, pruning.bounds_predicate(bound_key, ranges, "spark"))
        try:
            metrics = spark_commit_once(lambda: deltaspark.merge(
                ctx.spark, compacted, spec,
                path=deltaspark.s3a(url), app=app, version=plan.last_window,
                metadata=window_metadata(ctx, plan),
            ), dt, url, app, plan.last_window)
        finally:
            if bound_key is not None:
                compacted.unpersist()
        if bound_key is not None:
            metrics["pgcdc_key_ranges"] = len(ranges)
        fault_point("merge-after-commit", log)
        return metrics, dt, added
    by_name = {f.name: f for f in fields}
    stage_schema = pa.schema(
        fields
        + [META[OP], META[COMMIT_LSN], META[SEQ]]
        + [pa.field(keep_column(c), pa.bool_()) for c in toast]
        + ([by_name[k].with_name(MATCH_PREFIX + k) for k in keys] if rekey else [])
    )
    staging = ctx.staging(plan.schema, plan.table, f"w{plan.last_window}")
    stage(ctx, compacted, staging, stage_schema)
    paths, _rows = deltars.read_staged(ctx.fs, staging)
    fault_point("merge-after-stage", log)
    spec = build_merge_spec(**spec_args, dialect="delta-rs")
    ranges = []
    if bound_key is not None:  # the staged batch's keys, read on the driver (one column)
        ranges = pruning.key_ranges(deltars.staged_column(ctx.fs, paths, stage_schema, bound_key))
        spec = pruning.bounded(spec, pruning.bounds_predicate(bound_key, ranges, "delta-rs"))
    metrics = deltars.merge(
        dt, deltars.staged_reader(ctx.fs, paths, stage_schema),
        spec, app=app, version=plan.last_window,
        metadata=window_metadata(ctx, plan),
    )
    if bound_key is not None and not metrics.get("concurrent_commit"):
        metrics["pgcdc_key_ranges"] = len(ranges)
    fault_point("merge-after-commit", log)
    s3store.delete_prefix(ctx.client, ctx.layout.bucket, staging.split("/", 1)[1])
    return metrics, dt, added


def _append_only(ctx: JobContext, plan: TablePlan, url: str, dt, app: str):
    """A table without a key (logs, events, ``pgbench_history``): its inserts are appended
    in commit order, in one commit with the app transaction (exactly once per window, a
    replay is a no-op). A batch with an update, a delete or a truncate is applied as a
    multiset by :mod:`.keyless` (``REPLICA IDENTITY FULL``; else :class:`KeylessChange`
    for this table, the others go on)."""
    from pyspark.sql import functions as F

    from airflow_pgcdc.merge.compact import col as spark_col

    name = plan.qualified_name
    fields = _batch_fields(ctx, plan)
    dt, added = _evolve(ctx, name, url, dt, fields, {"pgcdc.created": name}, _missing_values(plan))
    meta = [META[OP], META[COMMIT_LSN], META[SEQ]]
    df = read_changes(ctx, plan, pa.schema(fields + meta))
    if plan.truncate_at is not None or df.where(spark_col(OP) != F.lit("I")).limit(1).collect():
        from airflow_pgcdc.merge.keyless import apply_keyless

        return apply_keyless(ctx, plan, url, dt, app, fields), dt, added
    rows = df.orderBy(COMMIT_LSN, SEQ).drop(OP, COMMIT_LSN, SEQ)
    out = pa.schema(fields)
    if ctx.engine == "delta-spark":
        from airflow_pgcdc.merge import deltaspark

        metrics = spark_commit_once(lambda: deltaspark.append(
            ctx.spark, rows, path=deltaspark.s3a(url), app=app, version=plan.last_window,
            metadata=window_metadata(ctx, plan),
        ), dt, url, app, plan.last_window)
        metrics.setdefault("num_source_rows", plan.rows)
        return metrics, dt, added
    staging = ctx.staging(plan.schema, plan.table, f"append-w{plan.last_window}")
    stage(ctx, rows, staging, out)
    paths, n = deltars.read_staged(ctx.fs, staging)
    fault_point("merge-after-stage", log)
    done = deltars.append(
        dt, deltars.staged_reader(ctx.fs, paths, out), pa.schema(dt.schema().to_arrow()),
        app=app, version=plan.last_window, metadata=window_metadata(ctx, plan),
    )
    fault_point("merge-after-commit", log)
    s3store.delete_prefix(ctx.client, ctx.layout.bucket, staging.split("/", 1)[1])
    return {"num_source_rows": n, **done}, dt, added


# --------------------------------------------------------------------------- history


CHANGELOG_SUFFIX = "__changelog"
CHANGELOG_META = (OP, COMMIT_LSN, SEQ, XID, COMMIT_TS, UNCHANGED_TOAST)


def changelog_url(delta: str, schema: str, table: str) -> str:
    """``{delta}/{schema}.{table}__changelog``: the append-only history of a table."""
    return delta_table_url(delta, schema, table) + CHANGELOG_SUFFIX


def _changelog(ctx: JobContext, schema: str, table: str, manifests, keys, entry, max_windows) -> dict:
    """Append every change row of the windows not yet in the changelog table (its own app
    transaction ``…:changelog``), as they are: one row per change, in commit order, with
    the ``_pgcdc_`` metadata; truncates are not rows (they are in the window manifests)."""
    name = f"{schema}.{table}"
    url, app = _target(ctx, schema, table, "changelog")
    dt = ctx.open(url)
    merged = deltars.merged_version(dt, app)
    windows = select_windows(manifests, after=ctx.after(name, merged), limit=max_windows)
    if not windows or not _holds(windows, schema, table):
        return {"changelog": url, "rows": 0}
    _check_expired(ctx, schema, table, windows, None, url, merged, history="changelog")
    plan = plan_table(
        windows, schema=schema, table=table, key_columns=_key_columns(name, entry, windows, keys),
        window_prefix=lambda seq: ctx.layout.window_prefix(ctx.slot, seq), keyless=True,  # rows as they are
    )
    if not plan.parts:
        return {"changelog": url, "rows": 0}
    meta = [META[n] for n in CHANGELOG_META]
    fields = _batch_fields(ctx, plan)
    dt, _added = _evolve(ctx, name, url, dt, fields + meta, {"pgcdc.changelog": name})
    schema_out = pa.schema(fields + meta)
    if ctx.engine == "delta-spark":
        from airflow_pgcdc.merge import deltaspark

        rows = plan.rows
        done = spark_commit_once(lambda: deltaspark.append(
            ctx.spark, read_parts(ctx, plan.parts, schema_out), path=deltaspark.s3a(url), app=app,
            version=plan.last_window, metadata=window_metadata(ctx, plan),
        ), dt, url, app, plan.last_window)
        if done.get("concurrent_commit"):
            return {"changelog": url, "rows": 0, "concurrent_commit": True}
        return {"changelog": url, "rows": int(done.get("numOutputRows", rows))}
    staging = ctx.staging(schema, table, f"changelog-w{plan.last_window}")
    stage(ctx, read_parts(ctx, plan.parts, schema_out), staging, schema_out)
    paths, rows = deltars.read_staged(ctx.fs, staging)
    target = pa.schema(dt.schema().to_arrow())
    done = deltars.append(
        dt, deltars.staged_reader(ctx.fs, paths, schema_out), target,
        app=app, version=plan.last_window, metadata=window_metadata(ctx, plan),
    )
    s3store.delete_prefix(ctx.client, ctx.layout.bucket, staging.split("/", 1)[1])
    if done.get("concurrent_commit"):
        return {"changelog": url, "rows": 0, "concurrent_commit": True}
    return {"changelog": url, "rows": rows}


def _change_inputs(plan: TablePlan, fields: list[pa.Field], keys) -> tuple[list[str], list[str], pa.Schema]:
    """For a batch's change rows: the table columns, those that may hold an unchanged TOAST
    value (variable-length, not a key), and the schema to read the parts with (columns,
    the old key columns, the ``_pgcdc_`` metadata the compaction needs)."""
    by_name = {f.name: f for f in fields}
    columns = [f.name for f in fields]
    latest_types = _pg_types(plan)
    toast = [c for c in columns if c not in keys and toastable(latest_types.get(c, "text"))]
    # REPLICA IDENTITY FULL in every version: the whole old row, so the compaction can tell a
    # moved row from another that took its key in the same transaction (merge.compact)
    full = bool(plan.versions) and all(v.replica_identity == "f" for v in plan.versions)
    olds = columns if full else list(keys)
    read_schema = pa.schema(
        fields
        + [by_name[k].with_name(OLD_PREFIX + k) for k in olds]
        + [META[n] for n in (OP, COMMIT_LSN, SEQ, UNCHANGED_TOAST)]
    )
    return columns, toast, read_schema


def _pg_types(plan: TablePlan) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in plan.versions:
        for c in v.columns:
            out[c["name"]] = c.get("pg_type", "text")
    return out


# --------------------------------------------------------------------------- Spark I/O


SCD2_SUFFIX = "__scd2"


def scd2_url(delta: str, schema: str, table: str) -> str:
    """``{delta}/{schema}.{table}__scd2``: the SCD type 2 history of a table."""
    return delta_table_url(delta, schema, table) + SCD2_SUFFIX


def _scd2_fields() -> list[pa.Field]:
    from airflow_pgcdc.merge.compact import HIST_OP, IS_CURRENT, VALID_FROM, VALID_TO

    return [pa.field(VALID_FROM, pa.int64()), pa.field(VALID_TO, pa.int64()),
            pa.field(IS_CURRENT, pa.bool_()), pa.field(HIST_OP, pa.string())]


def _scd2(ctx: JobContext, schema: str, table: str, snapshot, entry, manifests, keys, max_windows) -> dict:
    """Keep ``{schema}.{table}__scd2``: bootstrapped from the snapshot (every row a version
    valid from the consistent point, ``__op`` = ``S``), then one version per insert and
    update, ended by the key's next change (``__valid_to_lsn``; NULL while current), in
    one commit per batch with its own app transaction (``…:scd2``). LSNs are int64.
    A truncate ends every version current at that point at its LSN, including versions
    made earlier in the same batch."""
    from pyspark.sql import functions as F

    from airflow_pgcdc.merge.clauses import build_scd2_spec
    from airflow_pgcdc.merge.compact import (
        HIST_OP,
        IS_CURRENT,
        KIND,
        VALID_FROM,
        VALID_TO,
        scd2_rows,
    )

    name = f"{schema}.{table}"
    url, app = _target(ctx, schema, table, "scd2")
    out: dict[str, Any] = {"scd2": url, "versions": 0, "bootstrap_rows": 0}
    dt = ctx.open(url)
    if dt is None and entry is not None:
        _check_expired(ctx, schema, table, select_windows(
            manifests, after=ctx.after(name, None), consistent_point=snapshot.consistent_point,
            limit=max_windows), None, url, None, history="scd2")
        parts, fields = _snapshot_input(ctx, snapshot, entry)
        schema_h = pa.schema(fields + _scd2_fields())
        df = read_parts(ctx, parts, pa.schema(fields)).select(
            "*",
            F.lit(int(LSN.parse(snapshot.consistent_point))).cast("bigint").alias(VALID_FROM),
            F.lit(None).cast("bigint").alias(VALID_TO),
            F.lit(True).alias(IS_CURRENT),
            F.lit("S").alias(HIST_OP),
        )
        metadata = {"pgcdc.slot": ctx.slot, "pgcdc.scd2": name, "pgcdc.snapshot_id": snapshot.snapshot_id}
        if ctx.engine == "delta-spark":
            from airflow_pgcdc.merge import deltaspark

            rows = deltaspark.bootstrap(ctx.spark, df, path=deltaspark.s3a(url), metadata=metadata,
                                        configuration=table_configuration(fields))
        else:
            staging = ctx.staging(schema, table, "scd2-bootstrap")
            stage(ctx, df, staging, schema_h)
            paths, rows = deltars.read_staged(ctx.fs, staging)
            deltars.bootstrap(
                url, deltars.staged_reader(ctx.fs, paths, schema_h), storage_options=ctx.storage,
                configuration=table_configuration(fields), metadata=metadata,
            )
            s3store.delete_prefix(ctx.client, ctx.layout.bucket, staging.split("/", 1)[1])
        out["bootstrap_rows"] = rows
        dt = deltars.open_table(url, ctx.storage)
    after = ctx.after(name, deltars.merged_version(dt, app))
    consistent = snapshot.consistent_point if (after is None and entry is not None) else None
    windows = select_windows(manifests, after=after, consistent_point=consistent, limit=max_windows)
    if not windows or not _holds(windows, schema, table):
        return out
    _check_expired(ctx, schema, table, windows, None, url, deltars.merged_version(dt, app), history="scd2")
    key_columns = _key_columns(name, entry, windows, keys)
    plan = plan_table(
        windows, schema=schema, table=table, key_columns=key_columns,
        window_prefix=lambda seq: ctx.layout.window_prefix(ctx.slot, seq),
    )
    if not plan.has_work:
        return out
    fields = _batch_fields(ctx, plan)
    dt, _added = _evolve(ctx, name, url, dt, fields + _scd2_fields(), {"pgcdc.scd2": name})
    columns, toast, read_schema = _change_inputs(plan, fields, key_columns)
    rows = scd2_rows(
        read_parts(ctx, plan.parts, read_schema), table_columns=columns, key_columns=key_columns,
        toast_columns=toast, truncate_at=plan.truncate_at,
    )
    if toast:  # values not in the batch: the key's current version in the history
        files = [u[len("s3://"):] if u.startswith("s3://") else u for u in dt.file_uris()]
        hist_schema = pa.schema(fields + _scd2_fields())
        current = (
            read_files(ctx, files, hist_schema)
            .where(F.col(IS_CURRENT))
            .select(*[F.col(k) for k in key_columns], *[F.col(c).alias("_pgcdc_h_" + c) for c in toast])
        )
        rows = rows.join(current, on=list(key_columns), how="left").select(
            *[
                (F.when(F.col(keep_column(c)), F.col("_pgcdc_h_" + c)).otherwise(F.col(c)).alias(c)
                 if c in toast else F.col(c))
                for c in columns
            ],
            F.col(VALID_FROM), F.col(VALID_TO), F.col(IS_CURRENT), F.col(HIST_OP), F.col(KIND),
        )
    else:
        rows = rows.select(*columns, VALID_FROM, VALID_TO, IS_CURRENT, HIST_OP, KIND)
    stage_schema = pa.schema(fields + _scd2_fields() + [pa.field(KIND, pa.string())])
    target = pa.schema(dt.schema().to_arrow())
    truncate_lsn = plan.truncate_at[0] if plan.truncate_at is not None else None
    spec_args = dict(
        target_columns=target.names, source_columns=columns + [f.name for f in _scd2_fields()],
        key_columns=key_columns, truncate_lsn=truncate_lsn,
    )
    if ctx.engine == "delta-spark":
        from airflow_pgcdc.merge import deltaspark

        metrics = spark_commit_once(lambda: deltaspark.merge_scd2(
            ctx.spark, rows, build_scd2_spec(**spec_args, dialect="spark"), path=deltaspark.s3a(url),
            app=app, version=plan.last_window, metadata=window_metadata(ctx, plan),
        ), dt, url, app, plan.last_window)
        out["versions"] = int(metrics.get("num_target_rows_inserted", 0))
        out["closed"] = int(metrics.get("num_target_rows_updated", 0))
        return out
    staging = ctx.staging(schema, table, f"scd2-w{plan.last_window}")
    stage(ctx, rows, staging, stage_schema)
    paths, staged = deltars.read_staged(ctx.fs, staging)
    spec = build_scd2_spec(**spec_args)
    metrics = deltars.merge_scd2(
        dt, deltars.staged_reader(ctx.fs, paths, stage_schema), spec, app=app,
        version=plan.last_window, metadata=window_metadata(ctx, plan),
    )
    s3store.delete_prefix(ctx.client, ctx.layout.bucket, staging.split("/", 1)[1])
    out["versions"] = int(metrics.get("num_target_rows_inserted", 0))
    out["closed"] = int(metrics.get("num_target_rows_updated", 0))
    return out
