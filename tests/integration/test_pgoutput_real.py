"""The pgoutput decoder against what real PostgreSQL 15 and 18 walsenders send.

Each test makes the server emit some pgoutput messages, decodes them through
``LogicalStream`` and compares every decoded field with what the server itself says
through SQL: xids from ``pg_current_xact_id()`` in the same transaction, oids from the
catalogs, commit timestamps from ``pg_xact_commit_timestamp`` (``track_commit_timestamp``
is on), prepare times from ``pg_prepared_xacts``, commit/prepare/abort LSNs from the WAL
records themselves (``pg_walinspect``), values from ``col::text`` and ``typsend(col)``.
Every read also checks that each message's ``to_dict()`` is JSON-serialisable and that
re-encoding it gives back the server's exact bytes (see ``pgoutput_capture``).
"""

from __future__ import annotations

import dataclasses
import struct
from datetime import UTC, datetime

import pytest
from pgoutput_capture import (
    SMALL_WORK_MEM,
    WAL_BOUNDARIES,
    WAL_PAGE,
    Bench,
    Capture,
    xid32,
)

from airflow_pgcdc.pg.replication import ReplicationConnection
from airflow_pgcdc.protocol import pgoutput as po
from airflow_pgcdc.protocol.lsn import LSN


@pytest.fixture
def bench(fresh_db, slot_name):
    b = Bench(fresh_db, slot_name())
    yield b
    b.close()


def needs(bench: Bench, major: int, what: str) -> None:
    if bench.major < major:
        pytest.skip(f"{what} needs PostgreSQL {major}+ (this server is {bench.major})")


def current_xid(bench: Bench) -> int:
    return xid32(bench.value("SELECT pg_current_xact_id()::text"))


def assert_recent(ts: datetime, *, within: float = 120.0) -> None:
    assert ts.tzinfo is not None
    assert abs((datetime.now(UTC) - ts).total_seconds()) < within, ts


def position(cap: Capture, msg: po.Message) -> int:
    """The index of this very message object (equal messages are not the same one)."""
    return next(n for n, m in enumerate(cap.messages) if m is msg)


def stream_blocks(cap: Capture) -> list[list[po.Message]]:
    """The Stream Start ... Stream Stop blocks, each with its start and stop."""
    blocks, cur = [], None
    for m in cap.messages:
        if type(m) is po.StreamStart:
            assert cur is None
            cur = [m]
        elif cur is not None:
            cur.append(m)
            if type(m) is po.StreamStop:
                blocks.append(cur)
                cur = None
    assert cur is None, "unterminated stream block"
    return blocks


# --------------------------------------------------------------------------- Begin, Commit, Relation, Insert

MANY_TYPES = """
CREATE SCHEMA "App";
CREATE TABLE "App"."Many Types" (
    id int PRIMARY KEY,
    i2 smallint, i8 bigint, num numeric(10,2), f8 double precision, f4 real,
    t text, vc varchar(10), ch char(3), b bool,
    d date, ts timestamp(3), tstz timestamptz, iv interval, u uuid,
    js json, jb jsonb, by bytea, ia int4[], ta text[], ip inet, bits bit(4),
    nul text
)
"""
MANY_VALUES = (
    7, -32768, 9007199254740993, "12345678.91", 1.0 / 3.0, 2.5,
    "quote ' dq \" backslash \\ newline\nunicode héllo ✓ 漢字", "abcdefghij", "ab", True,
    "2024-02-29", "2024-02-29 13:14:15.678", "2024-02-29 13:14:15.123456+05:30",
    "1 year 2 mons 3 days 04:05:06.5", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
    '{"b": [1, 2], "a": "x"}', '{"b": [1, 2], "a": "x"}', b"\x00\x01\xfe\xff",
    [1, None, 3], ["a b", 'q"uote', "", None], "192.168.0.1/24", "1011",
    None,
)


def test_begin_commit_relation_insert(bench: Bench):
    bench.run(MANY_TYPES)
    bench.setup()
    relid = bench.relid('"App"."Many Types"')
    bench.run("BEGIN")
    xid = current_xid(bench)
    placeholders = ", ".join(["%s"] * len(MANY_VALUES))
    bench.run(f'INSERT INTO "App"."Many Types" VALUES ({placeholders})', MANY_VALUES)
    bench.run("COMMIT")
    expected_row = bench.text_row('"App"."Many Types"', "id = 7")

    cap = bench.read()
    assert cap.kinds() == ["begin", "relation", "insert", "commit"]
    begin, rel, ins, commit = cap.messages

    # Begin / Commit against the COMMIT record in the WAL and the commit timestamp
    wal = bench.wal_record(bench.wal_records(bench.consistent_point), "COMMIT", xid)
    assert begin.xid == xid
    assert begin.final_lsn == commit.commit_lsn == wal.start_lsn
    assert commit.end_lsn == wal.end_lsn
    assert commit.end_lsn > commit.commit_lsn
    assert commit.flags == 0
    assert begin.commit_timestamp == commit.commit_timestamp == bench.commit_timestamp(xid)
    assert_recent(commit.commit_timestamp)

    # Relation against pg_class / pg_attribute
    assert rel.xid is None
    assert rel.relation_oid == relid
    assert (rel.namespace, rel.relation_name, rel.replica_identity) == ("App", "Many Types", "d")
    attrs = bench.attributes('"App"."Many Types"')
    assert [(c.name, c.type_oid, c.type_modifier) for c in rel.columns] == attrs
    assert [c.flags for c in rel.columns] == [1] + [0] * (len(attrs) - 1)
    assert [c.is_key for c in rel.columns] == [True] + [False] * (len(attrs) - 1)
    by_name = {c.name: c for c in rel.columns}
    assert by_name["vc"].type_modifier == 10 + 4  # VARHDRSZ + n
    assert by_name["num"].type_modifier == ((10 << 16) | 2) + 4
    assert by_name["ch"].type_modifier == 3 + 4
    assert by_name["ts"].type_modifier == 3
    assert by_name["bits"].type_modifier == 4
    assert by_name["t"].type_modifier == -1
    for name, typname in [
        ("id", "int4"), ("i2", "int2"), ("i8", "int8"), ("num", "numeric"), ("f8", "float8"),
        ("t", "text"), ("vc", "varchar"), ("ch", "bpchar"), ("b", "bool"), ("tstz", "timestamptz"),
        ("u", "uuid"), ("jb", "jsonb"), ("by", "bytea"), ("ia", "_int4"), ("ta", "_text"),
    ]:
        assert by_name[name].type_oid == bench.typid(typname), name

    # Insert: every column in PostgreSQL's text output
    assert ins.xid is None
    assert ins.relation_oid == relid
    assert ins.new == expected_row
    assert ins.new[-1] is None
    assert ins.new[6] == MANY_VALUES[6]
    assert ins.new[9] == "t"
    assert ins.new[17] == "\\x0001feff"
    assert [po.kind_of(v) for v in ins.new] == ["t"] * (len(attrs) - 1) + ["n"]


