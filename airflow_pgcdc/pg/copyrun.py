"""Runs of like CopyData messages taken straight from libpq (the native
:mod:`airflow_pgcdc.pg._copyrun`, built by ``setup.py``): the drain's path for a plain
transaction's Inserts of one table, without a Python object per frame.

The native code calls libpq's ``PQgetCopyData``, ``PQfreemem`` and ``PQconsumeInput`` on
the connection psycopg made, so it must call them in the very library psycopg loaded:
psycopg's binary wheel carries its own libpq, and a second one (the system's) may be
loaded too. :func:`libpq_functions` finds the library psycopg's ``pq`` module uses among
the process' mapped files and takes the three addresses from it (``ctypes``); where that
is not certain (no ``/proc/self/maps``, psycopg's pure-Python ``pq``, two candidates) it
answers ``None`` and the drain reads every frame the ordinary way (the same result).
``PGCDC_COPYRUN=0`` turns the native path off (tests run the drain both ways).
"""

from __future__ import annotations

import ctypes
import logging
import os
from functools import cache

log = logging.getLogger(__name__)

try:
    from airflow_pgcdc.pg import _copyrun
except ImportError:  # pragma: no cover - depends on the install (no C compiler)
    _copyrun = None

COPYRUN_ENV = "PGCDC_COPYRUN"

# CopyData taken stops for one of these (the native module's status)
NOTHING_BUFFERED, OTHER_MESSAGE, FULL, ENDED, FAILED = 0, 1, 2, -1, -2


def _mapped_libpq() -> list[str]:
    """The distinct libpq files mapped into this process."""
    try:
        with open("/proc/self/maps") as f:
            fields = [line.split(None, 5) for line in f]
    except OSError:
        return []
    paths = {x[5].strip() for x in fields if len(x) == 6}
    return sorted(p for p in paths if os.path.basename(p).startswith(("libpq.so", "libpq-")))


@cache
def libpq_functions() -> tuple[int, int, int] | None:
    """``(PQgetCopyData, PQfreemem, PQconsumeInput)`` addresses in the libpq psycopg
    uses, or ``None`` when the native path is off, not built, or the library is not
    certain."""
    if _copyrun is None or os.environ.get(COPYRUN_ENV, "1") == "0":
        return None
    from psycopg import pq

    impl = pq.__impl__
    if impl not in ("binary", "c"):
        return None  # the pure-Python pq: its ctypes libpq is loaded by name, take no chances
    libs = _mapped_libpq()
    if impl == "binary":  # psycopg_binary links its own copy
        libs = [p for p in libs if "psycopg_binary" in p]
    else:
        libs = [p for p in libs if "psycopg_binary" not in p]
    if len(libs) != 1:
        log.debug("native CopyData runs off: libpq candidates %s", libs)
        return None
    try:
        lib = ctypes.CDLL(libs[0], mode=os.RTLD_NOLOAD | os.RTLD_NOW)  # the loaded one, never a new copy
        fns = tuple(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
                    for name in ("PQgetCopyData", "PQfreemem", "PQconsumeInput"))
    except (OSError, AttributeError) as exc:
        log.debug("native CopyData runs off: %s", exc)
        return None
    if not all(fns):
        return None
    return fns  # type: ignore[return-value]


take = _copyrun.take if _copyrun is not None else None
"""``take(pgconn_ptr, fns, oid, images, ops, insert, update, rows_left, bytes_left, overhead)
-> (status, count, nbytes, payload, data_start, wal_end)``: the native call itself (see
``airflow_pgcdc/pg/_copyrun.c``), no Python frame between it and the receive loop; None
where the module is not built (then :func:`libpq_functions` is None too)."""
