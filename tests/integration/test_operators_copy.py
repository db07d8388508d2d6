"""The initial-load operators in a real Airflow DAG run against real servers."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import psycopg
from airflow_runner import StatsdListener, airflow_env, lineage_env, lineage_events, run_dag
from lake_helpers import parquet_files
from psycopg.conninfo import conninfo_to_dict

from airflow_pgcdc.store import s3 as s3store

DAGS = Path(__file__).parent / "dags"


def conn_json(dsn: str) -> str:
    p = conninfo_to_dict(dsn)
    return json.dumps({"conn_type": "postgres", "host": p["host"], "port": int(p["port"]), "login": p["user"],
                       "password": p["password"], "schema": p["dbname"], "extra": {"application_name": "pgcdc-airflow"}})


def s3_conn_json(s3) -> str:
    """The test bed's S3 server as an Airflow ``aws`` connection."""
    return json.dumps({"conn_type": "aws", "login": s3.access_key, "password": s3.secret_key,
                       "extra": {"endpoint_url": s3.endpoint_url, "region_name": s3.region}})


def test_snapshot_and_basebackup_operators(fresh_db, slot_name, s3, s3_bucket, tmp_path):
    with psycopg.connect(fresh_db, autocommit=True) as c:
        c.execute("CREATE TABLE orders (id int PRIMARY KEY, total numeric(10,2))")
        c.execute("INSERT INTO orders SELECT g, g * 1.5 FROM generate_series(1, 500) g")
        c.execute("CREATE PUBLICATION pub FOR TABLE orders")
    env = airflow_env(tmp_path / "airflow", DAGS, {
        "AIRFLOW_CONN_PGCDC_SRC": conn_json(fresh_db),
        "AIRFLOW_CONN_PGCDC_S3": s3_conn_json(s3),
    })
    slot = slot_name()
    to = f"s3://{s3_bucket}/lake"
    result = run_dag(DAGS / "pgcdc_test_copy.py", "pgcdc_test_copy", env | lineage_env(tmp_path / "openlineage"),
                     {"to": to, "slot": slot, "publication": "pub"})
    assert result.state == "success", result.output[-4000:]
    if importlib.util.find_spec("airflow.providers.openlineage") is not None:  # the recovery's OpenLineage
        (done,) = [e for e in lineage_events(tmp_path / "openlineage")
                   if e.get("eventType") == "COMPLETE" and e["job"]["name"] == "pgcdc_test_copy.recover"]
        p = conninfo_to_dict(fresh_db)
        assert [d["name"] for d in done["inputs"]] == [f"{p['dbname']}.public.orders"]
        assert [(d["namespace"], d["name"]) for d in done["outputs"]] == [(f"s3://{s3_bucket}", f"lake/{slot}/resync")]
    snap = result.xcom("snapshot")
    assert snap["slot"] == slot and snap["tables"]["public.orders"]["rows"] == 500
    assert snap["manifest"].startswith(to) and snap["consistent_point"]
    rec = result.xcom("recover")  # the slot a task dropped: created again, the table copied again
    assert rec["cause"] == "slot_missing" and rec["slot_recreated"] and rec["next_window_seq"] == 0
    assert rec["copies"][0]["tables"] == [["public", "orders"]] and rec["record"].startswith(to)
    with psycopg.connect(fresh_db) as c:
        assert c.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone() == (1,)
    bb = result.xcom("basebackup")
    assert bb["end_lsn"] >= bb["start_lsn"] and "base.tar" in bb["archives"]
    keys = list(s3store.list_keys(s3.client(), s3_bucket, "lake/"))
    assert any(k.endswith("/_manifest.json") for k in keys) and any(k.endswith("backup_manifest") for k in keys)
    # secrets never reach the task logs
    assert fresh_db.server.password not in result.output
    assert s3.secret_key not in result.output


