"""Table shapes a real database has, from snapshot to Delta and ``pgcdc verify``, against
real PostgreSQL 15/18: inheritance parents published with or without their children,
partitioned tables both ways, generated columns, tables without a key (a ``pgbench``
database), odd names, keys duplicated inside a transaction (a ``DEFERRABLE`` key)."""

from __future__ import annotations

import psycopg
import pytest
from lake_helpers import assert_equal, drain, read_windows, sql

from airflow_pgcdc.merge.job import merge_slot
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.verify import verify_table


def delta_ids(lake, schema, table):
    from deltalake import DeltaTable

    from airflow_pgcdc.lake.tables import delta_table_url
    from airflow_pgcdc.store import s3 as s3store

    dt = DeltaTable(delta_table_url(lake, schema, table), storage_options=s3store.delta_storage_options())
    return sorted(dt.to_pyarrow_table().column("id").to_pylist())


@pytest.mark.parametrize("only", [False, True], ids=["with_children", "parent_only"])
def test_inheritance_parent_is_its_own_rows(only, fresh_db, slot_name, store, spark):
    """The snapshot copies a parent with ``ONLY`` (its children's rows used to be copied into
    it too, then streamed under the child's name: twice, or never changed again); the
    stream, the merge and verify agree on what the table is."""
    client, src, lake = store
    db = fresh_db
    sql(db, "CREATE TABLE p (id int PRIMARY KEY, v text)")
    sql(db, "CREATE TABLE c (extra int) INHERITS (p)")
    sql(db, "ALTER TABLE c ADD PRIMARY KEY (id)")
    sql(db, "INSERT INTO p VALUES (1, 'p1'), (2, 'p2')")
    sql(db, "INSERT INTO c VALUES (3, 'c3', 30), (4, 'c4', 40)")
    sql(db, f"CREATE PUBLICATION pub FOR TABLE {'ONLY p' if only else 'p'}")
    slot = slot_name()
    manifest = snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1,
                              worker_processes=False)
    assert manifest.table("public", "p").rows == 2
    sql(db, "INSERT INTO p VALUES (5, 'p5')")
    sql(db, "INSERT INTO c VALUES (6, 'c6', 60)")
    sql(db, "UPDATE c SET v = 'c3b' WHERE id = 3")
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake)
    assert delta_ids(lake, "public", "p") == [1, 2, 5]
    assert verify_table(db, lake, "public", "p").equal
    if only:
        assert [(t.schema, t.table) for t in manifest.tables] == [("public", "p")]
    else:
        assert delta_ids(lake, "public", "c") == [3, 4, 6]
        assert verify_table(db, lake, "public", "c").equal


@pytest.mark.parametrize("via_root", [True, False], ids=["via_root", "per_leaf"])
def test_partitioned_table_both_ways(via_root, fresh_db, slot_name, store, spark):
    """``publish_via_partition_root = true``: one Delta table for the root (the snapshot
    copies every partition under its name, the stream sends the root's name); ``false``:
    one Delta table per leaf. Rows moving between partitions included."""
    client, src, lake = store
    db = fresh_db
    sql(db, "CREATE TABLE m (id int, region text, v text, PRIMARY KEY (id, region)) PARTITION BY LIST (region)")
    sql(db, "CREATE TABLE m_eu PARTITION OF m FOR VALUES IN ('eu')")
    sql(db, "CREATE TABLE m_us PARTITION OF m FOR VALUES IN ('us')")
    sql(db, "INSERT INTO m VALUES (1, 'eu', 'a'), (2, 'us', 'b'), (3, 'eu', 'c')")
    sql(db, f"CREATE PUBLICATION pub FOR TABLE m WITH (publish_via_partition_root = {str(via_root).lower()})")
    slot = slot_name()
    manifest = snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1,
                              worker_processes=False)
    names = sorted(t.table for t in manifest.tables)
    assert names == (["m"] if via_root else ["m_eu", "m_us"])
    sql(db, "INSERT INTO m VALUES (4, 'us', 'd')")
    sql(db, "UPDATE m SET v = 'a2' WHERE id = 1")
    sql(db, "UPDATE m SET region = 'us' WHERE id = 3")  # moves to another partition
    sql(db, "DELETE FROM m WHERE id = 2")
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake)
    for name in names:
        result = verify_table(db, lake, "public", name)
        assert result.equal, (name, result.comparison)
    if via_root:
        assert delta_ids(lake, "public", "m") == [1, 3, 4]


