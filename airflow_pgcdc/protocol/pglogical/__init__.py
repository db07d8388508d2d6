"""The ``pglogical_output`` native binary protocol (spec 002), sans-IO.

Server -> client: :class:`PglogicalDecoder` turns the payload of each logical
XLogData message into a typed message: :class:`Startup` (``'S'``),
:class:`Begin` (``'B'``), :class:`Origin` (``'O'``), :class:`Commit` (``'C'``),
:class:`Relation` (``'R'``, table metadata with its attribute block),
:class:`Insert` / :class:`Update` / :class:`Delete` (``'I'`` / ``'U'`` / ``'D'``)
whose tuples are sequences of :class:`TupleField`. The decoder is stateful: it
checks the message flow (startup first, BEGIN ... COMMIT, ORIGIN only right after
BEGIN, rows only inside a transaction and only for an announced relation) and
keeps the relation map. Every malformed input raises a
:class:`~airflow_pgcdc.errors.ProtocolError` subclass with ``protocol="pglogical"``,
the message (``"BEGIN ('B')"``) and the byte offset inside the message; nothing
else escapes, every loop advances, and no count read from the wire allocates more
than the message itself could hold.

Client -> server: :func:`pglogical_start_options` builds the ``START_REPLICATION``
parameter list with the spec's key spellings (``"binary.want_binary_basetypes"``),
:func:`binary_compat_params_for_server` fills the ``binary.*`` compatibility keys
for this machine, and :func:`format_plugin_options` renders any plugin's option
list as ``("key" 'value', ...)`` with :func:`~airflow_pgcdc.protocol.quoting.quote_ident`
and :func:`~airflow_pgcdc.protocol.quoting.quote_literal`.

Encoders (:func:`encode_message` and one ``encode_*`` per message) write exactly
the bytes the real plugin writes; they exist for round-trip tests and fuzz seeds.

Where the document and the real plugin differ
-----------------------------------------------
The real plugin (pglogical 2.4.x, ``pglogical_proto_native.c``,
``pglogical_output_plugin.c``, ``pglogical_output_config.c``; Debian's
``postgresql-15-pglogical`` 2.4.2) is the truth; this module follows it, strictly:

1. **Row tuple markers.** The spec's row layout is ``flags, relidentifier, [tuple
   parts]`` with an unnamed "tuple type" byte before each ``'T'`` tuple. The plugin
   sends ``'N'`` (new tuple) before the tuple of INSERT; ``'K'`` (old key) before
   the old tuple of DELETE; for UPDATE an optional ``'K'`` old tuple, then ``'N'``.
   Its reader also accepts ``'O'`` (whole old tuple) where ``'K'`` may stand; so do we.
2. **Unchanged TOAST.** Field kind ``'u'`` (unchanged toasted value, no length, no
   data) is not in the spec; the plugin sends it.
3. **Field kind bytes.** The spec writes "'i'nternal binary (0x62)"; 0x62 is ``'b'``.
   The plugin uses ``'i'`` (0x69) internal, ``'b'`` (0x62) send/recv, ``'t'`` (0x74)
   text, ``'n'`` null, ``'u'`` unchanged, each as documented here.
4. **NUL terminators inside counted strings.** Schema and table name lengths
   (uint8), the origin name length (uint8), the ``'N'`` column-name block length
   (uint16) and the length of a ``'t'`` text value (int32) all *include* a trailing
   NUL that the plugin writes. Names are therefore at most 254 bytes. We require the
   NUL where the spec says "null terminated" (schema, table, non-empty origin name),
   strip it where present elsewhere (column name, text value), and reject NUL bytes
   anywhere else in a string.
5. **Column delimiter size.** The spec says the ``'C'`` delimiter's flags field is
   "the same size as the length field in other blocks"; it is not: the delimiter is
   ``'C'`` + uint8 flags (2 bytes), a metadata block header is type + uint16 length
   (3 bytes). Column flag bit 0 (``IS_REPLICA_IDENTITY``) marks a replica identity
   (key) column; the spec leaves column flags undefined.
6. **Timestamps** are written as uint64 in the spec; they are PostgreSQL
   ``TimestampTz`` (signed int64 microseconds since 2000-01-01), read as such.
7. **Relation metadata caching.** The spec says the upstream re-sends metadata
   before rows of a different table and a client may keep only the latest. The
   2.x plugin caches per session: it sends ``'R'`` once per relation (again after
   a relcache invalidation) and rows for several tables interleave. The decoder
   keeps a map ``relidentifier -> Relation``; a row for an unknown relid is an
   :class:`UnexpectedMessage`.
8. **Startup timing.** The plugin cannot write from its startup callback: the
   ``'S'`` message is sent from the first BEGIN callback, i.e. only when the first
   transaction is decoded, not when ``START_REPLICATION`` begins. Its keys are
   ``max_proto_version, min_proto_version, coltypes, pg_version_num, pg_version,
   pg_catversion, database_encoding, encoding, forward_changeset_origins,
   walsender_pid, pglogical_version, pglogical_version_num,
   binary.internal_basetypes, binary.binary_basetypes,
   binary.basetypes_major_version, binary.sizeof_int, binary.sizeof_long,
   binary.sizeof_datum, binary.maxalign, binary.bigendian, binary.float4_byval,
   binary.float8_byval, binary.integer_datetimes, binary.binary_pg_version,
   no_txinfo``; booleans are ``t``/``f``. ``encoding`` is ``SQL_ASCII`` unless the
   client sent ``expected_encoding``. BEGIN and ORIGIN are separate CopyData messages.
9. **Client parameters the plugin really reads**: ``startup_params_format``,
   ``max_proto_version``, ``min_proto_version`` (all three required), ``proto_format``,
   ``expected_encoding`` (ERROR unless equal to the database encoding),
   ``binary.want_internal_basetypes``, ``binary.want_binary_basetypes``,
   ``binary.basetypes_major_version`` (must equal the server's
   ``PG_VERSION_NUM / 100`` for any binary mode), ``binary.bigendian``,
   ``binary.sizeof_datum``, ``binary.sizeof_int``, ``binary.sizeof_long``,
   ``binary.float4_byval``, ``binary.float8_byval`` (a plugin bug stores it into
   the float4 setting), ``binary.integer_datetimes``, ``pglogical.forward_origins``
   (only ``all``), ``pglogical.replication_set_names`` (needed: without it no table
   is replicated), ``pglogical.replicate_only_table``, ``no_txinfo`` and
   ``pg_version`` -- parsed as an **integer**, so the spec's string
   ``server_version`` (``'15.4'``) makes the plugin ERROR. ``hooks.setup_function``
   is accepted and ignored; ``want_coltypes``, ``forward_changesets``,
   ``pg_version_num``, ``binary.maxalign`` and any other key are ignored (DEBUG1).
   Internal (``'i'``) values need ``binary.want_internal_basetypes`` plus a matching
   ``binary.basetypes_major_version`` and compatible sizes; send/recv (``'b'``)
   values need ``binary.want_binary_basetypes`` plus the matching major version.
10. **Internal values** (``'i'``) are raw server datums: pass-by-value types in
    host byte order, varlenas with their (possibly 1-byte, possibly compressed)
    header. This module returns the bytes as they are.

Left out: the JSON protocol (``proto_format=json``), the column type block (T.B.D.
in the spec, never sent), decoding ``'i'``/``'b'`` datums into Python values (that
belongs to the type layer).

The package
-----------
``messages`` (the typed messages), ``decoder`` (:class:`PglogicalDecoder`), ``encoder``
(the ``encode_*`` functions) and ``options`` (the client side). Import from the package:
``from airflow_pgcdc.protocol.pglogical import PglogicalDecoder, Insert``.
"""

