"""Manifests: typed, versioned JSON documents that say what a folder of the store holds.

Every manifest is a JSON object with ``"format": 1`` and a ``"kind"``. Readers refuse a
missing or unknown ``format`` (:class:`UnsupportedManifestFormat`), a missing required
field, a wrong type or an inconsistent value (:class:`ManifestError`, naming the S3 key
and the JSON path, e.g. ``tables[2].parts[0].rows``). Fields a reader does not know are
kept in ``extra`` and written back unchanged, so a newer writer may add optional fields
to format 1 without breaking older readers; anything incompatible bumps ``format``.

- :class:`SnapshotManifest` (``kind: "snapshot"``): ``…/snapshot/{snapshot_id}/_manifest.json``.
- :class:`BaseBackupInfo` (``kind: "basebackup"``): ``…/basebackup/{backup_id}/backup.json``.

LSNs are PostgreSQL's text form (``16/B374D848``); ``system_id`` is a string of digits (a
64-bit number would lose precision in JSON readers that use doubles); times are ISO 8601
with a UTC offset. Part ``path``s are relative to the folder holding the manifest.

Why one module of about 820 lines: the two kinds share one reader (``_Doc``: typed field
access with JSON paths in errors, ``_load``: the format and kind checks, the LSN, time and
system id checks) and one S3 I/O (:func:`write_manifest` takes either); a module per kind
would have both import that reader's private helpers. (The window manifest,
``store/window.py``, has its own reader: its errors and messages differ.)
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from airflow_pgcdc.protocol.lsn import LSN, InvalidLSN, lsn_text
from airflow_pgcdc.store.layout import LayoutError, validate_archive_name
from airflow_pgcdc.store.s3 import StoreError

__all__ = [
    "FORMAT_VERSION",
    "ArchiveEntry",
    "BaseBackupInfo",
    "ColumnEntry",
    "ManifestError",
    "load_document",
    "PartEntry",
    "SnapshotManifest",
    "TableEntry",
    "UnsupportedManifestFormat",
    "committed_snapshot",
    "read_basebackup_info",
    "read_snapshot_manifest",
    "write_manifest",
]

FORMAT_VERSION = 1
COMPRESSIONS = (None, "gzip", "lz4", "zstd")


class ManifestError(StoreError, ValueError):
    """A manifest that is not valid JSON, misses a field, or holds a wrong or inconsistent value."""


class UnsupportedManifestFormat(ManifestError):
    """A manifest whose ``format`` is missing or not one this version reads."""


# --------------------------------------------------------------------------- reading helpers


class _Doc:
    """A JSON object being read: typed getters that raise ManifestError naming key and path."""

    def __init__(self, data: Any, path: str, key: str | None, known: Sequence[str]) -> None:
        if not isinstance(data, dict):
            raise ManifestError(
                f"{path or 'the manifest'} must be a JSON object, got {_jtype(data)}", key=key
            )
        self.data = data
        self.path = path
        self.key = key
        self.known = set(known)

    def fail(self, name: str, reason: str) -> ManifestError:
        where = f"{self.path}.{name}" if self.path else name
        return ManifestError(f"{where}: {reason}", key=self.key)

    def sub(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def _raw(self, name: str, required: bool) -> Any:
        if name not in self.data:
            if required:
                raise self.fail(name, "missing")
            return None
        return self.data[name]

    def str(self, name: str, *, required: bool = True, empty: bool = False) -> str | None:
        value = self._raw(name, required)
        if value is None:
            if required:
                raise self.fail(name, "must be a string, got null")
            return None
        if not isinstance(value, str):
            raise self.fail(name, f"must be a string, got {_jtype(value)}")
        if not empty and not value:
            raise self.fail(name, "must not be empty")
        return value

    def int(self, name: str, *, required: bool = True, minimum: int | None = 0) -> int | None:
        value = self._raw(name, required)
        if value is None:
            if required:
                raise self.fail(name, "must be an integer, got null")
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(name, f"must be an integer, got {_jtype(value)}")
        if minimum is not None and value < minimum:
            raise self.fail(name, f"must be >= {minimum}, got {value}")
        return value

    def bool(self, name: str, *, required: bool = True, default: bool = False) -> bool:
        value = self._raw(name, required)
        if value is None and not required:
            return default
        if not isinstance(value, bool):
            raise self.fail(name, f"must be true or false, got {_jtype(value)}")
        return value

    def list(self, name: str, *, required: bool = True) -> list | None:
        value = self._raw(name, required)
        if value is None:
            if required:
                raise self.fail(name, "must be a list, got null")
            return None
        if not isinstance(value, list):
            raise self.fail(name, f"must be a list, got {_jtype(value)}")
        return value

    def str_list(self, name: str, *, required: bool = True) -> list[str] | None:
        value = self.list(name, required=required)
        if value is None:
            return None
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item:
                raise self.fail(f"{name}[{i}]", f"must be a non-empty string, got {_jtype(item)}")
        return list(value)

    def lsn(self, name: str, *, required: bool = True) -> str | None:
        value = self.str(name, required=required)
        if value is None:
            return None
        try:
            return str(LSN.parse(value))
        except InvalidLSN as e:
            raise self.fail(name, str(e)) from None

    def time(self, name: str, *, required: bool = True) -> datetime | None:
        value = self.str(name, required=required)
        if value is None:
            return None
        try:
            return _check_time(datetime.fromisoformat(value))
        except ValueError as e:
            raise self.fail(name, f"must be an ISO 8601 time with a UTC offset: {e}") from None

    def extra(self) -> dict[str, Any]:
        return {k: v for k, v in self.data.items() if k not in self.known}


def _jtype(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _check_time(value: datetime) -> datetime:
    if not isinstance(value, datetime):
        raise ValueError(f"expected a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"time {value.isoformat()} has no UTC offset")
    return value


def _canonical_lsn(value: Any, what: str) -> str:
    try:
        return lsn_text(value)
    except (InvalidLSN, TypeError) as e:
        raise ManifestError(f"{what}: {e}") from None


def load_document(text: str | bytes | Mapping[str, Any], key: str | None, kind: str, *,
                  formats: tuple[int, ...] = (FORMAT_VERSION,)) -> dict[str, Any]:
    """The one loader of every manifest kind: a JSON object of one of ``formats`` and of
    ``kind`` (:class:`ManifestError` naming ``key`` otherwise); the caller reads its fields."""
    if isinstance(text, Mapping):
        data: Any = dict(text)
    else:
        try:
            data = json.loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ManifestError(f"not a JSON document: {e}", key=key) from None
    if not isinstance(data, dict):
        raise ManifestError(f"a manifest is a JSON object, got {_jtype(data)}", key=key)
    if "format" not in data:
        raise UnsupportedManifestFormat(
            f'no "format" field: not a pgcdc {kind} manifest, or written by a version before format 1',
            key=key,
        )
    fmt = data["format"]
    if fmt not in formats or isinstance(fmt, bool):
        raise UnsupportedManifestFormat(
            f"{kind} manifest format {fmt!r} is not supported (this version reads format "
            f"{' and '.join(map(str, formats))}): upgrade airflow-pgcdc",
            key=key,
        )
    if data.get("kind") != kind:
        raise ManifestError(f"expected a {kind!r} manifest, got kind {data.get('kind')!r}", key=key)
    return data


def _dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


# --------------------------------------------------------------------------- snapshot manifest


@dataclass(frozen=True)
class ColumnEntry:
    """A column: name, PostgreSQL type name (``format_type`` without the modifier, e.g.
    ``integer``, ``character varying``, ``numeric``, ``public.mood``, ``text[]``), its
    type modifier (``atttypmod``; absent/``None`` when -1), nullability, and whether it is
    part of the table's key. ``attnum`` and ``attxmin`` (optional; copies written before
    them have none): the column's identity in PostgreSQL and the transaction that last
    wrote its catalog row, which the merge follows columns by (a rename keeps the attnum)."""

    name: str
    pg_type: str
    nullable: bool = True
    key: bool = False
    typmod: int | None = None
    type_oid: int | None = None
    attnum: int | None = None
    attxmin: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    _FIELDS: ClassVar = ("name", "pg_type", "typmod", "type_oid", "nullable", "key", "attnum", "attxmin")

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "pg_type": self.pg_type}
        if self.typmod is not None:
            d["typmod"] = self.typmod
        if self.type_oid is not None:
            d["type_oid"] = self.type_oid
        d["nullable"] = self.nullable
        d["key"] = self.key
        if self.attnum is not None:
            d["attnum"] = self.attnum
        if self.attxmin is not None:
            d["attxmin"] = self.attxmin
        return d | dict(self.extra)

    @classmethod
    def from_dict(cls, data: Any, path: str = "column", key: str | None = None) -> ColumnEntry:
        r = _Doc(data, path, key, cls._FIELDS)
        return cls(
            name=r.str("name"),  # type: ignore[arg-type]
            pg_type=r.str("pg_type"),  # type: ignore[arg-type]
            typmod=r.int("typmod", required=False, minimum=None),
            type_oid=r.int("type_oid", required=False, minimum=1),
            nullable=r.bool("nullable"),
            key=r.bool("key"),
            attnum=r.int("attnum", required=False, minimum=1),
            attxmin=r.str("attxmin", required=False),
            extra=r.extra(),
        )


@dataclass(frozen=True)
class PartEntry:
    """A Parquet part: ``path`` relative to the manifest's folder, rows and bytes."""

    path: str
    rows: int
    bytes: int
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    _FIELDS: ClassVar = ("path", "rows", "bytes")

    def __post_init__(self) -> None:
        _check_relative_path(self.path)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "rows": self.rows, "bytes": self.bytes} | dict(self.extra)

    @classmethod
    def from_dict(cls, data: Any, path: str = "part", key: str | None = None) -> PartEntry:
        r = _Doc(data, path, key, cls._FIELDS)
        rel = r.str("path")
        try:
            _check_relative_path(rel)  # type: ignore[arg-type]
        except ManifestError as e:
            raise r.fail("path", e.reason) from None
        return cls(path=rel, rows=r.int("rows"), bytes=r.int("bytes"), extra=r.extra())  # type: ignore[arg-type]

    @classmethod
    def from_part_info(cls, info: Any, base: str) -> PartEntry:
        """From a :class:`~airflow_pgcdc.store.parquet.PartInfo` whose key is under ``base``."""
        d = info.to_dict(base)
        return cls(path=d["path"], rows=d["rows"], bytes=d["bytes"])


