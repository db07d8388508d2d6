"""BinaryCopyDecoder on hand-built binary COPY streams (format from the PostgreSQL docs,
"COPY: Binary Format"); the real server's output is checked in
tests/integration/test_typemap_roundtrip.py."""

from __future__ import annotations

import datetime as dt
import struct

import pyarrow as pa
import pytest

from airflow_pgcdc.protocol.pgtypes import BUILTIN_BY_NAME, PgColumn
from airflow_pgcdc.typemap.decode.copy_binary import (
    SIGNATURE,
    BinaryCopyDecoder,
    binary_select_list,
    native_binary,
    text_expression,
)
from airflow_pgcdc.typemap.map import UnrepresentableValue, ValueConversionError

HEADER = SIGNATURE + struct.pack(">ii", 0, 0)
TRAILER = struct.pack(">h", -1)
PG_EPOCH_DAYS = 10957  # 2000-01-01 - 1970-01-01


def col(name: str, type_name: str) -> PgColumn:
    return PgColumn(name=name, type=BUILTIN_BY_NAME[type_name], typmod=-1)


def field(value: bytes | None) -> bytes:
    return struct.pack(">i", -1) if value is None else struct.pack(">i", len(value)) + value


def row(*values: bytes | None) -> bytes:
    return struct.pack(">h", len(values)) + b"".join(field(v) for v in values)


COLUMNS = [col("id", "int8"), col("name", "text"), col("ok", "bool"), col("day", "date"), col("n", "numeric")]


def messages(rows: list[bytes], header: bytes = HEADER) -> list[bytes]:
    """CopyData messages as PostgreSQL sends them: the header rides in the first row's."""
    out = [header + rows[0], *rows[1:]] if rows else [header]
    return [*out, TRAILER]


def decode(msgs: list[bytes], columns=COLUMNS, per_feed: int = 1, block_bytes: int = 1) -> pa.Table:
    dec = BinaryCopyDecoder(columns, table="public.t", block_bytes=block_bytes)
    batches = []
    for k in range(0, len(msgs), per_feed):
        group = msgs[k : k + per_feed]
        batches += dec.feed(b"".join(group), [len(m) for m in group])
    batches += dec.finish()
    return pa.Table.from_batches(batches, schema=dec.schema)


def sample_rows() -> list[bytes]:
    return [
        row(struct.pack(">q", 1), b"alpha", b"\x01", struct.pack(">i", 0), b"1.5"),
        row(struct.pack(">q", -2), None, b"\x00", None, None),
        row(struct.pack(">q", 3), "é long value past twelve bytes".encode(), None, struct.pack(">i", 2**31 - 1), b"NaN"),
        row(struct.pack(">q", 4), b"", b"\x01", struct.pack(">i", -1), b"-0.25"),
    ]


@pytest.mark.parametrize("per_feed,block_bytes", [(1, 1), (2, 1), (5, 1 << 20)])
def test_decodes_rows_nulls_and_specials(per_feed, block_bytes):
    t = decode(messages(sample_rows()), per_feed=per_feed, block_bytes=block_bytes)
    assert t.column("id").to_pylist() == [1, -2, 3, 4]
    assert t.column("name").to_pylist() == ["alpha", None, "é long value past twelve bytes", ""]
    assert t.column("ok").to_pylist() == [True, False, None, True]
    days = t.column("day").cast(pa.int32()).to_pylist()
    assert days[0] == PG_EPOCH_DAYS and days[1] is None and days[3] == PG_EPOCH_DAYS - 1
    assert days[2] == 2**31 - 1  # +infinity keeps the documented sentinel
    assert t.column("day")[0].as_py() == dt.date(2000, 1, 1)
    assert t.column("n").to_pylist() == ["1.5", None, "NaN", "-0.25"]  # numeric travels as text


def test_header_only_message_and_empty_copy():
    msgs = [HEADER, *sample_rows(), TRAILER]
    assert decode(msgs).num_rows == 4
    assert decode(messages([])).num_rows == 0


def test_header_extension_is_skipped():
    header = SIGNATURE + struct.pack(">ii", 0, 3) + b"xyz"
    assert decode(messages(sample_rows(), header=header)).column("id").to_pylist() == [1, -2, 3, 4]


