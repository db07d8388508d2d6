"""The initial copy: one exported snapshot, copied in parallel to S3 as Parquet.

1. A replication connection runs ``CREATE_REPLICATION_SLOT <slot> LOGICAL pgoutput
   (SNAPSHOT 'export')``: the slot's ``consistent_point`` is where the change stream
   will start, and the exported snapshot shows exactly the transactions committed
   before it. That connection then stays idle until every worker has imported the
   snapshot (it dies at the connection's next command).
2. A catalog session and N worker sessions each run ``BEGIN ISOLATION LEVEL REPEATABLE
   READ; SET TRANSACTION SNAPSHOT '<name>'``: they all see the same database.
3. Each table is split into CTID block ranges (from ``relpages``); workers take parts
   from a queue and stream ``COPY (SELECT ... WHERE ctid >= '(a,0)' AND ctid < '(b,0)')
   TO STDOUT`` through the type map into one Parquet file per part, uploaded with
   bounded memory.
4. ``_manifest.json`` is written last, with a conditional put: the snapshot exists if
   and only if its manifest does.

A part that fails is retried while the snapshot lives: the slot connection stays idle
until the copy ends, so a worker whose session died imports the snapshot again. If the run
fails as a whole, it drops the slot it created and removes its partial prefix, so no
orphan slot retains WAL and a rerun starts clean.

Right after creating the slot, a run records it in the store (``_slot.json`` beside its
parts: the consistent point and the system identifier). A rerun after a crash (no
cleanup ran) that finds a slot of that name drops it and starts over only when it is
provably that leftover: a record of an uncommitted run for this slot, taken on this
server, whose consistent point is still the slot's confirmed position (nothing was ever
acknowledged from it), with no window in the store and no process holding the slot.
Any other slot of that name (a live pipeline's, one another store follows, one with a
confirmed position past its start) is never dropped: :class:`SlotTaken` names it and
what holds it. The run holds the slot lock (:mod:`airflow_pgcdc.pg.slotlock`) that
drains take too, so no drain of ours runs on the slot meanwhile.

Why one module of about 650 lines: it is the coordinator of one job, :func:`snapshot_to_s3`
(about 200 lines) with the steps only it calls (the slot lock, the refusal of a slot that
is not provably our leftover, the sweep of other runs' files, the manifest entries) and
the two ways it runs parts (in this process, in worker processes). The part copy is
:mod:`~airflow_pgcdc.snapshot.parts` and the worker processes are
:mod:`~airflow_pgcdc.snapshot.workers`, already apart.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg

from airflow_pgcdc.options import publications_argument
from airflow_pgcdc.pg.catalog import check_encoding
from airflow_pgcdc.pg.conninfo import redact, unverified_tls
from airflow_pgcdc.pg.errors import DuplicateObject, UndefinedObject
from airflow_pgcdc.pg.replication import ReplicationConnection
from airflow_pgcdc.pg.slotlock import lock_holder, try_lock_slot
from airflow_pgcdc.pg.tables import (
    TableInfo,
    check_partitions_as_published,
    describe_table,
    parse_column_map,
    parse_table_names,
    publications_tables,
)
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.quoting import quote_literal
from airflow_pgcdc.snapshot.convert import (
    function_casts,
    table_converter,
    without_excluded,
)
from airflow_pgcdc.snapshot.errors import SnapshotError
from airflow_pgcdc.snapshot.options import SnapshotOptions, as_text_map
from airflow_pgcdc.snapshot.parts import Progress, SnapshotPart, copy_part, import_snapshot
from airflow_pgcdc.snapshot.workers import CopyJob, ProcessWorker, retryable, table_error
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout, new_run_id, store_argument
from airflow_pgcdc.store.manifest import (
    POINT_TIME,
    SLICE_WHERE,
    ColumnEntry,
    PartEntry,
    SnapshotManifest,
    TableEntry,
)
from airflow_pgcdc.store.privacy import (
    SlotPrivacy,
    load_privacy,
    parse_rules,
    resolve_privacy,
    save_privacy,
)
from airflow_pgcdc.store.window import window_folders
from airflow_pgcdc.typemap.privacy import PiiRuleError

log = logging.getLogger(__name__)

SMALL_TABLE_PAGES = 128  # 1 MiB of heap: one part, no CTID filter
MAX_PART_ATTEMPTS = 3


class SnapshotExists(SnapshotError):
    """The slot already has a committed snapshot: the pipeline is past its initial load."""


class SnapshotBusy(SnapshotError):
    """Another snapshot run, or a drain, is using the slot right now."""


class SlotTaken(SnapshotError):
    """A slot of that name exists and is not provably the leftover of a failed run of this
    snapshot: it is never dropped. ``hint`` says what to do."""



SLOT_RECORD = "_slot.json"


def plan_parts(table: TableInfo, rows_per_part: int, workers: int = 1) -> list[SnapshotPart]:
    """Split ``table`` into CTID block ranges of at most about ``rows_per_part`` rows.

    ``relpages``/``reltuples`` may be stale: the last range is open-ended, so rows in
    pages added since the last ANALYZE are still copied. Partitioned tables and small
    tables are one part. A table of several parts gets a multiple of ``workers`` parts
    of equal size, so its last round keeps every worker busy: 5M rows at 1M a part on 2
    workers were 5 parts, the fifth copied by one worker while the other idled (4.0 s);
    as 6 parts of 833k, 3.9 s.
    """
    pages = table.relpages
    if table.relkind != "r" or pages <= SMALL_TABLE_PAGES or table.reltuples <= 0:
        return [SnapshotPart(table, 0, None, None, max(pages, 1))]
    rows_per_page = max(table.reltuples / pages, 1.0)
    pages_per_part = max(int(rows_per_part / rows_per_page), 1)
    n = max(1, math.ceil(pages / pages_per_part))
    if n > 1 and workers > 1:
        n = min(math.ceil(n / workers) * workers, pages)
    bounds = [i * pages // n for i in range(n + 1)]
    parts = []
    for i in range(n):
        start = None if i == 0 else bounds[i]
        end = None if i == n - 1 else bounds[i + 1]
        parts.append(SnapshotPart(table, i, start, end, max(bounds[i + 1] - bounds[i], 1)))
    return parts


def _discover(
    catalog: psycopg.Connection, publications: tuple[str, ...], tables: Sequence[str] | None
) -> list[TableInfo]:
    if tables:
        names = parse_table_names(tables)
        for pub in publications:  # a partitioned table or a partition named as the stream never names it
            check_partitions_as_published(catalog, pub, names)
        found = [describe_table(catalog, s, t) for s, t in names]
        if publications:
            published = {(t.schema, t.name): t for t in publications_tables(catalog, publications)}
            found = [published.get((t.schema, t.name), t) for t in found]
        return found
    if not publications:
        raise SnapshotError("give a publication or a list of tables to copy")
    found = publications_tables(catalog, publications)
    if not found:
        raise SnapshotError(f"publication(s) {', '.join(map(repr, publications))} have no tables")
    return found


def _find_committed(client, layout: Layout, slot: str) -> str | None:
    prefix = layout.snapshots_prefix(slot)
    for key in s3store.list_keys(client, layout.bucket, prefix):
        if key.endswith("/_manifest.json"):
            return key
    return None


@contextmanager
def _slot_lock(dsn: str, slot: str) -> Iterator[psycopg.Connection]:
    """Hold the slot lock (:mod:`airflow_pgcdc.pg.slotlock`, the one drains take) for the
    run, so two runs never share a slot: the second one would otherwise take the first
    one's live slot for a dead run's leftover. The lock goes with the session, so a
    SIGKILLed coordinator releases it as soon as the server sees its socket close.
    Yields the lock's session (autocommit), for catalog reads."""
    if (tls := unverified_tls(dsn)) is not None:
        log.warning("%s", tls)
    conn = psycopg.connect(dsn, autocommit=True, application_name="pgcdc-snapshot-lock")
    try:
        check_encoding(conn)  # before the slot: a SQL_ASCII database is refused up front
        got = try_lock_slot(conn, slot)
        holder = None if got else lock_holder(conn, slot)
    except BaseException:
        conn.close()
        raise
    if not got:
        conn.close()
        raise SnapshotBusy(
            f"another snapshot run or a drain is using slot {slot} ({holder}); "
            "wait for it to end, or pick another slot name"
        )
    try:
        yield conn
    finally:
        conn.close()


