"""The pglogical_output decoder against the real plugin (pglogical 2.x) on PostgreSQL 15.

Every stream here is read through :class:`LogicalStream` with the raw CopyData
payloads recorded, so each test checks three things at once:

- the decoded fields equal what PostgreSQL itself reports through SQL (catalogs,
  ``pg_current_xact_id()``, ``pg_xact_commit_timestamp()``, ``pg_walinspect``'s
  commit records, the types' own send functions);
- our encoder rebuilds the plugin's bytes exactly (``encode_message(msg) == raw``);
- every message's ``to_dict()`` goes through ``json.dumps``.

The plugin needs ``CREATE EXTENSION pglogical``, a node and tables in a replication
set; the module makes one database for that and drops it at the end. Each stream
uses its own replication connection; nothing is ever confirmed, so a slot can be
read again from the start with other options.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import decimal
import json
import secrets
import struct
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import psycopg
import psycopg.sql
import pytest

from airflow_pgcdc.pg.logical import LogicalStream
from airflow_pgcdc.pg.replication import ReplicationConnection
from airflow_pgcdc.protocol.frames import XLogData
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.pglogical import (
    Begin,
    Commit,
    Delete,
    Insert,
    Origin,
    PglogicalMessage,
    Relation,
    Startup,
    TupleField,
    Update,
    binary_compat_params_for_server,
    encode_message,
    pglogical_start_options,
)

READ_TIMEOUT = 20.0  # seconds; every stream read is bounded by it
PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
BIG = "".join(chr(0x41 + (i * 7) % 26) for i in range(12_000))  # stored out of line


# --------------------------------------------------------------------------- the database


class _Recorder:
    """Stands in for the stream's decoder: keeps each payload, then decodes it."""

    def __init__(self, decoder) -> None:
        self.decoder = decoder
        self.raw: list[bytes] = []

    def decode(self, data) -> PglogicalMessage:
        raw = bytes(data)
        self.raw.append(raw)
        return self.decoder.decode(raw)


@dataclass
class PglogicalDb:
    server: object  # PostgresServer
    dbname: str
    dsn: str  # TCP, for replication connections

    def connect(self, *, autocommit: bool = True) -> psycopg.Connection:
        return self.server.connect(self.dbname, autocommit=autocommit)

    def sql(self, query: str, params: Sequence | None = None) -> list[tuple]:
        with self.connect() as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description is not None else []

    def one(self, query: str, params: Sequence | None = None):
        rows = self.sql(query, params)
        assert len(rows) == 1, rows
        return rows[0][0] if len(rows[0]) == 1 else rows[0]

    def insert_lsn(self) -> LSN:
        return LSN(self.one("SELECT pg_current_wal_insert_lsn()::text"))

    def create_slot(self, name: str) -> None:
        with ReplicationConnection.connect(self.dsn) as conn:
            conn.create_slot(name, output_plugin="pglogical_output", snapshot="nothing")

    def add_to_set(self, *regclasses: str, repset: str = "default") -> None:
        for rc in regclasses:
            self.sql("SELECT pglogical.replication_set_add_table(%s, %s::regclass)", (repset, rc))

    def stream(
        self, slot: str, options: list[tuple[str, str]], until: LSN
    ) -> tuple[list[PglogicalMessage], list[bytes]]:
        """Everything the plugin sends for ``slot`` up to ``until``, decoded, and the raw
        payloads; then the common checks (byte-exact re-encoding, JSON)."""
        with ReplicationConnection.connect(self.dsn) as conn:
            stream = LogicalStream.pglogical(conn, slot, options)
            recorder = _Recorder(stream.decoder)
            stream.decoder = recorder
            msgs = stream.read_until(until, timeout=READ_TIMEOUT)
        self._released(slot)
        check_common(msgs, recorder.raw)
        return msgs, recorder.raw

    def _released(self, slot: str, timeout: float = 30.0) -> None:
        """Wait until the walsender of the closed connection has released ``slot``: the
        next test streams the same slot, and a walsender still ending holds it (seen in a
        full run: ``ObjectInUse ... is active for PID``)."""
        deadline = time.monotonic() + timeout
        while self.sql("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active", (slot,)):
            assert time.monotonic() < deadline, f"slot {slot} still active {timeout} s after its stream closed"
            time.sleep(0.05)


@pytest.fixture(scope="module")
def pgl(pg15) -> Iterator[PglogicalDb]:
    """A database on pg15 with pglogical and a provider node (one per module)."""
    name = "pgl_" + secrets.token_hex(5)
    dsn = pg15.create_database(name)
    db = PglogicalDb(server=pg15, dbname=name, dsn=dsn)
    try:
        db.sql("CREATE EXTENSION pglogical")
        db.sql("CREATE EXTENSION pg_walinspect")
        db.sql(
            "SELECT pglogical.create_node(node_name := %s, dsn := %s)",
            ("pgcdc_provider", pg15.make_socket_dsn(name)),
        )
        yield db
    finally:
        _drop_pglogical_database(pg15, name)


