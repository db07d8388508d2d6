"""``PgcdcSparkMergeOperator`` in a real Airflow DAG run: snapshot and two drained windows
of a PostgreSQL 18 database on the S3 server, then ``spark-submit`` through the
``spark_default`` connection, on ``local[*]`` with the delta-spark engine and s3a reader
(jars found by the job itself); the Delta tables must equal PostgreSQL, the XCom and the Asset events
must say which windows were merged, and the S3 secret key must not reach the task log."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from airflow_runner import airflow_env, asset_events, run_dag, xcom_values

from airflow_pgcdc.drain.drain import drain_window
from airflow_pgcdc.lake.tables import delta_table_url
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.verify import verify_table

DAGS = Path(__file__).parent / "dags"


def sql(dsn, query, params=None):
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(query, params)


@pytest.mark.slow
@pytest.mark.parametrize("pg_server", ["pg18"], indirect=True)
def test_merge_operator_in_a_dag_run(fresh_db, slot_name, s3, s3_bucket, tmp_path):
    """On ``local[*]``: ``merge_first`` with Delta's Spark engine and the s3a reader, the jars
    found by the job itself; ``merge`` with the default engine into the tables it created
    (the engines take turns; a second Delta Spark job here cost ~60 s and proved nothing the
    first does not). (The operator on the default engine runs in ``test_operator_merge_partial.py``
    and ``test_dags.py``; the merge on the Spark cluster, both engines, jars found by the job,
    in ``test_merge_cluster.py``: the master is only a connection field to the operator, so
    the operator's own run on the cluster, ~7 minutes of the suite, was dropped.)"""
    from airflow_pgcdc.merge.jars import unavailable_reason

    if unavailable_reason():
        pytest.skip(unavailable_reason())
    output = run_merge_dag(fresh_db, slot_name, s3, s3_bucket, tmp_path, master="local[*]",
                           engine="delta-spark", reader="s3a", rest_default=True)
    assert output.count("--master local[*]") == 2
    assert output.count("--engine delta-spark --reader s3a") == 1 and output.count("--engine") == 1
    # under spark-submit to a local master the job starts Spark only for a table that needs it:
    # Delta's Spark engine does; the default engine's small merge does not (test_dags.py)
    assert output.count("starting the Spark session (master from spark-submit)") == 1, output[-3000:]
    # the "Spark UI" extra link: merge_first's application (its id as the job reported it) on the
    # history server page its spark_ui_url names; merge started no application: no link
    import re

    apps = sorted(set(re.findall(r'"spark": \{"app_id": "([^"]+)"', output)))  # the job's line, and as logged
    assert len(apps) == 1 and apps[0].startswith("local-"), apps
    assert xcom_values(tmp_path / "airflow", "merge_first", "_link_PgcdcSparkUILink") == [
        f"http://history.test:18080/history/{apps[0]}/jobs/"]
    assert xcom_values(tmp_path / "airflow", "merge", "_link_PgcdcSparkUILink") == [""]


def run_merge_dag(db, slot_name, s3, s3_bucket, tmp_path, *, master, engine=None, reader=None,
                  rest_default=False) -> str:
    client = s3.client()
    settings = s3store.S3Settings(endpoint_url=s3.endpoint_url, access_key_id=s3.access_key,
                                  secret_access_key=s3.secret_key, region=s3.region)
    source, lake = f"s3://{s3_bucket}/cdc", f"s3://{s3_bucket}/lake"
    sql(db, "CREATE TABLE orders (id int PRIMARY KEY, total numeric(10,2), note text)")
    sql(db, "INSERT INTO orders SELECT g, g * 1.5, 'n' || g FROM generate_series(1, 200) g")
    sql(db, "CREATE TABLE nokey (k int, v text)")  # no key: the operator's keys= gives one
    sql(db, "ALTER TABLE nokey REPLICA IDENTITY FULL")
    sql(db, "INSERT INTO nokey VALUES (1, 'a'), (2, 'b')")
    sql(db, "CREATE PUBLICATION pub FOR TABLE orders, nokey")
    slot = slot_name()
    snapshot_to_s3(db, source, slot=slot, publications="pub", workers=2, s3=client)
    # window 0
    sql(db, "INSERT INTO orders VALUES (1001, 9.99, 'new')")
    sql(db, "UPDATE orders SET total = total + 1, note = 'upd' WHERE id <= 10")
    sql(db, "DELETE FROM orders WHERE id BETWEEN 50 AND 59")
    sql(db, "INSERT INTO nokey VALUES (3, 'c')")
    w0 = drain_window(db, source, slot=slot, publications=["pub"], s3=client)
    # window 1
    sql(db, "UPDATE orders SET id = 2000 WHERE id = 100")  # key change
    sql(db, "UPDATE orders SET note = NULL WHERE id = 1001")
    sql(db, "INSERT INTO orders SELECT g, 0, 'late' FROM generate_series(3000, 3099) g")
    w1 = drain_window(db, source, slot=slot, publications=["pub"], s3=client)
    assert (w0.window_seq, w1.window_seq) == (0, 1) and w1.rows > 100

    home = tmp_path / "airflow"
    env = airflow_env(home, DAGS, {
        "AIRFLOW_CONN_PGCDC_S3": json.dumps({"conn_type": "aws", "login": s3.access_key, "password": s3.secret_key,
                                             "extra": {"endpoint_url": s3.endpoint_url, "region_name": s3.region}}),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": master}),
    })
    # S3 must come from the connection, not from an environment the child would inherit;
    # the jars are found by the job, not given
    env = {k: v for k, v in env.items() if not k.startswith("AWS_") and k != "PGCDC_SPARK_JARS"}
    conf = {"source": source, "slot": slot, "delta": lake, "tables": ["public.orders", "public.nokey"],
            "max_windows": 1, "engine": engine, "reader": reader}
    if rest_default:  # the second task on the default engine and reader
        conf |= {"engine_rest": None, "reader_rest": None}
    result = run_dag(DAGS / "pgcdc_test_merge.py", "pgcdc_test_merge", env, conf)
    assert result.state == "success", result.output[-6000:]

    # merge_first: one window per table (max_windows templated from the run's conf)
    out1 = result.xcom("merge_first")
    assert (out1["slot"], out1["source"], out1["delta"]) == (slot, source, lake)
    by1 = {t["table"]: t for t in out1["tables"]}
    assert set(by1) == {"public.orders", "public.nokey"}
    for name in by1:
        t = by1[name]
        assert t["action"] == "bootstrapped+merged", t
        assert (t["first_window"], t["last_window"]) == (0, 0)
        assert (t["start_lsn"], t["end_lsn"]) == (w0.start_lsn, w0.end_lsn)
        assert t["delta_url"] == delta_table_url(lake, *name.split("."))
    assert by1["public.orders"]["bootstrap_rows"] == 200

    # merge: the rest, without window numbers from anyone
    by2 = {t["table"]: t for t in result.xcom("merge")["tables"]}
    orders = by2["public.orders"]
    assert orders["action"] == "merged" and (orders["first_window"], orders["last_window"]) == (1, 1)
    assert (orders["start_lsn"], orders["end_lsn"]) == (w1.start_lsn, w1.end_lsn)
    assert by2["public.nokey"]["action"] == "no-changes"  # window 1 holds nothing for it: no commit

    # the Delta tables equal PostgreSQL
    for table, key in (("orders", None), ("nokey", ["k"])):
        v = verify_table(db, lake, "public", table, key=key, s3=settings)
        assert v.equal, json.dumps(v.to_dict(), indent=1, default=str)[:3000]

    # Asset events: one per merged table per run, through the slot's alias
    events = [e for e in asset_events(home) if e["task"] in ("merge_first", "merge")]
    url = {n: delta_table_url(lake, "public", n) for n in ("orders", "nokey")}
    got = sorted((e["uri"], e["extra"]["window_seq"], e["extra"]["end_lsn"]) for e in events)
    expect = [(url["nokey"], 0, w0.end_lsn), (url["orders"], 0, w0.end_lsn), (url["orders"], 1, w1.end_lsn)]
    assert got == sorted(expect), events
    assert all(e["aliases"] == "pgcdc-delta" for e in events), events
    first = next(e for e in events if e["uri"] == url["orders"] and e["extra"]["window_seq"] == 0)
    assert first["extra"]["start_lsn"] == w0.start_lsn and first["extra"]["action"] == "bootstrapped+merged"

    # the task log holds spark-submit's output, but never the secret key
    assert result.output.count("Spark-Submit cmd") == 2 and "PGCDC_MERGE_RESULT" in result.output
    assert "--slot " + slot in result.output and "--max-windows 1" in result.output
    assert "--tables public.orders public.nokey --key public.nokey=k" in result.output
    assert s3.secret_key not in result.output
    return result.output