def _record_slot(client, layout: Layout, slot: str, sid: str, consistent_point, ident) -> None:
    """Say in the store that this run created ``slot`` (see the module docstring)."""
    body = json.dumps({
        "slot": slot, "snapshot_id": sid, "consistent_point": str(consistent_point),
        "system_id": ident.systemid, "timeline": ident.timeline,
        "created_at": datetime.now(UTC).isoformat(),
    })
    s3store.put_bytes(client, layout.bucket, layout.snapshot_prefix(slot, sid) + SLOT_RECORD, body,
                      content_type="application/json")


def _leftover_or_refuse(conn: psycopg.Connection, client, layout: Layout, slot: str, ident) -> None:
    """``slot`` exists: return if it is provably the leftover of a failed run of this
    snapshot (then the caller drops it), else raise :class:`SlotTaken`."""
    row = conn.execute(
        "SELECT slot_type, plugin::text, database::text, active, active_pid, confirmed_flush_lsn::text "
        "FROM pg_catalog.pg_replication_slots WHERE slot_name = %s", (slot,),
    ).fetchone()
    if row is None:
        return  # gone meanwhile: the caller's drop finds nothing, and creates it
    slot_type, plugin, database, active, active_pid, confirmed = row
    where = f"s3://{layout.bucket}/{layout.snapshots_prefix(slot)}"
    hint = (f"pick another slot name; or, if slot {slot} is an orphan that nothing needs, drop it "
            f"yourself (SELECT pg_drop_replication_slot({quote_literal(slot)})): every change it holds "
            "and no one acknowledged is lost with it")
    if active:
        raise SlotTaken(
            f"replication slot {slot} exists and is in use by pid {active_pid} (plugin {plugin}, database "
            f"{database}); a snapshot never drops a slot someone streams", hint=hint,
        )
    if window_folders(client, layout, slot):
        raise SlotTaken(
            f"replication slot {slot} exists and the store already holds change windows for it "
            f"(s3://{layout.bucket}/{layout.changes_prefix(slot)}): it is a running pipeline's slot", hint=hint,
        )
    records = []
    for key in s3store.list_keys(client, layout.bucket, layout.snapshots_prefix(slot)):
        if key.endswith("/" + SLOT_RECORD):
            try:
                records.append(json.loads(s3store.get_bytes(client, layout.bucket, key)))
            except (s3store.ObjectNotFound, ValueError):
                continue
    ours = [r for r in records if str(r.get("system_id")) == str(ident.systemid)
            and slot_type == "logical" and plugin == "pgoutput" and confirmed is not None
            and LSN.parse(confirmed) == LSN.parse(r.get("consistent_point", "0/0"))]
    if not ours:
        why = (f"no failed snapshot run in {where} recorded creating it" if not records else
               f"its confirmed position {confirmed} is not the consistent point a failed run of this "
               f"snapshot recorded ({', '.join(str(r.get('consistent_point')) for r in records)}): "
               "changes were acknowledged from it since, or it was created again by someone else")
        raise SlotTaken(
            f"replication slot {slot} exists ({slot_type}, plugin {plugin}, database {database}, confirmed "
            f"{confirmed}) and is not a leftover of this snapshot: {why}. A snapshot never drops a slot "
            "that may hold someone's changes", hint=hint,
        )