def test_bytea_and_fixed_width_values():
    cols = [col("b", "bytea"), col("f", "float8"), col("ts", "timestamptz")]
    rows = [row(b"\x00\xff" * 10, struct.pack(">d", 1.25), struct.pack(">q", 0)), row(b"", None, None)]
    t = decode(messages(rows), columns=cols)
    assert t.column("b").to_pylist() == [b"\x00\xff" * 10, b""]
    assert t.column("f").to_pylist() == [1.25, None]
    assert t.column("ts")[0].as_py() == dt.datetime(2000, 1, 1, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    "msgs,needle,err_row,column",
    [
        ([b"PGCOPY\n\xff\r\n\x01" + HEADER[11:] + sample_rows()[0], TRAILER], "signature", None, None),
        ([SIGNATURE + struct.pack(">ii", 1 << 16, 0) + sample_rows()[0], TRAILER], "OIDs", None, None),
        (messages([sample_rows()[0], row(b"x")]), "has 1 fields, expected 5", 1, None),
        (messages([sample_rows()[0][:-3]]), "past the end of its row", 0, "n"),
        (messages([sample_rows()[0] + b"zz"]), "2 bytes after the last field", 0, None),
        (messages([row(struct.pack(">i", 1), b"a", b"\x01", struct.pack(">i", 0), b"1")]), "must be 8 bytes", 0, "id"),
        (messages([row(struct.pack(">q", 1), b"\xff\xfe", b"\x01", None, None)]), "invalid UTF-8", 0, "name"),
        (messages([sample_rows()[0][:2] + struct.pack(">i", -5)]), "negative field length -5", 0, "id"),
    ],
)
def test_malformed_input_is_a_typed_error_naming_where(msgs, needle, err_row, column):
    with pytest.raises(ValueConversionError) as info:
        decode(msgs)
    err = info.value
    assert needle in str(err) and err.table == "public.t"
    if err_row is not None:
        assert err.row == err_row
    if column is not None:
        assert err.column == column


def test_truncated_stream_and_data_after_trailer():
    msgs = messages(sample_rows())[:-1]  # no trailer
    with pytest.raises(ValueConversionError, match="without its trailer"):
        decode(msgs)
    dec = BinaryCopyDecoder(COLUMNS, table="public.t", block_bytes=1)
    dec.feed(HEADER + sample_rows()[0], [len(HEADER) + len(sample_rows()[0])])
    dec.feed(TRAILER, [2])
    with pytest.raises(ValueConversionError, match="after the end-of-data trailer"):
        dec.feed(sample_rows()[1], [len(sample_rows()[1])])


def test_row_number_counts_across_blocks():
    rows = sample_rows() * 3 + [row(b"short")]
    msgs = messages(rows)
    with pytest.raises(ValueConversionError) as info:
        decode(msgs, per_feed=2)
    assert info.value.row == 12
    assert info.value.offset == sum(map(len, msgs[:12]))  # the start of the block holding it


def test_out_of_range_date_is_unrepresentable():
    cols = [col("d", "date")]
    with pytest.raises(UnrepresentableValue) as info:
        decode(messages([row(struct.pack(">i", 2**31 - 2))]), columns=cols)
    assert info.value.column == "d" and info.value.row == 0


def test_select_list_sends_text_for_non_native_types_through_the_output_function():
    inet = col("addr", "inet")
    cols = [col("id", "int8"), col("n", "numeric"), inet, col("x", "xml"), col("bp", "bpchar")]
    dec = BinaryCopyDecoder(cols)
    assert [native_binary(k) for k in dec.codecs] == ["fixed", None, None, None, "utf8"]
    casts = frozenset({BUILTIN_BY_NAME["inet"].oid, BUILTIN_BY_NAME["xml"].oid, BUILTIN_BY_NAME["bpchar"].oid})
    sql = binary_select_list(cols, dec.codecs, casts)
    assert sql.startswith('"id", "n"::pg_catalog.text AS "n", CASE WHEN "addr" IS NULL')
    assert "format('%s', \"x\")" in sql and sql.endswith('"bp"')
    assert text_expression(inet) == '"addr"::pg_catalog.text'  # without the cast list: plain cast


def test_decoding_integers_does_not_import_pandas():
    """The snapshot's binary COPY of int2/int4/int8/oid columns converted each block with
    ``arrow_type.to_pandas_dtype()``, which imports pandas on pyarrow 20 (the floor; not on
    23): a worker without pandas (pyspark, which brings it, is an extra) failed every such
    table with ModuleNotFoundError. Fails before the fix in .venv-floor, where `make test`
    runs it again."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = """
import struct, sys
from airflow_pgcdc.protocol.pgtypes import BUILTIN_BY_NAME, PgColumn
from airflow_pgcdc.typemap.decode.copy_binary import SIGNATURE, BinaryCopyDecoder
cols = [PgColumn(n, BUILTIN_BY_NAME[n]) for n in ("int2", "int4", "int8", "oid")]
row = struct.pack(">h", 4) + b"".join(struct.pack(">i", w) + v for w, v in (
    (2, struct.pack(">h", -2)), (4, struct.pack(">i", 7)), (8, struct.pack(">q", 1 << 40)), (4, struct.pack(">I", 9))))
msgs = [SIGNATURE + struct.pack(">ii", 0, 0) + row, struct.pack(">h", -1)]
d = BinaryCopyDecoder(cols, table="public.t", block_bytes=1)
batches = list(d.feed(b"".join(msgs), [len(m) for m in msgs])) + list(d.finish())
values = [b.to_pylist() for b in batches if b.num_rows]
print(values == [[{"int2": -2, "int4": 7, "int8": 1 << 40, "oid": 9}]], "pandas" in sys.modules)
"""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root,
                         env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"], out.stdout
