"""The ``pglogical_output`` native binary protocol (spec 002), sans-IO.

Server -> client: :class:`PglogicalDecoder` turns the payload of each logical
XLogData message into a typed message: :class:`Startup` (``'S'``),
:class:`Begin` (``'B'``), :class:`Origin` (``'O'``), :class:`Commit` (``'C'``),
:class:`Relation` (``'R'``, table metadata with its attribute block),
:class:`Insert` / :class:`Update` / :class:`Delete` (``'I'`` / ``'U'`` / ``'D'``)
whose tuples are sequences of :class:`TupleField`. The decoder is stateful: it
checks the message flow (startup first, BEGIN ... COMMIT, ORIGIN only right after
BEGIN, rows only inside a transaction and only for an announced relation) and
keeps the relation map. Every malformed input raises a
:class:`~airflow_pgcdc.errors.ProtocolError` subclass with ``protocol="pglogical"``,
the message (``"BEGIN ('B')"``) and the byte offset inside the message; nothing
else escapes, every loop advances, and no count read from the wire allocates more
than the message itself could hold.

Client -> server: :func:`pglogical_start_options` builds the ``START_REPLICATION``
parameter list with the spec's key spellings (``"binary.want_binary_basetypes"``),
:func:`binary_compat_params_for_server` fills the ``binary.*`` compatibility keys
for this machine, and :func:`format_plugin_options` renders any plugin's option
list as ``("key" 'value', ...)`` with :func:`~airflow_pgcdc.protocol.quoting.quote_ident`
and :func:`~airflow_pgcdc.protocol.quoting.quote_literal`.

Encoders (:func:`encode_message` and one ``encode_*`` per message) write exactly
the bytes the real plugin writes; they exist for round-trip tests and fuzz seeds.

Where the document and the real plugin differ
-----------------------------------------------
The real plugin (pglogical 2.4.x, ``pglogical_proto_native.c``,
``pglogical_output_plugin.c``, ``pglogical_output_config.c``; Debian's
``postgresql-15-pglogical`` 2.4.2) is the truth; this module follows it, strictly:

1. **Row tuple markers.** The spec's row layout is ``flags, relidentifier, [tuple
   parts]`` with an unnamed "tuple type" byte before each ``'T'`` tuple. The plugin
   sends ``'N'`` (new tuple) before the tuple of INSERT; ``'K'`` (old key) before
   the old tuple of DELETE; for UPDATE an optional ``'K'`` old tuple, then ``'N'``.
   Its reader also accepts ``'O'`` (whole old tuple) where ``'K'`` may stand; so do we.
2. **Unchanged TOAST.** Field kind ``'u'`` (unchanged toasted value, no length, no
   data) is not in the spec; the plugin sends it.
3. **Field kind bytes.** The spec writes "'i'nternal binary (0x62)"; 0x62 is ``'b'``.
   The plugin uses ``'i'`` (0x69) internal, ``'b'`` (0x62) send/recv, ``'t'`` (0x74)
   text, ``'n'`` null, ``'u'`` unchanged, each as documented here.
4. **NUL terminators inside counted strings.** Schema and table name lengths
   (uint8), the origin name length (uint8), the ``'N'`` column-name block length
   (uint16) and the length of a ``'t'`` text value (int32) all *include* a trailing
   NUL that the plugin writes. Names are therefore at most 254 bytes. We require the
   NUL where the spec says "null terminated" (schema, table, non-empty origin name),
   strip it where present elsewhere (column name, text value), and reject NUL bytes
   anywhere else in a string.
5. **Column delimiter size.** The spec says the ``'C'`` delimiter's flags field is
   "the same size as the length field in other blocks"; it is not: the delimiter is
   ``'C'`` + uint8 flags (2 bytes), a metadata block header is type + uint16 length
   (3 bytes). Column flag bit 0 (``IS_REPLICA_IDENTITY``) marks a replica identity
   (key) column; the spec leaves column flags undefined.
6. **Timestamps** are written as uint64 in the spec; they are PostgreSQL
   ``TimestampTz`` (signed int64 microseconds since 2000-01-01), read as such.
7. **Relation metadata caching.** The spec says the upstream re-sends metadata
   before rows of a different table and a client may keep only the latest. The
   2.x plugin caches per session: it sends ``'R'`` once per relation (again after
   a relcache invalidation) and rows for several tables interleave. The decoder
   keeps a map ``relidentifier -> Relation``; a row for an unknown relid is an
   :class:`UnexpectedMessage`.
8. **Startup timing.** The plugin cannot write from its startup callback: the
   ``'S'`` message is sent from the first BEGIN callback, i.e. only when the first
   transaction is decoded, not when ``START_REPLICATION`` begins. Its keys are
   ``max_proto_version, min_proto_version, coltypes, pg_version_num, pg_version,
   pg_catversion, database_encoding, encoding, forward_changeset_origins,
   walsender_pid, pglogical_version, pglogical_version_num,
   binary.internal_basetypes, binary.binary_basetypes,
   binary.basetypes_major_version, binary.sizeof_int, binary.sizeof_long,
   binary.sizeof_datum, binary.maxalign, binary.bigendian, binary.float4_byval,
   binary.float8_byval, binary.integer_datetimes, binary.binary_pg_version,
   no_txinfo``; booleans are ``t``/``f``. ``encoding`` is ``SQL_ASCII`` unless the
   client sent ``expected_encoding``. BEGIN and ORIGIN are separate CopyData messages.
9. **Client parameters the plugin really reads**: ``startup_params_format``,
   ``max_proto_version``, ``min_proto_version`` (all three required), ``proto_format``,
   ``expected_encoding`` (ERROR unless equal to the database encoding),
   ``binary.want_internal_basetypes``, ``binary.want_binary_basetypes``,
   ``binary.basetypes_major_version`` (must equal the server's
   ``PG_VERSION_NUM / 100`` for any binary mode), ``binary.bigendian``,
   ``binary.sizeof_datum``, ``binary.sizeof_int``, ``binary.sizeof_long``,
   ``binary.float4_byval``, ``binary.float8_byval`` (a plugin bug stores it into
   the float4 setting), ``binary.integer_datetimes``, ``pglogical.forward_origins``
   (only ``all``), ``pglogical.replication_set_names`` (needed: without it no table
   is replicated), ``pglogical.replicate_only_table``, ``no_txinfo`` and
   ``pg_version`` -- parsed as an **integer**, so the spec's string
   ``server_version`` (``'15.4'``) makes the plugin ERROR. ``hooks.setup_function``
   is accepted and ignored; ``want_coltypes``, ``forward_changesets``,
   ``pg_version_num``, ``binary.maxalign`` and any other key are ignored (DEBUG1).
   Internal (``'i'``) values need ``binary.want_internal_basetypes`` plus a matching
   ``binary.basetypes_major_version`` and compatible sizes; send/recv (``'b'``)
   values need ``binary.want_binary_basetypes`` plus the matching major version.
10. **Internal values** (``'i'``) are raw server datums: pass-by-value types in
    host byte order, varlenas with their (possibly 1-byte, possibly compressed)
    header. This module returns the bytes as they are.

Left out: the JSON protocol (``proto_format=json``), the column type block (T.B.D.
in the spec, never sent), decoding ``'i'``/``'b'`` datums into Python values (that
belongs to the type layer).
"""

