"""Unit tests of the PostgreSQL → Arrow type map (no server; the real-server round trip
is tests/integration/test_typemap_roundtrip.py)."""

from __future__ import annotations

import pickle
import random
import struct
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_pgcdc.errors import PgcdcError
from airflow_pgcdc.protocol.pgoutput import UNCHANGED_TOAST
from airflow_pgcdc.protocol.pgtypes import (
    BUILTIN_BY_NAME,
    BUILTIN_TYPES,
    PgAttribute,
    PgColumn,
    PgTypeInfo,
    builtin_type,
    format_type,
    numeric_precision_scale,
)
from airflow_pgcdc.protocol.quoting import QuotingError
from airflow_pgcdc.typemap import codec, numeric, pgarray, times
from airflow_pgcdc.typemap.decode.copy_text import (
    SnapshotDecoder,
    _last_row_end,
    copy_select_list,
    copy_sql,
)
from airflow_pgcdc.typemap.decode.tuples import TupleDecoder
from airflow_pgcdc.typemap.map import (
    DATE_NEG_INFINITY,
    DATE_POS_INFINITY,
    INTERVAL_TYPE,
    SESSION_OPTIONS,
    TIMESTAMP_NEG_INFINITY,
    TIMESTAMP_POS_INFINITY,
    UnrepresentableValue,
    ValueConversionError,
    array_to_pg_text,
    arrow_field,
    arrow_schema,
    arrow_type,
    binary_supported,
    convert_binary,
    convert_text,
    session_setup_sql,
    to_pg_text,
)

B = BUILTIN_BY_NAME


def col(typname: str, typmod: int = -1, name: str = "c", **kw) -> PgColumn:
    return PgColumn(name, B[typname], typmod, **kw)


def numeric_typmod(p: int, s: int) -> int:
    return ((p << 16) | (s & 0x7FF)) + 4


def roundtrip(column: PgColumn, texts: list[str | None]) -> list[str | None]:
    return array_to_pg_text(convert_text(texts, column), column)


# --------------------------------------------------------------------------- descriptors


def test_builtin_table() -> None:
    assert builtin_type(23).name == "int4"
    assert builtin_type(1007).element is builtin_type(23)
    assert builtin_type(1020).delimiter == ";"  # _box: an array's typdelim is its element's
    assert builtin_type(3910).subtype is builtin_type(1184)
    assert builtin_type(4534).range is builtin_type(3910)
    assert builtin_type(22).element is None  # int2vector is not a varlena array
    assert builtin_type(99999) is None
    assert all(t.is_builtin for t in BUILTIN_TYPES.values())


@pytest.mark.parametrize(
    ("typname", "typmod", "ndims", "expected"),
    [
        ("int4", -1, 0, "int4"),
        ("numeric", numeric_typmod(12, 2), 0, "numeric(12,2)"),
        ("numeric", numeric_typmod(3, -2), 0, "numeric(3,-2)"),
        ("numeric", -1, 0, "numeric"),
        ("varchar", 24, 0, "varchar(20)"),
        ("bpchar", 9, 0, "bpchar(5)"),
        ("timestamptz", 3, 0, "timestamptz(3)"),
        ("bit", 8, 0, "bit(8)"),
        ("_int4", -1, 0, "int4[]"),
        ("_int4", -1, 2, "int4[][]"),
        ("_numeric", numeric_typmod(5, 2), 1, "numeric(5,2)[]"),
        ("interval", (0x7FFF << 16) | 3, 0, "interval(3)"),
        ("interval", ((1 << 3) | (1 << 10)) << 16 | 0xFFFF, 0, "interval day to hour"),
    ],
)
def test_format_type(typname, typmod, ndims, expected) -> None:
    assert format_type(B[typname], typmod, ndims) == expected


def test_format_type_user_types() -> None:
    mood = PgTypeInfo(16500, "mood", "public", "e", "E", labels=("a",))
    assert format_type(mood) == "public.mood"
    odd = PgTypeInfo(16501, "My Type", "Weird Schema", "c", "C")
    assert format_type(odd) == '"Weird Schema"."My Type"'


def test_numeric_typmod() -> None:
    assert numeric_precision_scale(-1) is None
    assert numeric_precision_scale(numeric_typmod(12, 2)) == (12, 2)
    assert numeric_precision_scale(numeric_typmod(3, -2)) == (3, -2)
    assert numeric_precision_scale(numeric_typmod(2, 5)) == (2, 5)
    assert numeric_precision_scale(numeric_typmod(1000, 0)) == (1000, 0)


# --------------------------------------------------------------------------- mapping


