"""Slot health, slot and publication management (airflow_pgcdc.pg.slots) and the
``pgcdc slot|publication|status`` commands, against real PostgreSQL 15 and 18 servers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from airflow_pgcdc.pg import publications, slots
from airflow_pgcdc.pg.replication import ReplicationConnection
from airflow_pgcdc.pg.tables import TableNotFound
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.quoting import quote_ident, quote_qualified
from airflow_pgcdc.status.job import committed_windows, slot_status
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.testing.postgres import PostgresServer


def sql(dsn: str, query: str, params=None):
    with psycopg.connect(dsn, autocommit=True) as c:
        cur = c.execute(query, params)
        return cur.fetchall() if cur.description else None


def write_rows(dsn: str, n: int = 20_000, table: str = "t") -> None:
    sql(dsn, f"CREATE TABLE IF NOT EXISTS {table} (id int PRIMARY KEY, v text)")
    sql(dsn, f"INSERT INTO {table} SELECT g, repeat('x', 100) FROM generate_series("
             f"(SELECT coalesce(max(id), 0) + 1 FROM {table}), "
             f"(SELECT coalesce(max(id), 0) + {n} FROM {table})) g")


def conn_json(dsn: str) -> str:
    p = conninfo_to_dict(dsn)
    return json.dumps({"conn_type": "postgres", "host": p["host"], "port": int(p["port"]),
                       "login": p["user"], "password": p["password"], "schema": p["dbname"]})


def pgcdc(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The real command, in a child process."""
    return subprocess.run(
        [sys.executable, "-m", "airflow_pgcdc.cli", *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})},
    )


@pytest.fixture
def cli(capsys, monkeypatch):
    """``cli(*args, env=...)``: :func:`airflow_pgcdc.cli.main` in this process (fast), with
    the same result shape as :func:`pgcdc`."""
    from airflow_pgcdc.cli import main

    def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)

    return run


# --------------------------------------------------------------------------- health


def test_health_moves_with_wal_and_acknowledgement(fresh_db, slot_name):
    name = slot_name()
    created = slots.create_slot(fresh_db, name)
    assert created.plugin == "pgoutput" and not created.two_phase
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        h0 = slots.slot_health(conn, name)
        assert h0.exists and h0.slot_type == "logical" and h0.plugin == "pgoutput"
        assert h0.database == fresh_db.dbname == h0.current_database
        assert h0.wal_status == "reserved" and not h0.active and not h0.lost
        assert h0.confirmed_flush_lsn == created.consistent_point
        assert h0.pending_bytes == h0.current_lsn - h0.confirmed_flush_lsn >= 0
        assert h0.retained_bytes == h0.current_lsn - h0.restart_lsn >= h0.pending_bytes
        assert slots.check_slot_usable(h0) is h0

        write_rows(fresh_db, 20_000)  # ~2.5 MB of WAL
        h1 = slots.slot_health(conn, name)
        assert slots.current_wal_lsn(conn) >= h1.current_lsn
        assert h1.confirmed_flush_lsn == h0.confirmed_flush_lsn  # nothing acknowledged yet
        assert h1.pending_bytes - h0.pending_bytes >= 2_000_000
        assert h1.retained_bytes >= h1.pending_bytes
        if h1.server_version >= 170000:
            # the newest commit came after the slot was last released: a provable lower bound
            assert h1.inactive_since is not None and h1.last_commit_time > h1.inactive_since
            assert slots.oldest_pending_age(h1) is not None and slots.oldest_pending_age(h1) >= 0
        else:
            assert h1.inactive_since is None and slots.oldest_pending_age(h1) is None

        # acknowledge up to here: pending drops to what was written since
        target = slots.current_wal_lsn(conn)
        (moved,) = conn.execute(
            "SELECT end_lsn::text FROM pg_replication_slot_advance(%s, %s::pg_lsn)", (name, str(target))
        ).fetchone()
        h2 = slots.slot_health(conn, name)
        assert h2.confirmed_flush_lsn == LSN.parse(moved) > h1.confirmed_flush_lsn
        assert h2.pending_bytes == h2.current_lsn - h2.confirmed_flush_lsn < h1.pending_bytes
        assert h2.pending_bytes < 1_000_000

        # the watcher's clock: pending WAL keeps its first-seen time until the slot moves
        clock = slots.PendingClock()
        clock.observe(h2)
        write_rows(fresh_db, 100)
        a1 = clock.observe(slots.slot_health(conn, name))
        since = clock.since
        assert a1 is not None and since is not None
        time.sleep(0.3)
        a2 = clock.observe(slots.slot_health(conn, name))
        assert a2 >= a1 + 0.25 and clock.since <= since
        conn.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_insert_lsn())", (name,))
        h4 = slots.slot_health(conn, name)
        a3 = clock.observe(h4)  # the slot moved: the clock starts again
        assert clock.confirmed_flush_lsn == str(h4.confirmed_flush_lsn) and a3 < a2

        assert name in [s.slot for s in slots.list_slots(conn)]
        assert h1.to_dict()["pending_bytes"] == h1.pending_bytes
        json.dumps(h1.to_dict())


