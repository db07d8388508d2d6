"""``{name}_incremental``: on its schedule, wait for changes (deferrable sensor) → drain
one window to S3 → Spark merge into the Delta tables (Asset event per Delta table) →
check that no table failed.

One table's trouble never stops the others: when the merge job fails some tables (an
incompatible type change, a table rewritten by DDL, ...) it still commits the others; the
``merge`` task then succeeds with the Asset events of the tables that moved (Airflow
records Asset events only for a successful task), and ``check_tables`` fails the run,
naming each failed table with its error and hint (``pgcdc resync`` for most).

Catch-up: ``max_active_runs=1`` and no catch-up of missed intervals; one run drains
what is pending when it starts (the window ends at the LSN the sensor observed), cut
at a transaction boundary by the drain limits, and the merge then merges every
committed window not merged yet (so a run after an outage, or after a failed merge,
catches up in one go, exactly once). A run whose sensor times out (nothing worth a
window within 4 minutes) is skipped, not failed.

Backfill: a run drains what the slot holds when it runs, whatever its logical date, so an
Airflow backfill of this DAG (``airflow backfill create``) could load nothing of the
intervals it names: its first task refuses each backfill run, pointing to
``{name}_backfill`` (rebuild the Delta tables from the store) and ``pgcdc resync``
(re-copy a table).

Thresholds (DAG params, so a run's conf can set them; defaults: the pipeline's):
``min_bytes`` (pending WAL that makes a window worth it), ``max_delay`` (seconds the
oldest change may wait), ``max_rows`` / ``max_bytes`` / ``max_seconds`` (window limits).
Params: ``slot``, ``publication``, ``tables`` (unused here: every published table is
merged), ``store``, ``delta``.
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG, Param

from airflow_pgcdc.dags.params import common_params, merge_task, pipeline_dag
from airflow_pgcdc.dags.pipeline import Pipeline
from airflow_pgcdc.operators.drain import PgcdcDrainOperator
from airflow_pgcdc.operators.merge import PgcdcMergeCheckOperator
from airflow_pgcdc.sensors.changes import PgcdcChangesSensor

SENSOR_TIMEOUT = datetime.timedelta(minutes=4)


def build(p: Pipeline) -> DAG:
    params = {
        **common_params(p),
        "min_bytes": Param(p.min_bytes, type="integer", minimum=0,
                           description="pending WAL (bytes) that makes a window worth draining"),
        "max_delay": Param(p.max_delay, type=["null", "number"], minimum=0,
                           description="seconds the oldest change may wait (null: no limit)"),
        "max_rows": Param(p.max_rows, type=["null", "integer"], minimum=0,
                          description="end a window after this many change rows (null: no limit)"),
        "max_bytes": Param(p.max_bytes, type=["null", "integer"], minimum=0,
                           description="end a window after this many bytes of changes (null: no limit)"),
        "max_seconds": Param(p.max_seconds, type=["null", "number"], minimum=0,
                             description="end a window after this many seconds (null: no limit)"),
    }
    with pipeline_dag(p, "incremental", __doc__, schedule=p.schedule, params=params) as dag:
        wait = PgcdcChangesSensor(
            task_id="wait_for_changes",
            slot="{{ params.slot }}",
            publications="{{ params.publication }}",
            min_bytes="{{ params.min_bytes }}",
            max_delay="{{ params.max_delay }}",
            postgres_conn_id=p.postgres_conn_id,
            deferrable=True,
            poke_interval=15,
            timeout=SENSOR_TIMEOUT.total_seconds(),
            soft_fail=True,
        )
        drain = PgcdcDrainOperator(
            task_id="drain",
            store="{{ params.store }}",
            slot="{{ params.slot }}",
            publications="{{ params.publication }}",
            sensor_task_id="wait_for_changes",
            max_rows="{{ params.max_rows }}",
            max_bytes="{{ params.max_bytes }}",
            max_seconds="{{ params.max_seconds }}",
            as_text=p.as_text,
            pii_key_conn_id=p.pii_key_conn_id,
            postgres_conn_id=p.postgres_conn_id,
            aws_conn_id=p.aws_conn_id,
        )
        merge = merge_task(p, "merge", on_failed_tables="succeed")
        check = PgcdcMergeCheckOperator(task_id="check_tables", merge_task_id="merge")
        wait >> drain >> merge >> check
        if p.max_lag_seconds is not None:  # the SLA: fails the run when a table is too far behind
            from airflow_pgcdc.operators.freshness import PgcdcFreshnessCheckOperator

            merge >> PgcdcFreshnessCheckOperator(
                task_id="freshness", store="{{ params.store }}", delta="{{ params.delta }}",
                slot="{{ params.slot }}", max_lag_seconds=p.max_lag_seconds,
                table_max_lag_seconds=p.table_max_lag_seconds, postgres_conn_id=p.postgres_conn_id,
                aws_conn_id=p.aws_conn_id)
    return dag
