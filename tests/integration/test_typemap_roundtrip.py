"""The type map against real PostgreSQL 15 and 18: every type round-trips exactly.

One wide table holds edge values of every mapped type (NULLs, empty strings, quotes,
backslashes, newlines, unicode, NaN/±Infinity, ±infinity dates and timestamps, BC
dates, the extremes of each range, arrays with NULLs, empty and multi-dimensional
arrays, nested composites, ranges empty and unbounded...). Then, per column, the
Arrow values turned back into text with ``array_to_pg_text`` must equal PostgreSQL's
own output function (raw text-format results, which is also exactly what pgoutput
sends in text mode):

* snapshot path: real ``COPY … (FORMAT csv)`` output through ``SnapshotDecoder``, fed
  whole and in random small pieces with tiny blocks (row boundaries inside quoted
  newlines, sticky fallbacks);
* change-stream text path: the raw text values through ``TupleDecoder``;
* binary path: raw binary-format results (``typsend``, as pgoutput ``binary true``
  sends them) through ``TupleDecoder``, for every type that ``binary_supported`` says.

Set ``PGCDC_BENCH=1`` to also run the snapshot converter micro-benchmark.
"""

from __future__ import annotations

import os
import random
import subprocess
import time

import psycopg
import pyarrow as pa
import pytest
from psycopg import pq

from airflow_pgcdc.pg.catalog import load_table_columns, load_type_info
from airflow_pgcdc.protocol.pgtypes import BUILTIN_TYPES, PgColumn
from airflow_pgcdc.typemap.decode.copy_binary import (
    BINARY_COPY_OPTIONS,
    FUNCTION_CASTS_SQL,
    BinaryCopyDecoder,
    binary_select_list,
)
from airflow_pgcdc.typemap.decode.copy_text import SnapshotDecoder, copy_sql
from airflow_pgcdc.typemap.decode.tuples import TupleDecoder
from airflow_pgcdc.typemap.map import (
    UnrepresentableValue,
    ValueConversionError,
    array_to_pg_text,
    arrow_schema,
    binary_supported,
    session_setup_sql,
    to_pg_text,
)

SETUP = [
    "CREATE EXTENSION IF NOT EXISTS hstore",
    """CREATE TYPE mood AS ENUM ('sad', 'ok', 'with space', 'q"uote', 'NULL')""",
    "CREATE DOMAIN posint AS int4 CHECK (VALUE > 0)",
    "CREATE DOMAIN money2 AS numeric(7,3)",
    "CREATE DOMAIN money3 AS money2",
    "CREATE DOMAIN intarr AS int4[]",
    "CREATE TYPE pair AS (a int4, b text)",
    "CREATE TYPE outer_t AS (p pair, arr int4[], t text, ts timestamptz)",
    "CREATE TYPE floatrange AS RANGE (subtype = float8)",
]

