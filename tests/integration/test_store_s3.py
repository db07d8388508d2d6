"""The store against a real S3 server (the test bed's ``weed mini``): multipart uploads with
bounded memory, abort and failure leave nothing, conditional creates, listing and deleting
more than one page, Parquet parts read back through the pyarrow S3 filesystem, delta-rs
options."""

from __future__ import annotations

import hashlib
import os
import threading
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from airflow_pgcdc.store.layout import Layout, decode_table_segment, new_run_id
from airflow_pgcdc.store.manifest import (
    ColumnEntry,
    PartEntry,
    SnapshotManifest,
    TableEntry,
    read_snapshot_manifest,
    write_manifest,
)
from airflow_pgcdc.store.multipart import MultipartWriter
from airflow_pgcdc.store.parquet import PartSequence
from airflow_pgcdc.store.s3 import (
    AccessDenied,
    AlreadyExists,
    CorruptObject,
    MiB,
    ObjectNotFound,
    S3RequestError,
    S3Settings,
    UploadAborted,
    delete_prefix,
    delta_storage_options,
    exists,
    get_bytes,
    get_json,
    list_keys,
    make_pyarrow_fs,
    make_s3_client,
    pending_uploads,
    put_bytes,
    put_if_absent,
)


@pytest.fixture(scope="module")
def settings(s3) -> S3Settings:
    return S3Settings.from_env(s3.aws_env())


@pytest.fixture(scope="module")
def client(settings):
    return make_s3_client(settings)


