"""Unit tests of the pgoutput decoder/encoder (spec 000, protocol versions 1-4).

Wire bytes in the golden tests are written out by hand from the spec with
``struct.pack``, independently of the module's encoder, so that a symmetric bug in
encoder and decoder cannot hide.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import struct
import time
from datetime import UTC, datetime, timedelta

import pytest

from airflow_pgcdc.errors import (
    InvalidFieldValue,
    ProtocolError,
    TrailingBytes,
    TruncatedMessage,
    UnexpectedMessage,
    UnknownMessageType,
)
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.pgoutput import (
    MESSAGE_CLASSES,
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
    PgoutputDecoder,
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
    Type,
    Update,
    encode_message,
    encode_tuple,
    kind_of,
    tuple_to_json,
)

TS = datetime(2024, 5, 1, 12, 34, 56, 789012, tzinfo=UTC)
TS2 = TS + timedelta(seconds=3)
TS_US = (TS - datetime(2000, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
XID = 0x8001_0203  # high bit set: must be read unsigned
LSN1 = LSN.parse("16/B374D848")
LSN2 = LSN.parse("16/B374D900")

ROW = ("42", None, UNCHANGED_TOAST, b"\x00\xff", "u", "", "grüße")


def q(n: int) -> bytes:
    return struct.pack("!q", n)


def u64(n: int) -> bytes:
    return struct.pack("!Q", n)


def u32(n: int) -> bytes:
    return struct.pack("!I", n)


def i32(n: int) -> bytes:
    return struct.pack("!i", n)


def i16(n: int) -> bytes:
    return struct.pack("!h", n)


# Hand-written TupleData for ROW.
ROW_BYTES = (
    i16(7)
    + b"t"
    + i32(2)
    + b"42"
    + b"n"
    + b"u"
    + b"b"
    + i32(2)
    + b"\x00\xff"
    + b"t"
    + i32(1)
    + b"u"
    + b"t"
    + i32(0)
    + b"t"
    + i32(7)
    + "grüße".encode()
)

COLUMNS = (
    RelationColumn(1, "id", 20, -1),
    RelationColumn(0, "name", 1043, 68),
)

# One sample of every message; data messages (which may carry an xid) have xid=None.
SAMPLES: dict[type[Message], Message] = {
    Begin: Begin(LSN1, TS, XID),
    LogicalMessage: LogicalMessage(None, 1, LSN1, "pfx", b"hello"),
    Commit: Commit(0, LSN1, LSN2, TS),
    Origin: Origin(LSN1, "node_a"),
    Relation: Relation(None, 16384, "public", "orders", "d", COLUMNS),
    Type: Type(None, 70000, "public", "mood"),
    Insert: Insert(None, 16384, ROW),
    Update: Update(None, 16384, ("1",), None, ROW),
    Delete: Delete(None, 16384, None, ROW),
    Truncate: Truncate(None, 3, (16384, 16390)),
    StreamStart: StreamStart(XID, True),
    StreamStop: StreamStop(),
    StreamCommit: StreamCommit(XID, 0, LSN1, LSN2, TS),
    StreamAbort: StreamAbort(XID, XID + 1),
    BeginPrepare: BeginPrepare(LSN1, LSN2, TS, XID, "gid-1"),
    Prepare: Prepare(0, LSN1, LSN2, TS, XID, "gid-1"),
    CommitPrepared: CommitPrepared(0, LSN1, LSN2, TS, XID, "gid-1"),
    RollbackPrepared: RollbackPrepared(0, LSN1, LSN2, TS, TS2, XID, "gid-1"),
    StreamPrepare: StreamPrepare(0, LSN1, LSN2, TS, XID, "gid-1"),
}
DATA_CLASSES = (LogicalMessage, Relation, Type, Insert, Update, Delete, Truncate)
MIN_VERSION = {
    cls: (3 if cls.tag in b"bPKrp" else 2 if cls.tag in b"SEcA" else 1) for cls in SAMPLES
}


def with_xid(msg: Message, xid: int) -> Message:
    return dataclasses.replace(msg, xid=xid)


def in_stream_decoder(version: int = 2, **kw) -> PgoutputDecoder:
    d = PgoutputDecoder(version, **kw)
    d.decode(b"S" + u32(777) + b"\x01")
    assert d.in_stream and d.stream_xid == 777
    return d


def raises(cls, data: bytes, decoder: PgoutputDecoder | None = None) -> ProtocolError:
    d = decoder or PgoutputDecoder(4)
    with pytest.raises(cls) as info:
        d.decode(data)
    err = info.value
    assert err.protocol == "pgoutput"
    assert err.offset is not None and 0 <= err.offset <= len(data)
    return err


# ---------------------------------------------------------------------------------------
# Golden bytes, by hand from the spec
# ---------------------------------------------------------------------------------------
GOLDEN_OUTSIDE = [
    (b"B" + u64(LSN1) + q(TS_US) + u32(XID), Begin(LSN1, TS, XID)),
    (b"M" + b"\x01" + u64(LSN1) + b"pfx\x00" + i32(5) + b"hello", SAMPLES[LogicalMessage]),
    (b"C" + b"\x00" + u64(LSN1) + u64(LSN2) + q(TS_US), Commit(0, LSN1, LSN2, TS)),
    (b"O" + u64(LSN1) + b"node_a\x00", Origin(LSN1, "node_a")),
    (
        b"R"
        + u32(16384)
        + b"public\x00orders\x00"
        + b"d"
        + i16(2)
        + b"\x01id\x00"
        + u32(20)
        + i32(-1)
        + b"\x00name\x00"
        + u32(1043)
        + i32(68),
        SAMPLES[Relation],
    ),
    (b"Y" + u32(70000) + b"public\x00mood\x00", SAMPLES[Type]),
    (b"I" + u32(16384) + b"N" + ROW_BYTES, SAMPLES[Insert]),
    (b"U" + u32(16384) + b"N" + ROW_BYTES, Update(None, 16384, None, None, ROW)),
    (
        b"U" + u32(16384) + b"K" + i16(1) + b"t" + i32(1) + b"1" + b"N" + ROW_BYTES,
        SAMPLES[Update],
    ),
    (
        b"U" + u32(16384) + b"O" + ROW_BYTES + b"N" + ROW_BYTES,
        Update(None, 16384, None, ROW, ROW),
    ),
    (b"D" + u32(16384) + b"O" + ROW_BYTES, SAMPLES[Delete]),
    (b"D" + u32(16384) + b"K" + i16(1) + b"n", Delete(None, 16384, (None,), None)),
    (b"T" + i32(2) + b"\x03" + u32(16384) + u32(16390), SAMPLES[Truncate]),
]


def _ids(cases) -> list[str]:
    return [f"{i}-{chr(case[0][0])}" for i, case in enumerate(cases)]


GOLDEN_V2 = [
    (b"S" + u32(XID) + b"\x01", StreamStart(XID, True)),
    (b"E", StreamStop()),
    (b"c" + u32(XID) + b"\x00" + u64(LSN1) + u64(LSN2) + q(TS_US), SAMPLES[StreamCommit]),
    (b"A" + u32(XID) + u32(XID + 1), StreamAbort(XID, XID + 1, None, None)),
]

GOLDEN_V3 = [
    (b"b" + u64(LSN1) + u64(LSN2) + q(TS_US) + u32(XID) + b"gid-1\x00", SAMPLES[BeginPrepare]),
    (
        b"P" + b"\x00" + u64(LSN1) + u64(LSN2) + q(TS_US) + u32(XID) + b"gid-1\x00",
        SAMPLES[Prepare],
    ),
    (
        b"K" + b"\x00" + u64(LSN1) + u64(LSN2) + q(TS_US) + u32(XID) + b"gid-1\x00",
        SAMPLES[CommitPrepared],
    ),
    (
        b"r"
        + b"\x00"
        + u64(LSN1)
        + u64(LSN2)
        + q(TS_US)
        + q(TS_US + 3_000_000)
        + u32(XID)
        + b"gid-1\x00",
        SAMPLES[RollbackPrepared],
    ),
    (
        b"p" + b"\x00" + u64(LSN1) + u64(LSN2) + q(TS_US) + u32(XID) + b"gid-1\x00",
        SAMPLES[StreamPrepare],
    ),
]


@pytest.mark.parametrize("version", [1, 2, 3, 4])
@pytest.mark.parametrize("raw,expected", GOLDEN_OUTSIDE, ids=_ids(GOLDEN_OUTSIDE))
def test_golden_outside_stream_every_version(version, raw, expected):
    assert PgoutputDecoder(version).decode(raw) == expected
    assert encode_message(expected, version) == raw


GOLDEN_CHANGES = [case for case in GOLDEN_OUTSIDE if type(case[1]) in DATA_CLASSES]


@pytest.mark.parametrize("version", [2, 3, 4])
@pytest.mark.parametrize("raw,expected", GOLDEN_CHANGES, ids=_ids(GOLDEN_CHANGES))
def test_golden_inside_stream_carries_xid(version, raw, expected):
    d = in_stream_decoder(version)
    streamed = raw[:1] + u32(4242) + raw[1:]
    got = d.decode(streamed)
    assert got == with_xid(expected, 4242)
    assert got.xid == 4242
    assert encode_message(got, version) == streamed
    assert encode_message(got, version, in_stream=True) == streamed
    assert d.in_stream  # change messages do not end the block


@pytest.mark.parametrize("version", [2, 3, 4])
@pytest.mark.parametrize("raw,expected", GOLDEN_V2, ids=_ids(GOLDEN_V2))
def test_golden_streaming_messages(version, raw, expected):
    d = PgoutputDecoder(version)
    if isinstance(expected, StreamStop):
        d.decode(b"S" + u32(1) + b"\x00")
    assert d.decode(raw) == expected
    assert encode_message(expected, version) == raw


@pytest.mark.parametrize("version", [3, 4])
@pytest.mark.parametrize("raw,expected", GOLDEN_V3, ids=_ids(GOLDEN_V3))
def test_golden_two_phase_messages(version, raw, expected):
    assert PgoutputDecoder(version).decode(raw) == expected
    assert encode_message(expected, version) == raw


def test_decoded_field_types():
    begin = PgoutputDecoder(1).decode(GOLDEN_OUTSIDE[0][0])
    assert type(begin.final_lsn) is LSN and str(begin.final_lsn) == "16/B374D848"
    assert begin.commit_timestamp.tzinfo is not None
    assert begin.commit_timestamp.utcoffset() == timedelta(0)
    assert begin.xid == XID  # unsigned
    ins = PgoutputDecoder(1).decode(b"I" + u32(0xFFFF_FFF0) + b"N" + ROW_BYTES)
    assert ins.relation_oid == 0xFFFF_FFF0
    assert type(ins.new) is tuple
    assert ins.new[2] is UNCHANGED_TOAST
    assert ins.new[4] == "u" and ins.new[4] is not UNCHANGED_TOAST
    assert type(ins.new[3]) is bytes


# ---------------------------------------------------------------------------------------
# Every message, every version: round trip or UnknownMessageType
# ---------------------------------------------------------------------------------------
def _setup_for(cls, version):
    """A decoder in the state in which ``cls`` may arrive."""
    d = PgoutputDecoder(version)
    if cls is StreamStop:
        d.decode(b"S" + u32(1) + b"\x00")
    return d


@pytest.mark.parametrize("version", [1, 2, 3, 4])
@pytest.mark.parametrize("cls", list(SAMPLES), ids=lambda c: c.__name__)
def test_every_message_every_version(cls, version):
    msg = SAMPLES[cls]
    assert cls.min_version == MIN_VERSION[cls]
    if version >= cls.min_version:
        raw = encode_message(msg, version)
        assert msg.encode(version) == raw
        assert _setup_for(cls, version).decode(raw) == msg
    else:
        raw = encode_message(msg, cls.min_version)
        err = raises(UnknownMessageType, raw, PgoutputDecoder(version))
        assert err.message_type == cls.label
        assert err.offset == 0
        assert f"version {cls.min_version}" in err.reason
        assert f"negotiated version {version}" in err.reason
        with pytest.raises(ValueError):
            encode_message(msg, version)


def test_message_classes_complete_and_typed():
    assert set(MESSAGE_CLASSES) == set(SAMPLES)
    names = [c.type for c in MESSAGE_CLASSES]
    assert names == [
        "begin",
        "message",
        "commit",
        "origin",
        "relation",
        "type",
        "insert",
        "update",
        "delete",
        "truncate",
        "stream_start",
        "stream_stop",
        "stream_commit",
        "stream_abort",
        "begin_prepare",
        "prepare",
        "commit_prepared",
        "rollback_prepared",
        "stream_prepare",
    ]
    for cls in MESSAGE_CLASSES:
        msg = SAMPLES[cls]
        assert not hasattr(msg, "__dict__"), cls  # __slots__
        assert cls.label.endswith(f"('{chr(cls.tag)}')")


def test_field_names():
    def names(cls):
        return [f.name for f in dataclasses.fields(cls)]

    assert names(Begin) == ["final_lsn", "commit_timestamp", "xid"]
    assert names(Commit) == ["flags", "commit_lsn", "end_lsn", "commit_timestamp"]
    assert names(StreamAbort) == ["xid", "subxid", "abort_lsn", "abort_timestamp"]
    assert names(RollbackPrepared) == [
        "flags",
        "prepare_end_lsn",
        "rollback_end_lsn",
        "prepare_timestamp",
        "rollback_timestamp",
        "xid",
        "gid",
    ]
    assert names(Relation) == [
        "xid",
        "relation_oid",
        "namespace",
        "relation_name",
        "replica_identity",
        "columns",
    ]
    assert names(RelationColumn) == ["flags", "name", "type_oid", "type_modifier"]
    assert names(Truncate) == ["xid", "options", "relation_oids"]
    assert names(Update) == ["xid", "relation_oid", "key", "old", "new"]
    assert names(Delete) == ["xid", "relation_oid", "key", "old"]
    assert names(Insert) == ["xid", "relation_oid", "new"]


# ---------------------------------------------------------------------------------------
# Field presence: xid only inside a stream block, version 1 has no streams
# ---------------------------------------------------------------------------------------
def test_v1_insert_has_no_xid_and_no_streams():
    d = PgoutputDecoder(1)
    raw = b"I" + u32(16384) + b"N" + i16(1) + b"n"
    assert d.decode(raw) == Insert(None, 16384, (None,))
    raises(UnknownMessageType, b"S" + u32(1) + b"\x01", d)
    with pytest.raises(ValueError, match="version 1"):
        encode_message(Insert(5, 16384, (None,)), 1)


@pytest.mark.parametrize("version", [2, 3, 4])
def test_xid_follows_stream_state(version):
    d = PgoutputDecoder(version)
    plain = b"I" + u32(16384) + b"N" + i16(1) + b"n"
    streamed = b"I" + u32(99) + u32(16384) + b"N" + i16(1) + b"n"
    assert d.decode(plain).xid is None
    # the streamed form outside a block reads 99 as the OID and then trips on the rest
    with pytest.raises(ProtocolError):
        d.decode(streamed)
    assert d.decode(b"S" + u32(99) + b"\x01") == StreamStart(99, True)
    assert d.decode(streamed) == Insert(99, 16384, (None,))
    with pytest.raises(ProtocolError):
        d.decode(plain)
    assert d.decode(b"E") == StreamStop()
    assert not d.in_stream and d.stream_xid is None
    assert d.decode(plain).xid is None


def test_subtransaction_xid_inside_block_is_kept():
    d = in_stream_decoder(2)
    assert d.decode(b"Y" + u32(12345) + u32(600) + b"\x00int4\x00") == Type(12345, 600, "", "int4")


def test_reset_forgets_stream_state():
    d = in_stream_decoder(2)
    d.reset()
    assert not d.in_stream
    assert d.decode(b"I" + u32(1) + b"N" + i16(0)).xid is None


def test_origin_allowed_inside_stream_block():
    d = in_stream_decoder(2)
    assert d.decode(b"O" + u64(0) + b"\x00") == Origin(LSN(0), "")


# ---------------------------------------------------------------------------------------
# Stream Abort: abort LSN/timestamp only with v4 + parallel streaming
# ---------------------------------------------------------------------------------------
SHORT_ABORT = b"A" + u32(7) + u32(8)
LONG_ABORT = SHORT_ABORT + u64(LSN1) + q(TS_US)


@pytest.mark.parametrize("version", [2, 3, 4])
def test_stream_abort_without_parallel_streaming(version):
    d = PgoutputDecoder(version)
    assert d.decode(SHORT_ABORT) == StreamAbort(7, 8, None, None)
    err = raises(TrailingBytes, LONG_ABORT, d)
    assert err.offset == 9
    assert err.message_type == "Stream Abort ('A')"


def test_stream_abort_parallel_streaming():
    d = PgoutputDecoder(4, parallel_streaming=True)
    assert d.decode(LONG_ABORT) == StreamAbort(7, 8, LSN1, TS)
    assert d.decode(SHORT_ABORT) == StreamAbort(7, 8, None, None)  # server may omit them
    err = raises(TruncatedMessage, LONG_ABORT[:20], d)
    assert err.offset == 17  # the abort timestamp
    err = raises(TruncatedMessage, LONG_ABORT[:12], d)
    assert err.offset == 9  # the abort LSN
    err = raises(TrailingBytes, LONG_ABORT + b"\x00", d)
    assert err.offset == 25
    assert encode_message(StreamAbort(7, 8, LSN1, TS), 4, parallel_streaming=True) == LONG_ABORT
    assert encode_message(StreamAbort(7, 8), 4, parallel_streaming=True) == SHORT_ABORT


def test_stream_abort_encoder_refuses_fields_it_cannot_send():
    with pytest.raises(ValueError, match="parallel"):
        encode_message(StreamAbort(7, 8, LSN1, TS), 4)
    with pytest.raises(ValueError, match="parallel"):
        encode_message(StreamAbort(7, 8, LSN1, TS), 3, parallel_streaming=True)


def test_parallel_streaming_needs_v4():
    for v in (1, 2, 3):
        with pytest.raises(ValueError, match="parallel"):
            PgoutputDecoder(v, parallel_streaming=True)


@pytest.mark.parametrize("bad", [0, 5, -1, 2.0, "2", True, None])
def test_bad_proto_version(bad):
    with pytest.raises(ValueError):
        PgoutputDecoder(bad)


def test_unknown_encoding():
    with pytest.raises(ValueError, match="encoding"):
        PgoutputDecoder(1, encoding="no-such-codec")


# ---------------------------------------------------------------------------------------
# Message flow
# ---------------------------------------------------------------------------------------
def test_stream_stop_without_start():
    err = raises(UnexpectedMessage, b"E", PgoutputDecoder(2))
    assert err.message_type == "Stream Stop ('E')"
    assert err.offset == 0


def test_stream_start_inside_block():
    d = in_stream_decoder(2)
    err = raises(UnexpectedMessage, b"S" + u32(5) + b"\x00", d)
    assert "777" in err.reason
    assert d.stream_xid == 777  # state unchanged by the failed message


@pytest.mark.parametrize(
    "raw",
    [r for r, _ in GOLDEN_V2[2:]]
    + [r for r, _ in GOLDEN_V3]
    + [GOLDEN_OUTSIDE[0][0], GOLDEN_OUTSIDE[2][0]],
    ids=lambda r: chr(r[0]),
)
def test_transaction_control_inside_stream_block(raw):
    d = in_stream_decoder(3)
    err = raises(UnexpectedMessage, raw, d)
    assert err.message_type.endswith(f"('{chr(raw[0])}')")
    assert d.in_stream


def test_failed_stream_start_does_not_open_block():
    d = PgoutputDecoder(2)
    raises(TrailingBytes, b"S" + u32(5) + b"\x00\x00", d)
    assert not d.in_stream
    raises(InvalidFieldValue, b"S" + u32(5) + b"\x02", d)
    assert not d.in_stream


def test_full_streamed_transaction_flow():
    d = PgoutputDecoder(2)
    msgs = [
        StreamStart(10, True),
        Relation(10, 1, "s", "t", "f", (RelationColumn(0, "a", 25, -1),)),
        Insert(11, 1, ("x",)),
        StreamStop(),
        StreamStart(10, False),
        Delete(10, 1, None, ("x",)),
        StreamStop(),
        StreamAbort(10, 11),
        StreamCommit(10, 0, LSN1, LSN2, TS),
    ]
    for m in msgs:
        assert d.decode(encode_message(m, 2)) == m


# ---------------------------------------------------------------------------------------
# Update / Delete sub-messages
# ---------------------------------------------------------------------------------------
ONE = i16(1) + b"t" + i32(1) + b"1"


def test_update_unknown_submessage():
    err = raises(UnknownMessageType, b"U" + u32(1) + b"X" + ONE)
    assert err.offset == 5
    assert "'X'" in err.reason
    assert err.message_type == "Update ('U')"


def test_update_unknown_submessage_in_stream_offset():
    err = raises(UnknownMessageType, b"U" + u32(9) + u32(1) + b"Z" + ONE, in_stream_decoder(2))
    assert err.offset == 9


def test_update_key_then_key_is_invalid():
    raw = b"U" + u32(1) + b"K" + ONE + b"K" + ONE
    err = raises(InvalidFieldValue, raw)
    assert err.offset == 14


def test_update_old_then_garbage():
    raw = b"U" + u32(1) + b"O" + ONE + b"?" + ONE
    err = raises(UnknownMessageType, raw)
    assert err.offset == 14


def test_update_missing_new_tuple():
    raw = b"U" + u32(1) + b"K" + ONE
    err = raises(TruncatedMessage, raw)
    assert err.offset == len(raw)


def test_update_encoder_refuses_key_and_old():
    with pytest.raises(ValueError):
        encode_message(Update(None, 1, ("1",), ("1",), ("1",)), 1)


def test_delete_needs_key_or_old():
    err = raises(InvalidFieldValue, b"D" + u32(1) + b"N" + ONE)
    assert err.offset == 5
    err = raises(UnknownMessageType, b"D" + u32(1) + b"x" + ONE)
    assert err.offset == 5
    with pytest.raises(ValueError):
        encode_message(Delete(None, 1, None, None), 1)
    with pytest.raises(ValueError):
        encode_message(Delete(None, 1, ("1",), ("1",)), 1)


def test_insert_needs_new():
    err = raises(InvalidFieldValue, b"I" + u32(1) + b"K" + ONE)
    assert err.offset == 5
    err = raises(UnknownMessageType, b"I" + u32(1) + b"\x00" + ONE)
    assert err.offset == 5


def test_delete_in_stream_with_key():
    d = in_stream_decoder(4)
    assert d.decode(b"D" + u32(3) + u32(1) + b"K" + ONE) == Delete(3, 1, ("1",), None)


# ---------------------------------------------------------------------------------------
# Truncate
# ---------------------------------------------------------------------------------------
def test_truncate_options():
    d = PgoutputDecoder(1)
    t = d.decode(b"T" + i32(1) + b"\x01" + u32(5))
    assert t.cascade and not t.restart_identity
    t = d.decode(b"T" + i32(1) + b"\x02" + u32(5))
    assert t.restart_identity and not t.cascade
    t = d.decode(b"T" + i32(0) + b"\xfc")  # unknown bits kept, no error
    assert t.options == 0xFC and not t.cascade and not t.restart_identity
    assert t.relation_oids == ()


def test_truncate_bad_counts_do_not_allocate():
    err = raises(InvalidFieldValue, b"T" + i32(-1) + b"\x00")
    assert err.offset == 1
    started = time.perf_counter()
    err = raises(TruncatedMessage, b"T" + i32(2**31 - 1) + b"\x00" + u32(5))
    assert time.perf_counter() - started < 0.5
    assert "2147483647" in err.reason
    raises(TrailingBytes, b"T" + i32(1) + b"\x00" + u32(5) + b"\x00")


# ---------------------------------------------------------------------------------------
# TupleData
# ---------------------------------------------------------------------------------------
def decode_insert(tuple_bytes: bytes, **kw) -> Insert:
    return PgoutputDecoder(1, **kw).decode(b"I" + u32(1) + b"N" + tuple_bytes)


def test_tuple_all_kinds_and_helpers():
    assert decode_insert(ROW_BYTES).new == ROW
    assert encode_tuple(ROW) == ROW_BYTES
    assert [kind_of(v) for v in ROW] == ["t", "n", "u", "b", "t", "t", "t"]
    assert set(TUPLE_KINDS) == {"n", "u", "t", "b"}
    with pytest.raises(TypeError):
        kind_of(42)
    assert tuple_to_json(ROW) == [
        {"kind": "t", "value": "42"},
        {"kind": "n", "value": None},
        {"kind": "u", "value": None},
        {"kind": "b", "value": "AP8="},
        {"kind": "t", "value": "u"},
        {"kind": "t", "value": ""},
        {"kind": "t", "value": "grüße"},
    ]


def test_unchanged_toast_is_a_singleton():
    assert pickle.loads(pickle.dumps(UNCHANGED_TOAST)) is UNCHANGED_TOAST
    assert copy.deepcopy(UNCHANGED_TOAST) is UNCHANGED_TOAST
    assert copy.copy(UNCHANGED_TOAST) is UNCHANGED_TOAST
    assert type(UNCHANGED_TOAST)() is UNCHANGED_TOAST
    assert repr(UNCHANGED_TOAST) == "UNCHANGED_TOAST"
    msg = pickle.loads(pickle.dumps(SAMPLES[Insert]))
    assert msg == SAMPLES[Insert] and msg.new[2] is UNCHANGED_TOAST


def test_empty_tuple():
    assert decode_insert(i16(0)).new == ()


def test_tuple_unknown_kind():
    err = raises(InvalidFieldValue, b"I" + u32(1) + b"N" + i16(2) + b"n" + b"x")
    assert err.offset == 9
    assert "'x'" in err.reason


def test_tuple_negative_length():
    raw = b"I" + u32(1) + b"N" + i16(1) + b"t" + i32(-1) + b"abc"
    err = raises(InvalidFieldValue, raw)
    assert err.offset == 9  # the length field
    assert "-1" in err.reason
    raw = b"I" + u32(1) + b"N" + i16(1) + b"b" + i32(-5)
    assert raises(InvalidFieldValue, raw).offset == 9


def test_tuple_truncated_value():
    raw = b"I" + u32(1) + b"N" + i16(1) + b"t" + i32(10) + b"abc"
    err = raises(TruncatedMessage, raw)
    assert err.offset == 13
    assert "10 bytes, 3 left" in err.reason


def test_tuple_truncated_length():
    raw = b"I" + u32(1) + b"N" + i16(1) + b"t" + b"\x00\x00"
    assert raises(TruncatedMessage, raw).offset == 9


def test_tuple_missing_column():
    raw = b"I" + u32(1) + b"N" + i16(2) + b"n"
    err = raises(TruncatedMessage, raw)
    assert err.offset == 8


def test_tuple_negative_column_count():
    err = raises(InvalidFieldValue, b"I" + u32(1) + b"N" + i16(-1))
    assert err.offset == 6


def test_tuple_huge_column_count():
    err = raises(TruncatedMessage, b"I" + u32(1) + b"N" + i16(32767) + b"nnn")
    assert "32767" in err.reason


def test_tuple_invalid_utf8():
    raw = b"I" + u32(1) + b"N" + i16(2) + b"n" + b"t" + i32(3) + b"a\xffb"
    err = raises(InvalidFieldValue, raw)
    assert err.offset == 15  # the bad byte
    assert "utf-8" in err.reason


def test_tuple_trailing_bytes():
    raw = b"I" + u32(1) + b"N" + i16(1) + b"n" + b"zz"
    err = raises(TrailingBytes, raw)
    assert err.offset == 9


def test_non_ascii_paths_agree():
    values = ("é" * 3, "plain", None, b"\x80\x81", "日本語", "")
    tup = encode_tuple(values)
    # outside stream, OID with a high byte (header not ASCII), in stream, latin-1
    assert decode_insert(tup).new == values
    assert PgoutputDecoder(1).decode(b"I" + u32(0x80808080) + b"N" + tup).new == values
    d = in_stream_decoder(2)
    assert d.decode(b"I" + u32(0x80000001) + u32(1) + b"N" + tup).new == values
    latin = ("é", "abc", None)
    got = decode_insert(encode_tuple(latin, "latin-1"), encoding="latin-1").new
    assert got == latin


def test_non_ascii_compatible_encoding():
    values = ("abc", "ü", None, UNCHANGED_TOAST)
    got = decode_insert(encode_tuple(values, "utf-16-le"), encoding="utf-16-le").new
    assert got == values


def test_long_values():
    big = "x" * 70_000
    assert decode_insert(encode_tuple((big, big.encode()))).new == (big, big.encode())


# ---------------------------------------------------------------------------------------
# Errors: each class, offsets
# ---------------------------------------------------------------------------------------
def test_empty_message():
    err = raises(TruncatedMessage, b"")
    assert err.offset == 0


@pytest.mark.parametrize("tag", [b"Z", b"\x00", b"\xff", b"x"])
def test_unknown_message_type(tag):
    err = raises(UnknownMessageType, tag + b"\x00" * 20)
    assert err.offset == 0
    assert "version 4" in err.reason


ALL_VALID = (
    [(r, 1, False) for r, _ in GOLDEN_OUTSIDE]
    + [(r, 2, False) for r, _ in GOLDEN_V2 if r[:1] != b"E"]
    + [(r, 3, False) for r, _ in GOLDEN_V3]
    + [(b"E", 2, True), (LONG_ABORT, 4, False)]
)


def _decoder(version, in_stream, parallel=False):
    d = PgoutputDecoder(version, parallel_streaming=parallel)
    if in_stream:
        d.decode(b"S" + u32(1) + b"\x00")
    return d


@pytest.mark.parametrize("raw,version,in_stream", ALL_VALID, ids=_ids(ALL_VALID))
def test_trailing_bytes_every_message(raw, version, in_stream):
    parallel = raw is LONG_ABORT
    err = raises(TrailingBytes, raw + b"\x00", _decoder(version, in_stream, parallel))
    assert err.offset == len(raw)
    assert err.message_type == _label(raw)


@pytest.mark.parametrize("raw,version,in_stream", ALL_VALID, ids=_ids(ALL_VALID))
def test_every_prefix_is_truncated(raw, version, in_stream):
    parallel = raw is LONG_ABORT
    for n in range(len(raw)):
        if parallel and n == len(SHORT_ABORT):
            continue  # the short Stream Abort form is valid on its own
        d = _decoder(version, in_stream, parallel)
        with pytest.raises(TruncatedMessage) as info:
            d.decode(raw[:n])
        err = info.value
        assert err.protocol == "pgoutput"
        assert 0 <= err.offset <= n, (n, err)
        if n:
            assert err.message_type == _label(raw)


def _label(raw: bytes) -> str:
    cls = next(c for c in MESSAGE_CLASSES if c.tag == raw[0])
    return cls.label


def test_error_rendering():
    err = raises(TruncatedMessage, b"B" + u64(1))
    assert err.message_type == "Begin ('B')"
    assert err.offset == 9
    assert str(err).startswith("pgoutput message Begin ('B') at byte 9:")
    assert pickle.loads(pickle.dumps(err)).offset == 9


@pytest.mark.parametrize(
    "raw,offset",
    [
        (b"C" + b"\x01" + u64(1) + u64(2) + q(0), 1),
        (b"c" + u32(1) + b"\x80" + u64(1) + u64(2) + q(0), 5),
        (b"P" + b"\x02" + u64(1) + u64(2) + q(0) + u32(1) + b"g\x00", 1),
        (b"K" + b"\x02" + u64(1) + u64(2) + q(0) + u32(1) + b"g\x00", 1),
        (b"r" + b"\x02" + u64(1) + u64(2) + q(0) + q(0) + u32(1) + b"g\x00", 1),
        (b"p" + b"\x02" + u64(1) + u64(2) + q(0) + u32(1) + b"g\x00", 1),
    ],
)
def test_nonzero_unused_flags_rejected(raw, offset):
    err = raises(InvalidFieldValue, raw)
    assert err.offset == offset
    assert "flags" in err.reason


def test_message_flags_and_lengths():
    raises(InvalidFieldValue, b"M" + b"\x02" + u64(1) + b"p\x00" + i32(0))
    err = raises(InvalidFieldValue, b"M" + b"\x00" + u64(1) + b"p\x00" + i32(-3))
    assert err.offset == 12
    err = raises(TruncatedMessage, b"M" + b"\x00" + u64(1) + b"p\x00" + i32(10) + b"abc")
    assert err.offset == 16
    m = PgoutputDecoder(1).decode(b"M" + b"\x00" + u64(1) + b"\x00" + i32(0))
    assert m == LogicalMessage(None, 0, LSN(1), "", b"") and not m.transactional


def test_relation_checks():
    good = GOLDEN_OUTSIDE[4][0]
    ident_at = 1 + 4 + len(b"public\x00orders\x00")
    bad_ident = good[:ident_at] + b"x" + good[ident_at + 1 :]
    err = raises(InvalidFieldValue, bad_ident)
    assert err.offset == ident_at
    neg = good[: ident_at + 1] + i16(-1)
    assert raises(InvalidFieldValue, neg).offset == ident_at + 1
    huge = good[: ident_at + 1] + i16(30000) + b"\x00" * 20
    assert "30000 columns" in raises(TruncatedMessage, huge).reason
    for ident in "dnfi":
        raw = good[:ident_at] + ident.encode() + good[ident_at + 1 :]
        assert PgoutputDecoder(1).decode(raw).replica_identity == ident
    rel = PgoutputDecoder(1).decode(good)
    assert [c.is_key for c in rel.columns] == [True, False]
    # unknown column flag bits are kept
    weird = good.replace(b"\x01id\x00", b"\x03id\x00")
    assert PgoutputDecoder(1).decode(weird).columns[0].flags == 3


def test_invalid_utf8_in_names():
    err = raises(InvalidFieldValue, b"Y" + u32(1) + b"pub\xfflic\x00t\x00")
    assert err.offset == 8
    assert err.message_type == "Type ('Y')"
    err = raises(TruncatedMessage, b"O" + u64(1) + b"no-terminator")
    assert err.offset == 9


@pytest.mark.parametrize("us", [2**63 - 1, -(2**63)])
def test_timestamp_out_of_range(us):
    err = raises(InvalidFieldValue, b"B" + u64(1) + q(us) + u32(1))
    assert err.offset == 9
    assert err.message_type == "Begin ('B')"
    err = raises(
        InvalidFieldValue, b"r" + b"\x00" + u64(1) + u64(2) + q(0) + q(us) + u32(1) + b"\x00"
    )
    assert err.offset == 26


def test_stream_start_first_segment_flag():
    assert PgoutputDecoder(2).decode(b"S" + u32(3) + b"\x00") == StreamStart(3, False)
    assert raises(InvalidFieldValue, b"S" + u32(3) + b"\x07", PgoutputDecoder(2)).offset == 5


def test_decode_accepts_buffers():
    raw = GOLDEN_OUTSIDE[0][0]
    d = PgoutputDecoder(1)
    assert d.decode(bytearray(raw)) == d.decode(memoryview(raw)) == GOLDEN_OUTSIDE[0][1]


# ---------------------------------------------------------------------------------------
# to_dict
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", list(SAMPLES), ids=lambda c: c.__name__)
def test_to_dict_json_ready(cls):
    msg = SAMPLES[cls]
    d = msg.to_dict()
    assert d["type"] == cls.type
    assert json.loads(json.dumps(d)) == d


def test_to_dict_formats():
    assert Begin(LSN1, TS, 5).to_dict() == {
        "type": "begin",
        "final_lsn": "16/B374D848",
        "commit_timestamp": "2024-05-01T12:34:56.789012+00:00",
        "xid": 5,
    }
    m = SAMPLES[LogicalMessage].to_dict()
    assert m["content"] == "aGVsbG8=" and m["content_text"] == "hello"
    assert m["xid"] is None and m["transactional"] is True and m["lsn"] == "16/B374D848"
    binary = LogicalMessage(3, 0, LSN1, "p", b"\xff\xfe").to_dict()
    assert "content_text" not in binary and binary["xid"] == 3
    u = SAMPLES[Update].to_dict()
    assert u["old"] is None and u["key"] == [{"kind": "t", "value": "1"}]
    assert u["new"][2] == {"kind": "u", "value": None}
    r = SAMPLES[Relation].to_dict()
    assert r["columns"][0] == {
        "flags": 1,
        "name": "id",
        "type_oid": 20,
        "type_modifier": -1,
        "is_key": True,
    }
    t = SAMPLES[Truncate].to_dict()
    assert t["relation_oids"] == [16384, 16390] and t["cascade"] and t["restart_identity"]
    a = StreamAbort(1, 2, LSN1, TS).to_dict()
    assert a["abort_lsn"] == "16/B374D848" and a["abort_timestamp"].startswith("2024-05-01T")
    assert StreamAbort(1, 2).to_dict()["abort_lsn"] is None
    assert StreamStop().to_dict() == {"type": "stream_stop"}
    assert StreamStart(1, False).to_dict() == {
        "type": "stream_start",
        "xid": 1,
        "first_segment": False,
    }


def test_encoder_xid_rules():
    ins = Insert(None, 1, ())
    with pytest.raises(ValueError, match="needs an xid"):
        encode_message(ins, 2, in_stream=True)
    with pytest.raises(ValueError, match="no xid"):
        encode_message(Insert(5, 1, ()), 2, in_stream=False)
    with pytest.raises(ValueError):
        encode_message(ins, 5)
    with pytest.raises(ValueError, match="NUL"):
        encode_message(Origin(LSN1, "a\x00b"), 1)
    with pytest.raises(TypeError):
        encode_tuple((1,))


def test_relation_columns_run_out():
    raw = b"R" + u32(1) + b"\x00t\x00d" + i16(2) + b"\x00abcdefghijk\x00" + u32(25) + i32(-1)
    err = raises(TruncatedMessage, raw)
    assert err.offset == len(raw)
    assert "column flags" in err.reason


def test_encoder_stream_abort_needs_both_fields():
    with pytest.raises(ValueError, match="abort_lsn"):
        encode_message(StreamAbort(1, 2, None, TS), 4, parallel_streaming=True)
    with pytest.raises(ValueError, match="abort_timestamp"):
        encode_message(StreamAbort(1, 2, LSN1, None), 4, parallel_streaming=True)
    with pytest.raises(TypeError):
        encode_message(RelationColumn(0, "a", 1, 1), 1)


def test_tuple_to_json_none():
    assert tuple_to_json(None) is None
