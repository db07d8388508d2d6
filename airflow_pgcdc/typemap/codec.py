"""The codec base, by which every PostgreSQL type family converts (one module per family
beside this one: ``text``, ``numeric``, ``times``, ``pgarray``).

One codec per PostgreSQL type family: text → Arrow (vectorised), binary → Arrow, and
Arrow → PostgreSQL text (the inverse, for verification).

Internal: the public API is the package, :mod:`airflow_pgcdc.typemap`. Codecs work on
whole Arrow arrays; when a value cannot be converted they raise :class:`BadValue` with
the index of the offending value in the array they were given; the public layer adds
table, column, type and row.

Vectorised means pyarrow.compute kernels (and numpy over Arrow buffers): a per-value
Python loop runs only for rare types (interval, timetz, arrays with quoted elements,
numeric in binary form) and for the few irregular values of common types (±infinity,
BC dates, years past 9999, ``24:00:00``).

Arrays and scalars made from Python or numpy values (the literals given to compute
kernels included) are built by :mod:`airflow_pgcdc.typemap.arrays`, never by
``pa.array``/``pa.scalar``/``to_numpy``: those make pyarrow import pandas.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_pgcdc.protocol.pgtypes import PgTypeInfo, format_type
from airflow_pgcdc.typemap import arrays

# --------------------------------------------------------------------------- constants

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

DATE_POS_INFINITY = INT32_MAX
"""``date 'infinity'`` as Arrow date32 (days since 1970-01-01): int32 max."""
DATE_NEG_INFINITY = INT32_MIN
"""``date '-infinity'`` as Arrow date32: int32 min."""
TIMESTAMP_POS_INFINITY = INT64_MAX
"""``timestamp[tz] 'infinity'`` as Arrow timestamp[us]: int64 max."""
TIMESTAMP_NEG_INFINITY = INT64_MIN
"""``timestamp[tz] '-infinity'`` as Arrow timestamp[us]: int64 min."""

INTERVAL_POS_INFINITY = (INT32_MAX, INT32_MAX, INT64_MAX)
"""``interval 'infinity'`` (PostgreSQL 17+) as (months, days, microseconds), as stored."""
INTERVAL_NEG_INFINITY = (INT32_MIN, INT32_MIN, INT64_MIN)

TIME_24H_US = 86_400_000_000
"""``time '24:00:00'``: one past Arrow's nominal time64 range, kept as is (see docs)."""

UNIX_EPOCH_PG_DAYS = 10_957
"""2000-01-01 (PostgreSQL's epoch) in days since 1970-01-01."""
UNIX_EPOCH_PG_US = UNIX_EPOCH_PG_DAYS * 86_400_000_000

DECIMAL_MAX_PRECISION = 38

INTERVAL_TYPE = pa.struct(
    [
        pa.field("months", pa.int32(), nullable=False),
        pa.field("days", pa.int32(), nullable=False),
        pa.field("microseconds", pa.int64(), nullable=False),
    ]
)


class BadValue(Exception):
    """Internal: value ``index`` of the array being converted is not valid.

    ``unrepresentable``: the value is valid PostgreSQL but has no lossless form in the
    mapped Arrow type (the public error is then ``UnrepresentableValue``)."""

    def __init__(self, index: int, reason: str, value: Any = None, *, unrepresentable: bool = False):
        super().__init__(reason)
        self.index = index
        self.reason = reason
        self.value = value
        self.unrepresentable = unrepresentable