def test_one_transaction_many_statements_in_order(bench: Bench):
    bench.run("CREATE TABLE a (id int PRIMARY KEY, v text)")
    bench.run("CREATE TABLE b (id bigint PRIMARY KEY)")
    bench.setup()
    bench.run("BEGIN")
    xid = current_xid(bench)
    bench.run("INSERT INTO a SELECT i, 'v' || i FROM generate_series(1, 5) i")
    bench.run("INSERT INTO b VALUES (10), (20)")
    bench.run("INSERT INTO a VALUES (6, NULL)")
    bench.run("COMMIT")
    bench.run("INSERT INTO b VALUES (30)")  # a second transaction: no second Relation
    cap = bench.read()
    first, second = cap.transactions()
    assert [m.type for m in first] == (
        ["begin", "relation"] + ["insert"] * 5 + ["relation"] + ["insert"] * 2 + ["insert", "commit"]
    )
    assert first[0].xid == xid
    assert [m.new for m in first if type(m) is po.Insert] == [
        *[(str(i), f"v{i}") for i in range(1, 6)], ("10",), ("20",), ("6", None)
    ]
    assert [m.type for m in second] == ["begin", "insert", "commit"]
    assert second[1].relation_oid == bench.relid("b")
    assert second[0].xid != xid
    assert first[-1].end_lsn <= second[-1].commit_lsn


# --------------------------------------------------------------------------- replica identity


REPLICA_IDENTITY_TABLES = """
CREATE TABLE rid_default (id int PRIMARY KEY, val text, n int);
CREATE TABLE rid_full (id int PRIMARY KEY, val text, n int);
ALTER TABLE rid_full REPLICA IDENTITY FULL;
CREATE TABLE rid_index (a int NOT NULL, b text NOT NULL, val text);
CREATE UNIQUE INDEX rid_index_ba ON rid_index (b, a);
ALTER TABLE rid_index REPLICA IDENTITY USING INDEX rid_index_ba;
CREATE TABLE rid_nothing (id int, val text);
ALTER TABLE rid_nothing REPLICA IDENTITY NOTHING;
"""


def test_replica_identities_updates_and_deletes(bench: Bench):
    bench.run(REPLICA_IDENTITY_TABLES)
    bench.setup()
    for statement in [
        "INSERT INTO rid_default VALUES (1, 'one', 1)",
        "UPDATE rid_default SET val = 'uno' WHERE id = 1",  # key unchanged: no K
        "UPDATE rid_default SET id = 2 WHERE id = 1",  # key changed: K with the old key
        "DELETE FROM rid_default WHERE id = 2",  # K
        "INSERT INTO rid_full VALUES (1, 'one', 1), (2, NULL, 5)",
        "UPDATE rid_full SET n = 2 WHERE id = 1",  # O, the whole old row
        "UPDATE rid_full SET val = 'two' WHERE id = 2",  # O with a NULL in it
        "DELETE FROM rid_full WHERE id = 1",  # O
        "INSERT INTO rid_index VALUES (1, 'x', 'v')",
        "UPDATE rid_index SET val = 'w'",  # index columns unchanged: no K
        "UPDATE rid_index SET a = 2",  # K: the index columns, the others NULL
        "DELETE FROM rid_index",  # K
        "INSERT INTO rid_nothing VALUES (1, 'n')",
    ]:
        bench.run(statement)
    cap = bench.read()

    rels = {r.relation_name: r for r in cap.of(po.Relation)}
    assert set(rels) == {"rid_default", "rid_full", "rid_index", "rid_nothing"}
    expect_ident = {"rid_default": "d", "rid_full": "f", "rid_index": "i", "rid_nothing": "n"}
    expect_keys = {
        "rid_default": [1, 0, 0],
        "rid_full": [1, 1, 1],  # FULL: every column is part of the identity
        "rid_index": [1, 1, 0],  # the index columns, whatever their order in the index
        "rid_nothing": [0, 0],
    }
    for name, rel in rels.items():
        assert rel.relation_oid == bench.relid(name)
        assert rel.replica_identity == expect_ident[name]
        assert rel.replica_identity == bench.value(
            "SELECT relreplident::text FROM pg_class WHERE oid = %s::regclass", (name,)
        )
        assert [c.flags for c in rel.columns] == expect_keys[name], name
        assert [(c.name, c.type_oid, c.type_modifier) for c in rel.columns] == bench.attributes(name)

    changes = [
        (rel_name, m)
        for m in cap.messages
        if type(m) in (po.Insert, po.Update, po.Delete)
        for rel_name in [next(n for n, r in rels.items() if r.relation_oid == m.relation_oid)]
    ]

    def shape(m):
        if type(m) is po.Insert:
            return ("I", m.new)
        if type(m) is po.Update:
            return ("U", m.key, m.old, m.new)
        return ("D", m.key, m.old)

    assert [(n, shape(m)) for n, m in changes] == [
        ("rid_default", ("I", ("1", "one", "1"))),
        ("rid_default", ("U", None, None, ("1", "uno", "1"))),
        ("rid_default", ("U", ("1", None, None), None, ("2", "uno", "1"))),
        ("rid_default", ("D", ("2", None, None), None)),
        ("rid_full", ("I", ("1", "one", "1"))),
        ("rid_full", ("I", ("2", None, "5"))),
        ("rid_full", ("U", None, ("1", "one", "1"), ("1", "one", "2"))),
        ("rid_full", ("U", None, ("2", None, "5"), ("2", "two", "5"))),
        ("rid_full", ("D", None, ("1", "one", "2"))),
        ("rid_index", ("I", ("1", "x", "v"))),
        ("rid_index", ("U", None, None, ("1", "x", "w"))),
        ("rid_index", ("U", ("1", "x", None), None, ("2", "x", "w"))),
        ("rid_index", ("D", ("2", "x", None), None)),
        ("rid_nothing", ("I", ("1", "n"))),
    ]
    assert all(m.xid is None for _, m in changes)


# --------------------------------------------------------------------------- TOAST

BIG_TEXT = "SELECT string_agg(md5(i::text), '') FROM generate_series(1, 400) i"  # 12800 chars


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_unchanged_toast_value(bench: Bench, binary: bool):
    bench.run("CREATE TABLE toasty (id int PRIMARY KEY, big text, n int)")
    bench.run("ALTER TABLE toasty ALTER COLUMN big SET STORAGE EXTERNAL")
    bench.setup()
    bench.run(f"INSERT INTO toasty SELECT 1, ({BIG_TEXT}), 0")
    bench.run("UPDATE toasty SET n = 1 WHERE id = 1")  # big untouched: sent as 'u'
    bench.run("UPDATE toasty SET big = big || 'x', n = 2 WHERE id = 1")  # changed: sent
    big = bench.value("SELECT big FROM toasty")
    assert len(big) == 12801
    toast = bench.value("SELECT reltoastrelid::regclass::text FROM pg_class WHERE oid = 'toasty'::regclass")
    assert bench.value(f"SELECT count(*) FROM {toast}") > 0, "the value must live out of line"
    cap = bench.read(binary=binary)
    ins = cap.one(po.Insert)
    upd1, upd2 = cap.of(po.Update)

    def enc(s: str):
        return s.encode() if binary else s

    def enc_int(n: int):
        return struct.pack("!i", n) if binary else str(n)

    assert ins.new == (enc_int(1), enc(big[:-1]), enc_int(0))
    assert upd1.key is None and upd1.old is None
    assert upd1.new[0] == enc_int(1) and upd1.new[2] == enc_int(1)
    assert upd1.new[1] is po.UNCHANGED_TOAST
    assert [po.kind_of(v) for v in upd1.new] == (["b", "u", "b"] if binary else ["t", "u", "t"])
    assert upd1.to_dict()["new"][1] == {"kind": "u", "value": None}
    assert upd2.new == (enc_int(1), enc(big), enc_int(2))


