""":class:`PgoutputDecoder`: the stateful, sans-IO decoder of one pgoutput stream (one
``START_REPLICATION``): one ``XLogData`` payload in, one typed message out.

The rules it enforces (field presence per version and stream state, strictness beyond
the spec text, speed) are in the package docstring.
"""

from __future__ import annotations

import codecs
import struct
from typing import Any

from airflow_pgcdc.errors import (
    InvalidFieldValue,
    TruncatedMessage,
    UnexpectedMessage,
    UnknownMessageType,
)
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.pgoutput.messages import (
    _BY_TAG,
    _REPLICA_IDENTITIES,
    MAX_PROTO_VERSION,
    MIN_PROTO_VERSION,
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
    TupleValue,
    Type,
    Update,
)
from airflow_pgcdc.protocol.pgoutput.wire import (
    _K,
    _L_BEGIN,
    _L_BEGIN_PREPARE,
    _L_COLUMN_TAIL,
    _L_COMMIT,
    _L_COMMIT_PREPARED,
    _L_LEN,
    _L_LSN,
    _L_MESSAGE_HEAD,
    _L_OID,
    _L_PREPARE,
    _L_RELATION_TAIL,
    _L_ROLLBACK_PREPARED,
    _L_STREAM_ABORT,
    _L_STREAM_ABORT_V4,
    _L_STREAM_COMMIT,
    _L_STREAM_START,
    _L_TRUNCATE_HEAD,
    _L_XID,
    _N,
    _O,
    _UNPACK_OID_B,
    _UNPACK_OID_B_I16,
    _UNPACK_U32,
    _UNPACK_XID_OID_B,
    _UNPACK_XID_OID_B_I16,
    _ascii_compatible,
    _bad_sub,
    _cstring,
    _err,
    _err_head,
    _finish,
    _flags_zero,
    _Layout,
    _new_lsn,
    _read_tuple,
    _show_byte,
    _ts,
)


