"""The replication connection layer (airflow_pgcdc.pg) against real servers:
auth (SCRAM), TLS, every command, streaming, acknowledgement, keepalives, errors."""

from __future__ import annotations

import asyncio
import io
import tarfile
import threading
import time

import psycopg
import pytest

from airflow_pgcdc.pg.errors import (
    ConnectionFailed,
    ConnectionLost,
    DuplicateObject,
    FeatureNotSupported,
    ObjectInUse,
    ServerError,
    UndefinedObject,
    UndefinedTable,
)
from airflow_pgcdc.pg.logical import LogicalStream
from airflow_pgcdc.pg.replication import (
    AsyncReplicationConnection,
    BackupResult,
    ReplicationConnection,
)
from airflow_pgcdc.protocol.frames import (
    ArchiveData,
    ManifestStart,
    NewArchive,
    PrimaryKeepalive,
    Progress,
    XLogData,
)
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.pgoutput.options import PgoutputOptions


def sql(dsn: str, query: str, params=None):
    with psycopg.connect(dsn, autocommit=True) as c:
        cur = c.execute(query, params)
        return cur.fetchall() if cur.description else None


def current_lsn(dsn: str) -> LSN:
    return LSN.parse(sql(dsn, "SELECT pg_current_wal_insert_lsn()::text")[0][0])


