"""What keeps a merge's cost with the batch, not the table (issue #14 §1).

* **Layout** (bootstrap and resync copy): the rows are written sorted by the merge key
  in files of about :data:`DEFAULT_TARGET_FILE_MB` (``--target-file-mb``), so a key range
  maps to few files and each file's min/max key statistics are narrow. Both engines
  rewrite only the target files that hold a matched row; with one file per table (the
  layout before), every merge rewrote the whole table.
* **Bounds** (merge): the ``ON`` condition also bounds the target's key by the batch's
  key ranges (:func:`key_ranges`, :func:`bounds_predicate`): ``t.k BETWEEN lo AND hi OR
  …``, at most :data:`MAX_RANGES` ranges split at the widest gaps between the batch's
  keys, so a few scattered keys do not widen one range to the whole table. Target-only
  conjuncts of the ``ON`` condition are what both engines prune target files by (their
  per-file min/max statistics): untouched files are not even scanned. Only for one
  integer key column (literals are then plain digits in either dialect); never for a
  batch with a truncate (its ``WHEN NOT MATCHED BY SOURCE THEN DELETE`` must see every
  target row) nor a rekeyed batch (its rows match on ``_pgcdc_match_<k>``).

Nothing here imports Spark or Airflow: the functions take plain values (a batch given as a
Spark DataFrame is asked through its own methods).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc

from airflow_pgcdc.lake.sizing import target_bytes
from airflow_pgcdc.lake.sql import quote_ident, quote_literal
from airflow_pgcdc.merge.clauses import MergeSpec

__all__ = ["MAX_RANGES", "bounded", "bounds_predicate", "file_count", "key_ranges", "prunable_key"]


MAX_RANGES = 32
"""At most this many key ranges in a merge's target bound."""


def prunable_key(key_columns: Sequence[str], types: dict[str, pa.DataType]) -> str | None:
    """The key column a bound can be put on: the only key column, when it is an integer."""
    if len(key_columns) != 1:
        return None
    t = types.get(key_columns[0])
    return key_columns[0] if t is not None and pa.types.is_integer(t) else None


def key_ranges(values: Sequence[int], max_ranges: int = MAX_RANGES) -> list[tuple[int, int]]:
    """``values`` (the batch's keys, any order, repeats allowed, no NULL) as at most
    ``max_ranges`` inclusive ranges ``(lo, hi)`` covering every value: split at the
    ``max_ranges - 1`` widest gaps between consecutive distinct values."""
    keys = sorted({int(v) for v in values})
    if not keys:
        return []
    if len(keys) <= max_ranges:
        return [(k, k) for k in keys]
    gaps = sorted(range(1, len(keys)), key=lambda i: keys[i] - keys[i - 1], reverse=True)[:max_ranges - 1]
    out, start = [], 0
    for i in sorted(gaps):
        out.append((keys[start], keys[i - 1]))
        start = i
    out.append((keys[start], keys[-1]))
    return out


def bounds_predicate(key: str, ranges: Sequence[tuple[int, int]], dialect: str, alias: str = "t") -> str | None:
    """``(t.k BETWEEN lo AND hi OR t.k = v …)`` for ``ranges`` (``None`` when empty: no
    bound). The column is quoted by :func:`~airflow_pgcdc.merge.clauses.quote_ident` for
    ``dialect``; the literals are Python ints rendered as digits (no other text)."""
    if not ranges:
        return None
    ref = f"{alias}.{quote_ident(key, dialect)}"
    parts = []
    for lo, hi in ranges:
        lo, hi = int(lo), int(hi)
        parts.append(f"{ref} = {lo}" if lo == hi else f"({ref} >= {lo} AND {ref} <= {hi})")
    return "(" + " OR ".join(parts) + ")"


MAX_PARTITIONS = 1000
"""A batch in more partitions than this is merged without the partition bound."""


def partition_values(rows, columns: Sequence[str], limit: int = MAX_PARTITIONS) -> dict[str, list] | None:
    """The distinct values of each of ``columns`` in the batch ``rows`` (an Arrow table, or a
    Spark DataFrame: one small job per column), or None when one has more than ``limit``."""
    out: dict[str, list] = {}
    for c in columns:
        try:
            if isinstance(rows, pa.Table):
                found = pc.unique(rows.column(c)).to_pylist()
            else:
                found = [r[0] for r in rows.select(quote_ident(c, "spark")).distinct().limit(limit + 1).collect()]
        except (OverflowError, ValueError):  # a value Python has none for (the date of 'infinity'): no bound
            return None
        if len(found) > limit:
            return None
        out[c] = found
    return out


def partitions_predicate(values: dict[str, list] | None, fields: dict[str, pa.Field], dialect: str,
                         alias: str = "t") -> str | None:
    """``t.p IN (…) AND …``: the target's partitions that hold the batch's ``values`` (per
    partition column); None (no bound) when there are none, or a column's type has no literal
    here (integers, text, dates and booleans do). Text goes through
    :func:`~airflow_pgcdc.lake.sql.quote_literal`, the rest is rendered from Python values."""
    import datetime as dt

    if not values:
        return None
    conds = []
    for column, found in values.items():
        t = fields[column].type
        lits = []
        for v in found:
            if v is None:
                return None
            if pa.types.is_integer(t):
                lits.append(str(int(v)))
            elif pa.types.is_string(t) or pa.types.is_large_string(t):
                lits.append(quote_literal(str(v), dialect))
            elif pa.types.is_date(t) and isinstance(v, dt.date):
                lits.append(f"CAST({quote_literal(v.isoformat(), dialect)} AS DATE)")
            elif pa.types.is_boolean(t):
                lits.append("TRUE" if v else "FALSE")
            else:
                return None
        if not lits:
            return None
        conds.append(f"{alias}.{quote_ident(column, dialect)} IN ({', '.join(lits)})")
    return "(" + " AND ".join(conds) + ")"


def bounded(spec: MergeSpec, bound: str | None) -> MergeSpec:
    """``spec`` with ``bound`` (a target-only predicate) added to its ``ON`` condition."""
    return spec if bound is None else replace(spec, predicate=f"{spec.predicate} AND {bound}")




def file_count(total_bytes: int, target_mb: float) -> int:
    """How many files ``total_bytes`` of Parquet makes at ``target_mb`` per file (≥ 1; a
    table under the target is one file)."""
    target = target_bytes(target_mb)
    return max(1, math.ceil(int(total_bytes) / target))
