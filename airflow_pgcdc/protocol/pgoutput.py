"""Decoder and encoder of the ``pgoutput`` logical replication messages, versions 1-4.

Sans-IO: :class:`PgoutputDecoder.decode` takes the payload of one ``XLogData`` frame
(exactly one pgoutput message) and returns a typed message object; nothing here
touches a socket. :func:`encode_message` does the reverse and is used by tests, fuzz
seeds and the benchmark. The reference is ``shared/spec/000_*.txt`` (PostgreSQL docs
53.9 "Logical Replication Message Formats"), checked against the PostgreSQL sources.

Messages
--------
One class per message, each with ``__slots__``, a ``type`` class attribute (the
snake_case name used in JSON) and ``to_dict()`` (JSON-ready: LSNs as ``X/Y``,
timestamps ISO-8601, bytes base64). LSN fields are :class:`~.lsn.LSN` instances,
timestamps aware UTC :class:`~datetime.datetime` objects.

TupleData representation
------------------------
A row image (``TupleData``) is a plain Python ``tuple`` with one item per column:

=====================  ===========  =========================================
item                   wire kind    meaning
=====================  ===========  =========================================
``None``               ``'n'``      SQL NULL
``UNCHANGED_TOAST``    ``'u'``      unchanged TOASTed value, not sent
``str``                ``'t'``      text-format value, decoded with the
                                    decoder's ``encoding`` (default UTF-8)
``bytes``              ``'b'``      binary-format value (``binary = true``)
=====================  ===========  =========================================

:data:`UNCHANGED_TOAST` is a dedicated singleton object, *not* the string ``'u'``: a
text column whose value is ``"u"`` must stay distinguishable from an unchanged TOAST
value (and CPython interns one-character strings, so identity would not help).
Test it with ``value is UNCHANGED_TOAST``; :func:`kind_of` maps any item back to its
kind letter and :data:`TUPLE_KINDS` lists the letters.

Field presence (what the decoder expects, per protocol version and stream state)
-----------------------------------------------------------------------------------
* The Int32 xid of Message, Relation, Type, Insert, Update, Delete and Truncate is
  present only in protocol >= 2 *and* only between Stream Start and Stream Stop. The
  decoder tracks that state (:attr:`PgoutputDecoder.in_stream`); outside a stream
  block ``xid`` is ``None``.
* Stream Start/Stop/Commit/Abort exist from version 2, Begin Prepare, Prepare,
  Commit Prepared, Rollback Prepared and Stream Prepare from version 3; any other
  version gets :class:`~airflow_pgcdc.errors.UnknownMessageType`.
* Stream Abort: the spec says abort LSN and abort timestamp are present "since
  protocol version 4". PostgreSQL (16+, ``logicalrep_write_stream_abort``) actually
  writes them only when the subscriber asked for ``streaming = parallel`` as well.
  Hence the ``parallel_streaming`` option: without it a Stream Abort is exactly
  ``tag + xid + subxid``; with it (requires version >= 4) both the 9-byte and the
  25-byte forms are accepted and ``abort_lsn``/``abort_timestamp`` are ``None`` in the
  short one. Any other length is an error.
* Flow: Stream Start inside a stream block and Stream Stop outside one raise
  :class:`~airflow_pgcdc.errors.UnexpectedMessage`. Stream Commit, Stream Abort,
  Stream Prepare and the transaction-control messages (Begin, Commit, Begin Prepare,
  Prepare, Commit Prepared, Rollback Prepared) are only accepted *outside* a stream
  block; inside one only changes (Relation, Type, Insert, Update, Delete, Truncate,
  Message), Origin and Stream Stop may appear.

Strictness and leniency beyond the spec text
--------------------------------------------
* The "currently unused" ``Int8(0)`` flags of Commit, Stream Commit, Prepare, Commit
  Prepared, Rollback Prepared and Stream Prepare must be 0, as PostgreSQL's own
  subscriber requires (``logicalrep_read_*``; a new meaning would come with a new
  protocol version).
* Where the spec lists the values of a field, others are rejected
  (:class:`~airflow_pgcdc.errors.InvalidFieldValue`): Message flags 0/1, Stream
  Start's first-segment flag 0/1, replica identity ``d``/``n``/``f``/``i``.
  PostgreSQL's subscriber is laxer here; a change in these would break our reading of
  the stream, so we prefer to stop.
* Relation column flags and Truncate option bits are kept raw and unknown bits are
  accepted (``is_key`` tests bit 1; ``cascade``/``restart_identity`` bits 1 and 2).
* Update and Delete tuple-type bytes: a byte that is none of ``K``/``O``/``N`` raises
  :class:`~airflow_pgcdc.errors.UnknownMessageType`; a known one in a place where it
  is not allowed (``N`` in a Delete, ``K`` twice) raises ``InvalidFieldValue``.

Speed
-----
TupleData is decoded by an optimistic loop (one ``struct.unpack_from`` per column,
slicing, no per-column bounds checks; an all-ASCII tuple is decoded as latin-1 once
and sliced) that falls back to a fully checked parser whenever anything is off, so
errors stay precise. Insert outside stream blocks has that loop inlined. About
0.55-0.6 M five-column Inserts per second on one core of the CI machine
(``bench/decode.py``).

Every malformed input raises a :class:`~airflow_pgcdc.errors.ProtocolError` subclass
with ``protocol="pgoutput"``, ``message_type`` such as ``"Insert ('I')"`` and the byte
offset inside the message; no ``IndexError``, ``struct.error``, ``UnicodeDecodeError``
or ``OverflowError`` escapes.
"""

from __future__ import annotations

import base64
import codecs
import struct
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Union

from airflow_pgcdc.errors import (
    InvalidFieldValue,
    ProtocolError,
    TrailingBytes,
    TruncatedMessage,
    UnexpectedMessage,
    UnknownMessageType,
)
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.pgtime import datetime_to_pg_us, pg_us_to_datetime

__all__ = [
    "PROTOCOL",
    "MIN_PROTO_VERSION",
    "MAX_PROTO_VERSION",
    "UNCHANGED_TOAST",
    "TUPLE_KINDS",
    "TupleValue",
    "TupleData",
    "kind_of",
    "tuple_to_json",
    "Message",
    "Begin",
    "LogicalMessage",
    "Commit",
    "Origin",
    "RelationColumn",
    "Relation",
    "Type",
    "Insert",
    "Update",
    "Delete",
    "Truncate",
    "StreamStart",
    "StreamStop",
    "StreamCommit",
    "StreamAbort",
    "BeginPrepare",
    "Prepare",
    "CommitPrepared",
    "RollbackPrepared",
    "StreamPrepare",
    "MESSAGE_CLASSES",
    "PgoutputDecoder",
    "encode_message",
    "encode_tuple",
]

PROTOCOL = "pgoutput"
MIN_PROTO_VERSION = 1
MAX_PROTO_VERSION = 4


# ---------------------------------------------------------------------------------------
# TupleData values
# ---------------------------------------------------------------------------------------
class _UnchangedToast:
    """The type of :data:`UNCHANGED_TOAST` (one instance per process, pickles to it)."""

    __slots__ = ()
    _instance: ClassVar[_UnchangedToast | None] = None

    def __new__(cls) -> _UnchangedToast:
        inst = cls._instance
        if inst is None:
            inst = cls._instance = super().__new__(cls)
        return inst

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        return "UNCHANGED_TOAST"  # pickle by reference to the module global

    def __copy__(self) -> _UnchangedToast:
        return self

    def __deepcopy__(self, memo: Any) -> _UnchangedToast:
        return self