def test_wide_table_and_megabyte_value(bench: Bench):
    cols = ", ".join(f"c{i} int" for i in range(1, 1000))
    bench.run(f"CREATE TABLE wide (id int PRIMARY KEY, {cols}, huge text)")
    bench.setup()
    values = ", ".join("NULL" if i % 3 == 0 else str(i * 1000) for i in range(1, 1000))
    bench.run(
        f"INSERT INTO wide VALUES (1, {values}, "
        "(SELECT string_agg(md5(i::text), '') FROM generate_series(1, 40000) i))"
    )
    for binary in (False, True):
        cap = bench.read(binary=binary)
        rel = cap.one(po.Relation)
        assert len(rel.columns) == 1001
        assert [(c.name, c.type_oid, c.type_modifier) for c in rel.columns] == bench.attributes("wide")
        new = cap.one(po.Insert).new
        assert len(new) == 1001
        assert [v is None for v in new[1:1000]] == [i % 3 == 0 for i in range(1, 1000)]
        huge = new[-1] if not binary else new[-1].decode()
        assert len(huge) == 1_280_000
        assert huge == bench.value("SELECT huge FROM wide")
        if binary:
            assert new[2] == struct.pack("!i", 2000)
        else:
            assert new[:3] == ("1", "1000", "2000")


# --------------------------------------------------------------------------- Truncate


def test_truncate_options_and_relations(bench: Bench):
    bench.run(
        """
        CREATE TABLE tp (id serial PRIMARY KEY);
        CREATE TABLE tc (id int PRIMARY KEY, pid int REFERENCES tp);
        CREATE TABLE tq (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text);
        CREATE TABLE tr (id int PRIMARY KEY);
        """
    )
    bench.setup()
    oids = {n: bench.relid(n) for n in ("tp", "tc", "tq", "tr")}
    for statement in [
        "INSERT INTO tp DEFAULT VALUES",
        "INSERT INTO tc VALUES (1, 1)",
        "INSERT INTO tq (v) VALUES ('x')",
        "TRUNCATE tp, tq RESTART IDENTITY CASCADE",  # cascades to tc
        "TRUNCATE tq",
        "TRUNCATE tq RESTART IDENTITY",
        "TRUNCATE tp CASCADE",
        "TRUNCATE tr, tq",
    ]:
        bench.run(statement)
    cap = bench.read()
    truncates = cap.of(po.Truncate)
    assert [(t.options, t.cascade, t.restart_identity) for t in truncates] == [
        (3, True, True), (0, False, False), (2, False, True), (1, True, False), (0, False, False),
    ]
    expected_sets = [{"tp", "tq", "tc"}, {"tq"}, {"tq"}, {"tp", "tc"}, {"tr", "tq"}]
    for t, names in zip(truncates, expected_sets, strict=True):
        assert t.xid is None
        assert len(t.relation_oids) == len(set(t.relation_oids))
        assert set(t.relation_oids) == {oids[n] for n in names}
    # every truncated relation was described by a Relation message before its Truncate
    seen: set[int] = set()
    for m in cap.messages:
        if type(m) is po.Relation:
            seen.add(m.relation_oid)
        elif type(m) is po.Truncate:
            assert set(m.relation_oids) <= seen
    d = truncates[0].to_dict()
    assert d["cascade"] is True and d["restart_identity"] is True
    assert sorted(d["relation_oids"]) == sorted(truncates[0].relation_oids)


# --------------------------------------------------------------------------- logical messages


def test_logical_messages(bench: Bench):
    bench.run("CREATE TABLE m (id int PRIMARY KEY)")
    bench.setup()
    end_nt = LSN.parse(
        bench.value("SELECT pg_logical_emit_message(false, 'pfx-nt', '\\x00ff01'::bytea)::text")
    )
    bench.run("BEGIN")
    xid = current_xid(bench)
    bench.run("INSERT INTO m VALUES (1)")
    end_t = LSN.parse(
        bench.value("SELECT pg_logical_emit_message(true, 'préfixe ✓', 'hello ✓')::text")
    )
    bench.run("COMMIT")
    bench.run("BEGIN")
    bench.run("SELECT pg_logical_emit_message(true, 'lost', 'rolled back')")
    bench.run("SELECT pg_logical_emit_message(false, 'kept', 'not transactional')")
    bench.run("ROLLBACK")
    bench.run("SELECT pg_logical_emit_message(true, 'alone', '')")  # a transaction of its own
    records = bench.wal_records(bench.consistent_point)

    cap = bench.read(messages=True)
    assert cap.kinds() == [
        "message",
        "begin", "relation", "insert", "message", "commit",
        "message",
        "begin", "message", "commit",
    ]
    nt, t, kept, alone = cap.of(po.LogicalMessage)
    messages = [r for r in records if r.resource_manager == "LogicalMessage"]
    assert len(messages) == 5  # the rolled-back transactional one is in the WAL too
    by_end = {r.end_lsn: r for r in messages}

    assert (nt.xid, nt.flags, nt.transactional) == (None, 0, False)
    assert nt.prefix == "pfx-nt" and nt.content == b"\x00\xff\x01"
    # the message LSN is the END of its WAL record, which pg_logical_emit_message returns
    assert nt.lsn == end_nt and end_nt in by_end

    assert (t.xid, t.flags, t.transactional) == (None, 1, True)
    assert t.prefix == "préfixe ✓" and t.content == "hello ✓".encode()
    assert t.lsn == end_t and end_t in by_end
    assert cap.messages[1].xid == xid
    assert cap.messages[1].final_lsn >= t.lsn  # the commit record follows the message

    assert (kept.flags, kept.prefix, kept.content) == (0, "kept", b"not transactional")
    assert (alone.flags, alone.prefix, alone.content) == (1, "alone", b"")
    d = t.to_dict()
    assert d["transactional"] is True and d["content_text"] == "hello ✓"
    assert "content_text" not in nt.to_dict()

    # without messages=true pgoutput sends none of them
    plain = bench.read()
    assert plain.kinds() == ["begin", "relation", "insert", "commit"]


# --------------------------------------------------------------------------- origin


def test_origin_message(bench: Bench):
    bench.run("CREATE TABLE o (id int PRIMARY KEY)")
    bench.setup()
    origin = "origin_" + bench.slot[-24:]
    bench.run("SELECT pg_replication_origin_create(%s)", (origin,))
    try:
        roident = bench.value("SELECT pg_replication_origin_oid(%s)", (origin,))
        session = bench.connect()
        session.execute("SELECT pg_replication_origin_session_setup(%s)", (origin,))
        session.execute("BEGIN")
        session.execute(
            "SELECT pg_replication_origin_xact_setup('0/ABCDEF', '2001-02-03 04:05:06.789012+00')"
        )
        session.execute("INSERT INTO o VALUES (1)")
        xid = xid32(session.execute("SELECT pg_current_xact_id()::text").fetchone()[0])
        session.execute("COMMIT")
        session.execute("SELECT pg_replication_origin_session_reset()")
        bench.run("INSERT INTO o VALUES (2)")  # not from the origin: no Origin message
        cap = bench.read()
        first, second = cap.transactions()
        assert [m.type for m in first] == ["begin", "origin", "relation", "insert", "commit"]
        begin, orig = first[0], first[1]
        assert begin.xid == xid
        assert orig.commit_lsn == LSN.parse("0/ABCDEF")
        assert orig.name == origin
        # the origin's timestamp is the transaction's commit timestamp
        when = datetime(2001, 2, 3, 4, 5, 6, 789012, tzinfo=UTC)
        assert begin.commit_timestamp == first[-1].commit_timestamp == when
        assert bench.commit_timestamp(xid) == when
        assert roident is not None
        assert [m.type for m in second] == ["begin", "insert", "commit"]

        if bench.major >= 16:
            # origin = 'none' filters the transaction out, 'any' keeps it
            none = bench.read(origin="none")
            assert [[m.type for m in tx] for tx in none.transactions()] == [
                ["begin", "relation", "insert", "commit"]
            ]
            assert none.of(po.Insert)[0].new == ("2",)
            anyo = bench.read(origin="any")
            assert anyo.kinds() == cap.kinds()
    finally:
        bench.run("SELECT pg_replication_origin_drop(%s)", (origin,))


