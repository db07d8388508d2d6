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
tables whose keys change and which have large values. The drain reports each such update
(``DrainResult.lost_toast`` and a warning).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from airflow_pgcdc.changes.rows import OLD_PREFIX
from airflow_pgcdc.merge.clauses import keep_column

__all__ = ["FIXED_WIDTH_TYPES", "compact", "ordered_changes", "scd2_rows", "toastable"]

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


def ordered_changes(
    df,
    *,
    table_columns: Sequence[str],
    key_columns: Sequence[str],
    truncate_at: tuple[int, int] | None = None,
):
    """Steps 1 and 2: the change rows after the last truncate, a key-changing update
    followed by a ``D`` row for its old key; columns ``table_columns``, ``_pgcdc_op``,
    ``_pgcdc_commit_lsn``, ``_pgcdc_seq``, ``_pgcdc_unchanged_toast``, ``_pgcdc_moved``."""
    from pyspark.sql import functions as F

    c = F.col
    cols = list(table_columns)
    keys = list(key_columns)
    if truncate_at is not None:
        t_lsn, t_seq = truncate_at
        df = df.where((c(LSN) > F.lit(t_lsn)) | ((c(LSN) == F.lit(t_lsn)) & (c(SEQ) > F.lit(t_seq))))
    meta = [OP, LSN, SEQ, TOAST, MOVED]
    olds = [OLD_PREFIX + k for k in keys]
    if not all(o in df.columns for o in olds):
        return df.withColumn(MOVED, F.lit(False)).select(*[c(x) for x in cols + meta])
    sent = F.lit(True)
    same = F.lit(True)
    for k, o in zip(keys, olds, strict=True):
        sent = sent & c(o).isNotNull()
        same = same & c(o).eqNullSafe(c(k))
    df = df.withColumn(MOVED, (c(OP) == F.lit("U")) & sent & ~same)
    types = dict(df.dtypes)
    old_rows = df.where(c(MOVED)).select(
        *[(c(OLD_PREFIX + x) if x in keys else F.lit(None).cast(types[x])).alias(x) for x in cols],
        F.lit("D").alias(OP),
        c(LSN),
        c(SEQ),
        F.array().cast("array<string>").alias(TOAST),
        F.lit(False).alias(MOVED),
    )
    return df.select(*[c(x) for x in cols + meta]).unionByName(old_rows)


def _key_window(keys: Sequence[str], *, upto: bool):
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy(*keys).orderBy(F.col(LSN), F.col(SEQ))
    end = Window.currentRow if upto else Window.unboundedFollowing
    return w.rowsBetween(Window.unboundedPreceding, end)


def _resolved(toast_cols: Sequence[str], keys: Sequence[str]) -> list:
    """Step 3's lookups: per TOAST-able column, the key's latest value carried up to
    this row (a struct, NULL when none in the batch)."""
    from pyspark.sql import functions as F

    c = F.col
    w_upto = _key_window(keys, upto=True)
    out = []
    for x in toast_cols:
        # a moved row is a boundary: it never takes a value of the new key's past
        carried = (~F.array_contains(c(TOAST), x) & c(OP).isin("I", "U")) | c(MOVED)
        out.append(
            F.last(F.when(carried, F.struct(c(x).alias("v"))), ignorenulls=True)
            .over(w_upto)
            .alias("_pgcdc_r_" + x)
        )
    return out


