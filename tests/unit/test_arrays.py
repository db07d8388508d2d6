"""Arrow arrays built over buffers (airflow_pgcdc.typemap.arrays): the same arrays as
``pa.array``; and the change-stream decode path never makes pyarrow import pandas."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from airflow_pgcdc.typemap import arrays

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("values", [
    [],
    ["a", "bc", "", "def"],
    [None],
    [None, "x", None, "", "yz", None],
    ["é", "日本", None, "ascii", "\u0000nul", "😀"],
    ("tuple", None, "ok"),
    ["x" * 1000] * 40,
])
def test_strings_match_pa_array(values) -> None:
    got = arrays.strings(values)
    got.validate(full=True)
    assert got.type == pa.string()
    assert got.equals(pa.array(list(values), pa.string()))
    assert got.null_count == sum(v is None for v in values)


@pytest.mark.parametrize("values", [
    [],
    [b"", b"\x00\xff", None, b"abc"],
    [bytearray(b"ba"), memoryview(b"mv"), None, b"b"],
    [None, None],
])
def test_binaries_match_pa_array(values) -> None:
    got = arrays.binaries(values)
    got.validate(full=True)
    expected = pa.array([None if v is None else bytes(v) for v in values], pa.binary())
    assert got.equals(expected)


def test_from_numpy_and_ints() -> None:
    mask = np.array([False, True, False, False])
    for typ, values in [
        (pa.int16(), np.array([1, 2, -3, 4], dtype=np.int16)),
        (pa.int64(), np.array([2**62, 0, -(2**63), 7])),
        (pa.uint32(), np.array([0, 1, 2**32 - 1, 5], dtype=np.uint32)),
        (pa.float64(), np.array([0.5, 3.25, -1e300, 2.0])),
        (pa.bool_(), np.array([True, False, True, True])),
        (pa.date32(), np.array([0, 1, -1, 19000], dtype=np.int32)),
        (pa.timestamp("us", tz="UTC"), np.array([0, 1, -1, 1_700_000_000_000_000])),
        (pa.time64("us"), np.array([0, 1, 86_399_999_999, 5])),
    ]:
        for m in (None, mask, np.zeros(4, dtype=bool)):
            got = arrays.from_numpy(values, typ, m)
            got.validate(full=True)
            expected = pa.array(values, typ, mask=m)
            assert got.equals(expected), (typ, m)
    ints = [5, None, -(2**63), 2**63 - 1]
    assert arrays.ints(ints).equals(pa.array(ints, pa.int64()))
    assert arrays.ints([1, 2]).equals(pa.array([1, 2], pa.int64()))
    ts = pa.timestamp("us", tz="UTC")
    assert arrays.ints([0, None], ts).equals(pa.array([0, None], pa.int64()).cast(ts))
    assert arrays.bools([True, False, 1, 0]).to_pylist() == [True, False, True, False]


def test_list_array_and_scalars() -> None:
    values = arrays.strings(["a", "b", "c"])
    got = arrays.list_array(np.array([0, 2, 2, 3], dtype=np.int32), values, pa.list_(pa.string()),
                            np.array([False, True, False]))
    got.validate(full=True)
    assert got.to_pylist() == [["a", "b"], None, ["c"]]
    for value, typ in [("t", pa.string()), (None, pa.string()), (b"\x00", pa.binary()), (1, pa.int32()),
                       (True, pa.bool_()), (1.5, pa.float64()), (None, pa.int64()), ("x", pa.large_string())]:
        assert arrays.scalar(value, typ).equals(pa.scalar(value, typ)), (value, typ)


def test_numpy_views() -> None:
    a = pa.array([1, None, 3, 4, None, 6], pa.int64()).slice(1, 4)  # [None, 3, 4, None]
    assert arrays.null_mask(a).tolist() == [True, False, False, True]
    assert arrays.numpy_values(a)[1:3].tolist() == [3, 4]
    assert arrays.numpy_values(a, np.int64).dtype == np.int64
    b = pa.array([True, None, False, True, True, None, False, True, True, False], pa.bool_()).slice(3)
    assert arrays.true_mask(b).tolist() == [True, True, False, False, True, True, False]
    assert arrays.null_mask(b).tolist() == [False, False, True, False, False, False, False]
    assert arrays.null_mask(pa.nulls(3)).tolist() == [True] * 3
    assert arrays.true_mask(pa.nulls(2, pa.bool_())).tolist() == [False, False]
    assert arrays.numpy_values(pa.nulls(2, pa.int32())).tolist() == [0, 0]
    assert arrays.null_mask(pa.array([], pa.int64())).shape == (0,)


# --------------------------------------------------------------------------- no pandas

# A wide table through the drain's conversion (ChangeBuffer -> RelationVersion.to_batch),
# text and binary rows, NULLs, unchanged TOAST, old keys, irregular values, then
# a Parquet file: pyarrow must not have imported pandas.
NO_PANDAS = textwrap.dedent(r"""
    import struct, sys, uuid
    import pyarrow as pa, pyarrow.parquet as pq
    from airflow_pgcdc.changes.rows import ChangeBuffer, RelationVersion
    from airflow_pgcdc.drain import drain  # noqa: F401  (everything a drain imports)
    from airflow_pgcdc.protocol.pgoutput import UNCHANGED_TOAST as U
    from airflow_pgcdc.protocol.pgtypes import BUILTIN_BY_NAME as B, PgColumn

    def num(p, s):
        return ((p << 16) | s) + 4

    spec = [  # name, type, typmod, text values (3 rows), binary values (2 rows)
        ("id", "int8", -1, ["1", "2", "3"], [struct.pack(">q", 4), struct.pack(">q", 5)]),
        ("i4", "int4", -1, ["-7", None, "8"], [struct.pack(">i", 1), None]),
        ("i2", "int2", -1, ["1", "2", None], [struct.pack(">h", 3), None]),
        ("o", "oid", -1, ["4294967295", "0", None], [struct.pack(">I", 7), None]),
        ("f8", "float8", -1, ["1.5", "NaN", "-Infinity"], [struct.pack(">d", 2.5), None]),
        ("f4", "float4", -1, ["1.5", None, "3"], [struct.pack(">f", 2.5), None]),
        ("n", "numeric", num(12, 2), ["1.50", "NaN", None],
         [struct.pack(">hhHHhh", 2, 0, 0, 2, 1, 5000), None]),
        ("nu", "numeric", -1, ["1e+30", "Infinity", None], [struct.pack(">hhHH", 0, 0, 0xC000, 0), None]),
        ("b", "bool", -1, ["t", "f", None], [b"\x01", None]),
        ("t", "text", -1, ["a", U, "日本"], [b"x", U]),
        ("vc", "varchar", -1, ["a", "b", None], [b"c", None]),
        ("by", "bytea", -1, ["\\x00ff", "\\001abc", None], [b"\x00\x01", None]),
        ("d", "date", -1, ["2024-01-02", "infinity", "0044-03-15 BC"], [struct.pack(">i", 1), None]),
        ("ts", "timestamp", -1, ["2024-01-02 03:04:05.5", "-infinity", "infinity"],
         [struct.pack(">q", 10), None]),
        ("tz", "timestamptz", -1, ["2024-01-02 03:04:05+02", "infinity", None], [struct.pack(">q", 1), None]),
        ("tm", "time", -1, ["10:11:12", "24:00:00", None], [struct.pack(">q", 1), None]),
        ("ttz", "timetz", -1, ["10:11:12+02", None, None], [struct.pack(">qi", 1, 0), None]),
        ("iv", "interval", -1, ["1 day", "-1 years 2 mons", None], [struct.pack(">qii", 1, 2, 3), None]),
        ("u", "uuid", -1, [str(uuid.UUID(int=5)), None, str(uuid.UUID(int=7))], [bytes(16), None]),
        ("j", "json", -1, ['{"a": 1}', None, "[]"], [b"{}", None]),
        ("jb", "jsonb", -1, ['{"a": 1}', None, "[]"], [b"\x01{}", None]),
        ("ai", "_int4", -1, ["{1,2,NULL}", "{}", None],
         [struct.pack(">iiiii", 1, 0, 23, 1, 1) + struct.pack(">ii", 4, 9), None]),
        ("at", "_text", -1, ['{"a b",c}', "{x,NULL}", None], [None, None]),
        ("an", "_int4", -1, ["{{1,2},{3,4}}", None, None], [None, None]),
    ]
    cols = tuple(PgColumn(name, B[typ], typmod, 2 if name == "an" else 0) for name, typ, typmod, _, _ in spec)
    keys = tuple(name in ("id", "i4") for name, *_ in spec)
    for ri in ("d", "f"):
        rv = RelationVersion(1, "public", "t", ri, cols, keys if ri == "d" else (True,) * len(cols))
        buf = ChangeBuffer(rv)
        text_rows = [tuple(s[3][r] for s in spec) for r in range(3)]
        bin_rows = [tuple(s[4][r] for s in spec) for r in range(2)]
        buf.add("I", text_rows[0], None, 100, 0, 7, 1_700_000_000_000_000)
        buf.add("U", text_rows[1], text_rows[0], 100, 1, 7, None)
        buf.add("U", bin_rows[0], bin_rows[1], 200, 2, 8, 0)
        buf.add("D", text_rows[2], None, 200, 3, 8, 0)
        buf.add("I", bin_rows[1], None, 300, 4, 9, 5)
        batch = rv.to_batch(buf.take())
        assert batch.num_rows == 5, batch
        sink = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_batches([batch]), sink)
        assert pq.ParquetFile(pa.BufferReader(sink.getvalue())).read().num_rows == 5
    print("pandas" in sys.modules)
