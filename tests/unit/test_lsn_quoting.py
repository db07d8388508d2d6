import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_pgcdc.errors import QuotingError
from airflow_pgcdc.pg.conninfo import redact, replication_conninfo
from airflow_pgcdc.protocol.lsn import LSN, InvalidLSN, WalSizes, passed_at
from airflow_pgcdc.protocol.quoting import (
    quote_ident,
    quote_literal,
    quote_qualified,
    shell_qualified,
)


@pytest.mark.parametrize(
    "text,value",
    [("0/0", 0), ("0/1", 1), ("16/B374D848", 0x16_B374D848), ("FFFFFFFF/FFFFFFFF", 2**64 - 1)],
)
def test_lsn_parse_format(text, value):
    lsn = LSN.parse(text)
    assert int(lsn) == value
    assert str(lsn) == text
    assert LSN(text) == lsn


@pytest.mark.parametrize("bad", ["", "0", "0/", "/0", "G/0", "1/2/3", "100000000/0", " x/1", None])
def test_lsn_parse_rejects(bad):
    with pytest.raises(InvalidLSN):
        LSN.parse(bad)


def test_lsn_arithmetic_and_order():
    a, b = LSN.parse("1/FFFFFFFF"), LSN.parse("2/0")
    assert a < b and a + 1 == b and isinstance(a + 1, LSN)
    assert b - a == 1 and type(b - a) is int
    assert isinstance(b - 1, LSN) and str(b - 1) == "1/FFFFFFFF"
    with pytest.raises(InvalidLSN):
        LSN(0) - 1
    with pytest.raises(InvalidLSN):
        LSN(2**64)
    assert pickle.loads(pickle.dumps(a)) == a and repr(a) == "LSN('1/FFFFFFFF')"


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_lsn_roundtrip(v):
    assert LSN.parse(str(LSN(v))) == v


@pytest.mark.parametrize(
    "target,block_size,reach",
    [
        ("0/1D44018", 8192, "0/1D44000"),  # just after a page's short header: the page's start
        ("1/0", 8192, "1/0"),  # a page boundary itself
        ("0/1D44000", 8192, "0/1D44000"),
        ("0/1D44020", 8192, "0/1D44020"),  # a record position on the page
        ("0/1D44010", 8192, "0/1D44010"),  # inside a header: never an end a stream reports
        ("0/1000018", 8192, "0/1000000"),  # inside a segment's first page's 40-byte header
        ("0/1000028", 8192, "0/1000000"),  # just after it (the insert position after pg_switch_wal())
        ("0/1002028", 8192, "0/1002028"),  # 40 bytes into a page that starts no segment
        ("0/3018", 16384, "0/3018"),  # mid-page when pages are 16 kB
        ("0/4018", 16384, "0/4000"),
    ],
)
def test_passed_at_moves_an_end_after_a_page_header_to_the_page_start(target, block_size, reach):
    assert passed_at(LSN.parse(target), block_size) == LSN.parse(reach)
    assert type(passed_at(LSN.parse(target), block_size)) is LSN
    assert WalSizes(block_size).passed_at(LSN.parse(target)) == LSN.parse(reach)


def test_wal_sizes_from_show_and_segments_other_than_16_mb():
    assert WalSizes.parse("8192", "16MB") == WalSizes(8192, 16 << 20) == WalSizes()
    assert WalSizes.parse("32768", "1GB") == WalSizes(32768, 1 << 30)
    assert WalSizes.parse(None, None) == WalSizes()
    sizes = WalSizes.parse("8192", "64MB")
    assert sizes.passed_at(LSN.parse("0/1000028")) == LSN.parse("0/1000028")  # not a segment start at 64 MB
    assert sizes.passed_at(LSN.parse("0/4000028")) == LSN.parse("0/4000000")
    with pytest.raises(ValueError, match="wal_segment_size"):
        WalSizes.parse("8192", "lots")


@pytest.mark.parametrize(
    "name,quoted",
    [
        ("t", '"t"'),
        ("Mixed Case", '"Mixed Case"'),
        ('we"ird', '"we""ird"'),
        ("it's", '"it\'s"'),
        ("back\\slash", '"back\\slash"'),
        ("ünïcødé ☃", '"ünïcødé ☃"'),
        ('"; DROP TABLE x; --', '"""; DROP TABLE x; --"'),
        ("a" * 63, '"' + "a" * 63 + '"'),
    ],
)
def test_quote_ident(name, quoted):
    assert quote_ident(name) == quoted


@pytest.mark.parametrize("bad", ["", "a\x00b", "a" * 64, "é" * 32, 5])
def test_quote_ident_refuses(bad):
    with pytest.raises(QuotingError):
        quote_ident(bad)


@pytest.mark.parametrize(
    "value,quoted",
    [
        ("", "''"),
        ("it's", "'it''s'"),
        ("back\\slash", "'back\\slash'"),
        ("'); DROP TABLE x; --", "'''); DROP TABLE x; --'"),
        ('dq"', "'dq\"'"),
    ],
)
def test_quote_literal(value, quoted):
    assert quote_literal(value) == quoted


