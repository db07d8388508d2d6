"""The Delta root's lock (airflow_pgcdc.lake.lock) on the real S3 server: ``pgcdc maintain``
and a merge on Delta's Spark engine (which does not commit conditionally on S3, so it could
overwrite a compaction's commit) never commit to one Delta root at once. Before, only DAG
scheduling kept them apart."""

from __future__ import annotations

import json
import threading
import time

import pytest

from airflow_pgcdc.lake.lock import DeltaRootBusy, delta_root_lock, lock_key
from airflow_pgcdc.maintain import maintain_slot
from airflow_pgcdc.store import s3 as s3store


def test_maintain_waits_for_a_merge_holding_the_root_and_takes_over_a_dead_one(store):
    client, src, lake = store
    bucket, key = lock_key(lake)
    with delta_root_lock(client, lake, job="pgcdc merge of slot s (delta-spark)"):
        held = json.loads(s3store.get_bytes(client, bucket, key))
        assert held["job"] == "pgcdc merge of slot s (delta-spark)"
        with pytest.raises(DeltaRootBusy, match=r"locked by pgcdc merge of slot s \(delta-spark\)") as busy:
            maintain_slot(store=src, slot="s", delta=lake, lock_wait=1)
        assert "retry" in busy.value.hint
    assert not s3store.exists(client, bucket, key)  # released
    maintain_slot(store=src, slot="s", delta=lake, lock_wait=1)  # free: it runs
    assert not s3store.exists(client, bucket, key)

    # a holder that died: its lock is not renewed, and is taken over after the ttl
    dead = {"owner": "x", "job": "pgcdc merge of slot s (delta-spark)", "pid": 1, "host": "gone",
            "renewed_at": time.time() - 3600}
    s3store.put_bytes(client, bucket, key, json.dumps(dead))
    maintain_slot(store=src, slot="s", delta=lake, lock_wait=1)
    assert not s3store.exists(client, bucket, key)


def test_a_live_holder_renews_its_lock(store):
    """A holder renews the lock while it works: a waiter with a ttl shorter than the hold
    does not take it over."""
    client, _src, lake = store
    released = threading.Event()
    holding = threading.Event()

    def hold():
        with delta_root_lock(client, lake, job="long merge", ttl=5):  # renewed every 1.7 s
            holding.set()
            released.wait(10)

    th = threading.Thread(target=hold)
    th.start()
    try:
        assert holding.wait(10)
        with pytest.raises(DeltaRootBusy, match="locked by long merge"):
            with delta_root_lock(client, lake, job="upkeep", wait=7, ttl=5):  # longer than the ttl
                pass
    finally:
        released.set()
        th.join(10)
    with delta_root_lock(client, lake, job="upkeep", wait=1):
        pass


_HOLD = """
import sys, time
from airflow_pgcdc.lake.lock import delta_root_lock
from airflow_pgcdc.store import s3 as s3store
client = s3store.make_s3_client(s3store.S3Settings.from_env())
with delta_root_lock(client, sys.argv[1], job="pgcdc merge of slot s (delta-spark)", ttl=3600):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_delta_spark_merge_holds_the_root_and_a_killed_holder_is_taken_over_at_once(store, spark):
    """A merge on Delta's Spark engine takes the lock (maintain holding it: the merge waits,
    then fails naming it); a merge on delta-rs takes none. A holder killed with SIGKILL (its
    ttl an hour) is taken over at once by the next job on this machine: its process is gone.
    Before, the next job waited for the ttl (300 s by default) and the merge took no lock."""
    import subprocess
    import sys

    from airflow_pgcdc.merge.job import merge_slot

    client, src, lake = store
    bucket, key = lock_key(lake)
    with delta_root_lock(client, lake, job="pgcdc maintain of slot s"):
        with pytest.raises(DeltaRootBusy, match="locked by pgcdc maintain of slot s"):
            merge_slot(spark, store=src, slot="s", delta=lake, engine="delta-spark", lock_wait=1)
        merge_slot(spark, store=src, slot="s", delta=lake, engine="delta-rs", lock_wait=1)  # no lock needed

    holder = subprocess.Popen([sys.executable, "-c", _HOLD, lake], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        held = json.loads(s3store.get_bytes(client, bucket, key))
        assert held["pid"] == holder.pid and held["pid_start"] and held["boot_id"] and held["pid_ns"], held
        with pytest.raises(DeltaRootBusy):  # alive: not taken over
            maintain_slot(store=src, slot="s", delta=lake, lock_wait=1)
    finally:
        holder.kill()
        holder.wait(30)
    t0 = time.monotonic()
    merge_slot(spark, store=src, slot="s", delta=lake, engine="delta-spark", lock_wait=60)
    assert time.monotonic() - t0 < 30, "the dead holder's lock was waited for"
    assert not s3store.exists(client, bucket, key)

    # a holder on another machine cannot be seen from here: its lock stands until its ttl
    other = {"owner": "y", "job": "pgcdc maintain of slot s", "host": "elsewhere", "pid": holder.pid,
             "pid_start": held["pid_start"], "boot_id": "b", "pid_ns": "pid:[1]", "renewed_at": time.time()}
    s3store.put_bytes(client, bucket, key, json.dumps(other))
    with pytest.raises(DeltaRootBusy, match="pid .* on elsewhere"):
        merge_slot(spark, store=src, slot="s", delta=lake, engine="delta-spark", lock_wait=1)