@pytest.mark.parametrize(
    ("column", "expected"),
    [
        (col("bool"), pa.bool_()),
        (col("int2"), pa.int16()),
        (col("int4"), pa.int32()),
        (col("int8"), pa.int64()),
        (col("oid"), pa.int64()),
        (col("float4"), pa.float32()),
        (col("float8"), pa.float64()),
        (col("numeric", numeric_typmod(12, 2)), pa.decimal128(13, 2)),
        (col("numeric", numeric_typmod(37, 5)), pa.decimal128(38, 5)),
        (col("numeric", numeric_typmod(38, 5)), pa.string()),
        (col("numeric", numeric_typmod(3, -2)), pa.decimal128(6, 0)),
        (col("numeric", numeric_typmod(2, 5)), pa.decimal128(6, 5)),
        (col("numeric"), pa.string()),
        (col("text"), pa.string()),
        (col("varchar", 24), pa.string()),
        (col("bpchar", 9), pa.string()),
        (col("name"), pa.string()),
        (col("char"), pa.string()),
        (col("bytea"), pa.binary()),
        (col("date"), pa.date32()),
        (col("time"), pa.time64("us")),
        (col("timetz"), pa.string()),
        (col("timestamp"), pa.timestamp("us")),
        (col("timestamptz"), pa.timestamp("us", "UTC")),
        (col("interval"), INTERVAL_TYPE),
        (col("uuid"), pa.string()),
        (col("json"), pa.string()),
        (col("jsonb"), pa.string()),
        (col("_int4"), pa.list_(pa.int32())),
        (col("_int4", ndims=2), pa.list_(pa.list_(pa.int32()))),
        (col("_timestamptz"), pa.list_(pa.timestamp("us", "UTC"))),
        (col("_int4", as_text=True), pa.string()),
        (col("inet"), pa.string()),
        (col("money"), pa.string()),
        (col("int4range"), pa.string()),
        (col("point"), pa.string()),
        (col("xid8"), pa.string()),
        (col("pg_lsn"), pa.string()),
    ],
)
def test_arrow_types(column, expected) -> None:
    assert arrow_type(column) == expected


def test_user_types_map_by_kind() -> None:
    mood = PgTypeInfo(16500, "mood", "public", "e", "E", labels=("sad", "ok"))
    posint = PgTypeInfo(16501, "posint", "public", "d", "N", base=B["int4"])
    money2 = PgTypeInfo(16502, "money2", "public", "d", "N", base=B["numeric"], base_typmod=numeric_typmod(7, 3))
    intarr = PgTypeInfo(16503, "intarr", "public", "d", "A", base=B["_int4"], base_ndims=1)
    pair = PgTypeInfo(16504, "pair", "public", "c", "C", attributes=(PgAttribute("a", B["int4"]),))
    pair_arr = PgTypeInfo(16505, "_pair", "public", "b", "A", element=pair)
    hstore = PgTypeInfo(16506, "hstore", "public", "b", "U")
    assert arrow_type(PgColumn("e", mood)) == pa.string()
    assert arrow_type(PgColumn("d", posint)) == pa.int32()
    assert arrow_type(PgColumn("m", money2)) == pa.decimal128(8, 3)
    assert arrow_type(PgColumn("a", intarr)) == pa.list_(pa.int32())
    assert arrow_type(PgColumn("p", pair)) == pa.string()
    assert arrow_type(PgColumn("pa", pair_arr)) == pa.list_(pa.string())
    assert arrow_type(PgColumn("h", hstore)) == pa.string()
    f = arrow_field(PgColumn("m", money2))
    assert f.metadata[b"pg_type"] == b"public.money2"
    assert f.metadata[b"pg_base_type"] == b"numeric(7,3)"
    assert f.metadata[b"pg_numeric_nan"] == b"10000.000"
    assert not binary_supported(pair) and not binary_supported(hstore)
    assert binary_supported(mood) and binary_supported(posint)


def test_field_metadata() -> None:
    f = arrow_field(col("numeric", numeric_typmod(12, 2), name="amount"))
    assert f.name == "amount" and f.nullable
    assert f.metadata[b"pg_type"] == b"numeric(12,2)"
    assert f.metadata[b"pg_type_oid"] == b"1700"
    assert f.metadata[b"pg_typmod"] == str(numeric_typmod(12, 2)).encode()
    assert f.metadata[b"pg_encoding"] == b"decimal"
    assert f.metadata[b"pg_numeric_nan"] == b"10000000000.00"
    ts = arrow_field(col("_timestamptz"))
    assert ts.metadata[b"pg_type"] == b"timestamptz[]"
    assert ts.metadata[b"pg_encoding"] == b"array"
    assert ts.metadata[b"pg_element_encoding"] == b"timestamptz"
    assert ts.metadata[b"pg_infinity"] == b"9223372036854775807/-9223372036854775808"
    schema = arrow_schema([col("int4", name="a"), col("text", name="b")])
    assert schema.names == ["a", "b"]


def test_session_settings() -> None:
    stmts = session_setup_sql()
    assert "SET DateStyle TO 'ISO, YMD'" in stmts
    assert "SET IntervalStyle TO 'postgres'" in stmts
    assert "-c DateStyle=ISO,YMD" in SESSION_OPTIONS and "-c bytea_output=hex" in SESSION_OPTIONS


# --------------------------------------------------------------------------- text round trips