from __future__ import annotations

import base64
import codecs
import ctypes
import re
import struct
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import Any, ClassVar

from airflow_pgcdc.errors import (
    InvalidFieldValue,
    ProtocolError,
    TruncatedMessage,
    UnexpectedMessage,
    UnknownMessageType,
)
from airflow_pgcdc.protocol.buffer import Reader
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.pgtime import datetime_to_pg_us, pg_us_to_datetime
from airflow_pgcdc.protocol.quoting import quote_ident, quote_literal, quote_qualified

__all__ = [
    "PROTOCOL",
    "PROTO_VERSION",
    "STARTUP_MESSAGE_VERSION",
    "STARTUP_PARAMS_FORMAT",
    "COLUMN_FLAG_KEY",
    "PglogicalMessage",
    "Startup",
    "Begin",
    "Commit",
    "Origin",
    "Column",
    "Relation",
    "TupleField",
    "NULL_FIELD",
    "UNCHANGED_FIELD",
    "Insert",
    "Update",
    "Delete",
    "PglogicalDecoder",
    "encode_message",
    "encode_startup",
    "encode_begin",
    "encode_commit",
    "encode_origin",
    "encode_relation",
    "encode_insert",
    "encode_update",
    "encode_delete",
    "encode_tuple",
    "pglogical_start_options",
    "binary_compat_params_for_server",
    "format_plugin_options",
]

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
_new_lsn = int.__new__  # a "Q" read is always in LSN range


def _lsn(value: int) -> LSN:
    return _new_lsn(LSN, value)


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


