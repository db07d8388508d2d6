"""The number families: ``bool``, the integers, the floats (and their shortest-exact text),
``numeric`` as decimal128 or as exact text, and ``numeric``'s binary form.
"""

from __future__ import annotations

import math
import re
import struct
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_pgcdc.protocol.pgtypes import format_type
from airflow_pgcdc.typemap import arrays
from airflow_pgcdc.typemap.codec import (
    DECIMAL_MAX_PRECISION,
    BadValue,
    Codec,
    _any_true,
    _as_string,
    _locate,
    _OneBad,
    _str,
    _wire,
)
from airflow_pgcdc.typemap.text import TextCodec

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
        # the Arrow type's NumPy dtype (not arrow_type.to_pandas_dtype(): pyarrow imports pandas for it)
        kind = "i" if pa.types.is_signed_integer(arrow_type) else "u"
        self.native = np.dtype(f"{kind}{arrow_type.bit_width // 8}")
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
        vals = _wire(data, self.wire).astype(self.native)
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
        return self.from_text(numeric_texts_from_binary(values))

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
        return numeric_texts_from_binary(values)


def numeric_texts_from_binary(values: list) -> pa.Array:
    """``numeric_send`` values (``None`` for NULL) → a string array of their
    ``numeric_out`` text; the two numeric codecs' binary path."""
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


