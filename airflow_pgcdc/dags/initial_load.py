"""``{name}_initial_load``: ensure publication → exported snapshot to S3 → Spark bootstrap
of the Delta tables → verify.

Run it once per slot (the snapshot refuses to run twice on a slot that has a committed
snapshot). Params (defaults: the pipeline's settings): ``slot``, ``publication``,
``tables``, ``store``, ``delta``, ``workers`` (snapshot connections), ``verify`` (compare
each Delta table with PostgreSQL at the end: meaningful when the source is quiet, as in
the demo; a busy source differs by the changes since the snapshot).
"""

from __future__ import annotations

from airflow.sdk import DAG, Param, task

from airflow_pgcdc.dags.params import common_params, merge_task, pipeline_dag
from airflow_pgcdc.dags.pipeline import Pipeline
from airflow_pgcdc.operators.snapshot import PgcdcSnapshotOperator
from airflow_pgcdc.operators.verify import PgcdcVerifyOperator


def build(p: Pipeline) -> DAG:
    params = {
        **common_params(p),
        "workers": Param(p.workers, type="integer", minimum=1, description="snapshot worker connections"),
        "verify": Param(True, type="boolean", description="verify Delta = PostgreSQL at the end"),
    }
    with pipeline_dag(p, "initial_load", __doc__, schedule=None, params=params) as dag:

        @task
        def ensure_publication(params=None) -> dict:
            """Create the publication, or add the tables it lacks (never narrows it)."""
            import psycopg

            from airflow_pgcdc.hooks.pgcdc import PgcdcHook
            from airflow_pgcdc.pg.publications import ensure_publication as ensure

            dsn = PgcdcHook(p.postgres_conn_id).get_dsn()
            with psycopg.connect(dsn, autocommit=True) as conn:
                done = ensure(conn, params["publication"], list(params["tables"]))
            return done.to_dict()

        snapshot = PgcdcSnapshotOperator(
            task_id="snapshot",
            store="{{ params.store }}",
            slot="{{ params.slot }}",
            publications="{{ params.publication }}",
            workers="{{ params.workers }}",
            as_text=p.as_text,
            pii=p.pii,
            pii_key_conn_id=p.pii_key_conn_id,
            postgres_conn_id=p.postgres_conn_id,
            aws_conn_id=p.aws_conn_id,
        )
        bootstrap = merge_task(p, "bootstrap")
        verify = PgcdcVerifyOperator(
            task_id="verify",
            delta="{{ params.delta }}",
            tables="{{ params.tables if params.verify else [] }}",
            store="{{ params.store }}",
            slot="{{ params.slot }}",
            pii_key_conn_id=p.pii_key_conn_id,
            postgres_conn_id=p.postgres_conn_id,
            aws_conn_id=p.aws_conn_id,
        )
        ensure_publication() >> snapshot >> bootstrap >> verify
    return dag
