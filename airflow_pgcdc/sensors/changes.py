"""``PgcdcChangesSensor``: wait until a replication slot has changes worth draining.

It succeeds when the slot's pending WAL reaches ``min_bytes`` or its oldest
unacknowledged change has waited ``max_delay``, and returns (XCom ``return_value``)::

    {"status": "ready", "reason": "min_bytes" | "max_delay" | "unreserved", "slot", "observed_lsn",
     "pending_bytes", "confirmed_flush_lsn", "restart_lsn", "retained_bytes", "wal_status",
     "pending_age_seconds", "observed_at"}

``observed_lsn`` is the server's WAL position when the condition held: the drain uses
it as its window end (``"{{ ti.xcom_pull('wait')['observed_lsn'] }}"``).

Deferrable (the default): it checks once in the worker (a ready slot or a broken one is
answered at once), then defers to :class:`~airflow_pgcdc.triggers.changes.PgcdcChangesTrigger`,
which polls in the triggerer. ``deferrable=False`` pokes in the worker (``mode="poke"``
or ``"reschedule"``). In reschedule mode each poke is a new process, so the time a
change has waited is counted from each poke (the server's own lower bound still applies).

Failures raise :class:`PgcdcSlotUnusable` (an ``AirflowFailException``: no retry) for a
lost, missing or mismatched slot or a missing publication, and :class:`PgcdcSlotBusy`
(retried as usual) for a slot in use by another process or an unreachable server. Both
carry ``kind`` and ``hint`` and say what to do.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue

from airflow_pgcdc.errors import HintedError
from airflow_pgcdc.hooks.compat import AirflowException, AirflowFailException
from airflow_pgcdc.hooks.pgcdc import PgcdcHook
from airflow_pgcdc.operators.renamed import renamed_argument
from airflow_pgcdc.operators.runs import refuse_backfill_run
from airflow_pgcdc.operators.values import checked, number
from airflow_pgcdc.pg.slots import PendingClock, PublicationMissing, SlotError
from airflow_pgcdc.triggers.changes import (
    DEFAULT_MAX_DELAY,
    DEFAULT_MIN_BYTES,
    DEFAULT_WARN_RETAINED_BYTES,
    PgcdcChangesTrigger,
    RetainedWalWarning,
    changes_ready,
    error_payload,
    seconds,
)

RETRYABLE = frozenset({"slot_in_use", "connection"})


class PgcdcSlotError(AirflowException, HintedError):
    """The sensor cannot wait on the slot. ``kind``: ``slot_lost``, ``slot_missing``,
    ``slot_in_use``, ``slot_mismatch``, ``publication_missing`` or ``connection``."""

    def __init__(self, message: str, *, kind: str, hint: str | None = None, slot: str | None = None) -> None:
        text = message if not hint else f"{message}\nhint: {hint}"
        super().__init__(text)
        self.kind = kind
        self.hint = hint
        self.slot = slot



class PgcdcSlotBusy(PgcdcSlotError):
    """The slot is in use by another process, or the server cannot be reached: retryable."""


class PgcdcSlotUnusable(PgcdcSlotError, AirflowFailException):
    """The slot is lost, missing or not usable, or the publication is missing: retrying
    cannot help (the task fails at once)."""


def slot_failure(payload: dict[str, Any]) -> PgcdcSlotError:
    """The exception for a failure event."""
    kind = payload.get("error") or "slot_error"
    cls = PgcdcSlotBusy if kind in RETRYABLE else PgcdcSlotUnusable
    return cls(payload.get("message") or kind, kind=kind, hint=payload.get("hint"), slot=payload.get("slot"))


class PgcdcChangesSensor(BaseSensorOperator):
    """Wait until ``slot`` has ``min_bytes`` of pending WAL or a change older than ``max_delay``.

    :param slot: logical replication slot (templated)
    :param publications: fail if this publication (a name or a list) is missing (templated;
        None: not checked; ``publication``: its 0.2 name, warns)
    :param min_bytes: pending WAL that makes a window worth draining (default 16 MiB; templated).
        WAL is per cluster: this counts other databases' WAL too (an upper bound on
        what the slot decodes)
    :param max_delay: how long the oldest unacknowledged change may wait (timedelta or
        seconds; default 10 minutes; None: no limit; templated). Measured as a lower bound (see
        :mod:`airflow_pgcdc.pg.slots`): at most ``max_delay`` after the sensor started
    :param warn_retained_bytes: warn in the log when the slot retains more WAL (default 1 GiB)
    :param plugin: output plugin the slot must use (default pgoutput; None: any)
    :param postgres_conn_id: Airflow ``postgres`` connection of the slot's database (templated)
    :param deferrable: wait in the triggerer (default True)
    :param poke_interval: seconds between polls (the trigger's poll interval too)
    """

    template_fields: Sequence[str] = ("slot", "publications", "min_bytes", "max_delay", "postgres_conn_id")
    ui_color = "#d5f5e3"

    def __init__(
        self,
        *,
        slot: str,
        publications: str | Sequence[str] | None = None,
        min_bytes: int = DEFAULT_MIN_BYTES,
        max_delay: timedelta | float | None = DEFAULT_MAX_DELAY,
        warn_retained_bytes: int | None = DEFAULT_WARN_RETAINED_BYTES,
        plugin: str | None = "pgoutput",
        postgres_conn_id: str = PgcdcHook.default_conn_name,
        deferrable: bool = True,
        poke_interval: timedelta | float = 30,
        **kwargs: Any,
    ) -> None:
        publications = renamed_argument(kwargs, "publication", "publications", publications, "PgcdcChangesSensor",
                                        required=None)
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.slot = slot
        self.publications = publications
        self.min_bytes = checked(min_bytes, number, int, "min_bytes", minimum=0)
        self.max_delay = checked(seconds(max_delay) if isinstance(max_delay, timedelta) else max_delay,
                                 number, float, "max_delay", minimum=0)
        self.warn_retained_bytes = warn_retained_bytes
        self.plugin = plugin
        self.postgres_conn_id = postgres_conn_id
        self.deferrable = deferrable
        self._clock = PendingClock()
        self._warner = RetainedWalWarning(warn_retained_bytes)

    def _min_bytes(self) -> int:  # templated: a string once rendered
        return number(self.min_bytes, int, "min_bytes", minimum=0) or 0

    def _max_delay(self) -> float | None:
        return number(self.max_delay, float, "max_delay", minimum=0)

    # -- one check, in the worker

    def _check(self) -> dict[str, Any] | None:
        import psycopg

        from airflow_pgcdc.pg.slots import slot_health

        hook = PgcdcHook(self.postgres_conn_id)
        try:
            with psycopg.connect(hook.get_dsn(), autocommit=True, connect_timeout=30) as conn:
                health = slot_health(conn, self.slot, publications=self.publications or None)
        except psycopg.OperationalError as e:
            raise PgcdcSlotBusy(
                f"cannot read replication slot {self.slot!r} on {hook.safe_dsn()}: {str(e).strip()}",
                kind="connection", slot=self.slot,
                hint="check that the server is up and the connection is right",
            ) from None
        try:
            ready = changes_ready(
                health, self._clock, min_bytes=self._min_bytes(), max_delay=self._max_delay(),
                plugin=self.plugin,
            )
        except (SlotError, PublicationMissing) as e:
            raise slot_failure(error_payload(self.slot, e)) from e
        warning = self._warner.message(health)
        if warning:
            self.log.warning("%s", warning)
        if ready is not None and ready.get("warning"):
            self.log.error("%s", ready["warning"])
        self.log.info(
            "slot %s: %s bytes pending (confirmed %s, current %s), %s bytes retained, wal_status %s",
            self.slot, health.pending_bytes, health.confirmed_flush_lsn, health.current_lsn,
            health.retained_bytes, health.wal_status,
        )
        return ready

    def poke(self, context) -> bool | PokeReturnValue:
        ready = self._check()
        return PokeReturnValue(is_done=True, xcom_value=ready) if ready else False

    def execute(self, context) -> Any:
        refuse_backfill_run(context, f"sensor {self.task_id} (slot {self.slot})")
        if not self.deferrable:
            return super().execute(context)
        ready = self._check()
        if ready is not None:
            self.log.info("slot %s is ready (%s) without waiting", self.slot, ready["reason"])
            return ready
        self.defer(
            trigger=PgcdcChangesTrigger(
                slot=self.slot,
                publications=self.publications or None,
                postgres_conn_id=self.postgres_conn_id,
                min_bytes=self._min_bytes(),
                max_delay=self._max_delay(),
                poll_interval=self.poke_interval,
                warn_retained_bytes=self.warn_retained_bytes,
                plugin=self.plugin,
                pending_since=self._clock.since,
                pending_confirmed_lsn=self._clock.confirmed_flush_lsn,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        if not event:
            raise PgcdcSlotBusy("the trigger ended without an event", kind="connection", slot=self.slot)
        if event.get("status") != "ready":
            raise slot_failure(event)
        if event.get("warning"):
            self.log.error("%s", event["warning"])
        self.log.info(
            "slot %s ready (%s): %s bytes pending up to %s",
            self.slot, event.get("reason"), event.get("pending_bytes"), event.get("observed_lsn"),
        )
        return event
