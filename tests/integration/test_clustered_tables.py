"""Liquid-clustered Delta tables (``--table-option schema.table:cluster_by=col[,col]``, Delta's
Spark engine), against PostgreSQL, SeaweedFS and Spark: refused with the delta-rs engine and
together with ``partition_by`` before anything is written, and on a column the table does not
have or on a column without statistics (a ``date``: that table fails, the others go on); the bootstrap creates the table clustered (the
``clustering`` writer feature, the columns in the ``delta.clustering`` domain metadata of its
first commit); the Spark engine's MERGE, appends and a keyless table's truncate keep the
clustering; the delta-rs engine refuses to commit to a clustered table (nothing written, its
windows stay pending, Delta's Spark engine merges them after); ``pgcdc maintain`` skips the
compaction (saying why) and vacuums without a commit; a new column is added by Delta's Spark
engine (the clustering kept), one added with a DEFAULT the old rows read is refused for its
table; a rebuild and a resync of a clustered table are refused (delta-rs replaces the table, and
cannot write clustering). Every table equals PostgreSQL."""

from __future__ import annotations

import json
from urllib.parse import urlparse

import pytest
from lake_helpers import drain, sql
from matrix import on_pg18

from airflow_pgcdc.lake.inspect import open_table
from airflow_pgcdc.lake.tables import app_id, delta_table_url
from airflow_pgcdc.merge.jars import unavailable_reason
from airflow_pgcdc.merge.job import TablesFailed, merge_slot
from airflow_pgcdc.merge.options import BadMergeOption
from airflow_pgcdc.merge.sinks import deltaspark
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.snapshot.resync import resync_tables
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.verify import verify_table

_MISSING = unavailable_reason()

CLUSTERED = {"public.ev": {"cluster_by": "region,id"}, "public.logs": {"cluster_by": "ts"}}


def _url(lake, name):
    return delta_table_url(lake, "public", name)


def _table(lake, name):
    return open_table(_url(lake, name), s3store.delta_storage_options())


def _first_commit(client, lake, name):
    loc = urlparse(_url(lake, name))
    body = client.get_object(Bucket=loc.netloc, Key=f"{loc.path.lstrip('/')}/_delta_log/{0:020d}.json")["Body"]
    return [json.loads(line) for line in body.read().decode().splitlines() if line.strip()]


def _clustering(spark, lake, name):
    return deltaspark.clustering_columns(spark, deltaspark.s3a(_url(lake, name)))


def _failed(exc_info):
    return {t.table: t for t in exc_info.value.result.tables if t.action == "failed"}


