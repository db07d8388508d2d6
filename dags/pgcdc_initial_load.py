"""``pgcdc_initial_load``: the sandbox pipeline's initial_load DAG, built by the DAG factory
(:mod:`airflow_pgcdc.dags.initial_load`, whose docstring is the DAG's documentation)."""

from _pgcdc_defaults import DEMO

from airflow_pgcdc.dags import pipeline_dags

globals().update(pipeline_dags(DEMO, ["initial_load"]))
