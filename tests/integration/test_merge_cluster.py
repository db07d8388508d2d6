"""The merge on a real Spark standalone cluster (the session's ``spark_cluster``: a Master
and 2 Workers, each its own JVM; executors in other JVMs with their own Python workers),
run the way users run it: ``pgcdc merge --master spark://…``, ``spark-submit`` by hand, and
``spark-submit`` driven by ``PgcdcSparkMergeOperator`` (``test_operator_merge.py``). Both engines: the default (delta-rs commit on the driver,
executors read and compact through the Python data source) and Delta's own Spark engine
with Spark's s3a reader. PostgreSQL 18 only (the local-mode tests cover both servers)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from lake_helpers import assert_equal, drain, sql
from test_merge import end_to_end

from airflow_pgcdc.lake.tables import app_id, delta_table_url
from airflow_pgcdc.merge.jars import unavailable_reason
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.store import s3 as s3store

# one pytest-xdist worker runs these tests (one cluster per run, not one per worker: two
# delta-spark merges on two clusters at once on the 2-core machine took a test past 600 s);
# tests/conftest.py makes the group take effect under pytest 9 (test_suite_scheduling.py).
# A 1200 s hang guard, and started first (slow), not at the end of the run
pytestmark = [pytest.mark.xdist_group("spark_cluster"), pytest.mark.timeout(1200), pytest.mark.slow]

_MISSING = unavailable_reason()
needs_jars = pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")

ENGINES = [
    # --driver-rows 0: these windows are small, and the driver would compact them itself;
    # here the executors (which cannot import the installed package) must read and compact
    pytest.param(["--driver-rows", "0"], id="delta-rs"),
    pytest.param(["--engine", "delta-spark", "--reader", "s3a"], id="delta-spark-s3a", marks=needs_jars),
]


@pytest.fixture
def db(pg18, request):
    name = "c_" + request.node.name.lower().replace("[", "_").replace("]", "").replace("-", "_")[:40]
    dsn = pg18.create_database(name)
    yield dsn
    pg18.drop_database(name)


def start_merge(cluster, s3, src, slot, lake, *extra, **env_extra) -> subprocess.Popen:
    """``pgcdc merge --master spark://…`` started in its own process (output in pipes)."""
    env = {k: v for k, v in os.environ.items() if k != "PGCDC_SPARK_JARS"}  # found, not given
    env.update(s3.aws_env(), SPARK_LOCAL_IP="127.0.0.1", **env_extra)
    return subprocess.Popen(
        [sys.executable, "-m", "airflow_pgcdc.cli", "merge", "--from", src, "--slot", slot, "--delta", lake,
         "--master", cluster.master_url, *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def finish_merge(proc: subprocess.Popen) -> dict:
    """Wait for a :func:`start_merge` process; it must succeed; returns its JSON result."""
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, "\n".join(
        [ln[:400] for ln in stderr.splitlines() if "Exception" in ln or "pgcdc" in ln][:30] + [stderr[-1500:]])
    return json.loads(stdout[stdout.index("{"):]) | {"_stderr": stderr}


def jars_on_the_nodes() -> tuple[tuple[str, ...], dict[str, str]]:
    """The arguments and environment of a ``pgcdc merge`` on a cluster whose nodes have the
    Delta and S3A jars installed (as a cluster image does: on Spark's class path through
    ``SPARK_DIST_CLASSPATH``, the way Spark's Hadoop-free build takes Hadoop's jars), so the
    job ships none: ``PGCDC_SPARK_JARS=none``. What ``spark.jars`` costs instead: each
    application's executors fetch and copy all of them (the AWS SDK bundle is 686 MB) at
    their first task, ~13 s per application here. On the driver's class path the jars come
    after Spark's, as in the executors', so the test bed's class archive still maps."""
    from airflow_pgcdc.merge.jars import find_jars

    installed = os.pathsep.join(find_jars())
    return (("--conf", f"spark.executorEnv.SPARK_DIST_CLASSPATH={installed}"),
            {"PGCDC_SPARK_JARS": "none", "SPARK_DIST_CLASSPATH": installed})


def jars_in_app_folders(cluster, apps_before: int) -> list[str]:
    """The jars the executors of the applications completed since ``apps_before`` were
    shipped (copied into their folders under the workers' work directories)."""
    ids = [a["id"] for a in cluster.status()["completedapps"][apps_before:]]
    assert ids, "no application completed"
    return [p.name for i in ids for p in cluster.base_dir.glob(f"work/*/{i}/*/*.jar")]


def cli_merge(cluster, s3, src, slot, lake, *extra, **env_extra):
    """``pgcdc merge --master spark://…`` in its own process; returns its JSON result."""
    out = finish_merge(start_merge(cluster, s3, src, slot, lake, *extra, **env_extra))
    stderr = out.pop("_stderr")
    if os.environ.get("PGCDC_DEBUG_TIMES"):
        print("MERGE", extra, out["seconds"], [(t["table"], t["seconds"]) for t in out["tables"]])
        print("\n".join(ln for ln in stderr.splitlines() if "INFO" in ln and "airflow_pgcdc" in ln or "WARN" in ln)[-3000:])
    return out


def submit_merge(cluster, s3, src, slot, lake, *extra, tmp_path):
    """``spark-submit --master spark://… --py-files airflow_pgcdc.zip spark_app.py …`` by hand,
    with no ``--jars``: the job finds them itself; returns its result line's JSON."""
    from airflow_pgcdc.merge import spark_app
    from airflow_pgcdc.merge.session import build_py_files
    from airflow_pgcdc.operators.merge import merge_spark_conf, parse_result_line
    from airflow_pgcdc.testing.spark import spark_home

    # SPARK_HOME: the venv is not activated, and spark-submit's own search runs `python3`
    env = dict(os.environ, **s3.aws_env(), SPARK_LOCAL_IP="127.0.0.1", SPARK_HOME=str(spark_home()))
    env.pop("PGCDC_SPARK_JARS", None)
    conf = merge_spark_conf() | {"spark.pyspark.python": str(executor_python_without_the_install(tmp_path))}
    confs = [x for k, v in conf.items() for x in ("--conf", f"{k}={v}")]
    proc = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "spark-submit"), "--master", cluster.master_url,
         "--py-files", build_py_files(tmp_path), *confs, spark_app.__file__,
         "--from", src, "--slot", slot, "--delta", lake, *extra],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = [parse_result_line(line) for line in proc.stdout.splitlines()]
    return next(r for r in found if r is not None)


