"""``pgcdc maintain``: upkeep of a slot's Delta tables and change store (no Airflow, no Spark).

The job is :mod:`.job`; this face re-exports its names."""

from airflow_pgcdc.maintain import job as _job
from airflow_pgcdc.maintain.job import *  # noqa: F403 - the face: every public name of the job

__all__ = list(_job.__all__)
