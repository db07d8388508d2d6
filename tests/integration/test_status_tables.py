"""``pgcdc status --delta``: per Delta table of the pipeline, its live data files and their
bytes, its latest version, the versions its log keeps and its last ``pgcdc maintain``, in
the text and the JSON output; checked against what delta-rs reports for each table, on
PostgreSQL 15 and 18, for tables merged by delta-rs and (PostgreSQL 18, with the jars) by
delta-spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime

import pytest
from deltalake import DeltaTable
from lake_helpers import sql

from airflow_pgcdc.drain.drain import drain_window
from airflow_pgcdc.lake.tables import delta_table_url
from airflow_pgcdc.maintain import maintain_slot
from airflow_pgcdc.merge.jars import unavailable_reason
from airflow_pgcdc.merge.job import merge_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.status.job import slot_status
from airflow_pgcdc.store import s3 as s3store

TABLES = ("t", "u", "q")
_NO_JARS = unavailable_reason()

pytestmark = pytest.mark.delta_spark  # both engines: Delta in the shared session


def setup_pipeline(db, client, src, slot):
    sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text, n int)")
    sql(db, "CREATE TABLE u (k text PRIMARY KEY, n int)")
    sql(db, "CREATE TABLE q (id int PRIMARY KEY, v text)")  # quiet after the snapshot
    sql(db, "INSERT INTO t SELECT g, 'v' || g, g FROM generate_series(1, 2000) g")
    sql(db, "INSERT INTO u SELECT 'k' || g, g FROM generate_series(1, 50) g")
    sql(db, "INSERT INTO q SELECT g, 'q' FROM generate_series(1, 10) g")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t, u, q")
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client)


def change(db, i):
    """New rows in t (a new small file per merge), an update and a delete now and then,
    a new row in u every other time."""
    sql(db, f"INSERT INTO t SELECT 10000 + {i} * 100 + g, 'new', {i} FROM generate_series(1, 20) g")
    if i % 3 == 1:
        sql(db, f"UPDATE t SET v = 'r{i}', n = n + 1 WHERE id = {i}")
        sql(db, f"DELETE FROM t WHERE id = {i + 1000}")
    if i % 2 == 0:
        sql(db, f"INSERT INTO u VALUES ('n{i}', {i})")


def run_rounds(db, client, src, slot, lake, spark, rounds, engine):
    for i in range(rounds):
        change(db, i)
        drain_window(db, src, slot=slot, publications="pub", s3=client)
        kw = {"engine": "delta-spark", "reader": "s3a"} if engine == "delta-spark" else {}
        merge_slot(spark, store=src, slot=slot, delta=lake, **kw)


def delta_rs_view(url):
    """What delta-rs itself reports for the table at ``url``."""
    dt = DeltaTable(url, storage_options=s3store.delta_storage_options())
    import pyarrow as pa

    adds = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
    history = dt.history()
    return {
        "version": dt.version(),
        "files": len(dt.file_uris()),
        "bytes": sum(adds["size_bytes"]),
        "versions_kept": len(history),
        "oldest_version": min(h["version"] for h in history),
    }


def by_table(status):
    return {t["table"]: t for t in status["store"]["delta_tables"]}


def assert_matches_delta_rs(tables, lake):
    for name in TABLES:
        got = tables[f"public.{name}"]
        assert got["exists"] is True and got["kind"] == "table", got
        assert got["delta_url"] == delta_table_url(lake, "public", name)
        want = delta_rs_view(got["delta_url"])
        assert {k: got[k] for k in want} == want, (name, got, want)
        assert got["stored_bytes"] >= got["bytes"] + got["log_bytes"] > got["bytes"], got


def cli_status(s3, db, slot, src, lake, *extra):
    env = dict(os.environ, **s3.aws_env())
    proc = subprocess.run([sys.executable, "-m", "airflow_pgcdc.cli", "status", "--dsn", db, "--slot", slot,
                           "--from", src, "--delta", lake, *extra], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def text_line(out, name):
    lines = [ln for ln in out.splitlines() if ln.startswith("delta table") and f" {name}: " in ln]
    assert len(lines) == 1, out
    return lines[0]


def check_pipeline(db, client, src, lake, slot, spark, s3, engine, rounds):
    setup_pipeline(db, client, src, slot)
    run_rounds(db, client, src, slot, lake, spark, rounds, engine)

    # after the merges: the figures are delta-rs' own, nothing maintained yet
    tables = by_table(slot_status(db, slot, store=src, delta=lake))
    assert set(tables) == {f"public.{t}" for t in TABLES}, sorted(tables)  # no history tables here
    assert_matches_delta_rs(tables, lake)
    assert all(t["last_maintenance"] is None for t in tables.values()), tables
    t_before = tables["public.t"]
    assert t_before["files"] > rounds // 2, t_before  # merges added files (one per merge at least on delta-rs)
    assert t_before["version"] >= rounds  # the bootstrap, then one commit per merge
    out = cli_status(s3, db, slot, src, lake)
    line = text_line(out, "public.t")
    assert f"version {t_before['version']} ({t_before['versions_kept']} versions in the log" in line, line
    assert f"{t_before['files']} data files" in line and "never maintained" in line, line

    # maintain, retention 0: the compaction folds the merges' files; status shows it
    result = maintain_slot(store=src, slot=slot, delta=lake, retention_hours=0).to_dict()
    done = {r["table"]: r for r in result["tables"]}
    tables = by_table(slot_status(db, slot, store=src, delta=lake))
    assert_matches_delta_rs(tables, lake)
    t_after = tables["public.t"]
    assert t_after["files"] < t_before["files"], (t_before, t_after)
    assert t_after["stored_bytes"] < t_before["stored_bytes"] + t_after["log_bytes"], (t_before, t_after)
    assert t_after["checkpoint_version"] == t_after["version"]
    for name in TABLES:
        m = tables[f"public.{name}"]["last_maintenance"]
        r = done[f"public.{name}"]
        assert m is not None and m["action"] == "maintained", m
        assert m["compaction"] == r["compaction"] and m["vacuum"] == r["vacuum"] and m["log"] == r["log"], (m, r)
        assert m["files_before"] == r["files_before"] and m["files_after"] == tables[f"public.{name}"]["files"]
        assert m["version_after"] == r["version_after"] == tables[f"public.{name}"]["version"]
        assert m["retention_hours"] == 0
        assert datetime.fromisoformat(m["started_at"]) <= datetime.fromisoformat(m["finished_at"])
    m = t_after["last_maintenance"]
    assert m["compaction"]["files_removed"] >= t_before["files"] - 1 and m["vacuum"]["files"] > 0, m

    # the CLI: the same figures in JSON, and a line per table in the text
    doc = json.loads(cli_status(s3, db, slot, src, lake, "--json"))
    figures = ("version", "files", "bytes", "versions_kept", "oldest_version", "checkpoint_version")
    assert {k: {f: v[f] for f in figures} for k, v in by_table(doc).items()} == \
        {k: {f: v[f] for f in figures} for k, v in tables.items()}
    assert by_table(doc)["public.t"]["last_maintenance"]["finished_at"] == m["finished_at"]
    line = text_line(cli_status(s3, db, slot, src, lake), "public.t")
    assert f"{t_after['files']} data files" in line and f"last maintain {m['finished_at']}" in line, line
    assert f"{m['compaction']['files_removed']} -> {m['compaction']['files_added']} files" in line, line

    # a merge after the maintenance: one version more, the maintenance record stays
    change(db, 102)  # inserts only into t: one file more
    drain_window(db, src, slot=slot, publications="pub", s3=client)
    kw = {"engine": "delta-spark", "reader": "s3a"} if engine == "delta-spark" else {}
    merge_slot(spark, store=src, slot=slot, delta=lake, **kw)
    tables = by_table(slot_status(db, slot, store=src, delta=lake))
    assert_matches_delta_rs(tables, lake)
    assert tables["public.t"]["version"] == t_after["version"] + 1
    assert tables["public.t"]["files"] > t_after["files"]
    assert tables["public.t"]["last_maintenance"] == m
    return t_before, t_after


def test_status_tables_deltars(fresh_db, slot_name, store, s3, spark):
    client, src, lake = store
    before, after = check_pipeline(fresh_db, client, src, lake, slot_name(), spark, s3, "delta-rs", rounds=3)
    print(f"\npublic.t: files {before['files']} -> {after['files']}, versions {before['versions_kept']} kept")


@pytest.mark.skipif(_NO_JARS is not None, reason=_NO_JARS or "")
def test_status_tables_delta_spark(pg18, request, slot_name, store, s3, spark):
    client, src, lake = store
    db = pg18.create_database("st_delta_spark")
    try:
        before, after = check_pipeline(db, client, src, lake, slot_name(), spark, s3, "delta-spark", rounds=2)
        print(f"\npublic.t (delta-spark): files {before['files']} -> {after['files']}")
    finally:
        pg18.drop_database("st_delta_spark")


class _CountingClient:
    """An S3 client that counts the objects read (GetObject) per key."""

    def __init__(self, client):
        import collections

        self._client = client
        self.gets = collections.Counter()

    def get_object(self, **kw):
        self.gets[kw["Key"]] += 1
        return self._client.get_object(**kw)

    def __getattr__(self, name):
        return getattr(self._client, name)


def test_status_reads_each_manifest_of_the_slot_once(pg18, request, slot_name, store, s3, spark):
    """``pgcdc status --delta`` asks for the snapshot, the resyncs and the newest window in
    several places (tables without a copy, tables that left, merge progress, Delta figures,
    partitions): one SlotStore reads each once (the snapshot manifest was read five times, the
    newest window's twice)."""
    client, src, lake = store
    db = pg18.create_database("st_reads")
    try:
        slot = slot_name()
        setup_pipeline(db, client, src, slot)
        run_rounds(db, client, src, slot, lake, spark, 1, "delta-rs")
        counting = _CountingClient(client)
        status = slot_status(db, slot, publications="pub", store=src, s3=counting, delta=lake)
        assert status["store"]["windows_committed"] == 1 and status["problem"] is None
        manifests = {k: n for k, n in counting.gets.items() if k.endswith("_manifest.json")}
        snapshot = [k for k in manifests if "/snapshot/" in k]
        assert len(snapshot) == 1 and manifests[snapshot[0]] == 1, manifests
        assert max(manifests.values()) == 1, manifests  # the newest window's too (it was read twice)
    finally:
        pg18.drop_database("st_reads")
