"""The delta-spark sink: the same MERGE (clauses from :mod:`.clauses`, Spark SQL dialect)
run by Delta Lake's own Spark engine on ``s3a://`` paths, so the join, the file rewrite
and the new data files are the executors' work; the driver plans and writes the commit.

Jars: ``io.delta:delta-spark_4.2_2.13:4.4.0`` and ``org.apache.hadoop:hadoop-aws:3.5.0``
(see :mod:`.jars`; ``make setup`` fetches them). The statements are Spark SQL
(``MERGE INTO delta.`s3a://…```), so the driver needs no ``delta`` Python module, only
the Delta SQL extension and catalog in the session (:func:`.session.spark_session` with
``delta=True``).

Idempotency is Delta's own: each commit carries ``txnAppId``/``txnVersion`` (the session
settings ``spark.databricks.delta.write.txnAppId``/``txnVersion`` for DML, the writer
options of the same names for appends), the same app id and version as the delta-rs sink,
so the two engines can take turns on one table; Delta skips a write whose app version is
already committed. The job also checks the table's app transaction before merging (read
with delta-rs on the driver), so a replay never reaches this code.

Concurrency: Delta's S3 log store (``S3SingleDriverLogStore``) assumes one writer per
table at a time; two merge jobs on one table at once are safe with delta-rs (conditional
puts), not here.

Liquid clustering (a table's ``cluster_by``): the bootstrap creates the table with ``CREATE
TABLE delta.`…` CLUSTER BY (…) AS SELECT`` (Delta 4.4 ignores ``DataFrameWriter.clusterBy``
on a path, and ``writeTo`` refuses a path table's clustering), which records the columns in
the ``delta.clustering`` domain metadata and adds the ``clustering`` and ``domainMetadata``
writer features (writer 7). MERGE and appends keep the columns; an overwrite (DataFrame or
``INSERT OVERWRITE``) sets them to none, so a clustered table's rows are replaced by a MERGE
instead (:func:`replace_rows`). delta-rs commits nothing to such a table
(:func:`~airflow_pgcdc.lake.inspect.clustered`).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from airflow_pgcdc.lake.sql import quote_ident
from airflow_pgcdc.merge.clauses import MergeSpec, Scd2Spec

__all__ = [
    "DELETION_VECTORS", "ClusteringRefused", "append", "bootstrap", "clustering_columns", "enable_deletion_vectors",
    "has_deletion_vectors", "last_commit", "merge", "merge_scd2", "needs_column_mapping", "replace_rows", "s3a",
    "sized_state", "state_partitions", "table_ref",
]

DELETION_VECTORS = "delta.enableDeletionVectors"
"""The table property that makes Delta's Spark engine mark a changed or deleted row in a
deletion vector (a small bitmap file beside the data file) instead of rewriting the data
file it sits in: a MERGE then writes the changed rows and one small file per touched data
file, not the touched files whole. The table gains the ``deletionVectors`` reader and
writer feature (protocol 3/7): every reader must support it (docs/store-format.md)."""

_MAPPED_ONLY = re.compile(r"[ ,;{}()\n\t=]")
"""Characters Delta accepts in a column name only when the table maps columns by name."""

_TXN_APP = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
_OPTIMIZE_WRITE = "spark.databricks.delta.optimizeWrite.enabled"
"""Delta's optimized writes, on for the MERGE statements only: the rows a merge writes are
binned into few files (one for a small window) instead of one per shuffle partition (8
here), so the table gathers fewer small files between two ``pgcdc maintain`` runs. Not for
the bootstrap, whose range-partitioned, key-sorted files it would reshuffle."""

_SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"
FILES_PER_STATE_PARTITION = 5000
"""Data files per partition of the table state Delta's Spark engine builds from the log
before each statement (``spark.databricks.delta.snapshotPartitions``, Delta's default 50
whatever the table). 50 tasks for a table of a few files cost more than the merge itself:
measured on the 2-core test machine, a delta-spark merge of 2 rows into a 3,000-row table
took 14 s, 7 s of it the state's 52-task job; sized by the table, 8-10 s."""


