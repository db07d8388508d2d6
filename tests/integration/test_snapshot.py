"""The initial copy against real servers and the real S3 server: one exported snapshot,
parallel CTID parts, Parquet on S3, manifest last; the snapshot/stream handshake;
failure handling (a killed worker, a killed coordinator, a failed run)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import psycopg
import pyarrow.parquet as pq
import pytest

from airflow_pgcdc.pg.logical import LogicalStream
from airflow_pgcdc.pg.replication import ReplicationConnection
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.pgoutput.options import PgoutputOptions
from airflow_pgcdc.snapshot.export import (
    SnapshotBusy,
    SnapshotError,
    SnapshotExists,
    plan_parts,
    snapshot_to_s3,
)
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout
from airflow_pgcdc.store.manifest import SnapshotManifest


def sql(dsn, query, params=None):
    with psycopg.connect(dsn, autocommit=True) as c:
        cur = c.execute(query, params)
        return cur.fetchall() if cur.description else None


@pytest.fixture
def store(s3, s3_bucket, monkeypatch):
    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    client = s3.client()
    return client, f"s3://{s3_bucket}/lake"


def read_table(s3, url: str, manifest: SnapshotManifest, schema: str, table: str):
    fs = s3store.make_pyarrow_fs()
    layout = Layout.parse(url)
    entry = manifest.table(schema, table)
    prefix = layout.snapshot_prefix(manifest.slot, manifest.snapshot_id)
    tables = [pq.read_table(f"{layout.bucket}/{prefix}{p.path}", filesystem=fs) for p in entry.parts]
    import pyarrow as pa

    return pa.concat_tables(tables)


def slot_exists(dsn, slot) -> bool:
    return bool(sql(dsn.socket_dsn, "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)))


def make_source(dsn, rows=20000):
    sql(dsn, "CREATE TABLE big (id bigint PRIMARY KEY, a int, b text, n numeric(12,2), ts timestamptz, f bool)")
    sql(dsn, "INSERT INTO big SELECT g, g %% 97, md5(g::text), g / 7.0, '2024-01-01'::timestamptz + g * interval '1 second', g %% 2 = 0 FROM generate_series(1, %s) g", (rows,))
    sql(dsn, "CREATE TABLE nokey (x int, y text)")
    sql(dsn, "INSERT INTO nokey VALUES (1, 'a'), (2, NULL)")
    sql(dsn, "CREATE TABLE small (k text PRIMARY KEY, v jsonb)")
    sql(dsn, "INSERT INTO small VALUES ('x', '{\"a\": [1, 2]}'), ('y''q', NULL)")
    sql(dsn, "ANALYZE")
    sql(dsn, "CREATE PUBLICATION pub FOR TABLE big, nokey, small")


def test_snapshot_copies_every_table_consistently(fresh_db, slot_name, store, s3):
    client, url = store
    make_source(fresh_db)
    slot = slot_name()
    manifest = snapshot_to_s3(fresh_db, url, slot=slot, publications="pub", workers=2, rows_per_part=3000, s3=client)
    assert slot_exists(fresh_db, slot)
    assert manifest.consistent_point == str(LSN.parse(manifest.consistent_point))
    assert manifest.timeline == 1 and manifest.system_id
    big = manifest.table("public", "big")
    assert len(big.parts) > 3, "rows_per_part=3000 splits 20000 rows into CTID ranges"
    assert big.rows == 20000 == sum(p.rows for p in big.parts)
    assert big.key_columns == ("id",) and big.has_key
    assert [c.name for c in big.columns] == ["id", "a", "b", "n", "ts", "f"]
    assert [c.pg_type for c in big.columns][3] == "numeric(12,2)"
    assert manifest.table("public", "nokey").has_key is False
    # the data equals the source
    got = read_table(s3, url, manifest, "public", "big").sort_by("id")
    assert got.column("id").to_pylist() == list(range(1, 20001))
    expect = sql(fresh_db, "SELECT b, n::text, f FROM big WHERE id IN (1, 777, 20000) ORDER BY id")
    for idx, (b, n, f) in zip((0, 776, 19999), expect, strict=True):
        row = got.slice(idx, 1).to_pylist()[0]
        assert row["b"] == b and str(row["n"]) == n and row["f"] == f
    small = read_table(s3, url, manifest, "public", "small").to_pylist()
    assert {r["k"] for r in small} == {"x", "y'q"}
    # the manifest on S3 is the one returned, and it was written last
    layout = Layout.parse(url)
    stored = json.loads(s3store.get_bytes(client, layout.bucket, layout.snapshot_manifest(slot, manifest.snapshot_id)))
    assert stored["format"] == 1 and stored["consistent_point"] == manifest.consistent_point
    # a second snapshot on the same slot is refused
    with pytest.raises(SnapshotExists):
        snapshot_to_s3(fresh_db, url, slot=slot, publications="pub", s3=client)


def test_publication_column_list_and_row_filter(fresh_db, slot_name, store, s3):
    if fresh_db.server.version_num < 150000:
        pytest.skip("column lists and row filters need PostgreSQL 15+")
    client, url = store
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, secret text, region text)")
    sql(fresh_db, "INSERT INTO t SELECT g, 'pw' || g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END FROM generate_series(1, 100) g")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t (id, region) WHERE (region = 'eu')")
    manifest = snapshot_to_s3(fresh_db, url, slot=slot_name(), publications="pub", workers=1, s3=client)
    entry = manifest.table("public", "t")
    assert [c.name for c in entry.columns] == ["id", "region"]
    assert entry.row_filter and "eu" in entry.row_filter
    data = read_table(s3, url, manifest, "public", "t")
    assert data.num_rows == 50 and set(data.column("region").to_pylist()) == {"eu"}
    assert "secret" not in data.schema.names


def test_several_publications_copy_each_table_as_their_stream_carries_it(fresh_db, slot_name, store, s3):
    """A table in two publications gets the OR of their row filters (PostgreSQL's own
    initial sync and pgoutput combine them so); a table in one of them is copied too; two
    column lists for one table are refused, as the server refuses to stream it."""
    if fresh_db.server.version_num < 150000:
        pytest.skip("column lists and row filters need PostgreSQL 15+")
    from airflow_pgcdc.pg.tables import PublicationsDisagree

    client, url = store
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, secret text, region text)")
    sql(fresh_db, "INSERT INTO t SELECT g, 'pw' || g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END "
                  "FROM generate_series(1, 100) g")
    sql(fresh_db, "CREATE TABLE u (id int PRIMARY KEY)")
    sql(fresh_db, "INSERT INTO u SELECT generate_series(1, 7)")
    sql(fresh_db, "CREATE PUBLICATION pub_eu FOR TABLE t (id, region) WHERE (region = 'eu')")
    sql(fresh_db, "CREATE PUBLICATION pub_us FOR TABLE t (id, region) WHERE (region = 'us' AND id <= 21), TABLE u")
    manifest = snapshot_to_s3(fresh_db, url, slot=slot_name(), publications=["pub_eu", "pub_us"], workers=1, s3=client)
    assert sorted(f"{e.schema}.{e.table}" for e in manifest.tables) == ["public.t", "public.u"]
    data = read_table(s3, url, manifest, "public", "t")
    ids = sorted(data.column("id").to_pylist())
    assert ids == sorted(set(range(2, 101, 2)) | set(range(1, 22, 2)))  # 50 eu + 11 us
    assert "secret" not in data.schema.names
    assert read_table(s3, url, manifest, "public", "u").num_rows == 7
    sql(fresh_db, "CREATE PUBLICATION pub_secret FOR TABLE t (id, secret)")
    with pytest.raises(PublicationsDisagree, match=r"pub_eu, pub_secret publish \"public\".\"t\" with different columns"):
        snapshot_to_s3(fresh_db, url, slot=slot_name(), publications=["pub_eu", "pub_secret"], workers=1, s3=client)


def test_snapshot_and_stream_meet_exactly_at_consistent_point(fresh_db, slot_name, store, s3):
    """A writer commits numbered rows the whole time: every number is in the snapshot or
    in the stream from the slot, never both, never neither."""
    client, url = store
    sql(fresh_db, "CREATE TABLE seq (n bigint PRIMARY KEY, pad text)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE seq")
    stop = threading.Event()
    written = [0]

    def writer():
        with psycopg.connect(fresh_db, autocommit=True) as c:
            n = 0
            while not stop.is_set():
                n += 1
                c.execute("INSERT INTO seq VALUES (%s, repeat('x', 100))", (n,))
                written[0] = n

    th = threading.Thread(target=writer)
    th.start()
    try:
        while written[0] < 200:
            time.sleep(0.01)
        slot = slot_name()
        manifest = snapshot_to_s3(fresh_db, url, slot=slot, publications="pub", workers=2, s3=client)
        while written[0] < manifest.table("public", "seq").rows + 200:
            time.sleep(0.01)
    finally:
        stop.set()
        th.join()
    last = written[0]
    in_snapshot = sorted(read_table(s3, url, manifest, "public", "seq").column("n").to_pylist())
    k = len(in_snapshot)
    assert in_snapshot == list(range(1, k + 1)), "the snapshot holds a prefix of the commits"
    target = LSN.parse(sql(fresh_db, "SELECT pg_current_wal_insert_lsn()::text")[0][0])
    with ReplicationConnection.connect(fresh_db) as conn:
        stream = LogicalStream.pgoutput(conn, slot, PgoutputOptions(publications=("pub",)), manifest.consistent_point)
        msgs = stream.read_until(target, timeout=60)
        conn.stop()
    streamed = [int(m.new[0]) for m in msgs if m.type == "insert"]
    assert streamed == list(range(k + 1, last + 1)), "the stream starts right after the snapshot"


def kill_one_copy(dsn, killed: list) -> None:
    """In a thread: terminate the first snapshot COPY backend seen (its pid into ``killed``)."""
    def run():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not killed:
            rows = sql(dsn, "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgcdc-snapshot' AND query LIKE 'COPY%%' AND state = 'active'")
            if rows:
                sql(dsn, "SELECT pg_terminate_backend(%s)", (rows[0][0],))
                killed.append(rows[0][0])
            time.sleep(0.005)
    threading.Thread(target=run, daemon=True).start()


def test_killed_worker_part_is_retried(fresh_db, slot_name, store, s3):
    client, url = store
    make_source(fresh_db, rows=300000)  # enough COPY time for the killer to find one
    slot = slot_name()
    killed = []

    def killer(_cp, _name):
        kill_one_copy(fresh_db.socket_dsn, killed)

    manifest = snapshot_to_s3(fresh_db, url, slot=slot, publications="pub", workers=3, rows_per_part=10000, s3=client, on_slot_created=killer)
    assert killed, "a worker backend was terminated mid-copy"
    assert manifest.table("public", "big").rows == 300000
    ids = read_table(s3, url, manifest, "public", "big").column("id").to_pylist()
    assert sorted(ids) == list(range(1, 300001))


def test_only_worker_killed_reimports_the_snapshot(fresh_db, slot_name, store, s3):
    """With one worker, a killed session is replaced by a new one that imports the same
    snapshot (the slot connection keeps it alive until the copy ends)."""
    client, url = store
    make_source(fresh_db, rows=300000)
    slot = slot_name()
    killed = []

    # a row written after the slot was created must not appear: the new session sees the snapshot
    def both(cp, name):
        sql(fresh_db.socket_dsn, "INSERT INTO big (id) VALUES (-1)")
        kill_one_copy(fresh_db.socket_dsn, killed)

    manifest = snapshot_to_s3(fresh_db, url, slot=slot, publications="pub", workers=1, rows_per_part=10000, s3=client, on_slot_created=both)
    assert killed, "the worker backend was terminated mid-copy"
    ids = read_table(s3, url, manifest, "public", "big").column("id").to_pylist()
    assert sorted(ids) == list(range(1, 300001))


def test_failed_run_drops_its_slot_and_prefix(fresh_db, slot_name, store):
    client, url = store
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY)")
    sql(fresh_db, "INSERT INTO t SELECT generate_series(1, 1000)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    # every COPY session is terminated once the slot exists: no worker is left to retry

    def kill_workers(_cp, _name):
        sql(fresh_db.socket_dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgcdc-snapshot'")

    with pytest.raises(SnapshotError) as ei:
        snapshot_to_s3(fresh_db, url, slot=slot, publications="pub", workers=2, s3=client, on_slot_created=kill_workers)
    assert "failed" in str(ei.value)
    assert not slot_exists(fresh_db, slot), "no orphan slot keeps WAL"
    # a usage error before anything starts leaves nothing either
    with pytest.raises(SnapshotError):
        snapshot_to_s3(fresh_db, url, slot=slot, s3=client)  # neither publication nor tables
    assert not slot_exists(fresh_db, slot)
    layout = Layout.parse(url)
    assert list(s3store.list_keys(client, layout.bucket, layout.snapshots_prefix(slot))) == []


def test_killed_coordinator_rerun_starts_clean(fresh_db, slot_name, store, s3):
    client, url = store
    make_source(fresh_db, rows=200000)
    slot = slot_name()
    env = {**os.environ, **s3.aws_env()}
    cmd = [sys.executable, "-m", "airflow_pgcdc.cli", "snapshot", "--dsn", fresh_db, "--slot", slot,
           "--publication", "pub", "--to", url, "--workers", "2", "--rows-per-part", "5000"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    layout = Layout.parse(url)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(k.endswith(".parquet") for k in s3store.list_keys(client, layout.bucket, layout.snapshots_prefix(slot))):
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert slot_exists(fresh_db, slot), "a SIGKILLed coordinator leaves its slot behind"
    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    manifest = SnapshotManifest.from_json(rerun.stdout)
    assert manifest.table("public", "big").rows == 200000
    keys = list(s3store.list_keys(client, layout.bucket, layout.snapshots_prefix(slot)))
    assert all(k.startswith(layout.snapshot_prefix(slot, manifest.snapshot_id)) for k in keys), "the dead run's parts are gone"
    assert sql(fresh_db.socket_dsn, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,))[0][0] == 1


def test_second_run_on_a_live_slot_is_refused(fresh_db, slot_name, store):
    """A second run while the first one copies must not take the live slot for a dead
    run's leftover (it would drop it and delete the first run's parts)."""
    client, url = store
    make_source(fresh_db)
    slot = slot_name()
    second: list[BaseException] = []

    def start_second(_cp, _name):
        try:
            snapshot_to_s3(fresh_db, url, slot=slot, publications="pub", workers=1, s3=client)
        except BaseException as exc:
            second.append(exc)

    manifest = snapshot_to_s3(fresh_db, url, slot=slot, publications="pub", workers=1, s3=client, on_slot_created=start_second)
    assert len(second) == 1 and isinstance(second[0], SnapshotBusy), second
    assert slot in str(second[0])
    assert manifest.table("public", "big").rows == 20000
    assert slot_exists(fresh_db, slot), "the first run's slot survives the second run"
    layout = Layout.parse(url)
    assert s3store.exists(client, layout.bucket, layout.snapshot_manifest(slot, manifest.snapshot_id))


def test_dead_run_objects_landing_late_are_swept(fresh_db, slot_name, store):
    """A killed run's upload can complete on the storage after the rerun's first clean-up:
    the rerun sweeps again once its manifest is committed (objects and pending uploads)."""
    client, url = store
    make_source(fresh_db)
    slot = slot_name()
    layout = Layout.parse(url)
    dead = layout.snapshot_prefix(slot, "20000101T000000Z-deadbeef")

    def late_landing(_cp, _name):
        client.put_object(Bucket=layout.bucket, Key=dead + "public.big/part-00000.parquet", Body=b"x")
        client.create_multipart_upload(Bucket=layout.bucket, Key=dead + "public.big/part-00001.parquet")

    manifest = snapshot_to_s3(fresh_db, url, slot=slot, publications="pub", workers=1, s3=client, on_slot_created=late_landing)
    keys = list(s3store.list_keys(client, layout.bucket, layout.snapshots_prefix(slot)))
    assert keys and all(k.startswith(layout.snapshot_prefix(slot, manifest.snapshot_id)) for k in keys), keys
    assert s3store.pending_uploads(client, layout.bucket, dead) == []


def test_plan_parts_open_ended_ranges():
    from airflow_pgcdc.pg.tables import TableInfo

    t = TableInfo(oid=1, schema="s", name="t", relkind="r", replica_identity="d", columns=(), key_columns=("id",),
                  key_source="primary key", relpages=10_000, reltuples=1_000_000.0)
    parts = plan_parts(t, 250_000)
    assert len(parts) == 4
    assert parts[0].start_block is None and parts[-1].end_block is None
    assert [p.end_block for p in parts[:-1]] == [p.start_block for p in parts[1:]]
    assert "ctid >= '(2500,0)'::tid AND ctid < '(5000,0)'::tid" in parts[1].where()
    tiny = TableInfo(oid=1, schema="s", name="t", relkind="r", replica_identity="d", columns=(), key_columns=(),
                     key_source=None, relpages=3, reltuples=10.0)
    assert len(plan_parts(tiny, 1)) == 1 and plan_parts(tiny, 1)[0].where() == ""
    # several workers: a multiple of them, of equal size, covering every page once
    for workers, count in ((2, 4), (3, 6), (5, 5), (8, 8)):
        parts = plan_parts(t, 250_000, workers)
        assert len(parts) == count, (workers, [p.pages for p in parts])
        assert sum(p.pages for p in parts) == 10_000 and max(p.pages for p in parts) - min(p.pages for p in parts) <= 1
        assert [p.end_block for p in parts[:-1]] == [p.start_block for p in parts[1:]]
    assert len(plan_parts(t, 300_000, 2)) == 4  # 10,000 pages of 300k rows: 4 parts, not 3
    assert len(plan_parts(tiny, 1, 4)) == 1


def test_progress_counts_pages_of_running_parts():
    from airflow_pgcdc.pg.tables import TableInfo
    from airflow_pgcdc.snapshot.parts import Progress as _Progress

    t = TableInfo(oid=1, schema="s", name="t", relkind="r", replica_identity="d", columns=(), key_columns=("id",),
                  key_source="primary key", relpages=1000, reltuples=100_000.0)
    first, second = plan_parts(t, 50_000)
    p = _Progress(total_pages=1000)
    assert "0.0% of pages" in p.line(1, 2) and "ETA unknown" in p.line(1, 2)
    p.part_rows(first, 25_000)  # half of a 500-page part: a quarter of the table
    assert p.percent() == pytest.approx(25.0)
    p.part_rows(second, 100_000)  # more rows than the statistics said: capped at the part
    assert p.percent() == pytest.approx(75.0)
    p.part_done(first, 123)
    assert p.percent() == pytest.approx(100.0) and p.rows == 125_000 and p.bytes == 123
    line = p.line(1, 2)
    assert "1/2 parts" in line and "125,000 rows" in line and "100.0% of pages" in line and "ETA 0s" in line


def test_snapshot_logs_progress(fresh_db, slot_name, store, caplog):
    client, url = store
    make_source(fresh_db, rows=100000)
    slot = slot_name()
    with caplog.at_level("INFO", logger="airflow_pgcdc.snapshot.export"):
        snapshot_to_s3(fresh_db, url, slot=slot, publications="pub", workers=2, rows_per_part=20000,
                       s3=client, progress_interval=0.0)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("snapshot: ")]
    assert len(lines) >= 2, lines
    assert "100.0% of pages" in lines[-1] and "tables," in lines[-1] and "rows/s" in lines[-1]
    assert "100,004 rows" in lines[-1]  # big's 100000 + nokey's 2 + small's 2
    assert "3/3 tables" in lines[-1]


@pytest.fixture
def recorded_workers(monkeypatch):
    """Every worker process the snapshot starts, in order."""
    from airflow_pgcdc.snapshot import export, workers

    started: list[workers.ProcessWorker] = []

    class Recorded(workers.ProcessWorker):
        def __init__(self, **kw):
            super().__init__(**kw)
            started.append(self)

    monkeypatch.setattr(export, "ProcessWorker", Recorded)
    return started


@pytest.mark.parametrize("mode", ["fork", "spawn", "threads"])
def test_every_worker_mode_copies_the_same_rows(fresh_db, slot_name, store, s3, recorded_workers, monkeypatch, mode):
    """Worker processes forked from this one (as the CLI does), started as fresh
    interpreters (as an Airflow task does: other threads run there), and worker threads
    (a client of unknown settings) give the same snapshot."""
    from airflow_pgcdc.snapshot import workers

    client, url = store
    make_source(fresh_db)
    if mode != "threads":
        monkeypatch.setattr(workers.threading, "active_count", lambda: 1 if mode == "fork" else 2)
    manifest = snapshot_to_s3(fresh_db, url, slot=slot_name(), publications="pub", workers=2, rows_per_part=3000,
                              s3=client, worker_processes=mode != "threads")
    if mode == "threads":
        assert recorded_workers == []
    else:
        assert len(recorded_workers) == 2 and all(w.pid != os.getpid() for w in recorded_workers)
        forked = [isinstance(w.proc, workers._Forked) for w in recorded_workers]
        assert forked == [mode == "fork"] * 2
        assert all(w.proc.poll() is not None for w in recorded_workers), "workers exit with the run"
    big = read_table(s3, url, manifest, "public", "big").sort_by("id")
    assert big.column("id").to_pylist() == list(range(1, 20001))
    expect = sql(fresh_db, "SELECT id, b, n::text, ts FROM big ORDER BY id")
    got = [(r["id"], r["b"], str(r["n"]), r["ts"]) for r in big.to_pylist()]
    assert got == expect
    assert len(manifest.table("public", "big").parts) % 2 == 0, "a multiple of the worker count"


def test_killed_worker_process_part_is_retried_on_a_new_process(fresh_db, slot_name, store, s3, recorded_workers):
    """SIGKILL one worker process mid-copy: its part is copied again by a new worker
    process, nothing is lost or doubled, and its dead upload is aborted."""
    client, url = store
    make_source(fresh_db, rows=300000)
    slot = slot_name()
    killed = []

    def kill_a_worker(_cp, _name):
        def run():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not killed:
                busy = sql(fresh_db.socket_dsn, "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                           "'pgcdc-snapshot' AND query LIKE 'COPY%%' AND state = 'active'")[0][0]
                if busy:
                    victim = recorded_workers[0]
                    os.kill(victim.pid, signal.SIGKILL)
                    killed.append(victim.pid)
                time.sleep(0.005)
        threading.Thread(target=run, daemon=True).start()

    manifest = snapshot_to_s3(fresh_db, url, slot=slot, publications="pub", workers=2, rows_per_part=10000,
                              s3=client, on_slot_created=kill_a_worker)
    assert killed, "a worker process was killed mid-copy"
    assert len(recorded_workers) == 3, "a new worker process replaced the killed one"
    ids = read_table(s3, url, manifest, "public", "big").column("id").to_pylist()
    assert sorted(ids) == list(range(1, 300001))
    layout = Layout.parse(url)
    assert s3store.pending_uploads(client, layout.bucket, layout.snapshots_prefix(slot)) == []


def test_the_text_casts_catalog_query_runs_once_per_run(fresh_db, slot_name, store, monkeypatch):
    """The casts lookup is one query for the run, not one per table (1,000 tables were
    1,000 round trips before the copy could start)."""
    from airflow_pgcdc.snapshot import export

    client, url = store
    make_source(fresh_db)
    calls = []
    real = export.function_casts
    monkeypatch.setattr(export, "function_casts", lambda conn: calls.append(1) or real(conn))
    manifest = snapshot_to_s3(fresh_db, url, slot=slot_name(), publications="pub", workers=1, s3=client)
    assert len(manifest.tables) == 3 and calls == [1]


class _RetriedAfterUnseenSuccess:
    """An S3 client whose conditional put of a manifest behaves like botocore retrying a
    PutObject whose answer was lost: the first request lands, the retry gets 412."""

    def __init__(self, client):
        self._client, self.retried = client, []

    def __getattr__(self, name):
        return getattr(self._client, name)

    def put_object(self, **kw):
        if kw.get("IfNoneMatch") == "*" and kw["Key"].endswith("/_manifest.json") and not self.retried:
            self._client.put_object(**kw)  # the success the client never saw
            self.retried.append(kw["Key"])
        return self._client.put_object(**kw)


def test_manifest_put_retried_after_an_unseen_success_commits_the_snapshot(fresh_db, slot_name, store, s3):
    """The snapshot's manifest put is retried by the client after a success it did not see:
    the retry's If-None-Match fails on our own manifest. That is the commit: the slot and
    the snapshot stay (the old code took it for a lost race, dropped its slot and removed
    the committed manifest with its prefix)."""
    client, url = store
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(fresh_db, "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 500) g")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    flaky = _RetriedAfterUnseenSuccess(client)
    manifest = snapshot_to_s3(fresh_db, url, slot=slot, publications="pub", workers=1, s3=flaky)
    layout = Layout.parse(url)
    key = layout.snapshot_manifest(slot, manifest.snapshot_id)
    assert flaky.retried == [key], "the manifest's put was the retried one"
    assert slot_exists(fresh_db, slot)
    stored = SnapshotManifest.from_json(s3store.get_bytes(client, layout.bucket, key))
    assert stored.snapshot_id == manifest.snapshot_id and stored.rows == 500
    assert read_table(s3, url, stored, "public", "t").num_rows == 500