def _drop_pglogical_database(server, name: str) -> None:
    """Drop the module's database without hanging.

    Seen with pglogical 2.4.2 on PostgreSQL 15.18: DROP DATABASE ... WITH (FORCE) of a
    database that has a pglogical node (and so a running manager worker) waits forever
    for the pglogical supervisor ("still waiting for backend with PID ... to accept
    ProcSignalBarrier"), and every later DROP DATABASE on the server waits too.
    Dropping the node first, and waiting for its manager to leave, avoids it; the
    statement timeout keeps a failure bounded.
    """
    with server.connect(name) as conn:
        if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'pglogical'").fetchone():
            conn.execute("SELECT pglogical.drop_node(%s, ifexists := true)", ("pgcdc_provider",))
    with server.connect("postgres") as conn:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            busy = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                " AND backend_type <> 'client backend'",
                (name,),
            ).fetchone()[0]
            if not busy:
                break
            time.sleep(0.1)
        for (slot,) in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (name,)
        ).fetchall():
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.execute("SET statement_timeout = '20s'")
        conn.execute(
            psycopg.sql.SQL("DROP DATABASE {} WITH (FORCE)").format(psycopg.sql.Identifier(name))
        )


# --------------------------------------------------------------------------- helpers


def check_common(msgs: list[PglogicalMessage], raws: list[bytes]) -> None:
    assert len(msgs) == len(raws)
    for msg, raw in zip(msgs, raws, strict=True):
        assert encode_message(msg) == raw, f"re-encoded {msg!r} differs from the plugin's bytes"
        json.dumps(msg.to_dict())
    if msgs:
        # The plugin writes its startup message from the first BEGIN callback.
        assert isinstance(msgs[0], Startup)
        assert isinstance(msgs[1], Begin)
        assert not any(isinstance(m, Startup) for m in msgs[1:])


def text_options(**kw) -> list[tuple[str, str]]:
    kw.setdefault("pglogical_replication_set_names", "default")
    return pglogical_start_options(**kw)


def xid_of(conn: psycopg.Connection) -> int:
    """The 32-bit xid of the connection's current transaction."""
    return int(conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0]) & 0xFFFFFFFF


def transaction(msgs: list[PglogicalMessage], xid: int) -> list[PglogicalMessage]:
    """BEGIN .. COMMIT of the transaction ``xid`` (exactly one)."""
    starts = [i for i, m in enumerate(msgs) if isinstance(m, Begin) and m.xid == xid]
    assert len(starts) == 1, f"transaction {xid}: {len(starts)} BEGINs in {msgs!r}"
    i = starts[0]
    j = next(k for k in range(i, len(msgs)) if isinstance(msgs[k], Commit))
    return msgs[i : j + 1]


def commit_record(db: PglogicalDb, since: LSN, xid: int) -> tuple[LSN, LSN]:
    """(start, end) of the WAL COMMIT record of ``xid``, from pg_walinspect."""
    rows = db.sql(
        "SELECT start_lsn::text, end_lsn::text FROM pg_get_wal_records_info_till_end_of_wal(%s)"
        " WHERE resource_manager = 'Transaction' AND record_type = 'COMMIT'"
        " AND xid::text = %s",
        (str(since), str(xid)),
    )
    assert len(rows) == 1, rows
    return LSN(rows[0][0]), LSN(rows[0][1])


def check_envelope(db: PglogicalDb, txn: list[PglogicalMessage], xid: int, since: LSN) -> None:
    """BEGIN and COMMIT against the WAL commit record and the commit timestamp."""
    begin, commit = txn[0], txn[-1]
    assert isinstance(begin, Begin) and isinstance(commit, Commit)
    start, end = commit_record(db, since, xid)
    assert begin.xid == xid
    assert begin.final_lsn == start  # "lsn of commit"
    assert commit.commit_lsn == begin.final_lsn
    assert commit.end_lsn == end
    ts = db.one("SELECT pg_xact_commit_timestamp(%s::text::xid)", (str(xid),))
    assert begin.commit_time == ts
    assert commit.commit_time == ts
    assert begin.flags == commit.flags == 0


def relation_facts(db: PglogicalDb, regclass: str) -> tuple[int, str, str, list[str], set[str]]:
    """(oid, schema, table, live column names in order, primary key columns)."""
    oid, nsp, rel = db.one(
        "SELECT c.oid::int8, n.nspname, c.relname FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s::regclass",
        (regclass,),
    )
    cols = [
        r[0]
        for r in db.sql(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
            " AND NOT attisdropped ORDER BY attnum",
            (regclass,),
        )
    ]
    keys = {
        r[0]
        for r in db.sql(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a"
            " ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
            " WHERE i.indrelid = %s::regclass AND i.indisprimary",
            (regclass,),
        )
    }
    return oid, nsp, rel, cols, keys