def test_origin_inside_streamed_transaction(bench: Bench):
    """A streamed transaction names its origin once, in its first stream block, with
    no LSN (the origin's commit LSN is not known before the commit)."""
    bench.run("CREATE TABLE big (id int PRIMARY KEY, pad text)")
    bench.setup()
    origin = "origin_" + bench.slot[-24:]
    bench.run("SELECT pg_replication_origin_create(%s)", (origin,))
    try:
        session = bench.connect()
        session.execute("SELECT pg_replication_origin_session_setup(%s)", (origin,))
        session.execute("BEGIN")
        session.execute("SELECT pg_replication_origin_xact_setup('1/2345', now())")
        session.execute(
            "INSERT INTO big SELECT i, repeat(md5(i::text), 3) FROM generate_series(1, 3000) i"
        )
        xid = xid32(session.execute("SELECT pg_current_xact_id()::text").fetchone()[0])
        session.execute("COMMIT")
        session.execute("SELECT pg_replication_origin_session_reset()")
        cap = bench.read(streaming="on", small_work_mem=True)
    finally:
        bench.run("SELECT pg_replication_origin_drop(%s)", (origin,))
    blocks = stream_blocks(cap)
    assert len(blocks) >= 2
    assert [type(m) for m in blocks[0][:3]] == [po.StreamStart, po.Origin, po.Relation]
    assert blocks[0][1] == po.Origin(LSN(0), origin)
    assert blocks[0][2].xid == xid  # the stream state survived the Origin
    assert not any(type(m) is po.Origin for b in blocks[1:] for m in b)
    assert cap.of(po.StreamCommit)[0].xid == xid


# --------------------------------------------------------------------------- Type


def test_type_messages(bench: Bench):
    bench.run(
        """
        CREATE SCHEMA "Typ";
        CREATE TYPE "Typ".mood AS ENUM ('sad', 'ok', 'happy');
        CREATE DOMAIN "Typ".posint AS int4 CHECK (VALUE > 0);
        CREATE TYPE "Typ".pair AS (a int, b text);
        CREATE DOMAIN "Typ".short_text AS varchar(5);
        CREATE TABLE "Typ".typed (
            id int PRIMARY KEY, m "Typ".mood, p "Typ".posint, c "Typ".pair,
            ms "Typ".mood[], st "Typ".short_text, plain text
        );
        """
    )
    bench.setup()
    bench.run(
        """INSERT INTO "Typ".typed VALUES (1, 'happy', 7, ROW(1, 'x y'), '{sad,ok}', 'abc', 'p')"""
    )
    cap = bench.read()
    assert cap.kinds() == ["begin", "type", "type", "type", "type", "type", "relation", "insert", "commit"]
    oid = {n: bench.typid(f'"Typ".{n}') for n in ("mood", "posint", "pair", "mood[]", "short_text")}
    types = [(t.xid, t.type_oid, t.namespace, t.type_name) for t in cap.of(po.Type)]
    # one Type per user-defined column type, in column order; a domain is described by
    # its base type's namespace and name (pg_catalog is sent as "")
    assert types == [
        (None, oid["mood"], "Typ", "mood"),
        (None, oid["posint"], "", "int4"),
        (None, oid["pair"], "Typ", "pair"),
        (None, oid["mood[]"], "Typ", "_mood"),
        (None, oid["short_text"], "", "varchar"),
    ]
    rel = cap.one(po.Relation)
    assert rel.namespace == "Typ" and rel.relation_name == "typed"
    assert [(c.name, c.type_oid, c.type_modifier) for c in rel.columns] == bench.attributes(
        '"Typ".typed'
    )
    assert [c.type_oid for c in rel.columns][1:6] == [
        oid["mood"], oid["posint"], oid["pair"], oid["mood[]"], oid["short_text"]
    ]
    assert cap.one(po.Insert).new == ("1", "happy", "7", '(1,"x y")', "{sad,ok}", "abc", "p")


# --------------------------------------------------------------------------- streaming (v2+)

BIG_TABLE = "CREATE TABLE big (id int PRIMARY KEY, pad text)"


def insert_rows(bench: Bench, first: int, last: int) -> None:
    bench.run(
        "INSERT INTO big SELECT i, repeat(md5(i::text), 3) FROM generate_series(%s::int, %s::int) i",
        (first, last),
    )


def test_streamed_transaction_commit(bench: Bench):
    bench.run(BIG_TABLE)
    bench.run(
        """
        CREATE TYPE mood AS ENUM ('a', 'b');
        CREATE TABLE side (id int PRIMARY KEY, m mood, note text);
        CREATE TABLE gone (id int PRIMARY KEY);
        INSERT INTO side VALUES (1, 'a', 'x');
        INSERT INTO gone VALUES (1);
        """
    )
    bench.setup()
    bench.run("BEGIN")
    xid = current_xid(bench)
    insert_rows(bench, 1, 2000)
    msg_end = LSN.parse(bench.value("SELECT pg_logical_emit_message(true, 'mid', 'stream')::text"))
    bench.run("INSERT INTO side VALUES (2, 'b', 'ünï ✓')")  # Type + Relation inside a block
    bench.run("UPDATE side SET note = 'upd' WHERE id = 1")
    bench.run("UPDATE big SET id = -1 WHERE id = 1")
    bench.run("DELETE FROM big WHERE id = 2")
    bench.run("TRUNCATE gone")
    insert_rows(bench, 2001, 4000)
    bench.run("COMMIT")
    commit = bench.wal_record(bench.wal_records(bench.consistent_point), "COMMIT", xid)

    cap = bench.read(streaming="on", messages=True, small_work_mem=True)
    assert cap.proto_version >= 2
    assert not cap.of(po.Begin) and not cap.of(po.Commit)
    blocks = stream_blocks(cap)
    assert len(blocks) >= 2, "64kB of work memory must split 4000 rows into several blocks"
    assert [b[0].first_segment for b in blocks] == [True] + [False] * (len(blocks) - 1)
    assert all(b[0].xid == xid for b in blocks)
    inside = [m for b in blocks for m in b[1:-1]]
    assert all(m.xid == xid for m in inside), {m.xid for m in inside}
    rels = [m for m in inside if type(m) is po.Relation]
    assert [r.relation_oid for r in rels] == [bench.relid(n) for n in ("big", "side", "gone")]
    (typ,) = [m for m in inside if type(m) is po.Type]
    assert (typ.xid, typ.type_oid, typ.namespace, typ.type_name) == (
        xid, bench.typid("mood"), "public", "mood"
    )
    inserts = [m for m in inside if type(m) is po.Insert and m.relation_oid == rels[0].relation_oid]
    assert [int(m.new[0]) for m in inserts] == list(range(1, 4001))
    (msg,) = [m for m in inside if type(m) is po.LogicalMessage]
    assert (msg.xid, msg.flags, msg.prefix, msg.content, msg.lsn) == (
        xid, 1, "mid", b"stream", msg_end
    )
    at = {id(m): n for n, m in enumerate(inside)}
    middle = inside[at[id(inserts[1999])] + 1 : at[id(inserts[2000])]]
    assert [m.type for m in middle] == [
        "message", "type", "relation", "insert", "update", "update", "delete",
        "relation", "truncate",
    ]
    assert middle[3].new == ("2", "b", "ünï ✓")
    assert (middle[4].key, middle[4].new) == (None, ("1", "a", "upd"))
    assert (middle[5].key, middle[5].new[0]) == (("1", None), "-1")
    assert (middle[6].key, middle[6].old) == (("2", None), None)
    assert middle[8].relation_oids == (bench.relid("gone"),) and middle[8].options == 0

    # after the last block: Stream Commit, and nothing else
    sc = cap.messages[-1]
    assert type(sc) is po.StreamCommit
    assert cap.messages[-2] is blocks[-1][-1]
    assert (sc.xid, sc.flags) == (xid, 0)
    assert (sc.commit_lsn, sc.end_lsn) == (commit.start_lsn, commit.end_lsn)
    assert sc.commit_timestamp == bench.commit_timestamp(xid)

    # the same transaction without streaming: Begin ... Commit, the same messages
    # (without their xid), the same commit
    plain = bench.read(messages=True, small_work_mem=True)
    (tx,) = plain.transactions()
    assert tx[0].xid == xid and tx[0].final_lsn == sc.commit_lsn
    assert tx[-1].end_lsn == sc.end_lsn and tx[-1].commit_timestamp == sc.commit_timestamp
    assert tx[1:-1] == [dataclasses.replace(m, xid=None) for m in inside]

    # and streamed with binary tuples: the same rows in send format
    binary = bench.read(streaming="on", binary=True, small_work_mem=True)
    big_oid = rels[0].relation_oid
    rows = [m.new for m in binary.of(po.Insert) if m.relation_oid == big_oid]
    assert rows == [(struct.pack("!i", int(r[0])), r[1].encode()) for r in (m.new for m in inserts)]
    assert all(m.xid == xid for m in binary.of(po.Insert))


