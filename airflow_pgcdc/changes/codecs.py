"""One codec per PostgreSQL type family: text → Arrow (vectorised), binary → Arrow, and
Arrow → PostgreSQL text (the inverse, for verification).

Internal module: the public API is :mod:`airflow_pgcdc.changes.typemap`. Codecs work on
whole Arrow arrays; when a value cannot be converted they raise :class:`BadValue` with
the index of the offending value in the array they were given; the public layer adds
table, column, type and row.

Vectorised means pyarrow.compute kernels (and numpy over Arrow buffers): a per-value
Python loop runs only for rare types (interval, timetz, arrays with quoted elements,
numeric in binary form) and for the few irregular values of common types (±infinity,
BC dates, years past 9999, ``24:00:00``).

Arrays and scalars made from Python or numpy values (the literals given to compute
kernels included) are built by :mod:`airflow_pgcdc.changes.arrays`, never by
``pa.array``/``pa.scalar``/``to_numpy``: those make pyarrow import pandas.
"""

from __future__ import annotations

import binascii
import math
import re
import struct
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_pgcdc.changes import arrays
from airflow_pgcdc.protocol.pgtypes import PgTypeInfo, format_type

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


# --------------------------------------------------------------------------- calendar


def days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (astronomical year: 1 BC = 0)."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def civil_from_days(z: int) -> tuple[int, int, int]:
    """The inverse of :func:`days_from_civil`."""
    z += 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    y = yoe + era * 400
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + (3 if mp < 10 else -9)
    return y + (m <= 2), m, d


def _parse_date_parts(y: str, m: str, d: str, bc: bool) -> int:
    year = int(y)
    if year < 1:
        raise _OneBad("year 0 does not exist")
    if bc:
        year = 1 - year
    month, day = int(m), int(d)
    if not 1 <= month <= 12 or not 1 <= day <= 31:
        raise _OneBad("month or day out of range")
    days = days_from_civil(year, month, day)
    if civil_from_days(days) != (year, month, day):
        raise _OneBad("no such date")
    return days


def _format_date_days(days: int) -> str:
    y, m, d = civil_from_days(days)
    if y <= 0:
        return f"{1 - y:04d}-{m:02d}-{d:02d} BC"
    return f"{y:04d}-{m:02d}-{d:02d}"


def _format_clock(us: int) -> str:
    """``HH:MM:SS[.ffffff]`` (trailing zeros of the fraction trimmed) of µs in a day."""
    secs, frac = divmod(us, 1_000_000)
    mins, s = divmod(secs, 60)
    h, mi = divmod(mins, 60)
    out = f"{h:02d}:{mi:02d}:{s:02d}"
    if frac:
        out += "." + f"{frac:06d}".rstrip("0")
    return out


def _frac_us(frac: str | None) -> int:
    return int((frac or "").ljust(6, "0")) if frac else 0


# --------------------------------------------------------------------------- floats


def format_float(v: float, single: bool = False) -> str:
    """``float8out``/``float4out`` with ``extra_float_digits`` > 0: the shortest exact
    digits (Ryu), fixed notation for decimal exponents -4 .. 14 (float4: -4 .. 5),
    else ``d.ddde+XX``."""
    if v != v:
        return "NaN"
    if v in (math.inf, -math.inf):
        return "Infinity" if v > 0 else "-Infinity"
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    if single:
        text = np.format_float_scientific(np.float32(v), unique=True, trim="-")
    else:
        text = repr(float(v))
    sign, digits, exponent = Decimal(text).as_tuple()
    ds = "".join(map(str, digits)).rstrip("0") or "0"
    lead = len(digits) + exponent - 1  # decimal exponent of the first digit
    neg = "-" if sign else ""
    if -4 <= lead < (6 if single else 15):
        if lead >= 0:
            ip = ds[: lead + 1].ljust(lead + 1, "0")
            fp = ds[lead + 1 :]
            return neg + ip + ("." + fp if fp else "")
        return neg + "0." + "0" * (-lead - 1) + ds
    mant = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
    return f"{neg}{mant}e{'-' if lead < 0 else '+'}{abs(lead):02d}"


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


class BoolCodec(Codec):
    encoding = "bool"
    csv_type = pa.bool_()
    binary_supported = True

    def __init__(self, type_, typmod):
        super().__init__(type_, typmod)
        self.arrow_type = pa.bool_()

    def from_text(self, arr):
        arr = _as_string(arr)
        t = pc.equal(arr, _str("t"))
        bad = pc.and_(pc.invert(t), pc.not_equal(arr, _str("f")))
        if _any_true(bad):
            raise _locate(arr, self.parse_one, "invalid boolean")
        return t

    def parse_one(self, text):
        if text == "t":
            return True
        if text == "f":
            return False
        raise _OneBad("boolean must be 't' or 'f'")

    fixed_width = 1

    def from_fixed(self, data, null_mask):
        vals = _wire(data, np.uint8) != 0
        return arrays.from_numpy(vals, pa.bool_(), null_mask)

    def to_text(self, arr):
        return [None if v is None else ("t" if v else "f") for v in arr.to_pylist()]