def check_relation(db: PglogicalDb, msg: PglogicalMessage, regclass: str) -> Relation:
    oid, nsp, rel, cols, keys = relation_facts(db, regclass)
    assert isinstance(msg, Relation)
    assert msg.relidentifier == oid
    assert (msg.nspname, msg.relname) == (nsp, rel)
    assert list(msg.column_names) == cols
    assert {c.colname for c in msg.columns if c.is_key} == keys
    assert [c.flags for c in msg.columns] == [1 if c in keys else 0 for c in cols]
    assert msg.flags == 0
    return msg


def texts(row: Sequence) -> tuple[TupleField, ...]:
    """The tuple the plugin sends in text mode for SQL values already cast to text."""
    return tuple(TupleField("n") if v is None else TupleField("t", v) for v in row)


def key_only(row: Sequence, key_flags: Sequence[bool]) -> tuple[TupleField, ...]:
    """An old-key ('K') tuple: key columns as text, every other column null."""
    return texts([v if k else None for v, k in zip(row, key_flags, strict=True)])


def shape(txn: list[PglogicalMessage]) -> list[tuple[str, str | None]]:
    """(tag, table name) for each message: rows by their relation, others by None."""
    out = []
    for m in txn:
        if isinstance(m, Relation):
            out.append((m.tag, m.relname))
        elif isinstance(m, Insert | Update | Delete):
            out.append((m.tag, m.relation.relname))
        else:
            out.append((m.tag, None))
    return out


# --------------------------------------------------------------------------- startup