@pytest.mark.parametrize(
    ("column", "texts"),
    [
        (col("bool"), ["t", "f", None]),
        (col("int2"), ["-32768", "32767", "0", None]),
        (col("int8"), ["-9223372036854775808", "9223372036854775807"]),
        (col("oid"), ["0", "4294967295"]),
        (col("float8"), ["NaN", "Infinity", "-Infinity", "-0", "0.1", "1e+308", "5e-324",
                         "123456789012345", "1.2345678901234568e+15", "1e-05", "0.0001", "3.141592653589793"]),
        (col("float4"), ["NaN", "1.1", "3.4028235e+38", "1e-45", "123456", "1.234567e+06", "1.5e-07", "0.3"]),
        (col("numeric", numeric_typmod(12, 2)), ["NaN", "0.00", "-9999999999.99", "9999999999.99", "0.01"]),
        (col("numeric", numeric_typmod(3, -2)), ["NaN", "1500", "-99900", "0"]),
        (col("numeric", numeric_typmod(2, 5)), ["NaN", "0.00012", "-0.00099", "0.00000"]),
        (col("numeric"), ["NaN", "Infinity", "-Infinity", "1.000", "-0.5"]),
        (col("text"), ["", "a\"b", "x\\y", "new\nline", "☃ 𝄞", None]),
        (col("bytea"), ["\\x", "\\x00ff10", "\\xdeadbeef", None]),
        (col("date"), ["infinity", "-infinity", "2000-01-01", "0044-03-15 BC", "4714-11-24 BC",
                       "5874897-12-31", "1970-01-01", "2024-02-29", "0001-01-01", "0001-12-31 BC",
                       "10000-01-01", None]),
        (col("time"), ["00:00:00", "24:00:00", "23:59:59.999999", "12:34:56.5", None]),
        (col("timestamp"), ["infinity", "-infinity", "2000-01-01 00:00:00", "4714-11-24 00:00:00 BC",
                            "294246-12-31 23:59:59.999999", "0001-01-01 00:00:00 BC",
                            "1969-12-31 23:59:59.999999", "10000-01-01 00:00:00.000001"]),
        (col("timestamptz"), ["infinity", "2000-01-01 00:00:00+00", "0044-03-15 12:00:00.5+00 BC",
                              "1970-01-01 00:00:00.000001+00"]),
        (col("interval"), ["00:00:00", "1 year 2 mons 3 days 04:05:06.789", "-1 years -2 mons +3 days -04:05:06",
                           "1 mon", "-1 days", "178000000 years", "2562047788:00:54.775807",
                           "-2562047788:00:54.775808", "1 day -00:00:01", "-1 mons +1 day",
                           "00:00:00.000001", "infinity", "-infinity", None]),
        (col("_int4"), ["{}", "{1,NULL,3}", "{NULL}", None]),
        (col("_text"), ['{"",NULL,"NULL","a,b","q\\"x","b\\\\s","sp ace","{}",plain}', "{}"]),
        (col("_int4", ndims=2), ["{{1,2},{3,NULL}}", "{}", "{{1}}"]),
        (col("_numeric", numeric_typmod(5, 2)), ["{NaN,1.50,NULL}"]),
        (col("_timestamptz"), ['{infinity,"2024-01-01 00:00:00+00",NULL,-infinity}']),
        (col("_box"), ["{(1,1),(0,0);(2,2),(1,1)}"]),
        (col("_interval"), ['{"1 day",-00:00:01,NULL}']),
        (col("_bytea"), ['{"\\\\x00",NULL,"\\\\x"}']),
        (col("_int4", as_text=True), ["[0:1]={1,2}", "{}"]),
    ],
)
def test_text_round_trip(column, texts) -> None:
    assert roundtrip(column, texts) == texts


def test_numeric_nan_sentinel_orders_above_numbers() -> None:
    c = col("numeric", numeric_typmod(4, 1))
    arr = convert_text(["NaN", "999.9", "-999.9"], c)
    assert arr.type == pa.decimal128(5, 1)
    assert arr.to_pylist() == [Decimal("1000.0"), Decimal("999.9"), Decimal("-999.9")]
    assert max(arr.to_pylist()) == arr[0].as_py()
    assert to_pg_text(arr[0], c) == "NaN"


def test_infinity_sentinels() -> None:
    d = convert_text(["infinity", "-infinity"], col("date"))
    assert d.cast(pa.int32()).to_pylist() == [DATE_POS_INFINITY, DATE_NEG_INFINITY]
    ts = convert_text(["infinity", "-infinity"], col("timestamptz"))
    assert ts.cast(pa.int64()).to_pylist() == [TIMESTAMP_POS_INFINITY, TIMESTAMP_NEG_INFINITY]
    iv = convert_text(["infinity"], col("interval"))
    assert iv.to_pylist() == [{"months": 2**31 - 1, "days": 2**31 - 1, "microseconds": 2**63 - 1}]


