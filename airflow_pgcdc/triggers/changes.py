"""``PgcdcChangesTrigger``: wait, in the triggerer, until a slot has changes worth draining.

Every ``poll_interval`` seconds it reads the slot's health (``pg_replication_slots`` and
the server's current WAL insert position, :func:`airflow_pgcdc.pg.slots.aslot_health`)
on an asyncio psycopg connection it keeps open between polls, and fires once:

- ``{"status": "ready", "reason": "min_bytes" | "max_delay" | "unreserved", "observed_lsn",
  "pending_bytes", "confirmed_flush_lsn", ...}`` when the pending WAL reaches ``min_bytes``,
  or the oldest unacknowledged change has waited ``max_delay`` seconds (as
  :class:`PendingClock` measures it: a lower bound, see :mod:`airflow_pgcdc.pg.slots`), or
  at once when the slot is ``unreserved`` (it holds more WAL than
  ``max_slot_wal_keep_size``: the next checkpoint may remove WAL it needs, and draining
  now is its only rescue; the event carries a ``warning``, logged as an error).
  ``observed_lsn`` is the server's WAL position at that poll: the drain's window end.
- ``{"status": "error", "error": kind, "message", "hint", "slot"}`` when the slot is
  lost (``wal_status`` 'lost', or invalidated: ``slot_lost``), missing
  (``slot_missing``), in use by another process (``slot_in_use``), not a logical pgoutput
  slot of this database (``slot_mismatch``), when the publication is missing
  (``publication_missing``), or when the server stays unreachable for
  ``connect_retries`` polls in a row (``connection``).

Retained WAL above ``warn_retained_bytes`` is logged as a warning (again each time it
doubles, and at most every 10 minutes otherwise).

Connections and secrets: the trigger is stored in Airflow's ``trigger`` table as
``serialize()``'s kwargs, so it holds the ``postgres_conn_id`` and never a DSN or a
password. It resolves the connection when it starts running, inside the triggerer:
in Airflow 3.3 the triggerer serves connections to triggers through its supervisor
(the same secrets backends as tasks). The hook's synchronous
:meth:`~airflow_pgcdc.hooks.pgcdc.PgcdcHook.get_dsn` is called in a worker thread
(``asyncio.to_thread``): called on the event loop thread, a synchronous
``get_connection`` would block the triggerer's loop (and Airflow refuses it while
another async call to the supervisor is in flight).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

import psycopg
from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_pgcdc.pg.slots import (
    PendingClock,
    PublicationMissing,
    SlotError,
    SlotHealth,
    aslot_health,
    check_slot_usable,
)

DEFAULT_MIN_BYTES = 16 << 20  # one WAL segment
DEFAULT_MAX_DELAY = 600.0  # seconds
DEFAULT_WARN_RETAINED_BYTES = 1 << 30
_WARN_EVERY = 600.0


def seconds(value: timedelta | float | int | None) -> float | None:
    """``timedelta`` or seconds (or None) as float seconds."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        return value.total_seconds()
    return float(value)


def error_payload(slot: str, exc: Exception) -> dict[str, Any]:
    """The failure event of a slot or publication error."""
    return {
        "status": "error",
        "error": getattr(exc, "kind", type(exc).__name__),
        "message": str(exc),
        "hint": getattr(exc, "hint", None),
        "slot": slot,
    }