class _Slotted:
    """Equality by ``_fields``, a readable repr, and a JSON-ready ``to_dict``."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()

    def _values(self) -> tuple:
        return tuple(getattr(self, f) for f in self._fields)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]  # mutable containers inside

    def __repr__(self) -> str:
        args = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
        return f"{type(self).__name__}({args})"


class PglogicalMessage(_Slotted):
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


class Column(_Slotted):
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


class TupleField(_Slotted):
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


# -- decoding -------------------------------------------------------------------------


def _check_encoding(encoding: str) -> str:
    try:
        return codecs.lookup(encoding).name
    except LookupError:
        raise ValueError(f"unknown Python text encoding {encoding!r}") from None


class PglogicalDecoder:
    """Stateful decoder of one pglogical_output stream (one START_REPLICATION).

    ``decode(payload)`` takes the data of one logical XLogData message and returns
    the typed message. ``encoding`` (a Python codec name) decodes names and text
    values; it must match the ``encoding`` the plugin uses (the database encoding
    when the client sent ``expected_encoding``).

    Flow rules enforced (:class:`UnexpectedMessage` otherwise): the startup message
    comes first and once; BEGIN only outside a transaction; COMMIT and rows only
    inside one; ORIGIN only immediately after BEGIN and only if the startup message
    announced ``forward_changeset_origins``; a row's relidentifier must have been
    announced by an earlier RELATION. A message that raises leaves the state as it
    was. ``'i'``/``'b'`` field values are accepted only when the startup message
    enabled ``binary.internal_basetypes``/``binary.binary_basetypes``.
    """

    __slots__ = (
        "encoding",
        "_startup",
        "_relations",
        "_begin",
        "_last_tag",
        "_allow_internal",
        "_allow_binary",
        "_allow_origin",
    )

    def __init__(self, encoding: str = "utf-8") -> None:
        self.encoding = _check_encoding(encoding)
        self._startup: Startup | None = None
        self._relations: dict[int, Relation] = {}
        self._begin: Begin | None = None
        self._last_tag: str | None = None
        self._allow_internal = False
        self._allow_binary = False
        self._allow_origin = False

    # -- state ----------------------------------------------------------------------
    @property
    def startup(self) -> Startup | None:
        """The startup message, once received."""
        return self._startup

    @property
    def relations(self) -> Mapping[int, Relation]:
        """The latest metadata per relidentifier (read-only view)."""
        return MappingProxyType(self._relations)

    @property
    def transaction(self) -> Begin | None:
        """The BEGIN of the open transaction, or None between transactions."""
        return self._begin

    @property
    def in_transaction(self) -> bool:
        return self._begin is not None

    # -- entry point ----------------------------------------------------------------
    def decode(self, data: bytes | bytearray | memoryview) -> PglogicalMessage:
        """Decode one message; raise a :class:`ProtocolError` subclass if malformed."""
        if not data:
            raise TruncatedMessage(
                "empty message: no message type byte", protocol=PROTOCOL, offset=0
            )
        r = Reader(data, 1, protocol=PROTOCOL)
        tag = chr(r.buf[0])
        label = _LABELS.get(tag)
        if label is None:
            raise UnknownMessageType(
                f"unknown message type {tag!r} (0x{ord(tag):02x})",
                protocol=PROTOCOL,
                message_type=f"{tag!r} (0x{ord(tag):02x})",
                offset=0,
            )
        r.message_type = label
        if tag == "S":
            msg: PglogicalMessage = self._startup_msg(r)
        else:
            if self._startup is None:
                raise r.error(
                    UnexpectedMessage,
                    f"the startup message ('S') must come first, got {label}",
                    0,
                )
            if tag == "B":
                msg = self._begin_msg(r)
            elif tag == "C":
                msg = self._commit_msg(r)
            elif tag == "O":
                msg = self._origin_msg(r)
            elif tag == "R":
                msg = self._relation_msg(r)
            else:
                msg = self._row_msg(r, tag)
        self._last_tag = tag
        return msg

    # -- helpers --------------------------------------------------------------------
    @staticmethod
    def _flags(r: Reader, what: str) -> int:
        pos = r.pos
        flags = r.u8("flags")
        if flags:
            raise r.error(
                InvalidFieldValue,
                f"{what} flags 0x{flags:02x}: reserved bits set (no flag is defined "
                "in protocol version 1; the spec demands an error)",
                pos,
            )
        return flags

    @staticmethod
    def _timestamp(r: Reader, what: str) -> datetime:
        pos = r.pos
        us = r.i64(what)
        try:
            return pg_us_to_datetime(us, protocol=PROTOCOL, what=what)
        except ProtocolError as exc:
            raise r.error(InvalidFieldValue, exc.reason, pos) from None

    def _text(self, r: Reader, raw: bytes, pos: int, what: str) -> str:
        nul = raw.find(b"\x00")
        if nul >= 0:
            raise r.error(InvalidFieldValue, f"{what} contains a NUL byte", pos + nul)
        try:
            return raw.decode(self.encoding)
        except UnicodeDecodeError as exc:
            raise r.error(
                InvalidFieldValue, f"{what} is not valid {self.encoding}: {exc.reason}", pos
            ) from None

    def _counted_string(self, r: Reader, n: int, what: str, *, require_nul: bool) -> str:
        """``n`` bytes holding a name; the plugin counts the terminating NUL in ``n``."""
        pos = r.pos
        raw = r.bytes(n, what)
        if raw.endswith(b"\x00"):
            raw = raw[:-1]
        elif require_nul:
            raise r.error(
                InvalidFieldValue,
                f"{what} ({n} bytes) is not NUL-terminated",
                pos + n - 1 if n else pos,
            )
        return self._text(r, raw, pos, what)

    def _in_transaction(self, r: Reader) -> Begin:
        if self._begin is None:
            raise r.error(
                UnexpectedMessage, f"{r.message_type} outside a transaction (no BEGIN)", 0
            )
        return self._begin

    # -- messages -------------------------------------------------------------------
    def _startup_msg(self, r: Reader) -> Startup:
        if self._startup is not None:
            raise r.error(UnexpectedMessage, "a second startup message", 0)
        pos = r.pos
        version = r.u8("startup message version")
        if version != STARTUP_MESSAGE_VERSION:
            raise r.error(
                InvalidFieldValue,
                f"startup message version {version} (only {STARTUP_MESSAGE_VERSION} exists)",
                pos,
            )
        params: dict[str, str] = {}
        offsets: dict[str, int] = {}
        enc = self.encoding
        while r.remaining():
            kpos = r.pos
            key = r.cstring("parameter name", enc)
            if not r.remaining():
                raise r.error(TruncatedMessage, f"truncated: parameter {key!r} has no value")
            if key in params:
                raise r.error(InvalidFieldValue, f"parameter {key!r} sent twice", kpos)
            offsets[key] = r.pos
            params[key] = r.cstring(f"value of parameter {key!r}", enc)
        for key, value in params.items():
            parse = _STARTUP_PARAM_TYPES.get(key)
            if parse is None:
                continue
            try:
                parse(value)
            except ValueError as exc:
                raise r.error(
                    InvalidFieldValue, f"parameter {key!r}: {exc}", offsets[key]
                ) from None
        msg = Startup(params=params, startup_message_version=version)
        lo, hi = msg.min_proto_version, msg.max_proto_version
        for key, bad in (
            ("min_proto_version", lo is not None and lo > PROTO_VERSION),
            ("max_proto_version", hi is not None and hi < PROTO_VERSION),
        ):
            if bad:
                raise r.error(
                    InvalidFieldValue,
                    f"server protocol versions {lo}..{hi} do not include {PROTO_VERSION}",
                    offsets[key],
                )
        fmt = msg.proto_format
        if fmt is not None and fmt != "native":
            raise r.error(
                InvalidFieldValue,
                f"proto_format {fmt!r}: this decoder reads the native protocol only",
                offsets["proto_format"],
            )
        self._startup = msg
        self._allow_internal = bool(msg.binary_internal_basetypes)
        self._allow_binary = bool(msg.binary_binary_basetypes)
        self._allow_origin = bool(msg.forward_changeset_origins)
        return msg

    def _begin_msg(self, r: Reader) -> Begin:
        if self._begin is not None:
            raise r.error(
                UnexpectedMessage,
                f"BEGIN inside the open transaction xid {self._begin.xid} (no COMMIT)",
                0,
            )
        flags = self._flags(r, "BEGIN")
        pos = r.pos
        final_lsn = _lsn(r.u64("lsn"))
        if not final_lsn:
            raise r.error(InvalidFieldValue, "final lsn is 0/0 (InvalidXLogRecPtr)", pos)
        commit_time = self._timestamp(r, "commit time")
        xid = r.u32("remote XID")
        r.finish()
        msg = Begin(final_lsn=final_lsn, commit_time=commit_time, xid=xid, flags=flags)
        self._begin = msg
        return msg

    def _commit_msg(self, r: Reader) -> Commit:
        begin = self._in_transaction(r)
        flags = self._flags(r, "COMMIT")
        pos = r.pos
        commit_lsn = _lsn(r.u64("commit lsn"))
        end_pos = r.pos
        end_lsn = _lsn(r.u64("end lsn"))
        commit_time = self._timestamp(r, "commit time")
        r.finish()
        if commit_lsn != begin.final_lsn:
            raise r.error(
                InvalidFieldValue,
                f"commit lsn {commit_lsn} differs from the BEGIN's lsn {begin.final_lsn}",
                pos,
            )
        if end_lsn < commit_lsn:
            raise r.error(
                InvalidFieldValue, f"end lsn {end_lsn} is before commit lsn {commit_lsn}", end_pos
            )
        self._begin = None
        return Commit(commit_lsn=commit_lsn, end_lsn=end_lsn, commit_time=commit_time, flags=flags)

    def _origin_msg(self, r: Reader) -> Origin:
        if self._last_tag != "B" or self._begin is None:
            raise r.error(UnexpectedMessage, "ORIGIN is only allowed immediately after BEGIN", 0)
        if not self._allow_origin:
            raise r.error(
                UnexpectedMessage,
                "ORIGIN received but the startup message did not announce "
                "forward_changeset_origins",
                0,
            )
        flags = self._flags(r, "ORIGIN")
        origin_lsn = _lsn(r.u64("origin_lsn"))
        n = r.u8("origin_identifier_length")
        name = self._counted_string(r, n, "origin_identifier", require_nul=n > 0)
        r.finish()
        return Origin(origin_lsn=origin_lsn, origin_identifier=name, flags=flags)

    def _relation_msg(self, r: Reader) -> Relation:
        flags = self._flags(r, "RELATION")
        relid = r.u32("relidentifier")
        n = r.u8("nspnamelength")
        nspname = self._counted_string(r, n, "nspname", require_nul=True)
        n = r.u8("relnamelength")
        relname = self._counted_string(r, n, "relname", require_nul=True)
        pos = r.pos
        block = r.byte("attrs block type")
        if block != "A":
            raise r.error(InvalidFieldValue, f"expected attrs block 'A', got {block!r}", pos)
        pos = r.pos
        natts = r.u16("natts")
        if 2 * natts > r.remaining():
            raise r.error(
                TruncatedMessage,
                f"truncated: {natts} columns need at least {2 * natts} bytes, {r.remaining()} left",
                pos,
            )
        buf, columns, seen = r.buf, [], set()
        for i in range(natts):
            cpos = r.pos
            delim = r.byte("column delimiter")
            if delim != "C":
                raise r.error(
                    InvalidFieldValue,
                    f"expected column delimiter 'C' for column {i}, got {delim!r}",
                    cpos,
                )
            cflags = r.u8("column flags")
            name = None
            # Metadata blocks up to the next column delimiter (or the end): each is
            # type + uint16 length + body; unknown types are skipped by their length.
            while r.pos < r.end and buf[r.pos] != 0x43:  # 'C'
                bpos = r.pos
                btype = r.byte("column block type")
                blen = r.u16("blockbodylength")
                if btype == "N":
                    if name is not None:
                        raise r.error(
                            InvalidFieldValue, f"column {i} has two name blocks ('N')", bpos
                        )
                    name = self._counted_string(r, blen, "colname", require_nul=False)
                else:
                    r.bytes(blen, f"column block {btype!r} body")
            if name is None:
                raise r.error(InvalidFieldValue, f"column {i} has no name block ('N')", cpos)
            if name in seen:
                raise r.error(InvalidFieldValue, f"duplicate column name {name!r}", cpos)
            seen.add(name)
            columns.append(Column(colname=name, flags=cflags))
        r.finish()
        rel = Relation(
            relidentifier=relid, nspname=nspname, relname=relname, columns=columns, flags=flags
        )
        self._relations[relid] = rel
        return rel

    def _row_msg(self, r: Reader, tag: str) -> PglogicalMessage:
        self._in_transaction(r)
        label = r.message_type
        flags = self._flags(r, label.split(" ")[0] if label else "row")
        pos = r.pos
        relid = r.u32("relidentifier")
        rel = self._relations.get(relid)
        if rel is None:
            raise r.error(
                UnexpectedMessage,
                f"relidentifier {relid} was not announced by a RELATION ('R') message",
                pos,
            )
        first = self._tuple_type(r, "N" if tag == "I" else ("KO" if tag == "D" else "NKO"))
        if tag == "I":
            new = self._tuple(r, rel)
            r.finish()
            return Insert(relidentifier=relid, new_tuple=new, flags=flags, relation=rel)
        if tag == "D":
            old = self._tuple(r, rel)
            r.finish()
            return Delete(
                relidentifier=relid, old_tuple=old, old_tuple_type=first, flags=flags, relation=rel
            )
        old_type, old = None, None
        if first != "N":
            old_type, old = first, self._tuple(r, rel)
            self._tuple_type(r, "N")
        new = self._tuple(r, rel)
        r.finish()
        return Update(
            relidentifier=relid,
            old_tuple_type=old_type,
            old_tuple=old,
            new_tuple=new,
            flags=flags,
            relation=rel,
        )

    @staticmethod
    def _tuple_type(r: Reader, allowed: str) -> str:
        pos = r.pos
        t = r.byte("tuple type")
        if t not in "NKO":
            raise r.error(
                UnknownMessageType, f"unknown tuple type {t!r} (expected one of 'N', 'K', 'O')", pos
            )
        if t not in allowed:
            want = " or ".join(repr(a) for a in allowed)
            raise r.error(InvalidFieldValue, f"tuple type {t!r} here, expected {want}", pos)
        return t

    def _tuple(self, r: Reader, rel: Relation) -> tuple[TupleField, ...]:
        pos = r.pos
        fmt = r.byte("tupleformat")
        if fmt != "T":
            raise r.error(UnknownMessageType, f"unknown tupleformat {fmt!r} (expected 'T')", pos)
        pos = r.pos
        natts = r.u16("natts")
        ncols = len(rel.columns)
        if natts != ncols:
            raise r.error(
                InvalidFieldValue,
                f"tuple has {natts} fields but relation {rel.relidentifier} "
                f"({rel.nspname}.{rel.relname}) has {ncols} columns",
                pos,
            )
        buf, end, p = r.buf, r.end, r.pos
        fields: list[TupleField] = []
        append = fields.append
        for i in range(natts):
            if p >= end:
                raise r.error(TruncatedMessage, f"truncated: field {i} of {natts} is missing", p)
            kind = buf[p]
            if kind == 0x6E:  # 'n'
                append(NULL_FIELD)
                p += 1
                continue
            if kind == 0x75:  # 'u'
                append(UNCHANGED_FIELD)
                p += 1
                continue
            if kind not in (0x74, 0x62, 0x69):  # 't', 'b', 'i'
                raise r.error(
                    InvalidFieldValue,
                    f"unknown kind {chr(kind)!r} (0x{kind:02x}) for field {i} "
                    "(expected 'n', 'u', 'i', 'b' or 't')",
                    p,
                )
            if p + 5 > end:
                raise r.error(
                    TruncatedMessage,
                    f"truncated: length of field {i} needs 4 bytes, {end - p - 1} left",
                    p + 1,
                )
            (n,) = _I32.unpack_from(buf, p + 1)
            start = p + 5
            if n < 0:
                raise r.error(InvalidFieldValue, f"negative length {n} for field {i}", p + 1)
            stop = start + n
            if stop > end:
                raise r.error(
                    TruncatedMessage,
                    f"truncated: field {i} needs {n} bytes, {end - start} left",
                    start,
                )
            if kind == 0x74:  # 't'; the plugin counts and sends the NUL terminator
                raw = buf[start : stop - 1] if n and buf[stop - 1] == 0 else buf[start:stop]
                append(TupleField("t", self._text(r, raw, start, f"text value of field {i}")))
            elif kind == 0x62:
                if not self._allow_binary:
                    raise r.error(
                        InvalidFieldValue,
                        f"field {i} is send/recv binary ('b') but binary.binary_basetypes "
                        "was not enabled in the startup message",
                        p,
                    )
                append(TupleField("b", buf[start:stop]))
            else:
                if not self._allow_internal:
                    raise r.error(
                        InvalidFieldValue,
                        f"field {i} is internal binary ('i') but binary.internal_basetypes "
                        "was not enabled in the startup message",
                        p,
                    )
                append(TupleField("i", buf[start:stop]))
            p = stop
        r.pos = p
        return tuple(fields)


# -- encoding (what the real plugin writes) --------------------------------------------


def _name_bytes(value: str, what: str, encoding: str, *, max_len: int) -> bytes:
    raw = value.encode(encoding)
    if b"\x00" in raw:
        raise ValueError(f"{what} contains a NUL byte: {value!r}")
    raw += b"\x00"
    if len(raw) > max_len:
        raise ValueError(f"{what} is {len(raw) - 1} bytes; at most {max_len - 1} fit")
    return raw


def _flags_byte(flags: int) -> bytes:
    if not 0 <= flags <= 0xFF:
        raise ValueError(f"flags must fit one byte, not {flags}")
    return bytes((flags,))


def encode_startup(msg: Startup, *, encoding: str = "utf-8") -> bytes:
    out = bytearray(b"S")
    out.append(msg.startup_message_version)
    for key, value in msg.params.items():
        for s, what in ((key, "parameter name"), (value, f"value of {key!r}")):
            raw = s.encode(encoding)
            if b"\x00" in raw:
                raise ValueError(f"{what} contains a NUL byte")
            out += raw + b"\x00"
    return bytes(out)


def encode_begin(msg: Begin) -> bytes:
    return (
        b"B"
        + _flags_byte(msg.flags)
        + struct.pack("!QqI", msg.final_lsn, datetime_to_pg_us(msg.commit_time), msg.xid)
    )


def encode_commit(msg: Commit) -> bytes:
    return (
        b"C"
        + _flags_byte(msg.flags)
        + struct.pack("!QQq", msg.commit_lsn, msg.end_lsn, datetime_to_pg_us(msg.commit_time))
    )


def encode_origin(msg: Origin, *, encoding: str = "utf-8") -> bytes:
    name = _name_bytes(msg.origin_identifier, "origin_identifier", encoding, max_len=255)
    return b"O" + _flags_byte(msg.flags) + struct.pack("!QB", msg.origin_lsn, len(name)) + name


def encode_relation(
    msg: Relation,
    *,
    encoding: str = "utf-8",
    extra_blocks: Mapping[int, Sequence[tuple[str, bytes]]] | None = None,
) -> bytes:
    """``extra_blocks`` maps a column index to ``(block type, body)`` metadata blocks
    written after that column's name block (for tests of unknown-block skipping)."""
    out = bytearray(b"R")
    out += _flags_byte(msg.flags)
    out += struct.pack("!I", msg.relidentifier)
    for value, what in ((msg.nspname, "nspname"), (msg.relname, "relname")):
        raw = _name_bytes(value, what, encoding, max_len=255)
        out.append(len(raw))
        out += raw
    out += b"A" + _U16.pack(len(msg.columns))
    for i, col in enumerate(msg.columns):
        out += b"C" + _flags_byte(col.flags)
        raw = _name_bytes(col.colname, "colname", encoding, max_len=0xFFFF)
        out += b"N" + _U16.pack(len(raw)) + raw
        for btype, body in (extra_blocks or {}).get(i, ()):
            if btype == "C" or len(btype.encode("latin-1")) != 1:
                raise ValueError(f"bad column block type {btype!r}")
            out += btype.encode("latin-1") + _U16.pack(len(body)) + body
    return bytes(out)


