""":class:`PglogicalDecoder`: the stateful decoder of one pglogical_output stream (one
``START_REPLICATION``): flow checks, the relation map, precise errors (see the package
docstring for where the real plugin and the spec differ).
"""

from __future__ import annotations

import codecs
from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType

from airflow_pgcdc.errors import (
    InvalidFieldValue,
    ProtocolError,
    TruncatedMessage,
    UnexpectedMessage,
    UnknownMessageType,
)
from airflow_pgcdc.protocol.buffer import Reader
from airflow_pgcdc.protocol.lsn import wire_lsn
from airflow_pgcdc.protocol.pglogical.messages import (
    _I32,
    _LABELS,
    _STARTUP_PARAM_TYPES,
    NULL_FIELD,
    PROTO_VERSION,
    PROTOCOL,
    STARTUP_MESSAGE_VERSION,
    UNCHANGED_FIELD,
    Begin,
    Column,
    Commit,
    Delete,
    Insert,
    Origin,
    PglogicalMessage,
    Relation,
    Startup,
    TupleField,
    Update,
)
from airflow_pgcdc.protocol.pgtime import pg_us_to_datetime

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
        final_lsn = wire_lsn(r.u64("lsn"))
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
        commit_lsn = wire_lsn(r.u64("commit lsn"))
        end_pos = r.pos
        end_lsn = wire_lsn(r.u64("end lsn"))
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
        origin_lsn = wire_lsn(r.u64("origin_lsn"))
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