def test_the_snapshot_operators_column_rules_hold_for_the_drain_with_the_key_from_a_connection(
        fresh_db, slot_name, s3, s3_bucket, tmp_path):
    import hashlib
    import hmac
    import io

    import pyarrow.parquet as pq

    key = "pii-key-from-a-connection-77"
    with psycopg.connect(fresh_db, autocommit=True) as c:
        c.execute("CREATE TABLE users (id int PRIMARY KEY, email text, ssn text)")
        c.execute("INSERT INTO users VALUES (1, 'alice@example.com', 'SSN-1'), (2, 'bob@example.com', 'SSN-2')")
        c.execute("CREATE PUBLICATION pub FOR TABLE users")
    env = airflow_env(tmp_path / "airflow", DAGS, {
        "AIRFLOW_CONN_PGCDC_SRC": conn_json(fresh_db),
        "AIRFLOW_CONN_PGCDC_S3": s3_conn_json(s3),
        "AIRFLOW_CONN_PGCDC_PII_KEY": json.dumps({"conn_type": "generic", "password": key}),
    })
    env.pop("PGCDC_PII_KEY", None)
    # OpenLineage: the provider's listener with its file transport, as a deployment sets it
    env |= lineage_env(tmp_path / "openlineage")
    env["AIRFLOW__OPENLINEAGE__NAMESPACE"] = "pgcdc-test"
    slot = slot_name()
    with StatsdListener() as statsd:
        result = run_dag(DAGS / "pgcdc_test_pii.py", "pgcdc_test_pii", env | statsd.airflow_env(),
                         {"store": f"s3://{s3_bucket}/cdc", "slot": slot})
        counts = statsd.counters(timeout=10.0, want=f"airflow.pgcdc.{slot}.resync.rows")
    assert result.state == "success", result.output[-4000:]
    assert counts[f"airflow.pgcdc.{slot}.resync.rows"] == result.xcom("resync")["rows"] == 3, counts
    assert counts[f"airflow.pgcdc.{slot}.resync.tables"] == 1
    complete = {}
    events = lineage_events(tmp_path / "openlineage")
    for e in events:
        if e.get("eventType") == "COMPLETE":
            complete[e["job"]["name"]] = e
    p = conninfo_to_dict(fresh_db)
    source = {"namespace": f"postgres://{p['host']}:{p['port']}", "name": f"{p['dbname']}.public.users"}
    snap = complete["pgcdc_test_pii.snapshot"]
    assert [{k: d[k] for k in ("namespace", "name")} for d in snap["inputs"]] == [source]
    (out,) = snap["outputs"]
    assert (out["namespace"], out["name"]) == (f"s3://{s3_bucket}", f"cdc/{slot}/snapshot")
    assert out["outputFacets"]["outputStatistics"]["rowCount"] == 2
    drained = complete["pgcdc_test_pii.drain"]
    assert [d["name"] for d in drained["inputs"]] == [source["name"]]
    assert drained["outputs"][0]["name"] == f"cdc/{slot}/changes"
    assert drained["outputs"][0]["outputFacets"]["outputStatistics"]["rowCount"] == 1
    resynced = complete["pgcdc_test_pii.resync"]
    assert [{k: d[k] for k in ("namespace", "name")} for d in resynced["inputs"]] == [source]
    (out,) = resynced["outputs"]
    assert out["name"].startswith(f"cdc/{slot}/resync/") and out["outputFacets"]["outputStatistics"]["rowCount"] == 3
    assert p["password"] not in json.dumps(events)
    assert result.xcom("drain")["rows"] == 1
    client = s3.client()
    emails, columns = [], set()
    for k in s3store.list_keys(client, s3_bucket, "cdc/"):
        for part in parquet_files(s3store.get_bytes(client, s3_bucket, k)):  # parts, and packs of small ones
            t = pq.read_table(io.BytesIO(part))
            columns |= set(t.column_names)
            emails += t.column("email").to_pylist()
    # the snapshot's two rows, the drained insert, and the resync's copy of all three
    assert sorted(emails) == sorted(hmac.new(key.encode(), e.encode(), hashlib.sha256).hexdigest()
                                    for e in ("alice@example.com", "bob@example.com", "carol@example.com") * 2)
    assert "ssn" not in columns and "_pgcdc_old_ssn" not in columns
    assert key not in result.output  # the key never reaches the task logs
