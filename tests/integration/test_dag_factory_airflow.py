"""The DAG factory in a real Airflow: one DAG file and one YAML file with two pipelines
(two source databases, each with its own connections, slot, store and Delta root); Airflow
parses all eight DAGs; the second pipeline's initial load runs for real (``dag.test()``
in a child process) through its own connection ids, against PostgreSQL 18, the S3 server
and local Spark, then the first pipeline's initial load and an incremental run, and both
pipelines' Delta tables equal their databases. The example DAGs (the factory applied to the sandbox pipeline) run in
``test_dags.py``."""

from __future__ import annotations

import json
import subprocess
import sys

import psycopg
from airflow_runner import airflow_env, run_dag
from psycopg.conninfo import conninfo_to_dict

from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.verify import verify_table

DAG_FILE = '''
from pathlib import Path

from airflow_pgcdc.dags import load_pipelines, register

register(globals(), load_pipelines(Path(__file__).with_name("pipelines.yaml")))
'''

_PARSE = r'''
import json, sys
try:
    from airflow.dag_processing.dagbag import DagBag
except ImportError:  # Airflow before 3.2 (the floor run)
    from airflow.models.dagbag import DagBag
bag = DagBag(sys.argv[1])
print("PARSED " + json.dumps({"dags": sorted(bag.dag_ids), "errors": {k: str(v)[:500] for k, v in bag.import_errors.items()},
                              "conns": {d: sorted({getattr(t, a) for t in bag.dags[d].tasks
                                                   for a in ("postgres_conn_id", "conn_id") if getattr(t, a, None)})
                                        for d in bag.dag_ids}}))
'''


def sql(dsn, query, params=None):
    with psycopg.connect(dsn, autocommit=True) as c:
        cur = c.execute(query, params)
        return cur.fetchall() if cur.description else None


def test_two_pipelines_from_one_config_in_one_airflow(pg18, s3, s3_bucket, tmp_path):
    dbs = {name: pg18.create_database(f"factory_{name}") for name in ("sales", "billing")}
    try:
        for name, dsn in dbs.items():
            sql(dsn, "CREATE SCHEMA app")
            sql(dsn, "CREATE TABLE app.items (id bigint PRIMARY KEY, label text)")
            sql(dsn, "INSERT INTO app.items SELECT g, %s || g FROM generate_series(1, 300) g", (name,))
        dags = tmp_path / "dags"
        dags.mkdir()
        (dags / "pipelines.py").write_text(DAG_FILE)
        (dags / "pipelines.yaml").write_text("pipelines:\n" + "".join(
            f"  - name: {name}\n    slot: {name}_slot\n    publication: {name}_pub\n    tables: [app.items]\n"
            f"    store: s3://{s3_bucket}/{name}/cdc\n    delta: s3://{s3_bucket}/{name}/delta\n"
            f"    postgres_conn_id: {name}_pg\n    aws_conn_id: {name}_s3\n    spark_conn_id: {name}_spark\n"
            for name in dbs))
        env = airflow_env(tmp_path / "airflow", dags)
        for name, dsn in dbs.items():
            p = conninfo_to_dict(dsn)
            env[f"AIRFLOW_CONN_{name.upper()}_PG"] = json.dumps({
                "conn_type": "pgcdc", "host": p["host"], "port": int(p["port"]), "login": p["user"],
                "password": p["password"], "schema": p["dbname"]})
            env[f"AIRFLOW_CONN_{name.upper()}_S3"] = json.dumps({
                "conn_type": "aws", "login": s3.access_key, "password": s3.secret_key,
                "extra": {"endpoint_url": s3.endpoint_url, "region_name": s3.region}})
            env[f"AIRFLOW_CONN_{name.upper()}_SPARK"] = json.dumps({"conn_type": "spark", "host": "local[2]"})

        # Airflow's own parse of the folder: eight DAGs, each pipeline's tasks on its connections
        proc = subprocess.run([sys.executable, "-c", _PARSE, str(dags)], env=env, capture_output=True, text=True,
                              timeout=300)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PARSED ")), None)
        assert line, proc.stderr[-3000:]
        parsed = json.loads(line[len("PARSED "):])
        assert parsed["errors"] == {}
        assert parsed["dags"] == sorted(f"{n}_{k}" for n in dbs
                                        for k in ("initial_load", "incremental", "backfill", "maintenance"))
        assert parsed["conns"]["sales_incremental"] == ["sales_pg", "sales_spark"]
        assert parsed["conns"]["billing_initial_load"] == ["billing_pg", "billing_spark"]

        # the second pipeline's initial load, for real, through its own connections
        run = run_dag(dags / "pipelines.py", "billing_initial_load", env, {})
        assert run.state == "success", run.output[-5000:]
        assert run.xcom("snapshot")["tables"]["app.items"]["rows"] == 300
        assert run.xcom("verify")["equal"] is True
        report = verify_table(dbs["billing"], f"s3://{s3_bucket}/billing/delta", "app", "items",
                              storage_options=s3store.delta_storage_options(s3store.S3Settings(
                                  endpoint_url=s3.endpoint_url, access_key_id=s3.access_key,
                                  secret_access_key=s3.secret_key, region=s3.region)))
        assert report.equal, report.to_dict()
        assert not list(s3store.list_keys(s3.client(), s3_bucket, "sales/")), "the other pipeline untouched"
        assert sql(dbs["billing"], "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'billing_slot'")[0][0]

        # the first pipeline too, in the same Airflow: its initial load, then one incremental run
        run = run_dag(dags / "pipelines.py", "sales_initial_load", env, {})
        assert run.state == "success", run.output[-5000:]
        sql(dbs["sales"], "UPDATE app.items SET label = 'changed' WHERE id <= 20; DELETE FROM app.items WHERE id > 290")
        run = run_dag(dags / "pipelines.py", "sales_incremental", env, {"min_bytes": 1})
        assert run.state == "success", run.output[-5000:]
        assert run.xcom("drain")["rows"] == 30 and run.xcom("drain")["window_seq"] == 0
        settings = s3store.S3Settings(endpoint_url=s3.endpoint_url, access_key_id=s3.access_key,
                                      secret_access_key=s3.secret_key, region=s3.region)
        for name in dbs:
            report = verify_table(dbs[name], f"s3://{s3_bucket}/{name}/delta", "app", "items",
                                  storage_options=s3store.delta_storage_options(settings))
            assert report.equal, (name, report.to_dict())
        assert sql(dbs["sales"], "SELECT count(*) FROM app.items")[0][0] == 290
    finally:
        for name in dbs:
            pg18.drop_database(f"factory_{name}")  # its slots first