def state_partitions(files: int) -> int:
    """The partitions of the state of a table of ``files`` data files: one per
    :data:`FILES_PER_STATE_PARTITION`, at least 1, at most Delta's default 50."""
    return max(1, min(50, -(-max(files, 0) // FILES_PER_STATE_PARTITION)))


@contextmanager
def sized_state(spark, files: int) -> Iterator[None]:
    """Around one statement on a table of ``files`` data files: Delta's state of it built in
    :func:`state_partitions` partitions, unless the job's conf sets
    ``spark.databricks.delta.snapshotPartitions`` itself (then that is kept)."""
    if spark is None or spark.conf.get(_SNAPSHOT_PARTITIONS, None) is not None:
        yield
        return
    spark.conf.set(_SNAPSHOT_PARTITIONS, str(state_partitions(files)))
    try:
        yield
    finally:
        spark.conf.unset(_SNAPSHOT_PARTITIONS)


def s3a(url: str) -> str:
    """A Delta table's ``s3://bucket/key`` → ``s3a://bucket/key`` (hadoop-aws' scheme), at
    the same objects delta-rs uses: delta-rs percent-decodes the URL's path (the table
    segment ``my%2Eschema.Odd%20Table`` is the key ``my.schema.Odd Table``), Hadoop keeps a
    ``%`` literally, so the path is decoded here. Without it the two engines wrote the same
    odd-named table to two places."""
    from urllib.parse import unquote

    return "s3a://" + unquote(url[len("s3://"):]) if url.startswith("s3://") else url


_CONCURRENT_MARKS = ("DELTA_CONCURRENT_", "io.delta.exceptions.Concurrent")


def is_concurrent(exc: BaseException) -> bool:
    """Whether Delta's Spark engine refused a commit because another writer committed
    first (its ``Concurrent…Exception`` family, seen through Py4J)."""
    text = str(exc)
    return any(mark in text for mark in _CONCURRENT_MARKS)


def q(name: str) -> str:
    """A Spark SQL identifier (the merge's one quoting function, Spark dialect)."""
    return quote_ident(name, "spark")


def table_ref(path: str) -> str:
    """``delta.`<path>```: a path-based Delta table in Spark SQL."""
    return f"delta.{q(path)}"


@contextmanager
def _session_conf(spark, values: Mapping[str, str]) -> Iterator[None]:
    """The session settings ``values`` around one statement, the previous ones restored after."""
    saved = {k: spark.conf.get(k, None) for k in values}
    for k, v in values.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


class _Txn:
    """The app transaction and commit metadata as session settings around one statement."""

    def __init__(self, spark, app: str | None, version: int | None, metadata: Mapping[str, str]) -> None:
        self.conf = spark.conf
        self.values = {_USER_METADATA: json.dumps(dict(metadata), sort_keys=True), _OPTIMIZE_WRITE: "true"}
        if app is not None:
            self.values[_TXN_APP] = app
            self.values[_TXN_VERSION] = str(version)

    def __enter__(self) -> _Txn:
        self.saved = {k: self.conf.get(k, None) for k in (_TXN_APP, _TXN_VERSION, _USER_METADATA, _OPTIMIZE_WRITE)}
        for k in self.saved:
            if k in self.values:
                self.conf.set(k, self.values[k])
            else:
                self.conf.unset(k)
        return self

    def __exit__(self, *exc: object) -> None:
        for k, v in self.saved.items():
            if v is None:
                self.conf.unset(k)
            else:
                self.conf.set(k, v)


def _view(df) -> str:
    name = "pgcdc_src_" + uuid.uuid4().hex[:12]
    df.createOrReplaceTempView(name)
    return name


def merge_sql(spec: MergeSpec, target: str, source_view: str) -> str:
    """The ``MERGE INTO`` statement of ``spec`` (target alias ``t``, source alias ``s``)."""
    sets = ", ".join(f"{col} = {expr}" for col, expr in spec.updates.items())
    cols = ", ".join(spec.inserts)
    vals = ", ".join(spec.inserts.values())
    delete = ("DELETE" if spec.delete_updates is None else  # soft deletes: the row is marked
              "UPDATE SET " + ", ".join(f"{col} = {expr}" for col, expr in spec.delete_updates.items()))
    text = (
        f"MERGE INTO {target} AS t USING {q(source_view)} AS s ON {spec.predicate}\n"
        f"WHEN MATCHED AND {spec.delete_when} THEN {delete}\n"
        + (f"WHEN MATCHED AND {spec.update_when} THEN UPDATE SET {sets}\n" if spec.updates else "")
        + f"WHEN NOT MATCHED AND {spec.insert_when} THEN INSERT ({cols}) VALUES ({vals})"
    )
    if spec.delete_not_matched_by_source:
        text += "\nWHEN NOT MATCHED BY SOURCE THEN DELETE"
    if spec.not_matched_by_source_updates:
        marks = ", ".join(f"{col} = {expr}" for col, expr in spec.not_matched_by_source_updates.items())
        text += f"\nWHEN NOT MATCHED BY SOURCE AND {spec.not_matched_by_source_when} THEN UPDATE SET {marks}"
    return text


def scd2_sql(spec: Scd2Spec, target: str, source_view: str) -> str:
    """The SCD type 2 ``MERGE INTO`` statement of ``spec``."""
    close = ", ".join(f"{col} = {expr}" for col, expr in spec.close_updates.items())
    cols = ", ".join(spec.inserts)
    vals = ", ".join(spec.inserts.values())
    text = (
        f"MERGE INTO {target} AS t USING {q(source_view)} AS s ON {spec.predicate}\n"
        f"WHEN MATCHED THEN UPDATE SET {close}\n"
        f"WHEN NOT MATCHED AND {spec.insert_when} THEN INSERT ({cols}) VALUES ({vals})"
    )
    if spec.close_all_updates is not None:
        sets = ", ".join(f"{col} = {expr}" for col, expr in spec.close_all_updates.items())
        text += f"\nWHEN NOT MATCHED BY SOURCE AND {spec.close_all_when} THEN UPDATE SET {sets}"
    return text


def last_commit(spark, path: str) -> dict[str, Any]:
    """The latest commit of the table at ``path``: ``{version, operation, metrics}``."""
    row = spark.sql(f"DESCRIBE HISTORY {table_ref(path)} LIMIT 1").collect()[0]
    return {"version": int(row["version"]), "operation": row["operation"],
            "metrics": dict(row["operationMetrics"] or {}), "txn": row["userMetadata"]}


_METRICS = {  # Delta's names -> delta-rs' (what the job reports)
    "numSourceRows": "num_source_rows",
    "numTargetRowsInserted": "num_target_rows_inserted",
    "numTargetRowsUpdated": "num_target_rows_updated",
    "numTargetRowsDeleted": "num_target_rows_deleted",
    "numTargetFilesAdded": "num_target_files_added",
    "numTargetFilesRemoved": "num_target_files_removed",
    "executionTimeMs": "execution_time_ms",
}


def _metrics(raw: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {k: int(v) for k, v in raw.items() if str(v).lstrip("-").isdigit()}
    for theirs, ours in _METRICS.items():
        if theirs in out:
            out[ours] = out[theirs]
    return out


def _run(spark, text: str, path: str, *, app: str, version: int, metadata: Mapping[str, str]) -> dict[str, Any]:
    before = last_commit(spark, path)["version"]
    with _Txn(spark, app, version, metadata):
        spark.sql(text).collect()
    after = last_commit(spark, path)
    if after["version"] == before:  # Delta skipped it: the app version is committed already
        return {"concurrent_commit": True, "num_source_rows": 0}
    return {**_metrics(after["metrics"]), "delta_version": after["version"]}


def merge(spark, source_df, spec: MergeSpec, *, path: str, app: str, version: int,
          metadata: dict[str, str]) -> dict[str, Any]:
    """One MERGE of ``source_df`` (aliased ``s``) into the Delta table at ``path``
    (aliased ``t``) as one commit with the app transaction ``(app, version)``; returns
    Delta's operation metrics (also under delta-rs' names, e.g. ``num_source_rows``)."""
    view = _view(source_df)
    try:
        return _run(spark, merge_sql(spec, table_ref(path), view), path,
                    app=app, version=version, metadata=metadata)
    finally:
        spark.catalog.dropTempView(view)


def merge_scd2(spark, source_df, spec: Scd2Spec, *, path: str, app: str, version: int,
               metadata: dict[str, str]) -> dict[str, Any]:
    """One SCD type 2 MERGE commit (see :func:`merge`)."""
    view = _view(source_df)
    try:
        return _run(spark, scd2_sql(spec, table_ref(path), view), path,
                    app=app, version=version, metadata=metadata)
    finally:
        spark.catalog.dropTempView(view)


def append(spark, df, *, path: str, app: str, version: int, metadata: dict[str, str],
           mode: str = "append") -> dict[str, Any]:
    """Append ``df`` (columns in the table's order and types) in one commit with the app
    transaction ``(app, version)``; ``mode="overwrite"``: ``df`` replaces the table's rows."""
    before = last_commit(spark, path)["version"]
    (
        df.write.format("delta").mode(mode)
        .option("txnAppId", app).option("txnVersion", str(version))
        .option("userMetadata", json.dumps(dict(metadata), sort_keys=True))
        .save(path)
    )
    after = last_commit(spark, path)
    if after["version"] == before:
        return {"concurrent_commit": True, "num_source_rows": 0}
    return {**_metrics(after["metrics"]), "delta_version": after["version"]}


def replace_rows(spark, df, *, path: str, app: str, version: int, metadata: dict[str, str]) -> dict[str, Any]:
    """``df`` (columns of the table) replaces the rows of the liquid-clustered table at ``path``
    in one commit with the app transaction ``(app, version)`` that keeps its clustering: a
    MERGE that matches nothing, inserting every row of ``df`` and deleting every row of the
    table (Delta's overwrite, DataFrame or ``INSERT OVERWRITE``, sets a clustered table's
    clustering columns to none). Returns what :func:`append` returns."""
    view = _view(df)
    cols = [q(c) for c in df.columns]
    text = (f"MERGE INTO {table_ref(path)} AS t USING {q(view)} AS s ON FALSE\n"
            f"WHEN NOT MATCHED THEN INSERT ({', '.join(cols)}) VALUES ({', '.join('s.' + c for c in cols)})\n"
            "WHEN NOT MATCHED BY SOURCE THEN DELETE")
    try:
        return _run(spark, text, path, app=app, version=version, metadata=metadata)
    finally:
        spark.catalog.dropTempView(view)


def clustering_columns(spark, path: str) -> list[str]:
    """The liquid-clustering columns of the Delta table at ``path`` as Delta's Spark engine
    reports them (``DESCRIBE DETAIL``; a name that needs quoting comes quoted), ``[]`` for a
    table without."""
    row = spark.sql(f"DESCRIBE DETAIL {table_ref(path)}").select("clusteringColumns").collect()[0]
    return list(row[0] or [])


def has_deletion_vectors(dt) -> bool:
    """Whether the Delta table (a delta-rs ``DeltaTable``) has deletion vectors turned on."""
    return str(dt.metadata().configuration.get(DELETION_VECTORS, "")).lower() == "true"


def enable_deletion_vectors(spark, path: str) -> None:
    """Turn deletion vectors on for the existing Delta table at ``path`` (one commit that
    sets the property and upgrades the protocol; repeating it changes nothing)."""
    set_property(spark, path, DELETION_VECTORS, "true")


def set_property(spark, path: str, name: str, value: str) -> None:
    """Set the table property ``name`` of the Delta table at ``path`` (one commit; Delta
    raises the protocol when the property needs it)."""
    from airflow_pgcdc.lake.sql import quote_literal

    spark.sql(f"ALTER TABLE {table_ref(path)} SET TBLPROPERTIES ({quote_literal(name, 'spark')} = "
              f"{quote_literal(value, 'spark')})").collect()


def needs_column_mapping(schema) -> bool:
    """Whether a Spark ``schema`` (nested fields included) has a column name Delta refuses
    unless the table maps columns by name (``delta.columnMapping.mode = name``): a space,
    a comma, ``;{}()=``, a tab or a newline."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    def walk(t) -> bool:
        if isinstance(t, StructType):
            return any(_MAPPED_ONLY.search(f.name) or walk(f.dataType) for f in t.fields)
        if isinstance(t, ArrayType):
            return walk(t.elementType)
        if isinstance(t, MapType):
            return walk(t.keyType) or walk(t.valueType)
        return False

    return walk(schema)


class ClusteringRefused(ValueError):
    """Delta's Spark engine refused a table's clustering columns (a type it keeps no
    statistics of, too many columns): its own words."""


_CLUSTERING_ERROR = re.compile(r"\[(DELTA_CLUSTER\w*)\][^\n]*")


def _create_clustered(spark, df, path: str, metadata: Mapping[str, str], configuration: Mapping[str, str],
                      cluster_by: Sequence[str]) -> None:
    """``CREATE TABLE delta.`path` USING delta CLUSTER BY (…) TBLPROPERTIES (…) AS SELECT`` of
    ``df``, the commit's metadata from the session (the statement takes no writer option)."""
    from airflow_pgcdc.lake.sql import quote_literal

    props = ", ".join(f"{quote_literal(k, 'spark')} = {quote_literal(v, 'spark')}" for k, v in configuration.items())
    view = _view(df)
    try:
        with _session_conf(spark, {_USER_METADATA: json.dumps(dict(metadata), sort_keys=True)}):
            spark.sql(f"CREATE TABLE {table_ref(path)} USING delta CLUSTER BY ({', '.join(q(c) for c in cluster_by)})"
                      + (f" TBLPROPERTIES ({props})" if props else "") + f" AS SELECT * FROM {q(view)}").collect()
    except Exception as e:
        found = _CLUSTERING_ERROR.search(str(e))
        if found:
            raise ClusteringRefused(found.group(0)) from None
        raise
    finally:
        spark.catalog.dropTempView(view)


def bootstrap(spark, df, *, path: str, metadata: dict[str, str],
              configuration: Mapping[str, str] | None = None, sort_by: list | None = None,
              files: int | None = None, partition_by: Sequence[str] = (), cluster_by: Sequence[str] = ()) -> int:
    """Create the Delta table at ``path`` from ``df`` in one commit (``errorifexists``:
    a table created meanwhile raises :class:`~.deltars.TableExists`); table properties
    from ``configuration``. ``sort_by`` (Spark columns, the merge key) and ``files``: the
    rows range-partitioned by the key into ``files`` data files, each sorted (every file
    then holds one narrow key range). A table whose column names need it maps columns by
    name (:func:`needs_column_mapping`; only then: the feature shuts out readers without
    column mapping). ``partition_by``: its partition columns; ``cluster_by``: its liquid
    clustering columns (:class:`ClusteringRefused` when Delta refuses them). Returns the
    rows written."""
    from airflow_pgcdc.merge.sinks.deltars import TableExists

    if sort_by:
        df = df.repartitionByRange(files or 1, *sort_by).sortWithinPartitions(*sort_by)
    elif files:
        df = df.repartition(files)

    writer = df.write.format("delta").mode("errorifexists").option(
        "userMetadata", json.dumps(dict(metadata), sort_keys=True))
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    configuration = dict(configuration or {})
    if needs_column_mapping(df.schema):
        configuration.setdefault("delta.columnMapping.mode", "name")
    for key, value in configuration.items():
        writer = writer.option(key, value)
    try:
        with sized_state(spark, files or 1):
            if cluster_by:
                _create_clustered(spark, df, path, metadata, configuration, cluster_by)
            else:
                writer.save(path)
    except Exception as e:
        text = str(e)
        if "already exists" in text.lower() or "DELTA_PATH_EXISTS" in text or "PATH_ALREADY_EXISTS" in text:
            raise TableExists(f"Delta table {path} already exists") from None
        raise
    return int(last_commit(spark, path)["metrics"].get("numOutputRows", 0))
