"""``pgcdc maintain``: upkeep of a slot's Delta tables and change store (no Airflow, no Spark).

:func:`maintain_slot` runs, per Delta table of the slot (each on its own: a failure is
reported and the others go on), :func:`~airflow_pgcdc.maintain.tables.maintain_table`
(compaction, VACUUM, checkpoint, log cleanup), then expires the change windows every
table merged and removes old merge staging debris (:mod:`airflow_pgcdc.store.maintenance`)
and the table copies (snapshot, resyncs) whose Delta tables hold them
(:mod:`airflow_pgcdc.maintain.copies`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from airflow_pgcdc.errors import HintedError, PgcdcError
from airflow_pgcdc.lake.progress import TablesProgress
from airflow_pgcdc.lake.tables import CHANGELOG_SUFFIX, RESYNC_APP_SUFFIX, SCD2_SUFFIX, app_id
from airflow_pgcdc.maintain.copies import expire_copies
from airflow_pgcdc.maintain.options import DEFAULT_RETENTION_HOURS, MaintainOptions
from airflow_pgcdc.maintain.tables import DEFAULT_TARGET_SIZE, DeltaTableResult, maintain_table
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout, store_argument
from airflow_pgcdc.store.maintenance import (
    cutoff_for,
    expire_windows,
    expired_key,
    last_maintenance,
    read_expired,
    record_key,
    remove_staging,
    write_record,
)
from airflow_pgcdc.store.manifest import committed_snapshot
from airflow_pgcdc.store.resyncs import committed_resyncs, latest_resync

__all__ = [
    "DEFAULT_RETENTION_HOURS",
    "DEFAULT_TARGET_SIZE",
    "MaintainResult",
    "TablesFailed",
    "expired_key",
    "last_maintenance",
    "maintain_slot",
    "read_expired",
    "record_key",
]

log = logging.getLogger("airflow_pgcdc.maintain")

TABLE_ATTEMPTS = 3  # a table's upkeep refused by a concurrent commit is started over this often
HISTORY_SUFFIXES = (CHANGELOG_SUFFIX, SCD2_SUFFIX)


@dataclass(frozen=True)
class MaintainResult:
    slot: str
    source: str
    delta: str
    retention_hours: float
    dry_run: bool
    tables: list[DeltaTableResult] = field(default_factory=list)
    windows: dict[str, Any] = field(default_factory=dict)
    copies: dict[str, Any] = field(default_factory=dict)
    staging: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def failed(self) -> list[DeltaTableResult]:
        return [t for t in self.tables if t.action == "failed"]

    def to_dict(self) -> dict[str, Any]:
        removed = sum(int(t.vacuum.get("bytes", 0)) + int(t.vacuum.get("deletion_vectors", {}).get("bytes", 0))
                      + int(t.vacuum.get("orphans", {}).get("bytes", 0))
                      + int(t.log.get("bytes", 0)) for t in self.tables)
        return {
            "slot": self.slot, "source": self.source, "delta": self.delta,
            "retention_hours": self.retention_hours, "dry_run": self.dry_run,
            "tables": [t.to_dict() for t in self.tables],
            "windows": self.windows, "copies": self.copies, "staging": self.staging,
            "bytes_removed": removed + sum(int(part.get("bytes", 0)) for part in (self.windows, self.copies,
                                                                                 self.staging)),
            "failed": [t.table for t in self.failed],
            "seconds": self.seconds,
        }


class TablesFailed(PgcdcError):
    """Some tables could not be maintained (the others were); ``result`` holds every outcome."""

    def __init__(self, message: str, result: MaintainResult) -> None:
        super().__init__(message)
        self.result = result


def _key_of(snapshot, resyncs, schema: str, table: str) -> tuple[str, ...]:
    found = latest_resync(resyncs, schema, table)
    if found is not None:
        return tuple(found[1].key_columns)
    entry = next((t for t in (snapshot.tables if snapshot else ()) if t.schema == schema and t.table == table), None)
    return tuple(entry.key_columns) if entry is not None else ()


def _copies(layout: Layout, slot: str, snapshot, resyncs) -> list[tuple[Layout, str, Any]]:
    """The table copies in the store: the slot's snapshot and each resync's (slices too)."""
    out = [(layout, slot, snapshot)] if snapshot is not None else []
    return out + [(r.layout, r.resync_slot, r.manifest) for r in resyncs]


def _applied_reader(delta: str, slot: str, storage) -> Callable[..., dict[str, int | None] | None]:
    """``applied(schema, table, suffix="")``: the transaction versions the Delta table
    ``schema.table`` (``suffix``: one of its history tables) holds for the slot's app ids
    (``{app: version or None}``), or None when it does not exist. Each Delta table's log is
    read once, when first asked: after the compaction, for the expiry of windows and copies.
    A merge committing after that read only makes the answer older than the truth, and an
    older answer keeps more (windows, copies) than needed, never less."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    read: dict[str, dict[str, int | None] | None] = {}

    def applied(schema: str, table: str, suffix: str = "") -> dict[str, int | None] | None:
        from airflow_pgcdc.lake.inspect import table_url

        url = table_url(delta, schema, table, storage) + suffix
        if url not in read:
            app = app_id(slot, schema, table)
            apps = [f"{app}:{suffix[2:]}"] if suffix else [app, app + RESYNC_APP_SUFFIX]
            try:
                dt = DeltaTable(url, storage_options=storage)
            except TableNotFoundError:
                read[url] = None
            else:
                read[url] = {a: dt.transaction_version(a) for a in apps}
        return read[url]

    return applied


