"""Operator mistakes and hostile timing that must never lose an acknowledged change,
against real PostgreSQL 15/18 and the S3 server:

- two drains on one slot (an overlapping DAG run, a manual drain, a retry): the slot lock,
  the re-check once the slot is owned, windows that are never deleted or replaced;
- a missing or misspelt publication, and a pipeline table that left the publication;
- ``pgcdc snapshot`` on a slot name that a live or another pipeline uses;
- a different server behind the same DSN;
- a manifest put that the client retried after a success it did not see.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time

import psycopg
import pytest
from matrix import on_pg18
from test_drain import all_rows, assert_tiled, confirmed, create_slot, sql, windows
from test_drain_crash import Writer

import airflow_pgcdc.drain.plan as plan_mod
import airflow_pgcdc.drain.run as run_mod
import airflow_pgcdc.drain.window as window_mod
from airflow_pgcdc.drain.drain import (
    DrainBusy,
    PipelineTablesUnpublished,
    PublicationNotFound,
    ServerMismatch,
    drain_window,
)
from airflow_pgcdc.faults import FaultPoint
from airflow_pgcdc.pg.replication import ReplicationConnection
from airflow_pgcdc.pg.slotlock import wait_lock_slot
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.snapshot.export import SlotTaken, snapshot_to_s3
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout
from airflow_pgcdc.store.window import WindowWriter, read_window


@pytest.fixture
def store(s3, s3_bucket, monkeypatch):
    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    return s3.client(), f"s3://{s3_bucket}/lake"


def drain(dsn, url, slot, client, **kw):
    kw.setdefault("publications", "pub")
    return drain_window(dsn, url, slot=slot, s3=client, **{"start_without_snapshot": True, **kw})


def manifests(client, url, slot) -> dict[int, bytes]:
    """Every committed manifest's bytes, by window."""
    layout = Layout.parse(url)
    out = {}
    for key in s3store.list_keys(client, layout.bucket, layout.changes_prefix(slot)):
        if key.endswith("/_manifest.json"):
            out[layout.parse_window_key(slot, key)] = s3store.get_bytes(client, layout.bucket, key)
    return out


def assert_never_replaced(seen: dict[int, bytes], now: dict[int, bytes]) -> None:
    for seq, body in seen.items():
        assert seq in now, f"committed window {seq} was removed"
        assert now[seq] == body, f"committed window {seq} was replaced"


def seq_table(dsn) -> None:
    sql(dsn, "CREATE TABLE seq (n int PRIMARY KEY, pad text)")
    sql(dsn, "CREATE PUBLICATION pub FOR TABLE seq")


def inserted(client, url, slot) -> list[int]:
    return [r["n"] for r in all_rows(client, url, slot, "public.seq") if r["_pgcdc_op"] == "I"]


def catch_up(dsn, url, slot, client) -> None:
    for _ in range(20):
        r = drain(dsn, url, slot, client)
        if r.window_seq is None or r.transactions == 0:
            return


# --------------------------------------------------------------------------- two drains


class PausedPlan:
    """Stops the drain running in the thread named ``paused`` after it read the store and
    the slot, just before it connects to stream (``ReplicationConnection.connect``), until
    ``go`` is set: the widest gap between a drain's plan and its owning the slot."""

    def __init__(self, monkeypatch):
        self.planned, self.go = threading.Event(), threading.Event()
        planned, go = self.planned, self.go
        real = plan_mod.ReplicationConnection

        class Paused(real):
            @classmethod
            def connect(cls, *a, **kw):
                if threading.current_thread().name == "paused" and not planned.is_set():
                    planned.set()
                    assert go.wait(60), "the test never let the paused drain go on"
                return real.connect(*a, **kw)

        monkeypatch.setattr(plan_mod, "ReplicationConnection", Paused)


def _overlap(dsn, url, slot, client, monkeypatch, *, honour_lock: bool):
    seq_table(dsn)
    create_slot(dsn, slot)
    sql(dsn, "INSERT INTO seq SELECT g, 'a' FROM generate_series(1, 10) g")
    drain(dsn, url, slot, client)
    sql(dsn, "INSERT INTO seq SELECT g, 'b' FROM generate_series(11, 30) g")
    paused = PausedPlan(monkeypatch)
    outcome: dict = {}

    def run_b():
        try:
            outcome["b"] = drain(dsn, url, slot, client, busy_wait=1)
        except Exception as e:  # noqa: BLE001 - asserted below
            outcome["b"] = e

    b = threading.Thread(target=run_b, name="paused")
    b.start()
    assert paused.planned.wait(60), "drain B read the store"
    if not honour_lock:  # drain A does not respect the lock (another version, another tool)
        monkeypatch.setattr(plan_mod, "wait_lock_slot", lambda *a, **kw: True, raising=False)
    try:
        outcome["a"] = drain(dsn, url, slot, client, busy_wait=1)
    except Exception as e:  # noqa: BLE001
        outcome["a"] = e
    seen = manifests(client, url, slot)
    paused.go.set()
    b.join(120)
    assert not b.is_alive()
    monkeypatch.setattr(plan_mod, "wait_lock_slot", wait_lock_slot)
    sql(dsn, "INSERT INTO seq SELECT g, 'c' FROM generate_series(31, 40) g")
    catch_up(dsn, url, slot, client)
    assert_never_replaced(seen, manifests(client, url, slot))
    assert sorted(inserted(client, url, slot)) == list(range(1, 41)), "every change exactly once"
    assert len(inserted(client, url, slot)) == 40
    ms = windows(client, url, slot)
    assert_tiled(ms, ms[0].start)
    assert confirmed(dsn, slot) == ms[-1].end
    return outcome


