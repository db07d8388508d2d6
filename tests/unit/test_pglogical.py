"""pglogical_output native protocol: decoder, encoders, start options (pure code)."""

from __future__ import annotations

import json
import struct
from datetime import UTC, datetime

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
    Relation,
    Startup,
    TupleField,
    Update,
    binary_compat_params_for_server,
    encode_message,
    encode_relation,
    format_plugin_options,
    pglogical_start_options,
)
from airflow_pgcdc.protocol.pgtime import datetime_to_pg_us

# What pglogical 2.4.2 on PostgreSQL 15 (x86_64) sends, in its order.
REAL_STARTUP_PARAMS = {
    "max_proto_version": "1",
    "min_proto_version": "1",
    "coltypes": "f",
    "pg_version_num": "150004",
    "pg_version": "15.4",
    "pg_catversion": "202209061",
    "database_encoding": "UTF8",
    "encoding": "UTF8",
    "forward_changeset_origins": "t",
    "walsender_pid": "4242",
    "pglogical_version": "2.4.2",
    "pglogical_version_num": "20402",
    "binary.internal_basetypes": "f",
    "binary.binary_basetypes": "f",
    "binary.basetypes_major_version": "1500",
    "binary.sizeof_int": "4",
    "binary.sizeof_long": "8",
    "binary.sizeof_datum": "8",
    "binary.maxalign": "8",
    "binary.bigendian": "f",
    "binary.float4_byval": "t",
    "binary.float8_byval": "t",
    "binary.integer_datetimes": "t",
    "binary.binary_pg_version": "1500",
    "no_txinfo": "f",
}

T0 = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
LSN1 = LSN.parse("16/B374D848")
RELID = 16384
REL = Relation(
    relidentifier=RELID,
    nspname="public",
    relname="items",
    columns=[Column(colname="id", flags=1), Column(colname="name"), Column(colname="doc")],
)


def startup_bytes(**overrides: str | None) -> bytes:
    params = dict(REAL_STARTUP_PARAMS)
    for k, v in overrides.items():
        key = k.replace("__", ".")
        if v is None:
            params.pop(key, None)
        else:
            params[key] = v
    return encode_message(Startup(params=params))


def make_decoder(*, begin: bool = False, relation: bool = False, **overrides) -> PglogicalDecoder:
    d = PglogicalDecoder()
    d.decode(startup_bytes(**overrides))
    if begin:
        d.decode(encode_message(Begin(final_lsn=LSN1, commit_time=T0, xid=900)))
    if relation:
        d.decode(encode_message(REL))
    return d


def raises(exc: type[ProtocolError], decoder: PglogicalDecoder, data: bytes) -> ProtocolError:
    with pytest.raises(exc) as info:
        decoder.decode(data)
    err = info.value
    assert err.protocol == "pglogical"
    return err


def t(value: str) -> TupleField:
    return TupleField("t", value)


# -- startup ------------------------------------------------------------------------------


def test_startup_as_the_real_plugin_sends_it():
    d = PglogicalDecoder()
    msg = d.decode(startup_bytes())
    assert isinstance(msg, Startup) and msg.type == "startup"
    assert msg.startup_message_version == 1
    assert msg.params == REAL_STARTUP_PARAMS
    assert list(msg.params) == list(REAL_STARTUP_PARAMS)  # wire order kept
    assert msg.max_proto_version == 1 and msg.min_proto_version == 1
    assert msg.coltypes is False
    assert msg.pg_version_num == 150004 and msg.pg_version == "15.4"
    assert msg.pg_catversion == 202209061
    assert msg.encoding == "UTF8" and msg.database_encoding == "UTF8"
    assert msg.forward_changeset_origins is True
    assert msg.forward_changesets is None  # not sent by 2.x
    assert msg.walsender_pid == 4242
    assert msg.pglogical_version == "2.4.2" and msg.pglogical_version_num == 20402
    assert msg.binary_internal_basetypes is False and msg.binary_binary_basetypes is False
    assert msg.binary_basetypes_major_version == 1500
    assert msg.binary_binary_pg_version == 1500
    assert (msg.binary_sizeof_int, msg.binary_sizeof_long, msg.binary_sizeof_datum) == (4, 8, 8)
    assert msg.binary_maxalign == 8
    assert msg.binary_bigendian is False
    assert msg.binary_float4_byval and msg.binary_float8_byval and msg.binary_integer_datetimes
    assert msg.no_txinfo is False
    assert msg.proto_format is None
    assert d.startup is msg
    assert json.loads(json.dumps(msg.to_dict())) == {
        "type": "startup",
        "startup_message_version": 1,
        "params": REAL_STARTUP_PARAMS,
    }


