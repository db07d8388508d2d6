"""Property tests of the pgoutput decoder: random messages round-trip through the
encoder, and truncated / flipped / spliced bytes raise only ProtocolError subclasses
(never IndexError, struct.error, UnicodeDecodeError, OverflowError, never a hang).
The optimistic fast paths are checked against the careful ones byte for byte."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_pgcdc.errors import ProtocolError
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.pgoutput import (
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
)
from airflow_pgcdc.protocol.pgoutput import wire as pgo

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

texts = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12
)
ascii_texts = st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=12)
lsns = st.integers(0, 2**64 - 1).map(LSN)
times = st.datetimes(
    min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31), timezones=st.just(UTC)
)
u8 = st.integers(0, 255)
u32 = st.integers(0, 2**32 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
values = st.one_of(
    st.none(),
    st.just(UNCHANGED_TOAST),
    texts,
    ascii_texts,
    st.binary(max_size=12),
)
tuples = st.lists(values, max_size=8).map(tuple)
columns = st.builds(RelationColumn, u8, texts, u32, i32)

DATA_CLASSES = (LogicalMessage, Relation, Type, Insert, Update, Delete, Truncate)


def data_message(xid):
    """Strategies for the change messages, with the given xid (None outside a stream)."""
    x = st.just(xid)
    return st.one_of(
        st.builds(LogicalMessage, x, st.integers(0, 1), lsns, texts, st.binary(max_size=16)),
        st.builds(
            Relation,
            x,
            u32,
            texts,
            texts,
            st.sampled_from("dnfi"),
            st.lists(columns, max_size=5).map(tuple),
        ),
        st.builds(Type, x, u32, texts, texts),
        st.builds(Insert, x, u32, tuples),
        st.one_of(
            st.builds(Update, x, u32, st.none(), st.none(), tuples),
            st.builds(Update, x, u32, tuples, st.none(), tuples),
            st.builds(Update, x, u32, st.none(), tuples, tuples),
        ),
        st.one_of(
            st.builds(Delete, x, u32, tuples, st.none()),
            st.builds(Delete, x, u32, st.none(), tuples),
        ),
        st.builds(Truncate, x, u8, st.lists(u32, max_size=6).map(tuple)),
    )


def control_message(version: int, parallel: bool):
    """Messages that arrive outside a stream block (besides the change messages)."""
    options = [
        st.builds(Begin, lsns, times, u32),
        st.builds(Commit, st.just(0), lsns, lsns, times),
        st.builds(Origin, lsns, texts),
    ]
    if version >= 2:
        abort = st.builds(StreamAbort, u32, u32)
        if parallel:
            abort = st.one_of(abort, st.builds(StreamAbort, u32, u32, lsns, times))
        options += [
            st.builds(StreamCommit, u32, st.just(0), lsns, lsns, times),
            abort,
        ]
    if version >= 3:
        zero = st.just(0)
        options += [
            st.builds(BeginPrepare, lsns, lsns, times, u32, texts),
            st.builds(Prepare, zero, lsns, lsns, times, u32, texts),
            st.builds(CommitPrepared, zero, lsns, lsns, times, u32, texts),
            st.builds(RollbackPrepared, zero, lsns, lsns, times, times, u32, texts),
            st.builds(StreamPrepare, zero, lsns, lsns, times, u32, texts),
        ]
    return st.one_of(options)


@st.composite
def situations(draw):
    """(decoder settings, in_stream, message) for any message valid in that situation."""
    version = draw(st.integers(1, 4))
    parallel = version == 4 and draw(st.booleans())
    in_stream = version >= 2 and draw(st.booleans())
    if in_stream:
        msg = draw(
            st.one_of(
                data_message(draw(u32)),
                st.builds(Origin, lsns, texts),
                st.just(StreamStop()),
            )
        )
    else:
        options = [data_message(None), control_message(version, parallel)]
        if version >= 2:
            options.append(st.builds(StreamStart, u32, st.booleans()))
        msg = draw(st.one_of(options))
    return version, parallel, in_stream, msg


def make_decoder(version: int, parallel: bool, in_stream: bool) -> PgoutputDecoder:
    d = PgoutputDecoder(version, parallel_streaming=parallel)
    if in_stream:
        d.decode(encode_message(StreamStart(1, True), version))
    return d


def check_error(err: ProtocolError, data: bytes) -> None:
    assert err.protocol == "pgoutput"
    assert isinstance(err.offset, int) and 0 <= err.offset <= len(data), (err, len(data))
    str(err)


def decode_or_protocol_error(decoder: PgoutputDecoder, data: bytes) -> Message | None:
    try:
        msg = decoder.decode(data)
    except ProtocolError as err:
        check_error(err, data)
        return None
    json.dumps(msg.to_dict())
    return msg


@FUZZ
@given(situations())
def test_round_trip(case):
    version, parallel, in_stream, msg = case
    raw = encode_message(msg, version, parallel_streaming=parallel)
    decoder = make_decoder(version, parallel, in_stream)
    got = decoder.decode(raw)
    assert got == msg
    assert type(got) is type(msg)
    assert encode_message(got, version, parallel_streaming=parallel) == raw
    d = got.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert decoder.in_stream == (
        (in_stream and not isinstance(msg, StreamStop)) or isinstance(msg, StreamStart)
    )


@settings(FUZZ, max_examples=100)
@given(st.integers(2, 4), st.data())
def test_streamed_transaction_sequences(version, data):
    """A whole stream: plain transactions and stream blocks, one decoder throughout."""
    decoder = PgoutputDecoder(version)
    for _ in range(data.draw(st.integers(1, 6))):
        if data.draw(st.booleans()):
            xid = data.draw(u32)
            seq = [StreamStart(xid, data.draw(st.booleans()))]
            seq += data.draw(st.lists(data_message(xid), max_size=4))
            seq.append(StreamStop())
            seq.append(
                data.draw(
                    st.sampled_from(
                        [StreamCommit(xid, 0, LSN(1), LSN(2), datetime(2020, 1, 1, tzinfo=UTC))]
                        + [StreamAbort(xid, xid)]
                    )
                )
            )
        else:
            seq = [Begin(LSN(5), datetime(2020, 1, 1, tzinfo=UTC), 9)]
            seq += data.draw(st.lists(data_message(None), max_size=4))
            seq.append(Commit(0, LSN(4), LSN(5), datetime(2020, 1, 1, tzinfo=UTC)))
        for msg in seq:
            assert decoder.decode(encode_message(msg, version)) == msg
    assert not decoder.in_stream


@st.composite
def mutated(draw):
    version, parallel, in_stream, msg = draw(situations())
    raw = bytearray(encode_message(msg, version, parallel_streaming=parallel))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["truncate", "flip", "set", "insert", "delete", "append"]))
        if op == "truncate":
            del raw[draw(st.integers(0, len(raw))) :]
        elif op in ("flip", "set") and raw:
            i = draw(st.integers(0, len(raw) - 1))
            if op == "flip":
                raw[i] ^= 1 << draw(st.integers(0, 7))
            else:
                raw[i] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF, *b"nutbNKO"]))
        elif op == "insert":
            i = draw(st.integers(0, len(raw)))
            raw[i:i] = draw(st.binary(min_size=1, max_size=5))
        elif op == "delete" and raw:
            i = draw(st.integers(0, len(raw) - 1))
            del raw[i : i + draw(st.integers(1, 5))]
        elif op == "append":
            raw += draw(st.binary(min_size=1, max_size=5))
    return version, parallel, in_stream, bytes(raw)


@FUZZ
@given(mutated())
def test_mutations_raise_only_protocol_errors(case):
    version, parallel, in_stream, raw = case
    decode_or_protocol_error(make_decoder(version, parallel, in_stream), raw)


@FUZZ
@given(
    st.integers(1, 4),
    st.booleans(),
    st.binary(max_size=1).flatmap(
        lambda head: st.binary(max_size=64).map(lambda rest: head + rest)
    ),
    st.sampled_from(b"BMCORYIUDTSEcAbPKrp"),
)
def test_random_bytes_raise_only_protocol_errors(version, in_stream, raw, tag):
    in_stream = in_stream and version >= 2
    for data in (raw, bytes([tag]) + raw):
        decode_or_protocol_error(make_decoder(version, False, in_stream), data)


@FUZZ
@given(st.binary(max_size=40))
def test_huge_counts_and_lengths(tail):
    """Maximal counts and lengths followed by little data fail fast, allocate nothing."""
    d = PgoutputDecoder(1)
    for head in (
        b"T" + b"\x7f\xff\xff\xff\x00",
        b"I" + b"\x00\x00\x00\x01N" + b"\x7f\xff",
        b"I" + b"\x00\x00\x00\x01N" + b"\x00\x01t\x7f\xff\xff\xff",
        b"R" + b"\x00\x00\x00\x01\x00\x00d\x7f\xff",
        b"M\x00" + b"\x00" * 8 + b"\x00\x7f\xff\xff\xff",
    ):
        decode_or_protocol_error(d, head + tail)


# ---------------------------------------------------------------------------------------
# Fast paths == careful paths
# ---------------------------------------------------------------------------------------
def outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except ProtocolError as err:
        return (type(err), err.offset, err.reason)


@st.composite
def tuple_bytes(draw):
    raw = bytearray(encode_tuple(draw(tuples)))
    if draw(st.booleans()) and raw:
        i = draw(st.integers(0, len(raw) - 1))
        raw[i] = draw(st.sampled_from([0x00, 0x01, 0x80, 0xFF, *b"nutbx"]))
    if draw(st.booleans()):
        del raw[draw(st.integers(0, len(raw))) :]
    return bytes(raw)


@FUZZ
@given(tuple_bytes(), st.sampled_from(["utf-8", "latin-1", "utf-16-le"]))
def test_fast_tuple_path_matches_checked_path(raw, encoding):
    ascii_ok = pgo._ascii_compatible(encoding)
    head = b"I\x00\x00\x00\x01N"
    data = head + raw
    fast = outcome(pgo._read_tuple, data, len(head), encoding, "x", ascii_ok)
    checked = outcome(pgo._read_tuple_checked, data, len(head), encoding, "x")
    assert fast == checked


@FUZZ
@given(tuple_bytes(), u32, st.binary(max_size=2))
def test_fast_insert_path_matches_general_path(raw, oid, tail):
    d = PgoutputDecoder(1)
    data = b"I" + oid.to_bytes(4, "big") + b"N" + raw + tail
    assert outcome(d._insert, data) == outcome(d._insert_general, data)


@FUZZ
@given(tuple_bytes(), u32, u32, st.binary(max_size=2))
def test_fast_insert_path_in_a_stream_block_matches_general_path(raw, xid, oid, tail):
    d = make_decoder(2, False, True)
    data = b"I" + xid.to_bytes(4, "big") + oid.to_bytes(4, "big") + b"N" + raw + tail
    assert outcome(d._insert, data) == outcome(d._insert_general, data)


@FUZZ
@given(tuples)
def test_tuple_values_survive_every_path(values):
    raw = encode_tuple(values)
    plain = PgoutputDecoder(2).decode(b"I\x00\x00\x40\x00N" + raw)
    high_oid = PgoutputDecoder(2).decode(b"I\x80\x00\x40\x00N" + raw)
    streamed = make_decoder(2, False, True).decode(b"I\x00\x00\x00\x07\x00\x00\x40\x00N" + raw)
    assert plain.new == high_oid.new == streamed.new == values
    for got, want in zip(plain.new, values, strict=True):
        assert type(got) is type(want)
