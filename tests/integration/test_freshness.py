"""Freshness in seconds (``pgcdc status --store … --delta …``, ``--max-lag-seconds N``): per
Delta table, now minus the commit time of its oldest change the store holds and the merge has
not applied; 0 once merged; a copy not merged yet is as old as its consistent point. Checked
on PostgreSQL, SeaweedFS and the delta-rs merge: the lag follows a real commit's time, the
quiet table stays at 0, and the command's exit code is the alert."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime

from airflow_runner import StatsdListener, airflow_env, run_dag
from lake_helpers import drain, sql
from matrix import on_pg18
from test_operators_copy import DAGS, conn_json, s3_conn_json
from test_status_tables import _CountingClient

from airflow_pgcdc.merge.job import merge_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.status.job import slot_status


def _status_cli(s3, db, slot, src, lake, *extra) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "airflow_pgcdc.cli", "status", "--dsn", db, "--slot", slot,
                           "--store", src, "--delta", lake, *extra], env=dict(os.environ, **s3.aws_env()),
                          capture_output=True, text=True, timeout=300)


@on_pg18("the lag is read from the store's manifests and the Delta tables: no server difference")
def test_the_lag_in_seconds_follows_the_oldest_change_not_merged(fresh_db, slot_name, store, s3, spark, tmp_path):
    client, src, lake = store
    db, slot = fresh_db, slot_name()
    sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(db, "CREATE TABLE quiet (id int PRIMARY KEY)")
    sql(db, "CREATE TABLE still (id int PRIMARY KEY)")  # copied, never changed
    sql(db, "INSERT INTO t VALUES (1, 'a'); INSERT INTO quiet VALUES (1); INSERT INTO still VALUES (1)")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t, quiet, still")
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    time.sleep(1.0)
    fresh = slot_status(db, slot, store=src, delta=lake)["store"]["freshness"]
    assert all(t["lag_seconds"] >= 1.0 and t["merged_through"] is None for t in fresh["tables"].values()), fresh

    merge_slot(spark, store=src, slot=slot, delta=lake, engine="delta-rs")
    assert {n: t["lag_seconds"] for n, t in slot_status(db, slot, store=src, delta=lake)["store"]["freshness"][
        "tables"].items()} == {"public.t": 0.0, "public.quiet": 0.0, "public.still": 0.0}

    (committed,) = sql(db, "INSERT INTO t VALUES (2, 'b') RETURNING clock_timestamp()")[0]
    drain(db, src, slot, client)
    time.sleep(1.5)
    before = datetime.now(UTC)
    fresh = slot_status(db, slot, store=src, delta=lake)["store"]["freshness"]
    t = fresh["tables"]["public.t"]
    waited = (before - committed).total_seconds()
    assert waited - 0.5 <= t["lag_seconds"] <= waited + 5.0, (t, waited)
    assert 0 <= (datetime.fromisoformat(t["oldest_unmerged_commit"]) - committed).total_seconds() < 1.0  # its commit
    assert fresh["tables"]["public.quiet"]["lag_seconds"] == 0.0 and fresh["lag_seconds"] >= t["lag_seconds"]

    # the Airflow check: every SLA holds (the run's is 600 s: the WAL's wait counts, and it is
    # the cluster's: other tests' databases commit on this server); then a table past the
    # run's SLA (1 s) fails the run, named, while t's own (3600 s) holds
    env = airflow_env(tmp_path / "airflow", DAGS, {
        "AIRFLOW_CONN_PGCDC_SRC": conn_json(db),
        "AIRFLOW_CONN_PGCDC_S3": s3_conn_json(s3),
    })
    conf = {"store": src, "delta": lake, "slot": slot}
    # the metrics reach a real StatsD listener (Airflow's [metrics], as a deployment sets it)
    with StatsdListener() as statsd:
        ok = run_dag(DAGS / "pgcdc_test_freshness.py", "pgcdc_test_freshness",
                     {**env, **statsd.airflow_env()}, {**conf, "max_lag": 600})
        assert ok.state == "success", ok.output[-3000:]
        lag = ok.xcom("freshness")["tables"]["public.t"]["lag_seconds"]
        assert lag >= 1.0
        gauges = statsd.gauges(timeout=10.0, want=f"airflow.pgcdc.{slot}.public.t.lag_seconds")
    assert abs(gauges[f"airflow.pgcdc.{slot}.public.t.lag_seconds"] - lag) < 0.01, gauges
    assert gauges[f"airflow.pgcdc.{slot}.public.quiet.lag_seconds"] == 0.0
    assert gauges[f"airflow.pgcdc.{slot}.lag_seconds"] >= lag
    assert gauges[f"airflow.pgcdc.{slot}.slot.retained_bytes"] > 0
    sql(db, "INSERT INTO quiet VALUES (2)")
    drain(db, src, slot, client)
    time.sleep(1.5)
    failed = run_dag(DAGS / "pgcdc_test_freshness.py", "pgcdc_test_freshness", env, {**conf, "max_lag": 1})
    assert failed.state == "failed" and "public.quiet" in failed.output and "SLA 1 s" in failed.output
    assert "public.t " not in failed.output.split("PgcdcTablesStale")[-1]

    late = _status_cli(s3, db, slot, src, lake, "--max-lag-seconds", "1")
    assert late.returncode == 1 and "public.t" in late.stderr and "past --max-lag-seconds 1" in late.stderr, late
    assert "freshness" in late.stdout and "behind the source" in late.stdout
    assert _status_cli(s3, db, slot, src, lake, "--max-lag-seconds", "3600").returncode == 0
    prom = _status_cli(s3, db, slot, src, lake, "--prometheus")
    assert prom.returncode == 0, prom.stderr
    line = next(ln for ln in prom.stdout.splitlines() if ln.startswith("pgcdc_table_lag_seconds") and "public.t" in ln)
    assert line.startswith(f'pgcdc_table_lag_seconds{{slot="{slot}",table="public.t"}} ') and float(line.split()[-1]) > 1

    merge_slot(spark, store=src, slot=slot, delta=lake, engine="delta-rs")
    fresh = slot_status(db, slot, store=src, delta=lake)["store"]["freshness"]
    assert fresh["tables"]["public.t"] == {"merged_through": 1, "oldest_unmerged_commit": None, "lag_seconds": 0.0}
    # merged: no table lags; what is left is the WAL's wait (the cluster's, see above), and the
    # exit code follows the figure the command reports
    ok = _status_cli(s3, db, slot, src, lake, "--max-lag-seconds", "1", "--json")
    fresh = json.loads(ok.stdout)["store"]["freshness"]
    assert {t["lag_seconds"] for t in fresh["tables"].values()} == {0.0}, fresh
    assert fresh["lag_seconds"] == round(fresh["wal_wait_seconds"] or 0.0, 3)
    assert ok.returncode == (1 if fresh["lag_seconds"] > 1 else 0), ok.stderr

    # the history: each window's rows, how old its oldest change was once stored and once in
    # Delta (from the merge jobs' records), and its picture
    png = tmp_path / "history.png"
    hist = _status_cli(s3, db, slot, src, lake, "--history", "1", "--plot", str(png), "--json")
    assert hist.returncode == 0, hist.stderr
    rows = {r["window_seq"]: r for r in json.loads(hist.stdout)["history"]}
    assert sorted(rows) == [0, 1] and rows[0]["rows"] == 1 and rows[1]["rows"] == 1
    assert rows[0]["lag_seconds"] >= waited and rows[0]["merged_at"] is not None  # merged after the wait
    assert rows[0]["stored_lag_seconds"] < rows[0]["lag_seconds"] and rows[0]["drain_seconds"] > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    text = _status_cli(s3, db, slot, src, lake, "--history", "1")
    assert text.returncode == 0 and "in Delta at" in text.stdout

    # a table no window ever held is not looked for in every window: the merge's tables
    # index (written by the last merge, through window 1) says none of windows 0..1 holds it
    sql(db, "INSERT INTO t VALUES (3, 'c')")
    drain(db, src, slot, client)
    counting = _CountingClient(client)
    fresh = slot_status(db, slot, store=src, delta=lake, s3=counting)["store"]["freshness"]
    assert fresh["tables"]["public.still"]["lag_seconds"] == 0.0 and fresh["tables"]["public.t"]["lag_seconds"] > 0
    read = sorted(k.split("/")[-2] for k in counting.gets if "/changes/" in k and k.endswith("_manifest.json"))
    assert read == ["w=000000000001", "w=000000000002"], read  # the index's window, and the new one