def test_startup_hand_written_bytes():
    data = b"S\x01max_proto_version\x001\x00min_proto_version\x001\x00x\x00\x00"
    msg = PglogicalDecoder().decode(data)
    assert msg.params == {"max_proto_version": "1", "min_proto_version": "1", "x": ""}


def test_startup_without_parameters_is_accepted():
    assert PglogicalDecoder().decode(b"S\x01").params == {}


def test_startup_version_must_be_1():
    err = raises(InvalidFieldValue, PglogicalDecoder(), b"S\x02")
    assert err.offset == 1 and err.message_type == "STARTUP ('S')"


def test_startup_key_without_value_is_truncated():
    raises(TruncatedMessage, PglogicalDecoder(), b"S\x01key\x00")
    raises(TruncatedMessage, PglogicalDecoder(), b"S\x01key\x00val")
    raises(TruncatedMessage, PglogicalDecoder(), b"S\x01key")
    raises(TruncatedMessage, PglogicalDecoder(), b"S")


def test_startup_duplicate_key():
    err = raises(InvalidFieldValue, PglogicalDecoder(), b"S\x01a\x001\x00a\x002\x00")
    assert err.offset == 6


@pytest.mark.parametrize(
    ("key", "value"),
    [("binary.bigendian", "maybe"), ("max_proto_version", "one"), ("walsender_pid", "")],
)
def test_startup_well_known_value_must_parse(key, value):
    data = startup_bytes(**{key.replace(".", "__"): value})
    err = raises(InvalidFieldValue, PglogicalDecoder(), data)
    assert data[err.offset :].startswith(value.encode() + b"\x00")
    assert key in err.reason


def test_startup_protocol_range_must_include_1():
    raises(
        InvalidFieldValue,
        PglogicalDecoder(),
        startup_bytes(min_proto_version="2", max_proto_version="3"),
    )
    raises(InvalidFieldValue, PglogicalDecoder(), startup_bytes(max_proto_version="0"))


def test_startup_json_proto_format_is_refused():
    raises(InvalidFieldValue, PglogicalDecoder(), startup_bytes(proto_format="json"))
    assert PglogicalDecoder().decode(startup_bytes(proto_format="native")).proto_format == "native"


def test_startup_invalid_utf8():
    raises(InvalidFieldValue, PglogicalDecoder(), b"S\x01k\xff\x00v\x00")


def test_startup_must_come_first_and_once():
    d = PglogicalDecoder()
    for data in (
        encode_message(Begin(final_lsn=LSN1, commit_time=T0, xid=1)),
        encode_message(REL),
        b"C" + bytes(25),
    ):
        err = raises(UnexpectedMessage, d, data)
        assert err.offset == 0
    d.decode(startup_bytes())
    err = raises(UnexpectedMessage, d, startup_bytes())
    assert err.message_type == "STARTUP ('S')"


def test_empty_and_unknown_messages():
    d = make_decoder()
    err = raises(TruncatedMessage, d, b"")
    assert err.offset == 0
    err = raises(UnknownMessageType, d, b"Z\x00")
    assert err.offset == 0 and "'Z'" in str(err)
    raises(UnknownMessageType, PglogicalDecoder(), b"\xff")


def test_decoder_rejects_unknown_encoding():
    with pytest.raises(ValueError):
        PglogicalDecoder(encoding="no-such-codec")


# -- begin / commit ---------------------------------------------------------------------------


def test_begin_commit_round_trip_and_layout():
    d = make_decoder()
    begin = Begin(final_lsn=LSN1, commit_time=T0, xid=4_000_000_000)
    data = encode_message(begin)
    assert data == b"B\x00" + struct.pack("!QqI", int(LSN1), datetime_to_pg_us(T0), 4_000_000_000)
    got = d.decode(data)
    assert got == begin and got.type == "begin"
    assert d.in_transaction and d.transaction == begin
    assert got.to_dict() == {
        "type": "begin",
        "flags": 0,
        "final_lsn": "16/B374D848",
        "commit_time": "2024-05-06T07:08:09.123456+00:00",
        "xid": 4_000_000_000,
    }
    commit = Commit(commit_lsn=LSN1, end_lsn=LSN1 + 48, commit_time=T0)
    data = encode_message(commit)
    assert data == b"C\x00" + struct.pack("!QQq", int(LSN1), int(LSN1) + 48, datetime_to_pg_us(T0))
    got = d.decode(data)
    assert got == commit and got.type == "commit"
    assert not d.in_transaction and d.transaction is None
    assert got.to_dict()["end_lsn"] == "16/B374D878"
    # and a second transaction may follow
    d.decode(encode_message(begin))


