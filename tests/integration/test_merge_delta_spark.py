"""The delta-spark sink (Delta Lake's own Spark MERGE through hadoop-aws' s3a://), with
either reader of the store (the Python data source, or Spark's Parquet reader on s3a://),
in local mode. ``make setup`` fetches the jars (``jvm/pom.xml``); without them (an offline
machine) these tests skip with the reason."""

from __future__ import annotations

import psycopg
import pytest

from airflow_pgcdc.merge.jars import unavailable_reason

_MISSING = unavailable_reason()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")


def sql(dsn, query, params=None):
    with psycopg.connect(dsn, autocommit=True) as c:
        cur = c.execute(query, params)
        return cur.fetchall() if cur.description else None


@pytest.fixture(scope="module")
def spark_with_delta():
    from airflow_pgcdc.merge.session import spark_session

    s = spark_session("local[2]", delta=True)
    yield s
    s.stop()


@pytest.mark.parametrize("reader", ["python", "s3a"])
def test_delta_spark_sink_merges_like_delta_rs(reader, fresh_db, slot_name, s3, s3_bucket, monkeypatch,
                                               spark_with_delta):
    from deltalake import DeltaTable

    from airflow_pgcdc.drain.drain import drain_window
    from airflow_pgcdc.merge.job import merge_slot
    from airflow_pgcdc.merge.plan import app_id, delta_table_url
    from airflow_pgcdc.snapshot.export import snapshot_to_s3
    from airflow_pgcdc.store import s3 as s3store

    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    src, lake = f"s3://{s3_bucket}/cdc", f"s3://{s3_bucket}/lake"
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(fresh_db, "INSERT INTO t SELECT g, 'x' FROM generate_series(1, 20) g")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    snapshot_to_s3(fresh_db, src, slot=slot, publication="pub")
    sql(fresh_db, "UPDATE t SET v = 'y' WHERE id < 5; DELETE FROM t WHERE id > 15; UPDATE t SET id = 99 WHERE id = 10")
    drain_window(fresh_db, src, slot=slot, publications="pub")
    merge_slot(spark_with_delta, source=src, slot=slot, delta=lake, engine="delta-spark", reader=reader)
    dt = DeltaTable(delta_table_url(lake, "public", "t"), storage_options=s3store.delta_storage_options())
    assert dt.transaction_version(app_id(slot, "public", "t")) == 0
    got = sorted((r["id"], r["v"]) for r in dt.to_pyarrow_table().to_pylist())
    assert got == sorted(sql(fresh_db, "SELECT id, v FROM t"))
