"""Fault injection for the crash tests, for every job (tests only; inert unless the
environment asks).

``PGCDC_FAULT=<point>``: the process SIGKILLs itself when it reaches ``point`` (no cleanup
runs, as in a real crash). ``PGCDC_PAUSE=<point>``: it pauses there once instead, for
``PGCDC_PAUSE_SECONDS`` (default 3), after creating the file ``PGCDC_PAUSE_FILE`` (so a
test can act while the job is mid-way). Points are named by the jobs that call
:func:`fault_point`: the drain's (``airflow_pgcdc.drain.drain.FAULT_POINTS``), the merge's
``merge-after-stage`` and ``merge-after-commit``.
"""

from __future__ import annotations

import logging
import os
import signal
import time

FAULT_ENV = "PGCDC_FAULT"
PAUSE_ENV = "PGCDC_PAUSE"


def fault_point(point: str, log: logging.Logger | None = None) -> None:
    """Kill or pause this process at ``point`` when the environment names it."""
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
