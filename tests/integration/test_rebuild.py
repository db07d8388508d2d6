"""``pgcdc rebuild`` on the real PostgreSQL 18 and S3 servers: a damaged live table and its
changelog rebuilt from the store (the snapshot and every window, kept by upkeep with a long
retention) and swapped in, one commit per table; the pipeline merges on from there. The
refusal when upkeep removed what a rebuild needs: ``test_maintain_expired.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake
from matrix import on_pg18
from test_maintain import TABLES, assert_equal, change, drain, setup_pipeline

from airflow_pgcdc.lake.lock import DeltaRootBusy, delta_root_lock
from airflow_pgcdc.lake.tables import app_id, changelog_url, delta_table_url
from airflow_pgcdc.maintain import maintain_slot
from airflow_pgcdc.merge.job import merge_slot
from airflow_pgcdc.merge.rebuild import NotReplayable, rebuild_slot, swap_in
from airflow_pgcdc.store import s3 as s3store


def changelog_rows(lake, table) -> int:
    dt = DeltaTable(changelog_url(lake, "public", table), storage_options=s3store.delta_storage_options())
    return dt.to_pyarrow_dataset().count_rows()


@pytest.mark.slow
@on_pg18("a rebuild reads the store: no server difference")
def test_pgcdc_rebuild_repairs_a_damaged_table_and_its_history(fresh_db, slot_name, store, spark, s3):
    client, src, lake = store
    db = fresh_db
    slot = slot_name()
    setup_pipeline(db, client, src, slot)
    for i in range(3):  # windows 0..2, merged with a changelog
        change(db, i)
        drain(db, src, slot, client)
        merge_slot(spark, store=src, slot=slot, delta=lake, history="changelog")
    opts = s3store.delta_storage_options()
    url = delta_table_url(lake, "public", "t")
    changes_before = changelog_rows(lake, "t")
    # damage: a stray delete on the live table (a bad job, a wrong hand-run statement)
    DeltaTable(url, storage_options=opts).delete("id <= 100")
    # upkeep with a long retention keeps every window and the copy: a rebuild stays possible
    kept = maintain_slot(store=src, slot=slot, delta=lake, retention_hours=1000).to_dict()
    assert kept["windows"]["expired"] == [], kept["windows"]
    damaged = DeltaTable(url, storage_options=opts).version()  # after upkeep's own commits

    proc = subprocess.run(
        [sys.executable, "-m", "airflow_pgcdc.cli", "rebuild", "--store", src, "--slot", slot, "--delta", lake,
         "--history", "changelog", "--target-file-mb", "0.02"],
        env=dict(os.environ, **s3.aws_env()), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    by = {t["table"]: t for t in out["tables"]}
    assert set(by) == {f"public.{n}" for n in TABLES}
    assert by["public.t"]["delta_url"] == url, "the result names the live tables"
    swapped = {s["live"]: s for s in out["rebuild"]["swapped"]}
    assert set(swapped) == {delta_table_url(lake, "public", n) for n in TABLES} | {
        changelog_url(lake, "public", n) for n in ("t", "u")}, sorted(swapped)  # q never changed: no changelog
    assert swapped[url]["window"] == 2 and swapped[url]["live_version"] == damaged + 1
    assert by["public.t"]["delta_version"] == damaged + 1
    scratch = out["rebuild"]["scratch"]
    assert scratch.startswith(f"{lake}_rebuild/") and out["rebuild"]["objects_removed"] > 0
    assert list(s3store.list_keys(client, scratch.split("/")[2], "lake_rebuild/")) == [], "the scratch root is gone"

    assert_equal(db, lake)  # t repaired, u and q as they were
    live = DeltaTable(url, storage_options=opts)
    assert live.version() == damaged + 1, "one commit on the live table"
    assert live.transaction_version(app_id(slot, "public", "t")) == 2, "the merge position is kept"
    assert len(live.file_uris()) > 1, "the rebuild's file size (--target-file-mb 0.02) is kept"
    old = DeltaTable(url, storage_options=opts, version=damaged)
    assert old.to_pyarrow_dataset().count_rows() == live.to_pyarrow_dataset().count_rows() - 100, "time travel"
    assert changelog_rows(lake, "t") == changes_before, "the changelog rebuilt, not appended twice"

    # the swap holds the live root's lock (a Delta Spark merge there commits unconditionally):
    # while another job holds it, the swap waits, then gives up without a commit
    scratch2 = f"{lake}_rebuild/held"
    merge_slot(spark, store=src, slot=slot, delta=scratch2, tables=["public.q"])
    held = {"delta": scratch2, "tables": [{"table": "public.q", "action": "bootstrapped", "app_id": app_id(
        slot, "public", "q"), "delta_url": delta_table_url(scratch2, "public", "q")}]}
    q_version = DeltaTable(delta_table_url(lake, "public", "q"), storage_options=opts).version()
    with delta_root_lock(client, lake, job="a delta-spark merge"), pytest.raises(DeltaRootBusy):
        swap_in(held, lake, settings=s3store.S3Settings.from_env(), run="t", lock_wait=1)
    assert DeltaTable(delta_table_url(lake, "public", "q"), storage_options=opts).version() == q_version
    assert swap_in(held, lake, settings=s3store.S3Settings.from_env(), run="t", lock_wait=1)[0]["live_version"] == (
        q_version + 1), "free again: the swap commits"

    # a wrong --delta (or --slot): a live table another slot's pipeline made is never replaced
    other_root = f"{lake}_other"
    write_deltalake(delta_table_url(other_root, "public", "q"), pa.table({"id": [1]}), storage_options=opts,
                    commit_properties=CommitProperties(custom_metadata={"pgcdc.slot": "another_slot"}))
    with pytest.raises(NotReplayable, match=r"1 of 3 table\(s\) .*public\.q \(its live table .* belongs to slot "
                                            r"another_slot's pipeline\)"):
        rebuild_slot(spark, store=src, slot=slot, delta=other_root)
    assert DeltaTable(delta_table_url(other_root, "public", "q"), storage_options=opts).version() == 0
    assert list(s3store.list_keys(client, scratch.split("/")[2], "lake_other_rebuild/")) == []

    # the pipeline goes on from the rebuilt tables
    change(db, 3)
    drain(db, src, slot, client)
    res = {t.table: t for t in merge_slot(spark, store=src, slot=slot, delta=lake, history="changelog").tables}
    assert res["public.t"].action == "merged" and res["public.t"].first_window == 3, res["public.t"]
    assert_equal(db, lake)
    assert changelog_rows(lake, "t") > changes_before
