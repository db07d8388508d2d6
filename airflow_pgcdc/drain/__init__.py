"""The change drain: one LSN window of a logical slot to S3 per call (see :mod:`.drain`);
what it checks before it confirms anything is in :mod:`.guards`."""

from airflow_pgcdc.drain.drain import (
    DrainBusy,
    DrainError,
    DrainTimeout,
    PipelineTablesUnpublished,
    PublicationMissing,
    PublicationNotFound,
    ServerMismatch,
    SlotAheadOfStore,
    SlotNotFound,
    WindowConflict,
    drain_window,
)
from airflow_pgcdc.drain.options import DrainResult

__all__ = [
    "DrainBusy",
    "DrainError",
    "DrainResult",
    "DrainTimeout",
    "PipelineTablesUnpublished",
    "PublicationMissing",
    "PublicationNotFound",
    "ServerMismatch",
    "SlotAheadOfStore",
    "SlotNotFound",
    "WindowConflict",
    "drain_window",
]
