"""A slice resync (``pgcdc resync --where``) on the real PostgreSQL 18 and S3 servers: the
damaged rows of one tenant copied again under a temporary slot's exported snapshot while a
writer keeps changing every tenant, and while drains and merges of the pipeline run past the
slice's consistent point; the merge upserts the slice and the table equals PostgreSQL, the
other tenants' rows untouched by it. Then a slice merged when no window changed the table,
and the refusals (a bad predicate, one that tries a second statement, a table without key)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import psycopg
import pytest
from deltalake import DeltaTable
from lake_helpers import assert_equal, delta_rows, drain, read_windows, sql
from matrix import on_pg18

from airflow_pgcdc.lake.tables import app_id, delta_table_url
from airflow_pgcdc.maintain import maintain_slot
from airflow_pgcdc.merge.job import merge_slot
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.snapshot.resync import BadSlice, resync_tables
from airflow_pgcdc.store import s3 as s3store

pytestmark = on_pg18("a slice is copied and merged the same way on either server")


class Writer(threading.Thread):
    """Updates rows of every tenant and inserts new ones, one transaction at a time."""

    def __init__(self, db):
        super().__init__(daemon=True)
        self.db, self.stop, self.done, self.error = db, threading.Event(), 0, None

    def run(self):
        try:
            with psycopg.connect(self.db, autocommit=True) as c:
                i = 0
                while not self.stop.is_set() or i < 20:
                    i += 1
                    c.execute("UPDATE t SET v = %s WHERE id %% 97 = %s", (f"w{i}", i % 97))
                    c.execute("INSERT INTO t VALUES (%s, %s, 'new')", (100_000 + i, i % 5 + 1))
                    self.done = i
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def test_a_slice_is_upserted_under_a_concurrent_writer(fresh_db, slot_name, store, spark, s3):
    client, src, lake = store
    db = fresh_db
    slot = slot_name()
    sql(db, "CREATE TABLE t (id int PRIMARY KEY, tenant int NOT NULL, v text)")
    sql(db, "INSERT INTO t SELECT g, g % 5 + 1, 'v' || g FROM generate_series(1, 3000) g")
    sql(db, "CREATE TABLE nokey (tenant int, v text)")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t, nokey")
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client)
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake)
    url = delta_table_url(lake, "public", "t")
    opts = s3store.delta_storage_options()

    # damage tenant 3 in the lake: wrong values, rows gone, a row the source never had stays
    dt = DeltaTable(url, storage_options=opts)
    dt.update(predicate="tenant = 3 AND id < 1000", updates={"v": "'bad'"})
    dt.delete("tenant = 3 AND id BETWEEN 1000 AND 1500")
    wrong = [r for r in delta_rows(url, "id") if r["tenant"] == 3]
    assert any(r["v"] == "bad" for r in wrong)

    writer = Writer(db)
    writer.start()
    merged_meanwhile = []

    def drain_and_merge_past_the_point(point, _snapshot):  # the pipeline goes on during the copy
        while writer.done < 5:
            writer.join(0.05)
        drain(db, src, slot, client)
        merged_meanwhile.append(merge_slot(spark, store=src, slot=slot, delta=lake).to_dict())

    proc_env = dict(os.environ, **s3.aws_env())
    done = resync_tables(db, src, slot=slot, publications="pub", tables=["public.t"], where="tenant = 3",
                         s3=client, worker_processes=False, on_slot_created=drain_and_merge_past_the_point)
    writer.stop.set()
    writer.join(60)
    assert writer.error is None and not writer.is_alive()
    entry = done.manifest.table("public", "t")
    assert entry.extra["where"] == "tenant = 3" and 0 < entry.rows < 1000
    assert done.url.startswith(f"{src}/{slot}/slice/"), "kept apart from whole-table copies"
    app = app_id(slot, "public", "t")
    merged = DeltaTable(url, storage_options=opts).transaction_version(app)
    ends = {w.window_seq: w.end for w in read_windows(client, src, slot)}
    assert ends[merged] > LSN.parse(done.manifest.consistent_point), "merged past the slice's point meanwhile"
    assert merged_meanwhile and merged_meanwhile[0]["tables"]
    drain(db, src, slot, client)
    # compacted by Spark here (driver_rows=0); the slice below by the driver (a small batch)
    out = merge_slot(spark, store=src, slot=slot, delta=lake, driver_rows=0).to_dict()
    t = next(x for x in out["tables"] if x["table"] == "public.t")
    assert t["action"] == "merged" and "tenant = 3" in t["note"] and t["metrics"]["pgcdc_compacted_on"] == "spark", t
    assert_equal(db, lake, "public.t", "id")
    live = DeltaTable(url, storage_options=opts)
    assert live.transaction_version(app + ":resync") == int(LSN.parse(done.manifest.consistent_point))
    # applied once: the next merge has nothing to do
    again = merge_slot(spark, store=src, slot=slot, delta=lake).to_dict()
    assert next(x for x in again["tables"] if x["table"] == "public.t")["action"] == "up-to-date"
    assert DeltaTable(url, storage_options=opts).version() == live.version()

    # a slice when no window changed the table since: the CLI, then a merge of it alone
    DeltaTable(url, storage_options=opts).update(predicate="tenant = 4", updates={"v": "'bad'"})
    proc = subprocess.run(
        [sys.executable, "-m", "airflow_pgcdc.cli", "resync", "--dsn", db, "--slot", slot, "--publication", "pub",
         "--store", src, "--tables", "public.t", "--where", "tenant = 4 AND v IS NOT NULL"],
        env=proc_env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["tables"][0]["where"] == "tenant = 4 AND v IS NOT NULL"
    # upkeep keeps the windows a slice not merged yet will read again
    kept = maintain_slot(store=src, slot=slot, delta=lake, retention_hours=0, dry_run=True).to_dict()["windows"]
    assert any("the slice of public.t" in why for why in kept["kept"]), kept
    out = merge_slot(spark, store=src, slot=slot, delta=lake).to_dict()
    t = next(x for x in out["tables"] if x["table"] == "public.t")
    assert t["action"] == "merged" and t["metrics"]["pgcdc_compacted_on"] == "driver", t
    assert_equal(db, lake, "public.t", "id")
    kept = maintain_slot(store=src, slot=slot, delta=lake, retention_hours=0, dry_run=True).to_dict()["windows"]
    assert not any("slice" in why for why in kept["kept"]), kept

    # refused before any slot exists
    for where, table, words in [
        ("tenant = ", "public.t", "is not a predicate on"),
        ("no_such_column = 1", "public.t", "no_such_column"),
        ("true) TO STDOUT; DROP TABLE t; COPY (SELECT 1", "public.t", "is not a predicate on"),
        ("tenant = 1", "public.nokey", "has no primary key or replica identity index"),
        ("  ", "public.t", "needs a predicate"),
    ]:
        with pytest.raises(BadSlice, match=words):
            resync_tables(db, src, slot=slot, publications="pub", tables=[table], where=where, s3=client,
                          worker_processes=False)
    assert sql(db, "SELECT count(*) FROM t")[0][0] > 3000, "the table is still there"
    assert not sql(db, "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE 'pgcdc_rs_%'")
