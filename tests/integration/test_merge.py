"""The Spark merge end to end, against real servers: PostgreSQL (15 and 18), the S3
server, Spark in local mode, delta-rs. Snapshot → workload → drains → merges, and the
Delta tables equal the PostgreSQL tables after each merge; replays are no-ops."""

from __future__ import annotations

import json

import psycopg
import pytest
from deltalake import DeltaTable
from lake_helpers import SMALL_WORK_MEM, assert_equal, delta_rows, drain, pg_rows, sql  # noqa: F401 - re-exported

from airflow_pgcdc.lake.tables import app_id, delta_table_url
from airflow_pgcdc.merge.errors import WindowGap
from airflow_pgcdc.merge.job import merge_slot
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.snapshot.resync import resync_tables
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout
from airflow_pgcdc.store.window import read_window


def test_snapshot_windows_merge_equal_postgres(fresh_db, slot_name, store, spark, driver_rows):
    client, src, lake = store

    def merge():
        return merge_slot(spark, store=src, slot=slot, delta=lake, driver_rows=driver_rows).to_dict()

    slot = slot_name()
    end_to_end(fresh_db, client, src, lake, slot, merge)


def end_to_end(db, client, src, lake, slot, merge, *, history=None):
    """Snapshot → every kind of change → drains → ``merge()`` (returns the job's result
    dict) → the Delta tables equal PostgreSQL after each merge; a replay is a no-op. Shared
    by the local-mode test here and the cluster tests (``test_merge_cluster.py``)."""
    sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text, n numeric(12,2), big text, tags int[], ts timestamptz)")
    sql(db, "ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL")  # > 2 kB: out of line, 'u' when unchanged
    sql(db, "CREATE TABLE u (k text PRIMARY KEY, j jsonb)")
    sql(db, "INSERT INTO t SELECT g, 'v' || g, g / 7.0, CASE WHEN g <= 5 THEN repeat(chr(65 + g), 5000) END, "
            "ARRAY[g, NULL, 3], '2024-01-01'::timestamptz + g * interval '1 hour' FROM generate_series(1, 300) g")
    sql(db, "INSERT INTO u VALUES ('a', '{\"x\": 1}'), ('b''q', NULL)")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t, u")
    manifest = snapshot_to_s3(db, src, slot=slot, publications="pub", workers=2, rows_per_part=100,
                              two_phase=True, s3=client)
    # window 0: every kind of change
    sql(db, "INSERT INTO t (id, v) VALUES (1001, 'new')")
    sql(db, "UPDATE t SET v = 'toast kept' WHERE id IN (1, 2)")  # big not sent ('u'): kept from the target
    sql(db, "UPDATE t SET id = 2000 WHERE id = 10")  # key change: old key deleted
    sql(db, "DELETE FROM t WHERE id = 20")
    sql(db, "INSERT INTO t (id, v) VALUES (1002, 'gone'); DELETE FROM t WHERE id = 1002")  # insert+delete
    sql(db, "DELETE FROM t WHERE id = 999999")  # nothing
    with psycopg.connect(db) as c:  # rolled back: never seen
        c.execute("INSERT INTO t (id) VALUES (5000)")
        c.rollback()
    sql(db, "INSERT INTO t (id, v, big) VALUES (3000, 'in txn', repeat('z', 3000)); "
            "UPDATE t SET v = 'then updated' WHERE id = 3000")  # TOAST resolved within the window
    sql(db, "BEGIN; INSERT INTO t SELECT g, 'streamed' FROM generate_series(10000, 12000) g; "
            "UPDATE t SET n = n + 1 WHERE id BETWEEN 100 AND 200; COMMIT")  # streamed (64kB)
    sql(db, "UPDATE u SET j = '{\"x\": 2, \"y\": [true]}' WHERE k = 'a'")
    with psycopg.connect(db, autocommit=True) as c:  # two-phase: held until COMMIT PREPARED
        c.execute("BEGIN")
        c.execute("INSERT INTO t (id, v) VALUES (4000, 'prepared'); UPDATE t SET v = 'prepared too' WHERE id = 5")
        c.execute(f"PREPARE TRANSACTION '{slot[-20:]}'")
    w0 = drain(db, src, slot, client)
    assert w0.window_seq == 0 and w0.rows > 2000
    r1 = merge()
    by = {t["table"]: t for t in r1["tables"]}
    assert by["public.t"]["action"] == "bootstrapped+merged" and by["public.t"]["bootstrap_rows"] == 300
    assert (by["public.t"]["first_window"], by["public.t"]["last_window"]) == (0, 0)
    assert_equal(db, lake, "public.t", "id")  # not the prepared transaction's rows yet
    assert_equal(db, lake, "public.u", "k")
    big = {r["id"]: r["big"] for r in delta_rows(delta_table_url(lake, "public", "t"), "id") if r["id"] in (1, 2, 3000)}
    assert big == {1: "B" * 5000, 2: "C" * 5000, 3000: "z" * 3000}, "unchanged TOAST kept, never NULL"
    # windows 1..n: schema change, truncate, TOAST kept across windows, several windows per merge
    sql(db, f"COMMIT PREPARED '{slot[-20:]}'")
    sql(db, "ALTER TABLE t ADD COLUMN extra int")
    sql(db, "UPDATE t SET extra = id * 2, v = 'w1' WHERE id IN (3, 4)")  # big unchanged again
    sql(db, "INSERT INTO u VALUES ('before truncate', NULL)")
    sql(db, "TRUNCATE u")
    sql(db, "INSERT INTO u VALUES ('after', '[1]')")
    for i in range(6):
        sql(db, "INSERT INTO t (id, v, extra) VALUES (%s, 'later', %s)", (20000 + i, i))
    seqs = []
    while True:
        w = drain(db, src, slot, client, max_rows=4)
        if w.window_seq is not None:  # an empty window (the server's WAL moved on) is committed and merged too
            seqs.append(w.window_seq)
        if w.transactions == 0:
            break
    assert len(seqs) >= 3
    r2 = merge()
    by = {t["table"]: t for t in r2["tables"]}
    assert by["public.t"]["action"] == "merged" and by["public.t"]["added_columns"] == ["extra"]
    assert (by["public.t"]["first_window"], by["public.t"]["last_window"]) == (1, seqs[-1])
    assert by["public.u"]["truncates"] == 1
    assert_equal(db, lake, "public.t", "id")
    assert_equal(db, lake, "public.u", "k")
    assert {r["id"]: r["v"] for r in pg_rows(db, "t", "id") if r["id"] in (4000, 5)} == {
        4000: "prepared", 5: "prepared too"}
    # the Delta commit says which windows it holds
    dt = DeltaTable(delta_table_url(lake, "public", "t"), storage_options=s3store.delta_storage_options())
    assert dt.transaction_version(app_id(slot, "public", "t")) == seqs[-1]
    last = dt.history(1)[0]
    info = json.loads(last["userMetadata"]) if "userMetadata" in last else last  # delta-spark: userMetadata
    assert info["pgcdc.window_last"] == str(seqs[-1]) and info["pgcdc.end_lsn"]
    # a replay is a no-op
    version = dt.version()
    r3 = merge()
    assert {t["action"] for t in r3["tables"]} == {"up-to-date"}
    dt.update_incremental()
    assert dt.version() == version
    assert manifest.consistent_point
    return r1, r2