def _check_relative_path(path: str) -> None:
    if not isinstance(path, str) or not path:
        raise ManifestError(f"a part path must be a non-empty string, got {path!r}")
    if (
        path.startswith("/")
        or "://" in path
        or any(seg in ("", ".", "..") for seg in path.split("/"))
    ):
        raise ManifestError(
            f"a part path is relative to the manifest's folder, without '.', '..' or '//': {path!r}"
        )


@dataclass(frozen=True)
class TableEntry:
    """One copied table: columns, key, publication filters, parts and totals.

    ``has_key`` is False for a table with neither a primary key nor a replica identity
    index: it was copied, but merging its changes needs ``REPLICA IDENTITY FULL`` or key
    columns given by the user. ``row_filter`` and ``column_list`` are the publication's
    (PostgreSQL 15+), ``None`` when it has none. ``rows``/``bytes`` default to the sums
    over ``parts`` and must equal them.
    """

    schema: str
    table: str
    columns: tuple[ColumnEntry, ...]
    key_columns: tuple[str, ...] = ()
    parts: tuple[PartEntry, ...] = ()
    has_key: bool | None = None
    row_filter: str | None = None
    column_list: tuple[str, ...] | None = None
    rows: int | None = None
    bytes: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    _FIELDS: ClassVar = (
        "schema", "table", "columns", "key_columns", "has_key", "row_filter",
        "column_list", "parts", "rows", "bytes",
    )  # fmt: skip

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "columns", tuple(self.columns))
        set_(self, "key_columns", tuple(self.key_columns))
        set_(self, "parts", tuple(self.parts))
        if self.column_list is not None:
            set_(self, "column_list", tuple(self.column_list))
        if self.has_key is None:
            set_(self, "has_key", bool(self.key_columns))
        if self.rows is None:
            set_(self, "rows", sum(p.rows for p in self.parts))
        if self.bytes is None:
            set_(self, "bytes", sum(p.bytes for p in self.parts))
        self._validate()

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.table}"

    def _validate(self) -> None:
        name = f"table {self.schema!r}.{self.table!r}"
        if not self.schema or not self.table:
            raise ManifestError(f"{name}: schema and table must not be empty")
        if not self.columns:
            raise ManifestError(f"{name}: no columns")
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            raise ManifestError(f"{name}: duplicate column names")
        missing = [k for k in self.key_columns if k not in names]
        if missing:
            raise ManifestError(f"{name}: key columns {missing} are not among its columns")
        if len(set(self.key_columns)) != len(self.key_columns):
            raise ManifestError(f"{name}: duplicate key columns")
        flagged = {c.name for c in self.columns if c.key}
        if flagged != set(self.key_columns):
            raise ManifestError(
                f"{name}: columns flagged key {sorted(flagged)} differ from key_columns {list(self.key_columns)}"
            )
        if self.has_key != bool(self.key_columns):
            raise ManifestError(
                f"{name}: has_key is {self.has_key} but key_columns is {list(self.key_columns)}"
            )
        if self.column_list is not None:
            absent = [c for c in self.column_list if c not in names]
            if absent:
                raise ManifestError(
                    f"{name}: column_list names {absent}, which are not among its columns"
                )
        if self.rows != sum(p.rows for p in self.parts):
            raise ManifestError(f"{name}: rows {self.rows} differ from the sum over its parts")
        if self.bytes != sum(p.bytes for p in self.parts):
            raise ManifestError(f"{name}: bytes {self.bytes} differ from the sum over its parts")
        paths = [p.path for p in self.parts]
        if len(set(paths)) != len(paths):
            raise ManifestError(f"{name}: duplicate part paths")

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "schema": self.schema,
            "table": self.table,
            "columns": [c.to_dict() for c in self.columns],
            "key_columns": list(self.key_columns),
            "has_key": self.has_key,
        }
        if self.row_filter is not None:
            d["row_filter"] = self.row_filter
        if self.column_list is not None:
            d["column_list"] = list(self.column_list)
        d["parts"] = [p.to_dict() for p in self.parts]
        d["rows"] = self.rows
        d["bytes"] = self.bytes
        return d | dict(self.extra)

    @classmethod
    def from_dict(cls, data: Any, path: str = "table", key: str | None = None) -> TableEntry:
        r = _Doc(data, path, key, cls._FIELDS)
        columns = [
            ColumnEntry.from_dict(c, f"{r.sub('columns')}[{i}]", key)
            for i, c in enumerate(r.list("columns"))  # type: ignore[arg-type]
        ]
        parts = [
            PartEntry.from_dict(p, f"{r.sub('parts')}[{i}]", key)
            for i, p in enumerate(r.list("parts"))
        ]  # type: ignore[arg-type]
        try:
            return cls(
                schema=r.str("schema"),  # type: ignore[arg-type]
                table=r.str("table"),  # type: ignore[arg-type]
                columns=tuple(columns),
                key_columns=tuple(r.str_list("key_columns")),  # type: ignore[arg-type]
                has_key=r.bool("has_key"),
                row_filter=r.str("row_filter", required=False),
                column_list=r.str_list("column_list", required=False),
                parts=tuple(parts),
                rows=r.int("rows"),
                bytes=r.int("bytes"),
                extra=r.extra(),
            )
        except ManifestError as e:
            if e.key is not None:
                raise
            raise ManifestError(f"{path}: {e.reason}", key=key) from None


