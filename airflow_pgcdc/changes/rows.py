"""Change rows: committed changes of one relation version → Arrow record batches.

A *relation version* is one definition of a published table as pgoutput's Relation
message describes it (schema, name, replica identity, columns with type OID, typmod
and key flag). A schema change mid-window gives the table a new version, hence new
part files (see :mod:`airflow_pgcdc.store.window`).

The columns of a change row (a public contract, see ``DESIGN.md``):

* the table's columns, in order, typed by the shared type map
  (:mod:`airflow_pgcdc.typemap`): for ``I`` and ``U`` the new row; for ``D``
  the old row as the server sent it (the replica identity key with the other
  columns NULL, or the full old row under ``REPLICA IDENTITY FULL``);
* ``_pgcdc_old_<column>`` for every column flagged as part of the replica identity
  (all columns under ``REPLICA IDENTITY FULL``, none under ``NOTHING``), same type:
  set on an ``U`` row when the server sent the old key (``K``, the update changed
  the key) or the old row (``O``, REPLICA IDENTITY FULL), NULL otherwise (and always
  NULL on ``I`` and ``D`` rows, whose table columns already hold what is known);
* ``_pgcdc_op`` (string ``I``/``U``/``D``), ``_pgcdc_commit_lsn`` (int64, the commit
  record's LSN), ``_pgcdc_seq`` (int64, order of the change within the window, over
  every table, truncates and transactional messages), ``_pgcdc_xid`` (int64, the
  top-level transaction id), ``_pgcdc_commit_ts`` (timestamp[us, UTC]),
  ``_pgcdc_unchanged_toast`` (list<string>: columns whose value was not sent because
  it is an unchanged TOASTed value; the column itself is NULL in the row). Under
  REPLICA IDENTITY FULL an unchanged TOAST value is taken from the old row when the
  old row has it, and is then not listed.

LSNs are int64 (readers that lack unsigned 64-bit integers, Spark, read them as is;
PostgreSQL LSNs stay far below 2^63).

Memory: a :class:`ChangeBuffer` keeps raw pgoutput tuples only until ``take()``; the
caller converts each taken :class:`ChangeChunk` (a few thousand rows) with
:meth:`RelationVersion.to_batch`, so nothing grows with the window.
"""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import chain, repeat

import numpy as np
import pyarrow as pa

from airflow_pgcdc.changes.columns import (
    COMMIT_LSN,
    COMMIT_TS,
    OLD_PREFIX,
    OP,
    SEQ,
    XID,
)
from airflow_pgcdc.changes.columns import UNCHANGED_TOAST as UNCHANGED_TOAST_COLUMN
from airflow_pgcdc.protocol.pgoutput import UNCHANGED_TOAST, PgoutputDecoder
from airflow_pgcdc.protocol.pgtypes import PgColumn, format_type
from airflow_pgcdc.typemap import arrays
from airflow_pgcdc.typemap.decode.tuples import TupleDecoder
from airflow_pgcdc.typemap.map import TypeMapError, ValueConversionError
from airflow_pgcdc.typemap.privacy import TableRules

__all__ = [
    "META_FIELDS",
    "OLD_PREFIX",
    "ChangeBuffer",
    "ChangeChunk",
    "RelationVersion",
    "definition_key",
    "old_column_name",
]