def test_in_use_missing_mismatch_and_publication_errors(fresh_db, slot_name):
    name = slot_name()
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY)")
    sql(fresh_db, "CREATE PUBLICATION p FOR TABLE t")
    slots.create_slot(fresh_db, name)
    with pytest.raises(slots.SlotExists, match="already exists") as e:
        slots.create_slot(fresh_db, name)
    assert "pgcdc slot drop" in e.value.hint

    with psycopg.connect(fresh_db, autocommit=True) as conn:
        # missing slot
        missing = slots.slot_health(conn, "no_such_slot")
        assert not missing.exists and missing.pending_bytes is None and missing.current_lsn
        with pytest.raises(slots.SlotMissing, match="does not exist") as e:
            slots.check_slot_usable(missing)
        assert e.value.kind == "slot_missing" and "pgcdc snapshot" in e.value.hint
        # missing publication
        h = slots.slot_health(conn, name, publications="no such pub")
        assert h.publication_exists is False
        with pytest.raises(slots.PublicationMissing, match="no such pub") as e:
            slots.check_slot_usable(h)
        assert "pgcdc publication ensure" in e.value.hint
        assert slots.slot_health(conn, name, publications="p").publication_exists is True
        # several: the first missing one is named, in the order given
        several = slots.slot_health(conn, name, publications=["p", "gone_b", "gone_a"])
        assert several.publication_exists is False and several.publication == "gone_b"
        with pytest.raises(slots.PublicationMissing, match="'gone_b'"):
            slots.check_slot_usable(several)
        assert slots.slot_health(conn, name, publications=["p", "p"]).publication_exists is True
        assert slots.slot_health(conn, name).publication_exists is None  # none checked
        # wrong plugin expectation
        with pytest.raises(slots.SlotMismatch, match="output plugin"):
            slots.check_slot_usable(h, plugin="wal2json")

    # another database: a logical slot decodes one database only
    other = fresh_db.server.make_dsn("postgres")
    with pytest.raises(slots.SlotMismatch, match=f"belongs to database '{fresh_db.dbname}'"):
        slots.check_slot_usable(slots.slot_health(other, name))

    # in use: a stream holds the slot
    with ReplicationConnection.connect(fresh_db) as repl:
        repl.start_replication(name, 0, options=[("proto_version", "1"), ("publication_names", "p")])
        pid = repl.pgconn.backend_pid
        h = slots.slot_health(fresh_db, name)
        assert h.active and h.active_pid == pid
        with pytest.raises(slots.SlotInUse, match=f"in use by process {pid}") as e:
            slots.check_slot_usable(h)
        assert e.value.active_pid == pid and e.value.kind == "slot_in_use"
        assert slots.check_slot_usable(h, allow_pid=pid) is h
        status = slot_status(fresh_db, name)  # a running drain is not a problem for status
        assert status["problem"] is None and status["slot"]["active_pid"] == pid
        with pytest.raises(slots.SlotInUse):
            slots.drop_slot(fresh_db, name, wait=False)
    assert slots.drop_slot(fresh_db, name) is True
    with pytest.raises(slots.SlotMissing):
        slots.drop_slot(fresh_db, name)
    assert slots.drop_slot(fresh_db, name, missing_ok=True) is False


