"""Test DAG: the slot's column rules given to the snapshot operator, the hash key from a
connection's password; a drain that is given neither applies them (the store's), and so does
a resync of the table."""

import datetime

from airflow.sdk import DAG, task

from airflow_pgcdc.operators.drain import PgcdcDrainOperator
from airflow_pgcdc.operators.resync import PgcdcResyncOperator
from airflow_pgcdc.operators.snapshot import PgcdcSnapshotOperator


@task
def write(marker: str) -> None:
    import psycopg

    from airflow_pgcdc.hooks.pgcdc import PgcdcHook

    with psycopg.connect(PgcdcHook("pgcdc_src").get_dsn(), autocommit=True) as c:
        c.execute("INSERT INTO users VALUES (3, %s, 'SSN-3')", (marker,))


with DAG("pgcdc_test_pii", schedule=None, start_date=datetime.datetime(2024, 1, 1), catchup=False) as dag:
    snapshot = PgcdcSnapshotOperator(
        task_id="snapshot",
        store="{{ dag_run.conf['store'] }}",
        slot="{{ dag_run.conf['slot'] }}",
        publications="pub",
        workers=1,
        pii={"public.users": {"email": "hash", "ssn": "exclude"}},
        pii_key_conn_id="pgcdc_pii_key",
        postgres_conn_id="pgcdc_src",
        aws_conn_id="pgcdc_s3",
    )
    drain = PgcdcDrainOperator(
        task_id="drain",
        store="{{ dag_run.conf['store'] }}",
        slot="{{ dag_run.conf['slot'] }}",
        publications="pub",
        pii_key_conn_id="pgcdc_pii_key",
        postgres_conn_id="pgcdc_src",
        aws_conn_id="pgcdc_s3",
    )
    resync = PgcdcResyncOperator(
        task_id="resync",
        store="{{ dag_run.conf['store'] }}",
        slot="{{ dag_run.conf['slot'] }}",
        publications="pub",
        tables=["public.users"],
        pii_key_conn_id="pgcdc_pii_key",
        postgres_conn_id="pgcdc_src",
        aws_conn_id="pgcdc_s3",
    )
    snapshot >> write("carol@example.com") >> drain >> resync
