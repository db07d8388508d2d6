"""A job's progress over its (Delta) tables, logged at intervals (a merge or upkeep of many tables is
no longer silent between its start and its end): tables done of all, failed, the job's own
counts (rows merged, bytes removed...), percent of tables, rate and ETA by tables."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["PROGRESS_SECONDS", "TablesProgress"]

PROGRESS_SECONDS = 30.0
"""How often a job logs its progress over its tables (and once at the end when it logged before)."""


class TablesProgress:
    """Counts the tables of a job (``job``: the line's first word) as each ends (:meth:`done`,
    from any worker thread); returns a line to log when :data:`PROGRESS_SECONDS` passed since
    the last one."""

    def __init__(self, total: int, *, job: str = "merge", interval: float = PROGRESS_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.job, self.interval, self.clock = total, job, interval, clock
        self.started = self.last = clock()
        self.tables = self.failed = 0
        self.counts: dict[str, int] = {}
        self.logged = False
        self._lock = threading.Lock()

    def done(self, action: str, **counts: int) -> str | None:
        """One table ended (its result's ``action``, and what to add to the job's counts: the
        names are the line's words, ``_`` for spaces); the line to log, or None."""
        with self._lock:
            self.tables += 1
            self.failed += action == "failed"
            for name, n in counts.items():
                self.counts[name] = self.counts.get(name, 0) + int(n or 0)
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
        if self.tables >= self.total:
            eta = "0s"
        else:
            eta = f"{(self.total - self.tables) / rate:,.0f}s" if self.tables else "unknown"
        counts = "".join(f", {n:,} {name.replace('_', ' ')}" for name, n in self.counts.items())
        return (f"{self.job}: {self.tables}/{self.total} tables ({pct:.1f}%), {self.failed} failed{counts}, "
                f"{elapsed:,.0f}s, {rate:,.2f} tables/s, ETA {eta}")
