"""Replication commands (spec 003, PostgreSQL docs 55.4): command text out, typed rows in.

Builders (named after the command: :func:`identify_system`, ...) return the exact text to send with the simple query protocol
on a replication connection. Their grammar mirrors PostgreSQL's ``repl_gram.y``:

- slot names, output plugin names, plugin option names and ``SHOW`` parameter names
  are identifiers (``IDENT``) and always go through
  :func:`~airflow_pgcdc.protocol.quoting.quote_ident`;
- plugin option values, ``SNAPSHOT``, ``LABEL``, ``TARGET``, ``TARGET_DETAIL``,
  ``CHECKPOINT``, ``COMPRESSION``, ``COMPRESSION_DETAIL``, ``MANIFEST`` and
  ``MANIFEST_CHECKSUMS`` values are string literals (``SCONST``) and always go
  through :func:`~airflow_pgcdc.protocol.quoting.quote_literal` (the server reads
  them with ``defGetString``, which accepts a literal for every one of them);
- LSNs are written ``X/Y`` (``RECPTR``), timelines and ``MAX_RATE`` as unsigned
  decimal integers (``UCONST``);
- option keywords are our own constants, written bare in upper case like the docs
  and ``pg_basebackup``; a boolean option is the bare keyword for true and
  ``KEYWORD false`` for false; ``None`` (the default of every option) leaves the
  option out so the server's default applies.

Python arguments are keyword-only apart from the command's subject (slot name,
parameter name, start LSN). Bad arguments raise :class:`CommandError` (a
``ValueError``) naming the argument and what is allowed; identifiers and literals
that cannot be quoted at all raise :class:`~airflow_pgcdc.errors.QuotingError`.

Parsers (``parse_*``) take one row of a result set as libpq returns it (a sequence
of ``bytes``/``str``/``None`` text values, one per column) and return a typed
value; a row that does not match the spec raises a
:class:`~airflow_pgcdc.errors.ProtocolError` subclass with ``protocol="replication"``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from airflow_pgcdc.errors import InvalidFieldValue, PgcdcError, UnexpectedMessage
from airflow_pgcdc.protocol.lsn import LSN, InvalidLSN
from airflow_pgcdc.protocol.quoting import NAMEDATALEN, quote_ident, quote_literal

__all__ = [
    "CommandError",
    "PROTOCOL",
    "MAX_RATE_LOWER",
    "MAX_RATE_UPPER",
    "validate_slot_name",
    # builders
    "identify_system",
    "show",
    "timeline_history",
    "create_replication_slot",
    "read_replication_slot",
    "start_replication_physical",
    "start_replication_logical",
    "drop_replication_slot",
    "base_backup",
    # results
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

PROTOCOL = "replication"

MAX_RATE_LOWER = 32
"""Smallest ``MAX_RATE`` the server accepts, in kB/s (``basebackup.h``)."""
MAX_RATE_UPPER = 1024 * 1024
"""Largest ``MAX_RATE`` the server accepts, in kB/s (1 GB/s)."""

_UCONST_MAX = (1 << 32) - 1
_SLOT_NAME_RE = re.compile(r"[a-z0-9_]+")


class CommandError(PgcdcError, ValueError):
    """An argument that cannot make a valid replication command (bad slot name,
    unknown option value, out-of-range number, options that exclude each other)."""


# -- argument checks ----------------------------------------------------------------


def validate_slot_name(slot_name: str) -> str:
    """Return ``slot_name`` if PostgreSQL accepts it as a replication slot name.

    Mirrors ``ReplicationSlotValidateName``: 1 to 63 bytes of ``[a-z0-9_]``.
    """
    if not isinstance(slot_name, str):
        raise CommandError(f"replication slot name must be a str, not {type(slot_name).__name__}")
    if not slot_name:
        raise CommandError("replication slot name must not be empty")
    if not _SLOT_NAME_RE.fullmatch(slot_name):
        raise CommandError(
            f"replication slot name {slot_name!r} contains invalid characters: "
            "slot names may only contain lower case letters, numbers and the underscore"
        )
    if len(slot_name) >= NAMEDATALEN:
        raise CommandError(
            f"replication slot name {slot_name!r} is {len(slot_name)} bytes long; "
            f"the limit is {NAMEDATALEN - 1}"
        )
    return slot_name


def _slot(slot_name: str) -> str:
    return quote_ident(validate_slot_name(slot_name))


def _flag(value: Any, what: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise CommandError(f"{what} must be True, False or None, not {value!r}")


def _uconst(value: Any, what: str, *, low: int, high: int = _UCONST_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise CommandError(f"{what} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise CommandError(f"{what} must be between {low} and {high}, got {value}")
    return value


def _timeline(value: Any, what: str = "timeline") -> int:
    return _uconst(value, what, low=1)


def _lsn(value: Any, what: str) -> LSN:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise CommandError(f"{what} must be an LSN, an int or 'X/Y' text, not {value!r}")
    try:
        return value if isinstance(value, LSN) else LSN(value)
    except (InvalidLSN, TypeError, ValueError) as exc:
        raise CommandError(f"{what}: {exc}") from None


def _choice(value: Any, what: str, allowed: Sequence[str], *, fold: bool = False) -> str:
    if isinstance(value, str):
        key = value.lower() if fold else value
        for a in allowed:
            if (a.lower() if fold else a) == key:
                return a
    raise CommandError(f"{what} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise CommandError(f"{what} must be a str, not {type(value).__name__}")
    return value


class _Options:
    """Collects ``KEYWORD [value]`` items of a generic option list ``( ... )``."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: list[str] = []

    def flag(self, keyword: str, value: bool | None) -> None:
        if value is True:
            self.items.append(keyword)
        elif value is False:
            self.items.append(f"{keyword} false")

    def literal(self, keyword: str, value: str | None) -> None:
        if value is not None:
            self.items.append(f"{keyword} {quote_literal(value)}")

    def integer(self, keyword: str, value: int | None) -> None:
        if value is not None:
            self.items.append(f"{keyword} {int(value)}")

    def render(self) -> str:
        return f" ({', '.join(self.items)})" if self.items else ""


