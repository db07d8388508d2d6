"""Child processes of the test bed and the sandbox: free ports, spawning a server in its
own process group that dies with its parent (or detached), waiting for and killing it,
running as the ``postgres`` user when we are root, temporary directories that a later run
reaps, and the registry of live servers stopped at exit. No third-party import."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import pwd
import random
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow_pgcdc.errors import HintedError
from airflow_pgcdc.lake.lock import process_start

__all__ = [
    "MAKE_HINT",
    "SandboxError",
    "chown_tree",
    "free_port",
    "kill_group",
    "live_servers",
    "make_temp_base",
    "minimal_env",
    "pid_alive",
    "pid_runs",
    "postgres_run_as",
    "reap_stale_temp_dirs",
    "register_live",
    "spawn",
    "tail_of",
    "traversable_by",
    "wait_gone",
]

MAKE_HINT = "run `make test` (or `make setup`), which installs PostgreSQL 15, pglogical and wal2json"


class SandboxError(HintedError):
    """A local server could not be started, reached or stopped.

    ``hint`` says what the user can do about it (shown by the CLI).
    """



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


def tail_of(path: Path | None, lines: int = 40) -> str:
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


def pid_alive(pid: int | None) -> bool:
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


def pid_runs(pid: int | None, exe: Path, marker: str | None = None) -> bool:
    """True if ``pid`` is alive, runs ``exe`` and (if given) has ``marker`` in its command line."""
    if not pid_alive(pid):
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


def wait_gone(pid: int, popen: subprocess.Popen | None, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if popen is not None:
            if popen.poll() is not None:
                return True
        elif not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


def kill_group(pid: int) -> None:
    """SIGKILL ``pid``'s process group if it leads one (our servers do), else just ``pid``."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)


_libc: Any = None


def _die_with_parent(sig: int):
    """A preexec_fn: the child gets ``sig`` when the process that started it dies.

    The snapshot workers have their own (:func:`airflow_pgcdc.snapshot.workers._die_with_parent`,
    which runs in the forked worker itself, always SIGKILL); see there why the two stay apart."""
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


def postgres_run_as() -> _RunAs | None:
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


def traversable_by(path: Path, run_as: _RunAs | None) -> bool:
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


def chown_tree(path: Path, run_as: _RunAs | None) -> None:
    if run_as is None:
        return
    os.chown(path, run_as.uid, run_as.gid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(root, name), run_as.uid, run_as.gid, follow_symlinks=False)


def minimal_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of server processes: no AWS keys or PG passwords inherited."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C", "TZ": "UTC"}
    if extra:
        env.update(extra)
    return env


live_servers: weakref.WeakSet = weakref.WeakSet()


_atexit_registered = False


_OWNER_FILE = "owner.json"


_TEMP_PREFIX = "pgcdc-testbed-"


def register_live(server: Any) -> None:
    global _atexit_registered
    live_servers.add(server)
    if not _atexit_registered:
        atexit.register(_stop_all_live)
        _atexit_registered = True


def _stop_all_live() -> None:
    for server in list(live_servers):
        with contextlib.suppress(Exception):
            server.close(mode="immediate")


def make_temp_base(kind: str) -> Path:
    """A fresh temp dir recording its owner, after removing those whose owner is gone."""
    reap_stale_temp_dirs()
    base = Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{kind}-"))
    owner = {"pid": os.getpid(), "start": process_start(os.getpid())}
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
        if pid_alive(pid) and process_start(pid) == owner.get("start"):
            continue
        for pidfile in base.glob("*/postmaster.pid"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                stale = int(pidfile.read_text().splitlines()[0])
                exe = Path(os.readlink(f"/proc/{stale}/exe"))
                # the postmaster's command line names its data dir: not a reused pid
                if exe.name == "postgres" and pid_runs(stale, exe, str(base)):
                    kill_group(stale)
        with contextlib.suppress(OSError, ValueError):
            stale = int((base / "weed.pid").read_text())
            exe = Path(os.readlink(f"/proc/{stale}/exe"))
            if exe.name == "weed" and pid_runs(stale, exe, str(base)):
                kill_group(stale)
        shutil.rmtree(base, ignore_errors=True)
        removed.append(base)
    return removed


def spawn(
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
            "env": dict(env) if env is not None else minimal_env(),
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

