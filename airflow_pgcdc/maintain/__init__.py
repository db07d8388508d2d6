"""``pgcdc maintain``: upkeep of a slot's Delta tables and change store (no Airflow, no Spark).

The job is :mod:`.job`; this face re-exports its names."""

from airflow_pgcdc.maintain.job import (  # noqa: F401
    DEFAULT_RETENTION_HOURS,
    DEFAULT_TARGET_SIZE,
    MaintainResult,
    TablesFailed,
    expired_key,
    last_maintenance,
    maintain_slot,
    read_expired,
    record_key,
)

__all__ = [
    "DEFAULT_RETENTION_HOURS",
    "DEFAULT_TARGET_SIZE",
    "MaintainResult",
    "TablesFailed",
    "expired_key",
    "last_maintenance",
    "maintain_slot",
    "read_expired",
    "record_key",
]
