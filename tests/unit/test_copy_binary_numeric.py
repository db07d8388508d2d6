"""numeric(p,s) columns decoded from binary COPY on the whole block
(copy_binary._decimal_column), checked against the per-value path (numeric_send bytes →
numeric_out text → the decimal codec's text parser) on values built by a numeric_send
encoder written from the PostgreSQL source's description of the format (numeric.c:
int16 ndigits, int16 weight, uint16 sign, uint16 dscale, ndigits base-10000 int16
digits, no leading or trailing zero digits). The real server's bytes are checked in
tests/integration/test_typemap_roundtrip.py."""

from __future__ import annotations

import random
import struct
from decimal import Decimal

import pyarrow as pa
import pytest

from airflow_pgcdc.protocol.pgtypes import BUILTIN_BY_NAME, PgColumn
from airflow_pgcdc.typemap.decode.copy_binary import SIGNATURE, BinaryCopyDecoder, native_binary
from airflow_pgcdc.typemap.map import ValueConversionError, codec_for

HEADER = SIGNATURE + struct.pack(">ii", 0, 0)
TRAILER = struct.pack(">h", -1)


def numeric_column(precision: int, scale: int) -> PgColumn:
    typmod = ((precision << 16) | (scale & 0x7FF)) + 4
    return PgColumn(name="n", type=BUILTIN_BY_NAME["numeric"], typmod=typmod)


def numeric_send(value: str, dscale: int) -> bytes:
    """PostgreSQL's numeric_send for ``value`` (a decimal string or 'NaN')."""
    if value == "NaN":
        return struct.pack(">hhHH", 0, 0, 0xC000, 0)
    if value in ("Infinity", "-Infinity"):
        return struct.pack(">hhHH", 0, 0, 0xD000 if value == "Infinity" else 0xF000, 0)
    d = Decimal(value)
    sign = 0x4000 if d < 0 else 0
    whole, _, frac = format(abs(d), "f").partition(".")
    whole = whole.lstrip("0")
    whole = "0" * (-len(whole) % 4) + whole
    frac = frac + "0" * (-len(frac) % 4)
    groups = [int(whole[i : i + 4]) for i in range(0, len(whole), 4)]
    weight = len(groups) - 1
    groups += [int(frac[i : i + 4]) for i in range(0, len(frac), 4)]
    while groups and groups[0] == 0:
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    if not groups:
        weight = 0
    return struct.pack(f">hhHH{len(groups)}h", len(groups), weight, sign, dscale, *groups)


def stream(values: list[bytes | None]) -> tuple[bytes, list[int]]:
    msgs = []
    for v in values:
        field = struct.pack(">i", -1) if v is None else struct.pack(">i", len(v)) + v
        msgs.append(struct.pack(">h", 1) + field)
    msgs[0] = HEADER + msgs[0]
    msgs.append(TRAILER)
    return b"".join(msgs), [len(m) for m in msgs]


def decode(column: PgColumn, values: list[bytes | None]) -> pa.Array:
    dec = BinaryCopyDecoder([column], table="public.t")
    data, lengths = stream(values)
    batches = dec.feed(data, lengths) + dec.finish()
    return pa.Table.from_batches(batches, schema=dec.schema).column(0).combine_chunks()


def per_value(column: PgColumn, values: list[bytes | None]) -> pa.Array:
    return codec_for(column).from_binary(values)