class IntCodec(Codec):
    """int2/int4/int8 (signed), and oid/xid/cid (unsigned 32-bit, as int64)."""

    encoding = "int"
    binary_supported = True

    def __init__(self, type_, typmod, arrow_type: pa.DataType, wire: str):
        super().__init__(type_, typmod)
        self.arrow_type = arrow_type
        self.csv_type = arrow_type
        self.wire = np.dtype(wire)  # big-endian binary layout
        if wire == ">u4":
            self.lo, self.hi = 0, 2**32 - 1
        else:
            bits = self.wire.itemsize * 8
            self.lo, self.hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1

    def from_text(self, arr):
        arr = _as_string(arr)
        try:
            out = pc.cast(arr, self.arrow_type)
        except pa.ArrowInvalid as e:
            raise _locate(arr, self.parse_one, str(e)) from None
        if self.lo == 0 and (
            _any_true(pc.less(out, arrays.scalar(0, self.arrow_type)))
            or _any_true(pc.greater(out, arrays.scalar(self.hi, self.arrow_type)))
        ):
            raise _locate(arr, self.parse_one, "out of range")
        return out

    def parse_one(self, text):
        if not re.fullmatch(r"-?\d+", text):
            raise _OneBad("not an integer")
        v = int(text)
        if not self.lo <= v <= self.hi:
            raise _OneBad(f"integer out of range [{self.lo}, {self.hi}]")
        return v

    @property
    def fixed_width(self):
        return self.wire.itemsize

    def from_fixed(self, data, null_mask):
        vals = _wire(data, self.wire).astype(self.arrow_type.to_pandas_dtype())
        return arrays.from_numpy(vals, self.arrow_type, null_mask)

    def to_text(self, arr):
        return [None if v is None else str(v) for v in arr.to_pylist()]


class FloatCodec(Codec):
    encoding = "float"
    binary_supported = True

    def __init__(self, type_, typmod, single: bool):
        super().__init__(type_, typmod)
        self.single = single
        self.arrow_type = pa.float32() if single else pa.float64()
        self.csv_type = self.arrow_type
        self.wire = np.dtype(">f4" if single else ">f8")

    def from_text(self, arr):
        arr = _as_string(arr)
        try:
            return pc.cast(arr, self.arrow_type)
        except pa.ArrowInvalid as e:
            raise _locate(arr, self.parse_one, str(e)) from None

    _FLOAT_RE = re.compile(r"-?(?:Infinity|NaN|(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)")

    def parse_one(self, text):
        if not self._FLOAT_RE.fullmatch(text):
            raise _OneBad("not a floating-point number")
        return float(text.replace("Infinity", "inf"))

    @property
    def fixed_width(self):
        return self.wire.itemsize

    def from_fixed(self, data, null_mask):
        vals = _wire(data, self.wire).astype(self.wire.newbyteorder("="))
        return arrays.from_numpy(vals, self.arrow_type, null_mask)

    def to_text(self, arr):
        return [None if v is None else format_float(v, self.single) for v in arr.to_pylist()]


class DecimalCodec(Codec):
    """``numeric(p,s)`` → ``decimal128(P, S)`` with room for one NaN sentinel.

    A ``numeric(p,s)`` value is below 10^(p-s) in magnitude and has ``s`` decimals
    (PostgreSQL 15+ allows s < 0 and s > p). The Arrow type keeps the scale
    ``S = max(s, 0)`` and has one more integer digit than the column can use, so
    ``NaN`` (the only special a constrained numeric can hold: ±Infinity cannot be
    stored with a typmod) is the value 10^max(p-s, 0): above every number of the
    column, as NaN sorts above every number in PostgreSQL.
    """

    encoding = "decimal"
    binary_supported = True

    def __init__(self, type_, typmod, precision: int, scale: int):
        super().__init__(type_, typmod)
        self.scale = max(scale, 0)
        self.int_digits = max(precision - scale, 0)
        arrow_precision = self.int_digits + self.scale + 1
        self.arrow_type = pa.decimal128(arrow_precision, self.scale)
        self.csv_type = self.arrow_type
        self.nan_text = "1" + "0" * self.int_digits + ("." + "0" * self.scale if self.scale else "")
        self.nan = Decimal(self.nan_text)

    @staticmethod
    def fits(precision: int, scale: int) -> bool:
        return max(precision - scale, 0) + max(scale, 0) + 1 <= DECIMAL_MAX_PRECISION

    def from_text(self, arr):
        arr = _as_string(arr)
        try:
            return pc.cast(arr, self.arrow_type)
        except pa.ArrowInvalid:
            pass
        is_nan = pc.equal(arr, _str("NaN"))
        fixed = pc.if_else(is_nan, _str(self.nan_text), arr)
        try:
            out = pc.cast(fixed, self.arrow_type)
        except pa.ArrowInvalid as e:
            raise _locate(arr, self.parse_one, str(e)) from None
        # a genuine number equal to the sentinel cannot come from a numeric(p,s) column
        return out

    _NUM_RE = re.compile(r"-?\d+(?:\.\d+)?")

    def parse_one(self, text):
        if text == "NaN":
            return self.nan
        if not self._NUM_RE.fullmatch(text):
            raise _OneBad(f"not a number for {format_type(self.pg, self.typmod)}")
        d = Decimal(text)
        if d.as_tuple().exponent < -self.scale:
            raise _OneBad(f"more than {self.scale} decimals")
        if abs(d) >= Decimal(10) ** self.int_digits:
            raise _OneBad(f"does not fit {format_type(self.pg, self.typmod)}")
        return d

    def from_binary(self, values):
        texts = []
        for i, v in enumerate(values):
            if v is None:
                texts.append(None)
                continue
            try:
                texts.append(numeric_binary_to_text(v))
            except _OneBad as e:
                raise BadValue(i, e.reason, bytes(v)) from None
        return self.from_text(arrays.strings(texts))

    def to_text(self, arr):
        out: list[str | None] = []
        for v in arr.to_pylist():
            if v is None:
                out.append(None)
            elif v == self.nan:
                out.append("NaN")
            else:
                out.append(format(v, "f"))
        return out

    def metadata(self):
        md = super().metadata()
        md[b"pg_numeric_nan"] = self.nan_text.encode()
        return md


