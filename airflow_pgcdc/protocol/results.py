"""The result rows of the replication commands (spec 003, PostgreSQL docs 55.4): typed values
in. The commands that produce them are built by :mod:`airflow_pgcdc.protocol.commands`.

Parsers (``parse_*``) take one row of a result set as libpq returns it (a sequence
of ``bytes``/``str``/``None`` text values, one per column) and return a typed
value; a row that does not match the spec raises a
:class:`~airflow_pgcdc.errors.ProtocolError` subclass with ``protocol="replication"``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_pgcdc.errors import InvalidFieldValue, UnexpectedMessage
from airflow_pgcdc.protocol.commands import _INT_RE, _UCONST_MAX, PROTOCOL
from airflow_pgcdc.protocol.lsn import LSN, InvalidLSN

__all__ = [
    "IdentifySystem",
    "ReplicationSlotCreated",
    "ReadReplicationSlot",
    "TimelineHistory",
    "TimelineHistoryEntry",
    "TimelineSwitch",
    "BaseBackupPosition",
    "TablespaceInfo",
    "parse_identify_system",
    "parse_show",
    "parse_replication_slot_created",
    "parse_read_replication_slot",
    "parse_timeline_history",
    "parse_timeline_switch",
    "parse_base_backup_position",
    "parse_base_backup_tablespace",
    "parse_base_backup_tablespaces",
]

# -- result rows ----------------------------------------------------------------------

Row = Sequence["bytes | bytearray | memoryview | str | None"]


def _error(cls: type, what: str, reason: str):
    return cls(reason, protocol=PROTOCOL, message_type=f"{what} result row")


def _columns(row: Row, names: Sequence[str], what: str) -> list[Any]:
    if isinstance(row, str | bytes) or not isinstance(row, Sequence):
        raise _error(
            UnexpectedMessage,
            what,
            f"expected a row (sequence of values), got {type(row).__name__}",
        )
    if len(row) != len(names):
        raise _error(
            UnexpectedMessage,
            what,
            f"expected {len(names)} columns ({', '.join(names)}), got {len(row)}",
        )
    return list(row)


def _text(value: Any, column: str, what: str, *, nullable: bool = False) -> str | None:
    if value is None:
        if nullable:
            return None
        raise _error(InvalidFieldValue, what, f"column {column} is NULL")
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _error(
                InvalidFieldValue, what, f"column {column} is not valid UTF-8: {exc.reason}"
            ) from None
    raise _error(InvalidFieldValue, what, f"column {column} has type {type(value).__name__}")


def _int(
    value: Any, column: str, what: str, *, low: int, high: int, nullable: bool = False
) -> int | None:
    text = _text(value, column, what, nullable=nullable)
    if text is None:
        return None
    if not _INT_RE.fullmatch(text):
        raise _error(InvalidFieldValue, what, f"column {column} is not an integer: {text!r}")
    n = int(text)
    if not low <= n <= high:
        raise _error(InvalidFieldValue, what, f"column {column} = {n} is outside {low}..{high}")
    return n


def _lsn_col(value: Any, column: str, what: str, *, nullable: bool = False) -> LSN | None:
    text = _text(value, column, what, nullable=nullable)
    if text is None:
        return None
    try:
        return LSN.parse(text)
    except InvalidLSN:
        raise _error(
            InvalidFieldValue, what, f"column {column} is not an LSN (X/Y): {text!r}"
        ) from None


def _jsonable(value: Any) -> Any:
    if isinstance(value, LSN):
        return str(value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value.hex()
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


class _Result:
    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (LSNs as ``X/Y``)."""
        return {f: _jsonable(getattr(self, f)) for f in self.__dataclass_fields__}  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class IdentifySystem(_Result):
    """The row of ``IDENTIFY_SYSTEM``."""

    @classmethod
    def from_row(cls, row: Row) -> IdentifySystem:
        """Same as :func:`parse_identify_system`."""
        return parse_identify_system(row)

    systemid: str
    """The cluster's unique system identifier (a 64-bit integer, as text)."""
    timeline: int
    xlogpos: LSN
    """The current WAL flush position: streaming can start here."""
    dbname: str | None
    """The database of a logical replication connection, else ``None``."""


_TLI_MAX = _UCONST_MAX


