"""``pgcdc verify``: does a Delta table hold exactly what its PostgreSQL table holds?

The job is :mod:`.job`; this face re-exports its names."""

from airflow_pgcdc.verify import job as _job
from airflow_pgcdc.verify.job import *  # noqa: F403 - the face: every public name of the job

__all__ = list(_job.__all__)
