"""The comparison core of ``pgcdc verify`` and the Delta type conversions, on Arrow tables
built from PostgreSQL text through the type map (no servers)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from airflow_pgcdc.cli.verify import render_report, split_key
from airflow_pgcdc.lake.types import (
    DeltaTypeMismatch,
    from_delta_array,
    to_delta_batch,
    to_delta_schema,
    to_delta_type,
)
from airflow_pgcdc.protocol.pgtypes import BUILTIN_BY_NAME as B
from airflow_pgcdc.protocol.pgtypes import PgColumn
from airflow_pgcdc.typemap.map import arrow_schema, convert_text
from airflow_pgcdc.verify import (
    Comparer,
    DeltaTableNotFound,
    KeyColumnError,
    NoKey,
    VerifyResult,
    compare_tables,
    delta_table_location,
    open_delta_table,
)


def numeric_typmod(p: int, s: int) -> int:
    return ((p << 16) | (s & 0x7FF)) + 4


COLS = [
    PgColumn("id", B["int4"]),
    PgColumn("name", B["text"]),
    PgColumn("amount", B["numeric"], numeric_typmod(12, 2)),
    PgColumn("raw", B["numeric"]),
    PgColumn("ts", B["timestamptz"]),
    PgColumn("d", B["date"]),
    PgColumn("t", B["time"]),
    PgColumn("tags", B["_int4"]),
    PgColumn("times", B["_time"]),
    PgColumn("b", B["bytea"]),
    PgColumn("iv", B["interval"]),
    PgColumn("doc", B["jsonb"]),
    PgColumn("f", B["float8"]),
    PgColumn("ok", B["bool"]),
    PgColumn("small", B["int2"]),
]

BASE = [
    ("1", "a", "1.50", "1.50", "2024-01-02 03:04:05.123456+00", "2024-01-02", "24:00:00",
     "{1,NULL}", "{00:00:01,24:00:00}", "\\x00ff", "1 mon 2 days 00:00:03", '{"a": 1}', "0.1", "t", "1"),
    ("2", "", "NaN", "NaN", "infinity", "infinity", "00:00:00", "{}", "{}", "\\x", "00:00:00", "[]", "NaN", "f", "0"),
    ("3", None, None, None, "-infinity", "-infinity", None, None, None, None, None, None, None, None, None),
    ("10", "x y", "-0.01", "-Infinity", "1999-12-31 23:59:59.999999+00", "0001-01-01 BC", "12:00:00",
     "{3}", "{NULL}", "\\xdeadbeef", "-1 days", "null", "-0", None, "-32768"),
]


def table(rows, cols=COLS) -> pa.Table:
    arrays = [convert_text([r[i] for r in rows], c) for i, c in enumerate(cols)]
    return pa.Table.from_arrays(arrays, schema=arrow_schema(cols))


def delta_form(t: pa.Table) -> pa.Table:
    """What the merge writes: the Delta storage form (time as int64 µs)."""
    schema = to_delta_schema(t.schema)
    return pa.Table.from_batches([to_delta_batch(b) for b in t.to_batches()], schema=schema)


def with_row(rows, key: str, **changes):
    names = [c.name for c in COLS]
    out = []
    for r in rows:
        if r[0] == key:
            r = list(r)
            for k, v in changes.items():
                r[names.index(k)] = v
            r = tuple(r)
        out.append(r)
    return out


def compare(pg_rows, delta_rows, key=("id",), **kw):
    return compare_tables(table(pg_rows), delta_form(table(delta_rows)), columns=COLS, key=list(key), **kw)


# --------------------------------------------------------------------------- equality


def test_equal_tables_every_type():
    r = compare(BASE, list(reversed(BASE)))
    assert r.equal
    assert (r.postgres_rows, r.delta_rows, r.only_in_postgres, r.only_in_delta, r.changed) == (4, 4, 0, 0, 0)
    assert r.compared_columns == tuple(c.name for c in COLS)
    assert r.delta_only_columns == () and r.missing_in_delta == () and r.type_mismatches == ()


def test_empty_tables_equal():
    r = compare([], [])
    assert r.equal and r.postgres_rows == 0 and r.delta_rows == 0


def test_delta_table_in_batches_and_reader():
    pg = table(BASE)
    dl = delta_form(table(BASE))
    reader = pa.RecordBatchReader.from_batches(dl.schema, dl.to_batches(max_chunksize=1))
    assert compare_tables(pg.to_batches(max_chunksize=3), reader, columns=COLS, key=["id"]).equal


# --------------------------------------------------------------------------- differences


def test_missing_rows_on_each_side():
    r = compare(BASE[:3], BASE[1:])
    assert not r.equal
    assert (r.only_in_postgres, r.only_in_delta, r.changed) == (1, 1, 0)
    assert r.sample_only_in_postgres == ({"id": "1"},)
    assert r.sample_only_in_delta == ({"id": "10"},)


def test_changed_value_names_the_column_and_both_values():
    r = compare(BASE, with_row(BASE, "2", name="b"))
    assert (r.only_in_postgres, r.only_in_delta, r.changed) == (0, 0, 1)
    (row,) = r.sample_changed
    assert row.key == {"id": "2"}
    assert [(d.column, d.postgres, d.delta) for d in row.columns] == [("name", "", "b")]


@pytest.mark.parametrize(
    ("column", "pg", "delta"),
    [
        ("name", None, ""),  # NULL is not ''
        ("name", "a", None),
        ("raw", "1.50", "1.5"),  # unconstrained numeric: scale is part of the value
        ("raw", "NaN", None),
        ("amount", "1.50", "1.51"),
        ("ts", "infinity", "294247-01-10 04:00:54.775806+00"),  # the sentinel is not a real timestamp
        ("ts", "-infinity", "4713-11-24 00:00:00+00 BC"),
        ("ts", "2024-01-02 03:04:05.123456+00", "2024-01-02 03:04:05.123457+00"),
        ("d", "infinity", "5874897-12-31"),
        ("t", "24:00:00", "23:59:59.999999"),  # time through Delta's int64
        ("t", "00:00:00", None),
        ("tags", "{1,NULL}", "{1}"),
        ("tags", "{}", None),
        ("tags", "{1,2}", "{2,1}"),
        ("times", "{24:00:00}", "{00:00:00}"),
        ("b", "\\x", None),
        ("b", "\\x00ff", "\\x00fe"),
        ("iv", "1 day", "24:00:00"),  # not normalised, as in PostgreSQL
        ("doc", '{"a": 1}', '{"a": 2}'),
        ("f", "0.1", "0.10000000000000002"),
        ("f", "0", "-0"),
        ("f", "NaN", None),
        ("f", "Infinity", "NaN"),
        ("ok", "t", "f"),
        ("ok", "f", None),
        ("small", "0", None),
        ("small", "-32768", "32767"),
    ],
)
def test_exact_differences(column, pg, delta):
    r = compare(with_row(BASE, "1", **{column: pg}), with_row(BASE, "1", **{column: delta}))
    assert not r.equal and r.changed == 1
    (row,) = r.sample_changed
    assert [d.column for d in row.columns] == [column]
    assert (row.columns[0].postgres, row.columns[0].delta) == (pg, delta)


def test_several_columns_of_one_row():
    r = compare(BASE, with_row(BASE, "10", name="z", t="12:00:00.000001", tags="{4}"))
    (row,) = r.sample_changed
    assert [d.column for d in row.columns] == ["name", "t", "tags"]
    assert row.columns[1].postgres == "12:00:00" and row.columns[1].delta == "12:00:00.000001"


def test_samples_sorted_by_key_value_and_limited():
    rows = [(str(i), *BASE[0][1:]) for i in range(1, 26)]
    r = compare(rows, [], max_diffs=3)
    assert r.only_in_postgres == 25
    assert [k["id"] for k in r.sample_only_in_postgres] == ["1", "2", "3"]
    r = compare(rows, [(str(i), *BASE[0][1:]) for i in range(8, 12)], max_diffs=10)
    assert [k["id"] for k in r.sample_only_in_postgres] == ["1", "2", "3", "4", "5", "6", "7", "12", "13", "14"]
    assert compare(rows, [], max_diffs=0).sample_only_in_postgres == ()


def test_composite_key_with_text_and_null():
    cols = [PgColumn("a", B["text"]), PgColumn("b", B["int8"]), PgColumn("v", B["text"])]
    pg = table([("x", "1", "p"), ("x", "2", "q"), ("y,z", "1", "r")], cols)
    dl = table([("x", "1", "p"), ("x", "2", "Q"), ('y"', "1", "r")], cols)
    r = compare_tables(pg, dl, columns=cols, key=["a", "b"])
    assert r.sample_changed[0].key == {"a": "x", "b": "2"}
    assert r.sample_only_in_postgres == ({"a": "y,z", "b": "1"},)
    assert r.sample_only_in_delta == ({"a": 'y"', "b": "1"},)


def test_duplicate_keys_in_delta_are_a_difference():
    r = compare(BASE, BASE + [BASE[1]])
    assert not r.equal
    assert r.duplicate_keys_delta == 1 and r.duplicate_keys_postgres == 0
    assert r.sample_duplicates[0].key == {"id": "2"} and r.sample_duplicates[0].count == 2
    assert (r.only_in_postgres, r.only_in_delta, r.changed) == (0, 0, 0)  # the key is reported once


# --------------------------------------------------------------------------- schemas


def test_delta_only_column_is_a_note():
    dl = delta_form(table(BASE)).append_column("dropped", pa.array([None, "old", None, None], pa.string()))
    r = compare_tables(table(BASE), dl, columns=COLS, key=["id"])
    assert r.equal
    assert r.delta_only_columns == ("dropped",)


def test_source_column_missing_from_delta():
    dl = delta_form(table(BASE)).drop_columns(["doc"])
    r = compare_tables(table(BASE), dl, columns=COLS, key=["id"])
    assert not r.equal
    assert r.missing_in_delta == ("doc",) and "doc" not in r.compared_columns
    assert r.changed == 0


def test_decimal_scale_in_delta_is_a_type_mismatch():
    dl = delta_form(table(BASE))
    i = dl.schema.get_field_index("amount")
    dl = dl.set_column(i, "amount", dl.column(i).cast(pa.decimal128(14, 3)))
    r = compare_tables(table(BASE), dl, columns=COLS, key=["id"])
    assert not r.equal
    (m,) = r.type_mismatches
    assert (m.column, m.pg_type, m.expected, m.found) == ("amount", "numeric(12,2)", "decimal128(13, 2)", "decimal128(14, 3)")


def test_time_stored_as_time_in_delta_is_accepted_as_is():
    # a table written without the Delta mapping still compares (types equal)
    assert compare_tables(table(BASE), table(BASE), columns=COLS, key=["id"]).equal


def test_physical_variants_are_not_differences():
    dl = delta_form(table(BASE))
    for name, typ in (("name", pa.large_string()), ("b", pa.large_binary()), ("doc", pa.string_view())):
        i = dl.schema.get_field_index(name)
        dl = dl.set_column(i, name, dl.column(i).cast(typ))
    i = dl.schema.get_field_index("raw")
    dl = dl.set_column(i, "raw", dl.column(i).dictionary_encode())
    assert compare_tables(table(BASE), dl, columns=COLS, key=["id"]).equal


# --------------------------------------------------------------------------- keys


def test_key_errors():
    with pytest.raises(NoKey) as e:
        compare(BASE, BASE, key=())
    assert e.value.hint
    with pytest.raises(KeyColumnError, match="nope"):
        compare(BASE, BASE, key=("nope",))
    dl = delta_form(table(BASE)).drop_columns(["id"])
    with pytest.raises(KeyColumnError, match="missing from the Delta table"):
        compare_tables(table(BASE), dl, columns=COLS, key=["id"])


def test_split_key():
    assert split_key("a,b") == ["a", "b"]
    assert split_key(' a , "B,c" ') == ["a", "B,c"]
    assert split_key('"x""y",z') == ['x"y', "z"]


# --------------------------------------------------------------------------- delta_types


def test_delta_types_roundtrip():
    t = table(BASE)
    schema = to_delta_schema(t.schema)
    assert schema.field("t").type == pa.int64()
    assert schema.field("times").type == pa.list_(pa.int64())
    assert schema.field("ts").type == t.schema.field("ts").type
    assert schema.field("t").metadata == t.schema.field("t").metadata
    batch = to_delta_batch(t.to_batches()[0])
    assert batch.column(batch.schema.get_field_index("t")).to_pylist() == [86_400_000_000, 0, None, 43_200_000_000]
    for f in t.schema:
        back = from_delta_array(batch.column(f.name), f)
        assert back.type == f.type
        ref = t.column(f.name).combine_chunks()
        if pa.types.is_floating(f.type):  # NaN != NaN: compare the bits
            back, ref = back.view(pa.int64()), ref.view(pa.int64())
        assert back.equals(ref)
    # Delta's list field is called "element"; chunked arrays too
    arr = pa.chunked_array([pa.array([[1, None]], pa.list_(pa.field("element", pa.int64())))])
    assert from_delta_array(arr, t.schema.field("times")).type == pa.list_(pa.time64("us"))
    assert to_delta_type(pa.struct([("a", pa.time64("us"))])) == pa.struct([("a", pa.time64("us"))])


def test_from_delta_array_refuses_other_types():
    with pytest.raises(DeltaTypeMismatch):
        from_delta_array(pa.array([1.5]), pa.field("x", pa.decimal128(3, 1)))
    with pytest.raises(DeltaTypeMismatch):
        from_delta_array(pa.array(["00:00:00"]), pa.field("t", pa.time64("us")))
    with pytest.raises(DeltaTypeMismatch):
        from_delta_array(pa.array([1], pa.int32()), pa.field("t", pa.time64("us")))
    with pytest.raises(DeltaTypeMismatch):
        ts = pa.array([0], pa.int64()).view(pa.timestamp("us"))
        from_delta_array(ts, pa.field("ts", pa.timestamp("us", tz="UTC")))


def test_delta_types_imports_only_pyarrow():
    import ast
    import pathlib

    import airflow_pgcdc.lake.types as m

    tree = ast.parse(pathlib.Path(m.__file__).read_text())
    mods = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert mods <= {"pyarrow", "__future__"}


# --------------------------------------------------------------------------- reports


def result_of(comparison) -> VerifyResult:
    return VerifyResult(
        table="public.t", postgres="host=h user=u password=***", delta_url="s3://b/lake/public.t",
        key_source="primary key", comparison=comparison, postgres_lsn="0/16B3748", delta_version=3,
        delta_last_commit={
            "timestamp": "2025-01-01T00:00:00+00:00", "operation": "MERGE", "pgcdc.window_last": "4",
        },
    )


def test_report_json_and_text():
    c = compare(with_row(BASE[:3], "2", raw="1.50"), with_row(BASE[1:], "2", raw="1.5"))
    res = result_of(c)
    data = json.loads(json.dumps(res.to_dict()))
    assert data["result"] == "DIFFERENT" and data["equal"] is False
    assert data["counts"] == {
        "only_in_postgres": 1, "only_in_delta": 1, "changed": 1,
        "duplicate_keys_postgres": 0, "duplicate_keys_delta": 0,
    }
    assert data["changed"] == [{"key": {"id": "2"}, "columns": {"raw": {"postgres": "1.50", "delta": "1.5"}}}]
    text = render_report(res)
    assert text.startswith("DIFFERENT  public.t\n")
    assert "(s3://b/lake/public.t, version 3, last commit 2025-01-01T00:00:00+00:00 MERGE pgcdc.window_last=4)" in text
    assert "    raw: postgres 1.50 | delta 1.5" in text
    assert "only in PostgreSQL (1):\n  id=1" in text
    assert "only in Delta (1):\n  id=10" in text
    eq = render_report(result_of(compare(BASE, BASE)))
    assert eq.startswith("EQUAL  public.t\n") and "changed             0" in eq


def test_report_quotes_odd_values_and_null():
    c = compare(with_row(BASE, "1", name="a b"), with_row(BASE, "1", name=None))
    assert '    name: postgres "a b" | delta NULL' in render_report(result_of(c))


def test_long_values_are_cut():
    long = "x" * 5000
    c = compare(with_row(BASE, "1", name=long), BASE)
    d = c.sample_changed[0].columns[0]
    assert d.postgres == "x" * 1000 and d.postgres_chars == 5000 and d.delta_chars == 1
    assert d.to_dict() == {"postgres": "x" * 1000, "delta": "a", "postgres_chars": 5000}
    assert f'name: postgres "{"x" * 120}"… (5000 characters) | delta a' in render_report(result_of(c))


# --------------------------------------------------------------------------- local Delta tables


def test_delta_location_encoding():
    assert delta_table_location("s3://b/lake/", "my.schema", "a/b") == "s3://b/lake/my~2Eschema.a~2Fb"


def test_two_names_that_decode_alike_get_two_delta_tables_and_legacy_tables_are_followed(tmp_path):
    """delta-rs decodes a URL's ``%`` escapes: before, ``"a.b"."c"`` and ``"a"."b.c"`` were one
    Delta table (``a.b.c``). Now each has its own; a table an earlier version wrote at its
    legacy place is followed there unless another table shares that place."""
    import os

    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from airflow_pgcdc.lake.inspect import table_url
    from airflow_pgcdc.lake.tables import delta_table_url, legacy_delta_table_url

    root = tmp_path.as_uri()
    write_deltalake(delta_table_url(root, "a.b", "c"), pa.table({"x": [1]}))
    write_deltalake(delta_table_url(root, "a", "b.c"), pa.table({"x": [2, 3]}))
    assert sorted(os.listdir(tmp_path)) == ["a.b~2Ec", "a~2Eb.c"]
    assert DeltaTable(delta_table_url(root, "a.b", "c")).to_pyarrow_table().num_rows == 1
    assert DeltaTable(delta_table_url(root, "a", "b.c")).to_pyarrow_table().num_rows == 2

    old = tmp_path / "old"
    old.mkdir()
    legacy = legacy_delta_table_url(old.as_uri(), "my schema", "t")
    write_deltalake(legacy, pa.table({"x": [1]}))
    assert os.listdir(old) == ["my schema.t"]  # where delta-rs put it
    assert table_url(old.as_uri(), "my schema", "t", {}) == legacy  # followed there
    assert table_url(old.as_uri(), "my schema", "t", {}, shared=True) == delta_table_url(old.as_uri(), "my schema", "t")
    assert delta_table_location(old.as_uri(), "my schema", "t", storage_options={}) == legacy
    assert table_url(old.as_uri(), "other", "t", {}) == delta_table_url(old.as_uri(), "other", "t")


def test_open_missing_delta_table(tmp_path):
    with pytest.raises(DeltaTableNotFound) as e:
        open_delta_table(str(tmp_path), "public", "t")
    assert "public.t" in str(e.value) and e.value.hint


def test_local_delta_table_via_dataset_and_sql_engine(tmp_path):
    from deltalake import write_deltalake

    from airflow_pgcdc.verify.delta import _delta_batches, _delta_query

    data = delta_form(table(BASE))
    write_deltalake(
        delta_table_location(str(tmp_path), "public", "t"), data.replace_schema_metadata(None),
        configuration={"delta.dataSkippingNumIndexedCols": "0"},  # date sentinels break delta-rs stats
    )
    dt, _loc = open_delta_table(str(tmp_path), "public", "t")
    assert compare_tables(table(BASE), dt.to_pyarrow_dataset(), columns=COLS, key=["id"]).equal
    # the fallback for tables pyarrow datasets cannot read (deletion vectors)
    comparer = Comparer(COLS, ["id"], pa.schema(dt.schema().to_arrow()))
    comparer.add_postgres(table(BASE))
    for b in _delta_batches(_delta_query(dt, comparer.delta_columns), comparer.delta_columns):
        comparer.add_delta(b)
    assert comparer.result().equal


def test_nan_is_one_value_and_null_keys_match():
    import math
    import struct

    cols = [PgColumn("k", B["text"]), PgColumn("f", B["float8"])]
    other_nan = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000123))[0]
    assert math.isnan(other_nan)
    pg = pa.table({"k": pa.array(["a", None]), "f": pa.array([float("nan"), 1.0])}, schema=arrow_schema(cols))
    dl = pa.table({"k": pa.array(["a", None]), "f": pa.array([other_nan, 1.0])}, schema=arrow_schema(cols))
    r = compare_tables(pg, dl, columns=cols, key=["k"])
    assert r.equal  # PostgreSQL has one NaN; a NULL key (given --key) matches a NULL key


def test_sliced_and_chunked_inputs():
    pg = pa.concat_tables([table(BASE[:2]), table(BASE[2:])])
    dl = delta_form(table(BASE + BASE)).slice(4)
    assert compare_tables(pg, dl, columns=COLS, key=["id"]).equal
    assert compare_tables(table(BASE).slice(1), dl.slice(1), columns=COLS, key=["id"]).equal
    r = compare_tables(table(BASE).slice(1, 2), dl, columns=COLS, key=["id"])
    assert r.only_in_delta == 2 and r.changed == 0
