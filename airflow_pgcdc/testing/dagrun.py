"""Run a DAG for real (``dag.test()``) in a child process with its own AIRFLOW_HOME
(used by ``make demo`` and the DAG tests).

Airflow reads its configuration at import time, so each run is a fresh interpreter:
``AIRFLOW_HOME`` under the test's tmp dir (SQLite metadata DB, migrated once per
home), the DAG file's folder as the dags folder, connections from ``AIRFLOW_CONN_*``.
The child prints one JSON line with the run state, each task's state and XCom return
value; the whole output (task logs included) is kept for assertions.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

_CHILD = r"""
import importlib.util, json, os, sys
path, dag_id, conf, run_type = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
sys.path.insert(0, os.path.dirname(os.path.abspath(path)))  # as Airflow does for the dags folder
spec = importlib.util.spec_from_file_location("dagfile", path)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
dag = next(v for v in vars(mod).values() if getattr(v, "dag_id", None) == dag_id)
import structlog
if not structlog.is_configured():  # Airflow 3.0's dag.test() leaves structlog unconfigured: its
    import logging                 # default prints debug, and the in-process supervisor debug-logs
                                   # every request (mask_secret's included, with the secret)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
test_args = {}
if run_type:  # dag.test() makes manual runs: make this one of the given type, as a scheduler would
    import datetime
    import airflow.models.dagrun as dagrun_module
    from airflow.utils.types import DagRunType

    def typed_run(*, dag, run_id, logical_date, run_after, **kw):
        kind = DagRunType(run_type)
        return dag.create_dagrun(
            run_id=dagrun_module.DagRun.generate_run_id(run_type=kind, logical_date=logical_date, run_after=run_after),
            logical_date=logical_date, run_after=run_after, run_type=kind,
            state=dagrun_module.DagRunState.RUNNING, **kw)

    dagrun_module.get_or_create_dagrun = typed_run
    import airflow.models.dag as dag_module
    if hasattr(dag_module, "_get_or_create_dagrun"):  # Airflow 3.0: dag.test()'s helper lives there
        dag_module._get_or_create_dagrun = typed_run  # (its extra arguments go through **kw)
    test_args["logical_date"] = datetime.datetime(2024, 6, 1, tzinfo=datetime.timezone.utc)  # a past interval
run = dag.test(run_conf=conf or None, **test_args)
tasks = {}
for ti in run.get_task_instances():
    try:
        value = ti.xcom_pull(task_ids=ti.task_id, map_indexes=ti.map_index)
    except Exception as exc:  # noqa: BLE001
        value = f"<xcom error {exc}>"
    tasks[ti.task_id] = {"state": str(ti.state), "xcom": value}
print("PGCDC-DAG-RESULT " + json.dumps({"state": str(run.state), "tasks": tasks}, default=str))
"""


@dataclass
class DagRunResult:
    state: str
    tasks: dict
    output: str

    def xcom(self, task_id: str):
        return self.tasks[task_id]["xcom"]


def airflow_env(home: Path, dags_folder: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(dags_folder),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__UNIT_TEST_MODE="False",
        SPARK_LOCAL_IP="127.0.0.1",
    )
    env.update(extra or {})
    return env


_migrated_db: list[Path] = []  # this process's migrated SQLite metadata DB, copied into new homes


def migrate(env: dict[str, str]) -> None:
    """The metadata DB of ``env``'s ``AIRFLOW_HOME``, migrated once. With the default SQLite
    DB, the first home of the process is migrated (``airflow db migrate``, ~10 s) and every
    later home starts from a copy of that DB as it was just migrated (it holds no path of
    its home)."""
    home = Path(env["AIRFLOW_HOME"])
    marker = home / ".migrated"
    if marker.exists():
        return
    default_db = not any(k.endswith("__SQL_ALCHEMY_CONN") for k in env)
    if default_db and _migrated_db and _migrated_db[0].exists() and not (home / "airflow.db").exists():
        home.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_migrated_db[0], home / "airflow.db")
        marker.touch()
        return
    proc = subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"], env=env, capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{proc.stderr[-3000:]}")
    marker.touch()
    if default_db and not _migrated_db and (home / "airflow.db").exists():
        # a copy taken now: the home's own DB gets runs, XComs and Asset events
        keep = Path(tempfile.mkdtemp(prefix="pgcdc-airflow-db-")) / "airflow.db"
        shutil.copyfile(home / "airflow.db", keep)
        atexit.register(shutil.rmtree, keep.parent, True)
        _migrated_db.append(keep)


_STAMPED = re.compile(r"\[(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)[.,](\d{3})(?:\+0000)?\] (.*)", re.S)


def _once(text: str) -> str:
    """``text`` without the second of two adjacent log lines that are one record: Airflow 3.0's
    ``dag.test()`` logs each task log line twice, ``[2026-01-02 03:04:05,678] …`` and
    ``[2026-01-02T03:04:05.678+0000] …``."""
    out, last = [], None
    for line in text.splitlines(keepends=True):
        m = _STAMPED.match(line)
        key = m.groups() if m else None
        if key is None or key != last:
            out.append(line)
        last = key
    return "".join(out)


def run_dag(dag_file: Path, dag_id: str, env: dict[str, str], conf: dict | None = None, timeout: float = 900, *,
            run_type: str | None = None) -> DagRunResult:
    """``dag.test()`` of ``dag_id`` in a child process; ``run_type`` (e.g. ``backfill``): the
    run is of that type (logical date 2024-06-01), as the scheduler makes it for
    ``airflow backfill create``, instead of ``dag.test()``'s manual run."""
    migrate(env)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(dag_file), dag_id, json.dumps(conf or {}), run_type or ""],
        env=env, capture_output=True, text=True, timeout=timeout,
    )
    output = _once(proc.stdout) + _once(proc.stderr)
    for line in proc.stdout.splitlines():
        if line.startswith("PGCDC-DAG-RESULT "):
            data = json.loads(line[len("PGCDC-DAG-RESULT "):])
            return DagRunResult(data["state"], data["tasks"], output)
    raise RuntimeError(f"the DAG run of {dag_id} printed no result (exit {proc.returncode}):\n{output[-5000:]}")


def sandbox_connections(env: dict[str, str], *, spark_master: str = "local[2]") -> dict[str, str]:
    """``AIRFLOW_CONN_*`` variables for the example DAGs' connections (``pgcdc_postgres``,
    ``pgcdc_s3``, ``spark_default``) from a sandbox's environment (``pgcdc sandbox env``)."""
    from psycopg.conninfo import conninfo_to_dict

    p = conninfo_to_dict(env["PGCDC_DSN"])
    return {
        "AIRFLOW_CONN_PGCDC_POSTGRES": json.dumps({
            "conn_type": "postgres", "host": p.get("host", "127.0.0.1"), "port": int(p["port"]),
            "login": p["user"], "password": p.get("password", ""), "schema": p["dbname"]}),
        "AIRFLOW_CONN_PGCDC_S3": json.dumps({
            "conn_type": "aws", "login": env["AWS_ACCESS_KEY_ID"], "password": env["AWS_SECRET_ACCESS_KEY"],
            "extra": {"endpoint_url": env["AWS_ENDPOINT_URL"], "region_name": env.get("AWS_REGION", "us-east-1")}}),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": spark_master}),
    }