def encode_tuple(fields: Sequence[TupleField], *, encoding: str = "utf-8") -> bytes:
    """``'T'``, natts, then each field; text values get the plugin's NUL terminator."""
    out = bytearray(b"T")
    out += _U16.pack(len(fields))
    for f in fields:
        k = f.kind
        if k in ("n", "u"):
            out += k.encode()
        elif k == "t":
            raw = _name_bytes(f.value, "text value", encoding, max_len=0x7FFFFFFF)  # type: ignore[arg-type]
            out += b"t" + _I32.pack(len(raw)) + raw
        elif k in ("i", "b"):
            raw = bytes(f.value)  # type: ignore[arg-type]
            out += k.encode() + _I32.pack(len(raw)) + raw
        else:
            raise ValueError(f"unknown tuple field kind {k!r}")
    return bytes(out)


def _row_header(tag: bytes, msg: Any) -> bytes:
    return tag + _flags_byte(msg.flags) + struct.pack("!I", msg.relidentifier)


def encode_insert(msg: Insert, *, encoding: str = "utf-8") -> bytes:
    return _row_header(b"I", msg) + b"N" + encode_tuple(msg.new_tuple, encoding=encoding)


def encode_update(msg: Update, *, encoding: str = "utf-8") -> bytes:
    out = _row_header(b"U", msg)
    if msg.old_tuple is not None:
        if msg.old_tuple_type not in ("K", "O"):
            raise ValueError(f"old_tuple_type must be 'K' or 'O', not {msg.old_tuple_type!r}")
        out += msg.old_tuple_type.encode() + encode_tuple(msg.old_tuple, encoding=encoding)
    return out + b"N" + encode_tuple(msg.new_tuple, encoding=encoding)


