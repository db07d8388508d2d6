"""``BASE_BACKUP`` streamed to S3: one object per archive, the manifest, then ``backup.json``.

:func:`base_backup_to_s3` runs ``BASE_BACKUP`` on a physical replication connection
(``replication=true``) and streams every archive the server sends straight into its own
S3 multipart upload as it arrives: memory stays below ``part_size * 2`` whatever the
size of the cluster, and only one upload is open at a time. Objects, under the
store layout (:mod:`airflow_pgcdc.store.layout`)::

    {prefix}/basebackup/{backup_id}/base.tar[.gz|.lz4|.zst]          the data directory
    {prefix}/basebackup/{backup_id}/<tablespace oid>.tar[.gz|…]      one per tablespace
    {prefix}/basebackup/{backup_id}/backup_manifest                  (unless manifest="no")
    {prefix}/basebackup/{backup_id}/backup.json                      written last

Archive names are the ones the server gives (``'n'`` message), so they carry the
suffix of the server-side compression. ``backup_manifest`` is never compressed.
``backup.json`` (:class:`~airflow_pgcdc.store.manifest.BaseBackupInfo`, ``format: 1``)
is written last with a conditional put: a backup exists if and only if its
``backup.json`` does. It records the start and end LSN, the timeline, the system
identifier, each archive's size and SHA-256, and (as extra fields) the server version
and the options used.

Restoring: download the archives, extract ``base.tar`` into an empty directory and each
``<oid>.tar`` into its tablespace directory (edit ``tablespace_map`` to point there),
put ``backup_manifest`` next to them, check with ``pg_verifybackup`` and start
PostgreSQL: with ``wal=True`` (the default) the backup carries the WAL it needs.

On any failure the open upload is aborted, the objects this backup already wrote are
deleted (and pending uploads under its prefix aborted), the replication connection is
closed (the server ends the backup), and a :class:`BaseBackupError` names the step that
failed. A destination that already holds objects is refused before anything starts
(:class:`BackupExists`), so cleanup never touches another backup.

Why one module of about 650 lines: it is one job, :func:`base_backup_to_s3` and the run it
drives (archives to multipart uploads, the manifest, progress, cleanup on failure), with
its typed errors and its result; the stream's frames are :mod:`airflow_pgcdc.protocol.frames`,
the uploads :mod:`airflow_pgcdc.store.multipart`, the manifest
:mod:`airflow_pgcdc.store.manifest`.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from airflow_pgcdc.errors import HintedError, InvalidFieldValue, PgcdcError, UnexpectedMessage
from airflow_pgcdc.pg.conninfo import redact
from airflow_pgcdc.pg.replication import BackupResult, ReplicationConnection
from airflow_pgcdc.protocol.frames import ArchiveData, ManifestStart, NewArchive, Progress
from airflow_pgcdc.protocol.results import (
    TablespaceInfo,
    parse_base_backup_position,
    parse_base_backup_tablespace,
)
from airflow_pgcdc.snapshot.options import BaseBackupOptions
from airflow_pgcdc.store.layout import (
    ARCHIVE_SUFFIXES,
    Layout,
    new_run_id,
    store_argument,
    validate_archive_name,
    validate_run_id,
)
from airflow_pgcdc.store.manifest import ArchiveEntry, BaseBackupInfo, write_manifest
from airflow_pgcdc.store.multipart import MultipartWriter
from airflow_pgcdc.store.privacy import slots_with_rules
from airflow_pgcdc.store.s3 import (
    S3Location,
    StoreError,
    abort_uploads_under,
    list_keys,
    make_s3_client,
    s3_argument,
)
from airflow_pgcdc.typemap.privacy import PiiRuleError

log = logging.getLogger(__name__)

__all__ = [
    "BackupExists",
    "BaseBackupError",
    "BaseBackupResult",
    "BaseBackupServerError",
    "BaseBackupStoreError",
    "base_backup_to_s3",
]

_CONTENT_TYPES = {
    None: "application/x-tar",
    "gzip": "application/gzip",
    "lz4": "application/x-lz4",
    "zstd": "application/zstd",
}


# --------------------------------------------------------------------------- errors


class BaseBackupError(HintedError):
    """A base backup to S3 failed.

    ``backup_id``, ``url`` (the backup's ``s3://…/`` prefix), ``stage`` (what was being
    done: ``"connecting to …"``, ``"streaming base.tar to s3://…"``, …) and ``cause``
    (the underlying typed error, also ``__cause__``). ``cleanup`` says what was removed,
    or why cleanup failed; ``hint`` what the user can do.
    """

    def __init__(
        self,
        reason: str,
        *,
        backup_id: str | None = None,
        url: str | None = None,
        stage: str | None = None,
        cause: BaseException | None = None,
        cleanup: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.reason = reason
        self.backup_id = backup_id
        self.url = url
        self.stage = stage
        self.cause = cause
        self.cleanup = cleanup
        super().__init__(self._render(), hint=hint)

    def _render(self) -> str:
        first, _, rest = self.reason.partition("\n")
        head = f"base backup {self.backup_id}" if self.backup_id else "base backup"
        text = f"{head} failed while {self.stage}: {first}" if self.stage else f"{head}: {first}"
        if self.cleanup:
            text += f" ({self.cleanup})"
        return text + ("\n" + rest if rest else "")



class BaseBackupServerError(BaseBackupError):
    """The PostgreSQL side failed: connection, a server error (e.g. an option the server
    build does not support), or bytes that do not follow the protocol."""


class BaseBackupStoreError(BaseBackupError):
    """The S3 side failed (missing bucket, access denied, a failed upload…)."""


class BackupExists(BaseBackupStoreError):
    """The backup's prefix already holds objects (same ``backup_id``): nothing was done."""