class NumericTextCodec(TextCodec):
    """Unconstrained ``numeric`` (or precision too large for decimal128): exact text,
    including ``NaN``, ``Infinity`` and ``-Infinity``."""

    def __init__(self, type_, typmod):
        super().__init__(type_, typmod, None, encoding="numeric-text")
        self.binary_supported = True

    def from_binary(self, values):
        texts = []
        for i, v in enumerate(values):
            if v is None:
                texts.append(None)
                continue
            try:
                texts.append(numeric_binary_to_text(v))
            except _OneBad as e:
                raise BadValue(i, e.reason, bytes(v)) from None
        return arrays.strings(texts)


def numeric_binary_to_text(v: bytes) -> str:
    """``numeric_send`` bytes → ``numeric_out`` text."""
    if len(v) < 8:
        raise _OneBad("binary numeric shorter than its 8-byte header")
    ndigits, weight, sign, dscale = struct.unpack_from(">hhHH", v)
    if sign == 0xC000:
        return "NaN"
    if sign == 0xD000:
        return "Infinity"
    if sign == 0xF000:
        return "-Infinity"
    if sign not in (0, 0x4000) or ndigits < 0 or len(v) != 8 + 2 * ndigits or dscale > 0x3FFF:
        raise _OneBad("malformed binary numeric")
    digits = struct.unpack_from(f">{ndigits}h", v, 8)
    if any(not 0 <= d < 10000 for d in digits):
        raise _OneBad("binary numeric digit out of range")

    def digit(i: int) -> int:
        return digits[i] if 0 <= i < ndigits else 0

    if weight >= 0:
        ip = str(digit(0)) + "".join(f"{digit(i):04d}" for i in range(1, weight + 1))
    else:
        ip = "0"
    out = ("-" if sign == 0x4000 else "") + ip
    if dscale:
        groups = (dscale + 3) // 4
        fp = "".join(f"{digit(weight + j):04d}" for j in range(1, groups + 1))
        out += "." + fp[:dscale]
    return out


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


class _SpecialsMixin:
    """Vectorised text parse with a per-value path for irregular values."""

    def _irregular(self, arr: pa.Array) -> pa.Array:
        # ±infinity, BC, and years of more (or fewer) than four digits
        m = pc.or_(pc.equal(arr, _str("infinity")), pc.equal(arr, _str("-infinity")))
        m = pc.or_(m, pc.ends_with(arr, " BC"))
        m = pc.or_(m, pc.not_equal(pc.utf8_slice_codeunits(arr, 4, 5), _str("-")))
        return pc.fill_null(m, _FALSE)

    def _text_to_storage(self, arr: pa.Array, cast_type, np_dtype, storage_type) -> pa.Array:
        arr = _as_string(arr)
        try:
            return _view(pc.cast(arr, cast_type).cast(storage_type), self.arrow_type)
        except pa.ArrowInvalid:
            pass
        irregular = self._irregular(arr)
        positions = _true_positions(irregular)
        regular = pc.if_else(irregular, _str(None), arr)
        try:
            base = pc.cast(regular, cast_type).cast(storage_type)
        except pa.ArrowInvalid:
            # something else is off (an offset with seconds, a bad value): every value
            base = pa.nulls(len(arr), storage_type)
            positions = None
        overrides = _per_value(arr, self.parse_one, positions)
        return _ints_with_overrides(base, overrides, arrays.null_mask(arr), np_dtype, self.arrow_type)


class DateCodec(_SpecialsMixin, Codec):
    encoding = "date"
    csv_type = pa.date32()
    binary_supported = True

    def __init__(self, type_, typmod):
        super().__init__(type_, typmod)
        self.arrow_type = pa.date32()

    _RE = re.compile(r"(\d{4,})-(\d\d)-(\d\d)( BC)?")

    def from_text(self, arr):
        return self._text_to_storage(arr, pa.date32(), np.int32, pa.int32())

    def parse_one(self, text):
        if text == "infinity":
            return DATE_POS_INFINITY
        if text == "-infinity":
            return DATE_NEG_INFINITY
        m = self._RE.fullmatch(text)
        if not m:
            raise _OneBad("not an ISO date (is DateStyle ISO?)")
        return _parse_date_parts(m[1], m[2], m[3], bool(m[4]))

    fixed_width = 4

    def from_fixed(self, data, null_mask):
        raw = _wire(data, ">i4").astype(np.int64)
        special = (raw == INT32_MAX) | (raw == INT32_MIN)
        shifted = np.where(special, raw, raw + UNIX_EPOCH_PG_DAYS)
        bad = ~special & ~null_mask & ((shifted >= INT32_MAX) | (shifted <= INT32_MIN))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise BadValue(i, "date out of range", _fixed_value(data, 4, i), unrepresentable=True)
        storage = arrays.from_numpy(shifted.astype(np.int32), pa.int32(), null_mask)
        return _view(storage, pa.date32())

    def to_text(self, arr):
        out: list[str | None] = []
        for v in arr.cast(pa.int32()).to_pylist():
            if v is None:
                out.append(None)
            elif v == DATE_POS_INFINITY:
                out.append("infinity")
            elif v == DATE_NEG_INFINITY:
                out.append("-infinity")
            else:
                out.append(_format_date_days(v))
        return out

    def metadata(self):
        md = super().metadata()
        md[b"pg_infinity"] = f"{DATE_POS_INFINITY}/{DATE_NEG_INFINITY}".encode()
        return md


