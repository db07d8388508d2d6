"""``{name}_maintenance``: daily lake upkeep (``pgcdc maintain``): compaction of the small
files the merges leave, VACUUM of the files older than the retention, a Delta log
checkpoint and log cleanup, per Delta table of the slot; then the parts of the change
windows every table merged (and older than the retention) are removed from the store, and
old merge staging debris.

It runs alongside ``{name}_incremental``: a merge that loses a commit race to the
compaction commits nothing and is merged by the next run (its windows stay pending), so
nothing is lost or doubled. ``max_active_runs=1`` (and ``max_active_tis_per_dag=1`` on
the task, for manual runs) keep it from racing itself. Params: ``slot``, ``store``,
``delta``, ``retention_hours`` (default the pipeline's, 168: time travel reaches a week
back; a rebuild from the store needs every window since the snapshot: see
``{name}_backfill``), ``zorder``.
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG, Param

from airflow_pgcdc.dags.params import common_params, pipeline_dag
from airflow_pgcdc.dags.pipeline import Pipeline
from airflow_pgcdc.operators.maintain import PgcdcMaintainOperator


def build(p: Pipeline) -> DAG:
    params = {
        **common_params(p, "slot", "store", "delta"),
        "retention_hours": Param(p.retention_hours, type="number", minimum=0,
                                 description="keep removed Delta files and merged windows this long"),
        "zorder": Param(False, type="boolean", description="Z-order on the key columns (rewrites every file)"),
    }
    with pipeline_dag(p, "maintenance", __doc__, schedule=p.maintenance_schedule, params=params) as dag:
        PgcdcMaintainOperator(
            task_id="maintain",
            store="{{ params.store }}",
            slot="{{ params.slot }}",
            delta="{{ params.delta }}",
            retention_hours="{{ params.retention_hours }}",
            zorder="{{ params.zorder }}",
            aws_conn_id=p.aws_conn_id,
            max_active_tis_per_dag=1,
            execution_timeout=datetime.timedelta(hours=6),
        )
    return dag
