"""``pgcdc_incremental``: every 5 minutes, wait for changes (deferrable sensor) → drain
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
window within ``SENSOR_TIMEOUT``) is skipped, not failed.

Backfill: a run drains what the slot holds when it runs, whatever its logical date, so an
Airflow backfill of this DAG (``airflow backfill create``) could load nothing of the
intervals it names: its first task refuses each backfill run, pointing to ``pgcdc_backfill``
(rebuild the Delta tables from the store) and ``pgcdc resync`` (re-copy a table).

Thresholds (DAG params, so a run's conf can set them; their defaults come from the DAG
processor's environment, then the values that suit a busy source): ``min_bytes``
(``PGCDC_MIN_BYTES``: pending WAL that makes a window worth it, default 16 MiB),
``max_delay`` (``PGCDC_MAX_DELAY``: seconds the oldest change may wait, default 600),
``max_rows`` / ``max_bytes`` / ``max_seconds`` (``PGCDC_MAX_ROWS`` / ``PGCDC_MAX_BYTES`` /
``PGCDC_MAX_SECONDS``: window limits, default none).
Params (defaults: the embedded sandbox): ``slot``, ``publication``, ``tables``
(unused here: every published table is merged), ``store``, ``delta``.
"""

from __future__ import annotations

import datetime
import os

from _pgcdc_defaults import AWS_CONN_ID, PARAMS, POSTGRES_CONN_ID, SPARK_CONN_ID
from airflow.sdk import DAG, Param

from airflow_pgcdc.operators.drain import PgcdcDrainOperator
from airflow_pgcdc.operators.merge import PgcdcMergeCheckOperator, PgcdcSparkMergeOperator
from airflow_pgcdc.sensors.changes import PgcdcChangesSensor


def _env_number(name: str, default, kind=int):
    value = os.environ.get(name, "")
    return kind(value) if value else default


SENSOR_TIMEOUT = datetime.timedelta(minutes=4)

with DAG(
    "pgcdc_incremental",
    schedule=datetime.timedelta(minutes=5),
    start_date=datetime.datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    render_template_as_native_obj=True,
    params={
        **PARAMS,
        "min_bytes": Param(_env_number("PGCDC_MIN_BYTES", 16 << 20), type="integer", minimum=0,
                           description="pending WAL (bytes) that makes a window worth draining"),
        "max_delay": Param(_env_number("PGCDC_MAX_DELAY", 600.0, float), type=["null", "number"], minimum=0,
                           description="seconds the oldest change may wait (null: no limit)"),
        "max_rows": Param(_env_number("PGCDC_MAX_ROWS", None), type=["null", "integer"], minimum=0,
                          description="end a window after this many change rows (null: no limit)"),
        "max_bytes": Param(_env_number("PGCDC_MAX_BYTES", None), type=["null", "integer"], minimum=0,
                           description="end a window after this many bytes of changes (null: no limit)"),
        "max_seconds": Param(_env_number("PGCDC_MAX_SECONDS", None, float), type=["null", "number"], minimum=0,
                             description="end a window after this many seconds (null: no limit)"),
    },
    tags=["pgcdc"],
    doc_md=__doc__,
) as dag:
    wait = PgcdcChangesSensor(
        task_id="wait_for_changes",
        slot="{{ params.slot }}",
        publication="{{ params.publication }}",
        min_bytes="{{ params.min_bytes }}",
        max_delay="{{ params.max_delay }}",
        postgres_conn_id=POSTGRES_CONN_ID,
        deferrable=True,
        poke_interval=15,
        timeout=SENSOR_TIMEOUT.total_seconds(),
        soft_fail=True,
    )
    drain = PgcdcDrainOperator(
        task_id="drain",
        store="{{ params.store }}",
        slot="{{ params.slot }}",
        publication="{{ params.publication }}",
        sensor_task_id="wait_for_changes",
        max_rows="{{ params.max_rows }}",
        max_bytes="{{ params.max_bytes }}",
        max_seconds="{{ params.max_seconds }}",
        postgres_conn_id=POSTGRES_CONN_ID,
        aws_conn_id=AWS_CONN_ID,
    )
    merge = PgcdcSparkMergeOperator(
        task_id="merge",
        store="{{ params.store }}",
        slot="{{ params.slot }}",
        delta="{{ params.delta }}",
        aws_conn_id=AWS_CONN_ID,
        conn_id=SPARK_CONN_ID,
        on_failed_tables="succeed",
    )
    check = PgcdcMergeCheckOperator(task_id="check_tables", merge_task_id="merge")
    wait >> drain >> merge >> check