SLICE_WHERE = "where"
"""A slice resync's table entry (``pgcdc resync --where``): the predicate its rows match."""

POINT_TIME = "consistent_point_time"
"""A snapshot manifest's server time read right after its slot was created (ISO 8601): every
commit in the copy was made before it. A replay to a time earlier than that is refused (the
copy may hold commits made after the time); a snapshot without it bounds by ``finished_at``."""


@dataclass(frozen=True)
class SnapshotManifest:
    """``_manifest.json`` of a snapshot, written last: the snapshot exists iff it does."""

    slot: str
    snapshot_id: str
    snapshot_name: str
    consistent_point: str
    system_id: str
    timeline: int
    started_at: datetime
    finished_at: datetime
    tables: tuple[TableEntry, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    kind: ClassVar[str] = "snapshot"
    _FIELDS: ClassVar = (
        "format", "kind", "slot", "snapshot_id", "snapshot_name", "consistent_point",
        "system_id", "timeline", "started_at", "finished_at", "tables", "rows", "bytes",
    )  # fmt: skip

    def __post_init__(self) -> None:
        object.__setattr__(self, "tables", tuple(self.tables))
        object.__setattr__(
            self, "consistent_point", _canonical_lsn(self.consistent_point, "consistent_point")
        )
        object.__setattr__(self, "system_id", _check_system_id(self.system_id))
        for name in ("slot", "snapshot_id", "snapshot_name"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ManifestError(f"{name} must be a non-empty string")
        if (
            not isinstance(self.timeline, int)
            or isinstance(self.timeline, bool)
            or self.timeline < 1
        ):
            raise ManifestError(f"timeline must be a positive integer, got {self.timeline!r}")
        try:
            _check_time(self.started_at)
            _check_time(self.finished_at)
        except ValueError as e:
            raise ManifestError(f"started_at/finished_at: {e}") from None
        if self.finished_at < self.started_at:
            raise ManifestError("finished_at is before started_at")
        seen = set()
        for t in self.tables:
            if (t.schema, t.table) in seen:
                raise ManifestError(f"table {t.schema!r}.{t.table!r} is listed twice")
            seen.add((t.schema, t.table))

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables)  # type: ignore[misc]

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.tables)  # type: ignore[misc]

    @property
    def tables_without_key(self) -> list[TableEntry]:
        return [t for t in self.tables if not t.has_key]

    def table(self, schema: str, table: str) -> TableEntry:
        for t in self.tables:
            if t.schema == schema and t.table == table:
                return t
        raise KeyError(f"{schema}.{table}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "kind": self.kind,
            "slot": self.slot,
            "snapshot_id": self.snapshot_id,
            "snapshot_name": self.snapshot_name,
            "consistent_point": self.consistent_point,
            "system_id": self.system_id,
            "timeline": self.timeline,
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat(),
            "rows": self.rows,
            "bytes": self.bytes,
            "tables": [t.to_dict() for t in self.tables],
        } | dict(self.extra)

    def to_json(self) -> str:
        return _dumps(self.to_dict())

    @classmethod
    def from_json(
        cls, text: str | bytes | Mapping[str, Any], *, key: str | None = None
    ) -> SnapshotManifest:
        """Parse and validate; ``key`` (the S3 key) is named in errors."""
        data = load_document(text, key, cls.kind)
        r = _Doc(data, "", key, cls._FIELDS)
        tables = [
            TableEntry.from_dict(t, f"tables[{i}]", key) for i, t in enumerate(r.list("tables"))
        ]  # type: ignore[arg-type]
        try:
            manifest = cls(
                slot=r.str("slot"),  # type: ignore[arg-type]
                snapshot_id=r.str("snapshot_id"),  # type: ignore[arg-type]
                snapshot_name=r.str("snapshot_name"),  # type: ignore[arg-type]
                consistent_point=r.lsn("consistent_point"),  # type: ignore[arg-type]
                system_id=r.str("system_id"),  # type: ignore[arg-type]
                timeline=r.int("timeline", minimum=1),  # type: ignore[arg-type]
                started_at=r.time("started_at"),  # type: ignore[arg-type]
                finished_at=r.time("finished_at"),  # type: ignore[arg-type]
                tables=tuple(tables),
                extra=r.extra(),
            )
        except ManifestError as e:
            if e.key is not None:
                raise
            raise ManifestError(e.reason, key=key) from None
        for name in ("rows", "bytes"):
            stated = r.int(name, required=False)
            if stated is not None and stated != getattr(manifest, name):
                raise r.fail(
                    name,
                    f"{stated} differs from the sum over the tables ({getattr(manifest, name)})",
                )
        return manifest


