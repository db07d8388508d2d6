"""The slot lock: one session advisory lock per replication slot name, held by every
run that writes the slot's store (a snapshot, a drain) for as long as it runs.

The slot itself is exclusive only while a stream is open on it: a drain that read the
store, then started its stream after another drain had committed and released the
slot, would take a stale plan for the truth. The lock is taken *before* the store is
read, so two of our runs on one slot never interleave; the drain also checks again,
once the slot is its own, that nothing moved (see :mod:`airflow_pgcdc.drain.drain`).

The lock lives in the slot's database (a logical slot belongs to one database, and every
run connects there) and goes with the session: a SIGKILLed run releases it as soon as
the server sees its socket close. Its key is ``hashtextextended('pgcdc-slot:' || slot,
0)``, so ``pg_locks`` shows who holds it (:func:`lock_holder`).
"""

from __future__ import annotations

import time

import psycopg

__all__ = ["LOCK_PREFIX", "lock_holder", "try_lock_slot", "wait_lock_slot"]

LOCK_PREFIX = "pgcdc-slot:"


def try_lock_slot(conn: psycopg.Connection, slot: str) -> bool:
    """Take the slot's lock on ``conn``'s session if it is free (an autocommit session:
    the lock lasts until the session ends)."""
    return bool(conn.execute(
        "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (LOCK_PREFIX + slot,)
    ).fetchone()[0])


def wait_lock_slot(conn: psycopg.Connection, slot: str, wait: float, *, interval: float = 0.2) -> bool:
    """:func:`try_lock_slot`, tried again for up to ``wait`` seconds."""
    deadline = time.monotonic() + max(wait, 0.0)
    while True:
        if try_lock_slot(conn, slot):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def lock_holder(conn: psycopg.Connection, slot: str) -> str:
    """Who holds the slot's lock, for an error message: ``pid 123 (application_name
    'pgcdc-drain', client 127.0.0.1, since 12:00:01 UTC)``; ``"another session"`` when
    the catalogs do not say (no privilege to see it)."""
    row = conn.execute(
        """
        SELECT a.pid, a.application_name, host(a.client_addr),
               to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS')
        FROM pg_catalog.pg_locks l
        JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
          AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
          AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended(%s, 0)
        LIMIT 1
        """,
        (LOCK_PREFIX + slot,),
    ).fetchone()
    if row is None:
        return "another session"
    pid, app, addr, since = row
    where = f", client {addr}" if addr else ""
    return f"pid {pid} (application_name {app or ''!r}{where}, connected since {since} UTC)"