def executor_python_without_the_install(tmp_path) -> Path:
    """An interpreter for the executors' Python workers that has the venv's packages but
    not our editable install (``python -S`` skips the ``.pth`` files that put the source
    tree on ``sys.path``): a job that runs with it imported ``airflow_pgcdc`` on the
    executors from the ``--py-files`` zip, as on a cluster whose nodes never installed it."""
    site = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "pyspark").is_dir())
    wrapper = tmp_path / "executor-python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{site}" exec {shlex.quote(sys.executable)} -S "$@"\n')
    wrapper.chmod(0o755)
    probe = subprocess.run([str(wrapper), "-c", "import pyarrow, deltalake, airflow_pgcdc"], capture_output=True,
                           text=True, cwd=tmp_path)
    assert "No module named 'airflow_pgcdc'" in probe.stderr, probe.stderr[-2000:]  # the install is hidden
    probe = subprocess.run([str(wrapper), "-c", "import pyarrow, deltalake, boto3, pyspark"], capture_output=True,
                           text=True, cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr[-2000:]  # the dependencies are not
    return wrapper


def local_merge(spark, src, slot, lake, *engine) -> dict:
    """The same merge in this process's local Spark session, for a step a cluster changes
    nothing in (a rerun that finds every window committed: ``up-to-date``, decided before
    any executor works; the later merges of Delta's Spark engine in
    :func:`test_end_to_end_on_the_cluster`): on the cluster it would cost an application
    (~60 s on the loaded 2-core machine, ~90 s with Delta's Spark engine)."""
    from airflow_pgcdc.merge.job import merge_slot

    opts = dict(zip(engine[::2], engine[1::2], strict=True))
    return merge_slot(spark, store=src, slot=slot, delta=lake, engine=opts.get("--engine", "delta-rs"),
                      reader=opts.get("--reader", "python")).to_dict()


@pytest.mark.parametrize("engine", ENGINES)
def test_end_to_end_on_the_cluster(engine, db, slot_name, s3, s3_bucket, spark_cluster, spark, monkeypatch,
                                   tmp_path):
    """The default engine: the two merges that write alternate between ``pgcdc merge
    --master`` and a hand-typed ``spark-submit`` whose executors cannot import our installed
    package (only the ``--py-files`` zip); the replay that must find nothing to do runs
    in-process (:func:`local_merge`). Delta's Spark engine: the first merge (bootstrap, then
    a MERGE whose executors read the windows and the table through s3a with the jars the job
    shipped them) by hand-typed ``spark-submit``; the later ones in-process: what they add
    (schema change, truncate, TOAST across windows) is planned and committed by the driver
    alike on a cluster and in local mode, and ``pgcdc merge --master`` with this engine runs
    on the cluster in the two tests below (a cluster application of this engine costs
    ~90 s of the suite)."""
    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    src, lake = f"s3://{s3_bucket}/cdc", f"s3://{s3_bucket}/lake"
    slot = slot_name()
    apps = len(spark_cluster.status()["completedapps"])
    merges = {
        "cli": lambda *a: cli_merge(spark_cluster, s3, *a),
        "submit": lambda *a: submit_merge(spark_cluster, s3, *a, tmp_path=tmp_path),
        "local": lambda *a: local_merge(spark, *a),
    }
    plan = ["submit", "local", "local"] if "delta-spark" in engine else ["cli", "submit", "local"]
    runs = iter(merges[step] for step in plan)
    end_to_end(db, s3.client(), src, lake, slot, lambda: next(runs)(src, slot, lake, *engine))
    done = spark_cluster.status()["completedapps"]
    written = len(plan) - plan.count("local")
    assert len(done) - apps == written, "each merge that wrote ran as an application of the cluster"
    assert all(a["cores"] == 2 for a in done[-written:]), "on both workers' executors"
    if "delta-spark" in engine:  # the job shipped the jars its executors need
        assert "delta-spark_4.2_2.13-4.4.0.jar" in jars_in_app_folders(spark_cluster, apps)


@pytest.mark.parametrize("engine", ENGINES[1:])
def test_killed_and_overlapping_jobs_on_the_cluster(engine, db, slot_name, s3, s3_bucket, spark_cluster, spark,
                                                    monkeypatch):
    """Delta's Spark engine (its commits and the Delta root's lock are its own): a job killed
    right after its Delta commit (its driver gone, its executors with it) reruns to
    ``up-to-date`` (in-process: :func:`local_merge`) with no second commit; then two jobs
    started together on the cluster (one core each, so both run at once) both succeed and
    the windows are committed once; the table equals PostgreSQL. The cluster has the jars
    installed (:func:`jars_on_the_nodes`); shipping them is proven by
    :func:`test_end_to_end_on_the_cluster`. The default engine's killed and overlapping jobs:
    ``test_merge.py::test_killed_merge_then_rerun_merges_exactly_once`` (its outcomes are
    the driver's; until session 23 they ran here too, three cluster applications, ~105 s)."""
    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    client = s3.client()
    src, lake = f"s3://{s3_bucket}/cdc", f"s3://{s3_bucket}/lake"
    slot = slot_name()
    sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(db, "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 2000) g")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t")
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client)
    sql(db, "UPDATE t SET v = 'w0' WHERE id % 7 = 0; DELETE FROM t WHERE id > 1900; "
            "INSERT INTO t SELECT g, 'new' FROM generate_series(5000, 5100) g")
    assert drain(db, src, slot, client).window_seq == 0
    url = delta_table_url(lake, "public", "t")
    app = app_id(slot, "public", "t")
    nodes_args, nodes_env = jars_on_the_nodes() if "delta-spark" in engine else ((), {})
    engine = [*engine, *nodes_args]

    apps = len(spark_cluster.status()["completedapps"])
    killed = start_merge(spark_cluster, s3, src, slot, lake, *engine, PGCDC_FAULT="merge-after-commit", **nodes_env)
    _, err = killed.communicate(timeout=600)
    assert killed.returncode == -9, err[-3000:]
    assert jars_in_app_folders(spark_cluster, apps) == [], "nothing shipped"
    dt = DeltaTable(url, storage_options=s3store.delta_storage_options())
    assert dt.transaction_version(app) == 0, "killed after its commit: window 0 is in"
    version = dt.version()
    rerun = local_merge(spark, src, slot, lake, *engine)
    assert [t["action"] for t in rerun["tables"]] == ["up-to-date"]
    dt.update_incremental()
    assert dt.version() == version, "the rerun committed nothing"
    assert_equal(db, lake, "public.t", "id")

    sql(db, "UPDATE t SET v = 'w1' WHERE id % 5 = 0")
    assert drain(db, src, slot, client).window_seq == 1
    sql(db, "DELETE FROM t WHERE id % 11 = 0; UPDATE t SET id = id + 100000 WHERE id % 13 = 0")
    assert drain(db, src, slot, client).window_seq == 2
    one_core = ("--conf", "spark.cores.max=1")
    jobs = [start_merge(spark_cluster, s3, src, slot, lake, *engine, *one_core, **nodes_env) for _ in range(2)]
    results = [finish_merge(j) for j in jobs]
    actions = [r["tables"][0]["action"] for r in results]
    assert actions.count("merged") == 1, actions
    assert {"merged-by-concurrent-job", "up-to-date"} & set(actions), actions
    dt.update_incremental()
    assert dt.transaction_version(app) == 2
    assert dt.version() == version + 1, "windows 1..2 committed once, by one of the two jobs"
    assert_equal(db, lake, "public.t", "id")


