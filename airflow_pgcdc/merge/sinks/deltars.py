"""The delta-rs sink's driver side: one Delta commit from the files a Spark job staged.

* :func:`bootstrap` creates the table from the staged snapshot rows in one commit
  (``mode="error"``: creation is atomic, a concurrent or repeated bootstrap finds the
  table there and stops, see :class:`TableExists`), with the snapshot in the commit's
  metadata.
* :func:`merge` runs one delta-rs MERGE (streamed source: the staged Parquet files read
  batch by batch) with the clauses of :mod:`.clauses`, committing the app transaction
  ``(app_id, version)`` and the window range in the commit's metadata. The app
  transaction makes a replay a no-op: the caller checks
  :func:`merged_version` before, and a commit is all or nothing (delta-rs writes the log
  entry with a conditional put), so a job killed mid-way leaves the previous version.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from airflow_pgcdc.lake.inspect import NONE_MERGED, app_version, merged_version, unreadable_features
from airflow_pgcdc.merge.clauses import MergeSpec
from airflow_pgcdc.merge.errors import MergeError

__all__ = [
    "CONCURRENT", "ConcurrentCommit", "TableExists", "UnreadableFeatures", "add_columns", "add_filled_columns",
    "append", "bootstrap", "commit_once", "merge", "merge_scd2", "plain_dataset", "read_staged", "replace", "staged_in_order",
    "staged_column", "staged_reader", "swap",
]

log = logging.getLogger(__name__)
BATCH_ROWS = 65_536


class TableExists(MergeError):
    """The Delta table already exists (a bootstrap ran before)."""


class ConcurrentCommit(MergeError):
    """Another writer committed to the Delta table between this job's read and its commit,
    and that commit was not this window's merge: rerun the job (nothing was written)."""


class UnreadableFeatures(MergeError):
    """The Delta table uses a feature delta-rs' pyarrow datasets read wrong (column mapping:
    every column NULL; deletion vectors: deleted rows back), so the delta-rs engine must not
    copy its rows."""




def current_rows(table) -> pa.RecordBatchReader:
    """The table's live rows as record batches: a plain dataset scan, or, for a table with
    deletion vectors (and no other feature :func:`unreadable_features` names), delta-rs'
    SQL engine, which applies them (deleted rows left out; checked against Delta's Spark
    engine in ``test_deletion_vectors.py``)."""
    features = unreadable_features(table)
    if features == ["deletion vectors"]:
        from deltalake import QueryBuilder

        return pa.RecordBatchReader.from_stream(QueryBuilder().register("t", table).execute("SELECT * FROM t"))
    return plain_dataset(table).scanner(batch_size=BATCH_ROWS).to_reader()


def plain_dataset(table):
    """``table.to_pyarrow_dataset()``, refused (:class:`UnreadableFeatures`) for a table
    that dataset would read wrong."""
    features = unreadable_features(table)
    if features:
        raise UnreadableFeatures(
            f"Delta table {table.table_uri} uses {' and '.join(features)}: the delta-rs engine would read its "
            "rows wrong",
            hint="merge this table with --engine delta-spark (which created it so)",
        )
    return table.to_pyarrow_dataset()


CONCURRENT = {"concurrent_commit": True, "num_source_rows": 0}
"""What :func:`merge`, :func:`merge_scd2` and :func:`append` return when a concurrent job
committed the same app transaction version first (the window is merged, once)."""


def _refused_by_delta_rs(exc: BaseException) -> bool:
    from deltalake.exceptions import CommitFailedError

    return isinstance(exc, CommitFailedError)


