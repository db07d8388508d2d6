"""Two merge jobs committing the same window to one Delta table at once (an overlapping
Airflow run, a manual rerun): delta-rs lets one commit win; the other finds the window
merged and reports it, nothing is written twice. Real S3 server, real delta-rs."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from airflow_pgcdc.lake.inspect import open_table
from airflow_pgcdc.merge.clauses import build_merge_spec
from airflow_pgcdc.merge.sinks import deltars
from airflow_pgcdc.store.s3 import S3Settings, delta_storage_options

APP = "pgcdc:slot:public.t"


@pytest.fixture()
def table(s3, s3_bucket):
    storage = delta_storage_options(S3Settings.from_env(s3.aws_env()))
    url = f"s3://{s3_bucket}/delta/public.t"
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": pa.array(["a", "b", "c"])})
    deltars.bootstrap(url, pa.RecordBatchReader.from_batches(rows.schema, rows.to_batches()),
                      storage_options=storage, metadata={})
    return url, storage


def changes() -> pa.Table:
    return pa.table({
        "id": pa.array([3, 4, 1], pa.int64()),
        "v": pa.array(["C", "D", None]),
        "_pgcdc_op": pa.array(["U", "I", "D"]),
    })


def race(n: int, commit) -> list:
    barrier = threading.Barrier(n)
    out: list = [None] * n

    def go(i: int) -> None:
        barrier.wait()
        try:
            out[i] = commit(i)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            out[i] = exc

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return out


def test_concurrent_merges_of_one_window_commit_once(table):
    url, storage = table
    spec = build_merge_spec(target_columns=["id", "v"], source_columns=["id", "v"], key_columns=["id"])
    # both jobs read the table before either commits
    tables = [open_table(url, storage) for _ in range(2)]

    def commit(i):
        src = changes()
        return deltars.merge(tables[i], pa.RecordBatchReader.from_batches(src.schema, src.to_batches()),
                             spec, app=APP, version=7, metadata={})

    out = race(2, commit)
    assert not any(isinstance(o, BaseException) for o in out), out
    assert sum(1 for o in out if o.get("concurrent_commit")) == 1, out
    dt = open_table(url, storage)
    assert dt.version() == 1, "one MERGE commit on top of the bootstrap"
    assert dt.transaction_version(APP) == 7
    assert sorted(dt.to_pyarrow_table().to_pylist(), key=lambda r: r["id"]) == [
        {"id": 2, "v": "b"}, {"id": 3, "v": "C"}, {"id": 4, "v": "D"},
    ]


TARGET = pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.string())])


def append_window(dt, version: int = 3):
    rows = pa.table({"id": pa.array([10], pa.int64()), "v": pa.array(["x"])})
    return deltars.append(dt, pa.RecordBatchReader.from_batches(rows.schema, rows.to_batches()), TARGET,
                          app=APP, version=version, metadata={})


def test_concurrent_appends_of_one_window_commit_once(table):
    url, storage = table
    tables = [open_table(url, storage) for _ in range(2)]
    out = race(2, lambda i: append_window(tables[i]))
    assert not any(isinstance(o, BaseException) for o in out), out
    assert sum(1 for o in out if o.get("concurrent_commit")) == 1, out
    dt = open_table(url, storage)
    assert dt.to_pyarrow_table().column("id").to_pylist().count(10) == 1, "the window's rows once"


def test_append_on_a_handle_read_before_another_jobs_commit_is_refused(table):
    """An append is blind (it conflicts with nothing): made against the latest version it
    would add the window twice. It is made against the handle the job read."""
    url, storage = table
    stale = open_table(url, storage)
    assert append_window(open_table(url, storage)) == {}
    assert append_window(stale).get("concurrent_commit")
    assert append_window(open_table(url, storage)).get("concurrent_commit"), "a fresh handle sees it merged"
    rows = open_table(url, storage).to_pyarrow_table().column("id").to_pylist()
    assert rows.count(10) == 1


def test_a_different_concurrent_commit_is_a_typed_error(table):
    url, storage = table
    spec = build_merge_spec(target_columns=["id", "v"], source_columns=["id", "v"], key_columns=["id"])
    stale = open_table(url, storage)
    other = open_table(url, storage)
    src = changes()
    deltars.merge(other, pa.RecordBatchReader.from_batches(src.schema, src.to_batches()), spec,
                  app="pgcdc:other", version=1, metadata={})
    with pytest.raises(deltars.ConcurrentCommit) as ei:
        deltars.merge(stale, pa.RecordBatchReader.from_batches(src.schema, src.to_batches()), spec,
                      app=APP, version=7, metadata={})
    assert url in str(ei.value) and "window 7" in str(ei.value)
    assert open_table(url, storage).transaction_version(APP) is None
