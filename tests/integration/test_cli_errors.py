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

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo


def pgcdc(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow_pgcdc.cli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PGCDC_VERBOSE": "", **env})


@pytest.mark.parametrize("pg_server", ["pg18"], indirect=True)  # the CLI's labels: no server difference
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


@pytest.mark.parametrize("pg_server", ["pg18"], indirect=True)  # one check of server_encoding at connect: no server difference
def test_a_sql_ascii_database_is_refused_up_front(pg_server, slot_name, store):
    """A SQL_ASCII database: before, the snapshot failed deep inside with ``operator does not
    exist: name = bytea``; now the snapshot, the drain and verify refuse it up front
    (``UnsupportedEncoding``), before a slot is created."""
    import psycopg
    import pytest

    from airflow_pgcdc.drain.drain import drain_window
    from airflow_pgcdc.pg.catalog import UnsupportedEncoding
    from airflow_pgcdc.snapshot.export import snapshot_to_s3
    from airflow_pgcdc.verify import verify_table

    client, src, lake = store
    name = "t_sql_ascii_" + slot_name("")[-12:]
    with psycopg.connect(pg_server.dsn, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}" ENCODING \'SQL_ASCII\' LC_COLLATE \'C\' LC_CTYPE \'C\' TEMPLATE template0')
    try:
        dsn = make_conninfo(pg_server.dsn, dbname=name)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t")
        slot = slot_name()
        with pytest.raises(UnsupportedEncoding, match="SQL_ASCII"):
            snapshot_to_s3(dsn, src, slot=slot, publications="pub", s3=client, workers=1,
                           worker_processes=False)
        with psycopg.connect(dsn, autocommit=True) as c:
            assert c.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                             (slot,)).fetchone()[0] == 0
        with pytest.raises(UnsupportedEncoding):
            drain_window(dsn, src, slot=slot, publications="pub", s3=client)
        import pyarrow as pa
        from deltalake import write_deltalake

        from airflow_pgcdc.lake.tables import delta_table_url
        from airflow_pgcdc.store.s3 import delta_storage_options

        write_deltalake(delta_table_url(lake, "public", "t"), pa.table({"id": [1], "v": ["a"]}),
                        storage_options=delta_storage_options())
        with pytest.raises(UnsupportedEncoding):
            verify_table(dsn, lake, "public", "t")
    finally:
        with psycopg.connect(pg_server.dsn, autocommit=True) as c:
            c.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