# -- builders --------------------------------------------------------------------------


def identify_system() -> str:
    """``IDENTIFY_SYSTEM``; parse the row with :func:`parse_identify_system`."""
    return "IDENTIFY_SYSTEM"


def show(name: str) -> str:
    """``SHOW name``: a run-time parameter; a dotted name (``ext.param``) is quoted
    part by part. Parse the row with :func:`parse_show`."""
    _str(name, "parameter name")
    parts = name.split(".")
    if any(not p for p in parts):
        raise CommandError(f"parameter name {name!r} has an empty part")
    return "SHOW " + ".".join(quote_ident(p) for p in parts)


def timeline_history(timeline: int) -> str:
    """``TIMELINE_HISTORY tli``; parse the row with :func:`parse_timeline_history`."""
    return f"TIMELINE_HISTORY {_timeline(timeline)}"


SnapshotAction = Literal["export", "use", "nothing"]
_SNAPSHOT_ACTIONS = ("export", "use", "nothing")
_LEGACY_SNAPSHOT = {
    "export": "EXPORT_SNAPSHOT",
    "nothing": "NOEXPORT_SNAPSHOT",
    "use": "USE_SNAPSHOT",
}


def create_replication_slot(
    slot_name: str,
    *,
    output_plugin: str | None = None,
    temporary: bool = False,
    two_phase: bool | None = None,
    reserve_wal: bool | None = None,
    snapshot: SnapshotAction | None = None,
    legacy_syntax: bool = False,
) -> str:
    """``CREATE_REPLICATION_SLOT slot [TEMPORARY] { PHYSICAL | LOGICAL plugin } [( ... )]``.

    With ``output_plugin`` the slot is logical, else physical. Options, ``None`` =
    left out (server default):

    - ``two_phase`` (logical only): decode two-phase commits at PREPARE;
    - ``snapshot`` (logical only): ``'export'`` (the server's default: the result row
      names a snapshot valid until the connection's next command), ``'use'`` (for the
      current transaction; the command must be its first) or ``'nothing'``;
    - ``reserve_wal`` (physical only): reserve WAL now, not at the first stream.

    ``legacy_syntax=True`` writes the pre-PostgreSQL-15 keyword form
    (``RESERVE_WAL``, ``EXPORT_SNAPSHOT`` / ``NOEXPORT_SNAPSHOT`` / ``USE_SNAPSHOT``,
    ``TWO_PHASE``), which has no way to say "false".
    Parse the row with :func:`parse_replication_slot_created`.
    """
    head = _create_head(slot_name, temporary)
    two_phase = _flag(two_phase, "two_phase")
    reserve_wal = _flag(reserve_wal, "reserve_wal")
    action = None if snapshot is None else _choice(snapshot, "snapshot", _SNAPSHOT_ACTIONS)
    opts = _Options()
    words: list[str] = []
    if output_plugin is None:
        if two_phase is not None or action is not None:
            raise CommandError(
                "two_phase and snapshot apply to logical slots only: "
                f"give output_plugin to create a logical slot {slot_name!r}"
            )
        head += " PHYSICAL"
        if legacy_syntax:
            words += ["RESERVE_WAL"] if reserve_wal else []
        opts.flag("RESERVE_WAL", reserve_wal)
    else:
        if reserve_wal is not None:
            raise CommandError(
                f"reserve_wal applies to physical slots only, not to logical slot {slot_name!r}"
            )
        head += f" LOGICAL {quote_ident(_str(output_plugin, 'output_plugin'))}"
        if legacy_syntax:
            words += [_LEGACY_SNAPSHOT[action]] if action is not None else []
            words += ["TWO_PHASE"] if two_phase else []
        opts.flag("TWO_PHASE", two_phase)
        opts.literal("SNAPSHOT", action)
    if legacy_syntax:
        return " ".join([head, *words])
    return head + opts.render()


