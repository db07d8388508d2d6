"""Shapes a real database holds that nobody here designed, against real PostgreSQL 15/18
(issue #27): each failed or stopped the pipeline before.

- ``PRIMARY KEY (c1, c2) INCLUDE (c3, c4)``: the snapshot recorded all four columns as the
  key, and after any change the merge failed the table with ``KeyNotCovered`` and a wrong
  hint. The key is the key columns (``pg_index.indnkeyatts``).
- ``ADD COLUMN d … DEFAULT`` after rows changed earlier in the same window: those rows read
  the default in PostgreSQL (they existed when the column was added), but NULL in Delta:
  their change rows, taken before the column existed, carried no value and the merge
  wrote NULL. Now the rows of versions older than the column read its default.
- ``"a.b"."c"`` and ``"a"."b.c"`` (issue #26): both Delta tables were one (delta-rs decoded
  both URLs to ``a.b.c``: the second was never bootstrapped and read the first's rows), and a
  truncate of one, stored as the text ``a.b.c``, was applied to both. Delta tables now use
  ``~`` escapes, truncates ``[schema, table]`` pairs.
- A table created after the snapshot, filled and dropped (a migration's scratch table):
  the merge failed it with ``NeedsSnapshot`` on every run (exit 1) and hinted to resync a
  table that no longer exists. Now it is skipped, with a note, and the job succeeds.
"""

from __future__ import annotations

import pytest
from lake_helpers import drain, sql

from airflow_pgcdc.merge.job import TablesFailed, merge_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.snapshot.resync import PublicationNotStreamed, ResyncError, resync_tables
from airflow_pgcdc.verify import verify_table


