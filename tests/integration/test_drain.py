"""The drain against real PostgreSQL 15/18 and the S3 server: windows that tile the LSN
line, change rows, streamed and two-phase transactions, TOAST, truncates, messages,
schema changes, origins, the start-position checks, keepalives during a slow upload,
and an idle slot that still advances."""

from __future__ import annotations

import time

import psycopg
import pyarrow as pa
import pytest

from airflow_pgcdc.drain.drain import SlotAheadOfStore, drain_window
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout
from airflow_pgcdc.store.window import committed_window_seqs, read_window, read_window_rows

SMALL_WORK_MEM = "-c logical_decoding_work_mem=64kB"


def sql(dsn, query, params=None):
    with psycopg.connect(dsn, autocommit=True) as c:
        cur = c.execute(query, params)
        return cur.fetchall() if cur.description else None


def create_slot(dsn, slot, *, two_phase=False) -> LSN:
    row = sql(dsn, "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput', false, %s)",
              (slot, two_phase))
    return LSN.parse(row[0][0])


def confirmed(dsn, slot) -> LSN:
    return LSN.parse(sql(dsn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                         (slot,))[0][0])


@pytest.fixture
def store(s3, s3_bucket, monkeypatch):
    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    return s3.client(), f"s3://{s3_bucket}/lake"


def windows(client, url, slot):
    layout = Layout.parse(url)
    return [read_window(client, layout, slot, s) for s in committed_window_seqs(client, layout, slot)]


def all_rows(client, url, slot, table="public.t") -> list[dict]:
    """Every change row of ``table`` over all committed windows, in window order."""
    layout = Layout.parse(url)
    out = []
    for m in windows(client, url, slot):
        t = read_window_rows(client, layout, slot, m).get(table)
        if t is not None:
            out.extend(t.to_pylist())
    return out


def assert_tiled(ms, start: LSN):
    assert [m.window_seq for m in ms] == list(range(len(ms)))
    assert ms[0].start == start
    for a, b in zip(ms, ms[1:], strict=False):
        assert a.end == b.start, "windows tile the LSN line"
    for m in ms:
        if m.first_commit_lsn:
            assert m.start <= LSN.parse(m.first_commit_lsn) <= LSN.parse(m.last_commit_lsn) < m.end


def drain(dsn, url, slot, client, **kw):
    kw.setdefault("publications", "pub")
    return drain_window(dsn, url, slot=slot, s3=client, **{"start_without_snapshot": True, **kw})


def test_windows_tile_and_hold_every_change_once(fresh_db, slot_name, store):
    client, url = store
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, v text, n numeric(8,2), ts timestamptz)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    start = create_slot(fresh_db, slot)
    sql(fresh_db, "INSERT INTO t VALUES (1, 'a', 1.5, '2024-01-01 00:00:00+00'), (2, 'b', NULL, NULL)")
    sql(fresh_db, "UPDATE t SET v = 'a2' WHERE id = 1")
    sql(fresh_db, "UPDATE t SET id = 10 WHERE id = 2")  # key change: the old key is recorded
    sql(fresh_db, "DELETE FROM t WHERE id = 1")
    r = drain(fresh_db, url, slot, client)
    assert r.window_seq == 0 and r.transactions == 4 and r.tables == {"public.t": 5}
    assert confirmed(fresh_db, slot) == LSN.parse(r.end_lsn), "acknowledged after the commit"
    rows = all_rows(client, url, slot)
    assert [(x["_pgcdc_op"], x["id"], x["_pgcdc_old_id"]) for x in rows] == [
        ("I", 1, None), ("I", 2, None), ("U", 1, None), ("U", 10, 2), ("D", 1, None)]
    assert rows[0]["v"] == "a" and str(rows[0]["n"]) == "1.50" and rows[0]["ts"].year == 2024
    assert [x["_pgcdc_seq"] for x in rows] == list(range(5))
    assert rows[0]["_pgcdc_commit_lsn"] == rows[1]["_pgcdc_commit_lsn"] < rows[2]["_pgcdc_commit_lsn"]
    xid = sql(fresh_db, "SELECT xmin::text::bigint FROM t WHERE id = 10")[0][0]
    assert rows[3]["_pgcdc_xid"] == xid and rows[3]["_pgcdc_commit_ts"] is not None
    # more transactions, cut by max_rows into several windows at transaction boundaries
    for i in range(20):
        sql(fresh_db, "INSERT INTO t SELECT g, 'x' FROM generate_series(%s::int, %s::int) g", (100 + 10 * i, 109 + 10 * i))
    results = []
    while True:
        res = drain(fresh_db, url, slot, client, max_rows=35)
        if res.window_seq is None or res.transactions == 0:
            break
        results.append(res)
        assert res.rows <= 40 and res.rows % 10 == 0, "never splits a transaction"
    assert len(results) >= 5
    ms = windows(client, url, slot)
    assert_tiled(ms, start)
    assert confirmed(fresh_db, slot) == ms[-1].end
    ids = [x["id"] for x in all_rows(client, url, slot) if x["_pgcdc_op"] == "I"]
    assert ids == [1, 2] + list(range(100, 300)), "each change exactly once, in commit order"
    # nothing new: a later drain finds nothing (or an empty window) and moves the slot along
    sql(fresh_db, "CREATE TABLE other (x int)")
    sql(fresh_db, "INSERT INTO other VALUES (1)")  # WAL outside the publication
    idle = drain(fresh_db, url, slot, client)
    assert idle.transactions == 0 and idle.rows == 0
    assert confirmed(fresh_db, slot) == LSN.parse(idle.end_lsn) > ms[-1].end, "an idle slot advances"


