"""Helpers for the tests that decode what real PostgreSQL servers send through pgoutput.

Not a test module: ``test_pgoutput_real.py`` and ``test_wal2json_oracle.py`` import it as
``from pgoutput_capture import ...`` (pytest's default ``prepend`` import mode puts this
directory on ``sys.path``; the test folders have no ``__init__.py``).

The pattern, per test: a :class:`Bench` on ``fresh_db`` creates a publication and a
logical slot (``snapshot 'nothing'``), the test runs a workload with plain SQL and
records what the server says about it (xids, oids, timestamps, WAL records), then
:meth:`Bench.read` opens a NEW replication connection, starts pgoutput with the
options under test and reads until the walsender has passed the WAL insert position
taken after the workload. Nothing is ever confirmed, so the same slot can be read
again with other options (protocol versions, binary...).

Every read also checks, for every message:

- ``to_dict()`` is JSON-serialisable;
- ``msg.encode(...)`` gives back exactly the bytes the server sent (decoder and
  encoder agree with the server byte for byte).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

import psycopg
from psycopg import sql as pgsql

from airflow_pgcdc.pg.logical import LogicalStream
from airflow_pgcdc.pg.replication import ReplicationConnection
from airflow_pgcdc.protocol import pgoutput as po
from airflow_pgcdc.protocol.lsn import LSN, WAL_BLOCK_SIZE, WalSizes
from airflow_pgcdc.protocol.pgoutput.options import PgoutputOptions

SMALL_WORK_MEM = "-c logical_decoding_work_mem=64kB"
"""The smallest ``logical_decoding_work_mem``: a transaction of more than ~64 kB of
changes is streamed (``streaming`` on) instead of being decoded at commit."""

READ_TIMEOUT = 30.0

WAL_PAGE = WAL_BLOCK_SIZE  # the test servers' wal_block_size (the default)


def end_wal_at_a_page_boundary(dsn: str, *, tries: int = 50) -> LSN:
    """Write WAL until its last record ends exactly at a page boundary; return
    ``pg_current_wal_insert_lsn()`` then: the position just after the next page's short
    header (24 bytes past the boundary), which no record reaches until more WAL comes.

    Non-transactional logical messages fill the page (no transaction, so no commit
    record): one measures a message record's size, the next is sized to end at the
    page's end. WAL from other sessions (autovacuum, the background writer) can get in
    between: then again. The last message is flushed by the WAL writer (its page is full)."""
    with psycopg.connect(dsn, autocommit=True) as c:

        def insert() -> LSN:
            return LSN.parse(c.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])

        def emit(n: int) -> None:
            c.execute("SELECT pg_logical_emit_message(false, 'pgcdc.test.fill', repeat('x', %s))", (n,))

        probe = 400  # over 255 bytes, as every fill: the same record header (long data length)
        for _ in range(tries):
            a = insert()
            emit(probe)
            b = insert()
            size = b - a  # the probe's record, aligned (if it alone was written, on one page)
            room = WAL_PAGE - b % WAL_PAGE
            payload = probe + room - size
            if b // WAL_PAGE != a // WAL_PAGE or payload < 300 or size > probe + 200:
                emit(room + 100)  # on into the next page, and measure again
                continue
            emit(payload)
            end = insert()
            if end % WAL_PAGE == 24:
                return end
    raise AssertionError(f"could not end the WAL at a page boundary in {tries} tries")


def end_wal_at_a_segment_boundary(dsn: str, *, tries: int = 10) -> LSN:
    """``pg_switch_wal()`` (as ``archive_timeout`` does on an idle server): the switch
    record fills its segment, so the WAL ends at the next segment's start and
    ``pg_current_wal_insert_lsn()`` names the position after that page's 40-byte long
    header. Returns it. A logical message first, so there is something to switch from."""
    with psycopg.connect(dsn, autocommit=True) as c:
        segment = WalSizes.parse(None, c.execute("SHOW wal_segment_size").fetchone()[0]).segment
        for _ in range(tries):
            c.execute("SELECT pg_logical_emit_message(false, 'pgcdc.test.fill', 'x')")
            c.execute("SELECT pg_switch_wal()")
            end = LSN.parse(c.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])
            if end % segment == 40:
                return end
    raise AssertionError(f"could not end the WAL at a segment boundary in {tries} tries")


WAL_BOUNDARIES = {"page": end_wal_at_a_page_boundary, "segment": end_wal_at_a_segment_boundary}
"""How to leave the WAL's insert position just after a page header, by kind of page."""


