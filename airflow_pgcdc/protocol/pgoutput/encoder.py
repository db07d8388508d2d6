""":func:`encode_message` and :func:`encode_tuple`: the exact wire bytes a walsender sends
for a message (used by tests, fuzz seeds and the benchmark).
"""

from __future__ import annotations

import struct
from datetime import datetime

from airflow_pgcdc.protocol.pgoutput.messages import (
    _STREAM_DATA,
    MAX_PROTO_VERSION,
    MIN_PROTO_VERSION,
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    Update,
    _use_encoder,
)
from airflow_pgcdc.protocol.pgoutput.wire import _I16, _U8, _U32
from airflow_pgcdc.protocol.pgtime import datetime_to_pg_us

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


_use_encoder(encode_message)
