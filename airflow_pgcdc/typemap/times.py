"""The date and time families: ``date``, ``timestamp[tz]``, ``time``, ``timetz``,
``interval``, with the proleptic calendar arithmetic they share and their text forms.
"""

from __future__ import annotations

import re
import struct

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_pgcdc.typemap import arrays
from airflow_pgcdc.typemap.codec import (
    _FALSE,
    DATE_NEG_INFINITY,
    DATE_POS_INFINITY,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    INTERVAL_NEG_INFINITY,
    INTERVAL_POS_INFINITY,
    INTERVAL_TYPE,
    TIME_24H_US,
    TIMESTAMP_NEG_INFINITY,
    TIMESTAMP_POS_INFINITY,
    UNIX_EPOCH_PG_DAYS,
    UNIX_EPOCH_PG_US,
    BadValue,
    Codec,
    _as_string,
    _binary_all,
    _fixed_value,
    _ints_with_overrides,
    _OneBad,
    _per_value,
    _str,
    _true_positions,
    _view,
    _wire,
)
from airflow_pgcdc.typemap.text import TextCodec

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