from __future__ import annotations

from airflow_pgcdc.protocol.pglogical.decoder import (
    PglogicalDecoder,
)
from airflow_pgcdc.protocol.pglogical.encoder import (
    encode_begin,
    encode_commit,
    encode_delete,
    encode_insert,
    encode_message,
    encode_origin,
    encode_relation,
    encode_startup,
    encode_tuple,
    encode_update,
)
from airflow_pgcdc.protocol.pglogical.messages import (
    COLUMN_FLAG_KEY,
    NULL_FIELD,
    PROTO_VERSION,
    PROTOCOL,
    STARTUP_MESSAGE_VERSION,
    STARTUP_PARAMS_FORMAT,
    UNCHANGED_FIELD,
    Begin,
    Column,
    Commit,
    Delete,
    Insert,
    Origin,
    PglogicalMessage,
    Relation,
    Startup,
    TupleField,
    Update,
)
from airflow_pgcdc.protocol.pglogical.options import (
    binary_compat_params_for_server,
    format_plugin_options,
    pglogical_start_options,
)

__all__ = [
    "PROTOCOL",
    "PROTO_VERSION",
    "STARTUP_MESSAGE_VERSION",
    "STARTUP_PARAMS_FORMAT",
    "COLUMN_FLAG_KEY",
    "PglogicalMessage",
    "Startup",
    "Begin",
    "Commit",
    "Origin",
    "Column",
    "Relation",
    "TupleField",
    "NULL_FIELD",
    "UNCHANGED_FIELD",
    "Insert",
    "Update",
    "Delete",
    "PglogicalDecoder",
    "encode_message",
    "encode_startup",
    "encode_begin",
    "encode_commit",
    "encode_origin",
    "encode_relation",
    "encode_insert",
    "encode_update",
    "encode_delete",
    "encode_tuple",
    "pglogical_start_options",
    "binary_compat_params_for_server",
    "format_plugin_options",
]
