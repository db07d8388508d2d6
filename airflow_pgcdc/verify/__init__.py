"""``pgcdc verify``: does a Delta table hold exactly what its PostgreSQL table holds?

Both sides become Arrow with the type map's types (``docs/types.md``):

* PostgreSQL: the table is read like the snapshot reads it (``describe_table`` →
  ``table_converter`` → ``COPY (SELECT …) TO STDOUT (FORMAT csv)`` →
  :class:`~airflow_pgcdc.changes.snapshot_copy.SnapshotDecoder`), in one ``REPEATABLE
  READ READ ONLY`` transaction, with the session settings the decoder relies on;
* Delta: the table at ``{delta_url}/{schema}.{table}`` (the store's segment encoding),
  read with delta-rs, each column brought back to the type map's type by
  :func:`airflow_pgcdc.merge.delta_types.from_delta_array` (``time`` is int64 µs in
  Delta); any other type difference is reported, not cast.

Rows are matched on the key (primary key or replica identity index, or the columns
given by the user); a table without one and no key given is compared as a multiset: rows
are matched on every column, equal rows by count (the k-th copy of a row on one side
with the k-th on the other). Values are compared exactly: fixed-width types (ints, floats,
decimals, dates, times, timestamps, bool) by their raw Arrow values, which both sides
hold in the same type (equal raw values ⟺ equal PostgreSQL text; every NaN counts as
PostgreSQL's one NaN), every other type through PostgreSQL's own text output of the
mapped value (:func:`~airflow_pgcdc.changes.typemap.array_to_pg_text`): ``1.50`` is not
``1.5`` in an unconstrained numeric, ``infinity`` is not the largest timestamp, NULL is
not ``''``, ``{1,NULL}`` is not ``{1}``. Per row only a 16-byte BLAKE2b digest of the
values and the rendered key are kept (memory: both tables in Arrow plus about 60 bytes
a row); keys are matched with an Arrow hash join, and only the first ``max_diffs``
differences of each kind are rendered, column by column, as PostgreSQL text.

The result says: row counts, keys only in PostgreSQL, keys only in Delta, keys whose
rows differ (with the columns and both values), keys that occur more than once on a
side, source columns missing from Delta or stored with another type (differences), and
columns only in Delta (a note: a column dropped in PostgreSQL stays in Delta).

A stored generated column is compared when the Delta table has it (a PostgreSQL 18
publication with ``publish_generated_columns = stored`` or a column list naming it streams
it, and the snapshot copies it), and left out otherwise, as the snapshot and the stream
leave it out (before PostgreSQL 18 always; a virtual column always).

The library never imports Airflow or Spark.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_pgcdc.changes.typemap import PgColumn, array_to_pg_text, arrow_field, format_type
from airflow_pgcdc.errors import HintedError, is_secret_name, redact
from airflow_pgcdc.merge.delta_types import DeltaTypeMismatch, from_delta_array, to_delta_type

__all__ = [
    "ChangedRow",
    "ColumnDiff",
    "Comparer",
    "Comparison",
    "DeltaReadError",
    "DeltaTableNotFound",
    "DuplicateKey",
    "KeyColumnError",
    "NoKey",
    "SourceTableNotFound",
    "TypeMismatch",
    "VerifyError",
    "VerifyResult",
    "compare_tables",
    "delta_table_location",
    "open_delta_table",
    "resolve_key",
    "verify_table",
]

DEFAULT_MAX_DIFFS = 10
VALUE_CHARS = 1000
"""Rendered values in a result are cut to this many characters (their length is kept)."""

DELTA_BATCH_ROWS = 65_536
_DIGEST = 16


# --------------------------------------------------------------------------- errors


class VerifyError(HintedError):
    """``pgcdc verify`` cannot compare; ``hint`` says what to do."""


class SourceTableNotFound(VerifyError):
    """The PostgreSQL table does not exist."""


class DeltaTableNotFound(VerifyError):
    """There is no Delta table where the table's should be."""


class DeltaReadError(VerifyError):
    """The Delta table exists but cannot be read (storage, protocol)."""


class NoKey(VerifyError):
    """The table has no primary key or replica identity index and no key was given."""


