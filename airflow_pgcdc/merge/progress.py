"""The merge job's progress over its tables, logged at intervals (a catch-up or bootstrap of
many tables is no longer silent between its start and its end): tables done of all, failed,
rows bootstrapped and merged, percent of tables, rate and ETA by tables."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["PROGRESS_SECONDS", "TablesProgress"]

PROGRESS_SECONDS = 30.0
"""How often the merge logs its progress (and once at the end when it logged before)."""


class TablesProgress:
    """Counts the tables of a job as each ends (:meth:`done`, from any table worker); returns
    a line to log when :data:`PROGRESS_SECONDS` passed since the last one."""

    def __init__(self, total: int, *, interval: float = PROGRESS_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.interval, self.clock = total, interval, clock
        self.started = self.last = clock()
        self.tables = self.failed = self.rows = self.bootstrap_rows = 0
        self.logged = False
        self._lock = threading.Lock()

    def done(self, action: str, merged_rows: int = 0, bootstrap_rows: int = 0) -> str | None:
        """One table ended (its result's ``action`` and rows); the line to log, or None."""
        with self._lock:
            self.tables += 1
            self.failed += action == "failed"
            self.rows += int(merged_rows or 0)
            self.bootstrap_rows += int(bootstrap_rows or 0)
            now = self.clock()
            if now - self.last < self.interval and not (self.logged and self.tables == self.total):
                return None
            self.last, self.logged = now, True
            return self.line(now)

    def line(self, now: float | None = None) -> str:
        now = self.clock() if now is None else now
        elapsed = max(now - self.started, 1e-9)
        pct = 100.0 * self.tables / self.total if self.total else 100.0
        rate = self.tables / elapsed
        eta = f"{(self.total - self.tables) / rate:,.0f}s" if self.tables and self.tables < self.total else (
            "0s" if self.tables >= self.total else "unknown")
        return (f"merge: {self.tables}/{self.total} tables ({pct:.1f}%), {self.failed} failed, "
                f"{self.bootstrap_rows:,} rows bootstrapped, {self.rows:,} change rows merged, "
                f"{elapsed:,.0f}s, {rate:,.2f} tables/s, ETA {eta}")
