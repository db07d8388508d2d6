"""A job's progress over its (Delta) tables, logged at intervals (a merge or upkeep of many tables is
no longer silent between its start and its end): tables done of all, failed, the job's own
counts (rows merged, bytes removed...), percent of tables, rate and ETA by tables; and inside
one table, the rows a long write has streamed into its Delta table (:func:`logged_reader`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["PROGRESS_SECONDS", "TablesProgress", "logged_reader"]

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


def logged_reader(reader, *, total_rows: int, label: str, log, interval: float = PROGRESS_SECONDS,
                  clock: Callable[[], float] = time.monotonic):
    """``reader`` (an Arrow ``RecordBatchReader``) as one that logs, every ``interval`` seconds
    while its consumer (a delta-rs write) reads it, ``{label}: 1,200,000/5,000,000 rows (24.0%),
    310.2 MB, 45s, 26,667 rows/s, ETA 143s``, and a last line at its end when it logged before."""
    import pyarrow as pa

    def batches():
        started = last = clock()
        rows = size = 0
        logged = False

        def line(now: float) -> str:
            elapsed = max(now - started, 1e-9)
            rate = rows / elapsed
            pct = f" ({100.0 * rows / total_rows:.1f}%)" if total_rows else ""
            left = max(total_rows - rows, 0)
            eta = "0s" if not left else (f"{left / rate:,.0f}s" if rate else "unknown")
            return (f"{label}: {rows:,}/{total_rows:,} rows{pct}, {size / 1e6:,.1f} MB, {elapsed:,.0f}s, "
                    f"{rate:,.0f} rows/s, ETA {eta}")

        for batch in reader:
            rows += batch.num_rows
            size += batch.nbytes
            now = clock()
            if now - last >= interval:
                last, logged = now, True
                log.info("%s", line(now))
            yield batch
        if logged:
            log.info("%s", line(clock()))

    return pa.RecordBatchReader.from_batches(reader.schema, batches())
