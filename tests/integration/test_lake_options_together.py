"""The lake consumers' options at once (``--change-data-feed --metadata-columns --soft-deletes
--catalog``), as a team would turn them on, on both engines: they compose (the feed shows a
soft delete as an update, the metadata columns say ``D``, the catalog lists the added
columns), and every table still equals PostgreSQL."""

from __future__ import annotations

import pyarrow as pa
import pytest
from lake_helpers import drain, sql
from matrix import on_pg18

from airflow_pgcdc.lake.catalog import Metastore
from airflow_pgcdc.lake.tables import delta_table_url
from airflow_pgcdc.merge.jars import unavailable_reason
from airflow_pgcdc.merge.job import merge_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.verify import verify_table

_MISSING = unavailable_reason()
EXTRA = ["_pgcdc_op", "_pgcdc_commit_lsn", "_pgcdc_commit_ts", "_pgcdc_merged_at", "_pgcdc_deleted_at"]


def _run(db, slot, client, src, lake, spark, uri, engine):
    from deltalake import DeltaTable

    sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(db, "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 4) g")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t")
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    prefix = engine.replace("-", "_") + "_"  # one metastore for the session: each test its own databases
    asked = dict(engine=engine, change_data_feed=True, metadata_columns=True, soft_deletes=True, catalog=uri,
                 catalog_prefix=prefix)
    out = merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    assert out.catalog == {f"{prefix}public.t": "created"}, out.catalog
    url = delta_table_url(lake, "public", "t")
    dt = DeltaTable(url, storage_options=s3store.delta_storage_options())
    v0 = dt.version()

    sql(db, "UPDATE t SET v = 'changed' WHERE id = 1; DELETE FROM t WHERE id = 2; INSERT INTO t VALUES (5, 'new')")
    drain(db, src, slot, client)
    out = merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    assert out.catalog == {f"{prefix}public.t": "unchanged"}, out.catalog
    dt = DeltaTable(url, storage_options=s3store.delta_storage_options())
    rows = {r["id"]: r for r in dt.to_pyarrow_table().to_pylist()}
    assert (rows[2]["_pgcdc_op"], rows[2]["_pgcdc_deleted_at"] is not None, rows[1]["_pgcdc_op"]) == ("D", True, "U")
    feed = pa.table(dt.load_cdf(starting_version=v0 + 1).read_all()).to_pylist()
    changes = sorted((r["_change_type"], r["id"], r["_pgcdc_op"]) for r in feed)
    # the soft delete is an update in the feed: its row is still there, marked
    assert changes == [("insert", 5, "I"), ("update_postimage", 1, "U"), ("update_postimage", 2, "D"),
                       ("update_preimage", 1, "R"), ("update_preimage", 2, "R")], changes
    with Metastore(uri) as ms:
        assert [c.name for c in ms.table(f"{prefix}public", "t").sd.cols] == ["id", "v", *EXTRA]
    assert verify_table(db, lake, "public", "t").equal


@pytest.mark.slow
@on_pg18("the options are the merge's: no server difference")
def test_the_options_compose_on_the_delta_rs_engine(fresh_db, slot_name, store, spark, hive_metastore):
    client, src, lake = store
    _run(fresh_db, slot_name(), client, src, lake, spark, hive_metastore.uri, "delta-rs")


@pytest.mark.slow
@pytest.mark.delta_spark
@pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")
@on_pg18("the options are the merge's: no server difference")
def test_the_options_compose_on_delta_spark(fresh_db, slot_name, store, spark, hive_metastore):
    client, src, lake = store
    _run(fresh_db, slot_name(), client, src, lake, spark, hive_metastore.uri, "delta-spark")
