"""A merge that needs windows ``pgcdc maintain`` expired (their parts removed, the manifests
kept as tombstones, listed in ``{slot}/maintain/expired.json``), on the real PostgreSQL
15/18 and S3 servers: a rebuild into a new Delta root, a Delta table gone from the root, a
history table added after the expiry. Each such table fails alone (``WindowsExpired``,
naming the table, the windows and their LSN span, hint ``pgcdc resync`` or a longer
retention); the others merge; a resync repairs it. The table copies (the snapshot's, then
the resyncs') lose their parts once their Delta tables hold them (``CopyExpired`` for a
table that would be created from one again), never before."""

from __future__ import annotations

import pytest
from matrix import on_pg18
from test_maintain import change, drain, setup_pipeline

from airflow_pgcdc.lake.inspect import open_table
from airflow_pgcdc.lake.tables import delta_table_url
from airflow_pgcdc.maintain import maintain_slot, read_expired
from airflow_pgcdc.merge.job import TablesFailed, merge_slot
from airflow_pgcdc.merge.rebuild import NotReplayable, rebuild_slot
from airflow_pgcdc.snapshot.resync import resync_tables
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout
from airflow_pgcdc.store.maintenance import read_expired_copies
from airflow_pgcdc.store.manifest import committed_snapshot
from airflow_pgcdc.store.resyncs import committed_resyncs
from airflow_pgcdc.store.window import read_window
from airflow_pgcdc.verify import verify_table

TABLES = ("t", "u", "q")


def assert_equal(db, lake, tables=TABLES):
    for t in tables:
        r = verify_table(db, lake, "public", t)
        assert r.equal, (lake, t, r.to_dict())


def failed(spark, **kw) -> dict:
    with pytest.raises(TablesFailed) as e:
        merge_slot(spark, **kw)
    return {t.table: t for t in e.value.result.tables}


def copy_objects(client, lay: Layout, prefix: str) -> list[str]:
    """The objects under a copy's folder, relative to it."""
    return sorted(o["Key"][len(prefix):] for o in s3store.list_objects(client, lay.bucket, prefix))


