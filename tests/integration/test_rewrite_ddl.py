"""DDL that rewrites a table without logical changes, against real PostgreSQL 15/18.

PostgreSQL decodes no change for the rows such a statement rewrites: after
``ADD COLUMN r float8 DEFAULT random()`` (or ``clock_timestamp()``) every existing row holds
a value the stream never carries, and ``ALTER COLUMN a TYPE text USING a::text || '!'``
changes every row's value without a change either. The drain detects the added columns
(the catalog: a default without ``attmissingval`` and a table file newer than that
default) and records them on the window's relation version (``rewritten_columns``); the
merge refuses that table alone (``TableRewritten``, hint ``pgcdc resync --tables …``), as
it refuses the type change (``TableRewritten`` too: its column's catalog row and the
table's file both changed, see ``merge/columns.py``); the other tables
merge, ``ADD COLUMN`` then ``SET DEFAULT`` is not flagged (the rows already there are NULL
in PostgreSQL too). After ``pgcdc resync`` of the refused tables, whose consistent point
is after the DDL, the merge replaces them and every table verifies equal, also for a
table whose DDL and the resync fall in one window with changes on both sides.
"""

from __future__ import annotations

import pytest
from lake_helpers import drain, read_windows, sql

from airflow_pgcdc.merge.job import (
    TableRewritten,
    TablesFailed,
    merge_slot,
)
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.snapshot.resync import resync_tables
from airflow_pgcdc.verify import verify_table

TABLES = ("vol", "typ", "late", "ok", "st")


def _versions(client, src, slot, table):
    return [rv for m in read_windows(client, src, slot) for t in m.tables if t["table"] == table
            for rv in t["relation_versions"]]


def _flagged(client, src, slot, table):
    return sorted({c["name"] for rv in _versions(client, src, slot, table) for c in rv.get("rewritten_columns", ())})


def test_rewriting_ddl_fails_that_table_until_a_resync(fresh_db, slot_name, store, spark):  # noqa: F811
    client, src, lake = store
    db = fresh_db
    for t in TABLES:
        sql(db, f"CREATE TABLE {t} (id int PRIMARY KEY, a int, v text)")
        sql(db, f"INSERT INTO {t} SELECT g, g, 'v' || g FROM generate_series(1, 40) g")
    sql(db, f"CREATE PUBLICATION pub FOR TABLE {', '.join(TABLES)}")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    merge_slot(spark, store=src, slot=slot, delta=lake)

    # volatile defaults: the table is rewritten, every existing row gets its own value
    sql(db, "ALTER TABLE vol ADD COLUMN r float8 DEFAULT random(), ADD COLUMN c timestamptz DEFAULT clock_timestamp()")
    sql(db, "UPDATE vol SET v = 'u' WHERE id <= 3; INSERT INTO vol (id, a, v) VALUES (100, 0, 'new')")
    # a type change with USING: every row's value changes, no change is decoded
    sql(db, "ALTER TABLE typ ALTER COLUMN a TYPE text USING a::text || '!'")
    sql(db, "UPDATE typ SET v = 'u' WHERE id <= 3")
    # a column added without a default, its default set later: old rows are NULL in PG too
    sql(db, "ALTER TABLE late ADD COLUMN x int")
    sql(db, "UPDATE late SET v = 'u' WHERE id = 1")
    sql(db, "ALTER TABLE late ALTER COLUMN x SET DEFAULT 5")
    sql(db, "INSERT INTO late (id, a, v) VALUES (100, 0, 'new'); UPDATE late SET v = 'w' WHERE id = 2")
    sql(db, "UPDATE ok SET v = 'u' WHERE id <= 5; DELETE FROM ok WHERE id = 40; UPDATE st SET v = 'u' WHERE id = 1")
    drain(db, src, slot, client)

    with pytest.raises(TablesFailed) as failed:
        merge_slot(spark, store=src, slot=slot, delta=lake)
    by = {t.table: t for t in failed.value.result.tables}
    assert by["public.vol"].action == "failed", by["public.vol"]
    assert "TableRewritten" in by["public.vol"].error and "'r'" in by["public.vol"].error
    assert "pgcdc resync" in by["public.vol"].hint and """--tables '"public"."vol"'""" in by["public.vol"].hint
    # the type change rewrote every row: refused as a rewrite (column identity, merge/columns.py),
    # naming the old and new type, before the schema step would refuse the new type
    assert by["public.typ"].action == "failed" and TableRewritten.__name__ in by["public.typ"].error
    assert "its type from integer to text" in by["public.typ"].error, by["public.typ"].error
    assert "pgcdc resync" in by["public.typ"].hint and """--tables '"public"."typ"'""" in by["public.typ"].hint
    assert {t: by[f"public.{t}"].action for t in ("late", "ok", "st")} == dict.fromkeys(("late", "ok", "st"), "merged")
    for t in ("late", "ok", "st"):
        assert verify_table(db, lake, "public", t).equal, t
    assert _flagged(client, src, slot, "vol") == ["c", "r"]  # the window's relation version says so
    assert _flagged(client, src, slot, "late") == [] and _flagged(client, src, slot, "ok") == []
    # the refusal holds until the table is taken again: a second merge refuses it too
    with pytest.raises(TablesFailed) as again:
        merge_slot(spark, store=src, slot=slot, delta=lake)
    assert sorted(t.table for t in again.value.result.failed) == ["public.typ", "public.vol"]

    # st: changes before its DDL, the DDL, the resync and changes after it, all in one window
    sql(db, "UPDATE st SET v = 'before' WHERE id <= 4")
    sql(db, "ALTER TABLE st ADD COLUMN r float8 DEFAULT random()")
    sql(db, "ALTER TABLE st ALTER COLUMN a TYPE text USING a::text || '!'")
    sql(db, "UPDATE st SET v = 'between' WHERE id BETWEEN 5 AND 8")
    resync_tables(db, src, slot=slot, publications="pub", tables=["vol", "typ", "st"], s3=client,
                  worker_processes=False)
    for t in TABLES:
        sql(db, f"UPDATE {t} SET v = 'after' WHERE id BETWEEN 10 AND 12")
    sql(db, "DELETE FROM vol WHERE id = 13; INSERT INTO typ (id, a, v) VALUES (100, 'x', 'new')")
    drain(db, src, slot, client)
    assert _flagged(client, src, slot, "st") == ["r"]  # recorded, but before the resync's point
    out = merge_slot(spark, store=src, slot=slot, delta=lake)
    actions = {t.table: t.action for t in out.tables}
    assert actions == {"public.vol": "resynced+merged", "public.typ": "resynced+merged", "public.st": "resynced+merged",
                       "public.late": "merged", "public.ok": "merged"}, actions
    for t in TABLES:
        assert verify_table(db, lake, "public", t).equal, t

    # after the resync, a later ADD COLUMN with a constant default is followed as usual
    sql(db, "ALTER TABLE vol ADD COLUMN k int DEFAULT 7")
    sql(db, "UPDATE vol SET v = 'later' WHERE id = 20")
    drain(db, src, slot, client)
    out = merge_slot(spark, store=src, slot=slot, delta=lake)
    assert {t.table: t.action for t in out.tables}["public.vol"] == "merged"
    assert verify_table(db, lake, "public", "vol").equal