def changes_ready(
    health: SlotHealth,
    clock: PendingClock,
    *,
    min_bytes: int = DEFAULT_MIN_BYTES,
    max_delay: float | None = DEFAULT_MAX_DELAY,
    plugin: str | None = "pgoutput",
) -> dict[str, Any] | None:
    """The ready payload if the slot has changes worth draining, None to keep waiting.

    Raises the typed slot errors of :func:`check_slot_usable` (the sensor and the trigger
    turn them into a failure). Shared by the trigger and the sensor's poke mode.
    """
    check_slot_usable(health, plugin=plugin, allow_unreserved=True)
    age = clock.observe(health)
    pending = health.pending_bytes or 0
    reason = warning = None
    if health.unreserved:
        reason = "unreserved"
        warning = (
            f"replication slot {health.slot!r} is UNRESERVED: it retains "
            f"{health.retained_bytes} bytes of WAL, more than max_slot_wal_keep_size allows; the "
            "next checkpoint may remove WAL it still needs and then its undelivered changes are "
            "lost. Draining it now, whatever the thresholds; raise max_slot_wal_keep_size or drain "
            "more often"
        )
    elif pending > 0 and pending >= min_bytes:
        reason = "min_bytes"
    elif pending > 0 and max_delay is not None and age is not None and age >= max_delay:
        reason = "max_delay"
    if reason is None:
        return None
    return {
        "status": "ready",
        "reason": reason,
        "slot": health.slot,
        "observed_lsn": str(health.current_lsn),
        "pending_bytes": pending,
        "confirmed_flush_lsn": str(health.confirmed_flush_lsn),
        "restart_lsn": None if health.restart_lsn is None else str(health.restart_lsn),
        "retained_bytes": health.retained_bytes,
        "wal_status": health.wal_status,
        "pending_age_seconds": age,
        "observed_at": health.observed_at.isoformat() if health.observed_at else None,
    } | ({"warning": warning} if warning else {})


class RetainedWalWarning:
    """Rate-limits the "retained WAL above the threshold" warning."""

    def __init__(self, threshold: int | None) -> None:
        self.threshold = threshold
        self._last_bytes = 0
        self._last_time = 0.0

    def message(self, health: SlotHealth, now: float | None = None) -> str | None:
        retained = health.retained_bytes
        if self.threshold is None or retained is None or retained < self.threshold:
            self._last_bytes = 0
            return None
        now = time.monotonic() if now is None else now
        if self._last_bytes and retained < 2 * self._last_bytes and now - self._last_time < _WARN_EVERY:
            return None
        self._last_bytes, self._last_time = retained, now
        extra = (
            f"; {health.safe_wal_size} bytes more before max_slot_wal_keep_size puts it at risk"
            if health.safe_wal_size is not None
            else "; max_slot_wal_keep_size is unlimited: the disk is the limit"
        )
        return (
            f"replication slot {health.slot!r} retains {retained} bytes of WAL "
            f"(threshold {self.threshold}, wal_status {health.wal_status}){extra}: drain it "
            "more often or with larger windows"
        )