META_FIELDS: tuple[pa.Field, ...] = (
    pa.field(OP, pa.string(), nullable=False),
    pa.field(COMMIT_LSN, pa.int64(), nullable=False),
    pa.field(SEQ, pa.int64(), nullable=False),
    pa.field(XID, pa.int64(), nullable=False),
    pa.field(COMMIT_TS, pa.timestamp("us", tz="UTC"), nullable=True),
    pa.field(UNCHANGED_TOAST_COLUMN, pa.list_(pa.string()), nullable=False),
)
META_NAMES = frozenset(f.name for f in META_FIELDS)
"""The metadata columns of a change part; a table column may not be named so (nor start
with ``_pgcdc_old_``); any other name, ``_pgcdc_``-prefixed ones included, is the user's."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_INSERTS = PgoutputDecoder(1)  # Insert messages outside a stream block (stateless for them)


MISSING_VALUES_FIELD = "missing_values"
REWRITTEN_FIELD = "rewritten_columns"
PII_FIELD = "pii"  # a column written under a rule (hash, mask:N); an excluded column is not listed
# a relation version's table file and its columns' identities (optional: older windows,
# and a column renamed or dropped before the drain read the catalog, have none)
RELFILENODE_FIELD = "relfilenode"
ATTNUM_FIELD = "attnum"
ATTXMIN_FIELD = "attxmin"
"""A relation version's columns whose existing rows a table rewrite filled, which no
change carries: ``[{name, expression}]`` (absent when none; see the drain)."""


def decode_missing_values(text: str) -> pa.RecordBatch:
    """A relation version's ``missing_values`` (see :meth:`RelationVersion.encode_missing_values`)."""
    with pa.ipc.open_stream(base64.b64decode(text)) as r:
        return r.read_next_batch()


def old_column_name(column: str) -> str:
    """``_pgcdc_old_<column>``: the old value of a replica-identity column."""
    return OLD_PREFIX + column


class ColumnNameClash(TypeMapError):
    """A table column whose name collides with a ``_pgcdc_`` metadata column."""


def definition_key(schema: str, table: str, replica_identity: str, columns, key_flags) -> tuple:
    """A relation's definition as :meth:`RelationVersion.same_definition` compares it
    (names, types, typmods, array dimensions, key flags, replica identity)."""
    return (schema, table, replica_identity, tuple(key_flags),
            tuple((c.name, c.type.oid, c.typmod, c.ndims) for c in columns))


