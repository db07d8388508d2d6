"""A batch's change rows compacted on the driver, in Arrow: what :func:`~airflow_pgcdc.merge.compact.compact`
does with Spark, for a batch small enough to hold in memory (most tables of most windows:
a few changed rows each). No Spark job, no staged files: the parts are read with pyarrow,
compacted here and handed to delta-rs' MERGE as one Arrow table.

The rules are :mod:`~airflow_pgcdc.merge.compact`'s, step for step (truncate, key-changing
updates and their ``D`` rows, stale moves under ``REPLICA IDENTITY FULL``, unchanged TOAST
values, last change per key, ``rekey``); ``tests/integration/test_compact_paths.py`` runs
both on random batches and requires equal results. Python sees only what the rules
compare (keys, positions, operations, TOAST lists; whole rows only to tell a stale move
apart): the values themselves stay in Arrow and are gathered by index, so values Python
has no type for (a ``±infinity`` timestamp) pass through untouched. A key Python cannot
compare raises :class:`NotOnDriver` and the caller uses Spark.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from airflow_pgcdc.changes.columns import COMMIT_LSN as LSN
from airflow_pgcdc.changes.columns import MATCH_PREFIX, OLD_PREFIX, OP, SEQ
from airflow_pgcdc.changes.columns import UNCHANGED_TOAST as TOAST
from airflow_pgcdc.merge.clauses import keep_column
from airflow_pgcdc.merge.spark_io import conformed_batches

__all__ = ["DRIVER_BYTES", "DRIVER_ROWS", "NotOnDriver", "compact_table", "read_table"]

DRIVER_ROWS = 20_000
"""Default of ``pgcdc merge --driver-rows``: a table's batch of at most this many change rows
is compacted on the driver (this module); a larger one by Spark. A copied table (bootstrap,
resync) of at most this many rows and :data:`DRIVER_BYTES` is read by the driver too."""

DRIVER_BYTES = 64 << 20
"""The most Parquet bytes of a copied table the driver reads itself (see :data:`DRIVER_ROWS`)."""


class NotOnDriver(Exception):
    """This batch holds values the driver's compaction cannot compare: Spark compacts it."""


_NAN = object()  # Spark groups and compares NaN as one value; Python's NaN equals nothing


def _comparable(column: pa.ChunkedArray | pa.Array) -> list:
    """``column``'s values as hashable Python values that are equal where Spark's are:
    temporal values as their integer (no calendar limits), NaN as one value, nested
    values as tuples."""
    t = column.type
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    if pa.types.is_temporal(t) and t.bit_width in (32, 64):
        as_int = pa.int32() if t.bit_width == 32 else pa.int64()
        return [v for c in chunks for v in c.view(as_int).to_pylist()]
    try:
        values = [v for c in chunks for v in c.to_pylist()]
    except (ValueError, OverflowError, pa.ArrowException) as exc:
        raise NotOnDriver(f"a {t} value Python cannot hold ({exc})") from None
    if pa.types.is_floating(t):
        return [_NAN if isinstance(v, float) and math.isnan(v) else v for v in values]
    if pa.types.is_nested(t):
        return [_frozen(v) for v in values]
    return values


def _frozen(v):
    if isinstance(v, float) and math.isnan(v):
        return _NAN
    if isinstance(v, dict):
        return tuple((k, _frozen(x)) for k, x in v.items())
    if isinstance(v, list | tuple):
        return tuple(_frozen(x) for x in v)
    return v


def read_table(fs, paths: Sequence[str], schema: pa.Schema) -> pa.Table:
    """Parquet files (``bucket/key`` paths) as one table conformed to ``schema`` (as the Spark
    reader does: missing columns NULL, types cast)."""
    return pa.Table.from_batches([b for path in paths for b in conformed_batches(fs, path, schema)], schema=schema)


@dataclass(slots=True)
class _Row:
    key: tuple
    lsn: int
    seq: int
    op: str
    toast: frozenset
    moved: bool
    move_d: bool
    at: int  # the row of the extended table whose values it carries
    origin: tuple | None = None  # a moved row: its old key


