"""The drain: one window of logical changes from a slot to S3, acknowledged only once
it is committed in the store.

One call, :func:`drain_window`:

0. **Whose turn.** The drain takes the slot lock (:mod:`airflow_pgcdc.pg.slotlock`,
   shared with the snapshot) before it reads the store, waiting up to ``busy_wait``
   seconds, else :class:`DrainBusy` having written nothing. It checks the publications
   against the pipeline's tables and the server's identity against the store's
   (:mod:`airflow_pgcdc.drain.guards`) before anything else. Once its stream has started
   (the slot is its own), it reads the store and the slot again: a window committed
   meanwhile by a drain that does not take the lock is :class:`DrainBusy` too.

1. **Where to start.** ``start_lsn`` is the ``end_lsn`` of the latest committed window
   of the slot in the store; for the first window, the ``consistent_point`` of the
   slot's committed snapshot (or, without a snapshot, the slot's
   ``confirmed_flush_lsn``). It is checked against the slot's ``confirmed_flush_lsn``:

   * equal: the normal case;
   * store ahead (a window was committed but its acknowledgement was lost, e.g. the
     drain died between the manifest and the status update, or PostgreSQL restarted
     before saving the slot): the stream starts at the store's position, which is
     acknowledged at once; nothing is rewritten;
   * slot ahead of the store: changes were acknowledged that no window holds (someone
     else consumed the slot, or the store lost objects): :class:`SlotAheadOfStore`,
     nothing is read. Recovery is a new snapshot.

2. **Where to end.** ``end_lsn`` is fixed before reading: ``until_lsn`` (the sensor's
   observed LSN) or ``pg_current_wal_insert_lsn()`` (not ``pg_current_wal_lsn()``,
   which can trail the last commit under ``synchronous_commit = off``). The window
   holds the whole transactions whose commit LSN lies in ``[start_lsn, end_lsn)``.
   Reading stops when an event at or past ``end_lsn`` arrives (a Begin, Stream Commit,
   Commit/Rollback Prepared, Prepare, non-transactional message: it is not consumed)
   or when a keepalive reports ``wal_end >= end_lsn`` outside a transaction (the
   walsender has decoded everything before it). The walsender only decodes flushed
   WAL, and an open transaction or a quiet server may leave it without a record past
   ``end_lsn``: after ``heartbeat_after`` seconds without reaching it, the drain emits
   a non-transactional logical message (prefix ``pgcdc.heartbeat``, never written to
   the window) whose record is past ``end_lsn``, and gives up with
   :class:`DrainTimeout` after ``max_wait`` seconds without receiving anything (its own
   heartbeats aside: a long window that keeps receiving is not cut short, an end the
   stream never reaches still times out). So it never waits forever.
   ``max_rows``, ``max_bytes`` (bytes of pgoutput messages received) and
   ``max_seconds`` end the window earlier, always after a whole transaction: the
   window then ends at that transaction's commit end LSN (or at the last keepalive
   position outside any transaction, when ``max_seconds`` passes on a quiet slot).
   An empty window (no transaction) is still written: windows tile the LSN line, and
   a quiet slot must advance too.

3. **Decoding.** pgoutput at the highest protocol the server speaks, ``streaming``
   ``parallel`` on 16+ (``on`` on 14/15), ``two_phase`` when the slot was created
   with it, ``messages`` on; transactions assembled by
   :class:`~airflow_pgcdc.changes.assembly.TransactionAssembler` (streamed ones
   spooled to ``spool_dir``), change rows built by :mod:`airflow_pgcdc.changes.rows`,
   written by :class:`~airflow_pgcdc.store.window.WindowWriter` from a background
   thread. The receive loop does not decode a plain transaction's inserts nor the
   changes inside a stream block (:meth:`TransactionAssembler.take_raw
   <airflow_pgcdc.changes.assembly.TransactionAssembler.take_raw>`): inserts are kept as
   received and decoded a chunk at a time by the writer, stream-block changes are
   spooled as received and decoded when replayed. Relation messages make relation versions (per table, per window, from 0);
   types outside the built-in set are resolved from the catalogs (a SQL session), a
   Type message's name being the fallback.

4. **Commit, then acknowledge.** Parts are closed (uploads finish), held prepared
   transactions are uploaded, ``_manifest.json`` is written with If-None-Match, and
   only then is the standby status update sent with ``flush = end_lsn``. While the
   writer thread uploads, the replication thread keeps sending status updates, so
   ``wal_sender_timeout`` never fires on a slow store.

Crash safety: nothing is acknowledged before the manifest exists, and the publications
are checked again right before it is written. Each attempt names its parts with its own
attempt id; a folder without a manifest keeps the debris of attempts that did not commit
until an attempt commits the window (PostgreSQL resends everything after
``confirmed_flush_lsn``) and then removes what its manifest does not list. A committed
folder is never rewritten. A manifest put refused as "already exists" is read back: our
own (a retried put whose success was lost) is a commit, another's is
:class:`WindowConflict` (this attempt's parts are removed, nothing acknowledged).

Test hook (fault injection): when the environment variable ``PGCDC_FAULT`` names one
of the points below, the process SIGKILLs itself there (``PGCDC_PAUSE`` pauses there
instead, see :func:`_fault`). Tests only.

* ``after-receive``: once ``PGCDC_FAULT_AFTER`` transactions (default 1) are in the window;
* ``during-upload``: when the first Parquet part is about to complete its upload;
* ``after-parts``: every part uploaded, no manifest yet;
* ``after-manifest``: the window is committed, not acknowledged;
* ``after-ack``: acknowledged, before the stream is closed.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg

from airflow_pgcdc.changes.assembly import (
    HeldPrepared,
    TransactionAssembler,
    TxnInfo,
    event_position,
)
from airflow_pgcdc.changes.codecs import parse_array_text
from airflow_pgcdc.changes.columns import COMMIT_LSN, SEQ, XID
from airflow_pgcdc.changes.rows import ChangeBuffer, ColumnNameClash, RelationVersion, ts_us
from airflow_pgcdc.changes.typemap import SESSION_OPTIONS
from airflow_pgcdc.drain.guards import (
    DrainBusy,
    DrainError,
    DrainTimeout,
    PipelineTablesUnpublished,
    PublicationNotFound,
    ServerMismatch,
    SlotAheadOfStore,
    SlotMissing,
    SlotNotFound,
    WindowConflict,
    check_publications,
    check_server,
    partition_leaves,
)
from airflow_pgcdc.pg.catalog import TypeNotFound, load_type_info
from airflow_pgcdc.pg.conninfo import parse_conninfo, redact
from airflow_pgcdc.pg.errors import ObjectInUse
from airflow_pgcdc.pg.logical import LogicalStream
from airflow_pgcdc.pg.replication import ReplicationConnection
from airflow_pgcdc.pg.slotlock import lock_holder, wait_lock_slot
from airflow_pgcdc.pg.tables import parse_table_names
from airflow_pgcdc.protocol import pgoutput as po
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.pgoutput import UNCHANGED_TOAST
from airflow_pgcdc.protocol.pgoutput_options import PgoutputOptions
from airflow_pgcdc.protocol.pgtypes import PgColumn, PgTypeInfo, builtin_type
from airflow_pgcdc.protocol.replication import XLogData
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout, new_attempt_id
from airflow_pgcdc.store.manifest import read_snapshot_manifest
from airflow_pgcdc.store.window import (
    DEFAULT_MEMORY_BUDGET,
    KEY_MOVES_FIELD,
    REFUSED_FIELD,
    WindowManifest,
    WindowWriter,
    latest_window,
    read_window,
)
from airflow_pgcdc.testing.faults import FAULT_ENV, PAUSE_ENV, fault_point

log = logging.getLogger(__name__)

__all__ = [
    "DrainBusy", "DrainError", "DrainResult", "DrainTimeout", "PipelineTablesUnpublished",
    "PublicationNotFound", "ServerMismatch", "SlotAheadOfStore", "SlotNotFound", "WindowConflict",
    "drain_window",
]  # fmt: skip

HEARTBEAT_PREFIX = "pgcdc.heartbeat"
HEARTBEAT_RECORD_SLACK = 512  # bytes past a heartbeat's LSN that its own record may take
FAULT_POINTS = ("after-receive", "during-upload", "after-parts", "after-manifest", "after-ack")
CHUNK_ROWS = 16_384
CHUNK_BYTES = 8 << 20
MESSAGE_CHUNK = 1_000


def _fault(point: str) -> None:
    """The drain's fault points (:mod:`airflow_pgcdc.testing.faults`)."""
    fault_point(point, log)