def _chunks(total: int, size: int, seed: int = 0):
    """Deterministic pseudo-random chunks, produced on the fly (never all in memory)."""
    block = hashlib.sha256(str(seed).encode()).digest() * (size // 32 + 1)
    n = 0
    i = 0
    while n < total:
        chunk = (i.to_bytes(8, "big") + block)[: min(size, total - n)]
        yield chunk
        n += len(chunk)
        i += 1


def _sha256_of_object(client, bucket: str, key: str) -> str:
    h = hashlib.sha256()
    body = client.get_object(Bucket=bucket, Key=key)["Body"]
    for chunk in iter(lambda: body.read(1 * MiB), b""):
        h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------- multipart writer


@pytest.mark.parametrize("max_in_flight", [0, 2])
def test_multipart_upload_40mib_with_bounded_memory(client, s3_bucket, max_in_flight) -> None:
    total, part_size = 40 * MiB, 5 * MiB
    h = hashlib.sha256()
    tracemalloc.start()
    try:
        with MultipartWriter(
            client, s3_bucket, "big/object.bin", part_size=part_size, max_in_flight=max_in_flight
        ) as w:
            for chunk in _chunks(total, 256 * 1024 + 7):
                h.update(chunk)
                w.write(chunk)
            assert w.tell() == total
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    bound = part_size * (max_in_flight + 1)
    assert peak <= bound + 3 * MiB, f"peak {peak / MiB:.1f} MiB > {bound / MiB} MiB + slack"
    assert w.bytes_written == total and w.multipart and w.closed
    head = client.head_object(Bucket=s3_bucket, Key="big/object.bin")
    assert head["ContentLength"] == total
    assert head["ETag"].strip('"').endswith("-8")  # 8 parts of 5 MiB
    assert _sha256_of_object(client, s3_bucket, "big/object.bin") == h.hexdigest()
    assert pending_uploads(client, s3_bucket) == []


def test_one_huge_write_is_split_into_parts(client, s3_bucket) -> None:
    data = os.urandom(11 * MiB + 3)
    with MultipartWriter(client, s3_bucket, "huge-write", part_size=5 * MiB) as w:
        w.write(memoryview(data))
    assert get_bytes(client, s3_bucket, "huge-write") == data
    assert client.head_object(Bucket=s3_bucket, Key="huge-write")["ETag"].strip('"').endswith("-3")


def test_upload_ready_sends_what_is_buffered_from_5_mib(client, s3_bucket) -> None:
    """upload_ready() (the Parquet writer calls it at a row group's end) ships the
    buffered bytes as a part once there are 5 MiB of them, whatever part_size is, and
    nothing below that; close() sends the rest, also when nothing is left buffered."""
    first, second, third = os.urandom(6 * MiB), os.urandom(1 * MiB), os.urandom(5 * MiB + 1)
    with MultipartWriter(client, s3_bucket, "ready/three", part_size=16 * MiB) as w:
        w.write(first)
        assert w.upload_ready() and w.multipart and w.tell() == len(first)
        w.write(second)
        assert not w.upload_ready()  # 1 MiB: below S3's smallest part but the last
        w.write(third)
        assert w.upload_ready()  # 6 MiB + 1 byte
        assert not w.upload_ready()  # nothing left
    assert get_bytes(client, s3_bucket, "ready/three") == first + second + third
    assert client.head_object(Bucket=s3_bucket, Key="ready/three")["ETag"].strip('"').endswith("-2")
    assert pending_uploads(client, s3_bucket) == []
    w = MultipartWriter(client, s3_bucket, "ready/closed", part_size=5 * MiB)
    w.close()
    with pytest.raises(ValueError, match="closed"):
        w.upload_ready()


def test_upload_ready_stops_after_early_parts(client, s3_bucket, monkeypatch) -> None:
    """Past EARLY_PARTS parts, upload_ready leaves the bytes to part_size buffers (parts
    smaller than part_size would lower the largest object 10,000 parts allow)."""
    from airflow_pgcdc.store import multipart

    monkeypatch.setattr(multipart, "EARLY_PARTS", 1)
    data = [os.urandom(6 * MiB) for _ in range(3)]
    with MultipartWriter(client, s3_bucket, "ready/capped", part_size=16 * MiB) as w:
        w.write(data[0])
        assert w.upload_ready()
        w.write(data[1])
        assert not w.upload_ready()  # one early part already
        w.write(data[2])
    assert get_bytes(client, s3_bucket, "ready/capped") == b"".join(data)
    assert client.head_object(Bucket=s3_bucket, Key="ready/capped")["ETag"].strip('"').endswith("-2")


@pytest.mark.parametrize("size", [0, 1, 5 * MiB])
def test_small_objects_go_as_one_put(client, s3_bucket, size) -> None:
    data = os.urandom(size)
    with MultipartWriter(
        client, s3_bucket, f"small/{size}", part_size=5 * MiB, content_type="x/y"
    ) as w:
        w.write(data)
    assert not w.multipart
    assert get_bytes(client, s3_bucket, f"small/{size}") == data
    assert client.head_object(Bucket=s3_bucket, Key=f"small/{size}")["ContentType"] == "x/y"


def test_abort_leaves_no_object_and_no_pending_upload(client, s3_bucket) -> None:
    w = MultipartWriter(client, s3_bucket, "aborted", part_size=5 * MiB, max_in_flight=2)
    for chunk in _chunks(17 * MiB, 1 * MiB):
        w.write(chunk)
    assert w.multipart and pending_uploads(client, s3_bucket)  # parts are up there
    w.abort()
    w.abort()  # idempotent
    assert w.aborted
    assert not exists(client, s3_bucket, "aborted")
    assert pending_uploads(client, s3_bucket) == []
    with pytest.raises(UploadAborted):
        w.write(b"x")
    with pytest.raises(UploadAborted):
        w.close()


def test_exception_inside_with_aborts(client, s3_bucket) -> None:
    with pytest.raises(RuntimeError, match="producer failed"):
        with MultipartWriter(client, s3_bucket, "failed", part_size=5 * MiB) as w:
            for chunk in _chunks(12 * MiB, 1 * MiB):
                w.write(chunk)
            raise RuntimeError("producer failed")
    assert w.aborted
    assert not exists(client, s3_bucket, "failed")
    assert pending_uploads(client, s3_bucket) == []


class _FailingClient:
    """A client whose UploadPart fails for one part number (a dead connection, say)."""

    def __init__(self, client, fail_part: int) -> None:
        self._client = client
        self._fail_part = fail_part

    def __getattr__(self, name):
        return getattr(self._client, name)

    def upload_part(self, **kwargs):
        if kwargs["PartNumber"] == self._fail_part:
            from botocore.exceptions import EndpointConnectionError

            raise EndpointConnectionError(endpoint_url="http://injected-failure")
        return self._client.upload_part(**kwargs)


@pytest.mark.parametrize("max_in_flight", [0, 1, 3])
def test_failed_part_upload_aborts_everything(client, s3_bucket, max_in_flight) -> None:
    w = MultipartWriter(
        _FailingClient(client, fail_part=2),
        s3_bucket,
        "part-fails",
        part_size=5 * MiB,
        max_in_flight=max_in_flight,
    )
    with pytest.raises(S3RequestError, match="UploadPart 2") as info:
        with w:
            for chunk in _chunks(30 * MiB, 1 * MiB):
                w.write(chunk)
    assert info.value.code == "EndpointConnectionError" and info.value.key == "part-fails"
    assert w.aborted
    assert not exists(client, s3_bucket, "part-fails")
    assert pending_uploads(client, s3_bucket) == []


@pytest.mark.parametrize("size", [10, 12 * MiB])
def test_conditional_complete_refuses_existing_key(client, s3_bucket, size) -> None:
    put_bytes(client, s3_bucket, "taken", b"first")
    w = MultipartWriter(client, s3_bucket, "taken", part_size=5 * MiB, if_none_match=True)
    for chunk in _chunks(size, 1 * MiB):
        w.write(chunk)
    with pytest.raises(AlreadyExists) as info:
        w.close()
    assert info.value.code == "PreconditionFailed" and "s3://" in str(info.value)
    assert w.aborted
    assert get_bytes(client, s3_bucket, "taken") == b"first"
    assert pending_uploads(client, s3_bucket) == []
    # and on a free key it simply creates
    with MultipartWriter(client, s3_bucket, "free", part_size=5 * MiB, if_none_match=True) as w2:
        w2.write(b"y" * size)
    assert get_bytes(client, s3_bucket, "free") == b"y" * size


# --------------------------------------------------------------------------- object operations


def test_put_if_absent_second_is_refused(client, s3_bucket) -> None:
    key = "slot/changes/w=000000000001/_manifest.json"
    assert (
        put_if_absent(client, s3_bucket, key, b'{"n": 1}', content_type="application/json") is True
    )
    assert put_if_absent(client, s3_bucket, key, b'{"n": 2}') is False
    assert get_json(client, s3_bucket, key) == {"n": 1}


def test_put_if_absent_races_have_one_winner(client, s3_bucket) -> None:
    barrier = threading.Barrier(8)

    def attempt(i: int) -> bool:
        barrier.wait()
        return put_if_absent(client, s3_bucket, "race", f"writer {i}")

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(attempt, range(8)))
    assert results.count(True) == 1
    winner = results.index(True)
    assert get_bytes(client, s3_bucket, "race") == f"writer {winner}".encode()