def test_the_drain_takes_jemalloc_for_arrow_unless_told_otherwise(fresh_db, slot_name, store, monkeypatch):
    """drain_window makes jemalloc Arrow's pool (prefer_jemalloc_pool; less memory than
    mimalloc on wide rows), and leaves a pool chosen by ARROW_DEFAULT_MEMORY_POOL alone."""
    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:
        pytest.skip("this pyarrow was built without jemalloc: the drain keeps Arrow's default pool")
    client, url = store
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    create_slot(fresh_db, slot)
    before = pa.default_memory_pool()
    try:
        for key, told, want in ((1, "system", "system"), (2, None, "jemalloc")):
            pa.set_memory_pool(pa.system_memory_pool())
            if told:
                monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", told)
            else:
                monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
            sql(fresh_db, "INSERT INTO t VALUES (%s)", (key,))
            assert drain(fresh_db, url, slot, client).rows == 1
            assert pa.default_memory_pool().backend_name == want
    finally:
        pa.set_memory_pool(before)


def test_key_change_with_unchanged_toast_is_reported(fresh_db, slot_name, store, caplog):
    """Without REPLICA IDENTITY FULL, a key-changing update does not resend unchanged TOAST
    values nor the old row: the drain names the table, the columns and the count."""
    client, url = store
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, v text, big text, big2 text)")
    sql(fresh_db, "ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL, ALTER COLUMN big2 SET STORAGE EXTERNAL")
    sql(fresh_db, "CREATE TABLE f (id int PRIMARY KEY, big text)")
    sql(fresh_db, "ALTER TABLE f ALTER COLUMN big SET STORAGE EXTERNAL")
    sql(fresh_db, "ALTER TABLE f REPLICA IDENTITY FULL")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t, f")
    slot = slot_name()
    create_slot(fresh_db, slot)
    sql(fresh_db, "INSERT INTO t VALUES (1, 'a', repeat('x', 5000), repeat('y', 5000)), (2, 'b', repeat('z', 5000), NULL)")
    sql(fresh_db, "INSERT INTO f VALUES (1, repeat('x', 5000))")
    sql(fresh_db, "UPDATE t SET v = 'kept key' WHERE id = 1")  # 'u' too, but the key stays: the merge keeps it
    sql(fresh_db, "UPDATE t SET id = 10 WHERE id = 1")  # big, big2 not sent, nor the old row
    sql(fresh_db, "UPDATE t SET id = 20, big = 'sent' WHERE id = 2")  # big sent; big2 is NULL (inline)
    sql(fresh_db, "UPDATE f SET id = 10 WHERE id = 1")  # FULL: the old row carries the value
    with caplog.at_level("WARNING", logger="airflow_pgcdc.drain.drain"):
        r = drain(fresh_db, url, slot, client)
    assert list(r.lost_toast) == ["public.t"]
    lost = r.lost_toast["public.t"]
    assert lost["updates"] == 1 and lost["columns"] == ["big", "big2"]
    assert LSN.parse(lost["first_commit_lsn"]) < LSN.parse(r.end_lsn)
    assert r.to_dict()["lost_toast"] == r.lost_toast
    warned = [m for m in caplog.messages if "REPLICA IDENTITY FULL" in m]
    assert len(warned) == 1 and "public.t" in warned[0] and "big, big2" in warned[0]
    moved = [x for x in all_rows(client, url, slot, "public.f") if x["id"] == 10]
    assert any(x["big"] == "x" * 5000 for x in moved), "REPLICA IDENTITY FULL: the value travels"