@pytest.mark.parametrize("pg_server", ["pg18"], indirect=True)  # the catalog reads and the merge paths here are the same on 15 and 18
def test_covering_keys_defaults_added_mid_window_and_tables_dropped_before_any_copy(fresh_db, slot_name, store, spark):
    client, src, lake = store
    db = fresh_db
    sql(db, "CREATE TABLE inc (c1 int, c2 int, c3 text, c4 int, PRIMARY KEY (c1, c2) INCLUDE (c3, c4))")
    sql(db, "INSERT INTO inc SELECT g % 7, g, 'v' || g, g FROM generate_series(1, 50) g")
    sql(db, "CREATE TABLE e (id int PRIMARY KEY, x text)")
    sql(db, "INSERT INTO e SELECT g, 'v' || g FROM generate_series(1, 20) g")
    sql(db, 'CREATE SCHEMA "a.b"; CREATE SCHEMA a; CREATE TABLE "a.b".c (id int PRIMARY KEY); '
            'CREATE TABLE a."b.c" (id int PRIMARY KEY)')
    sql(db, 'INSERT INTO "a.b".c SELECT generate_series(1, 5); INSERT INTO a."b.c" SELECT generate_series(1, 5)')
    sql(db, 'CREATE PUBLICATION pub FOR TABLE inc, e, "a.b".c, a."b.c"')
    slot = slot_name()
    snap = snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    assert {t.table: t.key_columns for t in snap.tables if t.schema == "public"} == {
        "inc": ("c1", "c2"), "e": ("id",)}
    boot = merge_slot(spark, store=src, slot=slot, delta=lake)
    # "a.b"."c" and "a"."b.c": two Delta tables (before, one: delta-rs decoded both URLs to a.b.c)
    assert sorted(t.action for t in boot.tables) == ["bootstrapped"] * 4, boot.tables

    sql(db, "UPDATE inc SET c3 = 'changed', c4 = -c4 WHERE c2 <= 10; DELETE FROM inc WHERE c2 = 20")
    sql(db, "INSERT INTO inc VALUES (1, 100, 'new', 0)")
    sql(db, 'TRUNCATE "a.b".c; INSERT INTO a."b.c" VALUES (6)')
    # changes before and after an ADD COLUMN ... DEFAULT, in one window
    sql(db, "UPDATE e SET x = 'before' WHERE id = 2; INSERT INTO e VALUES (100, 'inserted before')")
    sql(db, "ALTER TABLE e ADD COLUMN d text DEFAULT 'bar', ADD COLUMN n int DEFAULT 7")
    sql(db, "UPDATE e SET x = 'after' WHERE id = 1; UPDATE e SET d = 'own' WHERE id = 3")
    # a migration's scratch table: created, published, filled, dropped, all after the snapshot
    sql(db, "CREATE TABLE scratch (id int PRIMARY KEY, v text)")
    sql(db, "ALTER PUBLICATION pub ADD TABLE scratch")
    sql(db, "INSERT INTO scratch SELECT g, 'x' FROM generate_series(1, 5) g")
    sql(db, "UPDATE scratch SET v = 'y' WHERE id = 1")
    sql(db, "DROP TABLE scratch")
    drain(db, src, slot, client)

    for inc in ("merged", "up-to-date"):  # every run skips the scratch table, and succeeds
        out = merge_slot(spark, store=src, slot=slot, delta=lake)
        by = {t.table: t for t in out.tables}
        assert by["public.inc"].action == inc, by["public.inc"]
        assert by["public.scratch"].action == "skipped", by["public.scratch"]
        assert "no longer in the pipeline" in by["public.scratch"].note and by["public.scratch"].error is None
    assert verify_table(db, lake, "public", "inc").equal
    assert verify_table(db, lake, "public", "e").equal
    assert verify_table(db, lake, "a.b", "c").equal and verify_table(db, lake, "a", "b.c").equal
    assert sql(db, 'SELECT count(*) FROM a."b.c"') == [(6,)]

    # RENAME TABLE: the new name is refused until it has a copy, saying it is a rename; the
    # old name's Delta table keeps its last state and leaves the pipeline
    sql(db, "ALTER TABLE inc RENAME TO inc2; UPDATE inc2 SET c3 = 'renamed' WHERE c2 = 1")
    drain(db, src, slot, client)
    with pytest.raises(TablesFailed) as failed:
        merge_slot(spark, store=src, slot=slot, delta=lake)
    by = {t.table: t for t in failed.value.result.tables}
    assert by["public.inc2"].error.startswith("NeedsSnapshot") and "table public.inc renamed" in by["public.inc2"].error
    assert by["public.inc"].left_pipeline and by["public.inc"].action != "failed", by["public.inc"]
    # a resync through a publication the drains do not stream, or into another store: refused
    sql(db, "CREATE PUBLICATION other_pub FOR TABLE inc2")
    with pytest.raises(PublicationNotStreamed, match="stream publication"):
        resync_tables(db, src, slot=slot, publications="other_pub", tables=["inc2"], s3=client,
                      worker_processes=False)
    with pytest.raises(ResyncError, match="holds no snapshot and no window"):
        resync_tables(db, src + "-typo", slot=slot, publications="pub", tables=["inc2"], s3=client,
                      worker_processes=False)
    resync_tables(db, src, slot=slot, publications="pub", tables=["inc2"], s3=client, worker_processes=False)
    out = {t.table: t for t in merge_slot(spark, store=src, slot=slot, delta=lake).tables}
    assert out["public.inc2"].action.startswith("resynced") or out["public.inc2"].action.startswith("bootstrapped")
    assert verify_table(db, lake, "public", "inc2").equal
    assert sql(db, "SELECT d, n FROM e WHERE id IN (2, 100) ORDER BY id") == [("bar", 7), ("bar", 7)]


