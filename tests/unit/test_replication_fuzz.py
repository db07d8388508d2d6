"""Property tests: random bytes and rows never escape as anything but ProtocolError."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from airflow_pgcdc.errors import ProtocolError, TrailingBytes, TruncatedMessage
from airflow_pgcdc.protocol import results
from airflow_pgcdc.protocol.frames import (
    MAX_PG_US,
    MIN_PG_US,
    ArchiveData,
    HotStandbyFeedback,
    ManifestStart,
    NewArchive,
    PrimaryKeepalive,
    Progress,
    StandbyStatusUpdate,
    XLogData,
    parse_base_backup_copy_data,
    parse_client_copy_data,
    parse_copy_data,
)
from airflow_pgcdc.protocol.lsn import LSN

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

PARSERS = {
    "server": parse_copy_data,
    "client": parse_client_copy_data,
    "base_backup": parse_base_backup_copy_data,
}

lsns = st.integers(0, (1 << 64) - 1).map(LSN)
times = st.integers(MIN_PG_US, MAX_PG_US)
u32 = st.integers(0, (1 << 32) - 1)
payloads = st.binary(max_size=200)
cstrings = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40
)

server_frames = st.one_of(
    st.builds(XLogData, lsns, lsns, times, payloads),
    st.builds(PrimaryKeepalive, lsns, times, st.booleans()),
)
client_frames = st.one_of(
    st.builds(StandbyStatusUpdate, lsns, lsns, lsns, times, st.booleans()),
    st.builds(HotStandbyFeedback, times, u32, u32, u32, u32),
)
backup_frames = st.one_of(
    st.builds(NewArchive, cstrings.filter(bool), cstrings),
    st.just(ManifestStart()),
    st.builds(ArchiveData, payloads),
    st.builds(Progress, st.integers(0, (1 << 63) - 1)),
)
FRAMES = {"server": server_frames, "client": client_frames, "base_backup": backup_frames}
# Frames whose last field has a fixed size: any shorter prefix is truncated.
FIXED_SIZE = (PrimaryKeepalive, StandbyStatusUpdate, HotStandbyFeedback, Progress)


def _only_protocol_errors(parse, data: bytes):
    try:
        frame = parse(data)
    except ProtocolError as err:
        assert err.protocol == "replication"
        assert err.offset is None or 0 <= err.offset <= len(data)
        return None
    json.dumps(frame.to_dict())
    return frame


# -- random bytes -------------------------------------------------------------------------


@FUZZ
@given(kind=st.sampled_from(sorted(PARSERS)), data=st.binary(max_size=64))
@example(kind="server", data=b"w")
@example(kind="server", data=b"k" + b"\xff" * 17)
@example(kind="client", data=b"h" + b"\x7f" * 24)
@example(kind="base_backup", data=b"n\xff\x00\x00")
def test_random_bytes_raise_only_protocol_errors(kind, data):
    parse = PARSERS[kind]
    frame = _only_protocol_errors(parse, data)
    if frame is not None:
        # whatever parses re-serialises to the same bytes
        assert frame.to_bytes() == data
    _only_protocol_errors(parse, memoryview(data))


@FUZZ
@given(
    kind=st.sampled_from(sorted(PARSERS)),
    type_byte=st.sampled_from(b"wkrhndmp"),
    body=st.binary(max_size=48),
)
def test_known_type_bytes_with_random_bodies(kind, type_byte, body):
    data = bytes([type_byte]) + body
    frame = _only_protocol_errors(PARSERS[kind], data)
    if frame is not None:
        assert frame.to_bytes() == data


# -- valid frames, truncated and extended -------------------------------------------------


@FUZZ
@given(data=st.data(), kind=st.sampled_from(sorted(FRAMES)))
def test_valid_frames_round_trip(data, kind):
    frame = data.draw(FRAMES[kind])
    wire = frame.to_bytes()
    parsed = PARSERS[kind](wire)
    assert parsed == frame
    assert parsed.to_bytes() == wire
    assert PARSERS[kind](memoryview(wire)) == frame
    json.dumps(parsed.to_dict())


@FUZZ
@given(data=st.data(), kind=st.sampled_from(sorted(FRAMES)))
def test_truncated_frames_raise_protocol_errors(data, kind):
    frame = data.draw(FRAMES[kind])
    wire = frame.to_bytes()
    assume(len(wire) > 1)
    cut = data.draw(st.integers(0, len(wire) - 1))
    prefix = wire[:cut]
    parse = PARSERS[kind]
    if isinstance(frame, FIXED_SIZE) or cut == 0 or (isinstance(frame, XLogData) and cut < 25):
        try:
            parse(prefix)
        except TruncatedMessage as err:
            assert err.offset is not None and err.offset <= cut
        else:
            raise AssertionError(f"{prefix!r} parsed")
    else:
        _only_protocol_errors(parse, prefix)


@FUZZ
@given(
    data=st.data(), kind=st.sampled_from(sorted(FRAMES)), extra=st.binary(min_size=1, max_size=16)
)
def test_extended_fixed_frames_raise_trailing_bytes(data, kind, extra):
    frame = data.draw(FRAMES[kind])
    assume(isinstance(frame, (*FIXED_SIZE, ManifestStart)))
    wire = frame.to_bytes()
    try:
        PARSERS[kind](wire + extra)
    except TrailingBytes as err:
        assert err.offset == len(wire)
    else:
        raise AssertionError("trailing bytes accepted")


@FUZZ
@given(frame=server_frames, flip=st.integers(0, 10_000), bit=st.integers(0, 7))
def test_bit_flips_in_server_frames(frame, flip, bit):
    wire = bytearray(frame.to_bytes())
    wire[flip % len(wire)] ^= 1 << bit
    _only_protocol_errors(parse_copy_data, bytes(wire))


# -- result rows --------------------------------------------------------------------------

ROW_PARSERS = [
    results.parse_identify_system,
    results.parse_show,
    results.parse_replication_slot_created,
    results.parse_read_replication_slot,
    results.parse_timeline_history,
    results.parse_timeline_switch,
    results.parse_base_backup_position,
    results.parse_base_backup_tablespace,
]

cells = st.one_of(
    st.none(),
    st.text(max_size=24),
    st.binary(max_size=24),
    st.from_regex(r"[0-9A-F]{1,8}/[0-9A-F]{1,8}", fullmatch=True),
    st.integers(-(1 << 70), 1 << 70).map(str),
)


@FUZZ
@given(parse=st.sampled_from(ROW_PARSERS), row=st.lists(cells, max_size=5))
def test_random_rows_raise_only_protocol_errors(parse, row):
    try:
        result = parse(row)
    except ProtocolError as err:
        assert err.protocol == "replication"
        return
    if not isinstance(result, str):
        json.dumps(result.to_dict())


@FUZZ
@given(content=st.binary(max_size=200))
def test_random_timeline_history_content(content):
    history = results.parse_timeline_history(["00000002.history", content])
    try:
        entries = history.entries()
    except ProtocolError:
        return
    for e in entries:
        assert isinstance(e.switchpoint, LSN)