def test_timestamp_values_are_utc_microseconds() -> None:
    arr = convert_text(
        ["2024-06-01 14:00:00+02", "1900-01-01 00:00:00+00:19:32", "2024-06-01 12:00:00.000001+00"],
        col("timestamptz"),
    )
    assert arr.to_pylist()[0] == datetime(2024, 6, 1, 12, tzinfo=UTC)
    assert arr.cast(pa.int64())[1].as_py() == int(
        (datetime(1899, 12, 31, 23, 40, 28, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() * 1e6
    )
    assert array_to_pg_text(arr, col("timestamptz"))[0] == "2024-06-01 12:00:00+00"


def test_random_timestamps_and_dates_round_trip() -> None:
    rnd = random.Random(1)
    lo, hi = -210_866_803_200_000_000, 9_224_318_015_999_999_999 - 30 * 365 * 86_400_000_000
    values = [rnd.randint(lo, hi) for _ in range(3000)] + [0, -1, 1, 86_400_000_000 - 1]
    for tz in ("timestamp", "timestamptz"):
        c = col(tz)
        arr = pa.array(values, pa.int64()).cast(arrow_type(c))
        texts = array_to_pg_text(arr, c)
        back = convert_text(texts, c)
        assert back.cast(pa.int64()).to_pylist() == values
    # against Python's calendar for years 1..9999
    for _ in range(500):
        dt = datetime(1, 1, 1, tzinfo=UTC) + timedelta(microseconds=rnd.randint(0, 315_537_897_599_999_999))
        text = dt.strftime("%Y-%m-%d %H:%M:%S") + (f".{dt.microsecond:06d}".rstrip("0") if dt.microsecond else "")
        text = text.zfill(len(text) + 4 - text.index("-"))
        assert convert_text([text + "+00"], col("timestamptz")).to_pylist() == [dt]
    days = [rnd.randint(-2_440_588, 2_145_042_905) for _ in range(3000)]
    d = pa.array(days, pa.int32()).cast(pa.date32())
    assert convert_text(array_to_pg_text(d, col("date")), col("date")).cast(pa.int32()).to_pylist() == days
    assert convert_text(["0001-01-01"], col("date")).to_pylist() == [date(1, 1, 1)]


def test_float_formatting_matches_postgres_rules() -> None:
    f = numeric.format_float
    assert f(1e15) == "1e+15"
    assert f(123456789012345.0) == "123456789012345"
    assert f(1e-5) == "1e-05"
    assert f(0.0001) == "0.0001"
    assert f(1.5e300) == "1.5e+300"
    assert f(-0.0) == "-0"
    assert f(123456.0, single=True) == "123456"
    assert f(1234567.0, single=True) == "1.234567e+06"
    assert f(float(pa.scalar(1.1, pa.float32()).as_py()), single=True) == "1.1"
    rnd = random.Random(3)
    for _ in range(2000):
        v = struct.unpack("<d", struct.pack("<Q", rnd.getrandbits(64)))[0]
        if v == v:
            assert float(f(v).replace("Infinity", "inf")) == v


def test_interval_formatting() -> None:
    f = times.format_interval
    assert f(0, 0, 0) == "00:00:00"
    assert f(14, 3, 14_706_789_000) == "1 year 2 mons 3 days 04:05:06.789"
    assert f(-14, 3, -14_706_000_000) == "-1 years -2 mons +3 days -04:05:06"
    assert f(0, 1, -1_000_000) == "1 day -00:00:01"
    assert f(-1, 1, 0) == "-1 mons +1 day"
    assert f(0, -1, 1) == "-1 days +00:00:00.000001"


# --------------------------------------------------------------------------- arrays


def test_parse_array_text() -> None:
    p = pgarray.parse_array_text
    assert p("{}") == ([], None, [])
    assert p("{1,NULL,3}") == ([3], None, ["1", None, "3"])
    assert p('{"",NULL,"NULL","a\\"b","c\\\\d"}') == ([5], None, ["", None, "NULL", 'a"b', "c\\d"])
    assert p("{{1,2},{3,4}}") == ([2, 2], None, ["1", "2", "3", "4"])
    assert p("[0:1]={1,2}") == ([2], [0], ["1", "2"])
    assert p("[1:2]={1,2}") == ([2], None, ["1", "2"])
    assert p("{(1,1),(0,0);(2,2),(1,1)}", ";") == ([2], None, ["(1,1),(0,0)", "(2,2),(1,1)"])
    for bad in ("", "1", "{1,2", "{{1,2},{3}}", "{{1},2}", "{1,{2}}", "{1}x", '{"a}', "{1,,2}", "[0:1]{1}"):
        with pytest.raises(codec._OneBad):
            p(bad)


def test_array_shape_errors_are_unrepresentable() -> None:
    with pytest.raises(UnrepresentableValue) as info:
        convert_text(["{1}", "[0:1]={1,2}"], col("_int4", name="a"), table="s.t", row_offset=100)
    e = info.value
    assert (e.table, e.column, e.pg_type, e.row) == ("s.t", "a", "int4[]", 101)
    assert "as_text" in str(e)
    with pytest.raises(UnrepresentableValue, match="2-dimensional"):
        convert_text(["{{1}}"], col("_int4"))
    with pytest.raises(UnrepresentableValue):
        convert_text(["{1,2}"], col("_int4", ndims=2))


def test_array_element_errors_name_the_row() -> None:
    with pytest.raises(ValueConversionError) as info:
        convert_text(["{1,2}", None, "{3,x}"], col("_int4"))
    assert info.value.row == 2 and "element 2" in info.value.reason
    with pytest.raises(ValueConversionError) as info:
        convert_text(['{"2020-01-01 00:00:00+00",garbage}'], col("_timestamptz"))
    assert info.value.row == 0


# --------------------------------------------------------------------------- errors


GOOD = {
    "bool": "t", "bytea": "\\x", "date": "2000-01-01", "time": "00:00:00",
    "timestamp": "2000-01-01 00:00:00", "timestamptz": "2000-01-01 00:00:00+00",
    "interval": "1 day", "_int4": "{}",
}


@pytest.mark.parametrize(
    ("column", "bad"),
    [
        (col("bool"), "true"),
        (col("int2"), "40000"),
        (col("int4"), "1.5"),
        (col("oid"), "-1"),
        (col("float8"), "abc"),
        (col("numeric", numeric_typmod(4, 1)), "12345.6"),
        (col("numeric", numeric_typmod(4, 1)), "1.25"),
        (col("bytea"), "\\x0"),
        (col("bytea"), "\\xzz"),
        (col("date"), "01/02/2024"),
        (col("date"), "2023-02-29"),
        (col("time"), "25:00:00"),
        (col("timestamp"), "2024-01-01 00:00:00+00"),
        (col("timestamptz"), "2024-01-01 00:00:00"),
        (col("interval"), "P1Y2M"),
        (col("_int4"), "{1,2"),
    ],
)
def test_bad_values_raise_typed_errors(column, bad) -> None:
    with pytest.raises(ValueConversionError) as info:
        convert_text([GOOD.get(column.type.name, "0"), bad], column, table="public.t")
    e = info.value
    assert isinstance(e, PgcdcError) and isinstance(e, ValueError)
    assert e.row == 1 and e.table == "public.t" and e.column == "c"
    assert "public.t" in str(e) and "row 1" in str(e)


def test_unrepresentable_timestamps() -> None:
    for tz, text in (("timestamp", "294276-12-31 23:59:59.999999"), ("timestamptz", "294247-01-10 04:00:54.775807+00")):
        with pytest.raises(UnrepresentableValue, match="range"):
            convert_text([text], col(tz))
    assert convert_text(["294247-01-10 04:00:54.775806+00"], col("timestamptz")).cast(pa.int64())[0].as_py() == 2**63 - 2


def test_error_pickles() -> None:
    e = UnrepresentableValue("x", table="t", column="c", pg_type="int4[]", row=3, offset=10, value="v")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is UnrepresentableValue and str(back) == str(e) and back.row == 3


# --------------------------------------------------------------------------- binary


def _numeric_bin(ndigits_weight_sign_dscale, digits=()) -> bytes:
    return struct.pack(">hhHH", *ndigits_weight_sign_dscale) + struct.pack(f">{len(digits)}h", *digits)


def test_numeric_binary_to_text() -> None:
    t = numeric.numeric_binary_to_text
    assert t(_numeric_bin((0, 0, 0xC000, 0))) == "NaN"
    assert t(_numeric_bin((0, 0, 0xD000, 0))) == "Infinity"
    assert t(_numeric_bin((0, 0, 0xF000, 0))) == "-Infinity"
    assert t(_numeric_bin((0, 0, 0, 2))) == "0.00"
    assert t(_numeric_bin((2, 0, 0x4000, 2), (1, 5000))) == "-1.50"
    assert t(_numeric_bin((1, 1, 0, 0), (12,))) == "120000"
    assert t(_numeric_bin((1, -2, 0, 8), (12,))) == "0.00000012"
    assert t(_numeric_bin((3, 1, 0, 4), (1, 2345, 6789))) == "12345.6789"
    with pytest.raises(codec._OneBad):
        t(b"\x00\x01")


def test_binary_decoding_common_types() -> None:
    def bin_(column, values):
        return array_to_pg_text(convert_binary(values, column), column)

    assert bin_(col("bool"), [b"\x01", b"\x00", None]) == ["t", "f", None]
    assert bin_(col("int2"), [struct.pack(">h", -5), None]) == ["-5", None]
    assert bin_(col("int8"), [struct.pack(">q", -(2**63))]) == ["-9223372036854775808"]
    assert bin_(col("oid"), [struct.pack(">I", 2**32 - 1)]) == ["4294967295"]
    assert bin_(col("float4"), [struct.pack(">f", 1.5)]) == ["1.5"]
    assert bin_(col("float8"), [struct.pack(">d", float("nan"))]) == ["NaN"]
    assert bin_(col("text"), ["é".encode(), b""]) == ["é", ""]
    assert bin_(col("jsonb"), [b'\x01{"a": 1}']) == ['{"a": 1}']
    assert bin_(col("char"), [b"x", b"\x80", b"\x00"]) == ["x", "\\200", ""]
    assert bin_(col("bytea"), [b"\x00\xff"]) == ["\\x00ff"]
    u = bytes(range(16))
    assert bin_(col("uuid"), [u, None]) == ["00010203-0405-0607-0809-0a0b0c0d0e0f", None]
    assert bin_(col("date"), [struct.pack(">i", 0), struct.pack(">i", 2**31 - 1), struct.pack(">i", -(2**31))]) == [
        "2000-01-01", "infinity", "-infinity"]
    assert bin_(col("timestamptz"), [struct.pack(">q", 0), struct.pack(">q", 2**63 - 1)]) == [
        "2000-01-01 00:00:00+00", "infinity"]
    assert bin_(col("time"), [struct.pack(">q", 86_400_000_000)]) == ["24:00:00"]
    assert bin_(col("timetz"), [struct.pack(">qi", 3_600_000_000, -19800)]) == ["01:00:00+05:30"]
    assert bin_(col("interval"), [struct.pack(">qii", -1_000_000, 1, 14)]) == ["1 year 2 mons 1 day -00:00:01"]
    assert bin_(col("numeric", numeric_typmod(5, 2)), [_numeric_bin((0, 0, 0xC000, 0)), _numeric_bin((2, 0, 0, 2), (1, 5000))]) == [
        "NaN", "1.50"]
    arr = struct.pack(">iiI", 1, 1, 23) + struct.pack(">ii", 3, 1) + struct.pack(">i", 4) + struct.pack(">i", 7) \
        + struct.pack(">i", -1) + struct.pack(">i", 4) + struct.pack(">i", 9)
    assert bin_(col("_int4"), [arr, struct.pack(">iiI", 0, 0, 23)]) == ["{7,NULL,9}", "{}"]
    lb = struct.pack(">iiI", 1, 0, 23) + struct.pack(">ii", 1, 0) + struct.pack(">ii", 4, 7)
    assert bin_(col("_int4", as_text=True), [lb]) == ["[0:0]={7}"]
    with pytest.raises(UnrepresentableValue):
        convert_binary([lb], col("_int4"))
    with pytest.raises(ValueConversionError, match="4 bytes"):
        convert_binary([b"\x00\x01"], col("int4"))
    with pytest.raises(ValueConversionError, match="not supported"):
        convert_binary([b"x"], col("int4range"))
    with pytest.raises(UnrepresentableValue):
        convert_binary([struct.pack(">q", 2**63 - 2)], col("timestamp"))


# --------------------------------------------------------------------------- snapshot decoder


COLS = [col("int4", name="id"), col("text", name="t"), col("numeric", numeric_typmod(6, 2), name="n"),
        col("timestamptz", name="ts"), col("_text", name="arr")]


def _csv(rows) -> bytes:
    return b"".join(rows)


def test_snapshot_decoder_nulls_and_empty_strings() -> None:
    data = b'1,"",1.50,2024-01-01 00:00:00+00,{}\n2,,,,\n3,"a,""b""\nc",NaN,infinity,"{""x y"",NULL}"\n'
    t = SnapshotDecoder(COLS, table="public.t").decode_all(data)
    assert t.column("t").to_pylist() == ["", None, 'a,"b"\nc']
    assert t.column("arr").to_pylist() == [[], None, ["x y", None]]
    assert array_to_pg_text(t.column("n"), COLS[2]) == ["1.50", None, "NaN"]
    assert array_to_pg_text(t.column("ts"), COLS[3]) == ["2024-01-01 00:00:00+00", None, "infinity"]
    assert t.schema == arrow_schema(COLS)


def test_snapshot_decoder_any_chunking() -> None:
    rows = []
    for i in range(300):
        text = ['""', "", '"multi\nline, ""quoted"""', "plain", '"\r\n"'][i % 5]
        num = ["NaN", "1.25", ""][i % 3]
        ts = ["infinity", "2000-01-01 00:00:00.5+00", "0044-03-15 00:00:00+00 BC", ""][i % 4]
        rows.append(f"{i},{text},{num},{ts},{{a}}\n".encode())
    data = _csv(rows)
    whole = SnapshotDecoder(COLS).decode_all(data)
    assert whole.num_rows == 300
    rnd = random.Random(5)
    for block in (1, 50, 4096):
        dec = SnapshotDecoder(COLS, block_bytes=block)
        batches, pos = [], 0
        while pos < len(data):
            n = rnd.randint(1, 97)
            batches += dec.feed(data[pos : pos + n])
            pos += n
        batches += dec.finish()
        got = pa.Table.from_batches(batches, schema=dec.schema)
        for i, c in enumerate(COLS):
            assert array_to_pg_text(got.column(i), c) == array_to_pg_text(whole.column(i), c)
        assert dec.rows == 300 and dec.bytes == len(data)


def test_snapshot_decoder_fallback_is_sticky() -> None:
    dec = SnapshotDecoder(COLS, block_bytes=1)
    assert dec._native == [True, True, True, True, False]  # arrays are always read as text
    dec.feed(b"1,x,1.00,2000-01-01 00:00:00+00,{}\n")
    assert dec._native == [True, True, True, True, False]
    dec.feed(b"2,x,NaN,infinity,{}\n")
    assert dec._native == [True, True, False, False, False]
    out = dec.feed(b"3,x,2.00,2000-01-01 00:00:00+00,{}\n") + dec.finish()
    assert array_to_pg_text(out[0].column(2), COLS[2]) == ["2.00"]


def test_snapshot_decoder_errors() -> None:
    dec = SnapshotDecoder(COLS, table="public.t", block_bytes=1)
    dec.feed(b"1,x,1.00,,{}\n")
    with pytest.raises(ValueConversionError) as info:
        dec.feed(b"2,x,1.00,not a time,{}\n")
    e = info.value
    assert (e.table, e.column, e.row) == ("public.t", "ts", 1) and e.offset == 13
    with pytest.raises(ValueConversionError, match="malformed COPY CSV"):
        SnapshotDecoder(COLS).decode_all(b"1,2\n")
    with pytest.raises(ValueConversionError, match="truncated"):
        d = SnapshotDecoder(COLS)
        d.feed(b'1,"unterminated\n')
        d.finish()
    with pytest.raises(ValueConversionError) as info:
        SnapshotDecoder(COLS, table="public.t").decode_all(b'1,x,1.00,,{}\n2,x,1.00,,"{1,2"\n')
    assert info.value.column == "arr" and info.value.row == 1


def test_last_row_end() -> None:
    assert _last_row_end(b"") == 0
    assert _last_row_end(b"abc") == 0
    assert _last_row_end(b"a\nb") == 2
    assert _last_row_end(b'a\n"b\nc') == 2
    assert _last_row_end(b'"x\ny"\n"z\n') == 6
    assert _last_row_end(b'"only\nquoted') == 0


def test_copy_sql_quotes_identifiers() -> None:
    cols = [col("int4", name='we"ird'), col("text", name="Mixed Case")]
    assert copy_select_list(cols) == '"we""ird", "Mixed Case"'
    assert copy_sql("my schema", 'ta"ble', cols, "ctid >= '(0,0)'::tid") == (
        'COPY (SELECT "we""ird", "Mixed Case" FROM "my schema"."ta""ble" WHERE ctid >= \'(0,0)\'::tid) '
        "TO STDOUT (FORMAT csv)"
    )
    with pytest.raises(QuotingError):
        copy_sql("s", "t", [col("int4", name="a\x00b")])


def test_snapshot_parquet_keeps_metadata_and_sentinels(tmp_path) -> None:
    data = b"1,x,NaN,infinity,{}\n2,,1.00,-infinity,\n"
    t = SnapshotDecoder(COLS).decode_all(data)
    pq.write_table(t, tmp_path / "p.parquet")
    back = pq.read_table(tmp_path / "p.parquet")
    assert back.schema.field("n").metadata[b"pg_type"] == b"numeric(6,2)"
    assert array_to_pg_text(back.column("ts"), COLS[3]) == ["infinity", "-infinity"]
    assert array_to_pg_text(back.column("n"), COLS[2]) == ["NaN", "1.00"]


# --------------------------------------------------------------------------- tuple decoder


def test_tuple_decoder_text_and_unchanged_toast() -> None:
    dec = TupleDecoder(COLS, table="public.t")
    rows = [
        ("1", "a", "1.50", "infinity", "{x}"),
        ("2", UNCHANGED_TOAST, None, "2000-01-01 00:00:00+00", UNCHANGED_TOAST),
        ("3", "u", "NaN", None, None),
    ]
    out = dec.decode(rows)
    assert out.batch.schema == dec.schema
    assert out.batch.column("t").to_pylist() == ["a", None, "u"]
    assert out.unchanged_toast.to_pylist() == [[], ["t", "arr"], []]
    assert out.unchanged_masks[1].tolist() == [False, True, False]
    assert out.unchanged_masks[0] is None
    assert array_to_pg_text(out.batch.column("n"), COLS[2]) == ["1.50", None, "NaN"]
    empty = dec.decode([])
    assert empty.batch.num_rows == 0 and empty.batch.schema == dec.schema


def test_tuple_decoder_binary_and_mixed() -> None:
    cols = [col("int4", name="i"), col("text", name="t")]
    dec = TupleDecoder(cols)
    out = dec.decode([(struct.pack(">i", 5), b"x"), ("6", UNCHANGED_TOAST), (None, "y")])
    assert out.batch.column("i").to_pylist() == [5, 6, None]
    assert out.batch.column("t").to_pylist() == ["x", None, "y"]
    assert out.unchanged_toast.to_pylist() == [[], ["t"], []]
    allnull = dec.decode([(None, None)])
    assert allnull.batch.column("i").type == pa.int32()


def test_tuple_decoder_errors() -> None:
    dec = TupleDecoder(COLS, table="public.t")
    with pytest.raises(ValueConversionError, match="5 columns") as info:
        dec.decode([("1",) * 5, ("1", "2")], row_offset=7)
    assert info.value.row == 8
    with pytest.raises(ValueConversionError) as info:
        dec.decode([("1", "a", "1.005", None, None)], row_offset=3)
    assert (info.value.column, info.value.row, info.value.pg_type) == ("n", 3, "numeric(6,2)")
    with pytest.raises(ValueConversionError, match="not supported"):
        TupleDecoder([col("int4range")]).decode([(b"\x01",)])


def test_snapshot_decoder_single_null_column_rows_are_empty_lines() -> None:
    c = [col("text", name="t")]
    t = SnapshotDecoder(c).decode_all(b'a\n\n""\n\nb\n')
    assert t.column("t").to_pylist() == ["a", None, "", None, "b"]
    i = [col("int4", name="i")]
    assert SnapshotDecoder(i).decode_all(b"1\n\n2\n").column("i").to_pylist() == [1, None, 2]


@pytest.mark.parametrize("threads", [False, True])
def test_snapshot_decoder_rows_larger_than_blocks(threads) -> None:
    big = "x\n" * (3 << 19)
    data = b'1,"' + big.encode() + b'",,,\n2,y,,,\n'
    dec = SnapshotDecoder(COLS, block_bytes=1 << 16, use_threads=threads)
    out = []
    for i in range(0, len(data), 1 << 15):
        out += dec.feed(data[i : i + (1 << 15)])
    out += dec.finish()
    t = pa.Table.from_batches(out)
    assert t.column("t").to_pylist() == [big, "y"]


def test_huge_multiline_value_is_linear(monkeypatch) -> None:
    """A 16 MB value of short lines, fed in 64 KiB pieces: no rescans (quadratic). Every
    search for a row end reads its whole buffer (it counts the quotes), so the bytes
    handed to the searches measure the work: at most a few times the data."""
    from airflow_pgcdc.typemap.decode import copy_text

    scanned = []
    search = copy_text._last_row_end
    monkeypatch.setattr(copy_text, "_last_row_end", lambda buf, *a: scanned.append(len(buf)) or search(buf, *a))
    big = "line\n" * ((16 << 20) // 5)  # 16 MiB
    data = b'1,"' + big.encode() + b'",,,\n' + b"2,y,,,\n" * 1000
    dec = SnapshotDecoder(COLS, block_bytes=1 << 16)
    out = []
    for i in range(0, len(data), 1 << 16):
        out += dec.feed(data[i : i + (1 << 16)])
    out += dec.finish()
    assert sum(b.num_rows for b in out) == 1001
    assert len(scanned) > 3 and sum(scanned) <= 4 * len(data), (len(scanned), sum(scanned), len(data))


def test_last_row_end_with_known_prefix() -> None:
    buf = b'1,"a\nb\nc'
    assert _last_row_end(buf) == 0
    assert _last_row_end(buf + b'"\n', None, len(buf)) == len(buf) + 2
    assert _last_row_end(b'1,x\n2,"y\n', 1, 4) == 0


def test_decode_stream_and_buffer_kinds() -> None:
    data = b'1,"a\nb",1.00,,{}\n2,x,NaN,infinity,\n'
    pieces = [data[i : i + 3] for i in range(0, len(data), 3)]
    kinds = [bytearray(p) if i % 3 == 0 else memoryview(p) if i % 3 == 1 else p for i, p in enumerate(pieces)]
    dec = SnapshotDecoder(COLS, block_bytes=8)
    t = pa.Table.from_batches(list(dec.decode_stream(iter(kinds))), schema=dec.schema)
    assert t.column("t").to_pylist() == ["a\nb", "x"]
    buf = bytearray(b"1,x,1.00,,{}\n")
    dec = SnapshotDecoder(COLS)
    dec.feed(buf)
    buf[0:1] = b"9"  # a writable buffer is copied, so reusing it is safe
    assert dec.finish()[0].column(0).to_pylist() == [1]
    with pytest.raises(ValueError):
        dec.feed(b"x")


# --------------------------------------------------------------------------- properties

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_texts = st.one_of(st.text(alphabet=list('ab ,{}"\\\nNUL;é☃\t'), max_size=8), st.sampled_from(["NULL", "null", ""]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.one_of(st.none(), _texts), max_size=5), max_size=5))
def test_text_arrays_round_trip(rows) -> None:
    c = col("_text")
    texts = ["{" + ",".join("NULL" if e is None else pgarray.quote_array_element(e) for e in r) + "}" for r in rows]
    arr = convert_text(texts, c)
    assert arr.to_pylist() == rows
    assert array_to_pg_text(arr, c) == texts


@settings(max_examples=300, deadline=None)
@given(
    st.integers(-(2**31) + 1, 2**31 - 2),
    st.integers(-(2**31) + 1, 2**31 - 2),
    st.integers(-(2**63) + 1, 2**63 - 2),
)
def test_intervals_round_trip(months, days, us) -> None:
    text = times.format_interval(months, days, us)
    assert convert_text([text], col("interval")).to_pylist() == [
        {"months": months, "days": days, "microseconds": us}
    ]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 37), st.data())
