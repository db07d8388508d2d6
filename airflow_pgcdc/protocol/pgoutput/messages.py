"""The pgoutput message classes (one per message, spec order) and the TupleData values.

See the package docstring for the TupleData representation and the field presence rules;
the classes share :class:`~airflow_pgcdc.protocol.message.ProtocolMessage` with the other
protocol modules.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Union

from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.message import ProtocolMessage

_ENCODER: list = []
"""``[encode_message]``: :mod:`.encoder` puts it here when it is imported (the package
``__init__`` imports it before anything can use a message), so that ``Message.encode``
needs no import of the encoder, which imports the messages."""


def _use_encoder(encode_message) -> None:
    _ENCODER[:] = [encode_message]


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


class Message(ProtocolMessage):
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
        """The exact wire bytes of this message (see :func:`.encoder.encode_message`)."""
        return _ENCODER[0](
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