""")


def test_change_rows_do_not_import_pandas() -> None:
    """pyarrow imports pandas (1 s, ~50 MB per process) on its first conversion of a
    Python or numpy object; the drain's conversions must not do that."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", NO_PANDAS], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "converting change rows imported pandas"


def test_null_structs_keep_non_nullable_fields_valid() -> None:
    """An all-NULL interval column (or the old key of a chunk of inserts whose key is an
    interval) must still write to Parquet: INTERVAL_TYPE's fields are non-nullable."""
    import pyarrow.parquet as pq

    from airflow_pgcdc.changes.rows import ChangeBuffer, RelationVersion
    from airflow_pgcdc.protocol.pgtypes import BUILTIN_BY_NAME, PgColumn
    from airflow_pgcdc.typemap.codec import INTERVAL_TYPE
    from airflow_pgcdc.typemap.decode.tuples import TupleDecoder

    nested = pa.struct([pa.field("a", pa.string(), nullable=False), pa.field("b", INTERVAL_TYPE, nullable=False),
                        pa.field("c", pa.list_(pa.int32()), nullable=False), pa.field("d", pa.bool_())])
    for typ in (INTERVAL_TYPE, nested, pa.int64(), pa.list_(INTERVAL_TYPE)):
        got = arrays.nulls(3, typ)
        got.validate(full=True)
        assert got.type == typ and got.null_count == 3 and got.to_pylist() == [None] * 3
    iv = PgColumn("iv", BUILTIN_BY_NAME["interval"])
    batch = TupleDecoder([iv]).decode([(None,), (None,)]).batch
    rv = RelationVersion(1, "public", "t", "d", (iv, PgColumn("x", BUILTIN_BY_NAME["int4"])), (True, False))
    buf = ChangeBuffer(rv)
    buf.add("I", ("1 day", "1"), None, 1, 0, 1, 0)
    for b in (batch, rv.to_batch(buf.take())):
        sink = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_batches([b]), sink)
        assert pq.ParquetFile(pa.BufferReader(sink.getvalue())).read().num_rows == b.num_rows