class _OneBad(Exception):
    """Internal: a single-value parser's failure (no index yet)."""

    def __init__(self, reason: str, *, unrepresentable: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.unrepresentable = unrepresentable


# --------------------------------------------------------------------------- helpers


def _str(value: str | None) -> pa.Scalar:
    """A string scalar, for compute kernels (given a Python ``str``, they call
    ``pa.scalar``, which makes pyarrow import pandas)."""
    return arrays.scalar(value, pa.string())


_FALSE = arrays.scalar(False, pa.bool_())
_TRUE = arrays.scalar(True, pa.bool_())


def _true_positions(mask: pa.Array) -> np.ndarray:
    """Indices where a boolean array is true (nulls count as false)."""
    return np.flatnonzero(arrays.true_mask(mask))


def _any_true(mask: pa.Array) -> bool:
    v = pc.any(mask).as_py()
    return bool(v)


def _per_value(arr: pa.Array, parse_one, positions=None) -> dict[int, Any]:
    """Run ``parse_one`` on the values at ``positions`` (default: every non-null one)."""
    out: dict[int, Any] = {}
    if positions is None:
        pairs = enumerate(arr.to_pylist())
    else:  # convert only the few values asked for
        positions = [int(i) for i in positions]
        pairs = zip(positions, arr.take(arrays.ints(positions)).to_pylist(), strict=True)
    for i, v in pairs:
        if v is None:
            continue
        try:
            out[i] = parse_one(v)
        except _OneBad as e:
            raise BadValue(i, e.reason, v, unrepresentable=e.unrepresentable) from None
        except (ValueError, OverflowError, IndexError) as e:
            raise BadValue(i, f"cannot parse: {e}", v) from None
    return out


def _locate(arr: pa.Array, parse_one, fallback_reason: str) -> BadValue:
    """The first value of ``arr`` that ``parse_one`` rejects, as a BadValue."""
    try:
        _per_value(arr, parse_one)
    except BadValue as e:
        return e
    return BadValue(0, fallback_reason, None)


def _as_string(arr: pa.Array) -> pa.Array:
    if pa.types.is_large_string(arr.type) or pa.types.is_string_view(arr.type):
        return arr.cast(pa.string())
    if pa.types.is_null(arr.type):
        return pa.nulls(len(arr), pa.string())
    return arr


def _ints_with_overrides(
    base: pa.Array, overrides: dict[int, int], null_mask: np.ndarray, np_dtype, arrow_type: pa.DataType
) -> pa.Array:
    """``base`` (castable to ints) with some positions replaced, nulls from ``null_mask``."""
    vals = np.array(arrays.numpy_values(base), dtype=np_dtype)
    vals[arrays.null_mask(base)] = 0
    for i, v in overrides.items():
        vals[i] = v
    storage = arrays.from_numpy(vals, pa.from_numpy_dtype(np.dtype(np_dtype)), null_mask)
    return _view(storage, arrow_type)


def _view(storage: pa.Array, arrow_type: pa.DataType) -> pa.Array:
    """Reinterpret an int array's buffers as ``arrow_type`` (no range checks)."""
    if storage.type == arrow_type:
        return storage
    return pa.Array.from_buffers(arrow_type, len(storage), storage.buffers(), storage.null_count, storage.offset)


def _binary_all(values: list, width: int, label: str) -> tuple[bytes, np.ndarray]:
    """Join fixed-width binary values (None → zeros), checking every length."""
    n = len(values)
    null_mask = np.fromiter((v is None for v in values), dtype=bool, count=n)
    if null_mask.any():
        zero = bytes(width)
        values = [zero if v is None else v for v in values]
    lengths = set(map(len, values))
    if lengths and lengths != {width}:
        for i, v in enumerate(values):
            if len(v) != width:
                raise BadValue(i, f"binary {label} must be {width} bytes, got {len(v)}", bytes(v))
    return b"".join(values), null_mask


def _wire(data: bytes | np.ndarray, dtype) -> np.ndarray:
    """Fixed-width big-endian values joined in ``data`` as a numpy array of ``dtype``."""
    if isinstance(data, np.ndarray):
        return data.view(dtype).reshape(-1)
    return np.frombuffer(data, dtype=dtype)


def _fixed_value(data: bytes | np.ndarray, width: int, i: int) -> bytes:
    """The ``i``-th ``width``-byte value of ``data`` (for error messages)."""
    if isinstance(data, np.ndarray):
        return data.reshape(-1)[i * width : (i + 1) * width].tobytes()
    return bytes(data[i * width : (i + 1) * width])


# --------------------------------------------------------------------------- codecs


class Codec:
    """Converts one PostgreSQL type (with its typmod) to and from Arrow."""

    encoding = "text"  # short tag written into the field metadata (pg_encoding)
    csv_type: pa.DataType | None = None  # pyarrow.csv may parse the COPY CSV text natively
    identity_text = False  # from_text is the identity on a string array

    def __init__(self, type_: PgTypeInfo, typmod: int) -> None:
        self.pg = type_
        self.typmod = typmod
        self.arrow_type: pa.DataType = pa.string()

    # -- text
    def from_text(self, arr: pa.Array) -> pa.Array:
        raise NotImplementedError

    def parse_one(self, text: str) -> Any:
        """Parse one text value (used to locate errors and for irregular values)."""
        raise NotImplementedError

    # -- binary
    binary_supported = False
    fixed_width: int | None = None
    """Bytes of every binary value when the type's binary form has a fixed width: such a
    codec also converts a whole column at once with :meth:`from_fixed`."""

    def from_binary(self, values: list) -> pa.Array:
        if self.fixed_width is not None:
            return self.from_fixed(*_binary_all(values, self.fixed_width, self.pg.name))
        raise BadValue(0, f"binary format of {format_type(self.pg, self.typmod)} is not supported")

    def from_fixed(self, data: bytes | np.ndarray, null_mask: np.ndarray) -> pa.Array:
        """A column of fixed-width binary values, ``fixed_width`` bytes each, joined in
        ``data`` (bytes, or a uint8 array), with ``null_mask`` (the bytes of a NULL are
        ignored)."""
        raise NotImplementedError

    # -- back to PostgreSQL text
    def to_text(self, arr: pa.Array) -> list[str | None]:
        raise NotImplementedError

    def metadata(self) -> dict[bytes, bytes]:
        return {b"pg_encoding": self.encoding.encode()}


