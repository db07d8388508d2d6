"""Property tests of the pglogical decoder: round trips, and malformed bytes raise
only ProtocolError subclasses (never IndexError, struct.error, UnicodeDecodeError,
never a hang)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_pgcdc.errors import ProtocolError
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.pglogical import (
    NULL_FIELD,
    UNCHANGED_FIELD,
    Begin,
    Column,
    Commit,
    Delete,
    Insert,
    Origin,
    PglogicalDecoder,
    PglogicalMessage,
    Relation,
    Startup,
    TupleField,
    Update,
    encode_message,
    encode_relation,
)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

STARTUP = Startup(
    params={
        "max_proto_version": "1",
        "min_proto_version": "1",
        "encoding": "UTF8",
        "forward_changeset_origins": "t",
        "binary.internal_basetypes": "t",
        "binary.binary_basetypes": "t",
    }
)

texts = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=12,
)
names = texts.filter(lambda s: len(s.encode()) <= 254)
lsns = st.integers(1, 2**64 - 1).map(LSN)
times = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
)
u8 = st.integers(0, 255)


def fields(n: int):
    field = st.one_of(
        st.just(NULL_FIELD),
        st.just(UNCHANGED_FIELD),
        texts.map(lambda s: TupleField("t", s)),
        st.binary(max_size=12).map(lambda b: TupleField("i", b)),
        st.binary(max_size=12).map(lambda b: TupleField("b", b)),
    )
    return st.lists(field, min_size=n, max_size=n)


@st.composite
def relations(draw, relid=None):
    cols = draw(st.lists(names, max_size=5, unique=True))
    return Relation(
        relidentifier=draw(st.integers(0, 2**32 - 1)) if relid is None else relid,
        nspname=draw(names),
        relname=draw(names),
        columns=[Column(colname=c, flags=draw(st.sampled_from([0, 1]))) for c in cols],
    )


@st.composite
def rows(draw, rel: Relation):
    n = len(rel.columns)
    kind = draw(st.sampled_from(["I", "U", "UK", "UO", "DK", "DO"]))
    relid = rel.relidentifier
    if kind == "I":
        return Insert(relidentifier=relid, new_tuple=draw(fields(n)))
    if kind == "U":
        return Update(relidentifier=relid, new_tuple=draw(fields(n)))
    if kind[0] == "U":
        return Update(
            relidentifier=relid,
            old_tuple_type=kind[1],
            old_tuple=draw(fields(n)),
            new_tuple=draw(fields(n)),
        )
    return Delete(relidentifier=relid, old_tuple_type=kind[1], old_tuple=draw(fields(n)))


@st.composite
def streams(draw) -> list[PglogicalMessage]:
    """A valid stream: startup, then transactions with relations and rows."""
    out: list[PglogicalMessage] = [STARTUP]
    for _ in range(draw(st.integers(1, 3))):
        lsn, t = draw(lsns), draw(times)
        out.append(Begin(final_lsn=lsn, commit_time=t, xid=draw(st.integers(0, 2**32 - 1))))
        if draw(st.booleans()):
            out.append(Origin(origin_lsn=draw(lsns), origin_identifier=draw(names)))
        for _ in range(draw(st.integers(0, 3))):
            rel = draw(relations())
            out.append(rel)
            out.extend(draw(st.lists(rows(rel), max_size=3)))
        end = LSN(min(int(lsn) + draw(st.integers(0, 1000)), 2**64 - 1))
        out.append(Commit(commit_lsn=lsn, end_lsn=end, commit_time=t))
    return out


def feed(chunks: list[bytes]) -> None:
    """Decode every chunk with one decoder: each either decodes or raises ProtocolError."""
    d = PglogicalDecoder()
    for chunk in chunks:
        try:
            msg = d.decode(chunk)
        except ProtocolError as err:
            assert err.protocol == "pglogical"
            assert err.offset is None or 0 <= err.offset <= len(chunk)
        else:
            assert isinstance(msg, PglogicalMessage)
            json.dumps(msg.to_dict())


@FUZZ
@given(streams())
def test_round_trip(stream):
    d = PglogicalDecoder()
    decoded = [d.decode(encode_message(m)) for m in stream]
    assert decoded == stream
    json.dumps([m.to_dict() for m in decoded])
    assert not d.in_transaction


@FUZZ
@given(
    relations(),
    st.dictionaries(
        st.integers(0, 4),
        st.lists(
            st.tuples(st.sampled_from("ABDNTXYZ\x00\xff"), st.binary(max_size=40)), max_size=3
        ),
    ),
)
def test_unknown_column_blocks_are_skipped(rel, blocks):
    blocks = {i: [b for b in bl if b[0] != "N"] for i, bl in blocks.items() if i < len(rel.columns)}
    d = PglogicalDecoder()
    d.decode(encode_message(STARTUP))
    assert d.decode(encode_relation(rel, extra_blocks=blocks)) == rel


@FUZZ
@given(streams(), st.data())
def test_truncation_raises_protocol_error_only(stream, data):
    chunks = [encode_message(m) for m in stream]
    i = data.draw(st.integers(0, len(chunks) - 1))
    cut = data.draw(st.integers(0, len(chunks[i])))
    chunks[i] = chunks[i][:cut]
    feed(chunks)


@FUZZ
@given(streams(), st.data())
def test_byte_flips_raise_protocol_error_only(stream, data):
    chunks = [encode_message(m) for m in stream]
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(chunks) - 1))
        if not chunks[i]:
            continue
        buf = bytearray(chunks[i])
        op = data.draw(st.sampled_from(["flip", "set", "insert", "delete"]))
        pos = data.draw(st.integers(0, len(buf) - 1))
        if op == "flip":
            buf[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "set":
            buf[pos] = data.draw(st.sampled_from([0x00, 0xFF, 0x7F, 0x80, 0x43, 0x4E, 0x54]))
        elif op == "insert":
            buf[pos:pos] = data.draw(st.binary(min_size=1, max_size=4))
        else:
            del buf[pos : pos + data.draw(st.integers(1, 4))]
        chunks[i] = bytes(buf)
    feed(chunks)


@FUZZ
@given(st.lists(st.binary(max_size=64), max_size=6), st.sampled_from("SBCORIUD"))
def test_random_payloads_after_a_valid_prefix(payloads, tag):
    rel = Relation(
        relidentifier=0x43434343,
        nspname="s",
        relname="t",
        columns=[Column(colname="a"), Column(colname="b")],
    )
    prefix = [
        encode_message(STARTUP),
        encode_message(
            Begin(final_lsn=LSN(1), commit_time=datetime(2020, 1, 1, tzinfo=UTC), xid=1)
        ),
        encode_message(rel),
    ]
    feed(prefix + [tag.encode() + p for p in payloads])
    feed([tag.encode() + p for p in payloads])
