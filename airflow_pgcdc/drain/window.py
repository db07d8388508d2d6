"""The window being built: :class:`WindowSink`, the
:class:`~airflow_pgcdc.changes.assembly.Sink` that turns one window's transactions into
change rows, relation versions and parts (handed to the
:class:`~airflow_pgcdc.store.window.WindowWriter`), and :class:`TypeResolver`, the
catalog lookups it needs (types outside the built-in set, array dimensions, ADD COLUMN
defaults). Part of the drain (:mod:`airflow_pgcdc.drain.drain`)."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

import psycopg

from airflow_pgcdc.changes.assembly import HeldPrepared, TxnInfo
from airflow_pgcdc.changes.columns import COMMIT_LSN, SEQ, XID
from airflow_pgcdc.changes.rows import (
    ChangeBuffer,
    ColumnNameClash,
    RelationVersion,
    definition_key,
    ts_us,
)
from airflow_pgcdc.pg.catalog import TypeNotFound, load_type_info
from airflow_pgcdc.protocol import pgoutput as po
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.pgoutput import UNCHANGED_TOAST
from airflow_pgcdc.protocol.pgtypes import PgColumn, PgTypeInfo, builtin_type
from airflow_pgcdc.store.privacy import SlotPrivacy
from airflow_pgcdc.store.window import TRUNCATE_RELATIONS, WindowWriter
from airflow_pgcdc.typemap.pgarray import parse_array_text
from airflow_pgcdc.typemap.privacy import PiiError

log = logging.getLogger("airflow_pgcdc.drain.drain")  # the drain's logger, one name for all its modules

HEARTBEAT_PREFIX = "pgcdc.heartbeat"
CHUNK_ROWS = 16_384
CHUNK_BYTES = 8 << 20
IDLE_ROWS = 16_384
"""A table's buffered rows go to the writer once the window has taken this many rows of
other tables since its last change (checked when the window switches tables), and the
writer encodes them at once (:meth:`WindowWriter.submit_rows`'s ``settle``): a window
touching hundreds of tables one after another encodes each while the next ones arrive,
instead of all of them after the last one (the finish)."""
MESSAGE_CHUNK = 1_000


_ATTRIBUTE_COLUMNS = (
    "a.attname::text, a.attndims, CASE WHEN a.atthasmissing THEN a.attmissingval::text END, "
    "t.typdelim::text, "
    "a.atthasdef AND NOT a.atthasmissing AND d.oid IS NOT NULL AND c.relfilenode > d.oid, "
    "a.attgenerated::text, left(pg_catalog.pg_get_expr(d.adbin, d.adrelid), 200), "
    "a.attnum::int, a.xmin::text, c.relfilenode::bigint "
)
_ATTRIBUTE_FROM = (
    "FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid "
    "JOIN pg_catalog.pg_class c ON c.oid = a.attrelid "
    "LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
)
PREFETCH_MAX_RELATIONS = 1_000
"""Past this many relations in the publications, :class:`TypeResolver` reads each
relation's attributes when it is first met instead of all of them at once (the prefetch
keeps every column's catalog row until its relation is met: a few MB at this bound)."""


class TypeResolver:
    """Catalog lookups of one drain. A relation's attributes (array dimensions, ADD COLUMN
    defaults, rewritten columns, the columns' identities) are read when the drain first needs them; when
    ``publications`` are given, that first need reads those of every relation the
    publications cover at once (one query instead of one per relation: a window touching
    500 tables made 500 round trips). A relation's prefetched attributes are used only if
    its Relation message's columns (name, type, typmod) are all among them; otherwise, and
    whenever a relation's Relation message changes shape after it was first met (DDL while
    the drain runs), that relation's attributes are read again on their own, as before."""

    def __init__(self, sql: psycopg.Connection, publications: tuple[str, ...] | list[str] = ()) -> None:
        self.sql = sql
        self.publications = tuple(publications)
        # relation OID -> (its columns {name: (type oid, typmod)}, its attribute rows),
        # read once for the whole publication (None: not read yet); an entry is used once
        self._prefetched: dict[int, tuple[dict[str, tuple[int, int]], list[tuple]]] | None = None
        self.queries = 0  # catalog round trips for attributes (the prefetch's two included)
        self.types: dict[int, PgTypeInfo] = {}
        self.names: dict[int, tuple[str, str]] = {}
        self.ndims: dict[int, dict[str, int]] = {}
        self.missing: dict[int, dict[str, str]] = {}
        self.rewritten_cols: dict[int, dict[str, str]] = {}
        # relation OID -> (its file, relfilenode; {column: (attnum, xmin of its pg_attribute row)})
        self.identities: dict[int, tuple[int, dict[str, tuple[int, str]]]] = {}
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

    def identity(self, relation_oid: int) -> tuple[int, dict[str, tuple[int, str]]]:
        """``(relfilenode, {column: (attnum, xmin)})``: the relation's file and each
        column's identity (its ``attnum``) and the transaction that last wrote its
        ``pg_attribute`` row, as the catalog has them when the drain reads it. The merge
        follows columns by ``attnum`` (a rename keeps it, a column dropped and added again
        under its name gets a new one) and sees a column altered by a statement that also
        rewrote the table (``ALTER COLUMN … TYPE … USING``: both its ``xmin`` and the
        ``relfilenode`` change) (:mod:`airflow_pgcdc.merge.columns`)."""
        m = self.identities.get(relation_oid)
        if m is None:
            self._load_attributes(relation_oid)
            m = self.identities[relation_oid]
        return m

    def refresh(self, relation_oid: int, shape: tuple) -> None:
        """Read the relation's attributes again at its next use if its Relation message's
        ``shape`` is not the one they were read for (DDL since)."""
        previous = self.shapes.get(relation_oid)
        if previous != shape:
            self.shapes[relation_oid] = shape
            if previous is not None and self._prefetched is not None:
                self._prefetched.pop(relation_oid, None)  # a new shape: read this relation alone
            self.ndims.pop(relation_oid, None)
            self.missing.pop(relation_oid, None)
            self.rewritten_cols.pop(relation_oid, None)
            self.identities.pop(relation_oid, None)

    def _load_attributes(self, relation_oid: int) -> None:
        rows = self._take_prefetched(relation_oid)
        if rows is None:
            self.queries += 1
            rows = [tuple(row) for row in self.sql.execute(
                "SELECT " + _ATTRIBUTE_COLUMNS + _ATTRIBUTE_FROM
                + "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
                (relation_oid,),
            ).fetchall()]
        self._store_attributes(relation_oid, rows)

    def _take_prefetched(self, relation_oid: int) -> list[tuple] | None:
        """The relation's attribute rows from the one query over the publications' relations
        (made now if not yet), if they describe the columns of its current Relation message;
        else None (the caller reads the relation alone)."""
        if not self.publications:
            return None
        if self._prefetched is None:
            try:
                self._prefetched = self._prefetch()
            except psycopg.Error as exc:  # only a shortcut: each relation is then read alone
                log.warning("could not read the attributes of the publications' relations at once (%s): "
                            "reading each relation's when it is first met", exc)
                self._prefetched = {}
        entry = self._prefetched.pop(relation_oid, None)
        shape = self.shapes.get(relation_oid)
        if entry is None or shape is None:
            return None
        columns, rows = entry
        for name, type_oid, typmod, *_ in shape[1]:
            if columns.get(name) != (type_oid, typmod):
                return None  # the catalog read is not this message's shape: read it again
        return rows

    def _prefetch(self) -> dict[int, tuple[dict[str, tuple[int, int]], list[tuple]]]:
        self.queries += 1
        relids = [r[0] for r in self.sql.execute(
            "SELECT DISTINCT c.oid::bigint FROM pg_catalog.pg_publication_tables p "
            "JOIN pg_catalog.pg_namespace n ON n.nspname = p.schemaname "
            "JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename "
            "WHERE p.pubname = ANY(%s)", (list(self.publications),),
        ).fetchall()]
        if not relids or len(relids) > PREFETCH_MAX_RELATIONS:
            return {}
        self.queries += 1
        found: dict[int, tuple[dict[str, tuple[int, int]], list[tuple]]] = {}
        for relid, typid, typmod, *row in self.sql.execute(
            "SELECT a.attrelid::bigint, a.atttypid::bigint, a.atttypmod, "
            + _ATTRIBUTE_COLUMNS + _ATTRIBUTE_FROM
            + "WHERE a.attrelid = ANY(%s::oid[]) AND a.attnum > 0 AND NOT a.attisdropped "
            "ORDER BY a.attrelid, a.attnum",
            (relids,),
        ).fetchall():
            columns, rows = found.setdefault(relid, ({}, []))
            columns[row[0]] = (typid, typmod)
            rows.append(tuple(row))
        return found

    def _store_attributes(self, relation_oid: int, rows: list[tuple]) -> None:
        """``rows``: every column of the relation (``_ATTRIBUTE_COLUMNS``), by attnum."""
        self.identities[relation_oid] = (
            int(rows[0][9]) if rows else 0, {row[0]: (int(row[7]), str(row[8])) for row in rows})
        self.ndims[relation_oid] = {row[0]: row[1] for row in rows if row[1] > 0}
        self.rewritten_cols[relation_oid] = {
            name: (f"GENERATED ALWAYS AS ({expr}) STORED" if generated == "s" else f"DEFAULT {expr}")
            for name, _, _, _, rewritten, generated, expr, *_ in rows if rewritten
        }
        missing = {}
        for name, ndims, stored, delimiter, *_ in rows:
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


class WindowSink:
    """The :class:`~airflow_pgcdc.changes.assembly.Sink` that builds one window."""

    def __init__(self, writer: WindowWriter, types: TypeResolver, pump, buffer_budget: int = 64 << 20,
                 as_text: Mapping[tuple[str, str], Collection[str]] | None = None,
                 privacy: SlotPrivacy | None = None) -> None:
        self.writer = writer
        # {(schema, table): columns} kept as exact text (the snapshot must have done the same)
        self.as_text = dict(as_text or {})
        self.privacy = privacy
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
        # the first and last commit's time (``commit_times`` in the manifest: replay to a time)
        self.commit_times: list[datetime | None] = [None, None]
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
        self._left_at: dict[int, int] = {}  # id(RelationVersion) -> self.rows when the window left it
        self._idle_checked = 0  # self.rows at the last look for idle tables
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
        key = _table_key(rel)
        schema = key[0]
        text = self.as_text.get(key, ())
        columns = tuple(
            PgColumn(c.name, self.types.type_of(c.type_oid), c.type_modifier, dims.get(c.name, 0), c.name in text)
            for c in rel.columns
        )
        key_flags = tuple(c.is_key for c in rel.columns)
        # compared without building a version (its decoders and Arrow schema) first
        definition = definition_key(schema, rel.relation_name, rel.replica_identity, columns, key_flags)
        versions = self.versions.setdefault(key, [])
        rv = next((v for v in versions if v.definition == definition), None)
        if rv is None:
            identity = self.types.identity(rel.relation_oid)
            rules = None if self.privacy is None else self.privacy.rules_for(
                schema, rel.relation_name, rel.relation_oid, {n: a for n, (a, _) in identity[1].items()})
            rv = RelationVersion(
                rel.relation_oid, schema, rel.relation_name, rel.replica_identity, columns,
                key_flags, version=len(versions),
                missing_values=self.types.missing_values(rel.relation_oid) or None,
                rewritten=self._rewritten(rel, columns),
                identity=identity, privacy=rules,
            )
            versions.append(rv)
            self.buffers[id(rv)] = ChangeBuffer(rv)
            self.writer.declare(rv, self.pump)
        self._by_rel[id(rel)] = (rel, rv)
        return rv

    def follow(self, rel: po.Relation) -> bool:
        """A relation version for ``rel`` (built from the catalog, with no change: see
        :func:`~airflow_pgcdc.drain.guards.follow_catalog`); True when it is a new one."""
        before = len(self.versions.get(_table_key(rel), ()))
        rv = self._version(rel)
        return rv.version >= before

    def _rewritten(self, rel: po.Relation, columns) -> dict[str, str] | None:
        """This version's columns whose existing rows a rewrite filled (see
        :meth:`TypeResolver.rewritten`), logged: the merge refuses them until a resync."""
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
        except (ColumnNameClash, PiiError) as exc:  # a rule that cannot hold: the table is refused,
            self._refuse(rel, exc)                  # its values never written
            return False
        if self._last_rv is not None:
            self._left_at[id(self._last_rv)] = self.rows
        self._last_rel, self._last_rv, self._last_buf = rel, rv, self.buffers[id(rv)]
        if self.rows - self._idle_checked >= IDLE_ROWS:
            self._idle_checked = self.rows
            self._hand_over_idle()
        return True

    def _hand_over_idle(self) -> None:
        """Give the writer the buffered rows of the tables left :data:`IDLE_ROWS` rows
        ago or more, to be encoded now (see :data:`IDLE_ROWS`)."""
        before = self.rows - IDLE_ROWS
        current = self._last_buf
        for versions in self.versions.values():
            for rv in versions:
                buf = self.buffers[id(rv)]
                if buf is not current and len(buf) and self._left_at.get(id(rv), 0) <= before:
                    self.buffered -= buf.nbytes
                    self.writer.submit_rows(rv, buf.take(), self.pump, settle=True)

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
        buf.add_raw(message, "I" if message[0] == 73 else "U", self._commit_lsn, self.seq,
                    self._txn.xid, self._ts, nbytes)  # type: ignore[union-attr]
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

    update_raw = insert_raw
    """An Update carrying only its new row, as received (``U``, OID, ``N``: no old key or
    row, so nothing :meth:`change` does for updates applies): kept like an insert."""

    def takes_runs_of(self, rel: po.Relation) -> bool:
        """True when ``rel``'s changes go to the current buffer (its last change was
        taken, not refused): a run of its raw changes may then be appended in bulk."""
        return rel is self._last_rel

    def run_target(self) -> tuple[list, list, int, int]:
        """Where a run of the current relation's raw changes goes: ``(messages, ops,
        rows_left, bytes_left)`` of its open chunk (:meth:`took_run` completes them)."""
        buf = self._last_buf
        images, ops = buf.raw_run_lists()
        return images, ops, CHUNK_ROWS - len(buf), CHUNK_BYTES - buf.nbytes

    def took_run(self, k: int, nbytes: int) -> None:
        """``k`` raw changes (``nbytes`` of messages) were appended to :meth:`run_target`:
        what ``k`` calls of :meth:`insert_raw` would have done."""
        buf = self._last_buf
        before = buf.nbytes
        buf.add_raw_run(k, nbytes, self._commit_lsn, self.seq, self._txn.xid, self._ts)  # type: ignore[union-attr]
        self.buffered += buf.nbytes - before
        self.seq += k
        rows = self.rows
        self.rows = rows + k
        if (rows + k) >> 10 != rows >> 10:  # as insert_raw: a status update every 1,024 rows
            self.pump()
        if buf.nbytes >= CHUNK_BYTES or len(buf) >= CHUNK_ROWS:
            self.buffered -= buf.nbytes
            self.writer.submit_rows(self._last_rv, buf.take(), self.pump)
        elif self.buffered > self.buffer_budget:
            self._flush_largest()

    def _refuse(self, rel: po.Relation, exc: Exception) -> None:
        key = _table_key(rel)
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
        versions = [self._version(r) for r in relations]
        self.truncates.append({
            "seq": self.seq, "xid": txn.xid, "commit_lsn": str(txn.commit_lsn),  # type: ignore[union-attr]
            "commit_time": txn.commit_ts.isoformat() if txn.commit_ts is not None else None,  # type: ignore[union-attr]
            "tables": [rv.qualified_name for rv in versions],  # text: for readers older than the pairs
            TRUNCATE_RELATIONS: [[rv.schema, rv.table] for rv in versions],
            "cascade": msg.cascade, "restart_identity": msg.restart_identity,
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
            self.commit_times[0] = txn.commit_ts
        self.last_commit = txn.commit_lsn
        self.commit_times[1] = txn.commit_ts
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


def _table_key(rel: po.Relation) -> tuple[str, str]:
    """``(schema, table)`` of a relation message, as the sink keys its tables (a relation
    without a namespace is in ``pg_catalog``)."""
    return rel.namespace or "pg_catalog", rel.relation_name
