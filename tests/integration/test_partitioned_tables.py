"""Partitioned Delta tables (``--table-option schema.table:partition_by=col[,col]``), against
PostgreSQL, SeaweedFS and Spark, both engines: the bootstrap writes the table partitioned;
a table whose partition columns are key columns is merged reading only the batch's
partitions (delta-rs reports the files it scanned: one partition's, not the table's), a row
moved to another partition (its key changed) leaves none behind; a table partitioned by a
column outside its key is merged over the whole table (no bound: a row may change partition
without changing key), and comes out right; a rebuild asked to partitions an existing table
(and rebuilds a table no window holds: it was refused with WindowGap); a resync keeps the
partitioning; pgcdc maintain compacts within partitions; every table equals PostgreSQL."""

from __future__ import annotations

import pyarrow as pa
import pytest
from lake_helpers import drain, sql
from matrix import on_pg18

from airflow_pgcdc.lake.tables import delta_table_url
from airflow_pgcdc.merge.jars import unavailable_reason
from airflow_pgcdc.merge.job import merge_slot
from airflow_pgcdc.merge.rebuild import rebuild_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.snapshot.resync import resync_tables
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.verify import verify_table

_MISSING = unavailable_reason()


def _table(lake, name):
    from deltalake import DeltaTable

    return DeltaTable(delta_table_url(lake, "public", name), storage_options=s3store.delta_storage_options())


def _run(db, slot, client, src, lake, spark, engine):
    sql(db, "CREATE TABLE ev (id int, day date, v text, PRIMARY KEY (id, day))")
    sql(db, "INSERT INTO ev SELECT g, DATE '2026-11-01' + (g % 5), 'v' || g FROM generate_series(1, 50) g")
    sql(db, "CREATE TABLE acct (id int PRIMARY KEY, region text, v text)")
    sql(db, "INSERT INTO acct SELECT g, (ARRAY['eu', 'us', 'ap'])[1 + g % 3], 'v' || g FROM generate_series(1, 30) g")
    sql(db, "CREATE TABLE later (id int PRIMARY KEY, k int)")
    sql(db, "INSERT INTO later SELECT g, g % 3 FROM generate_series(1, 9) g")
    sql(db, "CREATE TABLE logs (region text, v int)")  # keyless: matched on every column, partition included
    sql(db, "ALTER TABLE logs REPLICA IDENTITY FULL")
    sql(db, "INSERT INTO logs SELECT (ARRAY['eu', 'us'])[1 + g % 2], g FROM generate_series(1, 10) g")
    sql(db, "CREATE PUBLICATION pub FOR TABLE ev, acct, later, logs")
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    asked = dict(engine=engine, table_options={"public.ev": {"partition_by": "day"},
                                               "public.acct": {"partition_by": "region"},
                                               "public.logs": {"partition_by": "region"}})
    merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    assert _table(lake, "ev").metadata().partition_columns == ["day"]
    assert _table(lake, "acct").metadata().partition_columns == ["region"]
    files = _table(lake, "ev").get_add_actions(flatten=True).num_rows
    assert files >= 5

    # changes in one partition: only its files are read
    sql(db, "UPDATE ev SET v = 'changed' WHERE day = DATE '2026-11-02'")
    # a row moved to another partition (its key changes) and one changing region (not its key)
    sql(db, "UPDATE ev SET day = DATE '2026-11-09' WHERE id = 5; UPDATE acct SET region = 'sa' WHERE id = 3")
    # a keyless table's delete and update: the target's rows are counted with their partition
    # values (the delta-rs engine read them from the data files, which do not hold them: NULL,
    # so nothing matched and the old rows stayed)
    sql(db, "DELETE FROM logs WHERE v = 2; UPDATE logs SET v = 30, region = 'us' WHERE v = 3")
    drain(db, src, slot, client)
    out = merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    by = {t.table: t for t in out.tables}
    assert by["public.ev"].action == "merged", out.to_dict()
    if engine == "delta-rs":  # the bound: the files of 2026-11-02 and of id 5's two days, not all
        assert by["public.ev"].metrics["num_target_files_scanned"] < files, by["public.ev"].metrics
    rows = {(r["id"], str(r["day"])) for r in _table(lake, "ev").to_pyarrow_table().to_pylist()}
    assert (5, "2026-11-09") in rows and (5, "2026-11-01") not in rows
    acct = {r["id"]: r["region"] for r in _table(lake, "acct").to_pyarrow_table().to_pylist()}
    assert acct[3] == "sa" and len(acct) == 30

    # an existing table is partitioned anew by a rebuild asked to
    assert _table(lake, "later").metadata().partition_columns == []
    if engine == "delta-rs":
        rebuild_slot(spark, store=src, slot=slot, delta=lake, tables=["public.later"], engine=engine,
                     table_options={"public.later": {"partition_by": "k"}})
        assert _table(lake, "later").metadata().partition_columns == ["k"]
    # a resync keeps the table's partitioning
    resync_tables(db, src, slot=slot, publications="pub", tables=["public.ev"], s3=client, worker_processes=False)
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    assert _table(lake, "ev").metadata().partition_columns == ["day"]

    # a rebuild of a table no window holds, after another table's changes and resync (its check
    # read only the manifests after the tables index's anchor, and refused it with WindowGap)
    rebuilt = rebuild_slot(spark, store=src, slot=slot, delta=lake, tables=["public.later"], engine=engine)
    assert [t["action"] for t in rebuilt["tables"]] == ["bootstrapped"], rebuilt

    # upkeep compacts within partitions: a partition's files become one
    from airflow_pgcdc.maintain import maintain_slot

    for i in range(2):  # more files in a partition: each merge's new rows are a file of their own
        sql(db, f"INSERT INTO acct VALUES ({100 + i}, 'eu', 'new')")
        drain(db, src, slot, client)
        merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    files = pa.table(_table(lake, "acct").get_add_actions(flatten=True)).column("partition.region").to_pylist()
    assert files.count("eu") == 3, files
    maintain_slot(store=src, slot=slot, delta=lake, tables=["public.acct"], unreferenced_floor_hours=0)
    adds = pa.table(_table(lake, "acct").get_add_actions(flatten=True)).to_pylist()
    per_partition = {}
    for a in adds:
        per_partition[a["partition.region"]] = per_partition.get(a["partition.region"], 0) + 1
    assert set(per_partition) == {"eu", "us", "ap", "sa"} and max(per_partition.values()) == 1, per_partition
    assert _table(lake, "acct").metadata().partition_columns == ["region"]
    for name in ("ev", "acct", "later", "logs"):
        assert verify_table(db, lake, "public", name).equal, name


@pytest.mark.slow
@on_pg18("partitioning is the merge's: no server difference")
def test_partitioned_tables_on_the_delta_rs_engine(fresh_db, slot_name, store, spark):
    client, src, lake = store
    _run(fresh_db, slot_name(), client, src, lake, spark, "delta-rs")


@pytest.mark.slow
@pytest.mark.delta_spark
@pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")
@on_pg18("partitioning is the merge's: no server difference")
def test_partitioned_tables_on_delta_spark(fresh_db, slot_name, store, spark):
    client, src, lake = store
    _run(fresh_db, slot_name(), client, src, lake, spark, "delta-spark")
