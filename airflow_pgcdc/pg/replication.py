"""Replication connections on ``psycopg.pq`` (psycopg 3 has no replication API).

libpq does the connection, authentication (SCRAM) and TLS (``sslmode``...); we drive
the simple-query and COPY BOTH / COPY OUT sub-protocols ourselves, without blocking:
``get_copy_data(1)`` plus a wait on the socket, never ``get_copy_data(0)`` (it would
hold the GIL while it blocks).

Every operation is written once, as a generator in :class:`_ReplicationProtocol`
(see :mod:`airflow_pgcdc.pg.waiting`), and exposed twice: blocking methods on
:class:`ReplicationConnection` and coroutines on :class:`AsyncReplicationConnection`.

Acknowledgement policy: the connection never decides on its own what is durable.
``flush``/``apply`` positions only move when the caller calls :meth:`send_feedback`
(or :meth:`confirm`); keepalives that ask for a reply are answered automatically
with the last positions the caller confirmed, and a status update is sent at least
every ``status_interval`` seconds so that ``wal_sender_timeout`` never fires.

Why one module of about 800 lines: every protocol step is written once, as a generator of
``_ReplicationProtocol`` (about 420 lines: commands, COPY BOTH, feedback, the BASE_BACKUP
stream), and the two connection classes below are only its two waiters, the blocking one
and the asyncio one (about 250 lines of methods that each run one of those generators). A
method and the step it drives are read together; putting the waiters in another file
would split every such pair without making either half stand on its own.
"""

from __future__ import annotations

import logging
import time
from array import array
from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field

from psycopg import pq

from airflow_pgcdc.errors import PgcdcError
from airflow_pgcdc.pg import copyrun
from airflow_pgcdc.pg.conninfo import redact, replication_conninfo
from airflow_pgcdc.pg.errors import (
    ConnectionFailed,
    ConnectionLost,
    ReplicationStateError,
    server_error_class,
)
from airflow_pgcdc.pg.waiting import WAIT_R, WAIT_RW, WAIT_W, PQGen, wait_async, wait_sync
from airflow_pgcdc.protocol import commands, frames
from airflow_pgcdc.protocol.lsn import LSN, WalSizes
from airflow_pgcdc.protocol.pgtime import now_pg_us

log = logging.getLogger(__name__)

_ES = pq.ExecStatus
_DIAG = pq.DiagnosticField
_COPY_BATCH = 512  # frames returned per wake-up at most (amortises the driver's cost)


@dataclass(slots=True)
class Result:
    """One result set of a simple query, values as text (``None`` for NULL)."""

    status: str
    command_tag: str
    columns: list[str] = field(default_factory=list)
    rows: list[tuple[str | None, ...]] = field(default_factory=list)

    def one(self) -> tuple[str | None, ...]:
        if len(self.rows) != 1:
            raise ReplicationStateError(
                f"expected one row from {self.command_tag or 'the command'}, got {len(self.rows)}"
            )
        return self.rows[0]


@dataclass(slots=True)
class BackupResult:
    """A result set that arrived inside a BASE_BACKUP exchange (start, tablespaces, end)."""

    result: Result
    index: int  # 0 = start position, 1 = tablespace list, 2 = end position
    type: str = "result"


class _State:
    IDLE = "idle"
    COPY_BOTH = "streaming"
    COPY_OUT = "copy_out"
    CLOSED = "closed"


def _result_from_pg(res, encoding: str) -> Result:
    status = res.status
    tag = (res.command_status or b"").decode(encoding, "replace")
    if status != _ES.TUPLES_OK:
        return Result(status=_ES(status).name, command_tag=tag)
    nf, nt = res.nfields, res.ntuples
    columns = [(res.fname(i) or b"").decode(encoding) for i in range(nf)]
    rows = []
    for r in range(nt):
        row = []
        for c in range(nf):
            v = res.get_value(r, c)
            row.append(None if v is None else bytes(v).decode(encoding))
        rows.append(tuple(row))
    return Result(status="TUPLES_OK", command_tag=tag, columns=columns, rows=rows)


