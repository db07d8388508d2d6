"""Compaction of change rows in Spark: a batch of windows → at most one row per key.

Order is ``(_pgcdc_commit_lsn, _pgcdc_seq)``: commit LSNs grow from window to window and
``_pgcdc_seq`` orders the changes within a window, so the pair is a total order over a
batch.

1. After a truncate of the table at ``(lsn, seq)``, only later changes count.
2. A key-changing update (the old key was sent and differs from the new one) also
   deletes the old key: a ``D`` row for the old key at the same position. Under
   ``REPLICA IDENTITY FULL`` that ``D`` row carries the whole old row, and it is dropped
   when, earlier in the same transaction, another row took that key (its values differ
   from the old row's): keys may be duplicated inside a transaction under a
   ``DEFERRABLE`` key, e.g. ``UPDATE t SET id = 3 - id`` swaps rows 1 and 2, and the
   second row leaving key 2 must not delete the first row's new version at key 2. Without
   ``FULL`` the old row is unknown and the ``D`` row always applies (a swap under a
   deferrable key then loses a row: use ``REPLICA IDENTITY FULL`` on such tables).
3. Unchanged TOAST: for each column that may be TOASTed (variable-length types), an
   update that did not carry the value takes it from the key's latest earlier change
   in the batch that did; if there is none, the flag ``_pgcdc_keep_<column>`` tells
   the merge to keep the target's value.
4. Per key, the last change wins: ``I``/``U`` upsert, ``D`` deletes (an insert then a
   delete in the batch leaves nothing; a delete of an absent key is a no-op).

A key-changing update that leaves a TOASTed column unchanged, on a table without
``REPLICA IDENTITY FULL``, carries neither the value nor the old row: PostgreSQL sends
neither. The drain counts such updates (``key_moves_unchanged_toast`` in the window
manifest); for such a batch, ``compact(rekey=True)`` matches the moved row on its old key
when that key has no other change in the batch, and the MERGE updates the target row in
place, key included, keeping the value. Otherwise (the old key changed earlier in the
batch, a second move) the moved row gets NULL there; it never takes a value of another
row that had the new key before. ``REPLICA IDENTITY FULL`` avoids all of it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from airflow_pgcdc.changes.columns import COMMIT_LSN as LSN
from airflow_pgcdc.changes.columns import (
    FROM_PREFIX,
    HIST_OP,
    IS_CURRENT,
    KIND,
    MATCH_PREFIX,
    MOVE_D,
    MOVED,
    OLD_PREFIX,
    OP,
    SEQ,
    VALID_FROM,
    VALID_TO,
)
from airflow_pgcdc.changes.columns import UNCHANGED_TOAST as TOAST
from airflow_pgcdc.lake.sql import quote_ident
from airflow_pgcdc.merge.clauses import keep_column

__all__ = ["FIXED_WIDTH_TYPES", "compact", "ordered_changes", "scd2_rows", "toastable"]


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


def col(name: str):
    """A Spark column by its exact name: dots, spaces and backticks are quoted (through
    :func:`~airflow_pgcdc.merge.clauses.quote_ident`, the merge's one Spark quoting
    function), never read as a struct path. A struct's field: ``col(s).getField(f)``."""
    from pyspark.sql import functions as F

    return F.col(quote_ident(name, "spark"))


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
    ``_pgcdc_commit_lsn``, ``_pgcdc_seq``, ``_pgcdc_unchanged_toast``, ``_pgcdc_moved``,
    ``_pgcdc_move_d`` (the added ``D`` rows) and ``_pgcdc_from_<k>`` (a moved row's old key)."""
    from pyspark.sql import functions as F

    c = col
    cols = list(table_columns)
    keys = list(key_columns)
    if truncate_at is not None:
        t_lsn, t_seq = truncate_at
        df = df.where((c(LSN) > F.lit(t_lsn)) | ((c(LSN) == F.lit(t_lsn)) & (c(SEQ) > F.lit(t_seq))))
    meta = [OP, LSN, SEQ, TOAST, MOVED]
    olds = [OLD_PREFIX + k for k in keys]
    types = dict(df.dtypes)
    if not all(o in df.columns for o in olds):
        df = df.withColumn(MOVED, F.lit(False)).withColumn(MOVE_D, F.lit(False))
        froms = [F.lit(None).cast(types[k]).alias(FROM_PREFIX + k) for k in keys]
        return df.select(*[c(x) for x in cols + meta], c(MOVE_D), *froms)
    sent = F.lit(True)
    same = F.lit(True)
    for k, o in zip(keys, olds, strict=True):
        sent = sent & c(o).isNotNull()
        same = same & c(o).eqNullSafe(c(k))
    df = df.withColumn(MOVED, (c(OP) == F.lit("U")) & sent & ~same)
    full = all(OLD_PREFIX + x in df.columns for x in cols)  # REPLICA IDENTITY FULL: the whole old row
    old_rows = df.where(c(MOVED)).select(
        *[(c(OLD_PREFIX + x) if x in keys or full else F.lit(None).cast(types[x])).alias(x) for x in cols],
        F.lit("D").alias(OP),
        c(LSN),
        c(SEQ),
        F.array().cast("array<string>").alias(TOAST),
        F.lit(False).alias(MOVED),
        F.lit(True).alias(MOVE_D),
        *[F.lit(None).cast(types[k]).alias(FROM_PREFIX + k) for k in keys],
    )
    froms = [F.when(c(MOVED), c(OLD_PREFIX + k)).alias(FROM_PREFIX + k) for k in keys]
    rows = df.select(*[c(x) for x in cols + meta], F.lit(False).alias(MOVE_D), *froms)
    out = rows.unionByName(old_rows)
    if full:
        out = _without_stale_moves(out, cols, keys)
    return out


def _without_stale_moves(df, cols: Sequence[str], keys: Sequence[str]):
    """Drop a move's ``D`` row (it carries the whole old row) when the key's latest earlier
    upsert in the same transaction is another row (other values): that row took the key
    while the moved one still had it (a ``DEFERRABLE`` key), and keeps it."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    c = col
    before = (
        Window.partitionBy(*[c(k) for k in keys]).orderBy(c(LSN), c(SEQ), c(MOVE_D))
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    upsert = F.struct(c(LSN).alias("lsn"), *[c(x).alias(f"c{i}") for i, x in enumerate(cols)])
    prev = F.last(F.when(c(OP) != F.lit("D"), upsert), ignorenulls=True).over(before)
    df = df.withColumn("_pgcdc_prev", prev)
    other_row = F.lit(False)
    for i, x in enumerate(cols):
        other_row = other_row | ~c("_pgcdc_prev").getField(f"c{i}").eqNullSafe(c(x))
    stale = c(MOVE_D) & c("_pgcdc_prev").isNotNull() & (c("_pgcdc_prev").getField("lsn") == c(LSN)) & other_row
    return df.where(~stale).drop("_pgcdc_prev")


def _key_window(keys: Sequence[str], *, upto: bool):
    from pyspark.sql import Window

    w = Window.partitionBy(*[col(k) for k in keys]).orderBy(col(LSN), col(SEQ))
    end = Window.currentRow if upto else Window.unboundedFollowing
    return w.rowsBetween(Window.unboundedPreceding, end)


def _resolved(toast_cols: Sequence[str], keys: Sequence[str], first_moved=None) -> list:
    """Step 3's lookups: per TOAST-able column, the key's latest value carried up to
    this row (a struct, NULL when none in the batch). ``first_moved``: a condition true on
    a moved row that opens its key's history in the batch (rekey mode): the values it did
    not carry stay unresolved (to be kept from the target row it is matched to)."""
    from pyspark.sql import functions as F

    c = col
    w_upto = _key_window(keys, upto=True)
    out = []
    for x in toast_cols:
        # a moved row is a boundary: it never takes a value of the new key's past
        boundary = c(MOVED)
        if first_moved is not None:
            boundary = boundary & ~(first_moved & F.array_contains(c(TOAST), x))
        carried = (~F.array_contains(c(TOAST), x) & c(OP).isin("I", "U")) | boundary
        out.append(
            F.last(F.when(carried, F.struct(c(x).alias("v"))), ignorenulls=True)
            .over(w_upto)
            .alias("_pgcdc_r_" + x)
        )
    return out


def _values_and_flags(cols: Sequence[str], toast_cols: Sequence[str]) -> tuple[list, list]:
    """The table columns with step 3 applied, and the ``_pgcdc_keep_<c>`` flags."""
    from pyspark.sql import functions as F

    c = col
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
    rekey: bool = False,
):
    """The compacted batch: ``table_columns``, ``_pgcdc_op``, ``_pgcdc_commit_lsn``,
    ``_pgcdc_seq`` and ``_pgcdc_keep_<c>`` for each of ``toast_columns``.

    ``df`` holds change rows (:mod:`airflow_pgcdc.changes.rows`); ``_pgcdc_old_<k>``
    columns, when present for every key column, detect key changes.

    ``rekey`` (the batch has key-changing updates whose unchanged TOAST values were not
    sent): also ``_pgcdc_match_<k>``, the target key the MERGE matches each row on. It is
    the row's key, except for a key B whose history in the batch starts with a move from
    key A where A has no other change in the batch (the target's row A is then A's row at
    the move, and nothing else claims it): B's row is matched on A, so the MERGE updates
    that row in place, key included, keeping the values the move did not carry
    (``_pgcdc_keep_<c>``); A's ``D`` row is dropped (the update replaces it). Any other
    move keeps the documented limit (NULL)."""
    from pyspark.sql import functions as F

    c = col
    cols = list(table_columns)
    keys = list(key_columns)
    toast_cols = [t for t in toast_columns if t not in keys]
    base = ordered_changes(df, table_columns=cols, key_columns=keys, truncate_at=truncate_at)
    whole = _key_window(keys, upto=False)
    pos = F.struct(c(LSN), c(SEQ))
    exprs = [c(x) for x in cols + [OP, LSN, SEQ, TOAST, MOVED]]
    exprs.append(F.last(pos).over(whole).alias("_pgcdc_last"))
    first_moved = None
    if rekey:
        # the key's first change in the batch; when it is a move: where from, and when
        base = base.withColumn("_pgcdc_first", F.first(pos).over(whole))
        origin = F.struct(*[c(FROM_PREFIX + k).alias(k) for k in keys], c(LSN), c(SEQ))
        exprs += [
            c(MOVE_D), c("_pgcdc_first"), F.first(F.when(c(MOVED), origin)).over(whole).alias("_pgcdc_origin"),
        ]
        first_moved = c(MOVED) & _at("_pgcdc_first")
    exprs += _resolved(toast_cols, keys, first_moved)
    ranked = base.select(*exprs)
    last = ranked.where(_at("_pgcdc_last"))
    values, flags = _values_and_flags(cols, toast_cols)
    if not rekey:
        return last.select(*values, c(OP), c(LSN), c(SEQ), *flags)
    return _rekeyed(last, keys, values, flags)


def _rekeyed(last, keys: Sequence[str], values: list, flags: list):
    """``compact``'s rekey step on the per-key last rows (see :func:`compact`)."""
    from pyspark.sql import functions as F

    c = col
    # a move's D row that is its old key's only change in the batch
    alone = c(MOVE_D) & _at("_pgcdc_first")
    sources = last.where(alone).select(
        *[c(k).alias("_pgcdc_a_" + k) for k in keys], c(LSN).alias("_pgcdc_a_lsn"), c(SEQ).alias("_pgcdc_a_seq"),
    )
    on = [c("_pgcdc_origin").getField(k) == c("_pgcdc_a_" + k) for k in keys]
    on += [c("_pgcdc_origin").getField(LSN) == c("_pgcdc_a_lsn"), c("_pgcdc_origin").getField(SEQ) == c("_pgcdc_a_seq")]
    joined = last.join(sources, on=_all(on), how="left")
    moved_here = c("_pgcdc_a_lsn").isNotNull()
    match = [F.when(moved_here, c("_pgcdc_a_" + k)).otherwise(c(k)).alias(MATCH_PREFIX + k) for k in keys]
    out = joined.select(*values, c(OP), c(LSN), c(SEQ), *flags, *match, c(MOVE_D))
    # the D rows whose key a moved row now takes over in place
    taken = joined.where(moved_here).select(
        *[c("_pgcdc_a_" + k).alias("_pgcdc_t_" + k) for k in keys],
        c("_pgcdc_a_lsn").alias("_pgcdc_t_lsn"), c("_pgcdc_a_seq").alias("_pgcdc_t_seq"),
    )
    on = [c(k) == c("_pgcdc_t_" + k) for k in keys] + [c(LSN) == c("_pgcdc_t_lsn"), c(SEQ) == c("_pgcdc_t_seq")]
    kept = out.join(taken, on=_all(on) & c(MOVE_D), how="left_anti")
    return kept.drop(MOVE_D)


def _at(position: str):
    """This row is at ``position`` (a struct column of ``_pgcdc_commit_lsn``, ``_pgcdc_seq``)."""

    c = col
    return (c(LSN) == c(position).getField(LSN)) & (c(SEQ) == c(position).getField(SEQ))


def _all(conditions: list):
    out = conditions[0]
    for cond in conditions[1:]:
        out = out & cond
    return out


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
    take the value of the key's current history row.

    ``truncate_at`` (the batch's last truncate of the table, ``(lsn, seq)``): versions
    before it are kept, and end at the key's next change before it or else at the
    truncate's LSN (the spec closes the history's current rows there too, see
    :func:`~airflow_pgcdc.merge.clauses.build_scd2_spec`)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    c = col
    cols = list(table_columns)
    keys = list(key_columns)
    toast_cols = [t for t in toast_columns if t not in keys]
    base = ordered_changes(df, table_columns=cols, key_columns=keys)  # history keeps it all
    ordered = Window.partitionBy(*[c(k) for k in keys]).orderBy(c(LSN), c(SEQ))
    exprs = [c(x) for x in cols + [OP, LSN, SEQ, TOAST, MOVED]]
    exprs.append(F.lead(c(LSN)).over(ordered).alias("_pgcdc_next"))
    exprs.append(F.lead(c(SEQ)).over(ordered).alias("_pgcdc_next_seq"))
    exprs.append(F.first(c(LSN)).over(_key_window(keys, upto=False)).alias("_pgcdc_first"))
    exprs += _resolved(toast_cols, keys)
    ranked = base.select(*exprs)
    values, flags = _values_and_flags(cols, toast_cols)
    valid_to = c("_pgcdc_next")
    if truncate_at is not None:
        t_lsn, t_seq = (F.lit(int(v)) for v in truncate_at)

        def before(lsn, seq):
            return (lsn < t_lsn) | ((lsn == t_lsn) & (seq < t_seq))

        # a version before the truncate ends at its next change if that is before it too
        ends_early = c("_pgcdc_next").isNotNull() & before(c("_pgcdc_next"), c("_pgcdc_next_seq"))
        valid_to = F.when(before(c(LSN), c(SEQ)) & ~ends_early, t_lsn).otherwise(valid_to)
    versions = ranked.where(c(OP) != F.lit("D")).select(
        *values,
        c(LSN).alias(VALID_FROM),
        valid_to.cast("bigint").alias(VALID_TO),
        valid_to.isNull().alias(IS_CURRENT),
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
