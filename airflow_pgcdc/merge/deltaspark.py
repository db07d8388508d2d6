"""The delta-spark sink: the same MERGE (clauses from :mod:`.clauses`, Spark SQL dialect)
run by Delta Lake's own Spark integration, for clusters that have ``io.delta:delta-spark``
and ``hadoop-aws`` on the classpath (``--packages io.delta:delta-spark_2.13:4.0.0,
org.apache.hadoop:hadoop-aws:3.4.1`` and the ``spark.sql.extensions`` /
``spark.sql.catalog.spark_catalog`` settings of Delta's documentation).

Idempotency is Delta's own: the commit carries ``txnAppId``/``txnVersion`` (session
settings ``spark.databricks.delta.write.txnAppId``/``txnVersion``, honoured by DML since
Delta 2.3), the same app id and version as the delta-rs sink, so the two engines can take
turns on one table. The job checks the table's app transaction version before merging
(read with delta-rs on the driver), so a replay never reaches this code.

Not runnable on the development machine (no Maven access for the jars): its test skips
there with that reason and runs where ``PGCDC_SPARK_JARS`` names the jars.
"""

from __future__ import annotations

import json
from typing import Any

from airflow_pgcdc.merge.clauses import MergeSpec

__all__ = ["merge", "s3a"]

_TXN_APP = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


def s3a(url: str) -> str:
    """``s3://bucket/key`` → ``s3a://bucket/key`` (hadoop-aws' scheme)."""
    return "s3a://" + url[len("s3://"):] if url.startswith("s3://") else url


def merge(spark, source_df, spec: MergeSpec, *, path: str, app: str, version: int,
          metadata: dict[str, str]) -> dict[str, Any]:
    """One MERGE of ``source_df`` (aliased ``s``) into the Delta table at ``path``
    (aliased ``t``) as one commit with the app transaction ``(app, version)``."""
    from delta.tables import DeltaTable

    conf = spark.conf
    saved = {k: conf.get(k, None) for k in (_TXN_APP, _TXN_VERSION, _USER_METADATA)}
    conf.set(_TXN_APP, app)
    conf.set(_TXN_VERSION, str(version))
    conf.set(_USER_METADATA, json.dumps(metadata, sort_keys=True))
    try:
        m = DeltaTable.forPath(spark, path).alias("t").merge(source_df.alias("s"), spec.predicate)
        m = m.whenMatchedDelete(condition=spec.delete_when)
        m = m.whenMatchedUpdate(condition=spec.update_when, set=spec.updates)
        m = m.whenNotMatchedInsert(condition=spec.insert_when, values=spec.inserts)
        if spec.delete_not_matched_by_source:
            m = m.whenNotMatchedBySourceDelete()
        m.execute()
        last = DeltaTable.forPath(spark, path).history(1).collect()[0]
        return dict(last["operationMetrics"] or {})
    finally:
        for k, v in saved.items():
            if v is None:
                conf.unset(k)
            else:
                conf.set(k, v)