def parse_identify_system(row: Row) -> IdentifySystem:
    what = "IDENTIFY_SYSTEM"
    systemid, timeline, xlogpos, dbname = _columns(
        row, ("systemid", "timeline", "xlogpos", "dbname"), what
    )
    sysid = _text(systemid, "systemid", what)
    if not sysid.isdigit() or not sysid.isascii() or int(sysid) >= 1 << 64:
        raise _error(InvalidFieldValue, what, f"column systemid is not a 64-bit integer: {sysid!r}")
    return IdentifySystem(
        systemid=sysid,
        timeline=_int(timeline, "timeline", what, low=1, high=_TLI_MAX),
        xlogpos=_lsn_col(xlogpos, "xlogpos", what),
        dbname=_text(dbname, "dbname", what, nullable=True),
    )


def parse_show(row: Row) -> str:
    """The value of ``SHOW name`` (one text column)."""
    (value,) = _columns(row, ("value",), "SHOW")
    return _text(value, "value", "SHOW")


@dataclass(frozen=True, slots=True)
class ReplicationSlotCreated(_Result):
    """The row of ``CREATE_REPLICATION_SLOT``."""

    @classmethod
    def from_row(cls, row: Row) -> ReplicationSlotCreated:
        """Same as :func:`parse_replication_slot_created`."""
        return parse_replication_slot_created(row)

    slot_name: str
    consistent_point: LSN
    """The earliest position streaming from this slot can start at."""
    snapshot_name: str | None
    """The exported snapshot (``SNAPSHOT 'export'``), valid until the connection's next
    command; ``None`` for physical slots and the other snapshot actions."""
    output_plugin: str | None
    """``None`` for physical slots."""


def parse_replication_slot_created(row: Row) -> ReplicationSlotCreated:
    what = "CREATE_REPLICATION_SLOT"
    slot, point, snap, plugin = _columns(
        row, ("slot_name", "consistent_point", "snapshot_name", "output_plugin"), what
    )
    slot_name = _text(slot, "slot_name", what)
    if not slot_name:
        raise _error(InvalidFieldValue, what, "column slot_name is empty")
    return ReplicationSlotCreated(
        slot_name=slot_name,
        consistent_point=_lsn_col(point, "consistent_point", what),
        snapshot_name=_text(snap, "snapshot_name", what, nullable=True),
        output_plugin=_text(plugin, "output_plugin", what, nullable=True),
    )


@dataclass(frozen=True, slots=True)
class ReadReplicationSlot(_Result):
    """The row of ``READ_REPLICATION_SLOT``: all ``None`` when the slot does not exist."""

    @classmethod
    def from_row(cls, row: Row) -> ReadReplicationSlot:
        """Same as :func:`parse_read_replication_slot`."""
        return parse_read_replication_slot(row)

    slot_type: str | None
    restart_lsn: LSN | None
    restart_tli: int | None

    @property
    def exists(self) -> bool:
        return self.slot_type is not None


def parse_read_replication_slot(row: Row) -> ReadReplicationSlot:
    what = "READ_REPLICATION_SLOT"
    stype, lsn, tli = _columns(row, ("slot_type", "restart_lsn", "restart_tli"), what)
    slot_type = _text(stype, "slot_type", what, nullable=True)
    if slot_type is not None and slot_type not in ("physical", "logical"):
        raise _error(
            InvalidFieldValue,
            what,
            f"column slot_type is neither physical nor logical: {slot_type!r}",
        )
    return ReadReplicationSlot(
        slot_type=slot_type,
        restart_lsn=_lsn_col(lsn, "restart_lsn", what, nullable=True),
        restart_tli=_int(tli, "restart_tli", what, low=1, high=_TLI_MAX, nullable=True),
    )


@dataclass(frozen=True, slots=True)
class TimelineHistoryEntry(_Result):
    """One line of a timeline history file: ``timeline`` ended at ``switchpoint``."""

    timeline: int
    switchpoint: LSN
    reason: str