def test_get_json_exists_and_typed_errors(client, s3_bucket) -> None:
    assert not exists(client, s3_bucket, "nope")
    with pytest.raises(ObjectNotFound) as info:
        get_json(client, s3_bucket, "nope")
    assert info.value.code == "NoSuchKey" and info.value.key == "nope"
    put_bytes(client, s3_bucket, "bad.json", b"{not json")
    assert exists(client, s3_bucket, "bad.json")
    with pytest.raises(CorruptObject, match="not a JSON document"):
        get_json(client, s3_bucket, "bad.json")
    with pytest.raises(ObjectNotFound) as info:
        exists(client, "no-such-bucket-pgcdc", "k")
    assert info.value.code == "NoSuchBucket"


def test_bad_credentials_are_typed_and_secret_free(s3, settings, s3_bucket) -> None:
    secret = "WrongSecret/ThatMustNotLeak+0123456789"
    bad = make_s3_client(settings.with_(secret_access_key=secret, max_attempts=1))
    with pytest.raises(AccessDenied) as info:
        put_bytes(bad, s3_bucket, "k", b"x")
    assert secret not in str(info.value) and secret not in repr(info.value.__dict__)
    assert info.value.bucket == s3_bucket


def test_list_and_delete_prefix_beyond_one_page(client, s3_bucket) -> None:
    keys = [f"run/p/{i:05d}" for i in range(1100)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: put_bytes(client, s3_bucket, k, b"."), keys))
    for survivor in ("run/p2/x", "run/other/y", "run/p"):
        put_bytes(client, s3_bucket, survivor, b"keep")
    pending = client.create_multipart_upload(Bucket=s3_bucket, Key="run/p/pending")
    assert list(list_keys(client, s3_bucket, "run/p/")) == keys  # 2 pages, in order
    assert delete_prefix(client, s3_bucket, "run/p/") == 1100
    assert list(list_keys(client, s3_bucket, "run/p/")) == []
    assert sorted(list_keys(client, s3_bucket, "run/")) == ["run/other/y", "run/p", "run/p2/x"]
    assert [u["UploadId"] for u in pending_uploads(client, s3_bucket)] == []
    assert pending["UploadId"]
    assert delete_prefix(client, s3_bucket, "run/p/") == 0
    with pytest.raises(Exception, match="empty prefix"):
        delete_prefix(client, s3_bucket, "")