def _create_head(slot_name: str, temporary: bool) -> str:
    temporary = _flag(temporary, "temporary")
    return f"CREATE_REPLICATION_SLOT {_slot(slot_name)}" + (" TEMPORARY" if temporary else "")


def read_replication_slot(slot_name: str) -> str:
    """``READ_REPLICATION_SLOT slot`` (physical slots only; PostgreSQL 15+).
    Parse the row with :func:`parse_read_replication_slot`."""
    return f"READ_REPLICATION_SLOT {_slot(slot_name)}"


def start_replication_physical(
    start_lsn: LSN | int | str,
    *,
    slot_name: str | None = None,
    timeline: int | None = None,
) -> str:
    """``START_REPLICATION [SLOT slot] PHYSICAL X/Y [TIMELINE tli]``."""
    parts = ["START_REPLICATION"]
    if slot_name is not None:
        parts.append(f"SLOT {_slot(slot_name)}")
    parts.append(f"PHYSICAL {_lsn(start_lsn, 'start_lsn')}")
    if timeline is not None:
        parts.append(f"TIMELINE {_timeline(timeline)}")
    return " ".join(parts)


PluginOptions = Mapping[str, Any] | Iterable[tuple[str, Any]]
"""Output plugin options: a mapping or ``(name, value)`` pairs; value str/int/bool/None."""


def start_replication_logical(
    slot_name: str,
    start_lsn: LSN | int | str,
    options: PluginOptions | None = (),
) -> str:
    """``START_REPLICATION SLOT slot LOGICAL X/Y [("name" 'value', "flag", ...)]``.

    ``options`` are the output plugin's options, in order, as ``(name, value)`` pairs
    or a mapping. A ``None`` value sends the name alone; ``int`` and ``bool`` values
    are sent as their text (``'4'``, ``'true'``). Names are identifiers (case is
    kept, so use the plugin's spelling, e.g. ``proto_version``); values are literals.
    """
    if options is None:
        options = ()
    items = options.items() if isinstance(options, Mapping) else options
    rendered: list[str] = []
    seen: set[str] = set()
    for item in items:
        try:
            name, value = item
        except (TypeError, ValueError):
            raise CommandError(
                f"plugin options must be (name, value) pairs, got {item!r}"
            ) from None
        _str(name, "plugin option name")
        if name in seen:
            raise CommandError(f"plugin option {name!r} is given twice")
        seen.add(name)
        text = quote_ident(name)
        if value is not None:
            text += " " + quote_literal(_option_value(name, value))
        rendered.append(text)
    cmd = f"START_REPLICATION SLOT {_slot(slot_name)} LOGICAL {_lsn(start_lsn, 'start_lsn')}"
    return cmd + (f" ({', '.join(rendered)})" if rendered else "")


