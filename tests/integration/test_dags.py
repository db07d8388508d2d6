"""The example DAGs of ``dags/``, run for real (``dag.test()`` in a child process) against
PostgreSQL 18, the S3 server and Spark in local mode: initial load, incremental runs,
backfill; after each, the Delta tables verify equal to PostgreSQL."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import psycopg
import pytest
from airflow_runner import (
    StatsdListener,
    airflow_env,
    asset_events,
    lineage_env,
    lineage_events,
    run_dag,
)
from deltalake import DeltaTable
from psycopg.conninfo import conninfo_to_dict
from test_secrets import PsWatch

from airflow_pgcdc.lake.tables import app_id, delta_table_url
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.verify import verify_table

DAGS = Path(__file__).resolve().parents[2] / "dags"
TABLES = ["shop.customers", "shop.orders"]


def sql(dsn, query, params=None):
    with psycopg.connect(dsn, autocommit=True) as c:
        cur = c.execute(query, params)
        return cur.fetchall() if cur.description else None


@pytest.fixture
def db(pg18, request):
    name = "dags_" + request.node.name.lower()[:40]
    dsn = pg18.create_database(name)
    yield dsn
    pg18.drop_database(name)


def connections(dsn: str, s3) -> dict[str, str]:
    p = conninfo_to_dict(dsn)
    return {
        "AIRFLOW_CONN_PGCDC_POSTGRES": json.dumps({
            "conn_type": "postgres", "host": p["host"], "port": int(p["port"]), "login": p["user"],
            "password": p["password"], "schema": p["dbname"]}),
        "AIRFLOW_CONN_PGCDC_S3": json.dumps({
            "conn_type": "aws", "login": s3.access_key, "password": s3.secret_key,
            "extra": {"endpoint_url": s3.endpoint_url, "region_name": s3.region}}),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "PGCDC_MIN_BYTES": "1",  # the incremental DAG's sensor: any pending change is worth a window
    }


def assert_all_equal(dsn, delta):
    for name in TABLES:
        schema, table = name.split(".")
        r = verify_table(dsn, delta, schema, table, s3=s3store.S3Settings.from_env())
        assert r.equal, r.to_dict()


@pytest.mark.slow
@pytest.mark.timeout(1200)  # five DAG runs, six spark-submits: ~7 minutes on a loaded 2-core machine
def test_initial_load_incremental_and_backfill(db, slot_name, s3, s3_bucket, tmp_path, monkeypatch):
    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    sql(db, "CREATE SCHEMA shop")
    sql(db, "CREATE TABLE shop.customers (id bigint PRIMARY KEY, email text NOT NULL, profile jsonb)")
    sql(db, "CREATE TABLE shop.orders (id bigint PRIMARY KEY, customer_id bigint, total numeric(12,2), "
            "items text[], placed_at timestamptz DEFAULT now())")
    sql(db, "INSERT INTO shop.customers SELECT g, 'u' || g || '@x', jsonb_build_object('tier', g % 3) "
            "FROM generate_series(1, 200) g")
    sql(db, "INSERT INTO shop.orders (id, customer_id, total, items) "
            "SELECT g, 1 + g % 200, g + 0.99, ARRAY['sku-' || g] FROM generate_series(1, 1000) g")
    env = airflow_env(tmp_path / "airflow", DAGS, connections(db, s3))
    slot = slot_name()
    store, delta = f"s3://{s3_bucket}/cdc", f"s3://{s3_bucket}/delta"
    conf = {"slot": slot, "publication": "demo_pub", "tables": TABLES, "store": store, "delta": delta}

    # no password or S3 secret key on any command line of the DAG runs' processes (task
    # runners, snapshot workers, spark-submit and its JVM and Python workers)
    ps = PsWatch([conninfo_to_dict(db)["password"], s3.secret_key]).__enter__()
    first = run_dag(DAGS / "pgcdc_initial_load.py", "pgcdc_initial_load", env, {**conf, "workers": 2})
    assert first.state == "success", first.output[-5000:]
    assert first.xcom("verify")["equal"] is True
    assert first.xcom("snapshot")["tables"]["shop.orders"]["rows"] == 1000
    assert {t["action"] for t in first.xcom("bootstrap")["tables"]} == {"bootstrapped"}

    # one incremental run here; the one at the end (after a resync) is the next window's
    sql(db, "UPDATE shop.orders SET total = total + 1 WHERE id % 5 = 0")
    sql(db, "DELETE FROM shop.orders WHERE id % 50 = 0")
    sql(db, "INSERT INTO shop.customers VALUES (1000, 'new@x', NULL)")
    # the run's metrics over StatsD and its OpenLineage events to a file, as a deployment
    # configures them (the floor environment has no OpenLineage provider: the optional extra)
    with StatsdListener() as statsd:
        run = run_dag(DAGS / "pgcdc_incremental.py", "pgcdc_incremental",
                      env | statsd.airflow_env() | lineage_env(tmp_path / "openlineage"), conf)
        counts = statsd.counters(timeout=10.0, want=f"airflow.pgcdc.{slot}.merge.seconds")  # its last
    assert run.state == "success", run.output[-5000:]
    window = run.xcom("drain")
    assert window["window_seq"] == 0 and window["rows"] > 0
    merged = {t["table"]: t for t in run.xcom("merge")["tables"]}
    assert counts[f"airflow.pgcdc.{slot}.drain.rows"] == window["rows"], counts
    assert counts[f"airflow.pgcdc.{slot}.drain.windows"] == 1
    assert counts[f"airflow.pgcdc.{slot}.shop.orders.merge_rows"] == merged["shop.orders"]["merged_rows"] > 0
    assert counts[f"airflow.pgcdc.{slot}.merge.rows"] == sum(t.get("merged_rows") or 0 for t in merged.values())
    assert f"airflow.pgcdc.{slot}.merge.seconds" in statsd.timers()
    if importlib.util.find_spec("airflow.providers.openlineage") is not None:
        events = lineage_events(tmp_path / "openlineage")
        (merge_event,) = [e for e in events if e.get("eventType") == "COMPLETE"
                          and e["job"]["name"] == "pgcdc_incremental.merge"]
        outputs = {o["name"]: o for o in merge_event["outputs"]}
        orders = outputs[s3store.S3Location.parse(delta_table_url(delta, "shop", "orders")).prefix]
        assert orders["outputFacets"]["outputStatistics"]["rowCount"] == merged["shop.orders"]["merged_rows"]
        assert {"id", "total", "items"} <= {f["name"] for f in orders["facets"]["schema"]["fields"]}
        assert [i["name"] for i in merge_event["inputs"]] == [f"cdc/{slot}/changes"]
    assert merged["shop.orders"]["last_window"] == 0
    assert run.xcom("check_tables") == {"failed": []}
    assert_all_equal(db, delta)
    # spark-submit to a local master, small batches: the job started no SparkContext (it
    # compacted on the driver in Arrow); with Delta's Spark engine it does (test_operator_merge.py)
    assert "starting the Spark session" not in run.output and "--master local[2]" in run.output

    # Asset events (the DAGs' locations are templated: they come through the aliases)
    events = asset_events(tmp_path / "airflow")
    snap_events = [e for e in events if e["task"] == "snapshot"]
    assert [e["uri"] for e in snap_events] == [f"{store}/{slot}/snapshot"]
    assert snap_events[0]["aliases"] == "pgcdc-snapshot" and snap_events[0]["extra"]["rows"] == 1200
    assert snap_events[0]["extra"]["consistent_point"] == first.xcom("snapshot")["consistent_point"]
    drains = [e for e in events if e["task"] == "drain"]
    assert [(e["uri"], e["extra"]["window_seq"]) for e in drains] == [(f"{store}/{slot}/changes", 0)]
    assert drains[-1]["extra"]["end_lsn"] == window["end_lsn"] and drains[-1]["aliases"] == "pgcdc-changes"
    merged_uris = {e["uri"] for e in events if e["task"] == "merge"}
    assert merged_uris == {delta_table_url(delta, *t.split(".")) for t in TABLES}

    # the backfill DAG with its defaults: every table of the slot (no `tables` given)
    back = run_dag(DAGS / "pgcdc_backfill.py", "pgcdc_backfill", env,
                   {**{k: v for k, v in conf.items() if k != "tables"}, "verify": True})
    ps.__exit__(None, None, None)
    assert ps.scans > 10 and ps.hits == [], ps.hits[:3]
    assert back.state == "success", back.output[-5000:]
    swapped = back.xcom("swap")
    assert {s["window"] for s in swapped} == {0}
    live_urls = {delta_table_url(delta, *t.split(".")) for t in TABLES}
    assert {s["live"] for s in swapped} == live_urls
    assert set(back.xcom("verify")["tables"]) == set(TABLES)
    assert_all_equal(db, delta)
    # Asset events for the live tables (from the swap), none for the scratch rebuild; the
    # run's rebuild folder is gone
    events = [e for e in asset_events(tmp_path / "airflow") if e["task"] in ("rebuild", "swap")]
    assert sorted(e["uri"] for e in events) == sorted(live_urls), events
    assert all(e["task"] == "swap" and e["extra"]["action"] == "rebuilt" for e in events), events
    assert list(s3store.list_keys(s3.client(), s3_bucket, "delta_rebuild/")) == []
    live = DeltaTable(delta_table_url(delta, "shop", "orders"), storage_options=s3store.delta_storage_options())
    assert live.transaction_version(app_id(slot, "shop", "orders")) == 0, "the swap keeps the merge position"
    # secrets never reach the task logs
    password = conninfo_to_dict(db)["password"]
    for out in (first.output, run.output, back.output):
        assert s3.secret_key not in out and password not in out

    # a table that joins the publication later: the backfill DAG's resync mode copies it
    # while the slot streams, and merges it into the live root; the next incremental run
    # brings the later changes
    sql(db, "CREATE TABLE shop.refunds (id bigint PRIMARY KEY, order_id bigint, amount numeric(12,2))")
    sql(db, "INSERT INTO shop.refunds SELECT g, g, g / 10.0 FROM generate_series(1, 50) g")
    sql(db, "ALTER PUBLICATION demo_pub ADD TABLE shop.refunds")
    sql(db, "UPDATE shop.refunds SET amount = 0 WHERE id <= 5")
    res = run_dag(DAGS / "pgcdc_backfill.py", "pgcdc_backfill", env,
                  {**conf, "mode": "resync", "tables": ["shop.refunds"]})
    assert res.state == "success", res.output[-5000:]
    assert res.xcom("resync")["tables"]["shop.refunds"]["rows"] == 50
    assert {t["table"]: t["action"] for t in res.xcom("merge_resynced")["tables"]} == {
        "shop.refunds": "resynced"}
    sql(db, "DELETE FROM shop.refunds WHERE id = 7; UPDATE shop.refunds SET amount = 1 WHERE id = 8")
    sql(db, "UPDATE shop.orders SET total = total + 1 WHERE id % 5 = 1")
    sql(db, "DELETE FROM shop.orders WHERE id % 50 = 1")
    run = run_dag(DAGS / "pgcdc_incremental.py", "pgcdc_incremental", env,
                  {**conf, "tables": TABLES + ["shop.refunds"]})
    assert run.state == "success", run.output[-5000:]
    assert run.xcom("drain")["window_seq"] == 1, "the second incremental run drains the next window"
    merged = {t["table"]: t for t in run.xcom("merge")["tables"]}
    assert merged["shop.orders"]["first_window"] == merged["shop.orders"]["last_window"] == 1
    assert run.xcom("check_tables") == {"failed": []}
    assert_all_equal(db, delta)
    r = verify_table(db, delta, "shop", "refunds", s3=s3store.S3Settings.from_env())
    assert r.equal and r.to_dict()["postgres"]["rows"] == 49, r.to_dict()
    assert s3.secret_key not in res.output and password not in res.output


def test_an_airflow_backfill_of_the_incremental_dag_is_refused(db, slot_name, s3, s3_bucket, tmp_path):
    """A backfill run of ``pgcdc_incremental`` (as ``airflow backfill create`` makes them: run
    type ``backfill``, a past logical date) is refused by its first task, naming what to use
    instead; nothing is drained although changes are pending (a manual run would drain them:
    ``PGCDC_MIN_BYTES=1``)."""
    from airflow_pgcdc.snapshot.export import snapshot_to_s3

    sql(db, "CREATE SCHEMA shop; CREATE TABLE shop.orders (id bigint PRIMARY KEY, total numeric(12,2))")
    sql(db, "INSERT INTO shop.orders VALUES (1, 1.5)")
    sql(db, "CREATE PUBLICATION demo_pub FOR TABLE shop.orders")
    slot = slot_name()
    store, delta = f"s3://{s3_bucket}/cdc", f"s3://{s3_bucket}/delta"
    snapshot_to_s3(db, store, slot=slot, publications="demo_pub", s3=s3.client())
    sql(db, "INSERT INTO shop.orders VALUES (2, 2.5)")
    env = airflow_env(tmp_path / "airflow", DAGS, connections(db, s3))
    conf = {"slot": slot, "publication": "demo_pub", "tables": ["shop.orders"], "store": store, "delta": delta}
    run = run_dag(DAGS / "pgcdc_incremental.py", "pgcdc_incremental", env, conf, run_type="backfill")
    assert run.state == "failed", run.output[-3000:]
    assert run.tasks["wait_for_changes"]["state"] == "failed", run.tasks
    assert {run.tasks[t]["state"] for t in ("drain", "merge")} == {"upstream_failed"}, run.tasks
    assert "Airflow backfill run" in run.output and "pgcdc_backfill" in run.output and "pgcdc resync" in run.output
    assert not [k for k in s3store.list_keys(s3.client(), s3_bucket, "cdc/") if "/changes/" in k], "nothing drained"
