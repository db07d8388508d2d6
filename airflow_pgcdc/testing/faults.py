"""Fault injection for the crash tests (tests only; inert unless the environment asks).

``PGCDC_FAULT=<point>``: the process SIGKILLs itself when it reaches ``point`` (no
cleanup runs, as in a real crash). Points are named by the jobs that call
:func:`fault_point` (the drain's, the merge's ``merge-after-stage`` and
``merge-after-commit``).
"""

from __future__ import annotations

import logging
import os
import signal

FAULT_ENV = "PGCDC_FAULT"


def fault_point(point: str, log: logging.Logger | None = None) -> None:
    if os.environ.get(FAULT_ENV) == point:
        (log or logging.getLogger(__name__)).warning("fault injection: killing the process at %s", point)
        os.kill(os.getpid(), signal.SIGKILL)