def test_startup_message_reports_the_server(pgl: PglogicalDb, slot_name):
    pgl.sql("CREATE TABLE st_t (id int PRIMARY KEY)")
    pgl.add_to_set("st_t")
    slot = slot_name("pgl_")
    pgl.create_slot(slot)

    # 'S' waits for a BEGIN: before our first transaction only keepalives come, unless a
    # transaction of the cluster's own workers (pglogical's, autovacuum's) commits in this
    # database meanwhile: that one arrives with the startup message and nothing in it.
    with ReplicationConnection.connect(pgl.dsn) as conn:
        stream = LogicalStream.pglogical(conn, slot, text_options())
        stream.decoder = recorder = _Recorder(stream.decoder)
        early = []
        deadline = time.monotonic() + 1.5
        while (left := deadline - time.monotonic()) > 0:
            item = stream.read(left)
            if item is not None and isinstance(item[0], XLogData):
                early.append(item[1])
        walsender_pid = pgl.one(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        )
        pgl.sql("INSERT INTO st_t VALUES (1)")
        msgs = early + stream.read_until(pgl.insert_lsn(), timeout=READ_TIMEOUT)
    check_common(msgs, recorder.raw)
    tags = [m.tag for m in msgs]
    assert tags[0] == "S", tags
    assert "".join(tags[1:]).replace("BC", "") == "BRIC", f"only empty transactions besides ours: {tags}"
    startup = msgs[0]
    assert startup.startup_message_version == 1

    version_num = int(pgl.one("SHOW server_version_num"))
    db_encoding = pgl.one(
        "SELECT pg_encoding_to_char(encoding) FROM pg_database WHERE datname = current_database()"
    )
    catversion = pgl.one("SELECT catalog_version_no FROM pg_control_system()")
    extversion = pgl.one("SELECT extversion FROM pg_extension WHERE extname = 'pglogical'")
    assert db_encoding == "UTF8"

    assert startup.max_proto_version == 1
    assert startup.min_proto_version == 1
    assert startup.coltypes is False
    # pg_version_num / pg_version are the plugin's build-time PG_VERSION_NUM /
    # PG_VERSION (Debian's package was built against 15.2), not the running server's.
    assert startup.pg_version_num // 100 == version_num // 100
    assert startup.pg_version_num <= version_num
    assert startup.pg_version.split(" ")[0].split(".")[0] == str(version_num // 10000)
    assert startup.pg_catversion == catversion
    assert startup.database_encoding == "UTF8"
    assert startup.encoding == "UTF8"  # because expected_encoding was sent
    assert startup.forward_changeset_origins is True
    assert startup.walsender_pid == walsender_pid
    assert startup.pglogical_version == extversion
    major, minor, patch = (int(x) for x in extversion.split("."))
    assert startup.pglogical_version_num == major * 10000 + minor * 100 + patch
    assert startup.no_txinfo is False
    # binary.* reply keys: what was granted, and the server's binary format
    assert startup.binary_internal_basetypes is False
    assert startup.binary_binary_basetypes is False
    assert startup.binary_basetypes_major_version == version_num // 100
    assert startup.binary_binary_pg_version == version_num // 100
    assert startup.binary_sizeof_int == ctypes.sizeof(ctypes.c_int)
    assert startup.binary_sizeof_long == ctypes.sizeof(ctypes.c_long)
    assert startup.binary_sizeof_datum == ctypes.sizeof(ctypes.c_void_p)
    assert startup.binary_maxalign == 8
    assert startup.binary_bigendian is (sys.byteorder == "big")
    # The plugin tests compile-time macros that PostgreSQL dropped (USE_FLOAT4_BYVAL in
    # 13, USE_INTEGER_DATETIMES in 10), so a PG15 server claims neither.
    assert startup.binary_float4_byval is False
    assert startup.binary_float8_byval is (ctypes.sizeof(ctypes.c_void_p) == 8)
    assert startup.binary_integer_datetimes is False
    assert list(startup.params) == [
        "max_proto_version", "min_proto_version", "coltypes", "pg_version_num",
        "pg_version", "pg_catversion", "database_encoding", "encoding",
        "forward_changeset_origins", "walsender_pid", "pglogical_version",
        "pglogical_version_num", "binary.internal_basetypes", "binary.binary_basetypes",
        "binary.basetypes_major_version", "binary.sizeof_int", "binary.sizeof_long",
        "binary.sizeof_datum", "binary.maxalign", "binary.bigendian",
        "binary.float4_byval", "binary.float8_byval", "binary.integer_datetimes",
        "binary.binary_pg_version", "no_txinfo",
    ]  # fmt: skip

    # Without expected_encoding the plugin reports SQL_ASCII (its field_datum_encoding
    # stays 0) although it still sends the database's bytes.
    msgs, _ = pgl.stream(slot, text_options(expected_encoding=None), pgl.insert_lsn())
    assert msgs[0].encoding == "SQL_ASCII"
    assert msgs[0].database_encoding == "UTF8"


# --------------------------------------------------------------------------- text mode


def test_text_mode_rows_against_sql(pgl: PglogicalDb, slot_name):
    pgl.sql(
        "CREATE TABLE tx_a (id int PRIMARY KEY, junk int, v text, big text, n int);"
        "ALTER TABLE tx_a DROP COLUMN junk;"
        "ALTER TABLE tx_a ALTER COLUMN big SET STORAGE EXTERNAL;"
        "CREATE TABLE tx_b (k1 int, k2 text, payload jsonb, PRIMARY KEY (k1, k2));"
        'CREATE SCHEMA "Sch ë";'
        'CREATE TABLE "Sch ë"."Tåble ""q""" ("cölumn" text PRIMARY KEY, "n n" numeric)'
    )
    uni = '"Sch ë"."Tåble ""q"""'
    pgl.add_to_set("tx_a", "tx_b", uni)
    slot = slot_name("pgl_")
    pgl.create_slot(slot)
    since = pgl.insert_lsn()

    a_cols = "id::text, v, big, n::text"
    b_cols = "k1::text, k2, payload::text"
    u_cols = '"cölumn", "n n"::text'
    with pgl.connect(autocommit=False) as conn:
        # T1: three tables interleaved in one transaction
        conn.execute("INSERT INTO tx_a VALUES (1, 'one', %s, NULL)", (BIG,))
        conn.execute("""INSERT INTO tx_b VALUES (1, 'x', '{"a": [1, "é"]}')""")
        conn.execute("INSERT INTO tx_a VALUES (2, NULL, 'small', 42)")
        conn.execute(f"INSERT INTO {uni} VALUES ('日本語 ✓', 12.500)")
        conn.execute("INSERT INTO tx_b VALUES (2, 'y', NULL)")
        xid1 = xid_of(conn)
        conn.commit()
        a1 = conn.execute(f"SELECT {a_cols} FROM tx_a WHERE id = 1").fetchone()
        a2 = conn.execute(f"SELECT {a_cols} FROM tx_a WHERE id = 2").fetchone()
        b1 = conn.execute(f"SELECT {b_cols} FROM tx_b WHERE k1 = 1").fetchone()
        b2 = conn.execute(f"SELECT {b_cols} FROM tx_b WHERE k1 = 2").fetchone()
        u1 = conn.execute(f"SELECT {u_cols} FROM {uni}").fetchone()
        conn.commit()
        # T2: an update that leaves the TOASTed column alone
        conn.execute("UPDATE tx_a SET v = 'uno' WHERE id = 1")
        xid2 = xid_of(conn)
        conn.commit()
        a1_after = conn.execute(f"SELECT {a_cols} FROM tx_a WHERE id = 1").fetchone()
        conn.commit()
        # T3: key-changing updates and deletes
        conn.execute("UPDATE tx_a SET id = 20 WHERE id = 2")
        conn.execute("UPDATE tx_b SET k2 = 'z', payload = '[]' WHERE k1 = 1")
        conn.execute("DELETE FROM tx_b WHERE k1 = 2")
        conn.execute("DELETE FROM tx_a WHERE id = 1")
        xid3 = xid_of(conn)
        conn.commit()
        a20 = conn.execute(f"SELECT {a_cols} FROM tx_a WHERE id = 20").fetchone()
        b1_after = conn.execute(f"SELECT {b_cols} FROM tx_b WHERE k1 = 1").fetchone()
        conn.commit()
    assert len(a1[2]) == len(BIG)

    msgs, _ = pgl.stream(slot, text_options(), pgl.insert_lsn())

    # T1
    t1 = transaction(msgs, xid1)
    check_envelope(pgl, t1, xid1, since)
    assert shape(t1) == [
        ("B", None),
        ("R", "tx_a"), ("I", "tx_a"),
        ("R", "tx_b"), ("I", "tx_b"),
        ("I", "tx_a"),
        ("R", 'Tåble "q"'), ("I", 'Tåble "q"'),
        ("I", "tx_b"),
        ("C", None),
    ]  # fmt: skip
    rel_a = check_relation(pgl, t1[1], "tx_a")
    rel_b = check_relation(pgl, t1[3], "tx_b")
    rel_u = check_relation(pgl, t1[6], uni)
    assert rel_a.column_names == ("id", "v", "big", "n")  # the dropped column is left out
    assert rel_b.key_columns == ("k1", "k2")
    assert (rel_u.nspname, rel_u.relname, rel_u.column_names) == (
        "Sch ë",
        'Tåble "q"',
        ("cölumn", "n n"),
    )
    inserts = [m for m in t1 if isinstance(m, Insert)]
    expected = [(rel_a, a1), (rel_b, b1), (rel_a, a2), (rel_u, u1), (rel_b, b2)]
    for ins, (rel, row) in zip(inserts, expected, strict=True):
        assert ins.relidentifier == rel.relidentifier and ins.relation is rel
        assert ins.new_tuple == texts(row)
        assert ins.flags == 0
    assert inserts[0].new_tuple[2] == TupleField("t", BIG)  # a whole TOASTed value, inline
    assert inserts[0].new_tuple[3] == TupleField("n")
    assert inserts[2].new_tuple[1] == TupleField("n")

    # T2: the relation is cached for the session, so no 'R'; 'u' for the unchanged TOAST
    t2 = transaction(msgs, xid2)
    check_envelope(pgl, t2, xid2, since)
    assert shape(t2) == [("B", None), ("U", "tx_a"), ("C", None)]
    upd = t2[1]
    assert upd.old_tuple is None and upd.old_tuple_type is None
    assert upd.new_tuple == texts(a1_after[:2]) + (TupleField("u"), TupleField("n"))

    # T3
    t3 = transaction(msgs, xid3)
    check_envelope(pgl, t3, xid3, since)
    assert shape(t3) == [
        ("B", None),
        ("U", "tx_a"),
        ("U", "tx_b"),
        ("D", "tx_b"),
        ("D", "tx_a"),
        ("C", None),
    ]
    a_keys = [c.is_key for c in rel_a.columns]
    b_keys = [c.is_key for c in rel_b.columns]
    u_a, u_b, d_b, d_a = t3[1:5]
    assert (u_a.old_tuple_type, u_a.old_tuple) == ("K", key_only(a2, a_keys))
    assert u_a.new_tuple == texts(a20)
    assert (u_b.old_tuple_type, u_b.old_tuple) == ("K", key_only(b1, b_keys))
    assert u_b.new_tuple == texts(b1_after)
    assert (d_b.old_tuple_type, d_b.old_tuple) == ("K", key_only(b2, b_keys))
    assert (d_a.old_tuple_type, d_a.old_tuple) == ("K", key_only(a1_after, a_keys))

    # Transactions arrive in commit order; each ends where the next one's WAL starts.
    commits = [m for m in msgs if isinstance(m, Commit)]
    assert [c.commit_lsn for c in commits] == sorted(c.commit_lsn for c in commits)
    assert all(c.end_lsn > c.commit_lsn for c in commits)


def test_relation_resent_after_alter_table(pgl: PglogicalDb, slot_name):
    pgl.sql("CREATE TABLE rs_t (id int PRIMARY KEY, v text)")
    pgl.add_to_set("rs_t")
    slot = slot_name("pgl_")
    pgl.create_slot(slot)
    with pgl.connect(autocommit=False) as conn:
        conn.execute("INSERT INTO rs_t VALUES (1, 'a')")
        xid1 = xid_of(conn)
        conn.commit()
        conn.execute("ALTER TABLE rs_t ADD COLUMN w int DEFAULT 7")
        conn.commit()
        conn.execute("INSERT INTO rs_t VALUES (2, 'b', 8)")
        xid2 = xid_of(conn)
        conn.commit()
    msgs, _ = pgl.stream(slot, text_options(), pgl.insert_lsn())
    t1, t2 = transaction(msgs, xid1), transaction(msgs, xid2)
    assert [m.tag for m in t1] == ["B", "R", "I", "C"]
    assert [m.tag for m in t2] == ["B", "R", "I", "C"]
    assert t1[1].column_names == ("id", "v")
    check_relation(pgl, t2[1], "rs_t")
    assert t2[1].column_names == ("id", "v", "w")
    assert t2[1].relidentifier == t1[1].relidentifier
    assert t2[2].relation is t2[1]
    assert t2[2].new_tuple == texts(("2", "b", "8"))
    # the DDL transaction itself is sent as an empty BEGIN/COMMIT pair
    begins = [m for m in msgs if isinstance(m, Begin)]
    assert len(begins) == 3


# --------------------------------------------------------------------------- origin


def test_forwarded_origin(pgl: PglogicalDb, slot_name):
    origin = "pgcdc_up_" + secrets.token_hex(4)
    pgl.sql("CREATE TABLE or_t (id int PRIMARY KEY, v text)")
    pgl.add_to_set("or_t")
    pgl.sql("SELECT pg_replication_origin_create(%s)", (origin,))
    slot = slot_name("pgl_")
    pgl.create_slot(slot)
    since = pgl.insert_lsn()
    origin_lsn = LSN.parse("5/ABCDEF01")
    with pgl.connect(autocommit=False) as conn:
        conn.execute("INSERT INTO or_t VALUES (1, 'local before')")
        xid_local1 = xid_of(conn)
        conn.commit()
        conn.execute("SELECT pg_replication_origin_session_setup(%s)", (origin,))
        conn.execute(
            "SELECT pg_replication_origin_xact_setup(%s::pg_lsn, now())", (str(origin_lsn),)
        )
        conn.execute("INSERT INTO or_t VALUES (2, 'forwarded')")
        xid_fwd = xid_of(conn)
        conn.commit()
        conn.execute("SELECT pg_replication_origin_session_reset()")
        conn.commit()
        conn.execute("INSERT INTO or_t VALUES (3, 'local after')")
        xid_local2 = xid_of(conn)
        conn.commit()
    until = pgl.insert_lsn()
    roident, remote_lsn = pgl.one(
        "SELECT o.roident::int, s.remote_lsn::text FROM pg_replication_origin o"
        " JOIN pg_replication_origin_status s ON s.external_id = o.roname WHERE o.roname = %s",
        (origin,),
    )
    assert LSN(remote_lsn) == origin_lsn

    msgs, raws = pgl.stream(slot, text_options(pglogical_forward_origins="all"), until)
    fwd = transaction(msgs, xid_fwd)
    check_envelope(pgl, fwd, xid_fwd, since)
    assert [m.tag for m in fwd] == ["B", "O", "I", "C"]
    o = fwd[1]
    assert isinstance(o, Origin)
    assert o.origin_identifier == origin
    assert o.origin_lsn == origin_lsn
    assert o.flags == 0
    assert raws[msgs.index(o)] == (
        b"O\x00" + struct.pack("!Q", origin_lsn) + bytes([len(origin) + 1])
        + origin.encode() + b"\x00"
    )  # fmt: skip
    assert fwd[2].new_tuple == texts(("2", "forwarded"))
    for xid in (xid_local1, xid_local2):
        local = transaction(msgs, xid)
        assert not any(isinstance(m, Origin) for m in local)
    assert roident > 0

    # Without pglogical.forward_origins the plugin filters the forwarded transaction
    # out entirely (origin filter), though its startup still says forward_changeset_origins.
    msgs, _ = pgl.stream(slot, text_options(), until)
    assert msgs[0].forward_changeset_origins is True
    assert not any(isinstance(m, Begin) and m.xid == xid_fwd for m in msgs)
    assert not any(isinstance(m, Origin) for m in msgs)
    assert [m.tag for m in transaction(msgs, xid_local1)] == ["B", "R", "I", "C"]
    assert [m.tag for m in transaction(msgs, xid_local2)] == ["B", "I", "C"]


# --------------------------------------------------------------------------- binary modes

TYPES_DDL = """
CREATE TYPE bn_mood AS ENUM ('sad', 'ok', 'happy');
CREATE TYPE bn_pair AS (a int, b text);
CREATE TABLE bn_t (
    id int PRIMARY KEY, i8 bigint, i2 smallint, f4 real, f8 double precision,
    tx text, long_tx text, bo boolean, ts timestamptz, d date, nu numeric, uu uuid,
    by bytea, jb jsonb, arr int[], en bn_mood, pr bn_pair, big text
);
ALTER TABLE bn_t ALTER COLUMN big SET STORAGE EXTERNAL;
"""
TYPES_COLS = "id i8 i2 f4 f8 tx long_tx bo ts d nu uu by jb arr en pr big".split()
SEND_SQL = (
    "SELECT int4send(id), int8send(i8), int2send(i2), float4send(f4), float8send(f8),"
    " textsend(tx), textsend(long_tx), boolsend(bo), timestamptz_send(ts), date_send(d),"
    " numeric_send(nu), uuid_send(uu), byteasend(by), jsonb_send(jb), array_send(arr),"
    " enum_send(en), pr::text, textsend(big) FROM bn_t WHERE id = %s"
)
VALUES_SQL = f"SELECT {', '.join(TYPES_COLS)} FROM bn_t WHERE id = %s"


@pytest.fixture(scope="module")
def typed_changes(pgl: PglogicalDb):
    """A table of many types, a slot, and three transactions on it: an insert of
    every type, an insert of NULLs, then an update that changes the key and leaves
    the TOASTed column alone. Returns (slot, until, xids, send_rows, value_rows)."""
    pgl.sql(TYPES_DDL)
    pgl.add_to_set("bn_t")
    slot = "pgl_bin_" + secrets.token_hex(4)
    pgl.create_slot(slot)
    row = (
        1, -(2**40) - 3, -7, 1.5, -2.25, "héllo", "x" * 300, True,
        dt.datetime(2024, 2, 29, 23, 59, 58, 123456, tzinfo=dt.UTC),
        dt.date(1999, 12, 31), decimal.Decimal("-12345.678900"),
        uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"), b"\x00\xffbin", '{"k": [1, 2]}',
        [1, None, 3], "happy", "(5,five)", BIG,
    )  # fmt: skip
    xids = []
    with pgl.connect(autocommit=False) as conn:
        conn.execute(f"INSERT INTO bn_t VALUES ({', '.join(['%s'] * len(row))})", row)
        xids.append(xid_of(conn))
        conn.commit()
        conn.execute("INSERT INTO bn_t (id) VALUES (2)")
        xids.append(xid_of(conn))
        conn.commit()
        conn.execute("UPDATE bn_t SET id = 3, i2 = 8 WHERE id = 1")
        xids.append(xid_of(conn))
        conn.commit()
        send_rows = {k: conn.execute(SEND_SQL, (k,)).fetchone() for k in (2, 3)}
        value_rows = {k: conn.execute(VALUES_SQL, (k,)).fetchone() for k in (2, 3)}
        conn.commit()
    return slot, pgl.insert_lsn(), xids, send_rows, value_rows


def _typed_rows(msgs, xids):
    ins1 = transaction(msgs, xids[0])[-2]
    ins2 = transaction(msgs, xids[1])[-2]
    upd = transaction(msgs, xids[2])[-2]
    assert isinstance(ins1, Insert) and isinstance(ins2, Insert) and isinstance(upd, Update)
    assert ins1.relation.column_names == tuple(TYPES_COLS)
    return ins1, ins2, upd


def test_binary_send_recv_fields(pgl: PglogicalDb, typed_changes):
    slot, until, xids, send_rows, value_rows = typed_changes
    version = int(pgl.one("SHOW server_version_num"))
    opts = text_options(
        binary_want_binary_basetypes=True, **binary_compat_params_for_server(version)
    )
    msgs, _ = pgl.stream(slot, opts, until)
    startup = msgs[0]
    assert startup.binary_binary_basetypes is True
    assert startup.binary_internal_basetypes is False
    ins1, ins2, upd = _typed_rows(msgs, xids)

    # Every built-in or plain type goes out in its send format ('b'); the composite
    # user type in text. The first row's values equal the send functions' output for
    # the same values (read back after the update: only id and i2 differ).
    sent, vals = send_rows[3], value_rows[3]
    kinds = [f.kind for f in ins1.new_tuple]
    assert kinds == ["b"] * 16 + ["t", "b"]
    f = {c: fld.value for c, fld in zip(TYPES_COLS, ins1.new_tuple, strict=True)}
    for i, col in enumerate(TYPES_COLS):
        if col in ("id", "i2", "pr"):
            continue
        assert f[col] == bytes(sent[i]), col
    assert f["id"] == struct.pack("!i", 1)  # int4: 4 bytes big endian
    assert f["i2"] == struct.pack("!h", -7)
    assert struct.unpack("!q", f["i8"])[0] == vals[1]
    assert struct.unpack("!f", f["f4"])[0] == vals[3]
    assert struct.unpack("!d", f["f8"])[0] == vals[4]
    assert f["tx"].decode() == vals[5] and f["long_tx"].decode() == vals[6]
    assert f["bo"] == b"\x01"
    assert PG_EPOCH + dt.timedelta(microseconds=struct.unpack("!q", f["ts"])[0]) == vals[8]
    assert dt.date(2000, 1, 1) + dt.timedelta(days=struct.unpack("!i", f["d"])[0]) == vals[9]
    assert uuid.UUID(bytes=f["uu"]) == vals[11]
    assert f["by"] == vals[12]
    assert f["jb"][:1] == b"\x01"  # jsonb send format: version 1, then the text
    assert json.loads(f["jb"][1:]) == vals[13]
    assert f["en"] == b"happy"
    assert ins1.new_tuple[16] == TupleField("t", "(5,five)")
    assert f["big"].decode() == BIG

    # NULLs stay 'n'
    assert ins2.new_tuple[0] == TupleField("b", struct.pack("!i", 2))
    assert all(fld == TupleField("n") for fld in ins2.new_tuple[1:])

    # key change: 'K' old key in send format, new tuple with 'u' for the TOASTed column
    assert upd.old_tuple_type == "K"
    assert upd.old_tuple == (TupleField("b", struct.pack("!i", 1)),) + (TupleField("n"),) * 17
    assert [fl.kind for fl in upd.new_tuple] == ["b"] * 16 + ["t", "u"]
    assert upd.new_tuple[0].value == struct.pack("!i", 3) == bytes(sent[0])
    assert upd.new_tuple[2].value == struct.pack("!h", 8) == bytes(sent[2])


def _varlena(raw: bytes) -> bytes:
    """The payload of an uncompressed in-line varlena (little-endian header)."""
    if raw[0] & 0x01:  # 1-byte header
        assert raw[0] >> 1 == len(raw), raw[:4]
        return raw[1:]
    assert raw[0] & 0x03 == 0, "expected an uncompressed 4-byte header"
    assert struct.unpack("<I", raw[:4])[0] >> 2 == len(raw)
    return raw[4:]


@pytest.mark.skipif(sys.byteorder != "little", reason="checks little-endian datums")
def test_internal_binary_fields(pgl: PglogicalDb, typed_changes):
    slot, until, xids, send_rows, value_rows = typed_changes
    version = int(pgl.one("SHOW server_version_num"))
    opts = text_options(binary_want_internal_basetypes=True, **binary_compat_params_for_server(version))
    msgs, _ = pgl.stream(slot, opts, until)
    startup = msgs[0]
    assert startup.binary_internal_basetypes is True
    assert startup.binary_binary_basetypes is False
    ins1, ins2, upd = _typed_rows(msgs, xids)

    sent, vals = send_rows[3], value_rows[3]
    kinds = [f.kind for f in ins1.new_tuple]
    # built-in base types with no element type go out as raw datums ('i'); arrays
    # (typelem set), the enum and the composite (user types) fall back to text.
    assert kinds == ["i"] * 14 + ["t", "t", "t", "i"]
    f = {c: fld.value for c, fld in zip(TYPES_COLS, ins1.new_tuple, strict=True)}
    assert f["id"] == struct.pack("<i", 1)  # int4: 4 bytes little endian on x86_64
    assert f["i8"] == struct.pack("<q", vals[1])
    assert f["i2"] == struct.pack("<h", -7)
    assert f["f4"] == struct.pack("<f", vals[3])
    assert f["f8"] == struct.pack("<d", vals[4])
    assert f["bo"] == b"\x01"
    # fixed-size pass-by-value: the send format byte-reversed
    for col, i in (("i8", 1), ("f4", 3), ("f8", 4), ("ts", 8), ("d", 9)):
        assert f[col] == bytes(sent[i])[::-1], col
    assert f["uu"] == bytes(sent[11]) == vals[11].bytes  # fixed-size by reference
    # varlenas with their header: short (1-byte) and 4-byte
    assert _varlena(f["tx"]) == vals[5].encode()
    assert len(f["tx"]) == 1 + len(vals[5].encode())
    assert _varlena(f["long_tx"]) == vals[6].encode()
    assert len(f["long_tx"]) == 4 + 300
    assert _varlena(f["by"]) == vals[12]
    assert _varlena(f["big"]).decode() == BIG  # detoasted by decoding, sent in line
    _varlena(f["nu"])
    _varlena(f["jb"])
    assert ins1.new_tuple[14] == TupleField("t", "{1,NULL,3}")
    assert ins1.new_tuple[15] == TupleField("t", "happy")
    assert ins1.new_tuple[16] == TupleField("t", "(5,five)")

    assert ins2.new_tuple[0] == TupleField("i", struct.pack("<i", 2))
    assert all(fld == TupleField("n") for fld in ins2.new_tuple[1:])
    assert upd.old_tuple_type == "K"
    assert upd.old_tuple == (TupleField("i", struct.pack("<i", 1)),) + (TupleField("n"),) * 17
    assert upd.new_tuple[0] == TupleField("i", struct.pack("<i", 3))
    assert upd.new_tuple[2] == TupleField("i", struct.pack("<h", 8))
    assert upd.new_tuple[-1] == TupleField("u")


def test_both_binary_modes_prefer_internal(pgl: PglogicalDb, typed_changes):
    slot, until, xids, send_rows, _ = typed_changes
    version = int(pgl.one("SHOW server_version_num"))
    opts = text_options(
        binary_want_internal_basetypes=True,
        binary_want_binary_basetypes=True,
        **binary_compat_params_for_server(version),
    )
    msgs, _ = pgl.stream(slot, opts, until)
    assert msgs[0].binary_internal_basetypes is True
    assert msgs[0].binary_binary_basetypes is True
    ins1, _, _ = _typed_rows(msgs, xids)
    # internal where allowed, send/recv for the array and the enum, text for the composite
    assert [f.kind for f in ins1.new_tuple] == ["i"] * 14 + ["b", "b", "t", "i"]
    assert ins1.new_tuple[14].value == bytes(send_rows[3][14])
    assert ins1.new_tuple[15].value == b"happy"


def test_binary_compat_params_enable_internal_mode(pgl: PglogicalDb, typed_changes):
    slot, until, xids, _, _ = typed_changes
    version = int(pgl.one("SHOW server_version_num"))
    opts = text_options(
        binary_want_internal_basetypes=True, **binary_compat_params_for_server(version)
    )
    msgs, _ = pgl.stream(slot, opts, until)
    assert msgs[0].binary_internal_basetypes is True
    ins1, _, _ = _typed_rows(msgs, xids)
    assert ins1.new_tuple[0].kind == "i"
