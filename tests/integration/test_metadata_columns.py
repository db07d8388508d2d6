"""CDC metadata columns in the Delta tables (``pgcdc merge --metadata-columns``): each row of
a keyed table carries ``_pgcdc_op`` (``R`` from a copy, ``I``/``U`` from its last change),
``_pgcdc_commit_lsn``, ``_pgcdc_commit_ts`` and ``_pgcdc_merged_at``.

Checked end to end on PostgreSQL, SeaweedFS and Spark: the bootstrap's rows say ``R`` and the
snapshot's consistent point; a merge's rows say their change's op, commit LSN and commit time
(the driver's compaction and Spark's alike); a deleted row is gone; a resync's rows say ``R``
and its point; a table whose own option says no has none, and gets them (NULL on the rows
already there) once asked; a keyless table never has them; a source column named
``_pgcdc_merged_at`` refuses its table alone; ``pgcdc verify`` compares the source's columns.
With Delta's Spark engine the same."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from lake_helpers import drain, sql
from matrix import on_pg18

from airflow_pgcdc.lake.tables import delta_table_url
from airflow_pgcdc.merge.errors import TablesFailed
from airflow_pgcdc.merge.jars import unavailable_reason
from airflow_pgcdc.merge.job import merge_slot
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.snapshot.resync import resync_tables
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout
from airflow_pgcdc.store.manifest import committed_snapshot
from airflow_pgcdc.verify import verify_table

META = ("_pgcdc_op", "_pgcdc_commit_lsn", "_pgcdc_commit_ts", "_pgcdc_merged_at")
_MISSING = unavailable_reason()


def _rows(lake: str, name: str) -> dict[int, dict]:
    from deltalake import DeltaTable

    dt = DeltaTable(delta_table_url(lake, "public", name), storage_options=s3store.delta_storage_options())
    return {r["id"]: r for r in dt.to_pyarrow_table().to_pylist()}


def _columns(lake: str, name: str) -> list[str]:
    from deltalake import DeltaTable

    dt = DeltaTable(delta_table_url(lake, "public", name), storage_options=s3store.delta_storage_options())
    return dt.schema().to_arrow().names


def _lsn(db) -> int:
    return int(LSN.parse(sql(db, "SELECT pg_current_wal_lsn()::text")[0][0]))


def _setup(db, slot, client, src) -> int:
    sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(db, "CREATE TABLE skip (id int PRIMARY KEY, v text)")
    sql(db, "CREATE TABLE k (id int, v text)")
    sql(db, "ALTER TABLE k REPLICA IDENTITY FULL")
    sql(db, "CREATE TABLE clash (id int PRIMARY KEY, _pgcdc_merged_at text)")
    for name in ("t", "skip", "k"):
        sql(db, f"INSERT INTO {name} SELECT g, 'v' || g FROM generate_series(1, 5) g")
    sql(db, "INSERT INTO clash VALUES (1, 'mine')")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t, skip, k, clash")
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    return int(LSN.parse(committed_snapshot(client, Layout.parse(src), slot).consistent_point))


def _check_copy_rows(rows: dict[int, dict], point: int, before: datetime, after: datetime) -> None:
    for r in rows.values():
        assert (r["_pgcdc_op"], r["_pgcdc_commit_lsn"], r["_pgcdc_commit_ts"]) == ("R", point, None), r
        assert before <= r["_pgcdc_merged_at"] <= after, r


@pytest.mark.slow
@on_pg18("the metadata columns are the merge's: no server difference")
def test_the_delta_rs_engine_writes_metadata_columns(fresh_db, slot_name, store, spark):
    client, src, lake = store
    db = fresh_db
    slot = slot_name()
    point = _setup(db, slot, client, src)
    asked = dict(metadata_columns=True, table_options={"public.skip": {"metadata_columns": False}})

    before = datetime.now(UTC)
    with pytest.raises(TablesFailed) as failed:
        merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    after = datetime.now(UTC)
    by = {t.table: t for t in failed.value.result.tables}
    assert by["public.clash"].action == "failed" and "ReservedColumnName" in by["public.clash"].error
    assert "--table-option public.clash:metadata_columns=false" in by["public.clash"].hint
    assert {by[n].action for n in ("public.t", "public.skip", "public.k")} == {"bootstrapped"}
    assert _columns(lake, "t")[-4:] == list(META)
    assert not set(META) & set(_columns(lake, "skip")) and not set(META) & set(_columns(lake, "k"))
    _check_copy_rows(_rows(lake, "t"), point, before, after)
    asked["table_options"]["public.clash"] = {"metadata_columns": False}

    # a merge: each changed row says its change; the others keep the copy's
    lsn0 = _lsn(db)
    t0 = datetime.now(UTC)
    sql(db, "INSERT INTO t VALUES (6, 'new'); UPDATE t SET v = 'changed' WHERE id = 2; DELETE FROM t WHERE id = 3")
    sql(db, "UPDATE k SET v = 'k' WHERE id = 1; UPDATE skip SET v = 's' WHERE id = 1")
    t1 = datetime.now(UTC)
    drain(db, src, slot, client)
    m0 = datetime.now(UTC)
    out = merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    assert {t.table: t.action for t in out.tables}["public.t"] == "merged", out.to_dict()
    assert "metadata_columns asked but not applied: public.k has no key" in {
        t.table: t.note for t in out.tables}["public.k"]
    assert {t.table: t.action for t in out.tables}["public.clash"] == "bootstrapped", out.to_dict()
    rows = _rows(lake, "t")
    assert 3 not in rows
    assert (rows[6]["_pgcdc_op"], rows[2]["_pgcdc_op"]) == ("I", "U")
    for i in (2, 6):
        assert lsn0 < rows[i]["_pgcdc_commit_lsn"] <= _lsn(db), rows[i]
        assert t0 <= rows[i]["_pgcdc_commit_ts"] <= t1 and rows[i]["_pgcdc_merged_at"] >= m0, rows[i]
    assert rows[2]["_pgcdc_commit_lsn"] == rows[6]["_pgcdc_commit_lsn"]  # one transaction
    _check_copy_rows({i: rows[i] for i in (1, 4, 5)}, point, before, after)
    assert not set(META) & set(_columns(lake, "skip")) and not set(META) & set(_columns(lake, "k"))

    # Spark's compaction (--driver-rows 0) writes the same
    t0 = datetime.now(UTC)
    sql(db, "UPDATE t SET v = 'again' WHERE id = 4")
    t1 = datetime.now(UTC)
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake, driver_rows=0, **asked)
    row = _rows(lake, "t")[4]
    assert row["_pgcdc_op"] == "U" and t0 <= row["_pgcdc_commit_ts"] <= t1 and row["_pgcdc_commit_lsn"] > point

    # the table's own "no" dropped: its existing rows read NULL, its changed row its change
    sql(db, "UPDATE skip SET v = 'later' WHERE id = 2")
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake, metadata_columns=True,
               table_options={"public.clash": {"metadata_columns": False}})
    skip = _rows(lake, "skip")
    assert skip[2]["_pgcdc_op"] == "U" and skip[2]["_pgcdc_commit_ts"] is not None
    assert [skip[i]["_pgcdc_op"] for i in (1, 3)] == [None, None]

    # a resync: its rows say R and its point
    resync_tables(db, src, slot=slot, publications="pub", tables=["public.t"], s3=client, worker_processes=False)
    drain(db, src, slot, client)
    out = merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    assert {t.table: t.action for t in out.tables}["public.t"].startswith("resynced"), out.to_dict()
    rows = _rows(lake, "t")
    assert {r["_pgcdc_op"] for r in rows.values()} == {"R"} and sorted(rows) == [1, 2, 4, 5, 6]
    assert len({r["_pgcdc_commit_lsn"] for r in rows.values()}) == 1 and rows[1]["_pgcdc_commit_lsn"] > point
    for name in ("t", "skip", "k", "clash"):
        assert verify_table(db, lake, "public", name).equal, name

    # pgcdc verify --check-metadata: every row's are consistent; rows merged before the columns
    # came hold none; a row whose are wrong fails the check (its data still equal)
    checked = verify_table(db, lake, "public", "t", check_metadata=True)
    assert checked.metadata_ok and checked.metadata["invalid"] == 0 and checked.metadata["rows"] == 5
    assert checked.metadata["newest_commit_lsn"] == str(LSN(rows[1]["_pgcdc_commit_lsn"]))
    skip = verify_table(db, lake, "public", "skip", check_metadata=True).metadata
    assert (skip["rows"], skip["without"], skip["invalid"]) == (5, 4, 0), skip
    from deltalake import DeltaTable

    DeltaTable(delta_table_url(lake, "public", "t"), storage_options=s3store.delta_storage_options()).update(
        {"_pgcdc_commit_ts": "CAST('2026-01-01T00:00:00Z' AS TIMESTAMP)"}, predicate='"id" = 1')  # an R with a time
    broken = verify_table(db, lake, "public", "t", check_metadata=True)
    assert broken.equal and not broken.metadata_ok and broken.metadata["invalid"] == 1
    with pytest.raises(Exception, match="no metadata column"):
        verify_table(db, lake, "public", "k", check_metadata=True)


@pytest.mark.slow
@pytest.mark.delta_spark
@pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")
@on_pg18("the metadata columns are the merge's: no server difference")
def test_delta_spark_writes_metadata_columns(fresh_db, slot_name, store, spark):
    client, src, lake = store
    db = fresh_db
    slot = slot_name()
    point = _setup(db, slot, client, src)
    asked = dict(engine="delta-spark", metadata_columns=True,
                 table_options={"public.skip": {"metadata_columns": False}, "public.clash": {"metadata_columns": False}})
    before = datetime.now(UTC)
    merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    after = datetime.now(UTC)
    assert _columns(lake, "t")[-4:] == list(META)
    _check_copy_rows(_rows(lake, "t"), point, before, after)

    t0 = datetime.now(UTC)
    sql(db, "INSERT INTO t VALUES (6, 'new'); UPDATE t SET v = 'changed' WHERE id = 2; DELETE FROM t WHERE id = 3")
    t1 = datetime.now(UTC)
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    rows = _rows(lake, "t")
    assert 3 not in rows and (rows[6]["_pgcdc_op"], rows[2]["_pgcdc_op"], rows[1]["_pgcdc_op"]) == ("I", "U", "R")
    assert t0 <= rows[2]["_pgcdc_commit_ts"] <= t1 and rows[2]["_pgcdc_commit_lsn"] > point
    assert not set(META) & set(_columns(lake, "skip"))
    for name in ("t", "skip", "k", "clash"):
        assert verify_table(db, lake, "public", name).equal, name