# (column, SQL type, [SQL literals], minimum server major)
COLUMNS: list[tuple[str, str, list[str], int]] = [
    ("b", "bool", ["true", "false"], 15),
    ("i2", "int2", ["-32768", "32767", "0"], 15),
    ("i4", "int4", ["-2147483648", "2147483647", "0"], 15),
    ("i8", "int8", ["-9223372036854775808", "9223372036854775807", "0"], 15),
    ("f4", "float4", ["'NaN'", "'Infinity'", "'-Infinity'", "'-0'", "'1.1'", "'3.4028235e38'",
                      "'1e-45'", "'123456'", "'1234567'", "'0.0001'", "'0.00001'", "'1.5e-7'",
                      "'16777217'", "'0.3'"], 15),
    ("f8", "float8", ["'NaN'", "'Infinity'", "'-Infinity'", "'-0'", "'0.1'", "'1e308'",
                      "'5e-324'", "'123456789012345'", "'1234567890123456'", "'1e15'", "'1e-5'",
                      "'0.0001'", "pi()", "'2.2250738585072014e-308'", "'1e22'", "'9007199254740993'"], 15),
    ("n12", "numeric(12,2)", ["'NaN'", "0", "'-9999999999.99'", "'9999999999.99'", "'0.01'",
                              "'-0.01'", "'1.005'"], 15),
    ("n", "numeric", ["'NaN'", "'Infinity'", "'-Infinity'", "'1e-300'", "0", "'-0.000'",
                      "'123456789012345678901234567890.123456789012345678901234567890'",
                      "'1e100'"], 15),
    ("n38", "numeric(38,10)", ["'NaN'", "'1234567890123456789012345678.0123456789'"], 15),
    ("n37", "numeric(37,0)", ["'NaN'", "'9999999999999999999999999999999999999'",
                              "'-9999999999999999999999999999999999999'"], 15),
    ("nneg", "numeric(3,-2)", ["'NaN'", "1500", "-99900", "0"], 15),
    ("nsmall", "numeric(2,5)", ["'NaN'", "0.00012", "-0.00099", "0"], 15),
    ("t", "text", ["''", "'a\"b'", "'back\\slash'", "E'new\\nline'", "E'tab\\there'",
                   "'unicode ☃ é 𝄞'", "'NULL'", "'\\N'", "','", "E'\\r\\n'", "'\\.'",
                   "E'\\\\.'", "'\"'", "' '", "repeat('x', 5000)"], 15),
    ("vc", "varchar(5)", ["'abc'", "''", "'a,b\"'"], 15),
    ("bp", "char(5)", ["'ab'", "''", "'abcde'"], 15),
    ("nm", "name", ["'nm'", "''"], 15),
    ("ch", '"char"', ["'x'", "E'\\\\200'", "''"], 15),
    ("by", "bytea", ["'\\x'", "'\\x00ff10'", "decode('deadbeef', 'hex')", "'\\x5c22'",
                     "convert_to(repeat('ab', 3000), 'UTF8')"], 15),
    ("d", "date", ["'infinity'", "'-infinity'", "'2000-01-01'", "'0044-03-15 BC'",
                   "'4714-11-24 BC'", "'5874897-12-31'", "'1970-01-01'", "'2024-02-29'",
                   "'0001-01-01'", "'0001-12-31 BC'", "'10000-01-01'", "'1969-12-31'"], 15),
    ("tm", "time", ["'00:00:00'", "'24:00:00'", "'23:59:59.999999'", "'12:34:56.5'"], 15),
    ("tm3", "time(3)", ["'12:34:56.789'"], 15),
    ("ttz", "timetz", ["'00:00:00+00'", "'24:00:00-15:59'", "'12:34:56.789+05:30'",
                       "'01:02:03+00:00:01'", "'23:59:59.999999+15:59'"], 15),
    ("ts", "timestamp", ["'infinity'", "'-infinity'", "'2000-01-01 00:00:00'",
                         "'4714-11-24 00:00:00 BC'", "'294246-12-31 23:59:59.999999'",
                         "'0001-01-01 00:00:00 BC'", "'1969-12-31 23:59:59.999999'",
                         "'10000-01-01 00:00:00.000001'", "'0044-03-15 12:00:00.5 BC'",
                         "'2024-02-29 12:00:00.123456'"], 15),
    ("tstz", "timestamptz", ["'infinity'", "'-infinity'", "'2000-01-01 00:00:00+00'",
                             "'4714-11-24 00:00:00+00 BC'", "'294246-12-31 23:59:59.999999+00'",
                             "'0044-03-15 12:00:00+00 BC'", "'2024-06-01 12:00:00+05:30'",
                             "'1900-01-01 00:00:00 Europe/Amsterdam'", "'1970-01-01 00:00:00.000001+00'"], 15),
    ("iv", "interval", ["'0'", "'1 year 2 mons 3 days 04:05:06.789'", "'-1 year -2 mons +3 days -04:05:06'",
                        "'1 mon'", "'-1 days'", "'178000000 years'", "'-178000000 years'",
                        "'2562047788 hours 54.775807 seconds'", "'-2562047788 hours -54.775808 seconds'",
                        "'1 day -00:00:01'", "'-1 mon 1 day'", "'0.000001 seconds'", "'1 year'",
                        "'-1 year'", "'13 mons'", "'25 hours'"], 15),
    ("iv_inf", "interval", ["'infinity'", "'-infinity'"], 17),
    ("u", "uuid", ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "'00000000-0000-0000-0000-000000000000'",
                   "'FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF'"], 15),
    ("js", "json", ["'{\"a\": [1, 2.50, \"x\"]}'", "'\"str\"'", "'null'", "'  {\"a\":1}  '"], 15),
    ("jb", "jsonb", ["'{\"b\": 1, \"a\": [1, 2.50]}'", "'[]'", "'\"\\u00e9\"'", "'null'"], 15),
    ("ai", "int4[]", ["'{}'", "'{1,NULL,3}'", "'{NULL}'", "'{-2147483648}'"], 15),
    ("at", "text[]", ["'{}'", "ARRAY['', NULL, 'NULL', 'null', 'a,b', 'q\"x', 'b\\s', 'sp ace', '{}', E'new\\nline', 'é']",
                      "'{plain,words}'"], 15),
    ("aii", "int4[][]", ["'{{1,2},{3,NULL}}'", "'{}'", "'{{1}}'"], 15),
    ("an", "numeric(5,2)[]", ["'{NaN,1.50,NULL}'", "'{}'"], 15),
    ("atz", "timestamptz[]", ["'{infinity,\"2024-01-01 00:00:00+00\",NULL,-infinity}'",
                              "ARRAY['0044-03-15 12:00:00+00 BC'::timestamptz]"], 15),
    ("ad", "date[]", ["'{-infinity,\"0044-03-15 BC\",2020-01-01}'"], 15),
    ("aby", "bytea[]", ["ARRAY['\\x00'::bytea, NULL, '\\x']"], 15),
    ("ab", "bool[]", ["'{t,f,NULL}'"], 15),
    ("af", "float8[]", ["'{NaN,Infinity,-0,1e-300}'"], 15),
    ("au", "uuid[]", ["'{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11,NULL}'"], 15),
    ("ajb", "jsonb[]", ["ARRAY['{\"a\": \"b c\"}'::jsonb, '1']"], 15),
    ("aiv", "interval[]", ["ARRAY['1 day'::interval, '-00:00:01', NULL]"], 15),
    ("abox", "box[]", ["'{(1,1),(0,0);(2,2),(1,1)}'"], 15),
    ("aint", "inet[]", ["'{10.0.0.1/8,::1}'"], 15),
    ("amood", "mood[]", ["ARRAY['sad', 'with space', 'NULL']::mood[]"], 15),
    ("apair", "pair[]", ["ARRAY[ROW(1, 'x y')::pair, NULL, ROW(NULL, '')::pair]"], 15),
    ("ach", "char(3)[]", ["ARRAY['a'::char(3), 'abc']"], 15),
    ("e", "mood", ["'sad'", "'with space'", "'q\"uote'", "'NULL'"], 15),
    ("dpos", "posint", ["1", "2147483647"], 15),
    ("dnum", "money2", ["'NaN'", "'1234.567'"], 15),
    ("dnum2", "money3", ["'NaN'", "'-1234.5'"], 15),
    ("darr", "intarr", ["'{1,2,NULL}'", "'{}'"], 15),
    ("inet", "inet", ["'192.168.0.1/24'", "'::1'", "'10.0.0.1'"], 15),
    ("cidr", "cidr", ["'10.0.0.0/8'", "'2001:db8::/32'"], 15),
    ("mac", "macaddr", ["'08:00:2b:01:02:03'"], 15),
    ("mac8", "macaddr8", ["'08:00:2b:01:02:03:04:05'"], 15),
    ("mon", "money", ["'12.34'", "'-1000000.5'", "0"], 15),
    ("bit", "bit(8)", ["B'10101010'"], 15),
    ("vbit", "varbit", ["B'1'", "B''"], 15),
    ("o", "oid", ["0", "4294967295"], 15),
    ("i4r", "int4range", ["'empty'", "'[1,5)'", "'(,)'", "'[1,)'"], 15),
    ("nr", "numrange", ["'(1.5,2.5]'", "'[NaN,NaN]'"], 15),
    ("tzr", "tstzrange", ["'[-infinity,infinity)'", "'[2020-01-01 00:00:00+00,)'", "'empty'"], 15),
    ("dr", "daterange", ["'[2020-01-01,)'"], 15),
    ("fr", "floatrange", ["'[1.5,2.5)'", "'(,)'"], 15),
    ("mr", "int4multirange", ["'{[1,3),[5,7)}'", "'{}'"], 15),
    ("cp", "pair", ["ROW(1, 'x y')", "ROW(NULL, NULL)", "ROW(0, '')", "ROW(-1, 'q\"uote\\b,(x)')"], 15),
    ("cpo", "outer_t", ["ROW(ROW(2, 'a b'), '{1,2}', 'a,b', 'infinity')", "ROW(NULL, '{}', NULL, NULL)"], 15),
    ("hs", "hstore", ["'a=>1, \"b c\"=>NULL'", "''"], 15),
    ("pt", "point", ["'(1,2)'", "'(1.5e300,-0)'"], 15),
    ("ln", "line", ["'{1,2,3}'"], 15),
    ("ls", "lseg", ["'[(0,0),(1,1)]'"], 15),
    ("bx", "box", ["'(2,2),(1,1)'"], 15),
    ("pth", "path", ["'[(0,0),(1,1)]'", "'((0,0),(1,1),(2,0))'"], 15),
    ("pg", "polygon", ["'((0,0),(1,1),(2,0))'"], 15),
    ("ci", "circle", ["'<(0,0),1>'"], 15),
    ("tv", "tsvector", ["'a fat cat'"], 15),
    ("lsn", "pg_lsn", ["'16/B374D848'"], 15),
    ("x8", "xid8", ["'18446744073709551615'"], 15),
]


