"""Test DAG: the initial-load operators with the connections the test sets."""

import datetime

from airflow.sdk import DAG

from airflow_pgcdc.operators.basebackup import PgcdcBaseBackupOperator
from airflow_pgcdc.operators.snapshot import PgcdcSnapshotOperator

with DAG("pgcdc_test_copy", schedule=None, start_date=datetime.datetime(2024, 1, 1), catchup=False) as dag:
    PgcdcSnapshotOperator(
        task_id="snapshot",
        store="{{ dag_run.conf['to'] }}",
        slot="{{ dag_run.conf['slot'] }}",
        publication="{{ dag_run.conf['publication'] }}",
        workers=2,
        postgres_conn_id="pgcdc_src",
        aws_conn_id="pgcdc_s3",
    )
    PgcdcBaseBackupOperator(
        task_id="basebackup",
        to="{{ dag_run.conf['to'] }}",
        backup_label="pgcdc-test",
        postgres_conn_id="pgcdc_src",
        aws_conn_id="pgcdc_s3",
    )
