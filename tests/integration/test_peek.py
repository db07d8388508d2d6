"""`pgcdc peek` end to end: a real server, the console script, JSON lines out."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg

from airflow_pgcdc.protocol.lsn import LSN


def sql(dsn, query, params=None):
    with psycopg.connect(dsn, autocommit=True) as c:
        cur = c.execute(query, params)
        return cur.fetchall() if cur.description else None


def peek(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``pgcdc peek``; a ``--dsn`` goes through ``PGCDC_DSN`` (the password stays off argv)."""
    args, env = list(args), {**os.environ, "PGCDC_VERBOSE": ""}
    if "--dsn" in args:
        at = args.index("--dsn")
        env["PGCDC_DSN"] = args[at + 1]
        del args[at:at + 2]
    cmd = [sys.executable, "-m", "airflow_pgcdc.cli", "peek", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def lines(proc) -> list[dict]:
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_peek_prints_json_lines_and_acks_only_when_asked(fresh_db, slot_name):
    s = slot_name()
    sql(fresh_db, "CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(8,2), tags text[], b bytea)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE items")
    created = peek("--dsn", fresh_db, "--slot", s, "--create-slot", "--publication", "pub", "--idle-timeout", "1")
    assert created.stdout == ""
    sql(fresh_db, "INSERT INTO items VALUES (1, 'caf\u00e9 \"quoted\"', 9.99, '{a,NULL}', '\\x00ff'), (2, NULL, NULL, NULL, NULL)")
    sql(fresh_db, "UPDATE items SET price = 10 WHERE id = 1")
    sql(fresh_db, "DELETE FROM items WHERE id = 2")
    target = LSN.parse(sql(fresh_db, "SELECT pg_current_wal_insert_lsn()::text")[0][0])
    args = ["--dsn", fresh_db, "--slot", s, "--publication", "pub", "--until-lsn", str(target)]

    first = lines(peek(*args, "--no-ack"))
    types = [m["type"] for m in first]
    assert types == ["begin", "relation", "insert", "insert", "commit",
                     "begin", "update", "commit", "begin", "delete", "commit"]
    ins = first[2]
    assert ins["new"] == [
        {"kind": "t", "value": "1"},
        {"kind": "t", "value": 'café "quoted"'},
        {"kind": "t", "value": "9.99"},
        {"kind": "t", "value": "{a,NULL}"},
        {"kind": "t", "value": "\\x00ff"},
    ]
    assert first[3]["new"][1] == {"kind": "n", "value": None}
    assert first[9]["key"][0] == {"kind": "t", "value": "2"}
    assert first[1]["relation_name"] == "items" and first[1]["namespace"] == "public"
    assert all(isinstance(LSN.parse(m["end_lsn"]), LSN) for m in first if m["type"] == "commit")

    # --no-ack: the slot did not move, the same messages come again
    assert lines(peek(*args, "--no-ack")) == first
    # default: acknowledged after printing; the slot ends at the last commit's end
    assert lines(peek(*args)) == first
    confirmed = sql(fresh_db.socket_dsn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (s,))[0][0]
    assert LSN.parse(confirmed) == LSN.parse(first[-1]["end_lsn"])
    assert peek("--dsn", fresh_db, "--slot", s, "--publication", "pub", "--idle-timeout", "1").stdout == ""


def test_peek_max_messages_and_logical_messages(fresh_db, slot_name):
    s = slot_name()
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    peek("--dsn", fresh_db, "--slot", s, "--create-slot", "--publication", "pub", "--idle-timeout", "0.5")
    sql(fresh_db, "SELECT pg_logical_emit_message(false, 'pgcdc/test', 'hello')")
    sql(fresh_db, "INSERT INTO t VALUES (1)")
    out = lines(peek("--dsn", fresh_db, "--slot", s, "--publication", "pub", "--messages", "--max-messages", "2", "--no-ack"))
    assert [m["type"] for m in out] == ["message", "begin"]
    assert out[0]["prefix"] == "pgcdc/test" and out[0]["transactional"] is False
    assert out[0]["content_text"] == "hello"


def test_peek_errors_are_one_line_with_exit_1(fresh_db):
    proc = peek("--dsn", fresh_db, "--slot", "no_such_slot", "--publication", "pub", "--idle-timeout", "1", check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("pgcdc: error: ERROR: replication slot \"no_such_slot\" does not exist")
    assert "Traceback" not in proc.stderr
    assert fresh_db.server.password not in proc.stderr
    usage = peek("--dsn", fresh_db, "--slot", "x", check=False)
    assert usage.returncode == 2 and "--publication" in usage.stderr
