"""Writing one table's Delta table, either engine: the bootstrap from the snapshot (rows
sorted by the key), the replacement from a resync's copy, the MERGE of a batch of windows,
and the appends of a table without a key. Part of the merge job (:mod:`.job`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from airflow_pgcdc.changes.columns import COMMIT_LSN, COMMIT_TS, MERGED_AT, OP, SEQ
from airflow_pgcdc.faults import FaultPoint, fault_point
from airflow_pgcdc.lake.inspect import open_table
from airflow_pgcdc.lake.progress import logged_reader
from airflow_pgcdc.lake.sizing import target_bytes
from airflow_pgcdc.lake.tables import RESYNC_APP_SUFFIX
from airflow_pgcdc.merge import pruning
from airflow_pgcdc.merge.checks import check_copy, check_internal_names
from airflow_pgcdc.merge.clauses import MATCH_PREFIX, build_merge_spec, keep_column
from airflow_pgcdc.merge.compact import compact
from airflow_pgcdc.merge.context import (
    META,
    JobContext,
    read_changes,
    read_changes_on_driver,
    read_parts,
    sorted_by_key,
    stage,
    window_metadata,
)
from airflow_pgcdc.merge.errors import MergeError
from airflow_pgcdc.merge.generated import DateColumn, from_schema, refuse_infinite, with_generated
from airflow_pgcdc.merge.metadata import (
    copy_metadata,
    extra_fields,
    metadata_fields,
    reserved_clash,
    truncate_mark,
    with_deleted_at,
    with_merged_at,
)
from airflow_pgcdc.merge.metadata import now as metadata_now
from airflow_pgcdc.merge.plan import TablePlan, missing_values
from airflow_pgcdc.merge.schema import (
    batch_fields,
    change_inputs,
    check_case,
    delta_fields,
    evolve,
    part_schema,
    table_fields,
)
from airflow_pgcdc.merge.sinks import deltars
from airflow_pgcdc.merge.sinks.base import Commit
from airflow_pgcdc.protocol.lsn import LSN

log = logging.getLogger("airflow_pgcdc.merge.job")  # the job's one logger, whatever module logs


def snapshot_input(ctx: JobContext, snapshot, entry, url: str) -> tuple[list[str], list[pa.Field]]:
    """A snapshot table's part keys and its columns as Delta stores them, to create ``url``
    (:class:`CopyExpired` when ``pgcdc maintain`` removed them)."""
    check_copy(ctx, ctx.layout, ctx.slot, snapshot, entry.schema, entry.table, url)
    base = ctx.layout.snapshot_prefix(ctx.slot, snapshot.snapshot_id)
    parts = [base + p.path for p in entry.parts]
    if not parts:
        raise MergeError(f"table {entry.qualified_name}: the snapshot {snapshot.snapshot_id} lists no part")
    check_case(entry.qualified_name, [c.name for c in entry.columns])
    return parts, delta_fields(table_fields(part_schema(ctx, parts[0])))


def _driver_copy(ctx: JobContext, parts: list[str], schema: pa.Schema, keys: Sequence[str]) -> pa.Table:
    """A small copy read by the driver, sorted by the key (the order only shapes the files)."""
    from airflow_pgcdc.merge.rows.arrow import read_table

    table = read_table(ctx.fs, [f"{ctx.layout.bucket}/{p}" for p in parts], schema)
    if keys:
        try:
            table = table.sort_by([(k, "ascending") for k in keys])
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowInvalid):
            pass  # a key type Arrow does not sort: the order only shapes the files, not what they hold
    return table


def _generated(ctx: JobContext, name: str, fields: Sequence[pa.Field], dt) -> tuple[DateColumn, ...]:
    """The generated date columns of ``name``'s Delta table ``dt`` (its schema says) whose
    source column is among ``fields`` (a column dropped in PostgreSQL stays in Delta with its
    date column, neither written again), or those its options ask for when there is no table
    yet (:mod:`..generated`)."""
    if dt is None:
        return ctx.generated_columns(name, fields)
    have = {f.name for f in fields}
    return tuple(g for g in from_schema(name, pa.schema(dt.schema().to_arrow())) if g.source in have)


def _with_extras(ctx: JobContext, name: str, keys: Sequence[str], schema: pa.Schema, point: int,
                 generated: Sequence[DateColumn] = ()):
    """For a copy of the table ``name`` taken at ``point``: ``(add, schema)``: what adds
    the columns the merge keeps beside the table's own (its ``generated`` date columns; for a
    keyed table, :mod:`..metadata`; the copy's rows are as it read them, and live) to the rows
    (an Arrow table or a Spark DataFrame), and the schema with them; ``add`` is None when the
    table has none."""
    meta, soft = bool(keys) and ctx.wants_metadata_columns(name), bool(keys) and ctx.wants_soft_deletes(name)
    if not (meta or soft or generated):
        return None, schema
    if meta or soft:
        reserved_clash(name, schema.names, metadata=meta, soft=soft)
    when = metadata_now()

    def add(rows):
        refuse_infinite(name, rows, generated)
        rows = with_generated(rows, generated)
        rows = copy_metadata(rows, point, when) if meta else rows
        return with_deleted_at(rows) if soft else rows

    return add, pa.schema(list(schema) + [g.field() for g in generated] + extra_fields(meta, soft))


def _copy_rows(ctx: JobContext, entry, parts: list[str], schema: pa.Schema, keys: Sequence[str],
               what: str, point: int, generated: Sequence[DateColumn] = ()) -> tuple[pa.RecordBatchReader, int]:
    """A copied table's rows sorted by the key, and how many, for a delta-rs write: a small
    table (``ctx.driver_rows`` rows, :data:`~..rows.arrow.DRIVER_BYTES`) read by the driver
    (no Spark job, no staged file), a larger one read, sorted and staged by Spark; with the
    columns the merge keeps beside the table's own (:func:`_with_extras`; ``point``: the
    copy's consistent point; ``generated``: the table's generated date columns), last."""
    add, out = _with_extras(ctx, entry.qualified_name, keys, schema, point, generated)
    if _fits_driver(ctx, entry.rows, sum(p.bytes for p in entry.parts)):
        table = _driver_copy(ctx, parts, schema, keys)
        if add is not None:
            table = add(table)
        return table.to_reader(), table.num_rows
    staging = ctx.staging(entry.schema, entry.table, what)
    rows = sorted_by_key(read_parts(ctx, parts, schema), keys)
    if add is not None:
        rows = add(rows)
    stage(ctx, rows, staging, out)
    paths, rows = deltars.read_staged(ctx.fs, staging)
    return logged_reader(deltars.staged_reader(ctx.fs, deltars.staged_in_order(paths), out), total_rows=rows,
                         label=f"{entry.qualified_name}: {what} copy into Delta", log=log), rows


def resync_replace(ctx: JobContext, resync, entry, url: str, app: str, covered: int,
                    keys: Sequence[str] = ()) -> int:
    """Replace (or create) the table's Delta table from a resync's copy, in one commit that
    also records the windows the copy covers (app version ``covered``) and the resync
    itself (``{app}:resync`` = its consistent point): readers see the old table or the new
    one, never a half-built or empty one; a crash before the commit leaves the old table
    and the rerun replaces it again. Written through delta-rs whatever the engine (the
    driver streams the files that the executors staged)."""
    name = entry.qualified_name
    check_copy(ctx, resync.layout, resync.resync_slot, resync.manifest, entry.schema, entry.table, url)
    parts = [resync.prefix + p.path for p in entry.parts]
    if not parts:
        raise MergeError(f"table {name}: the resync {resync.url} lists no part")
    check_case(name, [c.name for c in entry.columns])
    fields = delta_fields(table_fields(part_schema(ctx, parts[0])))
    schema = pa.schema(fields)
    point = int(resync.consistent_point)
    before = open_table(url, ctx.storage)  # a table keeps its partitioning: a rebuild changes it
    generated = _generated(ctx, name, fields, before)
    reader, rows = _copy_rows(ctx, entry, parts, schema, keys, "resync", point, generated)
    fault_point(FaultPoint.MERGE_AFTER_STAGE, log)
    deltars.replace(
        url, reader, storage_options=ctx.storage,
        configuration=ctx.sink.properties(fields, by="delta-rs", table=name),
        target_file_size=target_bytes(ctx.target_file_mb),
        partition_by=(before.metadata().partition_columns if before is not None
                      else ctx.partition_columns(name, schema.names + [g.name for g in generated])),
        transactions={app: covered, app + RESYNC_APP_SUFFIX: point},
        metadata={"pgcdc.slot": ctx.slot, "pgcdc.resync": resync.url,
                  "pgcdc.consistent_point": resync.manifest.consistent_point,
                  "pgcdc.windows_covered": str(covered)},
    )
    log.info("%s: replaced %s from the resync at %s (%d rows; windows through %d are in the copy)",
             name, url, resync.manifest.consistent_point, rows, covered)
    return rows


def bootstrap_table(ctx: JobContext, snapshot, entry, url: str, keys: Sequence[str] = ()) -> int:
    """Create the Delta table from the snapshot: rows sorted by ``keys`` (the merge key)
    in files of about ``ctx.target_file_mb`` (see :mod:`.pruning`)."""
    name = entry.qualified_name
    parts, fields = snapshot_input(ctx, snapshot, entry, url)
    schema = pa.schema(fields)
    metadata = {
        "pgcdc.slot": ctx.slot,
        "pgcdc.snapshot_id": snapshot.snapshot_id,
        "pgcdc.consistent_point": snapshot.consistent_point,
    }
    add, with_extras = _with_extras(ctx, name, keys, schema, int(LSN.parse(snapshot.consistent_point)),
                                    ctx.generated_columns(name, fields))
    try:
        copy_bytes = sum(p.bytes for p in entry.parts)
        if ctx.sink.driver_batches and _fits_driver(ctx, entry.rows, copy_bytes):
            rows = _driver_copy(ctx, parts, schema, keys)  # no Spark job, no staged file
        else:
            rows = read_parts(ctx, parts, schema)
        if add is not None:
            rows, schema = add(rows), with_extras
        rows = ctx.sink.create(url, rows, schema, metadata=metadata, configuration=ctx.sink.properties(fields, table=name),
                               where=(entry.schema, entry.table, "bootstrap"), keys=keys, copy_bytes=copy_bytes,
                               partition_by=ctx.partition_columns(name, schema.names),
                               cluster_by=ctx.cluster_columns(name, schema.names))
    except deltars.TableExists:
        log.info("%s: Delta table created meanwhile by another job; not bootstrapping again", name)
        return 0
    log.info("%s: bootstrapped %s from snapshot %s (%d rows)", name, url, snapshot.snapshot_id, rows)
    return rows


def merge_batch(ctx: JobContext, plan: TablePlan, url: str, dt, app: str):
    name = plan.qualified_name
    fields = batch_fields(ctx, plan)
    # keyed tables only: this is one
    meta, soft = ctx.wants_metadata_columns(name), ctx.wants_soft_deletes(name)
    if meta or soft:
        reserved_clash(name, [f.name for f in fields], metadata=meta, soft=soft)
    generated = _generated(ctx, name, fields, dt)
    dt, added = evolve(ctx, plan, url, dt, fields + [g.field() for g in generated] + extra_fields(meta, soft),
                       {"pgcdc.created": name}, missing_values(plan))
    target = pa.schema(dt.schema().to_arrow())
    generated = _generated(ctx, name, fields, dt)
    keys = list(plan.key_columns)
    columns, toast, read_schema = change_inputs(plan, fields, keys)
    check_internal_names(name, columns, keys, toast)
    carried = columns  # the values the compaction keeps of each key's last change
    if meta or soft:  # ... and its commit time; its op and LSN the compaction keeps anyway
        carried = columns + [COMMIT_TS]
        read_schema = read_schema.append(META[COMMIT_TS])
    # key-changing updates left TOAST values unsent: match such rows on their old key
    rekey = plan.key_moves > 0 and bool(toast)
    compaction = dict(table_columns=carried, key_columns=keys, toast_columns=toast, truncate_at=plan.truncate_at,
                      rekey=rekey)
    # delta-rs merges Arrow: a small batch is compacted on the driver, without any Spark job
    batch = _compacted_on_driver(ctx, plan, read_schema, compaction) if ctx.sink.driver_batches else None
    spec_args = dict(
        target_columns=target.names,
        source_columns=carried + ([OP, COMMIT_LSN, MERGED_AT] if meta else []) + [g.name for g in generated],
        key_columns=keys,
        keep_columns=toast, truncated=plan.truncate_at is not None, rekeyed=rekey, soft_delete=soft,
        delete_values=soft and bool(plan.versions) and all(v.replica_identity == "f" for v in plan.versions),
        truncate_time=truncate_mark(plan.truncate_time, metadata_now()) if soft and plan.truncate_at else None,
    )
    if rekey:
        log.info("%s: %d key-changing update(s) without their TOAST values: matching them on the old key",
                 name, plan.key_moves)
    # the target bound (see ..pruning): one integer key, no truncate, not rekeyed
    bound_key = None if (rekey or plan.truncate_at is not None) else pruning.prunable_key(
        keys, {f.name: f.type for f in fields})
    dt = ctx.sink.before_merge(name, url, dt)
    by_name = {f.name: f for f in fields + [g.field() for g in generated]}
    stage_schema = pa.schema(
        fields
        + ([META[COMMIT_TS]] if meta or soft else [])
        + [META[OP], META[COMMIT_LSN], META[SEQ]]
        + [pa.field(keep_column(c), pa.bool_()) for c in toast]
        + ([by_name[k].with_name(MATCH_PREFIX + k) for k in keys] if rekey else [])
        + (metadata_fields()[-1:] if meta else [])
        + [g.field() for g in generated]
    )
    rows = batch if batch is not None else compact(read_changes(ctx, plan, read_schema), **compaction)
    if meta:
        rows = with_merged_at(rows, metadata_now())
    refuse_infinite(name, rows, generated, deletes=True)
    rows = with_generated(rows, generated)
    # a partitioned table whose partition columns are key columns (or the dates of key
    # columns): only the batch's partitions can hold its keys (a row changing partition
    # changes key: a delete and an insert)
    parts = list(dt.metadata().partition_columns or ())
    keyed = set(keys) | {g.name for g in generated if g.source in keys}
    values = (pruning.partition_values(rows, parts) if parts and set(parts) <= keyed and not rekey
              and plan.truncate_at is None else None)
    metrics = ctx.sink.merge(
        url, dt, rows, stage_schema,
        lambda dialect: pruning.bounded(build_merge_spec(**spec_args, dialect=dialect),
                                        pruning.partitions_predicate(values, by_name, dialect)),
        Commit(app, plan.commit_version, window_metadata(ctx, plan), plan.cut_transactions(app)),
        where=(plan.schema, plan.table, f"w{plan.last_window}"), bound_key=bound_key,
    )
    return metrics, dt, added


def _fits_driver(ctx: JobContext, rows: int, parquet_bytes: int) -> bool:
    """Whether the driver reads a batch or copy of ``rows`` rows in ``parquet_bytes`` itself
    (``--driver-rows``, 0: never; :data:`~.rows.arrow.DRIVER_BYTES`). With table workers, one
    above a quarter of either limit takes the job's turn (as a table that needs Spark does):
    the driver holds at most one such batch and a few smaller ones at once."""
    from airflow_pgcdc.merge.rows.arrow import DRIVER_BYTES

    fits = 0 < ctx.driver_rows and rows <= ctx.driver_rows and parquet_bytes <= DRIVER_BYTES
    if fits and (rows > ctx.driver_rows // 4 or parquet_bytes > DRIVER_BYTES // 4):
        ctx.take_turn()
    return fits


def _compacted_on_driver(ctx: JobContext, plan: TablePlan, read_schema: pa.Schema, args: dict):
    """The batch compacted on the driver (:mod:`.rows.arrow`) when it is small enough
    (:func:`_fits_driver`), else ``None`` (Spark compacts it)."""
    from airflow_pgcdc.merge.rows.arrow import NotOnDriver, compact_table

    if not _fits_driver(ctx, plan.rows, plan.bytes):
        return None
    try:
        return compact_table(read_changes_on_driver(ctx, plan, read_schema), **args)
    except NotOnDriver as exc:
        log.info("%s: compacted by Spark: %s", plan.qualified_name, exc)
        return None


def append_only(ctx: JobContext, plan: TablePlan, url: str, dt, app: str):
    """A table without a key (logs, events, ``pgbench_history``): its inserts are appended
    in commit order, in one commit with the app transaction (exactly once per window, a
    replay is a no-op). A batch with an update, a delete or a truncate is applied as a
    multiset by :mod:`.keyless` (``REPLICA IDENTITY FULL``; else :class:`KeylessChange`
    for this table, the others go on)."""
    from pyspark.sql import functions as F

    from airflow_pgcdc.merge.compact import col as spark_col

    name = plan.qualified_name
    fields = batch_fields(ctx, plan)
    generated = _generated(ctx, name, fields, dt)
    dt, added = evolve(ctx, plan, url, dt, fields + [g.field() for g in generated], {"pgcdc.created": name},
                       missing_values(plan))
    generated = _generated(ctx, name, fields, dt)
    meta = [META[OP], META[COMMIT_LSN], META[SEQ]]
    out = pa.schema(fields + [g.field() for g in generated])
    commit = Commit(app, plan.commit_version, window_metadata(ctx, plan), plan.cut_transactions(app))
    where = (plan.schema, plan.table, f"append-w{plan.last_window}")
    if ctx.sink.driver_batches and plan.truncate_at is None and _fits_driver(ctx, plan.rows, plan.bytes):
        small = read_changes_on_driver(ctx, plan, pa.schema(fields + meta))
        if small.num_rows == 0 or pc.all(pc.equal(small[OP], "I")).as_py():  # inserts only: no Spark job
            small = small.sort_by([(COMMIT_LSN, "ascending"), (SEQ, "ascending")]).select([f.name for f in fields])
            refuse_infinite(name, small, generated)
            small = with_generated(small, generated)
            return ctx.sink.append(url, dt, small, out, commit, where=where), dt, added
    df = read_changes(ctx, plan, pa.schema(fields + meta))
    # only the op column comes to the driver: a whole row would be turned into Python values,
    # and a ±infinity timestamp has none (ValueError: year 294247 is out of range)
    if plan.truncate_at is not None or df.where(spark_col(OP) != F.lit("I")).select(OP).limit(1).collect():
        from airflow_pgcdc.merge.keyless import apply_keyless

        return apply_keyless(ctx, plan, url, dt, app, fields, generated), dt, added
    rows = df.orderBy(COMMIT_LSN, SEQ).drop(OP, COMMIT_LSN, SEQ)
    refuse_infinite(name, rows, generated)
    rows = with_generated(rows, generated)
    metrics = ctx.sink.append(url, dt, rows, out, commit, where=where)
    metrics.setdefault("num_source_rows", plan.rows)
    return metrics, dt, added