def test_generated_columns_agree_between_snapshot_and_stream(fresh_db, slot_name, store, spark):
    """A stored generated column: the snapshot and the stream agree on whether it is part of
    the table (PostgreSQL 18 publishes it only with publish_generated_columns = stored)."""
    client, src, lake = store
    db = fresh_db
    sql(db, "CREATE TABLE g (id int PRIMARY KEY, a int, twice int GENERATED ALWAYS AS (a * 2) STORED)")
    sql(db, "INSERT INTO g (id, a) VALUES (1, 1), (2, 2)")
    sql(db, "CREATE PUBLICATION pub FOR TABLE g")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    sql(db, "INSERT INTO g (id, a) VALUES (3, 3)")
    sql(db, "UPDATE g SET a = 10 WHERE id = 1")
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake)
    result = verify_table(db, lake, "public", "g")
    assert result.equal, result.comparison


def test_pgbench_database_with_a_keyless_table(fresh_db, slot_name, store, spark):
    """A database made by ``pgbench -i`` with ``FOR ALL TABLES``: ``pgbench_history`` has no
    key. It used to stop the first merge of every table (NoMergeKey); now it is appended
    (insert-only), the keyed tables are merged, a replay adds nothing, and an update of a
    keyless ``REPLICA IDENTITY FULL`` table is applied as a multiset."""
    import subprocess

    from psycopg.conninfo import conninfo_to_dict

    from airflow_pgcdc.testing.postgres import pg_bin_dir

    client, src, lake = store
    db = fresh_db
    flavour = "pg18" if db.server.version_num >= 180000 else "pg15"
    pgbench = str(pg_bin_dir(flavour) / "pgbench")
    params = conninfo_to_dict(db)
    env = {**__import__("os").environ, "PGPASSWORD": params.pop("password", "")}
    conn = " ".join(f"{k}={v}" for k, v in params.items())

    def bench(*args):
        p = subprocess.run([pgbench, *args, conn], env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]

    bench("-i", "-s", "1", "-q")
    sql(db, "CREATE TABLE notes (body text)")  # keyless too (FULL: PostgreSQL allows its update)
    sql(db, "ALTER TABLE notes REPLICA IDENTITY FULL")
    sql(db, "INSERT INTO notes VALUES ('first')")
    sql(db, "CREATE PUBLICATION pub FOR ALL TABLES")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    bench("-t", "200", "-c", "2", "-n")
    sql(db, "INSERT INTO notes VALUES ('second')")
    drain(db, src, slot, client)
    first = merge_slot(spark, store=src, slot=slot, delta=lake)
    keyless = {"pgbench_history": ["tid", "bid", "aid", "delta", "mtime"], "notes": ["body"]}  # verify needs one
    for name in ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history", "notes"):
        assert verify_table(db, lake, "public", name, key=keyless.get(name)).equal, name
    history = {t.table: t for t in first.tables}["public.pgbench_history"]
    assert history.action == "bootstrapped+merged" and history.merged_rows == 400
    # a keyless REPLICA IDENTITY FULL table gets an update: applied as a multiset (the
    # failure of a keyless change that cannot be applied is tested in test_keyless.py)
    sql(db, "UPDATE notes SET body = 'edited' WHERE body = 'first'")
    bench("-t", "50", "-c", "1", "-n")
    drain(db, src, slot, client)
    second = {t.table: t for t in merge_slot(spark, store=src, slot=slot, delta=lake).tables}
    assert second["public.notes"].action == "merged" and second["public.pgbench_accounts"].action == "merged"
    for name in ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history", "notes"):
        assert verify_table(db, lake, "public", name).equal, name  # keyless: as a multiset
    # a replay appends nothing twice
    assert {t.action for t in merge_slot(spark, store=src, slot=slot, delta=lake).tables} <= {"up-to-date",
                                                                                             "no-changes"}
    assert verify_table(db, lake, "public", "pgbench_history").equal


