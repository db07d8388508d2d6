"""The drain's limits against real PostgreSQL 15/18 and the S3 server: windows cut by
``max_bytes`` and by ``max_seconds`` (busy and quiet slots), the limit flags of
``pgcdc drain``, the heartbeat that moves a stalled stream past the window end (and
``DrainTimeout`` without it, or when the end is never reached; ``max_wait`` counts time
without data, not the whole reading time), and binary pgoutput values end to end.

Where a window may end is checked against an oracle independent of the drain's decoder:
a second slot created at the same point, read with ``pg_logical_slot_peek_binary_changes``
(pgoutput over the SQL interface), which gives each committed transaction's xid, commit
LSN, commit end LSN and the bytes of its messages."""

from __future__ import annotations

import itertools
import json
import struct
import time
from dataclasses import dataclass

import psycopg
import pytest
from pgoutput_capture import WAL_BOUNDARIES
from test_drain import all_rows, assert_tiled, confirmed, create_slot, drain, sql, windows

import airflow_pgcdc.drain.plan as plan_mod
import airflow_pgcdc.drain.run as run_mod
from airflow_pgcdc import cli
from airflow_pgcdc.drain.drain import HEARTBEAT_PREFIX, DrainTimeout
from airflow_pgcdc.protocol import pgoutput as po
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.store.layout import Layout
from airflow_pgcdc.store.window import committed_window_seqs, read_window, read_window_rows

# an until_lsn this far past the WAL insert position is never reached during a test: the
# window can only end by a limit
FAR = 1 << 30


@pytest.fixture
def store(s3, s3_bucket, monkeypatch):
    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    return s3.client(), f"s3://{s3_bucket}/lake"


def insert_lsn(dsn) -> LSN:
    return LSN.parse(sql(dsn, "SELECT pg_current_wal_insert_lsn()::text")[0][0])


# --------------------------------------------------------------------------- the oracle


@dataclass(frozen=True)
class Txn:
    xid: int
    commit_lsn: LSN
    end_lsn: LSN  # end of the commit record
    nbytes: int  # bytes of its pgoutput messages (Begin, changes, Commit; no Relation)


def peek(dsn, slot, *, messages=False) -> list[bytes]:
    rows = sql(dsn, "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1', "
                    "'publication_names', 'pub', 'messages', %s)", (slot, "true" if messages else "false"))
    return [bytes(r[0]) for r in rows]


def peek_transactions(dsn, slot) -> tuple[list[Txn], int]:
    """The committed transactions the oracle slot sees (it is not consumed), in commit
    order, and the size of the largest Relation message."""
    txns, nbytes, relation, xid = [], 0, 0, None
    for data in peek(dsn, slot):
        tag = data[:1]
        if tag == b"R":
            relation = max(relation, len(data))
            continue
        nbytes += len(data)
        if tag == b"B":  # final LSN, commit timestamp, xid
            (xid,) = struct.unpack_from("!I", data, 17)
        elif tag == b"C":  # flags, commit LSN, end LSN, commit timestamp
            _flags, commit_lsn, end_lsn = struct.unpack_from("!BQQ", data, 1)
            txns.append(Txn(xid, LSN(commit_lsn), LSN(end_lsn), nbytes))
            nbytes = 0
    return txns, relation


def heartbeat_lsns(dsn, slot) -> list[LSN]:
    """Positions of the heartbeat messages the oracle slot sees."""
    out = []
    for data in peek(dsn, slot, messages=True):
        if data[:1] == b"M":  # flags, LSN, prefix\0, length, content
            _flags, lsn = struct.unpack_from("!BQ", data, 1)
            prefix = data[10:data.index(b"\0", 10)].decode()
            if prefix == HEARTBEAT_PREFIX:
                out.append(LSN(lsn))
    return out


def check_windows(client, url, slot, txns, start):
    """Every committed window holds exactly the transactions whose commit LSN lies in
    ``[start, end)``, each as one contiguous run of rows, in commit order, and does not end
    inside a commit record; together they hold every transaction. Returns each window's
    manifest with its transactions."""
    layout = Layout.parse(url)
    ms = windows(client, url, slot)
    assert_tiled(ms, start)
    out = []
    for m in ms:
        inside = [t for t in txns if m.start <= t.commit_lsn < m.end]
        table = read_window_rows(client, layout, slot, m).get("public.t")
        rows = table.to_pylist() if table is not None else []
        runs = [k for k, _ in itertools.groupby((r["_pgcdc_xid"], r["_pgcdc_commit_lsn"]) for r in rows)]
        assert runs == [(t.xid, int(t.commit_lsn)) for t in inside], f"window {m.window_seq}"
        assert m.transactions == len(inside)
        if inside:
            assert m.end >= inside[-1].end_lsn, f"window {m.window_seq} ends inside a commit record"
        out.append((m, inside))
    assert [t for _, inside in out for t in inside] == txns, "every transaction in a window"
    return out