# --------------------------------------------------------------------------- result


@dataclass(frozen=True)
class BaseBackupResult:
    """What :func:`base_backup_to_s3` stored: ``info`` is the ``backup.json`` document,
    ``location`` the backup's folder (``s3://bucket/prefix/basebackup/{backup_id}``)."""

    info: BaseBackupInfo
    location: S3Location
    info_key: str
    manifest_key: str | None
    archive_keys: tuple[str, ...]
    seconds: float

    @property
    def backup_id(self) -> str:
        return self.info.backup_id

    @property
    def url(self) -> str:
        return self.location.url + "/"

    @property
    def start_lsn(self) -> str:
        return self.info.start_lsn

    @property
    def end_lsn(self) -> str:
        return self.info.end_lsn

    @property
    def timeline(self) -> int:
        return self.info.timeline

    def to_dict(self) -> dict[str, Any]:
        """``backup.json``'s content plus ``url`` (JSON-serialisable, e.g. for XCom)."""
        return self.info.to_dict() | {"url": self.url}


# --------------------------------------------------------------------------- progress


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class _ProgressLog:
    """Logs the ``'p'`` messages at most every ``interval`` seconds.

    The spec says ``'p'`` carries the bytes done "in the current tablespace"; servers
    send a running total over the backup. Both are handled: a value lower than the
    previous one starts a new count that is added to what came before.
    """

    def __init__(self, backup_id: str, total: int | None, interval: float | None) -> None:
        self.backup_id = backup_id
        self.total = total
        self.interval = interval
        self.started = time.monotonic()
        self._last_log = self.started
        self._offset = 0
        self._last_raw = 0
        self.done = 0

    def update(self, bytes_done: int) -> None:
        if bytes_done < self._last_raw:
            self._offset += self._last_raw
        self._last_raw = bytes_done
        self.done = self._offset + bytes_done
        if not self.interval:
            return
        now = time.monotonic()
        if now - self._last_log >= self.interval:
            self._last_log = now
            log.info("base backup %s: %s", self.backup_id, self.line(now))

    def line(self, now: float | None = None) -> str:
        elapsed = max(1e-6, (now or time.monotonic()) - self.started)
        rate = self.done / elapsed
        text = _size(self.done)
        if self.total:
            pct = min(100.0, 100.0 * self.done / self.total)
            text += f" of ~{_size(self.total)} ({pct:.0f}%)"
        text += f", {_size(rate)}/s"
        if self.total and rate > 0 and self.done < self.total:
            text += f", ETA {_duration((self.total - self.done) / rate)}"
        return text


