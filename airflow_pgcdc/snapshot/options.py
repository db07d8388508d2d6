"""What the copying jobs are asked, apart from their calls: :class:`SnapshotOptions`
(:func:`~.export.snapshot_to_s3`), :class:`ResyncOptions` (:func:`~.resync.resync_tables`),
:class:`RecoverOptions` (:func:`~.recover.recover_pipeline`) and :class:`BaseBackupOptions`
(:func:`~.basebackup.base_backup_to_s3`); and the names of what they answer. Each call takes
its object (or a mapping of its fields, or the fields as keywords); the CLI builds it once
from its arguments (``from_args``), the operators take it as their templated ``options``.

What the call names apart from the options is what says *which* pipeline: the server
(``dsn``), the store, the slot, the publications, the S3 access (``s3``) and, for tests,
callbacks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from airflow_pgcdc.options import JobOptions
from airflow_pgcdc.snapshot.convert import COPY_FORMATS
from airflow_pgcdc.snapshot.errors import SnapshotError
from airflow_pgcdc.store.s3 import DEFAULT_PART_SIZE

__all__ = [
    "BaseBackupOptions",
    "COPY_FORMATS",
    "DEFAULT_ROWS_PER_PART",
    "RecoverOptions",
    "ResyncOptions",
    "SnapshotOptions",
]

DEFAULT_ROWS_PER_PART = 1_000_000


def _as_text(value: Any) -> Any:
    """``as_text`` kept hashable: a mapping becomes a sorted tuple of ``(table, columns)``
    pairs, a list of ``schema.table=col,col`` items a tuple (both are what
    :func:`~airflow_pgcdc.pg.tables.parse_column_map` reads)."""
    if value is None or isinstance(value, tuple):
        return value
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), tuple([v] if isinstance(v, str) else v)) for k, v in value.items()))
    if isinstance(value, str):
        return (value,)
    return tuple(value)


def as_text_map(value: Any) -> Any:
    """:attr:`SnapshotOptions.as_text` as :func:`~airflow_pgcdc.pg.tables.parse_column_map` takes it."""
    if value and isinstance(value[0], tuple):
        return {k: list(v) for k, v in value}
    return value


def _pii(value: Any) -> tuple[str, ...] | None:
    """``pii`` kept hashable: ``("schema.table:column=rule", ...)`` from that list or from
    ``{"schema.table": {"column": "rule"}}`` (read by :func:`~airflow_pgcdc.store.privacy.parse_rules`)."""
    if not value:
        return None
    if isinstance(value, Mapping):
        return tuple(sorted(f"{t}:{c}={r}" for t, cols in value.items() for c, r in dict(cols).items()))
    return (value,) if isinstance(value, str) else tuple(str(v) for v in value)


class _CopyOptions(JobOptions):
    """What every copying job shares: how the tables are read."""

    def _check_copy(self) -> None:
        if isinstance(self.workers, bool) or int(self.workers) < 1:
            raise SnapshotError(f"workers must be at least 1, got {self.workers!r}")
        if isinstance(self.rows_per_part, bool) or int(self.rows_per_part) < 1:
            raise SnapshotError(f"rows_per_part must be at least 1, got {self.rows_per_part!r}")
        if self.copy_format not in COPY_FORMATS:
            raise SnapshotError(f"copy_format must be one of {', '.join(COPY_FORMATS)}, not {self.copy_format!r}")
        self._put("workers", int(self.workers))
        self._put("rows_per_part", int(self.rows_per_part))
        self._put("as_text", _as_text(self.as_text))


@dataclass(frozen=True, kw_only=True)
class SnapshotOptions(_CopyOptions):
    """What :func:`~.export.snapshot_to_s3` is asked past the server, the store, the slot and
    the publications. ``tables``: copy these (``schema.table``; default: the publications'
    tables). ``workers``: parallel copies; ``rows_per_part``: rows per Parquet part (a big
    table is split by CTID ranges of about this many rows); ``two_phase``: create the slot with
    two-phase decoding; ``snapshot_id``: the run id (default: a new time-sorted one);
    ``progress_interval``: seconds between progress lines; ``copy_format``: ``binary`` or
    ``csv``; ``worker_processes``: copies in processes (default: when the S3 settings are
    known) or threads; ``temporary``: a temporary slot (a resync's); ``as_text``: columns kept
    as their exact PostgreSQL text (``["schema.table=col,col"]`` or ``{"schema.table":
    ["col"]}``); ``slice_where``: copy only the rows matching this SQL predicate (a slice
    resync); ``pii``: the slot's column rules (``["schema.table:column=hash"]`` or
    ``{"schema.table": {"column": "exclude"}}``: :mod:`airflow_pgcdc.typemap.privacy`),
    written to the store for every later job of the slot."""

    job: ClassVar[str] = "the snapshot"

    tables: tuple[str, ...] | None = None
    workers: int = 4
    rows_per_part: int = DEFAULT_ROWS_PER_PART
    two_phase: bool = False
    snapshot_id: str | None = None
    progress_interval: float = 10.0
    copy_format: str = "binary"
    worker_processes: bool | None = None
    temporary: bool = False
    as_text: Any = None
    slice_where: str | None = None
    pii: Any = None

    def __post_init__(self) -> None:
        if self.tables is not None:
            self._put("tables", self._names(self.tables))
        self._check_copy()
        self._put("pii", _pii(self.pii))
        if self.pii:
            from airflow_pgcdc.store.privacy import parse_rules

            parse_rules(self.pii)  # refused when the options are made

    @classmethod
    def from_args(cls, args: Any) -> SnapshotOptions:
        """From ``pgcdc snapshot``'s parsed arguments."""
        return cls.of(tables=args.tables, workers=args.workers, rows_per_part=args.rows_per_part,
                      two_phase=args.two_phase, snapshot_id=args.snapshot_id, progress_interval=args.progress_interval,
                      copy_format=args.copy_format, as_text=args.as_text or None, pii=args.pii or None)