class TimestampCodec(_SpecialsMixin, Codec):
    binary_supported = True

    def __init__(self, type_, typmod, tz: bool):
        super().__init__(type_, typmod)
        self.tz = tz
        self.arrow_type = pa.timestamp("us", tz="UTC" if tz else None)
        self.csv_type = self.arrow_type
        self.encoding = "timestamptz" if tz else "timestamp"

    _RE = re.compile(
        r"(\d{4,})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?"
        r"(?:([+-])(\d\d)(?::(\d\d)(?::(\d\d))?)?)?( BC)?"
    )

    def from_text(self, arr):
        return self._text_to_storage(arr, self.arrow_type, np.int64, pa.int64())

    def parse_one(self, text):
        if text == "infinity":
            return TIMESTAMP_POS_INFINITY
        if text == "-infinity":
            return TIMESTAMP_NEG_INFINITY
        m = self._RE.fullmatch(text)
        if not m:
            raise _OneBad("not an ISO timestamp (is DateStyle ISO?)")
        if bool(m[8]) != self.tz:
            raise _OneBad("time zone offset " + ("missing" if self.tz else "not expected"))
        days = _parse_date_parts(m[1], m[2], m[3], bool(m[12]))
        h, mi, s = int(m[4]), int(m[5]), int(m[6])
        if h > 23 or mi > 59 or s > 59:
            raise _OneBad("time of day out of range")
        us = days * 86_400_000_000 + ((h * 60 + mi) * 60 + s) * 1_000_000 + _frac_us(m[7])
        if m[8]:
            off = int(m[9]) * 3600 + int(m[10] or 0) * 60 + int(m[11] or 0)
            us -= (off if m[8] == "+" else -off) * 1_000_000
        if not INT64_MIN < us < INT64_MAX:
            raise _OneBad(
                "timestamp outside Arrow's timestamp[us] range (int64 microseconds since "
                "1970, about 290308 BC .. 294247 AD; int64 max/min mean ±infinity)",
                unrepresentable=True,
            )
        return us

    fixed_width = 8

    def from_fixed(self, data, null_mask):
        raw = _wire(data, ">i8").astype(np.int64)
        special = (raw == INT64_MAX) | (raw == INT64_MIN)
        too_big = ~special & ~null_mask & (raw >= INT64_MAX - UNIX_EPOCH_PG_US)
        if too_big.any():
            i = int(np.flatnonzero(too_big)[0])
            raise BadValue(
                i, "timestamp beyond Arrow's timestamp[us] range", _fixed_value(data, 8, i), unrepresentable=True
            )
        shifted = np.where(special, raw, raw + UNIX_EPOCH_PG_US)
        storage = arrays.from_numpy(shifted, pa.int64(), null_mask)
        return _view(storage, self.arrow_type)

    def to_text(self, arr):
        out: list[str | None] = []
        for v in arr.cast(pa.int64()).to_pylist():
            if v is None:
                out.append(None)
            elif v == TIMESTAMP_POS_INFINITY:
                out.append("infinity")
            elif v == TIMESTAMP_NEG_INFINITY:
                out.append("-infinity")
            else:
                days, us = divmod(v, 86_400_000_000)
                y, m, d = civil_from_days(days)
                text = f"{abs(y if y > 0 else 1 - y):04d}-{m:02d}-{d:02d} {_format_clock(us)}"
                if self.tz:
                    text += "+00"
                if y <= 0:
                    text += " BC"
                out.append(text)
        return out

    def metadata(self):
        md = super().metadata()
        md[b"pg_infinity"] = f"{TIMESTAMP_POS_INFINITY}/{TIMESTAMP_NEG_INFINITY}".encode()
        return md


class TimeCodec(Codec):
    """``time`` → ``time64[us]``; ``24:00:00`` is 86,400,000,000 µs (see docs)."""

    encoding = "time"
    csv_type = pa.time64("us")
    binary_supported = True

    def __init__(self, type_, typmod):
        super().__init__(type_, typmod)
        self.arrow_type = pa.time64("us")

    _RE = re.compile(r"(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?")

    def from_text(self, arr):
        arr = _as_string(arr)
        irregular = pc.fill_null(pc.starts_with(arr, "24:"), _FALSE)
        positions = _true_positions(irregular)
        regular = pc.if_else(irregular, _str(None), arr)
        joined = pc.binary_join_element_wise(_str("1970-01-01"), regular, _str(" "))
        try:
            base = pc.cast(joined, pa.timestamp("us")).cast(pa.int64())
        except pa.ArrowInvalid:
            base = pa.nulls(len(arr), pa.int64())
            positions = None
        overrides = _per_value(arr, self.parse_one, positions)
        return _ints_with_overrides(base, overrides, arrays.null_mask(arr), np.int64, self.arrow_type)

    def parse_one(self, text):
        m = self._RE.fullmatch(text)
        if not m:
            raise _OneBad("not a time of day")
        h, mi, s = int(m[1]), int(m[2]), int(m[3])
        us = ((h * 60 + mi) * 60 + s) * 1_000_000 + _frac_us(m[4])
        if mi > 59 or s > 59 or us > TIME_24H_US:
            raise _OneBad("time of day out of range")
        return us

    fixed_width = 8

    def from_fixed(self, data, null_mask):
        raw = _wire(data, ">i8").astype(np.int64)
        bad = ~null_mask & ((raw < 0) | (raw > TIME_24H_US))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise BadValue(i, "time out of range", _fixed_value(data, 8, i))
        storage = arrays.from_numpy(raw, pa.int64(), null_mask)
        return _view(storage, self.arrow_type)

    def to_text(self, arr):
        return [None if v is None else _format_clock(v) for v in arr.cast(pa.int64()).to_pylist()]


