"""Generated date partition columns: ``--table-option schema.table:partition_by=date(created_at)``.

A table partitioned by the day of a timestamp column gets one more column, a Delta
*generated column* ``created_at_date`` (``date(created_at) as day`` names it ``day``) of type
``date`` whose ``delta.generationExpression`` is ``CAST(`created_at` AS DATE)``. The merge
computes its values itself, in Arrow or in Spark (the UTC date: the merge's Spark session
runs in UTC, as delta-rs does), wherever it writes rows: the bootstrap, a resync's
replacement, each MERGE's inserted and updated rows, a keyless table's appends and
rewrites. Both engines check every written value against the expression (a wrong value
fails the commit, it is never stored), and readers that know generated columns (Delta's
Spark engine) turn a filter on ``created_at`` into a partition filter on the date column.

The expression is in the Delta schema, so an existing table keeps its generated columns
whatever the options say later (:func:`from_schema`; as with ``partition_by``, only
``pgcdc rebuild`` partitions a table anew). Only ``CAST(`column` AS DATE)`` of a
``timestamp``/``timestamptz`` column is made here; a table whose schema holds another
generation expression is refused (:class:`~.errors.MergeError`): the merge cannot compute it.

A timestamp of ``'infinity'`` or ``'-infinity'`` has no day that delta-rs can compute (its
check of the expression fails on it): a row holding one in the source column of a date
partition is refused, for that table, naming the column (:func:`refuse_infinite`), on both
engines alike.

No Spark at import: rows are an Arrow table or a Spark DataFrame.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_pgcdc.changes.columns import OP
from airflow_pgcdc.lake.sql import quote_ident

__all__ = ["GENERATION_KEY", "DateColumn", "from_schema", "parse_partition_by", "partition_names", "refuse_infinite",
           "with_generated"]

GENERATION_KEY = "delta.generationExpression"
"""The Delta field metadata key of a generated column's expression (Spark SQL)."""

_SPEC = re.compile(r"^date\s*\(\s*(?P<source>[^()]+?)\s*\)(?:\s+as\s+(?P<name>\S.*?))?\s*$", re.IGNORECASE)
_EXPRESSION = re.compile(r"^CAST\(\s*`(?P<source>(?:[^`]|``)+)`\s+AS\s+DATE\s*\)$", re.IGNORECASE)


@dataclass(frozen=True)
class DateColumn:
    """The generated column ``name``: the UTC date of the timestamp column ``source``."""

    name: str
    source: str

    @property
    def expression(self) -> str:
        """Its ``delta.generationExpression`` (Spark SQL, the column quoted by the lake's one function)."""
        return f"CAST({quote_ident(self.source, 'spark')} AS DATE)"

    def field(self) -> pa.Field:
        """The Delta table's field (nullable: a NULL timestamp has no day)."""
        return pa.field(self.name, pa.date32(), metadata={GENERATION_KEY: self.expression})


def _error(message: str, hint: str):
    from airflow_pgcdc.merge.errors import MergeError

    return MergeError(message, hint=hint)


def _items(given: str) -> list[tuple[str, re.Match | None]]:
    return [(i, _SPEC.match(i)) for i in (x.strip() for x in str(given).split(",")) if i]


def _source(m: re.Match) -> str:
    source = m.group("source").strip()
    if len(source) > 1 and source[0] == source[-1] == '"':  # date("Created At")
        source = source[1:-1].replace('""', '"')
    return source


def _name(m: re.Match) -> str:
    return (m.group("name") or f"{_source(m)}_date").strip()


def _hint(table: str) -> str:
    return (f"--table-option {table}:partition_by=<columns of the table, or date(<timestamp column>) "
            "[as <name>], comma-separated>")


def partition_names(table: str, given: str, columns: Sequence[str]) -> tuple[str, ...]:
    """The partition column names ``partition_by``'s text gives (a generated column by its
    name), each checked to be one of ``columns`` (the table's, generated ones included). A
    ``date()`` whose source is among ``columns`` but whose generated column is not is left
    out: a table made without it (a history table, ``--history``) is partitioned by the
    other columns."""
    have = set(columns)
    names = tuple(_name(m) if m else item for item, m in _items(given)
                  if m is None or _name(m) in have or _source(m) not in have)
    missing = [n for n in names if n not in have]
    if missing or not names:
        raise _error(f"table {table}: partition_by names column(s) {missing or [given]} it does not have",
                     _hint(table))
    return names