def test_streamed_transaction_abort(bench: Bench):
    bench.run(BIG_TABLE)
    bench.setup()
    # The walsender must decode the rows while the transaction is still open: since
    # PostgreSQL 18 it discards, unstreamed, a transaction that CLOG already says
    # aborted. So read live.
    with bench.stream(streaming="on", small_work_mem=True) as live:
        bench.run("BEGIN")
        xid = current_xid(bench)
        insert_rows(bench, 1, 3000)
        live.until()
        bench.run("ROLLBACK")
        bench.run("INSERT INTO big VALUES (0, 'after')")
        live.until()
    cap = live.capture()
    blocks = stream_blocks(cap)
    assert blocks and all(b[0].xid == xid for b in blocks)
    assert all(m.xid == xid for b in blocks for m in b[1:-1])
    aborts = cap.of(po.StreamAbort)
    assert len(aborts) == 1
    abort = aborts[0]
    # without streaming = parallel the abort carries no LSN/timestamp, even on v4
    assert (abort.xid, abort.subxid, abort.abort_lsn, abort.abort_timestamp) == (
        xid, xid, None, None
    )
    assert position(cap, abort) == position(cap, blocks[-1][-1]) + 1
    assert not cap.of(po.StreamCommit)
    (tx,) = cap.transactions()  # the small transaction after it: not streamed
    assert [m.new for m in tx if type(m) is po.Insert] == [("0", "after")]


def test_aborted_transaction_decoded_late(bench: Bench):
    """Decoded only after its ROLLBACK: PostgreSQL 15 streams it and sends Stream Abort;
    18 finds it aborted in CLOG and sends nothing for it at all."""
    bench.run(BIG_TABLE)
    bench.setup()
    bench.run("BEGIN")
    xid = current_xid(bench)
    insert_rows(bench, 1, 3000)
    bench.run("ROLLBACK")
    cap = bench.read(streaming="on", small_work_mem=True)
    if bench.major >= 18:
        assert cap.messages == []
    else:
        assert cap.of(po.StreamStart)[0].xid == xid
        assert type(cap.messages[-1]) is po.StreamAbort
        assert (cap.messages[-1].xid, cap.messages[-1].subxid) == (xid, xid)


def subtransaction_workload(bench: Bench) -> tuple[int, int, int]:
    """BEGIN; 1500 rows; SAVEPOINT; 1500 rows; ROLLBACK TO; 1500 rows; COMMIT.
    Returns the top-level xid, the rolled-back subtransaction's xid, and the xid of
    the subtransaction that ROLLBACK TO SAVEPOINT starts (the savepoint stays)."""
    bench.run("BEGIN")
    xid = current_xid(bench)
    insert_rows(bench, 1, 1500)
    bench.run("SAVEPOINT s1")
    insert_rows(bench, 1501, 3000)
    subxid = int(bench.value("SELECT xmin::text::bigint FROM big WHERE id = 1501"))
    bench.run("ROLLBACK TO SAVEPOINT s1")
    insert_rows(bench, 3001, 4500)
    subxid2 = int(bench.value("SELECT xmin::text::bigint FROM big WHERE id = 3001"))
    bench.run("COMMIT")
    return xid, subxid, subxid2


def check_subtransaction_stream(
    cap: Capture, xid: int, subxid: int, subxid2: int
) -> po.StreamAbort:
    assert len({xid, subxid, subxid2}) == 3
    blocks = stream_blocks(cap)
    assert all(b[0].xid == xid for b in blocks)
    inserts = [m for b in blocks for m in b if type(m) is po.Insert]
    # a change carries the xid of the (sub)transaction that made it, not the top one
    ids = [int(m.new[0]) for m in inserts]
    sub = [m for m, i in zip(inserts, ids, strict=True) if 1501 <= i <= 3000]
    assert sub, "the subtransaction's rows must have been streamed before its abort"
    assert {m.xid for m in sub} == {subxid}
    assert {m.xid for m, i in zip(inserts, ids, strict=True) if i <= 1500} == {xid}
    assert {m.xid for m, i in zip(inserts, ids, strict=True) if i > 3000} == {subxid2}
    (abort,) = cap.of(po.StreamAbort)
    assert (abort.xid, abort.subxid) == (xid, subxid)
    pos = {id(m): n for n, m in enumerate(cap.messages)}
    assert pos[id(sub[-1])] < pos[id(abort)]
    after = [m for m, i in zip(inserts, ids, strict=True) if i > 3000]
    assert [int(m.new[0]) for m in after] == list(range(3001, 4501))
    assert pos[id(abort)] < pos[id(after[0])]
    assert [i for i in ids if i <= 1500] == list(range(1, 1501))
    commit = cap.messages[-1]
    assert type(commit) is po.StreamCommit and commit.xid == xid
    return abort


def test_streamed_subtransaction_abort(bench: Bench):
    bench.run(BIG_TABLE)
    bench.setup()
    xid, subxid, subxid2 = subtransaction_workload(bench)
    cap = bench.read(streaming="on", small_work_mem=True)
    abort = check_subtransaction_stream(cap, xid, subxid, subxid2)
    assert abort.abort_lsn is None and abort.abort_timestamp is None
    assert cap.messages[-1].commit_timestamp == bench.commit_timestamp(xid)


