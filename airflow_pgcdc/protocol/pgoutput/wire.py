"""Reading pgoutput bytes for :mod:`.decoder`: fixed field layouts with precise errors, C
strings, timestamps, and the two TupleData readers (the optimistic loop and the fully
checked one it falls back to, so errors stay precise).
"""

from __future__ import annotations

import codecs
import struct
from datetime import datetime

from airflow_pgcdc.errors import (
    InvalidFieldValue,
    ProtocolError,
    TrailingBytes,
    TruncatedMessage,
    UnknownMessageType,
)
from airflow_pgcdc.protocol.pgoutput.messages import (
    PROTOCOL,
    UNCHANGED_TOAST,
    TupleData,
    TupleValue,
)
from airflow_pgcdc.protocol.pgtime import pg_us_to_datetime

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


