"""CDC metadata columns and soft deletes in the Delta tables (``pgcdc merge --metadata-columns``, a table's
own ``--table-option schema.table:metadata_columns=…``): beside its columns, each row
carries where its current values come from.

* ``_pgcdc_op`` (string): ``I`` or ``U``, the operation of the row's last change; ``R``
  for a row as a copy (the snapshot, a resync) read it;
* ``_pgcdc_commit_lsn`` (int64): the commit LSN of that change's transaction (a copy's
  row: the copy's consistent point);
* ``_pgcdc_commit_ts`` (timestamp, UTC): that transaction's commit time (a copy's row: NULL);
* ``_pgcdc_merged_at`` (timestamp, UTC): when the merge wrote the row's current values.

The first three are the names of the change metadata in the store, which a source column
may not have (the drain refuses such a table); ``_pgcdc_merged_at`` a source column may
have, and such a table is refused (:class:`~.errors.ReservedColumnName`) while the option
is on. Keyless tables never get them (their rows are matched on every column).

Soft deletes (``--soft-deletes``): ``_pgcdc_deleted_at`` (timestamp, UTC), last: NULL for a
live row; the delete's commit time for a row the source deleted, which keeps its last values
(and, with the metadata columns, the delete's ``D``, LSN and commit time); a truncate marks
every live row with its commit time; a new row of the key sets it back to NULL. The clauses
are :func:`~.clauses.build_merge_spec`'s. No Spark at import: a batch is either an Arrow
table (the driver's) or a Spark DataFrame."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from airflow_pgcdc.changes.columns import COMMIT_LSN, COMMIT_TS, DELETED_AT, MERGED_AT, OP
from airflow_pgcdc.merge.errors import ReservedColumnName

__all__ = ["COPY_OP", "METADATA_COLUMNS", "copy_metadata", "deleted_at_field", "extra_fields", "reserved_clash",
           "truncate_mark", "with_deleted_at", "with_merged_at"]

COPY_OP = "R"
"""``_pgcdc_op`` of a row as a copy read it."""

METADATA_COLUMNS = (OP, COMMIT_LSN, COMMIT_TS, MERGED_AT)
"""The metadata columns, in the order the Delta table gets them."""

_TIME = pa.timestamp("us", tz="UTC")


def metadata_fields() -> list[pa.Field]:
    """The Delta table's metadata columns (every one nullable: rows merged before the option
    was turned on hold NULL)."""
    return [pa.field(OP, pa.string()), pa.field(COMMIT_LSN, pa.int64()), pa.field(COMMIT_TS, _TIME),
            pa.field(MERGED_AT, _TIME)]


def deleted_at_field() -> pa.Field:
    """``_pgcdc_deleted_at`` (soft deletes)."""
    return pa.field(DELETED_AT, _TIME)


def extra_fields(metadata: bool, soft: bool) -> list[pa.Field]:
    """The columns the merge adds after a table's own, in their order."""
    return (metadata_fields() if metadata else []) + ([deleted_at_field()] if soft else [])


def reserved_clash(name: str, columns: Sequence[str], *, metadata: bool = True, soft: bool = False) -> None:
    """Refuse the table ``name`` when one of its ``columns`` is named like a column the
    merge adds to it (the metadata columns, ``_pgcdc_deleted_at``)."""
    added = (set(METADATA_COLUMNS) if metadata else set()) | ({DELETED_AT} if soft else set())
    clash = sorted(set(columns) & added)
    if clash:
        options = [o for o, on in (("metadata_columns", metadata), ("soft_deletes", soft)) if on]
        raise ReservedColumnName(
            f"table {name}: column(s) {clash} have the name of a column the merge adds "
            f"({', '.join('--' + o.replace('_', '-') for o in options)})",
            hint=f"rename the column(s) in PostgreSQL and pgcdc resync the table, or leave {name} out: "
                 + " ".join(f"--table-option {name}:{o}=false" for o in options))


def now() -> datetime:
    return datetime.now(UTC)


def with_merged_at(rows: Any, when: datetime) -> Any:
    """``rows`` (an Arrow table or a Spark DataFrame) with ``_pgcdc_merged_at = when`` last."""
    if isinstance(rows, pa.Table):
        return rows.append_column(pa.field(MERGED_AT, _TIME), pa.array([when] * rows.num_rows, _TIME))
    from pyspark.sql import functions as F

    return rows.withColumn(MERGED_AT, F.lit(when))


def with_deleted_at(rows: Any) -> Any:
    """A copy's ``rows`` with ``_pgcdc_deleted_at`` NULL (every row live) last."""
    if isinstance(rows, pa.Table):
        return rows.append_column(deleted_at_field(), pa.nulls(rows.num_rows, _TIME))
    from pyspark.sql import functions as F

    return rows.withColumn(DELETED_AT, F.lit(None).cast("timestamp"))


def truncate_mark(commit_time: str | None, fallback: datetime) -> str:
    """What a truncate's marks say, as ISO 8601 UTC text for a SQL literal: its commit time
    (a window's ``commit_time``), or ``fallback`` (the merge's time) when its window did not
    record one."""
    when = datetime.fromisoformat(commit_time) if commit_time else fallback
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def copy_metadata(rows: Any, lsn: int, when: datetime) -> Any:
    """A copy's ``rows`` (an Arrow table or a Spark DataFrame) with the metadata columns last:
    ``R``, the copy's consistent point ``lsn``, no commit time, merged ``when``."""
    if isinstance(rows, pa.Table):
        n = rows.num_rows
        for f, values in zip(metadata_fields(), ([COPY_OP] * n, [int(lsn)] * n, [None] * n, [when] * n), strict=True):
            rows = rows.append_column(f, pa.array(values, f.type))
        return rows
    from pyspark.sql import functions as F

    return (rows.withColumn(OP, F.lit(COPY_OP)).withColumn(COMMIT_LSN, F.lit(int(lsn)).cast("bigint"))
            .withColumn(COMMIT_TS, F.lit(None).cast("timestamp")).withColumn(MERGED_AT, F.lit(when)))
