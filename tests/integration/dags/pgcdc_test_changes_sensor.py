"""Test DAG: the changes sensor (deferred to its trigger) hands observed_lsn downstream.

``wait`` waits on ``conf['slot']`` for ``conf['min_bytes']`` of pending WAL; ``use`` reads
its XCom through a template, the way a drain takes its window end; ``missing`` waits on
a slot that does not exist and must fail at once with the slot error.
"""

import datetime

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG

from airflow_pgcdc.sensors.changes import PgcdcChangesSensor


def _use(observed_lsn, pending_bytes):
    return {"window_end": observed_lsn, "pending_bytes": int(pending_bytes)}


with DAG("pgcdc_test_changes_sensor", schedule=None, start_date=datetime.datetime(2024, 1, 1),
         catchup=False, render_template_as_native_obj=True) as dag:
    wait = PgcdcChangesSensor(
        task_id="wait",
        slot="{{ dag_run.conf['slot'] }}",
        publications="{{ dag_run.conf['publication'] }}",
        min_bytes=2 << 20,
        max_delay=None,
        poke_interval=0.5,
        timeout=120,
        postgres_conn_id="pgcdc_src",
    )
    use = PythonOperator(
        task_id="use",
        python_callable=_use,
        op_kwargs={
            "observed_lsn": "{{ ti.xcom_pull(task_ids='wait')['observed_lsn'] }}",
            "pending_bytes": "{{ ti.xcom_pull(task_ids='wait')['pending_bytes'] }}",
        },
    )
    wait >> use
    PgcdcChangesSensor(
        task_id="missing",
        slot="no_such_slot",
        poke_interval=0.5,
        timeout=60,
        retries=3,
        postgres_conn_id="pgcdc_src",
    )
