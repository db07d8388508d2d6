"""Keys that are duplicated inside a transaction (a ``DEFERRABLE`` primary key), through
the drain and the merge into Delta, against real PostgreSQL 15/18."""

from __future__ import annotations

import pytest
from test_merge import assert_equal, drain, sql

from airflow_pgcdc.merge.job import merge_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3


@pytest.fixture(scope="module")
def spark():
    from airflow_pgcdc.merge.session import spark_session

    s = spark_session("local[2]")
    yield s
    s.stop()


@pytest.fixture
def store(s3, s3_bucket, monkeypatch):
    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    return s3.client(), f"s3://{s3_bucket}/cdc", f"s3://{s3_bucket}/lake"


def test_key_swap_in_one_statement_under_a_deferrable_key(fresh_db, slot_name, store, spark):
    """``UPDATE t SET id = 3 - id`` swaps rows 1 and 2: the second row leaving key 2 used to
    delete the first row's new version at key 2 (the old key's D row came after it)."""
    client, src, lake = store
    db = fresh_db
    sql(db, "CREATE TABLE t (id int PRIMARY KEY DEFERRABLE INITIALLY IMMEDIATE, v text, n int)")
    sql(db, "ALTER TABLE t REPLICA IDENTITY FULL")
    sql(db, "INSERT INTO t VALUES (1, 'one', 10), (2, 'two', 20), (5, 'five', 50)")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publication="pub", s3_client=client, workers=1, worker_processes=False)
    sql(db, "UPDATE t SET id = 3 - id WHERE id IN (1, 2)")  # the swap, one statement
    drain(db, src, slot, client)
    merge_slot(spark, source=src, slot=slot, delta=lake)
    assert_equal(db, lake, "public.t", "id")
    # a three-way rotation and a move in and out of one key inside one transaction
    with __import__("psycopg").connect(db, autocommit=True) as c:
        c.execute("BEGIN")
        c.execute("SET CONSTRAINTS ALL DEFERRED")
        c.execute("UPDATE t SET id = CASE id WHEN 1 THEN 2 WHEN 2 THEN 5 WHEN 5 THEN 1 END")
        c.execute("UPDATE t SET id = 7 WHERE v = 'one'")
        c.execute("UPDATE t SET id = 9 WHERE id = 7")
        c.execute("INSERT INTO t VALUES (7, 'seven', 70)")
        c.execute("COMMIT")
    drain(db, src, slot, client)
    merge_slot(spark, source=src, slot=slot, delta=lake)
    assert_equal(db, lake, "public.t", "id")
