"""Updates, deletes and truncates of a table without a key, as a multiset.

A keyless table under ``REPLICA IDENTITY FULL`` sends the whole old row with each update
and delete (``_pgcdc_old_<column>`` on a ``U`` row; the table columns of a ``D`` row).
PostgreSQL removed one particular tuple; nothing tells identical tuples apart, so the
Delta table is kept equal to the PostgreSQL table *as a multiset*: each delete removes
exactly one row equal to the old row (on every column, NULL equal to NULL), each update
replaces exactly one such row, duplicates stay duplicates.

The batch (every pending window, after its last truncate) becomes, per distinct row value
``v``, the sequence of ``+1`` (insert, an update's new row) and ``-1`` (delete, an update's
old row) in commit order ``(_pgcdc_commit_lsn, _pgcdc_seq)``, an update's ``-1`` before
its ``+1``. Applied one by one to ``c`` copies of ``v`` in the table (a removal of a row
that is not there removes nothing), the result is ``max(c + S, S - M)``: ``S`` the sum,
``M`` the lowest running sum, 0 included (Lindley's recursion). When the Delta table was equal to
PostgreSQL before the batch, that is ``c + S``; the formula also keeps the commit-order
meaning when it was not. Only values with ``S != 0`` or ``M < 0`` can change; their
``c`` is counted in the Delta table (read by Spark at the version the commit is made on).

The commit, one per batch with the table's app transaction (a replay is a no-op):

* no truncate: one MERGE whose source has, per value whose count grows, the missing
  copies (``_pgcdc_kind = 'ins'``: inserted, they match nothing); per value whose count
  shrinks, one ``'del'`` row (every copy of the value is deleted) and the copies that
  remain (inserted again). Nothing to do at all: an empty append that records the app
  transaction;
* a truncate in the batch: an overwrite with the rows the changes after it leave.

Equality is exact and the same in Spark (which counts) and in the engine (which
deletes): ``float4``/``float8`` columns compare their text (``-0`` is not ``0``, every
``NaN`` is one value, as PostgreSQL prints them), arrays of floats compare as JSON in
Spark (exact) and with DataFusion's total order in delta-rs (exact, but two ``NaN``\\ s
with other bit patterns inside an array differ there); other types by value. A map
column is refused (Spark cannot compare maps; the type map never makes one).

A row a Delta table holds beside the PostgreSQL columns (a column dropped in PostgreSQL)
is rewritten without it (NULL) when its value's count shrinks.

An update or a delete without the old row (a relation version not under ``REPLICA
IDENTITY FULL``), or an update whose unchanged TOAST value was not sent, cannot be
placed: :class:`~airflow_pgcdc.merge.errors.KeylessChange` for this table alone.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from airflow_pgcdc.changes.columns import (
    KEYLESS_CANON as CANON,
)
from airflow_pgcdc.changes.columns import KEYLESS_COUNT as COUNT
from airflow_pgcdc.changes.columns import KEYLESS_DELTA as DELTA
from airflow_pgcdc.changes.columns import KEYLESS_FULL as FULL
from airflow_pgcdc.changes.columns import KEYLESS_HAVE as HAVE
from airflow_pgcdc.changes.columns import KEYLESS_LOW as LOW
from airflow_pgcdc.changes.columns import KEYLESS_RUN as RUN
from airflow_pgcdc.changes.columns import KEYLESS_SUB as SUB
from airflow_pgcdc.changes.columns import KEYLESS_SUM as SUM
from airflow_pgcdc.changes.columns import KIND, OLD_PREFIX
from airflow_pgcdc.merge.clauses import build_keyless_spec
from airflow_pgcdc.merge.compact import LSN, OP, SEQ, TOAST, col
from airflow_pgcdc.protocol.lsn import LSN as Lsn
from airflow_pgcdc.protocol.quoting import quote_qualified

__all__ = ["KIND", "apply_keyless", "float_columns", "nested_float_columns"]

log = logging.getLogger(__name__)

INTERNAL = (KIND, DELTA, SUB, FULL, RUN, SUM, LOW, HAVE, COUNT)


def _leaf(t: pa.DataType) -> pa.DataType:
    while pa.types.is_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    return t


def float_columns(fields: Sequence[pa.Field]) -> list[str]:
    """Columns of ``float4``/``float8``: compared by their text."""
    return [f.name for f in fields if pa.types.is_floating(f.type)]


def nested_float_columns(fields: Sequence[pa.Field]) -> list[str]:
    """Arrays (of any depth) of floats."""
    return [
        f.name for f in fields
        if (pa.types.is_list(f.type) or pa.types.is_large_list(f.type)) and pa.types.is_floating(_leaf(f.type))
    ]


def _has_map(t: pa.DataType) -> bool:
    if pa.types.is_map(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_map(t.value_type)
    if pa.types.is_struct(t):
        return any(_has_map(f.type) for f in t)
    return False


def _canonical(fields: Sequence[pa.Field]) -> list:
    """Per column, the Spark expression rows are compared on (the same equality the MERGE
    predicate of :func:`~airflow_pgcdc.merge.clauses.build_keyless_spec` uses in Spark)."""
    from pyspark.sql import functions as F

    floats, nested = set(float_columns(fields)), set(nested_float_columns(fields))
    out = []
    for i, f in enumerate(fields):
        e = col(f.name)
        if f.name in floats:
            e = e.cast("string")
        elif f.name in nested:
            e = F.to_json(e)
        out.append(e.alias(f"{CANON}{i}"))
    return out


def _same(left: str, right: str, n: int):
    """NULL-safe equality of the canonical columns ``{left}{i}`` and ``{right}{i}``."""
    cond = None
    for i in range(n):
        e = col(f"{left}{i}").eqNullSafe(col(f"{right}{i}"))
        cond = e if cond is None else cond & e
    return cond


def _refuse(name: str, fields: Sequence[pa.Field], hint: str) -> None:
    from airflow_pgcdc.merge.errors import KeylessChange, ReservedColumnName

    maps = [f.name for f in fields if _has_map(f.type)]
    if maps:
        raise KeylessChange(
            f"table {name} has no key and column(s) {maps} of a map type: rows cannot be compared "
            "to apply its updates and deletes", hint=hint,
        )
    clash = sorted({f.name for f in fields} & ({*INTERNAL} | {f"{CANON}{i}" for i in range(len(fields))}))
    if clash:
        raise ReservedColumnName(
            f"table {name}: column(s) {clash} have the name of a column the merge adds while it "
            "applies a keyless table's changes", hint="rename the column(s) in PostgreSQL, then pgcdc resync the table",
        )


def _changes(ctx, plan, fields: Sequence[pa.Field]):
    """The batch's change rows with the whole old row, and ``_pgcdc_full`` (the row's
    relation version is under ``REPLICA IDENTITY FULL``: its updates carry the old row)."""
    from pyspark.sql import functions as F

    from airflow_pgcdc.merge.context import META, read_changes

    schema = pa.schema(
        list(fields) + [f.with_name(OLD_PREFIX + f.name) for f in fields]
        + [META[n] for n in (OP, LSN, SEQ, TOAST)]
    )
    out = None
    for full in (True, False):
        versions = tuple(v for v in plan.versions if (v.replica_identity == "f") == full and v.parts)
        if not versions:
            continue
        df = read_changes(ctx, dataclasses.replace(plan, versions=versions), schema).withColumn(FULL, F.lit(full))
        out = df if out is None else out.unionByName(df)
    return out


def _check(name: str, df, hint: str) -> None:
    """An update or delete without the old row, or with an unsent TOAST value: refused."""
    from pyspark.sql import functions as F

    from airflow_pgcdc.merge.errors import KeylessChange

    changes = col(OP).isin("U", "D")
    no_old = changes & ~col(FULL)
    toast = changes & (F.size(col(TOAST)) > 0)
    bad = df.where(no_old | toast).select(col(OP), col(LSN), no_old.alias("no_old"), col(TOAST)).limit(1).collect()
    if not bad:
        return
    op, lsn, missing, unsent = bad[0]
    what = {"U": "an update", "D": "a delete"}[op]
    if missing:
        why = ("was sent without the old row (the table was not under REPLICA IDENTITY FULL then): the "
               "row it changed cannot be found")
    else:
        why = f"left the unchanged TOASTed value(s) of {sorted(unsent)} unsent: the new row is not known"
    raise KeylessChange(f"table {name} has no key, and {what} (commit LSN {Lsn(lsn)}) {why}", hint=hint)


def _events(df, names: Sequence[str], truncate_at):
    """``+1``/``-1`` per row value, with its position; an update's old row (``-1``) first."""
    from pyspark.sql import functions as F

    if truncate_at is not None:
        t_lsn, t_seq = truncate_at
        df = df.where((col(LSN) > F.lit(t_lsn)) | ((col(LSN) == F.lit(t_lsn)) & (col(SEQ) > F.lit(t_seq))))
    pos = [col(LSN), col(SEQ)]
    new = df.where(col(OP).isin("I", "U")).select(
        *[col(x) for x in names], F.lit(1).alias(DELTA), *pos, F.lit(1).alias(SUB))
    gone = df.where(col(OP) == F.lit("D")).select(
        *[col(x) for x in names], F.lit(-1).alias(DELTA), *pos, F.lit(0).alias(SUB))
    old = df.where(col(OP) == F.lit("U")).select(
        *[col(OLD_PREFIX + x).alias(x) for x in names], F.lit(-1).alias(DELTA), *pos, F.lit(0).alias(SUB))
    return new.unionByName(gone).unionByName(old)