def _server_error(res, encoding: str, command: str | None):
    def f(code):
        v = res.error_field(code)
        return None if v is None else v.decode(encoding, "replace")

    sqlstate = f(_DIAG.SQLSTATE) or ""
    message = f(_DIAG.MESSAGE_PRIMARY) or (res.error_message or b"").decode(encoding, "replace").strip()
    cls = server_error_class(sqlstate)
    return cls(
        message,
        sqlstate=sqlstate,
        severity=f(_DIAG.SEVERITY_NONLOCALIZED) or f(_DIAG.SEVERITY) or "ERROR",
        detail=f(_DIAG.MESSAGE_DETAIL),
        hint=f(_DIAG.MESSAGE_HINT),
        command=command,
    )


class _ReplicationProtocol:
    """State and generators shared by the sync and async connections."""

    status_interval: float = 10.0
    gather_seconds: float = 0.0
    """A streaming read that found the socket empty (libpq's buffer too) and waited for it
    waits this much longer before it takes what came (the blocking connection only). A walsender flushes every message
    on its own: a reader that takes them as they come wakes for one or two at a time, and
    those wake-ups (ours, and the server's sends into a drained socket) cost both sides
    more than the messages. The drain sets 2 ms (``drain.run.GATHER_SECONDS``): the
    latency it adds is that, once per wait."""

    def __init__(self, pgconn: pq.PGconn, dsn_redacted: str, *, status_interval: float = 10.0):
        self.pgconn = pgconn
        self.dsn = dsn_redacted  # never holds the password
        self.encoding = "utf-8"
        self.state = _State.IDLE
        self.status_interval = status_interval
        # positions reported to the server
        self._received = LSN(0)  # highest position received (reported as "write")
        self._last_xlog = None  # the newest XLogData, folded into _received lazily
        self._physical = False
        self.flush_lsn = LSN(0)  # what the caller confirmed durable
        self.apply_lsn = LSN(0)
        self._last_status = 0.0
        self._frames: deque = deque()
        self._run_ended = False  # read_run saw the copy end (the next read raises StreamEnded)
        self._copyrun_fns = copyrun.libpq_functions() if getattr(pgconn, "pgconn_ptr", None) else None
        self._final_results: list[Result] = []
        self._command: str | None = None
        self._backup_results = 0
        self._pending_backup_results: deque[Result] = deque()
        self._wal_sizes: WalSizes | None = None

    # -- connection ---------------------------------------------------------------------
    @staticmethod
    def _gen_connect(conninfo: str, dsn_redacted: str, timeout: float | None) -> PQGen[pq.PGconn]:
        pgconn = pq.PGconn.connect_start(conninfo.encode())
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if pgconn.status == pq.ConnStatus.BAD:
                msg = pgconn.get_error_message().strip()
                pgconn.finish()
                raise ConnectionFailed(f"cannot connect to {dsn_redacted}: {msg}")
            poll = pgconn.connect_poll()
            if poll == pq.PollingStatus.OK:
                break
            if poll == pq.PollingStatus.FAILED:
                msg = pgconn.get_error_message().strip()
                pgconn.finish()
                raise ConnectionFailed(f"cannot connect to {dsn_redacted}: {msg}")
            wait = WAIT_R if poll == pq.PollingStatus.READING else WAIT_W
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not (yield pgconn.socket, wait, remaining):
                if deadline is not None and time.monotonic() >= deadline:
                    pgconn.finish()
                    raise ConnectionFailed(f"cannot connect to {dsn_redacted}: timed out after {timeout}s")
        pgconn.nonblocking = 1
        return pgconn

    @property
    def received_lsn(self) -> LSN:
        """The highest WAL position received: for a logical stream the newest
        XLogData's ``wal_end``, for a physical one the end of the newest data chunk.
        Reported to the server as the "write" position (informational)."""
        frame = self._last_xlog
        if frame is not None:
            self._last_xlog = None
            end = frame.data_end if self._physical else frame.wal_end
            if end > self._received:
                self._received = end
        return self._received

    @received_lsn.setter
    def received_lsn(self, value: LSN) -> None:
        self._last_xlog = None
        self._received = LSN(value)

    @property
    def server_version(self) -> int:
        """``server_version_num`` of the server, e.g. 180006."""
        return self.pgconn.server_version

    def _check_open(self) -> None:
        if self.state == _State.CLOSED:
            raise ReplicationStateError("the replication connection is closed")

    def _lost(self, exc: Exception) -> ConnectionLost:
        self.state = _State.CLOSED
        try:
            msg = self.pgconn.get_error_message().strip()
        except Exception:
            msg = ""
        return ConnectionLost(f"connection to {self.dsn} lost: {msg or exc}")

    def _consume(self) -> None:
        try:
            self.pgconn.consume_input()
        except Exception as exc:  # psycopg.OperationalError
            raise self._lost(exc) from None

    def _gen_flush(self) -> PQGen[None]:
        pgconn = self.pgconn
        while True:
            try:
                rv = pgconn.flush()
            except Exception as exc:
                raise self._lost(exc) from None
            if rv == 0:
                return
            ready = yield pgconn.socket, WAIT_RW, None
            if ready & WAIT_R:
                self._consume()

    def _gen_results(self, command: str) -> PQGen[list[Result]]:
        """Collect results until the command finishes or a COPY starts.

        Returns all results; a COPY_OUT / COPY_BOTH result switches the state and is
        the last in the list.
        """
        pgconn = self.pgconn
        results: list[Result] = []
        error = None
        while True:
            while pgconn.is_busy():
                yield pgconn.socket, WAIT_R, None
                self._consume()
            res = pgconn.get_result()
            if res is None:
                if error is not None:
                    raise error
                return results
            st = res.status
            if st == _ES.FATAL_ERROR:
                error = error or _server_error(res, self.encoding, command)
            elif st == _ES.COPY_BOTH:
                self.state = _State.COPY_BOTH
                results.append(Result(status="COPY_BOTH", command_tag=""))
                return results
            elif st == _ES.COPY_OUT:
                self.state = _State.COPY_OUT
                results.append(Result(status="COPY_OUT", command_tag=""))
                return results
            elif st in (_ES.TUPLES_OK, _ES.COMMAND_OK, _ES.EMPTY_QUERY):
                results.append(_result_from_pg(res, self.encoding))
            else:
                error = error or ReplicationStateError(
                    f"unexpected result status {_ES(st).name} for {command!r}"
                )

    def _gen_execute(self, command: str) -> PQGen[list[Result]]:
        self._check_open()
        if self.state != _State.IDLE:
            raise ReplicationStateError(
                f"cannot run {command.split()[0]} while the connection is {self.state}"
            )
        log.debug("replication command: %s", command)
        self._command = command
        try:
            self.pgconn.send_query(command.encode(self.encoding))
        except Exception as exc:
            raise self._lost(exc) from None
        yield from self._gen_flush()
        return (yield from self._gen_results(command))

    # -- typed commands ----------------------------------------------------------------------
    def _gen_single_row(self, command: str) -> PQGen[tuple[str | None, ...]]:
        results = yield from self._gen_execute(command)
        rows = [r for r in results if r.status == "TUPLES_OK"]
        if len(rows) != 1:
            raise ReplicationStateError(f"{command!r} returned {len(rows)} result sets, expected 1")
        return rows[0].one()

    def _gen_identify_system(self) -> PQGen[frames.IdentifySystem]:
        row = yield from self._gen_single_row(commands.identify_system())
        return frames.IdentifySystem.from_row(row)

    def _gen_show(self, name: str) -> PQGen[str | None]:
        row = yield from self._gen_single_row(commands.show(name))
        return row[0]

    def _gen_timeline_history(self, timeline: int) -> PQGen[frames.TimelineHistory]:
        row = yield from self._gen_single_row(commands.timeline_history(timeline))
        return frames.TimelineHistory.from_row(row)

    def _gen_create_slot(self, slot_name: str, **options) -> PQGen[frames.ReplicationSlotCreated]:
        row = yield from self._gen_single_row(commands.create_replication_slot(slot_name, **options))
        return frames.ReplicationSlotCreated.from_row(row)

    def _gen_read_slot(self, slot_name: str) -> PQGen[frames.ReadReplicationSlot]:
        row = yield from self._gen_single_row(commands.read_replication_slot(slot_name))
        return frames.ReadReplicationSlot.from_row(row)

    def _gen_drop_slot(self, slot_name: str, wait: bool) -> PQGen[None]:
        yield from self._gen_execute(commands.drop_replication_slot(slot_name, wait=wait))

    # -- streaming -------------------------------------------------------------------------------
    def _gen_start(self, command: str, start_lsn: LSN, physical: bool = False) -> PQGen[None]:
        if self.state == _State.CLOSED or self.pgconn.status == pq.ConnStatus.BAD:
            raise ReplicationStateError("the replication connection is closed")
        results = yield from self._gen_execute(command)
        if not results or results[-1].status != "COPY_BOTH":
            # PostgreSQL ends a second logical stream on one connection with "COPY 0"
            raise ReplicationStateError(
                f"the server did not start streaming for {command!r} "
                f"(got {[r.command_tag or r.status for r in results]}); "
                "open a new replication connection per stream"
            )
        self._physical = physical
        self._run_ended = False
        self.received_lsn = LSN(start_lsn)
        self.flush_lsn = max(self.flush_lsn, LSN(start_lsn))
        self.apply_lsn = self.flush_lsn
        self._last_status = time.monotonic()

    def _status_update_bytes(self, reply_requested: bool = False) -> bytes:
        return frames.build_standby_status_update(
            self.received_lsn if self.received_lsn > self.flush_lsn else self.flush_lsn,
            self.flush_lsn,
            self.apply_lsn,
            send_time_us=now_pg_us(),
            reply_requested=reply_requested,
        )

    def _gen_put(self, data: bytes) -> PQGen[None]:
        pgconn = self.pgconn
        while True:
            try:
                rv = pgconn.put_copy_data(data)
            except Exception as exc:
                raise self._lost(exc) from None
            if rv == 1:
                break
            yield pgconn.socket, WAIT_W, None
        yield from self._gen_flush()

    def _gen_send_status(self, reply_requested: bool = False) -> PQGen[None]:
        yield from self._gen_put(self._status_update_bytes(reply_requested))
        self._last_status = time.monotonic()

    def _gen_send_feedback(
        self, write: LSN | None, flush: LSN | None, apply: LSN | None, reply_requested: bool
    ) -> PQGen[None]:
        if self.state != _State.COPY_BOTH:
            raise ReplicationStateError("send_feedback needs a running stream")
        if flush is not None:
            self.flush_lsn = LSN(flush)
            self.apply_lsn = LSN(apply) if apply is not None else self.flush_lsn
        elif apply is not None:
            self.apply_lsn = LSN(apply)
        if write is not None and write > self.received_lsn:
            self.received_lsn = LSN(write)
        yield from self._gen_send_status(reply_requested)

    def _gen_end_of_copy(self) -> PQGen[None]:
        """After get_copy_data returned -1: collect the command's final results."""
        self.state = _State.IDLE
        results = yield from self._gen_results(self._command or "START_REPLICATION")
        self._final_results = results

    def _gen_read_raw(self, timeout: float | None) -> PQGen[bool]:
        """Fill ``self._frames`` with raw CopyData payloads; ``False`` when the copy ended.

        Returns ``True`` with an empty buffer on timeout. Sends the periodic status
        update while waiting.
        """
        pgconn = self.pgconn
        frames = self._frames
        deadline = None if timeout is None else time.monotonic() + timeout
        streaming = self.state == _State.COPY_BOTH
        consumed = False
        while True:
            try:
                nbytes, data = pgconn.get_copy_data(1)
            except Exception as exc:
                raise self._lost(exc) from None
            if nbytes > 0:
                frames.append(bytes(data))
                if len(frames) >= _COPY_BATCH:
                    return True
                consumed = False
                continue
            if nbytes == -1:
                yield from self._gen_end_of_copy()
                return False
            if nbytes == -2:
                self._copy_failed()
            # nbytes == 0: nothing buffered
            if frames:
                return True
            if not consumed:  # what the socket holds first (over TLS libpq reads a record a call)
                self._consume()
                consumed = True
                continue
            if not (yield from self._gen_wait_input(deadline, streaming)):
                return True
            if streaming and self.gather_seconds:  # the socket was empty: see gather_seconds
                time.sleep(self.gather_seconds)
                self._consume()

    def _copy_failed(self):
        """After get_copy_data returned -2: raise the server's error, or ConnectionLost."""
        res = self.pgconn.get_result()
        self.state = _State.IDLE
        if res is not None and res.status == _ES.FATAL_ERROR:
            raise _server_error(res, self.encoding, self._command)
        raise self._lost(RuntimeError("error reading COPY data"))

    def _gen_wait_input(self, deadline: float | None, streaming: bool) -> PQGen[bool]:
        """Wait until the socket has input (consumed into libpq's buffer: True) or
        ``deadline`` passes (False); a status update is sent when one is due."""
        pgconn = self.pgconn
        while True:
            now = time.monotonic()
            if streaming and now - self._last_status >= self.status_interval:
                yield from self._gen_send_status()
                now = time.monotonic()
            wait = self.status_interval - (now - self._last_status) if streaming else None
            if deadline is not None:
                left = deadline - now
                if left <= 0:
                    return False
                wait = left if wait is None else min(wait, left)
            ready = yield pgconn.socket, WAIT_R, (max(0.0, wait) if wait is not None else None)
            if ready:
                self._consume()
                return True

    def _gen_read_message(self, timeout: float | None):
        """Next XLogData or PrimaryKeepalive frame; ``None`` on timeout; raises
        :class:`StreamEnded` at the end of the stream. Keepalives that request a reply
        are answered here, and still returned (the caller may want their ``wal_end``)."""
        if self._run_ended and not self._frames:  # the copy ended under read_run
            raise StreamEnded(self._final_results)
        if self.state != _State.COPY_BOTH and not self._frames:
            raise ReplicationStateError("no replication stream is running")
        if not self._frames:
            more = yield from self._gen_read_raw(timeout)
            if not self._frames:
                if not more:
                    raise StreamEnded(self._final_results)
                return None
        frame = frames.parse_copy_data(self._frames.popleft())
        if type(frame) is frames.XLogData:
            self._last_xlog = frame
        elif frame.reply_requested and self.state == _State.COPY_BOTH:
            yield from self._gen_send_status()
        return frame

    def _gen_stop(self) -> PQGen[list[Result]]:
        """Send CopyDone, discard what the server still sends, and wait for the end."""
        if self.state != _State.COPY_BOTH:
            return []
        try:
            while self.pgconn.put_copy_end(None) == 0:
                yield self.pgconn.socket, WAIT_W, None
        except Exception as exc:
            raise self._lost(exc) from None
        yield from self._gen_flush()
        while True:
            self._frames.clear()
            more = yield from self._gen_read_raw(None)
            if not more:
                break
        self._frames.clear()
        return self._final_results

    # -- COPY TO STDOUT (plain SQL sessions) ----------------------------------------------------
    def _gen_copy_start(self, command: str) -> PQGen[None]:
        results = yield from self._gen_execute(command)
        if not results or results[-1].status != "COPY_OUT":
            raise ReplicationStateError(f"{command[:60]!r} did not start a COPY TO STDOUT")

    def _gen_copy_chunk(self, max_bytes: int, lengths: array | None = None) -> PQGen[bytes | None]:
        """Up to about ``max_bytes`` of COPY data (whole rows); ``None`` at the end.

        PostgreSQL sends one CopyData message per row: the inner loop only calls libpq
        and keeps the message (about 0.3 µs per row), the join comes once per chunk.
        ``lengths``: extend it with each message's size (the row boundaries, for the
        binary decoder).
        """
        if self.state != _State.COPY_OUT:
            return None
        pgconn = self.pgconn
        get = pgconn.get_copy_data
        parts: list[bytes] = []
        append = parts.append
        total = 0
        while total < max_bytes:
            try:
                nbytes, data = get(1)
                while nbytes > 0:
                    append(data)
                    total += nbytes
                    if total >= max_bytes:
                        break
                    nbytes, data = get(1)
            except Exception as exc:
                raise self._lost(exc) from None
            if nbytes > 0:
                break  # max_bytes reached
            if nbytes == 0:
                if parts:
                    break
                yield pgconn.socket, WAIT_R, None
                self._consume()
                continue
            if nbytes == -1:
                yield from self._gen_end_of_copy()
                break
            res = pgconn.get_result()
            self.state = _State.IDLE
            if res is not None and res.status == _ES.FATAL_ERROR:
                raise _server_error(res, self.encoding, self._command)
            raise self._lost(RuntimeError("error reading COPY data"))
        if not parts:
            return None
        if lengths is not None:
            lengths.extend(map(len, parts))
        return b"".join(parts)

    # -- base backup -----------------------------------------------------------------------------
    def _gen_base_backup_next(self):
        """Next event of a running BASE_BACKUP: a :class:`BackupResult` or a parsed
        CopyData message; ``None`` when the backup has finished."""
        while True:
            if self._frames:
                return frames.parse_base_backup_copy_data(self._frames.popleft())
            if self.state == _State.COPY_OUT:
                more = yield from self._gen_read_raw(None)
                if more:
                    continue
                # copy ended: the final results are the end position result set
            if self._pending_backup_results:
                res = self._pending_backup_results.popleft()
                self._backup_results += 1
                return BackupResult(res, self._backup_results - 1)
            if self.state == _State.COPY_OUT:
                continue
            if self.state == _State.IDLE and self._final_results:
                self._pending_backup_results.extend(
                    r for r in self._final_results if r.status == "TUPLES_OK"
                )
                self._final_results = []
                continue
            return None

    def _gen_base_backup_start(self, command: str) -> PQGen[None]:
        results = yield from self._gen_execute(command)
        self._backup_results = 0
        self._pending_backup_results = deque(r for r in results if r.status == "TUPLES_OK")
        self._final_results = []


