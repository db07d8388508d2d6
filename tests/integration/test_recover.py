"""``pgcdc recover`` against real PostgreSQL 15/18, S3 and Spark: a pipeline whose slot lost
changes goes on into its existing Delta tables.

Before it, a dropped or lost slot failed every drain (``SlotMissing``; a lost slot cannot
stream), a slot acknowledged past the store failed every drain (``SlotAheadOfStore``, hint
"take a new snapshot"), and the only way back was a new snapshot with a new slot into a new
Delta root (merging it into the old root is refused: ``TableOfAnotherSlot``). Now the
recovery re-creates the slot, copies every table as a resync, and records it; the next
drain resumes, the next merge replaces each Delta table in one commit (the old versions stay
readable) and follows on, with nothing lost and nothing twice (a keyless table compared as
a multiset catches a change applied twice). A table the recovery could not copy is refused
by the merge (``RecoveryGap``) until it is resynced, never merged on green without the
gap's changes.
"""

from __future__ import annotations

import psycopg
import pytest
from deltalake import DeltaTable
from lake_helpers import drain, read_windows, sql

from airflow_pgcdc.drain.drain import SlotAheadOfStore
from airflow_pgcdc.drain.guards import SlotMissing
from airflow_pgcdc.lake.tables import delta_table_url
from airflow_pgcdc.merge.job import RecoveryGap, TablesFailed, merge_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.snapshot.recover import NothingToRecover, RecoverError, recover_pipeline
from airflow_pgcdc.snapshot.resync import resync_tables
from airflow_pgcdc.status.job import slot_status
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.verify import verify_table

TABLES = ("k", "nk", "arr", "gone")


def _setup(db, src, client, slot):
    sql(db, "CREATE TABLE k (id int PRIMARY KEY, v text)")
    sql(db, "INSERT INTO k SELECT g, 'v' || g FROM generate_series(1, 50) g")
    sql(db, "CREATE TABLE nk (a int, b text); ALTER TABLE nk REPLICA IDENTITY FULL")  # keyless: a multiset
    sql(db, "INSERT INTO nk SELECT g % 5, 'x' FROM generate_series(1, 20) g")
    sql(db, "CREATE TABLE arr (id int PRIMARY KEY, a int2[])")
    sql(db, "INSERT INTO arr SELECT g, '{1}' FROM generate_series(1, 5) g")
    sql(db, "CREATE TABLE gone (id int PRIMARY KEY)")
    sql(db, "INSERT INTO gone SELECT generate_series(1, 5)")
    sql(db, f"CREATE PUBLICATION pub FOR TABLE {', '.join(TABLES)}")
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)


def _every_table_replaced_then_followed(db, src, lake, client, slot, spark):
    """One change after a recovery of every table: the merge replaces each Delta table from
    its copy and applies the change; all equal."""
    sql(db, "UPDATE k SET v = 'after' WHERE id = 11")
    drain(db, src, slot, client)
    out = merge_slot(spark, store=src, slot=slot, delta=lake)
    assert {t.table.split(".")[1]: t.action for t in out.tables} == {
        "k": "resynced+merged", "nk": "resynced", "arr": "resynced", "gone": "resynced"}, out.tables
    for t in TABLES:
        assert verify_table(db, lake, "public", t).equal, t