def _check_system_id(value: Any) -> str:
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not text.isascii() or not text.isdigit() or int(text) >= 2**64:
        raise ManifestError(
            f"system_id must be the decimal 64-bit system identifier, got {value!r}"
        )
    return str(int(text))


# --------------------------------------------------------------------------- base backup


@dataclass(frozen=True)
class ArchiveEntry:
    """One archive object of a base backup: its name (``base.tar``, ``16385.tar.zst``), the
    tablespace (``None`` for the data directory) and its size."""

    name: str
    bytes: int
    tablespace_oid: int | None = None
    tablespace_location: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    _FIELDS: ClassVar = ("name", "bytes", "tablespace_oid", "tablespace_location")

    def __post_init__(self) -> None:
        try:
            validate_archive_name(self.name)
        except LayoutError as e:
            raise ManifestError(e.reason) from None
        is_base = self.name.startswith("base.")
        if is_base != (self.tablespace_oid is None):
            raise ManifestError(
                f"archive {self.name!r}: tablespace_oid {self.tablespace_oid!r} does not match its name"
            )
        if self.tablespace_oid is not None and not self.name.startswith(f"{self.tablespace_oid}."):
            raise ManifestError(
                f"archive {self.name!r} is not named after tablespace {self.tablespace_oid}"
            )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "bytes": self.bytes}
        if self.tablespace_oid is not None:
            d["tablespace_oid"] = self.tablespace_oid
        if self.tablespace_location is not None:
            d["tablespace_location"] = self.tablespace_location
        return d | dict(self.extra)

    @classmethod
    def from_dict(cls, data: Any, path: str = "archive", key: str | None = None) -> ArchiveEntry:
        r = _Doc(data, path, key, cls._FIELDS)
        try:
            return cls(
                name=r.str("name"),  # type: ignore[arg-type]
                bytes=r.int("bytes"),  # type: ignore[arg-type]
                tablespace_oid=r.int("tablespace_oid", required=False, minimum=1),
                tablespace_location=r.str("tablespace_location", required=False),
                extra=r.extra(),
            )
        except ManifestError as e:
            if e.key is not None:
                raise
            raise ManifestError(f"{path}: {e.reason}", key=key) from None


