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
and ``merge-after-commit`` (:mod:`airflow_pgcdc.faults`).

Staged files live under ``{prefix}/{slot}/merge-staging/{run_id}/`` and are removed after
each commit; debris of a killed job older than :data:`STAGING_TTL_HOURS` is removed by
the next job.
"""


from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from airflow_pgcdc.lake.inspect import (
    NONE_MERGED,
    foreign_creator,
    latest_version,
    merged_version,
    open_table,
)
from airflow_pgcdc.lake.progress import TablesProgress
from airflow_pgcdc.lake.sizing import DEFAULT_TARGET_FILE_MB
from airflow_pgcdc.lake.tables import shared_legacy_places
from airflow_pgcdc.merge.checks import (
    after_point,
    check_columns,
    check_expired,
    check_partitions,
    check_recovery_gap,
    check_refused,
    check_rewritten,
    column_baseline,
    expired_state,
)
from airflow_pgcdc.merge.context import (
    JobContext,
    is_starter,
    remove_old_staging,
    target_url,
)
from airflow_pgcdc.merge.errors import (
    CatalogNotUpdated,
    ColumnIdentityChanged,
    IncompatibleSchemaChange,
    KeylessChange,
    MergeError,
    NeedsSnapshot,
    PartitionsChanged,
    PastThePoint,
    PointError,
    RecoveryGap,
    ReservedColumnName,
    SliceNotMerged,
    TableOfAnotherSlot,
    TableRewritten,
    TablesFailed,
    WindowGap,
    WindowOrderError,
    WindowsExpired,
)
from airflow_pgcdc.merge.history import changelog_history, scd2_history
from airflow_pgcdc.merge.options import (
    DEFAULT_TABLE_WORKERS,
    MergeOptions,
    MergeResult,
    TableResult,
)
from airflow_pgcdc.merge.plan import TablePlan, plan_table, select_windows
from airflow_pgcdc.merge.point import (
    applied_until,
    before_point,
    past_the_point,
    resolve_point,
)
from airflow_pgcdc.merge.results import FAILED_NAMED, write_detail
from airflow_pgcdc.merge.rows.arrow import DRIVER_ROWS
from airflow_pgcdc.merge.schema import merge_key_columns, with_change_data_feed
from airflow_pgcdc.merge.sinks.engines import sink_class
from airflow_pgcdc.merge.sinks.table import (
    append_only,
    bootstrap_table,
    merge_batch,
    resync_replace,
)
from airflow_pgcdc.merge.slices import pending_slices, slice_start
from airflow_pgcdc.merge.spark_io import register, s3_options
from airflow_pgcdc.merge.windows import (
    copy_refusal,
    covered_windows,
    holds_table,
    load_windows,
    pending_resync,
    renamed_from,
    table_left_pipeline,
)
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.quoting import shell_qualified
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout, new_run_id, store_argument
from airflow_pgcdc.store.manifest import committed_snapshot
from airflow_pgcdc.store.resyncs import committed_resyncs, latest_resync

__all__ = [  # the errors are merge/errors.py's, importable from here as before
    "ColumnIdentityChanged", "IncompatibleSchemaChange", "KeylessChange", "MergeResult", "NeedsSnapshot", "PartitionsChanged",
    "RecoveryGap", "ReservedColumnName", "TableResult", "TableRewritten", "TablesFailed", "WindowsExpired", "merge_slot",
]


log = logging.getLogger(__name__)


def merge_slot(
    spark,
    *,
    store: str | None = None,
    slot: str,
    delta: str,
    options: MergeOptions | Mapping[str, Any] | None = None,
    s3: Any = None,
    **fields: Any,
) -> MergeResult:
    """Bootstrap and merge every table of ``slot`` (or only ``tables``, ``schema.table``)
    with the Spark session ``spark`` (or a callable that starts one, called only when a table
    needs Spark: with delta-rs, a job whose batches are all small starts none)
    from the store at ``store`` (``s3://bucket/prefix``) into Delta tables under
    ``delta`` (``s3://bucket/lake``), reached with ``s3`` (an
    :class:`~airflow_pgcdc.store.s3.S3Settings`, or a client made by
    :func:`~airflow_pgcdc.store.s3.make_s3_client`; default: the environment's settings;
    ``source`` and ``settings``, the 0.1 names, warn), as ``options`` say: a :class:`~.options.MergeOptions`
    (or a mapping of its fields), or its fields given as keywords, which are:
    ``tables`` (only these, ``schema.table``); ``keys`` overrides merge keys per table;
    ``max_windows`` per table.
    ``engine``: ``delta-rs`` (default) or ``delta-spark`` (needs the Delta and hadoop-aws
    jars on the cluster). ``history="changelog"`` also appends every change row to
    ``{schema}.{table}__changelog``; ``history="scd2"`` keeps ``{schema}.{table}__scd2``
    (SCD type 2: one row per version of a row, with its LSN validity). ``reader``:
    ``python`` (default: a Spark Python Data Source on pyarrow's S3 filesystem) or
    ``s3a`` (Spark's own Parquet reader through hadoop-aws, for clusters that have it).
    ``target_file_mb``: the data files' size when a table is bootstrapped or replaced by a
    resync (rows sorted by the key; default :data:`~.pruning.DEFAULT_TARGET_FILE_MB`).
    ``deletion_vectors`` (delta-spark only): the tables this job creates, and those it merges
    into, get deletion vectors (see :func:`.deltaspark.enable_deletion_vectors`).
    ``lock_wait``: with delta-spark, how long to wait for ``pgcdc maintain`` holding the
    Delta root's lock (:mod:`airflow_pgcdc.lake.lock`; default 600 s).
    ``driver_rows`` (delta-rs): a table's batch of at most this many change rows is compacted
    on the driver in Arrow (:mod:`.rows.arrow`), with no Spark job; a larger one by Spark;
    0: every batch by Spark (default :data:`~.rows.arrow.DRIVER_ROWS`).
    ``table_workers``: tables merged at once by driver threads (default
    :data:`~.options.DEFAULT_TABLE_WORKERS` with delta-rs; delta-spark: one); each table's
    result, errors and commit (with its app transaction) are its own as with one.
    ``until_lsn`` / ``until_time``: replay to that point, the tables as the source was then
    (:mod:`.point`; delta-rs, no history tables)."""
    store = store_argument("merge_slot", store, "source", fields.pop("source", None))
    settings, _ = s3store.s3_argument("merge_slot", s3, fields, needs_settings=True)
    o = MergeOptions.of(options, **fields)  # the options' own checks (BadMergeOption)
    tables, keys, max_windows, engine, history, reader = o.tables, o.keys, o.max_windows, o.engine, o.history, o.reader
    deletion_vectors, lock_wait, until_lsn, until_time = o.deletion_vectors, o.lock_wait, o.until_lsn, o.until_time
    target_file_mb = DEFAULT_TARGET_FILE_MB if o.target_file_mb is None else o.target_file_mb
    sink_cls = sink_class(engine)  # the engine is chosen here, once: the rest asks the sink
    if deletion_vectors and not sink_cls.writes_deletion_vectors:
        raise MergeError(
            f"deletion vectors need --engine delta-spark (the {engine} engine writes none)",
            hint="add --engine delta-spark, or leave --deletion-vectors out")
    driver_rows = DRIVER_ROWS if o.driver_rows is None else o.driver_rows
    if o.table_workers is not None and o.table_workers > 1 and not sink_cls.concurrent_tables:
        raise MergeError(f"--table-workers {o.table_workers}: the {engine} engine merges one table at a time",
                         hint="leave --table-workers out with --engine delta-spark (its executors do the work)")
    table_workers = o.table_workers or (DEFAULT_TABLE_WORKERS if sink_cls.concurrent_tables else 1)
    until = until_lsn is not None or until_time is not None
    if until and not sink_cls.multi_transaction:
        raise PointError(
            "a replay to a point needs the delta-rs engine: its commit records two app transactions (the "
            "windows and the cut), Delta's Spark engine one",
            hint="leave --engine out for the replay; the pipeline may go on merging with delta-spark after it")
    if until and history:
        raise PointError("a replay to a point does not build history tables (changelog, SCD2)",
                         hint="leave --history out: the history tables hold every version with its LSN already")
    t0 = time.monotonic()
    layout = Layout.parse(store)
    client = s3store.make_s3_client(settings)
    if delta.startswith("s3://"):  # delta-rs commits the Delta log with If-None-Match too
        root = s3store.S3Location.parse(delta)
        s3store.check_conditional_puts(client, root.bucket, root.prefix.rstrip("/") + "/" if root.prefix else "")
    def prepared(session):  # what every table read through Spark needs of the session
        register(session)
        if sink_cls.needs_jars or reader == "s3a":
            from airflow_pgcdc.merge.jars import configure_s3a

            configure_s3a(session, settings)
            session.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")  # see SPARK_CONF
        if reader == "s3a":  # Parquet TIME columns: read, then turned into int64 µs
            session.conf.set("spark.sql.timeType.enabled", "true")
        return session

    # a session starter (spark_app.run) is called when a table first needs Spark: a job whose
    # tables are all small starts no JVM (delta-rs); delta-spark and s3a need it anyway: now
    lazy = is_starter(spark)
    if lazy and (sink_cls.needs_jars or reader == "s3a"):
        spark, lazy = spark(), False
    ctx = JobContext(
        session=(lambda: prepared(spark())) if lazy else prepared(spark), layout=layout, client=client, fs=s3store.make_pyarrow_fs(settings),
        storage=s3store.delta_storage_options(settings), slot=slot, delta=delta,
        run_id=new_run_id(), s3_options=s3_options(settings), engine=engine, history=history,
        reader=reader, target_file_mb=target_file_mb, deletion_vectors=bool(deletion_vectors),
        driver_rows=driver_rows, options=o,
    )
    ctx.sink = sink_cls(ctx)
    ctx.table_workers = table_workers
    ctx.settings = settings
    ctx.follow_credentials()
    if table_workers > 1:  # small tables at once; those that need Spark take turns
        ctx.spark_turns = threading.Lock()
    remove_old_staging(ctx)
    snapshot = committed_snapshot(client, layout, slot)
    ctx.resyncs = committed_resyncs(client, layout, slot)
    ctx.slices = committed_resyncs(client, layout, slot, slices=True)
    ctx.expired, ctx.expired_copies = expired_state(ctx)
    ctx.every_window = until
    manifests, wanted = load_windows(ctx, snapshot, tables)
    ctx.point = resolve_point(ctx, manifests, snapshot, until_lsn=until_lsn, until_time=until_time)
    ctx.legacy_shared = shared_legacy_places(
        set(wanted) | {(t.schema, t.table) for t in (snapshot.tables if snapshot else ())}
        | {(t.schema, t.table) for r in ctx.resyncs for t in r.manifest.tables})
    result = MergeResult(slot=slot, source=store, delta=delta,  # 'source': the result's key, kept
                         until=None if ctx.point is None else {"lsn": ctx.point.text, "window": ctx.point.window,
                                                               "asked": ctx.point.asked})
    # Delta's Spark engine does not commit conditionally on S3: it and pgcdc maintain hold the
    # Delta root's lock (airflow_pgcdc.lake.lock); delta-rs commits conditionally and needs none
    from airflow_pgcdc.lake.lock import root_lock_if

    with root_lock_if(not sink_cls.conditional_commits, client, delta, job=f"pgcdc merge of slot {slot} (delta-spark)",
                      wait=lock_wait):
        progress = TablesProgress(len(wanted))

        def one(name: tuple[str, str]) -> TableResult:
            res = _one(name)
            line = progress.done(res.action, rows_bootstrapped=res.bootstrap_rows, change_rows_merged=res.merged_rows)
            if line:
                log.info("slot %s: %s", slot, line)
            return res

        def _one(name: tuple[str, str]) -> TableResult:
            schema, table = name
            # one table's trouble never stops the others: it is reported, they are merged
            try:
                ctx.follow_credentials()
                res = _one_table(ctx, schema, table, snapshot, manifests, keys or {}, max_windows)
            except (WindowGap, WindowOrderError):  # the store's windows, not this table: stop
                raise
            except Exception as exc:  # noqa: BLE001 - reported per table, raised below
                log.error("%s.%s: not merged: %s", schema, table, exc, exc_info=not isinstance(exc, MergeError))
                res = TableResult(
                    table=f"{schema}.{table}", delta_url=target_url(ctx, schema, table)[0], action="failed",
                    error=f"{type(exc).__name__}: {exc}", hint=getattr(exc, "hint", None),
                )
            finally:
                ctx.release_spark_turn()
            res.left_pipeline = table_left_pipeline(manifests, schema, table)
            return res

        try:
            result.tables.extend(each_table(one, wanted, table_workers))
        finally:
            s3store.delete_prefix(client, layout.bucket, layout.merge_staging_prefix(slot, ctx.run_id))
    catalog_error = None
    if o.catalog:  # the tables are merged whatever the metastore says: it is told after
        from airflow_pgcdc.lake.catalog import CatalogError
        from airflow_pgcdc.merge.catalog import catalog_failure, sync_catalog

        try:
            catalog = sync_catalog(ctx, wanted, result.tables)
        except CatalogError as exc:
            log.error("catalog %s not brought up to date (the Delta tables are merged; the next merge tries "
                      "again): %s", o.catalog, exc)
            catalog, catalog_error = catalog_failure(exc), exc
        result = dataclasses.replace(result, catalog=catalog)
    result = dataclasses.replace(result, seconds=round(time.monotonic() - t0, 3),
                                 detail=layout.url(layout.merge_result(slot, ctx.run_id)))
    if write_detail(client, layout, slot, ctx.run_id, result.to_dict()) is None:
        result = dataclasses.replace(result, detail=None)
    if result.failed:
        shown = result.failed[:FAILED_NAMED]
        more = len(result.failed) - len(shown)
        raise TablesFailed(
            f"{len(result.failed)} of {len(result.tables)} table(s) not merged (the others were): "
            + "; ".join(f"{t.table}: {t.error}" for t in shown)
            + (f"; and {more} more (every one: {result.detail or 'the result printed'})" if more else ""),
            hint=" | ".join(f"{t.table}: {t.hint}" for t in shown if t.hint) or None,
            result=result,
        )
    if catalog_error is not None:
        raise CatalogNotUpdated(f"every table merged, but the catalog {o.catalog} was not brought up to date: "
                                f"{catalog_error}", hint=catalog_error.hint or "the next merge registers them again",
                                result=result)
    return result


def each_table(one, wanted: list[tuple[str, str]], workers: int) -> list[TableResult]:
    """``one(table)`` for every table of ``wanted``, ``workers`` at a time on driver threads
    (the job's I/O, delta-rs and Spark's job submission release the GIL: small tables' fixed
    costs, S3 round trips and commits, overlap), their results in ``wanted``'s order. A
    store-wide error (a window gap) stops the tables not started and is raised once the
    started ones end; with one worker, the tables run one after another in this thread."""
    if workers <= 1 or len(wanted) <= 1:
        return [one(name) for name in wanted]
    from concurrent.futures import ThreadPoolExecutor

    stop = threading.Event()

    def guarded(name):
        if stop.is_set():
            return None
        try:
            return one(name)
        except BaseException:
            stop.set()
            raise

    with ThreadPoolExecutor(max_workers=min(workers, len(wanted)), thread_name_prefix="pgcdc-merge") as pool:
        futures = [pool.submit(guarded, name) for name in wanted]
    return [f.result() for f in futures]  # the first store-wide error, in wanted's order


def _one_table(ctx: JobContext, schema: str, table: str, snapshot, manifests, keys, max_windows) -> TableResult:
    t0 = time.monotonic()
    name = f"{schema}.{table}"
    url, app = target_url(ctx, schema, table)
    res = TableResult(table=name, delta_url=url, action="up-to-date", app_id=app)
    entry = None
    if snapshot is not None:
        entry = next((t for t in snapshot.tables if t.schema == schema and t.table == table), None)
    found = latest_resync(ctx.resyncs, schema, table)
    pending = pending_resync(ctx, schema, table) if found else None
    dt = ctx.open(url)
    since = None
    main_entry = entry  # the history tables start from the pipeline's snapshot (a resync does not rebuild them)
    if found is not None:
        resync, entry = found  # the newest copy: its columns and key are the table's
        since = int(resync.consistent_point)
        if ctx.point is not None and since > ctx.point.lsn:  # before the copy replaces anything
            raise PastThePoint(
                f"{url} was copied again (a resync, at {resync.consistent_point}) after {ctx.point.asked} (LSN "
                f"{ctx.point.text}): the store holds no state of it at the point",
                hint="ask for a point at or after the resync's consistent point")
        if pending is not None:
            covered = covered_windows(manifests, resync.consistent_point)
            res.bootstrap_rows = resync_replace(ctx, resync, entry, url, app, covered,
                                                 merge_key_columns(name, entry, (), keys))
            res.action = "resynced"
            dt = open_table(url, ctx.storage)
    elif dt is None and entry is not None:
        # the windows the new table will need, before copying it for nothing
        check_expired(ctx, schema, table, select_windows(
            manifests, after=ctx.after(name, None), consistent_point=snapshot.consistent_point,
            limit=max_windows), None, url, None)
        res.bootstrap_rows = bootstrap_table(ctx, snapshot, entry, url, merge_key_columns(name, entry, (), keys))
        res.action = "bootstrapped"
        dt = open_table(url, ctx.storage)
    elif entry is None and snapshot is not None and holds_table(manifests, schema, table):
        if dt is None and table_left_pipeline(manifests, schema, table):
            # created after the copy and gone again (a migration's scratch table), or let go
            # with --forget-table before any copy: no Delta table, and none to make
            res.action = "skipped"
            res.note = ("not in the snapshot nor in any resync, and no longer in the pipeline (dropped, or "
                        "let go with --forget-table): its changes have no table to go to; nothing to merge")
            log.info("%s: skipped: %s", name, res.note)
            res.seconds = round(time.monotonic() - t0, 3)
            return res
        renamed = renamed_from(snapshot, ctx.resyncs, manifests, schema, table)
        left_out = copy_refusal(snapshot, ctx.resyncs, schema, table)
        if left_out is not None:
            raise NeedsSnapshot(
                f"table {name} has changes in the windows, but the copy {left_out['copy']} left it out: "
                f"{left_out['error']}",
                hint=f"{left_out.get('hint') or 'fix that'}; then pgcdc resync --slot {ctx.slot} --publication "
                     f"<publication> --store s3://{ctx.layout.bucket}/{ctx.layout.root.prefix} --tables "
                     f"{shell_qualified(schema, table)}",
            )
        raise NeedsSnapshot(
            f"table {name} has changes in the windows but is not in the slot's snapshot "
            f"({snapshot.snapshot_id}) nor in any resync: its Delta table would hold only the rows "
            "changed since it joined the publication"
            + (f". It is table {renamed[0]}.{renamed[1]} renamed (the same relation OID): the Delta table of the "
               "old name keeps its last state (left_pipeline), the new name needs its own copy" if renamed else ""),
            hint=f"pgcdc resync --slot {ctx.slot} --publication <publication> --store s3://{ctx.layout.bucket}/"
                 f"{ctx.layout.root.prefix} --tables {shell_qualified(schema, table)}; the next merge then "
                 "creates it",
        )
    last_merged = merged_version(dt, app)
    if since is None and res.action == "up-to-date" and (
            other := foreign_creator(ctx.client, dt, url, app, ctx.slot)):
        raise TableOfAnotherSlot(
            f"{url} was created by the pipeline of slot {other!r}, and slot {ctx.slot!r} never merged into "
            "it: its windows would be applied onto the other pipeline's state (after a lost slot, the "
            "changes between the two slots' starting points would be missing); nothing merged",
            hint=f"merge slot {ctx.slot} into a new Delta root (--delta), or remove this Delta table so the "
                 f"merge builds it from slot {ctx.slot}'s snapshot (its old versions go with it)",
        )
    merged = ctx.after(name, last_merged)  # anchored: windows up to there hold nothing for it
    # a replay to a point cut the window after the last whole one there: its later rows only
    applied = applied_until(dt, app, last_merged)
    if ctx.point is not None and (past := past_the_point(ctx.point, since, last_merged, applied)):
        if past == "at":
            res.delta_version = dt.version() if dt is not None else None
            res.seconds = round(time.monotonic() - t0, 3)
            return res
        raise PastThePoint(
            f"{url} already holds changes after {ctx.point.asked} (LSN {ctx.point.text}): {past}; a merge "
            "never takes changes back out", hint=f"pgcdc rebuild --tables {shell_qualified(schema, table)} "
                                                 "with the same --until-… builds it as of the point and swaps it in")
    dt = with_change_data_feed(ctx, name, url, dt)  # asked for now, the table made before (or without it)
    # slices (pgcdc resync --where) to upsert: the batch starts where the oldest one's copy ends,
    # every window's rows from there (a slice's key takes every change after its point; applying
    # the other keys' changes again is idempotent: slices need a key), all through the last one
    slices = pending_slices(ctx, schema, table, dt, app, since) if ctx.point is None else []
    row_since = since if slices else max(
        (x for x in (since, None if applied is None else applied + 1) if x is not None), default=None)
    start = slice_start(manifests, slices, merged) if slices else merged
    consistent = snapshot.consistent_point if (start is None and entry is not None and since is None) else None
    windows = select_windows(manifests, after=start, consistent_point=consistent,
                             limit=None if slices else max_windows)
    if ctx.point is not None:
        windows = [w for w in windows if w.start <= ctx.point.lsn]
    check_recovery_gap(ctx, schema, table, windows, since)  # after pgcdc recover: copied past the gap?
    # partitions attached or detached since the copy: refused, history included
    copied_at = since if since is not None else (
        int(LSN.parse(snapshot.consistent_point)) if snapshot is not None and entry is main_entry else None)
    check_partitions(ctx, schema, table, windows, entry, copied_at)
    check_expired(ctx, schema, table, windows, since, url, last_merged)
    # history first: its own app transaction, committed before the table's merge, so a
    # crash between the two leaves the history ahead, never behind
    if ctx.history == "changelog":
        res.history = changelog_history(ctx, schema, table, manifests, keys, main_entry, max_windows)
    elif ctx.history == "scd2":
        res.history = scd2_history(ctx, schema, table, snapshot, main_entry, manifests, keys, max_windows)
    if (not windows or not holds_table(windows, schema, table)) and not slices:
        if (windows or merged != last_merged) and res.action == "up-to-date":
            res.action = "no-changes"
        res.delta_version = dt.version() if dt is not None else None
        res.seconds = round(time.monotonic() - t0, 3)
        return res
    check_refused(schema, table, windows, since)
    key_columns = merge_key_columns(name, entry, windows, keys)
    if slices and not key_columns:
        raise SliceNotMerged(f"{name} has no key: the rows of the slice {slices[-1].url} cannot be matched to the "
                             "Delta table's", hint=f"resync the whole table: pgcdc resync --tables "
                                                   f"{shell_qualified(schema, table)}")
    if windows:
        plan = plan_table(
            windows, schema=schema, table=table, key_columns=key_columns,
            window_prefix=lambda seq: ctx.layout.window_prefix(ctx.slot, seq), keyless=not key_columns,
            since_lsn=row_since, until_lsn=None if ctx.point is None else ctx.point.lsn,
        )
    else:  # slices only: the table holds every window
        last = NONE_MERGED if last_merged is None else last_merged
        at = str(LSN(slices[-1].lsn))
        plan = TablePlan(schema=schema, table=table, key_columns=tuple(key_columns), first_window=last + 1,
                         last_window=last, start_lsn=at, end_lsn=at, since_lsn=row_since)
    if slices:
        plan = dataclasses.replace(plan, slices=tuple(slices))
        res.note = "upserted the slice(s) " + "; ".join(f"{s.url} (WHERE {s.where})" for s in slices)
    if row_since is not None:
        plan = after_point(ctx, plan, windows, row_since)
    if ctx.point is not None:
        plan = before_point(ctx, plan, windows, ctx.point.lsn)
    check_rewritten(ctx, schema, table, windows, plan, dt)
    copy_where = (f"the resync copy at {resync.consistent_point}" if since is not None
                  else f"the snapshot at {snapshot.consistent_point}" if snapshot is not None else "the copy")
    check_columns(ctx, schema, table, windows, plan, dt, column_baseline(
        ctx, schema, table, manifests, entry, copy_where, last_merged, since,
        from_copy=res.action in ("bootstrapped", "resynced")))
    res.first_window, res.last_window = plan.first_window, plan.last_window
    res.start_lsn, res.end_lsn = plan.start_lsn, plan.end_lsn
    res.change_rows, res.truncates = plan.rows, plan.truncates
    if not plan.has_work:
        res.action = "no-changes" if res.action == "up-to-date" else res.action
        res.delta_version = dt.version() if dt is not None else None
        res.seconds = round(time.monotonic() - t0, 3)
        return res
    merge = merge_batch if plan.key_columns else append_only
    if not plan.key_columns:
        unkept = [o for o, on in (("metadata_columns", ctx.wants_metadata_columns(name)),
                                  ("soft_deletes", ctx.wants_soft_deletes(name))) if on]
        if unkept:  # asked, and not done: said, not left to be found out
            res.note = (f"{', '.join(unkept)} asked but not applied: {name} has no key (its rows are matched "
                        "on every column; deleted rows are removed)")
            log.warning("%s: %s", name, res.note)
    metrics, dt, added = merge(ctx, plan, url, dt, app)
    res.metrics = metrics
    res.added_columns = added
    res.merged_rows = int(metrics.get("num_source_rows", 0))
    res.action = f"{res.action}+merged" if res.action in ("bootstrapped", "resynced") else "merged"
    if metrics.get("concurrent_commit"):
        res.action = "merged-by-concurrent-job"
    res.delta_version = latest_version(dt, url, ctx.storage)  # the commits after dt's only
    res.seconds = round(time.monotonic() - t0, 3)
    log.info(
        "%s: windows %s..%s (%s..%s), %d change rows -> %d merged rows, Delta version %s, %.1fs",
        name, plan.first_window, plan.last_window, plan.start_lsn, plan.end_lsn,
        plan.rows, res.merged_rows, res.delta_version, res.seconds,
    )
    return res
