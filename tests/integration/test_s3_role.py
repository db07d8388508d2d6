"""The pipeline under an assumed role whose sessions end every 20 seconds: the test bed's
S3 server runs STS (SeaweedFS' AssumeRole, every session cut to 20 s) and the jobs reach S3
only through ``role_arn`` (the static keys are the source credentials that assume it).
Snapshot, drain, the merge (delta-rs, its batches read by Spark's executors) and upkeep keep working across sessions that ended:
boto3 clients renew the role's credentials themselves, each merged table starts with fresh
ones (``JobContext.follow_credentials``), Spark's tasks assume it themselves. The control: storage
options taken before a session ended are refused after it."""

from __future__ import annotations

import time

import pytest
from deltalake import DeltaTable
from lake_helpers import sql

from airflow_pgcdc.drain.drain import drain_window
from airflow_pgcdc.lake.tables import delta_table_url
from airflow_pgcdc.maintain import maintain_slot
from airflow_pgcdc.merge.job import merge_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.testing.s3 import S3Server

SESSION = 20  # seconds every role session lasts on this server



@pytest.fixture(scope="module")
def sts_s3():
    server = S3Server(sts_session_seconds=SESSION).start()
    yield server
    server.close()


@pytest.fixture
def db(pg18, request):
    name = "role_" + request.node.name.lower()[:40]
    dsn = pg18.create_database(name)
    yield dsn
    pg18.drop_database(name)


def _rows(url: str, storage: dict[str, str]) -> list[tuple]:
    return sorted((r["id"], r["v"]) for r in DeltaTable(url, storage_options=storage).to_pyarrow_table().to_pylist())


def test_a_pipeline_under_a_role_outlives_its_sessions(db, slot_name, sts_s3, spark_with_delta, monkeypatch):
    for k, v in sts_s3.aws_env().items():
        monkeypatch.setenv(k, v)
    bucket = sts_s3.create_bucket("role-test")
    settings = s3store.S3Settings.from_env(role_arn=S3Server.ROLE_ARN, sts_endpoint_url=sts_s3.endpoint_url)
    first = settings.resolved_credentials()
    assert first[0] != sts_s3.access_key and first[2], "S3 is reached with the role's session, not the user's keys"
    client = s3store.make_s3_client(settings)
    src, lake = f"s3://{bucket}/cdc", f"s3://{bucket}/lake"
    for t in ("a", "b"):
        sql(db, f"CREATE TABLE {t} (id int PRIMARY KEY, v text); "
                f"INSERT INTO {t} SELECT g, md5(g::text) FROM generate_series(1, 200) g")
    sql(db, "CREATE PUBLICATION pub FOR ALL TABLES")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", workers=2, s3=settings)
    merge_slot(spark_with_delta, store=src, slot=slot, delta=lake, max_windows=0, s3=settings)
    before = s3store.delta_storage_options(settings)  # the session's credentials as they are now
    url = delta_table_url(lake, "public", "a")
    assert len(_rows(url, before)) == 200

    time.sleep(SESSION + 2)  # every session so far has ended
    with pytest.raises(Exception, match="InvalidAccessKeyId|ExpiredToken|403"):
        DeltaTable(url, storage_options=before).to_pyarrow_table()  # the control: old credentials refused
    assert s3store.list_keys(client, bucket, "cdc/") is not None and next(s3store.list_keys(client, bucket, "cdc/"))
    sql(db, "UPDATE a SET v = 'x' WHERE id < 50; DELETE FROM b WHERE id > 150; INSERT INTO a VALUES (1000, 'n')")
    drain_window(db, src, slot=slot, publications="pub", s3=client)  # the client made before renews itself
    merge_slot(spark_with_delta, store=src, slot=slot, delta=lake, s3=settings, driver_rows=0)  # executors too
    # Delta's Spark engine is not run here: S3A reaches STS over https only, and the test
    # bed's is plain http (tests/unit/test_s3_credentials.py checks S3A's settings for a role)

    time.sleep(SESSION + 2)
    maintain_slot(store=src, slot=slot, delta=lake, s3=settings)
    now = s3store.delta_storage_options(settings)
    for t in ("a", "b"):
        expect = sorted(sql(db, f"SELECT id, v FROM {t}"))
        assert _rows(delta_table_url(lake, "public", t), now) == expect


def test_an_aws_connection_with_a_role_reaches_s3_under_it(sts_s3, monkeypatch):
    """The role as an Airflow ``aws`` connection gives it (``role_arn``, the STS endpoint in
    ``service_config.sts``, the source keys as login and password), read by the amazon
    provider's connection wrapper when it is installed: objects are written and read with
    the role's session, not with the connection's keys."""
    import json

    from airflow_pgcdc.hooks.pgcdc import PgcdcHook

    for k in [k for k in __import__("os").environ if k.startswith(("AWS_", "PGCDC_S3_"))]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_ROLE", json.dumps({
        "conn_type": "aws", "login": sts_s3.access_key, "password": sts_s3.secret_key,
        "extra": {"endpoint_url": sts_s3.endpoint_url, "region_name": sts_s3.region, "role_arn": S3Server.ROLE_ARN,
                  "assume_role_kwargs": {"RoleSessionName": "pgcdc-conn-test"},
                  "service_config": {"sts": {"endpoint_url": sts_s3.endpoint_url}}}}))
    settings = PgcdcHook(aws_conn_id="lake_role").s3_settings()
    assert (settings.role_arn, settings.role_session_name) == (S3Server.ROLE_ARN, "pgcdc-conn-test")
    key_id, _secret, token = settings.resolved_credentials()
    assert key_id != sts_s3.access_key and token, "the role's session, not the connection's keys"
    bucket = sts_s3.create_bucket("role-conn")
    client = s3store.make_s3_client(settings)
    s3store.put_bytes(client, bucket, "probe/one.txt", b"under the role")
    assert s3store.get_bytes(client, bucket, "probe/one.txt") == b"under the role"
