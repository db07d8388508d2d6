"""Arrow arrays and scalars from Python lists and numpy arrays, built over buffers; and
numpy views of Arrow arrays.

Why not ``pa.array``: pyarrow imports pandas (when it is installed) the first time it
converts a Python or numpy object. ``pa.array``, ``pa.scalar``, a Python literal given
to a compute function (``pc.equal(arr, "t")`` converts ``"t"`` with ``pa.scalar``) and
``Array.to_numpy`` each first ask pyarrow's pandas shim whether the object is a pandas
one (``pandas_api._have_pandas_internal()``), and the first such question imports
pandas: about a second and 40-50 MB of resident memory in a process that has no use
for it. The change-stream path (:mod:`~airflow_pgcdc.typemap.decode.tuples`,
:mod:`~airflow_pgcdc.changes.rows`, the codecs) builds its arrays and scalars here
instead, with ``pa.Array.from_buffers`` over numpy memory, and reads Arrow buffers back
with numpy; compute kernels on Arrow arrays and scalars never ask.

The builders match ``pa.array(values, type)`` for the values they accept (tested
against it); they are as fast (strings: one ``str.join`` and one ``len`` per value).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import repeat
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = [
    "binaries",
    "bools",
    "from_numpy",
    "ints",
    "list_array",
    "null_mask",
    "nulls",
    "numpy_values",
    "scalar",
    "strings",
    "true_mask",
    "validity",
]

INT32_MAX = 2**31 - 1
_INT64 = pa.int64()


def _not_none(values: Sequence) -> np.ndarray:
    return np.fromiter(map(operator.is_not, values, repeat(None)), dtype=bool, count=len(values))


def validity(null_mask: np.ndarray | None) -> tuple[pa.Buffer | None, int]:
    """The validity bitmap of ``null_mask`` (True where null) and the null count."""
    if null_mask is None:
        return None, 0
    nulls = int(np.count_nonzero(null_mask))
    if nulls == 0:
        return None, 0
    return pa.py_buffer(np.packbits(~np.asarray(null_mask, dtype=bool), bitorder="little")), nulls


def _numpy_dtype(arrow_type: pa.DataType) -> np.dtype:
    """The numpy dtype of a fixed-width Arrow type's data buffer."""
    if pa.types.is_floating(arrow_type):
        return np.dtype(f"float{arrow_type.bit_width}")
    if pa.types.is_unsigned_integer(arrow_type):
        return np.dtype(f"uint{arrow_type.bit_width}")
    if pa.types.is_integer(arrow_type) or pa.types.is_temporal(arrow_type):
        return np.dtype(f"int{arrow_type.bit_width}")  # dates, times, timestamps, durations
    raise TypeError(f"not a fixed-width numeric or temporal Arrow type: {arrow_type}")


def from_numpy(values: np.ndarray, arrow_type: pa.DataType, null_mask: np.ndarray | None = None) -> pa.Array:
    """An array of ``arrow_type`` (boolean, integer, floating point or temporal) over
    ``values`` (converted to the type's storage dtype, without range checks);
    ``null_mask`` is True where the value is null."""
    n = len(values)
    bitmap, nulls = validity(null_mask)
    if pa.types.is_boolean(arrow_type):
        data = np.packbits(np.asarray(values, dtype=bool), bitorder="little")
    else:
        data = np.ascontiguousarray(values, dtype=_numpy_dtype(arrow_type))
    return pa.Array.from_buffers(arrow_type, n, [bitmap, pa.py_buffer(data)], nulls)


def bools(values: Sequence[bool]) -> pa.Array:
    """A boolean array (no nulls) from Python truth values."""
    return from_numpy(np.fromiter(values, dtype=bool, count=len(values)), pa.bool_())


def ints(values: Sequence[int | None], arrow_type: pa.DataType = _INT64) -> pa.Array:
    """``pa.array(values, arrow_type)`` for Python ints and ``None`` (integer or temporal
    types, values in int64 range)."""
    n = len(values)
    if None in values:
        valid = _not_none(values)
        data = np.zeros(n, dtype=np.int64)
        data[valid] = np.fromiter((v for v in values if v is not None), dtype=np.int64)
        return from_numpy(data, arrow_type, ~valid)
    return from_numpy(np.fromiter(values, dtype=np.int64, count=n), arrow_type)


def _varlen(arrow_type: pa.DataType, n: int, lengths: np.ndarray, data: bytes,
            valid: np.ndarray | None) -> pa.Array:
    if valid is not None:
        full = np.zeros(n, dtype=np.int64)
        full[valid] = lengths
        lengths = full
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > INT32_MAX:  # over 2 GiB: the 64-bit offsets variant
        arrow_type = pa.large_string() if pa.types.is_string(arrow_type) else pa.large_binary()
    else:
        offsets = offsets.astype(np.int32)
    bitmap, nulls = validity(None if valid is None else ~valid)
    return pa.Array.from_buffers(arrow_type, n, [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)], nulls)


def strings(values: Sequence[str | None]) -> pa.Array:
    """``pa.array(values, pa.string())`` for a sequence of ``str`` and ``None``."""
    n = len(values)
    valid = None
    if None in values:
        valid = _not_none(values)
        values = [v for v in values if v is not None]
    text = "".join(values)
    if text.isascii():
        data = text.encode("ascii")
        lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    else:
        encoded = [v.encode("utf-8") for v in values]
        data = b"".join(encoded)
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    return _varlen(pa.string(), n, lengths, data, valid)


