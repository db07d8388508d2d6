"""No password and no S3 secret key on any command line (``ps`` shows them to every user of
the host) while the CLI's drains, snapshots and merges run, with every process they start
(snapshot workers, the Spark JVM and its Python workers), against real servers."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict
from test_drain import sql

from airflow_pgcdc.merge.jars import unavailable_reason


def _command_lines() -> list[str]:
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                out.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace"))
            except OSError:
                continue
    return out


class PsWatch:
    """Reads every process's command line, again and again, until stopped."""

    def __init__(self, secrets: list[str]):
        self.secrets = [s for s in secrets if s]
        self.hits: list[str] = []
        self.scans = 0
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            for line in _command_lines():
                if any(s in line for s in self.secrets):
                    self.hits.append(line[:300])
            self.scans += 1
            time.sleep(0.05)

    def __enter__(self):
        self._th.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._th.join()


def test_no_secret_on_any_command_line(fresh_db, slot_name, s3, s3_bucket):
    if fresh_db.server.version_num < 180000:
        pytest.skip("command lines do not depend on the server's version: checked on PostgreSQL 18")
    password = conninfo_to_dict(fresh_db).get("password")
    secret = s3.aws_env()["AWS_SECRET_ACCESS_KEY"]
    assert password and secret
    slot = slot_name()
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(fresh_db, "INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 20000) g")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    env = {**os.environ, **s3.aws_env(), "PGCDC_DSN": str(fresh_db)}
    src, lake = f"s3://{s3_bucket}/cdc", f"s3://{s3_bucket}/lake"

    def pgcdc(*args, extra=None):
        p = subprocess.run([sys.executable, "-m", "airflow_pgcdc.cli", *args], env={**env, **(extra or {})},
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        assert password not in p.stdout + p.stderr and secret not in p.stdout + p.stderr
        assert "warning: the password is on the command line" not in p.stderr
        return p

    with PsWatch([password, secret]) as watch:
        pgcdc("snapshot", "--slot", slot, "--publication", "pub", "--to", src, "--workers", "2",
              "--rows-per-part", "5000")
        sql(fresh_db, "UPDATE t SET v = 'x' WHERE id % 100 = 0")
        pgcdc("drain", "--slot", slot, "--publication", "pub", "--to", src,
              extra={"PGCDC_PAUSE": "after-parts", "PGCDC_PAUSE_SECONDS": "1"})
        # one Spark job: Spark's Python workers get the S3 settings (the python reader: the path
        # a big table takes) and, with Delta's Spark engine, the JVM's S3A gets them too (it
        # writes the Delta table through s3a); without the jars, the default engine with
        # --driver-rows 0 (the Python workers' path only). Until session 23 two jobs, ~30 s each
        engine = (["--engine", "delta-spark"] if unavailable_reason() is None else ["--driver-rows", "0"])
        pgcdc("merge", "--from", src, "--slot", slot, "--delta", lake, "--master", "local[1]", *engine)
    assert watch.scans > 10
    assert watch.hits == [], watch.hits[:3]
    # the check itself sees a secret on a command line
    with PsWatch([password]) as watch:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)", f"password={password}"])
        proc.wait()
    assert watch.hits, "the watcher finds a password on a command line"