def test_two_phase_and_failover_slots(fresh_db, slot_name):
    tp = slot_name()
    assert slots.create_slot(fresh_db, tp, two_phase=True).two_phase
    assert slots.slot_health(fresh_db, tp).two_phase is True
    fo = slot_name()
    if fresh_db.server.major < 17:
        with pytest.raises(slots.UnsupportedFeature, match="PostgreSQL 17"):
            slots.create_slot(fresh_db, fo, failover=True)
        assert not slots.slot_health(fresh_db, fo).exists
        return
    created = slots.create_slot(fresh_db, fo, failover=True, two_phase=True)
    h = slots.slot_health(fresh_db, fo)
    assert h.failover is True and h.two_phase is True and created.failover
    assert h.confirmed_flush_lsn == created.consistent_point


# --------------------------------------------------------------------------- lost slot


@pytest.mark.integration
@pytest.mark.parametrize("flavour", ["pg15", "pg18"])
def test_lost_slot(flavour, monkeypatch):
    """A dedicated server (max_slot_wal_keep_size = 1MB): the slot goes 'unreserved' when it
    falls behind, then 'lost' at the next checkpoint; each is a SlotLost that says what
    happened and to re-snapshot; the trigger and `pgcdc status` report it too."""
    from airflow_pgcdc.triggers.changes import PgcdcChangesTrigger

    settings = {"max_slot_wal_keep_size": "1MB", "wal_keep_size": 0}
    with PostgresServer(flavour, settings=settings) as srv:
        dsn = srv.dsn
        slots.create_slot(dsn, "doomed")
        sql(dsn, "CREATE TABLE t (id int)")
        assert slots.slot_health(dsn, "doomed").wal_status == "reserved"
        for _ in range(4):
            sql(dsn, "INSERT INTO t VALUES (1)")
            sql(dsn, "SELECT pg_switch_wal()")
        h = slots.slot_health(dsn, "doomed")
        assert h.wal_status == "unreserved" and h.unreserved and not h.lost
        with pytest.raises(slots.SlotLost, match="'unreserved'") as e:
            slots.check_slot_usable(h)
        assert e.value.reason == "unreserved" and "re-snapshot" in e.value.hint

        sql(dsn, "CHECKPOINT")
        h = slots.slot_health(dsn, "doomed")
        assert h.wal_status == "lost" and h.lost and h.restart_lsn is None
        if srv.major >= 17:
            assert h.invalidation_reason == "wal_removed"
        with pytest.raises(slots.SlotLost) as e:
            slots.check_slot_usable(h)
        err = e.value
        assert err.kind == "slot_lost" and err.reason == "wal_removed"
        assert "WAL it still needed was removed" in str(err) and "max_slot_wal_keep_size" in str(err)
        assert "re-snapshot with a new slot" in err.hint and "pgcdc slot drop --slot doomed" in err.hint
        assert "pgcdc recover --slot doomed" in err.hint

        # the trigger fails with the same message
        monkeypatch.setenv("AIRFLOW_CONN_PGCDC_LOST", conn_json(dsn))
        trigger = PgcdcChangesTrigger(slot="doomed", postgres_conn_id="pgcdc_lost", poll_interval=0.2)

        async def first_event():
            return await asyncio.wait_for(anext(trigger.run()), 30)

        event = asyncio.run(first_event()).payload
        assert event["status"] == "error" and event["error"] == "slot_lost"
        assert "re-snapshot" in event["hint"] and "WAL it still needed was removed" in event["message"]

        # pgcdc status: prints the state, says what to do, exits 1
        proc = pgcdc("status", "--dsn", dsn, "--slot", "doomed", "--json")
        assert proc.returncode == 1, proc.stderr
        status = json.loads(proc.stdout)
        assert status["slot"]["wal_status"] == "lost" and status["problem"]["error"] == "slot_lost"
        assert "pgcdc: error: replication slot 'doomed' can no longer deliver" in proc.stderr
        assert "hint: to go on into the same store and Delta tables: `pgcdc recover --slot doomed" in proc.stderr
        assert srv.password not in proc.stdout + proc.stderr