def _copy_done(slot: str, snapshot, applied):
    """``done(manifest, schema, table)`` for :func:`~.copies.expire_copies`: the slot's
    snapshot is done with once the table's Delta table exists; a resync's, once the Delta
    table applied it or a later one (``applied``: :func:`_applied_reader`'s)."""

    def done(manifest, schema: str, table: str) -> bool:
        versions = applied(schema, table)
        if versions is None:
            return False
        if snapshot is not None and manifest.snapshot_id == snapshot.snapshot_id and manifest.slot == snapshot.slot:
            return True
        resync = versions[app_id(slot, schema, table) + RESYNC_APP_SUFFIX]
        return resync is not None and resync >= int(LSN.parse(manifest.consistent_point))

    return done


def _record(client, layout: Layout, slot: str, url: str, res: DeltaTableResult, started: datetime, **options) -> None:
    """Write ``{slot}/maintain/tables/{segment}.json`` for this table; a failure to write it
    is logged, never raised (the table was maintained)."""
    record = {"started_at": started.isoformat(timespec="seconds"),
              "finished_at": datetime.now(UTC).isoformat(timespec="seconds"), **options, **res.to_dict()}
    try:
        write_record(client, layout, slot, url, record)
    except Exception as exc:  # noqa: BLE001 - the record is for status; the upkeep is done
        log.warning("%s: the maintenance record was not written: %s", res.table, exc)


