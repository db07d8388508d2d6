"""The window writer completes finished parts' uploads on a bounded pool: concurrently,
every part durably written before finish() returns, and a failed part fails the window
(finish raises, so no manifest is written and nothing is acknowledged)."""

from __future__ import annotations

import threading

import pytest

from airflow_pgcdc.changes.rows import ChangeBuffer, RelationVersion
from airflow_pgcdc.protocol.pgtypes import PgColumn, builtin_type
from airflow_pgcdc.store.layout import Layout
from airflow_pgcdc.store.s3 import StoreError
from airflow_pgcdc.store.window import WindowWriter


class FakeS3:
    """put_object only (every part here is small); ``barrier``: each put waits there,
    so a writer that puts one part at a time breaks it; ``fail``: keys whose put fails."""

    def __init__(self, barrier: threading.Barrier | None = None, fail: tuple[str, ...] = ()) -> None:
        self.barrier = barrier
        self.fail = fail
        self.objects: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight = 0

    def put_object(self, Bucket, Key, Body, **kw):  # noqa: N803 - boto3's names
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.barrier is not None:
                self.barrier.wait()
            if any(f in Key for f in self.fail):
                raise StoreError("injected failure", key=Key)
            with self.lock:
                self.objects[Key] = bytes(Body)
            return {"ETag": '"x"'}
        finally:
            with self.lock:
                self.in_flight -= 1


def _version(i: int) -> RelationVersion:
    cols = (PgColumn("id", builtin_type(20)), PgColumn("v", builtin_type(25)))
    return RelationVersion(16384 + i, "public", f"t{i}", "d", cols, (True, False))


def _part_bytes(client: FakeS3, w: WindowWriter, p: dict) -> bytes:
    """A manifest part's bytes: its object, or its range of a pack."""
    body = client.objects[w.base + p["path"]]
    return body if p.get("offset") is None else body[p["offset"]:p["offset"] + p["length"]]


def _fill(writer: WindowWriter, tables: int, rows: int = 3) -> None:
    for i in range(tables):
        rv = _version(i)
        buf = ChangeBuffer(rv)
        for r in range(rows):
            buf.add("I", (str(r), f"v{r}"), None, 100, i * rows + r, 7, None)
        writer.submit_rows(rv, buf.take(), lambda: None)


def test_parts_are_completed_concurrently_and_all_before_finish_returns() -> None:
    # four puts must be in flight at once to pass the barrier: one at a time breaks it
    client = FakeS3(barrier=threading.Barrier(4, timeout=30))
    w = WindowWriter(client, Layout.parse("s3://bkt/lake"), "s1", 0, attempt="0123abcd", upload_threads=4,
                     pack_max_part_bytes=0)  # every part its own object (packs: below)
    _fill(w, 8)
    out = w.finish(lambda: None)
    assert client.most_in_flight >= 4
    keys = [w.base + p["path"] for t in out["tables"] for v in t["relation_versions"] for p in v["parts"]]
    assert len(keys) == 8 and set(keys) == set(client.objects)
    assert all(len(client.objects[k]) == p["bytes"]
               for t in out["tables"] for v in t["relation_versions"] for p in v["parts"]
               for k in [w.base + p["path"]])


def test_in_flight_completions_are_bounded() -> None:
    client = FakeS3()
    w = WindowWriter(client, Layout.parse("s3://bkt/lake"), "s1", 0, attempt="0123abcd", upload_threads=3,
                     pack_max_part_bytes=0)
    _fill(w, 40)
    w.finish(lambda: None)
    assert 1 <= client.most_in_flight <= 3
    assert len(client.objects) == 40


@pytest.mark.parametrize("threads", [0, 4])
def test_a_failed_part_fails_the_window(threads: int) -> None:
    client = FakeS3(fail=("t5/",))
    w = WindowWriter(client, Layout.parse("s3://bkt/lake"), "s1", 0, attempt="0123abcd", upload_threads=threads,
                     pack_max_part_bytes=0)
    _fill(w, 12)
    with pytest.raises(StoreError, match="injected failure"):
        w.finish(lambda: None)
    assert not any(k.endswith("_manifest.json") for k in client.objects)


