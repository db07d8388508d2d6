"""wal2json as an oracle for the pgoutput decoder (PostgreSQL 15: Debian's wal2json).

A pgoutput slot and a wal2json slot are created before the same workload; wal2json's
view (``format-version 2``, read with ``pg_logical_slot_get_changes``) and our decoded
pgoutput stream must then agree change by change and column by column: action, schema,
table, column names, type names and oids, values, the replica identity (old key / old
row), xids, commit timestamps, commit and end LSNs, and each change's WAL LSN.

Normalisation (wal2json's JSON -> PostgreSQL's text output, which pgoutput sends):

- the JSON is parsed with ``parse_int=str, parse_float=str``: wal2json writes numbers
  (int2/4/8, oid, float4/8, numeric) as bare JSON literals, copied from the type's
  output function, so keeping the literal text gives back that output exactly
  (``12.50`` stays ``"12.50"``, ``1.5e+300`` stays ``"1.5e+300"``);
- ``true``/``false`` -> ``"t"``/``"f"`` (boolean output); ``null`` -> ``None`` (NULL);
- JSON strings are every other type's text output, JSON-escaped: ``json.loads``
  undoes the escaping; except bytea, whose ``\\x`` prefix wal2json strips (we put it
  back: ``"0001ff"`` -> ``"\\x0001ff"``);
- wal2json writes ``NaN``, ``Infinity`` and ``-Infinity`` of float and numeric columns
  as ``null`` (JSON has no such numbers): on our side those values become ``None``
  before comparing (the only lossy spot, on wal2json's side);
- identity: wal2json's ``identity`` of an UPDATE is the old key ('K') or old row ('O')
  when pgoutput sends one, else the key columns of the NEW row; of a DELETE, the old
  key or old row. We compare it with the replica identity columns (Relation flag 1) of
  whichever image pgoutput sent (or of the new row);
- types: wal2json's ``type`` is ``format_type(typeoid, typmod)``; we ask the server for
  ``format_type`` of each Relation column's type oid and modifier;
- empty transactions: pgoutput (15+) sends nothing for them, wal2json's format 2 sends
  a B/C pair (its ``skip-empty-xacts`` is format 1 only): such pairs are dropped (the
  test bench commits empty transactions to flush the WAL).
"""

from __future__ import annotations

import json

import pytest
from pgoutput_capture import Bench, Capture

from airflow_pgcdc.protocol import pgoutput as po
from airflow_pgcdc.protocol.lsn import LSN

pytestmark = [
    pytest.mark.pg15,
    pytest.mark.parametrize("pg_server", ["pg15"], indirect=True),  # wal2json: PG15 only
]

WAL2JSON_OPTIONS = (
    "'format-version', '2', 'include-xids', '1', 'include-types', '1', 'include-typmod', '1', "
    "'include-type-oids', '1', 'include-timestamp', '1', 'include-lsn', '1', 'include-pk', '1'"
)
NON_FINITE = {"NaN", "Infinity", "-Infinity"}
FLOAT_OR_NUMERIC = {700, 701, 1700}
BYTEA = 17


@pytest.fixture
def bench(fresh_db, slot_name):
    b = Bench(fresh_db, slot_name())
    yield b
    b.close()