@needs_jars
def test_a_window_larger_than_the_driver_memory_merges_on_the_cluster(db, slot_name, s3, s3_bucket, spark_cluster,
                                                                      monkeypatch):
    """With Delta's Spark engine and the s3a reader, executors read, compact and merge the
    change rows; the driver only plans and commits. With ``spark.driver.memory=512m`` a
    window of 380,000 rows of ~1,800 bytes (about 680 MB as rows: more than the driver's
    whole heap, over five times the ~127 MB Spark may use of it) merges on the cluster and
    the table holds every row. The rows are wide and few because the proof is the bytes:
    the same ~670 MB as 1,200,000 rows of ~560 bytes (until session 22) or 3,000,000 (until
    session 17) cost the drain and the merge per row, and proved nothing more. The values
    stay under PostgreSQL's TOAST threshold (~2 kB a row), so they travel inline in the
    change stream. The cluster has the jars installed (:func:`jars_on_the_nodes`)."""
    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    client = s3.client()
    src, lake = f"s3://{s3_bucket}/cdc", f"s3://{s3_bucket}/lake"
    slot = slot_name()
    sql(db, "CREATE TABLE big (id bigint PRIMARY KEY, pad text)")
    sql(db, "INSERT INTO big SELECT g, 'first' FROM generate_series(1, 1000) g")
    sql(db, "CREATE PUBLICATION pub FOR TABLE big")
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client)
    n = 380_000
    for first in range(1001, n + 1, 100_000):  # 4 transactions
        sql(db, "INSERT INTO big SELECT g, repeat(md5(g::text), 56) FROM generate_series(%s, %s) g",
            (first, min(first + 99_999, n)))
    sql(db, "UPDATE big SET pad = 'updated' WHERE id <= 500")
    w = drain(db, src, slot, client)
    assert w.window_seq == 0 and w.rows == n - 1000 + 500
    nodes_args, nodes_env = jars_on_the_nodes()
    apps = len(spark_cluster.status()["completedapps"])
    out = cli_merge(spark_cluster, s3, src, slot, lake, "--engine", "delta-spark", "--reader", "s3a",
                    "--conf", "spark.driver.memory=512m", *nodes_args, **nodes_env)
    t = out["tables"][0]
    assert t["action"] == "bootstrapped+merged" and t["change_rows"] == w.rows, t
    assert jars_in_app_folders(spark_cluster, apps) == [], "nothing shipped"
    dt = DeltaTable(delta_table_url(lake, "public", "big"), storage_options=s3store.delta_storage_options())
    assert dt.to_pyarrow_dataset().count_rows() == n
    sample = dt.to_pyarrow_dataset().to_table(filter=(pc.field("id") <= 501) | (pc.field("id") == n)).to_pylist()
    pads = {r["id"]: r["pad"] for r in sample}
    assert pads[1] == pads[500] == "updated" and pads[501] == "first" and len(pads[n]) == 32 * 56
    print(f"window of {w.rows:,} rows, {w.bytes / 1e6:.0f} MB of Parquet, merged in {t['seconds']:.0f}s")


