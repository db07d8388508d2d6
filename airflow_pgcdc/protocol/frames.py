"""CopyData payloads of the streaming replication protocol (spec 003, PostgreSQL docs 55.4).

Sans-IO: every function takes the payload of *one* CopyData message (what
``PQgetCopyData`` returns, without the ``'d'`` + length envelope) and returns a
typed value, or takes typed values and returns the payload bytes.

During ``START_REPLICATION`` (physical or logical):

- server -> client: ``'w'`` :class:`XLogData`, ``'k'`` :class:`PrimaryKeepalive`
  (:func:`parse_copy_data`);
- client -> server: ``'r'`` :class:`StandbyStatusUpdate`, ``'h'``
  :class:`HotStandbyFeedback` (:func:`build_standby_status_update`,
  :func:`build_hot_standby_feedback`; :func:`parse_client_copy_data` reads them back).

During ``BASE_BACKUP`` (PostgreSQL 15+ protocol): ``'n'`` :class:`NewArchive`,
``'m'`` :class:`ManifestStart`, ``'d'`` :class:`ArchiveData`, ``'p'``
:class:`Progress` (:func:`parse_base_backup_copy_data`).

:func:`parse_copy_data` is the hot path of every drain: it checks the length once
and unpacks the XLogData header with one precompiled ``struct`` call. The payload
(``XLogData.data``, ``ArchiveData.data``) is a slice of the input: ``bytes`` in,
``bytes`` out; a ``memoryview`` in gives a zero-copy ``memoryview`` out, valid as
long as the caller's buffer is. Malformed input raises a
:class:`~airflow_pgcdc.errors.ProtocolError` subclass naming the message and the
byte offset, never ``IndexError`` or ``struct.error``.

Why one module of about 720 lines: it is the whole CopyData vocabulary of the streaming
replication protocol, each payload as a typed value (about 300 lines), its parser (about
180) and its builder (about 120; the inverse of the parser, tested as round trips against
it), read together when a field changes; the connection layer uses them as
``frames.<name>``. The commands and their result rows are :mod:`.commands` and
:mod:`.results`.
"""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from typing import Any, ClassVar

from airflow_pgcdc.errors import (
    InvalidFieldValue,
    PgcdcError,
    TrailingBytes,
    TruncatedMessage,
    UnexpectedMessage,
    UnknownMessageType,
)
from airflow_pgcdc.protocol.buffer import Reader
from airflow_pgcdc.protocol.lsn import LSN, InvalidLSN, wire_lsn
from airflow_pgcdc.protocol.message import ProtocolMessage
from airflow_pgcdc.protocol.pgtime import datetime_to_pg_us, now_pg_us, pg_us_to_datetime

# The typed result rows of replication commands live in ``results``; re-exported here
# because the connection layer reads them as ``frames.IdentifySystem.from_row(row)``.
from airflow_pgcdc.protocol.results import (  # noqa: F401
    BaseBackupPosition,
    IdentifySystem,
    ReadReplicationSlot,
    ReplicationSlotCreated,
    TablespaceInfo,
    TimelineHistory,
    TimelineSwitch,
)

__all__ = [
    "PROTOCOL",
    "FrameBuildError",
    "ReplicationFrame",
    "XLogData",
    "PrimaryKeepalive",
    "StandbyStatusUpdate",
    "HotStandbyFeedback",
    "NewArchive",
    "ManifestStart",
    "ArchiveData",
    "Progress",
    "parse_copy_data",
    "parse_client_copy_data",
    "parse_base_backup_copy_data",
    "build_xlog_data",
    "build_primary_keepalive",
    "build_standby_status_update",
    "build_hot_standby_feedback",
    "build_new_archive",
    "build_manifest_start",
    "build_archive_data",
    "build_progress",
    "XLOG_DATA_HEADER_SIZE",
    "MIN_PG_US",
    "MAX_PG_US",
]

PROTOCOL = "replication"