# --------------------------------------------------------------------------- decoding


@dataclass(frozen=True, slots=True)
class Decoded:
    """One XLogData payload as received, the decoder's stream state before it, and
    what it decoded to."""

    data: bytes
    in_stream: bool
    message: po.Message


class RecordingDecoder:
    """Wraps a :class:`PgoutputDecoder`, keeping every payload and its decoding."""

    def __init__(self, inner: po.PgoutputDecoder) -> None:
        self.inner = inner
        self.records: list[Decoded] = []

    def decode(self, data: bytes) -> po.Message:
        before = self.inner.in_stream
        msg = self.inner.decode(data)
        self.records.append(Decoded(bytes(data), before, msg))
        return msg

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


@dataclass
class Capture:
    """The decoded messages of one read, with the negotiated options."""

    messages: list[po.Message]
    records: list[Decoded]
    options: PgoutputOptions
    data_starts: list[LSN] = field(default_factory=list)
    """The ``data_start`` of each message's XLogData frame (for a change: its WAL LSN)."""

    @property
    def proto_version(self) -> int:
        return self.options.proto_version  # type: ignore[return-value]

    def of(self, cls: type) -> list:
        return [m for m in self.messages if type(m) is cls]

    def one(self, cls: type):
        found = self.of(cls)
        assert len(found) == 1, f"expected one {cls.__name__}, got {len(found)}: {self.kinds()}"
        return found[0]

    def kinds(self) -> list[str]:
        return [m.type for m in self.messages]

    def transactions(self) -> list[list[po.Message]]:
        """The messages split into Begin ... Commit groups (non-streamed, non-2PC)."""
        out: list[list[po.Message]] = []
        cur: list[po.Message] | None = None
        for m in self.messages:
            if type(m) is po.Begin:
                assert cur is None, f"Begin inside a transaction: {self.kinds()}"
                cur = [m]
            elif cur is not None:
                cur.append(m)
                if type(m) is po.Commit:
                    out.append(cur)
                    cur = None
        assert cur is None, f"unterminated transaction: {self.kinds()}"
        return out

    def check_round_trip(self) -> None:
        """Every message: JSON-ready ``to_dict()``, and re-encoding gives the server's bytes."""
        for rec in self.records:
            d = rec.message.to_dict()
            json.dumps(d)  # raises TypeError if anything is not JSON-serialisable
            assert d["type"] == rec.message.type
            again = rec.message.encode(
                self.proto_version,
                parallel_streaming=self.options.parallel_streaming,
                in_stream=rec.in_stream,
            )
            assert again == rec.data, (
                f"{rec.message!r} re-encodes to {again.hex()} but the server sent {rec.data.hex()}"
            )


def xid32(xid8: int | str) -> int:
    """The 32-bit xid that the wire carries, from an ``xid8`` (epoch << 32 | xid)."""
    return int(xid8) & 0xFFFFFFFF


# --------------------------------------------------------------------------- bench


@dataclass
class WalRecord:
    start_lsn: LSN
    end_lsn: LSN
    xid: int
    resource_manager: str
    record_type: str
    description: str


