"""Deletion vectors (``pgcdc merge --engine delta-spark --deletion-vectors``): Delta's Spark
engine marks changed and deleted rows in small bitmap files instead of rewriting the data
files they sit in, so a merge of scattered updates costs the changed rows, not the files
they touch (issue: lake upkeep, section 1).

Checked end to end on PostgreSQL 15 and 18, SeaweedFS and Spark with Delta: the table is
created with the feature; a merge of scattered updates and deletes rewrites no data file
and writes deletion vectors; the table equals PostgreSQL as delta-rs' SQL engine reads it
(``pgcdc verify``) and as Spark reads it; an ``ADD COLUMN … DEFAULT`` fills the live rows
only; the delta-rs engine merges on after it (delta-rs 1.6 applies the vectors when it
rewrites a file); ``pgcdc maintain`` (delta-rs optimize, VACUUM with retention 0) keeps
the live vectors and the rows, and once the vectors delete 10 % of the rows it purges them
(the table rewritten, live rows only, sorted by the key); a table created without the feature gets it when a later
merge asks; the delta-rs engine with the option is refused before any work."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lake_helpers import drain, sql
from matrix import on_pg18

from airflow_pgcdc.merge.jars import unavailable_reason
from airflow_pgcdc.merge.job import merge_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.verify import verify_table

_MISSING = unavailable_reason()
pytestmark = [pytest.mark.delta_spark, pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")]

ROWS = 3000


def _objects(client, url: str) -> dict[str, int]:
    bucket, _, prefix = url[len("s3://"):].partition("/")
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix.rstrip("/") + "/"):
        for o in page.get("Contents", ()):
            out[o["Key"]] = o["Size"]
    return out


def _spark_rows(spark, url: str) -> list[tuple]:
    from airflow_pgcdc.merge.sinks.deltaspark import s3a

    return sorted(tuple(r) for r in spark.read.format("delta").load(s3a(url)).select("id", "v", "n").collect())


@pytest.mark.slow
@on_pg18("deletion vectors are the merge's and maintain's: no server difference")
def test_merges_with_deletion_vectors(fresh_db, slot_name, store, spark):
    from deltalake import DeltaTable

    from airflow_pgcdc.lake.tables import delta_table_url
    from airflow_pgcdc.maintain import maintain_slot
    from airflow_pgcdc.maintain.tables import PURGE_RATIO, deleted_rows
    from airflow_pgcdc.merge.sinks.deltaspark import DELETION_VECTORS, has_deletion_vectors
    from airflow_pgcdc.store import s3 as s3store

    client, src, lake = store
    db = fresh_db
    sql(db, "CREATE TABLE t (id bigint PRIMARY KEY, v text, n int)")
    sql(db, "CREATE TABLE plain (id int PRIMARY KEY, v text)")
    sql(db, f"INSERT INTO t SELECT g, md5(g::text), g % 100 FROM generate_series(1, {ROWS}) g")
    sql(db, "INSERT INTO plain VALUES (1, 'a'), (2, 'b')")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t, plain")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    url = delta_table_url(lake, "public", "t")
    storage = s3store.delta_storage_options()

    # bootstrap: key-sorted files (tiny target size: several files), the feature on
    out = merge_slot(spark, store=src, slot=slot, delta=lake, engine="delta-spark", deletion_vectors=True,
                     target_file_mb=0.02, max_windows=0)
    assert {t.action for t in out.tables} == {"bootstrapped"}, out.to_dict()
    dt = DeltaTable(url, storage_options=storage)
    assert dt.metadata().configuration.get(DELETION_VECTORS) == "true"
    assert "deletionVectors" in (dt.protocol().reader_features or [])
    files_before = set(dt.file_uris())
    assert len(files_before) >= 3, files_before

    # scattered updates and deletes, one insert: no data file is rewritten
    sql(db, "UPDATE t SET v = 'u' || id, n = -n WHERE id IN (7, 1500, 2999)")
    sql(db, "DELETE FROM t WHERE id IN (11, 1700)")
    sql(db, f"INSERT INTO t VALUES ({ROWS + 1}, 'new', 1)")
    sql(db, "UPDATE plain SET v = 'c' WHERE id = 2")
    drain(db, src, slot, client)
    stored = _objects(client, url)
    out = merge_slot(spark, store=src, slot=slot, delta=lake, engine="delta-spark", deletion_vectors=True)
    assert {t.action for t in out.tables} == {"merged"}, out.to_dict()
    dt.update_incremental()
    assert files_before <= set(dt.file_uris()), "a data file was rewritten despite deletion vectors"
    # optimized writes: the merge's rows go into one new file, not one per shuffle partition
    assert len(set(dt.file_uris()) - files_before) == 1, set(dt.file_uris()) - files_before
    vectors = [k for k in _objects(client, url) if k not in stored and "deletion_vector_" in k]
    assert vectors, "the merge wrote no deletion vector"
    assert verify_table(db, lake, "public", "t").equal
    assert _spark_rows(spark, url) == sorted(sql(db, "SELECT id, v, n FROM t"))
    # every table the job bootstraps gets the feature
    assert has_deletion_vectors(DeltaTable(delta_table_url(lake, "public", "plain"), storage_options=storage))

    # ADD COLUMN … DEFAULT: the live rows get the default, the deleted ones stay deleted
    sql(db, "ALTER TABLE t ADD COLUMN d int DEFAULT 7")
    sql(db, "UPDATE t SET n = 1000 WHERE id = 20")
    drain(db, src, slot, client)
    out = merge_slot(spark, store=src, slot=slot, delta=lake, engine="delta-spark", deletion_vectors=True)
    assert not out.failed, out.to_dict()
    assert verify_table(db, lake, "public", "t").equal

    # the delta-rs engine merges into the table (it applies the vectors when it rewrites)
    sql(db, "UPDATE t SET v = 'rs' WHERE id IN (8, 1501)")
    sql(db, "DELETE FROM t WHERE id = 12")
    drain(db, src, slot, client)
    out = merge_slot(spark, store=src, slot=slot, delta=lake, engine="delta-rs")
    assert not out.failed, out.to_dict()
    assert verify_table(db, lake, "public", "t").equal

    # maintain, few dead rows: VACUUM (retention 0) keeps the live vectors (target size 1
    # byte: no file is small enough to compact, which would apply and drop the vectors)
    sql(db, "UPDATE t SET v = 'm' WHERE id IN (9, 2500)")
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake, engine="delta-spark", deletion_vectors=True)
    dt.update_incremental()
    physical, dead = deleted_rows(dt)
    assert 0 < dead < PURGE_RATIO * physical, (physical, dead)
    # a data file written and never committed (as by a merge killed before its commit)
    orphan = f"{url.rstrip('/')}/part-00000-0badf11e-0000-4000-8000-000000000000-c000.snappy.parquet"
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": [1]}), buf)
    client.put_object(Bucket=orphan.split("/")[2], Key=orphan.split("/", 3)[3], Body=buf.getvalue())
    # (at retention 0 but the default floor first: every vector file and the orphan are
    # younger than 24 h, and a merge running now may be about to commit them: none is removed)
    out = maintain_slot(store=src, slot=slot, delta=lake, retention_hours=0, target_size=1, tables=["public.t"])
    gone = out.tables[0].vacuum
    assert gone["deletion_vectors"]["files"] == 0 and gone["orphans"]["files"] == 0, gone
    vectors = {k for k in _objects(client, url) if "deletion_vector_" in k}
    out = maintain_slot(store=src, slot=slot, delta=lake, retention_hours=0, target_size=1,
                        unreferenced_floor_hours=0)  # no other writer runs in this test
    res = next(r for r in out.tables if r.table == "public.t")
    assert res.compaction["mode"] == "compact", res.compaction
    # the vectors of the files the delta-rs merge rewrote go, the live ones stay
    dv = res.vacuum["deletion_vectors"]
    left = {k for k in _objects(client, url) if "deletion_vector_" in k}
    assert dv["files"] >= 1 and dv["kept"] >= 1 and len(left) == dv["kept"] == len(vectors) - dv["files"], dv
    assert res.vacuum["orphans"]["files"] == 1 and orphan.split("/", 3)[3] not in _objects(client, url), res.vacuum
    assert verify_table(db, lake, "public", "t").equal
    assert _spark_rows(spark, url) == sorted(sql(db, "SELECT id, v, n FROM t"))
    dt.update_incremental()
    assert deleted_rows(dt)[1] == dead

    # maintain, a quarter of the rows dead: the purge rewrites the table, live rows only,
    # sorted by the key, and VACUUM removes the replaced files and every vector file
    sql(db, "UPDATE t SET n = n + 1 WHERE id % 4 = 0")
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake, engine="delta-spark", deletion_vectors=True)
    dt.update_incremental()
    physical, dead = deleted_rows(dt)
    assert dead >= PURGE_RATIO * physical, (physical, dead)
    out = maintain_slot(store=src, slot=slot, delta=lake, retention_hours=0, tables=["public.t"],
                        unreferenced_floor_hours=0)
    (res,) = out.tables
    assert res.compaction["mode"] == "purge" and res.compaction["deleted_rows_purged"] == dead, res.compaction
    dt.update_incremental()
    assert deleted_rows(dt) == (sql(db, "SELECT count(*) FROM t")[0][0], 0)

    adds = pa.table(dt.get_add_actions(flatten=True)).sort_by("min.id")
    lo, hi = adds.column("min.id").to_pylist(), adds.column("max.id").to_pylist()
    assert all(h < n for h, n in zip(hi, lo[1:], strict=False)), (lo, hi)  # disjoint key ranges
    on_s3 = {k.rsplit("/", 1)[-1] for k in _objects(client, url) if "/_delta_log/" not in k}
    assert {u.rsplit("/", 1)[-1] for u in dt.file_uris()} == on_s3, "only the live files are left"
    assert res.vacuum["files"] > 0 and res.vacuum["bytes"] > 0, res.vacuum
    # no file has a vector any more: every vector file goes
    assert res.vacuum["deletion_vectors"]["files"] >= 1 and res.vacuum["deletion_vectors"]["kept"] == 0, res.vacuum
    assert not [k for k in _objects(client, url) if "deletion_vector_" in k]
    assert verify_table(db, lake, "public", "t").equal
    spark.catalog.clearCache()
    assert _spark_rows(spark, url) == sorted(sql(db, "SELECT id, v, n FROM t"))
    sql(db, "UPDATE t SET v = 'after' WHERE id IN (10, 2600)")
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake, engine="delta-spark", deletion_vectors=True)
    assert verify_table(db, lake, "public", "t").equal


@on_pg18("the merge's option: no server difference")
def test_turned_on_for_an_existing_table_and_refused_for_delta_rs(fresh_db, slot_name, store, spark):
    from deltalake import DeltaTable

    from airflow_pgcdc.lake.tables import delta_table_url
    from airflow_pgcdc.merge.errors import MergeError
    from airflow_pgcdc.merge.sinks.deltaspark import has_deletion_vectors
    from airflow_pgcdc.store import s3 as s3store

    client, src, lake = store
    db = fresh_db
    sql(db, "CREATE TABLE t (id bigint PRIMARY KEY, v text, n int)")
    sql(db, "INSERT INTO t SELECT g, md5(g::text), g FROM generate_series(1, 500) g")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    with pytest.raises(MergeError, match="deletion vectors need --engine delta-spark"):
        merge_slot(spark, store=src, slot=slot, delta=lake, engine="delta-rs", deletion_vectors=True)
    merge_slot(spark, store=src, slot=slot, delta=lake, engine="delta-rs")  # created without them
    url = delta_table_url(lake, "public", "t")
    dt = DeltaTable(url, storage_options=s3store.delta_storage_options())
    assert not has_deletion_vectors(dt)
    sql(db, "UPDATE t SET v = 'x' WHERE id = 250")
    drain(db, src, slot, client)
    out = merge_slot(spark, store=src, slot=slot, delta=lake, engine="delta-spark", deletion_vectors=True)
    assert not out.failed, out.to_dict()
    dt.update_incremental()
    assert has_deletion_vectors(dt)
    assert verify_table(db, lake, "public", "t").equal