def _sweep_other_runs(client, layout: Layout, slot: str, sid: str) -> int:
    """Delete what other runs left under the slot's snapshot prefix (objects and pending
    multipart uploads), and abort this run's own pending uploads (a killed worker
    process's, whose part another worker wrote again). Runs once this run's manifest is
    committed and its workers have exited: a run killed before the rerun started may
    still have had uploads in flight, which the storage can complete after the rerun's
    first clean-up. Only uncommitted runs can be there (the rerun checked for a manifest,
    and the slot lock keeps other runs out). Returns the objects deleted."""
    prefix = layout.snapshots_prefix(slot)
    ours = layout.snapshot_prefix(slot, sid)
    # this run's own pending uploads: a worker process killed mid-part left its upload,
    # and the part was written again by another (every worker has exited by now)
    aborted = s3store.abort_uploads_under(client, layout.bucket, ours)
    if aborted:
        log.info("aborted %d multipart upload(s) left by failed parts under %s", aborted, ours)
    keys = list(s3store.list_keys(client, layout.bucket, prefix))
    keys += [u["Key"] for u in s3store.pending_uploads(client, layout.bucket, prefix)]
    others = sorted({prefix + k[len(prefix):].split("/", 1)[0] + "/" for k in keys if not k.startswith(ours)})
    deleted = 0
    for other in others:
        deleted += s3store.delete_prefix(client, layout.bucket, other)
    if others:
        log.info("removed %d object(s) of dead runs under %s", deleted, ", ".join(others))
    return deleted


