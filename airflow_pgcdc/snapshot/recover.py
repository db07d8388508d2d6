"""``pgcdc recover``: a pipeline whose slot lost changes, back on its feet without a new
pipeline and without emptying a Delta table.

A slot that was dropped, lost its WAL (``wal_status = 'lost'``, an invalidated slot) or was
acknowledged past the store's last window (a stray ``pg_recvlogical``, ``pgcdc peek --ack``)
no longer holds the changes between the store's end and its position: the drain refuses it
(:class:`~airflow_pgcdc.drain.guards.SlotMissing`, ``SlotAheadOfStore``). Before this, the
only way back was a new snapshot into a new pipeline. :func:`recover_pipeline` instead:

1. takes the slot lock (drains of the slot wait, then stop having done nothing), checks the
   server is the one the store followed (its system identifier; its WAL reaches the store's
   end) and that no prepared transaction is open (a new slot waits for them: it waits up to
   a minute, then refuses naming them);
2. drops a lost slot and creates the slot again under its name (two-phase and failover as
   before); a
   slot that exists and is only ahead of the store is kept;
3. copies every table of the pipeline that still exists (the newest window's tables; a
   table the publications now add too) with :func:`~airflow_pgcdc.snapshot.resync.resync_tables`,
   one resync per publication, each at a consistent point after the slot's position;
4. commits a recovery record (:mod:`airflow_pgcdc.store.recoveries`).

The next drain then starts the stream at the slot's position; its window starts at the
store's end (the windows still tile the LSN line) and records the gap. The next merge
replaces each Delta table from its copy in one commit (readers see the old version until
then, time travel keeps it) and applies only the changes at or after the copy's point, as
for any resync. A table the copies left out (a value the type map cannot carry, ...) is
refused by the merge (``RecoveryGap``) until ``pgcdc resync`` copies it: it never goes on
green with the gap's changes missing.

A recovery that stops half-way leaves nothing the drain accepts (no record): rerun it (a
re-created slot is then "ahead" and kept). Copies it committed are ordinary resyncs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg

from airflow_pgcdc.errors import HintedError
from airflow_pgcdc.pg.catalog import check_encoding
from airflow_pgcdc.pg.conninfo import redact
from airflow_pgcdc.pg.replication import ReplicationConnection
from airflow_pgcdc.pg.slotlock import lock_holder, wait_lock_slot
from airflow_pgcdc.pg.slots import create_slot, drop_slot, slot_health
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.quoting import quote_ident, quote_qualified
from airflow_pgcdc.snapshot.export import REFUSED_TABLES
from airflow_pgcdc.snapshot.options import RecoverOptions, ResyncOptions
from airflow_pgcdc.snapshot.resync import resync_tables
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout, new_run_id, validate_slot
from airflow_pgcdc.store.manifest import committed_snapshot
from airflow_pgcdc.store.recoveries import (
    Recovery,
    RecoveryCopy,
    committed_recoveries,
    covering,
    write_recovery,
)
from airflow_pgcdc.store.window import latest_window

__all__ = ["NothingToRecover", "RecoverError", "RecoveryDone", "recover_pipeline"]

log = logging.getLogger(__name__)


class RecoverError(HintedError):
    """The recovery could not be done; no recovery record was committed (the drain keeps
    refusing the slot)."""


class NothingToRecover(RecoverError):
    """The slot is healthy and not ahead of the store: no change is missing."""


@dataclass(frozen=True)
class RecoveryDone:
    recovery: Recovery
    url: str


@dataclass(frozen=True)
class _StoreEnd:
    end: LSN
    next_seq: int
    pipeline: frozenset[tuple[str, str]]
    publications: tuple[str, ...]
    system_id: str | None
    recorded_by: str


def _store_end(client, layout: Layout, slot: str) -> _StoreEnd:
    latest = latest_window(client, layout, slot)
    snap = committed_snapshot(client, layout, slot)
    store = f"s3://{layout.bucket}/{layout.root.prefix}".rstrip("/")
    if latest is None and snap is None:
        raise RecoverError(
            f"{store} holds no snapshot and no window of slot {slot!r}: there is no pipeline to recover here; "
            "nothing was done",
            hint=f"check the store URL and the slot (pgcdc status --slot {slot} --store <url>)",
        )
    if latest is not None:
        pipeline = set(latest.pipeline_tables or ())
        if latest.pipeline_tables is None:  # a window written before the field existed
            pipeline |= {(t.schema, t.table) for t in (snap.tables if snap else ())}
            pipeline |= {(t["schema"], t["table"]) for t in latest.tables}
        return _StoreEnd(latest.end, latest.window_seq + 1, frozenset(pipeline), tuple(latest.publications),
                         latest.system_id, f"window {latest.window_seq}")
    return _StoreEnd(LSN.parse(snap.consistent_point), 0, frozenset((t.schema, t.table) for t in snap.tables),
                     (), snap.system_id, f"snapshot {snap.snapshot_id}")


def _publications(given: Sequence[str] | str | None, end: _StoreEnd, slot: str) -> tuple[str, ...]:
    if isinstance(given, str):
        given = (given,)
    given = tuple(dict.fromkeys(given or ()))
    if not given:
        if not end.publications:
            raise RecoverError(
                f"the store of slot {slot!r} records no publication yet (no window was drained): name it",
                hint="--publication <the publication the pipeline's drains use>",
            )
        return end.publications
    foreign = [p for p in given if end.publications and p not in end.publications]
    if foreign:
        raise RecoverError(
            f"slot {slot}'s drains stream publication(s) {', '.join(end.publications)} ({end.recorded_by}), "
            f"not {', '.join(foreign)}: tables copied through them would never get a change; nothing was done",
            hint=f"--publication {' --publication '.join(end.publications)} (or leave it out)",
        )
    return given


def _check_server(dsn: str, end: _StoreEnd, slot: str) -> None:
    """The server behind ``dsn`` is the one the store followed: a recovery against another
    (a restored copy, a mistyped host) would copy other data into the pipeline's tables."""
    with ReplicationConnection.connect(dsn, application_name="pgcdc-recover") as conn:
        ident = conn.identify_system()
    if end.system_id is not None and str(ident.systemid) != str(end.system_id):
        raise RecoverError(
            f"the server's system identifier is {ident.systemid}, but slot {slot}'s store recorded "
            f"{end.system_id} ({end.recorded_by}): this is another cluster; nothing was done",
            hint="point --dsn at the server the pipeline follows",
        )
    if ident.xlogpos < end.end:
        raise RecoverError(
            f"the server's WAL ends at {ident.xlogpos}, before the store's end {end.end} ({end.recorded_by}): "
            "an older copy of the server (a restored backup?); nothing was done",
            hint="point --dsn at the server the pipeline follows",
        )


