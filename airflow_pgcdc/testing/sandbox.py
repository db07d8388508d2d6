"""Real servers on this machine: PostgreSQL (15 or 18) and an S3 server (SeaweedFS).

Used two ways:

- by the test bed (``tests/conftest.py``): :class:`PostgresServer` and :class:`S3Server`
  start in temporary directories, on free ports, as children of the test process that
  die with it (own process group, parent-death signal, ``atexit``);
- by ``pgcdc sandbox up|env|down`` (:class:`Sandbox`): the same servers, detached, with
  their state under ``.pgcdc/`` in the current directory; ``up --spark`` adds a Spark
  standalone cluster (:class:`airflow_pgcdc.testing.spark.SparkCluster`).

Starting and stopping need no third-party module. The one-time role setup and
:meth:`PostgresServer.execute` use psycopg; :meth:`S3Server.create_bucket` uses boto3.
No Airflow import here.

Passwords and secret keys are generated at random, kept in memory or in a 0600 state
file, and never logged nor shown in ``repr``. The role passwords reach PostgreSQL as
SCRAM verifiers computed client side, so even the server log cannot hold them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from airflow_pgcdc.testing.postgres import PostgresServer, pg_bin_dir, pg_build_has_ssl
from airflow_pgcdc.testing.processes import (
    SandboxError,
    chown_tree,
    free_port,
    postgres_run_as,
    traversable_by,
)
from airflow_pgcdc.testing.s3 import S3Server

__all__ = [
    "Sandbox",
]

class Sandbox:
    """``pgcdc sandbox``: PostgreSQL + S3, detached, state under ``<root>`` (``.pgcdc/``).

    ``root/state.json`` (mode 0600) holds the flavour, ports, pids, directories and
    credentials. Data survive :meth:`down` (the next :meth:`up` reuses them) unless
    ``purge=True``.
    """

    BUCKET = "pgcdc"

    def __init__(self, root: str | os.PathLike = ".pgcdc") -> None:
        self.root = Path(root).absolute()
        self.state_file = self.root / "state.json"

    # ---- state

    def _make_root(self) -> None:
        if not self.root.is_dir():
            self.root.mkdir(parents=True, exist_ok=True)
            # searchable, not listable: PostgreSQL runs as `postgres` when we are root
            os.chmod(self.root, 0o711)

    def _load(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return None
        except ValueError as e:
            raise SandboxError(
                f"the sandbox state {self.state_file} is unreadable: {e}",
                hint="run `pgcdc sandbox down --purge` to start over",
            ) from None

    def _save(self, state: Mapping[str, Any]) -> None:
        self._make_root()
        tmp = self.state_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(state, f, indent=2)
        os.replace(tmp, self.state_file)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self._make_root()
        gitignore = self.root / ".gitignore"
        if not gitignore.exists():
            gitignore.write_text("*\n")
        with open(self.root / "lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _servers(self, state: Mapping[str, Any]) -> tuple[PostgresServer, S3Server]:
        pg_state, s3_state = state["postgres"], state["s3"]
        pg = PostgresServer(
            state["flavour"],
            base_dir=pg_state["base_dir"],
            port=pg_state["port"],
            password=pg_state["password"],
            repl_password=pg_state["repl_password"],
            ssl=pg_state["ssl"],
            detached=True,
            log_file=self.root / "postgres.log",
        )
        s3 = S3Server(
            base_dir=s3_state["base_dir"],
            ports=s3_state["ports"],
            access_key=s3_state["access_key"],
            secret_key=s3_state["secret_key"],
            region=s3_state["region"],
            detached=True,
            log_file=self.root / "weed.log",
        )
        return pg, s3

    # ---- API

    @property
    def flavour(self) -> str | None:
        state = self._load()
        return state["flavour"] if state else None

    def status(self) -> dict[str, Any]:
        """``{"exists": bool, "flavour": ..., "postgres": bool, "s3": bool, "spark": bool|None}``
        (running flags; ``spark`` is ``None`` for a sandbox started without ``--spark``)."""
        state = self._load()
        if not state:
            return {"exists": False, "flavour": None, "postgres": False, "s3": False, "spark": None}
        pg, s3 = self._servers(state)
        cluster = self._spark(state)
        return {"exists": True, "flavour": state["flavour"], "postgres": pg.running, "s3": s3.running,
                "spark": None if cluster is None else cluster.running}

    def _spark(self, state: Mapping[str, Any]):
        """The sandbox's Spark cluster (``None`` when it has none)."""
        if not state.get("spark"):
            return None
        from airflow_pgcdc.testing.spark import SparkCluster

        return SparkCluster(base_dir=state["spark"]["base_dir"], detached=True, state=state["spark"])

    def is_up(self) -> bool:
        st = self.status()
        return st["postgres"] and st["s3"]

    def up(self, flavour: str | None = None, *, spark: bool = False) -> tuple[dict[str, str], bool]:
        """Start PostgreSQL and S3 (and with ``spark``, a Spark standalone cluster: a Master
        and 2 Workers) in the background; return ``(env, started)``.

        A no-op (``started`` False) when the sandbox is already up. A stopped sandbox
        restarts on its kept data; ``flavour`` must then match (default: the kept one,
        or ``pg18`` for a new sandbox). A sandbox that ran with Spark starts it again.
        """
        with self._locked():
            state = self._load()
            if state and flavour and state["flavour"] != flavour:
                raise SandboxError(
                    f"this sandbox holds a {state['flavour']} cluster, not {flavour}",
                    hint="run `pgcdc sandbox down --purge` first to replace it",
                )
            if state:
                pg, s3 = self._servers(state)
                cluster = self._spark(state)
                spark_up = cluster.running if cluster is not None else not spark
                if pg.running and s3.running and spark_up:
                    return self._env(state), False
            else:
                state = self._new_state(flavour or "pg18")
                pg, s3 = self._servers(state)
            try:
                self._start_one(pg, state["postgres"], "port", lambda: pg.port)
                self._start_one(s3, state["s3"], "ports", lambda: s3.ports)
                state["postgres"]["pid"] = pg.pid
                state["s3"]["pid"] = s3.pid
                self._save(state)
                s3.create_bucket(self.BUCKET)
                if spark or state.get("spark"):
                    self._start_spark(state)
            except BaseException:
                with contextlib.suppress(Exception):
                    s3.stop()
                with contextlib.suppress(Exception):
                    pg.stop("fast")
                raise
            return self._env(state), True

    def _start_spark(self, state: dict[str, Any]) -> None:
        from airflow_pgcdc.testing.spark import SparkCluster

        cluster = self._spark(state)
        if cluster is not None and cluster.running:
            return
        if cluster is not None:
            cluster.stop()
        cluster = SparkCluster(base_dir=self.root / "spark", detached=True)  # new free ports
        cluster.start()
        state["spark"] = cluster.state()
        self._save(state)

    @staticmethod
    def _start_one(server: Any, entry: dict[str, Any], key: str, current: Any) -> None:
        """Start on the recorded port(s); if taken, on new ones (recorded)."""
        try:
            server.start()
        except SandboxError:
            if "already in use" not in server.log_tail(60).lower() and "could not bind" not in server.log_tail(60):
                raise
            if key == "port":
                server.port, server._port_given = free_port(), False
            else:
                server.ports, server._ports_given = server.pick_ports(), False
            server.start()
        entry[key] = current()

    def _new_state(self, flavour: str) -> dict[str, Any]:
        self._make_root()
        bin_dir = pg_bin_dir(flavour)  # fail early, with the hint, if binaries are missing
        run_as = postgres_run_as()
        pg_base = self.root / flavour
        if not traversable_by(self.root, run_as) or len(str(pg_base / "sock")) > 80:
            # e.g. root running in /root/project: PostgreSQL runs as `postgres` and
            # cannot reach it, so its directory lives in /tmp (recorded in the state).
            pg_base = Path(tempfile.mkdtemp(prefix="pgcdc-sandbox-"))
            os.chmod(pg_base, 0o755)
        if run_as is not None:
            pg_base.mkdir(exist_ok=True)
            chown_tree(pg_base, run_as)
        return {
            "format": 1,
            "flavour": flavour,
            "postgres": {
                "base_dir": str(pg_base),
                "port": free_port(),
                "password": secrets.token_urlsafe(18),
                "repl_password": secrets.token_urlsafe(18),
                "ssl": pg_build_has_ssl(bin_dir),
            },
            "s3": {
                "base_dir": str(self.root / "s3"),
                "ports": S3Server.pick_ports(),
                "access_key": "PGCDC" + secrets.token_hex(8).upper(),
                "secret_key": secrets.token_urlsafe(30),
                "region": "us-east-1",
            },
        }

    def env(self) -> dict[str, str]:
        """The environment variables that point clients at the running sandbox."""
        state = self._load()
        if not state:
            raise SandboxError("there is no sandbox here", hint="run `pgcdc sandbox up`")
        pg, s3 = self._servers(state)
        if not (pg.running and s3.running):
            raise SandboxError("the sandbox is not running", hint="run `pgcdc sandbox up`")
        return self._env(state)

    def _env(self, state: Mapping[str, Any]) -> dict[str, str]:
        pg, s3 = self._servers(state)
        env = {
            "PGCDC_SANDBOX": str(self.root),
            "PGCDC_DSN": pg.dsn,
            "PGCDC_REPL_DSN": pg.repl_dsn,
            "PGHOST": "127.0.0.1",
            "PGPORT": str(pg.port),
            "PGDATABASE": pg.dbname,
            "PGUSER": pg.user,
            "PGPASSWORD": pg.password,
        }
        if pg.ca_file is not None:
            env["PGSSLROOTCERT"] = str(pg.ca_file)
        env.update(s3.aws_env())
        env["PGCDC_S3_BUCKET"] = self.BUCKET
        if state.get("spark"):
            env["PGCDC_SPARK_MASTER"] = state["spark"]["master_url"]
        return env

    def down(self, *, purge: bool = False) -> bool:
        """Stop both servers; True if something was running. Safe to call twice.

        ``purge`` also removes the data and the state (the next ``up`` starts afresh).
        """
        if not self.root.exists():
            return False
        with self._locked():
            try:
                state = self._load()
            except SandboxError:
                if not purge:
                    raise
                state = None  # unreadable state: purge what we can
            stopped = False
            if state:
                pg, s3 = self._servers(state)
                cluster = self._spark(state)
                stopped = pg.running or s3.running or (cluster is not None and cluster.running)
                errors = []
                stops = [s3.stop, lambda: pg.stop("fast")] + ([cluster.stop] if cluster is not None else [])
                for stop in stops:
                    try:
                        stop()
                    except Exception as e:  # stop both even if one fails
                        errors.append(e)
                if errors:
                    raise errors[0]
                if purge:
                    s3.purge()
                    shutil.rmtree(pg.base_dir, ignore_errors=True)  # may be outside root
        if purge:
            shutil.rmtree(self.root, ignore_errors=True)
        return stopped

