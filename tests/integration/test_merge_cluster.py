"""The merge on a real Spark standalone cluster (the session's ``spark_cluster``: a Master
and 2 Workers, each its own JVM; executors in other JVMs with their own Python workers),
run the way users run it: ``pgcdc merge --master spark://…`` and ``spark-submit`` driven
by ``PgcdcSparkMergeOperator``. Both engines: the default (delta-rs commit on the driver,
executors read and compact through the Python data source) and Delta's own Spark engine
with Spark's s3a reader. PostgreSQL 18 only (the local-mode tests cover both servers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_merge import end_to_end, sql

from airflow_pgcdc.merge.jars import unavailable_reason

_MISSING = unavailable_reason()
needs_jars = pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")

ENGINES = [
    pytest.param([], id="delta-rs"),
    pytest.param(["--engine", "delta-spark", "--reader", "s3a"], id="delta-spark-s3a", marks=needs_jars),
]


@pytest.fixture
def db(pg18, request):
    name = "c_" + request.node.name.lower().replace("[", "_").replace("]", "").replace("-", "_")[:40]
    dsn = pg18.create_database(name)
    yield dsn
    pg18.drop_database(name)


def cli_merge(cluster, s3, src, slot, lake, *extra):
    """``pgcdc merge --master spark://…`` in its own process; returns its JSON result."""
    env = dict(os.environ, **s3.aws_env(), SPARK_LOCAL_IP="127.0.0.1")
    env.pop("PGCDC_SPARK_JARS", None)  # the jars are found, not given
    proc = subprocess.run(
        [sys.executable, "-m", "airflow_pgcdc.cli", "merge", "--from", src, "--slot", slot, "--delta", lake,
         "--master", cluster.master_url, *extra],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout[proc.stdout.index("{"):])


@pytest.mark.parametrize("engine", ENGINES)
def test_end_to_end_on_the_cluster(engine, db, slot_name, s3, s3_bucket, spark_cluster, monkeypatch):
    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    src, lake = f"s3://{s3_bucket}/cdc", f"s3://{s3_bucket}/lake"
    slot = slot_name()
    apps = len(spark_cluster.status()["completedapps"])
    end_to_end(db, s3.client(), src, lake, slot, lambda: cli_merge(spark_cluster, s3, src, slot, lake, *engine))
    done = spark_cluster.status()["completedapps"]
    assert len(done) - apps == 3, "each merge ran as an application of the cluster"
    assert all(a["cores"] == 2 for a in done[-3:]), "on both workers' executors"


def test_delta_rs_and_delta_spark_take_turns_on_one_table(db, slot_name, s3, s3_bucket, spark_cluster,
                                                          monkeypatch):
    """Interop: a table bootstrapped and merged by delta-rs is merged into by delta-spark,
    then by delta-rs again; pyarrow (deltalake) readers see PostgreSQL's rows each time."""
    if _MISSING:
        pytest.skip(_MISSING)
    from test_merge import assert_equal, drain

    from airflow_pgcdc.snapshot.export import snapshot_to_s3

    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    client = s3.client()
    src, lake = f"s3://{s3_bucket}/cdc", f"s3://{s3_bucket}/lake"
    sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text, d date, ts timestamp)")
    sql(db, "INSERT INTO t SELECT g, 'v' || g, 'infinity', '-infinity' FROM generate_series(1, 100) g")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publication="pub", s3_client=client)
    turns = [[], ["--engine", "delta-spark"], [], ["--engine", "delta-spark", "--reader", "s3a"]]
    for n, extra in enumerate(turns):
        sql(db, "UPDATE t SET v = %s WHERE id %% 4 = %s", (f"turn {n}", n))
        sql(db, "DELETE FROM t WHERE id = %s", (50 + n,))
        sql(db, "INSERT INTO t VALUES (%s, 'new', '2024-01-01', now()::timestamp)", (1000 + n,))
        drain(db, src, slot, client)
        out = cli_merge(spark_cluster, s3, src, slot, lake, *extra)
        assert out["tables"][0]["action"] in ("bootstrapped+merged", "merged"), out
        assert (out["tables"][0]["first_window"], out["tables"][0]["last_window"]) == (n, n)
        assert_equal(db, lake, "public.t", "id")