def parse_partition_by(table: str, given: str, fields: Sequence[pa.Field]) -> tuple[tuple[str, ...], tuple[DateColumn, ...]]:
    """``partition_by``'s text for ``table`` (``a,b`` or ``date(ts)`` or ``date(ts) as day``,
    comma-separated) over its columns ``fields``: the partition column names in order, and
    the generated date columns among them. A :class:`~.errors.MergeError` names what is
    wrong: a column the table does not have, a ``date()`` of a column that is not a
    timestamp, a generated name that is already a column, a column given twice."""
    hint = _hint(table)
    types = {f.name: f.type for f in fields}
    names: list[str] = []
    generated: list[DateColumn] = []
    items = _items(given)
    if not items:
        raise _error(f"table {table}: partition_by {given!r} names no column", hint)
    for item, m in items:
        if m is None:
            if item not in types:
                raise _error(f"table {table}: partition_by names column(s) {[item]} it does not have", hint)
            names.append(item)
            continue
        source, name = _source(m), _name(m)
        t = types.get(source)
        if t is None:
            raise _error(f"table {table}: partition_by {item!r} names column {source!r}, which it does not have", hint)
        if not pa.types.is_timestamp(t):
            raise _error(f"table {table}: partition_by {item!r}: column {source!r} is {t}, not a timestamp "
                         "(date() is the day of a timestamp or timestamptz column)",
                         f"a date column partitions as it is: --table-option {table}:partition_by={source}")
        if name in types:
            raise _error(f"table {table}: partition_by {item!r} would add column {name!r}, which the table has",
                         f"name the generated column: --table-option {table}:partition_by=date({source}) as <name>")
        generated.append(DateColumn(name, source))
        names.append(name)
    if len(set(names)) != len(names):
        raise _error(f"table {table}: partition_by {given!r} names a column twice", hint)
    return tuple(names), tuple(generated)


def from_schema(table: str, schema: pa.Schema) -> tuple[DateColumn, ...]:
    """The generated date columns of a Delta table's ``schema`` (its fields' metadata), in
    order; a generation expression the merge does not compute is refused."""
    out = []
    for f in schema:
        meta = f.metadata or {}
        expression = meta.get(GENERATION_KEY.encode())
        if expression is None:
            continue
        m = _EXPRESSION.match(expression.decode())
        if m is None or not pa.types.is_date32(f.type):
            raise _error(f"table {table}: the Delta table's column {f.name!r} is generated as "
                         f"{expression.decode()!r}, which the merge does not compute",
                         "the merge writes only the date columns of partition_by=date(<column>): "
                         "pgcdc rebuild the table without that column")
        out.append(DateColumn(f.name, m.group("source").replace("``", "`")))
    return tuple(out)


def with_generated(rows: Any, columns: Sequence[DateColumn]) -> Any:
    """``rows`` (an Arrow table or a Spark DataFrame holding each column's source) with the
    generated ``columns`` last, in order: the UTC date of the source timestamp (NULL for
    NULL)."""
    if not columns:
        return rows
    if isinstance(rows, pa.Table):
        for c in columns:
            rows = rows.append_column(c.field(), pc.cast(rows.column(c.source), pa.date32()))
        return rows
    from airflow_pgcdc.merge.compact import col

    for c in columns:  # the session's time zone is UTC (merge.session.SPARK_CONF); the expression
        # rides in the column's metadata, so a table Spark creates from the rows has it
        rows = rows.withColumn(c.name, col(c.source).cast("date").alias(c.name, metadata={GENERATION_KEY: c.expression}))
    return rows


_INFINITE = (2**63 - 1, -(2**63))
"""``'infinity'`` and ``'-infinity'`` as the type map stores timestamps (int64 microseconds)."""


def refuse_infinite(table: str, rows: Any, columns: Sequence[DateColumn], *, deletes: bool = False) -> None:
    """Refuse (:class:`~.errors.MergeError`) ``rows`` of ``table`` that would write an
    ``'infinity'`` timestamp into the source of one of its date partition ``columns``
    (``deletes``: rows whose ``_pgcdc_op`` is ``D`` write nothing and are left out). One
    Spark job per column for a DataFrame."""
    for c in columns:
        if isinstance(rows, pa.Table):
            bad = pc.is_in(rows.column(c.source).cast(pa.int64()), value_set=pa.array(_INFINITE, pa.int64()))
            if deletes:
                bad = pc.and_(bad, pc.not_equal(rows.column(OP), "D"))
            found = bool(pc.any(bad).as_py())
        else:
            from pyspark.sql import functions as F

            from airflow_pgcdc.merge.compact import col

            cond = F.unix_micros(col(c.source).cast("timestamp")).isin(list(_INFINITE))
            if deletes:
                cond = cond & (col(OP) != F.lit("D"))
            found = bool(rows.where(cond).select(F.lit(1)).limit(1).collect())  # no row: it has no Python value
        if found:
            raise _error(f"table {table}: column {c.source!r} holds 'infinity' or '-infinity', which has no day "
                         f"for the date partition column {c.name!r}",
                         f"change those rows in PostgreSQL (then pgcdc resync --tables {table} if the copy holds "
                         f"them), or partition {table} by another column and pgcdc rebuild it")
