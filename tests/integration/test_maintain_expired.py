"""A merge that needs windows ``pgcdc maintain`` expired (their parts removed, the manifests
kept as tombstones, listed in ``{slot}/maintain/expired.json``), on the real PostgreSQL
15/18 and S3 servers: a rebuild into a new Delta root, a Delta table gone from the root, a
history table added after the expiry. Each such table fails alone (``WindowsExpired``,
naming the table, the windows and their LSN span, hint ``pgcdc resync`` or a longer
retention); the others merge; a resync repairs it."""

from __future__ import annotations

import pytest
from test_maintain import change, drain, setup_pipeline

from airflow_pgcdc.maintain import maintain_slot, read_expired
from airflow_pgcdc.merge import deltars
from airflow_pgcdc.merge.job import TablesFailed, merge_slot
from airflow_pgcdc.merge.plan import delta_table_url
from airflow_pgcdc.snapshot.resync import resync_tables
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout
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


def test_merge_needing_expired_windows_fails_that_table(fresh_db, slot_name, store, spark):
    client, src, lake = store
    db = fresh_db
    slot = slot_name()
    lay = Layout.parse(src)
    setup_pipeline(db, client, src, slot)
    for i in range(3):  # windows 0, 1, 2: t changes in each, u in 0 and 2, q never
        change(db, i)
        drain(db, src, slot, client)
        merge_slot(spark, store=src, slot=slot, delta=lake)
    change(db, 3)
    drain(db, src, slot, client)  # window 3: the latest, unmerged, kept
    out = maintain_slot(store=src, slot=slot, delta=lake, retention_hours=0).to_dict()
    assert out["windows"]["expired"] == [[0, 2]], out["windows"]
    assert read_expired(client, lay, slot) == {0, 1, 2}
    w = {seq: read_window(client, lay, slot, seq) for seq in range(4)}
    store_url = f"s3://{lay.bucket}/{lay.root.prefix}"

    # 1) a rebuild into a new Delta root (the backfill DAG's rebuild mode): t and u need the
    #    expired windows: each fails, naming them; q (no change in them) is bootstrapped
    lake2 = lake + "2"
    by = failed(spark, store=src, slot=slot, delta=lake2)
    t, u = by["public.t"], by["public.u"]
    assert t.action == "failed" and t.error == (
        f"WindowsExpired: table public.t needs the changes of window(s) 0-2 ({w[0].start_lsn}..{w[2].end_lsn}), "
        f"but pgcdc maintain removed their parts (listed in s3://{lay.bucket}/cdc/{slot}/maintain/expired.json): "
        f"its Delta table {delta_table_url(lake2, 'public', 't')} has merged no window yet (missing, or rebuilt "
        "from the copy). Nothing of this table was read or merged"), t.error
    assert t.hint == (
        f"pgcdc resync --slot {slot} --publication <publication> --to {store_url} --tables public.t (a new copy: "
        "the next merge replaces the Delta table from it and needs only the windows after it), or keep windows "
        "longer where rebuilds from the store must be possible (pgcdc maintain --retention-hours N, or "
        "--no-windows)"), t.hint
    assert u.action == "failed" and "needs the changes of window(s) 0, 2 (" in u.error, u.error
    assert by["public.q"].action == "bootstrapped", by["public.q"]
    opts = s3store.delta_storage_options()
    assert deltars.open_table(delta_table_url(lake2, "public", "t"), opts) is None  # not copied for nothing
    assert_equal(db, lake2, ["q"])

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

    # 5) the hint works: a resync of t and u, then both roots equal PostgreSQL
    resync_tables(db, src, slot=slot, publication="pub", tables=["t", "u"], s3_client=client,
                  worker_processes=False)
    change(db, 6)  # t and u change
    drain(db, src, slot, client)
    for root in (lake, lake2):
        res = {r.table: r for r in merge_slot(spark, store=src, slot=slot, delta=root).tables}
        assert res["public.u"].action == "resynced+merged", (root, res["public.u"])
        assert_equal(db, root)
