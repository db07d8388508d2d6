"""The change data feed (``pgcdc merge --change-data-feed``, a table's own
``--table-option schema.table:change_data_feed=…``): the Delta tables get
``delta.enableChangeDataFeed``, so downstream jobs read what each merge changed
(``readChangeFeed`` / ``table_changes`` on Spark, ``load_cdf`` on delta-rs).

Checked end to end on PostgreSQL, SeaweedFS and Spark: with the delta-rs engine, a merge of
inserts, updates and deletes, a truncate and a resync each show in the feed as what they
changed; a table whose own option says no gets no feed, and gets it at its next merge once
asked (an existing table turned on); Spark's reader reads the same feed. With Delta's Spark
engine the same, through its own writer. Every table still equals PostgreSQL."""

from __future__ import annotations

import pyarrow as pa
import pytest
from lake_helpers import drain, sql
from matrix import on_pg18

from airflow_pgcdc.lake.tables import CHANGE_DATA_FEED, delta_table_url
from airflow_pgcdc.merge.jars import unavailable_reason
from airflow_pgcdc.merge.job import merge_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.snapshot.resync import resync_tables
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.verify import verify_table

_MISSING = unavailable_reason()


def _table(lake: str, name: str):
    from deltalake import DeltaTable

    return DeltaTable(delta_table_url(lake, "public", name), storage_options=s3store.delta_storage_options())


def _feed_on(lake: str, name: str) -> bool:
    return (_table(lake, name).metadata().configuration or {}).get(CHANGE_DATA_FEED) == "true"


def _feed(lake: str, name: str, since: int) -> list[tuple]:
    """(version, change type, id, v) of every change from version ``since`` on, in order."""
    rows = pa.table(_table(lake, name).load_cdf(starting_version=since).read_all()).to_pylist()
    return sorted((r["_commit_version"], r["_change_type"], r["id"], r["v"]) for r in rows)


def _spark_feed(spark, lake: str, name: str, since: int) -> list[tuple]:
    from airflow_pgcdc.merge.jars import configure_s3a
    from airflow_pgcdc.merge.sinks.deltaspark import s3a

    configure_s3a(spark, s3store.S3Settings.from_env())
    df = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", since)
          .load(s3a(delta_table_url(lake, "public", name))))
    return sorted(tuple(r) for r in df.select("_commit_version", "_change_type", "id", "v").collect())


def _setup(db, names: tuple[str, ...]) -> None:
    for name in names:
        sql(db, f"CREATE TABLE {name} (id int PRIMARY KEY, v text)")
        sql(db, f"INSERT INTO {name} SELECT g, 'v' || g FROM generate_series(1, 5) g")
    sql(db, f"CREATE PUBLICATION pub FOR TABLE {', '.join(names)}")