def _run(db, slot, client, src, lake, spark):
    sql(db, "CREATE TABLE ev (id int PRIMARY KEY, region text, v text)")
    sql(db, "INSERT INTO ev SELECT g, (ARRAY['eu', 'us', 'ap'])[1 + g % 3], 'v' || g FROM generate_series(1, 60) g")
    sql(db, "CREATE TABLE logs (ts timestamptz, msg text)")
    sql(db, "ALTER TABLE logs REPLICA IDENTITY FULL")
    sql(db, "INSERT INTO logs SELECT TIMESTAMPTZ '2026-11-01 00:00+00' + g * INTERVAL '1 hour', 'm' || g "
            "FROM generate_series(1, 20) g")
    sql(db, "CREATE TABLE plain (id int PRIMARY KEY, v text)")
    sql(db, "INSERT INTO plain SELECT g, 'p' || g FROM generate_series(1, 5) g")
    sql(db, "CREATE TABLE dated (id int PRIMARY KEY, day date)")
    sql(db, "INSERT INTO dated VALUES (1, DATE '2026-11-01'), (2, 'infinity')")
    sql(db, "CREATE PUBLICATION pub FOR TABLE ev, logs, plain, dated")
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)

    # refused before anything is written: the delta-rs engine, and partition_by beside cluster_by
    with pytest.raises(BadMergeOption, match=r"public\.ev.*cluster_by.*delta-rs") as refused:
        merge_slot(spark, store=src, slot=slot, delta=lake, table_options=CLUSTERED)
    assert "--engine delta-spark" in refused.value.hint
    with pytest.raises(BadMergeOption, match=r"public\.ev.*cluster_by and partition_by") as refused:
        merge_slot(spark, store=src, slot=slot, delta=lake, engine="delta-spark",
                   table_options={"public.ev": {"cluster_by": "region", "partition_by": "region"}})
    assert "public.ev:cluster_by" in refused.value.hint
    assert _table(lake, "ev") is None and _table(lake, "logs") is None

    # the bootstrap: clustered tables; a column the table does not have, or one without statistics
    # (a date: delta-rs cannot read the statistics of its infinity), fails that table only
    with pytest.raises(TablesFailed) as failed:
        merge_slot(spark, store=src, slot=slot, delta=lake, engine="delta-spark",
                   table_options={**CLUSTERED, "public.plain": {"cluster_by": "nope"},
                                  "public.dated": {"cluster_by": "day"}})
    assert sorted(_failed(failed)) == ["public.dated", "public.plain"]
    bad = _failed(failed)["public.plain"]
    assert bad.error.startswith("BadMergeOption: table public.plain: cluster_by") and "nope" in bad.error, bad
    assert "public.plain:cluster_by" in bad.hint
    bad = _failed(failed)["public.dated"]
    assert bad.error.startswith("BadMergeOption: table public.dated: cluster_by=day: Delta refused it: "
                                "[DELTA_CLUSTERING_COLUMN_MISSING_STATS]"), bad
    assert "date" in bad.hint and "public.dated:cluster_by" in bad.hint
    assert _table(lake, "plain") is None and _table(lake, "dated") is None
    for name, column in (("ev", ["region", "id"]), ("logs", ["ts"])):
        protocol = _table(lake, name).protocol()
        assert protocol.min_writer_version == 7 and {"clustering", "domainMetadata"} <= set(protocol.writer_features)
        domains = [a["domainMetadata"] for a in _first_commit(client, lake, name) if "domainMetadata" in a]
        assert [(d["domain"], json.loads(d["configuration"])["clusteringColumns"]) for d in domains] == [
            ("delta.clustering", [[c] for c in column])], domains
        assert _clustering(spark, lake, name) == column
    asked = dict(engine="delta-spark", table_options=CLUSTERED)
    out = merge_slot(spark, store=src, slot=slot, delta=lake, **asked)  # plain, dated: not clustered
    assert {t.table: t.action for t in out.tables}["public.plain"] == "bootstrapped", out.to_dict()
    assert "clustering" not in set(_table(lake, "plain").protocol().writer_features or ())

    # updates, deletes, inserts (a keyed table's MERGE) and appends (a keyless table) keep the clustering
    sql(db, "UPDATE ev SET v = 'u' || id WHERE id % 7 = 0; DELETE FROM ev WHERE id % 11 = 0")
    sql(db, "INSERT INTO ev SELECT g, 'eu', 'new' FROM generate_series(61, 70) g")
    sql(db, "UPDATE ev SET region = 'sa' WHERE id = 3")
    sql(db, "INSERT INTO logs VALUES (TIMESTAMPTZ '2026-12-01 00:00+00', 'late')")
    drain(db, src, slot, client)
    out = merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    by = {t.table: t for t in out.tables}
    assert by["public.ev"].action == "merged" and by["public.logs"].action == "merged", out.to_dict()
    assert _clustering(spark, lake, "ev") == ["region", "id"] and _clustering(spark, lake, "logs") == ["ts"]
    for name in ("ev", "logs", "plain", "dated"):
        assert verify_table(db, lake, "public", name).equal, name

    # the delta-rs engine commits nothing to a clustered table: refused, the windows stay pending
    sql(db, "UPDATE ev SET v = 'again' WHERE id < 10")
    sql(db, "TRUNCATE logs")
    sql(db, "INSERT INTO logs VALUES (TIMESTAMPTZ '2026-12-02 00:00+00', 'after'), "
            "(TIMESTAMPTZ '2026-12-03 00:00+00', 'after')")
    drain(db, src, slot, client)
    versions = {name: _table(lake, name).version() for name in ("ev", "logs")}
    with pytest.raises(TablesFailed) as failed:
        merge_slot(spark, store=src, slot=slot, delta=lake)
    refusals = _failed(failed)
    assert sorted(refusals) == ["public.ev", "public.logs"], refusals
    for t in refusals.values():
        assert t.error.startswith(f"MergeError: table {t.table}: its Delta table") and "liquid-clustered" in t.error
        assert "--engine delta-spark" in t.hint
    assert {name: _table(lake, name).version() for name in versions} == versions
    # ... which Delta's Spark engine merges, the keyless table's truncate included
    out = merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    by = {t.table: t for t in out.tables}
    assert by["public.ev"].action == "merged" and by["public.logs"].action == "merged", out.to_dict()
    assert _clustering(spark, lake, "ev") == ["region", "id"] and _clustering(spark, lake, "logs") == ["ts"]
    assert _table(lake, "logs").to_pyarrow_table().num_rows == 2
    for name in ("ev", "logs"):
        assert verify_table(db, lake, "public", name).equal, name

    # upkeep: no compaction (delta-rs cannot commit it: the reason is reported), the VACUUM's
    # files removed without a commit, the checkpoint written
    from airflow_pgcdc.maintain import maintain_slot
    from airflow_pgcdc.maintain.tables import CLUSTERED_SKIP

    before = _table(lake, "ev")
    app = app_id(slot, "public", "ev")
    kept = set(before.get_add_actions(flatten=True).column("path").to_pylist())
    done = maintain_slot(store=src, slot=slot, delta=lake, tables=["public.ev"], retention_hours=0,
                         unreferenced_floor_hours=0, windows=False)
    res = next(t for t in done.tables if t.table == "public.ev")
    assert res.action == "maintained" and res.compaction["skipped"] == CLUSTERED_SKIP, res
    assert res.vacuum["files"] > 0, res.vacuum  # the files the merges replaced
    after = _table(lake, "ev")
    assert after.version() == before.version() and after.transaction_version(app) == before.transaction_version(app)
    assert res.log["checkpoint_version"] == after.version()
    live = set(after.get_add_actions(flatten=True).column("path").to_pylist())
    assert live == kept  # the live files stayed
    keys = s3store.list_objects(client, urlparse(lake).netloc, urlparse(_url(lake, "ev")).path.lstrip("/") + "/")
    data = {k["Key"].rsplit("/", 1)[-1] for k in keys if k["Key"].endswith(".parquet") and "_delta_log" not in k["Key"]}
    assert data == {p.rsplit("/", 1)[-1] for p in live}, (data, live)
    assert _clustering(spark, lake, "ev") == ["region", "id"]
    assert verify_table(db, lake, "public", "ev").equal

    # a new column (delta-rs' ALTER failed with CommitFailedError): added by Delta's Spark engine
    sql(db, "ALTER TABLE logs ADD COLUMN level text")
    sql(db, "INSERT INTO logs VALUES (TIMESTAMPTZ '2026-12-04 00:00+00', 'with level', 'warn')")
    drain(db, src, slot, client)
    out = merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    assert {t.table: t.action for t in out.tables}["public.logs"] == "merged", out.to_dict()
    assert "level" in _table(lake, "logs").schema().to_arrow().names and _clustering(spark, lake, "logs") == ["ts"]
    assert verify_table(db, lake, "public", "logs").equal

    # a rebuild swaps through delta-rs: refused before any work, naming the clustered table
    from airflow_pgcdc.merge.rebuild import NotReplayable, rebuild_slot

    with pytest.raises(NotReplayable, match=r"public\.logs.*liquid-clustered") as refused:
        rebuild_slot(spark, store=src, slot=slot, delta=lake, tables=["public.logs"], engine="delta-spark",
                     table_options=CLUSTERED)
    assert "--tables" in refused.value.hint

    # a resync's copy replaces the table through delta-rs, which cannot write clustering: refused
    resync_tables(db, src, slot=slot, publications="pub", tables=["public.ev"], s3=client, worker_processes=False)
    drain(db, src, slot, client)
    with pytest.raises(TablesFailed) as failed:
        merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    refusals = _failed(failed)
    assert list(refusals) == ["public.ev"], refusals
    assert refusals["public.ev"].error.startswith("BadMergeOption: table public.ev: cluster_by=region,id")
    assert "resync" in refusals["public.ev"].error and "ALTER TABLE" in refusals["public.ev"].hint
    assert _table(lake, "ev").version() == after.version() and _clustering(spark, lake, "ev") == ["region", "id"]

    # a column added with a DEFAULT its old rows read: filled by a delta-rs rewrite, so refused for that table
    sql(db, "ALTER TABLE logs ADD COLUMN n int DEFAULT 5")
    drain(db, src, slot, client)
    with pytest.raises(TablesFailed) as failed:
        merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    refusals = _failed(failed)
    assert sorted(refusals) == ["public.ev", "public.logs"], refusals
    assert "['n'] were added with a DEFAULT" in refusals["public.logs"].error, refusals["public.logs"]
    assert "n" not in _table(lake, "logs").schema().to_arrow().names


@pytest.mark.slow
@pytest.mark.delta_spark
@pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")
@on_pg18("clustering is the merge's: no server difference")
def test_clustered_tables_on_delta_spark(fresh_db, slot_name, store, spark):
    client, src, lake = store
    _run(fresh_db, slot_name(), client, src, lake, spark)
