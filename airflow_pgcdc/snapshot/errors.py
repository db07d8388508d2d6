"""The snapshot's base error, below its options and its entry points (both raise it)."""

from __future__ import annotations

from airflow_pgcdc.errors import HintedError

__all__ = ["SnapshotError"]


class SnapshotError(HintedError):
    """The snapshot could not be taken."""