def test_streamed_transaction_with_subtransaction_abort(fresh_db, slot_name, store):
    client, url = store
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, pad text)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    create_slot(fresh_db, slot)
    with psycopg.connect(fresh_db) as c:
        c.execute("INSERT INTO t SELECT g, repeat('p', 200) FROM generate_series(1, 3000) g")
        c.execute("SAVEPOINT s1")
        c.execute("INSERT INTO t SELECT g, repeat('q', 200) FROM generate_series(3001, 6000) g")
        c.execute("ROLLBACK TO SAVEPOINT s1")
        c.execute("INSERT INTO t SELECT g, 'r' FROM generate_series(6001, 7000) g")
        c.commit()
    with psycopg.connect(fresh_db) as c:  # a streamed transaction rolled back as a whole
        c.execute("INSERT INTO t SELECT g, repeat('z', 200) FROM generate_series(10001, 14000) g")
        c.rollback()
    sql(fresh_db, "INSERT INTO t VALUES (99999, 'after')")
    r = drain(fresh_db, url, slot, client, connect_options=SMALL_WORK_MEM)
    m = read_window(client, Layout.parse(url), slot, r.window_seq)
    assert m.streamed["committed"] == 1, m.streamed
    ids = [x["id"] for x in all_rows(client, url, slot)]
    assert ids == list(range(1, 3001)) + list(range(6001, 7001)) + [99999]


def test_two_phase_prepared_across_windows(fresh_db, slot_name, store):
    if fresh_db.server.version_num < 150000:
        pytest.skip("two-phase decoding needs PostgreSQL 15+")
    client, url = store
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    create_slot(fresh_db, slot, two_phase=True)
    with psycopg.connect(fresh_db, autocommit=True) as c:
        c.execute("BEGIN")
        c.execute("INSERT INTO t VALUES (1, 'prepared')")
        c.execute("PREPARE TRANSACTION 'g1'")
        c.execute("BEGIN")
        c.execute("INSERT INTO t VALUES (2, 'never')")
        c.execute("PREPARE TRANSACTION 'g2'")
        c.execute("INSERT INTO t VALUES (3, 'plain')")
    w0 = drain(fresh_db, url, slot, client)
    m0 = read_window(client, Layout.parse(url), slot, w0.window_seq)
    assert {p["gid"] for p in m0.pending_prepared} == {"g1", "g2"}
    assert w0.tables == {"public.t": 1}, "prepared changes are held, not emitted"
    sql(fresh_db, "COMMIT PREPARED 'g1'")
    sql(fresh_db, "ROLLBACK PREPARED 'g2'")
    w1 = drain(fresh_db, url, slot, client)  # a new session: only COMMIT PREPARED arrives
    m1 = read_window(client, Layout.parse(url), slot, w1.window_seq)
    assert m1.pending_prepared == []
    assert [p["gid"] for p in m1.prepared["committed"]] == ["g1"]
    assert [p["gid"] for p in m1.prepared["rolled_back"]] == ["g2"]
    rows = all_rows(client, url, slot)
    assert [(x["id"], x["v"]) for x in rows] == [(3, "plain"), (1, "prepared")]
    assert LSN(rows[1]["_pgcdc_commit_lsn"]) >= m1.start, "emitted at COMMIT PREPARED"