def _connect(dsn: str) -> psycopg.Connection:
    conn = psycopg.connect(dsn, autocommit=True)
    for stmt in session_setup_sql():
        conn.execute(stmt)
    return conn


def _raw(conn: psycopg.Connection, sql: str, fmt: int) -> list[list[bytes | None]]:
    res = conn.pgconn.exec_params(sql.encode(), [], result_format=fmt)
    if res.status != pq.ExecStatus.TUPLES_OK:
        raise AssertionError(res.error_message.decode())
    return [[res.get_value(r, c) for c in range(res.nfields)] for r in range(res.ntuples)]


def _make_table(conn: psycopg.Connection, major: int) -> tuple[list[PgColumn], int]:
    for stmt in SETUP:
        conn.execute(stmt)
    cols = [(n, t, v) for n, t, v, m in COLUMNS if major >= m]
    try:  # the embedded PostgreSQL 18 is built without libxml
        conn.execute("SELECT '<a/>'::xml")
        cols.append(("x", "xml", ["'<a>x &amp; y</a>'", "'text only'", "'<?xml version=\"1.0\"?><r/>'"]))
    except psycopg.errors.FeatureNotSupported:
        pass
    conn.execute(
        "CREATE TABLE everything (id int4 PRIMARY KEY, "
        + ", ".join(f"{n} {t}" for n, t, _ in cols) + ")"
    )
    nrows = max(len(v) for _, _, v in cols) + 1  # the last row is all NULLs
    for r in range(nrows):
        values = [v[r] if r < len(v) else "NULL" for _, _, v in cols]
        conn.execute(f"INSERT INTO everything VALUES ({r}, {', '.join(values)})")
    columns = load_table_columns(conn, "public", "everything")
    return columns, nrows


