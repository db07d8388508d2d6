"""The pglogical_output message classes (:class:`Startup`, :class:`Begin`, :class:`Origin`,
:class:`Commit`, :class:`Relation`, :class:`Insert`, :class:`Update`, :class:`Delete`) and
their parts (:class:`Column`, :class:`TupleField`), on the shared
:class:`~airflow_pgcdc.protocol.message.ProtocolMessage` base.
"""

from __future__ import annotations

import base64
import re
import struct
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar

from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.message import FieldValue, ProtocolMessage

PROTOCOL = "pglogical"

PROTO_VERSION = 1
"""The only native protocol version (client and plugin both speak 1 only)."""
STARTUP_MESSAGE_VERSION = 1
STARTUP_PARAMS_FORMAT = 1

COLUMN_FLAG_KEY = 0x01
"""Column flag bit 0: the column is part of the replica identity (``IS_REPLICA_IDENTITY``)."""

_LABELS = {
    "S": "STARTUP ('S')",
    "B": "BEGIN ('B')",
    "C": "COMMIT ('C')",
    "O": "ORIGIN ('O')",
    "R": "RELATION ('R')",
    "I": "INSERT ('I')",
    "U": "UPDATE ('U')",
    "D": "DELETE ('D')",
}

_I32 = struct.Struct("!i")
_U16 = struct.Struct("!H")


# -- typed messages -------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if isinstance(value, LSN):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    to_dict = getattr(value, "to_dict", None)
    if to_dict is not None:
        return to_dict()
    return value


class PglogicalMessage(ProtocolMessage):
    """Base of every top-level pglogical message."""

    __slots__ = ()
    type: ClassVar[str]
    """snake_case name of the message: ``"startup"``, ``"begin"``, ..."""
    tag: ClassVar[str]
    """The wire type byte as a one-character string (``'S'``, ``'B'``, ...)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: LSNs as ``X/Y``, times ISO 8601, bytes base64."""
        out: dict[str, Any] = {"type": self.type}
        for f in self._fields:
            out[f] = _jsonable(getattr(self, f))
        return out


_TRUE = frozenset({"t", "true", "y", "yes", "on", "1"})
_FALSE = frozenset({"f", "false", "n", "no", "off", "0"})
_INT_RE = re.compile(r"-?[0-9]{1,19}")


def _parse_bool(text: str) -> bool:
    low = text.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _parse_int(text: str) -> int:
    if not _INT_RE.fullmatch(text):
        raise ValueError(f"not an integer: {text!r}")
    return int(text)


def _parse_str(text: str) -> str:
    return text


_STARTUP_PARAM_TYPES: dict[str, Any] = {
    "max_proto_version": _parse_int,
    "min_proto_version": _parse_int,
    "proto_format": _parse_str,
    "coltypes": _parse_bool,
    "pg_version_num": _parse_int,
    "pg_version": _parse_str,
    "pg_catversion": _parse_int,
    "database_encoding": _parse_str,
    "encoding": _parse_str,
    "forward_changesets": _parse_bool,
    "forward_changeset_origins": _parse_bool,
    "no_txinfo": _parse_bool,
    "walsender_pid": _parse_int,
    "pglogical_version": _parse_str,
    "pglogical_version_num": _parse_int,
    "binary.internal_basetypes": _parse_bool,
    "binary.binary_basetypes": _parse_bool,
    "binary.binary_pg_version": _parse_int,
    "binary.basetypes_major_version": _parse_int,
    "binary.sizeof_int": _parse_int,
    "binary.sizeof_long": _parse_int,
    "binary.sizeof_datum": _parse_int,
    "binary.maxalign": _parse_int,
    "binary.bigendian": _parse_bool,
    "binary.float4_byval": _parse_bool,
    "binary.float8_byval": _parse_bool,
    "binary.integer_datetimes": _parse_bool,
}


def _param(key: str) -> property:
    parse = _STARTUP_PARAM_TYPES[key]

    def getter(self: Startup) -> Any:
        value = self.params.get(key)
        return None if value is None else parse(value)

    kind = {_parse_int: "int", _parse_bool: "bool", _parse_str: "str"}[parse]
    return property(getter, doc=f"``{key}`` as {kind}, or None when the server did not send it.")


