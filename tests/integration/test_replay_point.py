"""Replay to a point (``--until-time``, ``--until-lsn``) on the real PostgreSQL 18 and S3
servers: the tables as the source was at a time (or LSN) the test recorded between two
transactions of one window, compared row by row with what PostgreSQL held then; the
pipeline catching up from the point with nothing applied twice (a keyless table's appends
and a truncate after the point included); a rebuild ``--until-time`` swapped into the live
tables and merged on; and every refusal (a table past the point, a point before the copy or
past the windows, Delta's Spark engine, history tables)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest
from deltalake import DeltaTable
from lake_helpers import assert_equal, delta_rows, drain, pg_rows, sql
from matrix import on_pg18

from airflow_pgcdc.lake.tables import app_id, cut_app, delta_table_url
from airflow_pgcdc.merge.errors import PastThePoint, PointError
from airflow_pgcdc.merge.job import TablesFailed, merge_slot
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.store import s3 as s3store

pytestmark = on_pg18("a replay reads the store: no server difference")


def keyless(rows):
    return sorted((r["at"], r["what"]) for r in rows)


def state(db):
    """What PostgreSQL holds now: t by key, ev (keyless) as a sorted multiset."""
    return pg_rows(db, "public.t", "id"), keyless(pg_rows(db, "public.ev", "at"))


def lake_state(lake):
    return (delta_rows(delta_table_url(lake, "public", "t"), "id", ["id", "v"]),
            keyless(delta_rows(delta_table_url(lake, "public", "ev"), "at", ["at", "what"])))


def txns(lake, slot, table, window):
    dt = DeltaTable(delta_table_url(lake, "public", table), storage_options=s3store.delta_storage_options())
    app = app_id(slot, "public", table)
    return dt.version(), dt.transaction_version(app), dt.transaction_version(cut_app(app, window))


def test_replay_to_a_time_and_an_lsn_then_catch_up(fresh_db, slot_name, store, spark, s3):
    client, src, lake = store
    db = fresh_db
    slot = slot_name()
    sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(db, "CREATE TABLE ev (at int, what text)")  # keyless: its inserts are appended
    sql(db, "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 300) g")
    sql(db, "INSERT INTO ev SELECT g, 'copied' FROM generate_series(1, 5) g")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t, ev")
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client)

    # window 0, cut at an LSN between its two transactions
    sql(db, "UPDATE t SET v = 'w0a' WHERE id <= 20; INSERT INTO ev VALUES (6, 'w0a')")
    (in_w0,) = sql(db, "SELECT pg_current_wal_lsn()")[0]
    at_w0 = state(db)
    sql(db, "UPDATE t SET v = 'w0b' WHERE id <= 10; DELETE FROM t WHERE id = 300; INSERT INTO ev VALUES (7, 'w0b')")
    assert drain(db, src, slot, client).window_seq == 0
    # window 1, cut at a time between its transactions: before it deletes, updates and
    # inserts; after it more of each, and a truncate of the keyless table
    sql(db, "DELETE FROM t WHERE id BETWEEN 51 AND 60; INSERT INTO t VALUES (1001, 'before')")
    sql(db, "INSERT INTO ev VALUES (8, 'before'), (8, 'before')")  # a duplicate row, kept twice
    at_time, at_lsn = sql(db, "SELECT clock_timestamp(), pg_current_wal_lsn()")[0]
    then = state(db)
    sql(db, "UPDATE t SET v = 'after' WHERE id <= 100; DELETE FROM t WHERE id = 1001")
    sql(db, "INSERT INTO t VALUES (2001, 'after'); INSERT INTO ev VALUES (9, 'after')")
    sql(db, "TRUNCATE ev; INSERT INTO ev VALUES (10, 'after the truncate')")
    assert drain(db, src, slot, client).window_seq == 1
    now = state(db)
    assert then != now and at_w0 != then

    # until a time: the tables as they were then, in a new Delta root
    by_time = f"{lake}_at_time"
    out = merge_slot(spark, store=src, slot=slot, delta=by_time, until_time=at_time.isoformat()).to_dict()
    assert out["until"]["window"] == 1, out["until"]
    point = int(LSN.parse(out["until"]["lsn"]))
    assert point >= int(LSN.parse(str(at_lsn))), "just before the first commit after the time"
    assert lake_state(by_time) == then
    version, merged, cut = txns(by_time, slot, "t", 1)
    assert merged == 0 and cut == point, "window 0 whole, window 1 up to the point: one commit"
    # a rerun finds the tables at the point: nothing committed
    again = merge_slot(spark, store=src, slot=slot, delta=by_time, until_time=at_time.isoformat()).to_dict()
    assert {t["action"] for t in again["tables"]} == {"up-to-date"}, again["tables"]
    assert txns(by_time, slot, "t", 1)[0] == version

    # until an LSN (the one PostgreSQL reported at that time): the same state
    by_lsn = f"{lake}_at_lsn"
    merge_slot(spark, store=src, slot=slot, delta=by_lsn, until_lsn=str(at_lsn))
    assert lake_state(by_lsn) == then
    # inside window 0: no window whole (NONE_MERGED), window 0 up to the point
    by_w0 = f"{lake}_at_w0"
    out = merge_slot(spark, store=src, slot=slot, delta=by_w0, until_lsn=str(in_w0)).to_dict()
    assert out["until"]["window"] == 0
    assert lake_state(by_w0) == at_w0
    assert txns(by_w0, slot, "t", 0)[1:] == (-1, int(LSN.parse(str(in_w0))))

    # the pipeline catches up from each point: every change after it once, none twice
    for root in (by_time, by_w0):
        merge_slot(spark, store=src, slot=slot, delta=root)
        assert lake_state(root) == now, root
        assert txns(root, slot, "t", 1)[1] == 1
    # a later point on a table at an earlier one: merged on to it
    merge_slot(spark, store=src, slot=slot, delta=by_lsn, until_time=(at_time + timedelta(microseconds=1)).isoformat())
    assert lake_state(by_lsn) == then

    # the live pipeline: merged to the end, rebuilt until the time and swapped in (pgcdc
    # rebuild), then merged on
    merge_slot(spark, store=src, slot=slot, delta=lake)
    assert lake_state(lake) == now
    with pytest.raises(TablesFailed) as failed:  # a merge never takes changes back out
        merge_slot(spark, store=src, slot=slot, delta=lake, until_time=at_time.isoformat())
    errors = {t["table"]: t["error"] for t in failed.value.result.to_dict()["tables"]}
    assert set(errors) == {"public.t", "public.ev"}
    assert all(PastThePoint.__name__ in e and "holds window 1 whole" in e for e in errors.values()), errors
    proc = subprocess.run(
        [sys.executable, "-m", "airflow_pgcdc.cli", "rebuild", "--store", src, "--slot", slot, "--delta", lake,
         "--until-time", at_time.isoformat()],
        env=dict(os.environ, **s3.aws_env()), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rebuilt = json.loads(proc.stdout)
    assert rebuilt["until"]["lsn"] == str(LSN(point)) and len(rebuilt["rebuild"]["swapped"]) == 2
    assert lake_state(lake) == then, "the live tables as they were at the time"
    assert txns(lake, slot, "t", 1)[1:] == (0, point), "the swap carries the cut"
    merge_slot(spark, store=src, slot=slot, delta=lake)
    assert lake_state(lake) == now
    assert_equal(db, lake, "public.t", "id")

    # refused before anything is read or written
    for kwargs, words in [
        ({"until_time": (at_time - timedelta(days=1)).isoformat()}, "before slot"),
        ({"until_time": (at_time + timedelta(days=1)).isoformat()}, "may not be drained"),
        ({"until_lsn": "FFFF/0"}, "past the end"),
        ({"until_lsn": "nonsense"}, "is not an LSN"),
        ({"until_time": "yesterday"}, "is not an ISO 8601 time"),
        ({"until_lsn": str(at_lsn), "engine": "delta-spark"}, "delta-rs engine"),
        ({"until_lsn": str(at_lsn), "history": "changelog"}, "history tables"),
    ]:
        with pytest.raises(PointError, match=words):
            merge_slot(spark, store=src, slot=slot, delta=f"{lake}_refused", **kwargs)
    assert not list(s3store.list_keys(client, src.split("/")[2], "lake_refused/")), "nothing written"
