"""The documented least-privilege policy (store/iam.py ``pipeline_policy``) is enough for
the whole pipeline and no more: the test bed's S3 server (SeaweedFS, its IAM enforcing a
role's policy) gives the jobs only a role with exactly that policy; snapshot, drain, merge,
a rebuild into its default root and upkeep succeed under it, and a write outside the
pipeline's prefixes is refused."""

from __future__ import annotations

import pytest
from lake_helpers import sql

from airflow_pgcdc.drain.drain import drain_window
from airflow_pgcdc.maintain import maintain_slot
from airflow_pgcdc.merge.job import merge_slot
from airflow_pgcdc.merge.rebuild import rebuild_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.iam import pipeline_policy
from airflow_pgcdc.testing.s3 import S3Server

BUCKET = "iam-test"
STORE, DELTA = f"s3://{BUCKET}/cdc", f"s3://{BUCKET}/delta"



@pytest.fixture(scope="module")
def iam_s3():
    server = S3Server(sts_session_seconds=900, role_policy=pipeline_policy(STORE, DELTA)).start()
    server.create_bucket(BUCKET)
    yield server
    server.close()


def test_the_pipeline_runs_under_the_documented_policy_and_no_wider(pg18, slot_name, iam_s3, spark, monkeypatch):
    for k, v in iam_s3.aws_env().items():
        monkeypatch.setenv(k, v)
    settings = s3store.S3Settings.from_env(role_arn=S3Server.ROLE_ARN, sts_endpoint_url=iam_s3.endpoint_url,
                                           role_seconds=900)
    client = s3store.make_s3_client(settings)
    db = pg18.create_database("iam_policy")
    try:
        sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'v' FROM generate_series(1, 50) g")
        sql(db, "CREATE PUBLICATION pub FOR TABLE t")
        slot = slot_name()
        snapshot_to_s3(db, STORE, slot=slot, publications="pub", s3=settings)
        sql(db, "UPDATE t SET v = 'w' WHERE id < 10; DELETE FROM t WHERE id > 45")
        drain_window(db, STORE, slot=slot, publications="pub", s3=client)
        merged = merge_slot(spark, store=STORE, slot=slot, delta=DELTA, s3=settings)
        assert [t.action for t in merged.tables] == ["bootstrapped+merged"]
        rebuilt = rebuild_slot(spark, store=STORE, slot=slot, delta=DELTA, s3=settings)  # {delta}_rebuild/{run}
        assert rebuilt["rebuild"]["swapped"]
        done = maintain_slot(store=STORE, slot=slot, delta=DELTA, s3=settings, retention_hours=0)
        assert not [t for t in done.tables if t.action == "failed"]
        with pytest.raises(s3store.AccessDenied):  # the policy is enforced: nothing outside its prefixes
            s3store.put_bytes(client, BUCKET, "elsewhere/x", b"x")
    finally:
        pg18.drop_database("iam_policy")
