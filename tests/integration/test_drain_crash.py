"""Crash safety of the drain, proven with real processes: ``pgcdc drain`` runs as a
subprocess and is SIGKILLed at each fault point of ``airflow_pgcdc.drain.drain``
(``PGCDC_FAULT``), PostgreSQL is restarted mid-window, and the walsender is terminated
mid-window. After each, a rerun produces the window again (or finds it committed and
acknowledges it), and reading every window back yields each transaction of a writer
that numbers its transactions exactly once, in commit order, with no gap; the windows
tile the LSN line and the slot ends where the last window ends."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import psycopg
import pytest
from test_drain import all_rows, assert_tiled, confirmed, create_slot, sql, windows

from airflow_pgcdc.drain.drain import drain_window
from airflow_pgcdc.faults import DRAIN_POINTS
from airflow_pgcdc.pg.errors import ConnectionFailed, ConnectionLost, ObjectInUse
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.store import s3 as s3store


@pytest.fixture
def store(s3, s3_bucket, monkeypatch):
    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    return s3.client(), f"s3://{s3_bucket}/lake"


def run_drain(dsn, url, slot, s3, *, env=None, until=None, timeout=120):
    cmd = [sys.executable, "-m", "airflow_pgcdc.cli", "drain", "--dsn", dsn, "--slot", slot,
           "--publication", "pub", "--to", url, "--start-without-snapshot"]
    if until is not None:
        cmd += ["--until-lsn", str(until)]
    full_env = {**os.environ, **s3.aws_env(), **(env or {})}
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)


def rerun(dsn, url, slot, client, **kw):
    """The rerun, in this process (only the killed runs need to be processes)."""
    deadline = time.monotonic() + 30
    while True:  # the dead drain's walsender may hold the slot for a moment
        try:
            return drain_window(dsn, url, slot=slot, publications="pub", s3=client,
                                **{"start_without_snapshot": True, **kw})
        except (ObjectInUse, ConnectionFailed, ConnectionLost, psycopg.OperationalError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def start_drain(dsn, url, slot, s3, env):
    cmd = [sys.executable, "-m", "airflow_pgcdc.cli", "drain", "--dsn", dsn, "--slot", slot,
           "--publication", "pub", "--to", url, "--start-without-snapshot"]
    return subprocess.Popen(cmd, env={**os.environ, **s3.aws_env(), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class Writer:
    """Commits transaction n = 1, 2, 3… (one row each, value n) until stopped."""

    def __init__(self, dsn):
        self.dsn, self.n, self._stop = dsn, 0, threading.Event()
        self._th = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        with psycopg.connect(self.dsn, autocommit=True) as c:
            while not self._stop.is_set():
                c.execute("INSERT INTO seq VALUES (%s, repeat('x', 50))", (self.n + 1,))
                self.n += 1
                time.sleep(0.002)

    def __enter__(self):
        self._th.start()
        while self.n < 20:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._th.join()


def setup(dsn, slot):
    sql(dsn, "CREATE TABLE seq (n bigint PRIMARY KEY, pad text)")
    sql(dsn, "CREATE PUBLICATION pub FOR TABLE seq")
    return create_slot(dsn, slot)


def finish_and_verify(dsn, url, slot, s3, client, start, last):
    """Drain to the end; then every transaction exactly once, in order, windows tiled."""
    end = LSN.parse(sql(dsn, "SELECT pg_current_wal_insert_lsn()::text")[0][0])
    rerun(dsn, url, slot, client, until_lsn=end)
    ns = [row["n"] for row in all_rows(client, url, slot, "public.seq")]
    assert ns == list(range(1, last + 1)), (
        f"{len(ns)} rows for {last} transactions; duplicates: {len(ns) - len(set(ns))}, "
        f"missing: {sorted(set(range(1, last + 1)) - set(ns))[:10]}"
    )
    ms = windows(client, url, slot)
    assert_tiled(ms, start)
    assert confirmed(dsn, slot) == ms[-1].end
    commit_lsns = [row["_pgcdc_commit_lsn"] for row in all_rows(client, url, slot, "public.seq")]
    assert commit_lsns == sorted(commit_lsns), "commit order"
    return ms


def test_sigkill_at_every_fault_point(fresh_db, slot_name, store, s3):
    client, url = store
    slot = slot_name()
    start = setup(fresh_db, slot)
    with Writer(fresh_db) as w:
        for point in DRAIN_POINTS:
            before = {m.window_seq for m in windows(client, url, slot)}
            killed = run_drain(fresh_db, url, slot, s3, env={"PGCDC_FAULT": point})
            assert killed.returncode == -9, f"{point}: {killed.returncode} {killed.stderr[-2000:]}"
            after_kill = {m.window_seq for m in windows(client, url, slot)}
            if point in ("after-manifest", "after-ack"):
                assert len(after_kill) == len(before) + 1, f"{point}: the window was committed"
            else:
                assert after_kill == before, f"{point}: nothing committed"
            again = rerun(fresh_db, url, slot, client)
            assert again.window_seq == max(after_kill, default=-1) + 1
            if point == "after-manifest":
                assert again.acknowledged_lost, "the rerun acknowledged the committed window"
    last = w.n  # the writer has stopped: transactions 1..last are committed
    finish_and_verify(fresh_db, url, slot, s3, client, start, last)


def backlog(dsn, txns=60, rows=1000):
    with psycopg.connect(dsn, autocommit=True) as c:
        for i in range(txns):
            c.execute("INSERT INTO seq SELECT g, 'b' FROM generate_series(%s::bigint, %s::bigint) g",
                      (i * rows + 1, (i + 1) * rows))
    return txns * rows


def paused_drain(dsn, url, slot, s3, tmp_path, point="after-receive", seconds=4):
    """A ``pgcdc drain`` process, returned once it is paused at fault ``point``."""
    marker = tmp_path / "paused"
    proc = start_drain(dsn, url, slot, s3, {
        "PGCDC_PAUSE": point, "PGCDC_PAUSE_FILE": str(marker), "PGCDC_PAUSE_SECONDS": str(seconds),
    })
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return proc


@pytest.mark.parametrize("how", ["restart", "terminate"])
def test_postgres_restart_or_dropped_connection_mid_window(fresh_db, slot_name, store, s3, tmp_path, how):
    client, url = store
    slot = slot_name()
    start = setup(fresh_db, slot)
    last = backlog(fresh_db)
    proc = paused_drain(fresh_db, url, slot, s3, tmp_path)  # mid-window: part received
    if how == "restart":
        fresh_db.server.restart("immediate")
    else:
        sql(fresh_db.socket_dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_replication "
                                 "WHERE application_name = 'pgcdc-drain'")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, (proc.returncode, err[-3000:])
    assert windows(client, url, slot) == [], "nothing committed"
    assert rerun(fresh_db, url, slot, client).transactions > 0
    finish_and_verify(fresh_db, url, slot, s3, client, start, last)


def test_window_committed_by_someone_else_meanwhile(fresh_db, slot_name, store, s3, tmp_path):
    """A manifest that appears at our window's key while we upload (another drain won the
    conditional put): WindowConflict, nothing acknowledged, the other manifest untouched."""
    from airflow_pgcdc.store.layout import Layout

    client, url = store
    slot = slot_name()
    start = setup(fresh_db, slot)
    backlog(fresh_db, txns=5)
    proc = paused_drain(fresh_db, url, slot, s3, tmp_path, point="after-parts", seconds=3)
    layout = Layout.parse(url)
    key = layout.window_manifest(slot, 0)
    foreign = b'{"written_by": "another drain"}'
    client.put_object(Bucket=layout.bucket, Key=key, Body=foreign)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, (proc.returncode, err[-3000:])  # lost a race: EX_TEMPFAIL
    assert "window 0 of slot" in err and "committed by another drain meanwhile" in err, err[-3000:]
    assert confirmed(fresh_db, slot) == start, "a window we did not commit is not acknowledged"
    assert client.get_object(Bucket=layout.bucket, Key=key)["Body"].read() == foreign
    left = [k for k in s3store.list_keys(client, layout.bucket, layout.window_prefix(slot, 0)) if k != key]
    assert left == [], f"the loser removes its own parts: {left}"
