"""Tables partitioned by the day of a timestamp column (``--table-option
schema.table:partition_by=date(created_at)``), against PostgreSQL, SeaweedFS and Spark, both
engines: the bootstrap adds the generated column ``created_at_date`` (a Delta generated
column: ``CAST(`created_at` AS DATE)``) and partitions by it; merges keep it equal to the UTC
day of every row (updates moving a row to another day included, with the timestamp in the
key and outside it, and NULL); a row with an 'infinity' timestamp is refused for its table
alone, named (delta-rs cannot compute its day), unless a delete removes it in the batch; the merge reads only the batch's days when the
timestamp is a key column; a keyless table's appends, updates and deletes carry it; a resync
keeps it; a Spark reader filtering on the timestamp prunes by the day; a date() of a column
that is not a timestamp fails that table alone, named; every table equals PostgreSQL."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pytest
from lake_helpers import drain, sql
from matrix import on_pg18

from airflow_pgcdc.lake.tables import delta_table_url
from airflow_pgcdc.merge.errors import TablesFailed
from airflow_pgcdc.merge.jars import unavailable_reason
from airflow_pgcdc.merge.job import merge_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.snapshot.resync import resync_tables
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.verify import verify_table

_MISSING = unavailable_reason()

OPTIONS = {"public.orders": {"partition_by": "date(created_at)"},
           "public.events": {"partition_by": "date(at) as day"},
           "public.acct": {"partition_by": "date(seen)"},
           "public.wrong": {"partition_by": "date(v)"},
           "public.inf": {"partition_by": "date(at)"}}
FAILING = {"public.wrong", "public.inf"}  # every merge: one table's trouble does not stop the others


def _merge(spark, src, slot, lake, engine):
    try:
        out = merge_slot(spark, store=src, slot=slot, delta=lake, engine=engine, table_options=OPTIONS)
    except TablesFailed as failed:
        out = failed.result
    by = {t.table: t for t in out.tables}
    assert {t for t, r in by.items() if r.action == "failed"} == FAILING, out.to_dict()
    return by


def _table(lake, name):
    from deltalake import DeltaTable

    return DeltaTable(delta_table_url(lake, "public", name), storage_options=s3store.delta_storage_options())


def _check_days(lake, name, source, generated):
    """Every row's generated column is the UTC day of its timestamp (read as raw day numbers,
    so the day of 'infinity', past Python's dates, is checked too)."""
    t = _table(lake, name).to_pyarrow_table()
    days = t.column(generated).cast(pa.int32()).to_pylist()
    micros = t.column(source).cast(pa.int64()).to_pylist()
    want = [None if m is None else m // 86_400_000_000 for m in micros]
    assert days == want, (name, list(zip(micros, days, strict=True)))
    return t


def _run(db, slot, client, src, lake, spark, engine):
    sql(db, "CREATE TABLE orders (id int, created_at timestamptz, v text, PRIMARY KEY (id, created_at))")
    sql(db, "INSERT INTO orders SELECT g, TIMESTAMPTZ '2026-11-01 22:30+00' + (g % 5) * INTERVAL '1 day', 'v' || g "
            "FROM generate_series(1, 50) g")
    sql(db, "CREATE TABLE events (at timestamp, kind text)")
    sql(db, "ALTER TABLE events REPLICA IDENTITY FULL")
    sql(db, "INSERT INTO events SELECT TIMESTAMP '2026-11-01 12:00' + (g % 3) * INTERVAL '1 day', 'k' || g "
            "FROM generate_series(1, 12) g")
    sql(db, "CREATE TABLE acct (id int PRIMARY KEY, seen timestamptz, v text)")
    sql(db, "INSERT INTO acct SELECT g, TIMESTAMPTZ '2026-11-01 00:00+00' + g * INTERVAL '7 hours', 'v' || g "
            "FROM generate_series(1, 20) g")
    sql(db, "INSERT INTO acct VALUES (21, NULL, 'never')")
    sql(db, "CREATE TABLE wrong (id int PRIMARY KEY, v text)")
    sql(db, "INSERT INTO wrong VALUES (1, 'a')")
    sql(db, "CREATE TABLE inf (id int PRIMARY KEY, at timestamptz)")
    sql(db, "INSERT INTO inf VALUES (1, now()), (2, 'infinity')")
    sql(db, "CREATE PUBLICATION pub FOR TABLE orders, events, acct, wrong, inf")
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    by = _merge(spark, src, slot, lake, engine)
    # a date() of a text column, an 'infinity' to partition: those tables alone fail, named
    assert "date(v)" in by["public.wrong"].error and "not a timestamp" in by["public.wrong"].error
    assert "'at' holds 'infinity'" in by["public.inf"].error and "pgcdc resync" in by["public.inf"].hint
    assert {by[t].action for t in ("public.orders", "public.events", "public.acct")} == {"bootstrapped"}, by

    orders = _table(lake, "orders")
    assert orders.metadata().partition_columns == ["created_at_date"]
    field = orders.schema().to_arrow().field("created_at_date")
    assert field.type == pa.date32()
    assert field.metadata[b"delta.generationExpression"] == b"CAST(`created_at` AS DATE)"
    assert _table(lake, "events").metadata().partition_columns == ["day"]
    _check_days(lake, "orders", "created_at", "created_at_date")
    _check_days(lake, "events", "at", "day")
    _check_days(lake, "acct", "seen", "seen_date")
    files = orders.get_add_actions(flatten=True).num_rows
    assert files >= 5  # five days

    # changes on one day of orders; a row moved to another day (its key changes); acct rows
    # moved between days without a key change, one to NULL and one from NULL; keyless
    # events appended, updated across days and deleted
    sql(db, "UPDATE orders SET v = 'changed' WHERE created_at = TIMESTAMPTZ '2026-11-03 22:30+00'")
    sql(db, "UPDATE orders SET created_at = TIMESTAMPTZ '2026-11-09 23:59:59+00' WHERE id = 5")
    sql(db, "UPDATE acct SET seen = seen + INTERVAL '3 days' WHERE id IN (2, 3); "
            "UPDATE acct SET seen = NULL WHERE id = 4; UPDATE acct SET seen = '2026-12-24 23:00-05' WHERE id = 21")
    sql(db, "INSERT INTO events VALUES ('2026-11-20 23:59:59', 'late'), ('infinity', 'inf')")
    sql(db, "DELETE FROM events WHERE kind = 'inf'")  # gone in the batch: nothing to refuse
    sql(db, "UPDATE events SET at = at + INTERVAL '1 day' WHERE kind = 'k1'; DELETE FROM events WHERE kind = 'k2'")
    drain(db, src, slot, client)
    by = _merge(spark, src, slot, lake, engine)
    assert {by[t].action for t in ("public.orders", "public.events", "public.acct")} == {"merged"}, by
    if engine == "delta-rs":  # the bound: the days of the batch's keys, not the whole table
        assert by["public.orders"].metrics["num_target_files_scanned"] < files, by["public.orders"].metrics
    t = _check_days(lake, "orders", "created_at", "created_at_date")
    moved = [r for r in t.to_pylist() if r["id"] == 5]
    assert [str(r["created_at_date"]) for r in moved] == ["2026-11-09"], moved
    acct = {r["id"]: r for r in _check_days(lake, "acct", "seen", "seen_date").to_pylist()}
    assert acct[4]["seen_date"] is None and str(acct[21]["seen_date"]) == "2026-12-25"
    days = set(_check_days(lake, "events", "at", "day").column("day").cast(pa.int32()).to_pylist())
    assert (dt.date(2026, 11, 20) - dt.date(1970, 1, 1)).days in days

    # a resync keeps the generated column and the partitioning
    resync_tables(db, src, slot=slot, publications="pub", tables=["public.orders"], s3=client, worker_processes=False)
    # (an 'infinity' key inserted and deleted in the batch: a delete writes no day; its value
    # has no Python date, so this batch is merged without the partition bound)
    sql(db, "INSERT INTO orders VALUES (1000, 'infinity', 'inf'); DELETE FROM orders WHERE id = 1000")
    drain(db, src, slot, client)
    _merge(spark, src, slot, lake, engine)
    orders = _table(lake, "orders")
    assert orders.metadata().partition_columns == ["created_at_date"]
    assert orders.schema().to_arrow().field("created_at_date").metadata[b"delta.generationExpression"]
    _check_days(lake, "orders", "created_at", "created_at_date")

    # the timestamp of a date partition dropped in PostgreSQL: both stay in Delta, an updated
    # row's NULL as for any dropped column (the merge computed the date from a column the
    # batch no longer has: KeyError), the other rows' kept
    sql(db, "ALTER TABLE acct DROP COLUMN seen")
    sql(db, "UPDATE acct SET v = 'after drop' WHERE id = 2; INSERT INTO acct VALUES (22, 'new')")
    drain(db, src, slot, client)
    by = _merge(spark, src, slot, lake, engine)
    assert by["public.acct"].action == "merged", by["public.acct"]
    acct = {r["id"]: r for r in _check_days(lake, "acct", "seen", "seen_date").to_pylist()}
    assert acct[2]["v"] == "after drop" and acct[2]["seen"] is None and acct[22]["seen_date"] is None
    assert acct[5]["seen"] is not None and acct[5]["seen_date"] is not None

    for name in ("orders", "events", "acct"):
        report = verify_table(db, lake, "public", name)
        assert report.equal, (name, json.dumps(report.to_dict(), default=str)[-2000:])

    # a Spark reader's filter on the timestamp becomes a partition filter on the day
    if _MISSING is None and engine == "delta-spark":
        from airflow_pgcdc.merge.sinks.deltaspark import s3a

        df = spark.read.format("delta").load(s3a(delta_table_url(lake, "public", "orders")))
        q = df.where("created_at >= TIMESTAMP '2026-11-05 00:00:00'")
        plan = q._jdf.queryExecution().executedPlan().toString()
        assert "PartitionFilters: [" in plan and "created_at_date" in plan.split("PartitionFilters: [", 1)[1], plan
        assert q.count() == 11  # the ten of 2026-11-05, and id 5 moved to 2026-11-09


@pytest.mark.slow
@on_pg18("partitioning is the merge's: no server difference")
def test_generated_date_partitions_on_the_delta_rs_engine(fresh_db, slot_name, store, spark):
    client, src, lake = store
    _run(fresh_db, slot_name(), client, src, lake, spark, "delta-rs")


@pytest.mark.slow
@pytest.mark.delta_spark
@pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")
@on_pg18("partitioning is the merge's: no server difference")
def test_generated_date_partitions_on_delta_spark(fresh_db, slot_name, store, spark):
    client, src, lake = store
    _run(fresh_db, slot_name(), client, src, lake, spark, "delta-spark")