@pytest.mark.slow
def test_a_dropped_slot_is_recovered_into_the_existing_delta_tables(fresh_db, slot_name, store, spark):
    client, src, lake = store
    db = fresh_db
    slot = slot_name()
    _setup(db, src, client, slot)
    sql(db, "UPDATE k SET v = 'a' WHERE id <= 5; INSERT INTO nk VALUES (9, 'a')")
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake)
    k_url = delta_table_url(lake, "public", "k")
    before = DeltaTable(k_url, storage_options=s3store.delta_storage_options()).version()
    sql(db, "UPDATE k SET v = 'b' WHERE id BETWEEN 6 AND 10; INSERT INTO nk VALUES (9, 'b')")
    drain(db, src, slot, client)  # window 1: drained, not merged yet when the slot goes

    # the changes the slot loses: none of them is in a window
    sql(db, "UPDATE k SET v = 'lost' WHERE id BETWEEN 11 AND 15; DELETE FROM k WHERE id = 50")
    sql(db, "INSERT INTO k VALUES (51, 'lost'); INSERT INTO nk VALUES (9, 'lost'); DELETE FROM nk WHERE a = 0")
    sql(db, "UPDATE arr SET a = '[2:2]={5}' WHERE id = 1")  # a value a copy cannot carry typed
    sql(db, "DROP TABLE gone")
    sql(db, "SELECT pg_drop_replication_slot(%s)", (slot,))
    with pytest.raises(SlotMissing):
        drain(db, src, slot, client)

    def meanwhile(position):  # after the slot exists again, before the copies: in both, applied once
        sql(db, "UPDATE k SET v = 'during' WHERE id BETWEEN 16 AND 20; INSERT INTO nk VALUES (9, 'during')")

    done = recover_pipeline(db, src, slot=slot, s3=client, worker_processes=False, workers=1,
                            on_slot_ready=meanwhile)
    rec = done.recovery
    assert rec.cause == "slot_missing" and rec.slot_recreated, rec
    assert rec.next_window_seq == 2 and rec.store_end_lsn == read_windows(client, src, slot)[-1].end_lsn
    assert sorted(t for _s, t in rec.tables) == ["k", "nk"], rec.tables  # 'gone' was dropped
    assert [r["table"] for r in rec.refused] == ["arr"] and "lower bound" in rec.refused[0]["error"]
    assert rec.extra["dropped_tables"] == [["public", "gone"]]
    with pytest.raises(NothingToRecover, match="recovered already"):  # a rerun: its record covers the slot
        recover_pipeline(db, src, slot=slot, s3=client, worker_processes=False, busy_wait=1)

    sql(db, "UPDATE k SET v = 'after' WHERE id BETWEEN 21 AND 25; INSERT INTO nk VALUES (9, 'after')")
    drain(db, src, slot, client)
    w2 = read_windows(client, src, slot)[-1]
    assert w2.window_seq == 2 and w2.start_lsn == rec.store_end_lsn  # the windows still tile
    assert w2.extra["resumed"]["recovery"] == rec.recovery_id and w2.extra["resumed"]["cause"] == "slot_missing"
    sql(db, "UPDATE k SET v = 'next' WHERE id = 26")
    drain(db, src, slot, client)  # and the window after it is an ordinary one
    assert [("resumed" in w.extra) for w in read_windows(client, src, slot)] == [False, False, True, False]

    with pytest.raises(TablesFailed) as failed:
        merge_slot(spark, store=src, slot=slot, delta=lake)
    by = {t.table.split(".")[1]: t for t in failed.value.result.tables}
    assert by["k"].action == "resynced+merged" and by["nk"].action == "resynced+merged", by
    assert by["arr"].action == "failed" and by["arr"].error.startswith(RecoveryGap.__name__), by["arr"]
    assert "pgcdc resync" in by["arr"].hint
    for t in ("k", "nk"):
        assert verify_table(db, lake, "public", t).equal, t
    # one commit replaced the table: the version before it is still there, as it was
    dt = DeltaTable(k_url, storage_options=s3store.delta_storage_options(), version=before)
    old = {r["id"]: r["v"] for r in dt.to_pyarrow_table().to_pylist()}
    assert old[1] == "a" and old[50] == "v50" and 51 not in old

    # the refused table, once its value is fixed, is resynced and followed again
    sql(db, "UPDATE arr SET a = '{5}' WHERE id = 1")
    resync_tables(db, src, slot=slot, publications="pub", tables=["arr"], s3=client, worker_processes=False)
    sql(db, "UPDATE arr SET a = '{6}' WHERE id = 2; UPDATE k SET v = 'end' WHERE id = 1")
    drain(db, src, slot, client)
    out = merge_slot(spark, store=src, slot=slot, delta=lake)
    assert {t.table.split(".")[1]: t.action for t in out.tables if t.action != "no-changes"} == {
        "arr": "resynced+merged", "k": "merged"}, out.tables
    for t in ("k", "nk", "arr"):
        assert verify_table(db, lake, "public", t).equal, t