# --------------------------------------------------------------------------- the backup


@dataclass
class _Stored:
    name: str
    key: str
    bytes: int
    sha256: str
    tablespace_oid: int | None = None
    tablespace_location: str | None = None


class _Run:
    """State of one backup run, so that a failure at any point knows what to undo."""

    def __init__(self, client: Any, layout: Layout, backup_id: str, part_size: int) -> None:
        self.client = client
        self.layout = layout
        self.bucket = layout.bucket
        self.backup_id = backup_id
        self.prefix = layout.basebackup_prefix(backup_id)
        self.part_size = part_size
        self.stage = "starting"
        self.written: list[str] = []  # keys completed by this run
        self.writer: MultipartWriter | None = None
        self.hasher: Any = None
        self.current: _Stored | None = None
        self.archives: list[_Stored] = []
        self.manifest: _Stored | None = None

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    # -- one open upload at a time

    def open(self, stored: _Stored, content_type: str) -> None:
        self.finish()
        self.stage = f"streaming {stored.name} to s3://{self.bucket}/{stored.key}"
        log.debug("base backup %s: %s", self.backup_id, self.stage)
        self.writer = MultipartWriter(
            self.client, self.bucket, stored.key, part_size=self.part_size, content_type=content_type
        )
        self.hasher = hashlib.sha256()
        self.current = stored

    def write(self, data: Any) -> None:
        if self.writer is None:
            raise UnexpectedMessage(
                "archive data before any new-archive ('n') message",
                protocol="BASE_BACKUP",
                message_type="archive or manifest data ('d')",
            )
        self.writer.write(data)
        self.hasher.update(data)

    def finish(self) -> None:
        """Complete the open upload, if any."""
        writer, stored = self.writer, self.current
        if writer is None or stored is None:
            return
        self.stage = f"completing s3://{self.bucket}/{stored.key}"
        writer.close()
        self.written.append(stored.key)
        stored.bytes = writer.bytes_written
        stored.sha256 = self.hasher.hexdigest()
        self.writer = self.current = self.hasher = None
        log.debug("base backup %s: stored %s (%d bytes)", self.backup_id, stored.name, stored.bytes)

    # -- failure

    def undo(self) -> str:
        """Abort the open upload, delete what this run wrote; say what was done."""
        problems: list[str] = []
        if self.writer is not None:
            self.writer.abort()  # never raises; logs when the abort itself fails
            self.writer = None
        deleted = 0
        keys = list(self.written)
        for i in range(0, len(keys), 1000):
            batch = keys[i : i + 1000]
            try:
                resp = self.client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                )
                errors = resp.get("Errors") or []
                deleted += len(batch) - len(errors)
                if errors:
                    problems.append(
                        f"{len(errors)} objects not deleted, first {errors[0].get('Key')}: "
                        f"{errors[0].get('Message', '')}"
                    )
            except Exception as e:  # cleanup must not hide the original failure
                problems.append(f"DeleteObjects failed: {type(e).__name__}: {e}")
        try:
            abort_uploads_under(self.client, self.bucket, self.prefix)
        except Exception as e:
            problems.append(f"could not list/abort pending uploads: {e}")
        if problems:
            return (
                f"cleanup incomplete under {self.url}: " + "; ".join(problems)
                + f"; deleted {deleted} of {len(keys)} objects"
            )
        return f"removed {deleted} object(s) already written under {self.url}"


def _archive_oid(message: NewArchive) -> int | None:
    if message.is_base_directory:
        return None
    stem = message.archive_name.split(".", 1)[0]
    if not stem.isdigit():
        raise InvalidFieldValue(
            f"archive {message.archive_name!r} of tablespace {message.tablespace_location!r} "
            "is not named after a tablespace oid",
            protocol="BASE_BACKUP",
            message_type="new archive ('n')",
        )
    return int(stem)