def test_a_tables_parts_share_one_encoding_choice_on_a_bounded_sample(monkeypatch) -> None:
    """Counting distinct values is the window writer's costliest per-part step on wide
    rows: a relation version rolled into several parts chooses once, on at most
    ENCODING_SAMPLE_ROWS rows, and every part is written with that choice."""
    import io

    import pyarrow.parquet as pq

    from airflow_pgcdc.store import parquet as pqstore
    from airflow_pgcdc.store import window as wstore

    counted = []
    real = pqstore.choose_dictionary_columns
    monkeypatch.setattr(pqstore, "choose_dictionary_columns",
                        lambda sample, rows: counted.append(min(rows, sample.num_rows)) or real(sample, rows))
    client = FakeS3()
    # parts roll as soon as a row group is written (target 1 byte; settle encodes each batch)
    w = WindowWriter(client, Layout.parse("s3://bkt/lake"), "s1", 0, attempt="0123abcd",
                     target_part_bytes=1)
    rv = _version(0)
    seq = 0
    for _ in range(3):
        buf = ChangeBuffer(rv)
        for _row in range(20_000):
            buf.add("I", (str(seq), f"value {seq % 10}"), None, 100, seq, 7, None)
            seq += 1
        w.submit_rows(rv, buf.take(), lambda: None, settle=True)
    out = w.finish(lambda: None)
    parts = out["tables"][0]["relation_versions"][0]["parts"]
    assert len(parts) >= 2
    assert counted == [wstore.ENCODING_SAMPLE_ROWS]  # once, for every part
    for p in parts:
        meta = pq.ParquetFile(io.BytesIO(_part_bytes(client, w, p))).metadata
        cols = {meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i).encodings
                for i in range(meta.num_columns)}
        assert "RLE_DICTIONARY" in cols["v"] and "RLE_DICTIONARY" not in cols["id"], cols


class FakeMultipartS3(FakeS3):
    """FakeS3 with multipart uploads; ``calls``: each request in order, as (operation,
    key, the part's size in bytes or None)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str, int | None]] = []
        self.uploads: dict[str, dict[int, bytes]] = {}

    def create_multipart_upload(self, Bucket, Key, **kw):  # noqa: N803 - boto3's names
        self.calls.append(("create", Key, None))
        self.uploads[Key] = {}
        return {"UploadId": Key}

    def upload_part(self, Bucket, Key, UploadId, PartNumber, Body):  # noqa: N803
        self.calls.append(("part", Key, len(Body)))
        self.uploads[UploadId][PartNumber] = bytes(Body)
        return {"ETag": f'"{PartNumber}"'}

    def complete_multipart_upload(self, Bucket, Key, UploadId, MultipartUpload, **kw):  # noqa: N803
        self.calls.append(("complete", Key, None))
        parts = self.uploads.pop(UploadId)
        self.objects[Key] = b"".join(parts[p["PartNumber"]] for p in MultipartUpload["Parts"])
        return {"ETag": '"done"'}

    def abort_multipart_upload(self, Bucket, Key, UploadId):  # noqa: N803
        self.uploads.pop(UploadId, None)


def test_window_row_groups_are_small_and_uploaded_as_they_are_written() -> None:
    """A window part's row groups hold at most WINDOW_ROW_GROUP_BYTES of Arrow data (the
    rows of the open one wait in memory, unencoded), and the part's bytes are uploaded
    at row group ends once there are 5 MiB of them, not all at the part's close. Before:
    one 64 MiB row group, every byte sent by close()."""
    import io
    import os

    import pyarrow.parquet as pq

    from airflow_pgcdc.store import window as wstore
    from airflow_pgcdc.store.s3 import DEFAULT_PART_SIZE

    client = FakeMultipartS3()
    w = WindowWriter(client, Layout.parse("s3://bkt/lake"), "s1", 0, attempt="0123abcd")
    rv = _version(0)
    seq = 0
    sent = 0
    while sent < 40 << 20:  # incompressible text: ~40 MiB of Arrow, ~30 MiB of Parquet
        buf = ChangeBuffer(rv)
        for _ in range(2_000):
            value = os.urandom(512).hex()
            buf.add("I", (str(seq), value), None, 100, seq, 7, None)
            sent += len(value)
            seq += 1
        w.submit_rows(rv, buf.take(), lambda: None)
    out = w.finish(lambda: None)
    (part,) = out["tables"][0]["relation_versions"][0]["parts"]
    key = w.base + part["path"]
    meta = pq.ParquetFile(io.BytesIO(client.objects[key])).metadata
    assert meta.num_rows == seq
    assert meta.num_row_groups >= (40 << 20) // wstore.WINDOW_ROW_GROUP_BYTES
    row_bytes = sent / seq
    assert all(meta.row_group(i).num_rows * row_bytes <= wstore.WINDOW_ROW_GROUP_BYTES * 1.05
               for i in range(meta.num_row_groups))
    ops = [(op, size) for op, k, size in client.calls if k == key]
    # each row group's bytes went up at its end (each is over 5 MiB here), not in 16 MiB
    # buffers sent when full or at the part's close
    parts = [size for op, size in ops if op == "part"]
    assert ops[0][0] == "create" and ops[-1][0] == "complete", ops
    assert len(parts) == meta.num_row_groups and parts[0] < DEFAULT_PART_SIZE, (ops, meta.num_row_groups)


def test_small_parts_are_written_as_one_pack_each_a_whole_parquet_file() -> None:
    """A window of many small tables writes one object for their parts, not one each: each
    manifest entry is the pack's path, its offset and its length, and that range is the
    table's whole Parquet file (before: 30 PUTs)."""
    import io

    import pyarrow.parquet as pq

    client = FakeS3()
    w = WindowWriter(client, Layout.parse("s3://bkt/lake"), "s1", 0, attempt="0123abcd")
    _fill(w, 30, rows=4)
    out = w.finish(lambda: None)
    assert list(client.objects) == [w.base + "pack-00000-0123abcd.pack"]
    entries = {t["table"]: v["parts"] for t in out["tables"] for v in t["relation_versions"]}
    assert len(entries) == 30 and all(len(p) == 1 for p in entries.values())
    offsets = []
    for (p,) in entries.values():
        assert p["path"] == "pack-00000-0123abcd.pack" and p["length"] == p["bytes"]
        rows = pq.read_table(io.BytesIO(_part_bytes(client, w, p)))
        assert rows.num_rows == 4 == p["rows"] and set(rows.column("id").to_pylist()) == {0, 1, 2, 3}
        offsets.append((p["offset"], p["length"]))
    offsets.sort()
    assert offsets[0][0] == 0 and all(a + n == b for (a, n), (b, _) in zip(offsets, offsets[1:], strict=False))
    assert offsets[-1][0] + offsets[-1][1] == len(client.objects[w.base + "pack-00000-0123abcd.pack"])