@dataclass(frozen=True)
class BaseBackupInfo:
    """``backup.json`` next to a base backup's archives, written last.

    ``manifest`` says whether a ``backup_manifest`` object was stored; ``compression`` is
    the server-side compression (``gzip``, ``lz4``, ``zstd``) or ``None``.
    """

    backup_id: str
    start_lsn: str
    end_lsn: str
    timeline: int
    label: str
    archives: tuple[ArchiveEntry, ...]
    compression: str | None = None
    manifest: bool = False
    system_id: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    kind: ClassVar[str] = "basebackup"
    _FIELDS: ClassVar = (
        "format", "kind", "backup_id", "start_lsn", "end_lsn", "timeline", "label",
        "archives", "compression", "manifest", "system_id", "started_at", "finished_at", "bytes",
    )  # fmt: skip

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "archives", tuple(self.archives))
        set_(self, "start_lsn", _canonical_lsn(self.start_lsn, "start_lsn"))
        set_(self, "end_lsn", _canonical_lsn(self.end_lsn, "end_lsn"))
        if LSN.parse(self.end_lsn) < LSN.parse(self.start_lsn):
            raise ManifestError(f"end_lsn {self.end_lsn} is before start_lsn {self.start_lsn}")
        if (
            not isinstance(self.timeline, int)
            or isinstance(self.timeline, bool)
            or self.timeline < 1
        ):
            raise ManifestError(f"timeline must be a positive integer, got {self.timeline!r}")
        if not isinstance(self.backup_id, str) or not self.backup_id:
            raise ManifestError("backup_id must be a non-empty string")
        if not isinstance(self.label, str):
            raise ManifestError("label must be a string")
        if self.compression not in COMPRESSIONS:
            raise ManifestError(
                f"compression must be gzip, lz4, zstd or null, got {self.compression!r}"
            )
        if self.system_id is not None:
            set_(self, "system_id", _check_system_id(self.system_id))
        names = [a.name for a in self.archives]
        if len(set(names)) != len(names):
            raise ManifestError("duplicate archive names")
        if sum(n.startswith("base.") for n in names) != 1:
            raise ManifestError(f"exactly one base.tar archive expected, got {names}")
        suffix = {None: "", "gzip": ".gz", "lz4": ".lz4", "zstd": ".zst"}[self.compression]
        wrong = [n for n in names if not n.endswith(".tar" + suffix)]
        if wrong:
            raise ManifestError(f"archives {wrong} do not match compression {self.compression!r}")
        try:
            for t in (self.started_at, self.finished_at):
                if t is not None:
                    _check_time(t)
        except ValueError as e:
            raise ManifestError(f"started_at/finished_at: {e}") from None
        if self.started_at and self.finished_at and self.finished_at < self.started_at:
            raise ManifestError("finished_at is before started_at")

    @property
    def bytes(self) -> int:
        return sum(a.bytes for a in self.archives)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "format": FORMAT_VERSION,
            "kind": self.kind,
            "backup_id": self.backup_id,
            "label": self.label,
            "start_lsn": self.start_lsn,
            "end_lsn": self.end_lsn,
            "timeline": self.timeline,
        }
        if self.system_id is not None:
            d["system_id"] = self.system_id
        d["compression"] = self.compression
        d["manifest"] = self.manifest
        d["archives"] = [a.to_dict() for a in self.archives]
        d["bytes"] = self.bytes
        if self.started_at is not None:
            d["started_at"] = self.started_at.isoformat()
        if self.finished_at is not None:
            d["finished_at"] = self.finished_at.isoformat()
        return d | dict(self.extra)

    def to_json(self) -> str:
        return _dumps(self.to_dict())

    @classmethod
    def from_json(
        cls, text: str | bytes | Mapping[str, Any], *, key: str | None = None
    ) -> BaseBackupInfo:
        data = load_document(text, key, cls.kind)
        r = _Doc(data, "", key, cls._FIELDS)
        archives = [
            ArchiveEntry.from_dict(a, f"archives[{i}]", key)
            for i, a in enumerate(r.list("archives"))
        ]  # type: ignore[arg-type]
        if "compression" not in data:
            raise r.fail("compression", "missing (null when the archives are not compressed)")
        try:
            info = cls(
                backup_id=r.str("backup_id"),  # type: ignore[arg-type]
                label=r.str("label", empty=True),  # type: ignore[arg-type]
                start_lsn=r.lsn("start_lsn"),  # type: ignore[arg-type]
                end_lsn=r.lsn("end_lsn"),  # type: ignore[arg-type]
                timeline=r.int("timeline", minimum=1),  # type: ignore[arg-type]
                system_id=r.str("system_id", required=False),
                compression=r.str("compression", required=False),
                manifest=r.bool("manifest"),
                archives=tuple(archives),
                started_at=r.time("started_at", required=False),
                finished_at=r.time("finished_at", required=False),
                extra=r.extra(),
            )
        except ManifestError as e:
            if e.key is not None:
                raise
            raise ManifestError(e.reason, key=key) from None
        stated = r.int("bytes", required=False)
        if stated is not None and stated != info.bytes:
            raise r.fail("bytes", f"{stated} differs from the sum over the archives ({info.bytes})")
        return info