def _expected_text(conn: psycopg.Connection, columns: list[PgColumn]) -> list[list[str | None]]:
    names = ", ".join(f'"{c.name}"' for c in columns)
    rows = _raw(conn, f"SELECT {names} FROM everything ORDER BY id", 0)
    return [[None if v is None else v.decode() for v in col] for col in zip(*rows, strict=True)]


def _compare(label: str, columns, arrays, expected) -> None:
    problems = []
    for col, arr, exp in zip(columns, arrays, expected, strict=True):
        got = array_to_pg_text(arr, col)
        for r, (g, e) in enumerate(zip(got, exp, strict=True)):
            if g != e:
                problems.append(f"{col.name} row {r}: got {g!r}, PostgreSQL says {e!r}")
    assert not problems, f"{label}: {len(problems)} mismatches:\n" + "\n".join(problems[:40])


def test_every_type_round_trips(fresh_db) -> None:
    with _connect(fresh_db) as conn:
        major = conn.info.server_version // 10000
        columns, nrows = _make_table(conn, major)
        expected = _expected_text(conn, columns)
        schema = arrow_schema(columns)

        # the catalog agrees with the built-in table, and the metadata names the types
        for c in columns:
            if c.type.oid in BUILTIN_TYPES:
                assert c.type == BUILTIN_TYPES[c.type.oid], c.name
        by_name = {c.name: c for c in columns}
        assert by_name["aii"].ndims == 2
        assert schema.field("n12").metadata[b"pg_type"] == b"numeric(12,2)"
        assert schema.field("n12").type == pa.decimal128(13, 2)
        assert schema.field("n38").type == pa.string()
        assert schema.field("n37").type == pa.decimal128(38, 0)
        assert schema.field("nneg").type == pa.decimal128(6, 0)
        assert schema.field("nsmall").type == pa.decimal128(6, 5)
        assert schema.field("dnum").type == pa.decimal128(8, 3)
        assert schema.field("dnum2").metadata[b"pg_base_type"] == b"numeric(7,3)"
        assert schema.field("aii").type == pa.list_(pa.list_(pa.int32()))
        assert schema.field("darr").type == pa.list_(pa.int32())
        assert schema.field("dpos").type == pa.int32()
        assert schema.field("e").metadata[b"pg_type"] == b"public.mood"
        assert schema.field("tstz").type == pa.timestamp("us", "UTC")

        # snapshot path: real COPY CSV output, whole
        data = bytearray()
        with conn.cursor() as cur:
            with cur.copy(copy_sql("public", "everything", columns)) as copy:
                for chunk in copy:
                    data += chunk
        rows_order = [int(r[0]) for r in _raw(conn, "SELECT id FROM everything", 0)]
        assert rows_order == sorted(rows_order)  # a fresh heap: physical order is id order
        table = SnapshotDecoder(columns, table="public.everything").decode_all(bytes(data))
        assert table.schema == schema
        assert table.num_rows == nrows
        _compare("snapshot", columns, table.columns, expected)

        # ... and in random small pieces with tiny blocks (cuts inside quoted newlines)
        rnd = random.Random(7)
        dec = SnapshotDecoder(columns, table="public.everything", block_bytes=200)
        batches, pos = [], 0
        while pos < len(data):
            step = rnd.randint(1, 300)
            batches += dec.feed(bytes(data[pos : pos + step]))
            pos += step
        batches += dec.finish()
        assert dec.rows == nrows and dec.bytes == len(data)
        pieces = pa.Table.from_batches(batches, schema=schema)
        _compare("snapshot in pieces", columns, pieces.columns, expected)

        # snapshot path, binary COPY: native binary columns and the others as text, in
        # blocks of a few rows (every CopyData message is one row: its length is known)
        function_casts = frozenset(r[0] for r in conn.execute(FUNCTION_CASTS_SQL))
        bin_dec = BinaryCopyDecoder(columns, table="public.everything", block_bytes=300)
        select = binary_select_list(columns, bin_dec.codecs, function_casts)
        assert '"inet"::pg_catalog.text' not in select and "format('%s', \"inet\")" in select
        assert '"i8"' in select and '"i8"::' not in select and '"bp"::' not in select
        messages = []
        with conn.cursor() as cur:
            with cur.copy(f"COPY (SELECT {select} FROM everything) TO STDOUT {BINARY_COPY_OPTIONS}") as copy:
                messages = [bytes(m) for m in copy]
        batches = []
        for k in range(0, len(messages), 2):  # two messages per feed, as a socket read might give
            pair = messages[k : k + 2]
            batches += bin_dec.feed(b"".join(pair), [len(m) for m in pair])
        batches += bin_dec.finish()
        assert bin_dec.rows == nrows and len(batches) > 1
        binary_table = pa.Table.from_batches(batches, schema=schema)
        assert binary_table.schema == schema
        _compare("snapshot binary", columns, binary_table.columns, expected)
        native = {c.name for c, k in zip(columns, bin_dec.kinds, strict=True) if k}
        for must in ("b", "i2", "i4", "i8", "f4", "f8", "t", "vc", "bp", "nm", "by", "d", "tm", "ts", "tstz",
                     "js", "e", "dpos", "o"):
            assert must in native, must

        # change-stream path: pgoutput text values are the output functions' text
        text_rows = [tuple(col[r] for col in expected) for r in range(nrows)]
        decoded = TupleDecoder(columns, table="public.everything").decode(text_rows)
        assert decoded.batch.schema == schema
        _compare("stream text", columns, decoded.batch.columns, expected)
        # single-row batches agree too (the drain may flush a row at a time)
        one = TupleDecoder(columns).decode(text_rows[1:2])
        _compare("stream one row", columns, one.batch.columns, [[e[1]] for e in expected])

        # binary path: typsend output, for every type that supports it
        bin_cols = [c for c in columns if binary_supported(c)]
        names = ", ".join(f'"{c.name}"' for c in bin_cols)
        raw = _raw(conn, f"SELECT {names} FROM everything ORDER BY id", 1)
        bdec = TupleDecoder(bin_cols).decode([tuple(r) for r in raw])
        index = {c.name: i for i, c in enumerate(columns)}
        _compare("stream binary", bin_cols, bdec.batch.columns, [expected[index[c.name]] for c in bin_cols])
        supported = {c.name for c in bin_cols}
        for must in ("b", "i2", "i4", "i8", "f4", "f8", "n12", "n", "t", "by", "d", "ts", "tstz", "u",
                     "tm", "iv", "ai", "at", "atz", "e", "dpos", "dnum", "jb", "js", "darr"):
            assert must in supported, must

        # scalar inverse
        assert to_pg_text(table.column("tstz")[0], by_name["tstz"]) == "infinity"
        assert to_pg_text(table.column("n12")[0], by_name["n12"]) == "NaN"


