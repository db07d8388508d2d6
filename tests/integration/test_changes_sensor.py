"""PgcdcChangesTrigger under asyncio and PgcdcChangesSensor (poke, defer, and a real
deferred DAG run) against real PostgreSQL 15 and 18 servers."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import psycopg
import pytest
from airflow_runner import airflow_env, run_dag
from psycopg.conninfo import conninfo_to_dict

from airflow_pgcdc.pg import slots
from airflow_pgcdc.pg.replication import ReplicationConnection
from airflow_pgcdc.protocol.lsn import LSN

DAGS = Path(__file__).parent / "dags"


def conn_json(dsn: str, **extra: str) -> str:
    p = conninfo_to_dict(dsn)
    return json.dumps({"conn_type": "postgres", "host": p["host"], "port": int(p["port"]),
                       "login": p["user"], "password": p["password"], "schema": p["dbname"],
                       "extra": extra})


def sql(dsn: str, query: str, params=None):
    with psycopg.connect(dsn, autocommit=True) as c:
        cur = c.execute(query, params)
        return cur.fetchall() if cur.description else None


def current_lsn(dsn: str) -> LSN:
    return LSN.parse(sql(dsn, "SELECT pg_current_wal_insert_lsn()::text")[0][0])


def write_rows(dsn: str, n: int) -> None:
    sql(dsn, "INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series("
             "(SELECT coalesce(max(id), 0) + 1 FROM t), (SELECT coalesce(max(id), 0) + %s FROM t)) g",
        (n,))


@pytest.fixture
def source(fresh_db, slot_name, monkeypatch):
    """A database with table t in publication p, a fresh slot, and an Airflow connection to
    it (from the environment): ``(dsn, slot, conn_id)``."""
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(fresh_db, "CREATE PUBLICATION p FOR TABLE t")
    name = slot_name()
    slots.create_slot(fresh_db, name)
    conn_id = f"src_{fresh_db.dbname}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", conn_json(fresh_db))
    return fresh_db, name, conn_id


def trigger_for(slot: str, conn_id: str, **kwargs):
    from airflow_pgcdc.triggers.changes import PgcdcChangesTrigger

    kwargs.setdefault("poll_interval", 0.2)
    return PgcdcChangesTrigger(slot=slot, postgres_conn_id=conn_id, **kwargs)


def first_event(trigger, timeout: float = 20.0) -> dict:
    async def go():
        return await asyncio.wait_for(anext(trigger.run()), timeout)

    return asyncio.run(go()).payload


# --------------------------------------------------------------------------- trigger


def test_trigger_fires_on_pending_wal_and_serializes_without_secrets(source):
    dsn, slot, conn_id = source
    trigger = trigger_for(slot, conn_id, publications="p", min_bytes=1 << 20, max_delay=None)

    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_pgcdc.triggers.changes.PgcdcChangesTrigger"
    assert kwargs["postgres_conn_id"] == conn_id and kwargs["slot"] == slot
    text = json.dumps(kwargs)
    assert dsn.server.password not in text and "password" not in text
    from airflow_pgcdc.triggers.changes import PgcdcChangesTrigger

    assert PgcdcChangesTrigger(**kwargs).serialize() == (classpath, kwargs)

    async def scenario():
        task = asyncio.create_task(anext(trigger.run()))
        await asyncio.sleep(0.8)  # several polls: below min_bytes, it waits
        assert not task.done()
        before = slots.slot_health(dsn, slot)
        await asyncio.to_thread(write_rows, dsn, 20_000)  # ~2.5 MB of WAL
        after = current_lsn(dsn)
        event = (await asyncio.wait_for(task, 20)).payload
        return before, after, event

    before, after, event = asyncio.run(scenario())
    assert event["status"] == "ready" and event["reason"] == "min_bytes" and event["slot"] == slot
    assert event["pending_bytes"] >= 1 << 20
    # WAL counts while the INSERT still runs: the trigger may fire before it ends
    assert before.confirmed_flush_lsn < LSN.parse(event["observed_lsn"]) <= current_lsn(dsn)
    assert event["confirmed_flush_lsn"] == str(before.confirmed_flush_lsn)
    assert LSN.parse(event["observed_lsn"]) - LSN.parse(event["confirmed_flush_lsn"]) == event["pending_bytes"]
    assert event["wal_status"] == "reserved" and event["retained_bytes"] >= event["pending_bytes"]

    # retained WAL above the threshold: a warning, repeated only when it doubles (or later)
    from airflow_pgcdc.triggers.changes import RetainedWalWarning

    health = slots.slot_health(dsn, slot)
    warner = RetainedWalWarning(1 << 20)
    message = warner.message(health, now=0.0)
    assert f"retains {health.retained_bytes} bytes of WAL" in message and "threshold 1048576" in message
    assert warner.message(health, now=1.0) is None
    assert warner.message(health, now=601.0) is not None
    assert RetainedWalWarning(1 << 40).message(health) is None


def test_trigger_max_delay_and_waiting(source):
    dsn, slot, conn_id = source
    # nothing worth draining and no delay limit: it keeps waiting
    with pytest.raises(asyncio.TimeoutError):
        first_event(trigger_for(slot, conn_id, min_bytes=1 << 40, max_delay=None), timeout=1.0)
    # a change pending longer than max_delay fires, however small
    write_rows(dsn, 1)
    event = first_event(trigger_for(slot, conn_id, min_bytes=1 << 40, max_delay=1.0))
    assert event["status"] == "ready" and event["reason"] == "max_delay"
    assert event["pending_age_seconds"] >= 1.0 and event["pending_bytes"] > 0


def test_trigger_error_events(source):
    dsn, slot, conn_id = source
    event = first_event(trigger_for("no_such_slot", conn_id))
    assert event["status"] == "error" and event["error"] == "slot_missing"
    assert "'no_such_slot' does not exist" in event["message"] and event["hint"]

    event = first_event(trigger_for(slot, conn_id, publications="nope"))
    assert event["error"] == "publication_missing" and "'nope' does not exist" in event["message"]

    event = first_event(trigger_for(slot, "no_such_connection"))
    assert event["error"] == "connection" and "no_such_connection" in event["message"]

    with ReplicationConnection.connect(dsn) as repl:
        repl.start_replication(slot, 0, options=[("proto_version", "1"), ("publication_names", "p")])
        event = first_event(trigger_for(slot, conn_id))
        assert event["error"] == "slot_in_use"
        assert f"in use by process {repl.pgconn.backend_pid}" in event["message"]


# --------------------------------------------------------------------------- sensor


def test_sensor_poke_defer_and_failures(source):
    from airflow_pgcdc.hooks.compat import AirflowFailException, TaskDeferred
    from airflow_pgcdc.sensors.changes import (
        PgcdcChangesSensor,
        PgcdcSlotBusy,
        PgcdcSlotUnusable,
    )

    dsn, slot, conn_id = source
    sensor = PgcdcChangesSensor(task_id="s", slot=slot, publications="p", postgres_conn_id=conn_id,
                                min_bytes=1 << 20, max_delay=None, deferrable=False)
    assert sensor.poke({}) is False
    write_rows(dsn, 20_000)
    ret = sensor.poke({})
    assert ret.is_done and ret.xcom_value["reason"] == "min_bytes"
    assert LSN.parse(ret.xcom_value["observed_lsn"]) <= current_lsn(dsn)

    # deferrable and not ready yet: defers to the trigger, carrying the pending clock
    deferring = PgcdcChangesSensor(task_id="d", slot=slot, postgres_conn_id=conn_id,
                                   min_bytes=1 << 40, max_delay=3600, poke_interval=5)
    with pytest.raises(TaskDeferred) as d:
        deferring.execute({})
    trig = d.value.trigger
    assert d.value.method_name == "execute_complete"
    assert trig.slot == slot and trig.poll_interval == 5 and trig.max_delay == 3600
    assert trig.pending_since is not None and trig.pending_confirmed_lsn
    # ready at once: no deferral, the payload is the return value
    ready = PgcdcChangesSensor(task_id="r", slot=slot, postgres_conn_id=conn_id, min_bytes=1)
    assert ready.execute({})["status"] == "ready"

    # failures: clear messages; lost/missing do not retry, in-use does
    broken = PgcdcChangesSensor(task_id="b", slot="no_such_slot", postgres_conn_id=conn_id)
    with pytest.raises(PgcdcSlotUnusable, match="does not exist") as e:
        broken.execute({})
    assert isinstance(e.value, AirflowFailException) and e.value.kind == "slot_missing"
    assert "hint: create it" in str(e.value)
    lost = {"status": "error", "error": "slot_lost", "message": "replication slot 'x' can no longer…",
            "hint": "re-snapshot with a new slot", "slot": "x"}
    with pytest.raises(PgcdcSlotUnusable, match="re-snapshot"):
        sensor.execute_complete({}, lost)
    with pytest.raises(PgcdcSlotBusy) as e:
        sensor.execute_complete({}, {**lost, "error": "slot_in_use", "message": "in use by process 7"})
    assert not isinstance(e.value, AirflowFailException)
    assert sensor.execute_complete({}, {"status": "ready", "observed_lsn": "0/10"})["observed_lsn"] == "0/10"


@pytest.mark.parametrize("pg_server", ["pg18"], indirect=True)
def test_sensor_deferred_in_a_dag_run(fresh_db, slot_name, tmp_path):
    """A real DAG run (dag.test, trigger run inline): the sensor defers, the write happens
    while its trigger polls, the sensor succeeds and the next task gets observed_lsn."""
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(fresh_db, "CREATE PUBLICATION p FOR TABLE t")
    slot = slot_name()
    slots.create_slot(fresh_db, slot)
    app = "pgcdc-sensor-dag-test"
    env = airflow_env(tmp_path / "airflow", DAGS, {"AIRFLOW_CONN_PGCDC_SRC": conn_json(fresh_db, application_name=app)})
    results: list = []
    runner = threading.Thread(
        target=lambda: results.append(run_dag(
            DAGS / "pgcdc_test_changes_sensor.py", "pgcdc_test_changes_sensor", env,
            {"slot": slot, "publication": "p"}, timeout=240,
        )),
        daemon=True,
    )
    runner.start()
    # the trigger keeps one connection open between polls: wait for it, then write
    deadline = time.monotonic() + 150
    while runner.is_alive() and time.monotonic() < deadline:
        (n,) = sql(fresh_db, "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND "
                             "application_name = %s AND backend_start < now() - interval '1 second'",
                   (fresh_db.dbname, app))[0]
        if n:
            break
        time.sleep(0.2)
    assert runner.is_alive(), results and results[0].output[-4000:]
    write_rows(fresh_db, 25_000)  # ~3 MB > min_bytes (2 MiB)
    after = current_lsn(fresh_db)
    runner.join(timeout=200)
    assert results, "the DAG run did not finish"
    result = results[0]
    wait, use, missing = (result.tasks[t] for t in ("wait", "use", "missing"))
    assert wait["state"] == "success", result.output[-6000:]
    assert "running trigger in line" in result.output  # it did defer
    event = wait["xcom"]
    assert event["status"] == "ready" and event["reason"] == "min_bytes" and event["slot"] == slot
    assert LSN.parse(event["observed_lsn"]) >= after and event["pending_bytes"] >= 2 << 20
    assert use["state"] == "success" and use["xcom"]["window_end"] == event["observed_lsn"]
    assert missing["state"] == "failed"
    assert "replication slot 'no_such_slot' does not exist" in result.output
    assert fresh_db.server.password not in result.output
