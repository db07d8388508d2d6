"""CopyData payloads of START_REPLICATION and BASE_BACKUP (spec 003): build, parse, errors."""

from __future__ import annotations

import json
import pickle
import struct
from datetime import UTC, datetime, timedelta

import pytest

from airflow_pgcdc.errors import (
    InvalidFieldValue,
    PgcdcError,
    ProtocolError,
    TrailingBytes,
    TruncatedMessage,
    UnexpectedMessage,
    UnknownMessageType,
)
from airflow_pgcdc.protocol.frames import (
    MAX_PG_US,
    MIN_PG_US,
    XLOG_DATA_HEADER_SIZE,
    ArchiveData,
    FrameBuildError,
    HotStandbyFeedback,
    ManifestStart,
    NewArchive,
    PrimaryKeepalive,
    Progress,
    StandbyStatusUpdate,
    XLogData,
    build_archive_data,
    build_hot_standby_feedback,
    build_manifest_start,
    build_new_archive,
    build_primary_keepalive,
    build_progress,
    build_standby_status_update,
    build_xlog_data,
    parse_base_backup_copy_data,
    parse_client_copy_data,
    parse_copy_data,
)
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.pgtime import now_pg_us

T0 = 800_000_000_123_456  # 2025-05-08T...: a realistic wire time


def q(v: int) -> bytes:
    return struct.pack("!Q", v)


def sq(v: int) -> bytes:
    return struct.pack("!q", v)


# -- exact wire bytes ---------------------------------------------------------------------


def test_xlog_data_wire_layout():
    frame = b"w" + q(0x16_B374D848) + q(0x17_00000000) + sq(T0) + b"payload"
    msg = parse_copy_data(frame)
    assert isinstance(msg, XLogData)
    assert msg.type == "w" and msg.name == "XLogData"
    assert msg.data_start == LSN.parse("16/B374D848")
    assert isinstance(msg.data_start, LSN) and isinstance(msg.wal_end, LSN)
    assert str(msg.wal_end) == "17/0"
    assert msg.send_time_us == T0
    assert msg.send_time == datetime(2000, 1, 1, tzinfo=UTC) + timedelta(microseconds=T0)
    assert msg.data == b"payload"
    assert msg.data_end == LSN.parse("16/B374D848") + 7
    assert XLOG_DATA_HEADER_SIZE == 25
    assert build_xlog_data(msg.data_start, msg.wal_end, b"payload", send_time_us=T0) == frame


def test_xlog_data_empty_payload():
    msg = parse_copy_data(b"w" + q(1) + q(2) + sq(0))
    assert msg.data == b"" and msg.data_end == msg.data_start


def test_keepalive_wire_layout():
    frame = b"k" + q(0x1_00000010) + sq(T0) + b"\x01"
    msg = parse_copy_data(frame)
    assert isinstance(msg, PrimaryKeepalive)
    assert msg.type == "k"
    assert msg.wal_end == LSN.parse("1/10")
    assert msg.send_time_us == T0
    assert msg.reply_requested is True
    assert parse_copy_data(frame[:-1] + b"\x00").reply_requested is False
    assert build_primary_keepalive(msg.wal_end, send_time_us=T0, reply_requested=True) == frame


def test_standby_status_update_wire_layout():
    data = build_standby_status_update(
        LSN.parse("1/2"), LSN.parse("3/4"), 5, send_time_us=7, reply_requested=True
    )
    assert data == b"r" + q(1 << 32 | 2) + q(3 << 32 | 4) + q(5) + sq(7) + b"\x01"
    assert len(data) == 34
    msg = parse_client_copy_data(data)
    assert msg == StandbyStatusUpdate(LSN(1 << 32 | 2), LSN(3 << 32 | 4), LSN(5), 7, True)
    assert msg.type == "r"
    assert build_standby_status_update(0, 0, 0, send_time_us=0)[-1:] == b"\x00"


