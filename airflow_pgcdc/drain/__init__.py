"""The change drain: one LSN window of a logical slot to S3 per call (see :mod:`.drain`)."""

from airflow_pgcdc.drain.drain import (
    DrainError,
    DrainResult,
    DrainTimeout,
    SlotAheadOfStore,
    SlotNotFound,
    WindowConflict,
    drain_window,
)

__all__ = [
    "DrainError",
    "DrainResult",
    "DrainTimeout",
    "SlotAheadOfStore",
    "SlotNotFound",
    "WindowConflict",
    "drain_window",
]