@pytest.mark.parametrize("bit", range(8))
def test_begin_reserved_flag_bits(bit):
    d = make_decoder()
    data = bytearray(encode_message(Begin(final_lsn=LSN1, commit_time=T0, xid=1)))
    data[1] = 1 << bit
    err = raises(InvalidFieldValue, d, bytes(data))
    assert err.offset == 1 and err.message_type == "BEGIN ('B')"
    assert "reserved" in err.reason
    assert not d.in_transaction


@pytest.mark.parametrize("bit", range(8))
def test_commit_reserved_flag_bits(bit):
    d = make_decoder(begin=True)
    data = bytearray(encode_message(Commit(commit_lsn=LSN1, end_lsn=LSN1 + 8, commit_time=T0)))
    data[1] = 1 << bit
    err = raises(InvalidFieldValue, d, bytes(data))
    assert err.offset == 1 and err.message_type == "COMMIT ('C')"
    assert d.in_transaction  # state unchanged by the failed message


def test_begin_truncated_at_every_length():
    data = encode_message(Begin(final_lsn=LSN1, commit_time=T0, xid=1))
    assert len(data) == 22
    for n in range(1, len(data)):
        d = make_decoder()
        err = raises(TruncatedMessage, d, data[:n])
        assert err.offset is not None and err.offset <= n
        assert not d.in_transaction


def test_begin_trailing_bytes_do_not_open_a_transaction():
    d = make_decoder()
    err = raises(
        TrailingBytes, d, encode_message(Begin(final_lsn=LSN1, commit_time=T0, xid=1)) + b"x"
    )
    assert err.offset == 22
    assert not d.in_transaction


def test_begin_zero_lsn_and_bad_time():
    d = make_decoder()
    err = raises(InvalidFieldValue, d, b"B\x00" + struct.pack("!QqI", 0, 0, 1))
    assert err.offset == 2
    err = raises(InvalidFieldValue, d, b"B\x00" + struct.pack("!QqI", 1, 2**63 - 1, 1))
    assert err.offset == 10 and err.message_type == "BEGIN ('B')"


def test_begin_inside_a_transaction():
    d = make_decoder(begin=True)
    raises(UnexpectedMessage, d, encode_message(Begin(final_lsn=LSN1 + 100, commit_time=T0, xid=2)))


def test_commit_outside_transaction_and_mismatches():
    d = make_decoder()
    raises(
        UnexpectedMessage, d, encode_message(Commit(commit_lsn=LSN1, end_lsn=LSN1, commit_time=T0))
    )
    d = make_decoder(begin=True)
    err = raises(
        InvalidFieldValue,
        d,
        encode_message(Commit(commit_lsn=LSN1 + 1, end_lsn=LSN1 + 9, commit_time=T0)),
    )
    assert err.offset == 2
    err = raises(
        InvalidFieldValue,
        d,
        encode_message(Commit(commit_lsn=LSN1, end_lsn=LSN1 - 1, commit_time=T0)),
    )
    assert err.offset == 10
    err = raises(
        TrailingBytes,
        d,
        encode_message(Commit(commit_lsn=LSN1, end_lsn=LSN1, commit_time=T0)) + b"\0",
    )
    assert err.offset == 26
    assert d.in_transaction


# -- origin -----------------------------------------------------------------------------------


def test_origin_right_after_begin():
    d = make_decoder(begin=True)
    data = encode_message(Origin(origin_lsn=LSN.parse("1/2"), origin_identifier="bdr_node1"))
    assert data == b"O\x00" + struct.pack("!QB", 0x100000002, 10) + b"bdr_node1\x00"
    msg = d.decode(data)
    assert msg == Origin(origin_lsn=LSN.parse("1/2"), origin_identifier="bdr_node1")
    assert msg.to_dict() == {
        "type": "origin",
        "flags": 0,
        "origin_lsn": "1/2",
        "origin_identifier": "bdr_node1",
    }
    # a second ORIGIN is not "immediately after BEGIN"
    err = raises(UnexpectedMessage, d, data)
    assert err.message_type == "ORIGIN ('O')" and err.offset == 0


def test_origin_anywhere_else_is_unexpected():
    data = encode_message(Origin(origin_lsn=LSN(1), origin_identifier="x"))
    raises(UnexpectedMessage, make_decoder(), data)  # outside a transaction
    raises(UnexpectedMessage, make_decoder(begin=True, relation=True), data)  # after R
    d = make_decoder(begin=True, relation=True)
    d.decode(encode_message(Insert(relidentifier=RELID, new_tuple=[t("1"), t("a"), NULL_FIELD])))
    raises(UnexpectedMessage, d, data)


def test_origin_not_announced_in_startup():
    d = make_decoder(begin=True, forward_changeset_origins="f")
    raises(UnexpectedMessage, d, encode_message(Origin(origin_lsn=LSN(1), origin_identifier="x")))
    d = make_decoder(begin=True, forward_changeset_origins=None)
    raises(UnexpectedMessage, d, encode_message(Origin(origin_lsn=LSN(1), origin_identifier="x")))


