"""Test DAG: the freshness SLA check of a pipeline the test set up."""

import datetime

from airflow.sdk import DAG

from airflow_pgcdc.operators.freshness import PgcdcFreshnessCheckOperator

with DAG("pgcdc_test_freshness", schedule=None, start_date=datetime.datetime(2024, 1, 1), catchup=False) as dag:
    PgcdcFreshnessCheckOperator(
        task_id="freshness",
        store="{{ dag_run.conf['store'] }}",
        delta="{{ dag_run.conf['delta'] }}",
        slot="{{ dag_run.conf['slot'] }}",
        max_lag_seconds="{{ dag_run.conf['max_lag'] }}",
        table_max_lag_seconds={"public.t": 3600},
        postgres_conn_id="pgcdc_src",
        aws_conn_id="pgcdc_s3",
    )