# Wire layouts (after the one type byte).
_XLOG_HDR = struct.Struct("!QQq")  # data_start, wal_end, send_time
_KEEPALIVE = struct.Struct("!QqB")  # wal_end, send_time, reply_requested
_STATUS = struct.Struct("!QQQqB")  # write, flush, apply, send_time, reply_requested
_FEEDBACK = struct.Struct("!qIIII")  # send_time, xmin, xmin_epoch, catalog_xmin, epoch
_PROGRESS = struct.Struct("!q")

XLOG_DATA_HEADER_SIZE = 1 + _XLOG_HDR.size
"""Bytes before the WAL payload of an XLogData message (25)."""

_KEEPALIVE_SIZE = 1 + _KEEPALIVE.size  # 18
_STATUS_SIZE = 1 + _STATUS.size  # 34
_FEEDBACK_SIZE = 1 + _FEEDBACK.size  # 25

MIN_PG_US = datetime_to_pg_us(datetime.min.replace(tzinfo=UTC))
"""Smallest wire timestamp a Python ``datetime`` can hold (0001-01-01)."""
MAX_PG_US = datetime_to_pg_us(datetime.max.replace(tzinfo=UTC))
"""Largest wire timestamp a Python ``datetime`` can hold (9999-12-31 23:59:59.999999)."""

_U32_MAX = (1 << 32) - 1
_I64_MAX = (1 << 63) - 1
_new_lsn = int.__new__  # LSN values straight from a "Q" unpack are always in range


class FrameBuildError(PgcdcError, ValueError):
    """A builder was given a value that does not fit its wire field (a caller bug,
    not bytes from a peer, hence not a :class:`ProtocolError`)."""


# -- typed values -------------------------------------------------------------------