def test_hot_standby_feedback_wire_layout():
    data = build_hot_standby_feedback(
        xmin=1000, xmin_epoch=2, catalog_xmin=900, catalog_xmin_epoch=3, send_time_us=T0
    )
    assert data == b"h" + sq(T0) + struct.pack("!IIII", 1000, 2, 900, 3)
    msg = parse_client_copy_data(data)
    assert msg == HotStandbyFeedback(T0, 1000, 2, 900, 3)
    assert msg.type == "h" and not msg.stops_feedback
    stop = parse_client_copy_data(build_hot_standby_feedback(send_time_us=T0))
    assert stop.stops_feedback


def test_send_time_defaults_to_now_and_accepts_datetime():
    before = now_pg_us()
    msg = parse_client_copy_data(build_standby_status_update(1, 1, 1))
    after = now_pg_us()
    assert before <= msg.send_time_us <= after
    when = datetime(2024, 2, 29, 12, 0, tzinfo=UTC)
    msg = parse_client_copy_data(build_standby_status_update(1, 1, 1, send_time_us=when))
    assert msg.send_time == when


def test_base_backup_messages_wire_layout():
    assert parse_base_backup_copy_data(b"nbase.tar\x00\x00") == NewArchive("base.tar", "")
    new = parse_base_backup_copy_data(b"n16385.tar\x00/srv/tbs\x00")
    assert new.archive_name == "16385.tar" and new.tablespace_location == "/srv/tbs"
    assert not new.is_base_directory and NewArchive("base.tar", "").is_base_directory
    assert parse_base_backup_copy_data(b"m") == ManifestStart()
    assert parse_base_backup_copy_data(b"dtar bytes").data == b"tar bytes"
    assert parse_base_backup_copy_data(b"p" + sq(123456)) == Progress(123456)
    assert build_new_archive("16385.tar", "/srv/tbs") == b"n16385.tar\x00/srv/tbs\x00"
    assert build_manifest_start() == b"m"
    assert build_archive_data(b"xyz") == b"dxyz"
    assert build_progress(5) == b"p" + sq(5)


# -- round trips, types, dicts ------------------------------------------------------------

SERVER_FRAMES = [
    XLogData(LSN.parse("0/16B3748"), LSN.parse("FFFFFFFF/FFFFFFFF"), T0, b"\x00\xffWAL"),
    XLogData(LSN(0), LSN(0), MIN_PG_US, b""),
    PrimaryKeepalive(LSN.parse("5/0"), MAX_PG_US, False),
    PrimaryKeepalive(LSN(1), -1, True),
]
CLIENT_FRAMES = [
    StandbyStatusUpdate(LSN(1), LSN(2), LSN(3), T0, False),
    StandbyStatusUpdate(LSN((1 << 64) - 1), LSN(0), LSN(0), 0, True),
    HotStandbyFeedback(T0, 0xFFFFFFFF, 0, 1, 0xFFFFFFFF),
]
BACKUP_FRAMES = [
    NewArchive("base.tar", ""),
    NewArchive("16385.tar", "/données/tbs ünïcode"),
    ManifestStart(),
    ArchiveData(b"\x00" * 513),
    ArchiveData(b""),
    Progress(0),
    Progress((1 << 63) - 1),
]


@pytest.mark.parametrize("frame", SERVER_FRAMES, ids=repr)
def test_server_frames_round_trip(frame):
    data = frame.to_bytes()
    assert parse_copy_data(data) == frame
    assert parse_copy_data(memoryview(data)) == frame
    assert parse_copy_data(bytearray(data)) == frame
    assert parse_copy_data(data).to_bytes() == data


@pytest.mark.parametrize("frame", CLIENT_FRAMES, ids=repr)
def test_client_frames_round_trip(frame):
    data = frame.to_bytes()
    assert parse_client_copy_data(data) == frame
    assert parse_client_copy_data(memoryview(data)).to_bytes() == data


@pytest.mark.parametrize("frame", BACKUP_FRAMES, ids=repr)
def test_base_backup_frames_round_trip(frame):
    data = frame.to_bytes()
    assert parse_base_backup_copy_data(data) == frame
    assert parse_base_backup_copy_data(memoryview(data)).to_bytes() == data