def commit_once(run, table, *, url: str, app: str, version: int,
                refused: Callable[[BaseException], bool] = _refused_by_delta_rs,
                cut: dict[str, int] | None = None) -> dict[str, Any]:
    """``run()``: a commit carrying the app transaction ``(app, version)``, made against
    ``table``'s loaded version (``table``: a delta-rs handle, whichever engine commits).
    If ``table`` already holds ``version`` (the caller's handle was reloaded after another
    job merged the window), nothing is done. When the engine refuses the commit because
    another one won the race (``refused(exc)``; two merge jobs of one slot at once: an
    overlapping Airflow run, a manual rerun), the table is reloaded: if it holds
    ``version`` or later, the other job merged this window, which is a success here
    (:data:`CONCURRENT`); anything else is :class:`ConcurrentCommit`. ``cut``: the commit
    also records a cut window's point (``{cut app id: LSN}``, :mod:`.point`): the table has
    reached it when it holds window ``version + 1`` whole, or ``version`` and that cut."""

    def reached() -> int | None:  # the table's merged window when it is version or later
        if not cut:
            done = merged_version(table, app)
            return done if done is not None and done >= version else None
        raw = app_version(table, app)
        raw = NONE_MERGED if raw is None else raw
        if raw > version or (raw == version and all((app_version(table, a) or -1) >= v
                                                    for a, v in cut.items())):
            return raw
        return None

    done = reached()
    if done is not None:
        log.warning("Delta table %s: window %d is already merged (at window %d); nothing to do", url, version, done)
        return dict(CONCURRENT)
    try:
        return run()
    except Exception as exc:
        if not refused(exc):
            raise
        table.update_incremental()
        done = reached()
        if done is not None:
            log.warning(
                "Delta table %s: window %d was committed by a concurrent job (now at window %d); "
                "this job's commit was refused, nothing written twice", url, version, done,
            )
            return dict(CONCURRENT)
        raise ConcurrentCommit(
            f"Delta table {url}: another writer committed while this job merged window {version} "
            f"({str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__}); "
            "nothing was written, rerun the merge"
        ) from exc














def staged_in_order(paths: list[str]) -> list[str]:
    """The staged files in Spark partition order (``part-{partition:05d}-…``): a sorted
    DataFrame's rows, read in this order, come in key order."""
    return sorted(paths, key=lambda p: p.rsplit("/", 1)[-1])


def read_staged(fs, staging: str) -> tuple[list[str], int]:
    """The files and row count a staging writer committed (``_staged.json``)."""
    from airflow_pgcdc.merge.spark_io import STAGED_LIST

    with fs.open_input_stream(staging.rstrip("/") + "/" + STAGED_LIST) as f:
        doc = json.loads(f.read())
    return list(doc["paths"]), int(doc["rows"])


def staged_reader(fs, paths: list[str], schema: pa.Schema) -> pa.RecordBatchReader:
    """A stream of the staged rows (bounded memory: one batch at a time)."""
    import pyarrow.dataset as ds

    if not paths:
        return pa.RecordBatchReader.from_batches(schema, iter(()))
    dataset = ds.dataset(paths, format="parquet", filesystem=fs, schema=schema)
    return dataset.scanner(batch_size=BATCH_ROWS).to_reader()


def staged_column(fs, paths: list[str], schema: pa.Schema, column: str) -> list:
    """One column of the staged rows, as Python values (the merge's key bounds)."""
    import pyarrow.dataset as ds

    if not paths:
        return []
    dataset = ds.dataset(paths, format="parquet", filesystem=fs, schema=schema)
    return dataset.to_table(columns=[column]).column(0).to_pylist()


def bootstrap(url: str, reader: pa.RecordBatchReader, *,
              storage_options: dict[str, str], metadata: dict[str, str],
              configuration: dict[str, str] | None = None, target_file_size: int | None = None,
              partition_by: Sequence[str] = ()) -> None:
    """Create the table from ``reader``'s rows in one commit; files of about
    ``target_file_size`` bytes, in the order the rows come (delta-rs' default when None);
    partitioned by ``partition_by``."""
    from deltalake import CommitProperties, write_deltalake

    try:
        write_deltalake(
            url, reader, mode="error", storage_options=storage_options, configuration=configuration,
            target_file_size=target_file_size, partition_by=list(partition_by) or None,
            commit_properties=CommitProperties(custom_metadata=metadata),
        )
    except Exception as e:  # delta-rs raises its own DeltaError for an existing table
        if "already exists" in str(e).lower():
            raise TableExists(f"Delta table {url} already exists") from None
        raise


