"""Which kinds of DAG run a task of the live pipeline takes part in.

A drain (and the sensor that waits for it) reads what the replication slot holds *now*:
it cannot go back to a run's logical date or data interval. An Airflow backfill run
(``airflow backfill create``, or a backfill from the UI) of a DAG that drains would wait
for changes happening now, drain and merge them, beside the live schedule (Airflow does not
count backfill runs against ``max_active_runs``), and load nothing of the interval it is
named after. Such a run is refused by its first task, with what to use instead.
"""

from __future__ import annotations

from typing import Any

BACKFILL_RUN_TYPE = "backfill"  # DagRunType.BACKFILL (task SDK), BACKFILL_JOB (core)
INSTEAD = (
    "to load history from the store, trigger the pgcdc_backfill DAG (it rebuilds the Delta tables "
    "from the snapshot and every window the store keeps; with until_time, as they were at that time: "
    "`pgcdc rebuild --until-time <time>`); to re-copy a table from PostgreSQL, "
    "`pgcdc resync --tables <schema.table>` (or pgcdc_backfill with mode=resync; with where, only "
    "the matching rows: `pgcdc resync --where <predicate>`)"
)


def run_type(context: Any) -> str | None:
    """The run type of the task's DAG run (``scheduled``, ``manual``, ``backfill``, ...)."""
    dag_run = context.get("dag_run") if hasattr(context, "get") else None
    value = getattr(dag_run, "run_type", None)
    return None if value is None else str(getattr(value, "value", value))


def refuse_backfill_run(context: Any, task: str) -> None:
    """Fail the task, without retries, when its DAG run is an Airflow backfill run."""
    if run_type(context) != BACKFILL_RUN_TYPE:
        return
    from airflow_pgcdc.hooks.compat import AirflowFailException

    dag_run = context.get("dag_run")
    when = getattr(dag_run, "logical_date", None)
    raise AirflowFailException(
        f"{task} reads the changes the replication slot holds now and cannot load the past: this is an "
        f"Airflow backfill run (run {getattr(dag_run, 'run_id', '?')}, logical date {when}), refused; "
        f"{INSTEAD}"
    )