def _option_value(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | str):
        return str(value)
    raise CommandError(
        f"plugin option {name!r} value must be str, int, bool or None, not {type(value).__name__}"
    )


def drop_replication_slot(slot_name: str, *, wait: bool = False) -> str:
    """``DROP_REPLICATION_SLOT slot [WAIT]`` (WAIT: wait for an active slot to go idle)."""
    return f"DROP_REPLICATION_SLOT {_slot(slot_name)}" + (" WAIT" if _flag(wait, "wait") else "")


Target = Literal["client", "server", "blackhole"]
Checkpoint = Literal["fast", "spread"]
Compression = Literal["gzip", "lz4", "zstd"]
Manifest = Literal["yes", "no", "force-encode"]
ManifestChecksums = Literal["NONE", "CRC32C", "SHA224", "SHA256", "SHA384", "SHA512"]

_TARGETS = ("client", "server", "blackhole")
_CHECKPOINTS = ("fast", "spread")
_COMPRESSIONS = ("gzip", "lz4", "zstd")
_MANIFESTS = ("yes", "no", "force-encode")
_MANIFEST_CHECKSUMS = ("NONE", "CRC32C", "SHA224", "SHA256", "SHA384", "SHA512")
# Compression levels as the spec states them (zstd: ZSTD_minCLevel()..ZSTD_maxCLevel(),
# "usually -131072..22").
_LEVELS = {"gzip": (1, 9), "lz4": (1, 12), "zstd": (-131072, 22)}
_DETAIL_KEYWORDS = ("level", "workers")
_INT_RE = re.compile(r"[+-]?[0-9]+")


def base_backup(
    *,
    label: str | None = None,
    target: Target | None = None,
    target_detail: str | None = None,
    progress: bool | None = None,
    checkpoint: Checkpoint | None = None,
    wal: bool | None = None,
    wait: bool | None = None,
    compression: Compression | None = None,
    compression_detail: int | str | Mapping[str, int | None] | None = None,
    max_rate: int | None = None,
    tablespace_map: bool | None = None,
    verify_checksums: bool | None = None,
    manifest: Manifest | None = None,
    manifest_checksums: ManifestChecksums | None = None,
) -> str:
    """``BASE_BACKUP [( option [, ...] )]`` in the PostgreSQL 15+ option syntax.

    Every option defaults to ``None``: left out, the server's default applies.

    - ``target``: ``'client'`` (default), ``'server'`` (needs ``target_detail``, the
      server-side directory) or ``'blackhole'``;
    - ``compression``: ``'gzip'``, ``'lz4'`` or ``'zstd'``; ``compression_detail``
      (needs ``compression``) is a level (``int``), a mapping like
      ``{"level": 3, "workers": 4}`` (workers: zstd only) or the server's text form
      (``"level=3,workers=4"``);
    - ``max_rate`` in kB/s: 0 means unlimited (the option is left out, as the server
      refuses ``MAX_RATE 0``), else 32..1048576;
    - ``manifest``: ``'yes'``, ``'no'`` or ``'force-encode'``; ``manifest_checksums``:
      NONE, CRC32C, SHA224, SHA256, SHA384 or SHA512 (case-insensitive).

    The server then sends the start position (:func:`parse_base_backup_position`),
    the tablespace list (:func:`parse_base_backup_tablespaces`), CopyData messages
    (:func:`airflow_pgcdc.protocol.replication.parse_base_backup_copy_data`) and the
    end position (:func:`parse_base_backup_position`).
    """
    opts = _Options()
    if label is not None:
        opts.literal("LABEL", _str(label, "label"))

    if target is not None:
        target = _choice(target, "target", _TARGETS)
    if target_detail is not None:
        _str(target_detail, "target_detail")
        if target != "server":
            raise CommandError(
                "target_detail is only allowed with target='server' "
                f"(the server-side directory), not target={target!r}"
            )
    elif target == "server":
        raise CommandError("target='server' needs target_detail: the directory on the server")
    opts.literal("TARGET", target)
    opts.literal("TARGET_DETAIL", target_detail)

    opts.flag("PROGRESS", _flag(progress, "progress"))
    if checkpoint is not None:
        opts.literal("CHECKPOINT", _choice(checkpoint, "checkpoint", _CHECKPOINTS))
    opts.flag("WAL", _flag(wal, "wal"))
    opts.flag("WAIT", _flag(wait, "wait"))

    if compression is not None:
        compression = _choice(compression, "compression", _COMPRESSIONS)
        opts.literal("COMPRESSION", compression)
    if compression_detail is not None:
        if compression is None:
            raise CommandError("compression_detail needs compression (gzip, lz4 or zstd)")
        opts.literal("COMPRESSION_DETAIL", _compression_detail(compression, compression_detail))

    if max_rate is not None:
        _uconst(max_rate, "max_rate (kB/s)", low=0, high=MAX_RATE_UPPER)
        if 0 < max_rate < MAX_RATE_LOWER:
            raise CommandError(
                f"max_rate (kB/s) must be 0 (unlimited) or between {MAX_RATE_LOWER} and "
                f"{MAX_RATE_UPPER}, got {max_rate}"
            )
        if max_rate:
            opts.integer("MAX_RATE", max_rate)

    opts.flag("TABLESPACE_MAP", _flag(tablespace_map, "tablespace_map"))
    opts.flag("VERIFY_CHECKSUMS", _flag(verify_checksums, "verify_checksums"))
    if manifest is not None:
        opts.literal("MANIFEST", _choice(manifest, "manifest", _MANIFESTS))
    if manifest_checksums is not None:
        opts.literal(
            "MANIFEST_CHECKSUMS",
            _choice(manifest_checksums, "manifest_checksums", _MANIFEST_CHECKSUMS, fold=True),
        )
    return "BASE_BACKUP" + opts.render()