@dataclass
class DrainResult:
    """What one drain did. ``window_seq`` is ``None`` when there was nothing to drain
    (``end_lsn <= start_lsn``); ``acknowledged_only`` when it only re-sent a lost
    acknowledgement."""

    slot: str
    window_seq: int | None
    start_lsn: str
    end_lsn: str
    end_reason: str | None = None
    transactions: int = 0
    rows: int = 0
    bytes: int = 0
    tables: dict[str, int] = field(default_factory=dict)
    manifest: str | None = None
    acknowledged_lost: bool = False
    seconds: float = 0.0
    # {"schema.table": {"updates", "columns", "first_commit_lsn"}}: key-changing updates
    # whose unchanged TOAST values the server did not send (the merge recovers them from
    # the old key's row when it can, see merge.compact; else it writes NULL there)
    lost_toast: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "window_seq": self.window_seq,
            "start_lsn": self.start_lsn,
            "end_lsn": self.end_lsn,
            "end_reason": self.end_reason,
            "transactions": self.transactions,
            "rows": self.rows,
            "bytes": self.bytes,
            "tables": dict(self.tables),
            "manifest": self.manifest,
            "acknowledged_lost": self.acknowledged_lost,
            "lost_toast": {k: dict(v) for k, v in self.lost_toast.items()},
            "seconds": round(self.seconds, 3),
        }


# --------------------------------------------------------------------------- the window being built


class _TypeResolver:
    def __init__(self, sql: psycopg.Connection) -> None:
        self.sql = sql
        self.types: dict[int, PgTypeInfo] = {}
        self.names: dict[int, tuple[str, str]] = {}
        self.ndims: dict[int, dict[str, int]] = {}
        self.missing: dict[int, dict[str, str]] = {}
        self.rewritten_cols: dict[int, dict[str, str]] = {}
        # the Relation message's shape each relation's attributes were read for: a new
        # shape (DDL while the drain runs) reads them again, a replayed one does not
        self.shapes: dict[int, tuple] = {}

    def type_of(self, oid: int) -> PgTypeInfo:
        t = self.types.get(oid) or builtin_type(oid)
        if t is None:
            try:
                t = load_type_info(self.sql, [oid])[oid]
            except TypeNotFound:
                schema, name = self.names.get(oid, ("", "unknown"))
                t = PgTypeInfo.unknown(oid, name, schema)
            self.types[oid] = t
        return t

    def dims(self, relation_oid: int) -> dict[str, int]:
        d = self.ndims.get(relation_oid)
        if d is None:
            self._load_attributes(relation_oid)
            d = self.ndims[relation_oid]
        return d

    def missing_values(self, relation_oid: int) -> dict[str, str]:
        """``{column: text}``: the value rows that existed before an ``ADD COLUMN … DEFAULT``
        read for that column (``attmissingval``: PostgreSQL stores it instead of rewriting
        the table), in the type's text form. The catalog's current state: a table rewritten
        since then has none (its rows hold the value, and the merge cannot know)."""
        m = self.missing.get(relation_oid)
        if m is None:
            self._load_attributes(relation_oid)
            m = self.missing[relation_oid]
        return m

    def rewritten(self, relation_oid: int) -> dict[str, str]:
        """``{column: its default or generation expression}``: columns whose rows already
        there were given values by a table rewrite, which logical decoding does not send
        (``ADD COLUMN … DEFAULT random()``, ``… GENERATED ALWAYS AS (…) STORED``, or a
        constant default whose ``attmissingval`` a later rewrite materialized). The
        catalog says so when a column has a default but no ``attmissingval`` and the
        table's file (``relfilenode``) is newer than the default (``pg_attrdef.oid``: both
        come from the OID counter), i.e. the table was rewritten after the default was
        set. ``ADD COLUMN x`` then ``SET DEFAULT`` is not flagged (the file is older than
        the default; the rows read NULL in PostgreSQL too), unless the table was rewritten
        after it too (``VACUUM FULL``, ``CLUSTER``, ``TRUNCATE``): the merge only looks at
        columns its Delta table does not have yet, so that rarely matters. The catalog's
        state when the drain reads it, not as of the change. A partitioned table published
        through its root has no file of its own: not detected."""
        m = self.rewritten_cols.get(relation_oid)
        if m is None:
            self._load_attributes(relation_oid)
            m = self.rewritten_cols[relation_oid]
        return m

    def refresh(self, relation_oid: int, shape: tuple) -> None:
        """Read the relation's attributes again at its next use if its Relation message's
        ``shape`` is not the one they were read for (DDL since)."""
        if self.shapes.get(relation_oid) != shape:
            self.shapes[relation_oid] = shape
            self.ndims.pop(relation_oid, None)
            self.missing.pop(relation_oid, None)
            self.rewritten_cols.pop(relation_oid, None)

    def _load_attributes(self, relation_oid: int) -> None:
        rows = self.sql.execute(
            "SELECT a.attname::text, a.attndims, CASE WHEN a.atthasmissing THEN a.attmissingval::text END, "
            "t.typdelim::text, "
            "a.atthasdef AND NOT a.atthasmissing AND d.oid IS NOT NULL AND c.relfilenode > d.oid, "
            "a.attgenerated::text, left(pg_catalog.pg_get_expr(d.adbin, d.adrelid), 200) "
            "FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid "
            "JOIN pg_catalog.pg_class c ON c.oid = a.attrelid "
            "LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
            "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped "
            "AND (a.attndims > 0 OR a.atthasmissing OR a.atthasdef)",
            (relation_oid,),
        ).fetchall()
        self.ndims[relation_oid] = {row[0]: row[1] for row in rows if row[1] > 0}
        self.rewritten_cols[relation_oid] = {
            name: (f"GENERATED ALWAYS AS ({expr}) STORED" if generated == "s" else f"DEFAULT {expr}")
            for name, _, _, _, rewritten, generated, expr in rows if rewritten
        }
        missing = {}
        for name, ndims, stored, delimiter, _, _, _ in rows:
            if stored is None or ndims > 0:  # an array column's default: not read back (see README)
                continue
            # attmissingval is a one-element array of the column's type: its element's text
            try:
                dims, _bounds, values = parse_array_text(stored, delimiter or ",")
            except Exception as exc:  # noqa: BLE001 - the rows then read NULL, said loudly
                log.warning("relation %s, column %s: cannot read its ADD COLUMN default %r: %s",
                            relation_oid, name, stored, exc)
                continue
            if dims == [1] and values[0] is not None:
                missing[name] = values[0]
        self.missing[relation_oid] = missing


