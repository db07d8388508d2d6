"""What a drain is asked (:class:`DrainOptions`) and what it answers (:class:`DrainResult`):
the drain's two public objects, apart from the call (:func:`~.drain.drain_window`) so that
every module of the drain can name them without importing the entry point."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.store.window import DEFAULT_MEMORY_BUDGET

__all__ = ["DrainOptions", "DrainResult"]


@dataclass
class DrainResult:
    """What one drain did. ``window_seq`` is ``None`` when there was nothing to drain
    (``end_lsn <= start_lsn``); ``acknowledged_only`` when it only re-sent a lost
    acknowledgement."""

    slot: str
    window_seq: int | None
    start_lsn: str
    end_lsn: str
    end_reason: str | None = None
    transactions: int = 0
    rows: int = 0
    bytes: int = 0
    tables: dict[str, int] = field(default_factory=dict)
    manifest: str | None = None
    acknowledged_lost: bool = False
    seconds: float = 0.0
    # {"schema.table": {"updates", "columns", "first_commit_lsn"}}: key-changing updates
    # whose unchanged TOAST values the server did not send (the merge recovers them from
    # the old key's row when it can, see merge.compact; else it writes NULL there)
    lost_toast: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "window_seq": self.window_seq,
            "start_lsn": self.start_lsn,
            "end_lsn": self.end_lsn,
            "end_reason": self.end_reason,
            "transactions": self.transactions,
            "rows": self.rows,
            "bytes": self.bytes,
            "tables": dict(self.tables),
            "manifest": self.manifest,
            "acknowledged_lost": self.acknowledged_lost,
            "lost_toast": {k: dict(v) for k, v in self.lost_toast.items()},
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True)
class DrainOptions:
    """What :func:`drain_window` was asked for, past the DSN, the store and the slot (the
    meaning of each field is :func:`drain_window`'s; ``forget`` holds the parsed
    ``forget_tables``)."""

    publications: tuple[str, ...]
    until_lsn: LSN | str | int | None = None
    max_rows: int | None = None
    max_bytes: int | None = None
    max_seconds: float | None = None
    skip_origins: tuple[str, ...] = ()
    message_prefixes: tuple[str, ...] | None = None
    binary: bool = False
    heartbeat: bool = True
    heartbeat_after: float = 1.0
    max_wait: float = 300.0
    status_interval: float = 1.0
    spool_dir: str | None = None
    connect_options: str | None = None
    target_part_bytes: int | None = None
    forget: frozenset[tuple[str, str]] = frozenset()
    busy_wait: float = 10.0
    memory_budget: int = DEFAULT_MEMORY_BUDGET
    start_without_snapshot: bool = False
    as_text: Mapping[tuple[str, str], frozenset[str]] = field(default_factory=dict)