def test_a_part_over_the_limit_stays_its_own_object_and_the_fault_hook_sees_every_part() -> None:
    closed = []
    client = FakeS3()
    w = WindowWriter(client, Layout.parse("s3://bkt/lake"), "s1", 0, attempt="0123abcd",
                     pack_max_part_bytes=20_000, on_part_close=lambda: closed.append(1))
    _fill(w, 3, rows=2)  # small
    big = _version(9)
    buf = ChangeBuffer(big)
    for r in range(3_000):
        buf.add("I", (str(r), __import__("os").urandom(16).hex()), None, 100, r, 7, None)  # ~100 kB
    w.submit_rows(big, buf.take(), lambda: None)
    out = w.finish(lambda: None)
    parts = {t["table"]: v["parts"][0] for t in out["tables"] for v in t["relation_versions"]}
    assert parts["t9"].get("offset") is None and parts["t9"]["path"].startswith("public.t9/")
    assert {parts[f"t{i}"]["path"] for i in range(3)} == {"pack-00000-0123abcd.pack"}
    assert set(client.objects) == {w.base + "pack-00000-0123abcd.pack", w.base + parts["t9"]["path"]}
    assert len(closed) == 4


def test_a_failed_pack_fails_the_window() -> None:
    client = FakeS3(fail=("pack-",))
    w = WindowWriter(client, Layout.parse("s3://bkt/lake"), "s1", 0, attempt="0123abcd")
    _fill(w, 5)
    with pytest.raises(StoreError, match="injected failure"):
        w.finish(lambda: None)
    assert not client.objects, "no manifest"


def test_packs_split_at_their_size_and_references_name_a_range() -> None:
    from airflow_pgcdc.store.packs import PartPacker, part_ref, split_ref

    written = {}
    packer = PartPacker(lambda n: f"p{n}", written.__setitem__, max_pack_bytes=10)
    for i, body in enumerate([b"aaaa", b"bbbb", b"cccc", b"dddddddddddd"]):
        packer.add(f"k{i}", body)
    assert written == {"p0": b"aaaabbbb", "p1": b"cccc"}, "full packs are written as they fill"
    placed = packer.write()
    assert written == {"p0": b"aaaabbbb", "p1": b"cccc", "p2": b"dddddddddddd"}
    assert placed == {"k0": ("p0", 0, 4), "k1": ("p0", 4, 4), "k2": ("p1", 0, 4), "k3": ("p2", 0, 12)}
    assert PartPacker(lambda n: "x", written.__setitem__).write() == {}
    ref = part_ref("bkt/w/", {"path": "pack-00000.pack", "offset": 4, "length": 4})
    assert ref == "bkt/w/pack-00000.pack#range=4-4" and split_ref(ref) == ("bkt/w/pack-00000.pack", 4, 4)
    assert split_ref("bkt/w/public.t/v0000-part-00000.parquet") == ("bkt/w/public.t/v0000-part-00000.parquet",
                                                                     None, None)
    with pytest.raises(ValueError, match="OFFSET-LENGTH"):
        split_ref("bkt/p.pack#range=x-1")