def _pgcdc(*args, cwd):
    proc = subprocess.run([sys.executable, "-m", "airflow_pgcdc.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"pgcdc {' '.join(args)}: {proc.stdout}\n{proc.stderr}"
    return proc


def test_sandbox_up_spark_gives_a_cluster_and_the_airflow_connection(tmp_path):
    """``pgcdc sandbox up --spark``: PostgreSQL, S3 and a Spark standalone cluster that runs a
    job; ``env --airflow`` points spark_default at it; ``down`` leaves no JVM behind."""
    from airflow_pgcdc.testing.processes import pid_alive

    try:
        up = _pgcdc("sandbox", "up", "--spark", cwd=tmp_path)
        state = json.loads((tmp_path / ".pgcdc" / "state.json").read_text())
        master = state["spark"]["master_url"]
        assert f"Spark master {master}" in up.stderr
        assert _pgcdc("sandbox", "status", cwd=tmp_path).stdout.strip() == (
            "pg18: postgres running, s3 running, spark running")
        env = dict(line.split("=", 1) for line in _pgcdc("sandbox", "env", "--airflow", "--format", "dotenv",
                                                         cwd=tmp_path).stdout.splitlines())
        assert env["PGCDC_SPARK_MASTER"] == master
        assert json.loads(shlex.split(env["AIRFLOW_CONN_SPARK_DEFAULT"])[0])["host"] == master
        code = ("import sys; from pyspark.sql import SparkSession; "
                "s = SparkSession.builder.master(sys.argv[1]).getOrCreate(); "
                "print(s.sparkContext.parallelize(range(100), 4).map(lambda x: x * 2).sum()); s.stop()")
        out = subprocess.run([sys.executable, "-c", code, master], capture_output=True, text=True, timeout=300,
                             env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable))
        assert out.stdout.strip().splitlines()[-1] == "9900", out.stderr[-3000:]
        pids = [p["pid"] for p in state["spark"]["processes"]]
        assert len(pids) == 3 and all(pid_alive(p) for p in pids)
    finally:
        subprocess.run([sys.executable, "-m", "airflow_pgcdc.cli", "sandbox", "down", "--purge"], cwd=tmp_path,
                       capture_output=True, timeout=120)
    assert not any(pid_alive(p) for p in pids)
