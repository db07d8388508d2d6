"""The comparison of ``pgcdc verify``: two sides of Arrow batches, one 16-byte digest and a
rendered key per row, matched with a hash join on the key (or as a multiset), the first
``max_diffs`` differences of each kind rendered as PostgreSQL text (see the package
docstring)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_pgcdc.lake.types import DeltaTypeMismatch, from_delta_array, to_delta_type
from airflow_pgcdc.typemap.map import PgColumn, array_to_pg_text, arrow_field, format_type
from airflow_pgcdc.verify.delta import _delta_batches
from airflow_pgcdc.verify.results import (
    ChangedRow,
    ColumnDiff,
    Comparison,
    DuplicateKey,
    KeyColumnError,
    NoKey,
    TypeMismatch,
)

__all__ = [
    "Comparer",
    "compare_tables",
]

DEFAULT_MAX_DIFFS = 10


_DIGEST = 16


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