def setup_table(dsn: str, table: str = "t", pub: str = "p") -> None:
    sql(dsn, f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
    sql(dsn, f"CREATE PUBLICATION {pub} FOR TABLE {table}")


# -- connecting -----------------------------------------------------------------------------


def test_scram_password_over_tcp(pg_server):
    with ReplicationConnection.connect(pg_server.dsn) as conn:
        ident = conn.identify_system()
        assert conn.pgconn.used_password
        assert conn.show("password_encryption") == "scram-sha-256"
    row = sql(pg_server.socket_dsn, "SELECT system_identifier::text, timeline_id FROM pg_control_system(), pg_control_checkpoint()")[0]
    assert ident.systemid == row[0] and ident.timeline == row[1]
    assert ident.dbname == "pgcdc" and ident.xlogpos > 0


def test_wrong_password_is_a_typed_error_without_the_secret(pg_server):
    dsn = pg_server.make_dsn(password="not-the-password-xyz")
    with pytest.raises(ConnectionFailed) as ei:
        ReplicationConnection.connect(dsn)
    assert "not-the-password-xyz" not in str(ei.value)
    assert "password authentication failed" in str(ei.value)


def test_least_privilege_role_can_replicate(pg_server):
    with ReplicationConnection.connect(pg_server.repl_dsn) as conn:
        assert conn.identify_system().timeline >= 1


def test_tls_verify_ca(pg15):
    dsn = pg15.make_dsn(sslmode="verify-ca", sslrootcert=str(pg15.ca_file))
    with ReplicationConnection.connect(dsn) as conn:
        assert conn.pgconn.ssl_in_use
        assert conn.identify_system().timeline >= 1


def test_physical_replication_connection(pg_server):
    with ReplicationConnection.connect(pg_server.dsn, replication="true") as conn:
        assert conn.identify_system().dbname is None


# -- commands ---------------------------------------------------------------------------------


def test_slot_lifecycle_and_typed_errors(fresh_db, slot_name):
    s = slot_name()
    with ReplicationConnection.connect(fresh_db) as conn:
        created = conn.create_slot(s, output_plugin="pgoutput", snapshot="export")
        assert created.slot_name == s and created.output_plugin == "pgoutput"
        assert created.snapshot_name and created.consistent_point > 0
        with pytest.raises(DuplicateObject) as ei:
            conn.create_slot(s, output_plugin="pgoutput", snapshot="nothing")
        assert ei.value.sqlstate == "42710" and s in ei.value.message
        with pytest.raises(FeatureNotSupported):
            conn.read_slot(s)  # READ_REPLICATION_SLOT is for physical slots only
        conn.drop_slot(s, wait=True)
        with pytest.raises(UndefinedObject):
            conn.drop_slot(s)
    assert sql(fresh_db.socket_dsn, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (s,))[0][0] == 0


def test_physical_slot_reserve_wal_and_read(pg_server, slot_name):
    s = slot_name()
    with ReplicationConnection.connect(pg_server.dsn, replication="true") as conn:
        created = conn.create_slot(s, reserve_wal=True)
        assert created.output_plugin is None and created.snapshot_name is None
        info = conn.read_slot(s)
        assert info.slot_type == "physical" and info.restart_lsn is not None and info.restart_tli == 1
        missing = conn.read_slot("no_such_slot_xyz")
        assert missing.slot_type is None
        conn.drop_slot(s)


def test_temporary_slot_disappears_with_connection(fresh_db, slot_name):
    s = slot_name()
    with ReplicationConnection.connect(fresh_db) as conn:
        conn.create_slot(s, output_plugin="pgoutput", temporary=True, snapshot="nothing")
        assert sql(fresh_db.socket_dsn, "SELECT temporary FROM pg_replication_slots WHERE slot_name = %s", (s,)) == [(True,)]
    deadline = time.monotonic() + 10
    while sql(fresh_db.socket_dsn, "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (s,)):
        assert time.monotonic() < deadline, "temporary slot survived its connection"
        time.sleep(0.05)


def test_timeline_history_of_timeline_1_is_a_server_error(pg_server):
    # a fresh cluster has no history file for timeline 1; the server says so, typed
    with ReplicationConnection.connect(pg_server.dsn, replication="true") as conn:
        with pytest.raises(ServerError) as ei:
            conn.timeline_history(1)
        assert ei.value.sqlstate


def test_sql_on_a_replication_database_connection(fresh_db):
    with ReplicationConnection.connect(fresh_db) as conn:
        res = conn.execute("SELECT 1 AS one, NULL::text AS nothing, 'x''y' AS q")
        assert res[-1].columns == ["one", "nothing", "q"]
        assert res[-1].rows == [("1", None, "x'y")]
        assert conn.show("standard_conforming_strings") == "on"


# -- streaming ----------------------------------------------------------------------------------


def test_logical_stream_confirm_advances_slot(fresh_db, slot_name):
    setup_table(fresh_db)
    s = slot_name()
    with ReplicationConnection.connect(fresh_db) as conn:
        conn.create_slot(s, output_plugin="pgoutput", snapshot="nothing")
    sql(fresh_db, "INSERT INTO t VALUES (1, 'a')")
    sql(fresh_db, "INSERT INTO t VALUES (2, 'b')")
    target = current_lsn(fresh_db)
    with ReplicationConnection.connect(fresh_db) as conn:
        stream = LogicalStream.pgoutput(conn, s, PgoutputOptions(publications=("p",)))
        msgs = stream.read_until(target, timeout=30)
        commits = [m for m in msgs if m.type == "commit"]
        assert len(commits) == 2
        conn.confirm(commits[0].end_lsn)  # acknowledge only the first transaction
        conn.stop()
    confirmed = sql(fresh_db.socket_dsn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (s,))[0][0]
    assert LSN.parse(confirmed) == commits[0].end_lsn
    # the second transaction is delivered again, the first is not
    with ReplicationConnection.connect(fresh_db) as conn:
        again = LogicalStream.pgoutput(conn, s, PgoutputOptions(publications=("p",))).read_until(target, timeout=30)
        conn.stop()
    inserts = [m.new[0] for m in again if m.type == "insert"]
    assert inserts == ["2"]


def test_second_stream_on_same_slot_is_object_in_use(fresh_db, slot_name):
    setup_table(fresh_db)
    s = slot_name()
    with ReplicationConnection.connect(fresh_db) as conn:
        conn.create_slot(s, output_plugin="pgoutput", snapshot="nothing")
    with ReplicationConnection.connect(fresh_db) as first:
        LogicalStream.pgoutput(first, s, PgoutputOptions(publications=("p",)))
        with ReplicationConnection.connect(fresh_db) as second:
            with pytest.raises(ObjectInUse) as ei:
                LogicalStream.pgoutput(second, s, PgoutputOptions(publications=("p",)))
            assert ei.value.sqlstate == "55006"
        first.stop()


def test_missing_slot_and_missing_publication(fresh_db, slot_name):
    with ReplicationConnection.connect(fresh_db) as conn:
        with pytest.raises(UndefinedObject):
            LogicalStream.pgoutput(conn, "no_such_slot", PgoutputOptions(publications=("p",)))
    setup_table(fresh_db)
    s = slot_name()
    with ReplicationConnection.connect(fresh_db) as conn:
        conn.create_slot(s, output_plugin="pgoutput", snapshot="nothing")
    sql(fresh_db, "INSERT INTO t VALUES (1, 'a')")
    target = current_lsn(fresh_db)
    with ReplicationConnection.connect(fresh_db) as conn:
        stream = LogicalStream.pgoutput(conn, s, PgoutputOptions(publications=("missing_pub",)))
        if conn.server_version >= 180000:
            # PostgreSQL 18 skips a missing publication with a WARNING and sends nothing
            msgs = stream.read_until(target, timeout=30)
            assert not [m for m in msgs if m.type == "insert"]
        else:
            with pytest.raises(UndefinedObject) as ei:
                stream.read_until(target, timeout=30)
            assert "missing_pub" in str(ei.value)


def test_keepalives_answered_while_idle(fresh_db, slot_name):
    """wal_sender_timeout=2s and no periodic status updates of our own: only the
    automatic replies to keepalives keep the connection alive."""
    setup_table(fresh_db)
    s = slot_name()
    with ReplicationConnection.connect(fresh_db) as conn:
        conn.create_slot(s, output_plugin="pgoutput", snapshot="nothing")
    with ReplicationConnection.connect(
        fresh_db, status_interval=3600, options="-c wal_sender_timeout=2s"
    ) as conn:
        assert conn.show("wal_sender_timeout") == "2s"
        LogicalStream.pgoutput(conn, s, PgoutputOptions(publications=("p",)))
        asked = 0
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            frame = conn.read_message(timeout=0.5)
            if isinstance(frame, PrimaryKeepalive) and frame.reply_requested:
                asked += 1
        assert asked >= 2, "the server should have asked for replies"
        sql(fresh_db, "INSERT INTO t VALUES (1, 'alive')")
        got = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            frame = conn.read_message(timeout=0.5)
            if isinstance(frame, XLogData) and frame.data[:1] == b"I":
                got.append(frame)
        assert got, "the connection survived 3x wal_sender_timeout and still streams"
        conn.stop()


def test_terminated_walsender_raises_connection_lost(fresh_db, slot_name):
    setup_table(fresh_db)
    s = slot_name()
    with ReplicationConnection.connect(fresh_db) as conn:
        conn.create_slot(s, output_plugin="pgoutput", snapshot="nothing")
    with ReplicationConnection.connect(fresh_db) as conn:
        LogicalStream.pgoutput(conn, s, PgoutputOptions(publications=("p",)))
        pid = conn.pgconn.backend_pid
        sql(fresh_db.socket_dsn, "SELECT pg_terminate_backend(%s)", (pid,))
        # the server says why (57P01) or the socket just closes: typed either way, never a hang
        with pytest.raises((ConnectionLost, ServerError)):
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                conn.read_message(timeout=0.5)


def test_physical_stream_receives_wal(pg_server, slot_name):
    s = slot_name()
    with ReplicationConnection.connect(pg_server.dsn, replication="true") as conn:
        created = conn.create_slot(s, reserve_wal=True)
        ident = conn.identify_system()
    start = LSN(int(ident.xlogpos) & ~0xFFFFFF)  # segment start
    sql(pg_server.socket_dsn, "SELECT pg_switch_wal()")
    with ReplicationConnection.connect(pg_server.dsn, replication="true") as conn:
        conn.start_replication(s, start, logical=False, timeline=ident.timeline)
        got = 0
        deadline = time.monotonic() + 20
        while got < 8192 and time.monotonic() < deadline:
            frame = conn.read_message(timeout=1)
            if isinstance(frame, XLogData):
                assert frame.data_start >= start
                got += len(frame.data)
        conn.send_feedback(write=start + got, flush=start + got, apply=start + got)
        results = conn.stop()
        assert got >= 8192
    assert created.consistent_point >= 0 and isinstance(results, list)


def test_base_backup_messages(pg_server):
    with ReplicationConnection.connect(pg_server.dsn, replication="true") as conn:
        events = list(
            conn.base_backup(label="pgcdc test", progress=True, checkpoint="fast", wal=True, manifest="yes", max_rate=1_000_000)
        )
    results = [e for e in events if isinstance(e, BackupResult)]
    assert [r.index for r in results] == [0, 1, 2]
    start = results[0].result.rows[0]
    end = results[2].result.rows[0]
    assert LSN.parse(end[0]) >= LSN.parse(start[0])
    archives = [e for e in events if isinstance(e, NewArchive)]
    assert archives[0].archive_name == "base.tar" and archives[0].tablespace_location == ""
    assert any(isinstance(e, Progress) for e in events)
    # reassemble base.tar and check it really is the data directory
    data = bytearray()
    in_manifest = False
    manifest = bytearray()
    for e in events:
        if isinstance(e, ManifestStart):
            in_manifest = True
        elif isinstance(e, ArchiveData):
            (manifest if in_manifest else data).extend(e.data)
    with tarfile.open(fileobj=io.BytesIO(bytes(data))) as tar:
        names = tar.getnames()
    assert "PG_VERSION" in names and "backup_label" in names
    assert b'"PostgreSQL-Backup-Manifest-Version"' in manifest


# -- asyncio --------------------------------------------------------------------------------------


def test_async_connection_streams_and_confirms(fresh_db, slot_name):
    setup_table(fresh_db)
    s = slot_name()

    async def main():
        async with await AsyncReplicationConnection.connect(fresh_db) as conn:
            created = await conn.create_slot(s, output_plugin="pgoutput", snapshot="nothing")
        sql(fresh_db, "INSERT INTO t VALUES (7, 'async')")
        async with await AsyncReplicationConnection.connect(fresh_db) as conn:
            opts = PgoutputOptions(publications=("p",)).start_options(conn.server_version)
            await conn.start_replication(s, created.consistent_point, options=opts)
            frames = []
            async def collect():
                async for frame in conn:
                    if isinstance(frame, XLogData):
                        frames.append(bytes(frame.data))
                        if frame.data[:1] == b"C":
                            return
            # a concurrent task keeps running while we wait on the socket
            ticks = 0
            async def ticker():
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.01)
            t = asyncio.create_task(ticker())
            await asyncio.wait_for(collect(), 30)
            t.cancel()
            commit_end = LSN(int.from_bytes(frames[-1][10:18], "big"))
            await conn.confirm(commit_end)
            await conn.stop()
            return frames, commit_end, ticks

    frames, end, ticks = asyncio.run(main())
    assert [f[:1] for f in frames] == [b"B", b"R", b"I", b"C"]
    confirmed = sql(fresh_db.socket_dsn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (s,))[0][0]
    assert LSN.parse(confirmed) == end
    assert ticks > 0


def test_sync_read_can_be_interrupted_by_timeout_without_hanging(fresh_db, slot_name):
    setup_table(fresh_db)
    s = slot_name()
    with ReplicationConnection.connect(fresh_db) as conn:
        conn.create_slot(s, output_plugin="pgoutput", snapshot="nothing")
    with ReplicationConnection.connect(fresh_db) as conn:
        LogicalStream.pgoutput(conn, s, PgoutputOptions(publications=("p",)))
        for _ in range(100):  # drain the initial keepalives: an idle stream soon times out
            if conn.read_message(timeout=0.3) is None:
                break
        else:
            pytest.fail("read_message(timeout=0.3) never returned None on an idle stream")
        # reading happens without holding the GIL: another thread makes progress
        counter = 0
        stop = threading.Event()

        def spin():
            nonlocal counter
            while not stop.is_set():
                counter += 1

        th = threading.Thread(target=spin)
        th.start()
        conn.read_message(timeout=0.5)
        stop.set()
        th.join()
        assert counter > 1000
        conn.stop()


def test_copy_to_chunks_whole_rows(fresh_db):
    sql(fresh_db, "CREATE TABLE c (id int, v text)")
    sql(fresh_db, "INSERT INTO c SELECT g, repeat('x', g % 50) || E'\\ttab' FROM generate_series(1, 20000) g")
    with ReplicationConnection.connect(fresh_db, replication="false") as conn:
        chunks = list(conn.copy_to("COPY (SELECT * FROM c ORDER BY id) TO STDOUT", chunk_bytes=64 * 1024))
        assert len(chunks) > 3 and all(ch.endswith(b"\n") for ch in chunks)
        rows = b"".join(chunks).splitlines()
        assert len(rows) == 20000 and rows[0] == b"1\tx\\ttab"
        # the session is usable again afterwards
        assert conn.execute("SELECT count(*) FROM c")[-1].rows == [("20000",)]
        with pytest.raises(UndefinedTable):
            list(conn.copy_to("COPY (SELECT * FROM missing_table) TO STDOUT"))
