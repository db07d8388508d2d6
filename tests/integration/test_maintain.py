"""``pgcdc maintain``: compaction, VACUUM, checkpoint of the Delta tables and expiry of
the merged change windows, on the real PostgreSQL and S3 servers with delta-rs."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from lake_helpers import drain, sql

from airflow_pgcdc.lake.tables import app_id, delta_table_url
from airflow_pgcdc.maintain import expired_key, maintain_slot, read_expired
from airflow_pgcdc.merge.job import TablesFailed, merge_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout
from airflow_pgcdc.store.window import committed_window_seqs, read_window
from airflow_pgcdc.verify import verify_table

TABLES = ("t", "u", "q")


@pytest.fixture
def db18(pg18, request):
    name = "mt_" + request.node.name.lower().replace("[", "_").replace("]", "").replace("-", "_")[:40]
    dsn = pg18.create_database(name)
    yield dsn
    pg18.drop_database(name)


def setup_pipeline(db, client, src, slot):
    sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text, n int)")
    sql(db, "CREATE TABLE u (k text PRIMARY KEY, n int)")
    sql(db, "CREATE TABLE q (id int PRIMARY KEY, v text)")  # quiet: never changes after the snapshot
    sql(db, "INSERT INTO t SELECT g, 'v' || g, g FROM generate_series(1, 2000) g")
    sql(db, "INSERT INTO u SELECT 'k' || g, g FROM generate_series(1, 50) g")
    sql(db, "INSERT INTO q SELECT g, 'q' FROM generate_series(1, 10) g")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t, u, q")
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client)


def change(db, i):
    """New rows (a new small file per merge); sometimes an update and a delete."""
    sql(db, f"INSERT INTO t SELECT 10000 + {i} * 100 + g, 'new', {i} FROM generate_series(1, 20) g")
    if i % 7 == 3:  # rewrites the snapshot's file only
        sql(db, f"UPDATE t SET v = 'r{i}', n = n + 1 WHERE id = {i}")
        sql(db, f"DELETE FROM t WHERE id = {i + 1000}")
    if i % 2 == 0:
        sql(db, f"INSERT INTO u VALUES ('n{i}', {i})")


def assert_equal(db, lake, name="public.t"):
    for t in TABLES:
        r = verify_table(db, lake, "public", t)
        assert r.equal, f"public.{t}: {r.to_dict() if hasattr(r, 'to_dict') else r}"


def layout_objects(client, src, slot, seq):
    lay = Layout.parse(src)
    return [o["Key"].rsplit("/", 1)[-1] for o in s3store.list_objects(client, lay.bucket, lay.window_prefix(slot, seq))]


def run_cli(s3, *args):
    env = dict(os.environ, **s3.aws_env())
    proc = subprocess.run([sys.executable, "-m", "airflow_pgcdc.cli", "maintain", *args],
                          env=env, capture_output=True, text=True, timeout=600)
    return proc


@pytest.mark.slow
def test_maintain_compacts_vacuums_and_expires_merged_windows(db18, slot_name, store, spark, s3, monkeypatch):
    client, src, lake = store
    db = db18
    slot = slot_name()
    setup_pipeline(db, client, src, slot)
    merges = 22
    for i in range(merges):
        change(db, i)
        drain(db, src, slot, client)
        merge_slot(spark, store=src, slot=slot, delta=lake)
    opts = s3store.delta_storage_options()
    url = {t: delta_table_url(lake, "public", t) for t in TABLES}
    apps = {t: app_id(slot, "public", t) for t in TABLES}
    dts = {t: DeltaTable(url[t], storage_options=opts) for t in TABLES}
    files_before = {t: len(dts[t].file_uris()) for t in TABLES}
    versions_before = {t: dts[t].version() for t in TABLES}
    txn_before = {t: dts[t].transaction_version(apps[t]) for t in TABLES}
    assert files_before["t"] >= merges // 2 and files_before["u"] >= merges // 2, files_before
    assert txn_before["t"] == merges - 1 and txn_before["q"] is None
    # two more windows, not merged: the older stays (unmerged), the newer is the latest
    for i in range(merges, merges + 2):
        change(db, i)
        drain(db, src, slot, client)
    last = merges + 1

    # 1) a retention of 1 hour: everything compacted, nothing vacuumed or expired (all younger)
    proc = run_cli(s3, "--from", src, "--slot", slot, "--delta", lake, "--retention-hours", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "below the default" in proc.stderr
    out = json.loads(proc.stdout)
    by = {r["table"]: r for r in out["tables"]}
    assert set(by) == {"public.t", "public.u", "public.q"}
    assert by["public.t"]["files_after"] <= 2 < by["public.t"]["files_before"], by["public.t"]
    assert by["public.t"]["compaction"]["files_removed"] >= merges // 2
    assert by["public.t"]["vacuum"]["files"] == 0
    # no data file is older than the 24 h floor: nothing can be unreferenced, the log is not read
    assert by["public.t"]["vacuum"]["log_read"] is False and by["public.t"]["vacuum"]["orphans"]["files"] == 0
    assert out["windows"]["expired"] == [] and out["windows"]["objects"] == 0
    assert out["copies"]["expired"] == {} and list(out["copies"]["kept"]) == ["younger than the retention"]
    for t in TABLES:
        dt = DeltaTable(url[t], storage_options=opts)
        assert dt.transaction_version(apps[t]) == txn_before[t], t
        assert len(dt.file_uris()) <= 2, (t, len(dt.file_uris()))
    # time travel to the version before the compaction (within the retention) still reads
    old = DeltaTable(url["t"], storage_options=opts, version=versions_before["t"])
    assert old.to_pyarrow_table().num_rows == DeltaTable(url["t"], storage_options=opts).to_pyarrow_table().num_rows

    # a dry run reports what retention 0 would remove and removes nothing; each Delta
    # table's log is read twice: by its upkeep, then once for the windows' and copies' expiry
    opened = []
    real_init = DeltaTable.__init__
    with monkeypatch.context() as m:
        m.setattr(DeltaTable, "__init__", lambda self, uri, *a, **kw: opened.append(str(uri).rstrip("/"))
                  or real_init(self, uri, *a, **kw))
        dry = maintain_slot(store=src, slot=slot, delta=lake, retention_hours=0, dry_run=True).to_dict()
    assert {t: opened.count(url[t].rstrip("/")) for t in TABLES} == {t: 2 for t in TABLES}, opened
    assert dry["windows"]["expired"] == [[0, merges - 1]] and dry["windows"]["bytes"] > 0, dry["windows"]
    assert {r["table"]: r for r in dry["tables"]}["public.t"]["vacuum"]["dry_run"] is True
    assert dry["bytes_removed"] >= dry["windows"]["bytes"]
    print("\ndry run, vacuum of public.t would remove", {r["table"]: r for r in dry["tables"]}["public.t"]["vacuum"])
    assert len(layout_objects(client, src, slot, 0)) > 1
    assert not s3store.exists(client, Layout.parse(src).bucket, expired_key(Layout.parse(src), slot))

    # a data file written and never committed (as by a merge killed before its commit):
    # delta-rs' VACUUM never removes it (no remove action names it)
    orphan = f"{url['t'].rstrip('/')}/part-00000-0badf11e-0000-4000-8000-000000000000-c000.snappy.parquet"
    o_bucket, o_key = orphan.split("/")[2], orphan.split("/", 3)[3]
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": [1]}), buf)
    client.put_object(Bucket=o_bucket, Key=o_key, Body=buf.getvalue())

    # 2) retention 0: the compacted-away files are vacuumed, merged windows expired, the
    #    snapshot's parts removed (every table's Delta table holds it); the orphan is younger
    #    than the 24 h floor (a merge running now could be about to commit it): kept
    before_bytes = sum(o["Size"] for o in s3store.list_objects(client, *_split(src + "/" + slot + "/changes/")))
    proc = run_cli(s3, "--from", src, "--slot", slot, "--delta", lake, "--retention-hours", "0", "--zorder")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    by = {r["table"]: r for r in out["tables"]}
    assert by["public.t"]["vacuum"]["files"] >= merges // 2 and by["public.t"]["vacuum"]["bytes"] > 0, by["public.t"]
    assert by["public.t"]["compaction"]["mode"] == "z_order"
    assert by["public.t"]["vacuum"]["orphans"]["files"] == 0 and s3store.exists(client, o_bucket, o_key)
    assert out["windows"]["expired"] == [[0, merges - 1]], out["windows"]
    assert {k: sorted(v) for k, v in out["copies"]["expired"].items()} == {
        k: ["public.q", "public.t", "public.u"] for k in out["copies"]["expired"]} != {}, out["copies"]
    assert out["windows"]["bytes"] > 0 and out["bytes_removed"] > out["windows"]["bytes"]
    after_bytes = sum(o["Size"] for o in s3store.list_objects(client, *_split(src + "/" + slot + "/changes/")))
    assert before_bytes - after_bytes == out["windows"]["bytes"]
    print(f"\nfiles before/after: {files_before} -> "
          f"{ {t: len(DeltaTable(url[t], storage_options=opts).file_uris()) for t in TABLES} }; "
          f"removed: {out['bytes_removed']} bytes ({out['windows']['bytes']} of windows, "
          f"{out['windows']['objects']} objects); store changes/ {before_bytes} -> {after_bytes} bytes")
    lay = Layout.parse(src)
    assert read_expired(client, lay, slot) == set(range(merges))
    assert s3store.exists(client, lay.bucket, expired_key(lay, slot))
    for seq in range(merges):  # the manifest stays, as a tombstone
        assert layout_objects(client, src, slot, seq) == ["_manifest.json"], seq
    for seq in (merges, last):  # the unmerged window and the latest one keep their parts
        assert len(layout_objects(client, src, slot, seq)) > 1, seq
    assert committed_window_seqs(client, lay, slot) == list(range(last + 1))
    for t in TABLES:
        dt = DeltaTable(url[t], storage_options=opts)
        assert dt.transaction_version(apps[t]) == txn_before[t], t
        dt.load_as_version(dt.version())  # the current version (within any retention) reads
        assert dt.to_pyarrow_table().num_rows > 0
    with pytest.raises(Exception):  # noqa: B017 - a version older than retention 0 lost its files
        DeltaTable(url["t"], storage_options=opts, version=versions_before["t"] - 5).to_pyarrow_table()

    # a replayed merge of the merged windows is still a no-op; the next merge takes the 2 pending
    res = merge_slot(spark, store=src, slot=slot, delta=lake).to_dict()
    t_res = next(r for r in res["tables"] if r["table"] == "public.t")
    assert t_res["action"] == "merged" and t_res.get("first_window") == merges, t_res
    assert DeltaTable(url["t"], storage_options=opts).transaction_version(apps["t"]) == last
    assert_equal(db, lake)
    # a following drain + merge works (no WindowGap), and the quiet table still merges
    sql(db, "INSERT INTO q VALUES (100, 'late')")
    change(db, 99)
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake)
    assert_equal(db, lake)
    v = {t: DeltaTable(url[t], storage_options=opts).version() for t in TABLES}
    res = merge_slot(spark, store=src, slot=slot, delta=lake).to_dict()  # replay: nothing to do
    assert {t: DeltaTable(url[t], storage_options=opts).version() for t in TABLES} == v, res
    # maintain again: the windows expired before are skipped, the merged ones now expire
    from airflow_pgcdc.operators.maintain import PgcdcMaintainOperator

    op = PgcdcMaintainOperator(task_id="maintain", store=src, slot=slot, delta=lake, retention_hours="0")
    out2 = op.execute({})
    assert out2["windows"]["expired"] == [[merges, last]], out2["windows"]
    lineage = op.get_openlineage_facets_on_complete(None)  # None without the OpenLineage provider (floor)
    if importlib.util.find_spec("airflow.providers.openlineage") is not None:
        rewritten = sorted(t["url"].split("/", 3)[3] for t in out2["tables"]
                           if t["version_after"] != t["version_before"])
        assert rewritten and sorted(d.name for d in lineage.outputs) == rewritten, (out2["tables"], lineage)
        assert sorted(d.name for d in lineage.inputs) == rewritten
    assert_equal(db, lake)
    # with the floor at 0 (no other writer runs here) the orphan goes; the log was read for it
    # (the copy's tables, all expired before, are looked at again with one listing, not one each)
    listed = []
    real_list = s3store.list_objects
    with monkeypatch.context() as m:
        m.setattr(s3store, "list_objects", lambda c, b, prefix, *a, **kw: listed.append(prefix)
                  or real_list(c, b, prefix, *a, **kw))
        out3 = maintain_slot(store=src, slot=slot, delta=lake, retention_hours=0,
                             unreferenced_floor_hours=0).to_dict()
    assert out3["copies"]["expired"] == {} and out3["copies"]["objects"] == 0, out3["copies"]
    assert len([p for p in listed if "/snapshot/" in p]) == 1, listed
    # a Delta table's folder is listed whole twice (vacuum's sizes, the unreferenced files),
    # its log alone for the log's upkeep
    table_root = {t: url[t].split("/", 3)[3].rstrip("/") + "/" for t in TABLES}
    assert {t: listed.count(table_root[t]) for t in TABLES} == {t: 2 for t in TABLES}, listed
    vac = {r["table"]: r for r in out3["tables"]}["public.t"]["vacuum"]
    assert vac["orphans"] == {"files": 1, "bytes": len(buf.getvalue())} and vac["log_read"] is True, vac
    assert not s3store.exists(client, o_bucket, o_key)
    assert_equal(db, lake)


def _split(url):
    from airflow_pgcdc.store.s3 import S3Location

    loc = S3Location.parse(url)
    return loc.bucket, loc.prefix.rstrip("/") + "/"


@pytest.mark.slow
def test_maintain_while_merge_and_drain_run(db18, slot_name, store, spark):
    """A drain loop and a maintain loop (retention 0 and 168 in turn) in threads while the
    merge runs again and again in the main thread (Spark), until both kinds of maintain, three
    merges and two drains ran interleaved (not for a fixed time: 90 s until session 19):
    merges that lose a race commit nothing and rerun; in the end the Delta tables equal
    PostgreSQL, nothing lost, nothing doubled."""
    client, src, lake = store
    db = db18
    slot = slot_name()
    setup_pipeline(db, client, src, slot)
    for i in range(4):
        change(db, i)
        drain(db, src, slot, client)
        merge_slot(spark, store=src, slot=slot, delta=lake)
    stop = threading.Event()
    errors: list[BaseException] = []
    stats = {"merges": 0, "merge_refused": 0, "drains": 0, "maintains": 0, "maintain_failed": 0}

    def drains():
        i = 10
        try:
            while not stop.is_set():
                change(db, i)
                drain(db, src, slot, client)
                stats["drains"] += 1
                i += 1
                time.sleep(0.2)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    removed = [0]

    def maintains():  # maintain is delta-rs and boto3 only: a thread is fine (Spark stays in the main one)
        n = 0
        while not stop.is_set():
            n += 1
            try:  # every other run keeps the removed files (the merge then races the compaction at its
                # commit), the others vacuum them at once (a merge reading them fails, commits nothing)
                out = maintain_slot(store=src, slot=slot, delta=lake, retention_hours=0 if n % 2 else 168).to_dict()
                removed[0] += out["bytes_removed"]
                stats["maintains"] += 1
            except Exception as e:  # noqa: BLE001 - a table failing here is reported, counted
                stats["maintain_failed"] += 1
                print("maintain failed:", str(e)[:300])
            time.sleep(0.5)

    threads = [threading.Thread(target=drains), threading.Thread(target=maintains)]
    for th in threads:
        th.start()
    def enough() -> bool:  # both maintain kinds, merges and drains interleaved: what the race needs
        return stats["maintains"] >= 2 and stats["merges"] >= 3 and stats["drains"] >= 2

    deadline = time.monotonic() + 400  # a hang guard only: the loop ends when enough() holds
    try:
        while time.monotonic() < deadline and not errors and not enough():
            try:
                merge_slot(spark, store=src, slot=slot, delta=lake)
                stats["merges"] += 1
            except TablesFailed as e:  # lost a race with maintain: nothing committed, rerun
                stats["merge_refused"] += 1
                why = "ConcurrentCommit" if "ConcurrentCommit" in str(e) else "file vacuumed" if "not found" in str(e) else "other"
                stats[why] = stats.get(why, 0) + 1
                print("merge refused:", str(e)[:400])
    finally:
        stop.set()
        for th in threads:
            th.join(timeout=300)
    assert not errors, errors
    print(f"\n{stats}, {removed[0]} bytes removed")
    assert enough(), stats
    drain(db, src, slot, client)  # the quiet end: drain and merge what is left
    for _ in range(3):
        try:
            merge_slot(spark, store=src, slot=slot, delta=lake)
            break
        except TablesFailed:
            continue
    assert_equal(db, lake)
    opts = s3store.delta_storage_options()
    dt = DeltaTable(delta_table_url(lake, "public", "t"), storage_options=opts)
    # through the last window holding t (the quiet end's drain may commit an empty window: t's
    # version stays at the one before, by design; comparing with the very last one failed then)
    layout = Layout.parse(src)
    holding_t = [seq for seq in committed_window_seqs(client, layout, slot)
                 if any(e["table"] == "t" for e in read_window(client, layout, slot, seq).tables)]
    assert dt.transaction_version(app_id(slot, "public", "t")) == holding_t[-1]
