"""``pgcdc verify`` against real PostgreSQL 15/18 and the S3 server: a Delta table built
from the table through the snapshot path starts EQUAL; after an update, a delete, an
insert and a dropped column it reports exactly those keys; the errors a user meets."""

from __future__ import annotations

import json

import psycopg
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from airflow_pgcdc.cli import main
from airflow_pgcdc.lake.types import to_delta_batch, to_delta_schema
from airflow_pgcdc.pg.conninfo import parse_conninfo
from airflow_pgcdc.pg.tables import describe_table
from airflow_pgcdc.snapshot.convert import SESSION_SETUP, table_converter
from airflow_pgcdc.store.s3 import delta_storage_options
from airflow_pgcdc.verify import delta_table_location, verify_table

TABLE_SQL = """
CREATE SCHEMA shop;
CREATE TABLE shop."Orders" (
    id int PRIMARY KEY,
    name text,
    amount numeric(12,2),
    at timestamptz,
    day date,
    clock time,
    doc jsonb,
    tags int[],
    blob bytea,
    ref uuid,
    extra text
);
INSERT INTO shop."Orders"
SELECT i, 'name ' || i, i * 1.25, '2024-01-01 00:00:00+00'::timestamptz + i * interval '1 hour',
       '2024-01-01'::date + i, '00:00:00'::time + i * interval '1 minute',
       jsonb_build_object('i', i), ARRAY[i, NULL, i + 1], decode(lpad(to_hex(i), 4, '0'), 'hex'),
       md5(i::text)::uuid, 'x'
FROM generate_series(1, 300) i;
INSERT INTO shop."Orders" VALUES
    (1001, '', 'NaN', 'infinity', 'infinity', '24:00:00', '{"a": [1, 2.50]}', '{}', '\\x', NULL, NULL),
    (1002, NULL, -0.01, '-infinity', '-infinity', '23:59:59.999999', 'null', NULL, NULL,
     'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', NULL),
    (1003, 'é "q", x', NULL, '0044-03-15 12:00:00+00 BC', '0001-01-01 BC', NULL, NULL, '{NULL}', '\\x00', NULL, NULL);
"""


def sql(dsn, query, params=None):
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(query, params)


