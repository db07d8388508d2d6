"""``pgcdc status`` lists the tables that left the pipeline, per table, in its JSON and its
text: one dropped, one let go with ``--forget-table``; against real PostgreSQL 15/18, the S3
server and Delta tables the merge wrote. Tables that left do not hold ``merged_through``
back (they get no commit again)."""

from __future__ import annotations

import json
import subprocess
import sys

from lake_helpers import sql

from airflow_pgcdc.drain.drain import drain_window
from airflow_pgcdc.lake.tables import delta_table_url
from airflow_pgcdc.merge.job import merge_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3


def pgcdc(*args: str, env: dict) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "airflow_pgcdc.cli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **env})


def test_status_lists_dropped_and_forgotten_tables(fresh_db, slot_name, s3, s3_bucket, monkeypatch, spark):
    env = s3.aws_env()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    db, client = fresh_db, s3.client()
    src, lake = f"s3://{s3_bucket}/cdc", f"s3://{s3_bucket}/lake"
    sql(db, "CREATE TABLE a (id int PRIMARY KEY, v text); CREATE TABLE b (id int PRIMARY KEY, v text); "
            'CREATE TABLE "C t" (id int PRIMARY KEY, v text)')
    sql(db, "INSERT INTO a VALUES (1, 'a'); INSERT INTO b VALUES (1, 'b'); INSERT INTO \"C t\" VALUES (1, 'c')")
    sql(db, 'CREATE PUBLICATION pub FOR TABLE a, b, "C t"')
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    sql(db, "UPDATE a SET v = 'a0'; UPDATE b SET v = 'b0'; UPDATE \"C t\" SET v = 'c0'")
    drain_window(db, src, slot=slot, publications=["pub"], s3=client)  # window 0
    merge_slot(spark, store=src, slot=slot, delta=lake)

    sql(db, "DROP TABLE b")
    sql(db, 'ALTER PUBLICATION pub DROP TABLE "C t"')
    sql(db, "UPDATE a SET v = 'a1'")
    drain_window(db, src, slot=slot, publications=["pub"], s3=client,
                 forget_tables=['public."C t"'])  # window 1
    sql(db, "UPDATE a SET v = 'a2'")
    drain_window(db, src, slot=slot, publications=["pub"], s3=client)  # window 2
    out = {t.table: t for t in merge_slot(spark, store=src, slot=slot, delta=lake).tables}
    assert out["public.b"].left_pipeline and out["public.C t"].left_pipeline and not out["public.a"].left_pipeline

    proc = pgcdc("status", "--dsn", db, "--slot", slot, "--from", src, "--delta", lake, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    store = json.loads(proc.stdout)["store"]
    left = {t["table"]: t for t in store["left_pipeline"]}
    assert set(left) == {"public.b", "public.C t"}, store
    assert left["public.b"]["reason"] == "dropped" and left["public.C t"]["reason"] == "forgotten"
    for name in ("b", "C t"):
        t = left[f"public.{name}"]
        assert t["merged_through"] == 0 and t["last_window"] == 0, t
        assert t["delta_url"] == delta_table_url(lake, "public", name)
    # a is merged through window 2: the tables that left do not hold the slot back
    assert store["merged_per_table"]["public.a"] == 2
    assert store["merged_through"] == 2 and store["windows_not_merged"] == 0, store

    proc = pgcdc("status", "--dsn", db, "--slot", slot, "--from", src, "--delta", lake, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("left pipeline")]
    assert [line.split(None, 2)[2] for line in lines] == [
        "public.C t: out of the publication (--forget-table); its Delta table keeps its last state, "
        "merged through window 0 (last changes in window 0)",
        "public.b: dropped; its Delta table keeps its last state, merged through window 0 "
        "(last changes in window 0)",
    ], proc.stdout
    assert "3 committed, 0 not yet merged (merged through window 2)" in proc.stdout, proc.stdout

    # without --delta: still listed, without merge positions
    proc = pgcdc("status", "--dsn", db, "--slot", slot, "--from", src, "--json", env=env)
    left = {t["table"]: t for t in json.loads(proc.stdout)["store"]["left_pipeline"]}
    assert set(left) == {"public.b", "public.C t"} and "merged_through" not in left["public.b"]
