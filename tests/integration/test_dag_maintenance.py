"""The example DAG ``dags/pgcdc_maintenance.py`` run for real (``dag.test()`` in a child
process, :mod:`airflow_pgcdc.testing.dagrun`) on a pipeline of PostgreSQL 18, the S3 server
and delta-rs merges: the tables get compacted and vacuumed, the merged windows expire,
``pgcdc status`` shows the maintenance, and the tables equal PostgreSQL, before and after
a following drain and merge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from airflow_runner import airflow_env, run_dag
from deltalake import DeltaTable
from lake_helpers import sql

from airflow_pgcdc.drain.drain import drain_window
from airflow_pgcdc.lake.tables import app_id, delta_table_url
from airflow_pgcdc.maintain import read_expired
from airflow_pgcdc.merge.job import merge_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.status.job import slot_status
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout
from airflow_pgcdc.verify import verify_table

DAGS = Path(__file__).resolve().parents[2] / "dags"
TABLES = ("t", "u")


@pytest.fixture
def db(pg18):
    dsn = pg18.create_database("dag_maintenance")
    yield dsn
    pg18.drop_database("dag_maintenance")


def change(db, i):
    sql(db, f"INSERT INTO t SELECT 10000 + {i} * 100 + g, 'new', {i} FROM generate_series(1, 25) g")
    sql(db, f"UPDATE t SET v = 'r{i}' WHERE id = 10000 + {i} * 100 + 1")
    sql(db, f"INSERT INTO u VALUES ('n{i}', {i})")
    if i % 2:
        sql(db, f"DELETE FROM u WHERE k = 'k{i}'")


def assert_equal(db, lake):
    for t in TABLES:
        r = verify_table(db, lake, "public", t, s3=s3store.S3Settings.from_env())
        assert r.equal, r.to_dict()


@pytest.mark.slow
def test_maintenance_dag_compacts_expires_and_tables_stay_equal(db, slot_name, s3, s3_bucket, tmp_path,
                                                               monkeypatch, spark):
    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    client, src, lake = s3.client(), f"s3://{s3_bucket}/cdc", f"s3://{s3_bucket}/lake"
    slot = slot_name()
    sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text, n int)")
    sql(db, "CREATE TABLE u (k text PRIMARY KEY, n int)")
    sql(db, "INSERT INTO t SELECT g, 'v' || g, g FROM generate_series(1, 1000) g")
    sql(db, "INSERT INTO u SELECT 'k' || g, g FROM generate_series(1, 40) g")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t, u")
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client)
    rounds = 5
    for i in range(rounds):
        change(db, i)
        drain_window(db, src, slot=slot, publications="pub", s3=client)
        merge_slot(spark, store=src, slot=slot, delta=lake)
    assert_equal(db, lake)
    opts = s3store.delta_storage_options()
    url = {t: delta_table_url(lake, "public", t) for t in TABLES}
    files_before = {t: len(DeltaTable(url[t], storage_options=opts).file_uris()) for t in TABLES}
    txn_before = {t: DeltaTable(url[t], storage_options=opts).transaction_version(app_id(slot, "public", t))
                  for t in TABLES}
    assert txn_before == {t: rounds - 1 for t in TABLES}
    assert files_before["t"] > 2 and files_before["u"] > 2, files_before

    env = airflow_env(tmp_path / "airflow", DAGS, {
        "AIRFLOW_CONN_PGCDC_S3": json.dumps({
            "conn_type": "aws", "login": s3.access_key, "password": s3.secret_key,
            "extra": {"endpoint_url": s3.endpoint_url, "region_name": s3.region}}),
    })
    run = run_dag(DAGS / "pgcdc_maintenance.py", "pgcdc_maintenance", env,
                  {"slot": slot, "store": src, "delta": lake, "retention_hours": 0})
    assert run.state == "success", run.output[-5000:]
    assert s3.secret_key not in run.output
    out = run.xcom("maintain")
    by = {r["table"]: r for r in out["tables"]}
    assert set(by) == {"public.t", "public.u"}, sorted(by)
    for t in TABLES:
        r = by[f"public.{t}"]
        assert r["action"] == "maintained" and r["files_before"] == files_before[t], r
        dt = DeltaTable(url[t], storage_options=opts)
        assert r["files_after"] == len(dt.file_uris()) < files_before[t], (r, len(dt.file_uris()))
        assert r["vacuum"]["files"] > 0 and r["vacuum"]["retention_hours"] == 0, r["vacuum"]
        assert dt.transaction_version(app_id(slot, "public", t)) == txn_before[t]
    # every window but the latest was merged by both tables: their parts are gone
    assert out["windows"]["expired"] == [[0, rounds - 2]], out["windows"]
    assert read_expired(client, Layout.parse(src), slot) == set(range(rounds - 1))
    assert_equal(db, lake)

    # pgcdc status shows the DAG's maintenance per table
    status = slot_status(db, slot, store=src, delta=lake)
    tables = {t["table"]: t for t in status["store"]["delta_tables"]}
    for t in TABLES:
        m = tables[f"public.{t}"]["last_maintenance"]
        assert m is not None and m["action"] == "maintained", tables[f"public.{t}"]
        assert m["compaction"] == by[f"public.{t}"]["compaction"]
        assert tables[f"public.{t}"]["files"] == by[f"public.{t}"]["files_after"]

    # the pipeline goes on: a drain and a merge after the maintenance, still equal
    change(db, rounds)
    drain_window(db, src, slot=slot, publications="pub", s3=client)
    res = merge_slot(spark, store=src, slot=slot, delta=lake).to_dict()
    merged = {r["table"]: r for r in res["tables"]}
    assert merged["public.t"]["action"] == "merged" and merged["public.t"]["first_window"] == rounds, merged
    assert_equal(db, lake)