def test_toast_truncate_messages_schema_change_and_replica_identity_full(fresh_db, slot_name, store):
    client, url = store
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, big text, n int)")
    sql(fresh_db, "ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL")
    sql(fresh_db, "CREATE TABLE f (id int, v text)")
    sql(fresh_db, "ALTER TABLE f REPLICA IDENTITY FULL")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t, f")
    slot = slot_name()
    create_slot(fresh_db, slot)
    big = "x" * 100_000
    sql(fresh_db, "INSERT INTO t VALUES (1, %s, 1)", (big,))
    sql(fresh_db, "UPDATE t SET n = 2 WHERE id = 1")  # big is not resent: unchanged TOAST
    sql(fresh_db, "INSERT INTO f VALUES (1, 'a')")
    sql(fresh_db, "UPDATE f SET v = 'b' WHERE id = 1")
    sql(fresh_db, "DELETE FROM f")
    sql(fresh_db, "SELECT pg_logical_emit_message(false, 'app.nontx', 'hello')")
    with psycopg.connect(fresh_db) as c:
        c.execute("INSERT INTO t VALUES (2, 'small', 3)")
        c.execute("SELECT pg_logical_emit_message(true, 'app.tx', 'in-tx')")
        c.execute("TRUNCATE t RESTART IDENTITY")
        c.commit()
    sql(fresh_db, "ALTER TABLE t ADD COLUMN extra bool")
    sql(fresh_db, "INSERT INTO t VALUES (3, 'y', 4, true)")
    r = drain(fresh_db, url, slot, client)
    layout = Layout.parse(url)
    m = read_window(client, layout, slot, r.window_seq)
    tables = {f"{t['schema']}.{t['table']}": t for t in m.tables}
    assert [len(rv["columns"]) for rv in tables["public.t"]["relation_versions"]] == [3, 4]
    part = tables["public.t"]["relation_versions"][1]["parts"][0]  # small: in the window's pack
    assert part["path"].startswith("pack-00000-") and part["length"] == part["bytes"] > 0
    data = read_window_rows(client, layout, slot, m)
    t = data["public.t"].to_pylist()
    assert [(x["_pgcdc_op"], x["id"]) for x in t] == [("I", 1), ("U", 1), ("I", 2), ("I", 3)]
    assert t[0]["big"] == big and t[1]["big"] is None and t[1]["_pgcdc_unchanged_toast"] == ["big"]
    assert t[3]["extra"] is True and t[0]["extra"] is None
    (trunc,) = m.truncates
    assert trunc["tables"] == ["public.t"] and trunc["restart_identity"] and not trunc["cascade"]
    assert t[2]["_pgcdc_seq"] < trunc["seq"] < t[3]["_pgcdc_seq"], "truncate in the order of changes"
    f = data["public.f"].to_pylist()
    assert [(x["_pgcdc_op"], x["v"], x["_pgcdc_old_v"]) for x in f] == [
        ("I", "a", None), ("U", "b", "a"), ("D", "b", None)]
    assert m.messages["transactional"] == 1 and m.messages["non_transactional"] == 1
    import pyarrow.parquet as pq
    msgs = pa.concat_tables([
        pq.read_table(f"{layout.bucket}/{layout.window_prefix(slot, m.window_seq)}{p['path']}",
                      filesystem=s3store.make_pyarrow_fs())
        for p in m.messages["parts"]]).to_pylist()
    assert {(x["prefix"], x["content"], x["transactional"]) for x in msgs} == {
        ("app.nontx", b"hello", False), ("app.tx", b"in-tx", True)}
    tx = next(x for x in msgs if x["transactional"])
    assert t[2]["_pgcdc_seq"] < tx["_pgcdc_seq"] < trunc["seq"]


def test_origin_recorded_and_skipped(fresh_db, slot_name, store):
    client, url = store
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    create_slot(fresh_db, slot)
    with psycopg.connect(fresh_db, autocommit=True) as c:
        for name, ids in (("loop", (1, 2)), ("east", (3,))):
            c.execute("SELECT pg_replication_origin_create(%s)", (name,))
            c.execute("SELECT pg_replication_origin_session_setup(%s)", (name,))
            for i in ids:
                c.execute("BEGIN")
                c.execute("SELECT pg_replication_origin_xact_setup('0/AB', now())")
                c.execute("INSERT INTO t VALUES (%s)", (i,))
                c.execute("COMMIT")
            c.execute("SELECT pg_replication_origin_session_reset()")
        c.execute("INSERT INTO t VALUES (4)")
    r = drain(fresh_db, url, slot, client, skip_origins=["loop"])
    m = read_window(client, Layout.parse(url), slot, r.window_seq)
    assert [x["id"] for x in all_rows(client, url, slot)] == [3, 4]
    assert m.skipped_transactions == 2
    assert [(o["origin"], o["origin_lsn"]) for o in m.origins] == [("east", "0/AB")]


def test_start_position_checks(fresh_db, slot_name, store):
    client, url = store
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    create_slot(fresh_db, slot)
    sql(fresh_db, "INSERT INTO t VALUES (1)")
    drain(fresh_db, url, slot, client)
    sql(fresh_db, "INSERT INTO t VALUES (2)")
    # someone else consumes the slot: the store no longer holds what the slot acknowledged
    sql(fresh_db, "SELECT pg_replication_slot_advance(%s, pg_current_wal_insert_lsn())", (slot,))
    with pytest.raises(SlotAheadOfStore, match="acknowledged that no window holds") as ahead:
        drain(fresh_db, url, slot, client)
    assert f"pgcdc recover --slot {slot}" in ahead.value.hint