# --------------------------------------------------------------------------- parquet through the layout


def _rows(start: int, n: int) -> pa.RecordBatch:
    ids = pa.array(range(start, start + n), pa.int64())
    text = pc.binary_join_element_wise("row ", pc.cast(ids, pa.string()), ' é"/.%', "")
    return pa.record_batch(
        {
            "id": ids,
            "text": text,
            "ts": pc.cast(pc.multiply(ids, 1_000_000), pa.timestamp("us", tz="UTC")),
            "maybe": pa.array(
                [None if i % 5 == 0 else i * 0.5 for i in range(start, start + n)], pa.float64()
            ),
        }
    )


def test_parquet_part_sequence_round_trip_through_pyarrow_fs(client, settings, s3_bucket) -> None:
    lay = Layout.parse(f"s3://{s3_bucket}/exports/v1")
    slot, sid = "slot_1", new_run_id()
    schema_name, table_name = 'We"ird sch.ema', "a/b.c%d é_"
    batches = [_rows(i * 3000, 3000) for i in range(20)]
    seq = PartSequence(
        batches[0].schema,
        lambda n: lay.snapshot_part(slot, sid, schema_name, table_name, n),
        client=client,
        bucket=s3_bucket,
        max_rows=25_000,
        row_group_rows=10_000,
        upload_part_size=5 * MiB,
    )
    with seq:
        for b in batches:
            seq.write_batch(b)
    parts = seq.parts
    assert [p.rows for p in parts] == [25_000, 25_000, 10_000]
    prefix = lay.snapshot_table_prefix(slot, sid, schema_name, table_name)
    assert sorted(list_keys(client, s3_bucket, prefix)) == [p.key for p in parts]
    segment = prefix.rstrip("/").rsplit("/", 1)[1]
    assert decode_table_segment(segment) == (schema_name, table_name)
    for p in parts:
        assert client.head_object(Bucket=s3_bucket, Key=p.key)["ContentLength"] == p.bytes

    fs = make_pyarrow_fs(settings)
    expected = pa.Table.from_batches(batches)
    read = pa.concat_tables(pq.read_table(f"{s3_bucket}/{p.key}", filesystem=fs) for p in parts)
    assert read.equals(expected)
    dataset = ds.dataset(f"{s3_bucket}/{prefix}", filesystem=fs, format="parquet")
    assert dataset.to_table().sort_by("id").equals(expected)
    meta = pq.ParquetFile(f"{s3_bucket}/{parts[0].key}", filesystem=fs).metadata
    assert meta.num_row_groups == 3 and meta.row_group(0).column(0).compression == "ZSTD"

    # the manifest, written last and conditionally, lists the parts relative to its folder
    base = lay.snapshot_prefix(slot, sid)
    manifest = SnapshotManifest(
        slot=slot,
        snapshot_id=sid,
        snapshot_name="00000003-00000002-1",
        consistent_point="0/16B3748",
        system_id="7318273981273981273",
        timeline=1,
        started_at=pa.scalar(0, pa.timestamp("s", tz="UTC")).as_py(),
        finished_at=pa.scalar(1, pa.timestamp("s", tz="UTC")).as_py(),
        tables=[
            TableEntry(
                schema_name,
                table_name,
                [
                    ColumnEntry("id", "bigint", nullable=False, key=True),
                    ColumnEntry("text", "text"),
                    ColumnEntry("ts", "timestamp with time zone"),
                    ColumnEntry("maybe", "double precision"),
                ],
                key_columns=["id"],
                parts=[PartEntry.from_part_info(p, base) for p in parts],
            )
        ],
    )
    key = lay.snapshot_manifest(slot, sid)
    assert write_manifest(client, s3_bucket, key, manifest) is True
    assert write_manifest(client, s3_bucket, key, manifest) is False
    back = read_snapshot_manifest(client, s3_bucket, key)
    assert back == manifest and back.rows == 60_000
    assert [base + p.path for p in back.tables[0].parts] == [p.key for p in parts]