class _Window:
    """The :class:`~airflow_pgcdc.changes.assembly.Sink` that builds one window."""

    def __init__(self, writer: WindowWriter, types: _TypeResolver, pump, buffer_budget: int = 64 << 20) -> None:
        self.writer = writer
        self.types = types
        self.pump = pump
        # the change buffers of all tables together stay under this (a window touching
        # thousands of tables would otherwise hold up to CHUNK_BYTES for each)
        self.buffer_budget = buffer_budget
        self.buffered = 0
        self.seq = 0
        self.transactions = 0
        self.rows = 0
        self.table_rows: dict[str, int] = {}
        self.first_commit: LSN | None = None
        self.last_commit: LSN | None = None
        self.last_end: LSN | None = None  # end LSN of the last complete transaction
        self.truncates: list[dict] = []
        # key-changing updates that left TOASTed values unsent (see _note_lost_toast)
        self.lost_toast: dict[str, dict[str, Any]] = {}
        self.origins: list[dict] = []
        self.committed_prepared: list[dict] = []
        self.rolled_back_prepared: list[dict] = []
        self.messages: list[dict] = []
        self.n_messages = [0, 0]  # transactional, non-transactional
        self.versions: dict[tuple[str, str], list[RelationVersion]] = {}
        self.buffers: dict[int, ChangeBuffer] = {}
        self._by_rel: dict[int, tuple[po.Relation, RelationVersion]] = {}
        self._txn: TxnInfo | None = None
        self._ts: int | None = None
        self._commit_lsn = 0
        self._last_rel: po.Relation | None = None  # cache of the last change's relation
        self._last_rv: RelationVersion | None = None
        self._last_buf: ChangeBuffer | None = None
        # tables whose rows cannot be written (a column named like our metadata): their
        # changes are left out and the manifest says so; the merge refuses those tables
        self.refused: dict[tuple[str, str], dict[str, Any]] = {}
        self.txn_ended = False

    # -- relation versions

    def _version(self, rel: po.Relation) -> RelationVersion:
        hit = self._by_rel.get(id(rel))
        if hit is not None and hit[0] is rel:
            return hit[1]
        self.types.refresh(rel.relation_oid, (rel.replica_identity, tuple(
            (c.name, c.type_oid, c.type_modifier, c.is_key) for c in rel.columns)))
        dims = self.types.dims(rel.relation_oid)
        columns = tuple(
            PgColumn(c.name, self.types.type_of(c.type_oid), c.type_modifier, dims.get(c.name, 0))
            for c in rel.columns
        )
        schema = rel.namespace or "pg_catalog"
        candidate = RelationVersion(
            rel.relation_oid, schema, rel.relation_name, rel.replica_identity, columns,
            tuple(c.is_key for c in rel.columns),
        )
        versions = self.versions.setdefault((schema, rel.relation_name), [])
        rv = next((v for v in versions if v.same_definition(candidate)), None)
        if rv is None:
            rv = RelationVersion(
                candidate.relation_oid, schema, rel.relation_name, rel.replica_identity, columns,
                candidate.key_flags, version=len(versions),
                missing_values=self.types.missing_values(rel.relation_oid) or None,
                rewritten=self._rewritten(rel, columns),
            )
            versions.append(rv)
            self.buffers[id(rv)] = ChangeBuffer(rv)
            self.writer.declare(rv, self.pump)
        self._by_rel[id(rel)] = (rel, rv)
        return rv

    def _rewritten(self, rel: po.Relation, columns) -> dict[str, str] | None:
        """This version's columns whose existing rows a rewrite filled (see
        :meth:`_TypeResolver.rewritten`), logged: the merge refuses them until a resync."""
        found = self.types.rewritten(rel.relation_oid)
        mine = {c.name: found[c.name] for c in columns if c.name in found}
        if mine:
            log.warning("%s.%s: column(s) %s have values PostgreSQL wrote by rewriting the table (%s): "
                        "no change carries them; a merge that has to add them refuses the table "
                        "(pgcdc resync it)", rel.namespace, rel.relation_name, sorted(mine),
                        "; ".join(f"{k} {v}" for k, v in sorted(mine.items())))
        return mine or None

    # -- Sink

    def begin(self, txn: TxnInfo) -> None:
        self._txn = txn
        self._ts = ts_us(txn.commit_ts)
        # a plain int: the buffered rows hold it until their chunk is written, and an LSN
        # (an int subclass) is tracked by the cyclic GC, whose full collections it would slow
        self._commit_lsn = int(txn.commit_lsn)

    def _switch_to(self, rel: po.Relation) -> bool:
        """Make ``rel``'s relation version and buffer the current ones; False when the
        table is refused (a column name clash: that table alone, never the slot's drain)."""
        try:
            rv = self._version(rel)
        except ColumnNameClash as exc:
            self._refuse(rel, exc)
            return False
        self._last_rel, self._last_rv, self._last_buf = rel, rv, self.buffers[id(rv)]
        return True

    def change(self, rel: po.Relation, msg: Any, nbytes: int) -> None:
        if rel is not self._last_rel and not self._switch_to(rel):
            return
        rv, buf = self._last_rv, self._last_buf
        t = type(msg)
        if t is po.Insert:
            op, image, old = "I", msg.new, None
        elif t is po.Update:
            op, image = "U", msg.new
            old = msg.old if msg.old is not None else msg.key
            if msg.key is not None and UNCHANGED_TOAST in image:
                self._note_lost_toast(rv, image)
        else:
            op, old = "D", None
            image = msg.old if msg.old is not None else msg.key
            if image is None:
                image = (None,) * len(rv.columns)
        before = buf.nbytes
        buf.add(op, image, old, self._commit_lsn, self.seq, self._txn.xid, self._ts, nbytes)  # type: ignore[union-attr]
        self.buffered += buf.nbytes - before
        self.seq += 1
        self.rows += 1
        if self.rows & 1023 == 0:  # a replay (streamed, prepared) feeds no frames: keep the status going
            self.pump()
        if buf.nbytes >= CHUNK_BYTES or len(buf) >= CHUNK_ROWS:
            self.buffered -= buf.nbytes
            self.writer.submit_rows(rv, buf.take(), self.pump)
        elif self.buffered > self.buffer_budget:
            self._flush_largest()

    def insert_raw(self, rel: po.Relation, message: bytes, nbytes: int) -> None:
        """An Insert as received (:meth:`TransactionAssembler.take_raw`): kept undecoded in
        its buffer, its values decoded with the rest of its chunk by the writer
        (:meth:`~airflow_pgcdc.changes.rows.RelationVersion.to_batch`). The rest as
        :meth:`change`."""
        if rel is not self._last_rel and not self._switch_to(rel):
            return
        rv, buf = self._last_rv, self._last_buf
        before = buf.nbytes
        buf.add_raw_insert(message, self._commit_lsn, self.seq, self._txn.xid, self._ts, nbytes)  # type: ignore[union-attr]
        self.buffered += buf.nbytes - before
        self.seq += 1
        self.rows += 1
        if self.rows & 1023 == 0:  # a replay (streamed, prepared) feeds no frames: keep the status going
            self.pump()
        if buf.nbytes >= CHUNK_BYTES or len(buf) >= CHUNK_ROWS:
            self.buffered -= buf.nbytes
            self.writer.submit_rows(rv, buf.take(), self.pump)
        elif self.buffered > self.buffer_budget:
            self._flush_largest()

    def _refuse(self, rel: po.Relation, exc: Exception) -> None:
        key = (rel.namespace or "pg_catalog", rel.relation_name)
        entry = self.refused.get(key)
        if entry is None:
            entry = self.refused[key] = {"error": str(exc), "first_commit_lsn": str(LSN(self._commit_lsn)),
                                         "last_commit_lsn": "", "changes": 0}
            log.error("%s.%s: its changes cannot be stored and are left out of this window (the other "
                      "tables go on; the merge refuses this table): %s", key[0], key[1], exc)
        entry["changes"] += 1
        entry["last_commit_lsn"] = str(LSN(self._commit_lsn))

    def _note_lost_toast(self, rv: RelationVersion, image: tuple) -> None:
        """A key-changing update (the server sent the old key, not the old row: the table
        is not ``REPLICA IDENTITY FULL``) whose new row has unchanged TOAST values: the
        server sent neither them nor the old row. Counted per table, reported when the
        window commits and in the manifest, whose count makes the merge match such rows on
        their old key to keep the values (:func:`airflow_pgcdc.merge.compact.compact`)."""
        entry = self.lost_toast.setdefault(
            rv.qualified_name, {"updates": 0, "columns": [], "first_commit_lsn": str(LSN(self._commit_lsn))},
        )
        entry["updates"] += 1
        for col, v in zip(rv.columns, image, strict=False):
            if v is UNCHANGED_TOAST and col.name not in entry["columns"]:
                entry["columns"].append(col.name)

    def truncate(self, relations: list[po.Relation], msg: po.Truncate) -> None:
        txn = self._txn
        names = []
        for r in relations:
            rv = self._version(r)
            names.append(rv.qualified_name)
        self.truncates.append({
            "seq": self.seq, "xid": txn.xid, "commit_lsn": str(txn.commit_lsn),  # type: ignore[union-attr]
            "tables": names, "cascade": msg.cascade, "restart_identity": msg.restart_identity,
        })
        self.seq += 1

    def message(self, msg: po.LogicalMessage) -> None:
        txn = self._txn
        self.messages.append({
            SEQ: self.seq, "transactional": True, XID: txn.xid,  # type: ignore[union-attr]
            COMMIT_LSN: int(txn.commit_lsn), "lsn": int(msg.lsn),  # type: ignore[union-attr]
            "prefix": msg.prefix, "content": msg.content,
        })
        self.seq += 1
        self.n_messages[0] += 1
        self._flush_messages(False)

    def nontx_message(self, msg: po.LogicalMessage) -> None:
        if msg.prefix == HEARTBEAT_PREFIX:
            return
        self.messages.append({
            SEQ: None, "transactional": False, XID: None, COMMIT_LSN: None,
            "lsn": int(msg.lsn), "prefix": msg.prefix, "content": msg.content,
        })
        self.n_messages[1] += 1
        self._flush_messages(False)

    def commit(self, txn: TxnInfo) -> None:
        self.transactions += 1
        if self.first_commit is None:
            self.first_commit = txn.commit_lsn
        self.last_commit = txn.commit_lsn
        self.last_end = txn.end_lsn
        if txn.origin is not None:
            self.origins.append({
                "xid": txn.xid, "commit_lsn": str(txn.commit_lsn), "origin": txn.origin,
                "origin_lsn": str(txn.origin_lsn) if txn.origin_lsn is not None else None,
            })
        self._txn = None
        self.txn_ended = True

    def type_message(self, msg: po.Type) -> None:
        self.types.names[msg.type_oid] = (msg.namespace, msg.type_name)

    def prepared(self, held: HeldPrepared) -> None:
        self.last_end = held.prepare_end_lsn
        self.txn_ended = True

    def prepared_resolved(self, gid: str, xid: int, outcome: str, lsn: LSN) -> None:
        entry = {"gid": gid, "xid": xid}
        if outcome == "commit":
            self.committed_prepared.append(entry | {"commit_lsn": str(lsn)})
        else:
            self.rolled_back_prepared.append(entry | {"lsn": str(lsn)})
            self.last_end = lsn
            self.txn_ended = True

    # -- end

    def _flush_messages(self, force: bool) -> None:
        if self.messages and (force or len(self.messages) >= MESSAGE_CHUNK):
            rows, self.messages = self.messages, []
            self.writer.submit_messages(rows, self.pump)

    def _flush_largest(self) -> None:
        """Hand the largest buffers to the writer until half the budget is left."""
        for b in sorted(self.buffers.values(), key=lambda b: b.nbytes, reverse=True):
            if self.buffered <= self.buffer_budget // 2 or not len(b):
                break
            self.buffered -= b.nbytes
            self.writer.submit_rows(b.version, b.take(), self.pump)

    def flush(self) -> None:
        for versions in self.versions.values():
            for rv in versions:
                buf = self.buffers[id(rv)]
                if len(buf):
                    self.writer.submit_rows(rv, buf.take(), self.pump)
        self.buffered = 0
        self._flush_messages(True)