def encode_delete(msg: Delete, *, encoding: str = "utf-8") -> bytes:
    if msg.old_tuple_type not in ("K", "O"):
        raise ValueError(f"old_tuple_type must be 'K' or 'O', not {msg.old_tuple_type!r}")
    return (
        _row_header(b"D", msg)
        + msg.old_tuple_type.encode()
        + encode_tuple(msg.old_tuple, encoding=encoding)
    )


def encode_message(msg: PglogicalMessage, *, encoding: str = "utf-8") -> bytes:
    """The bytes the real plugin writes for ``msg``."""
    if isinstance(msg, Startup):
        return encode_startup(msg, encoding=encoding)
    if isinstance(msg, Begin):
        return encode_begin(msg)
    if isinstance(msg, Commit):
        return encode_commit(msg)
    if isinstance(msg, Origin):
        return encode_origin(msg, encoding=encoding)
    if isinstance(msg, Relation):
        return encode_relation(msg, encoding=encoding)
    if isinstance(msg, Insert):
        return encode_insert(msg, encoding=encoding)
    if isinstance(msg, Update):
        return encode_update(msg, encoding=encoding)
    if isinstance(msg, Delete):
        return encode_delete(msg, encoding=encoding)
    raise TypeError(f"not a pglogical message: {type(msg).__name__}")