@pytest.mark.slow
@pytest.mark.parametrize("pg_server", ["pg18"], indirect=True)  # the slot is kept: no server difference
def test_a_slot_acknowledged_past_the_store_is_recovered_and_kept(fresh_db, slot_name, store, spark):
    client, src, lake = store
    db = fresh_db
    slot = slot_name()
    _setup(db, src, client, slot)
    with pytest.raises(NothingToRecover):  # a healthy slot in step with its store lost nothing
        recover_pipeline(db, src, slot=slot, publications="pub", s3=client, worker_processes=False)
    sql(db, "UPDATE k SET v = 'a' WHERE id <= 5")
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake)
    sql(db, "UPDATE k SET v = 'skipped' WHERE id BETWEEN 6 AND 10; INSERT INTO nk VALUES (7, 'skipped')")
    # someone consumed the slot (pg_recvlogical, a stray peek --ack): acknowledged, in no window
    sql(db, "SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())", (slot,))
    with pytest.raises(SlotAheadOfStore) as ahead:
        drain(db, src, slot, client)
    assert "pgcdc recover" in ahead.value.hint
    assert slot_status(db, slot, store=src, s3=client)["store"]["slot_vs_store"] == "slot_ahead"

    done = recover_pipeline(db, src, slot=slot, s3=client, worker_processes=False, workers=1)
    assert done.recovery.cause == "slot_ahead" and not done.recovery.slot_recreated
    assert slot_status(db, slot, store=src, s3=client)["store"]["slot_vs_store"] == "recovered"
    _every_table_replaced_then_followed(db, src, lake, client, slot, spark)


@pytest.mark.slow
def test_a_slot_that_lost_its_wal_is_dropped_created_again_and_recovered(s3, s3_bucket, store, spark):
    """A dedicated PostgreSQL 15 (``max_slot_wal_keep_size = 1MB``): the slot falls behind and
    is invalidated at a checkpoint (``wal_status = 'lost'``) with changes it never delivered.
    The recovery drops the lost slot, creates it again and copies the tables."""
    from airflow_pgcdc.pg import slots
    from airflow_pgcdc.testing.postgres import PostgresServer

    client, src, lake = store
    settings = {"max_slot_wal_keep_size": "1MB", "wal_keep_size": 0, "max_prepared_transactions": 2}
    with PostgresServer("pg15", settings=settings) as srv:
        db = srv.dsn
        slot = "lostwal"
        _setup(db, src, client, slot)
        merge_slot(spark, store=src, slot=slot, delta=lake)
        sql(db, "UPDATE k SET v = 'lost' WHERE id <= 10; INSERT INTO nk VALUES (3, 'lost')")
        for _ in range(4):
            sql(db, "INSERT INTO gone SELECT max(id) + 1 FROM gone")
            sql(db, "SELECT pg_switch_wal()")
        sql(db, "CHECKPOINT")
        assert slots.slot_health(db, slot).lost
        # a forgotten prepared transaction would hold the new slot forever: named, nothing done
        with psycopg.connect(db, autocommit=True) as c:
            c.execute("BEGIN; INSERT INTO k VALUES (100, 'prepared'); PREPARE TRANSACTION 'forgotten'")
        with pytest.raises(RecoverError, match="'forgotten'") as held:
            recover_pipeline(db, src, slot=slot, publications="pub", s3=client, worker_processes=False,
                             prepared_wait=1)
        assert "COMMIT PREPARED" in held.value.hint and slots.slot_health(db, slot).lost  # the lost slot untouched
        sql(db, "COMMIT PREPARED 'forgotten'")
        done = recover_pipeline(db, src, slot=slot, publications="pub", s3=client, worker_processes=False,
                                workers=1)  # no window yet: no publication recorded
        assert done.recovery.cause == "slot_lost" and done.recovery.slot_recreated
        health = slots.slot_health(db, slot)
        assert health.exists and not health.lost and health.wal_status == "reserved"
        _every_table_replaced_then_followed(db, src, lake, client, slot, spark)