def format_timetz(us: int, zone_west_s: int) -> str:
    """``timetz_out``: clock then the UTC offset (``zone_west_s`` is seconds west)."""
    east = -zone_west_s
    sign = "+" if east >= 0 else "-"
    east = abs(east)
    hh, rest = divmod(east, 3600)
    mm, ss = divmod(rest, 60)
    out = f"{_format_clock(us)}{sign}{hh:02d}"
    if mm or ss:
        out += f":{mm:02d}"
    if ss:
        out += f":{ss:02d}"
    return out


class TimetzCodec(TextCodec):
    """``timetz``: exact text (Arrow has no time-with-offset type)."""

    def __init__(self, type_, typmod):
        super().__init__(type_, typmod, None, encoding="text")
        self.binary_supported = True

    def from_binary(self, values):
        out = []
        for i, v in enumerate(values):
            if v is None:
                out.append(None)
            elif len(v) != 12:
                raise BadValue(i, "binary timetz must be 12 bytes", bytes(v))
            else:
                us, zone = struct.unpack(">qi", v)
                out.append(format_timetz(us, zone))
        return arrays.strings(out)


class IntervalCodec(Codec):
    """``interval`` → ``struct<months: int32, days: int32, microseconds: int64>``, the
    three fields PostgreSQL stores (and sends in binary); ±infinity (PostgreSQL 17+) as
    PostgreSQL stores them: all fields max / all fields min. Text must be
    ``IntervalStyle = postgres``."""

    encoding = "interval"
    binary_supported = True

    def __init__(self, type_, typmod):
        super().__init__(type_, typmod)
        self.arrow_type = INTERVAL_TYPE

    _RE = re.compile(
        r"(?:([+-]?\d+) years? ?)?(?:([+-]?\d+) mons? ?)?(?:([+-]?\d+) days? ?)?"
        r"(?:([+-])?(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?)?"
    )

    def parse_one(self, text):
        if text == "infinity":
            return INTERVAL_POS_INFINITY
        if text == "-infinity":
            return INTERVAL_NEG_INFINITY
        m = self._RE.fullmatch(text)
        if not m or not text or text.endswith(" "):
            raise _OneBad("not an interval in IntervalStyle postgres")
        months = int(m[1] or 0) * 12 + int(m[2] or 0)
        days = int(m[3] or 0)
        us = 0
        if m[5] is not None:
            us = ((int(m[5]) * 60 + int(m[6])) * 60 + int(m[7])) * 1_000_000 + _frac_us(m[8])
            if m[4] == "-":
                us = -us
        if not (INT32_MIN <= months <= INT32_MAX and INT32_MIN <= days <= INT32_MAX and INT64_MIN <= us <= INT64_MAX):
            raise _OneBad("interval field out of range")
        return months, days, us

    def from_text(self, arr):
        arr = _as_string(arr)
        vals = _per_value(arr, self.parse_one)
        return self._build(len(arr), vals)

    def _build(self, n: int, vals: dict[int, tuple[int, int, int]]) -> pa.Array:
        months = np.zeros(n, np.int32)
        days = np.zeros(n, np.int32)
        us = np.zeros(n, np.int64)
        valid = np.zeros(n, bool)
        for i, (mo, d, u) in vals.items():
            months[i], days[i], us[i] = mo, d, u
            valid[i] = True
        return pa.StructArray.from_arrays(
            [arrays.from_numpy(months, pa.int32()), arrays.from_numpy(days, pa.int32()), arrays.from_numpy(us, pa.int64())],
            fields=list(INTERVAL_TYPE),
            mask=arrays.from_numpy(~valid, pa.bool_()),
        )

    def from_binary(self, values):
        data, null_mask = _binary_all(values, 16, "interval")
        rec = np.frombuffer(data, dtype=np.dtype([("us", ">i8"), ("days", ">i4"), ("months", ">i4")]))
        return pa.StructArray.from_arrays(
            [
                arrays.from_numpy(rec["months"], pa.int32()),
                arrays.from_numpy(rec["days"], pa.int32()),
                arrays.from_numpy(rec["us"], pa.int64()),
            ],
            fields=list(INTERVAL_TYPE),
            mask=arrays.from_numpy(null_mask, pa.bool_()),
        )

    def to_text(self, arr):
        out: list[str | None] = []
        for v in arr.to_pylist():
            out.append(None if v is None else format_interval(v["months"], v["days"], v["microseconds"]))
        return out


def _ctrunc_div(a: int, b: int) -> tuple[int, int]:
    """C division: quotient truncated toward zero, remainder with the dividend's sign."""
    q = abs(a) // abs(b)
    if (a < 0) != (b < 0):
        q = -q
    return q, a - q * b