def test_parallel_streaming_abort_lsn_and_timestamp(bench: Bench):
    needs(bench, 16, "streaming = parallel (Stream Abort with LSN and timestamp, protocol v4)")
    bench.run(BIG_TABLE)
    bench.setup()
    start = bench.insert_lsn()
    with bench.stream(streaming="parallel", small_work_mem=True) as live:
        xid, subxid, subxid2 = subtransaction_workload(bench)
        live.until()
        bench.run("BEGIN")
        xid2 = current_xid(bench)
        insert_rows(bench, 10001, 13000)
        live.until()
        before = bench.value("SELECT clock_timestamp()")
        bench.run("ROLLBACK")
        after = bench.value("SELECT clock_timestamp()")
        live.until()
    cap = live.capture()
    records = bench.wal_records(start)
    assert cap.proto_version == 4 and cap.options.parallel_streaming
    first = cap.messages[: cap.messages.index(cap.one(po.StreamCommit)) + 1]
    sub_abort = check_subtransaction_stream(Capture(first, [], cap.options), xid, subxid, subxid2)
    sub_record = bench.wal_record(records, "ABORT", subxid)
    assert sub_abort.abort_lsn == sub_record.end_lsn  # the END of the abort record
    assert_recent(sub_abort.abort_timestamp)
    top_abort = cap.of(po.StreamAbort)[-1]
    top_record = bench.wal_record(records, "ABORT", xid2)
    assert (top_abort.xid, top_abort.subxid) == (xid2, xid2)
    assert top_abort.abort_lsn == top_record.end_lsn
    assert before <= top_abort.abort_timestamp <= after
    assert sub_abort.abort_timestamp < top_abort.abort_timestamp
    assert cap.messages[-1] is top_abort
    assert stream_blocks(Capture(cap.messages[len(first):], [], cap.options))[0][0].xid == xid2


# --------------------------------------------------------------------------- two-phase (v3+)


def prepared_time(bench: Bench, gid: str) -> datetime:
    return bench.value("SELECT prepared FROM pg_prepared_xacts WHERE gid = %s", (gid,))


def test_two_phase_commit_and_rollback_prepared(bench: Bench):
    bench.run("CREATE TABLE tp (id int PRIMARY KEY, v text)")
    bench.setup(two_phase=True)
    bench.run("BEGIN")
    xid1 = current_xid(bench)
    bench.run("INSERT INTO tp VALUES (1, 'committed')")
    bench.run("PREPARE TRANSACTION 'gid-commit ✓'")
    prepared1 = prepared_time(bench, "gid-commit ✓")
    bench.run("COMMIT PREPARED 'gid-commit ✓'")
    bench.run("BEGIN")
    xid2 = current_xid(bench)
    bench.run("INSERT INTO tp VALUES (2, 'rolled back')")
    bench.run("PREPARE TRANSACTION 'gid-rollback'")
    prepared2 = prepared_time(bench, "gid-rollback")
    before = bench.value("SELECT clock_timestamp()")
    bench.run("ROLLBACK PREPARED 'gid-rollback'")
    after = bench.value("SELECT clock_timestamp()")
    records = bench.wal_records(bench.consistent_point)

    cap = bench.read(two_phase=True)
    assert cap.proto_version == (3 if bench.major == 15 else 4)
    assert cap.kinds() == [
        "begin_prepare", "relation", "insert", "prepare", "commit_prepared",
        "begin_prepare", "insert", "prepare", "rollback_prepared",
    ]
    bp1, _, ins1, p1, cp1, bp2, ins2, p2, rp2 = cap.messages
    prep1 = bench.wal_record(records, "PREPARE", xid1)
    prep2 = bench.wal_record(records, "PREPARE", xid2)
    commit_prepared = bench.wal_record(records, "COMMIT_PREPARED")
    abort_prepared = bench.wal_record(records, "ABORT_PREPARED")

    for bp, p, rec, xid, gid, ts in [
        (bp1, p1, prep1, xid1, "gid-commit ✓", prepared1),
        (bp2, p2, prep2, xid2, "gid-rollback", prepared2),
    ]:
        assert (bp.prepare_lsn, bp.end_lsn) == (p.prepare_lsn, p.end_lsn) == (
            rec.start_lsn, rec.end_lsn
        )
        assert bp.prepare_timestamp == p.prepare_timestamp == ts
        assert (bp.xid, bp.gid) == (p.xid, p.gid) == (xid, gid)
        assert p.flags == 0
    assert ins1.new == ("1", "committed") and ins2.new == ("2", "rolled back")
    assert ins1.xid is None

    assert cp1.flags == 0
    assert (cp1.xid, cp1.gid) == (xid1, "gid-commit ✓")
    assert (cp1.commit_lsn, cp1.end_lsn) == (commit_prepared.start_lsn, commit_prepared.end_lsn)
    assert cp1.commit_timestamp == bench.commit_timestamp(xid1)

    assert rp2.flags == 0
    assert (rp2.xid, rp2.gid) == (xid2, "gid-rollback")
    assert rp2.prepare_end_lsn == p2.end_lsn
    assert rp2.rollback_end_lsn == abort_prepared.end_lsn
    assert rp2.prepare_timestamp == prepared2
    assert before <= rp2.rollback_timestamp <= after


def test_stream_prepare(bench: Bench):
    bench.run(BIG_TABLE)
    bench.setup(two_phase=True)
    with bench.stream(two_phase=True, streaming="on", small_work_mem=True) as live:
        bench.run("BEGIN")
        xid = current_xid(bench)
        insert_rows(bench, 1, 3000)
        bench.run("PREPARE TRANSACTION 'big-gid'")
        prepared = prepared_time(bench, "big-gid")
        bench.run("COMMIT PREPARED 'big-gid'")
        # the second one is decoded live, before its ROLLBACK PREPARED: see
        # test_prepared_transaction_rolled_back_before_decoding for the other case
        bench.run("BEGIN")
        xid2 = current_xid(bench)
        insert_rows(bench, 5001, 8000)
        live.until()
        bench.run("PREPARE TRANSACTION 'big-gid-2'")
        bench.run("ROLLBACK PREPARED 'big-gid-2'")
        live.until()
    cap = live.capture()
    records = bench.wal_records(bench.consistent_point)
    end_first = position(cap, cap.one(po.CommitPrepared))
    first = Capture(cap.messages[: end_first + 1], [], cap.options)
    blocks = stream_blocks(first)
    assert blocks and all(b[0].xid == xid for b in blocks)
    assert sum(type(m) is po.Insert for b in blocks for m in b) == 3000
    sp, cp = first.messages[-2:]
    assert type(sp) is po.StreamPrepare and type(cp) is po.CommitPrepared
    assert first.messages[-3] is blocks[-1][-1]
    prep = bench.wal_record(records, "PREPARE", xid)
    assert sp.flags == 0
    assert (sp.prepare_lsn, sp.end_lsn) == (prep.start_lsn, prep.end_lsn)
    assert (sp.xid, sp.gid, sp.prepare_timestamp) == (xid, "big-gid", prepared)
    assert (cp.xid, cp.gid) == (xid, "big-gid")
    assert cp.commit_timestamp == bench.commit_timestamp(xid)
    assert not cap.of(po.BeginPrepare) and not cap.of(po.Prepare)
    # a streamed prepared transaction rolled back: Stream Prepare, Rollback Prepared
    second = Capture(cap.messages[end_first + 1 :], [], cap.options)
    assert stream_blocks(second)[0][0] == po.StreamStart(xid2, True)
    sp2, rp2 = second.messages[-2:]
    assert type(sp2) is po.StreamPrepare and type(rp2) is po.RollbackPrepared
    assert (sp2.xid, sp2.gid, rp2.xid, rp2.gid) == (xid2, "big-gid-2", xid2, "big-gid-2")
    assert rp2.prepare_end_lsn == sp2.end_lsn == bench.wal_record(records, "PREPARE", xid2).end_lsn
    assert rp2.rollback_end_lsn == bench.wal_record(records, "ABORT_PREPARED").end_lsn
    assert rp2.prepare_timestamp == sp2.prepare_timestamp