UNCHANGED_TOAST = _UnchangedToast()
"""A TupleData item for kind ``'u'``: an unchanged TOASTed value that was not sent."""

TUPLE_KINDS = "nutb"
"""The TupleData kind letters: ``n`` NULL (``None``), ``u`` unchanged TOAST
(:data:`UNCHANGED_TOAST`), ``t`` text (``str``), ``b`` binary (``bytes``)."""

TupleValue = Union[None, _UnchangedToast, str, bytes]  # noqa: UP007 (runtime alias)
TupleData = tuple[TupleValue, ...]


def kind_of(value: TupleValue) -> str:
    """The TupleData kind letter (``n``, ``u``, ``t``, ``b``) of one decoded item."""
    if value is None:
        return "n"
    if value is UNCHANGED_TOAST:
        return "u"
    if isinstance(value, str):
        return "t"
    if isinstance(value, bytes | bytearray | memoryview):
        return "b"
    raise TypeError(f"not a TupleData value: {type(value).__name__}")


def tuple_to_json(values: TupleData | None) -> list[dict[str, Any]] | None:
    """``[{"kind": "t", "value": "42"}, ...]``; binary values base64, n/u as null."""
    if values is None:
        return None
    out = []
    for v in values:
        if v is None:
            out.append({"kind": "n", "value": None})
        elif v is UNCHANGED_TOAST:
            out.append({"kind": "u", "value": None})
        elif isinstance(v, str):
            out.append({"kind": "t", "value": v})
        else:
            out.append({"kind": "b", "value": base64.b64encode(bytes(v)).decode("ascii")})
    return out


# ---------------------------------------------------------------------------------------
# Message classes
# ---------------------------------------------------------------------------------------
def _json_value(name: str, value: Any) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, LSN):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if name in ("key", "old", "new"):
        return tuple_to_json(value)
    if isinstance(value, tuple | list):
        return [v.to_dict() if hasattr(v, "to_dict") else _json_value(name, v) for v in value]
    return value


class Message:
    """Base class of every pgoutput message."""

    __slots__ = ()
    type: ClassVar[str]
    """The snake_case message name used in JSON output (``"insert"``, ...)."""
    tag: ClassVar[int]
    """The message type byte (``ord('I')`` ...)."""
    label: ClassVar[str]
    """How errors name the message: ``"Insert ('I')"``."""
    min_version: ClassVar[int] = 1
    """The first protocol version that has this message."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: ``{"type": ..., field: value, ...}``."""
        d: dict[str, Any] = {"type": self.type}
        for name in self.__slots__:
            d[name] = _json_value(name, getattr(self, name))
        return d

    def encode(
        self,
        proto_version: int,
        *,
        parallel_streaming: bool = False,
        in_stream: bool | None = None,
        encoding: str = "utf-8",
    ) -> bytes:
        """The exact wire bytes of this message (see :func:`encode_message`)."""
        return encode_message(
            self,
            proto_version,
            parallel_streaming=parallel_streaming,
            in_stream=in_stream,
            encoding=encoding,
        )


_DC = dataclass(slots=True, eq=True, repr=True)


@_DC
class Begin(Message):
    type: ClassVar[str] = "begin"
    tag: ClassVar[int] = ord("B")
    label: ClassVar[str] = "Begin ('B')"

    final_lsn: LSN
    commit_timestamp: datetime
    xid: int


@_DC
class LogicalMessage(Message):
    """A ``pg_logical_emit_message`` message (``'M'``)."""

    type: ClassVar[str] = "message"
    tag: ClassVar[int] = ord("M")
    label: ClassVar[str] = "Message ('M')"

    xid: int | None
    flags: int
    lsn: LSN
    prefix: str
    content: bytes

    @property
    def transactional(self) -> bool:
        return bool(self.flags & 1)

    def to_dict(self) -> dict[str, Any]:
        d = Message.to_dict(self)
        d["transactional"] = self.transactional
        try:
            d["content_text"] = self.content.decode("utf-8")
        except UnicodeDecodeError:
            pass
        return d


@_DC
class Commit(Message):
    type: ClassVar[str] = "commit"
    tag: ClassVar[int] = ord("C")
    label: ClassVar[str] = "Commit ('C')"

    flags: int
    commit_lsn: LSN
    end_lsn: LSN
    commit_timestamp: datetime


@_DC
class Origin(Message):
    type: ClassVar[str] = "origin"
    tag: ClassVar[int] = ord("O")
    label: ClassVar[str] = "Origin ('O')"

    commit_lsn: LSN
    """The LSN of the commit on the origin server."""
    name: str
    """Name of the origin."""


@_DC
class RelationColumn:
    """One column of a :class:`Relation` message."""

    flags: int
    name: str
    type_oid: int
    type_modifier: int

    @property
    def is_key(self) -> bool:
        """True if the column is part of the replica identity (flag bit 1)."""
        return bool(self.flags & 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "flags": self.flags,
            "name": self.name,
            "type_oid": self.type_oid,
            "type_modifier": self.type_modifier,
            "is_key": self.is_key,
        }


@_DC
class Relation(Message):
    type: ClassVar[str] = "relation"
    tag: ClassVar[int] = ord("R")
    label: ClassVar[str] = "Relation ('R')"

    xid: int | None
    relation_oid: int
    namespace: str
    """Schema name; empty for ``pg_catalog``."""
    relation_name: str
    replica_identity: str
    """``relreplident``: ``'d'`` default, ``'n'`` nothing, ``'f'`` full, ``'i'`` index."""
    columns: tuple[RelationColumn, ...]


@_DC
class Type(Message):
    type: ClassVar[str] = "type"
    tag: ClassVar[int] = ord("Y")
    label: ClassVar[str] = "Type ('Y')"

    xid: int | None
    type_oid: int
    namespace: str
    type_name: str


@_DC
class Insert(Message):
    type: ClassVar[str] = "insert"
    tag: ClassVar[int] = ord("I")
    label: ClassVar[str] = "Insert ('I')"

    xid: int | None
    relation_oid: int
    new: TupleData


@_DC
class Update(Message):
    type: ClassVar[str] = "update"
    tag: ClassVar[int] = ord("U")
    label: ClassVar[str] = "Update ('U')"

    xid: int | None
    relation_oid: int
    key: TupleData | None
    """The old key ('K'), sent when the update changed a replica identity column."""
    old: TupleData | None
    """The old row ('O'), sent with REPLICA IDENTITY FULL."""
    new: TupleData


@_DC
class Delete(Message):
    type: ClassVar[str] = "delete"
    tag: ClassVar[int] = ord("D")
    label: ClassVar[str] = "Delete ('D')"

    xid: int | None
    relation_oid: int
    key: TupleData | None
    old: TupleData | None


TRUNCATE_CASCADE = 1
TRUNCATE_RESTART_IDENTITY = 2


@_DC
class Truncate(Message):
    type: ClassVar[str] = "truncate"
    tag: ClassVar[int] = ord("T")
    label: ClassVar[str] = "Truncate ('T')"

    xid: int | None
    options: int
    relation_oids: tuple[int, ...]

    @property
    def cascade(self) -> bool:
        return bool(self.options & TRUNCATE_CASCADE)

    @property
    def restart_identity(self) -> bool:
        return bool(self.options & TRUNCATE_RESTART_IDENTITY)

    def to_dict(self) -> dict[str, Any]:
        d = Message.to_dict(self)
        d["cascade"] = self.cascade
        d["restart_identity"] = self.restart_identity
        return d