# -- client side: START_REPLICATION parameters ------------------------------------------


def format_plugin_options(options: Iterable[tuple[str, str | None]]) -> str:
    """Render an output plugin's options as ``("key" 'value', "key2" 'value2')``.

    Generic (pgoutput, pglogical_output, ...): keys through
    :func:`~airflow_pgcdc.protocol.quoting.quote_ident`, values through
    :func:`~airflow_pgcdc.protocol.quoting.quote_literal`; a ``None`` value writes
    the key alone (the grammar's option without argument). ``""`` for no options, so
    ``f"START_REPLICATION SLOT {slot} LOGICAL {lsn} {format_plugin_options(opts)}"``
    works either way.
    """
    parts = []
    for key, value in options:
        parts.append(
            quote_ident(key) if value is None else f"{quote_ident(key)} {quote_literal(value)}"
        )
    return f"({', '.join(parts)})" if parts else ""


def _int_opt(name: str, value: Any, lo: int, hi: int) -> str:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in {lo}..{hi}, not {value}")
    return str(value)


def _bool_opt(name: str, value: Any) -> str:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
    return "true" if value else "false"


def _str_opt(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty str, not {value!r}")
    return value


def _ident_list(name: str, value: str | Sequence[str]) -> str:
    names = [value] if isinstance(value, str) else list(value)
    if not names:
        raise ValueError(f"{name} must name at least one entry")
    return ",".join(quote_ident(n) for n in names)


_UINT8 = 0xFF
_UINT16 = 0xFFFF
_INT32 = 0x7FFFFFFF


def pglogical_start_options(
    *,
    startup_params_format: int = STARTUP_PARAMS_FORMAT,
    min_proto_version: int = PROTO_VERSION,
    max_proto_version: int = PROTO_VERSION,
    proto_format: str | None = "native",
    expected_encoding: str | None = "UTF8",
    want_coltypes: bool = False,
    forward_changesets: bool = False,
    no_txinfo: bool | None = None,
    pg_version_num: int | None = None,
    pg_version: int | None = None,
    binary_want_internal_basetypes: bool = False,
    binary_want_binary_basetypes: bool = False,
    binary_basetypes_major_version: int | None = None,
    binary_sizeof_int: int | None = None,
    binary_sizeof_long: int | None = None,
    binary_sizeof_datum: int | None = None,
    binary_maxalign: int | None = None,
    binary_bigendian: bool | None = None,
    binary_float4_byval: bool | None = None,
    binary_float8_byval: bool | None = None,
    binary_integer_datetimes: bool | None = None,
    pglogical_replication_set_names: str | Sequence[str] | None = None,
    pglogical_forward_origins: str | Sequence[str] | None = None,
    pglogical_replicate_only_table: tuple[str, str] | None = None,
    extra: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
) -> list[tuple[str, str]]:
    """The ``(key, value)`` list for ``START_REPLICATION ... LOGICAL ... (...)``.

    Keys are the spec's spellings (``binary.want_binary_basetypes``); the first pair
    is ``startup_params_format`` as the spec demands. ``None`` leaves a key out;
    ``want_coltypes``, ``forward_changesets`` and the two ``binary_want_*`` flags are
    sent only when true (false is their default). Booleans go out as ``true``/``false``.

    pglogical 2.x extras: ``pglogical_replication_set_names`` (one name or several;
    the plugin replicates nothing without it), ``pglogical_forward_origins`` (the
    plugin accepts only ``"all"``), ``pglogical_replicate_only_table`` as
    ``(schema, table)``. Names are quoted with ``quote_ident`` because the plugin
    splits these values with ``SplitIdentifierString``.

    ``pg_version`` is an int: the real plugin parses it as an integer (the spec's
    ``server_version`` string would make it ERROR). ``extra`` adds other keys
    verbatim (e.g. ``hooks.setup_function`` or pglogical 1.x's
    ``relmeta_cache_size``); a key given twice raises ``ValueError``.
    Use :func:`format_plugin_options` to render the list.
    """
    opts: list[tuple[str, str]] = [
        ("startup_params_format", _int_opt("startup_params_format", startup_params_format, 1, 1)),
        ("max_proto_version", _int_opt("max_proto_version", max_proto_version, 1, _INT32)),
        ("min_proto_version", _int_opt("min_proto_version", min_proto_version, 1, _INT32)),
    ]
    if min_proto_version > max_proto_version:
        raise ValueError(
            f"min_proto_version {min_proto_version} > max_proto_version {max_proto_version}"
        )
    if proto_format is not None:
        if proto_format not in ("native", "json"):
            raise ValueError(f"proto_format must be 'native' or 'json', not {proto_format!r}")
        opts.append(("proto_format", proto_format))
    if expected_encoding is not None:
        opts.append(("expected_encoding", _str_opt("expected_encoding", expected_encoding)))
    for key, flag in (("want_coltypes", want_coltypes), ("forward_changesets", forward_changesets)):
        if _bool_opt(key, flag) == "true":
            opts.append((key, "true"))
    if no_txinfo is not None:
        opts.append(("no_txinfo", _bool_opt("no_txinfo", no_txinfo)))
    if pg_version_num is not None:
        opts.append(("pg_version_num", _int_opt("pg_version_num", pg_version_num, 0, _INT32)))
    if pg_version is not None:
        opts.append(("pg_version", _int_opt("pg_version", pg_version, 0, _INT32)))
    for key, flag in (
        ("binary.want_internal_basetypes", binary_want_internal_basetypes),
        ("binary.want_binary_basetypes", binary_want_binary_basetypes),
    ):
        if _bool_opt(key, flag) == "true":
            opts.append((key, "true"))
    for key, value, hi in (
        ("binary.basetypes_major_version", binary_basetypes_major_version, _UINT16),
        ("binary.sizeof_int", binary_sizeof_int, _UINT8),
        ("binary.sizeof_long", binary_sizeof_long, _UINT8),
        ("binary.sizeof_datum", binary_sizeof_datum, _UINT8),
        ("binary.maxalign", binary_maxalign, _UINT8),
    ):
        if value is not None:
            opts.append((key, _int_opt(key, value, 1, hi)))
    for key, flag in (
        ("binary.bigendian", binary_bigendian),
        ("binary.float4_byval", binary_float4_byval),
        ("binary.float8_byval", binary_float8_byval),
        ("binary.integer_datetimes", binary_integer_datetimes),
    ):
        if flag is not None:
            opts.append((key, _bool_opt(key, flag)))
    if pglogical_forward_origins is not None:
        opts.append(
            (
                "pglogical.forward_origins",
                _ident_list("pglogical_forward_origins", pglogical_forward_origins),
            )
        )
    if pglogical_replication_set_names is not None:
        opts.append(
            (
                "pglogical.replication_set_names",
                _ident_list("pglogical_replication_set_names", pglogical_replication_set_names),
            )
        )
    if pglogical_replicate_only_table is not None:
        schema, table = pglogical_replicate_only_table
        opts.append(("pglogical.replicate_only_table", quote_qualified(schema, table)))
    if extra is not None:
        seen = {k for k, _ in opts}
        items = extra.items() if isinstance(extra, Mapping) else extra
        for key, value in items:
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError(f"extra option {key!r}: keys and values must be str")
            if key in seen:
                raise ValueError(f"option {key!r} given twice")
            seen.add(key)
            opts.append((key, value))
    return opts


def binary_compat_params_for_server(server_version_num: int) -> dict[str, int | bool]:
    """The ``binary_*`` keyword arguments of :func:`pglogical_start_options` that
    describe this machine, for a server whose ``server_version_num`` is given.

    ``binary_basetypes_major_version`` is ``server_version_num // 100`` (the plugin
    enables binary modes only when it equals its own ``PG_VERSION_NUM / 100``);
    sizes, alignment and byte order come from this interpreter's C ABI.

    ``float4_byval``, ``float8_byval`` and ``integer_datetimes`` are deliberately left
    out: pglogical 2.x compares them with build flags that PostgreSQL removed (13 and
    10), reports them as ``f`` on every modern server, and stores the client's
    ``float8_byval`` into its float4 setting, so sending the true values makes it
    silently refuse internal mode (measured on pglogical 2.4.2 / PostgreSQL 15).
    Use as
    ``pglogical_start_options(binary_want_binary_basetypes=True, **binary_compat_params_for_server(v))``.
    """
    if isinstance(server_version_num, bool) or not isinstance(server_version_num, int):
        raise TypeError("server_version_num must be an int (e.g. 150004)")
    if not 90400 <= server_version_num < 10_000_000:
        raise ValueError(
            f"server_version_num {server_version_num} is not a PostgreSQL 9.4+ "
            "server_version_num (e.g. 150004)"
        )
    sizeof_datum = ctypes.sizeof(ctypes.c_void_p)
    maxalign = max(
        ctypes.alignment(ctypes.c_long),
        ctypes.alignment(ctypes.c_double),
        ctypes.alignment(ctypes.c_longlong),
    )
    return {
        "binary_basetypes_major_version": server_version_num // 100,
        "binary_sizeof_int": ctypes.sizeof(ctypes.c_int),
        "binary_sizeof_long": ctypes.sizeof(ctypes.c_long),
        "binary_sizeof_datum": sizeof_datum,
        "binary_maxalign": maxalign,
        "binary_bigendian": sys.byteorder == "big",
    }
