"""Snapshot copy workers, each in its own process.

Why processes: a worker's receive loop (one libpq CopyData message per row, a Python
object each), its numpy decoding and its boto3 uploads hold the GIL most of the time, so
worker *threads* of one process do not add up: on the benchmark's table, 2 threads took
as long as 1 (4.30 s vs 4.45 s). Each worker process has its own interpreter, so N
workers use up to N cores.

Shape: the coordinator (:func:`~airflow_pgcdc.snapshot.export.snapshot_to_s3`) starts
the processes first thing, so their start-up (an interpreter, numpy, pyarrow, boto3)
overlaps its own connection and slot creation. One coordinator thread drives each
process over a socket pair with pickled messages (our own child, nothing else reads the
socket):

- coordinator → worker: ``("snapshot", dsn, snapshot_name)``: import the snapshot (the
  worker answers ``("ready",)`` once its session is in the snapshot's transaction, or
  ``("failed", retryable, message)``); ``("job", CopyJob)``: what the parts need;
  ``("part", SnapshotPart)``: copy it; ``None``: exit.
- worker → coordinator, per part: ``("rows", n)`` as batches are written (progress),
  then ``("done", result)`` or ``("failed", retryable, message)``.

A worker whose session failed closes it and imports the snapshot again before its next
part. A worker process that dies (killed, out of memory) is seen as end-of-file on its
socket: its part is retried by the coordinator's usual rules, on a new process. A worker
dies with its coordinator (``PR_SET_PDEATHSIG`` on Linux; elsewhere it exits at the
next message it cannot receive), so a killed coordinator leaves no copy running.

The DSN (with its password) and the S3 credentials travel only over the socket pair,
never on a command line or in the environment of the child.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from airflow_pgcdc.errors import PgcdcError
from airflow_pgcdc.pg.errors import AdminShutdown, ConnectionLost
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout
from airflow_pgcdc.store.s3 import S3Settings

START_TIMEOUT = 120.0
"""Seconds a new worker process has to import the snapshot before it counts as failed."""


class WorkerFailed(PgcdcError):
    """A part failed inside a worker process; ``retryable`` as the worker judged it
    (:func:`~airflow_pgcdc.snapshot.retryable` on the original exception)."""

    def __init__(self, message: str, *, retryable: bool, table_error: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.table_error = table_error  # a value of the table cannot be carried: that table alone fails


def table_error(exc: BaseException) -> bool:
    """A failure that is the table's own (a value the type map cannot carry): that table's
    copy fails, the others go on."""
    if isinstance(exc, WorkerFailed):
        return exc.table_error
    from airflow_pgcdc.typemap.map import ValueConversionError

    return isinstance(exc, ValueConversionError)


def retryable(exc: BaseException) -> bool:
    """Connection and storage failures are worth another worker's try; a conversion
    error or a server error about the query itself would fail again."""
    if isinstance(exc, WorkerFailed):
        return exc.retryable  # judged by this function in the worker process
    return isinstance(exc, (ConnectionLost, AdminShutdown, s3store.S3RequestError, s3store.UploadAborted, OSError))


class WorkerDied(WorkerFailed):
    """The worker process ended without answering (killed, crashed)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=True)


@dataclass(frozen=True)
class CopyJob:
    """What a worker needs for any part of this run (sent once, pickled)."""

    s3: S3Settings
    layout: Layout
    slot: str
    snapshot_id: str
    copy_format: str
    converters: dict  # table oid -> TableConverter


class _Forked:
    """The few :class:`subprocess.Popen` methods :class:`ProcessWorker` uses, for a child
    made by :func:`os.fork`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else: gone, status unknown
                self.returncode = 255
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.005)
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


class ProcessWorker:
    """One worker process and the socket to it. Not thread-safe: one coordinator thread
    drives it.

    The process is a :func:`os.fork` of this one when no other Python thread runs here
    (the CLI, before the copy starts): it starts at once with every module already
    imported. Otherwise (an Airflow task, where other threads may hold locks a forked
    child would inherit held; a replacement started from a coordinator thread) it is a
    fresh interpreter running this module, which costs about 0.3 s of imports.
    """

    def __init__(self, *, fork: bool | None = None) -> None:
        if fork is None:
            fork = hasattr(os, "fork") and threading.active_count() == 1
        ours, theirs = socket.socketpair()
        try:
            if fork:
                self.proc = _Forked(_fork_worker(ours, theirs))
            else:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "airflow_pgcdc.snapshot.workers", str(theirs.fileno())],
                    pass_fds=[theirs.fileno()],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,  # stdout is the CLI's (the manifest); errors go to stderr
                    close_fds=True,
                )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        self._closed = False
        self._broken = False  # its socket failed: the process is dead or dying

    @property
    def pid(self) -> int:
        return self.proc.pid

    def begin_import(self, dsn: str, snapshot_name: str) -> None:
        """Ask the worker to open its session inside the exported snapshot (answered by
        :meth:`end_import`: several workers import at once)."""
        self._send(("snapshot", str.__str__(dsn), str(snapshot_name)))  # plain str, whatever subclass came in

    def end_import(self) -> None:
        """Wait for the worker's session; raises :class:`WorkerFailed` if it has none."""
        msg = self._recv(START_TIMEOUT)
        if msg[0] == "failed":
            raise WorkerFailed(msg[2], retryable=msg[1])
        if msg != ("ready",):
            raise WorkerDied(f"worker process {self.pid} answered {msg[0]!r} to the snapshot import")

    def start_job(self, job: CopyJob) -> None:
        self._send(("job", job))

    def copy(self, part: Any, on_rows) -> tuple:
        """Copy ``part`` in the worker; ``on_rows(n)`` for each batch it writes. Returns
        the worker's result (see :func:`~airflow_pgcdc.snapshot.parts.copy_part`)."""
        self._send(("part", part))
        while True:
            msg = self._recv(None)
            kind = msg[0]
            if kind == "rows":
                on_rows(msg[1])
            elif kind == "done":
                return msg[1]
            elif kind == "failed":
                raise WorkerFailed(msg[2], retryable=msg[1], table_error=len(msg) > 3 and bool(msg[3]))
            else:
                raise WorkerDied(f"worker process {self.pid} sent an unknown message {kind!r}")

    @property
    def alive(self) -> bool:
        """Still able to take parts. A process killed a moment ago can close its socket
        before the kernel reports it exited: a failed socket counts as dead."""
        return not self._closed and not self._broken and self.proc.poll() is None

    def close(self, *, timeout: float = 5.0) -> None:
        """Ask the worker to exit; kill it if it does not within ``timeout``."""
        self.stop()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        """Ask the worker to exit, without waiting (:meth:`close` waits): stop every
        worker first, then close them, and they exit together."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(None)
        with contextlib.suppress(OSError):
            self.conn.close()

    def kill(self) -> None:
        """Stop the worker now (its COPY and upload with it)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.close(timeout=5.0)

    # -- internals

    def _send(self, msg) -> None:
        try:
            self.conn.send(msg)
        except (OSError, ValueError) as exc:
            self._broken = True
            raise WorkerDied(f"worker process {self.pid} is gone ({exc})") from None

    def _recv(self, timeout: float | None):
        try:
            if timeout is not None and not self.conn.poll(timeout):
                self._broken = True  # stuck: it will be killed
                raise WorkerDied(f"worker process {self.pid} did not answer within {timeout:.0f}s")
            return self.conn.recv()
        except (EOFError, OSError) as exc:
            self._broken = True
            code = self.proc.poll()
            how = f"exit status {code}" if code is not None else str(exc) or type(exc).__name__
            raise WorkerDied(f"worker process {self.pid} ended ({how})") from None