@dataclass(frozen=True, slots=True)
class TimelineHistory(_Result):
    """The row of ``TIMELINE_HISTORY``: the history file's name and raw bytes."""

    @classmethod
    def from_row(cls, row: Row) -> TimelineHistory:
        """Same as :func:`parse_timeline_history`."""
        return parse_timeline_history(row)

    filename: str
    content: bytes

    def entries(self) -> list[TimelineHistoryEntry]:
        """The file's lines (``tli<TAB>X/Y<TAB>reason``); blank and ``#`` lines skipped."""
        out = []
        for lineno, raw in enumerate(self.content.split(b"\n"), 1):
            line = raw.strip()
            if not line or line.startswith(b"#"):
                continue
            fields = line.split(b"\t", 2) if b"\t" in line else line.split(None, 2)
            try:
                tli = int(fields[0])
                lsn = LSN.parse(fields[1].decode("ascii"))
                reason = fields[2].decode("utf-8", "replace").strip() if len(fields) > 2 else ""
            except (IndexError, ValueError, UnicodeDecodeError):
                raise _error(
                    InvalidFieldValue,
                    "TIMELINE_HISTORY",
                    f"{self.filename} line {lineno} is not 'timeline<TAB>X/Y<TAB>reason': {raw!r}",
                ) from None
            out.append(TimelineHistoryEntry(tli, lsn, reason))
        return out


def parse_timeline_history(row: Row) -> TimelineHistory:
    what = "TIMELINE_HISTORY"
    filename, content = _columns(row, ("filename", "content"), what)
    name = _text(filename, "filename", what)
    if content is None:
        raise _error(InvalidFieldValue, what, "column content is NULL")
    if isinstance(content, str):
        data = content.encode("utf-8")
    elif isinstance(content, bytes | bytearray | memoryview):
        data = bytes(content)
    else:
        raise _error(InvalidFieldValue, what, f"column content has type {type(content).__name__}")
    return TimelineHistory(filename=name, content=data)


@dataclass(frozen=True, slots=True)
class TimelineSwitch(_Result):
    """The row after a physical ``START_REPLICATION`` on an old timeline ends."""

    @classmethod
    def from_row(cls, row: Row) -> TimelineSwitch:
        """Same as :func:`parse_timeline_switch`."""
        return parse_timeline_switch(row)

    next_timeline: int
    switchpoint: LSN


def parse_timeline_switch(row: Row) -> TimelineSwitch:
    what = "START_REPLICATION end-of-timeline"
    tli, pos = _columns(row, ("next_tli", "next_tli_startpos"), what)
    return TimelineSwitch(
        next_timeline=_int(tli, "next_tli", what, low=1, high=_TLI_MAX),
        switchpoint=_lsn_col(pos, "next_tli_startpos", what),
    )


@dataclass(frozen=True, slots=True)
class BaseBackupPosition(_Result):
    """The start or end position row of ``BASE_BACKUP``."""

    @classmethod
    def from_row(cls, row: Row) -> BaseBackupPosition:
        """Same as :func:`parse_base_backup_position`."""
        return parse_base_backup_position(row)

    lsn: LSN
    timeline: int


def parse_base_backup_position(row: Row) -> BaseBackupPosition:
    what = "BASE_BACKUP position"
    lsn, tli = _columns(row, ("recptr", "tli"), what)
    return BaseBackupPosition(
        lsn=_lsn_col(lsn, "recptr", what),
        timeline=_int(tli, "tli", what, low=1, high=_TLI_MAX),
    )


@dataclass(frozen=True, slots=True)
class TablespaceInfo(_Result):
    """One row of ``BASE_BACKUP``'s tablespace list; all ``None`` location/oid for the
    main data directory."""

    @classmethod
    def from_row(cls, row: Row) -> TablespaceInfo:
        """Same as :func:`parse_base_backup_tablespace`."""
        return parse_base_backup_tablespace(row)

    spcoid: int | None
    spclocation: str | None
    size_kb: int | None
    """Approximate size in kB (1024 bytes) when ``PROGRESS`` was asked, else ``None``."""

    @property
    def is_base_directory(self) -> bool:
        return self.spcoid is None


def parse_base_backup_tablespace(row: Row) -> TablespaceInfo:
    what = "BASE_BACKUP tablespace"
    oid, location, size = _columns(row, ("spcoid", "spclocation", "size"), what)
    return TablespaceInfo(
        spcoid=_int(oid, "spcoid", what, low=1, high=_UCONST_MAX, nullable=True),
        spclocation=_text(location, "spclocation", what, nullable=True),
        size_kb=_int(size, "size", what, low=0, high=(1 << 63) - 1, nullable=True),
    )


def parse_base_backup_tablespaces(rows: Iterable[Row]) -> list[TablespaceInfo]:
    return [parse_base_backup_tablespace(r) for r in rows]