class PgoutputDecoder:
    """Stateful decoder of one pgoutput stream (one ``START_REPLICATION``).

    ``proto_version`` is the negotiated ``proto_version`` option (1-4);
    ``parallel_streaming`` says the subscriber asked for ``streaming = parallel``
    (protocol >= 4), which makes Stream Abort carry its LSN and timestamp; ``encoding``
    decodes text values and names (the session's client encoding).

    The decoder remembers whether it is inside a Stream Start ... Stream Stop block,
    which decides whether change messages carry an xid. Use one decoder per stream,
    or :meth:`reset` it when the stream restarts.
    """

    __slots__ = (
        "proto_version",
        "parallel_streaming",
        "encoding",
        "_in_stream",
        "_stream_xid",
        "_table",
        "_ascii_ok",
    )

    def __init__(
        self, proto_version: int, *, parallel_streaming: bool = False, encoding: str = "utf-8"
    ) -> None:
        if (
            isinstance(proto_version, bool)
            or not isinstance(proto_version, int)
            or not MIN_PROTO_VERSION <= proto_version <= MAX_PROTO_VERSION
        ):
            raise ValueError(
                f"pgoutput proto_version must be an int from {MIN_PROTO_VERSION} to "
                f"{MAX_PROTO_VERSION}, got {proto_version!r}"
            )
        if parallel_streaming and proto_version < 4:
            raise ValueError(
                f"parallel streaming needs pgoutput proto_version 4 or higher, got {proto_version}"
            )
        try:
            codecs.lookup(encoding)
        except LookupError:
            raise ValueError(f"unknown text encoding {encoding!r}") from None
        self.proto_version = proto_version
        self.parallel_streaming = bool(parallel_streaming)
        self.encoding = encoding
        self._ascii_ok = _ascii_compatible(encoding)
        self._in_stream = False
        self._stream_xid: int | None = None
        handlers = {
            Begin: self._begin,
            LogicalMessage: self._message,
            Commit: self._commit,
            Origin: self._origin,
            Relation: self._relation,
            Type: self._type,
            Insert: self._insert,
            Update: self._update,
            Delete: self._delete,
            Truncate: self._truncate,
            StreamStart: self._stream_start,
            StreamStop: self._stream_stop,
            StreamCommit: self._stream_commit,
            StreamAbort: self._stream_abort,
            BeginPrepare: self._begin_prepare,
            Prepare: self._prepare,
            CommitPrepared: self._commit_prepared,
            RollbackPrepared: self._rollback_prepared,
            StreamPrepare: self._stream_prepare,
        }
        table: list[Any] = [self._unknown] * 256
        for cls, fn in handlers.items():
            table[cls.tag] = fn if cls.min_version <= proto_version else self._too_new
        self._table = table

    # -- state -----------------------------------------------------------------------
    @property
    def in_stream(self) -> bool:
        """True between a Stream Start and its Stream Stop."""
        return self._in_stream

    @property
    def stream_xid(self) -> int | None:
        """The xid of the open stream block, or ``None``."""
        return self._stream_xid

    def reset(self) -> None:
        """Forget the stream state (call when a new ``START_REPLICATION`` begins)."""
        self._in_stream = False
        self._stream_xid = None

    # -- entry point -------------------------------------------------------------------
    def decode(self, data: bytes) -> Message:
        """Decode one pgoutput message (the payload of one XLogData frame)."""
        if type(data) is not bytes:
            data = bytes(data)
        try:
            handler = self._table[data[0]]
        except IndexError:
            raise _err(TruncatedMessage, None, 0, "empty message: no message type byte") from None
        return handler(data)

    def _unknown(self, data: bytes) -> Message:
        raise _err(
            UnknownMessageType,
            None,
            0,
            f"unknown message type byte {_show_byte(data[0])} "
            f"(pgoutput protocol version {self.proto_version})",
        )

    def _too_new(self, data: bytes) -> Message:
        cls = _BY_TAG[data[0]]
        raise _err(
            UnknownMessageType,
            cls.label,
            0,
            f"{cls.label} exists only in pgoutput protocol version {cls.min_version} and "
            f"later, the stream negotiated version {self.proto_version}",
        )

    def _outside_stream(self, label: str) -> None:
        if self._in_stream:
            raise _err(
                UnexpectedMessage,
                label,
                0,
                f"{label} inside the stream block of transaction {self._stream_xid} "
                "(expected Stream Stop first)",
            )

    # -- transaction control -------------------------------------------------------------
    def _begin(self, data: bytes) -> Begin:
        label = Begin.label
        self._outside_stream(label)
        lsn, ts, xid = _L_BEGIN.read(data, 1, label)
        _finish(data, 1 + _L_BEGIN.size, label)
        return Begin(_new_lsn(LSN, lsn), _ts(ts, label, 9, "commit timestamp"), xid)

    def _commit(self, data: bytes) -> Commit:
        label = Commit.label
        self._outside_stream(label)
        flags, lsn, end_lsn, ts = _L_COMMIT.read(data, 1, label)
        _flags_zero(flags, label, 1)
        _finish(data, 1 + _L_COMMIT.size, label)
        return Commit(flags, _new_lsn(LSN, lsn), _new_lsn(LSN, end_lsn), _ts(ts, label, 18, "commit timestamp"))

    def _origin(self, data: bytes) -> Origin:
        label = Origin.label
        (lsn,) = _L_LSN.read(data, 1, label)
        name, pos = _cstring(data, 9, label, "origin name", self.encoding)
        _finish(data, pos, label)
        return Origin(_new_lsn(LSN, lsn), name)

    # -- changes -----------------------------------------------------------------------
    def _xid(self, data: bytes, label: str) -> tuple[int | None, int]:
        """The xid of a change message inside a stream block, and the next position."""
        if self._in_stream:
            return _L_XID.read(data, 1, label)[0], 5
        return None, 1

    def _message(self, data: bytes) -> LogicalMessage:
        label = LogicalMessage.label
        xid, pos = self._xid(data, label)
        flags, lsn = _L_MESSAGE_HEAD.read(data, pos, label)
        if flags > 1:
            raise _err(
                InvalidFieldValue, label, pos, f"message flags must be 0 or 1, got {flags:#04x}"
            )
        prefix, pos = _cstring(data, pos + 9, label, "message prefix", self.encoding)
        (ln,) = _L_LEN.read(data, pos, label)
        if ln < 0:
            raise _err(InvalidFieldValue, label, pos, f"negative content length {ln}")
        pos += 4
        if pos + ln > len(data):
            raise _err(
                TruncatedMessage,
                label,
                pos,
                f"truncated: content needs {ln} bytes, {len(data) - pos} left",
            )
        content = data[pos : pos + ln]
        _finish(data, pos + ln, label)
        return LogicalMessage(xid, flags, _new_lsn(LSN, lsn), prefix, content)

    def _relation(self, data: bytes) -> Relation:
        label = Relation.label
        enc = self.encoding
        xid, pos = self._xid(data, label)
        (oid,) = _L_OID.read(data, pos, label)
        namespace, pos = _cstring(data, pos + 4, label, "namespace", enc)
        name, pos = _cstring(data, pos, label, "relation name", enc)
        ident, ncols = _L_RELATION_TAIL.read(data, pos, label)
        if chr(ident) not in _REPLICA_IDENTITIES:
            raise _err(
                InvalidFieldValue,
                label,
                pos,
                f"replica identity {_show_byte(ident)} is not one of d, n, f, i",
            )
        if ncols < 0:
            raise _err(InvalidFieldValue, label, pos + 1, f"negative column count {ncols}")
        pos += 3
        if ncols * 10 > len(data) - pos:  # flags + NUL + typid + typmod at least
            raise _err(
                TruncatedMessage,
                label,
                pos,
                f"truncated: {ncols} columns need at least {ncols * 10} bytes, "
                f"{len(data) - pos} left",
            )
        columns = []
        for _ in range(ncols):
            if pos >= len(data):
                raise _err(TruncatedMessage, label, pos, "truncated: column flags missing")
            flags = data[pos]
            cname, pos = _cstring(data, pos + 1, label, "column name", enc)
            typid, typmod = _L_COLUMN_TAIL.read(data, pos, label)
            pos += 8
            columns.append(RelationColumn(flags, cname, typid, typmod))
        _finish(data, pos, label)
        return Relation(xid, oid, namespace, name, chr(ident), tuple(columns))

    def _type(self, data: bytes) -> Type:
        label = Type.label
        xid, pos = self._xid(data, label)
        (oid,) = _L_OID.read(data, pos, label)
        namespace, pos = _cstring(data, pos + 4, label, "namespace", self.encoding)
        name, pos = _cstring(data, pos, label, "type name", self.encoding)
        _finish(data, pos, label)
        return Type(xid, oid, namespace, name)

    def _insert(self, data: bytes) -> Insert:
        """Insert, the hottest message: an inlined copy of :func:`_read_tuple`'s ASCII
        loop for the common case (an all-ASCII tuple, in or outside a stream block: a
        streamed transaction's inserts are decoded twice, when received and when
        replayed); anything else, including every malformed message, goes through
        :meth:`_insert_general`.
        """
        if self._ascii_ok:
            try:
                if self._in_stream:  # inside a stream block the xid comes first
                    xid, oid, sub, ncols = _UNPACK_XID_OID_B_I16(data, 1)
                    pos = 12
                else:
                    xid = None
                    oid, sub, ncols = _UNPACK_OID_B_I16(data, 1)
                    pos = 8
                if sub == 78 and (data.isascii() or data[pos:].isascii()):
                    text = data.decode("latin-1")
                    unpack_u32 = _UNPACK_U32
                    values: list[TupleValue] = []
                    append = values.append
                    for _ in range(ncols):
                        kind = data[pos]
                        if kind == 116:  # 't'
                            (ln,) = unpack_u32(data, pos + 1)
                            pos += 5
                            append(text[pos : pos + ln])
                            pos += ln
                        elif kind == 110:  # 'n'
                            append(None)
                            pos += 1
                        elif kind == 117:  # 'u'
                            append(UNCHANGED_TOAST)
                            pos += 1
                        elif kind == 98:  # 'b'
                            (ln,) = unpack_u32(data, pos + 1)
                            pos += 5
                            append(data[pos : pos + ln])
                            pos += ln
                        else:
                            break
                    if pos == len(data) and len(values) == ncols:
                        return Insert(xid, oid, tuple(values))
            except (IndexError, struct.error):
                pass
        return self._insert_general(data)

    def _insert_general(self, data: bytes) -> Insert:
        if self._in_stream:
            if len(data) < 10:
                raise _err_head(data, Insert.label, True)
            xid, oid, sub = _UNPACK_XID_OID_B(data, 1)
            pos = 10
        else:
            if len(data) < 6:
                raise _err_head(data, Insert.label, False)
            oid, sub = _UNPACK_OID_B(data, 1)
            xid = None
            pos = 6
        if sub != _N:
            raise _bad_sub(sub, pos - 1, Insert.label, "N")
        new, pos = _read_tuple(data, pos, self.encoding, Insert.label, self._ascii_ok)
        if pos != len(data):
            _finish(data, pos, Insert.label)
        return Insert(xid, oid, new)

    def _update(self, data: bytes) -> Update:
        label = Update.label
        enc = self.encoding
        if self._in_stream:
            if len(data) < 10:
                raise _err_head(data, label, True)
            xid, oid, sub = _UNPACK_XID_OID_B(data, 1)
            pos = 10
        else:
            if len(data) < 6:
                raise _err_head(data, label, False)
            oid, sub = _UNPACK_OID_B(data, 1)
            xid = None
            pos = 6
        key = old = None
        if sub == _K or sub == _O:
            image, pos = _read_tuple(data, pos, enc, label, self._ascii_ok)
            if sub == _K:
                key = image
            else:
                old = image
            if pos >= len(data):
                raise _err(TruncatedMessage, label, pos, "truncated: new tuple ('N') missing")
            sub = data[pos]
            pos += 1
            if sub != _N:
                raise _bad_sub(sub, pos - 1, label, "N")
        elif sub != _N:
            raise _bad_sub(sub, pos - 1, label, "K, O or N")
        new, pos = _read_tuple(data, pos, enc, label, self._ascii_ok)
        _finish(data, pos, label)
        return Update(xid, oid, key, old, new)

    def _delete(self, data: bytes) -> Delete:
        label = Delete.label
        if self._in_stream:
            if len(data) < 10:
                raise _err_head(data, label, True)
            xid, oid, sub = _UNPACK_XID_OID_B(data, 1)
            pos = 10
        else:
            if len(data) < 6:
                raise _err_head(data, label, False)
            oid, sub = _UNPACK_OID_B(data, 1)
            xid = None
            pos = 6
        if sub != _K and sub != _O:
            raise _bad_sub(sub, pos - 1, label, "K or O")
        image, pos = _read_tuple(data, pos, self.encoding, label, self._ascii_ok)
        _finish(data, pos, label)
        if sub == _K:
            return Delete(xid, oid, image, None)
        return Delete(xid, oid, None, image)

    def _truncate(self, data: bytes) -> Truncate:
        label = Truncate.label
        xid, pos = self._xid(data, label)
        nrel, options = _L_TRUNCATE_HEAD.read(data, pos, label)
        if nrel < 0:
            raise _err(InvalidFieldValue, label, pos, f"negative relation count {nrel}")
        pos += 5
        left = len(data) - pos
        if nrel * 4 > left:  # checked before anything is allocated
            raise _err(
                TruncatedMessage,
                label,
                pos + (left // 4) * 4,
                f"truncated: {nrel} relation OIDs need {nrel * 4} bytes, {left} left",
            )
        oids = struct.unpack_from(f"!{nrel}I", data, pos)
        _finish(data, pos + nrel * 4, label)
        return Truncate(xid, options, oids)

    # -- streaming (v2+) ---------------------------------------------------------------
    def _stream_start(self, data: bytes) -> StreamStart:
        label = StreamStart.label
        if self._in_stream:
            raise _err(
                UnexpectedMessage,
                label,
                0,
                f"Stream Start while the stream block of transaction {self._stream_xid} "
                "is still open",
            )
        xid, first = _L_STREAM_START.read(data, 1, label)
        if first > 1:
            raise _err(
                InvalidFieldValue, label, 5, f"first-segment flag must be 0 or 1, got {first}"
            )
        _finish(data, 1 + _L_STREAM_START.size, label)
        self._in_stream = True
        self._stream_xid = xid
        return StreamStart(xid, first == 1)

    def _stream_stop(self, data: bytes) -> StreamStop:
        label = StreamStop.label
        if not self._in_stream:
            raise _err(UnexpectedMessage, label, 0, "Stream Stop without a Stream Start")
        _finish(data, 1, label)
        self._in_stream = False
        self._stream_xid = None
        return StreamStop()

    def _stream_commit(self, data: bytes) -> StreamCommit:
        label = StreamCommit.label
        self._outside_stream(label)
        xid, flags, lsn, end_lsn, ts = _L_STREAM_COMMIT.read(data, 1, label)
        _flags_zero(flags, label, 5)
        _finish(data, 1 + _L_STREAM_COMMIT.size, label)
        return StreamCommit(
            xid, flags, _new_lsn(LSN, lsn), _new_lsn(LSN, end_lsn), _ts(ts, label, 22, "commit timestamp")
        )

    def _stream_abort(self, data: bytes) -> StreamAbort:
        label = StreamAbort.label
        self._outside_stream(label)
        if self.parallel_streaming and len(data) > 1 + _L_STREAM_ABORT.size:
            xid, subxid, lsn, ts = _L_STREAM_ABORT_V4.read(data, 1, label)
            _finish(data, 1 + _L_STREAM_ABORT_V4.size, label)
            return StreamAbort(xid, subxid, _new_lsn(LSN, lsn), _ts(ts, label, 17, "abort timestamp"))
        xid, subxid = _L_STREAM_ABORT.read(data, 1, label)
        _finish(data, 1 + _L_STREAM_ABORT.size, label)
        return StreamAbort(xid, subxid, None, None)

    # -- two-phase (v3+) ------------------------------------------------------------------
    def _begin_prepare(self, data: bytes) -> BeginPrepare:
        label = BeginPrepare.label
        self._outside_stream(label)
        lsn, end_lsn, ts, xid = _L_BEGIN_PREPARE.read(data, 1, label)
        gid, pos = _cstring(data, 1 + _L_BEGIN_PREPARE.size, label, "GID", self.encoding)
        _finish(data, pos, label)
        return BeginPrepare(
            _new_lsn(LSN, lsn), _new_lsn(LSN, end_lsn), _ts(ts, label, 17, "prepare timestamp"), xid, gid
        )

    def _prepare_like(self, data: bytes, cls: type[Message], layout: _Layout, ts_what: str) -> Any:
        """Prepare, Commit Prepared and Stream Prepare share one layout."""
        label = cls.label
        self._outside_stream(label)
        flags, lsn, end_lsn, ts, xid = layout.read(data, 1, label)
        _flags_zero(flags, label, 1)
        gid, pos = _cstring(data, 1 + layout.size, label, "GID", self.encoding)
        _finish(data, pos, label)
        return cls(flags, _new_lsn(LSN, lsn), _new_lsn(LSN, end_lsn), _ts(ts, label, 18, ts_what), xid, gid)

    def _prepare(self, data: bytes) -> Prepare:
        return self._prepare_like(data, Prepare, _L_PREPARE, "prepare timestamp")

    def _commit_prepared(self, data: bytes) -> CommitPrepared:
        return self._prepare_like(data, CommitPrepared, _L_COMMIT_PREPARED, "commit timestamp")

    def _stream_prepare(self, data: bytes) -> StreamPrepare:
        return self._prepare_like(data, StreamPrepare, _L_PREPARE, "prepare timestamp")

    def _rollback_prepared(self, data: bytes) -> RollbackPrepared:
        label = RollbackPrepared.label
        self._outside_stream(label)
        flags, lsn, end_lsn, pts, rts, xid = _L_ROLLBACK_PREPARED.read(data, 1, label)
        _flags_zero(flags, label, 1)
        gid, pos = _cstring(data, 1 + _L_ROLLBACK_PREPARED.size, label, "GID", self.encoding)
        _finish(data, pos, label)
        return RollbackPrepared(
            flags,
            _new_lsn(LSN, lsn),
            _new_lsn(LSN, end_lsn),
            _ts(pts, label, 18, "prepare timestamp"),
            _ts(rts, label, 26, "rollback timestamp"),
            xid,
            gid,
        )


