"""The MERGE clauses, built once for both Delta sinks (delta-rs and delta-spark).

The source of a merge is the compacted batch (see :mod:`.compact`): at most one row per
key, with ``_pgcdc_op`` (``I``/``U``/``D``, the key's last change) and, per column that
may hold an unchanged TOAST value, a flag ``_pgcdc_keep_<column>`` (true: the source did
not carry the value, keep the target's). The clauses:

* ``ON`` every key column equal (keys are NOT NULL in PostgreSQL: a primary key or a
  replica identity index);
* matched and ``D``: delete;
* matched and not ``D``: update every target column: from the source, or the target's
  own value where the keep flag is set, or NULL for a column the source no longer has
  (dropped in PostgreSQL: it stays in Delta, NULL from then on);
* not matched and not ``D``: insert (a delete of an absent key is a no-op);
* after a truncate (``truncated``): not matched by source: delete; and keep flags are
  ignored (the target's rows are gone as of the truncate).

With soft deletes (``soft_delete``: the target has ``_pgcdc_deleted_at``), matched and
``D`` marks the row instead (``_pgcdc_deleted_at`` = the delete's commit time, and the
metadata columns the batch carries); its values are the delete's old row when that row is
whole (``delete_values``: every version of the batch has ``REPLICA IDENTITY FULL``), else
the ones the target holds (a change to them earlier in the batch is not carried by a delete
of the key alone); an update or insert of the key
sets it back to NULL (the row lives again); after a truncate, every live row the batch
does not hold is marked with the truncate's commit time.

Identifiers are quoted by :func:`quote_ident` for the dialect: DataFusion (delta-rs)
``"x"``, Spark SQL (delta-spark) `` `x` ``. String literals never come from data here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from airflow_pgcdc.changes.columns import (
    COMMIT_LSN,
    COMMIT_TS,
    DELETED_AT,
    IS_CURRENT,
    KEEP_PREFIX,
    KIND,
    MATCH_PREFIX,
    MERGED_AT,
    OP,
    VALID_FROM,
    VALID_TO,
)
from airflow_pgcdc.lake.sql import quote_ident, quote_literal

__all__ = [
    "KEEP_PREFIX", "MATCH_PREFIX", "MergeSpec", "Scd2Spec", "build_keyless_spec", "build_merge_spec",
    "build_scd2_spec", "keep_column",
]



def keep_column(column: str) -> str:
    """``_pgcdc_keep_<column>``: the flag column of ``column`` in a compacted batch."""
    return KEEP_PREFIX + column




@dataclass(frozen=True)
class MergeSpec:
    """Clauses as SQL text, target alias ``t``, source alias ``s``."""

    predicate: str
    delete_when: str
    update_when: str
    updates: dict[str, str]  # quoted target column -> expression
    insert_when: str
    inserts: dict[str, str]
    delete_not_matched_by_source: bool
    # soft deletes: matched and delete_when updates these instead of deleting; not matched
    # by source (after a truncate) and the condition: these are updated
    delete_updates: dict[str, str] | None = None
    not_matched_by_source_updates: dict[str, str] | None = None
    not_matched_by_source_when: str | None = None


def build_merge_spec(
    *,
    target_columns: Sequence[str],
    source_columns: Sequence[str],
    key_columns: Sequence[str],
    keep_columns: Sequence[str] = (),
    truncated: bool = False,
    dialect: str = "delta-rs",
    rekeyed: bool = False,
    soft_delete: bool = False,
    truncate_time: str | None = None,
    delete_values: bool = False,
) -> MergeSpec:
    """The clauses for a compacted batch. ``target_columns``: the Delta table's columns
    (after adding new source columns); ``source_columns``: the table columns present in
    the batch; ``keep_columns``: those with a ``_pgcdc_keep_`` flag in the batch;
    ``rekeyed``: the batch has ``_pgcdc_match_<k>`` columns, which the predicate matches
    the target's key on (the update then sets the key too). ``soft_delete``: the target's
    ``_pgcdc_deleted_at`` marks deleted rows (the batch carries ``_pgcdc_commit_ts``);
    ``truncate_time``: the batch's truncate's commit time (ISO 8601, UTC), what its marks say;
    ``delete_values``: a ``D`` row carries the whole old row (``REPLICA IDENTITY FULL``): the
    marked row takes its values."""
    q = lambda n: quote_ident(n, dialect)  # noqa: E731
    if not key_columns:
        raise ValueError("a merge needs at least one key column")
    src = set(source_columns)
    missing_keys = [k for k in key_columns if k not in src or k not in set(target_columns)]
    if missing_keys:
        raise ValueError(f"key column(s) {missing_keys} missing from the source or the target")
    keep = set(keep_columns) - set(key_columns)
    if keep - src:
        raise ValueError(f"keep flags for columns not in the source: {sorted(keep - src)}")
    match = (lambda k: MATCH_PREFIX + k) if rekeyed else (lambda k: k)  # noqa: E731
    predicate = " AND ".join(f"t.{q(k)} = s.{q(match(k))}" for k in key_columns)
    op = f"s.{q(OP)}"
    updates: dict[str, str] = {}
    inserts: dict[str, str] = {}
    for c in target_columns:
        if c not in src:
            updates[q(c)] = "NULL"
            continue
        value = f"s.{q(c)}"
        inserts[q(c)] = value
        if c in keep and not truncated:
            updates[q(c)] = f"CASE WHEN s.{q(keep_column(c))} THEN t.{q(c)} ELSE {value} END"
        else:
            updates[q(c)] = value
    if not soft_delete:
        return MergeSpec(
            predicate=predicate,
            delete_when=f"{op} = 'D'",
            update_when=f"{op} <> 'D'",
            updates=updates,
            insert_when=f"{op} <> 'D'",
            inserts=inserts,
            delete_not_matched_by_source=truncated,
        )
    if COMMIT_TS not in src or DELETED_AT not in set(target_columns):
        raise ValueError("soft deletes need _pgcdc_commit_ts in the batch and _pgcdc_deleted_at in the target")
    marks = {q(c): f"s.{q(c)}" for c in target_columns if delete_values and c in src and c not in key_columns}
    marks[q(DELETED_AT)] = f"s.{q(COMMIT_TS)}"
    marks.update({q(c): f"s.{q(c)}" for c in (OP, COMMIT_LSN, COMMIT_TS, MERGED_AT)
                  if c in src and c in set(target_columns)})
    when = None
    if truncated:
        if not truncate_time:
            raise ValueError("a soft-deleting merge after a truncate needs the truncate's commit time")
        when = f"t.{q(DELETED_AT)} IS NULL"
    return MergeSpec(
        predicate=predicate,
        delete_when=f"{op} = 'D'",
        update_when=f"{op} <> 'D'",
        updates=updates,  # _pgcdc_deleted_at is not in the batch: NULL, the row lives
        insert_when=f"{op} <> 'D'",
        inserts=inserts,
        delete_not_matched_by_source=False,
        delete_updates=marks,
        not_matched_by_source_updates=(
            {q(DELETED_AT): f"CAST({quote_literal(truncate_time, dialect)} AS TIMESTAMP)"} if truncated else None),
        not_matched_by_source_when=when,
    )


def build_keyless_spec(
    *,
    columns: Sequence[str],
    float_columns: Sequence[str] = (),
    nested_float_columns: Sequence[str] = (),
    dialect: str = "delta-rs",
) -> MergeSpec:
    """The clauses of a keyless table's multiset batch (:mod:`.keyless`): a source row
    ``_pgcdc_kind = 'del'`` deletes every target row equal to it on all ``columns``
    (NULL-safe; ``float_columns`` compare their text, so ``-0`` is not ``0`` and every NaN
    is one value; in Spark ``nested_float_columns``, arrays of floats, compare as JSON for
    the same reason, DataFusion's own comparison of arrays is already exact); a source
    row ``'ins'`` matches nothing and is inserted. No update clause."""
    q = lambda n: quote_ident(n, dialect)  # noqa: E731
    if not columns:
        raise ValueError("a keyless merge needs at least one column")
    kind = "s." + q(KIND)
    same = "IS NOT DISTINCT FROM" if dialect == "delta-rs" else "<=>"
    text = "VARCHAR" if dialect == "delta-rs" else "STRING"
    conds = [f"{kind} = 'del'"]
    for c in columns:
        t, s = f"t.{q(c)}", f"s.{q(c)}"
        if c in float_columns:
            t, s = f"CAST({t} AS {text})", f"CAST({s} AS {text})"
        elif c in nested_float_columns and dialect == "spark":
            t, s = f"to_json({t})", f"to_json({s})"
        conds.append(f"({t} {same} {s})")
    return MergeSpec(
        predicate=" AND ".join(conds),
        delete_when=f"{kind} = 'del'",
        update_when="",
        updates={},
        insert_when=f"{kind} = 'ins'",
        inserts={q(c): f"s.{q(c)}" for c in columns},
        delete_not_matched_by_source=False,
    )


@dataclass(frozen=True)
class Scd2Spec:
    """Clauses of an SCD type 2 merge (source rows from
    :func:`airflow_pgcdc.merge.compact.scd2_rows`, TOAST already resolved)."""

    predicate: str
    close_updates: dict[str, str]
    insert_when: str
    inserts: dict[str, str]
    close_all_updates: dict[str, str] | None  # after a truncate: every other current row
    close_all_when: str | None


def build_scd2_spec(
    *,
    target_columns: Sequence[str],
    source_columns: Sequence[str],
    key_columns: Sequence[str],
    truncate_lsn: int | None = None,
    dialect: str = "delta-rs",
) -> Scd2Spec:
    """``close`` source rows end the key's current history row (at the key's first change
    in the batch, or at the truncate); ``version`` rows are inserted. ``target_columns``
    are the history table's columns (the table's plus the ``__`` history columns)."""
    q = lambda n: quote_ident(n, dialect)  # noqa: E731
    if not key_columns:
        raise ValueError("a merge needs at least one key column")
    src = set(source_columns)
    keys = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in key_columns)
    predicate = f"{keys} AND t.{q(IS_CURRENT)} AND s.{q(KIND)} = 'close'"
    end = f"s.{q(VALID_FROM)}"
    if truncate_lsn is not None:  # a key whose first change came after the truncate ended there
        t = str(int(truncate_lsn))
        end = f"CASE WHEN s.{q(VALID_FROM)} < {t} THEN s.{q(VALID_FROM)} ELSE {t} END"
    close = {q(VALID_TO): end, q(IS_CURRENT): "false"}
    inserts = {q(c): (f"s.{q(c)}" if c in src else "NULL") for c in target_columns}
    return Scd2Spec(
        predicate=predicate,
        close_updates=close,
        insert_when=f"s.{q(KIND)} = 'version'",
        inserts=inserts,
        close_all_updates=(
            {q(VALID_TO): str(int(truncate_lsn)), q(IS_CURRENT): "false"} if truncate_lsn is not None else None
        ),
        close_all_when=f"t.{q(IS_CURRENT)}" if truncate_lsn is not None else None,
    )