def test_drain_that_planned_before_another_committed_never_replaces_its_window(fresh_db, slot_name, store, monkeypatch):
    """B reads the store and the slot, then A runs: A must wait for B's lock and give up
    (before the fix, A committed window 1, and B then deleted it, manifest included, and
    wrote an empty window 1: 20 rows lost)."""
    client, url = store
    out = _overlap(fresh_db, url, slot_name(), client, monkeypatch, honour_lock=True)
    assert isinstance(out["a"], DrainBusy), out
    assert "another drain or snapshot" in str(out["a"]) and "pgcdc-drain-catalog" in str(out["a"])
    assert out["b"].window_seq == 1 and out["b"].rows == 20, out


def test_drain_that_lost_the_race_to_a_lockless_drain_writes_nothing(fresh_db, slot_name, store, monkeypatch):
    """Without the lock (a drain of another version), A commits window 1 while B is between
    reading the store and owning the slot: B's re-check, once the slot is its own, finds
    window 1 and stops without writing or acknowledging anything."""
    client, url = store
    out = _overlap(fresh_db, url, slot_name(), client, monkeypatch, honour_lock=False)
    assert out["a"].window_seq == 1 and out["a"].rows == 20, out
    assert isinstance(out["b"], DrainBusy) and "committed window 1" in str(out["b"]), out


def test_overlapping_cli_drains_at_random_offsets(fresh_db, slot_name, store, s3):
    """Two `pgcdc drain` processes started again and again at close, random offsets while a
    numbered writer runs: every transaction exactly once, windows tile, no committed
    manifest replaced or removed; the loser exits 75 with a clear message."""
    client, url = store
    slot = slot_name()
    sql(fresh_db, "CREATE TABLE seq (n int PRIMARY KEY, pad text)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE seq")
    start = create_slot(fresh_db, slot)
    env = {**os.environ, **s3.aws_env()}
    cmd = [sys.executable, "-m", "airflow_pgcdc.cli", "drain", "--dsn", fresh_db, "--slot", slot,
           "--publication", "pub", "--to", url, "--start-without-snapshot", "--busy-wait", "0.5"]
    rng = random.Random(1234)
    seen: dict[int, bytes] = {}
    codes = []
    with Writer(fresh_db) as w:
        for _ in range(5):
            procs = []
            for _ in range(2):
                time.sleep(rng.uniform(0, 0.4))
                procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            for p in procs:
                _out, err = p.communicate(timeout=180)
                codes.append(p.returncode)
                assert p.returncode in (0, 75), err
                if p.returncode == 75:
                    assert "pgcdc: error: " in err and "wrote and acknowledged nothing" in err, err
            now = manifests(client, url, slot)
            assert_never_replaced(seen, now)
            seen = now
    catch_up(fresh_db, url, slot, client)
    assert_never_replaced(seen, manifests(client, url, slot))
    got = inserted(client, url, slot)
    assert got == list(range(1, w.n + 1)), "each numbered transaction exactly once, in order"
    ms = windows(client, url, slot)
    assert_tiled(ms, start)
    assert confirmed(fresh_db, slot) == ms[-1].end
    assert 0 in codes


# --------------------------------------------------------------------------- publications