# ----------------------------------------------------------------------------- the child


class _Progress:
    """What :func:`~airflow_pgcdc.snapshot.parts.copy_part` reports to, in a worker: rows go to the coordinator."""

    lock = contextlib.nullcontext()

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def part_rows(self, _part, rows: int) -> None:
        self._conn.send(("rows", rows))

    def part_done(self, _part, _size: int) -> None:
        pass  # the coordinator counts it when the result arrives


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this worker when its coordinator dies (``PR_SET_PDEATHSIG``);
    a no-op elsewhere or where ``prctl`` is missing.

    Not merged with :func:`airflow_pgcdc.testing.processes._die_with_parent`, which does
    the same ``prctl`` for another situation: that one is a ``preexec_fn`` built in the
    parent (libc loaded there, before a fork from a threaded test process) for a server
    started with ``subprocess`` as another user, with a chosen signal and a check that the
    parent is still there; this one runs in the worker itself, right after ``os.fork``
    or at the start of a fresh interpreter, where its coordinator's liveness is checked
    by the socket instead (``_serve`` ends on EOF). One function serving both would need
    both modes, and the snapshot job must not import the test bed (``testing/``)."""
    if sys.platform != "linux":
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _serve(conn: Connection) -> None:
    from airflow_pgcdc.snapshot.parts import copy_part, import_snapshot

    parent = os.getppid()
    session = None
    job: CopyJob | None = None
    client = None
    dsn = snapshot_name = None
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return  # the coordinator is gone
            if msg is None:
                return
            kind = msg[0]
            if kind == "snapshot":
                _, dsn, snapshot_name = msg
                try:
                    session = import_snapshot(dsn, snapshot_name)
                except BaseException as exc:
                    conn.send(("failed", retryable(exc), f"{type(exc).__name__}: {exc}"))
                    continue
                conn.send(("ready",))
            elif kind == "job":
                job = msg[1]
                client = s3store.make_s3_client(job.s3)
            elif kind == "part":
                part = msg[1]
                try:
                    if job is None or dsn is None:
                        raise RuntimeError("a part arrived before the snapshot and the job")
                    if session is None:  # the last part failed: a new session in the same snapshot
                        session = import_snapshot(dsn, snapshot_name)
                    result = copy_part(
                        session, part, job.converters[part.table.oid], client, job.layout,
                        job.slot, job.snapshot_id, _Progress(conn), job.copy_format,
                    )
                except BaseException as exc:
                    if session is not None:
                        session.close()
                        session = None
                    if os.getppid() != parent:
                        return
                    conn.send(("failed", retryable(exc), f"{type(exc).__name__}: {exc}", table_error(exc)))
                    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                        return
                    continue
                conn.send(("done", result))
    finally:
        if session is not None:
            session.close()


def _fork_worker(ours: socket.socket, theirs: socket.socket) -> int:
    """Fork a worker serving ``theirs``; returns its pid (in this process)."""
    pid = os.fork()
    if pid:
        return pid
    # the child: never returns, never runs the parent's finalizers (its inherited
    # connections are the parent's: closing them here would end the parent's sessions)
    code = 1
    try:
        ours.close()
        _die_with_parent()
        code = _run(Connection(theirs.detach()))
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(code)


def _run(conn: Connection) -> int:
    try:
        _serve(conn)
    except (BrokenPipeError, ConnectionResetError):
        return 1  # the coordinator went away mid-answer
    finally:
        conn.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _die_with_parent()
    return _run(Connection(int(argv[0])))


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)  # nothing left to finalize: skip the interpreter's teardown (numpy, pyarrow, boto3)
