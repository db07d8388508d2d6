"""Stored generated columns, against real PostgreSQL 15/18: the snapshot, a resync, the
stream and ``pgcdc verify`` agree on whether such a column is part of the table.

PostgreSQL 18 streams a stored generated column when the publication says
``publish_generated_columns = stored`` or its column list names it; before 18 (and on 18
by default) never. The snapshot and resync used to leave generated columns out always: on
18 with a publication that streams them, the Delta table got the column from the first
change that carried it, and every row the stream never touched read NULL there (and
``pgcdc verify`` said EQUAL, as it left them out too); a stored generated column added
later on such a publication (a table rewrite: TableRewritten) could not be repaired by a
resync, whose copy lacked the column. Now the copy holds exactly the streamed columns,
and verify compares a stored generated column when the Delta table has it.

Cases (``mode``): ``stored`` (PostgreSQL 18, ``publish_generated_columns = stored``),
``column_list`` (PostgreSQL 18, ``FOR TABLE g (id, a, v, twice)``: the list names it; a
column added later is not in the list), ``default`` (15 and 18: never streamed).
"""

from __future__ import annotations

import pytest
from lake_helpers import drain, sql

from airflow_pgcdc.cli import main
from airflow_pgcdc.merge.job import TablesFailed, merge_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.snapshot.resync import resync_tables
from airflow_pgcdc.verify import verify_table


def delta_rows(lake, schema, table):
    from deltalake import DeltaTable

    from airflow_pgcdc.lake.tables import delta_table_url
    from airflow_pgcdc.store import s3 as s3store

    dt = DeltaTable(delta_table_url(lake, schema, table), storage_options=s3store.delta_storage_options())
    return {r["id"]: r for r in dt.to_pyarrow_table().to_pylist()}


def assert_verify_equal(db, lake, table, generated, published):
    result = verify_table(db, lake, "public", table)
    assert result.equal, (table, result.comparison)
    compared = result.comparison.compared_columns
    assert (generated in compared) == published, (table, compared)


