"""The drain with user-defined types (Type messages feeding the type map) and with a
streamed two-phase transaction (Stream Prepare, then COMMIT PREPARED in a later window),
against real PostgreSQL 15 and 18."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg
import pyarrow as pa
import pytest
from test_drain import SMALL_WORK_MEM, all_rows, confirmed, create_slot, drain, sql, windows

from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.store.layout import Layout
from airflow_pgcdc.store.window import read_window_rows
from airflow_pgcdc.typemap.map import DATE_POS_INFINITY, TIMESTAMP_NEG_INFINITY


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


DRAIN_IN_A_PROCESS = """
import json, sys
from airflow_pgcdc.drain.drain import drain_window
dsn, url, slot, binary = sys.argv[1:5]
r = drain_window(dsn, url, slot=slot, publications="pub", binary=binary == "1", start_without_snapshot=True)
print(json.dumps({"rows": r.rows, "pandas": "pandas" in sys.modules}))
"""


def test_wide_table_text_and_binary_drains_agree_and_never_import_pandas(fresh_db, slot_name, store, s3):
    """Common types in text and binary format, NULLs, irregular values, an interval key
    (all-NULL old-key columns on inserts: a struct with non-nullable fields), REPLICA
    IDENTITY FULL: both drains write the same rows. Each runs in its own process, which
    must not have imported pandas (pyarrow does on its first conversion of a Python
    object: ~1 s and ~50 MB)."""
    client, url = store
    sql(fresh_db, """CREATE TABLE t (iv interval, id bigint, a int, s smallint, n numeric(12,2), nu numeric,
        f float8, b bool, tx text, by bytea, d date, ts timestamp, tz timestamptz, tm time, u uuid, jb jsonb,
        ai int[], at text[], empty interval, PRIMARY KEY (iv, id))""")
    sql(fresh_db, "ALTER TABLE t REPLICA IDENTITY FULL")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    slots = [slot_name(), slot_name()]
    for s in slots:
        create_slot(fresh_db, s)
    sql(fresh_db, """INSERT INTO t SELECT make_interval(days => g), g, g, 1, g / 7.0, 'NaN', 1.5, g % 2 = 0,
        md5(g::text), '\\x00ff', 'infinity', '2024-01-02 03:04:05.5', '-infinity', '24:00:00',
        gen_random_uuid(), '{"a": [1, 2]}', '{1,NULL,3}', '{"a b",c}', NULL FROM generate_series(1, 300) g""")
    sql(fresh_db, "INSERT INTO t (iv, id) VALUES ('-1 years 2 mons', 0)")
    sql(fresh_db, "UPDATE t SET a = a + 1, tx = NULL WHERE id <= 3")
    sql(fresh_db, "UPDATE t SET iv = '1 hour' WHERE id = 4")  # key change
    sql(fresh_db, "DELETE FROM t WHERE id BETWEEN 5 AND 6")
    tables = []
    for s, binary in zip(slots, ("0", "1"), strict=True):
        out = subprocess.run([sys.executable, "-c", DRAIN_IN_A_PROCESS, fresh_db, url, s, binary],
                             env={**os.environ, **s3.aws_env()}, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        res = json.loads(out.stdout.strip().splitlines()[-1])
        assert res == {"rows": 301 + 4 + 1 + 2, "pandas": False}, f"binary={binary}: {res}"
        (m,) = windows(client, url, s)
        tables.append(read_window_rows(client, Layout.parse(url), s, m)["public.t"])
    assert tables[0].num_rows == 308
    assert tables[0].equals(tables[1]), "text and binary drains write the same rows"
    t = tables[0]
    # infinities and 24:00:00 have no Python form: compare their storage
    assert t.column("d").cast(pa.int32())[0].as_py() == DATE_POS_INFINITY
    assert t.column("tz").cast(pa.int64())[0].as_py() == TIMESTAMP_NEG_INFINITY
    assert t.column("tm").cast(pa.int64())[0].as_py() == 86_400_000_000
    rows = t.drop_columns([p + c for p in ("", "_pgcdc_old_") for c in ("d", "tz", "tm")]).to_pylist()
    key_change = next(x for x in rows if x["_pgcdc_op"] == "U" and x["id"] == 4)
    assert key_change["_pgcdc_old_iv"] == {"months": 0, "days": 4, "microseconds": 0}
    assert key_change["iv"] == {"months": 0, "days": 0, "microseconds": 3_600_000_000}
    assert all(x["empty"] is None and x["_pgcdc_old_iv"] is None for x in rows if x["_pgcdc_op"] == "I")
    first = rows[0]
    assert (first["id"], str(first["n"]), first["tx"], first["ai"], first["at"]) == (
        1, "0.14", "c4ca4238a0b923820dcc509a6f75849b", [1, None, 3], ["a b", "c"])