def _drop_slot(dsn: str, slot: str) -> None:
    try:
        with ReplicationConnection.connect(dsn) as conn:
            conn.drop_slot(slot, wait=True)
        log.info("dropped replication slot %s", slot)
    except UndefinedObject:
        pass
    except Exception as exc:  # keep the original failure visible
        log.error("could not drop replication slot %s: %s (drop it by hand)", slot, exc)


def snapshot_to_s3(
    dsn: str,
    store: str | s3store.S3Location | None = None,
    *,
    slot: str,
    publications: Sequence[str] | str | None = None,
    options: SnapshotOptions | Mapping[str, Any] | None = None,
    s3: Any = None,
    on_slot_created: Callable[[str, str], None] | None = None,
    privacy: SlotPrivacy | None = None,
    **fields: Any,
) -> SnapshotManifest:
    """Create ``slot`` with an exported snapshot and copy the tables of ``publications`` (one
    name or several; a table in several is copied as one stream of them carries it, see
    :func:`~airflow_pgcdc.pg.tables.publications_tables`), or ``options.tables``, to ``store``.

    ``options``: a :class:`~.options.SnapshotOptions` (or a mapping of its fields), or its
    fields given as keywords (``tables``, ``workers``, ``rows_per_part``, ``two_phase``,
    ``snapshot_id``, ``progress_interval``, ``copy_format``, ``worker_processes``,
    ``temporary``, ``as_text``, ``slice_where``). ``s3``: an
    :class:`~airflow_pgcdc.store.s3.S3Settings` or a boto3 client (default: the
    environment's settings). The 0.1 names ``to``, ``publication``, ``s3_client`` and
    ``s3_settings`` are accepted for one release, with a :class:`DeprecationWarning`.

    ``temporary``: the slot is a temporary one, gone when this call returns (or its
    process dies): a table resync (:mod:`.resync`) needs only its snapshot and its
    consistent point, never its stream.

    Returns the committed manifest. ``on_slot_created(consistent_point, snapshot_name)``
    is called once the slot exists and every worker has imported the snapshot (tests use
    it to interleave writes). ``copy_format``: ``binary`` (default) or ``csv`` (see
    :data:`~airflow_pgcdc.snapshot.convert.COPY_FORMATS`). ``as_text``: columns kept as their
    exact PostgreSQL text whatever their type (``["schema.table=col,col"]`` or
    ``{"schema.table": ["col"]}``: the escape hatch for values the typed mapping cannot
    carry, such as arrays whose lower bound is not 1); give the drain the same.
    ``slice_where``: copy only the rows matching this SQL predicate (a slice resync,
    :mod:`.resync`; recorded in each table entry as ``where``). ``pii``: column rules
    (:mod:`airflow_pgcdc.store.privacy`), written to the store with the manifest; without
    them the store's rules for ``slot`` apply. ``privacy``: the rules to apply (a resync's:
    its pipeline's, not its temporary slot's).

    Workers run in their own processes (:mod:`airflow_pgcdc.snapshot.workers`) when the
    S3 settings are known: given as ``s3``, or those of a client made by
    :func:`~airflow_pgcdc.store.s3.make_s3_client`. With a client of unknown settings, or
    ``worker_processes=False``, they are threads of this process.
    """
    store = store_argument("snapshot_to_s3", store, "to", fields.pop("to", None))
    publications = publications_argument("snapshot_to_s3", publications, fields)
    settings, client = s3store.s3_argument("snapshot_to_s3", s3, fields)
    o = SnapshotOptions.of(options, **fields)
    tables, workers, rows_per_part, two_phase = o.tables, o.workers, o.rows_per_part, o.two_phase
    snapshot_id, progress_interval, copy_format = o.snapshot_id, o.progress_interval, o.copy_format
    worker_processes, temporary, slice_where = o.worker_processes, o.temporary, o.slice_where
    text_columns = parse_column_map(as_text_map(o.as_text))
    location = store if isinstance(store, s3store.S3Location) else s3store.S3Location.parse(store)
    layout = Layout(location)
    if client is None:
        client = s3store.make_s3_client(settings)
    given_rules = parse_rules(o.pii) if o.pii else None
    if privacy is None:
        privacy = resolve_privacy(client, layout, slot, given_rules, write=False)
    elif given_rules:
        raise SnapshotError("give column rules (pii) or the resolved rules (privacy), not both")
    if worker_processes is None:
        worker_processes = settings is not None
    elif worker_processes and settings is None:
        raise SnapshotError("worker processes need the S3 settings: pass s3=S3Settings(...), or a client made by "
                            "make_s3_client")
    with ExitStack() as stack:
        # the worker processes start first: their start-up overlaps the slot's creation,
        # and a forked one inherits no connection of this run
        procs: list[ProcessWorker] = []
        stack.callback(_close_workers, procs)  # also the replacements appended later
        for _ in range(workers if worker_processes else 0):
            procs.append(ProcessWorker())
        lock_conn = stack.enter_context(_slot_lock(dsn, slot))
        committed = _find_committed(client, layout, slot)
        if committed:
            raise SnapshotExists(
                f"slot {slot} already has a committed snapshot (s3://{location.bucket}/{committed}); "
                "drain its changes, or drop the slot and the prefix to start over"
            )
        sid = snapshot_id or new_run_id()
        started_at = datetime.now(UTC)
        log.info("snapshot %s of %s into %s (slot %s)", sid, redact(dsn), location.url, slot)

        repl = ReplicationConnection.connect(dsn, application_name="pgcdc-snapshot")
        slot_created = False
        wrote_rules = False
        sessions: list[ReplicationConnection] = []
        try:
            ident = repl.identify_system()

            def create_slot():
                return repl.create_slot(
                    slot, output_plugin="pgoutput", two_phase=True if two_phase else None, snapshot="export",
                    temporary=temporary,
                )

            try:
                created = create_slot()
            except DuplicateObject:
                # only a leftover of a failed run of this snapshot is dropped (else SlotTaken)
                _leftover_or_refuse(lock_conn, client, layout, slot, ident)
                log.warning("slot %s was left by a failed snapshot run (never acknowledged from): "
                            "dropping it and starting over", slot)
                s3store.delete_prefix(client, location.bucket, layout.snapshots_prefix(slot))
                try:
                    repl.drop_slot(slot)
                except UndefinedObject:
                    pass
                created = create_slot()
            slot_created = True
            _record_slot(client, layout, slot, sid, created.consistent_point, ident)
            snapshot_name = created.snapshot_name
            if not snapshot_name:
                raise SnapshotError("the server did not export a snapshot")
            log.info("slot %s created at consistent point %s, snapshot %s", slot, created.consistent_point, snapshot_name)
            # every session imports the snapshot before the slot connection does anything else
            catalog_conn = psycopg.connect(dsn, autocommit=False, application_name="pgcdc-snapshot-catalog")
            try:
                with catalog_conn.cursor() as cur:
                    cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    cur.execute(f"SET TRANSACTION SNAPSHOT {quote_literal(snapshot_name)}")
                    cur.execute("SELECT clock_timestamp()")  # after the slot: the copy's commits are older
                    (point_time,) = cur.fetchone()
                if procs:
                    for w in procs:
                        w.begin_import(dsn, snapshot_name)
                    for w in procs:
                        w.end_import()
                else:
                    for _ in range(workers):
                        sessions.append(import_snapshot(dsn, snapshot_name))
                # the slot connection stays idle until the copy ends: while it does, the
                # exported snapshot lives, and a worker whose session died imports it again
                if on_slot_created is not None:
                    on_slot_created(str(created.consistent_point), snapshot_name)
                discovered = _discover(catalog_conn, publications, tables)
                if slice_where:  # a slice resync: the named tables' matching rows only
                    discovered = [dataclasses.replace(t, slice_where=slice_where) for t in discovered]
                found = discovered  # with every column: the ruled ones' identities (an excluded one's too)
                if privacy:
                    discovered = _apply_rules(discovered, privacy, strict=bool(given_rules), whole=not tables)
                refusals = {t.oid: why for t in discovered if (why := _cannot_copy(t)) is not None}
                infos = [t for t in discovered if t.oid not in refusals]
                casts = function_casts(catalog_conn)
                converters = {t.oid: table_converter(catalog_conn, t, casts,
                                                     as_text=text_columns.get((t.schema, t.name), ()),
                                                     privacy=_rules_of(privacy, t))
                              for t in infos}
            finally:
                catalog_conn.close()
            for t in infos:
                warning = t.key_warning()
                if warning:
                    log.warning(warning)
            parts = [p for t in infos for p in plan_parts(t, rows_per_part, workers)]
            if procs:
                job = CopyJob(
                    s3=settings, layout=layout, slot=slot, snapshot_id=sid, copy_format=copy_format,
                    converters=converters,
                )

                def restart() -> ProcessWorker:
                    w = ProcessWorker()
                    procs.append(w)
                    w.begin_import(dsn, snapshot_name)
                    w.end_import()
                    w.start_job(job)
                    return w

                for w in procs:
                    w.start_job(job)
                runners = [_InWorkerProcess(w, restart) for w in procs]
            else:

                def reconnect() -> ReplicationConnection:
                    session = import_snapshot(dsn, snapshot_name)
                    sessions.append(session)
                    return session

                runners = [
                    _InThisProcess(s, reconnect, converters, client, layout, slot, sid, copy_format)
                    for s in sessions
                ]
            results = _copy_all(parts, runners, progress_interval)
            for t in infos:  # copies that failed on their own values: left out, their parts removed
                got = results.get(t.oid) or []
                if got and isinstance(got[0], RefusedCopy):
                    refusals[t.oid] = (got[0].why, "keep the column as exact text (--as-text schema.table=column), "
                                       "then pgcdc resync --tables the table with the same option")
                    base = layout.snapshot_prefix(slot, sid)
                    s3store.delete_keys(client, location.bucket, [base + k for k in got[0].keys],
                                        what=base)
            infos = [t for t in infos if t.oid not in refusals]
            refused = [_refused_entry(t, *refusals[t.oid]) for t in discovered if t.oid in refusals]
            for r in refused:
                log.error("table %s.%s is left out of the snapshot (the other tables are copied): %s",
                          r["schema"], r["table"], r["error"])
            if not infos:
                raise SnapshotError("no table could be copied: " + "; ".join(
                    f"{r['schema']}.{r['table']}: {r['error']}" for r in refused))
            manifest = SnapshotManifest(
                slot=slot,
                snapshot_id=sid,
                snapshot_name=snapshot_name,
                consistent_point=str(created.consistent_point),
                system_id=ident.systemid,
                timeline=ident.timeline,
                started_at=started_at,
                finished_at=datetime.now(UTC),
                tables=tuple(_table_entry(t, results, layout, slot, sid) for t in infos),
                extra={POINT_TIME: point_time.astimezone(UTC).isoformat(),
                       **({REFUSED_TABLES: refused} if refused else {})},
            )
            if given_rules and load_privacy(client, layout, slot) is None:  # the slot's rules, for every
                # later job of it (before the manifest: no drain runs first; removed if this run fails)
                save_privacy(client, layout, slot, privacy.with_ids(found))
                wrote_rules = True
            key = layout.snapshot_manifest(slot, sid)
            # a put the client retried after an unseen success finds its own manifest: committed
            if not s3store.commit_if_absent(client, location.bucket, key, manifest.to_json().encode()):
                raise SnapshotError(f"a manifest already exists at s3://{location.bucket}/{key}")
            log.info(
                "snapshot %s committed: %d tables, %d rows, %.1f MB, consistent point %s",
                sid, len(infos), manifest.rows, manifest.bytes / 1e6, manifest.consistent_point,
            )
        except BaseException:
            for w in procs:  # stop their COPYs and uploads before the prefix is removed
                w.kill()
            if slot_created and not temporary:  # a temporary slot goes with its connection
                _drop_slot(dsn, slot)
            try:
                s3store.delete_prefix(client, location.bucket, layout.snapshot_prefix(slot, sid))
                if wrote_rules:  # no data was committed under them: a new run may give others
                    s3store.delete_keys(client, location.bucket, [layout.privacy_rules(slot)])
            except Exception as exc:
                log.error("could not remove the partial snapshot prefix: %s", exc)
            raise
        finally:
            repl.close()
            for s in sessions:
                s.close()
            _close_workers(procs)  # before the sweep: it aborts the uploads they left
        try:
            _sweep_other_runs(client, layout, slot, sid)
        except Exception as exc:  # the snapshot is committed; leftovers are only garbage
            log.warning("could not remove dead runs' objects under %s: %s", layout.snapshots_prefix(slot), exc)
        return manifest


