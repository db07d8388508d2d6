"""pg.conninfo.unverified_tls: a warning when a remote host is reached with an sslmode that
does not verify the server (the drain and the snapshot log it)."""

from __future__ import annotations

import pytest

from airflow_pgcdc.pg.conninfo import unverified_tls


@pytest.mark.parametrize(("dsn", "env", "warns"), [
    ("host=db.example.com dbname=app", {}, True),  # libpq's default: prefer
    ("host=db.example.com sslmode=require", {}, True),
    ("postgresql://u@db.example.com/app?sslmode=verify-full", {}, False),
    ("host=db.example.com sslmode=verify-ca", {}, False),
    ("host=db.example.com", {"PGSSLMODE": "verify-full"}, False),
    ("dbname=app", {"PGHOST": "10.0.0.5"}, True),
    ("host=127.0.0.1 sslmode=disable", {}, False),
    ("host=localhost", {}, False),
    ("host=/var/run/postgresql", {}, False),
    ("host=localhost,db2.example.com sslmode=prefer", {}, True),
    ("hostaddr=192.0.2.7 sslmode=allow", {}, True),
])
def test_unverified_tls(dsn, env, warns):
    message = unverified_tls(dsn, environ=env)
    assert (message is not None) == warns, message
    if warns:
        assert "does not verify the server" in message and "verify-full" in message