@dataclass(frozen=True, eq=False)
class RelationVersion:
    """One definition of a table in a window: ``version`` counts from 0 per table and
    window, in the order the definitions were first used."""

    relation_oid: int
    schema: str
    table: str
    replica_identity: str
    columns: tuple[PgColumn, ...]
    key_flags: tuple[bool, ...]
    version: int = 0
    # {column: text}: what rows older than an ADD COLUMN … DEFAULT read (attmissingval)
    missing_values: dict[str, str] | None = field(default=None, compare=False)
    # {column: default or generation expression}: its existing rows were filled by a
    # table rewrite (a volatile default, a stored generated column): no change carries them
    rewritten: dict[str, str] | None = field(default=None, compare=False)
    # (relfilenode, {column: (attnum, xmin of its pg_attribute row)}) as the drain read the
    # catalog: how the merge follows columns by identity (see merge/columns.py)
    identity: tuple[int, dict[str, tuple[int, str]]] | None = field(default=None, compare=False)
    # the table's column rules (excluded, hashed, masked columns: typemap/privacy.py), applied
    # to every batch before it is written
    privacy: TableRules | None = field(default=None, compare=False)
    decoder: TupleDecoder = field(init=False, repr=False)
    old_decoder: TupleDecoder | None = field(init=False, repr=False)
    old_indexes: tuple[int, ...] = field(init=False, repr=False)
    schema_arrow: pa.Schema = field(init=False, repr=False)

    def __post_init__(self) -> None:
        display = f"{self.schema}.{self.table}"
        names = {c.name for c in self.columns}
        old_idx = tuple(i for i, k in enumerate(self.key_flags) if k)
        clash = [n for n in names if n in META_NAMES or n.startswith(OLD_PREFIX)]
        if clash:
            raise ColumnNameClash(
                f"table {display}: column(s) {sorted(clash)} have the name of airflow-pgcdc's "
                f"change metadata ({', '.join(sorted(META_NAMES))}, {OLD_PREFIX}*)"
            )
        dec = TupleDecoder(self.columns, table=display)
        old_cols = [self.columns[i] for i in old_idx]
        old_dec = TupleDecoder(old_cols, table=display) if old_cols else None
        rules = self.privacy
        if rules is not None:
            # a FULL identity flags every column; its merge key is checked by the snapshot
            rules.check(self.columns, () if self.replica_identity == "f" else
                        [c.name for c, k in zip(self.columns, self.key_flags, strict=True) if k])
            fields = list(rules.schema(self.columns))
            fields += [rules.field(c).with_name(old_column_name(c.name)) for c in old_cols
                       if c.name not in rules.excluded]
        else:
            fields = list(dec.schema)
            if old_dec is not None:
                fields += [f.with_name(old_column_name(f.name)) for f in old_dec.schema]
        fields += list(META_FIELDS)
        object.__setattr__(self, "decoder", dec)
        object.__setattr__(self, "old_decoder", old_dec)
        object.__setattr__(self, "old_indexes", old_idx)
        object.__setattr__(self, "schema_arrow", pa.schema(fields))

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def old_columns(self) -> list[str]:
        """The ``_pgcdc_old_*`` columns' source names (an excluded column has none)."""
        gone = self.privacy.excluded if self.privacy is not None else ()
        return [self.columns[i].name for i in self.old_indexes if self.columns[i].name not in gone]

    def describe(self) -> dict:
        """The manifest's description of this version."""
        relfilenode, ids = self.identity if self.identity is not None else (None, {})
        rules = self.privacy.rules if self.privacy is not None else {}
        return {
            "version": self.version,
            "relation_oid": self.relation_oid,
            "replica_identity": self.replica_identity,
            **({RELFILENODE_FIELD: relfilenode} if relfilenode else {}),
            "columns": [
                {
                    "name": c.name,
                    "pg_type": format_type(c.type, c.typmod, c.ndims),
                    "type_oid": c.type.oid,
                    "typmod": c.typmod,
                    "key": k,
                    **({ATTNUM_FIELD: ids[c.name][0], ATTXMIN_FIELD: ids[c.name][1]} if c.name in ids else {}),
                    **({PII_FIELD: str(rules[c.name])} if c.name in rules else {}),
                }
                for c, k in zip(self.columns, self.key_flags, strict=True)
                if c.name not in rules or rules[c.name].action != "exclude"
            ],
            "old_columns": [old_column_name(n) for n in self.old_columns],
            **self._missing_entry(),
            **({REWRITTEN_FIELD: [{"name": n, "expression": e} for n, e in self.rewritten.items()]}
               if self.rewritten else {}),
        }

    def _missing_entry(self) -> dict:
        if not self.missing_values:
            return {}
        try:
            encoded = self.encode_missing_values()
        except Exception as exc:  # noqa: BLE001 - a default the type map cannot read: rows read NULL
            logging.getLogger(__name__).warning(
                "%s: cannot record the ADD COLUMN default(s) %s (%s): rows older than the column "
                "will read NULL in Delta", self.qualified_name, sorted(self.missing_values), exc)
            return {}
        return {MISSING_VALUES_FIELD: encoded} if encoded else {}

    def encode_missing_values(self) -> str | None:
        """:attr:`missing_values` decoded with this version's own types, as one Arrow IPC
        row in base64 (exact for every type; the manifest's ``missing_values``)."""
        values = {n: v for n, v in (self.missing_values or {}).items()}
        rules = self.privacy
        idx = [i for i, c in enumerate(self.columns)
               if c.name in values and (rules is None or c.name not in rules.excluded)]
        if not idx:
            return None
        arrays_ = [self.decoder.decode_column(i, [values[self.columns[i].name]])[0] for i in idx]
        if rules is not None:  # a default is a value like any other: written as the rule says
            cols = [self.columns[i] for i in idx]
            batch = pa.RecordBatch.from_arrays(rules.apply(cols, arrays_), schema=rules.schema(cols))
        else:
            batch = pa.RecordBatch.from_arrays(arrays_, schema=pa.schema([self.decoder.schema.field(i) for i in idx]))
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as w:
            w.write_batch(batch)
        return base64.b64encode(sink.getvalue().to_pybytes()).decode("ascii")

    @property
    def definition(self) -> tuple:
        """What makes two versions the same definition (:func:`definition_key`)."""
        return definition_key(self.schema, self.table, self.replica_identity, self.columns, self.key_flags)

    def same_definition(self, other: RelationVersion) -> bool:
        return self.definition == other.definition

    def to_batch(self, chunk: ChangeChunk) -> pa.RecordBatch:
        """Convert a taken chunk to a record batch of :attr:`schema_arrow`. Inserts and
        new-row-only updates added as received (:meth:`ChangeBuffer.add_raw`) are decoded
        here: a chunk of them only by :meth:`TupleDecoder.decode_raw_inserts`, else (or
        when that declines) one by one."""
        n = len(chunk.ops)
        decoded = None
        images = chunk.images
        if chunk.raw:
            if chunk.raw == n:
                decoded = self.decoder.decode_raw_inserts(images, row_offset=chunk.first_seq)
            if decoded is None:
                decode = _INSERTS.decode
                images = [decode(m).new if type(m) is bytes else m for m in images]
        if decoded is None:
            decoded = self.decoder.decode(images, row_offset=chunk.first_seq)
        rules = self.privacy
        if rules is None:
            out = list(decoded.batch.columns)
            if self.old_decoder is not None:
                out += self._old_columns(chunk.olds, n, chunk.first_seq)
        else:  # nothing leaves here but what the rules let through
            out = rules.apply(self.columns, decoded.batch.columns)
            if self.old_decoder is not None:
                olds = [self.columns[i] for i in self.old_indexes]
                out += rules.apply(olds, self._old_columns(chunk.olds, n, chunk.first_seq))
        ops = "".join(chunk.ops).encode("ascii")  # one character each: I, U or D
        out += [
            pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(np.arange(n + 1, dtype=np.int32)),
                                                   pa.py_buffer(ops)]),
            arrays.ints(chunk.commit_lsns),
            arrays.ints(chunk.seqs),
            arrays.ints(chunk.xids),
            arrays.ints(chunk.commit_ts_us, META_FIELDS[4].type),
            decoded.unchanged_toast,
        ]
        assert len(ops) == n and all(len(a) == n for a in out)
        return pa.RecordBatch.from_arrays(out, schema=self.schema_arrow)

    def _old_columns(self, olds: list[tuple | None], n: int, row_offset: int) -> list[pa.Array]:
        """The ``_pgcdc_old_*`` columns: the replica-identity columns of the old key or
        old row where the server sent one (an unchanged TOAST value in it: NULL), else
        NULL."""
        dec = self.old_decoder
        assert dec is not None
        if olds.count(None) == n:  # inserts, deletes, updates that kept their key
            return [arrays.nulls(n, f.type) for f in dec.schema]
        width = len(self.columns)
        nulls = (None,) * width
        if not set(map(len, filter(None, olds))) <= {width}:
            raise ValueConversionError(
                f"an old row does not have the relation's {width} columns", table=self.qualified_name,
            )
        flat = list(chain.from_iterable(nulls if o is None else o for o in olds))
        columns = []
        for i in self.old_indexes:
            values = flat[i::width]
            if UNCHANGED_TOAST in values:
                values = [None if v is UNCHANGED_TOAST else v for v in values]
            columns.append(values)
        return list(dec.decode_columns(columns, n, row_offset=row_offset).batch.columns)