def test_vacuum_full_is_fine_a_materialized_default_and_a_generated_column_are_not(
        fresh_db, slot_name, store, spark):  # noqa: F811
    """``VACUUM FULL`` of a table whose column has a volatile default from ``CREATE TABLE``
    merges as usual (the drain sees a file newer than the default, but the Delta table has
    the column). ``ADD COLUMN n int DEFAULT 5`` followed by ``VACUUM FULL`` before the drain
    reads the catalog: the rewrite materialized the 5s and cleared ``attmissingval``, so the
    merge refuses the table (Delta would read NULL); a resync repairs it. A stored generated
    column added later (a rewrite too) is not published (pgoutput leaves it out; the
    snapshot too): the table merges."""
    client, src, lake = store
    db = fresh_db
    sql(db, "CREATE TABLE vf (id int PRIMARY KEY, v text, created timestamptz DEFAULT clock_timestamp())")
    sql(db, "CREATE TABLE cf (id int PRIMARY KEY, v text)")
    sql(db, "CREATE TABLE gen (id int PRIMARY KEY, a int)")
    for t in ("vf", "cf"):
        sql(db, f"INSERT INTO {t} (id, v) SELECT g, 'v' || g FROM generate_series(1, 30) g")
    sql(db, "INSERT INTO gen SELECT g, g FROM generate_series(1, 30) g")
    sql(db, "CREATE PUBLICATION pub FOR TABLE vf, cf, gen")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    merge_slot(spark, store=src, slot=slot, delta=lake)
    sql(db, "VACUUM FULL vf")
    sql(db, "UPDATE vf SET v = 'u' WHERE id <= 3; INSERT INTO vf (id, v) VALUES (100, 'new')")
    sql(db, "ALTER TABLE cf ADD COLUMN n int DEFAULT 5")
    sql(db, "VACUUM FULL cf")
    sql(db, "UPDATE cf SET v = 'u' WHERE id <= 3")
    sql(db, "ALTER TABLE gen ADD COLUMN g int GENERATED ALWAYS AS (a * 2) STORED")
    sql(db, "UPDATE gen SET a = -a WHERE id <= 3")
    drain(db, src, slot, client)
    assert _flagged(client, src, slot, "vf") == ["created"]  # flagged, but Delta has it: fine
    assert _flagged(client, src, slot, "cf") == ["n"]
    assert _flagged(client, src, slot, "gen") == []
    with pytest.raises(TablesFailed) as failed:
        merge_slot(spark, store=src, slot=slot, delta=lake)
    by = {t.table: t for t in failed.value.result.tables}
    assert by["public.vf"].action == "merged", by["public.vf"]
    assert verify_table(db, lake, "public", "vf").equal
    assert by["public.cf"].action == "failed" and "TableRewritten" in by["public.cf"].error
    assert "'n' (DEFAULT 5)" in by["public.cf"].error and """--tables '"public"."cf"'""" in by["public.cf"].hint
    assert by["public.gen"].action == "merged"
    resync_tables(db, src, slot=slot, publications="pub", tables=["cf"], s3=client, worker_processes=False)
    sql(db, "UPDATE cf SET v = 'after' WHERE id > 25; UPDATE gen SET a = 0 WHERE id > 25")
    drain(db, src, slot, client)
    out = merge_slot(spark, store=src, slot=slot, delta=lake)
    assert {t.table: t.action for t in out.tables} == {
        "public.vf": "no-changes", "public.cf": "resynced+merged", "public.gen": "merged"}
    for t in ("vf", "cf", "gen"):
        result = verify_table(db, lake, "public", t)
        assert result.equal, (t, result.comparison)