@_DC
class StreamStart(Message):
    type: ClassVar[str] = "stream_start"
    tag: ClassVar[int] = ord("S")
    label: ClassVar[str] = "Stream Start ('S')"
    min_version: ClassVar[int] = 2

    xid: int
    first_segment: bool


@_DC
class StreamStop(Message):
    type: ClassVar[str] = "stream_stop"
    tag: ClassVar[int] = ord("E")
    label: ClassVar[str] = "Stream Stop ('E')"
    min_version: ClassVar[int] = 2


@_DC
class StreamCommit(Message):
    type: ClassVar[str] = "stream_commit"
    tag: ClassVar[int] = ord("c")
    label: ClassVar[str] = "Stream Commit ('c')"
    min_version: ClassVar[int] = 2

    xid: int
    flags: int
    commit_lsn: LSN
    end_lsn: LSN
    commit_timestamp: datetime


@_DC
class StreamAbort(Message):
    """Abort of a streamed (sub)transaction.

    ``abort_lsn`` / ``abort_timestamp`` are ``None`` unless the server sent them
    (protocol >= 4 with ``streaming = parallel``; see the module docstring).
    """

    type: ClassVar[str] = "stream_abort"
    tag: ClassVar[int] = ord("A")
    label: ClassVar[str] = "Stream Abort ('A')"
    min_version: ClassVar[int] = 2

    xid: int
    subxid: int
    abort_lsn: LSN | None = None
    abort_timestamp: datetime | None = None


@_DC
class BeginPrepare(Message):
    type: ClassVar[str] = "begin_prepare"
    tag: ClassVar[int] = ord("b")
    label: ClassVar[str] = "Begin Prepare ('b')"
    min_version: ClassVar[int] = 3

    prepare_lsn: LSN
    end_lsn: LSN
    prepare_timestamp: datetime
    xid: int
    gid: str


@_DC
class Prepare(Message):
    type: ClassVar[str] = "prepare"
    tag: ClassVar[int] = ord("P")
    label: ClassVar[str] = "Prepare ('P')"
    min_version: ClassVar[int] = 3

    flags: int
    prepare_lsn: LSN
    end_lsn: LSN
    prepare_timestamp: datetime
    xid: int
    gid: str


@_DC
class CommitPrepared(Message):
    type: ClassVar[str] = "commit_prepared"
    tag: ClassVar[int] = ord("K")
    label: ClassVar[str] = "Commit Prepared ('K')"
    min_version: ClassVar[int] = 3

    flags: int
    commit_lsn: LSN
    end_lsn: LSN
    commit_timestamp: datetime
    xid: int
    gid: str


@_DC
class RollbackPrepared(Message):
    type: ClassVar[str] = "rollback_prepared"
    tag: ClassVar[int] = ord("r")
    label: ClassVar[str] = "Rollback Prepared ('r')"
    min_version: ClassVar[int] = 3

    flags: int
    prepare_end_lsn: LSN
    rollback_end_lsn: LSN
    prepare_timestamp: datetime
    rollback_timestamp: datetime
    xid: int
    gid: str


@_DC
class StreamPrepare(Message):
    type: ClassVar[str] = "stream_prepare"
    tag: ClassVar[int] = ord("p")
    label: ClassVar[str] = "Stream Prepare ('p')"
    min_version: ClassVar[int] = 3

    flags: int
    prepare_lsn: LSN
    end_lsn: LSN
    prepare_timestamp: datetime
    xid: int
    gid: str


MESSAGE_CLASSES: tuple[type[Message], ...] = (
    Begin,
    LogicalMessage,
    Commit,
    Origin,
    Relation,
    Type,
    Insert,
    Update,
    Delete,
    Truncate,
    StreamStart,
    StreamStop,
    StreamCommit,
    StreamAbort,
    BeginPrepare,
    Prepare,
    CommitPrepared,
    RollbackPrepared,
    StreamPrepare,
)
"""Every message class, in spec order."""

_BY_TAG: dict[int, type[Message]] = {cls.tag: cls for cls in MESSAGE_CLASSES}
_STREAM_DATA = frozenset(ord(c) for c in "MRYIUDT")  # carry an xid inside a stream block
_REPLICA_IDENTITIES = frozenset("dnfi")

# ---------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------
_U8 = struct.Struct("!B")
_I16 = struct.Struct("!h")
_U32 = struct.Struct("!I")
_OID_B = struct.Struct("!IB")  # relation oid + submessage byte
_XID_OID_B = struct.Struct("!IIB")  # xid + relation oid + submessage byte
_UNPACK_U32 = _U32.unpack_from
_UNPACK_I16 = _I16.unpack_from
_UNPACK_OID_B = _OID_B.unpack_from
_UNPACK_OID_B_I16 = struct.Struct("!IBh").unpack_from  # relation oid + 'N' + column count
_UNPACK_XID_OID_B = _XID_OID_B.unpack_from
_UNPACK_XID_OID_B_I16 = struct.Struct("!IIBh").unpack_from  # xid + relation oid + 'N' + column count
_new_lsn = int.__new__  # LSN values straight from a "Q" unpack are always in range

_N, _K, _O = ord("N"), ord("K"), ord("O")
_2_31 = 1 << 31
_2_32 = 1 << 32


def _err(cls: type[ProtocolError], label: str | None, offset: int, reason: str) -> ProtocolError:
    return cls(reason, protocol=PROTOCOL, message_type=label, offset=offset)


class _Layout:
    """A fixed run of big-endian fields: one ``unpack_from`` plus precise errors."""

    __slots__ = ("struct", "unpack_from", "size", "fields")

    def __init__(self, *fields: tuple[str, str]) -> None:
        self.fields: list[tuple[str, int, int]] = []
        off = 0
        for name, code in fields:
            size = struct.calcsize("!" + code)
            self.fields.append((name, off, size))
            off += size
        self.struct = struct.Struct("!" + "".join(code for _, code in fields))
        self.unpack_from = self.struct.unpack_from
        self.size = self.struct.size

    def read(self, data: bytes, pos: int, label: str) -> tuple:
        if pos + self.size > len(data):
            raise self.truncated(data, pos, label)
        return self.unpack_from(data, pos)

    def truncated(self, data: bytes, pos: int, label: str) -> ProtocolError:
        left = len(data)
        for name, off, size in self.fields:
            if pos + off + size > left:
                have = max(left - pos - off, 0)
                return _err(
                    TruncatedMessage,
                    label,
                    pos + off,
                    f"truncated: {name} needs {size} bytes, {have} left",
                )
        raise AssertionError("layout fits")  # pragma: no cover


