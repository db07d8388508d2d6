"""Every object the product writes carries the server-side encryption asked for
(``PGCDC_S3_SSE``, the ``aws`` connection's ``server_side_encryption`` extra): the store's
snapshot parts, windows and manifests, the merge's results and staging files, the Delta
files and log entries of both engines, the upkeep's records and rewritten files. Checked on
the test bed's S3 server, which records SSE-S3 (``AES256``) and returns it on HEAD."""

from __future__ import annotations

import pytest
from lake_helpers import sql

from airflow_pgcdc.drain.drain import drain_window
from airflow_pgcdc.maintain import maintain_slot
from airflow_pgcdc.merge.jars import unavailable_reason
from airflow_pgcdc.merge.job import merge_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.store import s3 as s3store


@pytest.fixture
def db(pg18, request):
    name = "sse_" + request.node.name.lower()[:40]
    dsn = pg18.create_database(name)
    yield dsn
    pg18.drop_database(name)


def _unencrypted(client, bucket: str) -> tuple[int, list[tuple[str, str | None]]]:
    """Objects without SSE-S3, of how many; S3A's empty directory markers (``…/``, no data
    to encrypt: the server keeps them as folders) are not objects with content."""
    keys = [k for k in s3store.list_keys(client, bucket, "") if not k.endswith("/")]
    heads = {k: client.head_object(Bucket=bucket, Key=k).get("ServerSideEncryption") for k in keys}
    return len(keys), [(k, v) for k, v in heads.items() if v != "AES256"]


def test_every_object_written_carries_the_encryption_asked_for(db, slot_name, s3, s3_bucket, spark_with_delta,
                                                               monkeypatch):
    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("PGCDC_S3_SSE", "AES256")
    client = s3store.make_s3_client()
    src, lake, lake2 = (f"s3://{s3_bucket}/{p}" for p in ("cdc", "lake", "lake-spark"))
    for t in ("a", "b"):
        sql(db, f"CREATE TABLE {t} (id int PRIMARY KEY, v text); "
                f"INSERT INTO {t} SELECT g, md5(g::text) FROM generate_series(1, 300) g")
    sql(db, "CREATE PUBLICATION pub FOR ALL TABLES")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", workers=2)
    merge_slot(spark_with_delta, store=src, slot=slot, delta=lake, max_windows=0)  # bootstrap, delta-rs
    sql(db, "UPDATE a SET v = 'x' WHERE id < 50; DELETE FROM b WHERE id > 250; INSERT INTO a VALUES (1000, 'n')")
    drain_window(db, src, slot=slot, publications="pub")
    merge_slot(spark_with_delta, store=src, slot=slot, delta=lake, driver_rows=0)  # staged by Spark's executors
    if unavailable_reason() is None:  # Delta's Spark engine writes through S3A
        merge_slot(spark_with_delta, store=src, slot=slot, delta=lake2, engine="delta-spark")
    maintain_slot(store=src, slot=slot, delta=lake, retention_hours=0)  # compaction, checkpoint, vacuum
    count, plain = _unencrypted(client, s3_bucket)
    assert count > 20 and not plain, f"{len(plain)} of {count} objects without SSE-S3: {plain[:10]}"
    kinds = {k.split("/")[0] for k in s3store.list_keys(client, s3_bucket, "")}
    assert {"cdc", "lake"} <= kinds and (unavailable_reason() is not None or "lake-spark" in kinds)


def test_staging_files_written_by_executors_carry_it(s3, s3_bucket, monkeypatch):
    """The merge's staging files (removed after each commit, so not in the scan above) are
    written by boto3 when encryption is asked for: Arrow's S3 client cannot send it."""
    from airflow_pgcdc.merge.spark_io import _open_output, s3_options

    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    options = s3_options(s3store.S3Settings.from_env(sse="AES256"))
    with _open_output(options, f"{s3_bucket}/staging/part-0.parquet") as out:
        out.write(b"PAR1")
    with _open_output(s3_options(s3store.S3Settings.from_env()), f"{s3_bucket}/staging/plain") as out:
        out.write(b"x")
    client = s3.client()
    assert client.head_object(Bucket=s3_bucket, Key="staging/part-0.parquet").get("ServerSideEncryption") == "AES256"
    assert client.head_object(Bucket=s3_bucket, Key="staging/plain").get("ServerSideEncryption") is None