@pytest.mark.parametrize("frame", SERVER_FRAMES + CLIENT_FRAMES + BACKUP_FRAMES, ids=repr)
def test_frames_have_slots_type_and_json_dict(frame):
    assert not hasattr(frame, "__dict__")
    assert isinstance(frame.type, str) and len(frame.type) == 1
    assert frame.to_bytes()[:1] == frame.type.encode()
    d = frame.to_dict()
    assert d["type"] == frame.type and d["name"] == type(frame).__name__
    json.dumps(d)
    assert repr(frame).startswith(type(frame).__name__ + "(")
    hash(frame)


def test_to_dict_formats():
    d = SERVER_FRAMES[0].to_dict()
    assert d == {
        "type": "w",
        "name": "XLogData",
        "data_start": "0/16B3748",
        "wal_end": "FFFFFFFF/FFFFFFFF",
        "send_time": (datetime(2000, 1, 1, tzinfo=UTC) + timedelta(microseconds=T0)).isoformat(),
        "send_time_us": T0,
        "data_hex": "00ff57414c",
    }
    assert CLIENT_FRAMES[0].to_dict()["flush"] == "0/2"
    assert PrimaryKeepalive(LSN(1), 0, True).to_dict()["send_time"] == "2000-01-01T00:00:00+00:00"
    assert Progress(7).to_dict() == {"type": "p", "name": "Progress", "bytes_done": 7}


def test_payload_is_a_cheap_slice_of_the_input():
    frame = build_xlog_data(1, 2, b"x" * 1000, send_time_us=0)
    assert type(parse_copy_data(frame).data) is bytes
    view = memoryview(frame)
    msg = parse_copy_data(view)
    assert isinstance(msg.data, memoryview)  # zero copy
    assert msg.data.obj is frame
    assert msg.data == b"x" * 1000
    backup = parse_base_backup_copy_data(memoryview(b"d" + b"y" * 10))
    assert isinstance(backup.data, memoryview) and backup.data == b"y" * 10
    # a memoryview of another format is read as bytes
    assert parse_copy_data(view.cast("c")).data == b"x" * 1000


def test_equality_and_types_are_distinct():
    assert XLogData(LSN(1), LSN(2), 3, b"a") == XLogData(LSN(1), LSN(2), 3, memoryview(b"a"))
    assert XLogData(LSN(1), LSN(2), 3, b"a") != XLogData(LSN(1), LSN(2), 3, b"b")
    assert Progress(1) != ArchiveData(b"")
    assert (Progress(1) == 1) is False


# -- errors ---------------------------------------------------------------------------


def _err(exc_info, cls, offset, message_type_part=None):
    err = exc_info.value
    assert type(err) is cls, err
    assert err.protocol == "replication"
    assert err.offset == offset, err
    if message_type_part is not None:
        assert message_type_part in (err.message_type or ""), err.message_type
    return err


@pytest.mark.parametrize(
    "parse", [parse_copy_data, parse_client_copy_data, parse_base_backup_copy_data]
)
def test_empty_payload_is_truncated_at_zero(parse):
    with pytest.raises(TruncatedMessage) as ei:
        parse(b"")
    _err(ei, TruncatedMessage, 0)


@pytest.mark.parametrize("length", range(1, 25))
def test_truncated_xlog_data_names_the_field_offset(length):
    frame = build_xlog_data(1, 2, b"", send_time_us=0)[:length]
    with pytest.raises(TruncatedMessage) as ei:
        parse_copy_data(frame)
    expected = 1 if length < 9 else 9 if length < 17 else 17
    err = _err(ei, TruncatedMessage, expected, "XLogData ('w')")
    assert "needs 8 bytes" in err.reason


@pytest.mark.parametrize("length", range(1, 18))
def test_truncated_keepalive(length):
    frame = build_primary_keepalive(1, send_time_us=0)[:length]
    with pytest.raises(TruncatedMessage) as ei:
        parse_copy_data(frame)
    _err(ei, TruncatedMessage, 1 if length < 9 else 9 if length < 17 else 17, "PrimaryKeepalive")