@dataclass(frozen=True, kw_only=True)
class ResyncOptions(_CopyOptions):
    """What :func:`~.resync.resync_tables` is asked past the server, the store, the slot and
    the publications: ``tables`` to copy again (``schema.table``; required), ``where`` (a
    slice: only the rows matching this SQL predicate), and how to copy them (as
    :class:`SnapshotOptions`)."""

    job: ClassVar[str] = "the resync"

    tables: tuple[str, ...] = ()
    where: str | None = None
    workers: int = 4
    rows_per_part: int = DEFAULT_ROWS_PER_PART
    copy_format: str = "binary"
    worker_processes: bool | None = None
    as_text: Any = None

    def __post_init__(self) -> None:
        self._put("tables", self._names(self.tables))
        self._check_copy()

    @classmethod
    def from_args(cls, args: Any) -> ResyncOptions:
        """From ``pgcdc resync``'s parsed arguments."""
        return cls.of(tables=args.tables, where=args.where, workers=args.workers, rows_per_part=args.rows_per_part,
                      as_text=args.as_text or None)


@dataclass(frozen=True, kw_only=True)
class RecoverOptions(_CopyOptions):
    """What :func:`~.recover.recover_pipeline` is asked past the server, the store, the slot
    and the publications: how to copy the tables again (as :class:`SnapshotOptions`);
    ``two_phase`` for a slot that must be created (default: as the lost slot was);
    ``busy_wait``: seconds to wait for a drain or snapshot holding the slot;
    ``prepared_wait``: seconds to wait for prepared transactions to end."""

    job: ClassVar[str] = "the recovery"

    workers: int = 4
    rows_per_part: int = DEFAULT_ROWS_PER_PART
    copy_format: str = "binary"
    worker_processes: bool | None = None
    as_text: Any = None
    two_phase: bool | None = None
    busy_wait: float = 10.0
    prepared_wait: float = 60.0

    def __post_init__(self) -> None:
        self._check_copy()

    @classmethod
    def from_args(cls, args: Any) -> RecoverOptions:
        """From ``pgcdc recover``'s parsed arguments."""
        return cls.of(workers=args.workers, rows_per_part=args.rows_per_part, as_text=args.as_text or None,
                      two_phase=args.two_phase)


@dataclass(frozen=True, kw_only=True)
class BaseBackupOptions(JobOptions):
    """``BASE_BACKUP``'s options (PostgreSQL 15+) and the copy's, for
    :func:`~.basebackup.base_backup_to_s3` (each field's meaning is the call's); invalid
    values raise :class:`~airflow_pgcdc.protocol.commands.CommandError` when the object is made."""

    job: ClassVar[str] = "the base backup"

    backup_id: str | None = None
    label: str = "pgcdc"
    checkpoint: str = "fast"
    wal: bool = True
    wait: bool = True
    compression: str | None = None
    compression_detail: Any = None
    max_rate: int | None = None
    tablespace_map: bool = True
    verify_checksums: bool = True
    manifest: str = "yes"
    manifest_checksums: str = "CRC32C"
    progress_interval: float | None = 10.0
    part_size: int = DEFAULT_PART_SIZE

    def __post_init__(self) -> None:
        from airflow_pgcdc.protocol import commands

        if isinstance(self.compression_detail, Mapping):
            self._put("compression_detail", tuple(sorted(self.compression_detail.items())))
        commands.base_backup(**self.command())  # CommandError on invalid values, before any I/O

    @classmethod
    def from_args(cls, args: Any) -> BaseBackupOptions:
        """From ``pgcdc basebackup``'s parsed arguments."""
        detail = args.compression_detail
        if isinstance(detail, str) and detail.strip().lstrip("+-").isdigit():
            detail = int(detail)
        return cls.of(backup_id=args.backup_id, label=args.label, checkpoint=args.checkpoint, wal=args.wal,
                      wait=args.wait, compression=args.compression, compression_detail=detail,
                      max_rate=args.max_rate, tablespace_map=args.tablespace_map,
                      verify_checksums=args.verify_checksums, manifest=args.manifest,
                      manifest_checksums=args.manifest_checksums,
                      progress_interval=0 if args.quiet else args.progress_interval)

    def command(self) -> dict[str, Any]:
        """The keywords of :func:`~airflow_pgcdc.protocol.commands.base_backup`."""
        detail = self.compression_detail
        return dict(
            label=self.label, progress=bool(self.progress_interval), checkpoint=self.checkpoint, wal=self.wal,
            wait=self.wait, compression=self.compression,
            compression_detail=dict(detail) if isinstance(detail, tuple) else detail,
            max_rate=self.max_rate or None, tablespace_map=self.tablespace_map,
            verify_checksums=self.verify_checksums, manifest=self.manifest,
            manifest_checksums=self.manifest_checksums if self.manifest != "no" else None,
        )