class KeyColumnError(VerifyError):
    """A key column that the table (or the Delta table) does not have, or cannot match on."""


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class ColumnDiff:
    """One differing column of a changed row: PostgreSQL's text output of each side's
    value (None: NULL), cut to :data:`VALUE_CHARS` characters; ``*_chars`` are the
    uncut lengths (None for NULL)."""

    column: str
    postgres: str | None
    delta: str | None
    postgres_chars: int | None = None
    delta_chars: int | None = None

    @classmethod
    def of(cls, column: str, postgres: str | None, delta: str | None) -> ColumnDiff:
        return cls(
            column, _cut(postgres), _cut(delta),
            None if postgres is None else len(postgres), None if delta is None else len(delta),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"postgres": self.postgres, "delta": self.delta}
        for side in ("postgres", "delta"):
            n = getattr(self, f"{side}_chars")
            if n is not None and n > len(getattr(self, side)):
                out[f"{side}_chars"] = n  # the value was cut
        return out


@dataclass(frozen=True)
class ChangedRow:
    key: dict[str, str | None]
    columns: tuple[ColumnDiff, ...]


@dataclass(frozen=True)
class DuplicateKey:
    side: str  # "postgres" | "delta"
    key: dict[str, str | None]
    count: int


@dataclass(frozen=True)
class TypeMismatch:
    column: str
    pg_type: str  # the PostgreSQL type, as format_type prints it
    expected: str  # the Arrow type Delta should have (the Delta form of the type map's)
    found: str


@dataclass(frozen=True)
class Comparison:
    """What :func:`compare_tables` found (pure data; see :class:`VerifyResult`)."""

    key_columns: tuple[str, ...]
    compared_columns: tuple[str, ...]
    postgres_rows: int
    delta_rows: int
    only_in_postgres: int
    only_in_delta: int
    changed: int
    duplicate_keys_postgres: int
    duplicate_keys_delta: int
    missing_in_delta: tuple[str, ...]  # source columns the Delta table lacks
    type_mismatches: tuple[TypeMismatch, ...]
    delta_only_columns: tuple[str, ...]  # a note, not a difference
    sample_only_in_postgres: tuple[dict[str, str | None], ...]
    sample_only_in_delta: tuple[dict[str, str | None], ...]
    sample_changed: tuple[ChangedRow, ...]
    sample_duplicates: tuple[DuplicateKey, ...]
    max_diffs: int

    @property
    def equal(self) -> bool:
        return not (
            self.only_in_postgres
            or self.only_in_delta
            or self.changed
            or self.duplicate_keys_postgres
            or self.duplicate_keys_delta
            or self.missing_in_delta
            or self.type_mismatches
            or self.postgres_rows != self.delta_rows
        )


