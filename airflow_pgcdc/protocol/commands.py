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

What the commands return (the typed result rows and their ``parse_*`` functions) is in
:mod:`airflow_pgcdc.protocol.results`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from airflow_pgcdc.errors import PgcdcError
from airflow_pgcdc.protocol.lsn import LSN, InvalidLSN
from airflow_pgcdc.protocol.quoting import NAMEDATALEN, quote_ident, quote_literal

__all__ = [
    "CommandError",
    "PROTOCOL",
    "MAX_RATE_LOWER",
    "MAX_RATE_UPPER",
    "validate_slot_name",
    "identify_system",
    "show",
    "timeline_history",
    "create_replication_slot",
    "read_replication_slot",
    "start_replication_physical",
    "start_replication_logical",
    "drop_replication_slot",
    "base_backup",
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
    (:func:`airflow_pgcdc.protocol.frames.parse_base_backup_copy_data`) and the
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


