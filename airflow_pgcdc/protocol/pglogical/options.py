"""The client side: the ``START_REPLICATION`` parameters (:func:`pglogical_start_options`,
:func:`binary_compat_params_for_server`) and :func:`format_plugin_options`, which renders
any output plugin's option list.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from airflow_pgcdc.protocol.pglogical.messages import PROTO_VERSION, STARTUP_PARAMS_FORMAT
from airflow_pgcdc.protocol.quoting import quote_ident, quote_literal, quote_qualified

# -- client side: START_REPLICATION parameters ------------------------------------------


def format_plugin_options(options: Iterable[tuple[str, str | None]]) -> str:
    """Render an output plugin's options as ``("key" 'value', "key2" 'value2')``.

    Generic (pgoutput, pglogical_output, ...): keys through
    :func:`~airflow_pgcdc.protocol.quoting.quote_ident`, values through
    :func:`~airflow_pgcdc.protocol.quoting.quote_literal`; a ``None`` value writes
    the key alone (the grammar's option without argument). ``""`` for no options, so
    ``f"START_REPLICATION SLOT {slot} LOGICAL {lsn} {format_plugin_options(opts)}"``
    works either way.
    """
    parts = []
    for key, value in options:
        parts.append(
            quote_ident(key) if value is None else f"{quote_ident(key)} {quote_literal(value)}"
        )
    return f"({', '.join(parts)})" if parts else ""


def _int_opt(name: str, value: Any, lo: int, hi: int) -> str:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in {lo}..{hi}, not {value}")
    return str(value)


def _bool_opt(name: str, value: Any) -> str:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
    return "true" if value else "false"


def _str_opt(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty str, not {value!r}")
    return value


def _ident_list(name: str, value: str | Sequence[str]) -> str:
    names = [value] if isinstance(value, str) else list(value)
    if not names:
        raise ValueError(f"{name} must name at least one entry")
    return ",".join(quote_ident(n) for n in names)


_UINT8 = 0xFF
_UINT16 = 0xFFFF
_INT32 = 0x7FFFFFFF


def pglogical_start_options(
    *,
    startup_params_format: int = STARTUP_PARAMS_FORMAT,
    min_proto_version: int = PROTO_VERSION,
    max_proto_version: int = PROTO_VERSION,
    proto_format: str | None = "native",
    expected_encoding: str | None = "UTF8",
    want_coltypes: bool = False,
    forward_changesets: bool = False,
    no_txinfo: bool | None = None,
    pg_version_num: int | None = None,
    pg_version: int | None = None,
    binary_want_internal_basetypes: bool = False,
    binary_want_binary_basetypes: bool = False,
    binary_basetypes_major_version: int | None = None,
    binary_sizeof_int: int | None = None,
    binary_sizeof_long: int | None = None,
    binary_sizeof_datum: int | None = None,
    binary_maxalign: int | None = None,
    binary_bigendian: bool | None = None,
    binary_float4_byval: bool | None = None,
    binary_float8_byval: bool | None = None,
    binary_integer_datetimes: bool | None = None,
    pglogical_replication_set_names: str | Sequence[str] | None = None,
    pglogical_forward_origins: str | Sequence[str] | None = None,
    pglogical_replicate_only_table: tuple[str, str] | None = None,
    extra: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
) -> list[tuple[str, str]]:
    """The ``(key, value)`` list for ``START_REPLICATION ... LOGICAL ... (...)``.

    Keys are the spec's spellings (``binary.want_binary_basetypes``); the first pair
    is ``startup_params_format`` as the spec demands. ``None`` leaves a key out;
    ``want_coltypes``, ``forward_changesets`` and the two ``binary_want_*`` flags are
    sent only when true (false is their default). Booleans go out as ``true``/``false``.

    pglogical 2.x extras: ``pglogical_replication_set_names`` (one name or several;
    the plugin replicates nothing without it), ``pglogical_forward_origins`` (the
    plugin accepts only ``"all"``), ``pglogical_replicate_only_table`` as
    ``(schema, table)``. Names are quoted with ``quote_ident`` because the plugin
    splits these values with ``SplitIdentifierString``.

    ``pg_version`` is an int: the real plugin parses it as an integer (the spec's
    ``server_version`` string would make it ERROR). ``extra`` adds other keys
    verbatim (e.g. ``hooks.setup_function`` or pglogical 1.x's
    ``relmeta_cache_size``); a key given twice raises ``ValueError``.
    Use :func:`format_plugin_options` to render the list.
    """
    opts: list[tuple[str, str]] = [
        ("startup_params_format", _int_opt("startup_params_format", startup_params_format, 1, 1)),
        ("max_proto_version", _int_opt("max_proto_version", max_proto_version, 1, _INT32)),
        ("min_proto_version", _int_opt("min_proto_version", min_proto_version, 1, _INT32)),
    ]
    if min_proto_version > max_proto_version:
        raise ValueError(
            f"min_proto_version {min_proto_version} > max_proto_version {max_proto_version}"
        )
    if proto_format is not None:
        if proto_format not in ("native", "json"):
            raise ValueError(f"proto_format must be 'native' or 'json', not {proto_format!r}")
        opts.append(("proto_format", proto_format))
    if expected_encoding is not None:
        opts.append(("expected_encoding", _str_opt("expected_encoding", expected_encoding)))
    for key, flag in (("want_coltypes", want_coltypes), ("forward_changesets", forward_changesets)):
        if _bool_opt(key, flag) == "true":
            opts.append((key, "true"))
    if no_txinfo is not None:
        opts.append(("no_txinfo", _bool_opt("no_txinfo", no_txinfo)))
    if pg_version_num is not None:
        opts.append(("pg_version_num", _int_opt("pg_version_num", pg_version_num, 0, _INT32)))
    if pg_version is not None:
        opts.append(("pg_version", _int_opt("pg_version", pg_version, 0, _INT32)))
    for key, flag in (
        ("binary.want_internal_basetypes", binary_want_internal_basetypes),
        ("binary.want_binary_basetypes", binary_want_binary_basetypes),
    ):
        if _bool_opt(key, flag) == "true":
            opts.append((key, "true"))
    for key, value, hi in (
        ("binary.basetypes_major_version", binary_basetypes_major_version, _UINT16),
        ("binary.sizeof_int", binary_sizeof_int, _UINT8),
        ("binary.sizeof_long", binary_sizeof_long, _UINT8),
        ("binary.sizeof_datum", binary_sizeof_datum, _UINT8),
        ("binary.maxalign", binary_maxalign, _UINT8),
    ):
        if value is not None:
            opts.append((key, _int_opt(key, value, 1, hi)))
    for key, flag in (
        ("binary.bigendian", binary_bigendian),
        ("binary.float4_byval", binary_float4_byval),
        ("binary.float8_byval", binary_float8_byval),
        ("binary.integer_datetimes", binary_integer_datetimes),
    ):
        if flag is not None:
            opts.append((key, _bool_opt(key, flag)))
    if pglogical_forward_origins is not None:
        opts.append(
            (
                "pglogical.forward_origins",
                _ident_list("pglogical_forward_origins", pglogical_forward_origins),
            )
        )
    if pglogical_replication_set_names is not None:
        opts.append(
            (
                "pglogical.replication_set_names",
                _ident_list("pglogical_replication_set_names", pglogical_replication_set_names),
            )
        )
    if pglogical_replicate_only_table is not None:
        schema, table = pglogical_replicate_only_table
        opts.append(("pglogical.replicate_only_table", quote_qualified(schema, table)))
    if extra is not None:
        seen = {k for k, _ in opts}
        items = extra.items() if isinstance(extra, Mapping) else extra
        for key, value in items:
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError(f"extra option {key!r}: keys and values must be str")
            if key in seen:
                raise ValueError(f"option {key!r} given twice")
            seen.add(key)
            opts.append((key, value))
    return opts


def binary_compat_params_for_server(server_version_num: int) -> dict[str, int | bool]:
    """The ``binary_*`` keyword arguments of :func:`pglogical_start_options` that
    describe this machine, for a server whose ``server_version_num`` is given.

    ``binary_basetypes_major_version`` is ``server_version_num // 100`` (the plugin
    enables binary modes only when it equals its own ``PG_VERSION_NUM / 100``);
    sizes, alignment and byte order come from this interpreter's C ABI.

    ``float4_byval``, ``float8_byval`` and ``integer_datetimes`` are deliberately left
    out: pglogical 2.x compares them with build flags that PostgreSQL removed (13 and
    10), reports them as ``f`` on every modern server, and stores the client's
    ``float8_byval`` into its float4 setting, so sending the true values makes it
    silently refuse internal mode (measured on pglogical 2.4.2 / PostgreSQL 15).
    Use as
    ``pglogical_start_options(binary_want_binary_basetypes=True, **binary_compat_params_for_server(v))``.
    """
    if isinstance(server_version_num, bool) or not isinstance(server_version_num, int):
        raise TypeError("server_version_num must be an int (e.g. 150004)")
    if not 90400 <= server_version_num < 10_000_000:
        raise ValueError(
            f"server_version_num {server_version_num} is not a PostgreSQL 9.4+ "
            "server_version_num (e.g. 150004)"
        )
    sizeof_datum = ctypes.sizeof(ctypes.c_void_p)
    maxalign = max(
        ctypes.alignment(ctypes.c_long),
        ctypes.alignment(ctypes.c_double),
        ctypes.alignment(ctypes.c_longlong),
    )
    return {
        "binary_basetypes_major_version": server_version_num // 100,
        "binary_sizeof_int": ctypes.sizeof(ctypes.c_int),
        "binary_sizeof_long": ctypes.sizeof(ctypes.c_long),
        "binary_sizeof_datum": sizeof_datum,
        "binary_maxalign": maxalign,
        "binary_bigendian": sys.byteorder == "big",
    }
