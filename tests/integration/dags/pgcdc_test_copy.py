"""Test DAG: the initial-load operators with the connections the test sets, and the
recovery of the slot the snapshot made once a task drops it (as an operator's mistake would)."""

import datetime

from airflow.sdk import DAG, task

from airflow_pgcdc.operators.basebackup import PgcdcBaseBackupOperator
from airflow_pgcdc.operators.recover import PgcdcRecoverOperator
from airflow_pgcdc.operators.snapshot import PgcdcSnapshotOperator


@task
def lose_slot(slot: str) -> None:
    import psycopg

    from airflow_pgcdc.hooks.pgcdc import PgcdcHook

    with psycopg.connect(PgcdcHook("pgcdc_src").get_dsn(), autocommit=True) as c:
        c.execute("SELECT pg_drop_replication_slot(%s)", (slot,))

with DAG("pgcdc_test_copy", schedule=None, start_date=datetime.datetime(2024, 1, 1), catchup=False) as dag:
    snapshot = PgcdcSnapshotOperator(
        task_id="snapshot",
        store="{{ dag_run.conf['to'] }}",
        slot="{{ dag_run.conf['slot'] }}",
        publications="{{ dag_run.conf['publication'] }}",
        workers=2,
        postgres_conn_id="pgcdc_src",
        aws_conn_id="pgcdc_s3",
    )
    PgcdcBaseBackupOperator(
        task_id="basebackup",
        store="{{ dag_run.conf['to'] }}",
        backup_label="pgcdc-test",
        postgres_conn_id="pgcdc_src",
        aws_conn_id="pgcdc_s3",
    )
    recover = PgcdcRecoverOperator(
        task_id="recover",
        store="{{ dag_run.conf['to'] }}",
        slot="{{ dag_run.conf['slot'] }}",
        publications="{{ dag_run.conf['publication'] }}",
        workers=1,
        postgres_conn_id="pgcdc_src",
        aws_conn_id="pgcdc_s3",
    )
    snapshot >> lose_slot("{{ dag_run.conf['slot'] }}") >> recover
