"""The two :class:`~.base.DeltaSink` implementations, one per ``--engine``:

* :class:`DeltaRsSink` (``delta-rs``, the default): Spark (when it runs at all) stages the
  rows as Parquet under the job's staging prefix, and the driver commits them with delta-rs
  (small batches come as Arrow and skip Spark); every commit is a conditional put and may
  record several app transactions.
* :class:`DeltaSparkSink` (``delta-spark``): Delta's Spark engine writes and commits (the
  executors write the files, the driver commits one app transaction per commit).

Fault points (:mod:`airflow_pgcdc.faults`): ``merge-after-stage`` once a commit's rows are
staged (delta-rs), ``merge-after-commit`` once it is made (both), for every table kind.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from airflow_pgcdc.faults import FaultPoint, fault_point
from airflow_pgcdc.lake.inspect import clustered
from airflow_pgcdc.lake.progress import logged_reader
from airflow_pgcdc.lake.sizing import target_bytes
from airflow_pgcdc.lake.tables import CHANGE_DATA_FEED
from airflow_pgcdc.merge import pruning
from airflow_pgcdc.merge.context import read_table_files, sorted_by_key, spark_commit_once, stage
from airflow_pgcdc.merge.errors import MergeError
from airflow_pgcdc.merge.sinks import deltars
from airflow_pgcdc.merge.sinks.base import Commit, DeltaSink
from airflow_pgcdc.store import s3 as s3store

__all__ = ["SINKS", "DeltaRsSink", "DeltaSparkSink", "sink_class"]

log = logging.getLogger("airflow_pgcdc.merge.job")  # the job's one logger, whatever module logs


def _col(name: str):
    from airflow_pgcdc.merge.compact import col

    return col(name)


class DeltaRsSink(DeltaSink):
    engine = "delta-rs"
    dialect = "delta-rs"
    driver_batches = True
    multi_transaction = True
    writes_deletion_vectors = False
    conditional_commits = True
    needs_jars = False
    concurrent_tables = True

    def __init__(self, ctx) -> None:
        """Refuses a job whose tables ask for liquid clustering: delta-rs 1.6.6 writes no
        clustered table (:func:`~airflow_pgcdc.lake.inspect.clustered`)."""
        super().__init__(ctx)
        options = getattr(ctx, "options", None)
        asked = sorted(t for t, given in (options.table_options if options is not None else {}).items()
                       if given.get("cluster_by"))
        if asked:
            from airflow_pgcdc.merge.options import BadMergeOption

            raise BadMergeOption(
                f"table_options[{asked[0]!r}]['cluster_by']"
                + (f" (and the cluster_by of {', '.join(asked[1:])})" if asked[1:] else "")
                + ": liquid clustering is Delta's Spark engine's; the delta-rs engine (delta-rs 1.6.6) cannot "
                  "write a clustered table",
                hint="add --engine delta-spark (engine='delta-spark'), or leave cluster_by out")

    def _writable(self, url: str, dt, name: str) -> None:
        """Refuses a commit to a liquid-clustered table (made by Delta's Spark engine): delta-rs
        would fail it after the work, with ``Unsupported table features required``."""
        if dt is not None and clustered(dt):
            raise MergeError(
                f"table {name}: its Delta table {url} is liquid-clustered (writer feature 'clustering'), and "
                "delta-rs 1.6.6 commits nothing to a clustered table",
                hint="merge it with --engine delta-spark (engine='delta-spark'), as the job that clustered it did")

    # -- staging: a Spark job's rows as Parquet files the driver streams into the commit
    def _stage(self, df, schema: pa.Schema, where: tuple[str, str, str]) -> tuple[str, list[str], int]:
        ctx = self.ctx
        staging = ctx.staging(*where)
        stage(ctx, df, staging, schema)
        paths, rows = deltars.read_staged(ctx.fs, staging)
        return staging, paths, rows

    def _unstage(self, staging: str | None) -> None:
        if staging is not None:
            s3store.delete_prefix(self.ctx.client, self.ctx.layout.bucket, staging.split("/", 1)[1])

    def _rows(self, rows, schema: pa.Schema, where: tuple[str, str, str], *, ordered: bool = False):
        """``(reader, row count, staging folder, staged files)`` of ``rows``: an Arrow table as
        it is (no staging: ``None, []``), a Spark DataFrame staged first."""
        if isinstance(rows, pa.Table):
            return rows.cast(schema).to_reader(), rows.num_rows, None, []
        staging, paths, n = self._stage(rows, schema, where)
        paths = deltars.staged_in_order(paths) if ordered else paths
        reader = logged_reader(deltars.staged_reader(self.ctx.fs, paths, schema), total_rows=n, log=log,
                               label=f"{where[0]}.{where[1]}: {where[2]} into Delta")  # a big one takes minutes
        return reader, n, staging, paths

    def create(self, url, rows, schema, *, metadata, configuration, where, keys=(), copy_bytes=None,
               sized=True, partition_by=(), cluster_by=()) -> int:
        if cluster_by:  # refused with the job (__init__): never reached
            raise MergeError(f"table {where[0]}.{where[1]}: delta-rs cannot create a liquid-clustered table",
                             hint="--engine delta-spark")
        if not isinstance(rows, pa.Table):
            rows = sorted_by_key(rows, keys)
        reader, n, staging, _ = self._rows(rows, schema, where, ordered=True)
        try:
            deltars.bootstrap(
                url, reader, storage_options=self.ctx.storage, configuration=configuration,
                metadata=dict(metadata), target_file_size=target_bytes(self.ctx.target_file_mb) if sized else None,
                partition_by=partition_by,
            )
        finally:
            self._unstage(staging)
        return n

    def append(self, url, dt, rows, schema, commit, *, where, mode="append") -> dict[str, Any]:
        self._writable(url, dt, f"{where[0]}.{where[1]}")
        reader, n, staging, _ = self._rows(rows, schema, where)
        fault_point(FaultPoint.MERGE_AFTER_STAGE, log)
        done = deltars.append(dt, reader, pa.schema(dt.schema().to_arrow()), app=commit.app,
                              version=commit.version, cut=dict(commit.cut), metadata=dict(commit.metadata), mode=mode)
        fault_point(FaultPoint.MERGE_AFTER_COMMIT, log)
        self._unstage(staging)
        return {"num_source_rows": n, **({"pgcdc_compacted_on": "driver"} if staging is None else {}), **done}

    def merge(self, url, dt, rows, schema, spec, commit, *, where, bound_key=None, scd2=False) -> dict[str, Any]:
        self._writable(url, dt, f"{where[0]}.{where[1]}")
        reader, n, staging, paths = self._rows(rows, schema, where)
        fault_point(FaultPoint.MERGE_AFTER_STAGE, log)
        built = spec(self.dialect)
        ranges: list = []
        if bound_key is not None:  # the batch's keys, read on the driver (one column)
            ranges = pruning.key_ranges(rows.column(bound_key).to_pylist() if staging is None
                                        else deltars.staged_column(self.ctx.fs, paths, schema, bound_key))
            built = pruning.bounded(built, pruning.bounds_predicate(bound_key, ranges, self.dialect))
        if scd2:
            metrics = deltars.merge_scd2(dt, reader, built, app=commit.app, version=commit.version,
                                         metadata=dict(commit.metadata))
        else:
            metrics = deltars.merge(dt, reader, built, app=commit.app, version=commit.version, cut=dict(commit.cut),
                                    metadata=dict(commit.metadata))
        if bound_key is not None and not metrics.get("concurrent_commit"):
            metrics["pgcdc_key_ranges"] = len(ranges)
        metrics["pgcdc_compacted_on"] = "driver" if staging is None else "spark"
        fault_point(FaultPoint.MERGE_AFTER_COMMIT, log)
        self._unstage(staging)
        return metrics

    def keyless(self, url, dt, rows, source, fields, spec, commit, *, where) -> dict[str, Any]:
        from airflow_pgcdc.changes.columns import KIND

        self._writable(url, dt, f"{where[0]}.{where[1]}")
        schema = pa.schema(list(fields) + ([pa.field(KIND, pa.string())] if source is not None else []))
        reader, n, staging, _ = self._rows(source if source is not None else rows, schema, where)
        fault_point(FaultPoint.MERGE_AFTER_STAGE, log)
        if source is not None and n:
            metrics = deltars.merge(dt, reader, spec(self.dialect), app=commit.app, version=commit.version,
                                    cut=dict(commit.cut), metadata=dict(commit.metadata))
        else:  # a truncate's rows, or nothing to change (the app transaction alone)
            metrics = deltars.append(dt, reader, pa.schema(dt.schema().to_arrow()), app=commit.app,
                                     version=commit.version, cut=dict(commit.cut), metadata=dict(commit.metadata),
                                     mode="overwrite" if rows is not None else "append")
        fault_point(FaultPoint.MERGE_AFTER_COMMIT, log)
        self._unstage(staging)
        return {"num_source_rows": n, **metrics}

    def enable_change_data_feed(self, url, dt) -> None:
        self._writable(url, dt, url)
        super().enable_change_data_feed(url, dt)

    def read(self, url, dt, fields):
        from airflow_pgcdc.lake.inspect import unreadable_features
        from airflow_pgcdc.merge.errors import KeylessChange

        features = unreadable_features(dt)
        if features:
            raise KeylessChange(
                f"Delta table {url} uses {' and '.join(features)}: the delta-rs engine reads a keyless "
                "table's data files to count its rows and would read them wrong",
                hint="merge this table with --engine delta-spark, or rewrite the table without those features",
            )
        return read_table_files(self.ctx, dt, pa.schema(list(fields)))


class DeltaSparkSink(DeltaSink):
    engine = "delta-spark"
    dialect = "spark"
    driver_batches = False
    multi_transaction = False
    writes_deletion_vectors = True
    conditional_commits = False
    needs_jars = True
    concurrent_tables = False

    def properties(self, fields, *, by="sink", table=None):
        """The common properties, and deletion vectors on the tables this engine creates when
        the job asks for them (``--deletion-vectors``)."""
        from airflow_pgcdc.merge.sinks.deltaspark import DELETION_VECTORS

        conf = super().properties(fields, by=by, table=table) or {}
        if by == "sink" and self.ctx.deletion_vectors:
            conf[DELETION_VECTORS] = "true"
        return conf or None

    def enable_change_data_feed(self, url, dt):
        """Through Delta's Spark engine (a table it wrote may have features delta-rs does not
        write), under the Delta root's lock the job holds."""
        from airflow_pgcdc.merge.sinks import deltaspark

        deltaspark.set_property(self.ctx.spark, deltaspark.s3a(url), CHANGE_DATA_FEED, "true")

    def before_merge(self, name, url, dt):
        from airflow_pgcdc.merge.schema import with_deletion_vectors

        return with_deletion_vectors(self.ctx, name, url, dt)

    @staticmethod
    def _one_transaction(commit: Commit) -> None:
        if commit.cut:  # refused before any work (PointError, SliceNotMerged): never reached
            raise MergeError(f"Delta's Spark engine records one app transaction per commit, not {dict(commit.cut)}")

    def _commit(self, run: Callable[[], dict[str, Any]], dt, url: str, commit: Commit) -> dict[str, Any]:
        self._one_transaction(commit)
        metrics = spark_commit_once(run, dt, url, commit.app, commit.version)
        fault_point(FaultPoint.MERGE_AFTER_COMMIT, log)
        return metrics

    def create(self, url, rows, schema, *, metadata, configuration, where, keys=(), copy_bytes=None,
               sized=True, partition_by=(), cluster_by=()) -> int:
        from airflow_pgcdc.merge.sinks import deltaspark

        files = pruning.file_count(copy_bytes, self.ctx.target_file_mb) if copy_bytes is not None else None
        try:
            return deltaspark.bootstrap(self.ctx.spark, rows, path=deltaspark.s3a(url), metadata=dict(metadata),
                                        configuration=configuration, sort_by=[_col(k) for k in keys] or None,
                                        files=files, partition_by=partition_by, cluster_by=cluster_by)
        except deltaspark.ClusteringRefused as exc:
            from airflow_pgcdc.merge.options import BadMergeOption

            name = f"{where[0]}.{where[1]}"
            raise BadMergeOption(f"table {name}: cluster_by={','.join(cluster_by)}: Delta refused it: {exc}",
                                 hint=f"--table-option {name}:cluster_by=<at most 4 columns with statistics: not a "
                                      "date, timestamp without time zone, boolean, bytea, array or map column, which "
                                      "the tables keep no statistics of (docs/types.md)>") from None

    def append(self, url, dt, rows, schema, commit, *, where, mode="append") -> dict[str, Any]:
        from airflow_pgcdc.merge.sinks import deltaspark

        if mode == "overwrite" and clustered(dt):  # Delta's overwrite would drop the clustering columns
            return self._commit(lambda: deltaspark.replace_rows(
                self.ctx.spark, rows, path=deltaspark.s3a(url), app=commit.app, version=commit.version,
                metadata=dict(commit.metadata),
            ), dt, url, commit)
        return self._commit(lambda: deltaspark.append(
            self.ctx.spark, rows, path=deltaspark.s3a(url), app=commit.app, version=commit.version,
            metadata=dict(commit.metadata), mode=mode,
        ), dt, url, commit)

    def merge(self, url, dt, rows, schema, spec, commit, *, where, bound_key=None, scd2=False) -> dict[str, Any]:
        from airflow_pgcdc.merge.sinks import deltaspark

        built = spec(self.dialect)
        ranges: list = []
        if bound_key is not None:  # the batch is computed once: its keys, then the MERGE
            from pyspark import StorageLevel

            rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
            ranges = pruning.key_ranges(rows.select(_col(bound_key)).toArrow().column(0).to_pylist())
            built = pruning.bounded(built, pruning.bounds_predicate(bound_key, ranges, self.dialect))
        run = deltaspark.merge_scd2 if scd2 else deltaspark.merge
        try:
            metrics = self._commit(lambda: run(
                self.ctx.spark, rows, built, path=deltaspark.s3a(url), app=commit.app, version=commit.version,
                metadata=dict(commit.metadata),
            ), dt, url, commit)
        finally:
            if bound_key is not None:
                rows.unpersist()
        if bound_key is not None:
            metrics["pgcdc_key_ranges"] = len(ranges)
        if not scd2:
            metrics["pgcdc_compacted_on"] = "spark"
        return metrics

    def keyless(self, url, dt, rows, source, fields, spec, commit, *, where) -> dict[str, Any]:
        from airflow_pgcdc.merge.sinks import deltaspark

        mode = "overwrite" if rows is not None else "append"
        if source is not None:
            with deltaspark.sized_state(self.ctx.spark, len(dt.file_uris())):  # it reads the target
                source = source.localCheckpoint()
            if source.isEmpty():
                rows, mode = source.select(*[_col(f.name) for f in fields]), "append"
        if rows is not None:
            return self.append(url, dt, rows, None, commit, where=where, mode=mode)
        built = spec(self.dialect)
        return self._commit(lambda: deltaspark.merge(
            self.ctx.spark, source, built, path=deltaspark.s3a(url), app=commit.app, version=commit.version,
            metadata=dict(commit.metadata),
        ), dt, url, commit)

    def add_clustered_columns(self, name, url, fields) -> None:
        from pyspark.sql.pandas.types import from_arrow_type

        from airflow_pgcdc.lake.sql import quote_ident
        from airflow_pgcdc.merge.sinks import deltaspark

        columns = ", ".join(f"{quote_ident(f.name, 'spark')} {from_arrow_type(f.type).simpleString()}" for f in fields)
        self.ctx.spark.sql(f"ALTER TABLE delta.{quote_ident(deltaspark.s3a(url), 'spark')} ADD COLUMNS ({columns})")
        log.info("Delta table %s (liquid-clustered): added column(s) %s with Delta's Spark engine", url,
                 [f.name for f in fields])

    def read(self, url, dt, fields):
        from airflow_pgcdc.merge.sinks import deltaspark

        df = self.ctx.spark.read.format("delta").option("versionAsOf", dt.version()).load(deltaspark.s3a(url))
        return df.select(*[_col(f.name) for f in fields])


SINKS: Mapping[str, type[DeltaSink]] = {s.engine: s for s in (DeltaRsSink, DeltaSparkSink)}


def sink_class(engine: str) -> type[DeltaSink]:
    """The sink of ``--engine``; a :class:`MergeError` names the engines for another name."""
    try:
        return SINKS[engine]
    except KeyError:
        raise MergeError(f"unknown engine {engine!r}", hint=f"one of {', '.join(SINKS)}") from None