@pytest.mark.parametrize("pg_server", ["pg18"], indirect=True)  # the refusal is the window writer's and the merge's: no server difference
def test_a_value_one_table_cannot_carry_stops_only_that_table(fresh_db, slot_name, store, spark):
    """An array whose lower bound is not 1 (``'[4:4]={NULL}'::int2[]``) has no list form.
    Before, one such change made every later drain of the slot fail, for every table, and no
    command could map the column ``as_text``: the only way out was a new slot and snapshot.
    Now the drain leaves that table out of the window and records it (``refused``), the other
    tables go on, the merge refuses that table alone (``ValueNotCarried``, hint ``--as-text``),
    and ``--as-text`` on the resync and the drains carries the column as exact text."""
    from deltalake import DeltaTable

    from airflow_pgcdc.lake.tables import delta_table_url
    from airflow_pgcdc.store import s3 as s3store

    client, src, lake = store
    db = fresh_db
    sql(db, "CREATE TABLE arr (id int PRIMARY KEY, a int2[]); CREATE TABLE ok (id int PRIMARY KEY, v text)")
    sql(db, "INSERT INTO arr VALUES (1, '{1,2}'); INSERT INTO ok VALUES (1, 'a')")
    sql(db, "CREATE PUBLICATION pub FOR TABLE arr, ok")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    merge_slot(spark, store=src, slot=slot, delta=lake)

    sql(db, "INSERT INTO arr VALUES (2, '[4:4]={NULL}'); UPDATE ok SET v = 'b' WHERE id = 1")
    w = drain(db, src, slot, client)  # before: UnrepresentableValue, for every table, on every drain
    assert w.window_seq == 0
    sql(db, "UPDATE ok SET v = 'c' WHERE id = 1; UPDATE arr SET a = '{3}' WHERE id = 1")
    drain(db, src, slot, client)  # the next window too
    with pytest.raises(TablesFailed) as failed:
        merge_slot(spark, store=src, slot=slot, delta=lake)
    by = {t.table: t for t in failed.value.result.tables}
    assert by["public.arr"].error.startswith("ValueNotCarried") and "UnrepresentableValue" in by["public.arr"].error, \
        by["public.arr"].error
    assert "--as-text" in by["public.arr"].hint, by["public.arr"].hint
    assert by["public.ok"].action == "merged" and verify_table(db, lake, "public", "ok").equal

    # the way out the hint gives: the column as text in a new copy and in the drains
    resync_tables(db, src, slot=slot, publications="pub", tables=["arr"], s3=client, worker_processes=False,
                  as_text=["public.arr=a"])
    sql(db, "INSERT INTO arr VALUES (3, '[0:1]={7,8}')")
    drain(db, src, slot, client, as_text={"public.arr": ["a"]})
    out = {t.table: t for t in merge_slot(spark, store=src, slot=slot, delta=lake).tables}
    assert out["public.arr"].action == "resynced+merged", out["public.arr"]
    rows = DeltaTable(delta_table_url(lake, "public", "arr"),
                      storage_options=s3store.delta_storage_options()).to_pyarrow_table().sort_by("id").to_pylist()
    assert rows == [{"id": 1, "a": "{3}"}, {"id": 2, "a": "[4:4]={NULL}"}, {"id": 3, "a": "[0:1]={7,8}"}]


def test_tables_a_snapshot_cannot_copy_are_left_out_alone(fresh_db, slot_name, store, spark):
    """Before, one such table failed the whole snapshot (and dropped its slot): a table with
    no columns (``unexpected ValueError: BinaryCopyDecoder needs at least one column``, no
    table named), a primary key including a stored generated column (``key columns ['b'] are
    not among its columns`` after copying everything), a value the type map cannot carry. Now
    each is left out of the snapshot, named with why (``refused_tables``), the others are
    committed, and the merge refuses each with that reason until a resync copies it."""
    from airflow_pgcdc.merge.errors import NeedsSnapshot
    from airflow_pgcdc.store import s3 as s3store
    from airflow_pgcdc.store.layout import Layout

    client, src, lake = store
    db = fresh_db
    sql(db, "CREATE TABLE nocol (); INSERT INTO nocol DEFAULT VALUES; INSERT INTO nocol DEFAULT VALUES")
    sql(db, "CREATE TABLE genkey (a int, b int GENERATED ALWAYS AS (a * 2) STORED, PRIMARY KEY (a, b))")
    sql(db, "INSERT INTO genkey (a) SELECT generate_series(1, 5)")
    sql(db, "CREATE TABLE arr (id int PRIMARY KEY, a int2[], pad text); INSERT INTO arr VALUES (1, '{1}', ''), "
            "(2, '[2:2]={5}', '')")
    # many parts: the others of the refused table complete after it failed, and go with it
    sql(db, "INSERT INTO arr SELECT g, '{1}', repeat('x', 500) FROM generate_series(3, 3000) g; ANALYZE arr")
    sql(db, "CREATE TABLE ok (id int PRIMARY KEY, v text); INSERT INTO ok VALUES (1, 'a')")
    sql(db, "CREATE PUBLICATION pub FOR TABLE nocol, genkey, arr, ok")
    slot = slot_name()
    snap = snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=2, rows_per_part=200)
    assert [t.table for t in snap.tables] == ["ok"]
    refused = {r["table"]: r for r in snap.extra["refused_tables"]}
    assert sorted(refused) == ["arr", "genkey", "nocol"], refused
    assert "no columns" in refused["nocol"]["error"] and "['b']" in refused["genkey"]["error"]
    assert "lower bound" in refused["arr"]["error"] and "--as-text" in refused["arr"]["hint"]
    assert sql(db, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,)) == [(1,)]
    layout = Layout.parse(src)
    left = [k for k in s3store.list_keys(client, layout.bucket, layout.snapshots_prefix(slot)) if "arr" in k]
    assert left == [], left  # the refused table's parts are removed

    sql(db, "INSERT INTO genkey (a) VALUES (6); UPDATE ok SET v = 'b'; UPDATE arr SET a = '{9}' WHERE id = 1")
    sql(db, "INSERT INTO nocol DEFAULT VALUES")  # a change of a table without columns: the drain goes on
    drain(db, src, slot, client)
    with pytest.raises(TablesFailed) as failed:
        merge_slot(spark, store=src, slot=slot, delta=lake)
    by = {t.table: t for t in failed.value.result.tables}
    assert by["public.ok"].action.startswith("bootstrapped") and verify_table(db, lake, "public", "ok").equal
    for t in ("genkey", "arr", "nocol"):
        assert by[f"public.{t}"].error.startswith(NeedsSnapshot.__name__), by[f"public.{t}"]
        assert "left it out" in by[f"public.{t}"].error and "pgcdc resync" in by[f"public.{t}"].hint