@pytest.mark.parametrize("length", range(1, 34))
def test_truncated_status_update(length):
    frame = build_standby_status_update(1, 2, 3, send_time_us=0)[:length]
    with pytest.raises(TruncatedMessage) as ei:
        parse_client_copy_data(frame)
    offsets = [1, 9, 17, 25, 33]
    expected = max(o for o in offsets if o <= length)
    _err(ei, TruncatedMessage, expected, "StandbyStatusUpdate")


@pytest.mark.parametrize("length", range(1, 25))
def test_truncated_hot_standby_feedback(length):
    frame = build_hot_standby_feedback(send_time_us=0)[:length]
    with pytest.raises(TruncatedMessage) as ei:
        parse_client_copy_data(frame)
    offsets = [1, 9, 13, 17, 21]
    _err(ei, TruncatedMessage, max(o for o in offsets if o <= length), "HotStandbyFeedback")


@pytest.mark.parametrize("length", range(1, 9))
def test_truncated_progress(length):
    with pytest.raises(TruncatedMessage) as ei:
        parse_base_backup_copy_data(build_progress(1)[:length])
    _err(ei, TruncatedMessage, 1, "progress")


@pytest.mark.parametrize(
    "frame, offset",
    [(b"n", 1), (b"nbase.tar", 1), (b"nbase.tar\x00", 10), (b"nbase.tar\x00/tbs", 10)],
)
def test_truncated_new_archive(frame, offset):
    with pytest.raises(TruncatedMessage) as ei:
        parse_base_backup_copy_data(frame)
    _err(ei, TruncatedMessage, offset, "new archive")


@pytest.mark.parametrize(
    "parse, frame, offset",
    [
        (parse_copy_data, build_primary_keepalive(1, send_time_us=0) + b"\x00", 18),
        (parse_client_copy_data, build_standby_status_update(1, 1, 1, send_time_us=0) + b"??", 34),
        (parse_client_copy_data, build_hot_standby_feedback(send_time_us=0) + b"x", 25),
        (parse_base_backup_copy_data, b"m\x00", 1),
        (parse_base_backup_copy_data, build_progress(3) + b"\x00", 9),
        (parse_base_backup_copy_data, b"nbase.tar\x00\x00extra", 11),
    ],
)
def test_trailing_bytes(parse, frame, offset):
    with pytest.raises(TrailingBytes) as ei:
        parse(frame)
    _err(ei, TrailingBytes, offset)


@pytest.mark.parametrize("byte", sorted(set(range(256)) - {ord("w"), ord("k"), ord("r"), ord("h")}))
def test_unknown_server_type(byte):
    with pytest.raises(UnknownMessageType) as ei:
        parse_copy_data(bytes([byte]) + b"\x00" * 30)
    err = _err(ei, UnknownMessageType, 0)
    assert f"0x{byte:02x}" in err.reason


@pytest.mark.parametrize("byte", sorted(set(range(256)) - {ord(c) for c in "ndmp"}))
def test_unknown_base_backup_type(byte):
    with pytest.raises(UnknownMessageType) as ei:
        parse_base_backup_copy_data(bytes([byte]) + b"\x00" * 30)
    _err(ei, UnknownMessageType, 0)


def test_unknown_client_type():
    with pytest.raises(UnknownMessageType) as ei:
        parse_client_copy_data(b"z" + b"\x00" * 40)
    _err(ei, UnknownMessageType, 0)


def test_direction_mismatch_is_unexpected():
    with pytest.raises(UnexpectedMessage) as ei:
        parse_copy_data(build_standby_status_update(1, 1, 1))
    _err(ei, UnexpectedMessage, 0)
    with pytest.raises(UnexpectedMessage):
        parse_copy_data(build_hot_standby_feedback())
    with pytest.raises(UnexpectedMessage):
        parse_client_copy_data(build_xlog_data(1, 1, b""))
    with pytest.raises(UnexpectedMessage):
        parse_client_copy_data(build_primary_keepalive(1))