def test_odd_column_names_through_drain_merge_and_verify(fresh_db, slot_name, store, spark):
    """Column names holding dots, spaces, quotes, capitals or a leading underscore, a key
    among them, and a schema holding a dot (Spark column references used to be unquoted:
    a column named ``a.b`` crashed the merge)."""
    client, src, lake = store
    db = fresh_db
    sql(db, 'CREATE SCHEMA "my.schema"')
    sql(db, 'CREATE TABLE "my.schema"."Odd Table" ("k.id" int PRIMARY KEY, "a.b" text, "sp ace" int, '
            '"q""uote" text, "_lead" text, "CamelCase" int)')
    sql(db, """INSERT INTO "my.schema"."Odd Table" VALUES (1, 'x', 1, 'q', 'l', 1), (2, 'y', 2, 'r', 'm', 2)""")
    sql(db, 'CREATE PUBLICATION pub FOR TABLE "my.schema"."Odd Table"')
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    sql(db, """INSERT INTO "my.schema"."Odd Table" VALUES (3, 'z', 3, 's', 'n', 3)""")
    sql(db, """UPDATE "my.schema"."Odd Table" SET "a.b" = 'x2', "sp ace" = 10 WHERE "k.id" = 1""")
    sql(db, """UPDATE "my.schema"."Odd Table" SET "k.id" = 20 WHERE "k.id" = 2""")
    sql(db, """DELETE FROM "my.schema"."Odd Table" WHERE "k.id" = 3""")
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake)
    result = verify_table(db, lake, "my.schema", "Odd Table")
    assert result.equal, result.comparison


def test_key_swap_in_one_statement_under_a_deferrable_key(fresh_db, slot_name, store, spark):
    """``UPDATE t SET id = 3 - id`` swaps rows 1 and 2: the second row leaving key 2 used to
    delete the first row's new version at key 2 (the old key's D row came after it)."""
    client, src, lake = store
    db = fresh_db
    sql(db, "CREATE TABLE t (id int PRIMARY KEY DEFERRABLE INITIALLY IMMEDIATE, v text, n int)")
    sql(db, "ALTER TABLE t REPLICA IDENTITY FULL")
    sql(db, "INSERT INTO t VALUES (1, 'one', 10), (2, 'two', 20), (5, 'five', 50)")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    sql(db, "UPDATE t SET id = 3 - id WHERE id IN (1, 2)")  # the swap, one statement
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake)
    assert_equal(db, lake, "public.t", "id")
    # a three-way rotation and a move in and out of one key inside one transaction
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("BEGIN")
        c.execute("SET CONSTRAINTS ALL DEFERRED")
        c.execute("UPDATE t SET id = CASE id WHEN 1 THEN 2 WHEN 2 THEN 5 WHEN 5 THEN 1 END")
        c.execute("UPDATE t SET id = 7 WHERE v = 'one'")
        c.execute("UPDATE t SET id = 9 WHERE id = 7")
        c.execute("INSERT INTO t VALUES (7, 'seven', 70)")
        c.execute("COMMIT")
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake)
    assert_equal(db, lake, "public.t", "id")


# --------------------------------------------------------------------------- resync


def _numbered_writer(db, table, stop, counter, log_table=None):
    """Inserts, updates and deletes on ``table`` (id, n, v) until ``stop``: transaction i
    inserts id 100000+i, bumps n of an existing row, deletes the row inserted 3 earlier
    (and appends row i to the keyless ``log_table``)."""
    with psycopg.connect(db, autocommit=True) as c:
        i = 0
        while not stop.is_set():
            i += 1
            with c.transaction():
                c.execute(f"INSERT INTO {table} VALUES (%s, 0, 'w')", (100000 + i,))
                c.execute(f"UPDATE {table} SET n = n + 1, v = 'u' || %s WHERE id = %s", (i, i % 300 + 1))
                if i > 3:
                    c.execute(f"DELETE FROM {table} WHERE id = %s", (100000 + i - 3,))
                if log_table:
                    c.execute(f"INSERT INTO {log_table} VALUES (%s, 'entry')", (i,))
            counter[0] = i