class SlowParts:
    """A boto3 client whose Parquet uploads (parts, and packs of small parts) take ``delay`` seconds."""

    def __init__(self, client, delay):
        self._c, self._delay = client, delay

    def put_object(self, **kw):
        if kw.get("Key", "").endswith((".parquet", ".pack")):
            time.sleep(self._delay)
        return self._c.put_object(**kw)

    def __getattr__(self, name):
        return getattr(self._c, name)


def test_keepalives_answered_during_a_slow_upload(fresh_db, slot_name, store):
    client, url = store
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    create_slot(fresh_db, slot)
    sql(fresh_db, "INSERT INTO t SELECT generate_series(1, 100)")
    t0 = time.monotonic()
    r = drain(fresh_db, url, slot, SlowParts(client, 5.0), connect_options="-c wal_sender_timeout=2s")
    assert time.monotonic() - t0 > 5
    assert r.rows == 100 and confirmed(fresh_db, slot) == LSN.parse(r.end_lsn)


DRAIN_DAG = '''
import datetime

from airflow.sdk import DAG, task

from airflow_pgcdc.operators.drain import PgcdcDrainOperator

with DAG("pgcdc_test_drain", schedule=None, start_date=datetime.datetime(2024, 1, 1), catchup=False) as dag:
    @task
    def wait(**context):  # stands in for PgcdcChangesSensor: the same XCom shape
        return {"status": "ready", "observed_lsn": context["dag_run"].conf["observed_lsn"]}

    w = wait()
    d = PgcdcDrainOperator(
        task_id="drain",
        store="{{ dag_run.conf['to'] }}",
        slot="{{ dag_run.conf['slot'] }}",
        publications="pub",
        sensor_task_id="wait",
        start_without_snapshot=True,
        postgres_conn_id="pgcdc_src",
        aws_conn_id="pgcdc_s3",
    )
    w >> d
'''


def test_drain_operator_in_a_dag_run(fresh_db, slot_name, s3, s3_bucket, tmp_path):
    import json

    from airflow_runner import airflow_env, run_dag
    from test_operators_copy import conn_json

    if fresh_db.server.major != 18:
        pytest.skip("one DAG run is enough: the operator is a thin wrapper (the drain runs on both)")
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    create_slot(fresh_db, slot)
    sql(fresh_db, "INSERT INTO t SELECT generate_series(1, 10)")
    observed = sql(fresh_db, "SELECT pg_current_wal_insert_lsn()::text")[0][0]
    sql(fresh_db, "INSERT INTO t SELECT generate_series(11, 15)")  # after the sensor's LSN
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "pgcdc_test_drain.py").write_text(DRAIN_DAG)
    env = airflow_env(tmp_path / "airflow", dags, {
        "AIRFLOW_CONN_PGCDC_SRC": conn_json(fresh_db),
        "AIRFLOW_CONN_PGCDC_S3": json.dumps({"conn_type": "aws", "login": s3.access_key, "password": s3.secret_key,
                                             "extra": {"endpoint_url": s3.endpoint_url, "region_name": s3.region}}),
    })
    to = f"s3://{s3_bucket}/lake"
    result = run_dag(dags / "pgcdc_test_drain.py", "pgcdc_test_drain", env,
                     {"to": to, "slot": slot, "observed_lsn": observed})
    assert result.state == "success", result.output[-4000:]
    out = result.xcom("drain")
    assert out["window_seq"] == 0 and out["end_lsn"] == observed
    assert out["tables"] == {"public.t": 10} and out["bytes"] > 0
    assert confirmed(fresh_db, slot) == LSN.parse(observed)
    assert fresh_db.server.password not in result.output and s3.secret_key not in result.output


def test_a_receiving_window_logs_its_progress(fresh_db, slot_name, store, caplog, monkeypatch):
    """Every PROGRESS_SECONDS (here: at every status update) the receiving window says its
    rows and position, so a long catch-up is not silent until its end."""
    import airflow_pgcdc.drain.run as run

    monkeypatch.setattr(run, "PROGRESS_SECONDS", 0.0)
    client, url = store
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    create_slot(fresh_db, slot)
    sql(fresh_db, "INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 50000) g")
    with caplog.at_level("INFO", logger="airflow_pgcdc.drain.drain"):
        r = drain(fresh_db, url, slot, client)
    lines = [m for m in caplog.messages if "receiving:" in m]
    assert lines and all(f"slot {slot}: window 0 receiving: " in m and "change rows, at 0/" in m for m in lines)
    assert r.rows == 50000
