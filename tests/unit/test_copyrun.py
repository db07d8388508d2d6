"""pg.copyrun without a server: which libpq it takes its functions from, the switch that
turns it off, and the native call's argument checks (its reads of a real stream are
tests/integration/test_drain_copyrun.py's)."""

from __future__ import annotations

import os

import psycopg  # noqa: F401 - loads psycopg's libpq, as the drain has by then
import pytest

from airflow_pgcdc.pg import copyrun


@pytest.fixture
def fresh_cache():
    copyrun.libpq_functions.cache_clear()
    yield
    copyrun.libpq_functions.cache_clear()


def test_the_libpq_found_is_psycopgs_own(fresh_cache):
    from psycopg import pq

    libs = copyrun._mapped_libpq()
    assert libs, "psycopg's libpq is mapped into this process"
    assert all(os.path.basename(p).startswith(("libpq.so", "libpq-")) for p in libs)
    if pq.__impl__ == "binary":
        assert any("psycopg_binary" in p for p in libs)
    if copyrun._copyrun is None:
        pytest.skip("airflow_pgcdc.pg._copyrun is not built (test_drain_copyrun fails for it)")
    fns = copyrun.libpq_functions()
    assert fns is not None and len(set(fns)) == 3 and all(isinstance(f, int) and f for f in fns)


def test_pgcdc_copyrun_0_turns_it_off(fresh_cache, monkeypatch):
    monkeypatch.setenv(copyrun.COPYRUN_ENV, "0")
    assert copyrun.libpq_functions() is None


def test_two_candidate_libraries_turn_it_off(fresh_cache, monkeypatch):
    """Where it is not certain which libpq made the connection, runs are off."""
    from psycopg import pq

    monkeypatch.setattr(copyrun, "_mapped_libpq", lambda: [
        "/a/psycopg_binary.libs/libpq-1.so.5", "/b/psycopg_binary.libs/libpq-2.so.5",
        "/usr/lib/libpq.so.5", "/usr/lib/x/libpq.so.5"])
    if pq.__impl__ not in ("binary", "c"):
        pytest.skip(f"psycopg's {pq.__impl__} pq: runs are off anyway")
    assert copyrun.libpq_functions() is None


def test_the_native_call_checks_its_arguments():
    if copyrun._copyrun is None:
        pytest.skip("airflow_pgcdc.pg._copyrun is not built")
    with pytest.raises(ValueError, match="4-byte relation OID"):
        copyrun.take(1, (1, 1, 1), b"\x00\x00\x40", [], [], "I", "U", 10, 10, 48)
    with pytest.raises(ValueError, match="non-null"):
        copyrun.take(0, (1, 1, 1), b"\x00\x00\x40\x00", [], [], "I", "U", 10, 10, 48)
    # no room: nothing is read (the pointers are never called), status FULL
    assert copyrun.take(1, (1, 1, 1), b"\x00\x00\x40\x00", [], [], "I", "U", 0, 10, 48) == (
        copyrun.FULL, 0, 0, None, 0, 0)
