"""Which files under a Delta table no version needs (maintain/unreferenced.py), from the
log's actions: the deletion-vector descriptor's file name, the replay of the latest
version, the tombstones within the retention, the data files no action names, and what
makes the step remove nothing."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from airflow_pgcdc.maintain.unreferenced import (
    FileAction,
    UnreadableLog,
    checkpoint_actions,
    commit_actions,
    data_file,
    live_paths,
    needed_vectors,
    unreferenced_files,
    vector_file,
    z85_decode,
)

URL = "s3://bucket/lake/public.t"
# the Delta protocol's own example: prefix "ab", then the UUID's 20 Z85 characters
EXAMPLE = {"storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^", "offset": 4, "sizeInBytes": 40,
           "cardinality": 6}
EXAMPLE_FILE = "ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"


def test_z85_decodes_the_reference_vector_and_refuses_garbage():
    assert z85_decode("HelloWorld") == bytes.fromhex("864fd26fb559f75b")
    with pytest.raises(ValueError, match="multiple of 5"):
        z85_decode("abcd")
    with pytest.raises(ValueError, match="not a Z85 character"):
        z85_decode("abc\"d")


def test_vector_file_of_each_storage_type():
    assert vector_file(EXAMPLE, URL) == EXAMPLE_FILE
    assert vector_file(dict(EXAMPLE, pathOrInlineDv=EXAMPLE["pathOrInlineDv"][2:]), URL) == EXAMPLE_FILE[3:]
    absolute = f"{URL}/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    assert vector_file({"storageType": "p", "pathOrInlineDv": absolute}, URL) == EXAMPLE_FILE[3:]
    s3a = absolute.replace("s3://", "s3a://")
    assert vector_file({"storageType": "p", "pathOrInlineDv": s3a}, URL) == EXAMPLE_FILE[3:]
    assert vector_file({"storageType": "i", "pathOrInlineDv": "wi5b=000010000siXQKl0"}, URL) is None
    assert vector_file(None, URL) is None
    with pytest.raises(UnreadableLog, match="unknown storage type"):
        vector_file({"storageType": "x", "pathOrInlineDv": "a"}, URL)
    with pytest.raises(UnreadableLog, match="outside the table"):
        vector_file({"storageType": "p", "pathOrInlineDv": "s3://other/deletion_vector_x.bin"}, URL)
    with pytest.raises(UnreadableLog, match="shorter than a UUID"):
        vector_file({"storageType": "u", "pathOrInlineDv": "abc"}, URL)


def test_commit_and_checkpoint_actions():
    lines = [{"commitInfo": {"operation": "MERGE"}},
             {"remove": {"path": "a.parquet", "deletionTimestamp": 5, "deletionVector": EXAMPLE}},
             {"add": {"path": "a.parquet", "size": 1, "deletionVector": None}},
             {"txn": {"appId": "x", "version": 3}}]
    got = commit_actions("\n".join(json.dumps(x) for x in lines) + "\n", URL)
    assert got == [FileAction("remove", "a.parquet", EXAMPLE_FILE, 5), FileAction("add", "a.parquet", None, None)]
    with pytest.raises(UnreadableLog, match="line 2: not JSON"):
        commit_actions('{"add": {"path": "a"}}\n{"add": ', URL)
    dv = pa.struct([("storageType", pa.string()), ("pathOrInlineDv", pa.string()), ("offset", pa.int32())])
    add = pa.struct([("path", pa.string()), ("deletionVector", dv)])
    remove = pa.struct([("path", pa.string()), ("deletionTimestamp", pa.int64()), ("deletionVector", dv)])
    table = pa.table({
        "add": pa.array([{"path": "b.parquet", "deletionVector": {"storageType": "u",
                          "pathOrInlineDv": EXAMPLE["pathOrInlineDv"], "offset": 1}}, None], add),
        "remove": pa.array([None, {"path": "c.parquet", "deletionTimestamp": 9, "deletionVector": None}], remove),
    })
    assert checkpoint_actions(table, URL) == [FileAction("add", "b.parquet", EXAMPLE_FILE, None),
                                              FileAction("remove", "c.parquet", None, 9)]
    sidecar = table.append_column("sidecar", pa.array([None, {"path": "x"}], pa.struct([("path", pa.string())])))
    with pytest.raises(UnreadableLog, match="sidecar"):
        checkpoint_actions(sidecar, URL)


def add(path, dv=None):
    return FileAction("add", path, dv)


def remove(path, dv=None, ts=0):
    return FileAction("remove", path, dv, ts)


def test_live_vectors_and_tombstones_within_the_retention():
    checkpoint = [add("f1", "dv1"), add("f2", "dv2"), add("f3")]
    commits = [
        (10, [add("f1", "dv1"), add("f2", "dv2")]),  # at or before the checkpoint: the checkpoint decides
        (11, [remove("f1", "dv1", ts=100), add("f1", "dv1b")]),  # a merge gave f1 a new vector, long ago
        (12, [remove("f2", "dv2", ts=500), add("f2", "dv2b")]),  # … and f2, within the retention
        (13, [remove("f3", ts=50), add("f4", "dv4")]),
    ]
    assert needed_vectors(checkpoint, commits, 10, cutoff_ms=300) == {"dv1b", "dv2b", "dv2", "dv4"}
    # a longer retention keeps f1's replaced vector too
    assert needed_vectors(checkpoint, commits, 10, cutoff_ms=100) == {"dv1", "dv1b", "dv2b", "dv2", "dv4"}
    # a purge removed every file, long ago: nothing is needed
    purge = [(14, [remove("f1", "dv1b", ts=200), remove("f2", "dv2b", ts=200), remove("f4", "dv4", ts=200),
                   add("g1")])]
    assert needed_vectors(checkpoint, commits + purge, 10, cutoff_ms=600) == set()


def test_a_remove_without_its_descriptor_keeps_every_vector_of_its_path():
    checkpoint = [add("f1", "dv1")]
    commits = [(6, [remove("f1", "dv1", ts=10), add("f1", "dv1b")]),
               (7, [remove("f1", ts=900), add("g")])]  # a writer that did not repeat the descriptor
    assert needed_vectors(checkpoint, commits, 5, cutoff_ms=500) == {"dv1", "dv1b"}
    assert needed_vectors(checkpoint, commits, 5, cutoff_ms=1000) == set()


def test_the_checkpoint_tombstones_count():
    checkpoint = [add("f1", "dv1b"), remove("f1", "dv1", ts=800), remove("old", "dv0", ts=1)]
    assert needed_vectors(checkpoint, [], 3, cutoff_ms=500) == {"dv1b", "dv1"}


def test_data_file_paths_as_the_log_spells_them():
    assert data_file("part-0.parquet", URL) == "part-0.parquet"
    assert data_file("a%3Db/part%200.parquet", URL) == "a=b/part 0.parquet"
    assert data_file(f"{URL}/part-0.parquet", URL) == "part-0.parquet"
    assert data_file(f"{URL.replace('s3://', 's3a://')}/x/part-0.parquet", URL) == "x/part-0.parquet"
    assert data_file("s3://elsewhere/part-0.parquet", URL) is None


def test_orphans_are_parquet_files_no_action_names():
    actions = [add("part-1.parquet"), remove("part%202.parquet", ts=1), add(f"{URL}/sub/part-3.parquet", "v")]
    keys = ["part-1.parquet", "part 2.parquet", "sub/part-3.parquet", "part-4.parquet", "sub/part-5.snappy.parquet",
            "_delta_log/00000000000000000000.checkpoint.parquet", "_change_data/cdc-1.parquet",
            ".hidden/part-6.parquet", EXAMPLE_FILE, "notes.txt"]
    assert unreferenced_files(keys, actions, URL) == {"part-4.parquet", "sub/part-5.snappy.parquet"}


def test_live_paths_follow_the_commits_after_the_checkpoint():
    checkpoint = [add("f1", "dv1"), add("f2"), remove("f0", ts=1)]
    commits = [(3, [add("old")]),  # before the checkpoint: ignored
               (5, [remove("f1", "dv1"), add("f1", "dv1b")]),
               (6, [remove("f2"), add("f3")])]
    assert live_paths(checkpoint, commits, 4) == {"f1", "f3"}


def test_vacuum_hours_round_up_never_down():
    """--retention-hours 0.9 ran VACUUM at 0 hours (int() cut it): files a 50-minute-old
    version needs were removed. delta-rs takes whole hours: rounded up, it keeps more."""
    from airflow_pgcdc.maintain.tables import vacuum_hours

    assert [vacuum_hours(h) for h in (0, 0.9, 1, 1.01, 168)] == [0, 1, 1, 2, 168]