def replace(url: str, reader: pa.RecordBatchReader, *, storage_options: dict[str, str],
            configuration: dict[str, str] | None, transactions: dict[str, int],
            metadata: dict[str, str], target_file_size: int | None = None, partition_by: Sequence[str] = ()) -> None:
    """Overwrite the Delta table at ``url`` (created when missing) with ``reader``'s rows and
    schema in one commit that also sets the app transactions ``transactions``."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    write_deltalake(
        url, reader, mode="overwrite", schema_mode="overwrite", storage_options=storage_options,
        configuration=configuration, target_file_size=target_file_size, partition_by=list(partition_by) or None,
        commit_properties=CommitProperties(
            app_transactions=[Transaction(a, v) for a, v in transactions.items()], custom_metadata=metadata,
        ),
    )


def _transactions(app: str, version: int, cut: dict[str, int] | None) -> list:
    from deltalake import Transaction

    return [Transaction(a, v) for a, v in {app: version, **(cut or {})}.items()]


def merge(table, reader: pa.RecordBatchReader, spec: MergeSpec, *, app: str, version: int,
          metadata: dict[str, str], cut: dict[str, int] | None = None) -> dict[str, Any]:
    """One MERGE commit; returns delta-rs' metrics. ``cut``: app transactions of a replay to
    a point recorded beside ``(app, version)`` (:mod:`.point`)."""
    from deltalake import CommitProperties

    merger = table.merge(
        reader,
        predicate=spec.predicate,
        source_alias="s",
        target_alias="t",
        streamed_exec=True,
        commit_properties=CommitProperties(
            app_transactions=_transactions(app, version, cut), custom_metadata=metadata
        ),
    )
    if spec.delete_updates is not None:  # soft deletes: the row is marked, not removed
        merger = merger.when_matched_update(updates=spec.delete_updates, predicate=spec.delete_when)
    else:
        merger = merger.when_matched_delete(predicate=spec.delete_when)
    if spec.updates:  # a keyless batch has none (see clauses.build_keyless_spec)
        merger = merger.when_matched_update(updates=spec.updates, predicate=spec.update_when)
    merger = merger.when_not_matched_insert(updates=spec.inserts, predicate=spec.insert_when)
    if spec.delete_not_matched_by_source:
        merger = merger.when_not_matched_by_source_delete()
    if spec.not_matched_by_source_updates:
        merger = merger.when_not_matched_by_source_update(updates=spec.not_matched_by_source_updates,
                                                          predicate=spec.not_matched_by_source_when)
    return commit_once(merger.execute, table, url=table.table_uri, app=app, version=version, cut=cut)


def append(table, reader: pa.RecordBatchReader, target: pa.Schema, *, app: str, version: int,
           metadata: dict[str, str], mode: str = "append", cut: dict[str, int] | None = None) -> dict[str, Any]:
    """Append rows (conformed to ``target``, the table's schema) to ``table`` (the
    DeltaTable the caller read the last merged window from) in one commit that records the
    app transaction ``(app, version)``. Returns ``{}``, or :data:`CONCURRENT`.
    ``mode="overwrite"``: the rows replace the table's (a keyless table's truncate).

    The commit is made against ``table``'s version, not the latest: a window another job
    appended since then makes delta-rs refuse it (an append to a fresh handle would not
    conflict with anything and would add the rows twice)."""
    from deltalake import CommitProperties, write_deltalake

    from airflow_pgcdc.merge.spark_io import conform

    conformed = pa.RecordBatchReader.from_batches(target, (conform(b, target) for b in reader))

    def run() -> dict[str, Any]:
        write_deltalake(
            table, conformed, mode=mode,
            commit_properties=CommitProperties(
                app_transactions=_transactions(app, version, cut), custom_metadata=metadata
            ),
        )
        return {}

    return commit_once(run, table, url=table.table_uri, app=app, version=version, cut=cut)


def add_columns(table, fields: list[pa.Field]) -> None:
    """Add new nullable columns (a schema change in PostgreSQL) in their own commit."""
    from deltalake import Schema

    if not fields:
        return
    delta_fields = Schema.from_arrow(pa.schema([f.with_nullable(True) for f in fields])).fields
    table.alter.add_columns(list(delta_fields))
    log.info("Delta table %s: added column(s) %s", table.table_uri, [f.name for f in fields])


def add_filled_columns(table, fields: list[pa.Field], values: dict[str, Any], *,
                       metadata: dict[str, str]) -> None:
    """Add new columns whose existing rows read a value (``values[name]``, a pyarrow scalar:
    an ``ADD COLUMN … DEFAULT`` in PostgreSQL), in ONE commit: the table's rows are
    rewritten with the columns set (readers see the table without the columns or with them
    filled, never NULLs first). Columns not in ``values`` are NULL. The rows stream
    through the driver; the cost is one rewrite of the table."""
    from deltalake import CommitProperties, write_deltalake

    current = pa.schema(table.schema().to_arrow())
    target = pa.schema(list(current) + [f.with_nullable(True) for f in fields])
    source = current_rows(table)

    def batches():
        for batch in source:
            extra = [
                pa.repeat(values[f.name].cast(f.type), batch.num_rows) if f.name in values
                else pa.nulls(batch.num_rows, f.type)
                for f in fields
            ]
            mine = [batch.column(f.name).cast(f.type) for f in current]  # SQL reads may widen types
            yield pa.RecordBatch.from_arrays(mine + extra, schema=target)

    write_deltalake(
        table, pa.RecordBatchReader.from_batches(target, batches()), mode="overwrite", schema_mode="merge",
        commit_properties=CommitProperties(custom_metadata=metadata),
    )
    log.info("Delta table %s: added column(s) %s, existing rows set to their ADD COLUMN default(s) %s",
             table.table_uri, [f.name for f in fields], sorted(values))


def swap(rebuilt_url: str, live_url: str, *, app: str, storage_options: dict[str, str],
         metadata: dict[str, str], target_file_size: int | None = None, rebuilt=None) -> dict[str, Any]:
    """Make the live table hold what a rebuilt table holds, in ONE commit on the live table
    (an overwrite: readers see the old contents or the new, never a mix, and time travel
    keeps the old versions). The commit carries the rebuilt table's app transaction
    version, so the next merge continues from the window the rebuild reached (windows the
    live table had merged beyond it are merged again: a merge is idempotent per key).
    A live table that does not exist is created. The rebuilt table's layout is kept: its
    properties (``configuration``: deletion vectors, column mapping, data skipping), its
    rows in its files' order (sorted by the key when the rebuild sorted them), in files of
    ``target_file_size`` bytes (delta-rs' default when None). ``rebuilt``: the rebuilt
    table when the caller opened it already (its log is read once)."""
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    from airflow_pgcdc.lake.tables import cut_app

    rebuilt = rebuilt if rebuilt is not None else DeltaTable(rebuilt_url, storage_options=storage_options)
    version = merged_version(rebuilt, app)
    reader = plain_dataset(rebuilt).scanner(batch_size=BATCH_ROWS).to_reader()
    # always the app transaction, NONE_MERGED when the rebuilt table holds no window whole:
    # the live table's own would otherwise stay, and the next merge would start after it;
    # and the cut of the window after it when the rebuild replayed to a point (merge/point.py)
    cut = cut_app(app, NONE_MERGED + 1 if version is None else version + 1)
    point = rebuilt.transaction_version(cut)
    txns = [Transaction(app, NONE_MERGED if version is None else version)] + (
        [Transaction(cut, point)] if point is not None else [])
    write_deltalake(
        live_url, reader, mode="overwrite", schema_mode="overwrite", storage_options=storage_options,
        configuration=dict(rebuilt.metadata().configuration) or None, target_file_size=target_file_size,
        # the rebuilt table's partitioning (None: the live table's stays; delta-rs takes no "none")
        partition_by=list(rebuilt.metadata().partition_columns) or None,
        commit_properties=CommitProperties(app_transactions=txns, custom_metadata=metadata),
    )
    live = DeltaTable(live_url, storage_options=storage_options)
    return {"live": live_url, "rebuilt": rebuilt_url, "window": version, "live_version": live.version()}


def merge_scd2(table, reader: pa.RecordBatchReader, spec, *, app: str, version: int,
               metadata: dict[str, str]) -> dict[str, Any]:
    """One SCD type 2 MERGE commit (:class:`~airflow_pgcdc.merge.clauses.Scd2Spec`)."""
    from deltalake import CommitProperties, Transaction

    merger = table.merge(
        reader, predicate=spec.predicate, source_alias="s", target_alias="t", streamed_exec=True,
        commit_properties=CommitProperties(
            app_transactions=[Transaction(app, version)], custom_metadata=metadata
        ),
    )
    merger = merger.when_matched_update(updates=spec.close_updates)
    merger = merger.when_not_matched_insert(updates=spec.inserts, predicate=spec.insert_when)
    if spec.close_all_updates is not None:
        merger = merger.when_not_matched_by_source_update(
            updates=spec.close_all_updates, predicate=spec.close_all_when
        )
    return commit_once(merger.execute, table, url=table.table_uri, app=app, version=version)