# --------------------------------------------------------------------------- helpers


def _find_snapshot(client, layout: Layout, slot: str):
    for key in s3store.list_keys(client, layout.bucket, layout.snapshots_prefix(slot)):
        if key.endswith("/_manifest.json"):
            return read_snapshot_manifest(client, layout.bucket, key)
    return None


def _slot_info(sql: psycopg.Connection, slot: str) -> tuple[LSN, bool, str]:
    row = sql.execute(
        "SELECT confirmed_flush_lsn::text, two_phase, plugin::text, database::text "
        "FROM pg_catalog.pg_replication_slots WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    if row is None:
        raise SlotMissing(
            f"replication slot {slot!r} does not exist", slot=slot,
            hint="a dropped slot lost its changes: start the pipeline again with pgcdc snapshot (or pgcdc resync "
            "for some tables) under a new slot name",
        )
    confirmed, two_phase, plugin, _db = row
    if plugin != "pgoutput":
        raise DrainError(f"slot {slot!r} uses output plugin {plugin!r}; the drain reads pgoutput")
    if confirmed is None:
        raise DrainError(f"slot {slot!r} is not a logical slot with a confirmed position")
    return LSN.parse(confirmed), bool(two_phase), plugin


def _options(dsn: str, extra: str | None) -> str:
    base = parse_conninfo(dsn).get("options", "")
    return " ".join(x for x in (base, SESSION_OPTIONS, extra or "") if x)


@dataclass
class _Plan:
    """Where the next window starts, read from the store and the slot (under the slot
    lock), and what the store recorded about the pipeline."""

    seq: int
    start: LSN
    confirmed: LSN
    two_phase: bool
    snapshot_id: str | None
    held: dict[str, HeldPrepared]
    # the tables the publications must still cover; None: nothing recorded yet
    pipeline: frozenset[tuple[str, str]] | None
    system_id: str | None
    timeline: int | None
    recorded_by: str  # "window 4", "snapshot 2025...": what recorded system_id/timeline


def _plan(client, layout: Layout, slot: str, sql: psycopg.Connection) -> _Plan:
    latest = latest_window(client, layout, slot)
    confirmed, two_phase, _plugin = _slot_info(sql, slot)
    held: dict[str, HeldPrepared] = {}
    if latest is not None:
        for e in latest.pending_prepared:
            held[e["gid"]] = HeldPrepared(
                gid=e["gid"], xid=e["xid"], prepare_lsn=LSN.parse(e["prepare_lsn"]),
                prepare_end_lsn=LSN.parse(e["prepare_end_lsn"]), prepare_ts=None,
                origin=e.get("origin"), stored=dict(e),
            )
        pipeline = latest.pipeline_tables
        if pipeline is None:  # a window written before pipeline_tables existed
            snap = _find_snapshot(client, layout, slot)
            pipeline = {(t.schema, t.table) for t in snap.tables} if snap is not None else set()
            pipeline |= {(t["schema"], t["table"]) for t in latest.tables}
        return _Plan(
            latest.window_seq + 1, latest.end, confirmed, two_phase, latest.snapshot_id, held,
            frozenset(pipeline), latest.system_id, latest.timeline, f"window {latest.window_seq}",
        )
    snap = _find_snapshot(client, layout, slot)
    if snap is not None:
        return _Plan(
            0, LSN.parse(snap.consistent_point), confirmed, two_phase, snap.snapshot_id, held,
            frozenset((t.schema, t.table) for t in snap.tables), snap.system_id, snap.timeline,
            f"snapshot {snap.snapshot_id}",
        )
    return _Plan(0, confirmed, confirmed, two_phase, None, held, None, None, None, "nothing")


def _lock(sql: psycopg.Connection, slot: str, busy_wait: float) -> None:
    if not wait_lock_slot(sql, slot, busy_wait):
        raise DrainBusy(
            f"slot {slot}: another drain or snapshot of this slot is running ({lock_holder(sql, slot)}); "
            "this drain wrote and acknowledged nothing",
            hint="nothing to do: the running one drains the changes (runs of one slot must not overlap; "
                 "in Airflow keep max_active_runs=1)",
        )


def _window_timelines(client, layout: Layout, slot: str):
    """``window_at(seq) -> (timeline, start)`` of committed windows, each manifest read once."""
    seen: dict[int, tuple[int | None, LSN]] = {}

    def window_at(seq: int) -> tuple[int | None, LSN]:
        if seq not in seen:
            m = read_window(client, layout, slot, seq)
            seen[seq] = (m.timeline, m.start)
        return seen[seq]

    return window_at


def _connect(dsn: str, slot: str, plan: _Plan, *, status_interval: float, connect_options: str | None,
             window_at=None):
    """A replication connection to a server that is the one the store followed
    (:func:`~airflow_pgcdc.drain.guards.check_server`, every timeline of the store's windows
    read with ``window_at``), with its ``IDENTIFY_SYSTEM``."""
    conn = ReplicationConnection.connect(
        dsn, application_name="pgcdc-drain", status_interval=status_interval,
        options=_options(dsn, connect_options),
    )
    try:
        ident = conn.identify_system()
        note = check_server(
            slot=slot, system_id=ident.systemid, timeline=ident.timeline,
            recorded_system_id=plan.system_id, recorded_timeline=plan.timeline,
            store_end=plan.start, where=plan.recorded_by,
            history=lambda tli: [(e.timeline, e.switchpoint) for e in conn.timeline_history(tli).entries()],
            windows=plan.seq, window_at=window_at,  # windows 0 .. seq - 1 are committed
            # the store's end against the server's WAL, once the store holds something
            flushed=ident.xlogpos if plan.seq > 0 or plan.snapshot_id is not None else None,
        )
    except BaseException:
        conn.close()
        raise
    if note:
        log.warning(note)
    return conn, ident


def _start_stream(conn, slot: str, options: PgoutputOptions, start: LSN, *, busy_wait: float, reconnect):
    """Start streaming on ``conn``: from here the slot is ours. A slot still held by a
    dying walsender (a drain killed a moment ago) is waited for, up to ``busy_wait``
    seconds, on new connections from ``reconnect()``. Returns ``(conn, stream)``."""
    deadline = time.monotonic() + busy_wait
    while True:
        try:
            return conn, LogicalStream.pgoutput(conn, slot, options, start)
        except ObjectInUse as exc:
            conn.close()
            if time.monotonic() >= deadline:
                raise DrainBusy(
                    f"slot {slot} is in use by another process: {exc.message}; this drain wrote and "
                    "acknowledged nothing",
                    hint="another consumer streams this slot (pg_replication_slots.active_pid): stop it; "
                         "only one process may consume a slot",
                ) from None
            log.info("slot %s is still active (a walsender ending?): waiting", slot)
            time.sleep(0.3)
            conn = reconnect()
        except BaseException:
            conn.close()
            raise


def _recheck(client, layout: Layout, slot: str, sql: psycopg.Connection, plan: _Plan) -> None:
    """With the slot ours: nothing moved since :func:`_plan` read the store and the slot."""
    latest = latest_window(client, layout, slot)
    seq = latest.window_seq + 1 if latest is not None else 0
    confirmed = _slot_info(sql, slot)[0]
    if seq != plan.seq or confirmed != plan.confirmed:
        raise DrainBusy(
            f"slot {slot}: while this drain was starting, another one committed window {seq - 1} "
            f"(the store's next window is {seq}, this drain planned {plan.seq}; the slot is at "
            f"{confirmed}, it read {plan.confirmed}); this drain wrote and acknowledged nothing",
            hint="nothing to do: the other drain took these changes (runs of one slot must not overlap)",
        )


# --------------------------------------------------------------------------- the drain


def drain_window(
    dsn: str,
    to: str | s3store.S3Location,
    *,
    slot: str,
    publications: Sequence[str] | str,
    until_lsn: LSN | str | int | None = None,
    max_rows: int | None = None,
    max_bytes: int | None = None,
    max_seconds: float | None = None,
    skip_origins: Sequence[str] = (),
    message_prefixes: Sequence[str] | None = None,
    binary: bool = False,
    heartbeat: bool = True,
    heartbeat_after: float = 1.0,
    max_wait: float = 300.0,
    status_interval: float = 1.0,
    spool_dir: str | None = None,
    connect_options: str | None = None,
    target_part_bytes: int | None = None,
    s3_client: Any = None,
    forget_tables: Sequence[str] = (),
    busy_wait: float = 10.0,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> DrainResult:
    """Drain one window of ``slot`` into ``to`` (``s3://bucket/prefix``); see the module
    docstring. ``connect_options`` are extra libpq ``options`` for the replication
    connection (e.g. ``-c wal_sender_timeout=2s``). ``forget_tables`` (``schema.table``)
    lets tables that left the publications leave the pipeline (see
    :mod:`airflow_pgcdc.drain.guards`). ``busy_wait``: how long to wait for another run
    of the slot (its lock, or a walsender still ending) before :class:`DrainBusy`.
    ``memory_budget``: bytes of change data the window keeps in memory over all its tables
    (open Parquet parts; the change buffers get a quarter more): past it, the largest
    tables' parts are finished early, so memory does not grow with the number of tables."""
    t0 = time.monotonic()
    started_at = datetime.now(UTC)
    if isinstance(publications, str):
        publications = (publications,)
    publications = tuple(publications)
    forget = frozenset(parse_table_names(forget_tables))
    location = to if isinstance(to, s3store.S3Location) else s3store.S3Location.parse(to)
    layout = Layout(location)
    client = s3_client or s3store.make_s3_client()

    sql = psycopg.connect(dsn, autocommit=True, application_name="pgcdc-drain-catalog")
    try:
        _lock(sql, slot, busy_wait)  # before the store is read: the plan stays true while we hold it
        plan = _plan(client, layout, slot, sql)
        check_publications(sql, publications, plan.pipeline or (), slot=slot, forget=forget)
        # the server must be the one the store followed before positions are compared
        window_at = _window_timelines(client, layout, slot)
        conn, ident = _connect(dsn, slot, plan, status_interval=status_interval, connect_options=connect_options,
                               window_at=window_at)
        try:
            return _drain_on(
                conn, ident, sql, client, layout, slot, plan, t0=t0, started_at=started_at,
                publications=publications, forget=forget, until_lsn=until_lsn, binary=binary,
                busy_wait=busy_wait, spool_dir=spool_dir, where=redact(dsn),
                reconnect=lambda: _connect(dsn, slot, plan, status_interval=status_interval,
                                           connect_options=connect_options, window_at=window_at)[0],
                run_kw=dict(
                    max_rows=max_rows, max_bytes=max_bytes, max_seconds=max_seconds,
                    skip_origins=skip_origins, message_prefixes=message_prefixes, heartbeat=heartbeat,
                    heartbeat_after=heartbeat_after, max_wait=max_wait, status_interval=status_interval,
                    target_part_bytes=target_part_bytes, memory_budget=memory_budget,
                ),
            )
        finally:
            conn.close()
    finally:
        sql.close()


def _drain_on(conn, ident, sql, client, layout: Layout, slot: str, plan: _Plan, *, t0, started_at,
              publications, forget, until_lsn, binary, busy_wait, spool_dir, reconnect, run_kw,
              where: str) -> DrainResult:
    """The drain once the slot is locked, the plan read and the server checked."""
    start, seq, confirmed = plan.start, plan.seq, plan.confirmed
    if confirmed > start:
        _recheck(client, layout, slot, sql, plan)  # a drain without the lock committed meanwhile?
        raise SlotAheadOfStore(
            f"slot {slot!r} has confirmed_flush_lsn {confirmed}, but the store's windows end at "
            f"{start} (s3://{layout.bucket}/{layout.changes_prefix(slot)}): changes were "
            "acknowledged that no window holds. Take a new snapshot to recover."
        )
    lost_ack = start > confirmed
    if until_lsn is not None:
        end_lsn = LSN(until_lsn) if not isinstance(until_lsn, str) else LSN.parse(until_lsn)
    else:
        end_lsn = LSN.parse(sql.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])
    server_version = sql.info.server_version
    types = _TypeResolver(sql)

    result = DrainResult(slot=slot, window_seq=None, start_lsn=str(start), end_lsn=str(end_lsn),
                         acknowledged_lost=lost_ack)
    if end_lsn <= start and not lost_ack:
        log.info("slot %s: nothing to drain (store at %s, end %s)", slot, start, end_lsn)
        result.end_lsn = str(start)
        result.seconds = time.monotonic() - t0
        return result

    options = PgoutputOptions(
        publications=publications,
        binary=binary,
        messages=True,
        streaming=("parallel" if server_version >= 160000 else "on") if server_version >= 140000 else "off",
        two_phase=plan.two_phase and server_version >= 150000,
    )
    log.info("drain %s: window %d [%s, %s) from %s", slot, seq, start, end_lsn, where)
    conn, stream = _start_stream(conn, slot, options, start, busy_wait=busy_wait, reconnect=reconnect)
    spool = _make_spool(spool_dir, slot)
    try:
        _recheck(client, layout, slot, sql, plan)  # the slot is ours now: no one moves it
        if lost_ack:
            log.warning("slot %s: the store is at %s but the slot at %s (a lost acknowledgement): "
                        "acknowledging %s", slot, start, confirmed, start)
            conn.confirm(start)
        if end_lsn <= start:
            conn.stop()
            result.end_lsn = str(start)
            result.seconds = time.monotonic() - t0
            return result
        return _run(
            conn, stream, sql, types, client, layout, slot, seq, start, end_lsn, plan.held,
            spool=spool, result=result, ident=ident, snapshot_id=plan.snapshot_id,
            started_at=started_at, t0=t0, publications=publications, pipeline=plan.pipeline,
            forget=forget, **run_kw,
        )
    finally:
        conn.close()
        shutil.rmtree(spool, ignore_errors=True)


def _run(conn, stream, sql, types, client, layout, slot, seq, start, end_lsn, held, *, spool,
         max_rows, max_bytes, max_seconds, skip_origins, message_prefixes, heartbeat,
         heartbeat_after, max_wait, status_interval, target_part_bytes, result, ident,
         snapshot_id, started_at, t0, publications, pipeline, forget, memory_budget) -> DrainResult:
    # the folder may hold debris of attempts that did not commit: it is left alone until this
    # attempt commits (an attempt of a drain that lost its slot may still be uploading, and its
    # commit would be refused anyway), then swept; our parts carry our attempt id in their names
    attempt = new_attempt_id()
    last_status = [time.monotonic()]

    def pump() -> None:
        now = time.monotonic()
        if now - last_status[0] >= min(status_interval, 1.0):
            conn.send_feedback()
            last_status[0] = now

    part_closed = [False]

    def on_part_close() -> None:
        if not part_closed[0]:
            part_closed[0] = True
            _fault("during-upload")

    writer_kw = {"target_part_bytes": target_part_bytes} if target_part_bytes else {}
    writer = WindowWriter(client, layout, slot, seq, on_part_close=on_part_close, attempt=attempt,
                          memory_budget=memory_budget, **writer_kw)
    window = _Window(writer, types, pump, buffer_budget=max(memory_budget // 4, CHUNK_BYTES))

    def fetch(h: HeldPrepared) -> str:
        e = h.stored or {}
        key = layout.window_prefix(slot, e["window_seq"]) + e["path"]
        fd, path = tempfile.mkstemp(prefix=f"held-{h.xid}-", suffix=".spool", dir=spool)
        with os.fdopen(fd, "wb") as f:  # streamed to disk, status updates going on meanwhile
            _while_pumping(lambda: s3store.download_to(client, layout.bucket, key, f), pump)
        return path

    asm = TransactionAssembler(
        window, proto_version=stream.options.proto_version, spool_dir=spool,
        skip_origins=frozenset(skip_origins), message_prefixes=tuple(message_prefixes) if message_prefixes is not None else None,
        held=held, fetch_prepared=fetch,
    )
    # the after-receive point is checked after every transaction: read the environment once
    fault_after = int(os.environ.get("PGCDC_FAULT_AFTER", "1"))
    if "after-receive" not in (os.environ.get(FAULT_ENV), os.environ.get(PAUSE_ENV)):
        fault_after = None
    receive_t0 = time.monotonic()
    deadline = receive_t0 + max_seconds if max_seconds is not None else None
    safe = start  # the furthest position where a window could end right now
    received = 0
    last_progress = time.monotonic()
    last_heartbeat = 0.0
    last_data = last_progress  # the last progress other than a heartbeat (for max_wait)
    # A walsender reading WAL that holds nothing for us (a busy unpublished table, a catch-up
    # from an old restart_lsn) sends nothing at all while our status updates keep it from
    # pinging: after a silent while, ask for a keepalive (reply_requested); its wal_end is how
    # far decoding got, which is progress (for max_wait) and, outside a transaction, a
    # position where the window may end
    ping_every = min(1.0, max_wait / 4, max_seconds / 3 if max_seconds else 1.0)
    last_ping = 0.0
    last_wal_end = start
    # the server's position moving only past our own heartbeat record is not progress (an end
    # the stream never reaches must still time out)
    hb_lsn: LSN | None = None
    reason = None
    n = 0  # XLogData frames received
    n_seen = 0  # ... as of the last silent read (changes do not touch last_progress)
    n_heartbeats = n_data_seen = 0
    try:
        read = conn.read_message
        decode = stream.decoder.decode
        feed = asm.feed
        take_raw = asm.take_raw
        in_block = False  # inside a stream block (a streamed transaction's changes are spooled)
        while True:
            frame = read(0.2)
            if type(frame) is XLogData:
                data = frame.data
                n += 1
                # the hottest path: a plain transaction's insert, or a change in a stream block,
                # taken undecoded (decoded in batches by the writer, or when replayed)
                if data and (in_block or data[0] == 73) and take_raw(data):
                    received += len(data)
                    if n & 4095 == 0:
                        pump()
                    continue
                msg = decode(data)
                t = type(msg)
                if t is po.Insert or t is po.Update or t is po.Delete:  # the hot path
                    received += len(data)
                    feed(msg, data)
                    if n & 4095 == 0:
                        pump()
                    continue
                now = time.monotonic()
                last_progress = now
                if t is po.LogicalMessage and msg.prefix == HEARTBEAT_PREFIX:
                    n_heartbeats += 1
                else:
                    last_data = now
                if n & 255 == 0:
                    pump()
                pos = event_position(msg)
                if pos is not None and pos >= end_lsn:
                    reason = "until_lsn"
                    break
                received += len(data)
                window.txn_ended = False
                feed(msg, data)
                in_block = asm.in_stream_block
                if window.txn_ended:
                    if window.last_end is not None and window.last_end > safe:
                        safe = window.last_end
                    if fault_after is not None and window.transactions >= fault_after:
                        _fault("after-receive")
                    if max_rows is not None and window.rows >= max_rows:
                        reason = "max_rows"
                    elif max_bytes is not None and received >= max_bytes:
                        reason = "max_bytes"
                    elif deadline is not None and now >= deadline:
                        reason = "max_seconds"
                    if reason is not None and not asm.in_transaction:
                        break
                    reason = None
                continue
            now = time.monotonic()
            if frame is None:
                if n != n_seen:  # frames (maybe only changes) arrived since the last silent read
                    n_seen = n
                    last_progress = now
                    if n - n_heartbeats != n_data_seen:
                        n_data_seen = n - n_heartbeats
                        last_data = now
                if deadline is not None and now >= deadline and not asm.in_transaction:
                    reason = "max_seconds"
                    break
                if now - last_progress > heartbeat_after and heartbeat and now - last_heartbeat > heartbeat_after:
                    hb_lsn = _emit_heartbeat(sql) or hb_lsn
                    last_heartbeat = now
                if now - last_data >= ping_every and now - last_ping >= ping_every:
                    conn.send_feedback(reply_requested=True)
                    last_status[0] = last_ping = now
                if now - last_data > max_wait:
                    raise DrainTimeout(
                        f"slot {slot}: the stream did not reach {end_lsn}: no progress for {max_wait}s "
                        f"(nothing received, and the server's position stayed at {last_wal_end}; received up "
                        f"to {conn.received_lsn})"
                    )
                pump()
                continue
            # a keepalive: outside a transaction, everything before wal_end was decoded
            pump()
            if frame.wal_end > last_wal_end:  # the walsender moved on: progress, even in silence
                last_wal_end = frame.wal_end
                if hb_lsn is None or frame.wal_end > hb_lsn + HEARTBEAT_RECORD_SLACK:
                    last_data = now
            if not asm.in_transaction:
                if frame.wal_end >= end_lsn:
                    reason = "until_lsn"
                    break
                if frame.wal_end > safe:
                    safe = frame.wal_end
                    last_progress = now
                if deadline is not None and now >= deadline:
                    reason = "max_seconds"
                    break
        window_end = end_lsn if reason == "until_lsn" else max(safe, start)
        receive_seconds = time.monotonic() - receive_t0
        # ---- finish: parts, held prepared transactions, manifest, then the acknowledgement
        fin_t0 = time.monotonic()
        window.flush()
        pending = []
        for h in asm.held.values():
            if h.stored is not None:
                pending.append(dict(h.stored))
                continue
            entry = {
                "gid": h.gid, "xid": h.xid, "prepare_lsn": str(h.prepare_lsn),
                "prepare_end_lsn": str(h.prepare_end_lsn),
                "prepare_ts": h.prepare_ts.isoformat() if h.prepare_ts else None,
                "origin": h.origin, "changes": h.spool.changes if h.spool else 0,
            }
            if h.spool is None:  # skipped by origin: nothing to keep but the gid
                entry |= {"window_seq": seq, "path": None, "bytes": 0, "skipped": True}
                pending.append(entry)
                continue
            writer.submit_prepared(entry, h.spool.write_filtered, pump)
            pending.append(entry)  # completed (path, bytes) by the writer
        out = writer.finish(pump)
        for t in out["tables"]:  # tells the merge to take those values from the old key's row
            lost = window.lost_toast.get(f"{t['schema']}.{t['table']}")
            if lost:
                t[KEY_MOVES_FIELD] = lost["updates"]
        for (schema, table), refused in window.refused.items():
            out["tables"].append({"schema": schema, "table": table, "rows": 0, "bytes": 0,
                                  "relation_versions": [], REFUSED_FIELD: refused})
        _fault("after-parts")
        # before anything is committed or confirmed: the publications still cover the pipeline
        # (dropped or altered during the window?); the query also proves the catalog session,
        # and with it the slot lock, is alive
        pubs = check_publications(sql, publications, pipeline or (), slot=slot, forget=forget)
        for what, tables in (("dropped", pubs.dropped), ("forgotten (--forget-table)", pubs.forgotten)):
            if tables:
                log.warning("slot %s: window %d: table(s) %s left the pipeline: %s; their Delta tables "
                            "keep their last state", slot, seq, ", ".join(f"{a}.{b}" for a, b in tables), what)
        manifest = WindowManifest(
            slot=slot, window_seq=seq, start_lsn=str(start), end_lsn=str(window_end),
            end_reason=reason or "until_lsn", transactions=window.transactions,
            rows=sum(t["rows"] for t in out["tables"]), bytes=out["bytes"], tables=tuple(out["tables"]),
            truncates=tuple(window.truncates), origins=tuple(window.origins),
            skipped_transactions=asm.skipped_transactions,
            messages={"transactional": window.n_messages[0], "non_transactional": window.n_messages[1],
                      "parts": out["messages_parts"]},
            prepared={"pending": pending, "committed": window.committed_prepared,
                      "rolled_back": window.rolled_back_prepared},
            streamed={"committed": asm.streamed_committed, "aborted": asm.streamed_aborted},
            timings={"started_at": started_at.isoformat(), "finished_at": datetime.now(UTC).isoformat(),
                     "receive_seconds": round(receive_seconds, 3),
                     "finish_seconds": round(time.monotonic() - fin_t0, 3)},
            first_commit_lsn=str(window.first_commit) if window.first_commit is not None else None,
            last_commit_lsn=str(window.last_commit) if window.last_commit is not None else None,
            system_id=ident.systemid, timeline=ident.timeline, snapshot_id=snapshot_id,
            publications=tuple(publications), pipeline_tables=tuple(sorted(pubs.covered)), attempt=attempt,
            extra=partition_leaves(sql, pubs.covered, client=client, layout=layout, slot=slot, seq=seq),
        )
        if not _while_pumping(lambda: writer.commit(manifest), pump):
            try:
                _while_pumping(lambda: writer.discard(manifest), pump)
            except Exception as exc:  # only garbage: the committed window does not list them
                log.warning("slot %s: window %d: could not remove this attempt's parts: %s", slot, seq, exc)
            raise WindowConflict(
                f"window {seq} of slot {slot} was committed by another drain meanwhile "
                f"(s3://{layout.bucket}/{layout.window_manifest(slot, seq)}); this drain's parts are "
                "removed and nothing was acknowledged",
                hint="runs of one slot must not overlap; the committed window stands",
            )
        _fault("after-manifest")
        try:
            swept = _while_pumping(lambda: writer.sweep(manifest), pump)
            if swept:
                log.info("slot %s: window %d: removed %d object(s) of attempts that did not commit", slot, seq, swept)
        except Exception as exc:  # committed: leftovers are garbage no reader lists
            log.warning("slot %s: window %d: could not remove other attempts' objects: %s", slot, seq, exc)
        conn.confirm(window_end)
        _fault("after-ack")
        try:
            conn.stop()
        except Exception as exc:  # the window is committed and acknowledged: only log
            log.warning("slot %s: ending the stream: %s", slot, exc)
    except BaseException:
        writer.abort()
        raise
    finally:
        asm.close()
    log.info("slot %s: window %d committed [%s, %s) %s: %d transactions, %d rows, %.1f MB",
             slot, seq, start, window_end, manifest.end_reason, manifest.transactions, manifest.rows,
             manifest.bytes / 1e6)
    for table, lost in window.lost_toast.items():
        log.warning(
            "slot %s: window %d: %d key-changing update(s) of %s left TOASTed column(s) %s unchanged "
            "(first at commit %s); without REPLICA IDENTITY FULL PostgreSQL sends neither those values "
            "nor the old row: the merge keeps them from the old key's row unless that key changed "
            "earlier in the same batch (then NULL); set REPLICA IDENTITY FULL on %s to be sure",
            slot, seq, lost["updates"], table, ", ".join(lost["columns"]), lost["first_commit_lsn"], table,
        )
    result.lost_toast = window.lost_toast
    result.window_seq = seq
    result.end_lsn = str(window_end)
    result.end_reason = manifest.end_reason
    result.transactions = manifest.transactions
    result.rows = manifest.rows
    result.bytes = manifest.bytes
    result.tables = manifest.table_rows
    result.manifest = layout.url(layout.window_manifest(slot, seq))
    result.seconds = time.monotonic() - t0
    return result


def _while_pumping(fn, pump, interval: float = 0.5):
    """Run ``fn()`` in a thread; meanwhile keep the replication connection alive."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            box["error"] = e

    th = threading.Thread(target=target, name="pgcdc-drain-io", daemon=True)
    th.start()
    while True:
        th.join(interval)
        if not th.is_alive():
            break
        pump()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _make_spool(base: str | None, slot: str) -> str:
    """This run's spool folder, ``{base}/pgcdc-spool-{slot}-{pid}-{random}`` (``base``: the
    system's temporary folder by default), removed when the run ends. A killed drain
    cannot remove its own (streamed transactions can spool gigabytes), so the next drain of
    the slot removes the folders of the slot whose process is gone."""
    base = base or tempfile.gettempdir()
    os.makedirs(base, exist_ok=True)
    prefix = f"pgcdc-spool-{slot}-"
    for name in os.listdir(base):
        pid = name[len(prefix):].split("-", 1)[0] if name.startswith(prefix) else ""
        if pid.isdigit() and not _alive(int(pid)):
            log.info("removing the spool folder of a drain that died: %s", os.path.join(base, name))
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=base)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _emit_heartbeat(sql: psycopg.Connection) -> LSN | None:
    """Write the heartbeat message; returns its record's LSN (None if it failed)."""
    try:
        if sql.info.server_version >= 170000:
            row = sql.execute("SELECT pg_logical_emit_message(false, %s, ''::text, true)::text",
                              (HEARTBEAT_PREFIX,)).fetchone()
        else:
            row = sql.execute("SELECT pg_logical_emit_message(false, %s, ''::text)::text",
                              (HEARTBEAT_PREFIX,)).fetchone()
        return LSN.parse(row[0])
    except psycopg.Error as exc:  # e.g. a read-only standby: the drain just waits longer
        log.warning("heartbeat failed: %s", exc)
        return None