def format_interval(months: int, days: int, us: int) -> str:
    """``interval_out`` with ``IntervalStyle = postgres``."""
    if (months, days, us) == INTERVAL_POS_INFINITY:
        return "infinity"
    if (months, days, us) == INTERVAL_NEG_INFINITY:
        return "-infinity"
    year, mon = _ctrunc_div(months, 12)
    parts: list[str] = []
    is_before = False
    is_zero = True
    for value, unit in ((year, "year"), (mon, "mon"), (days, "day")):
        if value == 0:
            continue
        parts.append(
            ("" if is_zero else " ")
            + ("+" if is_before and value > 0 else "")
            + f"{value} {unit}{'' if value == 1 else 's'}"
        )
        is_before = value < 0
        is_zero = False
    out = "".join(parts)
    hour, rest = _ctrunc_div(us, 3_600_000_000)
    minute, rest = _ctrunc_div(rest, 60_000_000)
    sec, fsec = _ctrunc_div(rest, 1_000_000)
    if is_zero or us != 0:
        minus = hour < 0 or minute < 0 or sec < 0 or fsec < 0
        out += ("" if is_zero else " ") + ("-" if minus else ("+" if is_before else ""))
        out += f"{abs(hour):02d}:{abs(minute):02d}:{abs(sec):02d}"
        if fsec:
            out += "." + f"{abs(fsec):06d}".rstrip("0")
    return out


# --------------------------------------------------------------------------- arrays


_ARRAY_SPACE = " \t\n\r\v\f"


def quote_array_element(text: str, delimiter: str = ",") -> str:
    """An element as ``array_out`` writes it (quoted when needed)."""
    if (
        text == ""
        or text.upper() == "NULL"
        or any(c in text for c in ('"', "\\", "{", "}", delimiter))
        or any(c in _ARRAY_SPACE for c in text)
    ):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def parse_array_text(text: str, delimiter: str = ",") -> tuple[list[int], list[int] | None, list[str | None]]:
    """``array_out`` text → (dimensions, lower bounds or None when all 1, flat elements).

    Elements are in row-major order, ``None`` for NULL; ``{}`` is ``([], None, [])``.
    """
    lbounds: list[int] | None = None
    pos = 0
    if text.startswith("["):
        eq = text.find("=")
        if eq < 0:
            raise _OneBad("array dimension decoration without '='")
        decoration = re.fullmatch(r"((?:\[-?\d+:-?\d+\])+)", text[:eq])
        if not decoration:
            raise _OneBad("bad array dimension decoration")
        bounds = [tuple(map(int, b)) for b in re.findall(r"\[(-?\d+):(-?\d+)\]", text[:eq])]
        lbounds = [lo for lo, _ in bounds]
        pos = eq + 1
    if pos >= len(text) or text[pos] != "{":
        raise _OneBad("array text must start with '{'")
    if pos == 0:
        flat = _parse_1d(text, delimiter)
        if flat is not None:
            return ([len(flat)] if flat else []), None, flat
    marks: list = []
    out: list[str | None] = []
    end = _parse_level(text, pos, 0, marks, out, delimiter)
    if end != len(text):
        raise _OneBad("junk after the array")
    dims: list[int] = [d for d in marks if d is not None and d >= 0]
    if marks and (marks[-1] != -1 or len(dims) != len(marks) - 1):
        raise _OneBad("elements at different depths")
    if lbounds is not None:
        if len(lbounds) != len(dims):
            raise _OneBad("array decoration does not match its dimensions")
        if all(lo == 1 for lo in lbounds):
            lbounds = None
    return dims, lbounds, out


_ONE_D: dict[str, tuple[re.Pattern, re.Pattern]] = {}
_UNESCAPE = re.compile(r"\\(.)", re.S)


def _parse_1d(text: str, delim: str) -> list[str | None] | None:
    """A 1-D array by regular expressions (None when ``text`` is not a plain 1-D array)."""
    pats = _ONE_D.get(delim)
    if pats is None:
        d = re.escape(delim)
        elem = rf'"(?:[^"\\]|\\.)*"|[^{d}"{{}}\\\s]+'
        whole = re.compile(rf"\{{(?:(?:{elem})(?:{d}(?:{elem}))*)?\}}", re.S)
        parts = re.compile(rf'"((?:[^"\\]|\\.)*)"|([^{d}"{{}}\\\s]+)', re.S)
        pats = _ONE_D[delim] = (whole, parts)
    whole, parts = pats
    if not whole.fullmatch(text):
        return None
    out: list[str | None] = []
    for quoted, bare in parts.findall(text, 1, len(text) - 1):
        if bare:
            out.append(None if bare == "NULL" else bare)
        else:
            out.append(_UNESCAPE.sub(r"\1", quoted) if "\\" in quoted else quoted)
    return out


def _parse_level(s: str, i: int, level: int, dims: list, out: list, delim: str) -> int:
    """Parse the sub-array starting at ``s[i] == "{"``; ``dims[level]`` gets its length.
    ``dims`` ends with a marker entry ``-1 - leaf_level`` once an element is seen."""
    i += 1
    n = len(s)
    count = 0
    if i < n and s[i] == "}":
        if level != 0:
            raise _OneBad("empty sub-array")
        return i + 1
    while True:
        if i >= n:
            raise _OneBad("unterminated array")
        c = s[i]
        if c == "{":
            i = _parse_level(s, i, level + 1, dims, out, delim)
        else:
            if c == '"':
                j = i + 1
                buf = []
                while True:
                    k = j
                    while k < n and s[k] != '"' and s[k] != "\\":
                        k += 1
                    if k >= n:
                        raise _OneBad("unterminated quoted array element")
                    buf.append(s[j:k])
                    if s[k] == '"':
                        i = k + 1
                        break
                    if k + 1 >= n:
                        raise _OneBad("unterminated escape in array element")
                    buf.append(s[k + 1])
                    j = k + 2
                out.append("".join(buf))
            else:
                j = i
                while j < n and s[j] != delim and s[j] != "}":
                    j += 1
                tok = s[i:j]
                if not tok or "{" in tok or '"' in tok:
                    raise _OneBad("malformed array element")
                out.append(None if tok == "NULL" else tok)
                i = j
            _set_dim(dims, level + 1, -1, "elements at different depths")
        count += 1
        if i >= n:
            raise _OneBad("unterminated array")
        if s[i] == delim:
            i += 1
            continue
        if s[i] == "}":
            i += 1
            break
        raise _OneBad(f"unexpected {s[i]!r} in array")
    _set_dim(dims, level, count, "ragged array (sub-arrays of different lengths)")
    return i