def test_decimals_round_trip(precision, data) -> None:
    scale = data.draw(st.integers(-5, precision + 3))
    c = col("numeric", numeric_typmod(precision, scale))
    digits = max(precision - scale, 0)
    s = max(scale, 0)
    unscaled = data.draw(st.integers(-(10 ** (digits + s)) + 1, 10 ** (digits + s) - 1))
    if scale < 0:
        unscaled -= unscaled % (10 ** -scale)
    digits_text = str(abs(unscaled)).rjust(s + 1, "0")
    text = ("-" if unscaled < 0 else "") + (
        digits_text[:-s] + "." + digits_text[-s:] if s else digits_text
    )
    texts = [text, "NaN"]
    assert roundtrip(c, texts) == texts


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=20)), max_size=10))
def test_bytea_round_trip(values) -> None:
    texts = [None if v is None else "\\x" + v.hex() for v in values]
    arr = convert_text(texts, col("bytea"))
    assert arr.to_pylist() == values


@pytest.mark.parametrize("oid", sorted(BUILTIN_TYPES))
def test_every_builtin_handles_empty_and_null(oid) -> None:
    c = PgColumn("c", BUILTIN_TYPES[oid])
    t = arrow_type(c)
    for values in ([], [None, None]):
        arr = convert_text(values, c)
        assert arr.type == t and arr.to_pylist() == values
        assert array_to_pg_text(arr, c) == values
        if binary_supported(c):
            assert convert_binary(values, c).to_pylist() == values
    dec = TupleDecoder([c])
    assert dec.decode([(None,), (UNCHANGED_TOAST,)]).batch.column(0).to_pylist() == [None, None]
    assert SnapshotDecoder([c]).decode_all(b"\n").column(0).to_pylist() == [None]


