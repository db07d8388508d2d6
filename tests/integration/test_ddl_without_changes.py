"""DDL the stream does not describe, against real PostgreSQL 15/18, S3 and Spark.

pgoutput sends a table's Relation message only before its next change. Before this, a
column added to a table that then got no change (``ALTER TABLE … ADD COLUMN`` on a table
left alone, a column an inheritance child gets from its parent), or added after the
table's last change in the window, was missing from its Delta table until the table's next
change (verify: DIFFERENT; the merge green), and a rename of such a table went unseen. The
drain now compares the pipeline's tables with the catalog at each window's end and gives a
table whose columns changed a relation version with no rows: the merge adds the column,
with the default the existing rows read, in the window that holds the DDL, and refuses a
rename there.
"""

from __future__ import annotations

import pytest
from lake_helpers import drain, read_windows, sql

from airflow_pgcdc.merge.job import TablesFailed, merge_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.verify import verify_table

TABLES = ("alone", "late", "parent", "child", "plain", "ren", "busy", "clash")


def _run(db, src, lake, client, slot, spark, **merge):
    sql(db, "CREATE TABLE alone (id int PRIMARY KEY, v text)")
    sql(db, "CREATE TABLE late (id int PRIMARY KEY, v text)")
    sql(db, "CREATE TABLE parent (id int PRIMARY KEY, v text)")
    sql(db, "CREATE TABLE child (extra int) INHERITS (parent); ALTER TABLE child ADD PRIMARY KEY (id)")
    sql(db, "CREATE TABLE plain (id int PRIMARY KEY, v text)")
    sql(db, "CREATE TABLE ren (id int PRIMARY KEY, v text)")
    sql(db, "CREATE TABLE busy (id int PRIMARY KEY, v text)")
    sql(db, "CREATE TABLE clash (id int PRIMARY KEY, v text)")
    for t in ("alone", "late", "plain", "ren", "busy", "clash"):
        sql(db, f"INSERT INTO {t} SELECT g, 'v' || g FROM generate_series(1, 20) g")
    sql(db, "INSERT INTO parent SELECT g, 'p' || g FROM generate_series(1, 10) g")
    sql(db, "INSERT INTO child SELECT g, 'c' || g, g FROM generate_series(11, 20) g")
    sql(db, f"CREATE PUBLICATION pub FOR TABLE {', '.join(TABLES)}")
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    sql(db, "UPDATE busy SET v = 'w0' WHERE id = 1")
    drain(db, src, slot, client)  # window 0: records the tables' columns
    merge_slot(spark, store=src, slot=slot, delta=lake, **merge)

    sql(db, "ALTER TABLE alone ADD COLUMN d int DEFAULT 7, ADD COLUMN n text")  # then left alone
    sql(db, "UPDATE late SET v = 'before' WHERE id = 2")
    sql(db, "ALTER TABLE late ADD COLUMN d text DEFAULT 'bar'")  # after its last change in the window
    sql(db, "ALTER TABLE parent ADD COLUMN p int DEFAULT 3")  # the child gets it too; neither changes
    sql(db, "ALTER TABLE ren RENAME COLUMN v TO title")  # no change after it: seen all the same
    sql(db, "UPDATE busy SET v = 'w1' WHERE id = 2")
    # a column named like the change metadata: no version can be made for it (its next change
    # refuses the table, as before); that table's trouble does not stop the others being followed
    sql(db, "ALTER TABLE clash ADD COLUMN _pgcdc_op int")
    drain(db, src, slot, client)
    w1 = read_windows(client, src, slot)[-1]
    rows = {t["table"]: sum(v["rows"] for v in t["relation_versions"]) for t in w1.tables}
    assert rows == {"alone": 0, "late": 1, "parent": 0, "child": 0, "ren": 0, "busy": 1}, rows
    with pytest.raises(TablesFailed) as failed:
        merge_slot(spark, store=src, slot=slot, delta=lake, **merge)
    by = {t.table.split(".")[1]: t for t in failed.value.result.tables}
    assert by["ren"].action == "failed" and "'v' was renamed to 'title'" in by["ren"].error, by["ren"]
    assert {t: by[t].action for t in ("alone", "late", "parent", "child")} == dict.fromkeys(
        ("alone", "late", "parent", "child"), "merged"), by
    assert sorted(by["alone"].added_columns) == ["d", "n"] and by["child"].added_columns == ["p"]
    for t in ("alone", "late", "parent", "child", "plain", "busy"):
        assert verify_table(db, lake, "public", t).equal, t

    # the next window: nothing changed in the catalog, nothing added
    sql(db, "UPDATE busy SET v = 'w2' WHERE id = 3")
    drain(db, src, slot, client)
    assert [t["table"] for t in read_windows(client, src, slot)[-1].tables] == ["busy"]


@pytest.mark.slow
def test_columns_added_without_a_change_reach_the_delta_table_in_their_window(fresh_db, slot_name, store, spark,
                                                                            driver_rows):
    client, src, lake = store
    _run(fresh_db, src, lake, client, slot_name(), spark, driver_rows=driver_rows)


@pytest.mark.slow
@pytest.mark.parametrize("pg_server", ["pg18"], indirect=True)  # the merge engine is the axis here
def test_columns_added_without_a_change_on_delta_spark(fresh_db, slot_name, store, spark_with_delta):
    client, src, lake = store
    _run(fresh_db, src, lake, client, slot_name(), spark_with_delta, engine="delta-spark")
