"""Columns followed by identity (``attnum``), not by name, against real PostgreSQL 15/18.

Before this, each of these ended green with a wrong Delta table (``pgcdc verify`` alone saw
it): ``RENAME COLUMN`` split the column in two (the merge added the new name, the old one
kept its old values); a column dropped and added again under its name got the old
column's values back in the rows the window did not change; ``ALTER COLUMN … TYPE …
USING`` that keeps the Delta type (``int USING a * 10``, ``varchar(10)`` to ``varchar(20)
USING upper(v)``) changed every row in PostgreSQL and none in Delta. Now the merge refuses
each such table alone (``ColumnIdentityChanged`` / ``TableRewritten``, with the ``pgcdc
resync`` hint), merges the others (a type widened without a rewrite, ``VACUUM FULL``, a
column dropped for good), and after the resync every table verifies equal.
"""

from __future__ import annotations

import pytest
from lake_helpers import drain, read_windows, sql

from airflow_pgcdc.merge.job import ColumnIdentityChanged, TableRewritten, TablesFailed, merge_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.snapshot.resync import resync_tables
from airflow_pgcdc.verify import verify_table

REFUSED = {
    "ren": ColumnIdentityChanged,   # renamed, first change after it in the batch
    "rea": ColumnIdentityChanged,   # dropped and added again under its name in one batch
    "gone": ColumnIdentityChanged,  # dropped in one merged window, added again later
    "typ": TableRewritten,          # int USING a * 10: same Delta type, every row changed
    "vch": TableRewritten,          # varchar(10) -> varchar(20) USING upper(v)
}
MERGED = ("wid", "vf", "ok", "dropped")  # widened without a rewrite, VACUUM FULL, nothing, a drop
TABLES = tuple(REFUSED) + MERGED


@pytest.mark.slow
def test_renames_readds_and_rewriting_type_changes_fail_that_table_until_a_resync(
        fresh_db, slot_name, store, spark):
    client, src, lake = store
    db = fresh_db
    for t in TABLES:
        sql(db, f"CREATE TABLE {t} (id int PRIMARY KEY, a int, v varchar(10), c int)")
        sql(db, f"INSERT INTO {t} SELECT g, g, 'v' || g, g FROM generate_series(1, 30) g")
    sql(db, f"CREATE PUBLICATION pub FOR TABLE {', '.join(TABLES)}")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    merge_slot(spark, store=src, slot=slot, delta=lake)
    copy = {t["table"]: t for t in _snapshot_tables(client, src, slot)}
    assert [c.get("attnum") for c in copy["ren"]["columns"]] == [1, 2, 3, 4]

    # window 0: every table changes; 'gone' and 'drop' lose a column (Delta keeps it)
    sql(db, "ALTER TABLE gone DROP COLUMN c; ALTER TABLE dropped DROP COLUMN c")
    for t in TABLES:
        sql(db, f"UPDATE {t} SET a = -a WHERE id = 1")
    drain(db, src, slot, client)
    first = merge_slot(spark, store=src, slot=slot, delta=lake)
    assert {t.action for t in first.tables} == {"merged"}, first.tables

    # window 1: the DDL, then changes
    sql(db, "ALTER TABLE ren RENAME COLUMN v TO title")
    sql(db, "UPDATE ren SET title = 'renamed' WHERE id <= 3")
    sql(db, "UPDATE rea SET v = 'before' WHERE id = 2")
    sql(db, "ALTER TABLE rea DROP COLUMN v")
    sql(db, "ALTER TABLE rea ADD COLUMN v varchar(10)")
    sql(db, "UPDATE rea SET v = 'after' WHERE id = 3")
    sql(db, "ALTER TABLE gone ADD COLUMN c int")
    sql(db, "UPDATE gone SET c = 100 WHERE id = 4")
    sql(db, "ALTER TABLE typ ALTER COLUMN a TYPE int USING a * 10")
    sql(db, "UPDATE typ SET v = 'u' WHERE id = 5")
    sql(db, "ALTER TABLE vch ALTER COLUMN v TYPE varchar(20) USING upper(v)")
    sql(db, "UPDATE vch SET a = 0 WHERE id = 6")
    sql(db, "ALTER TABLE wid ALTER COLUMN v TYPE varchar(20)")  # no rewrite: the values stay
    sql(db, "UPDATE wid SET v = 'a longer value' WHERE id = 7")
    sql(db, "VACUUM FULL vf")
    sql(db, "UPDATE vf SET v = 'u' WHERE id = 8")
    sql(db, "UPDATE ok SET v = 'u' WHERE id = 9; UPDATE dropped SET v = 'u' WHERE id = 9")
    drain(db, src, slot, client)
    versions = {t["table"]: t["relation_versions"] for m in read_windows(client, src, slot)
                if m.window_seq == 1 for t in m.tables}
    assert [c["name"] for c in versions["ren"][-1]["columns"]] == ["id", "a", "title", "c"]
    assert versions["ren"][-1]["columns"][2]["attnum"] == 3  # the drain recorded the identity

    with pytest.raises(TablesFailed) as failed:
        merge_slot(spark, store=src, slot=slot, delta=lake)
    by = {t.table.split(".")[1]: t for t in failed.value.result.tables}
    for t, error in REFUSED.items():
        assert by[t].action == "failed", (t, by[t])
        assert by[t].error.startswith(error.__name__), (t, by[t].error)
        assert "pgcdc resync" in by[t].hint and f"--tables '\"public\".\"{t}\"'" in by[t].hint, by[t].hint
    assert "'v' was renamed to 'title'" in by["ren"].error
    assert "'v' was dropped and added again" in by["rea"].error
    assert "'c'" in by["gone"].error and "dropped since" in by["gone"].error
    assert "'a' was altered" in by["typ"].error and "'v' was altered" in by["vch"].error
    for t in MERGED:
        assert by[t].action == "merged", (t, by[t])
        assert verify_table(db, lake, "public", t).equal, t
    for t in REFUSED:  # nothing merged: the Delta table is the last good state, not a mix
        assert not verify_table(db, lake, "public", t).equal, t

    # a resync of the refused tables: replaced from copies taken after the DDL, then followed
    resync_tables(db, src, slot=slot, publications="pub", tables=list(REFUSED), s3=client,
                  worker_processes=False)
    for t in TABLES:
        sql(db, f"UPDATE {t} SET a = 7 WHERE id BETWEEN 10 AND 12")
    drain(db, src, slot, client)
    out = merge_slot(spark, store=src, slot=slot, delta=lake)
    actions = {t.table.split(".")[1]: t.action for t in out.tables}
    assert actions == {**dict.fromkeys(REFUSED, "resynced+merged"), **dict.fromkeys(MERGED, "merged")}, actions
    for t in TABLES:
        assert verify_table(db, lake, "public", t).equal, t

    # and the next windows merge on the copies' identities
    sql(db, "UPDATE ren SET title = 'later' WHERE id = 20; UPDATE gone SET c = 1 WHERE id = 20")
    drain(db, src, slot, client)
    out = merge_slot(spark, store=src, slot=slot, delta=lake)
    assert {t.table.split(".")[1]: t.action for t in out.tables if t.action != "no-changes"} == {
        "ren": "merged", "gone": "merged"}
    assert verify_table(db, lake, "public", "ren").equal and verify_table(db, lake, "public", "gone").equal


def _snapshot_tables(client, src, slot):
    from airflow_pgcdc.store.layout import Layout
    from airflow_pgcdc.store.manifest import committed_snapshot

    return [t.to_dict() for t in committed_snapshot(client, Layout.parse(src), slot).tables]
