"""The delta-spark sink (Delta Lake's own Spark MERGE through hadoop-aws' s3a://), with
either reader of the store (the Python data source, or Spark's Parquet reader on s3a://),
in local mode. ``make setup`` fetches the jars (``jvm/pom.xml``); without them (an offline
machine) these tests skip with the reason."""

from __future__ import annotations

import psycopg
import pytest
from matrix import servers_in_turn

from airflow_pgcdc.merge.jars import unavailable_reason

_MISSING = unavailable_reason()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")


def sql(dsn, query, params=None):
    with psycopg.connect(dsn, autocommit=True) as c:
        cur = c.execute(query, params)
        return cur.fetchall() if cur.description else None


@servers_in_turn("reader", ["python", "s3a"])  # the readers read the same windows from either server
def test_delta_spark_sink_merges_like_delta_rs(reader, fresh_db, slot_name, s3, s3_bucket, monkeypatch,
                                               spark_with_delta):
    from deltalake import DeltaTable

    from airflow_pgcdc.drain.drain import drain_window
    from airflow_pgcdc.lake.tables import app_id, delta_table_url
    from airflow_pgcdc.merge.job import merge_slot
    from airflow_pgcdc.snapshot.export import snapshot_to_s3
    from airflow_pgcdc.store import s3 as s3store
    from airflow_pgcdc.store.layout import Layout
    from airflow_pgcdc.store.window import read_window

    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    src, lake = f"s3://{s3_bucket}/cdc", f"s3://{s3_bucket}/lake"
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(fresh_db, "INSERT INTO t SELECT g, 'x' FROM generate_series(1, 20) g")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    snapshot_to_s3(fresh_db, src, slot=slot, publications="pub")
    sql(fresh_db, "UPDATE t SET v = 'y' WHERE id < 5; DELETE FROM t WHERE id > 15; UPDATE t SET id = 99 WHERE id = 10")
    w0 = drain_window(fresh_db, src, slot=slot, publications="pub", pack_parts_under=0)  # parts as objects
    sql(fresh_db, "UPDATE t SET v = 'z' WHERE id = 2; INSERT INTO t VALUES (50, 'n')")
    w1 = drain_window(fresh_db, src, slot=slot, publications="pub")  # its small part inside the window's pack
    layout = Layout.parse(src)
    assert not read_window(s3.client(), layout, slot, w0.window_seq).packed
    assert read_window(s3.client(), layout, slot, w1.window_seq).packed
    # one job reads both windows' parts of t: an object and a byte range of a pack (the s3a
    # reader reads the object, the Python reader the range)
    merge_slot(spark_with_delta, store=src, slot=slot, delta=lake, engine="delta-spark", reader=reader)
    dt = DeltaTable(delta_table_url(lake, "public", "t"), storage_options=s3store.delta_storage_options())
    assert dt.transaction_version(app_id(slot, "public", "t")) == 1
    got = sorted((r["id"], r["v"]) for r in dt.to_pyarrow_table().to_pylist())
    assert got == sorted(sql(fresh_db, "SELECT id, v FROM t"))


@pytest.fixture
def db18(pg18, request):
    name = "ds_" + request.node.name.lower().replace("[", "_").replace("]", "").replace("-", "_")[:40]
    dsn = pg18.create_database(name)
    yield dsn
    pg18.drop_database(name)


@pytest.fixture
def store(s3, s3_bucket, monkeypatch):
    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    return s3.client(), f"s3://{s3_bucket}/cdc", f"s3://{s3_bucket}/lake"


SAME_AS_DELTA_RS = [
    "test_changelog_history_appends_every_change_once",
    "test_scd2_history_keeps_every_version_with_its_lsn_validity",
    "test_scd2_keeps_the_versions_before_a_truncate_in_the_batch",
    "test_key_change_keeps_unsent_toast_values",
    "test_types_survive_the_merge_exactly",
]


@pytest.mark.parametrize("name", SAME_AS_DELTA_RS)
def test_delta_spark_passes_the_delta_rs_tests(name, db18, slot_name, store, s3, spark_with_delta, monkeypatch):
    """The local-mode tests of ``test_merge.py`` (history tables, TOAST across key changes,
    every type), each merge run with ``engine="delta-spark"`` (and the s3a reader)."""
    import functools
    import inspect

    import test_merge

    from airflow_pgcdc.merge.job import merge_slot

    monkeypatch.setattr(test_merge, "merge_slot", functools.partial(merge_slot, engine="delta-spark", reader="s3a"))
    fn = getattr(test_merge, name)
    given = {"fresh_db": db18, "db18": db18, "slot_name": slot_name, "store": store, "s3": s3,
             "spark": spark_with_delta, "driver_rows": 0}  # delta-spark compacts through Spark whatever the size
    fn(**{k: given[k] for k in inspect.signature(fn).parameters})