def binaries(values: Sequence[bytes | bytearray | memoryview | None]) -> pa.Array:
    """``pa.array(values, pa.binary())`` for a sequence of bytes-like objects and ``None``."""
    n = len(values)
    valid = None
    if None in values:
        valid = _not_none(values)
        values = [v for v in values if v is not None]
    data = b"".join(values)
    lengths = np.fromiter(map(_nbytes, values), dtype=np.int64, count=len(values))
    return _varlen(pa.binary(), n, lengths, data, valid)


def _nbytes(v: bytes | bytearray | memoryview) -> int:
    return v.nbytes if type(v) is memoryview else len(v)


def list_array(offsets: np.ndarray, values: pa.Array, arrow_type: pa.DataType | None = None,
               null_mask: np.ndarray | None = None) -> pa.Array:
    """A list array: row ``i`` holds ``values[offsets[i]:offsets[i + 1]]``; ``null_mask``
    True where the row is null."""
    mask = from_numpy(null_mask, pa.bool_()) if null_mask is not None and null_mask.any() else None
    return pa.ListArray.from_arrays(
        from_numpy(np.asarray(offsets), pa.int32()), values, type=arrow_type, mask=mask
    )


def nulls(n: int, arrow_type: pa.DataType) -> pa.Array:
    """``n`` nulls of ``arrow_type``. Unlike ``pa.nulls``, the children of a struct are
    not null themselves but zeros (or empty), so that a struct whose fields are declared
    non-nullable (``interval``'s) stays valid, e.g. for the Parquet writer."""
    if not pa.types.is_struct(arrow_type):
        return pa.nulls(n, arrow_type)
    children = [nulls(n, f.type) if f.nullable else _zeros(n, f.type) for f in arrow_type]
    return pa.StructArray.from_arrays(children, fields=list(arrow_type),
                                      mask=from_numpy(np.ones(n, dtype=bool), pa.bool_()))


def _zeros(n: int, arrow_type: pa.DataType) -> pa.Array:
    """``n`` non-null zero values (empty strings, empty lists, structs of zeros)."""
    if pa.types.is_struct(arrow_type):
        return pa.StructArray.from_arrays([_zeros(n, f.type) for f in arrow_type], fields=list(arrow_type))
    if pa.types.is_list(arrow_type):
        return list_array(np.zeros(n + 1, dtype=np.int32), nulls(0, arrow_type.value_type), arrow_type)
    if pa.types.is_string(arrow_type) or pa.types.is_binary(arrow_type):
        offsets = pa.py_buffer(np.zeros(n + 1, dtype=np.int32))
        return pa.Array.from_buffers(arrow_type, n, [None, offsets, pa.py_buffer(b"")])
    return from_numpy(np.zeros(n, dtype=bool if pa.types.is_boolean(arrow_type) else _numpy_dtype(arrow_type)),
                      arrow_type)


def scalar(value: Any, arrow_type: pa.DataType) -> pa.Scalar:
    """``pa.scalar(value, arrow_type)`` for ``None``, ``str`` (string types), bytes
    (binary types) and numbers or booleans (fixed-width types)."""
    if value is None:
        return pa.nulls(1, arrow_type)[0]
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        arr = strings([value])
    elif pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        arr = binaries([value])
    elif pa.types.is_boolean(arrow_type):
        arr = from_numpy(np.array([bool(value)]), arrow_type)
    else:
        arr = from_numpy(np.array([value], dtype=_numpy_dtype(arrow_type)), arrow_type)
    return (arr if arr.type == arrow_type else arr.cast(arrow_type))[0]


# --------------------------------------------------------------------------- Arrow -> numpy


def _bits(buf: pa.Buffer, offset: int, n: int) -> np.ndarray:
    if n == 0:
        return np.zeros(0, dtype=bool)
    raw = np.frombuffer(buf, dtype=np.uint8)
    return np.unpackbits(raw, count=offset + n, bitorder="little")[offset:].view(bool)


def null_mask(arr: pa.Array) -> np.ndarray:
    """A numpy bool array, True where ``arr`` is null."""
    n = len(arr)
    nulls = arr.null_count
    if nulls == 0:
        return np.zeros(n, dtype=bool)
    if nulls == n:
        return np.ones(n, dtype=bool)
    return ~_bits(arr.buffers()[0], arr.offset, n)


def true_mask(arr: pa.Array) -> np.ndarray:
    """A numpy bool array, True where the boolean array ``arr`` is true (null: False)."""
    n = len(arr)
    if arr.null_count == n:
        return np.zeros(n, dtype=bool)
    out = _bits(arr.buffers()[1], arr.offset, n).copy()
    if arr.null_count:
        out &= ~null_mask(arr)
    return out


def numpy_values(arr: pa.Array, dtype: Any = None) -> np.ndarray:
    """The values of a fixed-width (integer, floating point, temporal) array as a
    read-only numpy array of its storage dtype (or ``dtype``, same width); the slots of
    nulls hold whatever the buffer has."""
    n = len(arr)
    dtype = np.dtype(dtype) if dtype is not None else _numpy_dtype(arr.type)
    buf = arr.buffers()[1]
    if buf is None or n == 0:
        return np.zeros(n, dtype=dtype)
    return np.frombuffer(buf, dtype=dtype, count=arr.offset + n)[arr.offset :]