def test_prepared_transaction_rolled_back_before_decoding(bench: Bench):
    """Decoded only after ROLLBACK PREPARED: PostgreSQL 15 streams it (Stream Prepare);
    18 finds it aborted while over the memory limit, drops its changes and sends an
    EMPTY prepared transaction (Begin Prepare, Prepare), then Rollback Prepared."""
    bench.run(BIG_TABLE)
    bench.setup(two_phase=True)
    bench.run("BEGIN")
    xid = current_xid(bench)
    insert_rows(bench, 1, 3000)
    bench.run("PREPARE TRANSACTION 'late'")
    bench.run("ROLLBACK PREPARED 'late'")
    cap = bench.read(two_phase=True, streaming="on", small_work_mem=True)
    if bench.major >= 18:
        assert cap.kinds() == ["begin_prepare", "prepare", "rollback_prepared"]
    else:
        assert cap.kinds()[0] == "stream_start" and cap.kinds()[-2:] == [
            "stream_prepare", "rollback_prepared"
        ]
    assert {m.xid for m in cap.messages if hasattr(m, "gid")} == {xid}
    assert cap.messages[-1].prepare_end_lsn == cap.messages[-2].end_lsn


# --------------------------------------------------------------------------- binary tuples


def test_binary_tuples_are_the_send_format(bench: Bench):
    bench.run(
        """
        CREATE TABLE bin (
            id int PRIMARY KEY, i2 smallint, i8 bigint, b bool, f bool, t text, f8 float8,
            by bytea, u uuid, d date, n numeric(10,2), tstz timestamptz, ia int4[],
            jb jsonb, nul int, vc varchar(5)
        )
        """
    )
    bench.setup()
    bench.run(
        "INSERT INTO bin VALUES (42, -2, 1234567890123, true, false, 'héllo', 0.5, "
        "'\\x00ff'::bytea, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '2000-01-02', 3.14, "
        "'2000-01-01 00:00:01+00', '{1,2,NULL}', '{\"a\": 1}', NULL, 'ab')"
    )
    cap = bench.read(binary=True)
    ins = cap.one(po.Insert)
    assert all(type(v) is bytes for v in ins.new if v is not None)
    assert ins.new[:7] == (
        struct.pack("!i", 42), struct.pack("!h", -2), struct.pack("!q", 1234567890123),
        b"\x01", b"\x00", "héllo".encode(), struct.pack("!d", 0.5),
    )
    assert ins.new[7] == b"\x00\xff"
    assert ins.new[8] == bytes.fromhex("a0eebc999c0b4ef8bb6d6bb9bd380a11")
    assert ins.new[9] == struct.pack("!i", 1)  # days since 2000-01-01
    assert ins.new[11] == struct.pack("!q", 1_000_000)  # microseconds since 2000-01-01
    assert ins.new[14] is None
    # every column equals what the type's send function makes of the stored value
    for i, (name, typid, _) in enumerate(bench.attributes("bin")):
        send = bench.value("SELECT typsend::regproc::text FROM pg_type WHERE oid = %s", (typid,))
        expected = bench.value(f"SELECT {send}({name}) FROM bin")
        assert ins.new[i] == (None if expected is None else bytes(expected)), (name, send)
    assert po.tuple_to_json(ins.new)[0] == {"kind": "b", "value": "AAAAKg=="}


# --------------------------------------------------------------------------- protocol versions


@pytest.mark.parametrize("version", [1, 2, 3, 4], ids=lambda v: f"v{v}")
def test_protocol_version_basic_workload(bench: Bench, version: int):
    if version == 4:
        needs(bench, 16, "pgoutput protocol version 4")
    bench.run("CREATE TABLE pv (id int PRIMARY KEY, v text)")
    bench.setup()
    bench.run("BEGIN")
    xid = current_xid(bench)
    bench.run("INSERT INTO pv VALUES (1, 'a'), (2, 'b')")
    bench.run("UPDATE pv SET v = 'c' WHERE id = 1")
    bench.run("UPDATE pv SET id = 3 WHERE id = 2")
    bench.run("DELETE FROM pv WHERE id = 1")
    bench.run("TRUNCATE pv")
    bench.run("COMMIT")
    cap = bench.read(proto_version=version)
    assert cap.proto_version == version
    # TRUNCATE invalidates the relation's cache entry: pgoutput describes it again
    assert cap.kinds() == [
        "begin", "relation", "insert", "insert", "update", "update", "delete",
        "relation", "truncate", "commit",
    ]
    begin, rel, i1, i2, u1, u2, d, rel_again, t, commit = cap.messages
    assert rel_again == rel
    assert begin.xid == xid and begin.final_lsn == commit.commit_lsn
    assert commit.commit_timestamp == bench.commit_timestamp(xid)
    assert rel.relation_oid == bench.relid("pv") and rel.xid is None
    assert (i1.new, i2.new) == (("1", "a"), ("2", "b"))
    assert (u1.key, u1.new) == (None, ("1", "c"))
    assert (u2.key, u2.new) == (("2", None), ("3", "b"))
    assert (d.key, d.old) == (("1", None), None)
    assert (t.options, t.relation_oids) == (0, (rel.relation_oid,))
    assert all(getattr(m, "xid", None) is None for m in cap.messages[1:])


def test_protocol_version_negotiation(bench: Bench):
    bench.run("CREATE TABLE n (id int PRIMARY KEY)")
    bench.setup(two_phase=True)
    bench.run("INSERT INTO n VALUES (1)")
    plain = bench.read()
    two_phase = bench.read(two_phase=True)
    assert plain.proto_version == (2 if bench.major == 15 else 4)
    assert two_phase.proto_version == (3 if bench.major == 15 else 4)
    assert plain.kinds() == two_phase.kinds() == ["begin", "relation", "insert", "commit"]


# --------------------------------------------------------------------------- connection layer


def test_connect_options_keyword_reaches_the_walsender(fresh_db):
    """The streaming tests rely on it (it was once dropped by replication_conninfo)."""
    with ReplicationConnection.connect(fresh_db, options=SMALL_WORK_MEM) as conn:
        assert conn.show("logical_decoding_work_mem") == "64kB"


def test_read_until_reads_a_prepared_transaction_to_its_prepare(bench: Bench):
    """Begin Prepare has an end LSN too, but does not end the transaction (read_until
    once stopped there when the PREPARE record was the last one written)."""
    from airflow_pgcdc.pg.logical import LogicalStream
    from airflow_pgcdc.protocol.pgoutput.options import PgoutputOptions

    bench.run("CREATE TABLE t (id int PRIMARY KEY)")
    bench.setup(two_phase=True)
    bench.run("BEGIN")
    bench.run("INSERT INTO t VALUES (1)")
    bench.run("PREPARE TRANSACTION 'g'")
    target = bench.insert_lsn()  # the end of the PREPARE record: nothing written since
    with ReplicationConnection.connect(bench.dsn) as conn:
        stream = LogicalStream.pgoutput(
            conn, bench.slot, PgoutputOptions(publications=(bench.publication,), two_phase=True)
        )
        msgs = stream.read_until(target, timeout=10)
    bench.run("ROLLBACK PREPARED 'g'")
    assert [m.type for m in msgs] == ["begin_prepare", "relation", "insert", "prepare"]


