"""The DAG runner of the tests: :mod:`airflow_pgcdc.dagrun` (shared with ``make demo``)."""

from airflow_pgcdc.dagrun import DagRunResult, airflow_env, migrate, run_dag

__all__ = ["DagRunResult", "airflow_env", "migrate", "run_dag"]
