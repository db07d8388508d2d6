"""``PgcdcSparkMergeOperator`` in a real Airflow DAG run when the job fails one table and
merges the other (PostgreSQL 18, the S3 server, ``spark-submit`` on ``local[*]``).

``good`` merges; ``bad`` has two columns that differ only in case (a Delta table cannot
hold both: the job fails that table alone, ``TablesFailed``, exit 1). Airflow records Asset
events only for a task that succeeds, so:

- ``merge_strict`` (default ``on_failed_tables="fail"``): the task fails naming ``bad``; its
  XCom still holds every table's result; no Asset event;
- ``merge`` (``on_failed_tables="succeed"``): the task succeeds with the Asset event of
  ``good`` only, and ``check`` (``PgcdcMergeCheckOperator``) fails naming ``bad``, so the
  run fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from airflow_runner import airflow_env, asset_events, run_dag

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
def test_merge_operator_with_a_failed_table(fresh_db, slot_name, s3, s3_bucket, tmp_path):
    db, client = fresh_db, s3.client()
    settings = s3store.S3Settings(endpoint_url=s3.endpoint_url, access_key_id=s3.access_key,
                                  secret_access_key=s3.secret_key, region=s3.region)
    source = f"s3://{s3_bucket}/cdc"
    lake, lake_strict = f"s3://{s3_bucket}/lake", f"s3://{s3_bucket}/lake-strict"
    sql(db, "CREATE TABLE good (id int PRIMARY KEY, v text)")
    sql(db, "INSERT INTO good SELECT g, 'v' || g FROM generate_series(1, 50) g")
    sql(db, 'CREATE TABLE bad (id int PRIMARY KEY, "Name" text, name text)')
    sql(db, "INSERT INTO bad VALUES (1, 'A', 'a')")
    sql(db, "CREATE PUBLICATION pub FOR TABLE good, bad")
    slot = slot_name()
    snapshot_to_s3(db, source, slot=slot, publications="pub", workers=1, s3=client)
    sql(db, "UPDATE good SET v = 'upd' WHERE id <= 5")
    sql(db, "INSERT INTO bad VALUES (2, 'B', 'b')")
    w0 = drain_window(db, source, slot=slot, publications=["pub"], s3=client)

    home = tmp_path / "airflow"
    env = airflow_env(home, DAGS, {
        "AIRFLOW_CONN_PGCDC_S3": json.dumps({"conn_type": "aws", "login": s3.access_key, "password": s3.secret_key,
                                             "extra": {"endpoint_url": s3.endpoint_url, "region_name": s3.region}}),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
    })
    env = {k: v for k, v in env.items() if not k.startswith("AWS_")}
    conf = {"source": source, "slot": slot, "lake": lake, "lake_strict": lake_strict}
    result = run_dag(DAGS / "pgcdc_test_merge_partial.py", "pgcdc_test_merge_partial", env, conf)
    states = {t: v["state"] for t, v in result.tasks.items()}
    assert result.state == "failed" and states == {
        "merge_strict": "failed", "merge": "success", "check": "failed"}, (states, result.output[-6000:])

    # both merges: good merged, bad failed with both column names; the XCom holds both
    for task in ("merge_strict", "merge"):
        out = result.xcom(task)
        assert isinstance(out, dict), (task, out, result.output[-4000:])
        by = {t["table"]: t for t in out["tables"]}
        assert by["public.good"]["action"] == "bootstrapped+merged", by
        assert by["public.good"]["end_lsn"] == w0.end_lsn
        assert by["public.bad"]["action"] == "failed" and "Name" in by["public.bad"]["error"], by
    # the task logs name the failed table (merge_strict's failure, check's failure)
    assert result.output.count("1 of 2 table(s) not merged (merged and committed: public.good):") >= 2, \
        result.output[-6000:]

    # Asset events: good's, from `merge` only; never bad's; none from the failed task
    events = asset_events(home)
    got = [(e["task"], e["uri"], e["extra"]["window_seq"], e["extra"]["end_lsn"]) for e in events]
    assert got == [("merge", delta_table_url(lake, "public", "good"), 0, w0.end_lsn)], events

    # good is in both lakes, equal to PostgreSQL
    for root in (lake, lake_strict):
        v = verify_table(db, root, "public", "good", s3=settings)
        assert v.equal, json.dumps(v.to_dict(), indent=1, default=str)[:3000]