@pytest.mark.parametrize("pg_server", ["pg18"], indirect=True)  # a merge-side fix: no server difference
def test_infinity_timestamps_in_a_table_without_a_key(fresh_db, slot_name, store, spark):
    """±infinity in a keyless table (``REPLICA IDENTITY FULL``, merged as a multiset): before,
    the merge failed with ``ValueError: year -290308 is out of range`` on every rerun, with no
    hint, and a deleted ``'infinity'`` row stayed in Delta."""
    client, src, lake = store
    db = fresh_db
    sql(db, "CREATE TABLE ev (ts timestamp, tz timestamptz, d date, v text)")
    sql(db, "ALTER TABLE ev REPLICA IDENTITY FULL")
    sql(db, "INSERT INTO ev VALUES ('infinity', 'infinity', 'infinity', 'a'), ('-infinity', '-infinity', "
            "'-infinity', 'b'), ('2024-01-01', '2024-01-01 00:00+00', '2024-01-01', 'c'), "
            "('infinity', '-infinity', '2024-01-02', 'd')")
    sql(db, "CREATE PUBLICATION pub FOR TABLE ev")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    merge_slot(spark, store=src, slot=slot, delta=lake)
    assert verify_table(db, lake, "public", "ev").equal
    sql(db, "DELETE FROM ev WHERE v = 'a'; UPDATE ev SET v = 'b2' WHERE v = 'b'")
    sql(db, "INSERT INTO ev VALUES ('-infinity', 'infinity', '-infinity', 'e'); UPDATE ev SET ts = 'infinity' WHERE v = 'c'")
    drain(db, src, slot, client)
    out = {t.table: t for t in merge_slot(spark, store=src, slot=slot, delta=lake).tables}
    assert out["public.ev"].action == "merged", out["public.ev"]
    assert verify_table(db, lake, "public", "ev").equal


@pytest.mark.parametrize("pg_server", ["pg18"], indirect=True)  # the merge's check: no server difference
def test_a_second_slot_is_not_merged_onto_another_slots_tables(fresh_db, slot_name, store, spark):
    """A slot lost, a new snapshot with a new slot, merged into the same Delta root: before,
    the new slot's windows were applied onto the old pipeline's tables (its snapshot never
    loaded: the table existed), so the changes between the two slots' points were missing,
    green. Now the merge refuses such a table (``TableOfAnotherSlot``)."""
    from airflow_pgcdc.merge.errors import TableOfAnotherSlot

    client, src, lake = store
    db = fresh_db
    sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'a' FROM generate_series(1, 20) g")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t")
    old = slot_name()
    snapshot_to_s3(db, src, slot=old, publications="pub", s3=client, workers=1, worker_processes=False)
    merge_slot(spark, store=src, slot=old, delta=lake)
    sql(db, "SELECT pg_drop_replication_slot(%s)", (old,))  # the slot is lost
    sql(db, "UPDATE t SET v = 'lost' WHERE id <= 5")  # changes no window holds
    new = slot_name()
    snapshot_to_s3(db, src, slot=new, publications="pub", s3=client, workers=1, worker_processes=False)
    sql(db, "UPDATE t SET v = 'after' WHERE id = 10")
    drain(db, src, new, client)
    with pytest.raises(TablesFailed) as failed:
        merge_slot(spark, store=src, slot=new, delta=lake)
    t = failed.value.result.tables[0]
    assert t.error.startswith(TableOfAnotherSlot.__name__) and repr(old) in t.error, t.error
    assert "new Delta root" in t.hint
    fresh = lake + "2"
    out = merge_slot(spark, store=src, slot=new, delta=fresh)
    assert out.tables[0].action == "bootstrapped+merged", out.tables[0]
    assert verify_table(db, fresh, "public", "t").equal