# --------------------------------------------------------------------------- instrumentation


class _Decoder:
    """A pgoutput decoder wrapper: ``on_message(msg)`` sees every decoded message."""

    def __init__(self, decoder, on_message):
        self._decoder, self._on_message = decoder, on_message

    def decode(self, data):
        msg = self._decoder.decode(data)
        self._on_message(msg)
        return msg

    def __getattr__(self, name):
        return getattr(self._decoder, name)


def watch_decoder(monkeypatch, on_message):
    """Wrap the decoder of every stream the drain opens; ``on_message(msg, options)``. The
    messages the drain takes undecoded (``TransactionAssembler.take_raw``: a plain
    transaction's inserts, the changes inside a stream block; ``WindowSink.took_run``: the
    runs of inserts the native receive path takes) are seen too, decoded here."""
    real = plan_mod.LogicalStream.pgoutput
    current = {}

    def pgoutput(conn, slot, options, start_lsn=0):
        stream = real(conn, slot, options, start_lsn)
        stream.decoder = _Decoder(stream.decoder, lambda msg: on_message(msg, options))
        current["options"] = options
        return stream

    real_take = run_mod.TransactionAssembler.take_raw

    def take_raw(self, raw):
        in_block = self.in_stream_block
        taken = real_take(self, raw)
        if taken:
            decoder = po.PgoutputDecoder(4 if in_block else 1)
            if in_block:
                decoder.decode(po.StreamStart(0, False).encode(4))
            on_message(decoder.decode(raw), current["options"])
        return taken

    real_took_run = run_mod.WindowSink.took_run

    def took_run(self, k, nbytes):  # the native receive path's runs (pg.copyrun): seen too
        images, _ = self._last_buf.raw_run_lists()
        decoder = po.PgoutputDecoder(1)
        for raw in images[-k:]:
            on_message(decoder.decode(raw), current["options"])
        return real_took_run(self, k, nbytes)

    monkeypatch.setattr(plan_mod.LogicalStream, "pgoutput", staticmethod(pgoutput))
    monkeypatch.setattr(run_mod.TransactionAssembler, "take_raw", take_raw)
    monkeypatch.setattr(run_mod.WindowSink, "took_run", took_run)


# --------------------------------------------------------------------------- max_bytes


def write_numbered(dsn, n) -> list[tuple]:
    """``n`` committed transactions on ``t``, numbered in commit order, with 1 to 3 rows of
    varied width (transaction ``big`` has 25), in pairs that overlap in the WAL
    (``k + 1`` starts first, ``k`` commits first); some also update and delete rows of
    earlier ones. Returns the changes the slot must deliver, in order:
    ``(txn, op, id)``, ``txn`` None for a delete (its row holds only the key)."""
    changes: list[tuple] = []
    alive: list[int] = []

    def inserts(conn, k, rows):
        out = []
        for j in range(rows):
            (id_,) = conn.execute("INSERT INTO t (txn, j, pad) VALUES (%s, %s, %s) RETURNING id",
                                  (k, j, "p" * (100 + 37 * (k + j) % 300))).fetchone()
            out.append((k, "I", id_))
        return out

    big = n // 4 * 2
    with psycopg.connect(dsn) as a, psycopg.connect(dsn) as b:
        for k in range(0, n, 2):
            late = inserts(b, k + 1, 1)  # k + 1 starts first ...
            early = inserts(a, k, 25 if k == big else 1 + k % 3)
            if k % 3 == 0 and len(alive) >= 2:
                upd, dele = alive.pop(0), alive.pop(0)
                a.execute("UPDATE t SET txn = %s, j = -1 WHERE id = %s", (k, upd))
                a.execute("DELETE FROM t WHERE id = %s", (dele,))
                early += [(k, "U", upd), (None, "D", dele)]
                alive.append(upd)
            a.commit()  # ... and commits second
            late += inserts(b, k + 1, k % 2 + 1)
            b.commit()
            changes += early + late
            alive += [c[2] for c in early + late if c[1] == "I"]
    return changes