class Startup(PglogicalMessage):
    """``'S'``: the plugin's take-it-or-leave-it reply to the client's parameters.

    ``params`` holds every key/value pair as sent (str -> str, in wire order); the
    properties read the well-known ones typed (``None`` when absent). The decoder
    has already checked that every well-known key present parses as its type.
    """

    __slots__ = ("startup_message_version", "params")
    type = "startup"
    tag = "S"
    _fields = ("startup_message_version", "params")

    def __init__(self, *, params: Mapping[str, str], startup_message_version: int = 1) -> None:
        self.startup_message_version = startup_message_version
        self.params: dict[str, str] = dict(params)

    max_proto_version = _param("max_proto_version")
    min_proto_version = _param("min_proto_version")
    proto_format = _param("proto_format")
    coltypes = _param("coltypes")
    pg_version_num = _param("pg_version_num")
    pg_version = _param("pg_version")
    pg_catversion = _param("pg_catversion")
    database_encoding = _param("database_encoding")
    encoding = _param("encoding")
    forward_changesets = _param("forward_changesets")
    forward_changeset_origins = _param("forward_changeset_origins")
    no_txinfo = _param("no_txinfo")
    walsender_pid = _param("walsender_pid")
    pglogical_version = _param("pglogical_version")
    pglogical_version_num = _param("pglogical_version_num")
    binary_internal_basetypes = _param("binary.internal_basetypes")
    binary_binary_basetypes = _param("binary.binary_basetypes")
    binary_binary_pg_version = _param("binary.binary_pg_version")
    binary_basetypes_major_version = _param("binary.basetypes_major_version")
    binary_sizeof_int = _param("binary.sizeof_int")
    binary_sizeof_long = _param("binary.sizeof_long")
    binary_sizeof_datum = _param("binary.sizeof_datum")
    binary_maxalign = _param("binary.maxalign")
    binary_bigendian = _param("binary.bigendian")
    binary_float4_byval = _param("binary.float4_byval")
    binary_float8_byval = _param("binary.float8_byval")
    binary_integer_datetimes = _param("binary.integer_datetimes")


class Begin(PglogicalMessage):
    """``'B'``: start of a transaction. ``final_lsn`` is the commit record's LSN
    (the spec's ``lsn``), ``xid`` the upstream transaction id (``remote XID``)."""

    __slots__ = ("flags", "final_lsn", "commit_time", "xid")
    type = "begin"
    tag = "B"
    _fields = ("flags", "final_lsn", "commit_time", "xid")

    def __init__(self, *, final_lsn: LSN, commit_time: datetime, xid: int, flags: int = 0) -> None:
        self.flags = flags
        self.final_lsn = final_lsn
        self.commit_time = commit_time
        self.xid = xid


class Commit(PglogicalMessage):
    """``'C'``: end of a transaction. ``commit_lsn`` equals BEGIN's ``final_lsn``;
    ``end_lsn`` is the position just past the commit record (the one to acknowledge)."""

    __slots__ = ("flags", "commit_lsn", "end_lsn", "commit_time")
    type = "commit"
    tag = "C"
    _fields = ("flags", "commit_lsn", "end_lsn", "commit_time")

    def __init__(
        self, *, commit_lsn: LSN, end_lsn: LSN, commit_time: datetime, flags: int = 0
    ) -> None:
        self.flags = flags
        self.commit_lsn = commit_lsn
        self.end_lsn = end_lsn
        self.commit_time = commit_time


class Origin(PglogicalMessage):
    """``'O'``: the transaction just begun was forwarded from another node.
    ``origin_identifier`` is ``""`` when the origin could not be identified."""

    __slots__ = ("flags", "origin_lsn", "origin_identifier")
    type = "origin"
    tag = "O"
    _fields = ("flags", "origin_lsn", "origin_identifier")

    def __init__(self, *, origin_lsn: LSN, origin_identifier: str, flags: int = 0) -> None:
        self.flags = flags
        self.origin_lsn = origin_lsn
        self.origin_identifier = origin_identifier


class Column(FieldValue):
    """One column of a :class:`Relation`: its ``'C'`` delimiter flags and ``'N'`` name."""

    __slots__ = ("flags", "colname")
    _fields = ("flags", "colname")

    def __init__(self, *, colname: str, flags: int = 0) -> None:
        self.flags = flags
        self.colname = colname

    @property
    def name(self) -> str:
        return self.colname

    @property
    def is_key(self) -> bool:
        """Part of the replica identity (column flag bit 0)."""
        return bool(self.flags & COLUMN_FLAG_KEY)

    def to_dict(self) -> dict[str, Any]:
        return {"flags": self.flags, "colname": self.colname, "is_key": self.is_key}