def test_real_pgoutput_stream_decodes(fresh_db, slot_name) -> None:
    """The stream path on what real walsenders send, text and binary mode: Relation
    message → ``columns_from_relation`` (+ catalog types) → ``TupleDecoder``."""
    from pgoutput_capture import bench as make_bench

    from airflow_pgcdc.protocol import pgoutput as po
    from airflow_pgcdc.typemap.map import columns_from_relation

    with make_bench(fresh_db, slot_name()) as b:
        b.setup()
        conn = b.sql
        for stmt in session_setup_sql():
            conn.execute(stmt)
        columns, nrows = _make_table(conn, b.major)
        expected = _expected_text(conn, columns)
        types = load_type_info(conn, {c.type.oid for c in columns})
        ndims = {c.name: c.ndims for c in columns}
        for binary in (False, True):
            cap = b.read(binary=binary)
            rel = [m for m in cap.of(po.Relation) if m.relation_name == "everything"][-1]
            cols = columns_from_relation(rel, types, ndims=ndims)
            assert cols == columns
            rows = [m.new for m in cap.of(po.Insert) if m.relation_oid == rel.relation_oid]
            assert len(rows) == nrows
            if not binary:
                out = TupleDecoder(cols, table="public.everything").decode(rows)
                _compare("pgoutput text", cols, out.batch.columns, expected)
                continue
            keep = [i for i, c in enumerate(cols) if binary_supported(c)]
            sub = [cols[i] for i in keep]
            out = TupleDecoder(sub).decode([tuple(r[i] for i in keep) for r in rows])
            assert all(isinstance(r[i], bytes) for r in rows for i in keep if r[i] is not None)
            _compare("pgoutput binary", sub, out.batch.columns, [expected[i] for i in keep])