def base_backup_to_s3(
    dsn: str,
    store: str | S3Location | None = None,
    *,
    options: BaseBackupOptions | Mapping[str, Any] | None = None,
    s3: Any = None,
    **fields: Any,
) -> BaseBackupResult:
    """Take a base backup of the cluster at ``dsn`` into ``store`` (``s3://bucket/prefix``).
    ``options``: a :class:`~.options.BaseBackupOptions` (or a mapping of its fields), or its
    fields given as keywords, described below. ``s3``: S3Settings or a client (default:
    :func:`~airflow_pgcdc.store.s3.make_s3_client`, boto3's environment conventions). The
    0.1 names ``to`` and ``s3_client`` are accepted for one release, with a
    :class:`DeprecationWarning`.

    Objects go to ``{prefix}/basebackup/{backup_id}/`` (``backup_id`` defaults to a new
    time-sorted id, see :func:`~airflow_pgcdc.store.layout.new_run_id`). The role needs
    the ``REPLICATION`` attribute; ``dsn`` is any libpq connection string (the database
    name is ignored: a base backup copies the whole cluster).

    Options are ``BASE_BACKUP``'s (PostgreSQL 15+): ``checkpoint`` ``"fast"`` or
    ``"spread"``; ``wal`` includes the WAL needed to make the backup consistent (without
    it a restore needs a WAL archive); ``wait`` waits for WAL archiving of the last
    segment; ``compression`` is server-side (``"gzip"``, ``"lz4"``, ``"zstd"`` as the
    server build supports them) with ``compression_detail`` a level, ``"level=N,workers=N"``
    or ``{"level": N, "workers": N}``; ``max_rate`` in kB/s (32..1048576; 0 or ``None``:
    unlimited); ``tablespace_map`` writes the tablespace symlinks into a ``tablespace_map``
    file; ``verify_checksums`` checks data page checksums when the cluster has them;
    ``manifest`` ``"yes"``, ``"force-encode"`` or ``"no"``, with ``manifest_checksums``
    (NONE, CRC32C, SHA224, SHA256, SHA384, SHA512). Invalid option values raise
    :class:`~airflow_pgcdc.protocol.commands.CommandError` before anything starts.

    Progress (bytes, percent of the size the server announced, rate, ETA) is logged
    every ``progress_interval`` seconds (``None`` or 0: no ``PROGRESS`` option, no log).
    Memory stays below about ``2 * part_size``.

    Raises :class:`BackupExists` when the destination already holds objects, and
    :class:`BaseBackupServerError` / :class:`BaseBackupStoreError` when the backup fails;
    in every case nothing this call wrote is left behind (no objects, no pending upload).
    """
    store = store_argument("base_backup_to_s3", store, "to", fields.pop("to", None))
    settings, client = s3_argument("base_backup_to_s3", s3, fields)
    o = BaseBackupOptions.of(options, **fields)  # CommandError on invalid values, before any I/O
    root = store if isinstance(store, S3Location) else S3Location.parse(store)
    layout = Layout(root)
    backup_id = validate_run_id(o.backup_id if o.backup_id is not None else new_run_id(), "backup id")
    label, checkpoint, wal, wait, compression = o.label, o.checkpoint, o.wal, o.wait, o.compression
    max_rate, tablespace_map, verify_checksums = o.max_rate, o.tablespace_map, o.verify_checksums
    manifest, manifest_checksums, progress_interval, part_size = (o.manifest, o.manifest_checksums,
                                                                 o.progress_interval, o.part_size)
    command = o.command()
    compression_detail = command["compression_detail"]
    suffix = ARCHIVE_SUFFIXES[compression]
    client = client if client is not None else make_s3_client(settings)
    run = _Run(client, layout, backup_id, part_size)
    safe_dsn = redact(dsn)

    # -- a store whose pipelines keep columns out of the lake takes no physical copy: it holds every value
    # -- the destination must be empty: cleanup then only ever removes our own objects
    run.stage = f"checking the destination {run.url}"
    try:
        ruled = slots_with_rules(client, layout)
        existing = next(iter(list_keys(client, run.bucket, run.prefix)), None)
    except StoreError as e:
        raise BaseBackupStoreError(
            str(e), backup_id=backup_id, url=run.url, stage=run.stage, cause=e,
            hint="check the bucket name, the S3 endpoint and the credentials",
        ) from e
    if existing is not None:
        raise BackupExists(
            f"s3://{run.bucket}/{existing} already exists; nothing was written",
            backup_id=backup_id, url=run.url, stage=run.stage,
            hint="choose another backup id (or omit it to get a new one)",
        )
    if ruled:
        raise PiiRuleError(
            f"the store {root.url} keeps columns out of the lake (column rules of slot(s) {', '.join(ruled)}): a base "
            "backup would copy every value of the cluster into it; nothing was written",
            hint="take base backups into another store, or snapshot the tables (pgcdc snapshot applies the rules)")

    started_at = datetime.now(UTC)
    t0 = time.monotonic()
    conn: ReplicationConnection | None = None
    try:
        run.stage = f"connecting to {safe_dsn}"
        conn = ReplicationConnection.connect(dsn, replication="true")
        run.stage = "IDENTIFY_SYSTEM"
        system = conn.identify_system()
        server_version = conn.show("server_version") or ""
        server_version_num = conn.server_version
        log.info(
            "base backup %s of %s (PostgreSQL %s, system %s) to %s%s",
            backup_id, safe_dsn, server_version, system.systemid, run.url,
            f", {compression} compressed by the server" if compression else "",
        )
        run.stage = "running BASE_BACKUP"
        start = end = None
        tablespaces: list[TablespaceInfo] = []
        meter = _ProgressLog(backup_id, None, progress_interval)
        in_manifest = False
        # Events are handled in any order of the result sets relative to the CopyData:
        # the protocol sends start and tablespaces first, but the percent/ETA only needs
        # the tablespace sizes once they are known.
        for ev in conn.base_backup(**command):
            t = type(ev)
            if t is ArchiveData:
                run.write(ev.data)
            elif t is Progress:
                meter.update(ev.bytes_done)
            elif t is NewArchive:
                if in_manifest:
                    raise UnexpectedMessage(
                        "a new archive after the manifest", protocol="BASE_BACKUP",
                        message_type="new archive ('n')",
                    )
                name = validate_archive_name(ev.archive_name)
                if not name.endswith(".tar" + suffix):
                    raise InvalidFieldValue(
                        f"archive {name!r} does not match compression {compression!r}",
                        protocol="BASE_BACKUP", message_type="new archive ('n')",
                    )
                oid = _archive_oid(ev)
                if any(a.name == name for a in run.archives):
                    raise InvalidFieldValue(
                        f"archive {name!r} sent twice", protocol="BASE_BACKUP",
                        message_type="new archive ('n')",
                    )
                stored = _Stored(
                    name, layout.basebackup_archive(backup_id, name), 0, "",
                    oid, ev.tablespace_location or None,
                )
                run.archives.append(stored)
                run.open(stored, _CONTENT_TYPES[compression])
            elif t is ManifestStart:
                if in_manifest or not run.archives:
                    raise UnexpectedMessage(
                        "manifest start before any archive, or twice", protocol="BASE_BACKUP",
                        message_type="manifest ('m')",
                    )
                in_manifest = True
                run.manifest = _Stored("backup_manifest", layout.basebackup_manifest(backup_id), 0, "")
                run.open(run.manifest, "application/json")
            elif t is BackupResult:
                if ev.index == 0:
                    start = parse_base_backup_position(ev.result.one())
                    log.debug("base backup %s: start %s on timeline %d", backup_id, start.lsn, start.timeline)
                elif ev.index == 1:
                    tablespaces = [parse_base_backup_tablespace(r) for r in ev.result.rows]
                    sizes = [ts.size_kb for ts in tablespaces]
                    if sizes and None not in sizes:
                        meter.total = sum(sizes) * 1024  # type: ignore[arg-type]
                elif ev.index == 2:
                    end = parse_base_backup_position(ev.result.one())
                else:
                    raise UnexpectedMessage(
                        f"a result set #{ev.index + 1} (three expected)", protocol="BASE_BACKUP"
                    )
        run.finish()
        run.stage = "ending BASE_BACKUP"
        if start is None or end is None:
            raise UnexpectedMessage(
                "the server ended BASE_BACKUP without its "
                + ("start" if start is None else "end") + " position",
                protocol="BASE_BACKUP",
            )
        if not any(a.tablespace_oid is None for a in run.archives):
            raise UnexpectedMessage("no base.tar archive was sent", protocol="BASE_BACKUP")
        if manifest != "no" and run.manifest is None:
            raise UnexpectedMessage("no backup manifest was sent", protocol="BASE_BACKUP")
        conn.close()
        conn = None

        finished_at = datetime.now(UTC)
        extra: dict[str, Any] = {
            "server_version": server_version,
            "server_version_num": server_version_num,
            "end_timeline": end.timeline,
            "wal": wal,
            "options": {
                "checkpoint": checkpoint,
                "wait": wait,
                "compression_detail": (
                    dict(compression_detail)
                    if isinstance(compression_detail, Mapping)
                    else compression_detail
                ),
                "max_rate": max_rate or None,
                "tablespace_map": tablespace_map,
                "verify_checksums": verify_checksums,
                "manifest": manifest,
                "manifest_checksums": manifest_checksums.upper() if manifest != "no" else None,
            },
            # the server's count of archive bytes before compression (its last 'p')
            "uncompressed_bytes": meter.done or None,
        }
        if run.manifest is not None:
            extra["manifest_bytes"] = run.manifest.bytes
            extra["manifest_sha256"] = run.manifest.sha256
        info = BaseBackupInfo(
            backup_id=backup_id,
            start_lsn=str(start.lsn),
            end_lsn=str(end.lsn),
            timeline=start.timeline,
            label=label,
            archives=tuple(
                ArchiveEntry(
                    name=a.name, bytes=a.bytes, tablespace_oid=a.tablespace_oid,
                    tablespace_location=a.tablespace_location, extra={"sha256": a.sha256},
                )
                for a in run.archives
            ),
            compression=compression,
            manifest=run.manifest is not None,
            system_id=system.systemid,
            started_at=started_at,
            finished_at=finished_at,
            extra=extra,
        )
        info_key = layout.basebackup_info(backup_id)
        run.stage = f"writing s3://{run.bucket}/{info_key}"
        if not write_manifest(client, run.bucket, info_key, info, if_absent=True):
            # another run with the same id committed first: its objects share our keys,
            # so none of them may be deleted
            run.written.clear()
            raise BackupExists(
                f"s3://{run.bucket}/{info_key} appeared while this backup ran (another run "
                "with the same backup id?); the objects under the prefix may mix both runs",
                backup_id=backup_id, url=run.url, stage=run.stage,
                hint="use a unique backup id per run",
            )
    except BaseException as exc:
        stage = run.stage
        if conn is not None:
            conn.close()  # mid-COPY: the server aborts the backup
        cleanup = run.undo()
        if not isinstance(exc, Exception) or isinstance(exc, BaseBackupError):
            log.warning("base backup %s stopped while %s: %s", backup_id, stage, cleanup)
            raise
        cls = BaseBackupStoreError if isinstance(exc, StoreError) else BaseBackupServerError
        hint = getattr(exc, "hint", None)
        hint = hint if isinstance(hint, str) and hint else None
        raise cls(
            str(exc) if isinstance(exc, PgcdcError) else f"{type(exc).__name__}: {exc}",
            backup_id=backup_id, url=run.url, stage=stage, cause=exc, cleanup=cleanup,
            hint=hint,
        ) from exc

    seconds = time.monotonic() - t0
    stored_bytes = sum(a.bytes for a in run.archives)
    log.info(
        "base backup %s done in %s: %d archive(s), %s stored%s, %s..%s on timeline %d, %s",
        backup_id, _duration(seconds), len(run.archives), _size(stored_bytes),
        f" ({_size(meter.done)} before compression)" if compression and meter.done else "",
        info.start_lsn, info.end_lsn, info.timeline, run.url,
    )
    return BaseBackupResult(
        info=info,
        location=root.child("basebackup", backup_id),
        info_key=info_key,
        manifest_key=run.manifest.key if run.manifest is not None else None,
        archive_keys=tuple(a.key for a in run.archives),
        seconds=seconds,
    )