def test_max_bytes_windows_end_at_transaction_boundaries(fresh_db, slot_name, store):
    client, url = store
    sql(fresh_db, "CREATE TABLE t (id bigserial PRIMARY KEY, txn int, j int, pad text)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    slot, oracle = slot_name(), slot_name("o_")
    start = create_slot(fresh_db, slot)
    create_slot(fresh_db, oracle)
    expected = write_numbered(fresh_db, 30)
    txns, relation = peek_transactions(fresh_db, oracle)
    assert len(txns) == 30
    max_bytes = 2 * max(sorted(t.nbytes for t in txns)[:-1])  # two or more transactions a window but the big one
    assert max(t.nbytes for t in txns) > max_bytes, "one transaction is larger than the limit"
    while True:
        r = drain(fresh_db, url, slot, client, max_bytes=max_bytes)
        if r.window_seq is None or r.transactions == 0:
            break
        assert confirmed(fresh_db, slot) == LSN.parse(r.end_lsn), "acknowledged at the window end"
    got = [(x["txn"], x["_pgcdc_op"], x["id"]) for x in all_rows(client, url, slot)]
    assert got == expected, "each change exactly once, in commit order"
    per_window = check_windows(client, url, slot, txns, start)
    cut = [(m, inside) for m, inside in per_window if m.end_reason == "max_bytes"]
    assert len(cut) >= 3
    last = [m for m, inside in per_window if inside][-1]
    for m, inside in per_window:
        if not inside:
            continue
        before_last = sum(t.nbytes for t in inside[:-1])
        assert before_last < max_bytes, f"window {m.window_seq} should have ended earlier"
        if m.end_reason == "max_bytes":
            assert m.end == inside[-1].end_lsn, "ends at the end of its last transaction's commit"
            assert before_last + inside[-1].nbytes + relation >= max_bytes, f"window {m.window_seq} cut too early"
        else:
            assert m.end_reason == "until_lsn" and m is last, "only the last window is not cut"
            assert before_last + inside[-1].nbytes < max_bytes, "the last window holds less than the limit"
    (big,) = [t for t in txns if t.nbytes > max_bytes]
    assert any(inside[-1] == big for _, inside in cut), "a transaction larger than the limit ends its window, whole"
    assert any(len(inside) >= 2 for _, inside in cut)


# --------------------------------------------------------------------------- max_seconds


def test_max_seconds_on_a_busy_slot_ends_at_a_transaction_boundary(fresh_db, slot_name, store, monkeypatch):
    client, url = store
    sql(fresh_db, "CREATE TABLE t (id bigserial PRIMARY KEY, txn int, j int)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    slot, oracle = slot_name(), slot_name("o_")
    start = create_slot(fresh_db, slot)
    create_slot(fresh_db, oracle)
    n_txns, n_rows = 100, 50
    sql(fresh_db, f"DO $$ BEGIN FOR k IN 0..{n_txns - 1} LOOP INSERT INTO t (txn, j) "
                  f"SELECT k, g FROM generate_series(0, {n_rows - 1}) g; COMMIT; END LOOP; END $$")
    # a consumer slower than the backlog, whatever the machine: each message takes 1 ms or
    # more, so reading all of them (5,000+) takes well over max_seconds
    slow = [True]
    watch_decoder(monkeypatch, lambda msg, options: slow[0] and time.sleep(0.001))
    r = drain(fresh_db, url, slot, client, until_lsn=insert_lsn(fresh_db) + FAR, max_seconds=2.0)
    slow[0] = False
    assert r.window_seq == 0 and r.end_reason == "max_seconds" and 0 < r.transactions < n_txns
    assert r.rows == n_rows * r.transactions, "whole transactions"
    assert confirmed(fresh_db, slot) == LSN.parse(r.end_lsn)
    rest = drain(fresh_db, url, slot, client)  # the rest of the backlog
    assert rest.window_seq == 1 and rest.end_reason == "until_lsn" and rest.transactions == n_txns - r.transactions
    txns, _ = peek_transactions(fresh_db, oracle)
    (first, inside), *_ = check_windows(client, url, slot, txns, start)
    assert first.end_reason == "max_seconds" and len(inside) == r.transactions
    assert first.end == inside[-1].end_lsn, "ends at the end of its last transaction's commit"
    got = [(x["txn"], x["j"]) for x in all_rows(client, url, slot)]
    assert got == [(k, j) for k in range(n_txns) for j in range(n_rows)], "each transaction exactly once, in order"


def test_max_seconds_on_a_quiet_slot_ends_and_advances(fresh_db, slot_name, store):
    client, url = store
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY)")
    sql(fresh_db, "CREATE TABLE other (x int)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    start = create_slot(fresh_db, slot)
    sql(fresh_db, "INSERT INTO other SELECT generate_series(1, 100)")  # WAL, but nothing for the slot
    written = insert_lsn(fresh_db)
    ends = []
    # one window normally; on a loaded machine the walsender's keepalive may come after the
    # deadline, and that window ends where it started: the next one goes on from there
    for _ in range(5):
        r = drain(fresh_db, url, slot, client, until_lsn=written + FAR, max_seconds=1.0, heartbeat=False)
        assert r.window_seq == len(ends) and r.end_reason == "max_seconds"
        assert r.transactions == 0 and r.rows == 0 and r.tables == {}
        end = LSN.parse(r.end_lsn)
        assert confirmed(fresh_db, slot) == end, "acknowledged at the window end"
        assert end <= insert_lsn(fresh_db), "a position the server reported, never past its WAL"
        ends.append(end)
        if end >= written:
            break
    assert ends[-1] >= written > start, "a quiet slot advances over WAL that has nothing for it"
    ms = windows(client, url, slot)
    assert_tiled(ms, start)
    assert [(m.end_reason, m.transactions) for m in ms] == [("max_seconds", 0)] * len(ends)
    sql(fresh_db, "INSERT INTO t VALUES (1)")  # the slot still delivers, once
    r = drain(fresh_db, url, slot, client)
    assert r.end_reason == "until_lsn" and r.tables == {"public.t": 1}
    assert [x["id"] for x in all_rows(client, url, slot)] == [1]


# --------------------------------------------------------------------------- the CLI flags


def test_cli_limit_flags(fresh_db, slot_name, store, capsys):
    client, url = store
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, txn int)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    start = create_slot(fresh_db, slot)

    def txn(k):
        sql(fresh_db, "INSERT INTO t SELECT g, %s FROM generate_series(%s::int, %s::int) g", (k, 10 * k, 10 * k + 9))

    def pgcdc_drain(*flags):
        capsys.readouterr()
        code = cli.main(["drain", "--dsn", fresh_db, "--slot", slot, "--publication", "pub", "--to", url,
                         "--start-without-snapshot", *flags])
        out = capsys.readouterr().out
        assert code == 0, out
        summary = json.loads(out)
        assert confirmed(fresh_db, slot) == LSN.parse(summary["end_lsn"])
        return summary

    for k in range(4):
        txn(k)
    observed = insert_lsn(fresh_db)  # as the sensor observes it
    txn(4)
    txn(5)
    s = pgcdc_drain("--max-rows", "15")
    assert (s["window_seq"], s["end_reason"], s["transactions"], s["rows"]) == (0, "max_rows", 2, 20)
    s = pgcdc_drain("--max-bytes", "1")
    assert (s["window_seq"], s["end_reason"], s["transactions"], s["rows"]) == (1, "max_bytes", 1, 10)
    s = pgcdc_drain("--until-lsn", str(observed))
    assert (s["window_seq"], s["end_reason"], s["transactions"], s["rows"]) == (2, "until_lsn", 1, 10)
    assert s["end_lsn"] == str(observed)
    s = pgcdc_drain("--until-lsn", str(observed + FAR), "--max-seconds", "1")
    assert (s["window_seq"], s["end_reason"]) == (3, "max_seconds")
    assert s["rows"] == 10 * s["transactions"] and s["tables"] == ({"public.t": s["rows"]} if s["rows"] else {})
    s = pgcdc_drain()  # whatever the max-seconds window left (nothing, unless the machine is slow)
    assert (s["window_seq"], s["end_reason"]) in ((4, "until_lsn"), (None, None))
    ms = windows(client, url, slot)
    assert_tiled(ms, start)
    assert ms[2].end == observed
    assert [x["txn"] for x in all_rows(client, url, slot)] == [k for k in range(6) for _ in range(10)]


# --------------------------------------------------------------------------- heartbeat


@pytest.fixture
def heartbeats(monkeypatch):
    """Counts the drain's heartbeat messages (they are still emitted)."""
    calls = []
    real = run_mod._emit_heartbeat

    def spy(conn):
        calls.append(time.monotonic())
        return real(conn)

    monkeypatch.setattr(run_mod, "_emit_heartbeat", spy)
    return calls


STALL_ATTEMPTS = 10
"""Tries of a stalled window: any other commit on the shared server (autovacuum's analyses
of earlier tests' databases, the background writer's running-xacts record) flushes WAL past
the window end and the try is a normal window. Three were not always enough in a full run
(three flushes within 1.5 s each, PG18); a try that flushes costs well under a second."""


def one_row_slot(dsn, slot) -> LSN:
    """Table ``t (id)`` in publication ``pub``, slot ``slot`` created, then row 1 inserted;
    returns the slot's start."""
    sql(dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    sql(dsn, "CREATE PUBLICATION pub FOR TABLE t")
    start = create_slot(dsn, slot)
    sql(dsn, "INSERT INTO t VALUES (1)")
    return start


def stalled_drain(dsn, url, slot, client, key, **kw):
    """Drain up to ``pg_current_wal_insert_lsn()`` while another session holds an
    uncommitted insert: its WAL lies before that position but nothing flushes it (no commit),
    so the walsender, which only decodes flushed WAL, has no record to decode up to the
    window end. Only new flushed WAL moves it: the heartbeat, or (every 15 s at most, when
    there was WAL since its last one) the background writer's running-xacts record. The
    insert is committed afterwards. Returns the window end and the result or DrainTimeout."""
    with psycopg.connect(dsn) as other:
        other.execute("INSERT INTO t VALUES (%s)", (key,))
        until = insert_lsn(dsn)
        try:
            result = drain(dsn, url, slot, client, until_lsn=until, **kw)
        except DrainTimeout as e:
            result = e
        other.commit()
    return until, result


def test_heartbeat_moves_a_stalled_stream_past_the_window_end(fresh_db, slot_name, store, heartbeats):
    client, url = store
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    slot, oracle = slot_name(), slot_name("o_")
    start = create_slot(fresh_db, slot)
    create_slot(fresh_db, oracle)
    sql(fresh_db, "INSERT INTO t VALUES (1)")
    layout = Layout.parse(url)
    for attempt in range(STALL_ATTEMPTS):
        heartbeats.clear()
        until, r = stalled_drain(fresh_db, url, slot, client, 100 + attempt, heartbeat_after=0.2, max_wait=120)
        assert not isinstance(r, Exception), r
        assert r.end_reason == "until_lsn" and LSN.parse(r.end_lsn) == until
        assert confirmed(fresh_db, slot) == until
        m = read_window(client, layout, slot, r.window_seq)
        assert m.messages["non_transactional"] == 0 and m.messages["parts"] == [], "never written to the window"
        if heartbeats:
            break
        # the background writer flushed WAL past the window end before the first heartbeat: again
    assert heartbeats, "the heartbeat moved the stream past the window end"
    assert any(h >= until for h in heartbeat_lsns(fresh_db, oracle)), "a heartbeat message past the window end"
    r = drain(fresh_db, url, slot, client)  # holds the heartbeat's position, not the message
    assert r.end_reason == "until_lsn"
    ms = windows(client, url, slot)
    assert_tiled(ms, start)
    assert all(m.messages["non_transactional"] == 0 and m.messages["parts"] == [] for m in ms)
    assert [x["id"] for x in all_rows(client, url, slot)] == [1] + [100 + i for i in range(attempt + 1)]


def test_without_heartbeat_a_stalled_stream_times_out_and_acknowledges_nothing(
        fresh_db, slot_name, store, heartbeats):
    client, url = store
    slot = slot_name()
    start = one_row_slot(fresh_db, slot)
    layout = Layout.parse(url)
    for attempt in range(STALL_ATTEMPTS):
        before, seqs = confirmed(fresh_db, slot), committed_window_seqs(client, layout, slot)
        until, r = stalled_drain(fresh_db, url, slot, client, 100 + attempt, heartbeat=False, max_wait=1.5)
        if isinstance(r, DrainTimeout):
            break
        # the background writer flushed WAL past the window end within max_wait: a normal window; again
        assert r.end_reason == "until_lsn" and LSN.parse(r.end_lsn) == until
    assert isinstance(r, DrainTimeout), "the stream never reaches the window end without a heartbeat"
    assert str(until) in str(r)
    assert heartbeats == []
    assert confirmed(fresh_db, slot) == before, "nothing acknowledged"
    assert committed_window_seqs(client, layout, slot) == seqs, "no manifest written"
    r = drain(fresh_db, url, slot, client)  # the next attempt holds it all, once
    assert r.end_reason == "until_lsn"
    assert_tiled(windows(client, url, slot), start)
    assert [x["id"] for x in all_rows(client, url, slot)] == [1] + [100 + i for i in range(attempt + 1)]


@pytest.mark.parametrize("boundary", sorted(WAL_BOUNDARIES))
def test_a_window_end_just_after_a_page_header_needs_no_heartbeat(fresh_db, slot_name, store, heartbeats,
                                                                    boundary):
    """The drain's default end, ``pg_current_wal_insert_lsn()``, names the position after a
    page header when the last record ended at that page's start (by chance, or after every
    ``pg_switch_wal()``: ``archive_timeout`` leaves an idle server there); the walsender reports the
    boundary until more WAL comes. The window ends there at once: it used to wait for a
    heartbeat (and, without one, time out on a quiet server). The next drain's guard sees
    the server's flushed WAL end at the boundary, before the store's end, and still knows
    it for the same server (it once said it "never had the store's last transactions")."""
    client, url = store
    slot = slot_name()
    start = one_row_slot(fresh_db, slot)
    for _ in range(STALL_ATTEMPTS):
        heartbeats.clear()
        end = WAL_BOUNDARIES[boundary](fresh_db)
        r = drain(fresh_db, url, slot, client)
        again = drain(fresh_db, url, slot, client)
        if not heartbeats and insert_lsn(fresh_db) == end:
            break  # no other WAL came (nor a heartbeat): both drains saw the boundary alone
        # another session's WAL (autovacuum, the background writer) came meanwhile: again
    assert not heartbeats, "the window end after a page header waited for a heartbeat"
    assert insert_lsn(fresh_db) == end, "other WAL came during every try"
    assert r.end_reason == "until_lsn" and LSN.parse(r.end_lsn) == end
    assert again.window_seq is None and LSN.parse(again.end_lsn) == end
    assert confirmed(fresh_db, slot) == end
    sql(fresh_db, "INSERT INTO t VALUES (2)")
    r = drain(fresh_db, url, slot, client)
    assert r.end_reason == "until_lsn" and r.rows == 1
    assert_tiled(windows(client, url, slot), start)
    assert [x["id"] for x in all_rows(client, url, slot)] == [1, 2]


def test_max_wait_is_time_without_data_not_the_reading_time(fresh_db, slot_name, store, monkeypatch):
    """A window that takes longer than ``max_wait`` to read, then stalls (as in
    :func:`stalled_drain`), is not given up: the heartbeat moves it on."""
    client, url = store
    sql(fresh_db, "CREATE TABLE t (id bigserial PRIMARY KEY, txn int, j int)")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    create_slot(fresh_db, slot)
    n_txns, n_rows = 80, 50
    sql(fresh_db, f"DO $$ BEGIN FOR k IN 0..{n_txns - 1} LOOP INSERT INTO t (txn, j) "
                  f"SELECT k, g FROM generate_series(0, {n_rows - 1}) g; COMMIT; END LOOP; END $$")
    # reading the backlog takes 4 s or more (1 ms a message), longer than max_wait
    watch_decoder(monkeypatch, lambda msg, options: time.sleep(0.001))
    with psycopg.connect(fresh_db) as other:
        other.execute("INSERT INTO t (txn, j) VALUES (-1, 0)")  # uncommitted: its WAL is not flushed
        until = insert_lsn(fresh_db)
        r = drain(fresh_db, url, slot, client, until_lsn=until, heartbeat_after=0.2, max_wait=3.0)
        other.commit()
    assert r.end_reason == "until_lsn" and LSN.parse(r.end_lsn) == until
    assert r.transactions == n_txns and r.rows == n_txns * n_rows
    assert confirmed(fresh_db, slot) == until


@pytest.mark.timeout(120)
def test_heartbeats_do_not_keep_an_endless_window_alive(fresh_db, slot_name, store, heartbeats):
    """A window end the stream never reaches (past the WAL, nothing written): the
    heartbeats it provokes are not progress, so ``DrainTimeout`` comes after ``max_wait``."""
    client, url = store
    slot = slot_name()
    start = one_row_slot(fresh_db, slot)
    with pytest.raises(DrainTimeout):
        drain(fresh_db, url, slot, client, until_lsn=insert_lsn(fresh_db) + FAR, heartbeat_after=0.2, max_wait=2.0)
    assert heartbeats, "heartbeats were emitted"
    assert confirmed(fresh_db, slot) == start, "nothing acknowledged"
    assert committed_window_seqs(client, Layout.parse(url), slot) == [], "no manifest written"


# --------------------------------------------------------------------------- binary values


def test_binary_mode_gives_the_same_rows_as_text_mode(fresh_db, slot_name, store, monkeypatch):
    client, url = store
    sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, i int, n numeric(12,3), nu numeric, ts timestamptz, "
                  "s text, b bytea, a int[], m int[][])")
    sql(fresh_db, "CREATE PUBLICATION pub FOR TABLE t")
    text_slot, binary_slot = slot_name(), slot_name()
    create_slot(fresh_db, text_slot)
    create_slot(fresh_db, binary_slot)
    sql(fresh_db, r"""INSERT INTO t VALUES
        (1, 0, 0, 0, '2024-02-29 12:34:56.789012+00', '', '\x', '{}', '{}'),
        (2, 2147483647, 123456789.125, '-1.5e-20', 'infinity', 'héllo ☃ \ "q"', '\x00ff10', '{1,NULL,-3}',
         '{{1,2},{3,NULL}}'),
        (3, -2147483648, -0.001, 'NaN', '-infinity', E'tab\tnl\n', '\x00', '{-1}', '{{1},{2},{3}}'),
        (4, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
        (5, 42, 'NaN', '1e100', '1999-12-31 23:59:59.999999-08', repeat('x', 5000), '\xdeadbeef', '{NULL}',
         '{{NULL}}'),
        (6, 7, 999999999.999, 'Infinity', '0001-01-01 00:00:00+00', 'x', '\x5c', '{5,6}', '{{5,6}}'),
        (7, 8, 1.5, '-Infinity', '4713-01-01 00:00:00+00 BC', 'y', '\x27', '{2147483647,-2147483648}',
         '{{7,8,9},{10,11,12}}')""")
    sql(fresh_db, "UPDATE t SET n = n + 1, a = a || 7, s = s || '!' WHERE id = 2")
    sql(fresh_db, "UPDATE t SET id = 20, nu = nu * 2 WHERE id = 2")
    sql(fresh_db, "DELETE FROM t WHERE id = 3")
    kinds: dict[bool, set] = {False: set(), True: set()}  # Python types of the values, by binary option

    def record(msg, options):
        if type(msg) in (po.Insert, po.Update):
            kinds[options.binary].update(type(v) for v in msg.new if v is not None and v is not po.UNCHANGED_TOAST)

    watch_decoder(monkeypatch, record)
    rt = drain(fresh_db, url, text_slot, client)
    rb = drain(fresh_db, url, binary_slot, client, binary=True)
    assert kinds == {False: {str}, True: {bytes}}, "values came as text, then in binary"
    assert (rt.transactions, rt.rows) == (rb.transactions, rb.rows) == (4, 10)
    layout = Layout.parse(url)
    text_rows = read_window_rows(client, layout, text_slot, read_window(client, layout, text_slot, 0))["public.t"]
    binary_rows = read_window_rows(client, layout, binary_slot, read_window(client, layout, binary_slot, 0))["public.t"]
    assert binary_rows.schema == text_rows.schema
    for name in text_rows.column_names:  # Arrow values (4713 BC has no Python datetime)
        assert binary_rows.column(name).equals(text_rows.column(name)), name
    assert binary_rows.column("id").to_pylist() == [1, 2, 3, 4, 5, 6, 7, 2, 20, 3]
    some = binary_rows.select(["b", "a", "m", "nu"]).slice(0, 7).to_pylist()  # not both wrong alike
    assert [x["b"] for x in some] == [b"", b"\x00\xff\x10", b"\x00", None, b"\xde\xad\xbe\xef", b"\\", b"'"]
    assert some[1]["a"] == [1, None, -3] and some[6]["m"] == [[7, 8, 9], [10, 11, 12]] and some[4]["m"] == [[None]]
    assert [x["nu"] for x in some][2:] == ["NaN", None, "1" + "0" * 100, "Infinity", "-Infinity"]

