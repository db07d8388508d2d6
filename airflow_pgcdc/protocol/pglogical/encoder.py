"""The encoders: exactly the bytes the real plugin writes (round-trip tests, fuzz seeds).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_pgcdc.protocol.pglogical.messages import (
    _I32,
    _U16,
    Begin,
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
from airflow_pgcdc.protocol.pgtime import datetime_to_pg_us

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