def test_refuses_to_skip_a_window(fresh_db, slot_name, store, spark):
    client, src, lake = store
    db = fresh_db
    sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client)
    for i in range(3):
        sql(db, "INSERT INTO t VALUES (%s, 'x')", (i,))
        drain(db, src, slot, client)
    layout = Layout.parse(src)
    s3store.delete_prefix(client, layout.bucket, layout.window_manifest(slot, 1))  # window 1 lost
    with pytest.raises(WindowGap, match="window 1 is not committed but window 2 is"):
        merge_slot(spark, store=src, slot=slot, delta=lake)


@pytest.fixture
def db18(pg18, request):
    name = "m_" + request.node.name.lower().replace("[", "_").replace("]", "").replace("-", "_")[:40]
    dsn = pg18.create_database(name)
    yield dsn
    pg18.drop_database(name)


def test_tables_merged_at_once_killed_mid_job_then_rerun_each_commit_once(db18, slot_name, store, spark, s3):
    """Eight tables on four table workers, the job killed when the first of them commits:
    the others are at any step then (reading, compacting, committing or done); the rerun
    merges each one that had not committed, once, and leaves the ones that had; every
    table equals PostgreSQL and holds one merge commit, with its window's app transaction."""
    import os
    import subprocess
    import sys

    client, src, lake = store
    db = db18
    names = [f"t{i}" for i in range(8)]
    for t in names:
        sql(db, f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
        sql(db, f"INSERT INTO {t} SELECT g, 'v' FROM generate_series(1, 40) g")
    sql(db, "CREATE PUBLICATION pub FOR ALL TABLES")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client)
    merge_slot(spark, store=src, slot=slot, delta=lake, max_windows=0)  # the bootstrap: version 0 each
    for i, t in enumerate(names):
        sql(db, f"UPDATE {t} SET v = 'changed' WHERE id <= {i + 2}; DELETE FROM {t} WHERE id > 38; "
                f"INSERT INTO {t} VALUES (100 + {i}, 'n')")
    drain(db, src, slot, client)
    env = dict(os.environ, **s3.aws_env(), PGCDC_FAULT="merge-after-commit", SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run(
        [sys.executable, "-m", "airflow_pgcdc.cli", "merge", "--store", src, "--slot", slot, "--delta", lake,
         "--table-workers", "4"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    tables = {t: DeltaTable(delta_table_url(lake, "public", t), storage_options=s3store.delta_storage_options())
              for t in names}
    committed = {t for t, dt in tables.items() if dt.transaction_version(app_id(slot, "public", t)) == 0}
    assert committed and all(tables[t].version() == 1 for t in committed), "killed when one had committed"
    rerun = merge_slot(spark, store=src, slot=slot, delta=lake, table_workers=4)
    actions = {r.table.split(".")[1]: r.action for r in rerun.tables}
    assert [r.table for r in rerun.tables] == [f"public.{t}" for t in names], "results in the job's order"
    assert {t for t, a in actions.items() if a == "up-to-date"} == committed, actions
    assert all(a == "merged" for t, a in actions.items() if t not in committed), actions
    for t, dt in tables.items():
        dt.update_incremental()
        assert dt.version() == 1 and dt.transaction_version(app_id(slot, "public", t)) == 0, t
        assert_equal(db, lake, f"public.{t}", "id")


def test_the_whole_result_is_kept_in_the_store_and_read_back_from_a_summary(db18, slot_name, store, spark):
    """Each job writes its whole result to {slot}/merge-results/; a summary that left tables
    out reads them back from it (merge.results.whole); results older than seven days are
    removed by the next job, newer ones kept."""
    from datetime import UTC, datetime, timedelta

    from airflow_pgcdc.merge.results import summary, whole

    client, src, lake = store
    db = db18
    names = [f"r{i}" for i in range(5)]
    for t in names:
        sql(db, f"CREATE TABLE {t} (id int PRIMARY KEY, v text); INSERT INTO {t} VALUES (1, 'a'), (2, 'b')")
    sql(db, "CREATE PUBLICATION pub FOR ALL TABLES")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client)
    first = merge_slot(spark, store=src, slot=slot, delta=lake)
    layout = Layout.parse(src)
    prefix = layout.merge_results_prefix(slot)
    old, recent = (f"{(datetime.now(UTC) - timedelta(days=d)):%Y%m%dT%H%M%SZ}-0000000{d}.json" for d in (8, 6))
    for name in (old, recent):
        s3store.put_bytes(client, layout.bucket, prefix + name, "{}")
    sql(db, "UPDATE r3 SET v = 'c' WHERE id = 1")
    drain(db, src, slot, client)
    second = merge_slot(spark, store=src, slot=slot, delta=lake)
    assert second.detail and second.detail != first.detail
    kept = sorted(k[len(prefix):] for k in s3store.list_keys(client, layout.bucket, prefix))
    assert kept == sorted([first.detail.rsplit("/", 1)[1], second.detail.rsplit("/", 1)[1], recent]), kept
    short = summary(second.to_dict(), limit=1)
    assert [t["table"] for t in short["tables"]] == ["public.r3"] and short["tables_omitted"] == 4
    assert short["actions"] == {"merged": 1, "no-changes": 4}
    assert whole(short, client) == second.to_dict()  # every table, read back from the store
    assert whole(second.to_dict()) == second.to_dict()  # a whole result is its own


@pytest.mark.parametrize("fault", ["merge-after-stage", "merge-after-commit"])
def test_killed_merge_then_rerun_merges_exactly_once(fault, db18, slot_name, store, spark, s3):
    import os
    import subprocess
    import sys

    client, src, lake = store
    db = db18
    sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(db, "INSERT INTO t SELECT g, 'v' FROM generate_series(1, 50) g")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client)
    sql(db, "UPDATE t SET v = 'changed' WHERE id <= 10; DELETE FROM t WHERE id > 40; INSERT INTO t VALUES (100, 'n')")
    drain(db, src, slot, client)
    env = dict(os.environ, **s3.aws_env(), PGCDC_FAULT=fault, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run(
        [sys.executable, "-m", "airflow_pgcdc.cli", "merge", "--from", src, "--slot", slot, "--delta", lake,
         "--master", "local[1]"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    url = delta_table_url(lake, "public", "t")
    dt = DeltaTable(url, storage_options=s3store.delta_storage_options())
    app = app_id(slot, "public", "t")
    if fault == "merge-after-stage":
        assert dt.version() == 0 and dt.transaction_version(app) is None, "killed before the commit: bootstrap only"
        assert len(delta_rows(url, "id")) == 50
    else:
        assert dt.version() == 1 and dt.transaction_version(app) == 0, "killed after the commit"
    rerun = merge_slot(spark, store=src, slot=slot, delta=lake)
    assert rerun.tables[0].action == ("merged" if fault == "merge-after-stage" else "up-to-date")
    dt.update_incremental()
    assert dt.version() == 1 and dt.transaction_version(app) == 0, "exactly one merge commit"
    assert_equal(db, lake, "public.t", "id")
    if fault == "merge-after-stage":
        return
    # two jobs started together (the default engine, compacting on the driver: no JVM, so
    # both read the same windows within a second): both succeed, the windows are committed
    # once. Delta's Spark engine does the same on the cluster (test_merge_cluster.py), where
    # this engine's executors only compact: its crash and concurrency outcomes are the
    # driver's (staging under its own run id, the Delta log's conditional commit)
    sql(db, "UPDATE t SET v = 'w1' WHERE id % 5 = 0")
    drain(db, src, slot, client)
    sql(db, "DELETE FROM t WHERE id % 11 = 0; UPDATE t SET id = id + 1000 WHERE id % 13 = 0")
    drain(db, src, slot, client)
    env.pop("PGCDC_FAULT")
    jobs = [subprocess.Popen([sys.executable, "-m", "airflow_pgcdc.cli", "merge", "--from", src, "--slot", slot,
                              "--delta", lake], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    outs = [j.communicate(timeout=300) for j in jobs]
    assert [j.returncode for j in jobs] == [0, 0], [err[-2000:] for _, err in outs]
    actions = [json.loads(out)["tables"][0]["action"] for out, _ in outs]
    assert actions.count("merged") == 1 and {"merged-by-concurrent-job", "up-to-date"} & set(actions), actions
    dt.update_incremental()
    assert dt.transaction_version(app) == 2 and dt.version() == 2, "windows 1..2 committed once, by one job"
    assert_equal(db, lake, "public.t", "id")


def test_pgcdc_merge_of_small_batches_starts_no_spark(db18, slot_name, store, s3):
    """``pgcdc merge`` whose tables are all small (bootstrap and window under --driver-rows)
    starts no JVM: with ``SPARK_HOME`` pointing nowhere it still bootstraps and merges, and
    the same run forced through Spark (``--driver-rows 0``) fails there, which shows the probe
    would see a Spark start."""
    import os
    import subprocess
    import sys

    client, src, lake = store
    db = db18
    sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE TABLE k (v text)")
    sql(db, "INSERT INTO t SELECT g, 'v' FROM generate_series(1, 50) g; INSERT INTO k VALUES ('a')")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t, k")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client)
    sql(db, "UPDATE t SET v = 'changed' WHERE id <= 10; DELETE FROM t WHERE id > 40; INSERT INTO k VALUES ('b')")
    drain(db, src, slot, client)
    env = dict(os.environ, **s3.aws_env(), SPARK_HOME="/nonexistent/spark", SPARK_LOCAL_IP="127.0.0.1")

    def pgcdc_merge(*extra):
        return subprocess.run([sys.executable, "-m", "airflow_pgcdc.cli", "merge", "--from", src, "--slot", slot,
                               *extra], env=env, capture_output=True, text=True, timeout=300)

    forced = pgcdc_merge("--delta", lake + "-spark", "--driver-rows", "0")
    assert forced.returncode != 0, "Spark started although SPARK_HOME points nowhere: the probe sees nothing"
    done = pgcdc_merge("--delta", lake)
    assert done.returncode == 0, done.stderr[-3000:]
    by = {t["table"]: t for t in json.loads(done.stdout)["tables"]}
    assert {n: t["action"] for n, t in by.items()} == {"public.t": "bootstrapped+merged",
                                                       "public.k": "bootstrapped+merged"}, by
    assert by["public.t"]["metrics"]["pgcdc_compacted_on"] == "driver"
    assert_equal(db, lake, "public.t", "id")
    assert sorted(r["v"] for r in delta_rows(delta_table_url(lake, "public", "k"), "v")) == ["a", "b"]


def test_changelog_history_appends_every_change_once(db18, slot_name, store, spark):
    from airflow_pgcdc.lake.tables import changelog_url

    client, src, lake = store
    db = db18
    sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(db, "INSERT INTO t VALUES (1, 'a')")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client)
    sql(db, "INSERT INTO t VALUES (2, 'b'); UPDATE t SET v = 'a2' WHERE id = 1")
    drain(db, src, slot, client)
    sql(db, "DELETE FROM t WHERE id = 2; UPDATE t SET id = 3 WHERE id = 1")
    drain(db, src, slot, client)
    from airflow_pgcdc.status.job import committed_windows

    before = committed_windows(client, src, slot, lake)
    assert before["merged_through"] is None and before["windows_not_merged"] == 2
    r = merge_slot(spark, store=src, slot=slot, delta=lake, history="changelog")
    assert r.tables[0].history["rows"] == 4
    after = committed_windows(client, src, slot, lake)  # what `pgcdc status --delta` shows
    assert after["merged_through"] == 1 and after["windows_not_merged"] == 0
    assert after["merged_per_table"] == {"public.t": 1}
    log_rows = DeltaTable(changelog_url(lake, "public", "t"), storage_options=s3store.delta_storage_options())
    got = sorted(log_rows.to_pyarrow_table().to_pylist(), key=lambda x: (x["_pgcdc_commit_lsn"], x["_pgcdc_seq"]))
    assert [(x["_pgcdc_op"], x["id"], x["v"]) for x in got] == [
        ("I", 2, "b"), ("U", 1, "a2"), ("D", 2, None), ("U", 3, "a2")]
    assert all(x["_pgcdc_xid"] and x["_pgcdc_commit_ts"] for x in got)
    assert_equal(db, lake, "public.t", "id")
    # a replay appends nothing
    again = merge_slot(spark, store=src, slot=slot, delta=lake, history="changelog")
    assert again.tables[0].action == "up-to-date"
    log_rows.update_incremental()
    assert log_rows.to_pyarrow_table().num_rows == 4


def test_two_phase_and_replica_identity_full(fresh_db, slot_name, store, spark, driver_rows):
    client, src, lake = store
    db = fresh_db
    sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(db, "CREATE TABLE f (id int PRIMARY KEY, big text, n int)")
    sql(db, "ALTER TABLE f REPLICA IDENTITY FULL")
    sql(db, "ALTER TABLE f ALTER COLUMN big SET STORAGE EXTERNAL")
    sql(db, "INSERT INTO f VALUES (1, repeat('q', 4000), 1), (2, repeat('r', 4000), 2)")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t, f")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", two_phase=True, s3=client)
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("BEGIN")
        c.execute("INSERT INTO t VALUES (1, 'prepared')")
        c.execute("PREPARE TRANSACTION 'g1'")
        c.execute("BEGIN")
        c.execute("INSERT INTO t VALUES (2, 'never')")
        c.execute("PREPARE TRANSACTION 'g2'")
        c.execute("INSERT INTO t VALUES (3, 'plain')")
        c.execute("UPDATE f SET id = 10, n = 11 WHERE id = 1")  # key change under FULL: big carried
        c.execute("UPDATE f SET n = 22 WHERE id = 2")
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake, driver_rows=driver_rows)
    assert_equal(db, lake, "public.t", "id")  # only 'plain': prepared changes are held
    assert_equal(db, lake, "public.f", "id")
    sql(db, "COMMIT PREPARED 'g1'")
    sql(db, "ROLLBACK PREPARED 'g2'")
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake, driver_rows=driver_rows)
    assert_equal(db, lake, "public.t", "id")
    assert [r["id"] for r in delta_rows(delta_table_url(lake, "public", "t"), "id")] == [1, 3]


def test_types_survive_the_merge_exactly(fresh_db, slot_name, store, spark, driver_rows):
    """Every kind of mapped value, through snapshot → bootstrap and drain → merge, is what
    PostgreSQL has (``pgcdc verify``'s exact comparison)."""
    from airflow_pgcdc.verify import verify_table

    client, src, lake = store
    db = fresh_db
    sql(db, "CREATE TYPE mood AS ENUM ('sad', 'ok')")
    sql(db, """CREATE TABLE t (
        id bigint PRIMARY KEY, i2 smallint, f8 float8, n numeric(10,3), nn numeric, b bool, d date,
        ts timestamp, tz timestamptz, tm time, iv interval, u uuid, j jsonb, ba bytea, arr int[],
        tarr text[], m mood, r int4range, x text)""")
    rows = """
        (1, 1, 1.5, 12.345, 'NaN', true, 'infinity', 'infinity', '-infinity', '24:00:00', '1 mon 2 days 03:00:00',
         'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a": [1, null]}', '\\x00ff', '{1,NULL,3}', '{"a b",NULL,""}',
         'sad', '[1,5)', 'x'),
        (2, NULL, 'NaN', -0.001, '1.50', false, '0044-03-15 BC', '2024-02-29 12:00:00.123456',
         '2024-06-01 00:00:00+05:30', '00:00:01.5', NULL, NULL, 'null', '', '{}', '{}', NULL, 'empty', NULL),
        (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"""
    sql(db, "INSERT INTO t VALUES " + rows)
    sql(db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client)
    sql(db, "INSERT INTO t SELECT id + 10, i2, f8, n, nn, b, d, ts, tz, tm, iv, u, j, ba, arr, tarr, m, r, x FROM t")
    sql(db, "UPDATE t SET d = '-infinity', iv = '-1 year', tm = '23:59:59.999999', nn = '-Infinity' WHERE id = 2")
    sql(db, "DELETE FROM t WHERE id = 13")
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake, driver_rows=driver_rows)
    result = verify_table(db, lake, "public", "t")
    report = result.to_dict()
    assert result.equal, report
    assert report["postgres"]["rows"] == report["delta"]["rows"] == 5
    assert len(report["compared_columns"]) == 19
    # and the comparison is sharp: one changed value in PostgreSQL is seen
    sql(db, "UPDATE t SET n = 12.340 WHERE id = 1")
    assert verify_table(db, lake, "public", "t").to_dict()["counts"]["changed"] == 1


def test_scd2_history_keeps_every_version_with_its_lsn_validity(db18, slot_name, store, spark):
    from airflow_pgcdc.lake.tables import scd2_url

    client, src, lake = store
    db = db18
    sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text, big text)")
    sql(db, "ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL")
    sql(db, "INSERT INTO t VALUES (1, 'a', repeat('B', 3000)), (2, 'b', NULL)")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    snap = snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client)
    sql(db, "UPDATE t SET v = 'a2' WHERE id = 1")  # big unchanged: taken from the history's current row
    sql(db, "DELETE FROM t WHERE id = 2")
    sql(db, "INSERT INTO t VALUES (3, 'c', NULL); UPDATE t SET v = 'c2' WHERE id = 3")
    drain(db, src, slot, client)
    sql(db, "UPDATE t SET v = 'a3' WHERE id = 1")
    drain(db, src, slot, client)
    r = merge_slot(spark, store=src, slot=slot, delta=lake, history="scd2")
    assert r.tables[0].history["bootstrap_rows"] == 2
    assert_equal(db, lake, "public.t", "id")
    h = DeltaTable(scd2_url(lake, "public", "t"), storage_options=s3store.delta_storage_options())
    rows = sorted(h.to_pyarrow_table().to_pylist(), key=lambda x: (x["id"], x["__valid_from_lsn"]))
    cp = int(LSN.parse(snap.consistent_point))
    by_key = {}
    for x in rows:
        by_key.setdefault(x["id"], []).append(x)
    assert [(x["__op"], x["v"], x["__is_current"]) for x in by_key[1]] == [
        ("S", "a", False), ("U", "a2", False), ("U", "a3", True)]
    assert all(x["big"] == "B" * 3000 for x in by_key[1]), "unchanged TOAST carried into every version"
    assert by_key[1][0]["__valid_from_lsn"] == cp
    for a, b in zip(by_key[1], by_key[1][1:], strict=False):
        assert a["__valid_to_lsn"] == b["__valid_from_lsn"], "versions tile the LSN line"
    assert by_key[1][-1]["__valid_to_lsn"] is None
    assert [(x["__op"], x["__is_current"]) for x in by_key[2]] == [("S", False)]
    assert by_key[2][0]["__valid_to_lsn"] > cp, "the delete ended the version"
    assert [(x["__op"], x["v"], x["__is_current"]) for x in by_key[3]] == [("I", "c", False), ("U", "c2", True)]
    current = sorted((x["id"], x["v"]) for x in rows if x["__is_current"])
    assert current == sorted(sql(db, "SELECT id, v FROM t")), "the current versions are the table"
    again = merge_slot(spark, store=src, slot=slot, delta=lake, history="scd2")
    assert again.tables[0].history["versions"] == 0
    h.update_incremental()
    assert h.to_pyarrow_table().num_rows == len(rows), "a replay adds no version"

    # rebuilt from the store with its history table (pgcdc rebuild --history scd2), swapped in:
    # the same versions with the same LSN validity
    from airflow_pgcdc.lake.tables import delta_table_url
    from airflow_pgcdc.merge.rebuild import rebuild_slot

    def versions(table_rows):
        cols = ("id", "v", "big", "__op", "__valid_from_lsn", "__valid_to_lsn", "__is_current")
        return sorted((tuple(x[c] for c in cols) for x in table_rows), key=lambda t: (t[0], t[4]))

    out = rebuild_slot(spark, store=src, slot=slot, delta=lake, history="scd2")
    assert {x["live"] for x in out["rebuild"]["swapped"]} == {delta_table_url(lake, "public", "t"),
                                                              scd2_url(lake, "public", "t")}
    h.update_incremental()
    assert versions(h.to_pyarrow_table().to_pylist()) == versions(rows)
    assert_equal(db, lake, "public.t", "id")


