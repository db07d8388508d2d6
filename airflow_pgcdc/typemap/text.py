"""The text-like families: text and the types kept as their text (:class:`TextCodec`), UTF-8
and uuid from binary, and ``bytea`` (:class:`ByteaCodec`).
"""

from __future__ import annotations

import binascii
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_pgcdc.protocol.pgtypes import PgTypeInfo
from airflow_pgcdc.typemap import arrays
from airflow_pgcdc.typemap.codec import (
    _TRUE,
    INT32_MAX,
    BadValue,
    Codec,
    _as_string,
    _binary_all,
    _locate,
    _OneBad,
    _per_value,
    _str,
)


class TextCodec(Codec):
    """Exact PostgreSQL text in an Arrow string (text types, json, enums, and every type
    without a typed mapping). ``binary``: how the type's binary form becomes its text:
    ``utf8`` (the same text), ``jsonb`` (version byte 1 + text), ``char`` (one byte,
    escaped like ``charout``), ``uuid`` (16 bytes), or None (not supported)."""

    identity_text = True
    csv_type = pa.string()

    def __init__(self, type_: PgTypeInfo, typmod: int, binary: str | None = None, encoding: str = "text"):
        super().__init__(type_, typmod)
        self.binary = binary
        self.binary_supported = binary is not None
        self.encoding = encoding

    def from_text(self, arr: pa.Array) -> pa.Array:
        return _as_string(arr)

    def parse_one(self, text: str) -> str:
        return text

    def from_binary(self, values: list) -> pa.Array:
        kind = self.binary
        if kind == "utf8":
            return utf8_from_binary(values)
        if kind == "jsonb":
            out = []
            for i, v in enumerate(values):
                if v is None:
                    out.append(None)
                elif len(v) < 1 or v[0] != 1:
                    raise BadValue(i, "binary jsonb must start with version byte 1", bytes(v))
                else:
                    out.append(bytes(v[1:]))
            return utf8_from_binary(out)
        if kind == "uuid":
            return _uuid_from_binary(values)
        if kind == "char":
            out = []
            for i, v in enumerate(values):
                if v is None:
                    out.append(None)
                elif len(v) != 1:
                    raise BadValue(i, 'binary "char" must be 1 byte', bytes(v))
                else:
                    b = v[0]
                    out.append("" if b == 0 else chr(b) if b < 0x80 else f"\\{b:03o}")
            return arrays.strings(out)
        return super().from_binary(values)

    def to_text(self, arr: pa.Array) -> list[str | None]:
        return arr.to_pylist()


def utf8_from_binary(values: list) -> pa.Array:
    """Binary values that are UTF-8 text (``None``: NULL) as a string array; invalid
    UTF-8 raises :class:`BadValue` naming the first bad value."""
    arr = arrays.binaries(values)
    try:
        return arr.cast(pa.string())
    except pa.ArrowInvalid:
        for i, v in enumerate(values):
            if v is not None:
                try:
                    bytes(v).decode("utf-8")
                except UnicodeDecodeError as e:
                    raise BadValue(i, f"invalid UTF-8: {e}", bytes(v)) from None
        raise


_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def _uuid_from_binary(values: list) -> pa.Array:
    data, null_mask = _binary_all(values, 16, "uuid")
    n = len(values)
    raw = np.frombuffer(data, dtype=np.uint8).reshape(n, 16)
    hexd = np.empty((n, 32), dtype=np.uint8)
    hexd[:, 0::2] = _HEX[raw >> 4]
    hexd[:, 1::2] = _HEX[raw & 15]
    out = np.full((n, 36), ord("-"), dtype=np.uint8)
    for dst, src in ((0, 0), (9, 8), (14, 12), (19, 16), (24, 20)):
        width = {0: 8, 9: 4, 14: 4, 19: 4, 24: 12}[dst]
        out[:, dst : dst + width] = hexd[:, src : src + width]
    offsets = np.arange(0, 36 * (n + 1), 36, dtype=np.int32)
    storage = pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(out.tobytes())]
    )
    if null_mask.any():
        storage = pc.if_else(arrays.from_numpy(null_mask, pa.bool_()), _str(None), storage)
    return storage


class ByteaCodec(Codec):
    encoding = "bytea"
    binary_supported = True

    def __init__(self, type_, typmod):
        super().__init__(type_, typmod)
        self.arrow_type = pa.binary()

    def from_text(self, arr):
        arr = _as_string(arr)
        starts = pc.starts_with(arr, "\\x")
        if not pc.all(pc.fill_null(starts, _TRUE)).as_py():
            # escape format (bytea_output = escape): per value
            vals = _per_value(arr, self.parse_one)
            out = [vals.get(i) for i in range(len(arr))]
            return arrays.binaries(out)
        body = pc.binary_slice(arr.cast(pa.binary()), 2, INT32_MAX)
        validity, offsets_buf, data_buf = body.buffers()
        n = len(body)
        offsets = np.frombuffer(offsets_buf, dtype=np.int32)[body.offset : body.offset + n + 1]
        lengths = np.diff(offsets)
        if (lengths & 1).any():
            i = int(np.flatnonzero(lengths & 1)[0])
            raise BadValue(i, "odd number of hex digits", arr[i].as_py())
        start, end = int(offsets[0]), int(offsets[-1])
        try:
            decoded = binascii.unhexlify(memoryview(data_buf)[start:end]) if end > start else b""
        except (binascii.Error, ValueError):
            raise _locate(arr, self.parse_one, "invalid hex digit") from None
        new_offsets = ((offsets - start) // 2).astype(np.int32)
        bufs = [validity, pa.py_buffer(new_offsets), pa.py_buffer(decoded)]
        return pa.Array.from_buffers(pa.binary(), n, bufs, body.null_count, body.offset)

    _OCT = re.compile(r"\\(\\|[0-3][0-7]{2})")

    def parse_one(self, text):
        if text.startswith("\\x"):
            try:
                return bytes.fromhex(text[2:])
            except ValueError as e:
                raise _OneBad(f"invalid hex bytea: {e}") from None
        out = bytearray()
        pos = 0
        for m in self._OCT.finditer(text):
            chunk = text[pos : m.start()]
            if "\\" in chunk:
                raise _OneBad("invalid escape in bytea")
            out += chunk.encode("latin-1")
            g = m.group(1)
            out.append(92 if g == "\\" else int(g, 8))
            pos = m.end()
        tail = text[pos:]
        if "\\" in tail:
            raise _OneBad("invalid escape in bytea")
        try:
            out += tail.encode("latin-1")
        except UnicodeEncodeError:
            raise _OneBad("non-byte character in escaped bytea") from None
        return bytes(out)

    def from_binary(self, values):
        return arrays.binaries(values)

    def to_text(self, arr):
        return [None if v is None else "\\x" + v.hex() for v in arr.to_pylist()]