def test_a_window_with_packed_parts_is_format_2_which_format_1_readers_refuse() -> None:
    from airflow_pgcdc.store.manifest import UnsupportedManifestFormat, load_document
    from airflow_pgcdc.store.window import WindowManifest

    def manifest(part):
        return WindowManifest(slot="s1", window_seq=0, start_lsn="0/1", end_lsn="0/2", end_reason="x", rows=1,
                              tables=({"schema": "public", "table": "t", "rows": 1, "bytes": 9,
                                       "relation_versions": [{"version": 0, "parts": [part]}]},))

    packed = manifest({"path": "pack-00000.pack", "rows": 1, "bytes": 9, "offset": 0, "length": 9})
    plain = manifest({"path": "public.t/v0000-part-00000.parquet", "rows": 1, "bytes": 9})
    assert (packed.to_dict()["format"], plain.to_dict()["format"]) == (2, 1)
    assert WindowManifest.from_json(packed.to_json()).packed
    with pytest.raises(UnsupportedManifestFormat, match="format 2 is not supported"):
        load_document(packed.to_json(), "k", "window")  # what a reader of format 1 does


class _CountingFs:
    """An Arrow-like filesystem over ``objects`` counting the files it opens."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects, self.opened = objects, []

    def open_input_file(self, path):
        import pyarrow as pa

        self.opened.append(path)
        return pa.BufferReader(self.objects[path])


def test_a_small_pack_is_read_once_for_all_its_parts_and_a_big_one_by_range(monkeypatch) -> None:
    from airflow_pgcdc.store import packs

    monkeypatch.setattr(packs, "_packs", packs.OrderedDict())
    monkeypatch.setattr(packs, "_ranged", set())
    monkeypatch.setattr(packs, "WHOLE_PACK_BYTES", 100)
    fs = _CountingFs({"b/small.pack": b"aaaabbbbcccc", "b/big.pack": b"x" * 150 + b"yyyy"})
    got = [packs.open_part(fs, f"b/small.pack#range={o}-4").read() for o in (0, 4, 8, 4)]
    assert got == [b"aaaa", b"bbbb", b"cccc", b"bbbb"] and fs.opened == ["b/small.pack"]
    assert packs.open_part(fs, "b/big.pack#range=150-4").read() == b"yyyy"
    assert packs.open_part(fs, "b/big.pack#range=0-4").read() == b"xxxx"
    assert fs.opened.count("b/big.pack") == 3, "sized once, then a range read per part"
    with pytest.raises(ValueError, match="truncated pack"):
        packs.open_part(fs, "b/small.pack#range=8-10")


def test_a_pack_dropped_from_the_cache_is_read_by_range_never_whole_again(monkeypatch) -> None:
    """A merge going table by table over more windows than the cache holds: each pack is
    downloaded whole at most once (before: every table downloaded every pack again)."""
    import pyarrow as pa

    from airflow_pgcdc.store import packs

    reads: list[tuple[str, str]] = []

    class File:
        def __init__(self, path, data):
            self.path, self.inner = path, pa.BufferReader(data)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.inner.close()

        def size(self):
            return self.inner.size()

        def read(self, *a):
            reads.append(("whole", self.path))
            return self.inner.read(*a)

        def read_at(self, n, offset):
            reads.append(("range", self.path))
            return self.inner.read_at(n, offset)

    class Fs:
        def open_input_file(self, path):
            return File(path, bytes([65 + int(path[3])]) * 12)

    monkeypatch.setattr(packs, "_packs", packs.OrderedDict())
    monkeypatch.setattr(packs, "_ranged", set())
    monkeypatch.setattr(packs, "PACK_CACHE_BYTES", 20)  # one 12-byte pack at a time
    for _table in range(3):
        for i in range(3):
            assert packs.open_part(Fs(), f"b/w{i}.pack#range=4-4").read() == bytes([65 + i]) * 4
    whole = [p for kind, p in reads if kind == "whole"]
    assert sorted(whole) == ["b/w0.pack", "b/w1.pack", "b/w2.pack"], reads