def test_parquet_round_trip_keeps_sentinels(fresh_db, tmp_path) -> None:
    """What the snapshot writes (Parquet) reads back to the same PostgreSQL text."""
    import pyarrow.parquet as pq_

    with _connect(fresh_db) as conn:
        major = conn.info.server_version // 10000
        columns, _ = _make_table(conn, major)
        expected = _expected_text(conn, columns)
        data = bytearray()
        with conn.cursor() as cur:
            with cur.copy(copy_sql("public", "everything", columns)) as copy:
                for chunk in copy:
                    data += chunk
    table = SnapshotDecoder(columns).decode_all(bytes(data))
    pq_.write_table(table, tmp_path / "t.parquet")
    back = pq_.read_table(tmp_path / "t.parquet")
    assert back.schema.field("n12").metadata[b"pg_type"] == b"numeric(12,2)"
    _compare("parquet", columns, back.columns, expected)


def test_unrepresentable_values_raise_typed_errors(fresh_db) -> None:
    with _connect(fresh_db) as conn:
        conn.execute(
            "CREATE TABLE odd (id int4, ts timestamp, tstz timestamptz, a int4[], "
            "a_text int4[], b int4[], n numeric(5,2))"
        )
        conn.execute(
            "INSERT INTO odd VALUES "
            "(0, '2000-01-01', '2000-01-01+00', '{1}', '[0:1]={1,2}', '{{1,2}}', 1.5), "
            "(1, '294276-12-31 23:59:59.999999', '294276-12-31 23:59:59.999999+00', "
            "'[0:1]={1,2}', '[-5:-5]={7}', '{1}', 'NaN')"
        )
        columns = load_table_columns(conn, "public", "odd")
        columns = [PgColumn(c.name, c.type, c.typmod, c.ndims, as_text=c.name == "a_text") for c in columns]
        by = {c.name: i for i, c in enumerate(columns)}
        expected = _expected_text_from(conn, "odd", columns)

        data = bytearray()
        with conn.cursor() as cur:
            with cur.copy(copy_sql("public", "odd", columns)) as copy:
                for chunk in copy:
                    data += chunk

        # one column at a time: the error names table, column, type and row
        for name, needle in (("ts", "timestamp"), ("tstz", "timestamptz"), ("a", "int4[]"), ("b", "int4[]")):
            cols = [columns[by["id"]], columns[by[name]]]
            with conn.cursor() as cur:
                sub = bytearray()
                with cur.copy(copy_sql("public", "odd", cols)) as copy:
                    for chunk in copy:
                        sub += chunk
            with pytest.raises(UnrepresentableValue) as info:
                SnapshotDecoder(cols, table="public.odd").decode_all(bytes(sub))
            err = info.value
            assert err.table == "public.odd" and err.column == name and err.pg_type == needle
            assert err.row == (0 if name == "b" else 1)
            assert name in str(err) and "row" in str(err)
            # same error on the stream path, text and binary
            with pytest.raises(UnrepresentableValue):
                TupleDecoder(cols, table="public.odd").decode(
                    [tuple(v) for v in zip(*_expected_text_from(conn, "odd", cols), strict=True)]
                )
            raw = _raw(conn, f'SELECT id, "{name}" FROM odd ORDER BY id', 1)
            with pytest.raises(UnrepresentableValue):
                TupleDecoder(cols, table="public.odd").decode([tuple(r) for r in raw])

        # as_text keeps non-default lower bounds exactly
        keep = [columns[by["id"]], columns[by["a_text"]], columns[by["n"]]]
        with conn.cursor() as cur:
            sub = bytearray()
            with cur.copy(copy_sql("public", "odd", keep)) as copy:
                for chunk in copy:
                    sub += chunk
        t = SnapshotDecoder(keep).decode_all(bytes(sub))
        assert t.column("a_text").to_pylist() == ["[0:1]={1,2}", "[-5:-5]={7}"]
        assert array_to_pg_text(t.column("n"), keep[2]) == ["1.50", "NaN"]
        assert expected[by["a_text"]] == ["[0:1]={1,2}", "[-5:-5]={7}"]
        raw = _raw(conn, "SELECT id, a_text, n FROM odd ORDER BY id", 1)
        tb = TupleDecoder(keep).decode([tuple(r) for r in raw]).batch
        assert tb.column(1).to_pylist() == ["[0:1]={1,2}", "[-5:-5]={7}"]

        # a bad value (not PostgreSQL output) is a ValueConversionError, never ArrowInvalid
        with pytest.raises(ValueConversionError) as info:
            TupleDecoder(columns[:1], table="public.odd").decode([("1",), ("x",)], row_offset=10)
        assert info.value.row == 11 and info.value.column == "id"