def test_origin_empty_identifier_both_ways():
    d = make_decoder(begin=True)
    assert d.decode(b"O\x00" + bytes(8) + b"\x00").origin_identifier == ""
    d = make_decoder(begin=True)
    assert d.decode(b"O\x00" + bytes(8) + b"\x01\x00").origin_identifier == ""


def test_origin_identifier_must_be_nul_terminated():
    d = make_decoder(begin=True)
    err = raises(InvalidFieldValue, d, b"O\x00" + bytes(8) + b"\x03abc")
    assert err.offset == 13
    err = raises(InvalidFieldValue, d, b"O\x00" + bytes(8) + b"\x03a\x00\x00")
    assert err.offset == 12
    raises(TruncatedMessage, d, b"O\x00" + bytes(8) + b"\x09abc\x00")


def test_origin_reserved_flags():
    d = make_decoder(begin=True)
    err = raises(InvalidFieldValue, d, b"O\x01" + bytes(8) + b"\x00")
    assert err.offset == 1


# -- relation ---------------------------------------------------------------------------------


def test_relation_hand_written_bytes_as_the_plugin_writes_them():
    data = (
        b"R\x00" + struct.pack("!I", RELID)
        + b"\x07public\x00" + b"\x06items\x00"
        + b"A\x00\x03"
        + b"C\x01" + b"N\x00\x03id\x00"
        + b"C\x00" + b"N\x00\x05name\x00"
        + b"C\x00" + b"N\x00\x04doc\x00"
    )  # fmt: skip
    assert encode_message(REL) == data
    d = make_decoder()
    rel = d.decode(data)
    assert rel == REL and rel.type == "relation"
    assert (rel.relid, rel.schema, rel.table, rel.natts) == (RELID, "public", "items", 3)
    assert rel.column_names == ("id", "name", "doc")
    assert rel.key_columns == ("id",)
    assert [c.is_key for c in rel.columns] == [True, False, False]
    assert d.relations[RELID] is rel
    assert json.loads(json.dumps(rel.to_dict())) == {
        "type": "relation",
        "flags": 0,
        "relidentifier": RELID,
        "nspname": "public",
        "relname": "items",
        "columns": [
            {"flags": 1, "colname": "id", "is_key": True},
            {"flags": 0, "colname": "name", "is_key": False},
            {"flags": 0, "colname": "doc", "is_key": False},
        ],
    }


def test_relation_unknown_blocks_are_skipped_by_length():
    d = make_decoder()
    data = encode_relation(
        REL, extra_blocks={0: [("T", b"\x00\x00\x00\x17")], 2: [("X", b""), ("Y", b"C" * 70)]}
    )
    assert d.decode(data) == REL
    # an unknown block before the name block, and one whose body holds 'C' bytes
    data = (
        b"R\x00" + struct.pack("!I", 7) + b"\x02s\x00\x02t\x00A\x00\x02"
        + b"C\x00" + b"Z\x00\x03CCC" + b"N\x00\x02a\x00"
        + b"C\x01" + b"N\x00\x01b" + b"\xee\x00\x00"
    )  # fmt: skip
    rel = d.decode(data)
    assert rel.column_names == ("a", "b") and rel.key_columns == ("b",)


def test_relation_block_length_past_the_end():
    d = make_decoder()
    data = encode_message(REL) + b"X\xff\xff"
    err = raises(TruncatedMessage, d, data)
    assert err.offset == len(data)


def test_relation_structure_errors():
    d = make_decoder()
    head = b"R\x00" + struct.pack("!I", 7) + b"\x02s\x00\x02t\x00"
    err = raises(InvalidFieldValue, d, head + b"B\x00\x00")
    assert err.offset == len(head)
    err = raises(InvalidFieldValue, d, head + b"A\x00\x01N\x00\x02a\x00")  # no 'C'
    assert err.offset == len(head) + 3
    err = raises(InvalidFieldValue, d, head + b"A\x00\x01C\x00")  # no name block
    assert "no name block" in err.reason
    err = raises(InvalidFieldValue, d, head + b"A\x00\x01C\x00N\x00\x02a\x00N\x00\x02b\x00")
    assert "two name blocks" in err.reason
    err = raises(InvalidFieldValue, d, head + b"A\x00\x02C\x00N\x00\x02a\x00C\x00N\x00\x02a\x00")
    assert "duplicate" in err.reason
    err = raises(TrailingBytes, d, head + b"A\x00\x01C\x00N\x00\x02a\x00C\x00")
    err = raises(TrailingBytes, d, head + b"A\x00\x00C\x00")
    assert err.offset == len(head) + 3
    # a bogus natts does not loop or allocate: it is checked against the bytes left
    err = raises(TruncatedMessage, d, head + b"A\xff\xff" + b"C\x00N\x00\x02a\x00")
    assert err.offset == len(head) + 1
    assert d.relations == {}