def test_key_change_keeps_unsent_toast_values(fresh_db, slot_name, store, spark, driver_rows):
    """Without REPLICA IDENTITY FULL a key-changing update sends neither its unchanged TOAST
    values nor the old row. When the old key has no other change in the batch, the merge
    matches the moved row on the old key and updates that row in place, key included,
    keeping those values; otherwise it writes NULL (the documented limit), never a value
    of another row."""
    client, src, lake = store
    db = fresh_db
    sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text, big text)")
    sql(db, "ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL")
    sql(db, "INSERT INTO t SELECT g, 'v' || g, repeat(chr(64 + g), 3000) FROM generate_series(1, 12) g")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", workers=1, s3=client)
    merge_slot(spark, store=src, slot=slot, delta=lake, driver_rows=driver_rows)  # bootstrap: rows 1..12 in Delta
    sql(db, "UPDATE t SET id = 101 WHERE id = 1")  # a plain move
    sql(db, "UPDATE t SET id = 102 WHERE id = 2")
    sql(db, "UPDATE t SET v = 'moved then updated' WHERE id = 102")  # big unchanged again
    sql(db, "UPDATE t SET id = 103 WHERE id = 3")
    sql(db, "DELETE FROM t WHERE id = 103")  # moved then deleted: both keys gone
    sql(db, "UPDATE t SET big = repeat('n', 3000) WHERE id = 4")
    sql(db, "UPDATE t SET id = 104 WHERE id = 4")  # the value is in the batch, not the target
    sql(db, "UPDATE t SET id = 105 WHERE id = 5")
    sql(db, "UPDATE t SET id = 106 WHERE id = 105")  # a chain
    sql(db, "UPDATE t SET id = 107, big = 'sent' WHERE id = 7")  # the value was sent
    sql(db, "INSERT INTO t VALUES (200, 'other', repeat('o', 3000))")
    sql(db, "UPDATE t SET v = 'plain update' WHERE id = 8")  # big kept the usual way
    sql(db, "DELETE FROM t WHERE id = 9")
    w = drain(db, src, slot, client)
    assert w.lost_toast["public.t"]["updates"] == 6  # 1, 2, 3, 4, 5 and 105 (7 sent big)
    r = merge_slot(spark, store=src, slot=slot, delta=lake, driver_rows=driver_rows)
    assert r.tables[0].action == "merged"
    assert r.tables[0].metrics["pgcdc_compacted_on"] == ("spark" if driver_rows == 0 else "driver")
    url = delta_table_url(lake, "public", "t")
    got = {x["id"]: x for x in delta_rows(url, "id")}
    want = {x["id"]: x for x in pg_rows(db, "public.t", "id")}
    assert set(got) == set(want), "every key once: old keys gone, new keys there"
    limited = {104, 106}  # value only in the batch (4) or moved twice (5): NULL, the limit
    for k, row in want.items():
        if k in limited:
            assert got[k]["big"] is None and got[k]["v"] == row["v"], k
        else:
            assert got[k] == row, k
    assert got[101]["big"] == "A" * 3000 and got[102]["big"] == "B" * 3000
    assert got[102]["v"] == "moved then updated"