def _expected_text_from(conn, table: str, columns) -> list[list[str | None]]:
    names = ", ".join(f'"{c.name}"' for c in columns)
    rows = _raw(conn, f"SELECT {names} FROM {table} ORDER BY id", 0)
    return [[None if v is None else v.decode() for v in col] for col in zip(*rows, strict=True)]


def test_load_type_info_resolves_user_types(fresh_db) -> None:
    with _connect(fresh_db) as conn:
        for stmt in SETUP:
            conn.execute(stmt)
        oids = dict(conn.execute(
            "SELECT typname::text, oid::int8 FROM pg_type WHERE typname = ANY(%s)",
            (["mood", "posint", "money3", "intarr", "pair", "outer_t", "floatrange", "_pair",
              "floatmultirange", "hstore"],),
        ).fetchall())
        info = load_type_info(conn, oids.values())
        mood = info[oids["mood"]]
        assert mood.kind == "e" and mood.labels == ("sad", "ok", "with space", 'q"uote', "NULL")
        assert info[oids["posint"]].base == BUILTIN_TYPES[23]
        m3 = info[oids["money3"]]
        assert m3.base.name == "numeric" and m3.base_typmod == ((7 << 16) | 3) + 4
        assert info[oids["intarr"]].base == BUILTIN_TYPES[1007]
        outer = info[oids["outer_t"]]
        assert [a.name for a in outer.attributes] == ["p", "arr", "t", "ts"]
        assert outer.attributes[0].type == info[oids["pair"]]
        assert outer.attributes[1].type == BUILTIN_TYPES[1007]
        assert info[oids["_pair"]].element == info[oids["pair"]]
        assert info[oids["floatrange"]].subtype == BUILTIN_TYPES[701]
        assert info[oids["floatmultirange"]].range == info[oids["floatrange"]]
        assert info[oids["hstore"]].kind == "b" and not info[oids["hstore"]].is_builtin
        assert load_type_info(conn, []) == {}
        from airflow_pgcdc.pg.catalog import TypeNotFound

        with pytest.raises(TypeNotFound):
            load_type_info(conn, [4_000_000_000])
        with pytest.raises(TypeNotFound):
            load_table_columns(conn, "public", 'no"such')


