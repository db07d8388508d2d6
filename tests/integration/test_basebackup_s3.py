"""BASE_BACKUP streamed to S3, proved by restoring it.

Each restore test backs up a real PostgreSQL 15 / 18 server (a table with a TOASTed value
in the default tablespace, another table in an extra tablespace) to the S3 server, then:
downloads every archive named in ``backup.json`` (sizes and SHA-256 checked), extracts
them into a fresh data directory and tablespace directory (decompressing gzip / lz4 /
zstd), puts ``backup_manifest`` next to them, runs that server version's
``pg_verifybackup`` (which also parses the WAL the backup carries), starts PostgreSQL on
the restored directory (recovery from the included WAL) and compares the tables with the
source. Compressions the server build lacks are skipped with the server's own message.

Failure tests check that nothing is left in the bucket (no object, no pending multipart
upload) after: a server that refuses an option, a missing bucket, S3 faults injected at
three points, and the walsender killed mid-stream.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import importlib.util
import json
import logging
import os
import secrets
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import psycopg
import pytest
from botocore.exceptions import ClientError

from airflow_pgcdc import cli
from airflow_pgcdc.snapshot.basebackup import (
    BackupExists,
    BaseBackupResult,
    BaseBackupServerError,
    BaseBackupStoreError,
    base_backup_to_s3,
)
from airflow_pgcdc.store.manifest import read_basebackup_info
from airflow_pgcdc.store.s3 import MIN_PART_SIZE, ObjectNotFound
from airflow_pgcdc.testing.postgres import PostgresServer
from airflow_pgcdc.testing.processes import chown_tree, postgres_run_as

MiB = 1024 * 1024


# --------------------------------------------------------------------------- helpers


def _objects(client, bucket: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", ()) or ():
            out[obj["Key"]] = obj["Size"]
    return out


def _pending_uploads(client, bucket: str) -> list[str]:
    return [u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) or []]


def _assert_bucket_clean(client, bucket: str) -> None:
    assert _objects(client, bucket) == {}
    assert _pending_uploads(client, bucket) == []


def _wait_no_backup_running(server: PostgresServer, timeout: float = 10.0) -> None:
    """The server ended the backup (no BASE_BACKUP left in progress)."""
    deadline = time.monotonic() + timeout
    while server.execute("SELECT pid FROM pg_stat_progress_basebackup"):
        assert time.monotonic() < deadline, "the server still runs the aborted BASE_BACKUP"
        time.sleep(0.05)


def _unsupported(e: BaseBackupServerError) -> bool:
    return "does not support" in str(e) or "not supported" in str(e)


class FaultyClient:
    """A boto3 client that fails the ``nth`` call of ``operation`` on a key ending with
    ``key_suffix`` (a 500 InternalError, as S3 would send it)."""

    def __init__(self, client, operation: str, key_suffix: str, nth: int = 1) -> None:
        self._client, self._operation, self._suffix, self._nth = client, operation, key_suffix, nth
        self.calls = 0

    def __getattr__(self, name: str):
        attr = getattr(self._client, name)
        if name != self._operation:
            return attr

        def call(**kwargs):
            if kwargs.get("Key", "").endswith(self._suffix):
                self.calls += 1
                if self.calls == self._nth:
                    raise ClientError(
                        {
                            "Error": {"Code": "InternalError", "Message": "injected fault"},
                            "ResponseMetadata": {"HTTPStatusCode": 500},
                        },
                        name,
                    )
            return attr(**kwargs)

        return call


# --------------------------------------------------------------------------- source data


@pytest.fixture
def tablespace(fresh_db):
    """An extra tablespace on the test's server (dropped after, with ``t_ts``)."""
    server: PostgresServer = fresh_db.server
    run_as = postgres_run_as()
    base = Path(tempfile.mkdtemp(prefix="pgcdc-ts-"))
    os.chmod(base, 0o711)
    location = base / "ts"
    location.mkdir(mode=0o700)
    chown_tree(location, run_as)
    name = "ts_" + secrets.token_hex(4)
    server.execute(f"CREATE TABLESPACE {name} LOCATION '{location}'")
    yield name
    with contextlib.suppress(Exception):
        server.execute("DROP TABLE IF EXISTS t_ts", dbname=fresh_db.dbname)
    _drop_tablespace(server, name)
    shutil.rmtree(base, ignore_errors=True)