REFUSED_TABLES = "refused_tables"
"""A snapshot (or resync) manifest's tables it could not copy: ``[{schema, table, error,
hint}]``. Their changes stream (they are published) and the merge refuses them
(``NeedsSnapshot``, with this reason) until a resync copies them."""


def _rules_of(privacy: SlotPrivacy | None, t: TableInfo):
    if not privacy:
        return None
    return privacy.rules_for(t.schema, t.name, t.oid, {c.name: c.attnum for c in t.columns})


def _apply_rules(tables: list[TableInfo], privacy: SlotPrivacy, *, strict: bool, whole: bool) -> list[TableInfo]:
    """``tables`` without their excluded columns. Rules given to this run (``strict``) must
    name columns the tables have and, for a whole snapshot (``whole``), tables it copies: a
    typo would leave a column raw."""
    if strict and whole:
        found = {(t.schema, t.name) for t in tables}
        unknown = sorted(f"{s}.{n}" for s, n in privacy.rules if (s, n) not in found)
        if unknown:
            raise PiiRuleError(f"column rules name table(s) {unknown} that the snapshot does not copy",
                               hint="name tables of the publications, as --tables takes them")
    return [without_excluded(t, _rules_of(privacy, t), strict=strict) for t in tables]


def _cannot_copy(t: TableInfo) -> tuple[str, str] | None:
    """``(why, hint)`` when ``t`` cannot be copied as it is, decided before any copy, else
    None: such a table is left out of the snapshot, the others are copied."""
    names = {c.name for c in t.columns}
    if not t.columns:
        return ("it has no columns (every column dropped, or CREATE TABLE t ()): nothing to carry but a row "
                "count, which a Delta table cannot hold",
                "add a column to it (or leave it out of the publication), then pgcdc resync --tables it")
    missing = [k for k in t.key_columns if k not in names]
    if missing:
        return (f"its key ({', '.join(t.key_columns)}) includes column(s) {missing} that are not copied nor "
                "streamed (stored generated columns are published only by PostgreSQL 18 with "
                "publish_generated_columns = stored)",
                "set REPLICA IDENTITY FULL and give the merge a key among the copied columns (--key), or publish "
                "the generated columns (PostgreSQL 18), then pgcdc resync --tables it")
    return None


