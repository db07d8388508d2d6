"""What a ``pgcdc`` command says when something outside it fails, against real servers:
a port that accepts connections but is not PostgreSQL (before: ~130 s of silence, then
"unexpected OperationalError"), a database that refuses the login, a bucket that does not
exist (before: "unexpected ClientError"). One line naming the part that failed, a hint,
exit 1, and no password."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

from psycopg.conninfo import conninfo_to_dict, make_conninfo


def pgcdc(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow_pgcdc.cli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PGCDC_VERBOSE": "", **env})


def test_unreachable_database_and_missing_bucket_are_named(fresh_db, slot_name, s3):
    # a server that accepts and never answers: libpq waits for it until connect_timeout
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        silent.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(silent.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        dsn = make_conninfo("", host="127.0.0.1", port=silent.getsockname()[1], dbname="x", user="x")
        proc = pgcdc("status", "--slot", "s", env={"PGCDC_DSN": dsn, "PGCONNECT_TIMEOUT": "2"})
    finally:
        stop.set()
        t.join()
        for c in held:
            c.close()
        silent.close()
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("pgcdc: error: PostgreSQL: ") and "unexpected" not in proc.stderr, proc.stderr
    assert "hint: check the DSN" in proc.stderr and "PGCONNECT_TIMEOUT" in proc.stderr

    # a wrong password: named, and the password is not printed
    params = conninfo_to_dict(str(fresh_db))
    wrong = make_conninfo("", **{**params, "password": "not-the-password-" + "x" * 8})
    proc = pgcdc("status", "--slot", "s", env={"PGCDC_DSN": wrong})
    assert proc.returncode == 1 and proc.stderr.startswith("pgcdc: error: PostgreSQL: "), proc.stderr
    assert "not-the-password" not in proc.stderr and params.get("password", "-") not in proc.stderr

    # a store in a bucket that does not exist
    slot = slot_name()
    sql_dsn = str(fresh_db)
    import psycopg

    with psycopg.connect(sql_dsn, autocommit=True) as c:
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    proc = pgcdc("status", "--slot", slot, "--store", "s3://no-such-bucket-pgcdc/cdc",
                 env={"PGCDC_DSN": sql_dsn, **s3.aws_env()})
    assert proc.returncode == 1 and proc.stderr.startswith("pgcdc: error: S3: "), proc.stderr
    assert "NoSuchBucket" in proc.stderr and "unexpected" not in proc.stderr, proc.stderr