def test_scd2_keeps_the_versions_before_a_truncate_in_the_batch(fresh_db, slot_name, store, spark):
    from airflow_pgcdc.lake.tables import scd2_url

    client, src, lake = store
    db = fresh_db
    sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(db, "INSERT INTO t VALUES (1, 'a'), (2, 'b'), (5, 'e')")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    snap = snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client)
    sql(db, "UPDATE t SET v = 'a2' WHERE id = 1")
    sql(db, "UPDATE t SET v = 'e2' WHERE id = 5")
    sql(db, "UPDATE t SET v = 'e3' WHERE id = 5")
    sql(db, "INSERT INTO t VALUES (3, 'c')")
    sql(db, "TRUNCATE t")
    sql(db, "INSERT INTO t VALUES (1, 'new1'), (4, 'd')")
    w = drain(db, src, slot, client)
    assert w.transactions == 6
    merge_slot(spark, store=src, slot=slot, delta=lake, history="scd2")
    assert_equal(db, lake, "public.t", "id")
    manifest = read_window(client, Layout.parse(src), slot, w.window_seq)
    t_lsn = int(LSN.parse(manifest.truncates[0]["commit_lsn"]))
    h = DeltaTable(scd2_url(lake, "public", "t"), storage_options=s3store.delta_storage_options())
    by_key = {}
    for x in sorted(h.to_pyarrow_table().to_pylist(), key=lambda x: (x["id"], x["__valid_from_lsn"])):
        by_key.setdefault(x["id"], []).append((x["__op"], x["v"], x["__valid_from_lsn"], x["__valid_to_lsn"]))
    cp = int(LSN.parse(snap.consistent_point))
    (s1, u1, i1), (s2,), (i3,), (i4,), (s5, u5a, u5b) = (by_key[k] for k in (1, 2, 3, 4, 5))
    assert (s1[:3], u1[:2], u1[3], i1[:2], i1[3]) == (("S", "a", cp), ("U", "a2"), t_lsn, ("I", "new1"), None)
    assert s1[3] == u1[2] < t_lsn < i1[2], "a2 lived from its update to the truncate"
    assert s2 == ("S", "b", cp, t_lsn), "an unchanged row ends at the truncate"
    assert i3[:2] == ("I", "c") and i3[2] < t_lsn == i3[3], "a row inserted and truncated in the batch is kept"
    assert i4[:2] == ("I", "d") and i4[3] is None
    assert [x[:2] for x in (s5, u5a, u5b)] == [("S", "e"), ("U", "e2"), ("U", "e3")]
    assert s5[3] == u5a[2] and u5a[3] == u5b[2] and u5b[3] == t_lsn, "versions tile up to the truncate"
    current = sorted((k, v[-1][1]) for k, v in by_key.items() if v[-1][3] is None)
    assert current == sorted(sql(db, "SELECT id, v FROM t"))


