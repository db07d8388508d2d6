"""``pgcdc maintain`` on tables merged by Delta's Spark engine: after the compaction,
VACUUM and the delta-rs checkpoint, delta-spark still reads the app transactions (a replay
is a no-op), merges the next windows and the tables equal PostgreSQL. Skips without the
jars (``make setup``)."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from airflow_pgcdc.merge.jars import unavailable_reason

_MISSING = unavailable_reason()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")


@pytest.mark.slow
def test_maintain_then_delta_spark_merges_on(pg18, request, slot_name, s3, s3_bucket, monkeypatch, spark_with_delta):
    import test_maintain as tm

    from airflow_pgcdc.lake.tables import app_id, delta_table_url
    from airflow_pgcdc.maintain import maintain_slot
    from airflow_pgcdc.merge.job import merge_slot
    from airflow_pgcdc.store import s3 as s3store

    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    client, src, lake = s3.client(), f"s3://{s3_bucket}/cdc", f"s3://{s3_bucket}/lake"
    db = pg18.create_database("mt_delta_spark")
    try:
        slot = slot_name()
        tm.setup_pipeline(db, client, src, slot)

        def merge():
            return merge_slot(spark_with_delta, store=src, slot=slot, delta=lake, engine="delta-spark",
                              reader="s3a").to_dict()

        rounds = 4  # four merges: files to compact, windows to expire (each round a delta-spark merge, ~10 s)
        for i in range(rounds):
            tm.change(db, i)
            tm.drain(db, src, slot, client)
            merge()
        opts = s3store.delta_storage_options()
        url = delta_table_url(lake, "public", "t")
        app = app_id(slot, "public", "t")
        before = DeltaTable(url, storage_options=opts)
        files_before, txn = len(before.file_uris()), before.transaction_version(app)
        assert txn == rounds - 1
        tm.change(db, rounds)
        tm.drain(db, src, slot, client)  # the latest window, not merged
        out = maintain_slot(store=src, slot=slot, delta=lake, retention_hours=0).to_dict()
        after = DeltaTable(url, storage_options=opts)
        print(f"\ndelta-spark table: files {files_before} -> {len(after.file_uris())}, removed {out['bytes_removed']} bytes, "
              f"windows expired {out['windows']['expired']}")
        assert len(after.file_uris()) < files_before
        assert after.transaction_version(app) == txn
        assert out["windows"]["expired"] == [[0, rounds - 1]], out["windows"]
        res = merge()  # delta-spark reads the delta-rs checkpoint and its app transactions
        t_res = next(r for r in res["tables"] if r["table"] == "public.t")
        assert t_res["action"] == "merged" and t_res["first_window"] == rounds, t_res
        tm.assert_equal(db, lake)
        version = DeltaTable(url, storage_options=opts).version()
        merge()  # a replay: nothing to do
        assert DeltaTable(url, storage_options=opts).version() == version
    finally:
        pg18.drop_database("mt_delta_spark")