def build_delta(dsn: str, delta_root: str, schema: str, table: str) -> None:
    """The Delta table as the merge would bootstrap it: the rows read through the
    snapshot path (COPY → type map), in Delta form, written with delta-rs."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in SESSION_SETUP:
            conn.execute(stmt)
        info = describe_table(conn, schema, table)
        conv = table_converter(conn, info)
        decoder = conv.decoder()
        with conn.cursor().copy(
            f"COPY (SELECT {conv.select_list} FROM {info.qualified}) TO STDOUT {conv.copy_options}"
        ) as copy:
            batches = [to_delta_batch(b) for b in decoder.decode_stream(copy)]
    data = pa.Table.from_batches(batches, schema=to_delta_schema(conv.schema))
    write_deltalake(
        delta_table_location(delta_root, schema, table),
        data,
        storage_options=delta_storage_options(),
        # delta-rs' file statistics panic on the date ±infinity sentinels (docs/types.md)
        configuration={"delta.dataSkippingNumIndexedCols": "0"},
    )


@pytest.fixture
def lake(s3, s3_bucket, monkeypatch):
    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    return f"s3://{s3_bucket}/lake"


def run(capsys, *argv):
    code = main(["verify", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_verify_equal_then_exactly_the_changed_keys(fresh_db, lake, capsys):
    password = parse_conninfo(fresh_db).get("password")
    sql(fresh_db, TABLE_SQL)
    build_delta(fresh_db, lake, "shop", "Orders")
    table_arg = 'shop."Orders"'

    code, out, err = run(capsys, "--dsn", fresh_db, "--delta", lake, "--table", table_arg)
    assert code == 0, out + err
    assert out.startswith('EQUAL  shop.Orders\n')
    assert "303 rows" in out and "id (primary key); 11 columns compared" in out
    assert "only in PostgreSQL  0" in out and "changed             0" in out

    sql(fresh_db, """
        UPDATE shop."Orders" SET amount = 2.51 WHERE id = 2;
        UPDATE shop."Orders" SET clock = '23:59:59' WHERE id = 1001;
        DELETE FROM shop."Orders" WHERE id = 7;
        INSERT INTO shop."Orders" (id, name) VALUES (2000, 'new');
        ALTER TABLE shop."Orders" DROP COLUMN extra;
    """)
    code, out, err = run(capsys, "--dsn", fresh_db, "--delta", lake, "--table", table_arg, "--json")
    assert code == 1, out + err
    report = json.loads(out)
    assert report["result"] == "DIFFERENT"
    assert report["postgres"]["rows"] == 303 and report["delta"]["rows"] == 303
    assert report["counts"] == {
        "only_in_postgres": 1, "only_in_delta": 1, "changed": 2,
        "duplicate_keys_postgres": 0, "duplicate_keys_delta": 0,
    }
    assert report["only_in_postgres"] == [{"id": "2000"}]
    assert report["only_in_delta"] == [{"id": "7"}]
    assert report["changed"] == [
        {"key": {"id": "2"}, "columns": {"amount": {"postgres": "2.51", "delta": "2.50"}}},
        {"key": {"id": "1001"}, "columns": {"clock": {"postgres": "23:59:59", "delta": "24:00:00"}}},
    ]
    assert report["schema"] == {"missing_in_delta": [], "type_mismatches": [], "delta_only_columns": ["extra"]}
    assert report["delta"]["version"] == 0 and report["delta"]["last_commit"]["operation"] == "WRITE"
    assert report["postgres"]["lsn"]

    code, out, err = run(capsys, "--dsn", fresh_db, "--delta", lake, "--table", table_arg, "--max-diffs", "1")
    assert code == 1
    assert out.startswith("DIFFERENT  shop.Orders\n")
    assert "changed (2, first 1):\n  id=2\n    amount: postgres 2.51 | delta 2.50\n" in out
    assert "note: columns only in Delta (not compared; dropped in PostgreSQL?): extra" in out
    assert password and password not in out + err


def test_verify_errors_and_given_key(fresh_db, lake, capsys):
    password = parse_conninfo(fresh_db).get("password")
    sql(fresh_db, "CREATE TABLE nokey (a int, b text, v numeric); "
                  "INSERT INTO nokey VALUES (1, 'x', 1.50), (1, 'y', 2), (2, 'x', NULL)")
    build_delta(fresh_db, lake, "public", "nokey")

    # no key and none given: compared as a multiset (every column, equal rows by count)
    code, out, err = run(capsys, "--dsn", fresh_db, "--delta", lake, "--table", "nokey")
    assert code == 0 and out.startswith("EQUAL"), out + err
    sql(fresh_db, "INSERT INTO nokey VALUES (1, 'x', 1.50)")  # a second copy of a row
    code, out, err = run(capsys, "--dsn", fresh_db, "--delta", lake, "--table", "nokey")
    assert code == 1 and out.startswith("DIFFERENT"), out + err
    sql(fresh_db, "DELETE FROM nokey WHERE ctid = (SELECT ctid FROM nokey WHERE b = 'x' AND a = 1 LIMIT 1)")

    code, out, err = run(capsys, "--dsn", fresh_db, "--delta", lake, "--table", "nokey", "--key", "a,b")
    assert code == 0, out + err
    assert "key       a, b (given)" in out

    code, out, err = run(capsys, "--dsn", fresh_db, "--delta", lake, "--table", "nokey", "--key", "a")
    assert code == 1  # a alone is not unique: reported, not guessed
    assert "duplicate keys      1 in PostgreSQL, 1 in Delta" in out

    code, out, err = run(capsys, "--dsn", fresh_db, "--delta", lake, "--table", "nokey", "--key", "zz")
    assert code == 1 and "pgcdc: error: key column(s) zz not in public.nokey" in err

    code, out, err = run(capsys, "--dsn", fresh_db, "--delta", lake, "--table", "public.missing")
    assert code == 1 and "pgcdc: error: no Delta table at s3://" in err and "hint:" in err

    sql(fresh_db, "CREATE TABLE only_pg (id int PRIMARY KEY)")
    code, out, err = run(capsys, "--dsn", fresh_db, "--delta", lake, "--table", "only_pg")
    assert code == 1 and "no Delta table at" in err

    build_delta(fresh_db, lake, "public", "only_pg")
    sql(fresh_db, "DROP TABLE only_pg")
    code, out, err = run(capsys, "--dsn", fresh_db, "--delta", lake, "--table", "only_pg")
    assert code == 1 and "pgcdc: error: table public.only_pg does not exist" in err and "hint:" in err

    bad = fresh_db.replace(f"password={password}", "password=wrong-secret") if password else fresh_db
    code, out, err = run(capsys, "--dsn", bad, "--delta", lake, "--table", "nokey", "--key", "a,b")
    assert code == 1 and "pgcdc: error: cannot connect to" in err
    assert password not in err and "wrong-secret" not in err

    # the library call
    result = verify_table(fresh_db, lake, "public", "nokey", key=["a", "b"])
    assert result.equal and result.comparison.postgres_rows == 3
    assert password not in result.postgres