def test_a_job_reads_only_the_window_manifests_it_needs(db18, slot_name, store, spark, monkeypatch):
    """After a merge, the tables index spares reading old manifests: the next job reads the
    new windows and those from the lowest last-merged window on. Without the index (or
    with a stale one) it reads them all, with the same result."""
    from airflow_pgcdc.merge import windows

    client, src, lake = store
    db = db18
    layout = Layout.parse(src)
    sql(db, "CREATE TABLE t1 (id int PRIMARY KEY, v text)")
    sql(db, "INSERT INTO t1 SELECT g, 'v' FROM generate_series(1, 10) g")
    sql(db, "CREATE TABLE t0 (id int PRIMARY KEY)")  # in the snapshot, never changed
    sql(db, "INSERT INTO t0 VALUES (1)")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t1, t0")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client)
    sql(db, "UPDATE t1 SET v = 'w0' WHERE id = 1")
    drain(db, src, slot, client)  # window 0
    sql(db, "CREATE TABLE t2 (id int PRIMARY KEY, v text)")
    sql(db, "ALTER PUBLICATION pub ADD TABLE t2")
    # a table that joins later needs its copy, even an empty one (the merge cannot tell a
    # new table from an old one whose rows it never saw)
    resync_tables(db, src, slot=slot, publications="pub", tables=["t2"], s3=client, worker_processes=False)
    sql(db, "INSERT INTO t2 VALUES (1, 'only in window 1')")
    drain(db, src, slot, client)  # window 1: the only one holding t2
    sql(db, "UPDATE t1 SET v = 'w2' WHERE id = 2")
    drain(db, src, slot, client)  # window 2
    first = merge_slot(spark, store=src, slot=slot, delta=lake)
    assert {t.table: t.action for t in first.tables} == {
        "public.t1": "bootstrapped+merged", "public.t0": "bootstrapped", "public.t2": "resynced+merged"}
    for i in range(3):
        sql(db, "UPDATE t1 SET v = %s WHERE id = 3", (f"w{3 + i}",))
        drain(db, src, slot, client)  # windows 3, 4, 5: t1 only
    read: list[int] = []
    real = windows._read_windows

    def spy(client_, layout_, slot_, seqs):
        read.extend(seqs)
        return real(client_, layout_, slot_, seqs)

    monkeypatch.setattr(windows, "_read_windows", spy)
    r = merge_slot(spark, store=src, slot=slot, delta=lake)
    assert {t.table: t.action for t in r.tables} == {
        "public.t1": "merged", "public.t0": "no-changes", "public.t2": "no-changes"}
    # the index covers windows 0..2 and says no table needs one of them (t1 and t2 merged up
    # to 2, t0 is in none): windows 0 and 1 are not read again; window 2 is (the next
    # window must start where it ended)
    assert sorted(read) == [2, 3, 4, 5]
    assert_equal(db, lake, "public.t1", "id")
    assert_equal(db, lake, "public.t2", "id")
    # no index: every manifest is read, same result
    s3store.delete_prefix(client, layout.bucket, layout.merge_tables_index(slot))
    sql(db, "UPDATE t1 SET v = 'w6' WHERE id = 4")
    sql(db, "INSERT INTO t2 VALUES (2, 'w6')")
    drain(db, src, slot, client)  # window 6
    read.clear()
    merge_slot(spark, store=src, slot=slot, delta=lake)
    assert sorted(read) == list(range(7))
    assert_equal(db, lake, "public.t1", "id")
    assert_equal(db, lake, "public.t2", "id")
    # a stale index (its window 6 ended elsewhere: the slot's windows were made again) is ignored
    doc = s3store.get_json(client, layout.bucket, layout.merge_tables_index(slot))
    assert doc["through"] == 6
    assert {(t["table"], t["last_window"]) for t in doc["tables"]} == {("t0", -1), ("t1", 6), ("t2", 6)}
    s3store.put_bytes(client, layout.bucket, layout.merge_tables_index(slot),
                      json.dumps({**doc, "end_lsn": "0/1", "tables": []}))
    read.clear()
    merge_slot(spark, store=src, slot=slot, delta=lake)
    assert sorted(read) == list(range(7))
    # a table behind the index (max_windows) is not anchored: its windows are read again
    for i in range(2):
        sql(db, "UPDATE t1 SET v = %s WHERE id = 5", (f"w{7 + i}",))
        drain(db, src, slot, client)  # windows 7, 8
    r = merge_slot(spark, store=src, slot=slot, delta=lake, max_windows=1)
    assert [(t.table, t.last_window) for t in r.tables if t.action == "merged"] == [("public.t1", 7)]
    read.clear()
    r = merge_slot(spark, store=src, slot=slot, delta=lake)
    assert sorted(read) == [7, 8], "the index covers 0..8; t1 merged up to 7"
    assert [(t.table, t.last_window) for t in r.tables if t.action == "merged"] == [("public.t1", 8)]
    assert_equal(db, lake, "public.t1", "id")