def test_missing_publication_acknowledges_nothing(fresh_db, slot_name, store, s3):
    """PostgreSQL 18 streams nothing for a publication that does not exist (15 fails late):
    a misspelt name used to commit an empty window and move the slot past every change."""
    client, url = store
    slot = slot_name()
    seq_table(fresh_db)
    create_slot(fresh_db, slot)
    sql(fresh_db, "INSERT INTO seq SELECT g, 'x' FROM generate_series(1, 500) g")
    before = confirmed(fresh_db, slot)
    with pytest.raises(PublicationNotFound, match="'pbu' do not exist") as ei:
        drain(fresh_db, url, slot, client, publications="pbu")
    assert "CREATE PUBLICATION" in ei.value.hint
    assert confirmed(fresh_db, slot) == before, "nothing acknowledged"
    assert manifests(client, url, slot) == {}, "nothing written"
    env = {**os.environ, **s3.aws_env()}
    cli = subprocess.run(
        [sys.executable, "-m", "airflow_pgcdc.cli", "drain", "--dsn", fresh_db, "--slot", slot,
         "--publication", "pbu", "--to", url, "--start-without-snapshot"], env=env, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 1 and "do not exist" in cli.stderr and "hint:" in cli.stderr, cli.stderr
    assert confirmed(fresh_db, slot) == before
    r = drain(fresh_db, url, slot, client)
    assert r.rows == 500 and inserted(client, url, slot) == list(range(1, 501))
    m = read_window(client, Layout.parse(url), slot, r.window_seq)
    assert m.publications == ("pub",) and m.pipeline_tables == (("public", "seq"),)


def test_table_removed_from_the_publication_is_refused_until_forgotten(fresh_db, slot_name, store):
    client, url = store
    slot = slot_name()
    for t in ("t1", "t2", "t3"):
        sql(fresh_db, f"CREATE TABLE {t} (id int PRIMARY KEY)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t1, t2, t3")
    create_slot(fresh_db, slot)
    sql(fresh_db, "INSERT INTO t1 VALUES (1); INSERT INTO t2 VALUES (1)")
    drain(fresh_db, url, slot, client)
    # a dropped table leaves the pipeline by itself; a table still there but unpublished does not
    sql(fresh_db, "DROP TABLE t3")
    sql(fresh_db, "ALTER PUBLICATION pub DROP TABLE t2")
    sql(fresh_db, "INSERT INTO t1 VALUES (2); INSERT INTO t2 VALUES (2)")
    before = confirmed(fresh_db, slot)
    with pytest.raises(PipelineTablesUnpublished, match="public.t2") as ei:
        drain(fresh_db, url, slot, client)
    assert ei.value.tables == (("public", "t2"),)
    assert "ALTER PUBLICATION" in ei.value.hint and "--forget-table" in ei.value.hint
    assert "t3" not in str(ei.value)
    assert confirmed(fresh_db, slot) == before and len(manifests(client, url, slot)) == 1
    r = drain(fresh_db, url, slot, client, forget_tables=["public.t2"])
    assert r.tables == {"public.t1": 1}
    m = read_window(client, Layout.parse(url), slot, r.window_seq)
    assert m.pipeline_tables == (("public", "t1"),)
    sql(fresh_db, "INSERT INTO t1 VALUES (3)")
    assert drain(fresh_db, url, slot, client).tables == {"public.t1": 1}, "t2 is no longer followed"


def test_publication_altered_during_the_window_commits_nothing(fresh_db, slot_name, store, monkeypatch):
    """The check runs again right before the manifest: a table removed while the window was
    being read makes the drain stop with nothing committed or acknowledged."""
    client, url = store
    slot = slot_name()
    for t in ("t1", "t2"):
        sql(fresh_db, f"CREATE TABLE {t} (id int PRIMARY KEY)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t1, t2")
    create_slot(fresh_db, slot)
    sql(fresh_db, "INSERT INTO t1 VALUES (1); INSERT INTO t2 VALUES (1)")
    drain(fresh_db, url, slot, client)
    sql(fresh_db, "INSERT INTO t1 VALUES (2); INSERT INTO t2 VALUES (2)")
    real = run_mod.fault_point

    def fault(point, log=None):
        if point == FaultPoint.DRAIN_AFTER_PARTS:
            sql(fresh_db, "ALTER PUBLICATION pub DROP TABLE t2")
        real(point, log)

    monkeypatch.setattr(run_mod, "fault_point", fault)
    before = confirmed(fresh_db, slot)
    with pytest.raises(PipelineTablesUnpublished):
        drain(fresh_db, url, slot, client)
    assert confirmed(fresh_db, slot) == before and len(manifests(client, url, slot)) == 1


def test_first_window_checks_the_snapshot_tables(fresh_db, slot_name, store, s3):
    client, url = store
    slot = slot_name()
    for t in ("t1", "t2"):
        sql(fresh_db, f"CREATE TABLE {t} (id int PRIMARY KEY)")
        sql(fresh_db, f"INSERT INTO {t} VALUES (1)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t1, t2")
    snapshot_to_s3(fresh_db, url, slot=slot, publications="pub", workers=1, s3=client,
                   worker_processes=False)
    sql(fresh_db, "ALTER PUBLICATION pub DROP TABLE t2")
    sql(fresh_db, "INSERT INTO t2 VALUES (2)")
    with pytest.raises(PipelineTablesUnpublished, match="public.t2"):
        drain(fresh_db, url, slot, client)
    assert manifests(client, url, slot) == {}


# --------------------------------------------------------------------------- snapshot and slots


def _slot_row(dsn, slot):
    rows = sql(dsn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,))
    return rows[0][0] if rows else None