@pytest.mark.slow
@on_pg18("the feed is the merge's: no server difference")
def test_the_delta_rs_engine_keeps_a_change_data_feed(fresh_db, slot_name, store, spark):
    client, src, lake = store
    db = fresh_db
    _setup(db, ("t", "off"))
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    asked = dict(change_data_feed=True, table_options={"public.off": {"change_data_feed": False}})

    out = merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    assert {t.action for t in out.tables} == {"bootstrapped"}, out.to_dict()
    assert _feed_on(lake, "t") and not _feed_on(lake, "off")
    v0 = _table(lake, "t").version()

    # inserts, updates, deletes: the feed says each
    for name in ("t", "off"):
        sql(db, f"INSERT INTO {name} VALUES (6, 'new'); UPDATE {name} SET v = 'changed' WHERE id = 2; "
                f"DELETE FROM {name} WHERE id = 3")
    drain(db, src, slot, client)
    out = merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    assert {t.action for t in out.tables} == {"merged"}, out.to_dict()
    v1 = _table(lake, "t").version()
    assert [c[1:] for c in _feed(lake, "t", v0 + 1)] == [
        ("delete", 3, "v3"), ("insert", 6, "new"), ("update_postimage", 2, "changed"), ("update_preimage", 2, "v2")]
    assert {c[0] for c in _feed(lake, "t", v0 + 1)} == {v1}
    if _MISSING is None:  # Spark's reader (Delta's jars) reads the feed delta-rs wrote
        assert _spark_feed(spark, lake, "t", v0 + 1) == _feed(lake, "t", v0 + 1)
    off = _table(lake, "off")
    assert not [f for f in s3store.list_objects(client, *_bucket_prefix(lake, "off", "_change_data/"))]
    assert CHANGE_DATA_FEED not in (off.metadata().configuration or {})

    # the table's own "no" dropped: the existing table gets the feed at its next merge
    sql(db, "UPDATE off SET v = 'later' WHERE id = 4")
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake, change_data_feed=True)
    assert _feed_on(lake, "off")
    last = _table(lake, "off").version()
    assert [c[1:] for c in _feed(lake, "off", last)] == [("update_postimage", 4, "later"),
                                                          ("update_preimage", 4, "v4")]

    # a truncate: every row it removed is a delete; the rows inserted after it, inserts
    sql(db, "TRUNCATE t; INSERT INTO t VALUES (10, 'after')")
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    v2 = _table(lake, "t").version()
    changes = [c[1:] for c in _feed(lake, "t", v1 + 1)]
    assert sorted(c for c in changes if c[0] == "delete") == [
        ("delete", 1, "v1"), ("delete", 2, "changed"), ("delete", 4, "v4"), ("delete", 5, "v5"), ("delete", 6, "new")]
    assert [c for c in changes if c[0] != "delete"] == [("insert", 10, "after")]

    # a resync: its replacement is in the feed as the rows it removed and the rows it wrote
    sql(db, "INSERT INTO t VALUES (11, 'eleven')")
    resync_tables(db, src, slot=slot, publications="pub", tables=["public.t"], s3=client, worker_processes=False)
    drain(db, src, slot, client)
    out = merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    assert {t.table: t.action for t in out.tables}["public.t"].startswith("resynced"), out.to_dict()
    after = _feed(lake, "t", v2 + 1)
    assert ("insert", 11, "eleven") in [c[1:] for c in after]
    assert {c[1:] for c in after if c[0] == min(c[0] for c in after)} == {
        ("delete", 10, "after"), ("insert", 10, "after"), ("insert", 11, "eleven")}
    assert _feed_on(lake, "t")

    # upkeep (compaction, log expiry, VACUUM of files older than the retention, the orphan
    # sweep) keeps the feed of the versions it retains: _change_data is not an orphan
    from airflow_pgcdc.maintain import maintain_slot

    whole = _feed(lake, "t", v0 + 1)
    maintain_slot(store=src, slot=slot, delta=lake, target_size=1, unreferenced_floor_hours=0)
    assert _feed(lake, "t", v0 + 1) == whole
    # past the retention the feed's files go, as Delta's VACUUM removes them (delta-rs' leaves them)
    feed_files = list(s3store.list_objects(client, *_bucket_prefix(lake, "t", "_change_data/")))
    assert feed_files
    out = maintain_slot(store=src, slot=slot, delta=lake, retention_hours=0, target_size=1,
                        unreferenced_floor_hours=0, tables=["public.t"])
    assert out.tables[0].vacuum["change_data"]["files"] == len(feed_files), out.tables[0].vacuum
    assert not list(s3store.list_objects(client, *_bucket_prefix(lake, "t", "_change_data/")))
    for name in ("t", "off"):
        assert verify_table(db, lake, "public", name).equal, name


def _bucket_prefix(lake: str, name: str, under: str) -> tuple[str, str]:
    loc = s3store.S3Location.parse(delta_table_url(lake, "public", name))
    return loc.bucket, loc.prefix.rstrip("/") + "/" + under


@pytest.mark.slow
@pytest.mark.delta_spark
@pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")
@on_pg18("the feed is the merge's: no server difference")
def test_delta_spark_keeps_a_change_data_feed(fresh_db, slot_name, store, spark):
    client, src, lake = store
    db = fresh_db
    _setup(db, ("t", "late"))
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)

    out = merge_slot(spark, store=src, slot=slot, delta=lake, engine="delta-spark", change_data_feed=True,
                     table_options={"public.late": {"change_data_feed": False}})
    assert {t.action for t in out.tables} == {"bootstrapped"}, out.to_dict()
    assert _feed_on(lake, "t") and not _feed_on(lake, "late")
    v0 = _table(lake, "t").version()

    for name in ("t", "late"):
        sql(db, f"INSERT INTO {name} VALUES (6, 'new'); UPDATE {name} SET v = 'changed' WHERE id = 2; "
                f"DELETE FROM {name} WHERE id = 3")
    drain(db, src, slot, client)
    out = merge_slot(spark, store=src, slot=slot, delta=lake, engine="delta-spark", change_data_feed=True)
    assert {t.action for t in out.tables} == {"merged"}, out.to_dict()
    expected = [("delete", 3, "v3"), ("insert", 6, "new"), ("update_postimage", 2, "changed"),
                ("update_preimage", 2, "v2")]
    assert [c[1:] for c in _spark_feed(spark, lake, "t", v0 + 1)] == expected
    # "late" was turned on (ALTER TABLE) before its merge: that merge is in its feed
    assert _feed_on(lake, "late")
    late = _table(lake, "late")
    merged_at = late.version()
    assert [c[1:] for c in _spark_feed(spark, lake, "late", merged_at)] == expected
    assert [c[1:] for c in _feed(lake, "late", merged_at)] == expected  # delta-rs reads Spark's feed
    for name in ("t", "late"):
        assert verify_table(db, lake, "public", name).equal, name