def _values_and_flags(cols: Sequence[str], toast_cols: Sequence[str]) -> tuple[list, list]:
    """The table columns with step 3 applied, and the ``_pgcdc_keep_<c>`` flags."""
    from pyspark.sql import functions as F

    c = F.col
    values, flags = [], []
    for x in cols:
        if x in toast_cols:
            missing = F.array_contains(c(TOAST), x)
            r = c("_pgcdc_r_" + x)
            values.append(F.when(missing & r.isNotNull(), r.getField("v")).otherwise(c(x)).alias(x))
        else:
            values.append(c(x))
    for x in toast_cols:
        r = c("_pgcdc_r_" + x)
        flags.append(
            (F.array_contains(c(TOAST), x) & r.isNull() & (c(OP) != F.lit("D")))
            .alias(keep_column(x))
        )
    return values, flags


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
    from pyspark.sql import functions as F

    c = F.col
    cols = list(table_columns)
    keys = list(key_columns)
    toast_cols = [t for t in toast_columns if t not in keys]
    base = ordered_changes(df, table_columns=cols, key_columns=keys, truncate_at=truncate_at)
    exprs = [c(x) for x in cols + [OP, LSN, SEQ, TOAST, MOVED]]
    exprs.append(F.last(F.struct(c(LSN), c(SEQ))).over(_key_window(keys, upto=False)).alias("_pgcdc_last"))
    exprs += _resolved(toast_cols, keys)
    ranked = base.select(*exprs)
    last = ranked.where(
        (c(LSN) == c("_pgcdc_last." + LSN)) & (c(SEQ) == c("_pgcdc_last." + SEQ))
    )
    values, flags = _values_and_flags(cols, toast_cols)
    return last.select(*values, c(OP), c(LSN), c(SEQ), *flags)


# SCD type 2 history columns
VALID_FROM, VALID_TO, IS_CURRENT, HIST_OP, KIND = (
    "__valid_from_lsn", "__valid_to_lsn", "__is_current", "__op", "_pgcdc_kind",
)


def scd2_rows(
    df,
    *,
    table_columns: Sequence[str],
    key_columns: Sequence[str],
    toast_columns: Sequence[str] = (),
    truncate_at: tuple[int, int] | None = None,
):
    """The source of an SCD type 2 merge: per key, one ``close`` row (``_pgcdc_kind``)
    whose ``__valid_from_lsn`` is the key's first change in the batch (the history's
    current row of that key ends there), and one ``version`` row per insert or update:
    valid from its commit LSN to the key's next change (NULL: still current). A delete
    only ends the version before it. Unchanged TOAST values are resolved as in
    :func:`compact`; where the batch has none, ``_pgcdc_keep_<c>`` asks the writer to
    take the value of the key's current history row."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    c = F.col
    cols = list(table_columns)
    keys = list(key_columns)
    toast_cols = [t for t in toast_columns if t not in keys]
    base = ordered_changes(df, table_columns=cols, key_columns=keys, truncate_at=truncate_at)
    ordered = Window.partitionBy(*keys).orderBy(c(LSN), c(SEQ))
    exprs = [c(x) for x in cols + [OP, LSN, SEQ, TOAST, MOVED]]
    exprs.append(F.lead(c(LSN)).over(ordered).alias("_pgcdc_next"))
    exprs.append(F.first(c(LSN)).over(_key_window(keys, upto=False)).alias("_pgcdc_first"))
    exprs += _resolved(toast_cols, keys)
    ranked = base.select(*exprs)
    values, flags = _values_and_flags(cols, toast_cols)
    versions = ranked.where(c(OP) != F.lit("D")).select(
        *values,
        c(LSN).alias(VALID_FROM),
        c("_pgcdc_next").alias(VALID_TO),
        c("_pgcdc_next").isNull().alias(IS_CURRENT),
        c(OP).alias(HIST_OP),
        *flags,
        F.lit("version").alias(KIND),
    )
    types = dict(base.dtypes)
    closes = ranked.where(c(LSN) == c("_pgcdc_first")).dropDuplicates(keys).select(
        *[c(x) if x in keys else F.lit(None).cast(types[x]).alias(x) for x in cols],
        c("_pgcdc_first").alias(VALID_FROM),
        F.lit(None).cast("bigint").alias(VALID_TO),
        F.lit(False).alias(IS_CURRENT),
        F.lit("C").alias(HIST_OP),
        *[F.lit(False).alias(keep_column(x)) for x in toast_cols],
        F.lit("close").alias(KIND),
    )
    return versions.unionByName(closes)
