"""Decoder and encoder of the ``pgoutput`` logical replication messages, versions 1-4.

Sans-IO: :class:`PgoutputDecoder.decode` takes the payload of one ``XLogData`` frame
(exactly one pgoutput message) and returns a typed message object; nothing here
touches a socket. :func:`encode_message` does the reverse and is used by tests, fuzz
seeds and the benchmark. The reference is ``shared/spec/000_*.txt`` (PostgreSQL docs
53.9 "Logical Replication Message Formats"), checked against the PostgreSQL sources.

Messages
--------
One class per message, each with ``__slots__``, a ``type`` class attribute (the
snake_case name used in JSON) and ``to_dict()`` (JSON-ready: LSNs as ``X/Y``,
timestamps ISO-8601, bytes base64). LSN fields are :class:`~.lsn.LSN` instances,
timestamps aware UTC :class:`~datetime.datetime` objects.

TupleData representation
------------------------
A row image (``TupleData``) is a plain Python ``tuple`` with one item per column:

=====================  ===========  =========================================
item                   wire kind    meaning
=====================  ===========  =========================================
``None``               ``'n'``      SQL NULL
``UNCHANGED_TOAST``    ``'u'``      unchanged TOASTed value, not sent
``str``                ``'t'``      text-format value, decoded with the
                                    decoder's ``encoding`` (default UTF-8)
``bytes``              ``'b'``      binary-format value (``binary = true``)
=====================  ===========  =========================================

:data:`UNCHANGED_TOAST` is a dedicated singleton object, *not* the string ``'u'``: a
text column whose value is ``"u"`` must stay distinguishable from an unchanged TOAST
value (and CPython interns one-character strings, so identity would not help).
Test it with ``value is UNCHANGED_TOAST``; :func:`kind_of` maps any item back to its
kind letter and :data:`TUPLE_KINDS` lists the letters.

Field presence (what the decoder expects, per protocol version and stream state)
-----------------------------------------------------------------------------------
* The Int32 xid of Message, Relation, Type, Insert, Update, Delete and Truncate is
  present only in protocol >= 2 *and* only between Stream Start and Stream Stop. The
  decoder tracks that state (:attr:`PgoutputDecoder.in_stream`); outside a stream
  block ``xid`` is ``None``.
* Stream Start/Stop/Commit/Abort exist from version 2, Begin Prepare, Prepare,
  Commit Prepared, Rollback Prepared and Stream Prepare from version 3; any other
  version gets :class:`~airflow_pgcdc.errors.UnknownMessageType`.
* Stream Abort: the spec says abort LSN and abort timestamp are present "since
  protocol version 4". PostgreSQL (16+, ``logicalrep_write_stream_abort``) actually
  writes them only when the subscriber asked for ``streaming = parallel`` as well.
  Hence the ``parallel_streaming`` option: without it a Stream Abort is exactly
  ``tag + xid + subxid``; with it (requires version >= 4) both the 9-byte and the
  25-byte forms are accepted and ``abort_lsn``/``abort_timestamp`` are ``None`` in the
  short one. Any other length is an error.
* Flow: Stream Start inside a stream block and Stream Stop outside one raise
  :class:`~airflow_pgcdc.errors.UnexpectedMessage`. Stream Commit, Stream Abort,
  Stream Prepare and the transaction-control messages (Begin, Commit, Begin Prepare,
  Prepare, Commit Prepared, Rollback Prepared) are only accepted *outside* a stream
  block; inside one only changes (Relation, Type, Insert, Update, Delete, Truncate,
  Message), Origin and Stream Stop may appear.

Strictness and leniency beyond the spec text
--------------------------------------------
* The "currently unused" ``Int8(0)`` flags of Commit, Stream Commit, Prepare, Commit
  Prepared, Rollback Prepared and Stream Prepare must be 0, as PostgreSQL's own
  subscriber requires (``logicalrep_read_*``; a new meaning would come with a new
  protocol version).
* Where the spec lists the values of a field, others are rejected
  (:class:`~airflow_pgcdc.errors.InvalidFieldValue`): Message flags 0/1, Stream
  Start's first-segment flag 0/1, replica identity ``d``/``n``/``f``/``i``.
  PostgreSQL's subscriber is laxer here; a change in these would break our reading of
  the stream, so we prefer to stop.
* Relation column flags and Truncate option bits are kept raw and unknown bits are
  accepted (``is_key`` tests bit 1; ``cascade``/``restart_identity`` bits 1 and 2).
* Update and Delete tuple-type bytes: a byte that is none of ``K``/``O``/``N`` raises
  :class:`~airflow_pgcdc.errors.UnknownMessageType`; a known one in a place where it
  is not allowed (``N`` in a Delete, ``K`` twice) raises ``InvalidFieldValue``.

Speed
-----
TupleData is decoded by an optimistic loop (one ``struct.unpack_from`` per column,
slicing, no per-column bounds checks; an all-ASCII tuple is decoded as latin-1 once
and sliced) that falls back to a fully checked parser whenever anything is off, so
errors stay precise. Insert outside stream blocks has that loop inlined. About
0.55-0.6 M five-column Inserts per second on one core of the CI machine
(``bench/decode.py``).

Every malformed input raises a :class:`~airflow_pgcdc.errors.ProtocolError` subclass
with ``protocol="pgoutput"``, ``message_type`` such as ``"Insert ('I')"`` and the byte
offset inside the message; no ``IndexError``, ``struct.error``, ``UnicodeDecodeError``
or ``OverflowError`` escapes.

The package
-----------
``messages`` (the classes and TupleData values), ``decoder`` (:class:`PgoutputDecoder`),
``wire`` (its byte-level readers), ``encoder`` (:func:`encode_message`,
:func:`encode_tuple`) and ``options`` (the client side: which protocol version to ask
for and the ``START_REPLICATION`` options). Import from the package:
``from airflow_pgcdc.protocol.pgoutput import PgoutputDecoder, Insert``.
"""

from __future__ import annotations

from airflow_pgcdc.protocol.pgoutput.decoder import (
    PgoutputDecoder,
)
from airflow_pgcdc.protocol.pgoutput.encoder import (
    encode_message,
    encode_tuple,
)
from airflow_pgcdc.protocol.pgoutput.messages import (
    MAX_PROTO_VERSION,
    MESSAGE_CLASSES,
    MIN_PROTO_VERSION,
    PROTOCOL,
    TRUNCATE_CASCADE,
    TRUNCATE_RESTART_IDENTITY,
    TUPLE_KINDS,
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Prepare,
    Relation,
    RelationColumn,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    TupleValue,
    Type,
    Update,
    kind_of,
    tuple_to_json,
)

__all__ = [
    "PROTOCOL",
    "MIN_PROTO_VERSION",
    "MAX_PROTO_VERSION",
    "UNCHANGED_TOAST",
    "TUPLE_KINDS",
    "TupleValue",
    "TupleData",
    "kind_of",
    "tuple_to_json",
    "Message",
    "Begin",
    "LogicalMessage",
    "Commit",
    "Origin",
    "RelationColumn",
    "Relation",
    "Type",
    "Insert",
    "Update",
    "Delete",
    "Truncate",
    "StreamStart",
    "StreamStop",
    "StreamCommit",
    "StreamAbort",
    "BeginPrepare",
    "Prepare",
    "CommitPrepared",
    "RollbackPrepared",
    "StreamPrepare",
    "MESSAGE_CLASSES",
    "PgoutputDecoder",
    "encode_message",
    "encode_tuple",
    "TRUNCATE_CASCADE",
    "TRUNCATE_RESTART_IDENTITY",
]
