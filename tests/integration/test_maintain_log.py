"""``pgcdc maintain``'s log expiry (``maintain/delta.py`` ``expire_log``) on a Delta table in
the S3 server: the log entries of versions before the newest checkpoint older than the
retention go (never younger than ``LOG_FLOOR_HOURS``), every later version still reads,
time travel included, and the app transaction survives. Before, the log kept every commit
for the table's 30-day log retention whatever ``--retention-hours`` said."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from airflow_pgcdc.maintain.tables import LOG_FLOOR_HOURS, expire_log, maintain_table


@pytest.fixture
def table(store):
    from airflow_pgcdc.store import s3 as s3store

    client, _src, lake = store
    url = f"{lake}/public.t"
    storage = s3store.delta_storage_options()
    for v in range(12):
        write_deltalake(url, pa.table({"id": [v], "v": [f"r{v}"]}), mode="append", storage_options=storage,
                        commit_properties=CommitProperties(app_transactions=[Transaction("pgcdc:s:public.t", v)]))
    return client, url, storage


def _log(client, url):
    bucket, _, prefix = url[len("s3://"):].partition("/")
    resp = client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/_delta_log/")
    return sorted(o["Key"].rsplit("/", 1)[-1] for o in resp.get("Contents", ()))


def test_log_entries_before_an_old_checkpoint_go(table):
    client, url, storage = table
    res = maintain_table(url, name="public.t", apps=["pgcdc:s:public.t"], storage_options=storage, client=client,
                         retention_hours=0)
    checkpoint = res.log["checkpoint_version"]  # after the compaction's (and VACUUM's) commits
    assert checkpoint >= 12 and f"{checkpoint:020d}.checkpoint.parquet" in _log(client, url)
    # the checkpoint is younger than the floor: nothing of the log went, at retention 0
    assert f"{0:020d}.json" in _log(client, url)
    assert expire_log(client, url, 0) == []
    # a day later (the floor passed), the entries before the checkpoint go
    gone = expire_log(client, url, 0, now=datetime.now(UTC) + timedelta(hours=LOG_FLOOR_HOURS + 1))
    names = _log(client, url)
    assert sorted(k.rsplit("/", 1)[-1] for k in gone) == [f"{v:020d}.json" for v in range(checkpoint)]
    assert f"{checkpoint:020d}.json" in names and f"{checkpoint:020d}.checkpoint.parquet" in names
    dt = DeltaTable(url, storage_options=storage)
    assert dt.version() == checkpoint and dt.to_pyarrow_table().num_rows == 12
    assert dt.transaction_version("pgcdc:s:public.t") == 11
    write_deltalake(url, pa.table({"id": [12], "v": ["r12"]}), mode="append", storage_options=storage)
    assert DeltaTable(url, storage_options=storage, version=checkpoint).to_pyarrow_table().num_rows == 12
    assert DeltaTable(url, storage_options=storage).to_pyarrow_table().num_rows == 13


def test_a_long_retention_keeps_the_log(table):
    client, url, storage = table
    res = maintain_table(url, name="public.t", apps=[], storage_options=storage, client=client, retention_hours=168)
    checkpoint = res.log["checkpoint_version"]
    commits = [n for n in _log(client, url) if n.endswith(".json")]
    assert expire_log(client, url, 168, now=datetime.now(UTC) + timedelta(hours=100)) == []
    assert [n for n in _log(client, url) if n.endswith(".json")] == commits == [
        f"{v:020d}.json" for v in range(checkpoint + 1)]
    assert len(expire_log(client, url, 168, now=datetime.now(UTC) + timedelta(hours=169))) == checkpoint