def _values(events, fields: Sequence[pa.Field]):
    """Per distinct row value that the batch may change: the value, ``S`` and ``M``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    names = [f.name for f in fields]
    keys = [f"{CANON}{i}" for i in range(len(fields))]
    ev = events.select(*[col(x) for x in names], col(DELTA), col(LSN), col(SEQ), col(SUB), *_canonical(fields))
    w = (Window.partitionBy(*[col(k) for k in keys]).orderBy(col(LSN), col(SEQ), col(SUB))
         .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    ev = ev.withColumn(RUN, F.sum(col(DELTA)).over(w))
    per = ev.groupBy(*[col(k) for k in keys]).agg(
        *[F.first(col(x)).alias(x) for x in names],
        F.sum(col(DELTA)).alias(SUM), F.least(F.min(col(RUN)), F.lit(0)).alias(LOW),
    )
    return per.where((col(SUM) != F.lit(0)) | (col(LOW) < F.lit(0)))


def _spark_schema(fields: Sequence[pa.Field]):
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(pa.schema(fields))


def _counted(values, target, fields: Sequence[pa.Field]):
    """``values`` with ``_pgcdc_have``: how many copies of the value the table holds."""
    from pyspark.sql import functions as F

    n = len(fields)
    tk = [f"_pgcdc_t{i}" for i in range(n)]
    canon = [e.alias(t) for e, t in zip(_canonical(fields), tk, strict=True)]
    wanted = values.select(*[col(f"{CANON}{i}") for i in range(n)])
    rows = target.select(*canon)
    rows = rows.join(wanted, on=_same("_pgcdc_t", CANON, n), how="left_semi")
    have = rows.groupBy(*[col(t) for t in tk]).agg(F.count(F.lit(1)).alias(HAVE))
    joined = values.join(have, on=_same(CANON, "_pgcdc_t", n), how="left")
    return joined.select(
        *[col(c) for c in values.columns], F.coalesce(col(HAVE), F.lit(0)).cast("bigint").alias(HAVE),
    )


def _copies(df, names: Sequence[str], count, kind: str):
    from pyspark.sql import functions as F

    return df.where(count > F.lit(0)).select(
        *[col(x) for x in names], F.lit(kind).alias(KIND), F.explode(F.sequence(F.lit(1), count)).alias(COUNT),
    ).drop(COUNT)


def merge_source(values, target, fields: Sequence[pa.Field]):
    """The MERGE source (no truncate in the batch): table columns and ``_pgcdc_kind``."""
    from pyspark.sql import functions as F

    names = [f.name for f in fields]
    counted = _counted(values, target, fields)
    final = F.greatest(col(HAVE) + col(SUM), col(SUM) - col(LOW))
    shrinks = final < col(HAVE)
    counted = counted.withColumn(COUNT, F.when(shrinks, final).otherwise(final - col(HAVE)).cast("int"))
    counted = counted.withColumn(KIND, F.when(shrinks, F.lit("del")).otherwise(F.lit("ins")))
    dels = counted.where(col(KIND) == F.lit("del")).select(*[col(x) for x in names], F.lit("del").alias(KIND))
    ins = _copies(counted, names, col(COUNT), "ins")
    return dels.unionByName(ins)


def rows_after_truncate(values, fields: Sequence[pa.Field]):
    """The table's rows after a truncate and the changes after it (``S - M`` copies)."""
    names = [f.name for f in fields]
    return _copies(values, names, (col(SUM) - col(LOW)).cast("int"), "ins").select(*[col(x) for x in names])