@pytest.mark.parametrize("boundary", sorted(WAL_BOUNDARIES))
def test_read_until_passes_an_end_just_after_a_page_header(bench: Bench, boundary):
    """When the last WAL record ends exactly at a page boundary (by chance, or always
    after ``pg_switch_wal()``), ``pg_current_wal_insert_lsn()`` names the position after
    the next page's header, and the walsender reports the boundary until more WAL comes:
    read_until must take that as passed. (CI once waited its 10 s on the test above: its
    PREPARE ended at a boundary.)"""
    from airflow_pgcdc.pg.logical import LogicalStream
    from airflow_pgcdc.protocol.pgoutput.options import PgoutputOptions

    bench.run("CREATE TABLE t (id int PRIMARY KEY)")
    bench.setup()
    for _ in range(10):
        target = WAL_BOUNDARIES[boundary](bench.dsn)
        with ReplicationConnection.connect(bench.dsn) as conn:
            stream = LogicalStream.pgoutput(conn, bench.slot, PgoutputOptions(publications=(bench.publication,)))
            assert stream.wal_sizes.block == WAL_PAGE
            assert stream.passed_at(target) == target - (24 if boundary == "page" else 40)
            assert stream.read_until(target, timeout=10) == []
        if bench.insert_lsn() == target:
            break  # no other WAL came meanwhile: the boundary alone was enough
    assert bench.insert_lsn() == target, "other sessions wrote WAL during every try"


# --------------------------------------------------------------------------- schema changes, publications


def test_relation_resent_after_schema_changes(bench: Bench):
    bench.run("CREATE TABLE ev (id int PRIMARY KEY, a text)")
    bench.setup()
    relid = bench.relid("ev")
    shapes = []
    for statement in [
        "INSERT INTO ev VALUES (1, 'x')",
        "ALTER TABLE ev ADD COLUMN b int DEFAULT 7",
        "INSERT INTO ev VALUES (2, 'y', 8)",
        "ALTER TABLE ev DROP COLUMN a",
        "INSERT INTO ev VALUES (3, 9)",
        "ALTER TABLE ev ALTER COLUMN b TYPE numeric(6,1)",  # rewrites the table
        "INSERT INTO ev VALUES (4, 10)",
        "ALTER TABLE ev REPLICA IDENTITY FULL",
        "INSERT INTO ev VALUES (5, 11)",
    ]:
        bench.run(statement)
        if statement.startswith("INSERT"):
            shapes.append(bench.attributes("ev"))
    cap = bench.read()
    txs = cap.transactions()
    assert [[m.type for m in tx] for tx in txs] == [["begin", "relation", "insert", "commit"]] * 5
    rels = [tx[1] for tx in txs]
    assert all(r.relation_oid == relid for r in rels)
    assert [[(c.name, c.type_oid, c.type_modifier) for c in r.columns] for r in rels] == shapes
    assert [r.replica_identity for r in rels] == ["d", "d", "d", "d", "f"]
    assert [c.name for c in rels[2].columns] == ["id", "b"]
    assert rels[3].columns[1].type_modifier == ((6 << 16) | 1) + 4
    assert [tx[2].new for tx in txs] == [
        ("1", "x"), ("2", "y", "8"), ("3", "9"), ("4", "10.0"), ("5", "11.0")
    ]
    # a change's XLogData frame starts at the WAL position of the change itself
    heap_inserts = [
        r.start_lsn
        for r in bench.wal_records(bench.consistent_point)
        if r.resource_manager == "Heap" and r.record_type.startswith("INSERT")
        and r.xid in {tx[0].xid for tx in txs}
    ]
    starts = [lsn for m, lsn in zip(cap.messages, cap.data_starts, strict=True) if type(m) is po.Insert]
    assert starts == heap_inserts


def test_publication_column_list_row_filter_generated_and_partition_root(bench: Bench):
    bench.run(
        """
        CREATE TABLE cl (id int PRIMARY KEY, a text, b text, c text);
        CREATE TABLE rf (id int PRIMARY KEY, v text);
        CREATE TABLE gen (id int PRIMARY KEY, a int, twice int GENERATED ALWAYS AS (a * 2) STORED);
        CREATE TABLE pr (id int, region text, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
        CREATE TABLE pr_eu PARTITION OF pr FOR VALUES IN ('eu');
        CREATE TABLE pr_us PARTITION OF pr FOR VALUES IN ('us');
        """
    )
    bench.setup(
        publication_sql=f"CREATE PUBLICATION {bench.publication} "
        "FOR TABLE cl (id, a), rf WHERE (id > 10), gen, pr "
        "WITH (publish_via_partition_root = true)"
    )
    for statement in [
        "INSERT INTO cl VALUES (1, 'a', 'b', 'c')",
        "UPDATE cl SET b = 'B'",  # only an unpublished column changed: still an Update
        "INSERT INTO rf VALUES (5, 'out'), (15, 'in')",  # 5 filtered out
        "UPDATE rf SET id = 20 WHERE id = 5",  # old row out, new row in: sent as Insert
        "UPDATE rf SET id = 1 WHERE id = 15",  # old row in, new row out: sent as Delete
        "UPDATE rf SET id = 25 WHERE id = 20",  # both in: an Update with the old key
        "INSERT INTO gen (id, a) VALUES (1, 21)",
        "INSERT INTO pr VALUES (1, 'eu'), (2, 'us')",
        "UPDATE pr SET region = 'us' WHERE id = 1",  # moves between partitions
    ]:
        bench.run(statement)
    cap = bench.read()
    rels = {r.relation_name: r for r in cap.of(po.Relation)}
    # via the root: the root's Relation, then the partition's own (as pgoutput's
    # maybe_send_schema does), and the changes name the root
    assert set(rels) == {"cl", "rf", "gen", "pr", "pr_eu", "pr_us"}
    pr_rels = [r.relation_name for r in cap.of(po.Relation) if r.relation_name.startswith("pr")]
    assert pr_rels == ["pr", "pr_eu", "pr", "pr_us"]
    assert [c.name for c in rels["cl"].columns] == ["id", "a"]
    assert [c.name for c in rels["gen"].columns] == ["id", "a"]  # generated: not published
    assert rels["pr"].relation_oid == bench.relid("pr")  # the root, not the partitions
    name = {r.relation_oid: n for n, r in rels.items()}

    def shape(m):
        if type(m) is po.Insert:
            return (name[m.relation_oid], "I", m.new)
        if type(m) is po.Update:
            return (name[m.relation_oid], "U", m.key, m.new)
        return (name[m.relation_oid], "D", m.key)

    changes = [shape(m) for m in cap.messages if type(m) in (po.Insert, po.Update, po.Delete)]
    assert not {m.relation_oid for m in cap.of(po.Insert)} & {
        rels["pr_eu"].relation_oid, rels["pr_us"].relation_oid
    }
    assert changes[:8] == [
        ("cl", "I", ("1", "a")),
        ("cl", "U", None, ("1", "a")),
        ("rf", "I", ("15", "in")),
        ("rf", "I", ("20", "out")),
        ("rf", "D", ("15", None)),
        ("rf", "U", ("20", None), ("25", "out")),
        ("gen", "I", ("1", "21")),
        ("pr", "I", ("1", "eu")),
    ]
    # a row moving between partitions is a Delete and an Insert on the root
    assert changes[8:] == [
        ("pr", "I", ("2", "us")),
        ("pr", "D", ("1", "eu")),
        ("pr", "I", ("1", "us")),
    ]