@pytest.mark.parametrize("mode", ["stored", "column_list", "default"])
def test_generated_columns_follow_the_publication(mode, fresh_db, slot_name, store, spark, capsys):  # noqa: F811
    client, src, lake = store
    db = fresh_db
    pg18 = db.server.version_num >= 180000
    if mode != "default" and not pg18:
        pytest.skip("PostgreSQL 15 never streams generated columns (no publish_generated_columns)")
    published = mode != "default"  # g.twice
    published_later = mode == "stored"  # late.g2, added after the snapshot
    sql(db, "CREATE TABLE g (id int PRIMARY KEY, a int, v text, twice int GENERATED ALWAYS AS (a * 2) STORED)")
    sql(db, "CREATE TABLE late (id int PRIMARY KEY, a int)")
    sql(db, "INSERT INTO g (id, a, v) SELECT i, i, 'v' || i FROM generate_series(1, 20) i")
    sql(db, "INSERT INTO late SELECT i, i FROM generate_series(1, 20) i")
    if mode == "stored":
        sql(db, "CREATE PUBLICATION pub FOR TABLE g, late WITH (publish_generated_columns = stored)")
    elif mode == "column_list":
        sql(db, "CREATE PUBLICATION pub FOR TABLE g (id, a, v, twice), late (id, a)")
    else:
        sql(db, "CREATE PUBLICATION pub FOR TABLE g, late")
    slot = slot_name()
    manifest = snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1,
                              worker_processes=False)
    g_cols = [c.name for c in manifest.table("public", "g").columns]
    assert g_cols == (["id", "a", "v", "twice"] if published else ["id", "a", "v"]), g_cols
    sql(db, "INSERT INTO g (id, a, v) VALUES (21, 21, 'new')")
    sql(db, "UPDATE g SET a = 100 WHERE id = 1")
    sql(db, "UPDATE g SET v = 'changed' WHERE id = 2")
    sql(db, "DELETE FROM g WHERE id = 3")
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake)
    rows = delta_rows(lake, "public", "g")
    if published:  # rows the stream never touched have their value from the snapshot
        assert {i: rows[i]["twice"] for i in (1, 2, 5, 20, 21)} == {1: 200, 2: 4, 5: 10, 20: 40, 21: 42}
    else:
        assert "twice" not in rows[5]
    assert_verify_equal(db, lake, "g", "twice", published)

    # a stored generated column added later: a rewrite no change carries
    sql(db, "ALTER TABLE late ADD COLUMN g2 int GENERATED ALWAYS AS (a * 3) STORED")
    sql(db, "UPDATE late SET a = -a WHERE id <= 3")
    drain(db, src, slot, client)
    if published_later:
        with pytest.raises(TablesFailed) as failed:
            merge_slot(spark, store=src, slot=slot, delta=lake)
        by = {t.table: t for t in failed.value.result.tables}
        assert by["public.late"].action == "failed" and "TableRewritten" in by["public.late"].error, by
        assert "'g2'" in by["public.late"].error and """--tables '"public"."late"'""" in by["public.late"].hint
        assert by["public.g"].action in ("merged", "no-changes"), by["public.g"]
        resync = resync_tables(db, src, slot=slot, publications="pub", tables=["late"], s3=client,
                               worker_processes=False)
        assert [c.name for c in resync.manifest.table("public", "late").columns] == ["id", "a", "g2"]
        sql(db, "UPDATE late SET a = 0 WHERE id = 20")
        drain(db, src, slot, client)
        out = merge_slot(spark, store=src, slot=slot, delta=lake)
        assert {t.table: t.action for t in out.tables}["public.late"] == "resynced+merged"
    else:
        out = merge_slot(spark, store=src, slot=slot, delta=lake)
        assert {t.table: t.action for t in out.tables}["public.late"] == "merged"
    rows = delta_rows(lake, "public", "late")
    if published_later:
        assert {i: rows[i]["g2"] for i in (1, 10, 20)} == {1: -3, 10: 30, 20: 0}
    else:
        assert "g2" not in rows[10]
    assert_verify_equal(db, lake, "late", "g2", published_later)
    assert_verify_equal(db, lake, "g", "twice", published)
    # and the command line says so
    for table, columns in (("g", 4 if published else 3), ("late", 3 if published_later else 2)):
        capsys.readouterr()
        code = main(["verify", "--dsn", db, "--delta", lake, "--table", f"public.{table}"])
        out, err = capsys.readouterr()
        assert code == 0 and out.startswith(f"EQUAL  public.{table}\n"), out + err
        assert f"{columns} columns compared" in out, out


def test_a_publication_that_starts_streaming_a_generated_column(fresh_db, slot_name, store, spark):  # noqa: F811
    """PostgreSQL 18: ``ALTER PUBLICATION … SET (publish_generated_columns = stored)`` after the
    snapshot. The stream carries the column from then on, the Delta table gets it with the
    next change, and the rows no change touched read NULL there: no rewrite happened, so the
    merge does not refuse the table; ``pgcdc verify`` says DIFFERENT (it compares the
    column, the Delta table has it), and ``pgcdc resync --tables`` repairs it."""
    client, src, lake = store
    db = fresh_db
    if db.server.version_num < 180000:
        pytest.skip("PostgreSQL 15 never streams generated columns")
    sql(db, "CREATE TABLE g (id int PRIMARY KEY, a int, twice int GENERATED ALWAYS AS (a * 2) STORED)")
    sql(db, "INSERT INTO g (id, a) SELECT i, i FROM generate_series(1, 10) i")
    sql(db, "CREATE PUBLICATION pub FOR TABLE g")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    sql(db, "ALTER PUBLICATION pub SET (publish_generated_columns = stored)")
    sql(db, "UPDATE g SET a = 100 WHERE id = 1")
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake)
    rows = delta_rows(lake, "public", "g")
    assert (rows[1]["twice"], rows[5]["twice"]) == (200, None)
    result = verify_table(db, lake, "public", "g")
    assert not result.equal and "twice" in result.comparison.compared_columns, result.comparison
    resync_tables(db, src, slot=slot, publications="pub", tables=["g"], s3=client, worker_processes=False)
    sql(db, "UPDATE g SET a = 0 WHERE id = 2")
    drain(db, src, slot, client)
    out = merge_slot(spark, store=src, slot=slot, delta=lake)
    assert {t.table: t.action for t in out.tables}["public.g"] == "resynced+merged"
    assert_verify_equal(db, lake, "g", "twice", True)