_L_BEGIN = _Layout(("final LSN", "Q"), ("commit timestamp", "q"), ("xid", "I"))
_L_COMMIT = _Layout(
    ("flags", "B"), ("commit LSN", "Q"), ("end LSN", "Q"), ("commit timestamp", "q")
)
_L_STREAM_COMMIT = _Layout(
    ("xid", "I"),
    ("flags", "B"),
    ("commit LSN", "Q"),
    ("end LSN", "Q"),
    ("commit timestamp", "q"),
)
_L_STREAM_START = _Layout(("xid", "I"), ("first segment flag", "B"))
_L_STREAM_ABORT = _Layout(("xid", "I"), ("subtransaction xid", "I"))
_L_STREAM_ABORT_V4 = _Layout(
    ("xid", "I"), ("subtransaction xid", "I"), ("abort LSN", "Q"), ("abort timestamp", "q")
)
_L_BEGIN_PREPARE = _Layout(
    ("prepare LSN", "Q"), ("end LSN", "Q"), ("prepare timestamp", "q"), ("xid", "I")
)
_L_PREPARE = _Layout(
    ("flags", "B"), ("prepare LSN", "Q"), ("end LSN", "Q"), ("prepare timestamp", "q"), ("xid", "I")
)
_L_COMMIT_PREPARED = _Layout(
    ("flags", "B"), ("commit LSN", "Q"), ("end LSN", "Q"), ("commit timestamp", "q"), ("xid", "I")
)
_L_ROLLBACK_PREPARED = _Layout(
    ("flags", "B"),
    ("prepare end LSN", "Q"),
    ("rollback end LSN", "Q"),
    ("prepare timestamp", "q"),
    ("rollback timestamp", "q"),
    ("xid", "I"),
)
_L_MESSAGE_HEAD = _Layout(("flags", "B"), ("message LSN", "Q"))
_L_RELATION_TAIL = _Layout(("replica identity", "B"), ("column count", "h"))
_L_COLUMN_TAIL = _Layout(("column type OID", "I"), ("column type modifier", "i"))
_L_TRUNCATE_HEAD = _Layout(("relation count", "i"), ("options", "B"))
_L_XID = _Layout(("xid", "I"))
_L_OID = _Layout(("OID", "I"))
_L_LSN = _Layout(("LSN", "Q"))
_L_LEN = _Layout(("content length", "i"))


def _ts(us: int, label: str, offset: int, what: str) -> datetime:
    """Wire microseconds -> aware UTC datetime (a typed error when out of range)."""
    try:
        return pg_us_to_datetime(us, protocol=PROTOCOL, what=what)
    except InvalidFieldValue as exc:
        raise _err(InvalidFieldValue, label, offset, exc.reason) from None


def _flags_zero(flags: int, label: str, offset: int) -> None:
    if flags:
        raise _err(InvalidFieldValue, label, offset, f"flags must be 0, got {flags:#04x}")


def _cstring(data: bytes, pos: int, label: str, what: str, encoding: str) -> tuple[str, int]:
    nul = data.find(b"\x00", pos)
    if nul < 0:
        raise _err(TruncatedMessage, label, pos, f"truncated: {what} has no NUL terminator")
    try:
        return data[pos:nul].decode(encoding), nul + 1
    except UnicodeDecodeError as exc:
        raise _err(
            InvalidFieldValue, label, pos + exc.start, f"{what} is not valid {encoding}"
        ) from None


def _finish(data: bytes, pos: int, label: str) -> None:
    if pos != len(data):
        raise _err(
            TrailingBytes, label, pos, f"{len(data) - pos} unexpected bytes after the last field"
        )


def _value_length_error(data: bytes, pos: int, ln: int, label: str) -> ProtocolError:
    """The column at ``pos`` announced length ``ln`` (unsigned) that does not fit."""
    if ln >= _2_31:
        return _err(InvalidFieldValue, label, pos + 1, f"negative column value length {ln - _2_32}")
    have = len(data) - pos - 5
    return _err(
        TruncatedMessage, label, pos + 5, f"truncated: column value needs {ln} bytes, {have} left"
    )


def _read_tuple(
    data: bytes, pos: int, encoding: str, label: str, ascii_ok: bool
) -> tuple[TupleData, int]:
    """Decode one TupleData starting at ``pos``; return ``(values, end position)``.

    The hot loop. It is optimistic: one ``unpack_from`` per text/binary column,
    slicing, no Reader calls and no per-column bounds checks. Lengths are read
    unsigned, so a bogus (negative or too large) length moves ``pos`` past the end;
    slicing never reads out of bounds; a read past the end raises
    ``IndexError``/``struct.error``. Whenever anything is off -- ``pos`` past the end
    afterwards, a column missing, an exception -- the tuple is parsed again by
    :func:`_read_tuple_checked`, which raises the precise typed error. Valid input
    never takes that path.

    ``ascii_ok`` says the text encoding maps bytes 0x00-0x7F to ASCII one to one.
    Then, when the tuple bytes are all ASCII (the common case: numbers, timestamps,
    identifiers), the message is decoded once as latin-1 and text values are plain
    ``str`` slices of it -- one allocation per column instead of two.
    """
    start = pos
    end = len(data)
    try:
        (ncols,) = _UNPACK_I16(data, pos)
        pos += 2
        values: list[TupleValue] = []
        append = values.append
        unpack_u32 = _UNPACK_U32
        if ascii_ok and (data.isascii() or data[pos:].isascii()):
            text = data.decode("latin-1")
            for _ in range(ncols):
                kind = data[pos]
                if kind == 116:  # 't'
                    (ln,) = unpack_u32(data, pos + 1)
                    pos += 5
                    append(text[pos : pos + ln])
                    pos += ln
                elif kind == 110:  # 'n'
                    append(None)
                    pos += 1
                elif kind == 117:  # 'u'
                    append(UNCHANGED_TOAST)
                    pos += 1
                elif kind == 98:  # 'b'
                    (ln,) = unpack_u32(data, pos + 1)
                    pos += 5
                    append(data[pos : pos + ln])
                    pos += ln
                else:
                    break
        else:
            for _ in range(ncols):
                kind = data[pos]
                if kind == 116:  # 't'
                    (ln,) = unpack_u32(data, pos + 1)
                    pos += 5
                    append(data[pos : pos + ln].decode(encoding))
                    pos += ln
                elif kind == 110:  # 'n'
                    append(None)
                    pos += 1
                elif kind == 117:  # 'u'
                    append(UNCHANGED_TOAST)
                    pos += 1
                elif kind == 98:  # 'b'
                    (ln,) = unpack_u32(data, pos + 1)
                    pos += 5
                    append(data[pos : pos + ln])
                    pos += ln
                else:
                    break
        if pos <= end and len(values) == ncols:
            return tuple(values), pos
    except (IndexError, struct.error, UnicodeDecodeError):
        pass
    return _read_tuple_checked(data, start, encoding, label)


def _read_tuple_checked(data: bytes, pos: int, encoding: str, label: str) -> tuple[TupleData, int]:
    """:func:`_read_tuple` with every length checked before use: raises the precise
    error (what, where) for malformed data. Used when the fast path stumbled."""
    end = len(data)
    if pos + 2 > end:
        raise _err(
            TruncatedMessage,
            label,
            pos,
            f"truncated: TupleData column count needs 2 bytes, {max(end - pos, 0)} left",
        )
    (ncols,) = _UNPACK_I16(data, pos)
    if ncols < 0:
        raise _err(InvalidFieldValue, label, pos, f"negative TupleData column count {ncols}")
    pos += 2
    if ncols > end - pos:  # every column needs at least its kind byte
        raise _err(
            TruncatedMessage,
            label,
            pos,
            f"truncated: TupleData announces {ncols} columns, only {end - pos} bytes left",
        )
    values: list[TupleValue] = []
    append = values.append
    unpack_u32 = _UNPACK_U32
    try:
        for _ in range(ncols):
            kind = data[pos]
            if kind == 116:  # 't'
                (ln,) = unpack_u32(data, pos + 1)
                stop = pos + 5 + ln
                if stop > end:
                    raise _value_length_error(data, pos, ln, label)
                append(data[pos + 5 : stop].decode(encoding))
                pos = stop
            elif kind == 110:  # 'n'
                append(None)
                pos += 1
            elif kind == 117:  # 'u'
                append(UNCHANGED_TOAST)
                pos += 1
            elif kind == 98:  # 'b'
                (ln,) = unpack_u32(data, pos + 1)
                stop = pos + 5 + ln
                if stop > end:
                    raise _value_length_error(data, pos, ln, label)
                append(data[pos + 5 : stop])
                pos = stop
            else:
                raise _err(
                    InvalidFieldValue,
                    label,
                    pos,
                    f"unknown TupleData column kind {_show_byte(kind)} (expected n, u, t or b)",
                )
    except IndexError:
        raise _err(
            TruncatedMessage, label, pos, "truncated: TupleData column kind missing"
        ) from None
    except struct.error:
        raise _err(
            TruncatedMessage,
            label,
            pos + 1,
            f"truncated: column value length needs 4 bytes, {end - pos - 1} left",
        ) from None
    except UnicodeDecodeError as exc:
        raise _err(
            InvalidFieldValue,
            label,
            pos + 5 + exc.start,
            f"text column value is not valid {encoding}: {exc.reason}",
        ) from None
    return tuple(values), pos