def test_columns_from_relation() -> None:
    from airflow_pgcdc.protocol.pgoutput import Relation, RelationColumn, Type
    from airflow_pgcdc.typemap.map import columns_from_relation

    mood = PgTypeInfo(16500, "mood", "public", "e", "E", labels=("a",))
    rel = Relation(
        None, 16600, "public", "t", "d",
        (
            RelationColumn(1, "id", 23, -1),
            RelationColumn(0, "n", 1700, numeric_typmod(12, 2)),
            RelationColumn(0, "m", 16500, -1),
            RelationColumn(0, "g", 16700, -1),
            RelationColumn(0, "a", 1007, -1),
        ),
    )
    cols = columns_from_relation(
        rel, {16500: mood}, ndims={"a": 2}, as_text={"n"},
        type_messages={16700: Type(None, 16700, "public", "geo")},
    )
    assert [c.name for c in cols] == ["id", "n", "m", "g", "a"]
    assert cols[0].type is B["int4"] and cols[2].type is mood
    assert cols[1].as_text and cols[1].typmod == numeric_typmod(12, 2)
    assert format_type(cols[3].type) == "public.geo" and arrow_type(cols[3]) == pa.string()
    assert arrow_type(cols[4]) == pa.list_(pa.list_(pa.int32()))