def create_wal2json_slot(bench: Bench) -> str:
    name = bench.slot[:-2] + "wj"
    bench.run("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (name,))
    return name


def read_wal2json(bench: Bench, slot: str) -> list[dict]:
    rows = bench.run(
        f"SELECT data FROM pg_logical_slot_get_changes(%s, NULL, NULL, {WAL2JSON_OPTIONS})",
        (slot,),
    )
    return [json.loads(data, parse_int=str, parse_float=str) for (data,) in rows]


def w2j_value(v):
    if v is True:
        return "t"
    if v is False:
        return "f"
    return v  # None, a JSON string, or a number's literal text


def w2j_columns(cols: list[dict] | None):
    if cols is None:
        return None
    out = []
    for c in cols:
        value = w2j_value(c["value"])
        if int(c["typeoid"]) == BYTEA and value is not None:
            value = "\\x" + value  # wal2json drops bytea's \x prefix
        out.append((c["name"], c["type"], int(c["typeoid"]), value))
    return out


def wal2json_changes(objs: list[dict]) -> tuple[list[tuple], list[tuple]]:
    """(transactions, changes) in a shape shared with :func:`pgoutput_changes`."""
    txs, changes = [], []
    for o in objs:
        action = o["action"]
        if action == "B":
            begin, n_changes = o, len(changes)
        elif action == "C":
            assert (o["xid"], o["lsn"], o["nextlsn"]) == (begin["xid"], begin["lsn"], begin["nextlsn"])
            if len(changes) == n_changes:
                continue  # an empty transaction: pgoutput skips those
            txs.append(
                (int(o["xid"]), LSN.parse(o["lsn"]), LSN.parse(o["nextlsn"]), o["timestamp"])
            )
        else:
            assert action in "IUD", o
            assert int(o["xid"]) == int(begin["xid"])
            changes.append(
                (
                    int(o["xid"]),
                    action,
                    o["schema"],
                    o["table"],
                    w2j_columns(o.get("columns")),
                    w2j_columns(o.get("identity")),
                    LSN.parse(o["lsn"]),
                )
            )
    return txs, changes


class TypeNames:
    """``format_type(oid, typmod)`` through the server, cached."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.cache: dict[tuple[int, int], str] = {}

    def __call__(self, oid: int, typmod: int) -> str:
        key = (oid, typmod)
        if key not in self.cache:
            self.cache[key] = self.bench.value("SELECT format_type(%s::oid, %s)", key)
        return self.cache[key]


def pgoutput_changes(cap: Capture, type_name: TypeNames) -> tuple[list[tuple], list[tuple]]:
    relations: dict[int, po.Relation] = {}
    txs, changes = [], []
    xid = None

    def columns(rel: po.Relation, image, only_key: bool = False):
        out = []
        for col, value in zip(rel.columns, image, strict=True):
            if only_key and not col.is_key:
                continue
            assert value is not po.UNCHANGED_TOAST
            if col.type_oid in FLOAT_OR_NUMERIC and value in NON_FINITE:
                value = None  # wal2json writes these as null
            out.append((col.name, type_name(col.type_oid, col.type_modifier), col.type_oid, value))
        return out

    for m, lsn in zip(cap.messages, cap.data_starts, strict=True):
        t = type(m)
        if t is po.Begin:
            begin, xid = m, m.xid
        elif t is po.Commit:
            assert m.commit_lsn == begin.final_lsn
            txs.append((xid, m.commit_lsn, m.end_lsn, m.commit_timestamp))
            xid = None
        elif t is po.Relation:
            relations[m.relation_oid] = m
        elif t in (po.Insert, po.Update, po.Delete):
            rel = relations[m.relation_oid]
            if t is po.Insert:
                action, new, identity = "I", columns(rel, m.new), None
            elif t is po.Update:
                old = m.key if m.key is not None else m.old
                action, new = "U", columns(rel, m.new)
                identity = columns(rel, old if old is not None else m.new, only_key=True)
            else:
                action, new = "D", None
                identity = columns(rel, m.key if m.key is not None else m.old, only_key=True)
            changes.append((xid, action, rel.namespace, rel.relation_name, new, identity, lsn))
        else:
            raise AssertionError(f"unexpected {m!r}")
    return txs, changes


def compare(bench: Bench, cap: Capture, objs: list[dict]) -> list[tuple]:
    """Assert that both views agree; return the (pgoutput) changes compared."""
    w_txs, w_changes = wal2json_changes(objs)
    p_txs, p_changes = pgoutput_changes(cap, TypeNames(bench))
    assert len(p_changes) == len(w_changes)
    for n, (p, w) in enumerate(zip(p_changes, w_changes, strict=True)):
        assert p == w, f"change #{n} differs:\n pgoutput {p}\n wal2json {w}"
    assert [t[:3] for t in p_txs] == [t[:3] for t in w_txs]  # xid, commit LSN, end LSN
    for (_, _, _, ts), (_, _, _, w_ts) in zip(p_txs, w_txs, strict=True):
        assert ts == bench.value("SELECT %s::timestamptz", (w_ts,))
    return p_changes


WK = '"Odd ""Schema""".wk'  # a schema name that needs quoting, and a composite key
WORKLOAD_TABLES = f"""
CREATE SCHEMA {WK[:-3]};
CREATE TABLE w (
    id int PRIMARY KEY, i8 bigint, num numeric(12,3), nm numeric, t text, b bool,
    ts timestamptz, d date, jb jsonb, js json, ia int[], ta text[], f8 float8, r real,
    u uuid, by bytea, vc varchar(8), nul text
);
CREATE TABLE wf (id int PRIMARY KEY, v text, n int);
ALTER TABLE wf REPLICA IDENTITY FULL;
CREATE TABLE {WK} (a int, "B col" text, v text, PRIMARY KEY (a, "B col"));
"""

TEXTS = [
    "plain",
    "it's \"quoted\" and back\\slashed",
    "line one\nline two\r\n\ttabbed",
    "unicode: héllo ✓ 漢字 🎉",
    "",
    "null \\u0000 lookalike and {braces}, [brackets]",
]


def test_pgoutput_matches_wal2json(bench: Bench):
    bench.run(WORKLOAD_TABLES)
    bench.setup()
    w2j = create_wal2json_slot(bench)
    insert = (
        "INSERT INTO w VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
        "%s, NULL)"
    )
    rows = []
    for i, text in enumerate(TEXTS, start=1):
        rows.append(
            (
                i, -(2**63) if i == 1 else i * 10**12, f"{i}.{i:03d}" if i != 3 else "-0.500",
                ["NaN", "1e-20", "123456789012345678901234567890.5", "-Infinity", "0", "1"][i - 1],
                text, i % 2 == 0, f"2024-0{i}-1{i} 0{i}:30:00.{i:06d}+0{i}", f"199{i}-12-31",
                json.dumps({"k": text, "n": [i, None, True]}), json.dumps({"k": text}),
                [i, None, -i], [text, None, "x y"],
                [1.5e300, "Infinity", 0.1, "NaN", -0.0, 3.0][i - 1],
                ["-Infinity", 2.5, "NaN", 1e-7, 0.0, 1.0][i - 1],
                f"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1{i}", bytes([0, i, 255]), text[:8],
            )
        )
    # one transaction per statement, then a multi-statement, multi-table transaction
    bench.run(insert, rows[0])
    bench.run(insert, rows[1])
    with bench.sql.transaction():
        for row in rows[2:]:
            bench.run(insert, row)
        bench.run("INSERT INTO wf VALUES (1, 'one', 1), (2, NULL, 2)")
        bench.run(f"INSERT INTO {WK} VALUES (1, 'k ✓', 'v')")
    bench.run("UPDATE w SET t = t || ' (updated)', b = NOT b, nul = 'now set' WHERE id <= 2")
    bench.run("UPDATE w SET id = id + 100 WHERE id = 3")  # key change: old key sent
    bench.run("UPDATE w SET num = NULL, jb = NULL WHERE id = 4")
    bench.run("UPDATE wf SET n = n + 1")  # FULL: old rows, one with a NULL
    bench.run(f"UPDATE {WK} SET \"B col\" = 'k2' WHERE a = 1")
    bench.run(f"UPDATE {WK} SET v = 'v2'")
    with bench.sql.transaction():
        bench.run("DELETE FROM w WHERE id IN (1, 103)")
        bench.run("DELETE FROM wf WHERE id = 2")
        bench.run(f"DELETE FROM {WK}")
    bench.run("INSERT INTO w (id) VALUES (7)")  # all NULLs but the key

    cap = bench.read()
    objs = read_wal2json(bench, w2j)
    assert len(cap.of(po.Begin)) == len(wal2json_changes(objs)[0]) == 11
    changes = compare(bench, cap, objs)
    assert "".join(c[1] for c in changes) == "I" * 9 + "U" * 8 + "D" * 4 + "I"
    identities = [c[5] for c in changes if c[1] != "I"]
    assert [len(i) for i in identities] == [1, 1, 1, 1, 3, 3, 2, 2, 1, 1, 3, 2]

    # the normalisation did real work: spot checks of the raw wal2json values
    first = next(o for o in objs if o["action"] == "I")
    raw = {c["name"]: c["value"] for c in first["columns"]}
    assert raw["i8"] == str(-(2**63)) and raw["num"] == "1.001" and raw["b"] is False
    assert raw["nm"] is None and raw["f8"] == "1.5e+300" and raw["r"] is None  # NaN/-Infinity
    assert raw["ia"] == "{1,NULL,-1}" and raw["by"] == "0001ff"  # no \\x
    pg_first = cap.of(po.Insert)[0]
    assert pg_first.new[3] == "NaN" and pg_first.new[13] == "-Infinity"


def test_streamed_pgoutput_matches_wal2json(bench: Bench):
    """A transaction streamed in blocks (with a rolled-back subtransaction), put back
    together from Stream Start/Stop blocks, Stream Abort and Stream Commit, equals what
    wal2json decodes at commit."""
    bench.run("CREATE TABLE s (id int PRIMARY KEY, v text, n numeric(8,2))")
    bench.setup()
    w2j = create_wal2json_slot(bench)
    fill = "INSERT INTO s SELECT i, md5(i::text) || E'\\n✓', i / 7.0 FROM generate_series(%s::int, %s::int) i"
    with bench.sql.transaction():
        bench.run(fill, (1, 1200))
        bench.run("SAVEPOINT sp")
        bench.run(fill, (1201, 2400))
        bench.run("ROLLBACK TO SAVEPOINT sp")
        bench.run("UPDATE s SET v = 'changed' WHERE id % 100 = 0")
        bench.run("DELETE FROM s WHERE id % 250 = 0")
        bench.run(fill, (2401, 3000))
    cap = bench.read(streaming="on", small_work_mem=True)
    objs = read_wal2json(bench, w2j)

    # reassemble: drop the aborted subtransaction's changes, then turn the stream into
    # one Begin ... Commit transaction as pgoutput sends it without streaming
    (commit,) = cap.of(po.StreamCommit)
    aborted = {a.subxid for a in cap.of(po.StreamAbort)}
    assert aborted and commit.xid not in aborted
    messages, starts = [], []
    for m, lsn in zip(cap.messages, cap.data_starts, strict=True):
        if type(m) in (po.StreamStart, po.StreamStop, po.StreamAbort, po.StreamCommit):
            continue
        if getattr(m, "xid", None) in aborted:
            continue
        if type(m) is po.Relation:
            m = po.Relation(None, *[getattr(m, f) for f in po.Relation.__slots__[1:]])
        elif type(m) in (po.Insert, po.Update, po.Delete):
            m = type(m)(None, *[getattr(m, f) for f in type(m).__slots__[1:]])
        messages.append(m)
        starts.append(lsn)
    begin = po.Begin(commit.commit_lsn, commit.commit_timestamp, commit.xid)
    end = po.Commit(0, commit.commit_lsn, commit.end_lsn, commit.commit_timestamp)
    rebuilt = Capture([begin, *messages, end], [], cap.options, [LSN(0), *starts, LSN(0)])
    assert sum(type(m) is po.Insert for m in messages) == 1800
    compare(bench, rebuilt, objs)