def test_parquet_sequence_failure_leaves_no_partial_part(client, s3_bucket) -> None:
    lay = Layout.parse(f"s3://{s3_bucket}/x")
    seq = PartSequence(
        _rows(0, 1).schema,
        lambda n: lay.snapshot_part("s", "sid", "public", "t", n),
        client=client,
        bucket=s3_bucket,
        max_rows=1000,
    )
    with pytest.raises(RuntimeError):
        with seq:
            seq.write_batch(_rows(0, 1500))  # part 0 done, part 1 open
            raise RuntimeError("source connection lost")
    assert list(list_keys(client, s3_bucket, "x/")) == [
        lay.snapshot_part("s", "sid", "public", "t", 0)
    ]
    assert pending_uploads(client, s3_bucket) == []


def test_parquet_sequence_memory_stays_bounded(client, s3_bucket) -> None:
    """~140 MB of Arrow data streamed in 64K-row batches: Arrow's pool never holds more than
    a couple of row groups, and Python's heap (tracemalloc) stays under the upload bound."""
    schema = _rows(0, 1).schema
    seq = PartSequence(
        schema,
        lambda n: f"mem/part-{n:05d}.parquet",
        client=client,
        bucket=s3_bucket,
        row_group_rows=64 * 1024,
        row_group_bytes=8 * MiB,
        target_bytes=64 * MiB,
        upload_part_size=5 * MiB,
        max_in_flight=1,
    )
    pool = pa.default_memory_pool()
    arrow_peak = 0
    total_arrow = 0
    tracemalloc.start()
    try:
        with seq:
            for i in range(48):
                batch = _rows(i * 65536, 65536)
                total_arrow += batch.nbytes
                seq.write_batch(batch)
                del batch
                arrow_peak = max(arrow_peak, pool.bytes_allocated())
        _, py_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seq.rows == 48 * 65536
    assert total_arrow > 130 * MiB
    print(f"arrow peak {arrow_peak / MiB:.1f} MiB, python peak {py_peak / MiB:.1f} MiB")
    assert arrow_peak < 32 * MiB, f"Arrow pool peaked at {arrow_peak / MiB:.1f} MiB"
    assert py_peak < 5 * MiB * 2 + 8 * MiB, f"Python heap peaked at {py_peak / MiB:.1f} MiB"
    assert sum(p.rows for p in seq.parts) == 48 * 65536


# --------------------------------------------------------------------------- delta-rs options


def test_delta_storage_options_write_and_read(settings, s3_bucket) -> None:
    deltalake = pytest.importorskip("deltalake")
    opts = delta_storage_options(settings)
    uri = f"s3://{s3_bucket}/delta/t"
    deltalake.write_deltalake(uri, pa.table({"x": [1, 2]}), storage_options=opts)
    deltalake.write_deltalake(uri, pa.table({"x": [3]}), storage_options=opts, mode="append")
    table = deltalake.DeltaTable(uri, storage_options=opts)
    assert table.version() == 1
    assert sorted(table.to_pyarrow_table()["x"].to_pylist()) == [1, 2, 3]


def test_the_conditional_put_probe_passes_on_a_server_that_enforces_it(client, s3_bucket) -> None:
    """The real S3 server answers 412 to a second If-None-Match put: the probe passes, once
    per process and bucket, and leaves no object behind."""
    from airflow_pgcdc.store import s3 as s3store

    s3store._CONDITIONAL_OK.discard((client.meta.endpoint_url, s3_bucket))
    s3store.check_conditional_puts(client, s3_bucket)
    assert (client.meta.endpoint_url, s3_bucket) in s3store._CONDITIONAL_OK
    assert list(s3store.list_keys(client, s3_bucket, "")) == []