@pytest.mark.integration
@pytest.mark.parametrize("flavour", ["pg15", "pg18"])
def test_unreserved_slot_is_drained_at_once_and_saved(flavour, monkeypatch, s3, s3_bucket):
    """An 'unreserved' slot is not a failure for the watchers: draining it is its only
    rescue. The trigger fires at once (reason 'unreserved', a warning), whatever the
    thresholds; the drain then acknowledges, and the next checkpoint leaves the slot alive
    (before, the sensor failed and the checkpoint made the slot 'lost'). The rescue part runs
    on 16+, where the test can force the running-xacts record that lets restart_lsn move."""
    from airflow_pgcdc.drain.drain import drain_window
    from airflow_pgcdc.triggers.changes import PgcdcChangesTrigger

    settings = {"max_slot_wal_keep_size": "1MB", "wal_keep_size": 0}
    with PostgresServer(flavour, settings=settings) as srv:
        dsn = srv.dsn
        sql(dsn, "CREATE TABLE t (id int PRIMARY KEY)")
        sql(dsn, "CREATE PUBLICATION pub FOR TABLE t")
        slots.create_slot(dsn, "rescued")
        for i in range(4):
            sql(dsn, "INSERT INTO t VALUES (%s)", (i,))
            sql(dsn, "SELECT pg_switch_wal()")
        assert slots.slot_health(dsn, "rescued").wal_status == "unreserved"
        monkeypatch.setenv("AIRFLOW_CONN_PGCDC_RESCUE", conn_json(dsn))
        trigger = PgcdcChangesTrigger(slot="rescued", postgres_conn_id="pgcdc_rescue", poll_interval=0.2,
                                      min_bytes=1 << 40, max_delay=None)

        async def first_event():
            return await asyncio.wait_for(anext(trigger.run()), 30)

        event = asyncio.run(first_event()).payload
        assert event["status"] == "ready" and event["reason"] == "unreserved", event
        assert "UNRESERVED" in event["warning"] and event["observed_lsn"]
        for k, v in s3.aws_env().items():
            monkeypatch.setenv(k, v)
        if srv.major < 16:
            return  # the rescue needs a running-xacts record to decode (below): 16+ can force one
        # restart_lsn moves only past a running-xacts record the slot decoded (the bgwriter logs
        # one every 15 s on a busy server; here, at once)
        sql(dsn, "SELECT pg_log_standby_snapshot()")
        r = drain_window(dsn, f"s3://{s3_bucket}/lake", slot="rescued", publications="pub",
                         s3=s3.client(), start_without_snapshot=True)
        assert r.rows == 4
        sql(dsn, "CHECKPOINT")
        h = slots.slot_health(dsn, "rescued")
        assert not h.lost and h.wal_status in ("reserved", "extended"), h.wal_status


# --------------------------------------------------------------------------- publications


HOSTILE_SCHEMA = 'My.Schema"; DROP TABLE x; --'
HOSTILE_TABLE = "a b\"c;'d"
HOSTILE_PUB = 'pub "x"; DROP PUBLICATION y; --'
HOSTILE_COL = 'Col "1", x'


