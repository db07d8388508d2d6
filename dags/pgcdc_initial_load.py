"""``pgcdc_initial_load``: ensure publication → exported snapshot to S3 → Spark bootstrap
of the Delta tables → verify.

Run it once per slot (the snapshot refuses to run twice on a slot that has a committed
snapshot). Params (defaults: the embedded sandbox, see ``_pgcdc_defaults``): ``slot``,
``publication``, ``tables``, ``store``, ``delta``, ``workers`` (snapshot connections),
``verify`` (compare each Delta table with PostgreSQL at the end: meaningful when the
source is quiet, as in the demo; a busy source differs by the changes since the snapshot).
"""

from __future__ import annotations

import datetime

from _pgcdc_defaults import AWS_CONN_ID, PARAMS, POSTGRES_CONN_ID, SPARK_CONN_ID
from airflow.sdk import DAG, Param, task

from airflow_pgcdc.operators.merge import PgcdcSparkMergeOperator
from airflow_pgcdc.operators.snapshot import PgcdcSnapshotOperator
from airflow_pgcdc.operators.verify import PgcdcVerifyOperator

with DAG(
    "pgcdc_initial_load",
    schedule=None,
    start_date=datetime.datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    render_template_as_native_obj=True,
    params={
        **PARAMS,
        "workers": Param(2, type="integer", minimum=1, description="snapshot worker connections"),
        "verify": Param(True, type="boolean", description="verify Delta = PostgreSQL at the end"),
    },
    tags=["pgcdc"],
    doc_md=__doc__,
) as dag:

    @task
    def ensure_publication(params=None) -> dict:
        """Create the publication, or add the tables it lacks (never narrows it)."""
        import psycopg

        from airflow_pgcdc.hooks.pgcdc import PgcdcHook
        from airflow_pgcdc.pg.publications import ensure_publication as ensure

        dsn = PgcdcHook(POSTGRES_CONN_ID).get_dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            done = ensure(conn, params["publication"], list(params["tables"]))
        return done.to_dict()

    snapshot = PgcdcSnapshotOperator(
        task_id="snapshot",
        store="{{ params.store }}",
        slot="{{ params.slot }}",
        publication="{{ params.publication }}",
        workers="{{ params.workers }}",
        postgres_conn_id=POSTGRES_CONN_ID,
        aws_conn_id=AWS_CONN_ID,
    )

    bootstrap = PgcdcSparkMergeOperator(
        task_id="bootstrap",
        store="{{ params.store }}",
        slot="{{ params.slot }}",
        delta="{{ params.delta }}",
        aws_conn_id=AWS_CONN_ID,
        conn_id=SPARK_CONN_ID,
    )

    verify = PgcdcVerifyOperator(
        task_id="verify",
        delta="{{ params.delta }}",
        tables="{{ params.tables if params.verify else [] }}",
        postgres_conn_id=POSTGRES_CONN_ID,
        aws_conn_id=AWS_CONN_ID,
    )

    ensure_publication() >> snapshot >> bootstrap >> verify