class PgcdcChangesTrigger(BaseTrigger):
    """Fire when ``slot`` has ``min_bytes`` of pending WAL or a change older than ``max_delay``.

    :param slot: logical replication slot
    :param publications: also check that these publications exist (a name or a list; None:
        do not check; ``publication``, the 0.2 name a trigger serialized then carries, is read too)
    :param postgres_conn_id: Airflow connection of the slot's database (resolved in the triggerer)
    :param min_bytes: pending WAL (bytes) that makes a window worth draining
    :param max_delay: seconds the oldest unacknowledged change may wait (None: no limit)
    :param poll_interval: seconds between polls
    :param warn_retained_bytes: log a warning when the slot retains more WAL (None: never)
    :param plugin: output plugin the slot must use (None: any)
    :param pending_since: carried over from the sensor: server epoch seconds when pending
        WAL was first seen at ``pending_confirmed_lsn``
    :param connect_retries: consecutive failed polls (server unreachable) before failing
    """

    def __init__(
        self,
        *,
        slot: str,
        publications: str | Sequence[str] | None = None,
        postgres_conn_id: str = "postgres_default",
        min_bytes: int = DEFAULT_MIN_BYTES,
        max_delay: float | None = DEFAULT_MAX_DELAY,
        poll_interval: float = 30.0,
        warn_retained_bytes: int | None = DEFAULT_WARN_RETAINED_BYTES,
        plugin: str | None = "pgoutput",
        pending_since: float | None = None,
        pending_confirmed_lsn: str | None = None,
        connect_retries: int = 5,
        publication: str | None = None,
    ) -> None:
        super().__init__()
        self.slot = slot
        given = publications if publications is not None else publication  # one deferred before the rename
        self.publications = [given] if isinstance(given, str) else (list(given) if given else None)
        self.postgres_conn_id = postgres_conn_id
        self.min_bytes = int(min_bytes)
        self.max_delay = seconds(max_delay)
        self.poll_interval = float(poll_interval)
        self.warn_retained_bytes = warn_retained_bytes
        self.plugin = plugin
        self.pending_since = pending_since
        self.pending_confirmed_lsn = pending_confirmed_lsn
        self.connect_retries = int(connect_retries)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "slot": self.slot,
                "publications": self.publications,
                "postgres_conn_id": self.postgres_conn_id,
                "min_bytes": self.min_bytes,
                "max_delay": self.max_delay,
                "poll_interval": self.poll_interval,
                "warn_retained_bytes": self.warn_retained_bytes,
                "plugin": self.plugin,
                "pending_since": self.pending_since,
                "pending_confirmed_lsn": self.pending_confirmed_lsn,
                "connect_retries": self.connect_retries,
            },
        )

    async def get_dsn(self) -> str:
        """The libpq DSN of ``postgres_conn_id`` (see the module doc: resolved in a thread)."""
        from airflow_pgcdc.hooks.pgcdc import PgcdcHook

        hook = PgcdcHook(postgres_conn_id=self.postgres_conn_id)
        return await asyncio.to_thread(hook.get_dsn)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        clock = PendingClock(self.pending_confirmed_lsn, self.pending_since)
        warner = RetainedWalWarning(self.warn_retained_bytes)
        try:
            dsn = await self.get_dsn()
        except Exception as e:  # noqa: BLE001 - a missing connection id: report, do not hang
            yield TriggerEvent({
                "status": "error", "error": "connection", "slot": self.slot, "hint": None,
                "message": f"cannot resolve Airflow connection {self.postgres_conn_id!r}: {e}",
            })
            return
        conn: psycopg.AsyncConnection | None = None
        failures = 0
        self.log.info(
            "watching replication slot %s: min_bytes=%s max_delay=%s poll_interval=%ss",
            self.slot, self.min_bytes, self.max_delay, self.poll_interval,
        )
        try:
            while True:
                try:
                    if conn is None or conn.closed:
                        conn = await psycopg.AsyncConnection.connect(
                            dsn, autocommit=True, connect_timeout=max(2, int(self.poll_interval))
                        )
                    health = await aslot_health(conn, self.slot, publications=self.publications)
                    failures = 0
                except psycopg.OperationalError as e:
                    failures += 1
                    if conn is not None:
                        await conn.close()
                        conn = None
                    if failures > self.connect_retries:
                        yield TriggerEvent({
                            "status": "error", "error": "connection", "slot": self.slot,
                            "message": f"cannot read replication slot {self.slot!r} after "
                            f"{failures} attempts: {str(e).strip()}",
                            "hint": "check that the server is up and the connection is right",
                        })
                        return
                    self.log.warning("polling slot %s failed (%s); retrying", self.slot, str(e).strip())
                    await asyncio.sleep(self.poll_interval)
                    continue
                try:
                    ready = changes_ready(
                        health, clock, min_bytes=self.min_bytes, max_delay=self.max_delay,
                        plugin=self.plugin,
                    )
                except (SlotError, PublicationMissing) as e:
                    self.log.error("%s", e)
                    yield TriggerEvent(error_payload(self.slot, e))
                    return
                warning = warner.message(health)
                if warning:
                    self.log.warning("%s", warning)
                if ready is not None:
                    if ready.get("warning"):
                        self.log.error("%s", ready["warning"])
                    self.log.info(
                        "slot %s ready (%s): %s bytes pending up to %s",
                        self.slot, ready["reason"], ready["pending_bytes"], ready["observed_lsn"],
                    )
                    yield TriggerEvent(ready)
                    return
                await asyncio.sleep(self.poll_interval)
        finally:
            if conn is not None:
                await conn.close()
