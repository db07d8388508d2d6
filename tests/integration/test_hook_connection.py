"""The ``pgcdc`` connection's Test button: ``PgcdcHook.test_connection`` against real
servers (what a pipeline needs of the server and the role), and ``airflow connections
test`` through Airflow's own connection and provider machinery."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys

import psycopg
import pytest
from matrix import on_pg18
from psycopg.conninfo import conninfo_to_dict

from airflow_pgcdc.hooks.pgcdc import PgcdcHook
from airflow_pgcdc.protocol.quoting import quote_ident, quote_literal


def _conn_env(dsn: str, **extra) -> str:
    d = conninfo_to_dict(dsn)
    return json.dumps({"conn_type": "pgcdc", "host": d["host"], "port": int(d["port"]), "login": d["user"],
                       "password": d.get("password"), "schema": d["dbname"], "extra": extra})


@pytest.fixture
def plain_role(pg_server):
    """A role that may log in but not replicate (neither REPLICATION nor superuser)."""
    name, password = f"plain_{secrets.token_hex(4)}", secrets.token_urlsafe(12)
    with psycopg.connect(pg_server.dsn, autocommit=True) as c:
        c.execute(f"CREATE ROLE {quote_ident(name)} LOGIN PASSWORD {quote_literal(password)}")
    yield pg_server.make_dsn(user=name, password=password)
    with psycopg.connect(pg_server.dsn, autocommit=True) as c:
        c.execute(f"DROP ROLE {quote_ident(name)}")


def test_the_hook_tests_what_a_pipeline_needs(pg_server, plain_role, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_PG_OK", _conn_env(pg_server.repl_dsn))
    ok, message = PgcdcHook("pg_ok").test_connection()
    assert ok, message
    assert message.startswith(f"PostgreSQL {pg_server.version_num // 10000}.") and "wal_level logical" in message
    assert "role pgcdc_repl may replicate" in message and "replication slot(s) free" in message

    # a role that can log in but not replicate: refused, saying what to grant
    monkeypatch.setenv("AIRFLOW_CONN_PG_PLAIN", _conn_env(plain_role))
    ok, message = PgcdcHook("pg_plain").test_connection()
    user = conninfo_to_dict(plain_role)["user"]
    assert not ok and f'may not replicate (ALTER ROLE "{user}" REPLICATION' in message, message

    # a wrong password: refused, and the message holds no password
    wrong = pg_server.make_dsn(user="pgcdc_repl", password="not-" + pg_server.repl_password)
    monkeypatch.setenv("AIRFLOW_CONN_PG_WRONG", _conn_env(wrong))
    ok, message = PgcdcHook("pg_wrong").test_connection()
    assert not ok and "password authentication failed" in message, message
    assert conninfo_to_dict(wrong)["password"] not in message and "password=***" in message


@on_pg18("the connection test reads the same catalog on every supported server")
def test_airflow_connections_test_uses_the_hook(pg_server, plain_role, tmp_path):
    """Through Airflow's CLI: a role that may replicate passes; one that may only log in
    fails with the hook's reason (a bare connection test would have passed it)."""
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__CORE__TEST_CONNECTION": "Enabled", "AIRFLOW_CONN_PG_CDC": _conn_env(pg_server.repl_dsn),
           "AIRFLOW_CONN_PG_PLAIN": _conn_env(plain_role)}

    def airflow_test(conn_id: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "airflow", "connections", "test", conn_id], env=env,
                              capture_output=True, text=True, timeout=180)
        return proc.stdout + proc.stderr

    out = airflow_test("pg_cdc")
    assert "Connection success!" in out, out[-3000:]
    out = airflow_test("pg_plain")
    assert "Connection failed!" in out and "may not replicate" in out, out[-3000:]
    assert conninfo_to_dict(plain_role)["password"] not in out