def _ascii_compatible(encoding: str) -> bool:
    """True if, in ``encoding``, a run of bytes below 0x80 always means those ASCII
    characters (UTF-8, LATIN1, the ISO 8859 and Windows code pages, EUC-*, GBK, ...).
    Stateful codecs (ISO-2022, UTF-7, HZ), where ASCII bytes can switch modes, are not."""
    name = codecs.lookup(encoding).name
    if name.startswith(("iso2022", "utf-7", "hz", "utf-16", "utf-32")):
        return False
    ascii_bytes = bytes(range(128))
    try:
        return ascii_bytes.decode(encoding) == ascii_bytes.decode("ascii")
    except UnicodeDecodeError:
        return False


def _show_byte(b: int) -> str:
    return f"{chr(b)!r} (0x{b:02x})" if 0x20 <= b < 0x7F else f"0x{b:02x}"


class PgoutputDecoder:
    """Stateful decoder of one pgoutput stream (one ``START_REPLICATION``).

    ``proto_version`` is the negotiated ``proto_version`` option (1-4);
    ``parallel_streaming`` says the subscriber asked for ``streaming = parallel``
    (protocol >= 4), which makes Stream Abort carry its LSN and timestamp; ``encoding``
    decodes text values and names (the session's client encoding).

    The decoder remembers whether it is inside a Stream Start ... Stream Stop block,
    which decides whether change messages carry an xid. Use one decoder per stream,
    or :meth:`reset` it when the stream restarts.
    """

    __slots__ = (
        "proto_version",
        "parallel_streaming",
        "encoding",
        "_in_stream",
        "_stream_xid",
        "_table",
        "_ascii_ok",
    )

    def __init__(
        self, proto_version: int, *, parallel_streaming: bool = False, encoding: str = "utf-8"
    ) -> None:
        if (
            isinstance(proto_version, bool)
            or not isinstance(proto_version, int)
            or not MIN_PROTO_VERSION <= proto_version <= MAX_PROTO_VERSION
        ):
            raise ValueError(
                f"pgoutput proto_version must be an int from {MIN_PROTO_VERSION} to "
                f"{MAX_PROTO_VERSION}, got {proto_version!r}"
            )
        if parallel_streaming and proto_version < 4:
            raise ValueError(
                f"parallel streaming needs pgoutput proto_version 4 or higher, got {proto_version}"
            )
        try:
            codecs.lookup(encoding)
        except LookupError:
            raise ValueError(f"unknown text encoding {encoding!r}") from None
        self.proto_version = proto_version
        self.parallel_streaming = bool(parallel_streaming)
        self.encoding = encoding
        self._ascii_ok = _ascii_compatible(encoding)
        self._in_stream = False
        self._stream_xid: int | None = None
        handlers = {
            Begin: self._begin,
            LogicalMessage: self._message,
            Commit: self._commit,
            Origin: self._origin,
            Relation: self._relation,
            Type: self._type,
            Insert: self._insert,
            Update: self._update,
            Delete: self._delete,
            Truncate: self._truncate,
            StreamStart: self._stream_start,
            StreamStop: self._stream_stop,
            StreamCommit: self._stream_commit,
            StreamAbort: self._stream_abort,
            BeginPrepare: self._begin_prepare,
            Prepare: self._prepare,
            CommitPrepared: self._commit_prepared,
            RollbackPrepared: self._rollback_prepared,
            StreamPrepare: self._stream_prepare,
        }
        table: list[Any] = [self._unknown] * 256
        for cls, fn in handlers.items():
            table[cls.tag] = fn if cls.min_version <= proto_version else self._too_new
        self._table = table

    # -- state -----------------------------------------------------------------------
    @property
    def in_stream(self) -> bool:
        """True between a Stream Start and its Stream Stop."""
        return self._in_stream

    @property
    def stream_xid(self) -> int | None:
        """The xid of the open stream block, or ``None``."""
        return self._stream_xid

    def reset(self) -> None:
        """Forget the stream state (call when a new ``START_REPLICATION`` begins)."""
        self._in_stream = False
        self._stream_xid = None

    # -- entry point -------------------------------------------------------------------
    def decode(self, data: bytes) -> Message:
        """Decode one pgoutput message (the payload of one XLogData frame)."""
        if type(data) is not bytes:
            data = bytes(data)
        try:
            handler = self._table[data[0]]
        except IndexError:
            raise _err(TruncatedMessage, None, 0, "empty message: no message type byte") from None
        return handler(data)

    def _unknown(self, data: bytes) -> Message:
        raise _err(
            UnknownMessageType,
            None,
            0,
            f"unknown message type byte {_show_byte(data[0])} "
            f"(pgoutput protocol version {self.proto_version})",
        )

    def _too_new(self, data: bytes) -> Message:
        cls = _BY_TAG[data[0]]
        raise _err(
            UnknownMessageType,
            cls.label,
            0,
            f"{cls.label} exists only in pgoutput protocol version {cls.min_version} and "
            f"later, the stream negotiated version {self.proto_version}",
        )

    def _outside_stream(self, label: str) -> None:
        if self._in_stream:
            raise _err(
                UnexpectedMessage,
                label,
                0,
                f"{label} inside the stream block of transaction {self._stream_xid} "
                "(expected Stream Stop first)",
            )

    # -- transaction control -------------------------------------------------------------
    def _begin(self, data: bytes) -> Begin:
        label = Begin.label
        self._outside_stream(label)
        lsn, ts, xid = _L_BEGIN.read(data, 1, label)
        _finish(data, 1 + _L_BEGIN.size, label)
        return Begin(_new_lsn(LSN, lsn), _ts(ts, label, 9, "commit timestamp"), xid)

    def _commit(self, data: bytes) -> Commit:
        label = Commit.label
        self._outside_stream(label)
        flags, lsn, end_lsn, ts = _L_COMMIT.read(data, 1, label)
        _flags_zero(flags, label, 1)
        _finish(data, 1 + _L_COMMIT.size, label)
        return Commit(flags, _new_lsn(LSN, lsn), _new_lsn(LSN, end_lsn), _ts(ts, label, 18, "commit timestamp"))

    def _origin(self, data: bytes) -> Origin:
        label = Origin.label
        (lsn,) = _L_LSN.read(data, 1, label)
        name, pos = _cstring(data, 9, label, "origin name", self.encoding)
        _finish(data, pos, label)
        return Origin(_new_lsn(LSN, lsn), name)

    # -- changes -----------------------------------------------------------------------
    def _xid(self, data: bytes, label: str) -> tuple[int | None, int]:
        """The xid of a change message inside a stream block, and the next position."""
        if self._in_stream:
            return _L_XID.read(data, 1, label)[0], 5
        return None, 1

    def _message(self, data: bytes) -> LogicalMessage:
        label = LogicalMessage.label
        xid, pos = self._xid(data, label)
        flags, lsn = _L_MESSAGE_HEAD.read(data, pos, label)
        if flags > 1:
            raise _err(
                InvalidFieldValue, label, pos, f"message flags must be 0 or 1, got {flags:#04x}"
            )
        prefix, pos = _cstring(data, pos + 9, label, "message prefix", self.encoding)
        (ln,) = _L_LEN.read(data, pos, label)
        if ln < 0:
            raise _err(InvalidFieldValue, label, pos, f"negative content length {ln}")
        pos += 4
        if pos + ln > len(data):
            raise _err(
                TruncatedMessage,
                label,
                pos,
                f"truncated: content needs {ln} bytes, {len(data) - pos} left",
            )
        content = data[pos : pos + ln]
        _finish(data, pos + ln, label)
        return LogicalMessage(xid, flags, _new_lsn(LSN, lsn), prefix, content)

    def _relation(self, data: bytes) -> Relation:
        label = Relation.label
        enc = self.encoding
        xid, pos = self._xid(data, label)
        (oid,) = _L_OID.read(data, pos, label)
        namespace, pos = _cstring(data, pos + 4, label, "namespace", enc)
        name, pos = _cstring(data, pos, label, "relation name", enc)
        ident, ncols = _L_RELATION_TAIL.read(data, pos, label)
        if chr(ident) not in _REPLICA_IDENTITIES:
            raise _err(
                InvalidFieldValue,
                label,
                pos,
                f"replica identity {_show_byte(ident)} is not one of d, n, f, i",
            )
        if ncols < 0:
            raise _err(InvalidFieldValue, label, pos + 1, f"negative column count {ncols}")
        pos += 3
        if ncols * 10 > len(data) - pos:  # flags + NUL + typid + typmod at least
            raise _err(
                TruncatedMessage,
                label,
                pos,
                f"truncated: {ncols} columns need at least {ncols * 10} bytes, "
                f"{len(data) - pos} left",
            )
        columns = []
        for _ in range(ncols):
            if pos >= len(data):
                raise _err(TruncatedMessage, label, pos, "truncated: column flags missing")
            flags = data[pos]
            cname, pos = _cstring(data, pos + 1, label, "column name", enc)
            typid, typmod = _L_COLUMN_TAIL.read(data, pos, label)
            pos += 8
            columns.append(RelationColumn(flags, cname, typid, typmod))
        _finish(data, pos, label)
        return Relation(xid, oid, namespace, name, chr(ident), tuple(columns))

    def _type(self, data: bytes) -> Type:
        label = Type.label
        xid, pos = self._xid(data, label)
        (oid,) = _L_OID.read(data, pos, label)
        namespace, pos = _cstring(data, pos + 4, label, "namespace", self.encoding)
        name, pos = _cstring(data, pos, label, "type name", self.encoding)
        _finish(data, pos, label)
        return Type(xid, oid, namespace, name)

    def _insert(self, data: bytes) -> Insert:
        """Insert, the hottest message: an inlined copy of :func:`_read_tuple`'s ASCII
        loop for the common case (an all-ASCII tuple, in or outside a stream block: a
        streamed transaction's inserts are decoded twice, when received and when
        replayed); anything else, including every malformed message, goes through
        :meth:`_insert_general`.
        """
        if self._ascii_ok:
            try:
                if self._in_stream:  # inside a stream block the xid comes first
                    xid, oid, sub, ncols = _UNPACK_XID_OID_B_I16(data, 1)
                    pos = 12
                else:
                    xid = None
                    oid, sub, ncols = _UNPACK_OID_B_I16(data, 1)
                    pos = 8
                if sub == 78 and (data.isascii() or data[pos:].isascii()):
                    text = data.decode("latin-1")
                    unpack_u32 = _UNPACK_U32
                    values: list[TupleValue] = []
                    append = values.append
                    for _ in range(ncols):
                        kind = data[pos]
                        if kind == 116:  # 't'
                            (ln,) = unpack_u32(data, pos + 1)
                            pos += 5
                            append(text[pos : pos + ln])
                            pos += ln
                        elif kind == 110:  # 'n'
                            append(None)
                            pos += 1
                        elif kind == 117:  # 'u'
                            append(UNCHANGED_TOAST)
                            pos += 1
                        elif kind == 98:  # 'b'
                            (ln,) = unpack_u32(data, pos + 1)
                            pos += 5
                            append(data[pos : pos + ln])
                            pos += ln
                        else:
                            break
                    if pos == len(data) and len(values) == ncols:
                        return Insert(xid, oid, tuple(values))
            except (IndexError, struct.error):
                pass
        return self._insert_general(data)

    def _insert_general(self, data: bytes) -> Insert:
        if self._in_stream:
            if len(data) < 10:
                raise _err_head(data, Insert.label, True)
            xid, oid, sub = _UNPACK_XID_OID_B(data, 1)
            pos = 10
        else:
            if len(data) < 6:
                raise _err_head(data, Insert.label, False)
            oid, sub = _UNPACK_OID_B(data, 1)
            xid = None
            pos = 6
        if sub != _N:
            raise _bad_sub(sub, pos - 1, Insert.label, "N")
        new, pos = _read_tuple(data, pos, self.encoding, Insert.label, self._ascii_ok)
        if pos != len(data):
            _finish(data, pos, Insert.label)
        return Insert(xid, oid, new)

    def _update(self, data: bytes) -> Update:
        label = Update.label
        enc = self.encoding
        if self._in_stream:
            if len(data) < 10:
                raise _err_head(data, label, True)
            xid, oid, sub = _UNPACK_XID_OID_B(data, 1)
            pos = 10
        else:
            if len(data) < 6:
                raise _err_head(data, label, False)
            oid, sub = _UNPACK_OID_B(data, 1)
            xid = None
            pos = 6
        key = old = None
        if sub == _K or sub == _O:
            image, pos = _read_tuple(data, pos, enc, label, self._ascii_ok)
            if sub == _K:
                key = image
            else:
                old = image
            if pos >= len(data):
                raise _err(TruncatedMessage, label, pos, "truncated: new tuple ('N') missing")
            sub = data[pos]
            pos += 1
            if sub != _N:
                raise _bad_sub(sub, pos - 1, label, "N")
        elif sub != _N:
            raise _bad_sub(sub, pos - 1, label, "K, O or N")
        new, pos = _read_tuple(data, pos, enc, label, self._ascii_ok)
        _finish(data, pos, label)
        return Update(xid, oid, key, old, new)

    def _delete(self, data: bytes) -> Delete:
        label = Delete.label
        if self._in_stream:
            if len(data) < 10:
                raise _err_head(data, label, True)
            xid, oid, sub = _UNPACK_XID_OID_B(data, 1)
            pos = 10
        else:
            if len(data) < 6:
                raise _err_head(data, label, False)
            oid, sub = _UNPACK_OID_B(data, 1)
            xid = None
            pos = 6
        if sub != _K and sub != _O:
            raise _bad_sub(sub, pos - 1, label, "K or O")
        image, pos = _read_tuple(data, pos, self.encoding, label, self._ascii_ok)
        _finish(data, pos, label)
        if sub == _K:
            return Delete(xid, oid, image, None)
        return Delete(xid, oid, None, image)

    def _truncate(self, data: bytes) -> Truncate:
        label = Truncate.label
        xid, pos = self._xid(data, label)
        nrel, options = _L_TRUNCATE_HEAD.read(data, pos, label)
        if nrel < 0:
            raise _err(InvalidFieldValue, label, pos, f"negative relation count {nrel}")
        pos += 5
        left = len(data) - pos
        if nrel * 4 > left:  # checked before anything is allocated
            raise _err(
                TruncatedMessage,
                label,
                pos + (left // 4) * 4,
                f"truncated: {nrel} relation OIDs need {nrel * 4} bytes, {left} left",
            )
        oids = struct.unpack_from(f"!{nrel}I", data, pos)
        _finish(data, pos + nrel * 4, label)
        return Truncate(xid, options, oids)

    # -- streaming (v2+) ---------------------------------------------------------------
    def _stream_start(self, data: bytes) -> StreamStart:
        label = StreamStart.label
        if self._in_stream:
            raise _err(
                UnexpectedMessage,
                label,
                0,
                f"Stream Start while the stream block of transaction {self._stream_xid} "
                "is still open",
            )
        xid, first = _L_STREAM_START.read(data, 1, label)
        if first > 1:
            raise _err(
                InvalidFieldValue, label, 5, f"first-segment flag must be 0 or 1, got {first}"
            )
        _finish(data, 1 + _L_STREAM_START.size, label)
        self._in_stream = True
        self._stream_xid = xid
        return StreamStart(xid, first == 1)

    def _stream_stop(self, data: bytes) -> StreamStop:
        label = StreamStop.label
        if not self._in_stream:
            raise _err(UnexpectedMessage, label, 0, "Stream Stop without a Stream Start")
        _finish(data, 1, label)
        self._in_stream = False
        self._stream_xid = None
        return StreamStop()

    def _stream_commit(self, data: bytes) -> StreamCommit:
        label = StreamCommit.label
        self._outside_stream(label)
        xid, flags, lsn, end_lsn, ts = _L_STREAM_COMMIT.read(data, 1, label)
        _flags_zero(flags, label, 5)
        _finish(data, 1 + _L_STREAM_COMMIT.size, label)
        return StreamCommit(
            xid, flags, _new_lsn(LSN, lsn), _new_lsn(LSN, end_lsn), _ts(ts, label, 22, "commit timestamp")
        )

    def _stream_abort(self, data: bytes) -> StreamAbort:
        label = StreamAbort.label
        self._outside_stream(label)
        if self.parallel_streaming and len(data) > 1 + _L_STREAM_ABORT.size:
            xid, subxid, lsn, ts = _L_STREAM_ABORT_V4.read(data, 1, label)
            _finish(data, 1 + _L_STREAM_ABORT_V4.size, label)
            return StreamAbort(xid, subxid, _new_lsn(LSN, lsn), _ts(ts, label, 17, "abort timestamp"))
        xid, subxid = _L_STREAM_ABORT.read(data, 1, label)
        _finish(data, 1 + _L_STREAM_ABORT.size, label)
        return StreamAbort(xid, subxid, None, None)

    # -- two-phase (v3+) ------------------------------------------------------------------
    def _begin_prepare(self, data: bytes) -> BeginPrepare:
        label = BeginPrepare.label
        self._outside_stream(label)
        lsn, end_lsn, ts, xid = _L_BEGIN_PREPARE.read(data, 1, label)
        gid, pos = _cstring(data, 1 + _L_BEGIN_PREPARE.size, label, "GID", self.encoding)
        _finish(data, pos, label)
        return BeginPrepare(
            _new_lsn(LSN, lsn), _new_lsn(LSN, end_lsn), _ts(ts, label, 17, "prepare timestamp"), xid, gid
        )

    def _prepare_like(self, data: bytes, cls: type[Message], layout: _Layout, ts_what: str) -> Any:
        """Prepare, Commit Prepared and Stream Prepare share one layout."""
        label = cls.label
        self._outside_stream(label)
        flags, lsn, end_lsn, ts, xid = layout.read(data, 1, label)
        _flags_zero(flags, label, 1)
        gid, pos = _cstring(data, 1 + layout.size, label, "GID", self.encoding)
        _finish(data, pos, label)
        return cls(flags, _new_lsn(LSN, lsn), _new_lsn(LSN, end_lsn), _ts(ts, label, 18, ts_what), xid, gid)

    def _prepare(self, data: bytes) -> Prepare:
        return self._prepare_like(data, Prepare, _L_PREPARE, "prepare timestamp")

    def _commit_prepared(self, data: bytes) -> CommitPrepared:
        return self._prepare_like(data, CommitPrepared, _L_COMMIT_PREPARED, "commit timestamp")

    def _stream_prepare(self, data: bytes) -> StreamPrepare:
        return self._prepare_like(data, StreamPrepare, _L_PREPARE, "prepare timestamp")

    def _rollback_prepared(self, data: bytes) -> RollbackPrepared:
        label = RollbackPrepared.label
        self._outside_stream(label)
        flags, lsn, end_lsn, pts, rts, xid = _L_ROLLBACK_PREPARED.read(data, 1, label)
        _flags_zero(flags, label, 1)
        gid, pos = _cstring(data, 1 + _L_ROLLBACK_PREPARED.size, label, "GID", self.encoding)
        _finish(data, pos, label)
        return RollbackPrepared(
            flags,
            _new_lsn(LSN, lsn),
            _new_lsn(LSN, end_lsn),
            _ts(pts, label, 18, "prepare timestamp"),
            _ts(rts, label, 26, "rollback timestamp"),
            xid,
            gid,
        )


_L_CHANGE_HEAD = _Layout(("relation OID", "I"), ("tuple type byte", "B"))
_L_CHANGE_HEAD_XID = _Layout(("xid", "I"), ("relation OID", "I"), ("tuple type byte", "B"))


def _err_head(data: bytes, label: str, with_xid: bool) -> ProtocolError:
    return (_L_CHANGE_HEAD_XID if with_xid else _L_CHANGE_HEAD).truncated(data, 1, label)


def _bad_sub(sub: int, pos: int, label: str, expected: str) -> ProtocolError:
    if sub in (_N, _K, _O):
        return _err(
            InvalidFieldValue,
            label,
            pos,
            f"tuple type byte {_show_byte(sub)} not allowed here (expected {expected})",
        )
    return _err(
        UnknownMessageType,
        label,
        pos,
        f"unknown tuple type byte {_show_byte(sub)} (expected {expected})",
    )


# ---------------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------------
_P_U8 = _U8.pack
_P_U32 = _U32.pack
_P_I32 = struct.Struct("!i").pack
_P_I16 = _I16.pack
_P_U64 = struct.Struct("!Q").pack
_P_I64 = struct.Struct("!q").pack


def encode_tuple(values: TupleData, encoding: str = "utf-8") -> bytes:
    """The wire bytes of one TupleData (see the module docstring for the items)."""
    parts = [_P_I16(len(values))]
    for v in values:
        if v is None:
            parts.append(b"n")
        elif v is UNCHANGED_TOAST:
            parts.append(b"u")
        elif isinstance(v, str):
            raw = v.encode(encoding)
            parts.append(b"t" + _P_I32(len(raw)) + raw)
        elif isinstance(v, bytes | bytearray | memoryview):
            raw = bytes(v)
            parts.append(b"b" + _P_I32(len(raw)) + raw)
        else:
            raise TypeError(f"not a TupleData value: {type(v).__name__}")
    return b"".join(parts)


def _cstr(text: str, encoding: str) -> bytes:
    raw = text.encode(encoding)
    if b"\x00" in raw:
        raise ValueError(f"string {text!r} contains a NUL byte")
    return raw + b"\x00"


def _ts_us(dt: datetime) -> bytes:
    return _P_I64(datetime_to_pg_us(dt))


def encode_message(
    msg: Message,
    proto_version: int,
    *,
    parallel_streaming: bool = False,
    in_stream: bool | None = None,
    encoding: str = "utf-8",
) -> bytes:
    """The exact wire bytes of ``msg`` as a walsender speaking ``proto_version`` sends it.

    ``in_stream`` says whether a change message (Message, Relation, Type, Insert,
    Update, Delete, Truncate) sits inside a stream block and so carries its xid;
    ``None`` means "if ``msg.xid`` is set". ``parallel_streaming`` (version >= 4) lets a
    Stream Abort carry its LSN and timestamp when ``abort_lsn`` is set. Raises
    ``ValueError`` for a message the version does not have or fields it cannot send.
    """
    if not MIN_PROTO_VERSION <= proto_version <= MAX_PROTO_VERSION:
        raise ValueError(f"pgoutput proto_version must be 1..4, got {proto_version!r}")
    cls = type(msg)
    if not isinstance(msg, Message):
        raise TypeError(f"not a pgoutput message: {cls.__name__}")
    if cls.min_version > proto_version:
        raise ValueError(
            f"{cls.label} needs protocol version {cls.min_version}, not {proto_version}"
        )
    tag = bytes((cls.tag,))
    if cls.tag in _STREAM_DATA:
        xid = msg.xid  # type: ignore[attr-defined]
        if in_stream is None:
            in_stream = xid is not None
        if in_stream:
            if proto_version < 2:
                raise ValueError("protocol version 1 has no streamed transactions")
            if xid is None:
                raise ValueError(f"{cls.label} inside a stream block needs an xid")
            head = tag + _P_U32(xid)
        else:
            if xid is not None:
                raise ValueError(f"{cls.label} outside a stream block carries no xid")
            head = tag
    if cls is Insert:
        return b"".join((head, _P_U32(msg.relation_oid), b"N", encode_tuple(msg.new, encoding)))
    if cls is Update:
        if msg.key is not None and msg.old is not None:
            raise ValueError("an Update carries a key ('K') or an old tuple ('O'), not both")
        parts = [head, _P_U32(msg.relation_oid)]
        if msg.key is not None:
            parts += [b"K", encode_tuple(msg.key, encoding)]
        elif msg.old is not None:
            parts += [b"O", encode_tuple(msg.old, encoding)]
        parts += [b"N", encode_tuple(msg.new, encoding)]
        return b"".join(parts)
    if cls is Delete:
        if (msg.key is None) == (msg.old is None):
            raise ValueError("a Delete carries exactly one of key ('K') and old tuple ('O')")
        sub, image = (b"K", msg.key) if msg.key is not None else (b"O", msg.old)
        return b"".join((head, _P_U32(msg.relation_oid), sub, encode_tuple(image, encoding)))
    if cls is Begin:
        return tag + _P_U64(msg.final_lsn) + _ts_us(msg.commit_timestamp) + _P_U32(msg.xid)
    if cls is Commit:
        return (
            tag
            + _P_U8(msg.flags)
            + _P_U64(msg.commit_lsn)
            + _P_U64(msg.end_lsn)
            + _ts_us(msg.commit_timestamp)
        )
    if cls is LogicalMessage:
        content = bytes(msg.content)
        return b"".join(
            (
                head,
                _P_U8(msg.flags),
                _P_U64(msg.lsn),
                _cstr(msg.prefix, encoding),
                _P_I32(len(content)),
                content,
            )
        )
    if cls is Origin:
        return tag + _P_U64(msg.commit_lsn) + _cstr(msg.name, encoding)
    if cls is Relation:
        parts = [
            head,
            _P_U32(msg.relation_oid),
            _cstr(msg.namespace, encoding),
            _cstr(msg.relation_name, encoding),
            msg.replica_identity.encode("ascii"),
            _P_I16(len(msg.columns)),
        ]
        for col in msg.columns:
            parts += [
                _P_U8(col.flags),
                _cstr(col.name, encoding),
                _P_U32(col.type_oid),
                _P_I32(col.type_modifier),
            ]
        return b"".join(parts)
    if cls is Type:
        return (
            head
            + _P_U32(msg.type_oid)
            + _cstr(msg.namespace, encoding)
            + _cstr(msg.type_name, encoding)
        )
    if cls is Truncate:
        oids = tuple(msg.relation_oids)
        return head + _P_I32(len(oids)) + _P_U8(msg.options) + struct.pack(f"!{len(oids)}I", *oids)
    if cls is StreamStart:
        return tag + _P_U32(msg.xid) + _P_U8(1 if msg.first_segment else 0)
    if cls is StreamStop:
        return tag
    if cls is StreamCommit:
        return (
            tag
            + _P_U32(msg.xid)
            + _P_U8(msg.flags)
            + _P_U64(msg.commit_lsn)
            + _P_U64(msg.end_lsn)
            + _ts_us(msg.commit_timestamp)
        )
    if cls is StreamAbort:
        out = tag + _P_U32(msg.xid) + _P_U32(msg.subxid)
        if msg.abort_lsn is None:
            if msg.abort_timestamp is not None:
                raise ValueError("Stream Abort: abort_timestamp without abort_lsn")
            return out
        if proto_version < 4 or not parallel_streaming:
            raise ValueError(
                "Stream Abort carries abort LSN and timestamp only with protocol version 4 "
                "and parallel streaming"
            )
        if msg.abort_timestamp is None:
            raise ValueError("Stream Abort: abort_lsn without abort_timestamp")
        return out + _P_U64(msg.abort_lsn) + _ts_us(msg.abort_timestamp)
    if cls is BeginPrepare:
        return (
            tag
            + _P_U64(msg.prepare_lsn)
            + _P_U64(msg.end_lsn)
            + _ts_us(msg.prepare_timestamp)
            + _P_U32(msg.xid)
            + _cstr(msg.gid, encoding)
        )
    if cls is Prepare or cls is StreamPrepare:
        return (
            tag
            + _P_U8(msg.flags)
            + _P_U64(msg.prepare_lsn)
            + _P_U64(msg.end_lsn)
            + _ts_us(msg.prepare_timestamp)
            + _P_U32(msg.xid)
            + _cstr(msg.gid, encoding)
        )
    if cls is CommitPrepared:
        return (
            tag
            + _P_U8(msg.flags)
            + _P_U64(msg.commit_lsn)
            + _P_U64(msg.end_lsn)
            + _ts_us(msg.commit_timestamp)
            + _P_U32(msg.xid)
            + _cstr(msg.gid, encoding)
        )
    if cls is RollbackPrepared:
        return (
            tag
            + _P_U8(msg.flags)
            + _P_U64(msg.prepare_end_lsn)
            + _P_U64(msg.rollback_end_lsn)
            + _ts_us(msg.prepare_timestamp)
            + _ts_us(msg.rollback_timestamp)
            + _P_U32(msg.xid)
            + _cstr(msg.gid, encoding)
        )
    raise TypeError(f"no encoder for {cls.__name__}")  # pragma: no cover