# --------------------------------------------------------------------------- benchmark


@pytest.mark.skipif(not os.environ.get("PGCDC_BENCH"), reason="set PGCDC_BENCH=1 to run the benchmark")
def test_snapshot_converter_speed(fresh_db, capsys) -> None:
    """1M rows × (int8, int4, text, numeric(12,2), timestamptz, bool, float8, date):
    raw COPY (psql > /dev/null) vs the converter on the same COPY output."""
    rows = int(os.environ.get("PGCDC_BENCH_ROWS", "1000000"))
    with _connect(fresh_db) as conn:
        conn.execute(
            "CREATE TABLE bench AS SELECT i::int8 AS a, (i % 100000)::int4 AS b, "
            "md5(i::text) || CASE WHEN i % 10 = 0 THEN ' x,y' ELSE '' END AS c, "
            "(i * 1.37)::numeric(12,2) AS d, timestamptz '2020-01-01' + i * interval '1.234567 second' AS e, "
            "i % 3 = 0 AS f, i * 0.123456789::float8 AS g, date '2000-01-01' + (i % 10000) AS h "
            f"FROM generate_series(1, {rows}) i"
        )
        conn.execute("VACUUM ANALYZE bench")
        columns = load_table_columns(conn, "public", "bench")
        sql = copy_sql("public", "bench", columns)
        psql = fresh_db.server.bin_dir / "psql"
        env = dict(os.environ, PGOPTIONS="-c TimeZone=UTC")
        t0 = time.perf_counter()
        subprocess.run([str(psql), fresh_db.socket_dsn, "-c", "COPY bench TO STDOUT"],
                       stdout=subprocess.DEVNULL, check=True, env=env)
        raw_copy = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = subprocess.run([str(psql), fresh_db.socket_dsn, "-c", sql],
                             stdout=subprocess.PIPE, check=True, env=env).stdout
        csv_copy = time.perf_counter() - t0
        def decode(use_threads: bool) -> float:
            best = None
            for _ in range(3):
                dec = SnapshotDecoder(columns, table="bench", use_threads=use_threads)
                t0 = time.perf_counter()
                c0 = time.process_time()
                n = 0
                step = 1 << 16
                for i in range(0, len(out), step):
                    for b in dec.feed(out[i : i + step]):
                        n += b.num_rows
                for b in dec.finish():
                    n += b.num_rows
                took = time.perf_counter() - t0
                cpu.append(time.process_time() - c0)
                best = took if best is None else min(best, took)
                assert n == rows
            return best

        cpu: list[float] = []

        best = decode(False)
        threaded = decode(True)
        # end to end in one Python thread: psycopg COPY messages (one per row) fed as they come
        t0 = time.perf_counter()
        with conn.cursor() as cur, cur.copy(sql) as copy:
            for _data in copy:
                pass
        psycopg_copy = time.perf_counter() - t0
        t0 = time.perf_counter()
        dec = SnapshotDecoder(columns, table="bench")
        with conn.cursor() as cur, cur.copy(sql) as copy:
            n = sum(b.num_rows for b in dec.decode_stream(copy))
        end_to_end = time.perf_counter() - t0
        assert n == rows
        with capsys.disabled():
            print(
                f"\n[typemap bench] {rows:,} rows, {len(out) / 1e6:.1f} MB CSV\n"
                f"  raw COPY t TO STDOUT (psql > /dev/null)      {raw_copy:.2f}s\n"
                f"  COPY (SELECT ...) CSV (psql > /dev/null)      {csv_copy:.2f}s\n"
                f"  converter on the captured CSV, 1 thread       {best:.2f}s = {rows / best:,.0f} rows/s, "
                f"{len(out) / best / 1e6:.0f} MB/s, {best / raw_copy:.2f}x raw COPY "
                f"(CPU {min(cpu[:3]):.2f}s)\n"
                f"  converter, use_threads=True                   {threaded:.2f}s\n"
                f"  psycopg COPY, messages discarded              {psycopg_copy:.2f}s\n"
                f"  psycopg COPY + converter, one thread          {end_to_end:.2f}s = "
                f"{end_to_end / raw_copy:.2f}x raw COPY"
            )