def _set_dim(dims: list, level: int, value: int, why: str) -> None:
    """Record ``dims[level] = value`` (value -1 marks the leaf level); a different value
    already there means the array is not rectangular."""
    while len(dims) <= level:
        dims.append(None)
    if dims[level] is None:
        dims[level] = value
    elif dims[level] != value:
        raise _OneBad(why)


class ArrayCodec(Codec):
    """Arrays → Arrow lists, nested ``depth`` deep (``ndims`` of the column, at least 1).

    NULL elements are list nulls; ``{}`` is an empty list. A value whose dimensions
    differ from the column's (``ndims``) or whose lower bounds are not 1 has no list
    form: it raises ``UnrepresentableValue`` (map the column ``as_text`` to keep such
    values as exact text).
    """

    encoding = "array"

    def __init__(self, type_, typmod, element: Codec, depth: int, delimiter: str):
        super().__init__(type_, typmod)
        self.element = element
        self.depth = max(depth, 1)
        self.delimiter = delimiter
        t = element.arrow_type
        for _ in range(self.depth):
            t = pa.list_(t)
        self.arrow_type = t
        self.binary_supported = element.binary_supported

    # ---- text
    def from_text(self, arr):
        arr = _as_string(arr)
        n = len(arr)
        if self.depth == 1 and n:
            fast = self._fast_1d(arr)
            if fast is not None:
                return fast
        parsed: list[tuple[list[int], list] | None] = [None] * n
        values = arr.to_pylist()
        for i, v in enumerate(values):
            if v is None:
                continue
            try:
                dims, lbounds, elems = parse_array_text(v, self.delimiter)
            except _OneBad as e:
                raise BadValue(i, e.reason, v) from None
            self._check_shape(i, v, dims, lbounds)
            parsed[i] = (dims, elems)
        return self._assemble(parsed, lambda flat: self.element.from_text(arrays.strings(flat)))

    def _check_shape(self, i: int, v: Any, dims: list[int], lbounds) -> None:
        if lbounds is not None:
            raise BadValue(
                i, "array with lower bounds other than 1 has no list form; map the column "
                "as_text to keep it", v, unrepresentable=True,
            )
        if dims and len(dims) != self.depth:
            raise BadValue(
                i, f"{len(dims)}-dimensional array in a column mapped with {self.depth} "
                "dimension(s); declare the column's dimensions (ndims) or map it as_text",
                v, unrepresentable=True,
            )

    def _fast_1d(self, arr: pa.Array) -> pa.Array | None:
        """1-D arrays without quoted elements: split with compute kernels."""
        ok = pc.and_(pc.starts_with(arr, "{"), pc.ends_with(arr, "}"))
        one = arrays.scalar(1, pa.int32())
        ok = pc.and_(ok, pc.equal(pc.count_substring(arr, "{"), one))
        ok = pc.and_(ok, pc.equal(pc.count_substring(arr, "}"), one))
        ok = pc.and_(ok, pc.invert(pc.match_substring(arr, '"')))
        if not pc.all(pc.fill_null(ok, _TRUE)).as_py():
            return None
        inner = pc.utf8_slice_codeunits(arr, 1, -1)
        empty = pc.equal(inner, _str(""))
        inner = pc.if_else(empty, _str(None), inner)
        lists = pc.split_pattern(inner, self.delimiter)
        flat = lists.flatten()
        flat = pc.if_else(pc.equal(flat, _str("NULL")), _str(None), flat)
        if _any_true(pc.equal(flat, _str(""))):
            return None  # malformed (empty unquoted element): let the parser say where
        offsets = _list_offsets(lists)
        try:
            typed = self.element.from_text(flat)
        except BadValue as e:
            row = int(np.searchsorted(offsets, e.index, side="right") - 1)
            raise BadValue(row, f"element {e.index - offsets[row] + 1}: {e.reason}", arr[row].as_py(),
                           unrepresentable=e.unrepresentable) from None
        mask = pc.is_null(arr)
        return pa.ListArray.from_arrays(arrays.from_numpy(offsets, pa.int32()), typed, type=self.arrow_type, mask=mask)

    def _assemble(self, parsed: list, convert) -> pa.Array:
        """Nested lists from per-row ``(dims, flat elements)`` (None = NULL row)."""
        flat: list = []
        row_starts = []
        for p in parsed:
            row_starts.append(len(flat))
            if p is not None:
                flat.extend(p[1])
        try:
            typed = convert(flat)
        except BadValue as e:
            row = int(np.searchsorted(np.array(row_starts), e.index, side="right") - 1)
            raise BadValue(row, f"element {e.index - row_starts[row] + 1}: {e.reason}", e.value,
                           unrepresentable=e.unrepresentable) from None
        # offsets level by level, outermost first
        level_offsets: list[list[int]] = [[0] for _ in range(self.depth)]
        for p in parsed:
            if p is None or not p[0]:
                level_offsets[0].append(level_offsets[0][-1])
                continue
            dims = p[0]
            count = 1
            for level in range(self.depth):
                offs = level_offsets[level]
                for _ in range(count):
                    offs.append(offs[-1] + dims[level])
                count *= dims[level]
        values = typed
        for level in range(self.depth - 1, -1, -1):
            t = self.element.arrow_type
            for _ in range(self.depth - level):
                t = pa.list_(t)
            mask = None
            if level == 0:
                mask = arrays.bools([p is None for p in parsed])
            values = pa.ListArray.from_arrays(
                arrays.ints(level_offsets[level], pa.int32()), values, type=t, mask=mask
            )
        return values

    # ---- binary
    def from_binary(self, values):
        parsed: list = []
        for i, v in enumerate(values):
            if v is None:
                parsed.append(None)
                continue
            try:
                dims, lbounds, elems = _parse_binary_array(bytes(v))
            except _OneBad as e:
                raise BadValue(i, e.reason, bytes(v)) from None
            self._check_shape(i, bytes(v), dims, None if all(lo == 1 for lo in lbounds) else lbounds)
            parsed.append((dims, elems))
        return self._assemble(parsed, self.element.from_binary)

    def binary_to_text(self, values: list) -> list[str | None]:
        """Binary arrays → exact ``array_out`` text, any shape (for ``as_text`` columns)."""
        shapes: list = []
        flat: list = []
        for i, v in enumerate(values):
            if v is None:
                shapes.append(None)
                continue
            try:
                dims, lbounds, elems = _parse_binary_array(bytes(v))
            except _OneBad as e:
                raise BadValue(i, e.reason, bytes(v)) from None
            shapes.append((dims, lbounds, len(flat), len(elems)))
            flat.extend(elems)
        texts = self.element.to_text(self.element.from_binary(flat)) if flat else []
        quoted = ["NULL" if t is None else quote_array_element(t, self.delimiter) for t in texts]
        out: list[str | None] = []
        for shape in shapes:
            if shape is None:
                out.append(None)
                continue
            dims, lbounds, start, count = shape
            if not dims:
                out.append("{}")
                continue
            deco = ""
            if any(lo != 1 for lo in lbounds):
                deco = "".join(f"[{lo}:{lo + d - 1}]" for lo, d in zip(lbounds, dims, strict=True)) + "="
            out.append(deco + _nest(quoted[start : start + count], dims, self.delimiter))
        return out

    # ---- back to text
    def to_text(self, arr):
        return self._format(arr, self.depth)

    def _format(self, arr: pa.Array, depth: int) -> list[str | None]:
        offsets = _list_offsets(arr)
        inner = arr.values.slice(offsets[0], offsets[-1] - offsets[0]) if len(arr) else arr.values.slice(0, 0)
        offsets = offsets - offsets[0]
        if depth == 1:
            texts = self.element.to_text(inner)
            elems = ["NULL" if t is None else quote_array_element(t, self.delimiter) for t in texts]
        else:
            elems = self._format(inner, depth - 1)
        valid = arr.is_valid().to_pylist()
        out: list[str | None] = []
        for r in range(len(arr)):
            if not valid[r]:
                out.append(None)
                continue
            items = elems[offsets[r] : offsets[r + 1]]
            out.append("{" + self.delimiter.join(items) + "}")
        return out