class Relation(PglogicalMessage):
    """``'R'``: table metadata. ``relidentifier`` (in practice the table's OID) is
    what row messages refer to; ``columns`` are numbered 0..natts-1 in wire order and
    match the fields of every tuple decoded with this metadata."""

    __slots__ = ("flags", "relidentifier", "nspname", "relname", "columns")
    type = "relation"
    tag = "R"
    _fields = ("flags", "relidentifier", "nspname", "relname", "columns")

    def __init__(
        self,
        *,
        relidentifier: int,
        nspname: str,
        relname: str,
        columns: Sequence[Column],
        flags: int = 0,
    ) -> None:
        self.flags = flags
        self.relidentifier = relidentifier
        self.nspname = nspname
        self.relname = relname
        self.columns: tuple[Column, ...] = tuple(columns)

    @property
    def relid(self) -> int:
        return self.relidentifier

    @property
    def schema(self) -> str:
        return self.nspname

    @property
    def table(self) -> str:
        return self.relname

    @property
    def natts(self) -> int:
        return len(self.columns)

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.colname for c in self.columns)

    @property
    def key_columns(self) -> tuple[str, ...]:
        """Names of the replica identity columns, in column order."""
        return tuple(c.colname for c in self.columns if c.flags & COLUMN_FLAG_KEY)


class TupleField(FieldValue):
    """One field of a tuple. ``kind`` is ``'n'`` null, ``'u'`` unchanged TOAST value
    (not sent), ``'i'`` internal binary, ``'b'`` send/recv binary, ``'t'`` text;
    ``value`` is ``None`` for ``n``/``u``, ``bytes`` for ``i``/``b``, ``str`` for ``t``.
    Treat as immutable (the decoder shares the ``n`` and ``u`` instances)."""

    __slots__ = ("kind", "value")
    _fields = ("kind", "value")

    def __init__(self, kind: str, value: bytes | str | None = None) -> None:
        self.kind = kind
        self.value = value

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": ..., "value": text | base64 | None}``."""
        v = self.value
        if isinstance(v, bytes):
            v = base64.b64encode(v).decode("ascii")
        return {"kind": self.kind, "value": v}


NULL_FIELD = TupleField("n")
UNCHANGED_FIELD = TupleField("u")


class _RowMessage(PglogicalMessage):
    __slots__ = ()

    @property
    def relid(self) -> int:
        return self.relidentifier  # type: ignore[attr-defined]


class Insert(_RowMessage):
    """``'I'``: a new row (``'N'`` tuple). ``relation`` is the metadata the decoder
    used (not part of equality or ``to_dict``)."""

    __slots__ = ("flags", "relidentifier", "new_tuple", "relation")
    type = "insert"
    tag = "I"
    _fields = ("flags", "relidentifier", "new_tuple")

    def __init__(
        self,
        *,
        relidentifier: int,
        new_tuple: Sequence[TupleField],
        flags: int = 0,
        relation: Relation | None = None,
    ) -> None:
        self.flags = flags
        self.relidentifier = relidentifier
        self.new_tuple: tuple[TupleField, ...] = tuple(new_tuple)
        self.relation = relation


class Update(_RowMessage):
    """``'U'``: ``old_tuple`` (tuple type ``'K'`` key or ``'O'`` whole old row) is
    present only when the replica identity changed or is FULL; then ``new_tuple``."""

    __slots__ = ("flags", "relidentifier", "old_tuple_type", "old_tuple", "new_tuple", "relation")
    type = "update"
    tag = "U"
    _fields = ("flags", "relidentifier", "old_tuple_type", "old_tuple", "new_tuple")

    def __init__(
        self,
        *,
        relidentifier: int,
        new_tuple: Sequence[TupleField],
        old_tuple: Sequence[TupleField] | None = None,
        old_tuple_type: str | None = None,
        flags: int = 0,
        relation: Relation | None = None,
    ) -> None:
        if (old_tuple is None) != (old_tuple_type is None):
            raise ValueError("old_tuple and old_tuple_type go together")
        self.flags = flags
        self.relidentifier = relidentifier
        self.old_tuple_type = old_tuple_type
        self.old_tuple: tuple[TupleField, ...] | None = (
            None if old_tuple is None else tuple(old_tuple)
        )
        self.new_tuple: tuple[TupleField, ...] = tuple(new_tuple)
        self.relation = relation


class Delete(_RowMessage):
    """``'D'``: the deleted row's key (``'K'``) or whole old row (``'O'``)."""

    __slots__ = ("flags", "relidentifier", "old_tuple_type", "old_tuple", "relation")
    type = "delete"
    tag = "D"
    _fields = ("flags", "relidentifier", "old_tuple_type", "old_tuple")

    def __init__(
        self,
        *,
        relidentifier: int,
        old_tuple: Sequence[TupleField],
        old_tuple_type: str = "K",
        flags: int = 0,
        relation: Relation | None = None,
    ) -> None:
        self.flags = flags
        self.relidentifier = relidentifier
        self.old_tuple_type = old_tuple_type
        self.old_tuple: tuple[TupleField, ...] = tuple(old_tuple)
        self.relation = relation