class StreamEnded(PgcdcError):
    """The server ended the COPY stream (e.g. after our CopyDone, or a timeline end)."""

    def __init__(self, results: Sequence[Result] = ()):
        self.results = list(results)
        super().__init__("the replication stream ended")


def _build_start_command(
    slot_name: str | None,
    start_lsn: LSN,
    *,
    logical: bool,
    options: Sequence[tuple[str, str | None]] | None,
    timeline: int | None,
) -> str:
    if logical:
        if slot_name is None:
            raise ValueError("a logical stream needs a slot")
        return commands.start_replication_logical(slot_name, start_lsn, options or ())
    return commands.start_replication_physical(start_lsn, slot_name=slot_name, timeline=timeline)


class ReplicationConnection(_ReplicationProtocol):
    """A blocking replication connection. Use as a context manager."""

    @classmethod
    def connect(
        cls,
        dsn: str,
        *,
        replication: str = "database",
        connect_timeout: float | None = 30.0,
        status_interval: float = 10.0,
        **params: str,
    ) -> ReplicationConnection:
        conninfo = replication_conninfo(dsn, replication=replication, **params)
        safe = redact(dsn)
        pgconn = wait_sync(cls._gen_connect(conninfo, safe, connect_timeout))
        return cls(pgconn, safe, status_interval=status_interval)

    def __enter__(self) -> ReplicationConnection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.state != _State.CLOSED:
            self.state = _State.CLOSED
            self.pgconn.finish()

    def execute(self, command: str) -> list[Result]:
        """Run one command (replication command, or SQL on a ``replication=database``
        connection); returns its result sets."""
        return wait_sync(self._gen_execute(command))

    def identify_system(self) -> frames.IdentifySystem:
        return wait_sync(self._gen_identify_system())

    def show(self, name: str) -> str | None:
        return wait_sync(self._gen_show(name))

    def wal_sizes(self) -> WalSizes:
        """The server's WAL page and segment sizes (``SHOW``, read once per connection;
        the first call must come before streaming starts)."""
        if self._wal_sizes is None:
            self._wal_sizes = WalSizes.parse(self.show("wal_block_size"), self.show("wal_segment_size"))
        return self._wal_sizes

    def timeline_history(self, timeline: int) -> frames.TimelineHistory:
        return wait_sync(self._gen_timeline_history(timeline))

    def create_slot(self, slot_name: str, **options) -> frames.ReplicationSlotCreated:
        """``CREATE_REPLICATION_SLOT``; options as :func:`commands.create_replication_slot`."""
        return wait_sync(self._gen_create_slot(slot_name, **options))

    def read_slot(self, slot_name: str) -> frames.ReadReplicationSlot:
        return wait_sync(self._gen_read_slot(slot_name))

    def drop_slot(self, slot_name: str, *, wait: bool = False) -> None:
        wait_sync(self._gen_drop_slot(slot_name, wait))

    def start_replication(
        self,
        slot_name: str | None = None,
        start_lsn: LSN | str | int = 0,
        *,
        logical: bool = True,
        options: Sequence[tuple[str, str | None]] | None = None,
        timeline: int | None = None,
    ) -> None:
        """Start a logical (default) or physical stream; then :meth:`read_message`."""
        lsn = LSN(start_lsn)
        cmd = _build_start_command(slot_name, lsn, logical=logical, options=options, timeline=timeline)
        wait_sync(self._gen_start(cmd, lsn, not logical))

    def read_message(self, timeout: float | None = None):
        """The next frame (``XLogData`` or ``PrimaryKeepalive``), or ``None`` after
        ``timeout`` seconds. Raises :class:`StreamEnded` when the server ends the copy."""
        if self._frames:  # fast path: no generator round trip while frames are buffered
            frame = frames.parse_copy_data(self._frames.popleft())
            if type(frame) is frames.XLogData:
                self._last_xlog = frame
                return frame
            if not frame.reply_requested:
                return frame
            wait_sync(self._gen_send_status())
            return frame
        return wait_sync(self._gen_read_message(timeout))

    def can_read_runs(self) -> bool:
        """True when :meth:`read_run` takes runs natively (else it reads one frame)."""
        return self._copyrun_fns is not None

    def read_run(self, oid: bytes, images: list, ops: list, rows_left: int, bytes_left: int, overhead: int,
                 timeout: float | None = None):
        """Take the XLogData frames that carry an Insert, or an Update with its new row
        only, of relation ``oid`` (4 bytes, network order), for as long as they come
        (:mod:`airflow_pgcdc.pg.copyrun`): each one's pgoutput message is appended to
        ``images`` and ``"I"`` or ``"U"`` to ``ops``, up to ``rows_left`` messages or
        ``bytes_left`` bytes (each message's length plus ``overhead``). Returns
        ``(count, nbytes, frame)``: ``frame`` is the next other frame, parsed as by
        :meth:`read_message` (keepalives asking for a reply are answered), or ``None``
        (the limit was reached, nothing more is buffered after a run, or ``timeout``
        passed with nothing received). Without the native path, or while frames read the
        ordinary way are buffered, it is ``(0, 0, read_message(timeout))``."""
        fns = self._copyrun_fns
        if fns is None or self._frames or self.state != _State.COPY_BOTH or rows_left <= 0 or bytes_left <= 0:
            return 0, 0, self.read_message(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        ptr = self.pgconn.pgconn_ptr
        while True:
            status, count, nbytes, payload, _start, end = copyrun.take(
                ptr, fns, oid, images, ops, "I", "U", rows_left, bytes_left, overhead)
            if count and end > self._received:
                self._received = LSN(end)
            if status == copyrun.OTHER_MESSAGE:
                self._frames.append(payload)
                return count, nbytes, self.read_message(0)
            if status == copyrun.ENDED:
                wait_sync(self._gen_end_of_copy())
                if not count:
                    raise StreamEnded(self._final_results)
                self._run_ended = True  # the next read raises it, after the caller took the run
                return count, nbytes, None
            if status == copyrun.FAILED:
                self._copy_failed()  # raises (a run taken meanwhile is lost with the window)
            if status == copyrun.FULL or count:
                return count, nbytes, None
            if not wait_sync(self._gen_wait_input(deadline, True)):
                return 0, 0, None
            if self.gather_seconds:  # see gather_seconds
                time.sleep(self.gather_seconds)

    def __iter__(self) -> Iterator:
        """Frames until the stream ends (keepalives included)."""
        while True:
            try:
                frame = self.read_message(None)
            except StreamEnded:
                return
            if frame is not None:
                yield frame

    def send_feedback(
        self,
        *,
        write: LSN | None = None,
        flush: LSN | None = None,
        apply: LSN | None = None,
        reply_requested: bool = False,
    ) -> None:
        """Send a standby status update; ``flush`` is what PostgreSQL may forget."""
        wait_sync(self._gen_send_feedback(write, flush, apply, reply_requested))

    def confirm(self, lsn: LSN) -> None:
        """Acknowledge everything up to ``lsn`` (a Commit's end LSN) as durable."""
        self.send_feedback(flush=LSN(lsn))

    def stop(self) -> list[Result]:
        """End the stream cleanly (CopyDone) and return the command's final results."""
        return wait_sync(self._gen_stop())

    def copy_to(self, command: str, *, chunk_bytes: int = 4 << 20, row_lengths: bool = False) -> Iterator:
        """Run ``COPY ... TO STDOUT`` and yield its data in chunks of whole rows of about
        ``chunk_bytes``. Works on a plain SQL session (``replication="false"``) and on a
        ``replication=database`` one. With ``row_lengths``, yield ``(chunk, lengths)``:
        ``lengths`` an ``array('q')`` of the chunk's CopyData message sizes (one row each;
        the binary header rides in the first row's message, the trailer has its own)."""
        wait_sync(self._gen_copy_start(command))
        while True:
            lengths = array("q") if row_lengths else None
            chunk = wait_sync(self._gen_copy_chunk(chunk_bytes, lengths))
            if chunk is None:
                return
            yield (chunk, lengths) if row_lengths else chunk

    def base_backup(self, **options) -> Iterator:
        """Run ``BASE_BACKUP`` (options as :func:`commands.base_backup`) and yield its
        events in order: :class:`BackupResult` (start position, tablespaces), then the
        CopyData messages (new archive, data, manifest, progress), then the end
        position :class:`BackupResult`."""
        wait_sync(self._gen_base_backup_start(commands.base_backup(**options)))
        while True:
            ev = wait_sync(self._gen_base_backup_next())
            if ev is None:
                return
            yield ev


class AsyncReplicationConnection(_ReplicationProtocol):
    """The asyncio twin of :class:`ReplicationConnection` (same generators)."""

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        replication: str = "database",
        connect_timeout: float | None = 30.0,
        status_interval: float = 10.0,
        **params: str,
    ) -> AsyncReplicationConnection:
        conninfo = replication_conninfo(dsn, replication=replication, **params)
        safe = redact(dsn)
        pgconn = await wait_async(cls._gen_connect(conninfo, safe, connect_timeout))
        return cls(pgconn, safe, status_interval=status_interval)

    async def __aenter__(self) -> AsyncReplicationConnection:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self.state != _State.CLOSED:
            self.state = _State.CLOSED
            self.pgconn.finish()

    async def _run(self, gen):
        try:
            return await wait_async(gen)
        except BaseException as exc:
            # a cancelled or failed wait leaves the protocol mid-way: the connection
            # cannot be trusted any more
            if not isinstance(exc, PgcdcError) or isinstance(exc, ConnectionLost):
                await self.close()
            raise

    async def execute(self, command: str) -> list[Result]:
        return await self._run(self._gen_execute(command))

    async def identify_system(self) -> frames.IdentifySystem:
        return await self._run(self._gen_identify_system())

    async def show(self, name: str) -> str | None:
        return await self._run(self._gen_show(name))

    async def timeline_history(self, timeline: int) -> frames.TimelineHistory:
        return await self._run(self._gen_timeline_history(timeline))

    async def create_slot(self, slot_name: str, **options) -> frames.ReplicationSlotCreated:
        return await self._run(self._gen_create_slot(slot_name, **options))

    async def read_slot(self, slot_name: str) -> frames.ReadReplicationSlot:
        return await self._run(self._gen_read_slot(slot_name))

    async def drop_slot(self, slot_name: str, *, wait: bool = False) -> None:
        await self._run(self._gen_drop_slot(slot_name, wait))

    async def start_replication(
        self,
        slot_name: str | None = None,
        start_lsn: LSN | str | int = 0,
        *,
        logical: bool = True,
        options: Sequence[tuple[str, str | None]] | None = None,
        timeline: int | None = None,
    ) -> None:
        lsn = LSN(start_lsn)
        cmd = _build_start_command(slot_name, lsn, logical=logical, options=options, timeline=timeline)
        await self._run(self._gen_start(cmd, lsn, not logical))

    async def read_message(self, timeout: float | None = None):
        return await self._run(self._gen_read_message(timeout))

    async def __aiter__(self) -> AsyncIterator:
        while True:
            try:
                frame = await self.read_message(None)
            except StreamEnded:
                return
            if frame is not None:
                yield frame

    async def send_feedback(
        self,
        *,
        write: LSN | None = None,
        flush: LSN | None = None,
        apply: LSN | None = None,
        reply_requested: bool = False,
    ) -> None:
        await self._run(self._gen_send_feedback(write, flush, apply, reply_requested))

    async def confirm(self, lsn: LSN) -> None:
        await self.send_feedback(flush=LSN(lsn))

    async def stop(self) -> list[Result]:
        return await self._run(self._gen_stop())

    async def base_backup(self, **options) -> AsyncIterator:
        await self._run(self._gen_base_backup_start(commands.base_backup(**options)))
        while True:
            ev = await self._run(self._gen_base_backup_next())
            if ev is None:
                return
            yield ev