@dataclass
class Bench:
    """One database (``dsn``), one publication, one pgoutput slot.

    ``sql``: an autocommit psycopg connection to the same database (superuser
    ``pgcdc``); open others with :meth:`connect` for concurrent sessions.
    """

    dsn: str
    slot: str
    publication: str = "pub_all"
    sql: psycopg.Connection = field(init=False)
    consistent_point: LSN | None = None
    server_version: int = 0
    _conns: list[psycopg.Connection] = field(default_factory=list)
    _flusher: psycopg.Connection | None = None

    def __post_init__(self) -> None:
        self.sql = self.connect()
        self.server_version = self.sql.info.server_version

    def connect(self) -> psycopg.Connection:
        conn = psycopg.connect(self.dsn, autocommit=True)
        self._conns.append(conn)
        return conn

    def close(self) -> None:
        for conn in self._conns:
            conn.close()

    @property
    def major(self) -> int:
        return self.server_version // 10000

    # -- SQL helpers ----------------------------------------------------------------
    def run(self, query: str, params=None) -> list[tuple]:
        cur = self.sql.execute(query, params)
        return cur.fetchall() if cur.description is not None else []

    def value(self, query: str, params=None):
        rows = self.run(query, params)
        assert len(rows) == 1 and len(rows[0]) == 1, rows
        return rows[0][0]

    def insert_lsn(self) -> LSN:
        return LSN.parse(self.value("SELECT pg_current_wal_insert_lsn()::text"))

    def flush_wal(self) -> None:
        """Make the server flush the WAL written so far, from another session: a
        walsender decodes only flushed WAL, and the changes of a transaction still in
        progress (or a just-aborted one) may otherwise sit unflushed for seconds, until
        the background writer logs its next snapshot. A committed transaction with an
        xid but no changes is flushed at commit, and pgoutput skips it (PostgreSQL 15+
        sends nothing for empty transactions)."""
        if self._flusher is None:
            self._flusher = self.connect()
        self._flusher.execute("SELECT pg_current_xact_id()")

    def target(self) -> LSN:
        """The WAL insert position now, flushed: what a read should reach."""
        lsn = self.insert_lsn()
        self.flush_wal()
        return lsn

    def relid(self, name: str) -> int:
        return int(self.value("SELECT %s::regclass::oid::bigint", (name,)))

    def typid(self, name: str) -> int:
        return int(self.value("SELECT %s::regtype::oid::bigint", (name,)))

    def attributes(self, table: str) -> list[tuple[str, int, int]]:
        """``(name, type oid, typmod)`` of the live columns, in attnum order."""
        return [
            (name, int(typid), int(typmod))
            for name, typid, typmod in self.run(
                "SELECT attname, atttypid::bigint, atttypmod FROM pg_attribute "
                "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped "
                "ORDER BY attnum",
                (table,),
            )
        ]

    def text_row(self, table: str, where: str) -> tuple:
        """One row of ``table``, every column exactly as its type's output function
        writes it (the raw text-format result, not a ``::text`` cast, which would for
        instance strip ``char(n)`` padding). ``table`` and ``where`` are SQL text."""
        cols = ", ".join(
            pgsql.Identifier(n).as_string(self.sql) for n, _, _ in self.attributes(table)
        )
        return self.raw_row(f"SELECT {cols} FROM {table} WHERE {where}")

    def raw_row(self, query: str) -> tuple:
        """The one row of ``query`` (no parameters) in text format, undecoded by psycopg:
        ``str`` (UTF-8) or ``None`` for NULL."""
        res = self.sql.pgconn.exec_(query.encode())
        if res.status != psycopg.pq.ExecStatus.TUPLES_OK:
            raise AssertionError(res.error_message.decode())
        assert res.ntuples == 1, (query, res.ntuples)
        values = (res.get_value(0, i) for i in range(res.nfields))  # None for NULL
        return tuple(None if v is None else bytes(v).decode() for v in values)

    def commit_timestamp(self, xid: int) -> datetime:
        return self.value("SELECT pg_xact_commit_timestamp(%s::text::xid)", (str(xid),))

    def wal_records(self, start: LSN, end: LSN | None = None) -> list[WalRecord]:
        """The WAL records in ``[start, end)`` (``end``: the flush position) through
        ``pg_walinspect``. A committed no-op transaction first makes sure everything
        written so far is flushed."""
        self.run("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        self.flush_wal()
        if end is None:
            end = LSN.parse(self.value("SELECT pg_current_wal_flush_lsn()::text"))
        rows = self.run(
            "SELECT start_lsn::text, end_lsn::text, xid::text::bigint, resource_manager, "
            "record_type, coalesce(description, '') "
            "FROM pg_get_wal_records_info(%s::text::pg_lsn, %s::text::pg_lsn)",
            (str(start), str(end)),
        )
        return [
            WalRecord(LSN.parse(a), LSN.parse(b), int(x), rm, rt, desc)
            for a, b, x, rm, rt, desc in rows
        ]

    @staticmethod
    def wal_record(records: list[WalRecord], record_type: str, xid: int | None = None) -> WalRecord:
        """The one record of ``record_type`` (and ``xid``, when given) in ``records``."""
        found = [
            r for r in records if r.record_type == record_type and (xid is None or r.xid == xid)
        ]
        assert len(found) == 1, (record_type, xid, [(r.record_type, r.xid) for r in records])
        return found[0]

    # -- publication and slot -------------------------------------------------------------
    def setup(self, *, two_phase: bool = False, publication_sql: str | None = None) -> LSN:
        """Create the publication (``FOR ALL TABLES`` unless given) and the slot."""
        self.run(publication_sql or f"CREATE PUBLICATION {self.publication} FOR ALL TABLES")
        with ReplicationConnection.connect(self.dsn) as conn:
            created = conn.create_slot(
                self.slot,
                output_plugin="pgoutput",
                snapshot="nothing",
                two_phase=True if two_phase else None,
            )
        assert created.slot_name == self.slot
        self.consistent_point = LSN(created.consistent_point)
        return self.consistent_point

    def read(self, until: LSN | None = None, **options) -> Capture:
        """Decode the slot from its confirmed position until the stream has passed
        ``until`` (default: :meth:`target`). Confirms nothing.
        ``options``: as :meth:`stream`."""
        with self.stream(**options) as live:
            live.until(until)
        return live.capture()

    @contextmanager
    def stream(
        self,
        *,
        proto_version: int | None = None,
        binary: bool = False,
        messages: bool = False,
        streaming: str = "off",
        two_phase: bool = False,
        origin: str | None = None,
        publications: tuple[str, ...] | None = None,
        small_work_mem: bool = False,
        timeout: float = READ_TIMEOUT,
    ) -> Iterator[LiveRead]:
        """A started pgoutput stream on a new replication connection, read step by step
        with :meth:`LiveRead.until` while the test keeps writing (so that the walsender
        decodes transactions while they are still in progress)."""
        opts = PgoutputOptions(
            publications=publications or (self.publication,),
            proto_version=proto_version,
            binary=binary,
            messages=messages,
            streaming=streaming,
            two_phase=two_phase,
            origin=origin,
        )
        params = {"options": SMALL_WORK_MEM} if small_work_mem else {}
        with ReplicationConnection.connect(self.dsn, **params) as conn:
            stream = LogicalStream.pgoutput(conn, self.slot, opts)
            yield LiveRead(self, stream, timeout)


class LiveRead:
    """One started stream; :meth:`until` reads on, :meth:`capture` checks and returns
    everything read so far."""

    def __init__(self, bench: Bench, stream: LogicalStream, timeout: float) -> None:
        self.bench = bench
        self.stream = stream
        self.timeout = timeout
        self.recorder = RecordingDecoder(stream.decoder)
        stream.decoder = self.recorder
        self.messages: list[po.Message] = []
        self.data_starts: list[LSN] = []
        read = stream.read

        def read_recording_frames(timeout=None):
            item = read(timeout)
            if item is not None and item[1] is not None:
                self.data_starts.append(item[0].data_start)
            return item

        stream.read = read_recording_frames  # read_until reads through it

    def until(self, lsn: LSN | None = None) -> list[po.Message]:
        """Read until the walsender has passed ``lsn`` (default: :meth:`Bench.target`,
        the WAL insert position now, flushed); return the messages read in this step."""
        target = self.bench.target() if lsn is None else lsn
        msgs = self.stream.read_until(target, timeout=self.timeout)
        self.messages += msgs
        return msgs

    def capture(self) -> Capture:
        cap = Capture(self.messages, self.recorder.records, self.stream.options, self.data_starts)
        assert [r.message for r in self.recorder.records] == self.messages
        assert len(self.data_starts) == len(self.messages)
        cap.check_round_trip()
        return cap


@contextmanager
def bench(dsn: str, slot: str) -> Iterator[Bench]:
    """A :class:`Bench` whose connections close afterwards (call ``setup`` yourself)."""
    b = Bench(dsn, slot)
    try:
        yield b
    finally:
        b.close()