def test_relation_names_must_be_nul_terminated():
    d = make_decoder()
    err = raises(InvalidFieldValue, d, b"R\x00\x00\x00\x00\x07\x02ab\x02t\x00A\x00\x00")
    assert err.offset == 8  # where the NUL should be
    err = raises(InvalidFieldValue, d, b"R\x00\x00\x00\x00\x07\x00\x02t\x00A\x00\x00")
    assert err.offset == 7
    err = raises(InvalidFieldValue, d, b"R\x00\x00\x00\x00\x07\x02s\x00\x03\x00t\x00A\x00\x00")
    assert "NUL" in err.reason


@pytest.mark.parametrize("bit", range(8))
def test_relation_reserved_flag_bits(bit):
    data = bytearray(encode_message(REL))
    data[1] = 1 << bit
    err = raises(InvalidFieldValue, make_decoder(), bytes(data))
    assert err.offset == 1 and err.message_type == "RELATION ('R')"


def test_relation_between_and_during_transactions_and_replaced():
    d = make_decoder()
    d.decode(encode_message(REL))
    d.decode(encode_message(Begin(final_lsn=LSN1, commit_time=T0, xid=1)))
    new = Relation(
        relidentifier=RELID, nspname="public", relname="items", columns=[Column(colname="id")]
    )
    d.decode(encode_message(new))
    assert d.relations[RELID] == new
    row = d.decode(encode_message(Insert(relidentifier=RELID, new_tuple=[t("5")])))
    assert row.relation == new


def test_relation_column_names_in_another_encoding():
    d = PglogicalDecoder(encoding="latin-1")
    d.decode(startup_bytes())
    rel = Relation(
        relidentifier=1, nspname="s\xe9", relname="t\xe9", columns=[Column(colname="\xe9")]
    )
    assert d.decode(encode_message(rel, encoding="latin-1")) == rel
    # the same bytes are not UTF-8
    err = raises(InvalidFieldValue, make_decoder(), encode_message(rel, encoding="latin-1"))
    assert err.offset == 7


# -- rows -------------------------------------------------------------------------------------


def test_insert_hand_written_bytes():
    data = (
        b"I\x00" + struct.pack("!I", RELID) + b"N"
        + b"T\x00\x03"
        + b"t\x00\x00\x00\x0342\x00"
        + b"n"
        + b"t\x00\x00\x00\x01\x00"
    )  # fmt: skip
    msg = make_decoder(begin=True, relation=True).decode(data)
    assert msg == Insert(relidentifier=RELID, new_tuple=[t("42"), NULL_FIELD, t("")])
    assert msg.type == "insert" and msg.relid == RELID and msg.relation == REL
    assert encode_message(msg) == data
    assert json.loads(json.dumps(msg.to_dict())) == {
        "type": "insert",
        "flags": 0,
        "relidentifier": RELID,
        "new_tuple": [
            {"kind": "t", "value": "42"},
            {"kind": "n", "value": None},
            {"kind": "t", "value": ""},
        ],
    }


def test_text_without_terminator_is_accepted():
    d = make_decoder(begin=True, relation=True)
    data = b"I\x00" + struct.pack("!I", RELID) + b"NT\x00\x03t\x00\x00\x00\x02abnt\x00\x00\x00\x00"
    assert d.decode(data).new_tuple == (t("ab"), NULL_FIELD, t(""))


def test_text_with_inner_nul_or_bad_utf8():
    d = make_decoder(begin=True, relation=True)
    head = b"I\x00" + struct.pack("!I", RELID) + b"NT\x00\x03nn"
    err = raises(InvalidFieldValue, d, head + b"t\x00\x00\x00\x04a\x00b\x00")
    assert err.offset == len(head) + 5 + 1
    err = raises(InvalidFieldValue, d, head + b"t\x00\x00\x00\x03\xc3\x28\x00")
    assert err.offset == len(head) + 5


def test_update_with_and_without_old_tuple():
    d = make_decoder(begin=True, relation=True)
    plain = Update(relidentifier=RELID, new_tuple=[t("1"), t("b"), UNCHANGED_FIELD])
    data = encode_message(plain)
    assert data[6:7] == b"N"
    got = d.decode(data)
    assert got == plain and got.old_tuple is None and got.old_tuple_type is None
    assert got.to_dict()["new_tuple"][2] == {"kind": "u", "value": None}
    for kind in ("K", "O"):
        upd = Update(
            relidentifier=RELID,
            old_tuple_type=kind,
            old_tuple=[t("1"), NULL_FIELD, NULL_FIELD],
            new_tuple=[t("2"), t("b"), UNCHANGED_FIELD],
        )
        data = encode_message(upd)
        assert data[6:7] == kind.encode()
        got = d.decode(data)
        assert got == upd and got.type == "update"
        assert json.loads(json.dumps(got.to_dict()))["old_tuple_type"] == kind