@pytest.mark.parametrize(
    "precision,scale",
    [(12, 2), (1, 0), (5, 5), (2, 5), (3, -2), (17, 0), (13, 4), (10, 9), (6, 3)],
)
def test_matches_the_per_value_path(precision, scale):
    column = numeric_column(precision, scale)
    assert native_binary(codec_for(column)) == "decimal"
    rng = random.Random(precision * 100 + scale)
    int_digits = max(precision - scale, 0)
    texts = ["0", "NaN"]
    for _ in range(3000):
        digits = rng.randint(1, precision)
        unscaled = rng.randrange(10**digits) * (-1 if rng.random() < 0.4 else 1)
        if scale >= 0:
            d = Decimal(unscaled).scaleb(-scale)
        else:
            d = Decimal(unscaled % 10 ** max(precision, 1)).scaleb(-scale)
        if abs(d) >= Decimal(10) ** int_digits:
            continue
        texts.append(format(d, "f"))
    largest = Decimal(10) ** int_digits - Decimal(1).scaleb(-max(scale, 0))
    texts += [format(largest, "f"), format(-largest, "f")]
    values = [numeric_send(t, max(scale, 0)) for t in texts] + [None]
    got = decode(column, values)
    want = per_value(column, values)
    assert got.type == want.type
    assert got.to_pylist() == want.to_pylist()
    assert got.null_count == 1


def test_nan_is_the_codecs_sentinel_and_nulls_stay_null():
    column = numeric_column(12, 2)
    got = decode(column, [numeric_send("NaN", 0), None, numeric_send("-1.5", 2)])
    assert got.to_pylist() == [Decimal("10000000000.00"), None, Decimal("-1.50")]


def test_digits_past_the_first_group_and_tiny_values():
    column = numeric_column(17, 8)
    texts = ["123456789.12345678", "-0.00000001", "0.0001", "99999999.99999999", "10000"]
    got = decode(column, [numeric_send(t, 8) for t in texts])
    assert got.to_pylist() == [Decimal(t).quantize(Decimal("1e-8")) for t in texts]


def bad(value: bytes, precision=12, scale=2, row_before=True) -> ValueConversionError:
    column = numeric_column(precision, scale)
    values = ([numeric_send("1", scale)] if row_before else []) + [value]
    with pytest.raises(ValueConversionError) as info:
        decode(column, values)
    err = info.value
    assert err.column == "n" and err.table == "public.t"
    assert err.row == (1 if row_before else 0)
    return err


def test_infinity_cannot_be_a_constrained_numeric():
    assert "not a number for numeric(12,2)" in str(bad(numeric_send("Infinity", 0)))
    assert "not a number" in str(bad(numeric_send("-Infinity", 0)))


def test_too_large_for_the_column():
    assert "does not fit numeric(12,2)" in str(bad(numeric_send("10000000000", 2)))
    # one digit group, but worth more than the column holds
    assert "does not fit" in str(bad(struct.pack(">hhHHh", 1, 5, 0, 0, 1)))


def test_more_decimals_than_the_scale():
    assert "more than 2 decimals" in str(bad(numeric_send("0.001", 3)))
    assert "more than 2 decimals" in str(bad(struct.pack(">hhHHh", 1, -2, 0, 0, 5)))


def test_malformed_fields():
    assert "malformed" in str(bad(struct.pack(">hhHH", 0, 0, 0x1234, 0)))  # unknown sign
    assert "malformed" in str(bad(struct.pack(">hhHHh", 2, 0, 0, 0, 1)))  # 2 digits announced, 1 sent
    assert "malformed" in str(bad(struct.pack(">hhHH", -1, 0, 0, 0)))
    assert "out of range" in str(bad(struct.pack(">hhHHh", 1, 0, 0, 0, 10000)))
    assert "out of range" in str(bad(struct.pack(">hhHHh", 1, 0, 0, 0, -1)))
    assert "shorter than its 8-byte header" in str(bad(b"\x00\x01"))


def test_wide_decimals_still_travel_as_text():
    # decimal128 digits above 18: unscaled values do not fit int64, the server's text is parsed
    assert native_binary(codec_for(numeric_column(18, 2))) is None
    assert native_binary(codec_for(numeric_column(17, 0))) == "decimal"
    assert native_binary(codec_for(PgColumn(name="n", type=BUILTIN_BY_NAME["numeric"], typmod=-1))) is None
