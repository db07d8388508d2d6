"""Table shapes a real database has, from snapshot to Delta and ``pgcdc verify``, against
real PostgreSQL 15/18: inheritance parents published with or without their children,
partitioned tables both ways, generated columns, tables without a key (a ``pgbench``
database), odd names, keys duplicated inside a transaction (a ``DEFERRABLE`` key)."""

from __future__ import annotations

import psycopg
import pytest
from test_merge import assert_equal, drain, sql

from airflow_pgcdc.merge.job import merge_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.verify import verify_table


@pytest.fixture(scope="module")
def spark():
    from airflow_pgcdc.merge.session import spark_session

    s = spark_session("local[2]")
    yield s
    s.stop()


@pytest.fixture
def store(s3, s3_bucket, monkeypatch):
    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    return s3.client(), f"s3://{s3_bucket}/cdc", f"s3://{s3_bucket}/lake"


def delta_ids(lake, schema, table):
    from deltalake import DeltaTable

    from airflow_pgcdc.merge.plan import delta_table_url
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
    manifest = snapshot_to_s3(db, src, slot=slot, publication="pub", s3_client=client, workers=1,
                              worker_processes=False)
    assert manifest.table("public", "p").rows == 2
    sql(db, "INSERT INTO p VALUES (5, 'p5')")
    sql(db, "INSERT INTO c VALUES (6, 'c6', 60)")
    sql(db, "UPDATE c SET v = 'c3b' WHERE id = 3")
    drain(db, src, slot, client)
    merge_slot(spark, source=src, slot=slot, delta=lake)
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
    manifest = snapshot_to_s3(db, src, slot=slot, publication="pub", s3_client=client, workers=1,
                              worker_processes=False)
    names = sorted(t.table for t in manifest.tables)
    assert names == (["m"] if via_root else ["m_eu", "m_us"])
    sql(db, "INSERT INTO m VALUES (4, 'us', 'd')")
    sql(db, "UPDATE m SET v = 'a2' WHERE id = 1")
    sql(db, "UPDATE m SET region = 'us' WHERE id = 3")  # moves to another partition
    sql(db, "DELETE FROM m WHERE id = 2")
    drain(db, src, slot, client)
    merge_slot(spark, source=src, slot=slot, delta=lake)
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
    snapshot_to_s3(db, src, slot=slot, publication="pub", s3_client=client, workers=1, worker_processes=False)
    sql(db, "INSERT INTO g (id, a) VALUES (3, 3)")
    sql(db, "UPDATE g SET a = 10 WHERE id = 1")
    drain(db, src, slot, client)
    merge_slot(spark, source=src, slot=slot, delta=lake)
    result = verify_table(db, lake, "public", "g")
    assert result.equal, result.comparison


def test_pgbench_database_with_a_keyless_table(fresh_db, slot_name, store, spark):
    """A database made by ``pgbench -i`` with ``FOR ALL TABLES``: ``pgbench_history`` has no
    key. It used to stop the first merge of every table (NoMergeKey); now it is appended
    (insert-only), the keyed tables are merged, a replay adds nothing, and a keyless table
    whose changes cannot be applied (an update) fails alone, named in the error, while the
    others are committed."""
    import subprocess

    from psycopg.conninfo import conninfo_to_dict

    from airflow_pgcdc.merge.job import TablesFailed
    from airflow_pgcdc.sandbox import pg_bin_dir

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
    snapshot_to_s3(db, src, slot=slot, publication="pub", s3_client=client, workers=1, worker_processes=False)
    bench("-t", "200", "-c", "2", "-n")
    sql(db, "INSERT INTO notes VALUES ('second')")
    drain(db, src, slot, client)
    first = merge_slot(spark, source=src, slot=slot, delta=lake)
    keyless = {"pgbench_history": ["tid", "bid", "aid", "delta", "mtime"], "notes": ["body"]}  # verify needs one
    for name in ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history", "notes"):
        assert verify_table(db, lake, "public", name, key=keyless.get(name)).equal, name
    history = {t.table: t for t in first.tables}["public.pgbench_history"]
    assert history.action == "bootstrapped+merged" and history.merged_rows == 400
    # a keyless table gets an update: only that table fails; the others are merged
    sql(db, "UPDATE notes SET body = 'edited' WHERE body = 'first'")
    bench("-t", "50", "-c", "1", "-n")
    drain(db, src, slot, client)
    with pytest.raises(TablesFailed, match="public.notes") as ei:
        merge_slot(spark, source=src, slot=slot, delta=lake)
    outcome = {t.table: t for t in ei.value.result.tables}
    assert outcome["public.notes"].action == "failed" and "KeylessChange" in outcome["public.notes"].error
    assert "primary key" in outcome["public.notes"].hint
    assert outcome["public.pgbench_accounts"].action == "merged"
    for name in ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history"):
        assert verify_table(db, lake, "public", name, key=keyless.get(name)).equal, name
    # a replay appends nothing twice
    with pytest.raises(TablesFailed):
        merge_slot(spark, source=src, slot=slot, delta=lake)
    assert verify_table(db, lake, "public", "pgbench_history", key=keyless["pgbench_history"]).equal


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
    snapshot_to_s3(db, src, slot=slot, publication="pub", s3_client=client, workers=1, worker_processes=False)
    sql(db, """INSERT INTO "my.schema"."Odd Table" VALUES (3, 'z', 3, 's', 'n', 3)""")
    sql(db, """UPDATE "my.schema"."Odd Table" SET "a.b" = 'x2', "sp ace" = 10 WHERE "k.id" = 1""")
    sql(db, """UPDATE "my.schema"."Odd Table" SET "k.id" = 20 WHERE "k.id" = 2""")
    sql(db, """DELETE FROM "my.schema"."Odd Table" WHERE "k.id" = 3""")
    drain(db, src, slot, client)
    merge_slot(spark, source=src, slot=slot, delta=lake)
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
    snapshot_to_s3(db, src, slot=slot, publication="pub", s3_client=client, workers=1, worker_processes=False)
    sql(db, "UPDATE t SET id = 3 - id WHERE id IN (1, 2)")  # the swap, one statement
    drain(db, src, slot, client)
    merge_slot(spark, source=src, slot=slot, delta=lake)
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
    merge_slot(spark, source=src, slot=slot, delta=lake)
    assert_equal(db, lake, "public.t", "id")