def _refused_entry(t: TableInfo, why: str, hint: str) -> dict[str, str]:
    return {"schema": t.schema, "table": t.name, "error": why, "hint": hint}


def _table_entry(t: TableInfo, results: dict, layout: Layout, slot: str, sid: str) -> TableEntry:
    parts = sorted(results[t.oid], key=lambda p: p[0])
    key_set = set(t.key_columns)
    return TableEntry(
        schema=t.schema,
        table=t.name,
        columns=tuple(
            ColumnEntry(
                name=c.name,
                pg_type=c.type_name,
                nullable=not c.not_null,
                key=c.name in key_set,
                typmod=c.typmod,
                type_oid=c.type_oid,
                attnum=c.attnum,
                attxmin=c.xmin,
            )
            for c in t.columns
        ),
        key_columns=t.key_columns,
        parts=tuple(PartEntry(path=path, rows=rows, bytes=size) for _n, path, rows, size in parts),
        has_key=t.has_key,
        row_filter=t.row_filter,
        column_list=t.column_list,
        rows=sum(p[2] for p in parts),
        bytes=sum(p[3] for p in parts),
        # a partitioned table copied through its root: the leaves its copy holds (`pgcdc
        # status` compares them with the catalog: attached or detached partitions' rows
        # are not streamed)
        extra=({"partitions": [list(leaf) for leaf in t.partitions]} if t.relkind == "p" else {})
        | ({"relfilenode": t.relfilenode} if t.relfilenode else {}) | {"relation_oid": t.oid}
        | ({SLICE_WHERE: t.slice_where} if t.slice_where else {}),
    )