def test_quote_literal_refuses_nul():
    with pytest.raises(QuotingError):
        quote_literal("a\x00")


def test_shell_qualified_is_one_shell_word_naming_exactly_the_table():
    import shlex

    from airflow_pgcdc.pg.tables import parse_table_names

    for schema, name in (("public", "t"), ("a.b", "c"), ("a", "b.c"), ("Shop", "it's \"odd\" "), ("s", "x y")):
        words = shlex.split(shell_qualified(schema, name))
        assert len(words) == 1 and parse_table_names(words) == [(schema, name)], (schema, name, words)


def test_quote_qualified():
    assert quote_qualified("public", 'T"1') == '"public"."T""1"'


def test_redact_hides_password_and_replication_conninfo():
    dsn = "host=h port=5 dbname=d user=u password=s3cr3t sslmode=require"
    red = redact(dsn)
    assert "s3cr3t" not in red and "***" in red and "sslmode=require" in red
    ci = replication_conninfo(dsn)
    assert "replication=database" in ci and "standard_conforming_strings=on" in ci
    assert "replication" not in replication_conninfo(dsn, replication="false")


# -- pgoutput start options ---------------------------------------------------------------
from airflow_pgcdc.protocol.pgoutput.options import (  # noqa: E402
    PgoutputOptions,
    UnsupportedOption,
    max_proto_version,
)


@pytest.mark.parametrize(
    "server,two_phase,expected",
    [(130000, False, 1), (140005, False, 2), (150018, False, 2), (150018, True, 3), (160000, False, 4), (180001, True, 4)],
)
def test_max_proto_version(server, two_phase, expected):
    assert max_proto_version(server, two_phase=two_phase) == expected


def test_start_options_quote_publication_names():
    o = PgoutputOptions(publications=("p1", 'We,ird"'), streaming="parallel", binary=True, messages=True, origin="none")
    assert o.start_options(180000) == [
        ("proto_version", "4"),
        ("publication_names", '"p1","We,ird"""'),
        ("binary", "true"),
        ("messages", "true"),
        ("streaming", "parallel"),
        ("origin", "none"),
    ]
    # PostgreSQL 15 takes streaming as a boolean
    assert ("streaming", "true") in PgoutputOptions(publications=("p",), streaming="on").start_options(150000)


@pytest.mark.parametrize(
    "kwargs,server",
    [
        (dict(streaming="parallel"), 150000),
        (dict(two_phase=True), 140000),
        (dict(origin="none"), 150000),
        (dict(proto_version=4), 150000),
        (dict(streaming="on", proto_version=1), 180000),
    ],
)
def test_start_options_refuse_what_server_cannot(kwargs, server):
    with pytest.raises(UnsupportedOption):
        PgoutputOptions(publications=("p",), **kwargs).start_options(server)


def test_options_validate():
    with pytest.raises(UnsupportedOption):
        PgoutputOptions(publications=())
    with pytest.raises(UnsupportedOption):
        PgoutputOptions(publications=("p",), streaming="yes")


def test_replication_conninfo_keeps_caller_options():
    ci = replication_conninfo("host=h options='-c a=1'", options="-c wal_sender_timeout=2s")
    assert "wal_sender_timeout=2s" in ci and "standard_conforming_strings=on" in ci


def test_one_redactor_for_dsns_uris_environments_and_messages():
    from airflow_pgcdc.errors import redact as redact_text
    from airflow_pgcdc.errors import redact_mapping

    assert redact("host=h password = 'a b\\'c' user=u") == "host=h password = *** user=u"
    assert redact("postgresql://u:s3cr3t@h:5/d?sslmode=require") == "postgresql://u:***@h:5/d?sslmode=require"
    assert redact("postgresql://h/d?user=u&password=s3cr3t") == "postgresql://h/d?user=u&password=***"
    assert "pw" not in redact("host=h sslpassword=pw")
    env = {"PGCDC_DSN": "host=h password=pw", "AWS_SECRET_ACCESS_KEY": "k3y", "AWS_ACCESS_KEY_ID": "id",
           "NOTE": "the key is k3y"}
    assert redact_mapping(env) == {"PGCDC_DSN": "host=h password=***", "AWS_SECRET_ACCESS_KEY": "***",
                                   "AWS_ACCESS_KEY_ID": "id", "NOTE": "the key is ***"}
    assert redact_text("failed with k3y and host=h password=pw", ["k3y"]) == "failed with *** and host=h password=***"


def test_lsn_text_is_the_canonical_text_of_an_int_or_a_text():
    from airflow_pgcdc.protocol.lsn import lsn_text

    assert lsn_text(0x16B374D848) == "16/B374D848"
    assert lsn_text("16/b374d848") == "16/B374D848"
    assert lsn_text(" 0/0 ") == "0/0"
    for bad in ("16B374D848", 1.5, None, -1, 1 << 64):
        with pytest.raises(InvalidLSN):
            lsn_text(bad)


def test_wire_lsn_is_an_lsn_without_the_checks():
    from airflow_pgcdc.protocol.lsn import wire_lsn

    v = wire_lsn(0x16B374D848)
    assert type(v) is LSN and v == LSN("16/B374D848") and str(v) == "16/B374D848"
