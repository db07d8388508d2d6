"""Before a window is read: the drain's plan (:func:`read_plan`: where the window starts,
from the store and the slot), the slot lock (:func:`take_slot_lock`), the checked
replication connection (:func:`connect_replication`), the start of the stream
(:func:`start_stream`) and the check that nothing moved meanwhile (:func:`recheck`).
Part of the drain (:mod:`airflow_pgcdc.drain.drain`)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import psycopg

from airflow_pgcdc.changes.assembly import HeldPrepared
from airflow_pgcdc.drain.guards import (
    DrainBusy,
    DrainError,
    SlotMissing,
    StoreHasNoCopy,
    check_server,
)
from airflow_pgcdc.pg.conninfo import parse_conninfo
from airflow_pgcdc.pg.errors import ObjectInUse
from airflow_pgcdc.pg.logical import LogicalStream
from airflow_pgcdc.pg.replication import ReplicationConnection
from airflow_pgcdc.pg.slotlock import lock_holder, wait_lock_slot
from airflow_pgcdc.protocol.lsn import DEFAULT_WAL_SIZES, LSN
from airflow_pgcdc.protocol.pgoutput.options import PgoutputOptions
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.catalog import CATALOG_FIELD
from airflow_pgcdc.store.layout import Layout
from airflow_pgcdc.store.manifest import read_snapshot_manifest
from airflow_pgcdc.store.window import latest_window, read_window
from airflow_pgcdc.typemap.map import SESSION_OPTIONS

log = logging.getLogger("airflow_pgcdc.drain.drain")  # the drain's logger, one name for all its modules


def _find_snapshot(client, layout: Layout, slot: str):
    for key in s3store.list_keys(client, layout.bucket, layout.snapshots_prefix(slot)):
        if key.endswith("/_manifest.json"):
            return read_snapshot_manifest(client, layout.bucket, key)
    return None


def _slot_info(sql: psycopg.Connection, slot: str) -> tuple[LSN, bool, str]:
    row = sql.execute(
        "SELECT confirmed_flush_lsn::text, two_phase, plugin::text, database::text "
        "FROM pg_catalog.pg_replication_slots WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    if row is None:
        raise SlotMissing(
            f"replication slot {slot!r} does not exist", slot=slot,
            hint=f"a new pipeline starts with pgcdc snapshot (it creates the slot); a dropped slot lost its changes: "
                 f"pgcdc recover --slot {slot} --store <url> creates it again and copies every table into the "
                 "existing Delta tables, and the pipeline goes on",
        )
    confirmed, two_phase, plugin, _db = row
    if plugin != "pgoutput":
        raise DrainError(f"slot {slot!r} uses output plugin {plugin!r}; the drain reads pgoutput")
    if confirmed is None:
        raise DrainError(f"slot {slot!r} is not a logical slot with a confirmed position")
    return LSN.parse(confirmed), bool(two_phase), plugin


def _options(dsn: str, extra: str | None) -> str:
    base = parse_conninfo(dsn).get("options", "")
    return " ".join(x for x in (base, SESSION_OPTIONS, extra or "") if x)


@dataclass
class Plan:
    """Where the next window starts, read from the store and the slot (under the slot
    lock), and what the store recorded about the pipeline."""

    seq: int
    start: LSN
    confirmed: LSN
    two_phase: bool
    snapshot_id: str | None
    held: dict[str, HeldPrepared]
    # the tables the publications must still cover; None: nothing recorded yet
    pipeline: frozenset[tuple[str, str]] | None
    system_id: str | None
    timeline: int | None
    recorded_by: str  # "window 4", "snapshot 2025...": what recorded system_id/timeline
    # after ``pgcdc recover``: the stream starts at the slot's position, past the store's end
    # (``start``); the window records the gap (``resumed``) for the merge
    resume_from: LSN | None = None
    resumed: dict | None = None
    catalog: str | None = None  # the previous window's catalog fingerprints (store/catalog.py)

    @property
    def floor(self) -> LSN:
        """The earliest position the stream can be at: where a window may end at the soonest."""
        return self.resume_from if self.resume_from is not None else self.start


def read_plan(client, layout: Layout, slot: str, sql: psycopg.Connection) -> Plan:
    latest = latest_window(client, layout, slot)
    confirmed, two_phase, _plugin = _slot_info(sql, slot)
    held: dict[str, HeldPrepared] = {}
    if latest is not None:
        for e in latest.pending_prepared:
            held[e["gid"]] = HeldPrepared(
                gid=e["gid"], xid=e["xid"], prepare_lsn=LSN.parse(e["prepare_lsn"]),
                prepare_end_lsn=LSN.parse(e["prepare_end_lsn"]), prepare_ts=None,
                origin=e.get("origin"), stored=dict(e),
            )
        pipeline = latest.pipeline_tables
        if pipeline is None:  # a window written before pipeline_tables existed
            snap = _find_snapshot(client, layout, slot)
            pipeline = {(t.schema, t.table) for t in snap.tables} if snap is not None else set()
            pipeline |= {(t["schema"], t["table"]) for t in latest.tables}
        return Plan(
            latest.window_seq + 1, latest.end, confirmed, two_phase, latest.snapshot_id, held,
            frozenset(pipeline), latest.system_id, latest.timeline, f"window {latest.window_seq}",
            catalog=latest.extra.get(CATALOG_FIELD),
        )
    snap = _find_snapshot(client, layout, slot)
    if snap is not None:
        return Plan(
            0, LSN.parse(snap.consistent_point), confirmed, two_phase, snap.snapshot_id, held,
            frozenset((t.schema, t.table) for t in snap.tables), snap.system_id, snap.timeline,
            f"snapshot {snap.snapshot_id}",
        )
    return Plan(0, confirmed, confirmed, two_phase, None, held, None, None, None, "nothing")


def after_recovery(client, layout: Layout, slot: str, plan: Plan) -> Plan | None:
    """The plan for a slot ahead of the store that ``pgcdc recover`` covered
    (:func:`~airflow_pgcdc.store.recoveries.covering`): the stream starts at the slot's
    position, no prepared transaction is held any more (the slot that held them is gone, or
    they ended before the copies: a new slot waits for them), and the window records the gap.
    None when no recovery covers it."""
    import dataclasses

    from airflow_pgcdc.store.recoveries import committed_recoveries, covering

    found = covering(committed_recoveries(client, layout, slot), store_end=plan.start, next_seq=plan.seq,
                     confirmed=plan.confirmed)
    if found is None:
        return None
    resumed = {"recovery": found.recovery_id, "cause": found.cause, "from_lsn": str(plan.start),
               "resumed_at": str(plan.confirmed), "copied_from": str(found.copied_from),
               "tables": [list(t) for t in sorted(found.tables)]}
    return dataclasses.replace(plan, held={}, resume_from=plan.confirmed, resumed=resumed)


def no_copy(layout: Layout, slot: str, plan: Plan) -> StoreHasNoCopy:
    """The refusal of a store that holds nothing of ``slot`` (see :class:`StoreHasNoCopy`)."""
    store = f"s3://{layout.bucket}/{layout.root.prefix}".rstrip("/")
    return StoreHasNoCopy(
        f"{store} holds no snapshot and no window of slot {slot!r} (nothing under "
        f"s3://{layout.bucket}/{layout.snapshots_prefix(slot)} nor {layout.changes_prefix(slot)}): a drain "
        f"would start this store at the slot's position {plan.confirmed} and acknowledge past it, and the "
        "store that follows this slot, if there is one, could then only be recovered by a new snapshot. "
        "Nothing was read or acknowledged",
        hint=f"check the store URL (pgcdc status --slot {slot} --store <url> shows what a store holds); "
             "take the initial copy first (pgcdc snapshot); or, to start a store of changes only from the "
             "slot's position on purpose, pass --start-without-snapshot (start_without_snapshot=True)",
    )


def take_slot_lock(sql: psycopg.Connection, slot: str, busy_wait: float) -> None:
    if not wait_lock_slot(sql, slot, busy_wait):
        raise DrainBusy(
            f"slot {slot}: another drain or snapshot of this slot is running ({lock_holder(sql, slot)}); "
            "this drain wrote and acknowledged nothing",
            hint="nothing to do: the running one drains the changes (runs of one slot must not overlap; "
                 "in Airflow keep max_active_runs=1)",
        )


def window_timelines(client, layout: Layout, slot: str):
    """``window_at(seq) -> (timeline, start)`` of committed windows, each manifest read once."""
    seen: dict[int, tuple[int | None, LSN]] = {}

    def window_at(seq: int) -> tuple[int | None, LSN]:
        if seq not in seen:
            m = read_window(client, layout, slot, seq)
            seen[seq] = (m.timeline, m.start)
        return seen[seq]

    return window_at


def connect_replication(dsn: str, slot: str, plan: Plan, *, status_interval: float, connect_options: str | None,
             window_at=None):
    """A replication connection to a server that is the one the store followed
    (:func:`~airflow_pgcdc.drain.guards.check_server`, every timeline of the store's windows
    read with ``window_at``), with its ``IDENTIFY_SYSTEM``."""
    conn = ReplicationConnection.connect(
        dsn, application_name="pgcdc-drain", status_interval=status_interval,
        options=_options(dsn, connect_options),
    )
    try:
        ident = conn.identify_system()
        # the store's end against the server's WAL, once the store holds something
        check_flush = plan.seq > 0 or plan.snapshot_id is not None
        note = check_server(
            slot=slot, system_id=ident.systemid, timeline=ident.timeline,
            recorded_system_id=plan.system_id, recorded_timeline=plan.timeline,
            store_end=plan.start, where=plan.recorded_by,
            history=lambda tli: [(e.timeline, e.switchpoint) for e in conn.timeline_history(tli).entries()],
            windows=plan.seq, window_at=window_at,  # windows 0 .. seq - 1 are committed
            flushed=ident.xlogpos if check_flush else None,
            wal_sizes=conn.wal_sizes() if check_flush else DEFAULT_WAL_SIZES,
        )
    except BaseException:
        conn.close()
        raise
    if note:
        log.warning(note)
    return conn, ident


def start_stream(conn, slot: str, options: PgoutputOptions, start: LSN, *, busy_wait: float, reconnect):
    """Start streaming on ``conn``: from here the slot is ours. A slot still held by a
    dying walsender (a drain killed a moment ago) is waited for, up to ``busy_wait``
    seconds, on new connections from ``reconnect()``. Returns ``(conn, stream)``."""
    deadline = time.monotonic() + busy_wait
    while True:
        try:
            return conn, LogicalStream.pgoutput(conn, slot, options, start)
        except ObjectInUse as exc:
            conn.close()
            if time.monotonic() >= deadline:
                raise DrainBusy(
                    f"slot {slot} is in use by another process: {exc.message}; this drain wrote and "
                    "acknowledged nothing",
                    hint="another consumer streams this slot (pg_replication_slots.active_pid): stop it; "
                         "only one process may consume a slot",
                ) from None
            log.info("slot %s is still active (a walsender ending?): waiting", slot)
            time.sleep(0.3)
            conn = reconnect()
        except BaseException:
            conn.close()
            raise


def recheck(client, layout: Layout, slot: str, sql: psycopg.Connection, plan: Plan) -> None:
    """With the slot ours: nothing moved since :func:`read_plan` read the store and the slot."""
    latest = latest_window(client, layout, slot)
    seq = latest.window_seq + 1 if latest is not None else 0
    confirmed = _slot_info(sql, slot)[0]
    if seq != plan.seq or confirmed != plan.confirmed:
        raise DrainBusy(
            f"slot {slot}: while this drain was starting, another one committed window {seq - 1} "
            f"(the store's next window is {seq}, this drain planned {plan.seq}; the slot is at "
            f"{confirmed}, it read {plan.confirmed}); this drain wrote and acknowledged nothing",
            hint="nothing to do: the other drain took these changes (runs of one slot must not overlap)",
        )


# --------------------------------------------------------------------------- the drain