@on_pg18("expiry and the merge's check of it come after the store: no server difference")
def test_merge_needing_expired_windows_fails_that_table(fresh_db, slot_name, store, spark):
    client, src, lake = store
    db = fresh_db
    slot = slot_name()
    lay = Layout.parse(src)
    setup_pipeline(db, client, src, slot)
    snap = committed_snapshot(client, lay, slot)
    snap_prefix = lay.snapshot_prefix(slot, snap.snapshot_id)
    parts_before = copy_objects(client, lay, snap_prefix)
    assert any(k.startswith("public.t/") for k in parts_before), parts_before
    # no Delta table yet: the snapshot stays whole, whatever the retention
    out = maintain_slot(store=src, slot=slot, delta=lake, retention_hours=0).to_dict()
    assert out["copies"]["expired"] == {} and out["copies"]["objects"] == 0, out["copies"]
    assert sorted(out["copies"]["kept"]) == [
        "its Delta table does not hold this copy yet (not created, or the resync not applied)"], out["copies"]
    assert copy_objects(client, lay, snap_prefix) == parts_before
    for i in range(3):  # windows 0, 1, 2: t changes in each, u in 0 and 2, q never
        change(db, i)
        drain(db, src, slot, client)
        merge_slot(spark, store=src, slot=slot, delta=lake)
    change(db, 3)
    drain(db, src, slot, client)  # window 3: the latest, unmerged, kept
    out = maintain_slot(store=src, slot=slot, delta=lake, retention_hours=0).to_dict()
    assert out["windows"]["expired"] == [[0, 2]], out["windows"]
    assert read_expired(client, lay, slot) == {0, 1, 2}
    # every table's Delta table holds the snapshot: its parts go, the manifest stays
    assert {k: sorted(v) for k, v in out["copies"]["expired"].items()} == {
        snap.snapshot_id: ["public.q", "public.t", "public.u"]}, out["copies"]
    assert out["copies"]["bytes"] > 0
    assert copy_objects(client, lay, snap_prefix) == [k for k in parts_before if "/" not in k], parts_before
    assert read_expired_copies(client, lay, slot) == {
        lay.snapshot_manifest(slot, snap.snapshot_id): {"public.q", "public.t", "public.u"}}
    w = {seq: read_window(client, lay, slot, seq) for seq in range(4)}
    store_url = f"s3://{lay.bucket}/{lay.root.prefix}"

    # 1) a rebuild into a new Delta root (the backfill DAG's rebuild mode): t and u need the
    #    expired windows: each fails, naming them; q needs none of them, but its copy is gone
    lake2 = lake + "2"
    by = failed(spark, store=src, slot=slot, delta=lake2)
    t, u = by["public.t"], by["public.u"]
    assert t.action == "failed" and t.error == (
        f"WindowsExpired: table public.t needs the changes of window(s) 0-2 ({w[0].start_lsn}..{w[2].end_lsn}), "
        f"but pgcdc maintain removed their parts (listed in s3://{lay.bucket}/cdc/{slot}/maintain/expired.json): "
        f"its Delta table {delta_table_url(lake2, 'public', 't')} has merged no window yet (missing, or rebuilt "
        "from the copy). Nothing of this table was read or merged"), t.error
    assert t.hint == (
        f"pgcdc resync --slot {slot} --publication <publication> --store {store_url} --tables '\"public\".\"t\"' (a new copy: "
        "the next merge replaces the Delta table from it and needs only the windows after it), or keep windows "
        "longer where rebuilds from the store must be possible (pgcdc maintain --retention-hours N, or "
        "--no-windows)"), t.hint
    assert u.action == "failed" and "needs the changes of window(s) 0, 2 (" in u.error, u.error
    q = by["public.q"]
    assert q.action == "failed" and q.error == (
        f"CopyExpired: {delta_table_url(lake2, 'public', 'q')} must be created from the copy of table public.q in "
        f"s3://{lay.bucket}/{lay.snapshot_manifest(slot, snap.snapshot_id)} (taken at {snap.consistent_point}), "
        "but pgcdc maintain removed its parts once the table's Delta table held them and the copy was older than "
        f"the retention (listed in s3://{lay.bucket}/cdc/{slot}/maintain/expired.json): the Delta table was "
        "dropped since, or a history table is added after the fact. Nothing of this table was read or merged"), q
    assert q.hint.startswith(f"pgcdc resync --slot {slot} --publication <publication> --store {store_url} --tables "
                             "'\"public\".\"q\"' (a new copy"), q.hint
    opts = s3store.delta_storage_options()
    for name in ("t", "q"):  # not copied for nothing, nor half made
        assert open_table(delta_table_url(lake2, "public", name), opts) is None

    # 1b) pgcdc rebuild refuses whole, before any work: every table named with what it lacks
    #     and the retention that would have kept it; nothing under the rebuild root, the
    #     live tables untouched
    live_versions = {n: open_table(delta_table_url(lake, "public", n), opts).version() for n in TABLES}
    with pytest.raises(NotReplayable) as refused:
        rebuild_slot(spark, store=src, slot=slot, delta=lake)
    text = str(refused.value)
    assert text.startswith(f"slot {slot}: 3 of 3 table(s) cannot be rebuilt from the store {src}: "), text
    copy = f"its copy s3://{lay.bucket}/{lay.snapshot_manifest(slot, snap.snapshot_id)} expired"
    assert f"public.t (window(s) 0-2 expired, {copy}; a retention over 1 h would have kept them)" in text, text
    assert f"public.u (window(s) 0, 2 expired, {copy}; a retention over" in text, text
    assert f"public.q ({copy})" in text, text
    assert text.endswith("Nothing was read or written"), text
    assert "pgcdc resync" in refused.value.hint and "--retention-hours" in refused.value.hint
    assert sorted(p["table"] for p in refused.value.problems) == ["public.q", "public.t", "public.u"]
    assert list(s3store.list_keys(client, lay.bucket, "lake_rebuild/")) == []
    assert {n: open_table(delta_table_url(lake, "public", n), opts).version()
            for n in TABLES} == live_versions

    # 2) the live root goes on: window 3 merges (its parts are there)
    res = {r.table: r for r in merge_slot(spark, store=src, slot=slot, delta=lake).tables}
    assert res["public.t"].action == "merged" and res["public.t"].first_window == 3, res["public.t"]
    assert_equal(db, lake)

    # 3) a history table added after the expiry lags behind it: t and u fail (history first),
    #    with the history's own hint; q has no change to append
    by = failed(spark, store=src, slot=slot, delta=lake, history="changelog")
    assert by["public.t"].error.startswith(
        "WindowsExpired: changelog table of public.t needs the changes of window(s) 0-2 ("), by["public.t"].error
    assert "pgcdc resync does not rebuild history tables" in by["public.t"].hint
    assert by["public.u"].action == "failed" and by["public.q"].action in ("up-to-date", "no-changes"), by

    # 4) a Delta table gone from the live root: u fails, t merges the next window
    s3store.delete_prefix(client, lay.bucket, delta_table_url(lake, "public", "u").split("/", 3)[3] + "/")
    change(db, 4)
    drain(db, src, slot, client)
    by = failed(spark, store=src, slot=slot, delta=lake)
    assert [r for r in by if by[r].action == "failed"] == ["public.u"], by
    assert "table public.u needs the changes of window(s) 0, 2 (" in by["public.u"].error
    assert by["public.t"].action == "merged"
    assert_equal(db, lake, ["t", "q"])

    # 5) the hints work: a resync of the three, then both roots equal PostgreSQL
    resync_tables(db, src, slot=slot, publications="pub", tables=["t", "u", "q"], s3=client,
                  worker_processes=False)
    change(db, 6)  # t and u change
    drain(db, src, slot, client)
    for root in (lake, lake2):
        res = {r.table: r for r in merge_slot(spark, store=src, slot=slot, delta=root).tables}
        assert res["public.u"].action == "resynced+merged", (root, res["public.u"])
        assert_equal(db, root)

    # 6) the resync's copy goes once the Delta tables applied it; the slot's snapshot stays a
    #    tombstone; the pipeline goes on
    (resync,) = committed_resyncs(client, lay, slot)
    r_prefix = resync.layout.snapshot_prefix(resync.resync_slot, resync.manifest.snapshot_id)
    assert any(k.startswith("public.q/") for k in copy_objects(client, lay, r_prefix))
    out = maintain_slot(store=src, slot=slot, delta=lake, retention_hours=0).to_dict()
    assert {k: sorted(v) for k, v in out["copies"]["expired"].items()} == {
        resync.manifest.snapshot_id: ["public.q", "public.t", "public.u"]}, out["copies"]
    assert [k for k in copy_objects(client, lay, r_prefix) if "/" in k] == []
    change(db, 8)
    drain(db, src, slot, client)
    for root in (lake, lake2):
        merge_slot(spark, store=src, slot=slot, delta=root)
        assert_equal(db, root)