def test_ensure_publication_idempotent_with_hostile_names(fresh_db):
    q = quote_qualified(HOSTILE_SCHEMA, HOSTILE_TABLE)
    sql(fresh_db, f"CREATE SCHEMA {quote_ident(HOSTILE_SCHEMA)}")
    sql(fresh_db, f"CREATE TABLE {q} (id int PRIMARY KEY, {quote_ident(HOSTILE_COL)} text, secret text)")
    sql(fresh_db, "CREATE TABLE plain (id int PRIMARY KEY, v int)")
    sql(fresh_db, "CREATE TABLE later (id int PRIMARY KEY)")
    sql(fresh_db, "CREATE TABLE part (id int, k int) PARTITION BY RANGE (k)")
    sql(fresh_db, "CREATE TABLE part_1 PARTITION OF part FOR VALUES FROM (0) TO (10)")
    hostile = (HOSTILE_SCHEMA, HOSTILE_TABLE)
    hostile_name = f"{HOSTILE_SCHEMA}.{HOSTILE_TABLE}"

    with psycopg.connect(fresh_db, autocommit=True) as conn:
        r1 = publications.ensure_publication(
            conn, HOSTILE_PUB, [hostile, "public.plain"],
            column_lists={hostile: ["id", HOSTILE_COL]},
            row_filters={"public.plain": "v > 10"},
        )
        assert r1.created and r1.added == (hostile_name, "public.plain")
        rows = dict(
            ((s, t), (cols, flt)) for s, t, cols, flt in conn.execute(
                "SELECT schemaname, tablename, attnames, rowfilter FROM pg_publication_tables "
                "WHERE pubname = %s", (HOSTILE_PUB,)).fetchall()
        )
        assert rows[hostile][0] == ["id", HOSTILE_COL] and rows[hostile][1] is None
        assert rows[("public", "plain")][1] == "(v > 10)"

        # again: nothing to do, nothing changed
        r2 = publications.ensure_publication(
            conn, HOSTILE_PUB, [hostile, "public.plain"], row_filters={"public.plain": "(v > 10)"}
        )
        assert not r2.created and r2.added == () and r2.present == (hostile_name, "public.plain")
        assert r2.notes == ()
        # a different row filter is reported, never applied (no narrowing, no drop)
        r3 = publications.ensure_publication(conn, HOSTILE_PUB, ["plain", "later"],
                                      row_filters={"plain": "v > 99"})
        assert r3.added == ("public.later",) and r3.present == ("public.plain",)
        assert len(r3.notes) == 1 and "left as it is" in r3.notes[0]
        (flt,) = conn.execute("SELECT rowfilter FROM pg_publication_tables WHERE pubname = %s "
                              "AND tablename = 'plain'", (HOSTILE_PUB,)).fetchone()
        assert flt == "(v > 10)"
        n = conn.execute("SELECT count(*) FROM pg_publication_rel r JOIN pg_publication p "
                         "ON p.oid = r.prpubid WHERE p.pubname = %s", (HOSTILE_PUB,)).fetchone()[0]
        assert n == 3

        with pytest.raises(slots.PublicationConflict, match="FOR ALL\\s+TABLES"):
            publications.ensure_publication(conn, HOSTILE_PUB, all_tables=True)
        with pytest.raises(TableNotFound):
            publications.ensure_publication(conn, HOSTILE_PUB, ["public.nope"])
        with pytest.raises(ValueError):
            publications.ensure_publication(conn, "x", ["plain"], all_tables=True)

        # FOR ALL TABLES, idempotent; an empty publication
        assert publications.ensure_publication(conn, "everything", all_tables=True).created
        again = publications.ensure_publication(conn, "everything", ["plain"])
        assert not again.created and again.all_tables and again.present == ("public.plain",)
        assert publications.ensure_publication(conn, "empty").created
        assert publications.ensure_publication(conn, "empty", ["plain"]).added == ("public.plain",)

        # REPLICA IDENTITY FULL: hostile names, partitions, idempotent
        changed = publications.set_replica_identity_full(conn, [hostile, "part"])
        assert changed == [hostile_name, "public.part", "public.part_1"]
        assert publications.set_replica_identity_full(conn, [hostile, "part"]) == []
        idents = conn.execute(
            "SELECT relreplident::text FROM pg_class WHERE relname = ANY(%s)",
            ([HOSTILE_TABLE, "part", "part_1"],)).fetchall()
        assert {i for (i,) in idents} == {"f"}
        assert sql(fresh_db, "SELECT count(*) FROM pg_publication")[0][0] == 3  # nothing dropped


# --------------------------------------------------------------------------- CLI


