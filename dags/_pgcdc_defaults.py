"""The example DAGs' pipeline: the embedded sandbox (``pgcdc sandbox up``), built by the
DAG factory (:mod:`airflow_pgcdc.dags`).

Connections (set them in Airflow, or as ``AIRFLOW_CONN_*`` variables; ``make demo`` and
``pgcdc sandbox env --airflow`` print them for the sandbox):

* ``pgcdc_postgres``: the source database (type ``postgres`` or ``pgcdc``; extras ``sslmode``…);
* ``pgcdc_s3``: S3 (type ``aws``: login = access key id, password = secret key,
  extras ``endpoint_url``, ``region_name``);
* ``spark_default``: Spark (type ``spark``, host ``local[*]`` for the embedded default,
  your cluster's master otherwise).

The incremental DAG's thresholds default to the DAG processor's ``PGCDC_MIN_BYTES``,
``PGCDC_MAX_DELAY``, ``PGCDC_MAX_ROWS``, ``PGCDC_MAX_BYTES`` and ``PGCDC_MAX_SECONDS`` when
set (a run's conf may still set each).
"""

import os

from airflow_pgcdc.dags import Pipeline


def _env_number(name: str, default, kind=int):
    value = os.environ.get(name, "")
    return kind(value) if value else default


DEMO = Pipeline(
    name="pgcdc",
    slot="pgcdc_demo",
    publication="pgcdc_demo_pub",
    tables=("shop.customers", "shop.orders"),
    store="s3://pgcdc/cdc",
    delta="s3://pgcdc/delta",
    postgres_conn_id="pgcdc_postgres",
    aws_conn_id="pgcdc_s3",
    spark_conn_id="spark_default",
    min_bytes=_env_number("PGCDC_MIN_BYTES", 16 << 20),
    max_delay=_env_number("PGCDC_MAX_DELAY", 600.0, float),
    max_rows=_env_number("PGCDC_MAX_ROWS", None),
    max_bytes=_env_number("PGCDC_MAX_BYTES", None),
    max_seconds=_env_number("PGCDC_MAX_SECONDS", None, float),
)
