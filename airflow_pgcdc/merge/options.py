"""What a merge answers (:class:`MergeResult`, one :class:`TableResult` per table) and the
choices it is asked to make among (:data:`ENGINES`, :data:`HISTORIES`, :data:`READERS`):
apart from the call (:func:`~.job.merge_slot`), so that the errors and the other modules of
the merge name them without importing the job."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["ENGINES", "HISTORIES", "READERS", "MergeResult", "TableResult"]


ENGINES = ("delta-rs", "delta-spark")


HISTORIES = (None, "changelog", "scd2")


READERS = ("python", "s3a")


@dataclass
class TableResult:
    table: str
    delta_url: str
    # bootstrapped[+merged] | resynced[+merged] | merged | merged-by-concurrent-job |
    # up-to-date | no-changes | skipped (``note`` says why) | failed
    action: str
    app_id: str = ""
    bootstrap_rows: int = 0
    first_window: int | None = None
    last_window: int | None = None
    start_lsn: str | None = None
    end_lsn: str | None = None
    change_rows: int = 0
    merged_rows: int = 0
    truncates: int = 0
    added_columns: list[str] = field(default_factory=list)
    delta_version: int | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    history: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None  # action "failed": what went wrong, and what to do
    hint: str | None = None
    # the table is no longer in the pipeline (dropped, or out of the publication) as of the
    # newest window read: its Delta table keeps its last state
    left_pipeline: bool = False
    note: str | None = None  # why a table was skipped


@dataclass
class MergeResult:
    slot: str
    source: str
    delta: str
    tables: list[TableResult] = field(default_factory=list)
    seconds: float = 0.0
    # a replay to a point: {lsn, window (the one cut there), asked}
    until: dict[str, Any] | None = None

    @property
    def failed(self) -> list[TableResult]:
        return [t for t in self.tables if t.action == "failed"]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