def _drop_tablespace(server: PostgresServer, name: str, timeout: float = 30.0) -> None:
    """DROP TABLESPACE waits for a ProcSignalBarrier that pglogical 2.4.2's workers (PG15)
    never absorb: terminate them first, as ``PostgresServer.drop_database`` does."""
    deadline = time.monotonic() + timeout
    with server.connect("postgres") as conn:
        while True:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE backend_type LIKE 'pglogical%%'"
            )
            conn.execute("SET statement_timeout = 5000")
            try:
                conn.execute(f"DROP TABLESPACE IF EXISTS {name}")
                return
            except psycopg.errors.QueryCanceled:
                assert time.monotonic() < deadline, f"DROP TABLESPACE {name} did not finish"


def _seed(dsn: str, tablespace: str | None) -> None:
    """Tables ``t`` (a 1 MiB value stored out of line in TOAST, deleted rows) and ``t_ts``
    in ``tablespace``."""
    big = secrets.token_hex(512 * 1024)  # 1 MiB of text
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, label text NOT NULL, big text)")
        conn.execute("ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL")
        conn.execute("INSERT INTO t SELECT g, 'row ' || g, NULL FROM generate_series(1, 500) g")
        conn.execute("UPDATE t SET big = %s WHERE id = 7", (big,))
        conn.execute("UPDATE t SET big = repeat('x', 5000) WHERE id = 8")
        conn.execute("DELETE FROM t WHERE id % 50 = 0")
        toast = conn.execute(
            "SELECT reltoastrelid::regclass::text FROM pg_class WHERE oid = 't'::regclass"
        ).fetchone()[0]
        assert conn.execute(f"SELECT count(*) FROM {toast}").fetchone()[0] > 100  # out of line
        if tablespace:
            conn.execute(f"CREATE TABLE t_ts (id int PRIMARY KEY, v text) TABLESPACE {tablespace}")
            conn.execute("INSERT INTO t_ts SELECT g, md5(g::text) FROM generate_series(1, 200) g")


def _table_contents(conn) -> dict[str, list]:
    out = {"t": conn.execute("SELECT id, label, big FROM t ORDER BY id").fetchall()}
    if conn.execute("SELECT to_regclass('t_ts')").fetchone()[0] is not None:
        out["t_ts"] = conn.execute("SELECT id, v FROM t_ts ORDER BY id").fetchall()
    return out


# --------------------------------------------------------------------------- restore


def _lz4_available() -> str | None:
    if importlib.util.find_spec("lz4") is not None:
        return "module"
    if shutil.which("lz4"):
        return "cli"
    return None


# The archives come from our own test server; the "tar"/"data" filters' per-member checks
# cost 1.5 s per 46 MB data directory, which this file cannot afford several times over.
_FILTER = "fully_trusted"


def _extract(path: Path, compression: str | None, dest: Path) -> None:
    """Extract one archive into ``dest``, decompressing as a stream."""
    if compression is None:
        with tarfile.open(path, "r:") as tar:
            tar.extractall(dest, filter=_FILTER)
    elif compression == "gzip":
        with gzip.open(path, "rb") as raw, tarfile.open(fileobj=raw, mode="r|") as tar:
            tar.extractall(dest, filter=_FILTER)
    elif compression == "zstd":
        import zstandard

        with open(path, "rb") as f, zstandard.ZstdDecompressor().stream_reader(f) as raw:
            with tarfile.open(fileobj=raw, mode="r|") as tar:
                tar.extractall(dest, filter=_FILTER)
    elif compression == "lz4":
        if _lz4_available() == "module":
            import lz4.frame

            with lz4.frame.open(path, "rb") as raw, tarfile.open(fileobj=raw, mode="r|") as tar:
                tar.extractall(dest, filter=_FILTER)
        else:
            proc = subprocess.Popen(["lz4", "-dc", str(path)], stdout=subprocess.PIPE)
            assert proc.stdout is not None
            with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                tar.extractall(dest, filter=_FILTER)
            assert proc.wait(30) == 0
    else:  # pragma: no cover
        raise AssertionError(compression)