def _compression_detail(method: str, detail: Any) -> str:
    if isinstance(detail, bool):
        raise CommandError("compression_detail must be an int, a str or a mapping, not a bool")
    if isinstance(detail, int):
        _check_level(method, detail)
        return str(detail)
    if isinstance(detail, Mapping):
        pairs = list(detail.items())
    elif isinstance(detail, str):
        if _INT_RE.fullmatch(detail.strip()):
            _check_level(method, int(detail))
            return detail.strip()
        pairs = []
        for item in detail.split(","):
            key, sep, val = item.strip().partition("=")
            if not key:
                raise CommandError(f"compression_detail {detail!r} has an empty keyword")
            if sep and not _INT_RE.fullmatch(val.strip()):
                raise CommandError(
                    f"compression_detail {detail!r}: {key} needs an integer value, got {val!r}"
                )
            pairs.append((key, int(val) if sep else None))
    else:
        raise CommandError(
            f"compression_detail must be an int, a str or a mapping, not {type(detail).__name__}"
        )
    out = []
    for key, val in pairs:
        if key not in _DETAIL_KEYWORDS:
            raise CommandError(
                f"compression_detail keyword {key!r} is unknown; the spec knows "
                f"{', '.join(_DETAIL_KEYWORDS)}"
            )
        if val is None or isinstance(val, bool) or not isinstance(val, int):
            raise CommandError(f"compression_detail {key} needs an integer value, got {val!r}")
        if key == "level":
            _check_level(method, val)
        else:
            if method != "zstd":
                raise CommandError(
                    f"compression_detail workers is only supported by zstd, not {method}"
                )
            if val < 0:
                raise CommandError(f"compression_detail workers must be >= 0, got {val}")
        out.append(f"{key}={val}")
    if not out:
        raise CommandError("compression_detail is empty")
    return ",".join(out)


def _check_level(method: str, level: int) -> None:
    low, high = _LEVELS[method]
    if not low <= level <= high:
        raise CommandError(
            f"{method} compression level must be between {low} and {high}, got {level}"
        )


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
