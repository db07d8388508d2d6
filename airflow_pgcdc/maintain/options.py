"""What upkeep is asked (:class:`MaintainOptions`), apart from the call
(:func:`~.job.maintain_slot`): the library call takes it (or its fields as keywords), ``pgcdc
maintain`` builds it once from its arguments (:meth:`MaintainOptions.from_args`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from airflow_pgcdc.errors import PgcdcError
from airflow_pgcdc.lake.sizing import target_bytes
from airflow_pgcdc.maintain.tables import DEFAULT_TARGET_SIZE
from airflow_pgcdc.maintain.unreferenced import UNREFERENCED_FLOOR_HOURS
from airflow_pgcdc.options import JobOptions

__all__ = ["DEFAULT_RETENTION_HOURS", "DEFAULT_TARGET_SIZE", "MaintainOptions", "UNREFERENCED_FLOOR_HOURS"]

DEFAULT_RETENTION_HOURS = 168
"""How long removed Delta files, expired windows and staging debris are kept (a week)."""



@dataclass(frozen=True, kw_only=True)
class MaintainOptions(JobOptions):
    """What :func:`~.job.maintain_slot` is asked, past the store, the slot and the Delta
    root (each field's meaning is the call's)."""

    job: ClassVar[str] = "upkeep"

    tables: tuple[str, ...] | None = None
    retention_hours: float = DEFAULT_RETENTION_HOURS
    zorder: bool = False
    target_size: int = DEFAULT_TARGET_SIZE
    dry_run: bool = False
    windows: bool = True
    unreferenced_floor_hours: float = UNREFERENCED_FLOOR_HOURS
    lock_wait: float | None = None

    def __post_init__(self) -> None:
        if self.tables is not None:
            self._put("tables", self._names(self.tables))
        if isinstance(self.retention_hours, bool) or float(self.retention_hours) < 0:
            raise PgcdcError(f"retention must be 0 hours or more, got {self.retention_hours}")
        self._put("retention_hours", float(self.retention_hours))
        if isinstance(self.target_size, bool) or int(self.target_size) < 1:
            raise PgcdcError(f"the target file size must be positive, got {self.target_size} bytes")
        for name in ("zorder", "dry_run", "windows"):
            self._put(name, bool(getattr(self, name)))

    @classmethod
    def from_args(cls, args: Any) -> MaintainOptions:
        """From ``pgcdc maintain``'s parsed arguments."""
        return cls.of(tables=args.tables, retention_hours=args.retention_hours, zorder=args.zorder,
                      target_size=target_bytes(args.target_file_mb) if args.target_file_mb else None,
                      dry_run=args.dry_run, windows=args.windows)