class Restored:
    """A backup downloaded from S3 and laid out as a data directory (``base/data``) and
    one directory per tablespace (``base/ts/<oid>``)."""

    def __init__(self, base: Path, data: Path, tablespaces: dict[int, Path]) -> None:
        self.base, self.data, self.tablespaces = base, data, tablespaces


@contextlib.contextmanager
def restore_from_s3(client, bucket: str, result: BaseBackupResult):
    """Download and extract a backup into a fresh directory (removed after)."""
    base = Path(tempfile.mkdtemp(prefix="pgcdc-restore-"))
    os.chmod(base, 0o711)  # the `postgres` user must reach the data directory
    try:
        info = read_basebackup_info(client, bucket, result.info_key)
        assert info == result.info
        downloads = base / "downloads"
        downloads.mkdir()
        data = base / "data"
        data.mkdir(mode=0o700)
        tablespaces: dict[int, Path] = {}
        prefix = result.info_key.rsplit("/", 1)[0] + "/"
        for archive in info.archives:
            path = downloads / archive.name
            client.download_file(bucket, prefix + archive.name, str(path))
            assert path.stat().st_size == archive.bytes
            assert hashlib.sha256(path.read_bytes()).hexdigest() == archive.extra["sha256"]
            if archive.tablespace_oid is None:
                dest = data
            else:
                dest = base / "ts" / str(archive.tablespace_oid)
                dest.mkdir(parents=True, mode=0o700)
                tablespaces[archive.tablespace_oid] = dest
            _extract(path, info.compression, dest)
            path.unlink()
        if info.manifest:
            client.download_file(bucket, prefix + "backup_manifest", str(data / "backup_manifest"))
            manifest = (data / "backup_manifest").read_bytes()
            assert len(manifest) == info.extra["manifest_bytes"]
            assert hashlib.sha256(manifest).hexdigest() == info.extra["manifest_sha256"]
        # what pg_basebackup does for a plain-format backup: the tablespace symlinks
        for oid, path in tablespaces.items():
            link = data / "pg_tblspc" / str(oid)
            if not link.exists():
                link.symlink_to(path)
        yield Restored(base, data, tablespaces)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def verify_backup(server: PostgresServer, data: Path, *, parse_wal: bool = True) -> str:
    """``pg_verifybackup`` of the server's own version on a restored directory."""
    argv = [str(server.bin_dir / "pg_verifybackup")]
    if not parse_wal:
        argv.append("--no-parse-wal")
    proc = subprocess.run(argv + [str(data)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"pg_verifybackup failed:\n{proc.stdout}{proc.stderr}"
    return proc.stdout + proc.stderr


@contextlib.contextmanager
def start_restored(source: PostgresServer, restored: Restored):
    """Start PostgreSQL on a restored directory (recovery from the WAL it carries)."""
    if restored.tablespaces:  # point tablespace_map at the restored tablespace directories
        tmap = restored.data / "tablespace_map"
        assert tmap.exists()
        oids = {int(line.split(" ", 1)[0]) for line in tmap.read_text().splitlines() if line}
        assert oids == set(restored.tablespaces)
        tmap.write_text("".join(f"{oid} {path}\n" for oid, path in restored.tablespaces.items()))
    chown_tree(restored.base, postgres_run_as())
    server = PostgresServer(
        source.flavour,
        base_dir=restored.base,
        password=source.password,
        repl_password=source.repl_password,
    )
    try:
        server.start()
        yield server
    finally:
        server.close()


# --------------------------------------------------------------------------- backup + restore

RESTORE_CASES = [
    pytest.param(None, None, id="none"),
    pytest.param("gzip", 1, id="gzip"),
    pytest.param("lz4", 3, id="lz4"),
    pytest.param("zstd", {"level": 5, "workers": 2}, id="zstd"),
]


@pytest.mark.parametrize(("compression", "detail"), RESTORE_CASES)
def test_backup_to_s3_restores(fresh_db, tablespace, s3, s3_bucket, compression, detail):
    server: PostgresServer = fresh_db.server
    client = s3.client()
    if compression == "lz4" and _lz4_available() is None:
        pytest.skip("no lz4 decompressor here (neither the lz4 module nor the lz4 CLI)")
    _seed(fresh_db, tablespace)
    with psycopg.connect(fresh_db) as conn:
        expected = _table_contents(conn)
        system_id = str(conn.execute("SELECT system_identifier FROM pg_control_system()").fetchone()[0])
        ts_oid = conn.execute("SELECT oid FROM pg_tablespace WHERE spcname = %s", (tablespace,)).fetchone()[0]
    assert len(expected["t"]) == 490 and len(expected["t_ts"]) == 200

    try:
        result = base_backup_to_s3(
            fresh_db, f"s3://{s3_bucket}/backups", compression=compression,
            compression_detail=detail, s3=client, part_size=MIN_PART_SIZE,
            label="restore test",
        )
    except BaseBackupServerError as e:
        if compression and _unsupported(e):
            _assert_bucket_clean(client, s3_bucket)
            pytest.skip(f"{server.flavour} build: {str(e).splitlines()[0]}")
        raise

    info = result.info
    suffix = {None: "", "gzip": ".gz", "lz4": ".lz4", "zstd": ".zst"}[compression]
    prefix = f"backups/basebackup/{result.backup_id}/"
    assert result.url == f"s3://{s3_bucket}/{prefix}"
    names = {f"base.tar{suffix}", f"{ts_oid}.tar{suffix}"}
    stored = _objects(client, s3_bucket)
    assert set(stored) == {prefix + n for n in names | {"backup_manifest", "backup.json"}}
    assert _pending_uploads(client, s3_bucket) == []
    assert {a.name: a.bytes for a in info.archives} == {n: stored[prefix + n] for n in names}
    ts_archive = next(a for a in info.archives if a.tablespace_oid is not None)
    assert ts_archive.tablespace_oid == ts_oid and ts_archive.tablespace_location
    assert info.compression == compression and info.manifest is True
    assert info.system_id == system_id and info.timeline == 1 and info.label == "restore test"
    assert info.start_lsn != info.end_lsn
    assert info.extra["server_version_num"] // 10000 == server.major
    if compression is None:  # the 5 MiB parts really made a multipart upload
        assert stored[prefix + "base.tar"] > 2 * MIN_PART_SIZE
    else:
        assert info.extra["uncompressed_bytes"] > info.bytes

    with restore_from_s3(client, s3_bucket, result) as restored:
        assert (restored.data / "backup_label").read_text().count("LABEL: restore test") == 1
        assert any((restored.data / "pg_wal").glob("0000000100000000*"))  # WAL is included
        out = verify_backup(server, restored.data)
        assert "successfully verified" in out
        with start_restored(server, restored) as copy:
            with copy.connect(fresh_db.dbname) as conn:
                assert _table_contents(conn) == expected
                assert str(
                    conn.execute("SELECT system_identifier FROM pg_control_system()").fetchone()[0]
                ) == system_id
                assert conn.execute("SELECT pg_is_in_recovery()").fetchone()[0] is False
                assert conn.execute(
                    "SELECT pg_tablespace_location(oid) FROM pg_tablespace WHERE spcname = %s",
                    (tablespace,),
                ).fetchone()[0] == str(restored.tablespaces[ts_oid])


def test_options_are_sent_and_recorded(fresh_db, s3, s3_bucket):
    """No WAL, force-encoded SHA256 manifest, no checksums verification, no tablespace
    map, rate-limited, a label with quotes: the server honours each, backup.json says so."""
    server: PostgresServer = fresh_db.server
    client = s3.client()
    label = "it's a \"label\" \\ with quotes"
    result = base_backup_to_s3(
        fresh_db, f"s3://{s3_bucket}", backup_id="opts-1", label=label, wal=False,
        wait=False, compression="gzip", compression_detail="level=1", max_rate=1_000_000,
        tablespace_map=False, verify_checksums=False, manifest="force-encode",
        manifest_checksums="sha256", progress_interval=None, s3=client,
    )
    info = result.info
    assert result.backup_id == "opts-1" and info.label == label
    assert info.extra["wal"] is False
    assert info.extra["options"] == {
        "checkpoint": "fast", "wait": False, "compression_detail": "level=1",
        "max_rate": 1_000_000, "tablespace_map": False, "verify_checksums": False,
        "manifest": "force-encode", "manifest_checksums": "SHA256",
    }
    # 'p' messages come without PROGRESS too (only the sizes in the tablespace list need it)
    assert info.extra["uncompressed_bytes"] > info.bytes
    manifest = json.loads(client.get_object(Bucket=s3_bucket, Key=result.manifest_key)["Body"].read())
    files = manifest["Files"]
    assert files and all("Encoded-Path" in f and "Path" not in f for f in files)
    assert {f["Checksum-Algorithm"] for f in files} == {"SHA256"}
    assert manifest["WAL-Ranges"][0]["Start-LSN"] == info.start_lsn
    with restore_from_s3(client, s3_bucket, result) as restored:
        assert f"LABEL: {label}\n" in (restored.data / "backup_label").read_text()
        assert not any(p.is_file() for p in (restored.data / "pg_wal").iterdir())
        assert not (restored.data / "tablespace_map").exists()
        verify_backup(server, restored.data, parse_wal=False)


def test_no_manifest(pg18, s3, s3_bucket):
    client = s3.client()
    result = base_backup_to_s3(
        pg18.dsn, f"s3://{s3_bucket}/p", manifest="no", s3=client, progress_interval=None
    )
    assert result.info.manifest is False and result.manifest_key is None
    assert {k.rsplit("/", 1)[1] for k in _objects(client, s3_bucket)} == {"base.tar", "backup.json"}


def test_memory_stays_bounded(pg18, s3, s3_bucket):
    """An archive much larger than a part streams through with about two parts in memory."""
    client = s3.client()
    base_backup_to_s3(pg18.dsn, f"s3://{s3_bucket}/warm", s3=client, compression="gzip")
    tracemalloc.start()
    try:
        result = base_backup_to_s3(
            pg18.dsn, f"s3://{s3_bucket}", s3=client, part_size=MIN_PART_SIZE,
            progress_interval=None,
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.info.bytes > 6 * MIN_PART_SIZE
    assert peak < 3 * MIN_PART_SIZE, f"peak {peak / MiB:.1f} MiB"


def test_progress_is_logged(pg18, s3, s3_bucket, caplog):
    """The 'p' messages become log lines with bytes and rate (and, once the server's
    tablespace sizes are known while streaming, percent and ETA)."""
    caplog.set_level(logging.INFO, logger="airflow_pgcdc.snapshot.basebackup")
    result = base_backup_to_s3(
        pg18.dsn, f"s3://{s3_bucket}", max_rate=24_000, progress_interval=0.01,
        s3=s3.client(),
    )
    lines = [r.getMessage() for r in caplog.records if r.name.endswith("basebackup")]
    progress = [m for m in lines if "/s" in m and "done in" not in m]
    assert progress, lines
    assert all("MiB" in m for m in progress)
    assert any("done in" in m and result.end_lsn in m for m in lines)
    assert not any(pg18.password in m for m in lines)  # the DSN is redacted
    assert any("password=***" in m for m in lines)
    if not any("%" in m and "ETA" in m for m in progress):
        pytest.xfail(
            "pg.replication.ReplicationConnection.base_backup yields the start-position and "
            "tablespace result sets after the CopyData, so sizes (percent, ETA) are unknown "
            "while streaming"
        )


# --------------------------------------------------------------------------- failures


def test_refused_option_leaves_nothing(pg_server, s3, s3_bucket):
    client = s3.client()
    with pytest.raises(BaseBackupServerError) as info:
        base_backup_to_s3(pg_server.dsn, f"s3://{s3_bucket}/x", label="L" * 2000, s3=client)
    e = info.value
    assert "backup label too long" in str(e) and e.cause.sqlstate == "22023"
    assert e.stage == "running BASE_BACKUP" and e.url.startswith(f"s3://{s3_bucket}/x/basebackup/")
    assert pg_server.password not in str(e)
    _assert_bucket_clean(client, s3_bucket)


def test_unsupported_compression_leaves_nothing(pg18, s3, s3_bucket):
    """The embedded PostgreSQL 18 build has no lz4: the server refuses, nothing is left."""
    client = s3.client()
    try:
        result = base_backup_to_s3(pg18.dsn, f"s3://{s3_bucket}", compression="lz4", s3=client)
    except BaseBackupServerError as e:
        assert _unsupported(e) and "LZ4" in str(e)
        _assert_bucket_clean(client, s3_bucket)
    else:
        assert result.info.compression == "lz4"
        pytest.skip("this PostgreSQL 18 build supports lz4: no refusal to test")


def test_missing_bucket(pg_server, s3):
    client = s3.client()
    before = pg_server.execute("SELECT count(*) FROM pg_stat_replication")
    with pytest.raises(BaseBackupStoreError) as info:
        base_backup_to_s3(pg_server.dsn, "s3://no-such-bucket-pgcdc/x", backup_id="b1", s3=client)
    e = info.value
    assert isinstance(e.cause, ObjectNotFound) and e.cause.code == "NoSuchBucket"
    assert "checking the destination" in e.stage and e.hint
    assert pg_server.execute("SELECT count(*) FROM pg_stat_replication") == before


@pytest.mark.parametrize(
    ("operation", "key_suffix", "nth", "stage", "compression"),
    [
        pytest.param(
            "upload_part", "base.tar", 2, "streaming base.tar", None, id="second-part-of-base.tar"
        ),
        pytest.param("put_object", "backup_manifest", 1, "completing", "gzip", id="backup_manifest"),
        pytest.param("put_object", "backup.json", 1, "writing", "gzip", id="backup.json"),
    ],
)
def test_s3_fault_cleans_up(
    pg_server, s3, s3_bucket, operation, key_suffix, nth, stage, compression
):
    client = s3.client()
    faulty = FaultyClient(client, operation, key_suffix, nth)
    with pytest.raises(BaseBackupStoreError) as info:
        base_backup_to_s3(
            pg_server.dsn, f"s3://{s3_bucket}/f", s3=faulty, part_size=MIN_PART_SIZE,
            progress_interval=None, compression=compression,
        )
    e = info.value
    assert faulty.calls == nth
    assert e.stage.startswith(stage) and key_suffix in e.stage
    assert e.cause.code == "InternalError" and "injected fault" in str(e)
    assert "removed" in e.cleanup
    if key_suffix != "base.tar":  # base.tar was complete, then deleted
        assert "removed 0 " not in e.cleanup
    _assert_bucket_clean(client, s3_bucket)
    _wait_no_backup_running(pg_server)


def test_walsender_killed_mid_stream(pg_server, s3, s3_bucket):
    """The server dies while base.tar is half uploaded: its multipart upload is aborted."""
    client = s3.client()
    killed: list[int] = []

    def kill_when_streaming() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rows = pg_server.execute("SELECT pid, backup_streamed FROM pg_stat_progress_basebackup")
            if rows and rows[0][1] > 2 * MIN_PART_SIZE:  # a part is uploaded, more pending
                pg_server.execute("SELECT pg_terminate_backend(%s)", (rows[0][0],))
                killed.append(rows[0][0])
                return
            time.sleep(0.02)

    thread = threading.Thread(target=kill_when_streaming, daemon=True)
    thread.start()
    with pytest.raises(BaseBackupServerError) as info:
        base_backup_to_s3(
            pg_server.dsn, f"s3://{s3_bucket}/k", max_rate=16_384, s3=client,
            part_size=MIN_PART_SIZE, progress_interval=None,
        )
    thread.join(5)
    assert killed
    e = info.value
    assert e.stage.startswith("streaming base.tar")
    assert "terminating connection" in str(e) or "lost" in str(e)
    _assert_bucket_clean(client, s3_bucket)


def test_existing_backup_id_is_refused(pg18, s3, s3_bucket):
    client = s3.client()
    first = base_backup_to_s3(
        pg18.dsn, f"s3://{s3_bucket}", backup_id="same", compression="gzip", s3=client,
        progress_interval=None,
    )
    before = _objects(client, s3_bucket)
    with pytest.raises(BackupExists) as info:
        base_backup_to_s3(pg18.dsn, f"s3://{s3_bucket}", backup_id="same", s3=client)
    assert "already exists" in str(info.value) and info.value.hint
    assert _objects(client, s3_bucket) == before  # the first backup is untouched
    assert read_basebackup_info(client, s3_bucket, first.info_key) == first.info


# --------------------------------------------------------------------------- CLI


def test_cli_basebackup(pg_server, s3, s3_bucket, monkeypatch, capsys):
    for key, value in s3.aws_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PGCDC_DSN", pg_server.dsn)  # the password stays off the command line
    code = cli.main([
        "basebackup", "--to", f"s3://{s3_bucket}/cli",
        "--backup-id", "cli-1", "--compression", "gzip", "--compression-detail", "1",
        "--label", "from the cli", "--manifest-checksums", "sha256", "--progress-interval", "0.01",
    ])
    out, err = capsys.readouterr()
    assert code == 0, err
    printed = json.loads(out)
    stored = json.loads(
        s3.client().get_object(Bucket=s3_bucket, Key="cli/basebackup/cli-1/backup.json")["Body"].read()
    )
    assert printed == stored
    assert printed["backup_id"] == "cli-1" and printed["compression"] == "gzip"
    assert printed["label"] == "from the cli" and printed["options"]["compression_detail"] == 1
    assert "done in" in err and "password=***" in err
    assert pg_server.password not in out and pg_server.password not in err

    # usage errors exit 2 before anything runs
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["basebackup", "--to", f"s3://{s3_bucket}/cli", "--max-rate", "5"])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["basebackup", "--to", "/tmp/not-s3"])
    assert exit_info.value.code == 2
    capsys.readouterr()

    # failures: one line, exit 1, no password
    code = cli.main(["basebackup", "--to", f"s3://{s3_bucket}/cli", "--backup-id", "cli-1"])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert err.startswith("pgcdc: error: base backup cli-1 failed while checking the destination")
    assert "hint: choose another backup id" in err
    code = cli.main(["basebackup", "--to", f"s3://{s3_bucket}/cli2", "--label", "L" * 2000])
    out, err = capsys.readouterr()
    assert code == 1 and "backup label too long" in err and pg_server.password not in err
    assert not _objects(s3.client(), s3_bucket).keys() - {
        f"cli/basebackup/cli-1/{n}" for n in ("base.tar.gz", "backup_manifest", "backup.json")
    }