def _wait_prepared(sql: psycopg.Connection, wait: float) -> None:
    """A new slot (and a resync's exported snapshot) waits until every transaction running
    in the cluster ends, prepared ones included, which a forgotten one never does: wait up
    to ``wait`` seconds for them to end, then refuse, naming them."""
    deadline = time.monotonic() + wait
    while True:
        rows = sql.execute("SELECT gid, database::text FROM pg_catalog.pg_prepared_xacts ORDER BY prepared").fetchall()
        if not rows:
            return
        if time.monotonic() >= deadline:
            names = ", ".join(f"{gid!r} (database {db})" for gid, db in rows[:10])
            raise RecoverError(
                f"{len(rows)} prepared transaction(s) are still open after {wait:g} s: {names}; a new slot (and a "
                "resync's snapshot) waits until every one ends; nothing was done",
                hint="COMMIT PREPARED or ROLLBACK PREPARED them, then run the recovery again",
            )
        time.sleep(0.5)


def _tables_to_copy(sql: psycopg.Connection, publications: tuple[str, ...], pipeline) -> tuple[
        dict[str, list[tuple[str, str]]], list[tuple[str, str]], list[tuple[str, str]]]:
    """``({publication: tables}, dropped, unpublished)``: every table the publications
    publish (each under the first that does), and the pipeline's tables that are gone or no
    longer published."""
    found = {p for (p,) in sql.execute(
        "SELECT pubname::text FROM pg_catalog.pg_publication WHERE pubname = ANY(%s)", (list(publications),))}
    missing = [p for p in publications if p not in found]
    if missing:
        raise RecoverError(
            f"publication(s) {', '.join(missing)} do not exist in database {sql.info.dbname!r}; nothing was done",
            hint="create it again with the pipeline's tables, then run the recovery again",
        )
    groups: dict[str, list[tuple[str, str]]] = {}
    seen: set[tuple[str, str]] = set()
    for pub in publications:
        for s, t in sql.execute("SELECT schemaname::text, tablename::text FROM pg_catalog.pg_publication_tables "
                                "WHERE pubname = %s ORDER BY 1, 2", (pub,)):
            if (s, t) not in seen:
                seen.add((s, t))
                groups.setdefault(pub, []).append((s, t))
    dropped, unpublished = [], []
    for t in sorted(set(pipeline) - seen):
        gone = sql.execute("SELECT to_regclass(%s) IS NULL", (quote_qualified(*t),)).fetchone()[0]
        (dropped if gone else unpublished).append(t)
    return groups, dropped, unpublished


