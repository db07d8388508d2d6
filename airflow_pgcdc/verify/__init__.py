"""``pgcdc verify``: does a Delta table hold exactly what its PostgreSQL table holds?

The job is :mod:`.job`; this face re-exports its names."""

from airflow_pgcdc.verify.job import (  # noqa: F401
    MULTISET,
    ChangedRow,
    ColumnDiff,
    Comparer,
    Comparison,
    DeltaReadError,
    DeltaTableNotFound,
    DuplicateKey,
    KeyColumnError,
    NoKey,
    SourceTableNotFound,
    TypeMismatch,
    VerifyError,
    VerifyResult,
    compare_tables,
    delta_table_location,
    open_delta_table,
    resolve_key,
    verify_table,
)

__all__ = [
    "MULTISET",
    "ChangedRow",
    "ColumnDiff",
    "Comparer",
    "Comparison",
    "DeltaReadError",
    "DeltaTableNotFound",
    "DuplicateKey",
    "KeyColumnError",
    "NoKey",
    "SourceTableNotFound",
    "TypeMismatch",
    "VerifyError",
    "VerifyResult",
    "compare_tables",
    "delta_table_location",
    "open_delta_table",
    "resolve_key",
    "verify_table",
]