class ReplicationFrame(ProtocolMessage):
    """Base of every CopyData payload type: equality by fields (from
    :class:`~airflow_pgcdc.protocol.message.ProtocolMessage`), a hash, a repr that shows
    bytes by their length, ``to_dict``."""

    __slots__ = ()
    type: ClassVar[str]
    """The message's type byte, as a one-character string (``'w'``, ``'k'``, ...)."""
    name: ClassVar[str]
    """The message's name in the spec (``"XLogData"``, ...)."""

    def __hash__(self) -> int:
        return hash(
            (type(self).__name__,)
            + tuple(bytes(v) if isinstance(v, memoryview) else v for v in self._values())
        )

    def __repr__(self) -> str:
        parts = []
        for f in self._fields:
            v = getattr(self, f)
            if isinstance(v, bytes | bytearray | memoryview):
                parts.append(f"{f}=<{len(v)} bytes>")
            else:
                parts.append(f"{f}={v!r}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: LSNs as ``X/Y``, times as ISO 8601, bytes as hex."""
        out: dict[str, Any] = {"type": self.type, "name": self.name}
        for f in self._fields:
            out.update(_jsonable(f, getattr(self, f)))
        return out

    def to_bytes(self) -> bytes:
        """The CopyData payload this value was (or would be) parsed from."""
        raise NotImplementedError


def _jsonable(field: str, value: Any) -> dict[str, Any]:
    if field.endswith("_us"):
        # send_time_us -> send_time (ISO) and send_time_us (int)
        base = field[: -len("_us")]
        return {base: pg_us_to_datetime(value).isoformat(), field: value}
    if isinstance(value, LSN):
        return {field: str(value)}
    if isinstance(value, bytes | bytearray | memoryview):
        return {field + "_hex": bytes(value).hex()}
    return {field: value}


class XLogData(ReplicationFrame):
    """``'w'``: a chunk of the WAL stream (or, for a logical slot, one plugin message)."""

    # The LSNs are kept as the unpacked ints and become LSN objects on access: building
    # two int-subclass objects per frame would be the largest cost of the hot path.
    __slots__ = ("_data_start", "_wal_end", "send_time_us", "data")
    type = "w"
    name = "XLogData"
    _fields = ("data_start", "wal_end", "send_time_us", "data")

    def __init__(
        self, data_start: int, wal_end: int, send_time_us: int, data: bytes | memoryview
    ) -> None:
        self._data_start = data_start
        self._wal_end = wal_end
        self.send_time_us = send_time_us
        """The server's clock when sending, in microseconds since 2000-01-01 UTC."""
        self.data = data
        """The WAL bytes (for a logical slot: one output-plugin message)."""

    @property
    def data_start(self) -> LSN:
        """The WAL position of the first byte of ``data``."""
        v = self._data_start
        return v if type(v) is LSN else _new_lsn(LSN, v)

    @property
    def wal_end(self) -> LSN:
        """The server's current end of WAL."""
        v = self._wal_end
        return v if type(v) is LSN else _new_lsn(LSN, v)

    @property
    def send_time(self) -> datetime:
        return pg_us_to_datetime(self.send_time_us, protocol=PROTOCOL, what="send time")

    @property
    def data_end(self) -> LSN:
        """``data_start + len(data)``: the position just past this chunk."""
        return LSN(int(self._data_start) + len(self.data))

    def to_bytes(self) -> bytes:
        return build_xlog_data(
            self.data_start, self.wal_end, self.data, send_time_us=self.send_time_us
        )


class PrimaryKeepalive(ReplicationFrame):
    """``'k'``: the server is alive; ``reply_requested`` asks for a status update now."""

    __slots__ = ("wal_end", "send_time_us", "reply_requested")
    type = "k"
    name = "PrimaryKeepalive"
    _fields = ("wal_end", "send_time_us", "reply_requested")

    def __init__(self, wal_end: LSN, send_time_us: int, reply_requested: bool) -> None:
        self.wal_end = wal_end
        self.send_time_us = send_time_us
        self.reply_requested = reply_requested

    @property
    def send_time(self) -> datetime:
        return pg_us_to_datetime(self.send_time_us, protocol=PROTOCOL, what="send time")

    def to_bytes(self) -> bytes:
        return build_primary_keepalive(
            self.wal_end, send_time_us=self.send_time_us, reply_requested=self.reply_requested
        )


class StandbyStatusUpdate(ReplicationFrame):
    """``'r'`` (client -> server): positions written, flushed and applied, plus one."""

    __slots__ = ("write", "flush", "apply", "send_time_us", "reply_requested")
    type = "r"
    name = "StandbyStatusUpdate"
    _fields = ("write", "flush", "apply", "send_time_us", "reply_requested")

    def __init__(
        self, write: LSN, flush: LSN, apply: LSN, send_time_us: int, reply_requested: bool
    ) -> None:
        self.write = write
        self.flush = flush
        self.apply = apply
        self.send_time_us = send_time_us
        self.reply_requested = reply_requested

    @property
    def send_time(self) -> datetime:
        return pg_us_to_datetime(self.send_time_us, protocol=PROTOCOL, what="send time")

    def to_bytes(self) -> bytes:
        return build_standby_status_update(
            self.write,
            self.flush,
            self.apply,
            send_time_us=self.send_time_us,
            reply_requested=self.reply_requested,
        )


class HotStandbyFeedback(ReplicationFrame):
    """``'h'`` (client -> server): the standby's xmin and catalog_xmin with epochs."""

    __slots__ = ("send_time_us", "xmin", "xmin_epoch", "catalog_xmin", "catalog_xmin_epoch")
    type = "h"
    name = "HotStandbyFeedback"
    _fields = ("send_time_us", "xmin", "xmin_epoch", "catalog_xmin", "catalog_xmin_epoch")

    def __init__(
        self,
        send_time_us: int,
        xmin: int,
        xmin_epoch: int,
        catalog_xmin: int,
        catalog_xmin_epoch: int,
    ) -> None:
        self.send_time_us = send_time_us
        self.xmin = xmin
        self.xmin_epoch = xmin_epoch
        self.catalog_xmin = catalog_xmin
        self.catalog_xmin_epoch = catalog_xmin_epoch

    @property
    def send_time(self) -> datetime:
        return pg_us_to_datetime(self.send_time_us, protocol=PROTOCOL, what="send time")

    @property
    def stops_feedback(self) -> bool:
        """xmin and catalog_xmin both 0: "no more hot standby feedback on this connection"."""
        return self.xmin == 0 and self.catalog_xmin == 0

    def to_bytes(self) -> bytes:
        return build_hot_standby_feedback(
            xmin=self.xmin,
            xmin_epoch=self.xmin_epoch,
            catalog_xmin=self.catalog_xmin,
            catalog_xmin_epoch=self.catalog_xmin_epoch,
            send_time_us=self.send_time_us,
        )


class NewArchive(ReplicationFrame):
    """``'n'`` (BASE_BACKUP): a new tar archive starts (one for the data directory,
    one per extra tablespace)."""

    __slots__ = ("archive_name", "tablespace_location")
    type = "n"
    name = "NewArchive"
    _fields = ("archive_name", "tablespace_location")

    def __init__(self, archive_name: str, tablespace_location: str) -> None:
        self.archive_name = archive_name
        """The archive's file name, e.g. ``base.tar`` or ``16385.tar``."""
        self.tablespace_location = tablespace_location
        """The tablespace's directory; the empty string for the main data directory."""

    @property
    def is_base_directory(self) -> bool:
        return self.tablespace_location == ""

    def to_bytes(self) -> bytes:
        return build_new_archive(self.archive_name, self.tablespace_location)


class ManifestStart(ReplicationFrame):
    """``'m'`` (BASE_BACKUP): the backup manifest starts; following ``'d'`` are its bytes."""

    __slots__ = ()
    type = "m"
    name = "ManifestStart"

    def to_bytes(self) -> bytes:
        return build_manifest_start()


class ArchiveData(ReplicationFrame):
    """``'d'`` (BASE_BACKUP): bytes of the current archive or of the manifest."""

    __slots__ = ("data",)
    type = "d"
    name = "ArchiveData"
    _fields = ("data",)

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = data

    def to_bytes(self) -> bytes:
        return build_archive_data(self.data)


class Progress(ReplicationFrame):
    """``'p'`` (BASE_BACKUP): bytes done so far in the current tablespace."""

    __slots__ = ("bytes_done",)
    type = "p"
    name = "Progress"
    _fields = ("bytes_done",)

    def __init__(self, bytes_done: int) -> None:
        self.bytes_done = bytes_done

    def to_bytes(self) -> bytes:
        return build_progress(self.bytes_done)


# -- parsing --------------------------------------------------------------------------


def _buffer(data: Any) -> bytes | memoryview:
    """Bytes stay bytes; a memoryview becomes a flat unsigned-byte view (no copy)."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, memoryview):
        if data.format != "B" or data.ndim != 1:
            data = data.cast("B")
        return data
    if isinstance(data, bytearray):
        return bytes(data)
    raise TypeError(f"CopyData payload must be bytes or memoryview, not {type(data).__name__}")


def _check_time(us: int, message_type: str, offset: int) -> None:
    if not MIN_PG_US <= us <= MAX_PG_US:
        raise InvalidFieldValue(
            f"send time {us} us since 2000-01-01 is outside years 1..9999",
            protocol=PROTOCOL,
            message_type=message_type,
            offset=offset,
        )


def _empty(kind: str) -> TruncatedMessage:
    return TruncatedMessage(
        f"empty {kind} CopyData message: no type byte", protocol=PROTOCOL, offset=0
    )


def _reader(buf: bytes | memoryview, message_type: str) -> Reader:
    r = Reader(buf, protocol=PROTOCOL, message_type=message_type)
    r.pos = 1
    return r


def _bool_byte(r: Reader, what: str) -> bool:
    pos = r.pos
    v = r.u8(what)
    if v > 1:
        raise r.error(InvalidFieldValue, f"{what} must be 0 or 1, got {v}", pos)
    return v == 1


def _time(r: Reader, what: str = "send time") -> int:
    pos = r.pos
    us = r.i64(what)
    _check_time(us, r.message_type or "", pos)
    return us


def _lsn_field(r: Reader, what: str) -> LSN:
    return wire_lsn(r.u64(what))


_XLOG_NAME = "XLogData ('w')"
_KEEPALIVE_NAME = "PrimaryKeepalive ('k')"
_STATUS_NAME = "StandbyStatusUpdate ('r')"
_FEEDBACK_NAME = "HotStandbyFeedback ('h')"


def parse_copy_data(data: bytes | memoryview) -> XLogData | PrimaryKeepalive:
    """Parse one server -> client CopyData payload of ``START_REPLICATION``.

    Raises :class:`TruncatedMessage`, :class:`TrailingBytes`,
    :class:`InvalidFieldValue`, :class:`UnknownMessageType` (a type byte the spec
    does not define) or :class:`UnexpectedMessage` (a client -> server type).
    """
    buf = data if type(data) is bytes else _buffer(data)
    n = len(buf)
    if n == 0:
        raise _empty("START_REPLICATION")
    t = buf[0]
    if t == 0x77:  # 'w' -- the hot path
        if n >= 25:
            start, end, ts = _XLOG_HDR.unpack_from(buf, 1)
            if not MIN_PG_US <= ts <= MAX_PG_US:
                _check_time(ts, _XLOG_NAME, 17)
            return XLogData(start, end, ts, buf[25:])
        r = _reader(buf, _XLOG_NAME)
        _lsn_field(r, "data start LSN")
        _lsn_field(r, "WAL end LSN")
        _time(r)
        raise AssertionError("unreachable: a short XLogData must fail above")  # pragma: no cover
    if t == 0x6B:  # 'k'
        if n == _KEEPALIVE_SIZE:
            end, ts, reply = _KEEPALIVE.unpack_from(buf, 1)
            if MIN_PG_US <= ts <= MAX_PG_US and reply <= 1:
                return PrimaryKeepalive(_new_lsn(LSN, end), ts, reply == 1)
        r = _reader(buf, _KEEPALIVE_NAME)
        end = _lsn_field(r, "WAL end LSN")
        ts = _time(r)
        reply = _bool_byte(r, "reply-requested flag")
        r.finish()
        return PrimaryKeepalive(end, ts, reply)  # pragma: no cover (fast path took it)
    if t in (0x72, 0x68):  # 'r', 'h'
        raise UnexpectedMessage(
            f"type {chr(t)!r} is a client -> server message; the server never sends it",
            protocol=PROTOCOL,
            message_type=f"START_REPLICATION CopyData ({chr(t)!r})",
            offset=0,
        )
    raise UnknownMessageType(
        f"unknown START_REPLICATION CopyData type byte 0x{t:02x} ({_show(t)}); "
        "expected 'w' (XLogData) or 'k' (keepalive)",
        protocol=PROTOCOL,
        offset=0,
    )


def _show(t: int) -> str:
    return repr(chr(t)) if 0x20 <= t < 0x7F else "not printable"


def parse_client_copy_data(data: bytes | memoryview) -> StandbyStatusUpdate | HotStandbyFeedback:
    """Parse one client -> server CopyData payload (``'r'`` or ``'h'``).

    The client side of the stream only ever builds these; this parser exists for
    round-trip tests and for fake servers.
    """
    buf = _buffer(data)
    if len(buf) == 0:
        raise _empty("client")
    t = buf[0]
    if t == 0x72:  # 'r'
        r = _reader(buf, _STATUS_NAME)
        write = _lsn_field(r, "write LSN")
        flush = _lsn_field(r, "flush LSN")
        apply = _lsn_field(r, "apply LSN")
        ts = _time(r)
        reply = _bool_byte(r, "reply-requested flag")
        r.finish()
        return StandbyStatusUpdate(write, flush, apply, ts, reply)
    if t == 0x68:  # 'h'
        r = _reader(buf, _FEEDBACK_NAME)
        ts = _time(r)
        xmin = r.u32("xmin")
        xmin_epoch = r.u32("xmin epoch")
        catalog_xmin = r.u32("catalog_xmin")
        catalog_epoch = r.u32("catalog_xmin epoch")
        r.finish()
        return HotStandbyFeedback(ts, xmin, xmin_epoch, catalog_xmin, catalog_epoch)
    if t in (0x77, 0x6B):
        raise UnexpectedMessage(
            f"type {chr(t)!r} is a server -> client message, not a client reply",
            protocol=PROTOCOL,
            message_type=f"client CopyData ({chr(t)!r})",
            offset=0,
        )
    raise UnknownMessageType(
        f"unknown client CopyData type byte 0x{t:02x} ({_show(t)}); "
        "expected 'r' (standby status update) or 'h' (hot standby feedback)",
        protocol=PROTOCOL,
        offset=0,
    )


_MANIFEST_START = ManifestStart()


def parse_base_backup_copy_data(
    data: bytes | memoryview,
) -> NewArchive | ManifestStart | ArchiveData | Progress:
    """Parse one CopyData payload of ``BASE_BACKUP`` (PostgreSQL 15+ protocol)."""
    buf = _buffer(data)
    n = len(buf)
    if n == 0:
        raise _empty("BASE_BACKUP")
    t = buf[0]
    if t == 0x64:  # 'd' -- the hot path
        return ArchiveData(buf[1:])
    if t == 0x6E:  # 'n'
        r = _reader(buf, "new archive ('n')")
        archive_name = r.cstring("archive file name")
        location = r.cstring("tablespace location")
        r.finish()
        if not archive_name:
            raise r.error(InvalidFieldValue, "archive file name is empty", 1)
        return NewArchive(archive_name, location)
    if t == 0x6D:  # 'm'
        if n != 1:
            raise TrailingBytes(
                f"{n - 1} unexpected bytes after the last field",
                protocol=PROTOCOL,
                message_type="manifest ('m')",
                offset=1,
            )
        return _MANIFEST_START
    if t == 0x70:  # 'p'
        r = _reader(buf, "progress report ('p')")
        pos = r.pos
        done = r.i64("bytes done")
        r.finish()
        if done < 0:
            raise r.error(InvalidFieldValue, f"bytes done is negative: {done}", pos)
        return Progress(done)
    raise UnknownMessageType(
        f"unknown BASE_BACKUP CopyData type byte 0x{t:02x} ({_show(t)}); "
        "expected 'n', 'm', 'd' or 'p'",
        protocol=PROTOCOL,
        offset=0,
    )


# -- building -------------------------------------------------------------------------


def _lsn_arg(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise FrameBuildError(f"{what} must be an LSN, an int or 'X/Y' text, not {value!r}")
    try:
        return int(LSN(value))
    except (InvalidLSN, TypeError, ValueError) as exc:
        raise FrameBuildError(f"{what}: {exc}") from None


def _time_arg(send_time_us: int | None) -> int:
    if send_time_us is None:
        return now_pg_us()
    if isinstance(send_time_us, datetime):
        send_time_us = datetime_to_pg_us(send_time_us)
    if isinstance(send_time_us, bool) or not isinstance(send_time_us, int):
        raise FrameBuildError(
            f"send_time_us must be an int (microseconds since 2000-01-01), "
            f"not {type(send_time_us).__name__}"
        )
    if not MIN_PG_US <= send_time_us <= MAX_PG_US:
        raise FrameBuildError(f"send_time_us {send_time_us} is outside years 1..9999")
    return send_time_us


def _u32_arg(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _U32_MAX:
        raise FrameBuildError(f"{what} must be an int in 0..{_U32_MAX}, got {value!r}")
    return value


def build_standby_status_update(
    write: int,
    flush: int,
    apply: int,
    *,
    send_time_us: int | None = None,
    reply_requested: bool = False,
) -> bytes:
    """The ``'r'`` payload: WAL positions + 1 of the last byte written, flushed, applied.

    ``send_time_us`` defaults to now (``datetime`` is accepted too).
    """
    return b"r" + _STATUS.pack(
        _lsn_arg(write, "write LSN"),
        _lsn_arg(flush, "flush LSN"),
        _lsn_arg(apply, "apply LSN"),
        _time_arg(send_time_us),
        1 if reply_requested else 0,
    )


def build_hot_standby_feedback(
    *,
    xmin: int = 0,
    xmin_epoch: int = 0,
    catalog_xmin: int = 0,
    catalog_xmin_epoch: int = 0,
    send_time_us: int | None = None,
) -> bytes:
    """The ``'h'`` payload. All four xid fields 0 (the default) stops the feedback."""
    return b"h" + _FEEDBACK.pack(
        _time_arg(send_time_us),
        _u32_arg(xmin, "xmin"),
        _u32_arg(xmin_epoch, "xmin epoch"),
        _u32_arg(catalog_xmin, "catalog_xmin"),
        _u32_arg(catalog_xmin_epoch, "catalog_xmin epoch"),
    )


def build_xlog_data(
    data_start: int,
    wal_end: int,
    data: bytes | memoryview,
    *,
    send_time_us: int | None = None,
) -> bytes:
    """The ``'w'`` payload (server side: for tests and fake servers)."""
    return (
        b"w"
        + _XLOG_HDR.pack(
            _lsn_arg(data_start, "data start LSN"),
            _lsn_arg(wal_end, "WAL end LSN"),
            _time_arg(send_time_us),
        )
        + bytes(data)
    )


def build_primary_keepalive(
    wal_end: int, *, send_time_us: int | None = None, reply_requested: bool = False
) -> bytes:
    """The ``'k'`` payload (server side: for tests and fake servers)."""
    return b"k" + _KEEPALIVE.pack(
        _lsn_arg(wal_end, "WAL end LSN"), _time_arg(send_time_us), 1 if reply_requested else 0
    )


def _cstring_arg(value: str, what: str) -> bytes:
    if not isinstance(value, str):
        raise FrameBuildError(f"{what} must be a str, not {type(value).__name__}")
    if "\x00" in value:
        raise FrameBuildError(f"{what} contains a NUL byte: {value!r}")
    return value.encode("utf-8") + b"\x00"


def build_new_archive(archive_name: str, tablespace_location: str = "") -> bytes:
    """The ``'n'`` payload (server side: for tests and fake servers)."""
    if not archive_name:
        raise FrameBuildError("archive file name must not be empty")
    return (
        b"n"
        + _cstring_arg(archive_name, "archive file name")
        + _cstring_arg(tablespace_location, "tablespace location")
    )


def build_manifest_start() -> bytes:
    """The ``'m'`` payload."""
    return b"m"


def build_archive_data(data: bytes | memoryview) -> bytes:
    """The ``'d'`` payload."""
    return b"d" + bytes(data)


def build_progress(bytes_done: int) -> bytes:
    """The ``'p'`` payload."""
    if isinstance(bytes_done, bool) or not isinstance(bytes_done, int):
        raise FrameBuildError(f"bytes_done must be an int, not {type(bytes_done).__name__}")
    if not 0 <= bytes_done <= _I64_MAX:
        raise FrameBuildError(f"bytes_done must be in 0..2^63-1, got {bytes_done}")
    return b"p" + _PROGRESS.pack(bytes_done)