def test_delta_rs_and_delta_spark_take_turns_on_one_table(db18, slot_name, store, spark_with_delta):
    """Interop: a table bootstrapped by delta-spark is merged into by delta-rs, then by
    delta-spark again, then delta-rs; each engine's readers (deltalake/pyarrow and Spark's
    own Delta reader) see PostgreSQL's rows after every turn. ±infinity dates and
    timestamps included (delta-rs computes no statistics for them: the table property
    survives either engine's writes). The local session has the Delta and S3A jars on its
    driver's class loader, not in ``spark.jars``: after these Delta statements no jar was
    copied into the application's ``SparkFiles`` folder (with ``spark.jars`` its in-driver
    executor copied all 671 MB there at its first task, at every run)."""
    from lake_helpers import drain

    from airflow_pgcdc.lake.tables import delta_table_url
    from airflow_pgcdc.merge.job import merge_slot
    from airflow_pgcdc.merge.sinks.deltaspark import s3a
    from airflow_pgcdc.snapshot.export import snapshot_to_s3
    from airflow_pgcdc.verify import verify_table

    client, src, lake = store
    db = db18
    sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text, d date, ts timestamp)")
    sql(db, "INSERT INTO t SELECT g, 'v' || g, 'infinity', '-infinity' FROM generate_series(1, 100) g")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client)
    url = delta_table_url(lake, "public", "t")
    for n, engine in enumerate(["delta-spark", "delta-rs", "delta-spark", "delta-rs"]):
        sql(db, "UPDATE t SET v = %s WHERE id %% 4 = %s", (f"turn {n}", n))
        sql(db, "DELETE FROM t WHERE id = %s", (50 + n,))
        sql(db, "INSERT INTO t VALUES (%s, 'new', '2024-01-01', '2024-01-01 10:00')", (1000 + n,))
        drain(db, src, slot, client)
        out = merge_slot(spark_with_delta, store=src, slot=slot, delta=lake, engine=engine).tables[0]
        assert out.action in ("bootstrapped+merged", "merged") and (out.first_window, out.last_window) == (n, n)
        report = verify_table(db, lake, "public", "t")
        assert report.equal, report.to_dict()
        spark_rows = {r["id"]: r["v"] for r in spark_with_delta.read.format("delta").load(s3a(url)).select("id", "v").collect()}
        assert spark_rows == dict(sql(db, "SELECT id, v FROM t"))
    props = dict(spark_with_delta.sql(f"SHOW TBLPROPERTIES delta.`{s3a(url)}`").collect())
    assert props["delta.dataSkippingStatsColumns"] == "`id`,`v`"
    detail = spark_with_delta.sql(f"DESCRIBE DETAIL delta.`{s3a(url)}`").collect()[0]
    # timestamp without time zone is Delta's timestampNtz: a table feature (reader 3 /
    # writer 7), which delta-rs, Spark 3.5+, Trino and DuckDB (delta-kernel-rs) read
    assert (detail["minReaderVersion"], detail["minWriterVersion"]) == (3, 7), detail
    # the whole protocol, as the README documents it: a new table feature (deletion vectors,
    # column mapping, ...) must be a decision, since each one shuts out some readers
    from deltalake import DeltaTable

    from airflow_pgcdc.store import s3 as s3store

    proto = DeltaTable(url, storage_options=s3store.delta_storage_options()).protocol()
    assert sorted(proto.reader_features or []) == ["timestampNtz"], proto
    assert set(proto.writer_features or []) <= {"timestampNtz", "appendOnly", "invariants"}, proto
    assert set(detail["tableFeatures"]) == {"appendOnly", "invariants", "timestampNtz"}, detail

    import os

    from pyspark import SparkFiles

    from airflow_pgcdc.merge import jars

    shipped = spark_with_delta.sparkContext.getConf().get("spark.jars", "")
    assert not any(j in shipped for j in jars.find_jars()), shipped
    root = SparkFiles.getRootDirectory()
    copied = [f for _, _, files in os.walk(root) for f in files if f.endswith(".jar")]
    assert copied == [], f"jars copied into {root}: {copied}"

    # a rebuild from the store with Delta's Spark engine (pgcdc rebuild --engine delta-spark):
    # built in a scratch root, swapped in with one commit, and the pipeline merges on
    from airflow_pgcdc.lake.tables import app_id
    from airflow_pgcdc.merge.rebuild import rebuild_slot

    opts = s3store.delta_storage_options()
    before = DeltaTable(url, storage_options=opts).version()
    out = rebuild_slot(spark_with_delta, store=src, slot=slot, delta=lake, engine="delta-spark")
    assert [s["live"] for s in out["rebuild"]["swapped"]] == [url] and out["tables"][0]["delta_url"] == url
    live = DeltaTable(url, storage_options=opts)
    assert live.version() == before + 1 and live.transaction_version(app_id(slot, "public", "t")) == 3
    assert verify_table(db, lake, "public", "t").equal
    sql(db, "UPDATE t SET v = 'after the rebuild' WHERE id <= 10")
    drain(db, src, slot, client)
    merge_slot(spark_with_delta, store=src, slot=slot, delta=lake, engine="delta-spark")
    assert verify_table(db, lake, "public", "t").equal