@pytest.mark.parametrize("case", ["new_table", "rebuild"])
def test_resync_while_a_writer_and_drains_run(case, fresh_db, slot_name, store, spark, driver_rows):
    """``pgcdc resync`` of a table while a numbered writer changes it and drains run: for a
    table added to the publication after the snapshot (the merge refused it until then,
    naming resync) and for a table of the pipeline whose Delta table was damaged. The next
    merge replaces the Delta table from the copy in one commit and applies only the later
    changes: equal to PostgreSQL; the other table is untouched; a replay is a no-op; the
    temporary slot is gone. A keyless log table written by the same transactions is resynced
    too: a change before the copy's consistent point applied again would be a duplicate row."""
    import threading

    from deltalake import DeltaTable

    from airflow_pgcdc.lake.tables import delta_table_url
    from airflow_pgcdc.merge.job import NeedsSnapshot, TablesFailed
    from airflow_pgcdc.snapshot.resync import TableNotPublished, resync_tables
    from airflow_pgcdc.store import s3 as s3store

    client, src, lake = store
    db = fresh_db
    sql(db, "CREATE TABLE a (id int PRIMARY KEY, v text)")
    sql(db, "CREATE TABLE b (id int PRIMARY KEY, n int, v text)")
    sql(db, "INSERT INTO a SELECT g, 'a' FROM generate_series(1, 100) g")
    sql(db, "INSERT INTO b SELECT g, 0, 'b' FROM generate_series(1, 300) g")
    sql(db, "CREATE TABLE l (i int, note text)")  # no key: appended
    sql(db, "INSERT INTO l SELECT -g, 'old' FROM generate_series(1, 20) g")
    sql(db, f"CREATE PUBLICATION pub FOR TABLE {'a' if case == 'new_table' else 'a, b, l'}")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    storage = s3store.delta_storage_options()
    b_url = delta_table_url(lake, "public", "b")

    def resync():
        return resync_tables(db, src, slot=slot, publications="pub", tables=["public.b", "l"], s3=client,
                             workers=2, rows_per_part=100, worker_processes=False)

    if case == "new_table":
        with pytest.raises(TableNotPublished) as refused:
            resync()
        statement, _, rest = refused.value.hint.partition("; ")
        assert statement == 'ALTER PUBLICATION "pub" ADD TABLE "public"."b", "public"."l"'
        assert rest == "then rerun the resync"
        sql(db, statement)  # the hint is the statement to run
        sql(db, "UPDATE b SET v = 'changed after joining' WHERE id <= 5")
        drain(db, src, slot, client)
        with pytest.raises(TablesFailed) as failed:
            merge_slot(spark, store=src, slot=slot, delta=lake, driver_rows=driver_rows)
        by = {t.table: t for t in failed.value.result.tables}
        assert by["public.a"].action == "bootstrapped" or by["public.a"].action.startswith("bootstrapped")
        assert by["public.b"].action == "failed" and NeedsSnapshot.__name__ in by["public.b"].error
        assert "pgcdc resync" in by["public.b"].hint and """--tables '"public"."b"'""" in by["public.b"].hint
    else:
        drain(db, src, slot, client)
        merge_slot(spark, store=src, slot=slot, delta=lake, driver_rows=driver_rows)
        DeltaTable(b_url, storage_options=storage).delete("id <= 150")  # the incident
    a_version = DeltaTable(delta_table_url(lake, "public", "a"), storage_options=storage).version()

    stop, counter, errors = threading.Event(), [0], []
    # Windows must straddle the copy's consistent point (changes on both sides of it in one
    # window), whatever the timing: the drains pause before the resync (so the next window
    # starts before the point, with the writer's changes in between) and go on once the
    # temporary slot is consistent and the writer has committed after it (or the resync ended).
    hold, idle = threading.Event(), threading.Event()

    def wait_for(count):
        while counter[0] < count and not stop.is_set():
            stop.wait(0.02)

    def drains():
        held = False
        while not stop.is_set():
            if hold.is_set():
                idle.set()
                held = True
                stop.wait(0.02)
                continue
            idle.clear()
            try:  # the first window after the pause reads up to the server's end (no time cut)
                drain(db, src, slot, client, max_seconds=None if held else 1)
                held = False
            except Exception as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)
                idle.set()
                return

    def release_when_consistent():
        with psycopg.connect(db, autocommit=True) as c:
            while hold.is_set() and not stop.is_set():
                if c.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'pgcdc\\_rs\\_%' "
                             "AND confirmed_flush_lsn IS NOT NULL").fetchone()[0]:
                    wait_for(counter[0] + 2)
                    hold.clear()
                    return
                stop.wait(0.02)

    threads = [threading.Thread(target=_numbered_writer, args=(db, "b", stop, counter, "l")),
               threading.Thread(target=drains)]
    for th in threads:
        th.start()
    try:
        wait_for(50)
        hold.set()
        idle.wait(120)
        wait_for(counter[0] + 5)  # changes between the last window's end and the consistent point
        watcher = threading.Thread(target=release_when_consistent)
        watcher.start()
        done = resync()
        at_resync = counter[0]
        wait_for(at_resync + 2)
        hold.clear()
        watcher.join(60)
        wait_for(at_resync + 50)
    finally:
        stop.set()
        for th in threads:
            th.join(60)
    assert not errors, errors
    assert done.manifest.table("public", "b").rows > 0
    temp = sql(db, "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'pgcdc\\_rs\\_%'")[0][0]
    assert temp == 0, "the temporary slot is gone"
    while drain(db, src, slot, client).transactions:
        pass
    point = LSN.parse(done.manifest.consistent_point)
    straddling = [m for m in read_windows(client, src, slot) if m.start < point < m.end]
    assert straddling and any(t["table"] == "l" for t in straddling[0].tables), \
        "a window holds changes from both sides of the copy's consistent point"
    out = merge_slot(spark, store=src, slot=slot, delta=lake, driver_rows=driver_rows)
    by = {t.table: t for t in out.tables}
    assert by["public.b"].action == "resynced+merged", by["public.b"]
    assert by["public.l"].action == "resynced+merged", by["public.l"]
    assert_equal(db, lake, "public.l", "i")  # every row once (verify needs a key)
    assert by["public.a"].action in ("up-to-date", "no-changes")
    assert_equal(db, lake, "public.b", "id")
    assert verify_table(db, lake, "public", "b").equal
    assert DeltaTable(delta_table_url(lake, "public", "a"), storage_options=storage).version() == a_version
    dt = DeltaTable(b_url, storage_options=storage)
    version = dt.version()
    again = merge_slot(spark, store=src, slot=slot, delta=lake, driver_rows=driver_rows)
    assert {t.table: t.action for t in again.tables}["public.b"] == "up-to-date"
    dt.update_incremental()
    assert dt.version() == version, "a replay commits nothing"
    sql(db, "UPDATE b SET v = 'after' WHERE id % 10 = 0; DELETE FROM b WHERE id = 7")
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake, driver_rows=driver_rows)
    assert_equal(db, lake, "public.b", "id")