@dataclass(slots=True)
class ChangeChunk:
    """Raw change rows of one relation version, in window order."""

    ops: list[str]
    images: list[tuple]
    olds: list[tuple | None]
    commit_lsns: list[int]
    seqs: list[int]
    xids: list[int]
    commit_ts_us: list[int | None]
    nbytes: int
    raw: int = 0  # images that are Insert messages as received (bytes), not decoded tuples

    @property
    def first_seq(self) -> int:
        return self.seqs[0] if self.seqs else 0

    def __len__(self) -> int:
        return len(self.ops)


def ts_us(ts: datetime | None) -> int | None:
    if ts is None:
        return None
    d = ts - _EPOCH
    return (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds


ROW_OVERHEAD = 48
"""Bytes a buffered change is counted beyond its values' (or message's) bytes."""


class ChangeBuffer:
    """Collects change rows of one relation version until :meth:`take`."""

    __slots__ = ("version", "_chunk", "rows", "nbytes")

    def __init__(self, version: RelationVersion) -> None:
        self.version = version
        self.rows = 0  # total rows ever added
        self.nbytes = 0  # approximate bytes of the raw values buffered now
        self._chunk = self._new()

    @staticmethod
    def _new() -> ChangeChunk:
        return ChangeChunk([], [], [], [], [], [], [], 0)

    def add(
        self,
        op: str,
        image: tuple,
        old: tuple | None,
        commit_lsn: int,
        seq: int,
        xid: int,
        commit_ts_us: int | None,
        nbytes: int = 0,
    ) -> None:
        """Add one change; ``nbytes`` is its size (the pgoutput message's length will do)."""
        if old is not None and op == "U" and self.version.replica_identity == "f" and UNCHANGED_TOAST in image:
            # REPLICA IDENTITY FULL: the old row may hold the value that was not resent
            image = tuple(
                o if (v is UNCHANGED_TOAST and o is not UNCHANGED_TOAST) else v
                for v, o in zip(image, old, strict=False)
            ) + image[len(old):]
        c = self._chunk
        c.ops.append(op)
        c.images.append(image)
        c.olds.append(old)
        c.commit_lsns.append(commit_lsn)
        c.seqs.append(seq)
        c.xids.append(xid)
        c.commit_ts_us.append(commit_ts_us)
        size = nbytes + ROW_OVERHEAD
        c.nbytes += size
        self.nbytes += size
        self.rows += 1

    def add_raw_insert(self, message: bytes, commit_lsn: int, seq: int, xid: int, commit_ts_us: int | None,
                       nbytes: int | None = None) -> None:
        """Add an insert as the pgoutput Insert message received (outside a stream block):
        decoded when the chunk is converted (:meth:`RelationVersion.to_batch`); ``nbytes``
        its size as :meth:`add` counts it (default: the message's length)."""
        self.add_raw(message, "I", commit_lsn, seq, xid, commit_ts_us, nbytes)

    def add_raw(self, message: bytes, op: str, commit_lsn: int, seq: int, xid: int, commit_ts_us: int | None,
                nbytes: int | None = None) -> None:
        """Add a change as the pgoutput message received: an Insert (``op`` ``I``) or an
        Update that carries only its new row (``U``, OID, ``N``; ``op`` ``U``), outside a
        stream block; as :meth:`add_raw_insert` otherwise."""
        c = self._chunk
        c.ops.append(op)
        c.images.append(message)
        c.olds.append(None)
        c.commit_lsns.append(commit_lsn)
        c.seqs.append(seq)
        c.xids.append(xid)
        c.commit_ts_us.append(commit_ts_us)
        c.raw += 1
        size = (len(message) if nbytes is None else nbytes) + ROW_OVERHEAD
        c.nbytes += size
        self.nbytes += size
        self.rows += 1

    def raw_run_lists(self) -> tuple[list, list]:
        """The open chunk's lists of messages and ops, for a run of raw changes appended
        to them by the receive loop's native path (:meth:`add_raw_run` completes them)."""
        c = self._chunk
        return c.images, c.ops

    def add_raw_run(self, k: int, nbytes: int, commit_lsn: int, seq: int, xid: int,
                    commit_ts_us: int | None) -> None:
        """Complete ``k`` changes whose messages and ops were just appended to
        :meth:`raw_run_lists` (``nbytes``: their messages' bytes), numbered from ``seq``:
        what ``k`` calls of :meth:`add_raw` would have done."""
        c = self._chunk
        c.olds.extend(repeat(None, k))
        c.commit_lsns.extend(repeat(commit_lsn, k))
        c.seqs.extend(range(seq, seq + k))
        c.xids.extend(repeat(xid, k))
        c.commit_ts_us.extend(repeat(commit_ts_us, k))
        c.raw += k
        size = nbytes + ROW_OVERHEAD * k
        c.nbytes += size
        self.nbytes += size
        self.rows += k

    def __len__(self) -> int:
        return len(self._chunk.ops)

    def take(self) -> ChangeChunk:
        chunk, self._chunk = self._chunk, self._new()
        self.nbytes = 0
        return chunk