def apply_keyless(ctx, plan, url: str, dt, app: str, fields: list[pa.Field], generated=()) -> dict[str, Any]:
    """Apply the batch of a keyless table (see the module): one commit with the table's app
    transaction. ``fields``: the batch's columns as Delta stores them (the table has them);
    ``generated``: the table's generated date columns (:mod:`.generated`), computed from each
    row value, so they are part of it."""
    from airflow_pgcdc.merge.context import window_metadata
    from airflow_pgcdc.merge.generated import with_generated

    name = plan.qualified_name
    hint = (f"ALTER TABLE {quote_qualified(plan.schema, plan.table)} REPLICA IDENTITY FULL (a keyless "
            f"table's updates and deletes are applied from the old row it then sends), then take the table "
            f"again: pgcdc resync --tables {name}; or give it a primary key, or name one: --key {name}=col1,col2")
    _refuse(name, fields, hint)
    df = _changes(ctx, plan, fields)
    events = None
    if df is not None:
        _check(name, df, hint)
        events = with_generated(_events(df, [f.name for f in fields], plan.truncate_at), generated)
    fields = list(fields) + [g.field() for g in generated]
    if events is not None:
        values = _values(events, fields)
        if generated:  # the values whose count grows are inserted
            from airflow_pgcdc.merge.generated import refuse_infinite

            refuse_infinite(name, values.where(col(SUM) > 0), generated)
    else:  # a truncate alone
        from pyspark.sql import functions as F

        values = ctx.spark.createDataFrame([], _spark_schema(fields))
        values = values.select(*[col(x) for x in values.columns], F.lit(0).cast("bigint").alias(SUM),
                               F.lit(0).cast("bigint").alias(LOW))
    metadata = window_metadata(ctx, plan)
    if plan.truncate_at is not None:
        log.info("%s: keyless, truncated in the batch: its rows are replaced by what the changes after "
                 "the truncate leave", name)
        return _commit(ctx, plan, url, dt, app, fields, rows_after_truncate(values, fields), None, metadata)
    source = merge_source(values, ctx.sink.read(url, dt, fields), fields)
    return _commit(ctx, plan, url, dt, app, fields, None, source, metadata)


def _commit(ctx, plan, url, dt, app, fields, rows, source, metadata) -> dict[str, Any]:
    """One commit: ``rows`` replace the table (a truncate), or ``source`` is merged (an
    empty source: an empty append, for the app transaction)."""
    from airflow_pgcdc.merge.sinks.base import Commit

    names = [f.name for f in fields]
    floats, nested = float_columns(fields), nested_float_columns(fields)
    return ctx.sink.keyless(
        url, dt, rows, source, fields,
        lambda dialect: build_keyless_spec(columns=names, float_columns=floats, nested_float_columns=nested,
                                           dialect=dialect),
        Commit(app, plan.commit_version, metadata, plan.cut_transactions(app)),
        where=(plan.schema, plan.table, f"keyless-w{plan.last_window}"),
    )
