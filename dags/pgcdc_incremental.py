"""``pgcdc_incremental``: the sandbox pipeline's incremental DAG, built by the DAG factory
(:mod:`airflow_pgcdc.dags.incremental`, whose docstring is the DAG's documentation)."""

from _pgcdc_defaults import DEMO

from airflow_pgcdc.dags import pipeline_dags

globals().update(pipeline_dags(DEMO, ["incremental"]))
