"""The merge as a self-contained Spark application (merge/platforms.py), run for real:
``spark-submit`` of the launcher alone, with ``--package`` naming the package zip and
``--env`` the S3 endpoint, by a driver and executors whose Python has no airflow_pgcdc
installed (as on Databricks, EMR or a Kubernetes image with only the job's dependencies).
The job must import the package from the zip, merge, print its result and record it whole
in the store, where ``results.latest`` reads it back."""

from __future__ import annotations

import os
import subprocess
import sys

from lake_helpers import assert_equal, sql
from test_merge_cluster import executor_python_without_the_install

from airflow_pgcdc.drain.drain import drain_window
from airflow_pgcdc.merge import results
from airflow_pgcdc.merge.platforms import build_artifacts, merge_application, spark_submit_command
from airflow_pgcdc.operators.merge import merge_spark_conf, parse_result_line
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.testing.spark import spark_home


def test_the_launcher_merges_with_only_its_package_zip(pg18, slot_name, s3, s3_bucket, monkeypatch, tmp_path):
    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    db = pg18.create_database("platforms_launcher")
    try:
        sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'v' FROM generate_series(1, 30) g")
        sql(db, "CREATE PUBLICATION pub FOR TABLE t")
        src, lake, slot = f"s3://{s3_bucket}/cdc", f"s3://{s3_bucket}/lake", slot_name()
        snapshot_to_s3(db, src, slot=slot, publications="pub")
        sql(db, "UPDATE t SET v = 'w' WHERE id < 5; DELETE FROM t WHERE id > 25; INSERT INTO t VALUES (99, 'n')")
        drain_window(db, src, slot=slot, publications="pub")

        art = build_artifacts(tmp_path / "artifacts")
        python = executor_python_without_the_install(tmp_path)  # driver and executors: no airflow_pgcdc
        endpoint = s3.aws_env()["AWS_ENDPOINT_URL"]
        app = merge_application(store=src, slot=slot, delta=lake, launcher=art.launcher,
                                package=f"file://{art.package}", env={"AWS_ENDPOINT_URL": endpoint},
                                options={"driver_rows": 0},  # the executors read the store too
                                conf={k: str(v) for k, v in merge_spark_conf(python=str(python)).items()})
        cmd = spark_submit_command(app, master="local[1]", deploy_mode="client",
                                   spark_submit=os.path.join(os.path.dirname(sys.executable), "spark-submit"))
        # the platform's identity gives the keys; the endpoint comes only from --env
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT_URL")}
        env.update(SPARK_LOCAL_IP="127.0.0.1", SPARK_HOME=str(spark_home()), PYTHONPATH="")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-4000:]
        # spark-submit's PythonRunner merges the script's stderr into its stdout
        said = [ln for ln in proc.stdout.splitlines() if "pgcdc merge: airflow-pgcdc" in ln]
        # imported from Spark's copy of the zip (addPyFile), nowhere else
        assert len(said) == 1 and said[0].endswith(f"/airflow_pgcdc-{art.version}.zip/airflow_pgcdc/__init__.py"), said
        printed = next(r for r in map(parse_result_line, proc.stdout.splitlines()) if r is not None)
        assert [(t["table"], t["action"]) for t in printed["tables"]] == [("public.t", "bootstrapped+merged")]
        # the launcher's line also names its Spark application (the operator's "Spark UI" link);
        # the rest is what a task after a Databricks or EMR run reads from the store
        assert printed.pop("spark")["master"] == "local[1]"
        assert results.latest(src, slot) == printed
        assert_equal(db, lake, "public.t", "id")
    finally:
        pg18.drop_database("platforms_launcher")
