"""Fault injection for the crash tests, for every job: the product's one test hook, at the
bottom layer (beside :mod:`airflow_pgcdc.errors`), inert unless the environment asks.

``PGCDC_FAULT=<point>``: the process SIGKILLs itself when it reaches ``point`` (no cleanup
runs, as in a real crash). ``PGCDC_PAUSE=<point>``: it pauses there once instead, for
``PGCDC_PAUSE_SECONDS`` (default 3), after creating the file ``PGCDC_PAUSE_FILE`` (so a
test can act while the job is mid-way). ``PGCDC_FAULT_AFTER=<n>``: the drain's
``after-receive`` point fires once ``n`` transactions (default 1) are in the window.

The points are the members of :class:`FaultPoint`; a job calls :func:`fault_point` with one
of them, never with a string of its own.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from enum import StrEnum

__all__ = ["DRAIN_POINTS", "FAULT_ENV", "PAUSE_ENV", "FaultPoint", "armed", "fault_after", "fault_point"]

FAULT_ENV = "PGCDC_FAULT"
PAUSE_ENV = "PGCDC_PAUSE"
FAULT_AFTER_ENV = "PGCDC_FAULT_AFTER"


class FaultPoint(StrEnum):
    """Where a job can be killed or paused; the value is what ``PGCDC_FAULT`` names."""

    DRAIN_AFTER_RECEIVE = "after-receive"
    """The drain, once ``PGCDC_FAULT_AFTER`` transactions are in the window."""
    DRAIN_DURING_UPLOAD = "during-upload"
    """The drain, when the first Parquet part is about to complete its upload."""
    DRAIN_AFTER_PARTS = "after-parts"
    """The drain: every part uploaded, no manifest yet."""
    DRAIN_AFTER_MANIFEST = "after-manifest"
    """The drain: the window is committed, not acknowledged."""
    DRAIN_AFTER_ACK = "after-ack"
    """The drain: acknowledged, before the stream is closed."""
    MERGE_AFTER_STAGE = "merge-after-stage"
    """The merge: a table's rows are staged (or read), nothing committed."""
    MERGE_AFTER_COMMIT = "merge-after-commit"
    """The merge: a table's commit is made, the job has not moved on."""


DRAIN_POINTS: tuple[FaultPoint, ...] = tuple(p for p in FaultPoint if p.name.startswith("DRAIN_"))
"""The drain's points, in the order a window reaches them."""


def armed(point: FaultPoint) -> bool:
    """Whether the environment asks to kill or pause at ``point``."""
    return point in (os.environ.get(FAULT_ENV), os.environ.get(PAUSE_ENV))


def fault_after() -> int | None:
    """How many transactions the drain's ``after-receive`` point waits for, or ``None`` when
    that point is not armed (read once per window: the point is checked per transaction)."""
    if not armed(FaultPoint.DRAIN_AFTER_RECEIVE):
        return None
    return int(os.environ.get(FAULT_AFTER_ENV, "1"))


def fault_point(point: FaultPoint, log: logging.Logger | None = None) -> None:
    """Kill or pause this process at ``point`` when the environment names it."""
    point = FaultPoint(point)  # a name that is not a point is a ValueError, not a silent no-op
    if os.environ.get(FAULT_ENV) == point:
        (log or logging.getLogger(__name__)).warning("fault injection: killing the process at %s", point)
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(PAUSE_ENV) == point:
        os.environ.pop(PAUSE_ENV)  # once
        marker = os.environ.get("PGCDC_PAUSE_FILE")
        if marker:
            with open(marker, "w") as f:
                f.write(point)
        time.sleep(float(os.environ.get("PGCDC_PAUSE_SECONDS", "3")))
