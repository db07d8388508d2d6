"""Compaction of change rows in Spark: a batch of windows → at most one row per key.

Order is ``(_pgcdc_commit_lsn, _pgcdc_seq)``: commit LSNs grow from window to window and
``_pgcdc_seq`` orders the changes within a window, so the pair is a total order over a
batch.

1. After a truncate of the table at ``(lsn, seq)``, only later changes count.
2. A key-changing update (the old key was sent and differs from the new one) also
   deletes the old key: a ``D`` row for the old key at the same position.
3. Unchanged TOAST: for each column that may be TOASTed (variable-length types), an
   update that did not carry the value takes it from the key's latest earlier change
   in the batch that did; if there is none, the flag ``_pgcdc_keep_<column>`` tells
   the merge to keep the target's value.
4. Per key, the last change wins: ``I``/``U`` upsert, ``D`` deletes (an insert then a
   delete in the batch leaves nothing; a delete of an absent key is a no-op).

Known limit: a key-changing update that leaves a TOASTed column unchanged, on a table
without ``REPLICA IDENTITY FULL``, cannot carry the value to the new key: PostgreSQL
sends neither the value nor the old row. The moved row gets NULL there (it never takes
a value of another row that had the new key before). Use ``REPLICA IDENTITY FULL`` on
tables whose keys change and which have large values.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from airflow_pgcdc.changes.rows import OLD_PREFIX
from airflow_pgcdc.merge.clauses import keep_column

__all__ = ["FIXED_WIDTH_TYPES", "compact", "toastable"]

OP, LSN, SEQ, TOAST = "_pgcdc_op", "_pgcdc_commit_lsn", "_pgcdc_seq", "_pgcdc_unchanged_toast"
MOVED = "_pgcdc_moved"

# PostgreSQL types stored inline at a fixed width (pg_type.typlen > 0): never TOASTed.
# Both spellings: typname (the window manifests) and SQL (format_type).
FIXED_WIDTH_TYPES = frozenset({
    "bool", "boolean", "int2", "smallint", "int4", "integer", "int8", "bigint",
    "float4", "real", "float8", "double precision", "date", "time", "timetz", "timestamp",
    "timestamptz", "time without time zone", "time with time zone",
    "timestamp without time zone", "timestamp with time zone", "interval", "oid", "xid",
    "cid", "xid8", "uuid", "money", "macaddr", "macaddr8", "pg_lsn", '"char"', "tid",
    "point", "line", "lseg", "box", "circle",
})


def toastable(pg_type: str) -> bool:
    """Whether values of ``pg_type`` (typname or SQL spelling, with or without a type
    modifier) may be TOASTed: arrays and every variable-length type."""
    t = pg_type.strip().lower()
    if t.endswith("]"):
        return True
    t = " ".join(re.sub(r"\([^)]*\)", " ", t).split())
    return t not in FIXED_WIDTH_TYPES


def compact(
    df,
    *,
    table_columns: Sequence[str],
    key_columns: Sequence[str],
    toast_columns: Sequence[str] = (),
    truncate_at: tuple[int, int] | None = None,
):
    """The compacted batch: ``table_columns``, ``_pgcdc_op``, ``_pgcdc_commit_lsn``,
    ``_pgcdc_seq`` and ``_pgcdc_keep_<c>`` for each of ``toast_columns``.

    ``df`` holds change rows (:mod:`airflow_pgcdc.changes.rows`); ``_pgcdc_old_<k>``
    columns, when present for every key column, detect key changes."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    c = F.col
    cols = list(table_columns)
    keys = list(key_columns)
    toast_cols = [t for t in toast_columns if t not in keys]
    if truncate_at is not None:
        t_lsn, t_seq = truncate_at
        df = df.where((c(LSN) > F.lit(t_lsn)) | ((c(LSN) == F.lit(t_lsn)) & (c(SEQ) > F.lit(t_seq))))
    meta = [OP, LSN, SEQ, TOAST, MOVED]
    olds = [OLD_PREFIX + k for k in keys]
    if all(o in df.columns for o in olds):
        sent = F.lit(True)
        same = F.lit(True)
        for k, o in zip(keys, olds, strict=True):
            sent = sent & c(o).isNotNull()
            same = same & c(o).eqNullSafe(c(k))
        df = df.withColumn(MOVED, (c(OP) == F.lit("U")) & sent & ~same)
        types = dict(df.dtypes)
        old_rows = df.where(c(MOVED)).select(
            *[
                (c(OLD_PREFIX + x) if x in keys else F.lit(None).cast(types[x])).alias(x)
                for x in cols
            ],
            F.lit("D").alias(OP),
            c(LSN),
            c(SEQ),
            F.array().cast("array<string>").alias(TOAST),
            F.lit(False).alias(MOVED),
        )
        base = df.select(*[c(x) for x in cols + meta]).unionByName(old_rows)
    else:
        base = df.withColumn(MOVED, F.lit(False)).select(*[c(x) for x in cols + meta])
    order = [c(LSN), c(SEQ)]
    w_all = Window.partitionBy(*keys).orderBy(*order).rowsBetween(
        Window.unboundedPreceding, Window.unboundedFollowing
    )
    w_upto = Window.partitionBy(*keys).orderBy(*order).rowsBetween(
        Window.unboundedPreceding, Window.currentRow
    )
    exprs = [c(x) for x in cols + meta]
    exprs.append(F.last(F.struct(c(LSN), c(SEQ))).over(w_all).alias("_pgcdc_last"))
    for x in toast_cols:
        # a moved row is a boundary: it never takes a value of the new key's past
        carried = (~F.array_contains(c(TOAST), x) & c(OP).isin("I", "U")) | c(MOVED)
        exprs.append(
            F.last(F.when(carried, F.struct(c(x).alias("v"))), ignorenulls=True)
            .over(w_upto)
            .alias("_pgcdc_r_" + x)
        )
    ranked = base.select(*exprs)
    last = ranked.where(
        (c(LSN) == c("_pgcdc_last." + LSN)) & (c(SEQ) == c("_pgcdc_last." + SEQ))
    )
    out = []
    for x in cols:
        if x in toast_cols:
            missing = F.array_contains(c(TOAST), x)
            r = c("_pgcdc_r_" + x)
            out.append(F.when(missing & r.isNotNull(), r.getField("v")).otherwise(c(x)).alias(x))
        else:
            out.append(c(x))
    out += [c(OP), c(LSN), c(SEQ)]
    for x in toast_cols:
        r = c("_pgcdc_r_" + x)
        out.append(
            (F.array_contains(c(TOAST), x) & r.isNull() & (c(OP) != F.lit("D")))
            .alias(keep_column(x))
        )
    return last.select(*out)