def test_update_needs_new_tuple_after_old():
    d = make_decoder(begin=True, relation=True)
    old = b"T\x00\x03nnn"
    head = b"U\x00" + struct.pack("!I", RELID)
    err = raises(InvalidFieldValue, d, head + b"K" + old + b"K" + old)
    assert err.offset == 7 + len(old)
    err = raises(TruncatedMessage, d, head + b"K" + old)
    assert err.offset == 7 + len(old)


def test_delete_key_and_old():
    d = make_decoder(begin=True, relation=True)
    for kind in ("K", "O"):
        msg = Delete(
            relidentifier=RELID, old_tuple_type=kind, old_tuple=[t("9"), NULL_FIELD, NULL_FIELD]
        )
        data = encode_message(msg)
        assert (
            data
            == b"D\x00"
            + struct.pack("!I", RELID)
            + kind.encode()
            + b"T\x00\x03t\x00\x00\x00\x029\x00nn"
        )
        got = d.decode(data)
        assert got == msg and got.type == "delete"
    err = raises(InvalidFieldValue, d, b"D\x00" + struct.pack("!I", RELID) + b"NT\x00\x03nnn")
    assert err.offset == 6


def test_insert_with_wrong_or_unknown_tuple_type():
    d = make_decoder(begin=True, relation=True)
    head = b"I\x00" + struct.pack("!I", RELID)
    err = raises(InvalidFieldValue, d, head + b"KT\x00\x03nnn")
    assert err.offset == 6 and err.message_type == "INSERT ('I')"
    err = raises(UnknownMessageType, d, head + b"XT\x00\x03nnn")
    assert err.offset == 6
    err = raises(UnknownMessageType, d, head + b"NQ\x00\x03nnn")
    assert err.offset == 7


def test_tuple_natts_must_match_relation():
    d = make_decoder(begin=True, relation=True)
    err = raises(InvalidFieldValue, d, b"I\x00" + struct.pack("!I", RELID) + b"NT\x00\x02nn")
    assert err.offset == 8
    err = raises(InvalidFieldValue, d, b"I\x00" + struct.pack("!I", RELID) + b"NT\xff\xffnn")
    assert err.offset == 8


def test_tuple_field_errors_with_offsets():
    d = make_decoder(begin=True, relation=True)
    head = b"I\x00" + struct.pack("!I", RELID) + b"NT\x00\x03n"  # field 0 at 10
    err = raises(InvalidFieldValue, d, head + b"xnn")
    assert err.offset == 11 and "'x'" in err.reason
    err = raises(InvalidFieldValue, d, head + b"t\xff\xff\xff\xffnn")
    assert err.offset == 12 and "negative" in err.reason
    err = raises(TruncatedMessage, d, head + b"t\x00\x00")
    assert err.offset == 12
    err = raises(TruncatedMessage, d, head + b"t\x7f\xff\xff\xffab")
    assert err.offset == 16
    err = raises(TruncatedMessage, d, head + b"n")
    assert err.offset == 12
    err = raises(TrailingBytes, d, head + b"nn!")
    assert err.offset == 13


@pytest.mark.parametrize("kind", ["i", "b"])
def test_binary_fields_only_when_negotiated(kind):
    fields = [TupleField(kind, b"\x00\x00\x00\x2a"), NULL_FIELD, TupleField(kind, b"")]
    msg = Insert(relidentifier=RELID, new_tuple=fields)
    err = raises(InvalidFieldValue, make_decoder(begin=True, relation=True), encode_message(msg))
    assert err.offset == 10 and "not enabled" in err.reason
    key = "binary__internal_basetypes" if kind == "i" else "binary__binary_basetypes"
    d = make_decoder(begin=True, relation=True, **{key: "t"})
    got = d.decode(encode_message(msg))
    assert got == msg
    assert got.to_dict()["new_tuple"] == [
        {"kind": kind, "value": "AAAAKg=="},
        {"kind": "n", "value": None},
        {"kind": kind, "value": ""},
    ]


def test_rows_outside_transaction_or_unknown_relation():
    ins = encode_message(Insert(relidentifier=RELID, new_tuple=[t("1"), NULL_FIELD, NULL_FIELD]))
    d = make_decoder(relation=True)
    err = raises(UnexpectedMessage, d, ins)
    assert err.offset == 0
    d = make_decoder(begin=True)
    err = raises(UnexpectedMessage, d, ins)
    assert err.offset == 2 and str(RELID) in err.reason
    other = encode_message(Delete(relidentifier=RELID + 1, old_tuple=[]))
    raises(UnexpectedMessage, make_decoder(begin=True, relation=True), other)


