"""Transaction assembly: a pgoutput message stream → whole committed transactions, in
commit order, with every change bound to the relation definition it was written under.

What arrives, and what the assembler does with it:

* ``Begin … Commit`` (a transaction decoded at its commit, smaller than
  ``logical_decoding_work_mem``): passed straight to the sink, change by change. The
  commit LSN and time are already known from Begin, so nothing is buffered.
* ``Stream Start/Stop`` blocks, then ``Stream Commit`` or ``Stream Abort`` (a large
  transaction sent while in progress, ``streaming on|parallel``): every message of a
  block is appended to a :class:`Spool`, one local file per top-level xid (bounded
  memory whatever the size). Changes inside stream blocks carry the *subtransaction's*
  xid: a Stream Abort whose subxid differs from the xid drops only that
  subtransaction's changes (recorded, filtered on replay); one whose subxid equals the
  xid drops the spool. Stream Commit replays the spool to the sink, in commit order
  with the plain transactions around it.
* ``Begin Prepare … Prepare`` and ``Stream Prepare`` (two-phase): the transaction is
  spooled and *held* by gid until ``Commit Prepared`` (replayed then, at the commit's
  LSN and time) or ``Rollback Prepared`` (discarded). A transaction still held when a
  window ends is persisted by the window writer (its spool file goes to the store), so
  a window boundary or a restart loses nothing: after the prepare has been
  acknowledged, PostgreSQL sends only the Commit Prepared. ``fetch_prepared(gid, xid)``
  gives the assembler the local path of such a stored spool.
* ``Relation`` updates the live relation cache (oid → the message, with its raw
  bytes). A spool records a Relation before the first change of each relation (and
  again when the definition changed), so every spool replays on its own, in this
  process or, for a prepared transaction, in a later one.
* ``Type`` messages are passed to the sink (they name user types); ``Origin`` is kept
  per transaction, and transactions from ``skip_origins`` are dropped whole (loop
  prevention). ``Message`` (logical decoding messages): transactional ones in their
  transaction's order, non-transactional ones at once; ``message_prefixes`` keeps only
  the given prefixes (``None``: all).

Spool file format (also the stored form of a held prepared transaction): the 8 bytes
``PGCDCSP1``, one byte pgoutput protocol version, then records ``!BII`` (flags, subxid,
length) + the pgoutput message exactly as the server sent it. Flag bit 0: the message
was inside a stream block (it carries an xid); bit 1: a Relation record (never dropped
by a subtransaction abort).

The sink (see :class:`Sink`) gets ``begin(txn)``, ``change(relation, msg, nbytes)``
(``nbytes``: the size of the message on the wire, a cheap measure of the row's size),
``truncate(relations, msg)``, ``message(msg)``, ``commit(txn)``, ``nontx_message(msg)``,
``type_message(msg)``, ``prepared(held)``, ``prepared_resolved(gid, xid, outcome, lsn)``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from airflow_pgcdc.changes.spool import AssemblyError, Spool
from airflow_pgcdc.protocol import pgoutput as po
from airflow_pgcdc.protocol.lsn import LSN

__all__ = [
    "AssemblyError",
    "HeldPrepared",
    "Sink",
    "Spool",
    "TransactionAssembler",
    "TxnInfo",
    "event_position",
]

_XID_OID = struct.Struct("!II").unpack_from  # a change message in a stream block: xid, relation OID
_OID = struct.Struct("!I").unpack_from
_CHANGE_TAGS = b"IUD"


@dataclass(slots=True)
class TxnInfo:
    """A committed transaction as the sink sees it."""

    xid: int
    commit_lsn: LSN
    end_lsn: LSN
    commit_ts: datetime | None
    kind: str = "plain"  # plain | streamed | prepared
    gid: str | None = None
    origin: str | None = None
    origin_lsn: LSN | None = None


class Sink(Protocol):  # pragma: no cover - interface
    def begin(self, txn: TxnInfo) -> None: ...
    def change(self, relation: po.Relation, msg: Any, nbytes: int) -> None: ...
    def truncate(self, relations: list[po.Relation], msg: po.Truncate) -> None: ...
    def message(self, msg: po.LogicalMessage) -> None: ...
    def commit(self, txn: TxnInfo) -> None: ...
    def nontx_message(self, msg: po.LogicalMessage) -> None: ...
    def type_message(self, msg: po.Type) -> None: ...
    def prepared(self, held: HeldPrepared) -> None: ...
    def prepared_resolved(self, gid: str, xid: int, outcome: str, lsn: LSN) -> None: ...


def event_position(msg: Any) -> LSN | None:
    """The LSN that places a transaction-completing event on the LSN line (the start of
    its WAL record: what a window's ``[start_lsn, end_lsn)`` is compared with), or
    ``None`` for messages that do not complete anything."""
    t = type(msg)
    if t is po.Begin:
        return msg.final_lsn
    if t is po.StreamCommit or t is po.CommitPrepared:
        return msg.commit_lsn
    if t is po.BeginPrepare or t is po.StreamPrepare or t is po.Prepare:
        return msg.prepare_lsn
    if t is po.RollbackPrepared:
        return msg.rollback_end_lsn - 1  # the record starts before its end
    if t is po.LogicalMessage and not msg.transactional:
        return msg.lsn
    return None




@dataclass
class HeldPrepared:
    """A prepared transaction waiting for COMMIT/ROLLBACK PREPARED."""

    gid: str
    xid: int
    prepare_lsn: LSN
    prepare_end_lsn: LSN
    prepare_ts: datetime | None
    spool: Spool | None = None  # local data (prepared in this run)
    origin: str | None = None
    origin_lsn: LSN | None = None
    stored: dict | None = None  # manifest entry when the data is in the store
    extra: dict = field(default_factory=dict)

    @property
    def skipped(self) -> bool:
        """Dropped by origin: nothing was kept but the gid (``extra`` when prepared in this
        run, the stored manifest entry when prepared in an earlier window)."""
        return bool(self.extra.get("skipped") or (self.stored or {}).get("skipped"))


class TransactionAssembler:
    """Feeds a :class:`Sink` with whole committed transactions (module docstring)."""

    def __init__(
        self,
        sink: Sink,
        *,
        proto_version: int,
        spool_dir: str,
        skip_origins: frozenset[str] | set[str] = frozenset(),
        message_prefixes: tuple[str, ...] | None = None,
        held: dict[str, HeldPrepared] | None = None,
        fetch_prepared: Callable[[HeldPrepared], str] | None = None,
    ) -> None:
        self.sink = sink
        self.proto_version = proto_version
        self.spool_dir = spool_dir
        self.skip_origins = frozenset(skip_origins)
        self.message_prefixes = tuple(message_prefixes) if message_prefixes is not None else None
        self.relations: dict[int, tuple[po.Relation, bytes, bool]] = {}
        self.spools: dict[int, Spool] = {}
        self.held: dict[str, HeldPrepared] = dict(held or {})
        self.fetch_prepared = fetch_prepared
        # a sink that takes inserts as received (see take_raw): insert_raw(relation, message, nbytes)
        self._insert_raw = getattr(sink, "insert_raw", None)
        # ... and updates that carry only their new row (no old key or row): update_raw(...)
        self._update_raw = getattr(sink, "update_raw", None)
        self._stream_xid: int | None = None
        self._plain: TxnInfo | None = None  # open Begin ... Commit
        self._plain_started = False
        self._plain_skip = False
        self._prep: Spool | None = None  # open Begin Prepare ... Prepare
        self.skipped_transactions = 0
        self.streamed_committed = 0
        self.streamed_aborted = 0

    # -- state

    @property
    def in_transaction(self) -> bool:
        """Inside Begin…Commit or Begin Prepare…Prepare (a stop there would split it)."""
        return self._plain is not None or self._prep is not None

    @property
    def open_streams(self) -> int:
        return len(self.spools)

    @property
    def in_stream_block(self) -> bool:
        """Between Stream Start and Stream Stop: changes go to a spool (see
        :meth:`spool_streamed_change`)."""
        return self._stream_xid is not None

    def take_raw(self, raw: bytes) -> bool:
        """The drain's hot path, before decoding: True when ``raw`` (a pgoutput message
        as received) was handled without being decoded, else False (decode it and
        :meth:`feed` it). Handled: a change (Insert, Update, Delete) inside a stream block
        (:meth:`spool_streamed_change`), an Insert of a plain transaction when the sink
        takes inserts as received (``sink.insert_raw(relation, message, nbytes)``; its
        values are decoded with the rest of their chunk), and an Update of a plain
        transaction that carries only its new row (``U``, OID, ``N``: no old key or row)
        when the sink takes those (``sink.update_raw``, the same way). Anything unusual is
        declined, so the decoder sees it and says what is wrong."""
        if self._stream_xid is not None:
            return raw[0] in _CHANGE_TAGS and self.spool_streamed_change(raw)
        tag = raw[0]
        take = self._insert_raw if tag == 73 else self._update_raw if tag == 85 else None  # 'I', 'U'
        if take is None or self._plain is None or self._prep is not None or len(raw) < 8 or raw[5] != 78:
            return False  # ... 'N'
        if self._plain_skip:
            return True
        entry = self.relations.get(_OID(raw, 1)[0])
        if entry is None:
            return False  # feed() raises the error
        if not self._plain_started:
            self._start_plain()
        take(entry[0], raw, len(raw))
        return True

    def raw_run_oid(self, raw: bytes) -> bytes | None:
        """After :meth:`take_raw` took ``raw`` (an Insert, or an Update with its new row
        only, of a plain transaction): its relation OID (4 bytes, as in the message) when
        the like messages that follow it may be handed to the sink in bulk, without this
        class seeing them (the drain's native receive path: ``sink.run_target`` /
        ``sink.took_run``), else None (a skipped transaction, a refused table, a sink
        without runs)."""
        if (self._stream_xid is not None or self._plain is None or self._prep is not None or self._plain_skip
                or self._insert_raw is None or self._update_raw is None):
            return None
        entry = self.relations.get(_OID(raw, 1)[0])
        takes = getattr(self.sink, "takes_runs_of", None)
        if entry is None or takes is None or not takes(entry[0]):
            return None
        return raw[1:5]

    def spool_streamed_change(self, raw: bytes) -> bool:
        """Spool an Insert, Update or Delete received inside a stream block without
        decoding it (it is decoded when the transaction is replayed at its Stream Commit,
        and never if it is aborted): what :meth:`feed` does with the decoded message.
        ``raw`` must be such a message; False (nothing done) outside a stream block or
        when ``raw`` is too short to hold its xid and relation OID (decode it: the
        decoder says what is wrong)."""
        if self._stream_xid is None or len(raw) < 9:
            return False
        xid, oid = _XID_OID(raw, 1)
        spool = self.spools[self._stream_xid]
        self._spool_relations(spool, (oid,))
        spool.append(raw, in_stream=True, subxid=xid or spool.xid)
        return True

    def close(self) -> None:
        """Discard every local spool (streamed transactions that did not commit)."""
        for s in self.spools.values():
            s.discard()
        self.spools.clear()
        if self._prep is not None:
            self._prep.discard()
            self._prep = None

    # -- input

    def feed(self, msg: Any, raw: bytes) -> None:
        t = type(msg)
        if (t is po.Insert or t is po.Update or t is po.Delete) and self._stream_xid is None \
                and self._prep is None and self._plain is not None:
            # the hot path: a change of a plain transaction
            if self._plain_skip:
                return
            if not self._plain_started:
                self._start_plain()
            entry = self.relations.get(msg.relation_oid)
            if entry is None:
                raise AssemblyError(
                    f"a change for relation OID {msg.relation_oid} before its Relation message"
                )
            self.sink.change(entry[0], msg, len(raw))
            return
        if self._stream_xid is not None and t is not po.StreamStop:
            self._in_stream(msg, raw, t)
            return
        if self._prep is not None:
            self._in_prepare(msg, raw, t)
            return
        if t is po.Insert or t is po.Update or t is po.Delete:
            self._plain_change(msg)
        elif t is po.Relation:
            self.relations[msg.relation_oid] = (msg, raw, False)
        elif t is po.Begin:
            if self._plain is not None:
                raise AssemblyError("Begin inside an open transaction")
            self._plain = TxnInfo(msg.xid, msg.final_lsn, msg.final_lsn, msg.commit_timestamp)
            self._plain_started = False
            self._plain_skip = False
        elif t is po.Commit:
            txn = self._need_plain("Commit")
            txn.end_lsn = msg.end_lsn
            txn.commit_lsn = msg.commit_lsn
            if self._plain_skip:
                self.skipped_transactions += 1
            else:
                self._start_plain()
                self.sink.commit(txn)
            self._plain = None
        elif t is po.Origin:
            txn = self._need_plain("Origin")
            txn.origin, txn.origin_lsn = msg.name, msg.commit_lsn
            self._plain_skip = msg.name in self.skip_origins
        elif t is po.Truncate:
            if not self._plain_skip:
                self._start_plain()
                self.sink.truncate(self._rels(msg.relation_oids), msg)
        elif t is po.LogicalMessage:
            if not self._keep_message(msg):
                return
            if msg.transactional:
                self._need_plain("transactional Message")
                if not self._plain_skip:
                    self._start_plain()
                    self.sink.message(msg)
            else:
                self.sink.nontx_message(msg)
        elif t is po.Type:
            self.sink.type_message(msg)
        elif t is po.StreamStart:
            self._stream_xid = msg.xid
            if msg.xid not in self.spools:
                self.spools[msg.xid] = Spool(self.spool_dir, msg.xid, self.proto_version)
        elif t is po.StreamStop:
            self._stream_xid = None
        elif t is po.StreamCommit:
            spool = self.spools.pop(msg.xid, None)
            if spool is None:
                raise AssemblyError(f"Stream Commit for xid {msg.xid}, which never streamed")
            txn = TxnInfo(msg.xid, msg.commit_lsn, msg.end_lsn, msg.commit_timestamp, kind="streamed")
            try:
                self._replay(spool, txn)
            finally:
                spool.discard()
            self.streamed_committed += 1
        elif t is po.StreamAbort:
            spool = self.spools.get(msg.xid)
            if spool is None:
                return  # nothing of it was streamed to us (e.g. aborted before any block)
            if msg.subxid == msg.xid:
                self.spools.pop(msg.xid).discard()
                self.streamed_aborted += 1
            else:
                spool.abort_subxact(msg.subxid)
        elif t is po.BeginPrepare:
            self._prep = Spool(self.spool_dir, msg.xid, self.proto_version)
        elif t is po.StreamPrepare:
            spool = self.spools.pop(msg.xid, None)
            if spool is None:
                raise AssemblyError(f"Stream Prepare for xid {msg.xid}, which never streamed")
            self._hold(msg, spool)
        elif t is po.CommitPrepared:
            self._commit_prepared(msg)
        elif t is po.RollbackPrepared:
            held = self.held.pop(msg.gid, None)
            if held is not None and held.spool is not None:
                held.spool.discard()
            self.sink.prepared_resolved(msg.gid, msg.xid, "rollback", msg.rollback_end_lsn)
        else:  # Prepare without Begin Prepare, or something new
            raise AssemblyError(f"unexpected {msg.label} outside a transaction")

    # -- plain transactions

    def _need_plain(self, what: str) -> TxnInfo:
        if self._plain is None:
            raise AssemblyError(f"{what} outside a transaction")
        return self._plain

    def _start_plain(self) -> None:
        if not self._plain_started:
            self._plain_started = True
            self.sink.begin(self._plain)  # type: ignore[arg-type]

    def _plain_change(self, msg: Any) -> None:
        self._need_plain(msg.label)
        if self._plain_skip:
            return
        self._start_plain()
        self.sink.change(self._rel(msg.relation_oid), msg, 0)

    def _rel(self, oid: int) -> po.Relation:
        try:
            return self.relations[oid][0]
        except KeyError:
            raise AssemblyError(f"a change for relation OID {oid} before its Relation message") from None

    def _rels(self, oids) -> list[po.Relation]:
        return [self._rel(o) for o in oids]

    def _keep_message(self, msg: po.LogicalMessage) -> bool:
        if self.message_prefixes is None:
            return True
        return any(msg.prefix.startswith(p) for p in self.message_prefixes)

    # -- spooling (stream blocks and prepared transactions)

    def _spool_relations(self, spool: Spool, oids) -> None:
        for oid in oids:
            entry = self.relations.get(oid)
            if entry is None:
                raise AssemblyError(f"a change for relation OID {oid} before its Relation message")
            _msg, raw, in_stream = entry
            if spool.relations_written.get(oid) is not raw:
                spool.append(raw, in_stream=in_stream, relation=True)
                spool.relations_written[oid] = raw

    def _spool_message(self, spool: Spool, msg: Any, raw: bytes, t: type, in_stream: bool) -> None:
        if t is po.Relation:
            self.relations[msg.relation_oid] = (msg, raw, in_stream)
            return
        if t is po.Insert or t is po.Update or t is po.Delete:
            self._spool_relations(spool, (msg.relation_oid,))
        elif t is po.Truncate:
            self._spool_relations(spool, msg.relation_oids)
        elif t is po.Origin:
            spool.origin = (msg.name, msg.commit_lsn)
            return
        elif t is po.Type:
            self.sink.type_message(msg)
            return
        elif t is po.LogicalMessage:
            if not self._keep_message(msg):
                return
            if not msg.transactional:
                self.sink.nontx_message(msg)
                return
        else:
            raise AssemblyError(f"unexpected {msg.label} inside a transaction")
        subxid = getattr(msg, "xid", None) or spool.xid
        spool.append(raw, in_stream=in_stream, subxid=subxid)

    def _in_stream(self, msg: Any, raw: bytes, t: type) -> None:
        spool = self.spools[self._stream_xid]  # type: ignore[index]
        self._spool_message(spool, msg, raw, t, True)

    def _in_prepare(self, msg: Any, raw: bytes, t: type) -> None:
        spool = self._prep
        assert spool is not None
        if t is po.Prepare:
            self._prep = None
            self._hold(msg, spool)
            return
        self._spool_message(spool, msg, raw, t, False)

    def _hold(self, msg: Any, spool: Spool) -> None:
        origin = spool.origin
        held = HeldPrepared(
            gid=msg.gid,
            xid=msg.xid,
            prepare_lsn=msg.prepare_lsn,
            prepare_end_lsn=msg.end_lsn,
            prepare_ts=msg.prepare_timestamp,
            spool=spool,
            origin=origin[0] if origin else None,
            origin_lsn=origin[1] if origin else None,
        )
        if held.origin is not None and held.origin in self.skip_origins:
            spool.discard()
            held.spool = None
            held.extra["skipped"] = True
        old = self.held.pop(msg.gid, None)
        if old is not None and old.spool is not None:
            old.spool.discard()
        self.held[msg.gid] = held
        self.sink.prepared(held)

    def _commit_prepared(self, msg: po.CommitPrepared) -> None:
        held = self.held.pop(msg.gid, None)
        if held is None:
            raise AssemblyError(
                f"Commit Prepared for gid {msg.gid!r} (xid {msg.xid}) whose prepared "
                "transaction is neither in this stream nor held in the store"
            )
        txn = TxnInfo(
            msg.xid, msg.commit_lsn, msg.end_lsn, msg.commit_timestamp,
            kind="prepared", gid=msg.gid, origin=held.origin, origin_lsn=held.origin_lsn,
        )
        self.sink.prepared_resolved(msg.gid, msg.xid, "commit", msg.commit_lsn)
        if held.skipped:
            self.skipped_transactions += 1
            return
        spool = held.spool
        if spool is None:
            if self.fetch_prepared is None:
                raise AssemblyError(f"prepared transaction {msg.gid!r} is held in the store, "
                                    "but no fetch_prepared was given")
            spool = Spool(self.spool_dir, msg.xid, self.proto_version, path=self.fetch_prepared(held))
        try:
            self._replay(spool, txn)
        finally:
            spool.discard()

    def _replay(self, spool: Spool, txn: TxnInfo) -> None:
        if spool.origin is not None and txn.origin is None:
            txn.origin, txn.origin_lsn = spool.origin
        if txn.origin is not None and txn.origin in self.skip_origins:
            self.skipped_transactions += 1
            return
        sink = self.sink
        insert_raw = self._insert_raw
        rels: dict[int, po.Relation] = {}
        started = False
        for m, size in spool.messages(raw_inserts=insert_raw is not None):
            t = type(m)
            if t is bytes:  # an Insert as received (its xid removed), see Spool.messages
                if not started:
                    sink.begin(txn)
                    started = True
                insert_raw(rels[_OID(m, 1)[0]], m, size)
                continue
            if t is po.Relation:
                rels[m.relation_oid] = m
                continue
            if not started:
                sink.begin(txn)
                started = True
            if t is po.Insert or t is po.Update or t is po.Delete:
                sink.change(rels[m.relation_oid], m, size)
            elif t is po.Truncate:
                sink.truncate([rels[o] for o in m.relation_oids], m)
            elif t is po.LogicalMessage:
                sink.message(m)
        if not started:
            sink.begin(txn)
        sink.commit(txn)
