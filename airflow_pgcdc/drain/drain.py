"""The drain: one window of logical changes from a slot to S3, acknowledged only once
it is committed in the store.

One call, :func:`drain_window`:

0. **Whose turn.** The drain takes the slot lock (:mod:`airflow_pgcdc.pg.slotlock`,
   shared with the snapshot) before it reads the store, waiting up to ``busy_wait``
   seconds, else :class:`DrainBusy` having written nothing. It checks the publications
   against the pipeline's tables and the server's identity against the store's
   (:mod:`airflow_pgcdc.drain.guards`) before anything else. Once its stream has started
   (the slot is its own), it reads the store and the slot again: a window committed
   meanwhile by a drain that does not take the lock is :class:`DrainBusy` too.

1. **Where to start.** ``start_lsn`` is the ``end_lsn`` of the latest committed window
   of the slot in the store; for the first window, the ``consistent_point`` of the
   slot's committed snapshot (or, without a snapshot, the slot's
   ``confirmed_flush_lsn``). It is checked against the slot's ``confirmed_flush_lsn``:

   * equal: the normal case;
   * store ahead (a window was committed but its acknowledgement was lost, e.g. the
     drain died between the manifest and the status update, or PostgreSQL restarted
     before saving the slot): the stream starts at the store's position, which is
     acknowledged at once; nothing is rewritten;
   * slot ahead of the store: changes were acknowledged that no window holds (someone
     else consumed the slot, or the store lost objects): :class:`SlotAheadOfStore`,
     nothing is read, unless ``pgcdc recover`` copied every table since: then the stream
     starts at the slot's position and the window records the gap
     (:func:`~airflow_pgcdc.drain.plan.after_recovery`).

2. **Where to end.** ``end_lsn`` is fixed before reading: ``until_lsn`` (the sensor's
   observed LSN) or ``pg_current_wal_insert_lsn()`` (not ``pg_current_wal_lsn()``,
   which can trail the last commit under ``synchronous_commit = off``). The window
   holds the whole transactions whose commit LSN lies in ``[start_lsn, end_lsn)``.
   Reading stops when an event at or past ``end_lsn`` arrives (a Begin, Stream Commit,
   Commit/Rollback Prepared, Prepare, non-transactional message: it is not consumed)
   or when a keepalive reports ``wal_end >= end_lsn`` outside a transaction (the
   walsender has decoded everything before it; an ``end_lsn`` just after a WAL page's
   header is reached at the page's start, where the walsender's position stays when
   the last record ended there: :func:`~airflow_pgcdc.protocol.lsn.passed_at`). The
   walsender only decodes flushed WAL, and an open transaction or a quiet server may
   leave it without a record past ``end_lsn``: after ``heartbeat_after`` seconds without
   reaching it, the drain emits a non-transactional logical message (prefix
   ``pgcdc.heartbeat``, never written to the window) whose record is past ``end_lsn``,
   and gives up with
   :class:`DrainTimeout` after ``max_wait`` seconds without receiving anything (its own
   heartbeats aside: a long window that keeps receiving is not cut short, an end the
   stream never reaches still times out). So it never waits forever.
   ``max_rows``, ``max_bytes`` (bytes of pgoutput messages received) and
   ``max_seconds`` end the window earlier, always after a whole transaction: the
   window then ends at that transaction's commit end LSN (or at the last keepalive
   position outside any transaction, when ``max_seconds`` passes on a quiet slot).
   An empty window (no transaction) is still written: windows tile the LSN line, and
   a quiet slot must advance too.

3. **Decoding.** pgoutput at the highest protocol the server speaks, ``streaming``
   ``parallel`` on 16+ (``on`` on 14/15), ``two_phase`` when the slot was created
   with it, ``messages`` on; transactions assembled by
   :class:`~airflow_pgcdc.changes.assembly.TransactionAssembler` (streamed ones
   spooled to ``spool_dir``), change rows built by :mod:`airflow_pgcdc.changes.rows`,
   written by :class:`~airflow_pgcdc.store.window.WindowWriter` from a background
   thread. The receive loop does not decode a plain transaction's inserts (nor its
   updates that carry only their new row) nor the changes inside a stream block (:meth:`TransactionAssembler.take_raw
   <airflow_pgcdc.changes.assembly.TransactionAssembler.take_raw>`): inserts are kept as
   received and decoded a chunk at a time by the writer, stream-block changes are
   spooled as received and decoded when replayed. Once one such insert was taken, the
   like messages of its table that follow are taken in a run, natively, straight from
   libpq (:meth:`ReplicationConnection.read_run
   <airflow_pgcdc.pg.replication.ReplicationConnection.read_run>`), until any other
   message, which is read as before. Relation messages make relation versions (per table, per window, from 0);
   types outside the built-in set are resolved from the catalogs (a SQL session), a
   Type message's name being the fallback.

4. **Commit, then acknowledge.** Parts are closed (uploads finish), held prepared
   transactions are uploaded, ``_manifest.json`` is written with If-None-Match, and
   only then is the standby status update sent with ``flush = end_lsn``. While the
   writer thread uploads, the replication thread keeps sending status updates, so
   ``wal_sender_timeout`` never fires on a slow store.

Crash safety: nothing is acknowledged before the manifest exists, and the publications
are checked again right before it is written. Each attempt names its parts with its own
attempt id; a folder without a manifest keeps the debris of attempts that did not commit
until an attempt commits the window (PostgreSQL resends everything after
``confirmed_flush_lsn``) and then removes what its manifest does not list. A committed
folder is never rewritten. A manifest put refused as "already exists" is read back: our
own (a retried put whose success was lost) is a commit, another's is
:class:`WindowConflict` (this attempt's parts are removed, nothing acknowledged).

Test hook (fault injection): when the environment variable ``PGCDC_FAULT`` names one
of the points below, the process SIGKILLs itself there (``PGCDC_PAUSE`` pauses there
instead; :class:`airflow_pgcdc.faults.FaultPoint`). Tests only.

* ``after-receive``: once ``PGCDC_FAULT_AFTER`` transactions (default 1) are in the window;
* ``during-upload``: when the first Parquet part is about to complete its upload;
* ``after-parts``: every part uploaded, no manifest yet;
* ``after-manifest``: the window is committed, not acknowledged;
* ``after-ack``: acknowledged, before the stream is closed.

The code: this module holds :func:`drain_window` and what it is asked and answers
(:class:`DrainOptions`, :class:`DrainResult`); :mod:`airflow_pgcdc.drain.plan` what
happens before a window is read (the plan, the slot lock, the checked connection, the
stream's start); :mod:`airflow_pgcdc.drain.run` the window once the slot is ours
(receive, commit, acknowledge); :mod:`airflow_pgcdc.drain.window` the window being built
(rows, parts, type resolution); :mod:`airflow_pgcdc.drain.guards` the checks. All of them
log under ``airflow_pgcdc.drain.drain``.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg

from airflow_pgcdc.drain.guards import (
    DrainBusy,
    DrainError,
    DrainTimeout,
    PipelineTablesUnpublished,
    PublicationMissing,
    PublicationNotFound,
    ServerMismatch,
    SlotAheadOfStore,
    SlotNotFound,
    StoreHasNoCopy,
    WindowConflict,
    check_publications,
)
from airflow_pgcdc.drain.options import DrainOptions, DrainResult
from airflow_pgcdc.drain.plan import (
    Plan,
    after_recovery,
    connect_replication,
    no_copy,
    read_plan,
    recheck,
    start_stream,
    take_slot_lock,
    window_timelines,
)
from airflow_pgcdc.drain.run import WindowRun, make_spool
from airflow_pgcdc.drain.window import HEARTBEAT_PREFIX as HEARTBEAT_PREFIX
from airflow_pgcdc.drain.window import TypeResolver
from airflow_pgcdc.pg.catalog import check_encoding
from airflow_pgcdc.pg.conninfo import redact, unverified_tls
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.pgoutput.options import PgoutputOptions
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout, store_argument
from airflow_pgcdc.store.parquet import prefer_jemalloc_pool

log = logging.getLogger(__name__)

__all__ = [
    "DrainBusy", "DrainError", "DrainResult", "DrainTimeout", "PipelineTablesUnpublished",
    "PublicationMissing", "PublicationNotFound", "ServerMismatch", "SlotAheadOfStore", "SlotNotFound", "StoreHasNoCopy", "WindowConflict",
    "drain_window",
]  # fmt: skip





# --------------------------------------------------------------------------- the drain




def drain_window(
    dsn: str,
    store: str | s3store.S3Location | None = None,
    *,
    slot: str,
    publications: Sequence[str] | str,
    options: DrainOptions | Mapping[str, Any] | None = None,
    s3: Any = None,
    **fields: Any,
) -> DrainResult:
    """Drain one window of ``slot`` into ``store`` (``s3://bucket/prefix``) from
    ``publications``; see the module docstring. ``options``: a :class:`~.options.DrainOptions`
    (or a mapping of its fields), or its fields given as keywords (``until_lsn``,
    ``max_rows``, ``max_bytes``, ``max_seconds``, ``skip_origins``, ``message_prefixes``,
    ``binary``, ``heartbeat``, ``heartbeat_after``, ``max_wait``, ``status_interval``,
    ``spool_dir``, ``connect_options``, ``target_part_bytes``, ``forget_tables``,
    ``busy_wait``, ``memory_budget``, ``pack_parts_under``, ``start_without_snapshot``, ``as_text``), which
    mean below. ``s3``: an
    :class:`~airflow_pgcdc.store.s3.S3Settings` or a boto3 client (default: the environment's
    settings). The 0.1 names ``to`` (of ``store``) and ``s3_client`` (of ``s3``) are accepted for
    one release, with a :class:`DeprecationWarning`; giving both names is a :class:`TypeError`.
    ``connect_options`` are extra libpq ``options`` for the replication
    connection (e.g. ``-c wal_sender_timeout=2s``). ``forget_tables`` (``schema.table``)
    lets tables that left the publications leave the pipeline (see
    :mod:`airflow_pgcdc.drain.guards`). ``busy_wait``: how long to wait for another run
    of the slot (its lock, or a walsender still ending) before :class:`DrainBusy`.
    ``memory_budget``: bytes of change data the window keeps in memory over all its tables
    (open Parquet parts; the change buffers get a quarter more): past it, the largest
    tables' parts are finished early, so memory does not grow with the number of tables.
    ``pack_parts_under``: parts of at most this many bytes (default 1 MiB) are written into
    the window's pack objects, one request for many small tables (:mod:`airflow_pgcdc.store.packs`;
    window manifest format 2); ``0``: every part is an object of its own.
    ``start_without_snapshot``: a store that holds no snapshot and no window of the slot is
    refused (:class:`StoreHasNoCopy`: a mistyped store would otherwise take the slot over)
    unless this says to start it on purpose, at the slot's position, changes only.
    ``as_text``: columns kept as their exact PostgreSQL text (``["schema.table=col,col"]``
    or ``{"schema.table": ["col"]}``), as the table's copy did (a value the typed mapping
    cannot carry otherwise leaves that table out of the window: the merge refuses it)."""
    t0 = time.monotonic()
    started_at = datetime.now(UTC)
    store = store_argument("drain_window", store, "to", fields.pop("to", None))
    settings, client = s3store.s3_argument("drain_window", s3, fields)
    options = dataclasses.replace(DrainOptions.of(options, **fields), publications=publications)
    location = store if isinstance(store, s3store.S3Location) else s3store.S3Location.parse(store)
    layout = Layout(location)
    client = client or s3store.make_s3_client(settings)
    prefer_jemalloc_pool()  # the window's Arrow buffers (see there; ARROW_DEFAULT_MEMORY_POOL wins)

    if (tls := unverified_tls(dsn)) is not None:
        log.warning("%s", tls)
    sql = psycopg.connect(dsn, autocommit=True, application_name="pgcdc-drain-catalog")
    try:
        check_encoding(sql)
        take_slot_lock(sql, slot, options.busy_wait)  # before the store is read: the plan stays true while we hold it
        plan = read_plan(client, layout, slot, sql)
        if plan.recorded_by == "nothing" and not options.start_without_snapshot:
            raise no_copy(layout, slot, plan)
        check_publications(sql, options.publications, plan.pipeline or (), slot=slot, forget=options.forget)
        # the server must be the one the store followed before positions are compared
        window_at = window_timelines(client, layout, slot)

        def connect():
            return connect_replication(dsn, slot, plan, status_interval=options.status_interval,
                            connect_options=options.connect_options, window_at=window_at)

        conn, ident = connect()
        try:
            return _drain_on(conn, ident, sql, client, layout, slot, plan, options, t0=t0, started_at=started_at,
                             where=redact(dsn), reconnect=lambda: connect()[0])
        finally:
            conn.close()
    finally:
        sql.close()


def _drain_on(conn, ident, sql, client, layout: Layout, slot: str, plan: Plan, o: DrainOptions, *, t0,
              started_at, reconnect, where: str) -> DrainResult:
    """The drain once the slot is locked, the plan read and the server checked."""
    start, seq, confirmed = plan.start, plan.seq, plan.confirmed
    until_lsn = o.until_lsn
    if confirmed > start:
        recheck(client, layout, slot, sql, plan)  # a drain without the lock committed meanwhile?
        resumed = after_recovery(client, layout, slot, plan)
        if resumed is None:
            raise SlotAheadOfStore(
                f"slot {slot!r} has confirmed_flush_lsn {confirmed}, but the store's windows end at "
                f"{start} (s3://{layout.bucket}/{layout.changes_prefix(slot)}): changes were "
                "acknowledged that no window holds; nothing was read or acknowledged",
                hint=f"pgcdc recover --slot {slot} --store {layout.root.url} --dsn ... "
                     "(copies every table again into the existing Delta tables; the pipeline then goes on)",
            )
        plan = resumed
        log.warning("slot %s: resuming at %s after recovery %s: the changes in [%s, %s) are in its copies, "
                    "not in this window", slot, confirmed, plan.resumed["recovery"], start, confirmed)
    lost_ack = start > confirmed
    if until_lsn is not None:
        end_lsn = LSN(until_lsn) if not isinstance(until_lsn, str) else LSN.parse(until_lsn)
    if until_lsn is None or end_lsn < plan.floor:  # an end seen before a recovery: the stream is past it
        end_lsn = LSN.parse(sql.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])
    server_version = sql.info.server_version
    types = TypeResolver(sql, o.publications)

    result = DrainResult(slot=slot, window_seq=None, start_lsn=str(start), end_lsn=str(end_lsn),
                         acknowledged_lost=lost_ack)
    if end_lsn <= start and not lost_ack and plan.resumed is None:
        log.info("slot %s: nothing to drain (store at %s, end %s)", slot, start, end_lsn)
        return dataclasses.replace(result, end_lsn=str(start), seconds=time.monotonic() - t0)

    options = PgoutputOptions(
        publications=o.publications,
        binary=o.binary,
        messages=True,
        streaming=("parallel" if server_version >= 160000 else "on") if server_version >= 140000 else "off",
        two_phase=plan.two_phase and server_version >= 150000,
    )
    log.info("drain %s: window %d [%s, %s) from %s", slot, seq, start, end_lsn, where)
    conn, stream = start_stream(conn, slot, options, plan.floor, busy_wait=o.busy_wait, reconnect=reconnect)
    spool = make_spool(o.spool_dir, slot)
    try:
        recheck(client, layout, slot, sql, plan)  # the slot is ours now: no one moves it
        if lost_ack:
            log.warning("slot %s: the store is at %s but the slot at %s (a lost acknowledgement): "
                        "acknowledging %s", slot, start, confirmed, start)
            conn.confirm(start)
        if end_lsn <= start:
            conn.stop()
            return dataclasses.replace(result, end_lsn=str(start), seconds=time.monotonic() - t0)
        return WindowRun(conn, stream, sql, types, client, layout, slot, plan, o, end_lsn=end_lsn, spool=spool,
                          result=result, ident=ident, t0=t0, started_at=started_at).run()
    finally:
        conn.close()
        shutil.rmtree(spool, ignore_errors=True)