def compact_table(
    table: pa.Table,
    *,
    table_columns: Sequence[str],
    key_columns: Sequence[str],
    toast_columns: Sequence[str] = (),
    truncate_at: tuple[int, int] | None = None,
    rekey: bool = False,
) -> pa.Table:
    """The compacted batch, as :func:`~airflow_pgcdc.merge.compact.compact` returns it:
    ``table_columns``, ``_pgcdc_op``, ``_pgcdc_commit_lsn``, ``_pgcdc_seq``, the
    ``_pgcdc_keep_<c>`` flags, and with ``rekey`` the ``_pgcdc_match_<k>`` columns (in that
    order; row order unspecified)."""
    cols = list(table_columns)
    keys = list(key_columns)
    if not keys:
        raise ValueError("the driver's compaction needs key columns")
    toast_cols = [t for t in toast_columns if t not in keys]
    n = table.num_rows
    ops = table[OP].to_pylist()
    lsns = table[LSN].to_pylist()
    seqs = table[SEQ].to_pylist()
    toasts = [frozenset(t) for t in table[TOAST].to_pylist()]
    key_values = list(zip(*[_comparable(table[k]) for k in keys], strict=True)) if n else []
    olds = [OLD_PREFIX + k for k in keys]
    has_olds = all(o in table.column_names for o in olds)
    old_values = list(zip(*[_comparable(table[o]) for o in olds], strict=True)) if has_olds and n else []
    full = all(OLD_PREFIX + x in table.column_names for x in cols)

    # steps 1 and 2 (compact.ordered_changes): after the truncate; a move adds its old key's D row
    rows: list[_Row] = []
    moved_at: list[int] = []
    for i in range(n):
        if truncate_at is not None and (lsns[i], seqs[i]) <= tuple(truncate_at):
            continue
        moved = False
        if has_olds and ops[i] == "U":
            old = old_values[i]
            moved = all(v is not None for v in old) and old != key_values[i]
        rows.append(_Row(key_values[i], lsns[i], seqs[i], ops[i], toasts[i], moved, False, i,
                         old_values[i] if moved else None))
        if moved:
            rows.append(_Row(old_values[i], lsns[i], seqs[i], "D", frozenset(), False, True, n + len(moved_at)))
            moved_at.append(i)
    ext = _extended(table, cols, keys, full, moved_at)
    groups: dict[tuple, list[_Row]] = {}
    for r in rows:
        groups.setdefault(r.key, []).append(r)
    for g in groups.values():
        g.sort(key=lambda r: (r.lsn, r.seq, r.move_d))
    if full and moved_at:
        _drop_stale_moves(groups, ext, cols)

    # steps 3 and 4: per key, the last change, its unchanged TOAST values resolved
    last_rows: list[tuple[_Row, dict[str, int | None], _Row]] = []
    for g in groups.values():
        if not g:
            continue
        first, last = g[0], g[-1]
        resolved: dict[str, int | None] = {}
        for x in toast_cols:
            found = None
            for r in reversed(g):
                first_moved = rekey and r is first and r.moved
                boundary = r.moved and not (first_moved and x in r.toast)
                if (x not in r.toast and r.op in ("I", "U")) or boundary:
                    found = r.at
                    break
            resolved[x] = found
        last_rows.append((last, resolved, first))

    match_at: list[int] = []
    if rekey:
        last_rows, match_at = _rekeyed(last_rows)
    return _output(ext, table, cols, keys, toast_cols, last_rows, match_at if rekey else None)


def _extended(table: pa.Table, cols: list[str], keys: list[str], full: bool, moved_at: list[int]) -> pa.Table:
    """The batch's table columns, followed by one row per move: its old key's ``D`` row (the
    key from ``_pgcdc_old_<k>``; the other columns the old row's under FULL, else NULL)."""
    taken = pa.array(moved_at, pa.int64())
    out = {}
    for x in cols:
        column = table[x]
        if not moved_at:
            out[x] = column
            continue
        if x in keys or full:
            extra = table[OLD_PREFIX + x].take(taken).cast(column.type)
        else:
            extra = pa.chunked_array([pa.nulls(len(moved_at), column.type)])
        out[x] = pa.chunked_array(list(column.chunks) + list(extra.chunks), type=column.type)
    return pa.table(out)


def _drop_stale_moves(groups: dict[tuple, list[_Row]], ext: pa.Table, cols: list[str]) -> None:
    """compact._without_stale_moves: a move's D row goes when the key's latest earlier upsert
    is in the same transaction (same commit LSN) and is another row (other values)."""
    values = [_comparable(ext[x]) for x in cols]

    def row(at: int) -> tuple:
        return tuple(v[at] for v in values)

    for key, g in groups.items():
        prev = None
        kept = []
        for r in g:
            stale = r.move_d and prev is not None and prev.lsn == r.lsn and row(prev.at) != row(r.at)
            if not stale:
                kept.append(r)
            if r.op != "D":
                prev = r
        groups[key] = kept


def _rekeyed(last_rows):
    """compact._rekeyed on the per-key last rows: a key whose history starts with a move from
    a key A whose only change is that move's D row is matched on A (and A's D row dropped)."""
    alone = {(r.key, r.lsn, r.seq): r for r, _res, first in last_rows if r.move_d and first is r}
    taken = set()
    match_at = []
    for r, _res, first in last_rows:
        source = None
        if first.moved and all(v is not None for v in first.origin):
            source = alone.get((first.origin, first.lsn, first.seq))
        match_at.append(source.at if source is not None else r.at)
        if source is not None:
            taken.add((source.key, source.lsn, source.seq))
    kept, kept_match = [], []
    for item, m in zip(last_rows, match_at, strict=True):
        r = item[0]
        if r.move_d and (r.key, r.lsn, r.seq) in taken:
            continue
        kept.append(item)
        kept_match.append(m)
    return kept, kept_match


def _output(ext: pa.Table, table: pa.Table, cols, keys, toast_cols, last_rows, match_at) -> pa.Table:
    own = pa.array([r.at for r, _res, _f in last_rows], pa.int64())
    arrays, fields = [], []
    for x in cols:
        if x in toast_cols:
            index = pa.array([
                res[x] if (x in r.toast and res[x] is not None) else r.at for r, res, _f in last_rows
            ], pa.int64())
        else:
            index = own
        arrays.append(ext[x].take(index))
        fields.append(table.schema.field(x))
    arrays += [
        pa.array([r.op for r, _res, _f in last_rows], pa.string()),
        pa.array([r.lsn for r, _res, _f in last_rows], pa.int64()),
        pa.array([r.seq for r, _res, _f in last_rows], pa.int64()),
    ]
    fields += [table.schema.field(OP), table.schema.field(LSN), table.schema.field(SEQ)]
    for x in toast_cols:
        arrays.append(pa.array([x in r.toast and res[x] is None and r.op != "D" for r, res, _f in last_rows],
                               pa.bool_()))
        fields.append(pa.field(keep_column(x), pa.bool_()))
    if match_at is not None:
        index = pa.array(match_at, pa.int64())
        for k in keys:
            arrays.append(ext[k].take(index))
            fields.append(table.schema.field(k).with_name(MATCH_PREFIX + k))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))
