"""Replication command texts (spec 003) and their result-row parsers."""

from __future__ import annotations

import itertools
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_pgcdc.errors import (
    InvalidFieldValue,
    PgcdcError,
    ProtocolError,
    QuotingError,
    UnexpectedMessage,
)
from airflow_pgcdc.protocol import commands as c
from airflow_pgcdc.protocol import frames, results
from airflow_pgcdc.protocol.commands import CommandError
from airflow_pgcdc.protocol.lsn import LSN

# -- a scanner with repl_scanner.l's token rules, to prove hostile text stays inert --------

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<ident>"(?:[^"]|"")*")
  | (?P<sconst>'(?:[^']|'')*')
  | (?P<recptr>[0-9A-Fa-f]+/[0-9A-Fa-f]+)
  | (?P<uconst>[0-9]+)
  | (?P<word>[A-Za-z_\x80-\U0010ffff][A-Za-z_0-9$\x80-\U0010ffff]*)
  | (?P<punct>[(),.;])
    """,
    re.X,
)


def scan(text: str) -> list[tuple[str, str]]:
    """Tokens as the replication scanner sees them; quoted tokens unescaped."""
    out = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        assert m, f"unscannable at {pos}: {text[pos:]!r}"
        pos = m.end()
        kind = m.lastgroup
        tok = m.group()
        if kind == "space":
            continue
        if kind == "ident":
            tok = tok[1:-1].replace('""', '"')
        elif kind == "sconst":
            tok = tok[1:-1].replace("''", "'")
        out.append((kind, tok))
    return out


W = "word"
ID = "ident"
S = "sconst"
P = "punct"


# -- simple commands ------------------------------------------------------------------


def test_identify_system_command():
    assert c.identify_system() == "IDENTIFY_SYSTEM"


@pytest.mark.parametrize(
    "name, text",
    [
        ("wal_segment_size", 'SHOW "wal_segment_size"'),
        ("server_version", 'SHOW "server_version"'),
        ("pglogical.conflict_resolution", 'SHOW "pglogical"."conflict_resolution"'),
        ('x"; DROP', 'SHOW "x""; DROP"'),
    ],
)
def test_show(name, text):
    assert c.show(name) == text


@pytest.mark.parametrize("name", ["", ".", "a.", ".a", "a..b"])
def test_show_refuses_empty_parts(name):
    with pytest.raises((CommandError, QuotingError)):
        c.show(name)


@pytest.mark.parametrize(
    "tli, text", [(1, "TIMELINE_HISTORY 1"), (4294967295, "TIMELINE_HISTORY 4294967295")]
)
def test_timeline_history_command(tli, text):
    assert c.timeline_history(tli) == text


@pytest.mark.parametrize("tli", [0, -1, 1 << 32, True, "2", 2.0, None])
def test_timeline_history_refuses_bad_timelines(tli):
    with pytest.raises(CommandError, match="timeline"):
        c.timeline_history(tli)


def test_read_and_drop_replication_slot():
    assert c.read_replication_slot("phys_1") == 'READ_REPLICATION_SLOT "phys_1"'
    assert c.drop_replication_slot("s") == 'DROP_REPLICATION_SLOT "s"'
    assert c.drop_replication_slot("s", wait=True) == 'DROP_REPLICATION_SLOT "s" WAIT'
    assert c.drop_replication_slot("s", wait=False) == 'DROP_REPLICATION_SLOT "s"'


# -- CREATE_REPLICATION_SLOT ------------------------------------------------------------


@pytest.mark.parametrize("temporary", [False, True])
@pytest.mark.parametrize("reserve_wal", [None, True, False])
def test_create_physical_slot(temporary, reserve_wal):
    head = 'CREATE_REPLICATION_SLOT "s1"' + (" TEMPORARY" if temporary else "") + " PHYSICAL"
    opt = {None: "", True: " (RESERVE_WAL)", False: " (RESERVE_WAL false)"}[reserve_wal]
    assert (
        c.create_replication_slot("s1", temporary=temporary, reserve_wal=reserve_wal) == head + opt
    )
    legacy = c.create_replication_slot(
        "s1", temporary=temporary, reserve_wal=reserve_wal, legacy_syntax=True
    )
    assert legacy == head + (" RESERVE_WAL" if reserve_wal else "")


@pytest.mark.parametrize("temporary", [False, True])
@pytest.mark.parametrize("two_phase", [None, True, False])
@pytest.mark.parametrize("snapshot", [None, "export", "use", "nothing"])
def test_create_logical_slot_every_combination(temporary, two_phase, snapshot):
    head = 'CREATE_REPLICATION_SLOT "cdc"' + (" TEMPORARY" if temporary else "")
    head += ' LOGICAL "pgoutput"'
    opts = []
    if two_phase is not None:
        opts.append("TWO_PHASE" if two_phase else "TWO_PHASE false")
    if snapshot is not None:
        opts.append(f"SNAPSHOT '{snapshot}'")
    expected = head + (f" ({', '.join(opts)})" if opts else "")
    got = c.create_replication_slot(
        "cdc", output_plugin="pgoutput", temporary=temporary, two_phase=two_phase, snapshot=snapshot
    )
    assert got == expected

    legacy_words = []
    if snapshot is not None:
        legacy_words.append(
            {"export": "EXPORT_SNAPSHOT", "use": "USE_SNAPSHOT", "nothing": "NOEXPORT_SNAPSHOT"}[
                snapshot
            ]
        )
    if two_phase:
        legacy_words.append("TWO_PHASE")
    legacy = c.create_replication_slot(
        "cdc",
        output_plugin="pgoutput",
        temporary=temporary,
        two_phase=two_phase,
        snapshot=snapshot,
        legacy_syntax=True,
    )
    assert legacy == " ".join([head, *legacy_words])


def test_create_slot_exact_examples():
    assert (
        c.create_replication_slot("cdc", output_plugin="pgoutput", snapshot="export")
        == 'CREATE_REPLICATION_SLOT "cdc" LOGICAL "pgoutput" (SNAPSHOT \'export\')'
    )
    assert (
        c.create_replication_slot("cdc", output_plugin="pglogical_output", temporary=True)
        == 'CREATE_REPLICATION_SLOT "cdc" TEMPORARY LOGICAL "pglogical_output"'
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"two_phase": True}, "logical slots only"),
        ({"snapshot": "export"}, "logical slots only"),
        ({"output_plugin": "pgoutput", "reserve_wal": True}, "physical slots only"),
        ({"output_plugin": "pgoutput", "snapshot": "EXPORT"}, "snapshot must be one of"),
        ({"output_plugin": "pgoutput", "snapshot": "share"}, "snapshot must be one of"),
        ({"output_plugin": "pgoutput", "snapshot": True}, "snapshot must be one of"),
        ({"output_plugin": "pgoutput", "two_phase": "yes"}, "two_phase must be"),
        ({"reserve_wal": 1}, "reserve_wal must be"),
        ({"temporary": "true"}, "temporary must be"),
        ({"output_plugin": 5}, "output_plugin must be a str"),
    ],
)
def test_create_slot_refuses_bad_options(kwargs, match):
    with pytest.raises(CommandError, match=match):
        c.create_replication_slot("s", **kwargs)


def test_create_slot_options_are_keyword_only():
    with pytest.raises(TypeError):
        c.create_replication_slot("s", "pgoutput")  # type: ignore[misc]


# -- slot names -------------------------------------------------------------------------

HOSTILE_SLOT_NAMES = [
    "",
    "Upper",
    "with space",
    "quote'",
    'dquote"',
    "back\\slash",
    "semi;colon",
    "dash-name",
    "dot.name",
    "ünïcode",
    "слот",
    "nul\x00byte",
    "x" * 64,
    "a" * 100,
    "'); DROP TABLE x; --",
    '" ; DROP_REPLICATION_SLOT "other',
    "tab\tname",
    "new\nline",
]


@pytest.mark.parametrize("name", HOSTILE_SLOT_NAMES, ids=repr)
@pytest.mark.parametrize(
    "build",
    [
        lambda n: c.create_replication_slot(n),
        lambda n: c.create_replication_slot(n, output_plugin="pgoutput"),
        lambda n: c.read_replication_slot(n),
        lambda n: c.drop_replication_slot(n, wait=True),
        lambda n: c.start_replication_physical(0, slot_name=n),
        lambda n: c.start_replication_logical(n, 0),
    ],
)
def test_hostile_slot_names_are_refused_naming_the_slot(build, name):
    with pytest.raises(CommandError) as ei:
        build(name)
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, PgcdcError)
    if name:
        assert repr(name) in str(ei.value)


@pytest.mark.parametrize("name", ["a", "slot_1", "0", "_", "x" * 63, "abc_def_0123456789"])
def test_valid_slot_names_are_quoted(name):
    assert c.validate_slot_name(name) == name
    assert c.drop_replication_slot(name) == f'DROP_REPLICATION_SLOT "{name}"'


def test_slot_name_must_be_str():
    with pytest.raises(CommandError, match="must be a str"):
        c.validate_slot_name(b"slot")  # type: ignore[arg-type]


# -- hostile identifiers where PostgreSQL allows anything: plugin, option names --------------

HOSTILE_IDENTS = [
    'pg"output',
    '""',
    "'); DROP TABLE x; --",
    '"); DROP TABLE x; --',
    "with space",
    "back\\slash\\",
    "ünïcode ✓",
    "плагин",
    "x" * 63,
    "é" * 31,  # 62 bytes
    "Mixed_Case",
    "semi;colon,comma(paren)",
    "new\nline",
]


@pytest.mark.parametrize("name", HOSTILE_IDENTS, ids=repr)
def test_hostile_plugin_names_stay_one_identifier(name):
    text = c.create_replication_slot("s", output_plugin=name, snapshot="nothing")
    assert scan(text) == [
        (W, "CREATE_REPLICATION_SLOT"),
        (ID, "s"),
        (W, "LOGICAL"),
        (ID, name),
        (P, "("),
        (W, "SNAPSHOT"),
        (S, "nothing"),
        (P, ")"),
    ]


@pytest.mark.parametrize("name", ["x" * 64, "é" * 32, "a\x00b", ""], ids=repr)
def test_unquotable_plugin_names_raise_quoting_error(name):
    with pytest.raises(QuotingError):
        c.create_replication_slot("s", output_plugin=name)
    with pytest.raises(QuotingError):
        c.start_replication_logical("s", 0, [(name, "v")])


HOSTILE_VALUES = [
    "'); DROP TABLE x; --",
    "'",
    "''",
    "\\'",
    "\\",
    'a"b',
    "publication with spaces, and, commas",
    "ünïcode ✓ 日本",
    "new\nline\r\n",
    "",
    "x" * 10_000,
    "$$ dollar $$",
    "E'\\x00'",
]


@pytest.mark.parametrize("value", HOSTILE_VALUES, ids=lambda v: repr(v)[:40])
@pytest.mark.parametrize("name", ["publication_names", *HOSTILE_IDENTS[:4]], ids=repr)
def test_hostile_plugin_options_stay_inert(name, value):
    text = c.start_replication_logical(
        "cdc", LSN.parse("16/B374D848"), [("proto_version", "4"), (name, value), ("flag", None)]
    )
    assert scan(text) == [
        (W, "START_REPLICATION"),
        (W, "SLOT"),
        (ID, "cdc"),
        (W, "LOGICAL"),
        ("recptr", "16/B374D848"),
        (P, "("),
        (ID, "proto_version"),
        (S, "4"),
        (P, ","),
        (ID, name),
        (S, value),
        (P, ","),
        (ID, "flag"),
        (P, ")"),
    ]


def test_sql_injection_in_option_value_exact_text():
    text = c.start_replication_logical("cdc", 0, [("publication_names", "'); DROP TABLE x; --")])
    assert text == (
        "START_REPLICATION SLOT \"cdc\" LOGICAL 0/0 (\"publication_names\" '''); DROP TABLE x; --')"
    )


def test_nul_in_option_value_is_refused():
    with pytest.raises(QuotingError):
        c.start_replication_logical("cdc", 0, [("publication_names", "a\x00b")])


# -- START_REPLICATION ----------------------------------------------------------------


@pytest.mark.parametrize("slot", [None, "phys"])
@pytest.mark.parametrize("timeline", [None, 1, 7])
@pytest.mark.parametrize("lsn", [0, LSN.parse("16/B374D848"), "0/1000000"])
def test_start_replication_physical_every_combination(slot, timeline, lsn):
    expected = "START_REPLICATION"
    if slot:
        expected += f' SLOT "{slot}"'
    expected += f" PHYSICAL {LSN(lsn) if not isinstance(lsn, str) else lsn}"
    if timeline:
        expected += f" TIMELINE {timeline}"
    assert c.start_replication_physical(lsn, slot_name=slot, timeline=timeline) == expected


@pytest.mark.parametrize("lsn", [-1, 1 << 64, "16-B374D848", "", None, True, 1.5])
def test_start_replication_bad_lsn(lsn):
    with pytest.raises(CommandError, match="start_lsn"):
        c.start_replication_physical(lsn)
    with pytest.raises(CommandError, match="start_lsn"):
        c.start_replication_logical("s", lsn)


@pytest.mark.parametrize("tli", [0, -3, 1 << 32])
def test_start_replication_bad_timeline(tli):
    with pytest.raises(CommandError, match="timeline"):
        c.start_replication_physical(0, timeline=tli)


@pytest.mark.parametrize(
    "options, suffix",
    [
        ((), ""),
        (None, ""),
        ([("proto_version", "4")], " (\"proto_version\" '4')"),
        (
            {"proto_version": "4", "publication_names": '"pub"'},
            ' ("proto_version" \'4\', "publication_names" \'"pub"\')',
        ),
        ([("binary", True), ("streaming", False)], " (\"binary\" 'true', \"streaming\" 'false')"),
        ([("proto_version", 4)], " (\"proto_version\" '4')"),
        ([("include-xids", None)], ' ("include-xids")'),
        (
            [("proto_version", "4"), ("publication_names", "p"), ("messages", "true")],
            " (\"proto_version\" '4', \"publication_names\" 'p', \"messages\" 'true')",
        ),
    ],
)
def test_start_replication_logical(options, suffix):
    base = 'START_REPLICATION SLOT "cdc" LOGICAL 1/0'
    assert c.start_replication_logical("cdc", LSN.parse("1/0"), options) == base + suffix
    assert c.start_replication_logical("cdc", "1/0", options=options) == base + suffix
    assert c.start_replication_logical("cdc", 1 << 32) == base


def test_start_replication_logical_takes_any_iterable_of_pairs():
    text = c.start_replication_logical("cdc", 0, iter([("a", "1"), ("b", "2")]))
    assert text == 'START_REPLICATION SLOT "cdc" LOGICAL 0/0 ("a" \'1\', "b" \'2\')'


@pytest.mark.parametrize(
    "options, match",
    [
        ([("a", "1"), ("a", "2")], "given twice"),
        (["proto_version"], "pairs"),
        ([("a", "1", "x")], "pairs"),
        ([("a", 1.5)], "value must be"),
        ([("a", b"bytes")], "value must be"),
        ([(5, "v")], "name must be a str"),
    ],
)
def test_start_replication_logical_bad_options(options, match):
    with pytest.raises(CommandError, match=match):
        c.start_replication_logical("cdc", 0, options)


# -- BASE_BACKUP --------------------------------------------------------------------------

# One representative setting per option (or coupled pair), in the spec's order, with the
# fragment it must produce.
BASE_BACKUP_UNITS = [
    ({"label": "nightly 'base'"}, ["LABEL 'nightly ''base'''"]),
    (
        {"target": "server", "target_detail": "/srv/backups"},
        ["TARGET 'server'", "TARGET_DETAIL '/srv/backups'"],
    ),
    ({"progress": True}, ["PROGRESS"]),
    ({"checkpoint": "fast"}, ["CHECKPOINT 'fast'"]),
    ({"wal": True}, ["WAL"]),
    ({"wait": False}, ["WAIT false"]),
    (
        {"compression": "zstd", "compression_detail": "level=3,workers=4"},
        ["COMPRESSION 'zstd'", "COMPRESSION_DETAIL 'level=3,workers=4'"],
    ),
    ({"max_rate": 1024}, ["MAX_RATE 1024"]),
    ({"tablespace_map": True}, ["TABLESPACE_MAP"]),
    ({"verify_checksums": False}, ["VERIFY_CHECKSUMS false"]),
    ({"manifest": "force-encode"}, ["MANIFEST 'force-encode'"]),
    ({"manifest_checksums": "sha512"}, ["MANIFEST_CHECKSUMS 'SHA512'"]),
]


def test_base_backup_without_options():
    assert c.base_backup() == "BASE_BACKUP"


def test_base_backup_every_combination_of_options():
    n = len(BASE_BACKUP_UNITS)
    for mask in range(1 << n):
        kwargs: dict = {}
        fragments: list[str] = []
        for i, (kw, frag) in enumerate(BASE_BACKUP_UNITS):
            if mask >> i & 1:
                kwargs.update(kw)
                fragments.extend(frag)
        expected = f"BASE_BACKUP ({', '.join(fragments)})" if fragments else "BASE_BACKUP"
        assert c.base_backup(**kwargs) == expected, kwargs


@pytest.mark.parametrize(
    "kwargs, text",
    [
        ({"label": "pgcdc"}, "BASE_BACKUP (LABEL 'pgcdc')"),
        ({"label": ""}, "BASE_BACKUP (LABEL '')"),
        ({"target": "client"}, "BASE_BACKUP (TARGET 'client')"),
        ({"target": "blackhole"}, "BASE_BACKUP (TARGET 'blackhole')"),
        ({"progress": False}, "BASE_BACKUP (PROGRESS false)"),
        ({"checkpoint": "spread"}, "BASE_BACKUP (CHECKPOINT 'spread')"),
        ({"wal": False}, "BASE_BACKUP (WAL false)"),
        ({"wait": True}, "BASE_BACKUP (WAIT)"),
        ({"compression": "gzip"}, "BASE_BACKUP (COMPRESSION 'gzip')"),
        (
            {"compression": "lz4", "compression_detail": 12},
            "BASE_BACKUP (COMPRESSION 'lz4', COMPRESSION_DETAIL '12')",
        ),
        (
            {"compression": "gzip", "compression_detail": "9"},
            "BASE_BACKUP (COMPRESSION 'gzip', COMPRESSION_DETAIL '9')",
        ),
        (
            {"compression": "zstd", "compression_detail": -5},
            "BASE_BACKUP (COMPRESSION 'zstd', COMPRESSION_DETAIL '-5')",
        ),
        (
            {"compression": "zstd", "compression_detail": {"level": 22, "workers": 0}},
            "BASE_BACKUP (COMPRESSION 'zstd', COMPRESSION_DETAIL 'level=22,workers=0')",
        ),
        (
            {"compression": "gzip", "compression_detail": {"level": 1}},
            "BASE_BACKUP (COMPRESSION 'gzip', COMPRESSION_DETAIL 'level=1')",
        ),
        (
            {"compression": "zstd", "compression_detail": " level=3 , workers=2 "},
            "BASE_BACKUP (COMPRESSION 'zstd', COMPRESSION_DETAIL 'level=3,workers=2')",
        ),
        ({"max_rate": 0}, "BASE_BACKUP"),
        ({"max_rate": 32}, "BASE_BACKUP (MAX_RATE 32)"),
        ({"max_rate": 1048576}, "BASE_BACKUP (MAX_RATE 1048576)"),
        ({"tablespace_map": False}, "BASE_BACKUP (TABLESPACE_MAP false)"),
        ({"verify_checksums": True}, "BASE_BACKUP (VERIFY_CHECKSUMS)"),
        ({"manifest": "yes"}, "BASE_BACKUP (MANIFEST 'yes')"),
        ({"manifest": "no"}, "BASE_BACKUP (MANIFEST 'no')"),
        ({"manifest_checksums": "none"}, "BASE_BACKUP (MANIFEST_CHECKSUMS 'NONE')"),
        ({"manifest_checksums": "CRC32C"}, "BASE_BACKUP (MANIFEST_CHECKSUMS 'CRC32C')"),
        ({"manifest_checksums": "Sha224"}, "BASE_BACKUP (MANIFEST_CHECKSUMS 'SHA224')"),
        ({"manifest_checksums": "SHA256"}, "BASE_BACKUP (MANIFEST_CHECKSUMS 'SHA256')"),
        ({"manifest_checksums": "sha384"}, "BASE_BACKUP (MANIFEST_CHECKSUMS 'SHA384')"),
    ],
)
def test_base_backup_option_values(kwargs, text):
    assert c.base_backup(**kwargs) == text


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"target": "tape"}, "target must be one of"),
        ({"target": "Client"}, "target must be one of"),
        ({"target": "server"}, "needs target_detail"),
        ({"target_detail": "/x"}, "only allowed with target='server'"),
        ({"target": "client", "target_detail": "/x"}, "only allowed with target='server'"),
        ({"checkpoint": "slow"}, "checkpoint must be one of"),
        ({"checkpoint": True}, "checkpoint must be one of"),
        ({"compression": "bzip2"}, "compression must be one of"),
        ({"compression": "none"}, "compression must be one of"),
        ({"compression_detail": 5}, "needs compression"),
        ({"compression": "gzip", "compression_detail": 0}, "between 1 and 9"),
        ({"compression": "gzip", "compression_detail": 10}, "between 1 and 9"),
        ({"compression": "gzip", "compression_detail": -1}, "between 1 and 9"),
        ({"compression": "lz4", "compression_detail": 13}, "between 1 and 12"),
        ({"compression": "zstd", "compression_detail": 23}, "between -131072 and 22"),
        ({"compression": "zstd", "compression_detail": "level=-131073"}, "between -131072 and 22"),
        ({"compression": "gzip", "compression_detail": "workers=2"}, "only supported by zstd"),
        ({"compression": "zstd", "compression_detail": {"workers": -1}}, "workers must be >= 0"),
        ({"compression": "zstd", "compression_detail": "speed=3"}, "unknown"),
        ({"compression": "zstd", "compression_detail": "level"}, "needs an integer"),
        ({"compression": "zstd", "compression_detail": "level=high"}, "needs an integer"),
        ({"compression": "zstd", "compression_detail": "level=3,,"}, "empty keyword"),
        (
            {"compression": "zstd", "compression_detail": "'); DROP TABLE x; --"},
            "compression_detail",
        ),
        ({"compression": "zstd", "compression_detail": {}}, "empty"),
        ({"compression": "zstd", "compression_detail": True}, "not a bool"),
        ({"compression": "zstd", "compression_detail": 3.0}, "compression_detail must be"),
        ({"max_rate": 1}, "between 32 and 1048576"),
        ({"max_rate": 31}, "between 32 and 1048576"),
        ({"max_rate": 1048577}, "between 0 and 1048576"),
        ({"max_rate": -1}, "between 0 and 1048576"),
        ({"max_rate": True}, "must be an int"),
        ({"max_rate": "100"}, "must be an int"),
        ({"manifest": "true"}, "manifest must be one of"),
        ({"manifest": "YES"}, "manifest must be one of"),
        ({"manifest_checksums": "md5"}, "manifest_checksums must be one of"),
        ({"progress": "yes"}, "progress must be"),
        ({"wal": 1}, "wal must be"),
        ({"wait": 0}, "wait must be"),
        ({"tablespace_map": "on"}, "tablespace_map must be"),
        ({"verify_checksums": None and 1 or 2}, "verify_checksums must be"),
        ({"label": 5}, "label must be a str"),
    ],
)
def test_base_backup_refuses_bad_options(kwargs, match):
    with pytest.raises(CommandError, match=re.escape(match)):
        c.base_backup(**kwargs)


def test_base_backup_options_are_keyword_only():
    with pytest.raises(TypeError):
        c.base_backup("label")  # type: ignore[misc]


@pytest.mark.parametrize("label", HOSTILE_VALUES, ids=lambda v: repr(v)[:40])
def test_hostile_labels_and_paths_stay_inert(label):
    text = c.base_backup(label=label, target="server", target_detail=label, progress=True)
    assert scan(text) == [
        (W, "BASE_BACKUP"),
        (P, "("),
        (W, "LABEL"),
        (S, label),
        (P, ","),
        (W, "TARGET"),
        (S, "server"),
        (P, ","),
        (W, "TARGET_DETAIL"),
        (S, label),
        (P, ","),
        (W, "PROGRESS"),
        (P, ")"),
    ]


def test_nul_in_label_is_refused():
    with pytest.raises(QuotingError):
        c.base_backup(label="a\x00b")


# -- property: whatever the text, it comes back as the same single token ------------------

_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=80
)


@settings(max_examples=300, deadline=None)
@given(name=_text, value=_text, plugin=_text)
def test_any_text_is_inert_or_refused(name, value, plugin):
    try:
        text = c.start_replication_logical("cdc", 0, [(name, value)])
    except QuotingError:
        assert not name or len(name.encode()) >= 64
    else:
        assert scan(text)[5:] == [(P, "("), (ID, name), (S, value), (P, ")")]
    try:
        text = c.create_replication_slot("cdc", output_plugin=plugin)
    except QuotingError:
        assert not plugin or len(plugin.encode()) >= 64
    else:
        assert scan(text) == [
            (W, "CREATE_REPLICATION_SLOT"),
            (ID, "cdc"),
            (W, "LOGICAL"),
            (ID, plugin),
        ]
    text = c.base_backup(label=value)
    assert scan(text) == [(W, "BASE_BACKUP"), (P, "("), (W, "LABEL"), (S, value), (P, ")")]


@settings(max_examples=300, deadline=None)
@given(name=_text)
def test_any_slot_name_is_valid_or_refused(name):
    try:
        text = c.drop_replication_slot(name)
    except CommandError:
        assert not re.fullmatch(r"[a-z0-9_]{1,63}", name)
    else:
        assert re.fullmatch(r"[a-z0-9_]{1,63}", name)
        assert scan(text) == [(W, "DROP_REPLICATION_SLOT"), (ID, name)]


def test_command_error_is_a_pgcdc_value_error():
    assert issubclass(CommandError, PgcdcError) and issubclass(CommandError, ValueError)
    assert not issubclass(CommandError, ProtocolError)


# -- result rows ------------------------------------------------------------------------


def _as_bytes(row):
    return [None if v is None else v.encode() for v in row]


@pytest.mark.parametrize("convert", [list, tuple, _as_bytes], ids=["list", "tuple", "bytes"])
def test_identify_system(convert):
    row = convert(["7412345678901234567", "1", "0/1A2B3C4", "app"])
    r = results.parse_identify_system(row)
    assert r == results.IdentifySystem("7412345678901234567", 1, LSN.parse("0/1A2B3C4"), "app")
    assert isinstance(r.xlogpos, LSN)
    assert r.to_dict() == {
        "systemid": "7412345678901234567",
        "timeline": 1,
        "xlogpos": "0/1A2B3C4",
        "dbname": "app",
    }
    json.dumps(r.to_dict())
    assert results.IdentifySystem.from_row(row) == r
    assert frames.IdentifySystem is results.IdentifySystem  # re-exported for the pg layer
    physical = results.parse_identify_system(convert(["1", "3", "16/B374D848", None]))
    assert physical.dbname is None and physical.timeline == 3


@pytest.mark.parametrize(
    "row, cls, match",
    [
        (["1", "1", "0/0"], UnexpectedMessage, "expected 4 columns"),
        (["1", "1", "0/0", None, None], UnexpectedMessage, "expected 4 columns"),
        ("abcd", UnexpectedMessage, "expected a row"),
        (None, UnexpectedMessage, "expected a row"),
        ([None, "1", "0/0", None], InvalidFieldValue, "systemid is NULL"),
        (["-1", "1", "0/0", None], InvalidFieldValue, "systemid"),
        (["18446744073709551616", "1", "0/0", None], InvalidFieldValue, "systemid"),
        (["١٢٣", "1", "0/0", None], InvalidFieldValue, "systemid"),
        (["1", "0", "0/0", None], InvalidFieldValue, "timeline = 0"),
        (["1", "x", "0/0", None], InvalidFieldValue, "timeline is not an integer"),
        (["1", None, "0/0", None], InvalidFieldValue, "timeline is NULL"),
        (["1", "1", "00/0/0", None], InvalidFieldValue, "xlogpos is not an LSN"),
        (["1", "1", "123456789/0", None], InvalidFieldValue, "xlogpos is not an LSN"),
        (["1", "1", None, None], InvalidFieldValue, "xlogpos is NULL"),
        (["1", "1", "0/0", b"\xff\xfe"], InvalidFieldValue, "not valid UTF-8"),
        (["1", "1", "0/0", 5], InvalidFieldValue, "has type int"),
    ],
)
def test_identify_system_bad_rows(row, cls, match):
    with pytest.raises(cls, match=match) as ei:
        results.parse_identify_system(row)
    assert ei.value.protocol == "replication"
    assert "IDENTIFY_SYSTEM" in ei.value.message_type


def test_replication_slot_created():
    logical = results.parse_replication_slot_created(
        [b"cdc", b"0/15D6C08", b"00000003-00000002-1", b"pgoutput"]
    )
    assert logical == results.ReplicationSlotCreated(
        "cdc", LSN.parse("0/15D6C08"), "00000003-00000002-1", "pgoutput"
    )
    physical = results.ReplicationSlotCreated.from_row(("phys", "0/0", None, None))
    assert physical.snapshot_name is None and physical.output_plugin is None
    assert logical.to_dict()["consistent_point"] == "0/15D6C08"
    with pytest.raises(InvalidFieldValue, match="consistent_point"):
        results.parse_replication_slot_created(["cdc", "nope", None, None])
    with pytest.raises(InvalidFieldValue, match="slot_name is empty"):
        results.parse_replication_slot_created(["", "0/0", None, None])
    with pytest.raises(UnexpectedMessage):
        results.parse_replication_slot_created(["cdc", "0/0"])


def test_read_replication_slot():
    r = results.parse_read_replication_slot(["physical", "0/3000028", "1"])
    assert r == results.ReadReplicationSlot("physical", LSN.parse("0/3000028"), 1) and r.exists
    missing = results.ReadReplicationSlot.from_row([None, None, None])
    assert not missing.exists and missing.restart_lsn is None and missing.restart_tli is None
    assert missing.to_dict() == {"slot_type": None, "restart_lsn": None, "restart_tli": None}
    with pytest.raises(InvalidFieldValue, match="slot_type"):
        results.parse_read_replication_slot(["snapshot", None, None])
    with pytest.raises(InvalidFieldValue, match="restart_tli"):
        results.parse_read_replication_slot(["physical", "0/1", "-1"])


def test_timeline_history():
    content = (
        b"1\t0/3000158\tno recovery target specified\n"
        b"\n"
        b"# comment\n"
        b'2\t0/50000A0\tat restore point "p"\n'
    )
    r = results.parse_timeline_history([b"00000003.history", content])
    assert r.filename == "00000003.history" and r.content == content
    assert r.entries() == [
        results.TimelineHistoryEntry(1, LSN.parse("0/3000158"), "no recovery target specified"),
        results.TimelineHistoryEntry(2, LSN.parse("0/50000A0"), 'at restore point "p"'),
    ]
    assert results.TimelineHistory.from_row(["x.history", "1\t0/1\tr\n"]).content == b"1\t0/1\tr\n"
    json.dumps(r.to_dict())
    bad = results.parse_timeline_history(["00000002.history", b"one\ttwo\n"])
    with pytest.raises(InvalidFieldValue, match="line 1"):
        bad.entries()
    with pytest.raises(InvalidFieldValue, match="content is NULL"):
        results.parse_timeline_history(["x", None])


def test_timeline_switch_and_show():
    assert results.parse_timeline_switch(["3", "0/5000000"]) == results.TimelineSwitch(
        3, LSN.parse("0/5000000")
    )
    assert results.TimelineSwitch.from_row([b"4", b"1/0"]).switchpoint == LSN.parse("1/0")
    assert results.parse_show([b"16MB"]) == "16MB"
    with pytest.raises(InvalidFieldValue):
        results.parse_show([None])
    with pytest.raises(InvalidFieldValue, match="next_tli"):
        results.parse_timeline_switch(["0", "0/0"])


def test_base_backup_result_sets():
    start = results.parse_base_backup_position([b"0/2000028", b"1"])
    assert start == results.BaseBackupPosition(LSN.parse("0/2000028"), 1)
    assert start.to_dict() == {"lsn": "0/2000028", "timeline": 1}
    assert results.BaseBackupPosition.from_row(("0/2000100", "1")).lsn == LSN.parse("0/2000100")
    spaces = results.parse_base_backup_tablespaces(
        [[None, None, b"30734"], [b"16385", b"/srv/tbs", None]]
    )
    assert spaces == [
        results.TablespaceInfo(None, None, 30734),
        results.TablespaceInfo(16385, "/srv/tbs", None),
    ]
    assert spaces[0].is_base_directory and not spaces[1].is_base_directory
    assert results.TablespaceInfo.from_row([None, None, None]).size_kb is None
    with pytest.raises(InvalidFieldValue, match="spcoid"):
        results.parse_base_backup_tablespace(["0", "/x", None])
    with pytest.raises(InvalidFieldValue, match="size"):
        results.parse_base_backup_tablespace([None, None, "-5"])
    with pytest.raises(InvalidFieldValue, match="tli"):
        results.parse_base_backup_position(["0/0", None])
    with pytest.raises(UnexpectedMessage):
        results.parse_base_backup_position(["0/0", "1", "extra"])


def test_result_values_are_immutable():
    r = results.parse_base_backup_position(["0/0", "1"])
    with pytest.raises(AttributeError):
        r.timeline = 2  # type: ignore[misc]
    assert not hasattr(r, "__dict__")


def test_every_public_name_exists():
    for name in c.__all__:
        assert hasattr(c, name), name
    for name in frames.__all__:
        assert hasattr(frames, name), name


def test_combinations_cover_all_units():
    # guard for test_base_backup_every_combination_of_options: every option is in a unit
    covered = set(itertools.chain.from_iterable(kw for kw, _ in BASE_BACKUP_UNITS))
    import inspect

    params = set(inspect.signature(c.base_backup).parameters)
    assert covered == params
