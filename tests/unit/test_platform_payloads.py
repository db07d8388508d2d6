"""The payloads of the platforms' operators for the merge (merge/platforms.py), rendered
from one application: entry point, arguments, artefact and S3 settings in each (the run
itself: tests/integration/test_merge_platforms.py, spark-submit of the launcher)."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

import pytest

from airflow_pgcdc.merge.errors import MergeError
from airflow_pgcdc.merge.platforms import (
    EXECUTOR_DEPENDENCIES,
    build_artifacts,
    databricks_task,
    emr_serverless_job_driver,
    merge_application,
    result_of,
    spark_kubernetes_application,
    spark_submit_command,
)

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER, PACKAGE = "s3://art/pgcdc_merge-0.1.0.py", "s3://art/airflow_pgcdc-0.1.0.zip"


def app(**kw):
    return merge_application(store="s3://b/cdc", slot="shop", delta="s3://b/lake", launcher=LAUNCHER, package=PACKAGE,
                             options={"tables": ["public.orders"], "engine": "delta-rs", "max_windows": 3},
                             env={"AWS_REGION": "eu-west-1", "PGCDC_S3_SSE": "aws:kms",
                                  "PGCDC_S3_SSE_KMS_KEY_ID": "alias/lake"},
                             conf={"spark.executor.memory": "4g"}, **kw)


ARGS = ["--package", PACKAGE, "--env", "AWS_REGION=eu-west-1", "--env", "PGCDC_S3_SSE=aws:kms",
        "--env", "PGCDC_S3_SSE_KMS_KEY_ID=alias/lake", "--store", "s3://b/cdc", "--slot", "shop",
        "--delta", "s3://b/lake", "--tables", "public.orders", "--max-windows", "3"]


def test_one_argument_contract():
    a = app()
    assert list(a.arguments) == ARGS
    assert result_of(a.arguments) == {"store": "s3://b/cdc", "slot": "shop", "delta": "s3://b/lake"}


def test_secrets_and_other_urls_are_refused():
    with pytest.raises(MergeError, match="AWS_SECRET_ACCESS_KEY: a job's payload carries only"):
        merge_application(store="s3://b/cdc", slot="s", delta="s3://b/lake", launcher=LAUNCHER, package=PACKAGE,
                          env={"AWS_SECRET_ACCESS_KEY": "x"})
    with pytest.raises(MergeError, match="not an s3:// URL"):
        merge_application(store="/tmp/cdc", slot="s", delta="s3://b/lake", launcher=LAUNCHER, package=PACKAGE)


def test_spark_submit_on_yarn_or_kubernetes_in_cluster_mode():
    cmd = spark_submit_command(app(), master="yarn")
    assert cmd[:7] == ["spark-submit", "--master", "yarn", "--deploy-mode", "cluster", "--name", "pgcdc-merge"]
    assert cmd[7:9] == ["--conf", "spark.executor.memory=4g"] and cmd[9] == LAUNCHER and cmd[10:] == ARGS
    with pytest.raises(MergeError, match="client mode only"):
        spark_submit_command(app(), master="spark://h:7077")


def test_databricks_spark_python_task():
    task = databricks_task(app(), cluster={"spark_version": "16.4.x-scala2.13", "node_type_id": "m5.xlarge",
                                           "num_workers": 2, "spark_conf": {"spark.a": "1"}})
    assert task["spark_python_task"] == {"python_file": LAUNCHER, "parameters": ARGS}
    assert task["new_cluster"]["spark_conf"] == {"spark.a": "1", "spark.executor.memory": "4g"}
    assert [lib["pypi"]["package"] for lib in task["libraries"]] == list(EXECUTOR_DEPENDENCIES)
    assert databricks_task(app(), existing_cluster_id="0101-x")["existing_cluster_id"] == "0101-x"
    with pytest.raises(MergeError, match="one of them"):
        databricks_task(app())


def test_emr_serverless_job_driver():
    driver = emr_serverless_job_driver(app(), python_environment="s3://art/pyenv.tar.gz")["sparkSubmit"]
    assert driver["entryPoint"] == LAUNCHER and driver["entryPointArguments"] == ARGS
    params = driver["sparkSubmitParameters"]
    assert "--conf spark.archives=s3://art/pyenv.tar.gz#environment" in params
    assert "--conf spark.executorEnv.PYSPARK_PYTHON=./environment/bin/python" in params
    assert "--conf spark.executor.memory=4g" in params


def test_spark_kubernetes_application():
    spec = spark_kubernetes_application(app(name="Pgcdc Merge/shop"), image="registry/pgcdc:0.1.0", namespace="data")
    assert (spec["apiVersion"], spec["kind"], spec["metadata"]) == (
        "sparkoperator.k8s.io/v1beta2", "SparkApplication", {"name": "pgcdc-merge-shop", "namespace": "data"})
    s = spec["spec"]
    assert (s["type"], s["mode"], s["image"], s["mainApplicationFile"], s["arguments"]) == (
        "Python", "cluster", "registry/pgcdc:0.1.0", LAUNCHER, ARGS)
    assert s["sparkConf"] == {"spark.executor.memory": "4g"}


def test_the_executor_dependencies_are_the_packages_floors():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    floors = {re.split(r"[<>=\[]", d)[0]: d for d in declared}
    assert {re.split(r"[<>=\[]", d)[0]: d for d in EXECUTOR_DEPENDENCIES} == {
        name: floors[name] for name in ("pyarrow", "deltalake", "boto3", "numpy")}


def test_the_launcher_sets_only_allowed_environment(tmp_path, monkeypatch):
    art = build_artifacts(tmp_path)
    assert Path(art.package).name == f"airflow_pgcdc-{art.version}.zip"
    spec = importlib.util.spec_from_file_location("launcher", art.launcher)
    launcher = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launcher)
    with pytest.raises(SystemExit, match="--env AWS_SECRET_ACCESS_KEY is not one of"):
        launcher.main(["--env", "AWS_SECRET_ACCESS_KEY=x", "--store", "s3://b/cdc"])
    monkeypatch.setenv("PGCDC_S3_SSE", "unset")  # restored after the test, whatever the launcher sets
    with pytest.raises(SystemExit):  # spark_app's own parser: --slot and --delta missing
        launcher.main(["--env", "PGCDC_S3_SSE=AES256", "--store", "s3://b/cdc"])
    import os

    assert os.environ["PGCDC_S3_SSE"] == "AES256"
    assert build_artifacts(tmp_path / "again").launcher != art.launcher
    assert Path(build_artifacts(tmp_path / "again").launcher).read_text() == Path(art.launcher).read_text()