@dataclass(frozen=True)
class VerifyResult:
    """:func:`verify_table`'s answer: the comparison plus where both sides came from."""

    table: str  # schema.table
    postgres: str  # the DSN, redacted
    delta_url: str
    key_source: str  # "primary key" | "replica identity index" | "given" | MULTISET
    comparison: Comparison
    postgres_lsn: str | None = None  # the server's WAL position when the table was read
    delta_version: int | None = None
    delta_last_commit: dict[str, Any] = field(default_factory=dict)

    @property
    def equal(self) -> bool:
        return self.comparison.equal

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``pgcdc verify --json``)."""
        c = self.comparison
        return {
            "table": self.table,
            "result": "EQUAL" if self.equal else "DIFFERENT",
            "equal": self.equal,
            "postgres": {"dsn": self.postgres, "rows": c.postgres_rows, "lsn": self.postgres_lsn},
            "delta": {
                "url": self.delta_url,
                "rows": c.delta_rows,
                "version": self.delta_version,
                "last_commit": self.delta_last_commit,
            },
            "key": {"columns": list(c.key_columns), "source": self.key_source},
            "compared_columns": list(c.compared_columns),
            "counts": {
                "only_in_postgres": c.only_in_postgres,
                "only_in_delta": c.only_in_delta,
                "changed": c.changed,
                "duplicate_keys_postgres": c.duplicate_keys_postgres,
                "duplicate_keys_delta": c.duplicate_keys_delta,
            },
            "schema": {
                "missing_in_delta": list(c.missing_in_delta),
                "type_mismatches": [vars(m) for m in c.type_mismatches],
                "delta_only_columns": list(c.delta_only_columns),
            },
            "max_diffs": c.max_diffs,
            "only_in_postgres": [dict(k) for k in c.sample_only_in_postgres],
            "only_in_delta": [dict(k) for k in c.sample_only_in_delta],
            "changed": [
                {"key": dict(r.key), "columns": {d.column: d.to_dict() for d in r.columns}}
                for r in c.sample_changed
            ],
            "duplicate_keys": [vars(d) for d in c.sample_duplicates],
        }


# --------------------------------------------------------------------------- the comparison


def _cut(text: str | None, limit: int = VALUE_CHARS) -> str | None:
    return text if text is None or len(text) <= limit else text[:limit]


def _fixed_width(t: pa.DataType) -> bool:
    """Types compared by their raw Arrow values (equal values ⟺ equal PostgreSQL text):
    ints, floats (NaN made canonical), decimals, dates, times, timestamps, bool."""
    return (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_decimal(t)
        or pa.types.is_temporal(t) and not pa.types.is_duration(t) and not pa.types.is_interval(t)
        or pa.types.is_boolean(t)
    )


def _raw_rows(arrays: Sequence[pa.Array]) -> list[bytes]:
    """Per row, the bytes of the fixed-width values of ``arrays`` (validity, then values;
    a NULL's value bytes are zeros)."""
    import numpy as np

    n = len(arrays[0])
    valid = []
    values = []
    for a in arrays:
        t = a.type
        if pa.types.is_boolean(t):
            a = a.cast(pa.uint8())
        elif pa.types.is_floating(t):  # every NaN is the one NaN PostgreSQL has
            a = pc.if_else(pc.is_nan(a), pa.scalar(float("nan"), t), a)
        width = a.type.bit_width // 8
        ok = a.is_valid().to_numpy(zero_copy_only=False)
        buf = a.buffers()[1]
        data = np.frombuffer(buf, dtype=np.uint8)[a.offset * width : (a.offset + n) * width].reshape(n, width)
        if a.null_count:
            data = data.copy()
            data[~ok] = 0
        valid.append(ok.astype(np.uint8).reshape(n, 1))
        values.append(data)
    m = np.ascontiguousarray(np.hstack(valid + values))
    return m.view(f"V{m.shape[1]}").ravel().tolist()


_encode_key = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _render_keys(arrays: Sequence[pa.Array], columns: Sequence[PgColumn]) -> pa.Array:
    """Per row, the key as a JSON list of PostgreSQL texts (``["1","x"]``; NULL: ``null``):
    one string that joins and sorts, and reads back as the key's values."""
    if all(pa.types.is_integer(a.type) for a in arrays):  # the common case, vectorised
        parts: list[Any] = []
        for a in arrays:
            quoted = pc.binary_join_element_wise('"', a.cast(pa.string()), '"', "")
            parts.append(pc.fill_null(quoted, "null"))
        return pc.binary_join_element_wise("[", pc.binary_join_element_wise(*parts, ","), "]", "")
    texts = [array_to_pg_text(a, c) for a, c in zip(arrays, columns, strict=True)]
    if len(texts) == 1:
        return pa.array([_encode_key([v]) for v in texts[0]], pa.string())
    return pa.array([_encode_key(list(k)) for k in zip(*texts, strict=True)], pa.string())


class _Side:
    """One side's rows: the Arrow batches (compared columns, type map types) and, per
    row, the rendered key (JSON list of texts) and a 16-byte digest of every value: raw
    bytes for fixed-width types, PostgreSQL text for the others."""

    def __init__(self, columns: Sequence[PgColumn], key_idx: Sequence[int]) -> None:
        self.columns = list(columns)
        self.key_idx = list(key_idx)
        types = [arrow_field(c).type for c in self.columns]
        self.fixed_idx = [i for i, t in enumerate(types) if _fixed_width(t)]
        self.text_idx = [i for i, t in enumerate(types) if not _fixed_width(t)]
        self.batches: list[pa.RecordBatch] = []
        self.keys: list[pa.Array] = []
        self.digests: list[pa.Array] = []
        self.rows = 0
        self._table: pa.Table | None = None

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        cols = self.columns
        keys = _render_keys([batch.column(i) for i in self.key_idx], [cols[i] for i in self.key_idx])
        blake = hashlib.blake2b
        texts = [array_to_pg_text(batch.column(i), cols[i]) for i in self.text_idx]
        if self.fixed_idx:
            raw = _raw_rows([batch.column(i) for i in self.fixed_idx])
            if texts:
                digests = [
                    blake(r + repr(t).encode(), digest_size=_DIGEST).digest()
                    for r, t in zip(raw, zip(*texts, strict=True), strict=True)
                ]
            else:
                digests = [blake(r, digest_size=_DIGEST).digest() for r in raw]
            del raw
        else:
            digests = [blake(repr(t).encode(), digest_size=_DIGEST).digest() for t in zip(*texts, strict=True)]
        del texts
        self.batches.append(batch)
        self.keys.append(keys)
        self.digests.append(pa.array(digests, pa.binary()))
        self.rows += batch.num_rows
        self._table = None

    def index(self, suffix: str) -> pa.Table:
        return pa.table({
            "__k": pa.chunked_array(self.keys, pa.string()),
            f"__h{suffix}": pa.chunked_array(self.digests, pa.binary()),
            f"__r{suffix}": pa.array(range(self.rows), pa.int64()) if self.rows else pa.array([], pa.int64()),
        })

    def table(self) -> pa.Table:
        if self._table is None:
            schema = pa.schema([arrow_field(c) for c in self.columns])
            self._table = pa.Table.from_batches(self.batches, schema=schema)
        return self._table

    def render(self, rows: pa.Array) -> list[list[str | None]]:
        """The rendered values of rows (global indices): one list per column."""
        taken = self.table().take(rows)
        return [array_to_pg_text(taken.column(i), c) for i, c in enumerate(self.columns)]


def _key_dict(key_columns: Sequence[str], key_text: str) -> dict[str, str | None]:
    # a multiset's key is the rendered row, a newline and its occurrence (see _numbered)
    return dict(zip(key_columns, json.loads(key_text.partition("\n")[0]), strict=True))


def _numbered(keys: pa.ChunkedArray) -> pa.Array:
    """Each rendered row with its occurrence among equal rows (``<row>\\n<n>``, n from 1;
    a rendered key is JSON, without a raw newline): the k-th copy of a row on one side
    matches the k-th copy on the other, so duplicates compare by count."""
    seen: dict[str, int] = {}
    out = []
    for k in keys.to_pylist():
        n = seen[k] = seen.get(k, 0) + 1
        out.append(f"{k}\n{n}")
    return pa.array(out, pa.string())


def _sorted_positions(table: pa.Table, key_columns: Sequence[str], keys: pa.ChunkedArray) -> pa.Array:
    """Order of ``table``'s rows by its key columns' values (by the rendered key when
    the key's types cannot be sorted, e.g. arrays)."""
    try:
        return pc.sort_indices(table.select(list(key_columns)), [(k, "ascending") for k in key_columns])
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
        return pc.sort_indices(keys)


class Comparer:
    """Incremental comparison: :meth:`add_postgres` then :meth:`add_delta` batches (in
    any number, either order), then :meth:`result`.

    ``columns``: the source table's columns (the type map's view); PostgreSQL batches
    carry them with their mapped types. ``delta_schema``: the Delta table's Arrow
    schema; Delta batches are in Delta storage form (``time`` as int64 µs) and must hold
    :attr:`delta_columns` (the projection to read). ``key``: the columns rows are
    matched on. ``multiset`` (a table without a key): rows are matched on every compared
    column, and equal rows by count (``key`` is ignored): a row twice in PostgreSQL and
    once in Delta is one row only in PostgreSQL.
    """

    def __init__(
        self,
        columns: Sequence[PgColumn],
        key: Sequence[str],
        delta_schema: pa.Schema,
        *,
        max_diffs: int = DEFAULT_MAX_DIFFS,
        table: str | None = None,
        multiset: bool = False,
    ) -> None:
        self.multiset = multiset
        if multiset:
            key = ()  # every compared column, below
        if max_diffs < 0:
            raise ValueError("max_diffs must be >= 0")
        self.table = table or "the table"
        self.max_diffs = max_diffs
        names = [c.name for c in columns]
        missing_key = [k for k in key if k not in names]
        if missing_key:
            raise KeyColumnError(
                f"key column(s) {', '.join(missing_key)} not in {self.table} (columns: {', '.join(names)})",
                hint="give existing column names with --key a,b",
            )
        if not key and not multiset:
            raise NoKey(f"no key columns to match rows of {self.table} on", hint="give them with --key a,b")
        self.key = tuple(key)
        self.delta_schema = delta_schema
        delta_names = set(delta_schema.names)
        self.missing = tuple(n for n in names if n not in delta_names)
        self.delta_only = tuple(n for n in delta_schema.names if n not in set(names))
        mismatches = []
        compared = []
        for c in columns:
            if c.name not in delta_names:
                continue
            f = arrow_field(c)
            found = delta_schema.field(c.name).type
            try:
                from_delta_array(pa.nulls(0, found), f)
            except DeltaTypeMismatch:
                mismatches.append(TypeMismatch(
                    c.name, format_type(c.type, c.typmod, c.ndims), str(to_delta_type(f.type)), str(found)
                ))
                continue
            compared.append(c)
        self.mismatches = tuple(mismatches)
        if multiset:
            self.key = tuple(c.name for c in compared)
            if not self.key:
                raise NoKey(f"no column of {self.table} to compare rows on", hint="check the Delta table")
        bad_key = [k for k in self.key if k in self.missing or any(m.column == k for m in mismatches)]
        if bad_key:
            raise KeyColumnError(
                f"key column(s) {', '.join(bad_key)} of {self.table} missing from the Delta table "
                "or stored with another type: rows cannot be matched",
                hint="check that --delta points at this table's Delta table, or give another --key",
            )
        self.columns = compared
        self.fields = [arrow_field(c) for c in compared]
        key_idx = [[c.name for c in compared].index(k) for k in self.key]
        self.pg = _Side(compared, key_idx)
        self.delta = _Side(compared, key_idx)

    @property
    def delta_columns(self) -> list[str]:
        """The Delta columns to read."""
        return [c.name for c in self.columns]

    def add_postgres(self, batch: pa.RecordBatch | pa.Table) -> None:
        for b in _batches(batch):
            arrays = []
            for f in self.fields:
                a = b.column(f.name)
                if a.type != f.type:
                    raise TypeError(f"PostgreSQL column {f.name}: expected {f.type}, got {a.type}")
                arrays.append(a)
            self.pg.add(pa.RecordBatch.from_arrays(arrays, schema=pa.schema(self.fields)))

    def add_delta(self, batch: pa.RecordBatch | pa.Table) -> None:
        for b in _batches(batch):
            arrays = [from_delta_array(b.column(f.name), f) for f in self.fields]
            self.delta.add(pa.RecordBatch.from_arrays(arrays, schema=pa.schema(self.fields)))

    # ---- result

    def _duplicates(self, index: pa.Table, side: str) -> tuple[pa.Array, list[DuplicateKey]]:
        counts = index.group_by("__k").aggregate([("__k", "count")])
        dup = counts.filter(pc.greater(counts["__k_count"], 1))
        if dup.num_rows == 0:
            return pa.array([], pa.string()), []
        order = pc.sort_indices(dup["__k"])
        dup = dup.take(order)
        sample = [
            DuplicateKey(side, _key_dict(self.key, k), n)
            for k, n in zip(
                dup["__k"].slice(0, self.max_diffs).to_pylist(),
                dup["__k_count"].slice(0, self.max_diffs).to_pylist(),
                strict=True,
            )
        ]
        return dup["__k"].combine_chunks(), sample

    def result(self) -> Comparison:
        pg_index = self.pg.index("p")
        dl_index = self.delta.index("d")
        if self.multiset:
            pg_index = pg_index.set_column(0, "__k", _numbered(pg_index["__k"]))
            dl_index = dl_index.set_column(0, "__k", _numbered(dl_index["__k"]))
        dup_pg, sample_dup_pg = self._duplicates(pg_index, "postgres")
        dup_dl, sample_dup_dl = self._duplicates(dl_index, "delta")
        dups = pa.concat_arrays([dup_pg, dup_dl])
        if len(dups):
            pg_index = pg_index.filter(pc.invert(pc.is_in(pg_index["__k"], value_set=dups)))
            dl_index = dl_index.filter(pc.invert(pc.is_in(dl_index["__k"], value_set=dups)))
        joined = pg_index.join(dl_index, keys="__k", join_type="full outer")
        only_pg = joined.filter(pc.is_null(joined["__rd"]))
        only_dl = joined.filter(pc.is_null(joined["__rp"]))
        both = joined.filter(pc.and_(pc.is_valid(joined["__rp"]), pc.is_valid(joined["__rd"])))
        changed = both.filter(pc.not_equal(both["__hp"], both["__hd"]))

        n = self.max_diffs
        pg_table = self.pg.table() if (only_pg.num_rows or changed.num_rows) else None
        dl_table = self.delta.table() if only_dl.num_rows else None

        def first_keys(part: pa.Table, rows_col: str, table: pa.Table | None) -> pa.Table:
            if part.num_rows == 0 or n == 0:
                return part.slice(0, 0)
            keyed = table.select(list(self.key)).take(part[rows_col])
            order = _sorted_positions(keyed, self.key, part["__k"])
            return part.take(order.slice(0, n))

        sample_pg = first_keys(only_pg, "__rp", pg_table)
        sample_dl = first_keys(only_dl, "__rd", dl_table)
        sample_ch = first_keys(changed, "__rp", pg_table)
        changed_rows = []
        if sample_ch.num_rows:
            pg_vals = self.pg.render(sample_ch["__rp"])
            dl_vals = self.delta.render(sample_ch["__rd"])
            for r, key_text in enumerate(sample_ch["__k"].to_pylist()):
                diffs = tuple(
                    ColumnDiff.of(c.name, pg_vals[i][r], dl_vals[i][r])
                    for i, c in enumerate(self.columns)
                    if pg_vals[i][r] != dl_vals[i][r]
                )
                changed_rows.append(ChangedRow(_key_dict(self.key, key_text), diffs))
        return Comparison(
            key_columns=self.key,
            compared_columns=tuple(c.name for c in self.columns),
            postgres_rows=self.pg.rows,
            delta_rows=self.delta.rows,
            only_in_postgres=only_pg.num_rows,
            only_in_delta=only_dl.num_rows,
            changed=changed.num_rows,
            duplicate_keys_postgres=len(dup_pg),
            duplicate_keys_delta=len(dup_dl),
            missing_in_delta=self.missing,
            type_mismatches=self.mismatches,
            delta_only_columns=self.delta_only,
            sample_only_in_postgres=tuple(_key_dict(self.key, k) for k in sample_pg["__k"].to_pylist()),
            sample_only_in_delta=tuple(_key_dict(self.key, k) for k in sample_dl["__k"].to_pylist()),
            sample_changed=tuple(changed_rows),
            sample_duplicates=tuple(sample_dup_pg + sample_dup_dl),
            max_diffs=n,
        )


def _batches(data: pa.RecordBatch | pa.Table) -> Iterator[pa.RecordBatch]:
    if isinstance(data, pa.Table):
        yield from data.to_batches()
    else:
        yield data


def compare_tables(
    postgres: pa.Table | Iterable[pa.RecordBatch],
    delta: pa.Table | pa.RecordBatchReader | Any,
    *,
    columns: Sequence[PgColumn],
    key: Sequence[str],
    max_diffs: int = DEFAULT_MAX_DIFFS,
    table: str | None = None,
    multiset: bool = False,
) -> Comparison:
    """Compare a source table's rows (``postgres``: a Table or RecordBatches with the
    type map's types for ``columns``) with its Delta table's (``delta``: a Table, a
    RecordBatchReader or a ``pyarrow.dataset.Dataset`` in Delta storage form), matching
    rows on ``key`` (``multiset``: on every column, equal rows by count). Pure: no I/O
    besides reading ``delta``."""
    comparer = Comparer(columns, key, delta.schema, max_diffs=max_diffs, table=table, multiset=multiset)
    for batch in [postgres] if isinstance(postgres, pa.Table) else postgres:
        comparer.add_postgres(batch)
    for batch in _delta_batches(delta, comparer.delta_columns):
        comparer.add_delta(batch)
    return comparer.result()


def _delta_batches(delta: Any, names: list[str]) -> Iterator[pa.RecordBatch]:
    if isinstance(delta, pa.Table):
        yield from delta.select(names).to_batches()
    elif isinstance(delta, pa.RecordBatchReader):
        yield from delta
    else:  # a pyarrow dataset
        yield from delta.to_batches(columns=names, batch_size=DELTA_BATCH_ROWS)


# --------------------------------------------------------------------------- the Delta side


def delta_table_location(delta_url: str, schema: str, table: str) -> str:
    """``{delta_url}/{schema}.{table}``: where the merge keeps the table (one rule, the merge's)."""
    from airflow_pgcdc.merge.plan import delta_table_url

    return delta_table_url(delta_url, schema, table)


def _storage_options(url: str, storage_options: Mapping[str, str] | None) -> dict[str, str] | None:
    if storage_options is not None:
        return dict(storage_options)
    if url.startswith("s3://"):
        from airflow_pgcdc.store.s3 import S3Location, delta_storage_options

        S3Location.parse(url)  # a clear error for a malformed URL
        return delta_storage_options()
    return None


def _scrub(text: str, options: Mapping[str, str] | None) -> str:
    return redact(text, [v for k, v in (options or {}).items() if is_secret_name(k)])


_HINT_DELTA = (
    "--delta is the Delta root (e.g. s3://bucket/lake), the table's Delta table is at "
    "<root>/<schema>.<table>; S3 endpoint and keys come from AWS_ENDPOINT_URL, "
    "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY"
)


def open_delta_table(
    delta_url: str, schema: str, table: str, *, storage_options: Mapping[str, str] | None = None
):
    """``(DeltaTable, location)`` of ``schema.table``'s Delta table under ``delta_url``
    (S3 options from the environment for ``s3://`` URLs unless given). Raises
    :class:`DeltaTableNotFound` or :class:`DeltaReadError`."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    location = delta_table_location(delta_url, schema, table)
    options = _storage_options(location, storage_options)
    try:
        return DeltaTable(location, storage_options=options), location
    except TableNotFoundError:
        raise DeltaTableNotFound(
            f"no Delta table at {location} (for {schema}.{table})",
            hint=_HINT_DELTA + "; has the merge run for this table?",
        ) from None
    except Exception as e:  # storage errors: wrong endpoint, keys, bucket
        msg = _scrub(str(e).strip().splitlines()[0] if str(e).strip() else "", options)
        raise DeltaReadError(
            f"cannot open the Delta table at {location}: {type(e).__name__}: {msg}", hint=_HINT_DELTA
        ) from None


def _delta_source(dt, names: list[str]):
    """A dataset of the Delta table, or (tables with deletion vectors or column mapping,
    which pyarrow datasets cannot read) a RecordBatchReader from delta-rs' SQL engine."""
    from deltalake.exceptions import DeltaProtocolError

    try:
        return dt.to_pyarrow_dataset()
    except DeltaProtocolError:
        return _delta_query(dt, names)


def _delta_query(dt, names: list[str]) -> pa.RecordBatchReader:
    from deltalake import QueryBuilder

    from airflow_pgcdc.merge.clauses import quote_ident

    cols = ", ".join(quote_ident(n, "delta-rs") for n in names) if names else "1"
    reader = QueryBuilder().register("t", dt).execute(f"SELECT {cols} FROM t")
    return pa.RecordBatchReader.from_stream(reader)


_COMMIT_STANDARD = {
    "operationParameters", "operationMetrics", "engineInfo", "clientVersion", "readVersion",
    "isBlindAppend", "isolationLevel", "txnId",
}


def _last_commit(dt) -> dict[str, Any]:
    try:
        history = dt.history(1)
    except Exception:
        return {}
    if not history:
        return {}
    info = {k: v for k, v in history[0].items() if k not in _COMMIT_STANDARD}
    ts = info.get("timestamp")
    if isinstance(ts, int):
        info["timestamp"] = datetime.fromtimestamp(ts / 1000, UTC).isoformat()
    return info


# --------------------------------------------------------------------------- the PostgreSQL side


MULTISET = "no key: every column, equal rows by count"


def resolve_key(info, key: Sequence[str] | None) -> tuple[tuple[str, ...], str]:
    """``(key columns, source)`` for a :class:`~airflow_pgcdc.pg.tables.TableInfo`: the
    given columns (``"given"``), else the replica identity index or primary key."""
    names = [c.name for c in info.columns]
    if key:
        unknown = [k for k in key if k not in names]
        if unknown:
            raise KeyColumnError(
                f"key column(s) {', '.join(unknown)} not in {info.display} "
                f"(columns: {', '.join(names)})",
                hint="--key takes column names exactly as PostgreSQL spells them, comma-separated",
            )
        return tuple(key), "given"
    if info.key_columns:
        return tuple(info.key_columns), info.key_source or "primary key"
    raise NoKey(
        f"table {info.display} has no primary key or replica identity index: rows cannot be matched",
        hint="give the columns that identify a row with --key a,b",
    )


def _read_postgres(dsn: str, schema: str, table: str, key: Sequence[str] | None, delta_schema: pa.Schema,
                   comparer_kw: dict) -> tuple[Comparer, str, str | None]:
    import psycopg

    from airflow_pgcdc.pg.errors import ConnectionFailed
    from airflow_pgcdc.pg.tables import TableNotFound, describe_table
    from airflow_pgcdc.snapshot.convert import SESSION_SETUP, table_converter

    try:
        conn = psycopg.connect(dsn, autocommit=True)
    except psycopg.Error as e:
        raise ConnectionFailed(f"cannot connect to {redact(dsn)}: {str(e).strip()}") from None
    with conn:
        for stmt in SESSION_SETUP:
            conn.execute(stmt)
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            info = describe_table(conn, schema, table, generated=True)
        except TableNotFound:
            raise SourceTableNotFound(
                f"table {schema}.{table} does not exist in database {conn.info.dbname!r}",
                hint='--table takes schema.table; quote names with dots or capitals: \'s."Odd.Name"\'',
            ) from None
        # a stored generated column is compared when the Delta table has it (a PostgreSQL 18
        # publication streams it, and the snapshot copied it: pg/tables.py), else left out
        # as the snapshot and the stream leave it out
        info = dataclasses.replace(info, columns=tuple(
            c for c in info.columns if not c.generated or c.name in delta_schema.names))
        try:
            key_columns, key_source = resolve_key(info, key)
            multiset = False
        except NoKey:  # a table without a key: its rows as a multiset (duplicates by count)
            key_columns, key_source, multiset = (), MULTISET, True
        conv = table_converter(conn, info)
        comparer = Comparer(conv.columns, key_columns, delta_schema, table=info.display, multiset=multiset,
                            **comparer_kw)
        lsn = conn.execute(
            "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
            "ELSE pg_current_wal_lsn() END)::text"
        ).fetchone()[0]
        sql = f"COPY (SELECT {conv.select_list} FROM {info.from_clause}) TO STDOUT {conv.copy_options}"
        decoder = conv.decoder()
        with conn.cursor().copy(sql) as copy:
            for batch in decoder.decode_stream(copy):
                comparer.add_postgres(batch)
        conn.execute("COMMIT")
    return comparer, key_source, lsn


def verify_table(
    dsn: str,
    delta_url: str,
    schema: str,
    table: str,
    *,
    key: Sequence[str] | None = None,
    max_diffs: int = DEFAULT_MAX_DIFFS,
    storage_options: Mapping[str, str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> VerifyResult:
    """Compare PostgreSQL table ``schema.table`` (``dsn``) with its Delta table under
    ``delta_url`` (``s3://bucket/lake`` or a local path), matching rows on ``key`` (default:
    the replica identity index or primary key). Returns a :class:`VerifyResult`; raises
    a :class:`VerifyError` subclass (with a ``hint``) when it cannot compare.
    ``progress`` is called with a short message at each phase."""

    say = progress or (lambda _m: None)

    dt, location = open_delta_table(delta_url, schema, table, storage_options=storage_options)
    try:
        delta_schema = pa.schema(dt.schema().to_arrow())
        version = dt.version()
    except Exception as e:
        raise DeltaReadError(f"cannot read the Delta table at {location}: {type(e).__name__}: {e}") from None
    say(f"reading {schema}.{table} from PostgreSQL ({redact(dsn)})")
    comparer, key_source, lsn = _read_postgres(
        dsn, schema, table, key, delta_schema, {"max_diffs": max_diffs}
    )
    say(f"read {comparer.pg.rows} rows; reading {location} (version {version})")
    try:
        source = _delta_source(dt, comparer.delta_columns)
        for batch in _delta_batches(source, comparer.delta_columns):
            comparer.add_delta(batch)
    except DeltaTypeMismatch as e:  # a data file that does not hold the table's types
        raise DeltaReadError(f"cannot read the Delta table at {location}: {e}") from None
    except OSError as e:
        raise DeltaReadError(
            f"cannot read the Delta table at {location}: "
            f"{_scrub(str(e), _storage_options(location, storage_options))}",
            hint=_HINT_DELTA,
        ) from None
    say(f"read {comparer.delta.rows} rows; comparing")
    return VerifyResult(
        table=f"{schema}.{table}",
        postgres=redact(dsn),
        delta_url=location,
        key_source=key_source,
        comparison=comparer.result(),
        postgres_lsn=lsn,
        delta_version=version,
        delta_last_commit=_last_commit(dt),
    )

