"""The drain's native receive path (airflow_pgcdc/pg/_copyrun.c: runs of a plain
transaction's inserts and new-row updates of one table, taken straight from libpq) and
the early hand-over of idle tables to the writer give, window for window, the rows the
ordinary path gives: two slots on the same WAL, one drained each way, compared row by row
on a workload that starts and breaks runs in every way the stream allows (tables
interleaved in one transaction, key updates, deletes, unchanged TOAST, a refused table,
a streamed transaction, chunk limits crossed inside a run)."""

from __future__ import annotations

import pytest
from test_drain import all_rows, assert_tiled, confirmed, create_slot, drain, sql, windows

import airflow_pgcdc.drain.run as run_mod
import airflow_pgcdc.drain.window as window_mod
from airflow_pgcdc.pg import copyrun
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.store.window import WindowWriter

# the walsender streams a transaction once its changes pass this: the big one below, not the others
WORK_MEM = "-c logical_decoding_work_mem=2MB"
TABLES = ("public.t", "public.u", "public.w", "public.x")


def test_the_native_path_is_built_and_finds_libpq():
    """`make setup` builds the native parts; psycopg's libpq is found in this process."""
    import psycopg  # noqa: F401 - loads psycopg's libpq

    assert copyrun._copyrun is not None, "airflow_pgcdc.pg._copyrun is not built: run `make setup` (needs gcc)"
    assert copyrun.libpq_functions() is not None, f"libpq not found among {copyrun._mapped_libpq()}"


def _count_runs(monkeypatch) -> list[int]:
    taken = [0]
    real = run_mod.WindowSink.took_run

    def took_run(self, k, nbytes):
        taken[0] += k
        return real(self, k, nbytes)

    monkeypatch.setattr(run_mod.WindowSink, "took_run", took_run)
    return taken


def _workload(dsn) -> None:
    """Changes that start, extend, cut and break runs."""
    sql(dsn, "INSERT INTO t SELECT g, 'a' || g, g FROM generate_series(1, 3000) g")  # one long run
    sql(dsn, "UPDATE t SET v = v || 'x' WHERE id <= 500")  # new-row-only updates: a run of 'U'
    sql(dsn, "UPDATE t SET id = id + 100000 WHERE id BETWEEN 501 AND 520")  # key changes: decoded
    sql(dsn, "DELETE FROM t WHERE id BETWEEN 521 AND 540")
    # two tables interleaved row by row in one transaction: every message switches tables
    sql(dsn, "DO $$ BEGIN FOR k IN 1..400 LOOP INSERT INTO t VALUES (10000 + k, 'i', k); "
             "INSERT INTO u VALUES (k, repeat('u', k % 50)); END LOOP; END $$")
    # runs of one table broken by another table's rows every 50
    sql(dsn, "DO $$ BEGIN FOR k IN 1..1500 LOOP INSERT INTO u VALUES (1000 + k, 'r'); "
             "IF k % 50 = 0 THEN INSERT INTO t VALUES (20000 + k, 'b', k); END IF; END LOOP; END $$")
    # TOAST: a big value, then updates that leave it unchanged (decoded: 'u' values)
    sql(dsn, "INSERT INTO t SELECT 30000 + g, repeat(md5(g::text), 400), g FROM generate_series(1, 30) g")
    sql(dsn, "UPDATE t SET n = n + 1 WHERE id > 30000")
    # a refused table (a column named like the metadata): its rows are left out, the others go on
    sql(dsn, "INSERT INTO w SELECT g, g FROM generate_series(1, 200) g")
    sql(dsn, "INSERT INTO t SELECT 40000 + g, 'after w', g FROM generate_series(1, 200) g")
    # x left idle while 400 rows of t come: at the next switch its rows go to the writer early
    sql(dsn, "INSERT INTO x SELECT g, 'idle' FROM generate_series(1, 300) g")
    sql(dsn, "INSERT INTO t SELECT 90000 + g, 'x', g FROM generate_series(1, 400) g")
    # many one-row transactions (a run of one each)
    for k in range(30):
        sql(dsn, "INSERT INTO u VALUES (%s, 'one')", (5000 + k,))


def _streamed(dsn) -> None:
    """One transaction larger than the walsender's logical_decoding_work_mem: streamed, spooled."""
    sql(dsn, "INSERT INTO t SELECT 50000 + g, repeat('s', 100), g FROM generate_series(1, 30000) g")


@pytest.mark.parametrize("chunk_rows", [16_384, 97])
def test_native_runs_give_the_rows_of_the_ordinary_path(fresh_db, slot_name, store, monkeypatch, chunk_rows):
    client, url, _lake = store
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, v text, n int)")
    sql(fresh_db, "CREATE TABLE u (id int PRIMARY KEY, s text)")
    sql(fresh_db, 'CREATE TABLE w (id int PRIMARY KEY, "_pgcdc_op" int)')
    sql(fresh_db, "CREATE TABLE x (id int PRIMARY KEY, s text)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t, u, w, x")
    native, plain = slot_name("n_"), slot_name("p_")
    starts = {native: create_slot(fresh_db, native), plain: create_slot(fresh_db, plain)}  # no change between
    _workload(fresh_db)
    _streamed(fresh_db)
    # small chunks: runs stop at the chunk's room and go on in the next chunk; idle tables
    # are handed over (and their rows encoded) while the others arrive
    monkeypatch.setattr(window_mod, "CHUNK_ROWS", chunk_rows)
    monkeypatch.setattr(window_mod, "IDLE_ROWS", 150 if chunk_rows < 1000 else window_mod.IDLE_ROWS)
    settled = []
    real_submit = WindowWriter.submit_rows

    def submit_rows(self, version, chunk, wait, *, settle=False):
        settled.append(settle)
        return real_submit(self, version, chunk, wait, settle=settle)

    monkeypatch.setattr(WindowWriter, "submit_rows", submit_rows)
    end = LSN.parse(sql(fresh_db, "SELECT pg_current_wal_insert_lsn()::text")[0][0])
    taken = _count_runs(monkeypatch)
    results = {}
    for slot, on in ((native, True), (plain, False)):
        if not on:
            monkeypatch.setattr(copyrun, "libpq_functions", lambda: None)
        before = taken[0]
        results[slot] = r = drain(fresh_db, url, slot, client, until_lsn=end, connect_options=WORK_MEM)
        assert (taken[0] > before) == on, f"runs taken natively: {taken[0] - before} (native {on})"
        assert r.window_seq == 0 and confirmed(fresh_db, slot) == end
        assert_tiled(windows(client, url, slot), starts[slot])
    a, b = results[native], results[plain]
    assert (a.transactions, a.rows, a.tables) == (b.transactions, b.rows, b.tables)
    assert taken[0] >= 3000, "the long insert was taken in runs"
    if chunk_rows < 1000:
        assert any(settled), "idle tables were handed over early"
    for table in TABLES:
        got, want = all_rows(client, url, native, table), all_rows(client, url, plain, table)
        assert len(got) == len(want) and got == want, table
    t_rows = all_rows(client, url, native, "public.t")
    assert [x["_pgcdc_seq"] for x in t_rows] == sorted(x["_pgcdc_seq"] for x in t_rows)
    assert sum(1 for x in t_rows if x["_pgcdc_op"] == "I" and 50000 < x["id"] <= 80000) == 30000, "the streamed one"
    m = windows(client, url, native)[0]
    assert m.streamed["committed"] == 1, "the big transaction was streamed (spooled, no runs)"
    assert [t for t in m.tables if t["table"] == "w"][0].get("refused"), "w is refused, alone"