@pytest.mark.parametrize("flag", [2, 0x80, 0xFF])
def test_reply_flag_must_be_0_or_1(flag):
    frame = build_primary_keepalive(1, send_time_us=0)[:-1] + bytes([flag])
    with pytest.raises(InvalidFieldValue) as ei:
        parse_copy_data(frame)
    _err(ei, InvalidFieldValue, 17)
    frame = build_standby_status_update(1, 1, 1, send_time_us=0)[:-1] + bytes([flag])
    with pytest.raises(InvalidFieldValue) as ei:
        parse_client_copy_data(frame)
    _err(ei, InvalidFieldValue, 33)


@pytest.mark.parametrize("us", [MAX_PG_US + 1, MIN_PG_US - 1, (1 << 63) - 1, -(1 << 63)])
def test_unrepresentable_send_time(us):
    with pytest.raises(InvalidFieldValue) as ei:
        parse_copy_data(b"w" + q(1) + q(2) + sq(us) + b"data")
    _err(ei, InvalidFieldValue, 17, "XLogData")
    with pytest.raises(InvalidFieldValue) as ei:
        parse_copy_data(b"k" + q(1) + sq(us) + b"\x00")
    _err(ei, InvalidFieldValue, 9)
    with pytest.raises(InvalidFieldValue) as ei:
        parse_client_copy_data(b"h" + sq(us) + b"\x00" * 16)
    _err(ei, InvalidFieldValue, 1)


def test_bad_base_backup_fields():
    with pytest.raises(InvalidFieldValue) as ei:
        parse_base_backup_copy_data(b"p" + sq(-1))
    _err(ei, InvalidFieldValue, 1)
    with pytest.raises(InvalidFieldValue) as ei:
        parse_base_backup_copy_data(b"n\x00\x00")
    _err(ei, InvalidFieldValue, 1)
    with pytest.raises(InvalidFieldValue) as ei:
        parse_base_backup_copy_data(b"nbase.tar\x00\xff\xfe\x00")
    _err(ei, InvalidFieldValue, 10)


def test_errors_are_pgcdc_value_errors_and_pickle():
    with pytest.raises(ProtocolError) as ei:
        parse_copy_data(b"w\x00")
    err = ei.value
    assert isinstance(err, PgcdcError) and isinstance(err, ValueError)
    assert "replication" in str(err) and "at byte 1" in str(err)
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is TruncatedMessage
    assert (clone.protocol, clone.message_type, clone.offset) == (
        err.protocol,
        err.message_type,
        err.offset,
    )


def test_non_buffer_input_is_a_type_error():
    with pytest.raises(TypeError):
        parse_copy_data("w")  # type: ignore[arg-type]


# -- builder argument checks ------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda: build_standby_status_update(-1, 0, 0),
        lambda: build_standby_status_update(0, 1 << 64, 0),
        lambda: build_standby_status_update(0, 0, "nope"),
        lambda: build_standby_status_update(0, 0, 0, send_time_us=MAX_PG_US + 1),
        lambda: build_standby_status_update(0, 0, 0, send_time_us=1.5),
        lambda: build_standby_status_update(0, 0, 0, send_time_us=True),
        lambda: build_hot_standby_feedback(xmin=-1),
        lambda: build_hot_standby_feedback(catalog_xmin=1 << 32),
        lambda: build_hot_standby_feedback(xmin_epoch=True),
        lambda: build_xlog_data(-5, 0, b""),
        lambda: build_primary_keepalive(1 << 64),
        lambda: build_new_archive(""),
        lambda: build_new_archive("a\x00b"),
        lambda: build_new_archive("base.tar", "/x\x00"),
        lambda: build_progress(-1),
        lambda: build_progress(1 << 63),
        lambda: build_progress(2.0),
    ],
)
def test_builders_refuse_values_that_do_not_fit(call):
    with pytest.raises(FrameBuildError) as ei:
        call()
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, PgcdcError)


def test_builders_accept_lsn_text():
    data = build_standby_status_update("1/0", "1/0", "0/0", send_time_us=0)
    assert parse_client_copy_data(data).write == LSN.parse("1/0")
