"""Soft deletes (``pgcdc merge --soft-deletes``): a row the source deletes stays in its Delta
table with ``_pgcdc_deleted_at`` (the delete's commit time) and its last values (the delete's
old row under ``REPLICA IDENTITY FULL``; else those Delta held before the delete's window); a new row
of the key revives it; a truncate marks every live row with its commit time; ``pgcdc
verify`` compares the live rows.

Checked end to end on PostgreSQL, SeaweedFS and Spark, on both engines: deletes, a delete
then a re-insert in one window and across windows, a truncate followed by inserts, the
metadata columns beside (the mark says ``D``), a table whose own option says no (its deletes
remove rows), and verify equal throughout."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from lake_helpers import drain, sql
from matrix import on_pg18

from airflow_pgcdc.lake.tables import delta_table_url
from airflow_pgcdc.merge.jars import unavailable_reason
from airflow_pgcdc.merge.job import merge_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.verify import verify_table

_MISSING = unavailable_reason()


def _rows(lake: str, name: str) -> dict[int, dict]:
    from deltalake import DeltaTable

    dt = DeltaTable(delta_table_url(lake, "public", name), storage_options=s3store.delta_storage_options())
    return {r["id"]: r for r in dt.to_pyarrow_table().to_pylist()}


def _live(rows: dict[int, dict]) -> dict[int, str]:
    return {i: r["v"] for i, r in rows.items() if r["_pgcdc_deleted_at"] is None}


def _run(db, slot, client, src, lake, spark, engine: str) -> None:
    sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(db, "CREATE TABLE hard (id int PRIMARY KEY, v text)")
    sql(db, "CREATE TABLE full_ri (id int PRIMARY KEY, v text)")
    sql(db, "ALTER TABLE full_ri REPLICA IDENTITY FULL")
    for name in ("t", "hard", "full_ri"):
        sql(db, f"INSERT INTO {name} SELECT g, 'v' || g FROM generate_series(1, 6) g")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t, hard, full_ri")
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    asked = dict(engine=engine, soft_deletes=True, metadata_columns=True,
                 table_options={"public.hard": {"soft_deletes": False}})
    merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    rows = _rows(lake, "t")
    assert {r["_pgcdc_deleted_at"] for r in rows.values()} == {None} and len(rows) == 6
    assert "_pgcdc_deleted_at" not in next(iter(_rows(lake, "hard").values()))

    # deletes: the rows stay, marked with the delete's time and their last values; a delete
    # then a re-insert of a key in one window leaves it live with the new values
    t0 = datetime.now(UTC)
    for name in ("t", "hard", "full_ri"):
        sql(db, f"UPDATE {name} SET v = 'last' WHERE id = 2; DELETE FROM {name} WHERE id IN (2, 3); "
                f"DELETE FROM {name} WHERE id = 4; INSERT INTO {name} VALUES (4, 'back')")
    t1 = datetime.now(UTC)
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    rows = _rows(lake, "t")
    # the delete's old row holds the key only: the values Delta held before this window
    assert (rows[2]["v"], rows[3]["v"]) == ("v2", "v3")
    full = _rows(lake, "full_ri")  # REPLICA IDENTITY FULL: the delete's old row, whole
    assert (full[2]["v"], full[3]["v"], full[2]["_pgcdc_op"]) == ("last", "v3", "D")
    assert _live(full) == {1: "v1", 4: "back", 5: "v5", 6: "v6"}
    for i in (2, 3):
        assert t0 <= rows[i]["_pgcdc_deleted_at"] <= t1 and rows[i]["_pgcdc_op"] == "D", rows[i]
        assert rows[i]["_pgcdc_commit_ts"] == rows[i]["_pgcdc_deleted_at"]
    assert _live(rows) == {1: "v1", 4: "back", 5: "v5", 6: "v6"}
    assert sorted(_rows(lake, "hard")) == [1, 4, 5, 6]  # its own "no": deletes remove
    assert verify_table(db, lake, "public", "t").equal

    # a re-insert in a later window revives the row
    sql(db, "INSERT INTO t VALUES (3, 'again')")
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    rows = _rows(lake, "t")
    assert rows[3]["_pgcdc_deleted_at"] is None and rows[3]["v"] == "again" and rows[3]["_pgcdc_op"] == "I"

    # a truncate marks every live row with its commit time; rows inserted after it live
    sql(db, "TRUNCATE t; INSERT INTO t VALUES (5, 'after'), (10, 'ten')")
    t2 = datetime.now(UTC)
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    rows = _rows(lake, "t")
    assert _live(rows) == {5: "after", 10: "ten"}
    marks = {i: r["_pgcdc_deleted_at"] for i, r in rows.items() if i in (1, 3, 4, 6)}
    assert len(set(marks.values())) == 1 and t1 <= next(iter(marks.values())) <= t2, marks
    assert rows[2]["_pgcdc_deleted_at"] < rows[1]["_pgcdc_deleted_at"]  # deleted before: its own mark kept
    for name in ("t", "hard", "full_ri"):
        assert verify_table(db, lake, "public", name).equal, name


@pytest.mark.slow
@on_pg18("soft deletes are the merge's: no server difference")
def test_the_delta_rs_engine_keeps_deleted_rows_marked(fresh_db, slot_name, store, spark):
    client, src, lake = store
    _run(fresh_db, slot_name(), client, src, lake, spark, "delta-rs")


@pytest.mark.slow
@pytest.mark.delta_spark
@pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")
@on_pg18("soft deletes are the merge's: no server difference")
def test_delta_spark_keeps_deleted_rows_marked(fresh_db, slot_name, store, spark):
    client, src, lake = store
    _run(fresh_db, slot_name(), client, src, lake, spark, "delta-spark")
