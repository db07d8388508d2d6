"""Transaction assembly (plain, streamed, subtransaction aborts, two-phase held across
processes, origins, messages), change rows and the window manifest, without servers."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from airflow_pgcdc.changes.assembly import AssemblyError, TransactionAssembler, event_position
from airflow_pgcdc.changes.rows import ChangeBuffer, ColumnNameClash, RelationVersion, ts_us
from airflow_pgcdc.protocol import pgoutput as po
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.pgtypes import PgColumn, builtin_type
from airflow_pgcdc.store.window import WindowManifest, WindowManifestError

TS = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
V = 4


class Recorder:
    def __init__(self):
        self.events = []
        self.held = []
        self.resolved = []

    def begin(self, txn):
        self.events.append(("begin", txn.xid, int(txn.commit_lsn), txn.kind))

    def change(self, rel, msg, nbytes):
        self.events.append((msg.type, rel.relation_name, msg.new if msg.type != "delete" else msg.key))

    def truncate(self, rels, msg):
        self.events.append(("truncate", tuple(r.relation_name for r in rels)))

    def message(self, msg):
        self.events.append(("message", msg.prefix))

    def commit(self, txn):
        self.events.append(("commit", txn.xid, txn.origin))

    def nontx_message(self, msg):
        self.events.append(("nontx", msg.prefix))

    def type_message(self, msg):
        self.events.append(("type", msg.type_name))

    def prepared(self, held):
        self.held.append(held)

    def prepared_resolved(self, gid, xid, outcome, lsn):
        self.resolved.append((gid, outcome))


class Feeder:
    """Encodes messages as a walsender would and feeds the decoded form + raw bytes."""

    def __init__(self, asm):
        self.asm = asm
        self.decoder = po.PgoutputDecoder(V)

    def __call__(self, *msgs):
        for m in msgs:
            raw = m.encode(V, in_stream=self.decoder.in_stream)
            self.asm.feed(self.decoder.decode(raw), raw)


def rel(oid=100, name="t", xid=None, cols=("id", "v")):
    return po.Relation(xid, oid, "public", name, "d", tuple(
        po.RelationColumn(1 if i == 0 else 0, c, 23 if i == 0 else 25, -1) for i, c in enumerate(cols)
    ))


def ins(v, xid=None, oid=100):
    return po.Insert(xid, oid, (str(v), f"v{v}"))


def make(tmp_path, **kw):
    rec = Recorder()
    asm = TransactionAssembler(rec, proto_version=V, spool_dir=str(tmp_path), **kw)
    return rec, asm, Feeder(asm)


def test_plain_transaction_passes_through(tmp_path):
    rec, asm, feed = make(tmp_path)
    feed(po.Begin(LSN(0x100), TS, 7), rel(), ins(1), po.Delete(None, 100, ("1", None), None),
         po.Commit(0, LSN(0x100), LSN(0x130), TS))
    assert rec.events == [
        ("begin", 7, 0x100, "plain"), ("insert", "t", ("1", "v1")), ("delete", "t", ("1", None)),
        ("commit", 7, None),
    ]
    assert not asm.in_transaction


def test_streamed_transaction_subxact_abort_and_commit_order(tmp_path):
    rec, asm, feed = make(tmp_path)
    feed(po.StreamStart(50, True), rel(xid=50), ins(1, xid=50), ins(2, xid=51), ins(3, xid=52),
         po.StreamStop())
    # a plain transaction commits in between: it comes first
    feed(po.Begin(LSN(0x200), TS, 60), ins(9), po.Commit(0, LSN(0x200), LSN(0x210), TS))
    feed(po.StreamStart(50, False), ins(4, xid=51), po.StreamStop())
    feed(po.StreamAbort(50, 51))  # subtransaction 51 rolled back: only its changes go
    assert asm.open_streams == 1
    feed(po.StreamCommit(50, 0, LSN(0x300), LSN(0x310), TS))
    assert rec.events == [
        ("begin", 60, 0x200, "plain"), ("insert", "t", ("9", "v9")), ("commit", 60, None),
        ("begin", 50, 0x300, "streamed"), ("insert", "t", ("1", "v1")), ("insert", "t", ("3", "v3")),
        ("commit", 50, None),
    ]
    assert asm.open_streams == 0 and list(tmp_path.iterdir()) == [], "spool files removed"


def test_streamed_transaction_abort_drops_everything(tmp_path):
    rec, asm, feed = make(tmp_path)
    feed(po.StreamStart(50, True), rel(xid=50), ins(1, xid=50), po.StreamStop(), po.StreamAbort(50, 50))
    assert rec.events == [] and asm.streamed_aborted == 1 and list(tmp_path.iterdir()) == []


def test_relation_sent_inside_stream_is_spooled_for_later_plain_use(tmp_path):
    """The walsender sends a Relation once per session: a spool must carry its own copy,
    and a plain transaction later uses the live cache."""
    rec, asm, feed = make(tmp_path)
    feed(po.StreamStart(50, True), rel(xid=50), ins(1, xid=50), po.StreamStop())
    feed(po.Begin(LSN(0x200), TS, 60), ins(2), po.Commit(0, LSN(0x200), LSN(0x210), TS))
    feed(po.StreamCommit(50, 0, LSN(0x300), LSN(0x310), TS))
    kinds = [e[0] for e in rec.events]
    assert kinds == ["begin", "insert", "commit", "begin", "insert", "commit"]


def test_schema_change_inside_stream_binds_each_change_to_its_definition(tmp_path):
    rec, asm, feed = make(tmp_path)
    seen = []
    rec.change = lambda r, m, n: seen.append(([c.name for c in r.columns], m.new))
    feed(po.StreamStart(50, True), rel(xid=50), ins(1, xid=50),
         rel(xid=50, cols=("id", "v", "w")), po.Insert(50, 100, ("2", "x", "y")), po.StreamStop(),
         po.StreamCommit(50, 0, LSN(0x300), LSN(0x310), TS))
    assert seen == [(["id", "v"], ("1", "v1")), (["id", "v", "w"], ("2", "x", "y"))]


def test_two_phase_held_until_commit_prepared_even_across_processes(tmp_path):
    rec, asm, feed = make(tmp_path)
    feed(po.BeginPrepare(LSN(0x100), LSN(0x120), TS, 70, "g1"), rel(), ins(1),
         po.Prepare(0, LSN(0x100), LSN(0x120), TS, 70, "g1"))
    feed(po.BeginPrepare(LSN(0x130), LSN(0x140), TS, 71, "g2"), ins(2),
         po.Prepare(0, LSN(0x130), LSN(0x140), TS, 71, "g2"))
    assert rec.events == [] and [h.gid for h in rec.held] == ["g1", "g2"]
    feed(po.RollbackPrepared(0, LSN(0x140), LSN(0x160), TS, TS, 71, "g2"))
    assert rec.resolved == [("g2", "rollback")]
    # the window ends: g1 is persisted (as the window writer does) and this process ends
    held = asm.held["g1"]
    stored = tmp_path / "stored.spool"
    with open(stored, "wb") as f:
        held.spool.write_filtered(f)
    asm.close()
    held.spool.discard()
    held.spool = None
    # a new process: only COMMIT PREPARED arrives; the data comes from the store
    rec2, asm2, feed2 = make(tmp_path, held={"g1": held}, fetch_prepared=lambda h: str(stored))
    feed2(po.CommitPrepared(0, LSN(0x500), LSN(0x520), TS, 70, "g1"))
    assert rec2.events == [("begin", 70, 0x500, "prepared"), ("insert", "t", ("1", "v1")), ("commit", 70, None)]
    assert rec2.resolved == [("g1", "commit")]
    with pytest.raises(AssemblyError, match="neither in this stream nor held"):
        feed2(po.CommitPrepared(0, LSN(0x600), LSN(0x620), TS, 99, "unknown"))


def test_stream_prepare_then_commit_prepared(tmp_path):
    rec, asm, feed = make(tmp_path)
    feed(po.StreamStart(80, True), rel(xid=80), ins(1, xid=80), po.StreamStop(),
         po.StreamPrepare(0, LSN(0x100), LSN(0x120), TS, 80, "sp"))
    assert rec.events == [] and asm.held["sp"].spool is not None
    feed(po.Begin(LSN(0x150), TS, 81), ins(5), po.Commit(0, LSN(0x150), LSN(0x160), TS))
    feed(po.CommitPrepared(0, LSN(0x200), LSN(0x220), TS, 80, "sp"))
    assert [e[:2] for e in rec.events if e[0] == "begin"] == [("begin", 81), ("begin", 80)]


def test_origin_recorded_and_skipped(tmp_path):
    rec, asm, feed = make(tmp_path, skip_origins={"loop"})
    feed(po.Begin(LSN(0x100), TS, 7), rel(), po.Origin(LSN(0x9), "loop"), ins(1),
         po.Commit(0, LSN(0x100), LSN(0x110), TS))
    feed(po.Begin(LSN(0x200), TS, 8), po.Origin(LSN(0x9), "other"), ins(2),
         po.Commit(0, LSN(0x200), LSN(0x210), TS))
    assert rec.events == [("begin", 8, 0x200, "plain"), ("insert", "t", ("2", "v2")), ("commit", 8, "other")]
    assert asm.skipped_transactions == 1


def test_messages_transactional_in_order_and_prefix_filter(tmp_path):
    rec, asm, feed = make(tmp_path, message_prefixes=("app",))
    feed(po.LogicalMessage(None, 0, LSN(0x50), "app.hello", b"x"),
         po.LogicalMessage(None, 0, LSN(0x51), "other", b"x"),
         po.Begin(LSN(0x100), TS, 7), rel(), ins(1),
         po.LogicalMessage(None, 1, LSN(0x90), "app.tx", b"y"), ins(2),
         po.Commit(0, LSN(0x100), LSN(0x110), TS))
    assert [e[0] for e in rec.events] == ["nontx", "begin", "insert", "message", "insert", "commit"]
    assert event_position(po.LogicalMessage(None, 0, LSN(0x50), "a", b"")) == 0x50
    assert event_position(po.LogicalMessage(None, 1, LSN(0x50), "a", b"")) is None


def test_truncate_bound_to_relations(tmp_path):
    rec, asm, feed = make(tmp_path)
    feed(po.Begin(LSN(0x100), TS, 7), rel(), rel(101, "u"), po.Truncate(None, 1, (100, 101)),
         po.Commit(0, LSN(0x100), LSN(0x110), TS))
    assert ("truncate", ("t", "u")) in rec.events


def test_change_without_relation_is_a_typed_error(tmp_path):
    rec, asm, feed = make(tmp_path)
    with pytest.raises(AssemblyError, match="before its Relation"):
        feed(po.Begin(LSN(0x100), TS, 7), ins(1, oid=555))


# --------------------------------------------------------------------------- rows


def version(ri="d", keys=(True, False, False)):
    cols = (PgColumn("id", builtin_type(23)), PgColumn("v", builtin_type(25)), PgColumn("n", builtin_type(1700)))
    return RelationVersion(1, "public", "t", ri, cols, keys)


def test_change_rows_ops_old_key_and_unchanged_toast():
    rv = version()
    assert rv.schema_arrow.names == [
        "id", "v", "n", "_pgcdc_old_id", "_pgcdc_op", "_pgcdc_commit_lsn", "_pgcdc_seq",
        "_pgcdc_xid", "_pgcdc_commit_ts", "_pgcdc_unchanged_toast",
    ]
    buf = ChangeBuffer(rv)
    t = ts_us(TS)
    buf.add("I", ("1", "a", "1.5"), None, 0x100, 0, 7, t)
    buf.add("U", ("2", po.UNCHANGED_TOAST, None), ("1", None, None), 0x200, 1, 8, t)  # key change
    buf.add("U", ("2", "b", po.UNCHANGED_TOAST), None, 0x200, 2, 8, t)
    buf.add("D", ("2", None, None), None, 0x300, 3, 9, t)
    batch = rv.to_batch(buf.take())
    assert len(buf) == 0 and buf.rows == 4
    d = batch.to_pydict()
    assert d["_pgcdc_op"] == ["I", "U", "U", "D"]
    assert d["id"] == [1, 2, 2, 2] and d["_pgcdc_old_id"] == [None, 1, None, None]
    assert d["v"] == ["a", None, "b", None]
    assert d["_pgcdc_unchanged_toast"] == [[], ["v"], ["n"], []]
    assert d["_pgcdc_commit_lsn"] == [0x100, 0x200, 0x200, 0x300] and d["_pgcdc_xid"] == [7, 8, 8, 9]
    assert d["_pgcdc_commit_ts"][0] == TS
    assert batch.schema.field("id").metadata[b"pg_type"] == b"int4"


def test_replica_identity_full_fills_unchanged_toast_from_old_row():
    rv = version("f", (True, True, True))
    assert rv.old_columns == ["id", "v", "n"]
    buf = ChangeBuffer(rv)
    buf.add("U", ("1", po.UNCHANGED_TOAST, "2"), ("1", "big", "1"), 1, 0, 7, None)
    d = rv.to_batch(buf.take()).to_pydict()
    assert d["v"] == ["big"] and d["_pgcdc_unchanged_toast"] == [[]]
    assert d["_pgcdc_old_n"] == [pa.scalar(1).as_py()] or str(d["_pgcdc_old_n"][0]) == "1"


def test_reserved_column_names_are_refused():
    with pytest.raises(ColumnNameClash):
        RelationVersion(1, "s", "t", "d", (PgColumn("_pgcdc_op", builtin_type(25)),), (False,))


# --------------------------------------------------------------------------- manifest


def test_window_manifest_round_trip_and_validation():
    m = WindowManifest(slot="s", window_seq=3, start_lsn="0/100", end_lsn=LSN(0x200), end_reason="until_lsn",
                       transactions=1, rows=2, tables=({"schema": "public", "table": "t", "rows": 2, "bytes": 10,
                                                       "relation_versions": []},),
                       extra={"future": 1})
    again = WindowManifest.from_json(m.to_json())
    assert again == m and again.extra == {"future": 1} and again.end_lsn == "0/200"
    assert again.table_rows == {"public.t": 2}
    with pytest.raises(WindowManifestError, match="format"):
        WindowManifest.from_json('{"format": 3, "kind": "window"}')
    with pytest.raises(WindowManifestError, match="before start_lsn"):
        WindowManifest(slot="s", window_seq=0, start_lsn="0/200", end_lsn="0/100", end_reason="x")
    bad = m.to_dict() | {"rows": 5}
    with pytest.raises(WindowManifestError, match="sum over the tables"):
        WindowManifest.from_json(bad)


def test_spool_records_cut_across_read_chunks(tmp_path, monkeypatch):
    """Records are read back in chunks: records larger than a chunk, headers split across
    chunks, aborted subtransactions dropped, a truncated file refused."""
    from airflow_pgcdc.changes import spool as spools

    monkeypatch.setattr(spools, "SPOOL_READ_CHUNK", 7)
    spool = spools.Spool(str(tmp_path), 42, 2)
    written = []
    for i in range(50):
        raw = bytes([i % 251]) * (i * 3 % 40)
        sub = 43 if i % 5 == 0 else 0
        spool.append(raw, in_stream=bool(i % 2), subxid=sub, relation=i % 7 == 0)
        written.append((i, raw, sub, i % 7 == 0))
    spool.abort_subxact(43)
    expected = [raw for _i, raw, sub, rel in written if rel or sub != 43]
    assert [raw for _f, _s, raw in spool.records()] == expected
    assert [raw for _f, _s, raw in spool.records()] == expected  # again: the position is kept
    spool.close()
    with open(spool.path, "r+b") as f:
        f.truncate(f.seek(0, 2) - 3)
    again = spools.Spool(str(tmp_path), 42, 2, path=spool.path)
    with pytest.raises(AssemblyError, match="truncated"):
        list(again.records())


class RawStreamFeeder(Feeder):
    """As the drain feeds: changes inside a stream block are spooled undecoded."""

    def __call__(self, *msgs):
        for m in msgs:
            raw = m.encode(V, in_stream=self.decoder.in_stream)
            if raw[:1] in (b"I", b"U", b"D") and self.asm.spool_streamed_change(raw):
                continue
            self.asm.feed(self.decoder.decode(raw), raw)


def test_undecoded_streamed_changes_replay_like_decoded_ones(tmp_path):
    """spool_streamed_change (the drain's path for changes in a stream block) leads to the
    same events as feeding the decoded messages: subtransaction aborts, relations spooled
    once per spool, a schema change inside the stream, plain changes in between."""

    def scenario(feed):
        feed(po.StreamStart(50, True), rel(xid=50), ins(1, xid=50), ins(2, xid=51), ins(3, xid=52),
             po.Update(52, 100, None, None, ("3", "u3")), po.StreamStop())
        feed(po.Begin(LSN(0x200), TS, 60), ins(9), po.Commit(0, LSN(0x200), LSN(0x210), TS))
        feed(po.StreamStart(50, False), ins(4, xid=51), rel(xid=50, cols=("id", "v", "w")),
             po.Insert(50, 100, ("5", "x", "y")), po.Delete(50, 100, ("1", None, None), None), po.StreamStop())
        feed(po.StreamAbort(50, 51))
        feed(po.StreamCommit(50, 0, LSN(0x300), LSN(0x310), TS))

    runs = []
    for feeder in (Feeder, RawStreamFeeder):
        d = tmp_path / feeder.__name__
        d.mkdir()
        rec = Recorder()
        asm = TransactionAssembler(rec, proto_version=V, spool_dir=str(d))
        scenario(feeder(asm))
        assert asm.open_streams == 0 and list(d.iterdir()) == []
        runs.append(rec.events)
    assert runs[0] == runs[1]
    assert ("insert", "t", ("2", "v2")) not in runs[1] and ("insert", "t", ("5", "x", "y")) in runs[1]
    # outside a stream block nothing is done
    (tmp_path / "x").mkdir()
    _rec, asm, _feed = make(tmp_path / "x")
    assert not asm.in_stream_block and not asm.spool_streamed_change(ins(1, xid=50).encode(V, in_stream=True))


class RawRecorder(Recorder):
    """A sink that takes inserts as received, as the drain's window does."""

    _dec = po.PgoutputDecoder(1)

    def insert_raw(self, rel, message, nbytes):
        self.events.append(("insert", rel.relation_name, self._dec.decode(message).new))


class RawUpdateRecorder(RawRecorder):
    """... and updates that carry only their new row, as the drain's window does."""

    def update_raw(self, rel, message, nbytes):
        m = self._dec.decode(message)
        assert m.key is None and m.old is None  # only those are handed over undecoded
        self.raw_updates = getattr(self, "raw_updates", 0) + 1
        self.events.append(("update", rel.relation_name, m.new))


class TakeRawFeeder(Feeder):
    """As the drain feeds: every message is offered to take_raw before being decoded."""

    def __call__(self, *msgs):
        for m in msgs:
            raw = m.encode(V, in_stream=self.decoder.in_stream)
            if not self.asm.take_raw(raw):
                self.asm.feed(self.decoder.decode(raw), raw)


def test_inserts_taken_as_received_give_the_same_events(tmp_path):
    """take_raw (plain inserts to sink.insert_raw, stream-block changes spooled undecoded,
    replays handing inserts over undecoded) leads to the events of decoded feeding:
    plain, streamed with a subtransaction abort, prepared, skipped origins."""

    def scenario(feed):
        feed(po.Begin(LSN(0x100), TS, 7), rel(), ins(1), po.Update(None, 100, None, None, ("1", "u")),
             ins(2), po.Update(None, 100, ("2", None), None, ("3", "k")),
             po.Delete(None, 100, ("1", None), None), po.Commit(0, LSN(0x100), LSN(0x130), TS))
        feed(po.StreamStart(50, True), rel(xid=50), ins(3, xid=50), ins(4, xid=51), po.StreamStop())
        feed(po.StreamStart(50, False), rel(xid=50, cols=("id", "v", "w")), po.Insert(50, 100, ("5", "x", "y")),
             po.StreamStop(), po.StreamAbort(50, 51))
        feed(po.StreamCommit(50, 0, LSN(0x300), LSN(0x310), TS))
        feed(po.Begin(LSN(0x400), TS, 8), po.Origin(LSN(0x10), "elsewhere"), ins(6), po.Commit(0, LSN(0x400), LSN(0x410), TS))
        feed(po.BeginPrepare(LSN(0x500), LSN(0x520), TS, 70, "g1"), ins(7), po.Prepare(0, LSN(0x500), LSN(0x520), TS, 70, "g1"))
        feed(po.CommitPrepared(0, LSN(0x600), LSN(0x610), TS, 70, "g1"))

    runs = []
    for recorder, feeder in ((Recorder, Feeder), (RawRecorder, TakeRawFeeder), (RawUpdateRecorder, TakeRawFeeder)):
        d = tmp_path / recorder.__name__
        d.mkdir()
        rec = recorder()
        asm = TransactionAssembler(rec, proto_version=V, spool_dir=str(d), skip_origins={"elsewhere"})
        scenario(feeder(asm))
        runs.append((rec.events, asm.skipped_transactions, asm.streamed_committed))
    assert rec.raw_updates == 1  # the new-row-only update; the keyed one was decoded
    assert runs[0] == runs[1] == runs[2]
    events = runs[1][0]
    assert ("insert", "t", ("3", "v3")) in events and ("insert", "t", ("4", "v4")) not in events
    assert ("insert", "t", ("7", "v7")) in events and ("insert", "t", ("6", "v6")) not in events
