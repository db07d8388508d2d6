"""The drain with user-defined types (Type messages feeding the type map) and with a
streamed two-phase transaction (Stream Prepare, then COMMIT PREPARED in a later window),
against real PostgreSQL 15 and 18."""

from __future__ import annotations

import psycopg
import pytest
from test_drain import SMALL_WORK_MEM, all_rows, confirmed, create_slot, drain, sql, windows

from airflow_pgcdc.protocol.lsn import LSN


@pytest.fixture
def store(s3, s3_bucket, monkeypatch):
    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    return s3.client(), f"s3://{s3_bucket}/lake"


def test_enum_domain_composite_and_array_of_enum_through_the_drain(fresh_db, slot_name, store):
    client, url = store
    sql(fresh_db, "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
    sql(fresh_db, "CREATE DOMAIN price AS numeric(7,2) CHECK (VALUE >= 0)")
    sql(fresh_db, "CREATE TYPE pair AS (a int, b text)")
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, m mood, p price, c pair, ms mood[])")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    create_slot(fresh_db, slot)
    sql(fresh_db, "INSERT INTO t VALUES (1, 'happy', 12.5, ROW(1, 'x y'), '{sad,NULL,ok}'), (2, NULL, NULL, NULL, NULL)")
    sql(fresh_db, "UPDATE t SET m = 'sad', p = 0.01 WHERE id = 1")
    r = drain(fresh_db, url, slot, client)
    assert r.rows == 3 and confirmed(fresh_db, slot) == LSN.parse(r.end_lsn)
    rows = all_rows(client, url, slot)
    assert [(x["_pgcdc_op"], x["m"], None if x["p"] is None else str(x["p"]), x["c"], x["ms"]) for x in rows] == [
        ("I", "happy", "12.50", '(1,"x y")', ["sad", None, "ok"]),
        ("I", None, None, None, None),
        ("U", "sad", "0.01", '(1,"x y")', ["sad", None, "ok"]),
    ]
    m = windows(client, url, slot)[0]
    cols = {c["name"]: c["pg_type"] for c in m.tables[0]["relation_versions"][0]["columns"]}
    assert cols["m"].endswith("mood") and cols["p"].endswith("price") and cols["ms"].endswith("mood[]")


def test_streamed_prepared_transaction_held_then_committed(fresh_db, slot_name, store):
    client, url = store
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    create_slot(fresh_db, slot, two_phase=True)
    with psycopg.connect(fresh_db, autocommit=True) as c:
        c.execute("BEGIN")
        c.execute("INSERT INTO t SELECT g, repeat('v', 50) FROM generate_series(1, 5000) g")  # > 64kB: streamed
        c.execute("PREPARE TRANSACTION 'big'")
        c.execute("INSERT INTO t VALUES (-1, 'plain')")
    w0 = drain(fresh_db, url, slot, client, connect_options=SMALL_WORK_MEM)
    m0 = windows(client, url, slot)[0]
    assert [p["gid"] for p in m0.pending_prepared] == ["big"]
    assert w0.tables == {"public.t": 1}, "the streamed prepared transaction is held, not emitted"
    sql(fresh_db, "COMMIT PREPARED 'big'")
    drain(fresh_db, url, slot, client, connect_options=SMALL_WORK_MEM)
    ms = windows(client, url, slot)
    assert ms[-1].pending_prepared == [] and [p["gid"] for p in ms[-1].prepared["committed"]] == ["big"]
    ids = [x["id"] for x in all_rows(client, url, slot)]
    assert ids == [-1, *range(1, 5001)], "every change of the prepared transaction once, at its commit"
