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


def confirmed(dsn, slot) -> LSN:
    return LSN.parse(sql(dsn.socket_dsn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                         "WHERE slot_name = %s", (slot,))[0][0])


def test_peek_prints_json_lines_and_acks_only_when_asked(fresh_db, slot_name):
    s = slot_name()
    sql(fresh_db, "CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(8,2), tags text[], b bytea, "
                  "ok bool, f float8, j jsonb)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE items")
    created = peek("--dsn", fresh_db, "--slot", s, "--create-slot", "--publication", "pub", "--idle-timeout", "1")
    assert created.stdout == ""
    start = confirmed(fresh_db, s)
    sql(fresh_db, "INSERT INTO items VALUES (1, 'caf\u00e9 \"quoted\"', 9.99, '{a,NULL}', '\\x00ff', true, 'NaN', "
                  "'{\"k\": [1, 2]}'), (2, NULL, NULL, NULL, NULL, NULL, 1.5, NULL)")
    sql(fresh_db, "UPDATE items SET price = 10 WHERE id = 1")
    sql(fresh_db, "DELETE FROM items WHERE id = 2")
    target = LSN.parse(sql(fresh_db, "SELECT pg_current_wal_insert_lsn()::text")[0][0])
    args = ["--dsn", fresh_db, "--slot", s, "--publication", "pub", "--until-lsn", str(target)]

    # the protocol view: every decoded message, values as sent
    first = lines(peek(*args, "--protocol"))
    types = [m["type"] for m in first]
    assert types == ["begin", "relation", "insert", "insert", "commit",
                     "begin", "update", "commit", "begin", "delete", "commit"]
    ins = first[2]
    assert ins["new"][:5] == [
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
    # by default nothing is acknowledged: the slot did not move, the same messages come again
    assert confirmed(fresh_db, s) == start
    assert lines(peek(*args, "--protocol", "--no-ack")) == first

    # the default view: one line per row change, named and typed
    rows = lines(peek(*args))
    assert [(r["op"], r["table"]) for r in rows] == [
        ("insert", "public.items"), ("insert", "public.items"), ("update", "public.items"), ("delete", "public.items")]
    assert rows[0]["row"] == {"id": 1, "name": 'café "quoted"', "price": "9.99", "tags": "{a,NULL}", "b": "\\x00ff",
                              "ok": True, "f": "NaN", "j": {"k": [1, 2]}}
    assert rows[1]["row"]["f"] == 1.5 and rows[1]["row"]["name"] is None
    assert rows[0]["commit_lsn"] == first[0]["final_lsn"] and rows[0]["xid"] == first[0]["xid"]
    assert rows[2]["row"]["price"] == "10.00" and "key" not in rows[2]  # the key did not change: no old key
    assert rows[3]["key"] == {"id": 2} and "row" not in rows[3]
    assert confirmed(fresh_db, s) == start

    # --ack on a slot this run did not create needs --force-ack: refused, nothing moved
    refused = peek(*args, "--ack", check=False)
    assert refused.returncode == 1 and "--force-ack" in refused.stderr and refused.stdout == "", refused.stderr
    assert confirmed(fresh_db, s) == start
    # --ack --force-ack: acknowledged after printing; the slot ends at the last commit's end
    assert lines(peek(*args, "--protocol", "--ack", "--force-ack")) == first
    assert confirmed(fresh_db, s) == LSN.parse(first[-1]["end_lsn"])
    quiet = peek("--dsn", fresh_db, "--slot", s, "--publication", "pub", "--idle-timeout", "1.5", "--quiet-after", "0.5")
    assert quiet.stdout == "" and "waiting for changes on slot" in quiet.stderr, quiet.stderr


def test_peek_acks_a_slot_it_created_with_ack_alone(fresh_db, slot_name):
    s = slot_name()
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    out = peek("--dsn", fresh_db, "--slot", s, "--create-slot", "--ack", "--publication", "pub", "--idle-timeout", "1")
    assert out.returncode == 0 and out.stdout == ""
    refused = peek("--dsn", fresh_db, "--slot", s, "--ack", "--publication", "pub", "--idle-timeout", "1", check=False)
    assert refused.returncode == 1 and "--force-ack" in refused.stderr


def test_peek_max_messages_and_logical_messages(fresh_db, slot_name):
    s = slot_name()
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    peek("--dsn", fresh_db, "--slot", s, "--create-slot", "--publication", "pub", "--idle-timeout", "0.5")
    sql(fresh_db, "SELECT pg_logical_emit_message(false, 'pgcdc/test', 'hello')")
    sql(fresh_db, "INSERT INTO t VALUES (1)")
    out = lines(peek("--dsn", fresh_db, "--slot", s, "--publication", "pub", "--messages", "--max-messages", "2",
                     "--protocol"))
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