def _nest(items: list[str], dims: list[int], delim: str) -> str:
    if len(dims) == 1:
        return "{" + delim.join(items) + "}"
    step = len(items) // dims[0] if dims[0] else 0
    return "{" + delim.join(
        _nest(items[k * step : (k + 1) * step], dims[1:], delim) for k in range(dims[0])
    ) + "}"


def _list_offsets(arr: pa.Array) -> np.ndarray:
    offs = arrays.numpy_values(arr.offsets).astype(np.int64)
    return offs


def _parse_binary_array(v: bytes) -> tuple[list[int], list[int], list]:
    """``array_send`` bytes → (dims, lower bounds, flat element bytes)."""
    if len(v) < 12:
        raise _OneBad("binary array shorter than its header")
    ndim, flags, _elemtype = struct.unpack_from(">iiI", v)
    if ndim < 0 or ndim > 6 or flags not in (0, 1):
        raise _OneBad("malformed binary array header")
    pos = 12
    dims, lbounds = [], []
    for _ in range(ndim):
        if pos + 8 > len(v):
            raise _OneBad("binary array truncated in its dimensions")
        d, lo = struct.unpack_from(">ii", v, pos)
        if d < 0:
            raise _OneBad("negative array dimension")
        dims.append(d)
        lbounds.append(lo)
        pos += 8
    total = math.prod(dims) if dims else 0
    elems: list = []
    for _ in range(total):
        if pos + 4 > len(v):
            raise _OneBad("binary array truncated")
        (length,) = struct.unpack_from(">i", v, pos)
        pos += 4
        if length == -1:
            elems.append(None)
            continue
        if length < 0 or pos + length > len(v):
            raise _OneBad("binary array element length out of bounds")
        elems.append(v[pos : pos + length])
        pos += length
    if pos != len(v):
        raise _OneBad("trailing bytes after binary array")
    if total == 0:
        dims = []
    return dims, lbounds, elems