def maintain_slot(
    *,
    store: str | None = None,
    slot: str,
    delta: str,
    options: MaintainOptions | Mapping[str, Any] | None = None,
    s3: Any = None,
    **fields: Any,
) -> MaintainResult:
    """Maintain every Delta table of ``slot`` under ``delta``, then the change store under
    ``store``, reached with ``s3`` (S3Settings, or a client made by ``make_s3_client``;
    ``source`` and ``settings``, the 0.1 names, warn), as ``options`` say: a
    :class:`~.options.MaintainOptions` (or a mapping of its fields), or its fields given as
    keywords, which are: ``tables`` (only these, ``schema.table``); ``zorder``; ``target_size``
    (bytes); ``dry_run``; ``windows`` (False: the Delta tables only); ``retention_hours``: how long
    removed Delta files, expired windows and staging debris are kept (default 168; any value,
    0 included, is accepted, with a warning below the default). ``unreferenced_floor_hours``:
    the age under which a file no log entry names is never removed, whatever the retention
    (:data:`~airflow_pgcdc.maintain.unreferenced.UNREFERENCED_FLOOR_HOURS`; 0 only where no
    other writer can be running, as in a benchmark). ``lock_wait``: how long to wait for a
    merge on Delta's Spark engine that holds the Delta root's lock (:mod:`airflow_pgcdc.lake.lock`;
    default 600 s) before :class:`~airflow_pgcdc.lake.lock.DeltaRootBusy`. Raises
    :class:`TablesFailed` when some tables failed (the others were maintained)."""
    store = store_argument("maintain_slot", store, "source", fields.pop("source", None))
    settings, _ = s3store.s3_argument("maintain_slot", s3, fields, needs_settings=True)
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError, TableNotFoundError

    o = MaintainOptions.of(options, **fields)
    tables, retention_hours, zorder, target_size = o.tables, o.retention_hours, o.zorder, o.target_size
    dry_run, windows, unreferenced_floor_hours, lock_wait = o.dry_run, o.windows, o.unreferenced_floor_hours, o.lock_wait
    t0 = time.monotonic()
    if retention_hours < DEFAULT_RETENTION_HOURS:
        log.warning(
            "retention %s h is below the default %d h: time travel to versions older than that "
            "breaks, and a reader or merge still reading a removed file fails (a merge then reruns)",
            retention_hours, DEFAULT_RETENTION_HOURS,
        )
    client = s3store.make_s3_client(settings)
    storage = s3store.delta_storage_options(settings)
    layout = Layout.parse(store)
    if delta.startswith("s3://"):  # its compactions and checkpoints are delta-rs commits
        root = s3store.S3Location.parse(delta)
        s3store.check_conditional_puts(client, root.bucket, root.prefix.rstrip("/") + "/" if root.prefix else "")
    snapshot = committed_snapshot(client, layout, slot)
    resyncs = committed_resyncs(client, layout, slot)
    slices = committed_resyncs(client, layout, slot, slices=True)  # pgcdc resync --where
    names: dict[tuple[str, str], None] = {}
    for t in (snapshot.tables if snapshot else ()):
        names[(t.schema, t.table)] = None
    for r in resyncs:
        for t in r.manifest.tables:
            names[(t.schema, t.table)] = None
    try:  # the merge's tables index: tables only windows hold
        doc = s3store.get_json(client, layout.bucket, layout.merge_tables_index(slot))
        for t in doc.get("tables", ()):
            names[(str(t["schema"]), str(t["table"]))] = None
    except Exception:  # noqa: BLE001 - a cache; missing means the snapshot's and resyncs' tables
        pass
    result = MaintainResult(slot=slot, source=store, delta=delta, retention_hours=retention_hours, dry_run=dry_run)
    wanted = list(names)
    if tables:
        from airflow_pgcdc.pg.tables import parse_table_names  # one parser for --tables everywhere

        asked = parse_table_names(tables)
        missing = [f"{s}.{t}" for s, t in asked if (s, t) not in names]
        if missing:
            raise HintedError(f"table(s) {missing} are not tables of slot {slot}",
                             hint="give schema.table names from the slot's snapshot or resyncs (as --tables "
                                  "reads them everywhere: unquoted names are lower-cased, \"quote\" case and dots)")
        wanted = asked

    # Delta's Spark engine does not commit conditionally on S3: a delta-spark merge and this
    # upkeep must not commit to the root at once (airflow_pgcdc.lake.lock)
    from airflow_pgcdc.lake.lock import root_lock_if

    with root_lock_if(not dry_run, client, delta, job=f"pgcdc maintain of slot {slot}", wait=lock_wait):
        from airflow_pgcdc.lake.inspect import table_url

        cutoff = cutoff_for(retention_hours)
        progress = TablesProgress(len(wanted), job="maintain")
        for schema, table in wanted:
            name = f"{schema}.{table}"
            table_failed = False
            if settings.role_arn:  # an assumed role's credentials, as STS renewed them: each table starts fresh
                storage = s3store.delta_storage_options(settings)
            base = table_url(delta, schema, table, storage)
            app = app_id(slot, schema, table)
            targets = [(base, name, [app, app + RESYNC_APP_SUFFIX])]
            targets += [(base + sfx, name + sfx, [f"{app}:{sfx[2:]}"]) for sfx in HISTORY_SUFFIXES]
            for url, label, apps in targets:
                try:
                    dt = DeltaTable(url, storage_options=storage)  # maintain_table's first attempt reads it
                except TableNotFoundError:
                    if url == base:
                        log.info("%s: no Delta table yet (nothing to maintain; its windows are kept)", name)
                    continue
                started = datetime.now(UTC)
                try:
                    keys = _key_of(snapshot, resyncs, schema, table) if url == base else ()
                    for attempt in range(TABLE_ATTEMPTS):
                        try:
                            res = maintain_table(url, dt=dt if attempt == 0 else None, name=label, apps=apps,
                                                 storage_options=storage, client=client,
                                                 retention_hours=retention_hours,
                                                 zorder=(keys or None) if zorder else None, keys=keys,
                                                 target_size=target_size, dry_run=dry_run,
                                                 unreferenced_floor_hours=unreferenced_floor_hours)
                            break
                        except CommitFailedError as exc:  # a merge committed meanwhile: start over from it
                            if attempt + 1 == TABLE_ATTEMPTS:
                                raise
                            log.warning("%s: a concurrent commit refused this one (%s); starting over", label,
                                        str(exc).splitlines()[0][:200])
                except Exception as exc:  # noqa: BLE001 - reported per table, raised below
                    log.error("%s: not maintained: %s", label, exc, exc_info=not isinstance(exc, PgcdcError))
                    res = DeltaTableResult(table=label, url=url, action="failed", error=f"{type(exc).__name__}: {exc}")
                    table_failed = True
                result.tables.append(res)
                if not dry_run:  # the last maintenance of this table, for pgcdc status
                    _record(client, layout, slot, url, res, started, retention_hours=retention_hours,
                            zorder=bool(zorder), target_size=target_size)
            line = progress.done("failed" if table_failed else "maintained")
            if line:
                log.info("slot %s: %s", slot, line)

        if windows:
            applied = _applied_reader(delta, slot, storage)  # read now, not before the compaction

            def merged(schema: str, table: str) -> int | None:
                """The last window every Delta table of ``schema.table`` merged (None: keep)."""
                app = app_id(slot, schema, table)
                base = applied(schema, table)
                versions = [None if base is None else base[app]]
                for sfx in HISTORY_SUFFIXES:
                    history = applied(schema, table, sfx)
                    if history is not None:
                        versions.append(history[f"{app}:{sfx[2:]}"])
                return None if None in versions else min(versions)

            blocked = None
            for s, t in names:  # a resync not applied yet: its merge reads the windows after its copy
                found = latest_resync(resyncs, s, t)
                if found is None:
                    continue
                base = applied(s, t)
                resync = None if base is None else base[app_id(slot, s, t) + RESYNC_APP_SUFFIX]
                if resync is None or resync < int(found[0].consistent_point):
                    blocked = f"the resync of {s}.{t} is not merged yet"
                    break
            for r in slices if blocked is None else ():  # its merge reads the windows after its copy too
                for e in r.manifest.tables:
                    base = applied(e.schema, e.table)
                    mark = None if base is None else base[app_id(slot, e.schema, e.table) + RESYNC_APP_SUFFIX]
                    if base is not None and (mark is None or mark < int(r.consistent_point)):
                        blocked = f"the slice of {e.schema}.{e.table} ({r.url}) is not merged yet"
                        break
            result = dataclasses.replace(
                result,
                windows=expire_windows(client, layout, slot, merged=merged, cutoff=cutoff, blocked=blocked,
                                       dry_run=dry_run),
                copies=expire_copies(client, layout, slot, _copies(layout, slot, snapshot, resyncs + slices),
                                     done=_copy_done(slot, snapshot, applied), cutoff=cutoff, dry_run=dry_run),
                staging=remove_staging(client, layout, slot, cutoff=cutoff, dry_run=dry_run))
    result = dataclasses.replace(result, seconds=round(time.monotonic() - t0, 3))
    if result.failed:
        raise TablesFailed(
            f"{len(result.failed)} of {len(result.tables)} Delta table(s) not maintained (the others were): "
            + "; ".join(f"{t.table}: {t.error}" for t in result.failed),
            result,
        )
    return result