def test_snapshot_never_drops_another_pipelines_slot(fresh_db, slot_name, store, s3_bucket, s3):
    """A snapshot into an empty store with the slot name of a pipeline that streams into
    another store used to drop that slot (and every change it held)."""
    client, url = store
    slot = slot_name()
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY)")
    sql(fresh_db, "INSERT INTO t VALUES (1)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    snapshot_to_s3(fresh_db, url, slot=slot, publications="pub", workers=1, s3=client, worker_processes=False)
    sql(fresh_db, "INSERT INTO t VALUES (2)")
    drain(fresh_db, url, slot, client)
    sql(fresh_db, "INSERT INTO t VALUES (3)")  # pending in the slot
    pos = _slot_row(fresh_db, slot)
    other = f"s3://{s3_bucket}/elsewhere"
    with pytest.raises(SlotTaken, match="not a leftover") as ei:
        snapshot_to_s3(fresh_db, other, slot=slot, publications="pub", workers=1, s3=client,
                       worker_processes=False)
    assert "pg_drop_replication_slot" in ei.value.hint
    assert _slot_row(fresh_db, slot) == pos, "the slot is still there, where it was"
    # a slot created by hand (no record of ours): refused too
    hand = slot_name()
    create_slot(fresh_db, hand)
    with pytest.raises(SlotTaken):
        snapshot_to_s3(fresh_db, other, slot=hand, publications="pub", workers=1, s3=client,
                       worker_processes=False)
    assert _slot_row(fresh_db, hand) is not None
    assert drain(fresh_db, url, slot, client).tables == {"public.t": 1}, "the pipeline goes on"


def test_snapshot_refuses_a_slot_someone_streams_at_once(fresh_db, slot_name, store, s3_bucket):
    """A slot held by a live stream: the snapshot used to wait for its release, then drop it."""
    client, url = store
    slot = slot_name()
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    create_slot(fresh_db, slot)
    holder = ReplicationConnection.connect(fresh_db)
    holder.start_replication(slot, 0, options=[("proto_version", "1"), ("publication_names", '"pub"')])
    box: dict = {}

    def run():
        try:
            snapshot_to_s3(fresh_db, url, slot=slot, publications="pub", workers=1, s3=client,
                           worker_processes=False)
        except Exception as e:  # noqa: BLE001
            box["error"] = e

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(60)
    try:
        assert not th.is_alive(), "the snapshot waited for the live stream"
        assert isinstance(box.get("error"), SlotTaken) and "in use by pid" in str(box["error"]), box
        assert _slot_row(fresh_db, slot) is not None
    finally:
        holder.close()


# --------------------------------------------------------------------------- another server


def test_another_server_behind_the_same_dsn_is_refused(pg15, pg18, slot_name, store, request):
    """The store followed one cluster; the DSN now reaches another one (a restore, a wrong
    host) that has a slot of the same name: before any confirmation, ServerMismatch."""
    client, url = store
    slot = slot_name()
    dbs = []
    for server in (pg18, pg15):
        name = f"t_srv_{os.getpid()}_{len(dbs)}_{random.randrange(1 << 30)}"
        dbs.append((server, name, server.create_database(name)))
    request.addfinalizer(lambda: [srv.drop_database(n) for srv, n, _ in dbs])
    first, second = dbs[0][2], dbs[1][2]
    for dsn in (first, second):
        seq_table(dsn)
        create_slot(dsn, slot)
    sql(first, "INSERT INTO seq VALUES (1, 'x')")
    drain(first, url, slot, client)
    sql(second, "INSERT INTO seq VALUES (2, 'y')")
    before = confirmed(second, slot)
    with pytest.raises(ServerMismatch, match="system identifier"):
        drain(second, url, slot, client)
    assert confirmed(second, slot) == before, "nothing acknowledged on the other server"
    assert len(manifests(client, url, slot)) == 1


# --------------------------------------------------------------------------- commits and debris


def test_manifest_put_retried_after_an_unseen_success_counts_as_committed(store):
    """The S3 client retries a PutObject whose answer it lost; the retry's If-None-Match
    then fails on our own manifest: that is a commit, not a lost race."""
    from airflow_pgcdc.store.window import WindowManifest

    client, url = store
    layout = Layout.parse(url)
    m = WindowManifest(slot="s1", window_seq=0, start_lsn="0/10", end_lsn="0/20", end_reason="until_lsn",
                       attempt="0123abcd")
    key = layout.window_manifest("s1", 0)
    assert s3store.put_if_absent(client, layout.bucket, key, m.to_json().encode())  # the unseen success
    w = WindowWriter(client, layout, "s1", 0, attempt="0123abcd")
    try:
        assert w.commit(m), "our own manifest: committed"
        other = WindowManifest(slot="s1", window_seq=0, start_lsn="0/10", end_lsn="0/20", end_reason="until_lsn",
                               attempt="ffff0000")
        assert not w.commit(other), "another attempt's manifest: lost"
    finally:
        w.abort()


def test_killed_attempts_debris_is_swept_by_the_commit_and_never_before(fresh_db, slot_name, store, s3):
    """A drain killed after uploading its parts leaves them; the rerun names its own parts
    differently, commits, then removes the dead attempt's objects: the folder holds exactly
    what the manifest lists."""
    client, url = store
    slot = slot_name()
    seq_table(fresh_db)
    create_slot(fresh_db, slot)
    sql(fresh_db, "INSERT INTO seq SELECT g, 'x' FROM generate_series(1, 50) g")
    env = {**os.environ, **s3.aws_env(), "PGCDC_FAULT": "after-parts"}
    cmd = [sys.executable, "-m", "airflow_pgcdc.cli", "drain", "--dsn", fresh_db, "--slot", slot,
           "--publication", "pub", "--to", url, "--start-without-snapshot"]
    dead = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert dead.returncode != 0
    layout = Layout.parse(url)
    debris = set(s3store.list_keys(client, layout.bucket, layout.window_prefix(slot, 0)))
    assert debris and not any(k.endswith("_manifest.json") for k in debris)
    deadline = time.monotonic() + 30
    while True:
        try:
            r = drain(fresh_db, url, slot, client)
            break
        except (DrainBusy, psycopg.OperationalError):
            assert time.monotonic() < deadline
            time.sleep(0.3)
    assert r.window_seq == 0 and r.rows == 50
    m = read_window(client, layout, slot, 0)
    base = layout.window_prefix(slot, 0)
    listed = {base + p["path"] for t in m.tables for v in t["relation_versions"] for p in v["parts"]}
    assert all(m.attempt in k for k in listed)
    assert set(s3store.list_keys(client, layout.bucket, base)) == listed | {base + "_manifest.json"}
    assert not (debris & listed), "the rerun never wrote over the dead attempt's keys"
    assert inserted(client, url, slot) == list(range(1, 51))


def test_timeline_check_unit():
    """The timeline rule, on history files as TIMELINE_HISTORY returns them (pure)."""
    from airflow_pgcdc.drain.guards import check_server

    hist = {3: [(1, LSN.parse("0/5000000")), (2, LSN.parse("0/9000000"))]}

    def check(**kw):
        args = dict(slot="s", system_id="42", timeline=3, recorded_system_id="42", recorded_timeline=2,
                    store_end=LSN.parse("0/8000000"), where="window 7", history=hist.__getitem__)
        return check_server(**(args | kw))

    assert check(timeline=2) is None
    assert "before the switch" in check()
    with pytest.raises(ServerMismatch, match="past that point"):
        check(store_end=LSN.parse("0/9000001"))
    with pytest.raises(ServerMismatch, match="system identifier"):
        check(recorded_system_id="7")
    with pytest.raises(ServerMismatch, match="older copy"):
        check(timeline=1)
    with pytest.raises(ServerMismatch, match="does not contain"):
        check(recorded_timeline=5, timeline=6, history=lambda t: [(1, LSN.parse("0/1"))])
    assert check(recorded_system_id=None, recorded_timeline=None) is None
    assert "before the switch" in check(recorded_timeline=1, store_end=LSN.parse("0/5000000"))


# --------------------------------------------------------------------------- silent catch-up


def test_silent_catch_up_counts_the_servers_progress(fresh_db, slot_name, store):
    """Thousands of transactions on an unpublished table: the walsender reads them and sends
    nothing for seconds (empty transactions are skipped). Keepalives the drain asks for
    show its position moving: that is progress, so a ``max_wait`` shorter than the silence
    does not end the drain in ``DrainTimeout`` (before, it did, again and again), and a
    window over noise only still ends past it, so the slot advances."""
    client, url = store
    slot = slot_name()
    seq_table(fresh_db)
    sql(fresh_db, "CREATE TABLE noise (id bigserial PRIMARY KEY, pad text)")
    create_slot(fresh_db, slot)
    sql(fresh_db, "INSERT INTO seq VALUES (1, 'x')")
    sql(fresh_db, "DO $$ BEGIN FOR i IN 1..120000 LOOP INSERT INTO noise (pad) SELECT repeat('n', 200) "
                  "FROM generate_series(1, 5); COMMIT; END LOOP; END $$")
    sql(fresh_db, "INSERT INTO seq VALUES (2, 'y')")
    r = drain(fresh_db, url, slot, client, max_wait=1.0, heartbeat=False)
    assert r.rows == 2 and inserted(client, url, slot) == [1, 2]
    assert confirmed(fresh_db, slot) == LSN.parse(r.end_lsn)
    # noise only, and a window cut by time: it ends where the server's decoding got, not at its start
    sql(fresh_db, "DO $$ BEGIN FOR i IN 1..120000 LOOP INSERT INTO noise (pad) SELECT repeat('n', 200) "
                  "FROM generate_series(1, 5); COMMIT; END LOOP; END $$")
    end = LSN.parse(sql(fresh_db, "SELECT pg_current_wal_insert_lsn()::text")[0][0])
    before = confirmed(fresh_db, slot)
    r2 = drain(fresh_db, url, slot, client, max_wait=5, max_seconds=8, heartbeat=False, until_lsn=end)
    assert r2.rows == 0 and LSN.parse(r2.end_lsn) > before, (r2.end_reason, r2.start_lsn, r2.end_lsn)
    assert confirmed(fresh_db, slot) == LSN.parse(r2.end_lsn), "the slot advances through the noise"


# --------------------------------------------------------------------------- correctness edges


def test_origin_filtered_prepared_transaction_across_two_windows(fresh_db, slot_name, store):
    """A prepared transaction from a skipped origin, held in window 0 and committed in window
    1: window 1 skips it (before, the stored entry's 'skipped' flag was not read back and the
    drain died with a TypeError, in every later run)."""
    if fresh_db.server.version_num < 150000:
        pytest.skip("two-phase decoding needs PostgreSQL 15+")
    client, url = store
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    create_slot(fresh_db, slot, two_phase=True)
    origin = slot + "_o"  # origins are per cluster
    with psycopg.connect(fresh_db, autocommit=True) as c:
        c.execute("SELECT pg_replication_origin_create(%s)", (origin,))
        c.execute("SELECT pg_replication_origin_session_setup(%s)", (origin,))
        c.execute("BEGIN")
        c.execute("SELECT pg_replication_origin_xact_setup('0/AB', now())")
        c.execute("INSERT INTO t VALUES (1)")
        c.execute("PREPARE TRANSACTION 'from_loop'")
        c.execute("SELECT pg_replication_origin_session_reset()")
        c.execute("INSERT INTO t VALUES (2)")
    w0 = drain(fresh_db, url, slot, client, skip_origins=[origin])
    assert w0.tables == {"public.t": 1}
    sql(fresh_db, "COMMIT PREPARED 'from_loop'")
    sql(fresh_db, "INSERT INTO t VALUES (3)")
    w1 = drain(fresh_db, url, slot, client, skip_origins=[origin])
    m1 = read_window(client, Layout.parse(url), slot, w1.window_seq)
    assert m1.pending_prepared == [] and [p["gid"] for p in m1.prepared["committed"]] == ["from_loop"]
    assert m1.skipped_transactions == 1
    assert [x["id"] for x in all_rows(client, url, slot, "public.t")] == [2, 3]


def test_spool_of_a_killed_drain_is_removed_by_the_next(fresh_db, slot_name, store, s3, tmp_path):
    """A drain killed while it spools a streamed transaction leaves its spool files; the next
    drain of the slot removes them (the folder of a process that is gone), keeps a live
    process's folder, and removes its own when it ends."""
    client, url = store
    slot = slot_name()
    sql(fresh_db, "CREATE TABLE seq (n bigint PRIMARY KEY, pad text)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE seq")
    create_slot(fresh_db, slot)
    spool = tmp_path / "spool"
    env = {**os.environ, **s3.aws_env()}
    with psycopg.connect(fresh_db) as open_txn:  # a big transaction still open: streamed, spooled
        open_txn.execute("INSERT INTO seq SELECT g, repeat('s', 200) FROM generate_series(1, 5000) g")
        proc = subprocess.Popen(
            [sys.executable, "-m", "airflow_pgcdc.cli", "drain", "--dsn", fresh_db, "--slot", slot,
             "--publication", "pub", "--to", url, "--start-without-snapshot", "--spool-dir", str(spool), "--connect-options",
             "-c logical_decoding_work_mem=64kB"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while not any(p.is_file() and p.stat().st_size for p in spool.rglob("*")):
            assert time.monotonic() < deadline and proc.poll() is None, "the drain spools the open transaction"
            time.sleep(0.05)
        proc.kill()
        proc.communicate(timeout=30)
        open_txn.commit()
    sql(fresh_db, "INSERT INTO seq VALUES (0, 'after')")
    assert [p for p in spool.rglob("*") if p.is_file()], "the killed drain left spool files"
    live = spool / f"pgcdc-spool-{slot}-{os.getpid()}-keep"
    live.mkdir()
    deadline = time.monotonic() + 30
    while True:
        try:
            r = drain(fresh_db, url, slot, client, spool_dir=str(spool),
                      connect_options="-c logical_decoding_work_mem=64kB")
            break
        except (DrainBusy, psycopg.OperationalError):
            assert time.monotonic() < deadline
            time.sleep(0.3)
    assert r.rows == 5001
    assert sorted(p.name for p in spool.iterdir()) == [live.name], "dead spool removed, live kept, own removed"


def test_long_replay_of_a_streamed_transaction_keeps_the_connection(fresh_db, slot_name, store, monkeypatch):
    """Replaying a big streamed transaction at its Stream Commit feeds no frames: status
    updates must still go out, or a replay longer than wal_sender_timeout gets the
    connection killed, and every retry replays it again. Here the replay is slowed to about
    4 s against a 2 s wal_sender_timeout."""
    client, url = store
    slot = slot_name()
    sql(fresh_db, "CREATE TABLE seq (n bigint PRIMARY KEY, pad text)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE seq")
    create_slot(fresh_db, slot)
    sql(fresh_db, "INSERT INTO seq SELECT g, repeat('s', 100) FROM generate_series(1, 20000) g")
    real = window_mod.WindowSink.change

    def slow(self, rel, msg, nbytes):
        if self.rows % 100 == 0:
            time.sleep(0.02)
        return real(self, rel, msg, nbytes)

    monkeypatch.setattr(window_mod.WindowSink, "change", slow)
    r = drain(fresh_db, url, slot, client, connect_options="-c wal_sender_timeout=2s -c logical_decoding_work_mem=64kB")
    assert r.rows == 20000 and r.transactions == 1
    m = read_window(client, Layout.parse(url), slot, r.window_seq)
    assert m.streamed["committed"] == 1, "the transaction was streamed and replayed at its commit"
    assert confirmed(fresh_db, slot) == LSN.parse(r.end_lsn)


def test_long_replay_of_a_held_prepared_transaction_keeps_the_connection(fresh_db, slot_name, store, monkeypatch):
    """A two-phase transaction prepared in window 0 is held in the store; its COMMIT PREPARED
    in window 1 replays it from S3 (through a spool file). Slowed to about 4 s against a 2 s
    wal_sender_timeout, status updates keep the connection alive and window 1 commits."""
    if fresh_db.server.version_num < 150000:
        pytest.skip("two-phase decoding needs PostgreSQL 15+")
    client, url = store
    slot = slot_name()
    sql(fresh_db, "CREATE TABLE seq (n bigint PRIMARY KEY, pad text)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE seq")
    create_slot(fresh_db, slot, two_phase=True)
    with psycopg.connect(fresh_db, autocommit=True) as c:
        c.execute("BEGIN")
        c.execute("INSERT INTO seq SELECT g, repeat('p', 100) FROM generate_series(1, 20000) g")
        c.execute("PREPARE TRANSACTION 'held'")
    w0 = drain(fresh_db, url, slot, client)
    assert w0.rows == 0 and read_window(client, Layout.parse(url), slot, w0.window_seq).pending_prepared
    sql(fresh_db, "COMMIT PREPARED 'held'")
    real = window_mod.WindowSink.change

    def slow(self, rel, msg, nbytes):
        if self.rows % 100 == 0:
            time.sleep(0.02)
        return real(self, rel, msg, nbytes)

    monkeypatch.setattr(window_mod.WindowSink, "change", slow)
    r = drain(fresh_db, url, slot, client, connect_options="-c wal_sender_timeout=2s")
    assert r.window_seq == w0.window_seq + 1 and r.rows == 20000 and r.transactions == 1
    m = read_window(client, Layout.parse(url), slot, r.window_seq)
    assert m.pending_prepared == [] and [p["gid"] for p in m.prepared["committed"]] == ["held"]
    assert confirmed(fresh_db, slot) == LSN.parse(r.end_lsn)


def test_drain_right_after_a_killed_one_waits_for_the_slot(fresh_db, slot_name, store, s3):
    """Right after a drain is SIGKILLed, its walsender may hold the slot (and its session the
    slot lock) for a moment: the next drain waits for them (bounded) instead of failing
    with 'slot is active'."""
    client, url = store
    slot = slot_name()
    seq_table(fresh_db)
    create_slot(fresh_db, slot)
    env = {**os.environ, **s3.aws_env(), "PGCDC_FAULT": "after-receive"}
    for i in range(1, 4):
        sql(fresh_db, "INSERT INTO seq VALUES (%s, 'x')", (i,))
        dead = subprocess.run(
            [sys.executable, "-m", "airflow_pgcdc.cli", "drain", "--dsn", fresh_db, "--slot", slot,
             "--publication", "pub", "--to", url, "--start-without-snapshot"], env=env, capture_output=True, text=True, timeout=120)
        assert dead.returncode == -9, dead.stderr[-2000:]
        r = drain(fresh_db, url, slot, client)  # no retry loop here: the drain waits by itself
        assert r.window_seq is not None
    assert inserted(client, url, slot) == [1, 2, 3]


# --------------------------------------------------------------------------- memory


# the drain's own peak (VmHWM): getrusage's ru_maxrss would report this pytest process' size
# (Linux carries the replaced image's peak over exec; see airflow_pgcdc.testing.memory)
_PEAK_RSS = """
import sys
from airflow_pgcdc.cli import main
from airflow_pgcdc.testing.memory import vm_hwm
code = main(sys.argv[1:])
print("PEAK_RSS_KB", vm_hwm() // 1024, file=sys.stderr)
sys.exit(code)
"""


@pytest.mark.slow
@on_pg18("the drain's buffers per table: no server difference")
def test_memory_of_a_window_touching_many_tables_is_bounded(fresh_db, slot_name, store, s3):
    """2,000 tables, about 100 kB of changes each, in one window, drained twice from two
    slots: with a 32 MB budget (the open parts of all tables together stay under it: the
    largest are finished early) and with a budget larger than the window (what the drain did
    before: each table kept its own buffers until the window ended). Measured: 206 MB
    against 611 MB peak RSS (about 150 MB of either is the interpreter and its libraries).
    The bounded drain must stay well under the unbounded one."""
    client, url = store
    slots = [slot_name(), slot_name()]
    n, rows = 2000, 100
    with psycopg.connect(fresh_db, autocommit=True) as c:
        for i in range(n):
            c.execute(f"CREATE TABLE t{i} (id int PRIMARY KEY, v text)")
        c.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    for slot in slots:
        create_slot(fresh_db, slot)
    with psycopg.connect(fresh_db, autocommit=True) as c:
        for i in range(n):
            c.execute(f"INSERT INTO t{i} SELECT g, md5(g::text) || repeat(md5((g * 7)::text), 30) "
                      f"FROM generate_series(1, {rows}) g")
    env = {**os.environ, **s3.aws_env()}
    peaks = []
    for slot, budget in zip(slots, ("32", "4096"), strict=True):
        p = subprocess.run(
            [sys.executable, "-c", _PEAK_RSS, "drain", "--dsn", fresh_db, "--slot", slot, "--publication", "pub",
             "--to", url, "--start-without-snapshot", "--memory-budget-mb", budget], env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        peaks.append(int(p.stderr.rsplit("PEAK_RSS_KB", 1)[1].split()[0]) / 1024)
        result = json.loads(p.stdout)
        assert result["rows"] == n * rows and len(result["tables"]) == n
        m = read_window(client, Layout.parse(url), slot, result["window_seq"])
        assert sum(t["rows"] for t in m.tables) == n * rows
    bounded, unbounded = peaks
    print(f"peak RSS {bounded:.0f} MB with a 32 MB budget, {unbounded:.0f} MB without, for {n} tables")
    assert bounded < 0.6 * unbounded, f"peak RSS {bounded:.0f} MB bounded vs {unbounded:.0f} MB unbounded"


def test_a_missing_slot_is_slot_missing(fresh_db, slot_name, store):
    """One class for a slot that does not exist, whoever finds out (the drain used to raise
    its own SlotNotFound, without the slot or a hint); the old name still catches it."""
    from airflow_pgcdc.drain import SlotNotFound
    from airflow_pgcdc.pg.slots import SlotMissing

    client, url = store
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    with pytest.raises(SlotMissing, match=f"replication slot '{slot}' does not exist") as missing:
        drain(fresh_db, url, slot, client)
    assert missing.value.slot == slot and "pgcdc snapshot" in missing.value.hint
    assert isinstance(missing.value, SlotNotFound)
    assert not list(s3store.list_objects(client, Layout.parse(url).bucket, ""))  # wrote nothing


def test_a_store_that_holds_nothing_of_the_slot_is_refused(fresh_db, slot_name, store, s3):
    """``pgcdc drain --store`` with a typo: before, the drain started window 0 at the slot's
    confirmed position in the empty prefix and acknowledged it, so the real store's next
    drain failed (``SlotAheadOfStore``) and only a new snapshot could recover. Now the drain
    refuses (``StoreHasNoCopy``, nothing read or acknowledged, nothing written there), the CLI
    says how to opt in, ``pgcdc status`` on that prefix exits 1, and the real store goes on."""
    from airflow_pgcdc.drain.drain import StoreHasNoCopy

    client, url = store
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'a')")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    snap = snapshot_to_s3(fresh_db, url, slot=slot, publications="pub", s3=client, workers=1,
                          worker_processes=False)
    sql(fresh_db, "INSERT INTO t VALUES (2, 'b')")
    before = confirmed(fresh_db, slot)
    typo = url + "-typo"
    with pytest.raises(StoreHasNoCopy) as refused:
        drain_window(fresh_db, typo, slot=slot, publications="pub", s3=client)
    assert typo in str(refused.value) and "--start-without-snapshot" in refused.value.hint
    assert confirmed(fresh_db, slot) == before
    layout = Layout.parse(typo)
    assert list(s3store.list_keys(client, layout.bucket, layout.root.prefix)) == []
    env = {**os.environ, **s3.aws_env()}
    cli = subprocess.run(
        [sys.executable, "-m", "airflow_pgcdc.cli", "drain", "--dsn", fresh_db, "--slot", slot,
         "--publication", "pub", "--store", typo], env=env, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 1 and "holds no snapshot and no window" in cli.stderr, cli.stderr
    assert "--start-without-snapshot" in cli.stderr, cli.stderr
    status = subprocess.run(
        [sys.executable, "-m", "airflow_pgcdc.cli", "status", "--dsn", fresh_db, "--slot", slot,
         "--store", typo, "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert status.returncode == 1 and "holds no snapshot and no window" in status.stderr, status.stderr
    assert json.loads(status.stdout)["store"]["slot_vs_store"] == "store_empty"
    assert confirmed(fresh_db, slot) == before
    # the real store drains the change from the snapshot's consistent point
    w = drain_window(fresh_db, url, slot=slot, publications="pub", s3=client)
    assert w.window_seq == 0 and w.start_lsn == snap.consistent_point and w.rows == 1