def _close_workers(procs: list[ProcessWorker]) -> None:
    """Ask every worker process to exit, then wait for them: they exit together.
    Idempotent."""
    for w in procs:
        w.stop()
    for w in procs:
        w.close()


class _InThisProcess:
    """A worker thread copying parts on its own session (``worker_processes=False``)."""

    def __init__(self, session, reconnect, converters, client, layout, slot, sid, copy_format) -> None:
        self.session = session
        self._reconnect = reconnect
        self._args = (client, layout, slot, sid)
        self._converters = converters
        self._copy_format = copy_format

    def copy(self, part: SnapshotPart, progress: Progress) -> tuple:
        conv = self._converters[part.table.oid]
        return copy_part(self.session, part, conv, *self._args, progress, self._copy_format)

    def recover(self) -> bool:
        """After a failed part: a new session importing the same snapshot (False if none)."""
        self.session.close()
        try:
            self.session = self._reconnect()
        except Exception as again:
            log.warning("worker could not import the snapshot again: %s", again)
            return False
        return True


class _InWorkerProcess:
    """A worker thread handing parts to its worker process."""

    def __init__(self, worker: ProcessWorker, restart: Callable[[], ProcessWorker]) -> None:
        self.worker = worker
        self._restart = restart

    def copy(self, part: SnapshotPart, progress: Progress) -> tuple:
        def on_rows(n: int) -> None:
            with progress.lock:
                progress.part_rows(part, n)

        result = self.worker.copy(part, on_rows)
        with progress.lock:
            progress.part_done(part, result[3])
        return result

    def recover(self) -> bool:
        """After a failed part: the same process if it lives (it imports the snapshot
        again itself), else a new one (False if that fails too)."""
        if self.worker.alive:
            return True
        self.worker.kill()
        try:
            self.worker = self._restart()
        except Exception as again:
            log.warning("could not start a new worker process: %s", again)
            return False
        return True