def recover_pipeline(
    dsn: str,
    store: str,
    *,
    slot: str,
    publications: Sequence[str] | str | None = None,
    options: RecoverOptions | Mapping[str, Any] | None = None,
    s3: Any = None,
    on_slot_ready: Callable[[LSN], None] | None = None,
    **fields: Any,
) -> RecoveryDone:
    """Recover the pipeline of ``slot`` whose store is ``store`` (see the module doc).
    ``publications``: the drains' (default: those the newest window records). ``options``: a
    :class:`~.options.RecoverOptions` (or a mapping of its fields), or its fields given as
    keywords (``workers``, ``rows_per_part``, ``copy_format``, ``worker_processes``,
    ``as_text``: how the tables are copied again, as for a snapshot; ``two_phase``: for a
    slot that must be created and whose old one is gone (default: as the lost slot was, else
    off); ``busy_wait``; ``prepared_wait``: seconds to wait for prepared transactions to end,
    see :func:`_wait_prepared`). ``s3``: S3Settings or a client (``s3_client`` and
    ``s3_settings``, the 0.1 names, warn). ``on_slot_ready(position)`` is called once the
    slot exists again (tests use it to write meanwhile). Raises :class:`NothingToRecover`
    for a slot that lost nothing, :class:`RecoverError` for anything else; returns the
    committed recovery."""
    settings, client = s3store.s3_argument("recover_pipeline", s3, fields)
    o = RecoverOptions.of(options, **fields)
    two_phase, busy_wait, prepared_wait = o.two_phase, o.busy_wait, o.prepared_wait
    validate_slot(slot)
    layout = Layout.parse(store)
    client = client or s3store.make_s3_client(settings)
    end = _store_end(client, layout, slot)
    pubs = _publications(publications, end, slot)
    _check_server(dsn, end, slot)
    with psycopg.connect(dsn, autocommit=True, application_name="pgcdc-recover") as sql:
        check_encoding(sql)
        if not wait_lock_slot(sql, slot, busy_wait):
            raise RecoverError(
                f"slot {slot}: a drain or snapshot of this slot is running ({lock_holder(sql, slot)}); nothing "
                "was done",
                hint="pause the pipeline's DAGs (a drain of a lost slot fails anyway), then run the recovery again",
            )
        health = slot_health(sql, slot)
        if health.exists and health.database != sql.info.dbname:
            raise RecoverError(
                f"slot {slot!r} belongs to database {health.database!r}, not {sql.info.dbname!r}; nothing was done",
                hint="point --dsn at the pipeline's database",
            )
        if health.exists and health.active:
            raise RecoverError(
                f"slot {slot!r} is being streamed (pid {health.active_pid}): something else consumes it; "
                "nothing was done",
                hint="stop that consumer (pg_replication_slots.active_pid), then run the recovery again",
            )
        if not health.exists:
            cause = "slot_missing"
        elif health.lost:
            cause = "slot_lost"
        elif health.confirmed_flush_lsn is not None and health.confirmed_flush_lsn > end.end:
            cause = "slot_ahead"
        else:
            raise NothingToRecover(
                f"slot {slot!r} is at {health.confirmed_flush_lsn} and the store's changes reach {end.end} "
                f"({end.recorded_by}): no change is missing, nothing to recover",
                hint="to copy some tables again, use pgcdc resync --tables ...",
            )
        if cause == "slot_ahead":
            done = covering(committed_recoveries(client, layout, slot), store_end=end.end, next_seq=end.next_seq,
                            confirmed=health.confirmed_flush_lsn)
            if done is not None:
                raise NothingToRecover(
                    f"slot {slot!r} was recovered already (recovery {done.recovery_id}, "
                    f"{layout.url(layout.recovery_record(slot, done.recovery_id))}): the next drain resumes at "
                    f"{health.confirmed_flush_lsn}; nothing to do",
                    hint="run the pipeline's drain and merge",
                )
        _wait_prepared(sql, prepared_wait)
        groups, dropped, unpublished = _tables_to_copy(sql, pubs, end.pipeline)
        if unpublished:
            names = ", ".join(quote_qualified(*t) for t in unpublished)
            raise RecoverError(
                f"table(s) {names} belong to the pipeline but publication(s) {', '.join(pubs)} no longer cover "
                "them; nothing was done",
                hint=f"ALTER PUBLICATION {quote_ident(pubs[0])} ADD TABLE {names}; then run the recovery again "
                     "(or let them go first: pgcdc drain --forget-table needs a healthy slot, so add them back)",
            )
        if not groups:
            raise RecoverError(f"publication(s) {', '.join(pubs)} publish no table; nothing was done",
                               hint="add the pipeline's tables to the publication")
        log.info("slot %s: %s (store ends at %s, %s); recovering from %s", slot,
                 {"slot_missing": "the slot does not exist", "slot_lost": "the slot lost its WAL",
                  "slot_ahead": f"the slot is at {health.confirmed_flush_lsn}, past the store"}[cause],
                 end.end, end.recorded_by, redact(dsn))
        recreated = cause != "slot_ahead"
        if cause == "slot_lost":
            drop_slot(dsn, slot)
        if recreated:
            wanted = two_phase if two_phase is not None else bool(health.two_phase)
            created = create_slot(dsn, slot, two_phase=wanted, failover=bool(health.failover))
            log.info("slot %s created again at %s%s", slot, created.consistent_point,
                     " (two-phase)" if wanted else "")
        position = slot_health(sql, slot).confirmed_flush_lsn
        if on_slot_ready is not None:
            on_slot_ready(position)
        copies, refused = [], []
        for pub, tables in groups.items():
            copy = ResyncOptions(tables=tuple(quote_qualified(*t) for t in tables), workers=o.workers,
                                 rows_per_part=o.rows_per_part, copy_format=o.copy_format,
                                 worker_processes=o.worker_processes, as_text=o.as_text)
            done = resync_tables(dsn, store, slot=slot, publications=pub, options=copy, s3=client)
            m = done.manifest
            copies.append(RecoveryCopy(done.resync_slot, m.snapshot_id, m.consistent_point, pub,
                                       tuple((t.schema, t.table) for t in m.tables)))
            refused.extend(m.extra.get(REFUSED_TABLES) or ())
        now = slot_health(sql, slot).confirmed_flush_lsn
        first = min(LSN.parse(c.consistent_point) for c in copies)
        if now is None or now > first:
            raise RecoverError(
                f"slot {slot} moved to {now} while the tables were copied (the first copy is at {first}): "
                "something consumed it meanwhile; no recovery was recorded",
                hint="stop whatever streams the slot, then run the recovery again",
            )
        recovery = Recovery(
            slot=slot, recovery_id=new_run_id(), cause=cause, store_end_lsn=str(end.end),
            next_window_seq=end.next_seq, slot_position=str(now), slot_recreated=recreated,
            copies=tuple(copies), refused=tuple(refused), created_at=datetime.now(UTC).isoformat(),
            extra={"dropped_tables": [list(t) for t in dropped], "publications": list(pubs)},
        )
        url = write_recovery(client, layout, recovery)
    log.info("slot %s recovered: %d table(s) copied again (%d left out: %s); the next drain starts at %s, "
             "the next merge replaces the Delta tables from the copies (%s)", slot, len(recovery.tables),
             len(refused), ", ".join(f"{r.get('schema')}.{r.get('table')}" for r in refused) or "none", now, url)
    return RecoveryDone(recovery, url)