# --------------------------------------------------------------------------- S3 I/O


def write_manifest(
    client: Any,
    bucket: str,
    key: str,
    manifest: SnapshotManifest | BaseBackupInfo,
    *,
    if_absent: bool = True,
) -> bool:
    """Store ``manifest`` at ``key``; with ``if_absent`` (default) only if nothing is there
    (``If-None-Match: *``). Returns False when the key already existed (nothing written)."""
    from airflow_pgcdc.store.s3 import put_bytes, put_if_absent

    body = manifest.to_json().encode("utf-8")
    if if_absent:
        return put_if_absent(client, bucket, key, body, content_type="application/json")
    put_bytes(client, bucket, key, body, content_type="application/json")
    return True


def read_snapshot_manifest(client: Any, bucket: str, key: str) -> SnapshotManifest:
    """Load and validate a snapshot manifest (:class:`ObjectNotFound` if absent)."""
    from airflow_pgcdc.store.s3 import get_bytes

    try:
        return SnapshotManifest.from_json(get_bytes(client, bucket, key), key=key)
    except ManifestError as e:
        raise type(e)(e.reason, bucket=bucket, key=key) from None


def read_basebackup_info(client: Any, bucket: str, key: str) -> BaseBackupInfo:
    """Load and validate a base backup's ``backup.json`` (:class:`ObjectNotFound` if absent)."""
    from airflow_pgcdc.store.s3 import get_bytes

    try:
        return BaseBackupInfo.from_json(get_bytes(client, bucket, key), key=key)
    except ManifestError as e:
        raise type(e)(e.reason, bucket=bucket, key=key) from None


def committed_snapshot(client: Any, layout: Any, slot: str) -> SnapshotManifest | None:
    """The slot's committed snapshot (the one whose ``_manifest.json`` exists), or ``None``.
    ``layout``: a :class:`~airflow_pgcdc.store.layout.Layout`."""
    from airflow_pgcdc.store.s3 import list_keys

    for key in list_keys(client, layout.bucket, layout.snapshots_prefix(slot)):
        if key.endswith("/_manifest.json"):
            return read_snapshot_manifest(client, layout.bucket, key)
    return None