def test_a_merge_killed_while_replacing_from_a_resync_keeps_the_old_table(fresh_db, slot_name, store, s3, spark):
    """The job is killed after staging the copy, before its one replace commit: the old
    (damaged) Delta table is still there and readable at its version; the rerun replaces it
    and applies the later changes."""
    import os
    import subprocess
    import sys

    from deltalake import DeltaTable

    from airflow_pgcdc.lake.tables import delta_table_url
    from airflow_pgcdc.snapshot.resync import resync_tables
    from airflow_pgcdc.store import s3 as s3store

    client, src, lake = store
    db = fresh_db
    sql(db, "CREATE TABLE b (id int PRIMARY KEY, v text)")
    sql(db, "INSERT INTO b SELECT g, 'b' FROM generate_series(1, 300) g")
    sql(db, "CREATE PUBLICATION pub FOR TABLE b")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    merge_slot(spark, store=src, slot=slot, delta=lake)
    url = delta_table_url(lake, "public", "b")
    dt = DeltaTable(url, storage_options=s3store.delta_storage_options())
    dt.delete("id <= 150")  # the incident
    dt.update_incremental()
    damaged = dt.version()
    resync_tables(db, src, slot=slot, publications="pub", tables=["b"], s3=client, worker_processes=False)
    sql(db, "UPDATE b SET v = 'after' WHERE id % 3 = 0")
    drain(db, src, slot, client)
    env = dict(os.environ, **s3.aws_env(), PGCDC_FAULT="merge-after-stage", SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run([sys.executable, "-m", "airflow_pgcdc.cli", "merge", "--from", src, "--slot", slot,
                           "--delta", lake, "--master", "local[1]"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    dt.update_incremental()
    assert dt.version() == damaged and len(dt.to_pyarrow_table()) == 150, "the old table, as it was"
    out = merge_slot(spark, store=src, slot=slot, delta=lake)
    assert [t.action for t in out.tables] == ["resynced+merged"]
    assert_equal(db, lake, "public.b", "id")
    assert verify_table(db, lake, "public", "b").equal


def test_add_column_with_a_default_reads_it_in_delta_too(fresh_db, slot_name, store, spark):
    """``ALTER TABLE … ADD COLUMN … DEFAULT <constant or stable expression>`` rewrites no row
    in PostgreSQL: the rows already there read the default (``attmissingval``). In Delta they
    read it too (they used to read NULL), for several types, while a row inserted later with
    an explicit NULL stays NULL and a column without a default stays NULL."""
    client, src, lake = store
    db = fresh_db
    sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(db, "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 50) g")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    merge_slot(spark, store=src, slot=slot, delta=lake)
    sql(db, "ALTER TABLE t ADD COLUMN n int DEFAULT 42, ADD COLUMN s text DEFAULT 'it''s', "
            "ADD COLUMN ts timestamptz DEFAULT now(), ADD COLUMN iv interval DEFAULT '1 day 02:00', "
            "ADD COLUMN tm time DEFAULT '12:34:56.789', ADD COLUMN d numeric(10,2) DEFAULT 3.14, "
            "ADD COLUMN q text DEFAULT 'a,b \"c\" {d}', ADD COLUMN bx box DEFAULT '(1,1),(0,0)', "
            "ADD COLUMN nodef int")
    sql(db, "UPDATE t SET v = 'changed' WHERE id = 1")
    sql(db, "INSERT INTO t (id, v, n, s) VALUES (100, 'new', NULL, NULL)")
    drain(db, src, slot, client)
    out = merge_slot(spark, store=src, slot=slot, delta=lake)
    assert sorted(out.tables[0].added_columns) == ["bx", "d", "iv", "n", "nodef", "q", "s", "tm", "ts"]
    assert verify_table(db, lake, "public", "t").equal  # every column, every type
    from deltalake import DeltaTable

    from airflow_pgcdc.lake.tables import delta_table_url
    from airflow_pgcdc.store import s3 as s3store

    rows = {r["id"]: r for r in DeltaTable(delta_table_url(lake, "public", "t"),
                                           storage_options=s3store.delta_storage_options()).to_pyarrow_table().to_pylist()}
    assert (rows[2]["n"], rows[2]["s"], rows[2]["nodef"], rows[2]["tm"]) == (42, "it's", None, 45296789000)
    assert (rows[2]["q"], rows[2]["bx"]) == ('a,b "c" {d}', "(1,1),(0,0)")  # box: ';'-delimited arrays
    assert (rows[100]["n"], rows[100]["s"]) == (None, None), "an explicit NULL stays NULL"


def test_columns_named_like_our_metadata(fresh_db, slot_name, store, spark):
    """A column starting with ``_pgcdc_`` is the user's own and goes through (it used to stop
    the drain of the whole slot). A column named exactly like the change metadata
    (``_pgcdc_op``) cannot be stored: the drain leaves that table's changes out and says so in
    the manifest, the other tables go on, and the merge refuses that table alone, naming the
    fix; after a rename and a resync it merges equal."""
    from airflow_pgcdc.merge.job import ReservedColumnName, TablesFailed
    from airflow_pgcdc.snapshot.resync import resync_tables

    client, src, lake = store
    db = fresh_db
    sql(db, 'CREATE TABLE ok (id int PRIMARY KEY, "_pgcdc_mine" text, "_pgcdc_old" int, v text)')
    sql(db, 'CREATE TABLE odd (id int PRIMARY KEY, "_pgcdc_op" text, v text)')
    sql(db, "INSERT INTO ok SELECT g, 'm' || g, g, 'v' FROM generate_series(1, 20) g")
    sql(db, "INSERT INTO odd SELECT g, 'o', 'v' FROM generate_series(1, 20) g")
    sql(db, "CREATE PUBLICATION pub FOR TABLE ok, odd")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    sql(db, "UPDATE ok SET \"_pgcdc_mine\" = 'changed', v = 'w0' WHERE id <= 5; DELETE FROM ok WHERE id = 20")
    sql(db, "UPDATE odd SET v = 'lost?' WHERE id <= 3")
    w = drain(db, src, slot, client)
    refused = {t["table"]: t.get("refused") for t in read_windows(client, src, slot)[0].tables}
    assert refused["ok"] is None and refused["odd"]["changes"] == 3
    with pytest.raises(TablesFailed) as failed:
        merge_slot(spark, store=src, slot=slot, delta=lake)
    by = {t.table: t for t in failed.value.result.tables}
    assert by["public.ok"].action == "bootstrapped+merged"
    assert by["public.odd"].action == "failed" and ReservedColumnName.__name__ in by["public.odd"].error
    assert "pgcdc resync" in by["public.odd"].hint
    assert verify_table(db, lake, "public", "ok").equal
    assert w.rows == 6
    sql(db, 'ALTER TABLE odd RENAME COLUMN "_pgcdc_op" TO op')
    resync_tables(db, src, slot=slot, publications="pub", tables=["odd"], s3=client, worker_processes=False)
    sql(db, "UPDATE odd SET v = 'after' WHERE id > 15")
    drain(db, src, slot, client)
    out = merge_slot(spark, store=src, slot=slot, delta=lake)
    assert {t.table: t.action for t in out.tables}["public.odd"] == "resynced+merged"
    assert verify_table(db, lake, "public", "odd").equal


def test_columns_differing_only_in_case_fail_that_table_alone(fresh_db, slot_name, store, spark):
    """``"Name"`` and ``name`` are two columns in PostgreSQL but one in Delta (case-
    insensitive): that table fails with both names and a hint; the other table merges."""
    from airflow_pgcdc.merge.job import IncompatibleSchemaChange, TablesFailed

    client, src, lake = store
    db = fresh_db
    sql(db, 'CREATE TABLE c (id int PRIMARY KEY, "Name" text, name text)')
    sql(db, "CREATE TABLE fine (id int PRIMARY KEY, v text)")
    sql(db, "INSERT INTO c VALUES (1, 'A', 'a'); INSERT INTO fine VALUES (1, 'x')")
    sql(db, "CREATE PUBLICATION pub FOR TABLE c, fine")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    with pytest.raises(TablesFailed) as failed:
        merge_slot(spark, store=src, slot=slot, delta=lake)
    by = {t.table: t for t in failed.value.result.tables}
    assert by["public.fine"].action == "bootstrapped"
    assert by["public.c"].action == "failed" and IncompatibleSchemaChange.__name__ in by["public.c"].error
    assert "'Name', 'name'" in by["public.c"].error and "rename" in by["public.c"].hint
    assert verify_table(db, lake, "public", "fine").equal


def test_a_dropped_table_keeps_its_delta_table_and_is_marked(fresh_db, slot_name, store, spark):
    """A table dropped in PostgreSQL leaves the pipeline: the drain goes on, its Delta table
    keeps its last state, and the merge result marks it (``left_pipeline``); nothing fails."""
    from deltalake import DeltaTable

    from airflow_pgcdc.lake.tables import delta_table_url
    from airflow_pgcdc.store import s3 as s3store

    client, src, lake = store
    db = fresh_db
    sql(db, "CREATE TABLE a (id int PRIMARY KEY, v text); CREATE TABLE b (id int PRIMARY KEY, v text)")
    sql(db, "INSERT INTO a VALUES (1, 'a'); INSERT INTO b SELECT g, 'b' FROM generate_series(1, 10) g")
    sql(db, "CREATE PUBLICATION pub FOR TABLE a, b")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    sql(db, "UPDATE b SET v = 'last' WHERE id = 1")
    drain(db, src, slot, client)
    first = merge_slot(spark, store=src, slot=slot, delta=lake)
    assert not any(t.left_pipeline for t in first.tables)
    sql(db, "DROP TABLE b")
    sql(db, "UPDATE a SET v = 'after' WHERE id = 1")
    drain(db, src, slot, client)
    out = {t.table: t for t in merge_slot(spark, store=src, slot=slot, delta=lake).tables}
    assert out["public.b"].left_pipeline and out["public.b"].action in ("up-to-date", "no-changes")
    assert out["public.a"].action == "merged" and not out["public.a"].left_pipeline
    rows = DeltaTable(delta_table_url(lake, "public", "b"), storage_options=s3store.delta_storage_options())
    assert len(rows.to_pyarrow_table()) == 10, "the Delta table keeps its last state"