@pytest.mark.parametrize("tag", [b"I", b"U", b"D"])
def test_row_reserved_flags(tag):
    d = make_decoder(begin=True, relation=True)
    kind = b"K" if tag == b"D" else b"N"
    err = raises(
        InvalidFieldValue, d, tag + b"\x80" + struct.pack("!I", RELID) + kind + b"T\x00\x03nnn"
    )
    assert err.offset == 1


def test_errors_name_protocol_message_and_offset():
    d = make_decoder(begin=True, relation=True)
    with pytest.raises(ProtocolError) as info:
        d.decode(b"U\x00" + struct.pack("!I", RELID) + b"NT\x00\x03nn")
    err = info.value
    assert isinstance(err, TruncatedMessage)
    assert (err.protocol, err.message_type, err.offset) == ("pglogical", "UPDATE ('U')", 12)
    assert str(err).startswith("pglogical message UPDATE ('U') at byte 12:")


def test_decode_accepts_memoryview_and_bytearray():
    d = make_decoder(begin=True, relation=True)
    data = encode_message(Insert(relidentifier=RELID, new_tuple=[t("1"), t("x"), NULL_FIELD]))
    assert d.decode(memoryview(data)) == d.decode(bytearray(data))


def test_full_stream_like_the_real_plugin():
    """S, B, O, R, I, U, D, C: the order pglogical 2.x writes a forwarded transaction in."""
    begin = Begin(final_lsn=LSN1, commit_time=T0, xid=901)
    stream = [
        Startup(params=REAL_STARTUP_PARAMS),
        begin,
        Origin(origin_lsn=LSN.parse("0/AB"), origin_identifier="pgl_provider"),
        REL,
        Insert(relidentifier=RELID, new_tuple=[t("1"), t("caf\u00e9 \u2603"), t('{"a": 1}')]),
        Update(relidentifier=RELID, new_tuple=[t("1"), t("x"), UNCHANGED_FIELD]),
        Update(
            relidentifier=RELID,
            old_tuple_type="K",
            old_tuple=[t("1"), NULL_FIELD, NULL_FIELD],
            new_tuple=[t("2"), t("x"), UNCHANGED_FIELD],
        ),
        Delete(relidentifier=RELID, old_tuple=[t("2"), NULL_FIELD, NULL_FIELD]),
        Commit(commit_lsn=LSN1, end_lsn=LSN1 + 0x30, commit_time=T0),
    ]
    d = PglogicalDecoder()
    out = [d.decode(encode_message(m)) for m in stream]
    assert out == stream
    assert [m.type for m in out] == [
        "startup", "begin", "origin", "relation", "insert", "update", "update", "delete", "commit"
    ]  # fmt: skip
    json.dumps([m.to_dict() for m in out])
    assert not d.in_transaction


def test_message_equality_and_repr():
    a = Insert(relidentifier=1, new_tuple=[t("1")])
    assert a == Insert(relidentifier=1, new_tuple=[t("1")], relation=REL)
    assert a != Insert(relidentifier=1, new_tuple=[t("2")])
    assert a != Delete(relidentifier=1, old_tuple=[t("1")])
    assert "Insert(" in repr(a) and "TupleField(kind='t', value='1')" in repr(a)
    with pytest.raises(ValueError):
        Update(relidentifier=1, new_tuple=[], old_tuple=[])


def test_encoders_refuse_what_the_wire_cannot_carry():
    with pytest.raises(ValueError):
        encode_message(Relation(relidentifier=1, nspname="x" * 255, relname="t", columns=[]))
    with pytest.raises(ValueError):
        encode_message(Origin(origin_lsn=LSN(1), origin_identifier="a\x00b"))
    with pytest.raises(ValueError):
        encode_message(Begin(final_lsn=LSN1, commit_time=T0, xid=1, flags=256))
    with pytest.raises(ValueError):
        encode_message(Insert(relidentifier=1, new_tuple=[TupleField("q", None)]))
    with pytest.raises(TypeError):
        encode_message(object())  # type: ignore[arg-type]
    # the longest names that fit: 254 bytes + NUL
    rel = Relation(relidentifier=1, nspname="s" * 254, relname="t" * 254, columns=[])
    assert make_decoder().decode(encode_message(rel)) == rel


# -- client side ------------------------------------------------------------------------------


def test_start_options_defaults():
    assert pglogical_start_options() == [
        ("startup_params_format", "1"),
        ("max_proto_version", "1"),
        ("min_proto_version", "1"),
        ("proto_format", "native"),
        ("expected_encoding", "UTF8"),
    ]


