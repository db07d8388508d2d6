"""The merge as a self-contained Spark application, for any platform that runs one.

``spark-submit`` in client mode (:class:`~airflow_pgcdc.operators.merge.PgcdcSparkMergeOperator`)
suits a standalone cluster; Databricks, EMR (Serverless), YARN or Kubernetes clusters are
handed the job by their own operator. What they all need is here, built once:

* the artefacts (:func:`build_artifacts`): the package as one zip,
  ``airflow_pgcdc-{version}.zip``, and a launcher script, ``pgcdc_merge-{version}.py``,
  which adds that zip to the running Spark application (``SparkContext.addPyFile``, driver
  and executors) before it imports the package: the platform is given one Python file and
  arguments, nothing installed beforehand but the job's Python dependencies
  (:data:`EXECUTOR_DEPENDENCIES`; Databricks gets them as libraries, EMR Serverless from a
  virtual environment archive, Kubernetes from the image);
* one argument contract (:func:`merge_application`): the launcher's ``--package URI``, its
  ``--env NAME=VALUE`` pairs (the S3 settings that are not secrets: endpoint, region,
  encryption, role; credentials come from the platform's identity, never a payload), then
  ``spark_app.py``'s arguments (:meth:`~.options.MergeOptions.to_args`);
* the payloads of the platforms' operators, from that one application:
  :func:`spark_submit_command` (YARN or Kubernetes cluster mode, standalone client mode),
  :func:`databricks_task` (``DatabricksSubmitRunOperator``'s ``spark_python_task``),
  :func:`emr_serverless_job_driver` (``EmrServerlessStartJobOperator``'s ``job_driver``),
  :func:`spark_kubernetes_application` (``SparkKubernetesOperator``'s SparkApplication).

The job prints its result on stdout, which these platforms keep in their own logs; it also
writes it whole to the store (:mod:`.results`), where a task after the run reads it.
No Airflow here: the DAG in docs/operations.md shows each operator with these payloads."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_pgcdc.merge.errors import MergeError
from airflow_pgcdc.merge.options import MergeOptions

EXECUTOR_DEPENDENCIES = ("pyarrow>=20", "deltalake>=1.6.0,<2", "boto3>=1.35.30", "numpy>=1.26")
"""What the merge's driver and executors import besides pyspark (pyproject.toml's floors)."""

PASSED_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL_STS",
              "PGCDC_S3_SSE", "PGCDC_S3_SSE_KMS_KEY_ID", "PGCDC_S3_ACL", "PGCDC_S3_ROLE_ARN",
              "PGCDC_S3_ROLE_SESSION_NAME", "PGCDC_S3_ROLE_SECONDS")
"""The environment the launcher may set from its ``--env`` arguments: S3 settings that are
not secrets (a key, a token or an external id in a job's payload would be shown by every
platform's UI and API)."""

LAUNCHER = '''"""airflow-pgcdc {version}: the merge job, self-contained (airflow_pgcdc.merge.platforms)."""
import os
import sys

ALLOWED = {allowed!r}


def main(argv):
    args = list(argv)
    package = None
    while args and args[0] in ("--package", "--env"):
        flag, value, args = args[0], args[1], args[2:]
        if flag == "--package":
            package = value
            continue
        name, _, text = value.partition("=")
        if name not in ALLOWED:
            sys.exit(f"pgcdc merge: --env {{name}} is not one of {{', '.join(sorted(ALLOWED))}} (credentials come "
                     "from the platform's identity, never from arguments)")
        os.environ[name] = text
    if package:
        from pyspark.sql import SparkSession

        SparkSession.builder.getOrCreate().sparkContext.addPyFile(package)  # driver and executors
    import airflow_pgcdc
    from airflow_pgcdc.merge.spark_app import main as merge

    print(f"pgcdc merge: airflow-pgcdc {{airflow_pgcdc.__version__}} from {{airflow_pgcdc.__file__}}",
          file=sys.stderr)
    return merge(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
'''


@dataclass(frozen=True)
class Artifacts:
    """The files a platform is given (local paths; upload them where the platform reads)."""

    package: str  # airflow_pgcdc-{version}.zip
    launcher: str  # pgcdc_merge-{version}.py
    version: str


@dataclass(frozen=True)
class MergeApplication:
    """One merge job as a Spark application: the launcher and its arguments, the package,
    the Spark settings, and the job's name. Every payload builder takes this."""

    launcher: str  # URI of pgcdc_merge-{version}.py where the platform reads it
    package: str  # URI of airflow_pgcdc-{version}.zip
    arguments: tuple[str, ...]  # the launcher's: --package, --env…, then spark_app.py's
    conf: Mapping[str, str] = field(default_factory=dict)
    name: str = "pgcdc-merge"


def build_artifacts(directory: str | os.PathLike) -> Artifacts:
    """Write the package zip and the launcher into ``directory`` (made if missing); both
    named with the package's version, rewritten each time."""
    from airflow_pgcdc import package_version
    from airflow_pgcdc.merge.session import build_py_files

    version = package_version()
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    staging = out / f".pgcdc-{version}"
    built = Path(build_py_files(staging))
    package = out / f"airflow_pgcdc-{version}.zip"
    shutil.copyfile(built, package)
    shutil.rmtree(staging, ignore_errors=True)
    launcher = out / f"pgcdc_merge-{version}.py"
    launcher.write_text(LAUNCHER.format(version=version, allowed=tuple(sorted(PASSED_ENV))))
    return Artifacts(package=str(package), launcher=str(launcher), version=version)


def merge_application(*, store: str, slot: str, delta: str, launcher: str, package: str,
                      options: MergeOptions | Mapping[str, Any] | None = None,
                      env: Mapping[str, str] | None = None, conf: Mapping[str, str] | None = None,
                      name: str = "pgcdc-merge") -> MergeApplication:
    """The merge of ``slot`` (store ``store``, Delta root ``delta``) with ``options``, as the
    application at ``launcher`` with ``package`` (URIs where the platform reads them, e.g.
    ``s3://bucket/artifacts/pgcdc_merge-0.1.0.py``). ``env``: S3 settings the job sets in its
    environment (:data:`PASSED_ENV` only: :class:`MergeError` for anything else, a secret
    above all); ``conf``: Spark settings of the platform's own."""
    o = MergeOptions.of(options)
    passed = dict(env or {})
    refused = sorted(set(passed) - set(PASSED_ENV))
    if refused:
        raise MergeError(f"env {', '.join(refused)}: a job's payload carries only {', '.join(PASSED_ENV)}",
                         hint="credentials come from the platform's identity (instance profile, IRSA, the "
                              "cluster's role); a role to assume: PGCDC_S3_ROLE_ARN")
    for value in (store, delta):
        if not value.startswith("s3://"):
            raise MergeError(f"the merge reads and writes S3: {value!r} is not an s3:// URL")
    arguments = ["--package", package]
    for key, value in sorted(passed.items()):
        if not re.fullmatch(r"[^\s=]+", str(value)):
            raise MergeError(f"env {key}: {value!r} is not one word")
        arguments += ["--env", f"{key}={value}"]
    arguments += ["--store", store, "--slot", slot, "--delta", delta, *o.to_args()]
    return MergeApplication(launcher=launcher, package=package, arguments=tuple(arguments),
                            conf=dict(conf or {}), name=name)


def spark_submit_command(app: MergeApplication, *, master: str, deploy_mode: str = "cluster",
                         spark_submit: str = "spark-submit") -> list[str]:
    """``spark-submit`` of ``app``: YARN (``master="yarn"``) or Kubernetes
    (``k8s://https://…``, with the image in ``conf``) in cluster mode; a standalone master
    takes Python applications in client mode only."""
    if master.startswith("spark://") and deploy_mode == "cluster":
        raise MergeError("a standalone master runs Python applications in client mode only",
                         hint="deploy_mode='client', or PgcdcSparkMergeOperator, which reads the result back")
    cmd = [spark_submit, "--master", master, "--deploy-mode", deploy_mode, "--name", app.name]
    for key, value in sorted(app.conf.items()):
        cmd += ["--conf", f"{key}={value}"]
    return [*cmd, app.launcher, *app.arguments]


def databricks_task(app: MergeApplication, *, cluster: Mapping[str, Any] | None = None,
                    existing_cluster_id: str | None = None, task_key: str = "pgcdc_merge") -> dict[str, Any]:
    """One task of ``DatabricksSubmitRunOperator(tasks=[…])`` (Jobs API 2.1 runs/submit): a
    ``spark_python_task`` running the launcher with the arguments, the job's Python
    dependencies as PyPI libraries, on a new cluster (``cluster``: its spec, given
    ``spark_conf`` merged with ``app.conf``) or ``existing_cluster_id``."""
    if (cluster is None) == (existing_cluster_id is None):
        raise MergeError("give a cluster spec or an existing cluster id (one of them)")
    task: dict[str, Any] = {
        "task_key": task_key,
        "spark_python_task": {"python_file": app.launcher, "parameters": list(app.arguments)},
        "libraries": [{"pypi": {"package": dep}} for dep in EXECUTOR_DEPENDENCIES],
    }
    if cluster is not None:
        task["new_cluster"] = {**cluster, "spark_conf": {**(cluster.get("spark_conf") or {}), **app.conf}}
    else:
        task["existing_cluster_id"] = existing_cluster_id
    return task


def emr_serverless_job_driver(app: MergeApplication, *, python_environment: str | None = None) -> dict[str, Any]:
    """``EmrServerlessStartJobOperator``'s ``job_driver``: ``sparkSubmit`` with the launcher as
    entry point and the arguments; ``python_environment``: an archive of a virtual environment
    holding :data:`EXECUTOR_DEPENDENCIES` (``s3://…/pyenv.tar.gz``), unpacked on every node as
    EMR Serverless documents (``spark.archives`` and the ``PYSPARK_PYTHON`` of its ``bin``)."""
    conf = dict(app.conf)
    if python_environment:
        conf["spark.archives"] = f"{python_environment}#environment"
        conf["spark.emr-serverless.driverEnv.PYSPARK_DRIVER_PYTHON"] = "./environment/bin/python"
        conf["spark.emr-serverless.driverEnv.PYSPARK_PYTHON"] = "./environment/bin/python"
        conf["spark.executorEnv.PYSPARK_PYTHON"] = "./environment/bin/python"
    params = " ".join(f"--conf {key}={value}" for key, value in sorted(conf.items()))
    return {"sparkSubmit": {"entryPoint": app.launcher, "entryPointArguments": list(app.arguments),
                            **({"sparkSubmitParameters": params} if params else {})}}


def spark_kubernetes_application(app: MergeApplication, *, image: str, namespace: str = "default",
                                 service_account: str = "spark", spark_version: str = "4.2.0",
                                 executors: int = 2) -> dict[str, Any]:
    """The SparkApplication (Kubeflow Spark operator, ``sparkoperator.k8s.io/v1beta2``) that
    ``SparkKubernetesOperator(application_file=…)`` submits: Python, cluster mode, ``image``
    holding pyspark and :data:`EXECUTOR_DEPENDENCIES`, the launcher as main file."""
    name = re.sub(r"[^a-z0-9-]", "-", app.name.lower()).strip("-")[:63] or "pgcdc-merge"
    return {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "type": "Python", "pythonVersion": "3", "mode": "cluster", "image": image,
            "sparkVersion": spark_version, "mainApplicationFile": app.launcher,
            "arguments": list(app.arguments), "sparkConf": dict(app.conf),
            "restartPolicy": {"type": "Never"},
            "driver": {"cores": 1, "memory": "2g", "serviceAccount": service_account},
            "executor": {"cores": 1, "instances": executors, "memory": "2g"},
        },
    }


def result_of(arguments: Sequence[str]) -> dict[str, str]:
    """``{store, slot, delta}`` of a launcher's arguments: where a task after the run finds
    the job's result (``results.latest(store, slot)``)."""
    out: dict[str, str] = {}
    for flag in ("--store", "--slot", "--delta"):
        if flag in arguments:
            out[flag[2:]] = arguments[list(arguments).index(flag) + 1]
    return out