def _copy_all(parts, runners, progress_interval) -> dict:
    """Copy ``parts`` on one thread per runner (:class:`_InThisProcess` or
    :class:`_InWorkerProcess`). A part that fails on a lost session, a storage error or
    a dead worker process is put back (up to :data:`MAX_PART_ATTEMPTS` tries) and its
    runner recovers (a new session, a new process) or, failing that, stops, leaving the
    part to the others."""
    work: queue.Queue = queue.Queue()
    for p in sorted(parts, key=lambda p: -p.pages):  # largest first: the last round is short
        work.put((p, 1))
    results: dict[int, list] = {p.table.oid: [] for p in parts}
    remaining = {t: sum(1 for p in parts if p.table.oid == t) for t in results}
    refused: dict[int, str] = {}  # table OID -> why its copy failed (a value it cannot carry)
    progress = Progress(total_pages=sum(p.pages for p in parts))
    failures: list[BaseException] = []
    lock = threading.Lock()
    alive = [len(runners)]
    stop = threading.Event()

    def worker(runner) -> None:
        while not stop.is_set():
            try:
                part, attempt = work.get(timeout=0.1)
            except queue.Empty:
                if all(v == 0 for v in remaining.values()):
                    return
                continue
            if part.table.oid in refused:  # its table failed already: nothing more of it
                continue
            try:
                res = runner.copy(part, progress)
            except BaseException as exc:  # this runner's session is unusable now
                if stop.is_set():
                    return  # the run is failing: no new session or process
                if table_error(exc) and not isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    with lock:  # that table alone: the others are copied and committed
                        if part.table.oid not in refused:
                            refused[part.table.oid] = f"{exc}"
                            log.error("table %s cannot be copied (the other tables go on; it is left out of "
                                      "the snapshot): %s", part.table.display, exc)
                        remaining[part.table.oid] = 0
                    if not runner.recover():
                        with lock:
                            alive[0] -= 1
                        return
                    continue
                retry = attempt < MAX_PART_ATTEMPTS and retryable(exc)
                recovered = runner.recover() if retry else False
                with lock:
                    if not recovered:
                        alive[0] -= 1
                    if retry and alive[0] > 0:
                        log.warning(
                            "part %d of %s failed (attempt %d): %s; retrying",
                            part.number, part.table.display, attempt, exc,
                        )
                        work.put((part, attempt + 1))
                    else:
                        failures.append(exc)
                        stop.set()
                if not recovered:
                    return
                continue
            with lock:
                results[part.table.oid].append(res)
                if part.table.oid in refused:  # its table failed meanwhile: the part is removed with it
                    continue
                remaining[part.table.oid] -= 1
                if remaining[part.table.oid] == 0:
                    progress.tables_done += 1

    threads = [threading.Thread(target=worker, args=(r,), name=f"pgcdc-snapshot-{i}", daemon=True) for i, r in enumerate(runners)]
    for th in threads:
        th.start()
    n_tables = len(results)
    last = time.monotonic()
    try:
        while any(th.is_alive() for th in threads):
            for th in threads:
                th.join(timeout=0.2)
            if time.monotonic() - last >= progress_interval:
                log.info(progress.line(n_tables, len(parts)))
                last = time.monotonic()
    except BaseException:  # interrupted: the workers take no more parts and start nothing
        stop.set()
        raise
    if failures:
        raise SnapshotError(f"the snapshot copy failed: {failures[0]}") from failures[0]
    if any(v for v in remaining.values()):
        raise SnapshotError("every worker failed before all parts were copied")
    log.info(progress.line(n_tables, len(parts)))
    for oid, why in refused.items():  # what the refused tables wrote is no one's
        results[oid] = [RefusedCopy(why, [r[1] for r in results.get(oid, ())])]
    return results


@dataclass(frozen=True)
class RefusedCopy:
    """A table whose copy failed on its own values: ``why``, and the keys its parts wrote."""

    why: str
    keys: list