def test_start_options_everything():
    opts = pglogical_start_options(
        want_coltypes=True,
        forward_changesets=True,
        no_txinfo=False,
        pg_version_num=150004,
        pg_version=150004,
        binary_want_internal_basetypes=True,
        binary_want_binary_basetypes=True,
        pglogical_replication_set_names=["default", 'My "Set"'],
        pglogical_forward_origins="all",
        pglogical_replicate_only_table=("public", "Items"),
        extra={"hooks.setup_function": "pglogical.pglogical_hooks_setup"},
        **binary_compat_params_for_server(150004),
    )
    keys = [k for k, _ in opts]
    assert keys[0] == "startup_params_format"
    assert len(keys) == len(set(keys))
    d = dict(opts)
    assert d["binary.want_binary_basetypes"] == "true"
    assert d["binary.want_internal_basetypes"] == "true"
    assert d["binary.basetypes_major_version"] == "1500"
    assert d["want_coltypes"] == "true" and d["forward_changesets"] == "true"
    assert d["no_txinfo"] == "false"
    assert d["pg_version"] == "150004" and d["pg_version_num"] == "150004"
    assert d["pglogical.replication_set_names"] == '"default","My ""Set"""'
    assert d["pglogical.forward_origins"] == '"all"'
    assert d["pglogical.replicate_only_table"] == '"public"."Items"'
    assert d["hooks.setup_function"] == "pglogical.pglogical_hooks_setup"
    for key in (
        "binary.sizeof_int",
        "binary.sizeof_long",
        "binary.sizeof_datum",
        "binary.maxalign",
        "binary.bigendian",
    ):
        assert key in d
    # pglogical 2.x mishandles these three: binary_compat_params_for_server leaves them out
    for key in ("binary.float4_byval", "binary.float8_byval", "binary.integer_datetimes"):
        assert key not in d


def test_start_options_validation():
    with pytest.raises(ValueError):
        pglogical_start_options(startup_params_format=2)
    with pytest.raises(ValueError):
        pglogical_start_options(min_proto_version=2, max_proto_version=1)
    with pytest.raises(ValueError):
        pglogical_start_options(proto_format="xml")
    with pytest.raises(ValueError):
        pglogical_start_options(expected_encoding="")
    with pytest.raises(TypeError):
        pglogical_start_options(binary_bigendian=0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        pglogical_start_options(binary_sizeof_int=True)
    with pytest.raises(ValueError):
        pglogical_start_options(binary_sizeof_int=256)
    with pytest.raises(ValueError):
        pglogical_start_options(extra={"proto_format": "json"})
    with pytest.raises(ValueError):
        pglogical_start_options(extra=[("a", "1"), ("a", "2")])
    with pytest.raises(TypeError):
        pglogical_start_options(extra={"a": 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError):
        pglogical_start_options(pglogical_replication_set_names=[])
    assert ("expected_encoding", "UTF8") not in pglogical_start_options(expected_encoding=None)
    assert all(k != "proto_format" for k, _ in pglogical_start_options(proto_format=None))


def test_binary_compat_params_for_this_machine():
    import sys

    p = binary_compat_params_for_server(150004)
    assert p["binary_basetypes_major_version"] == 1500
    assert binary_compat_params_for_server(90605)["binary_basetypes_major_version"] == 906
    assert p["binary_bigendian"] is (sys.byteorder == "big")
    assert p["binary_sizeof_int"] == 4
    if sys.maxsize > 2**32:  # x86_64 / aarch64 Linux
        assert (p["binary_sizeof_long"], p["binary_sizeof_datum"], p["binary_maxalign"]) == (
            8,
            8,
            8,
        )
    assert not {"binary_float4_byval", "binary_float8_byval", "binary_integer_datetimes"} & set(p)
    with pytest.raises(ValueError):
        binary_compat_params_for_server(15)
    with pytest.raises(TypeError):
        binary_compat_params_for_server("150004")  # type: ignore[arg-type]


def test_format_plugin_options():
    assert format_plugin_options([]) == ""
    assert format_plugin_options(pglogical_start_options()[:2]) == (
        "(\"startup_params_format\" '1', \"max_proto_version\" '1')"
    )
    hostile = format_plugin_options(
        [('we"ird', "it's; DROP TABLE x; --"), ("back\\slash", "a\\b"), ("flag", None)]
    )
    assert hostile == ('("we""ird" \'it\'\'s; DROP TABLE x; --\', "back\\slash" \'a\\b\', "flag")')
    # a generator works, and pgoutput-style options format the same way
    assert format_plugin_options((k, v) for k, v in [("proto_version", "1")]) == (
        "(\"proto_version\" '1')"
    )
    from airflow_pgcdc.errors import QuotingError

    with pytest.raises(QuotingError):
        format_plugin_options([("k", "nul\x00")])
    with pytest.raises(QuotingError):
        format_plugin_options([("", "v")])