# The library calls under the commands run on both versions above; the commands themselves
# (argument handling, output, exit codes) once, on PostgreSQL 18.
@pytest.mark.parametrize("pg_server", ["pg18"], indirect=True)
def test_cli_slot_publication_status(fresh_db, slot_name, s3, s3_bucket, cli):
    name = slot_name()
    password = fresh_db.server.password
    sql(fresh_db, "CREATE TABLE orders (id int PRIMARY KEY, total int)")

    proc = cli("publication", "ensure", "--dsn", fresh_db, "--name", "Pub One",
                 "--tables", "orders", "--row-filter", "public.orders=total > 0",
                 "--replica-identity-full")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["created"] and out["added"] == ["public.orders"]
    assert out["replica_identity_full"] == ["public.orders"]
    proc = cli("publication", "ensure", "--dsn", fresh_db, "--name", "Pub One", "--tables", "orders")
    assert proc.returncode == 0 and json.loads(proc.stdout)["present"] == ["public.orders"]

    proc = pgcdc("slot", "create", "--dsn", fresh_db, "--slot", name, "--two-phase")
    assert proc.returncode == 0, proc.stderr
    created = json.loads(proc.stdout)
    assert created["slot"] == name and created["two_phase"] and LSN.parse(created["consistent_point"])
    proc = cli("slot", "create", "--dsn", fresh_db, "--slot", name)
    assert proc.returncode == 1 and "already exists" in proc.stderr and "hint:" in proc.stderr

    proc = cli("slot", "list", "--dsn", fresh_db, "--json")
    listed = {s["slot"]: s for s in json.loads(proc.stdout)}
    assert listed[name]["plugin"] == "pgoutput" and listed[name]["two_phase"]
    proc = cli("slot", "list", "--dsn", fresh_db)
    assert proc.returncode == 0 and name in proc.stdout and "wal_status" in proc.stdout

    # status without and with a store; the store holds windows 0 and 1 committed and 2 in progress
    sql(fresh_db, "INSERT INTO orders SELECT g, g FROM generate_series(1, 1000) g")
    proc = cli("status", "--dsn", fresh_db, "--slot", name, "--publication", "Pub One", "--json")
    assert proc.returncode == 0, proc.stderr
    st = json.loads(proc.stdout)
    assert st["problem"] is None and st["slot"]["pending_bytes"] > 0 and "store" not in st
    assert st["slot"]["publication_exists"] is True

    client = s3.client()
    confirmed = st["slot"]["confirmed_flush_lsn"]
    windows = [("0/10", "0/20"), ("0/20", confirmed)]
    for seq, (start, end) in enumerate(windows):
        key = f"lake/{name}/changes/w={seq:012d}/_manifest.json"
        doc = {"format": 1, "window_seq": seq, "start_lsn": start, "end_lsn": end, "tables": {}}
        s3store.put_bytes(client, s3_bucket, key, json.dumps(doc).encode())
    s3store.put_bytes(client, s3_bucket, f"lake/{name}/changes/w={2:012d}/public.orders/v0000-part-00000.parquet", b"x")
    env = s3.aws_env()
    proc = pgcdc("status", "--dsn", fresh_db, "--slot", name, "--from", f"s3://{s3_bucket}/lake", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    store = json.loads(proc.stdout)["store"]
    assert store["windows_committed"] == 2 and store["uncommitted_folders"] == [2]
    assert store["last_window"]["window_seq"] == 1 and store["last_window"]["end_lsn"] == confirmed
    # without --delta, how many windows were merged is unknown, not "all of them"
    assert store["windows_not_merged"] is None and store["merged_through"] is None
    assert store["slot_vs_store"] == "in_sync"
    proc = cli("status", "--dsn", fresh_db, "--slot", name, "--from", f"s3://{s3_bucket}/lake", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "last window" in proc.stdout and f"1 [0/20, {confirmed})" in proc.stdout
    assert "2 committed, how many merged: unknown without --delta" in proc.stdout, proc.stdout
    assert "not acknowledged" in proc.stdout

    # an empty store: none / 0
    store = committed_windows(client, f"s3://{s3_bucket}/other", name)
    assert store["windows_committed"] == 0 and store["last_window"] is None and store["windows_not_merged"] == 0

    # the slot acknowledged beyond the store: changes are missing, exit 1
    sql(fresh_db, "SELECT pg_replication_slot_advance(%s, pg_current_wal_insert_lsn())", (name,))
    proc = cli("status", "--dsn", fresh_db, "--slot", name, "--from", f"s3://{s3_bucket}/lake", "--json", env=env)
    assert proc.returncode == 1 and json.loads(proc.stdout)["store"]["slot_vs_store"] == "slot_ahead"

    proc = cli("slot", "drop", "--dsn", fresh_db, "--slot", name)
    assert proc.returncode == 0 and json.loads(proc.stdout)["dropped"] is True
    proc = pgcdc("slot", "drop", "--dsn", fresh_db, "--slot", name)
    assert proc.returncode == 1 and "does not exist" in proc.stderr
    proc = cli("slot", "drop", "--dsn", fresh_db, "--slot", name, "--if-exists")
    assert proc.returncode == 0 and json.loads(proc.stdout)["dropped"] is False
    proc = cli("status", "--dsn", fresh_db, "--slot", name)
    assert proc.returncode == 1 and f"replication slot '{name}' does not exist" in proc.stderr
    for p in (proc,):
        assert password not in p.stdout + p.stderr
