"""``pgcdc_backfill``: rebuild Delta tables from S3 (the snapshot, then every committed
window) into a fresh location, optionally verify, then swap them in.

When: a Delta table was damaged or deleted, a merge bug was fixed, or a table's layout
must change. The change store is the source of truth: the snapshot plus the windows,
which the drain never deletes, replay the whole history of the slot.

Consistency rule: the rebuilt table equals the source as of its last merged window's
``end_lsn`` (the job refuses gaps, as always). The swap is one overwrite commit on the
live table carrying the rebuilt table's app transaction version: readers see the old
contents or the new, never a mix, and time travel keeps the old versions. Windows the
live table merged while the rebuild ran are merged again by the next ``pgcdc_incremental``
run (merging is idempotent per key, and windows are applied in order).

Mode ``resync`` (``params.mode``): copy ``tables`` again from PostgreSQL while the slot
keeps streaming (``PgcdcResyncOperator``: a temporary slot's exported snapshot), then
merge them into the live root: each Delta table is replaced from the copy in one commit
and gets only the changes committed after it. For a table added to the publication after
the initial load (add it to the publication first), or one whose history in the store
cannot rebuild it. The other params of the rebuild mode are ignored.

Params: ``mode`` (``rebuild``, the default, or ``resync``), ``tables`` (which tables;
default all of the slot; ``resync`` needs them), ``store``, ``slot``,
``delta`` (the live root), ``rebuild_root`` (default ``{delta}_rebuild``; each run
builds under ``{rebuild_root}/{ts_nodash}``), ``max_windows`` (stop after N windows;
null: all), ``verify`` (compare the rebuilt tables with PostgreSQL: only meaningful on a
quiet source), ``swap`` (default true).
"""

from __future__ import annotations

import datetime

from _pgcdc_defaults import AWS_CONN_ID, PARAMS, POSTGRES_CONN_ID, SPARK_CONN_ID
from airflow.sdk import DAG, Param, task

from airflow_pgcdc.operators.merge import PgcdcSparkMergeOperator
from airflow_pgcdc.operators.resync import PgcdcResyncOperator
from airflow_pgcdc.operators.verify import PgcdcVerifyOperator

REBUILT = "{{ (params.rebuild_root or params.delta ~ '_rebuild') ~ '/' ~ ts_nodash }}"

with DAG(
    "pgcdc_backfill",
    schedule=None,
    start_date=datetime.datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    render_template_as_native_obj=True,
    params={
        **PARAMS,
        "mode": Param("rebuild", enum=["rebuild", "resync"],
                      description="rebuild from the store, or resync the tables from PostgreSQL"),
        "rebuild_root": Param(None, type=["null", "string"],
                              description="where to rebuild (default {delta}_rebuild)"),
        "max_windows": Param(None, type=["null", "integer"], minimum=0,
                             description="merge at most N windows (null: all)"),
        "verify": Param(False, type="boolean", description="verify the rebuilt tables (quiet source only)"),
        "swap": Param(True, type="boolean", description="swap the rebuilt tables in"),
    },
    tags=["pgcdc"],
    doc_md=__doc__,
) as dag:
    @task.branch
    def choose(params=None) -> str:
        return "resync" if params["mode"] == "resync" else "rebuild"

    resync = PgcdcResyncOperator(
        task_id="resync",
        store="{{ params.store }}",
        slot="{{ params.slot }}",
        publication="{{ params.publication }}",
        tables="{{ params.tables }}",
        postgres_conn_id=POSTGRES_CONN_ID,
        aws_conn_id=AWS_CONN_ID,
    )
    merge_resynced = PgcdcSparkMergeOperator(
        task_id="merge_resynced",
        store="{{ params.store }}",
        slot="{{ params.slot }}",
        delta="{{ params.delta }}",
        tables="{{ params.tables }}",
        aws_conn_id=AWS_CONN_ID,
        conn_id=SPARK_CONN_ID,
    )
    rebuild = PgcdcSparkMergeOperator(
        task_id="rebuild",
        store="{{ params.store }}",
        slot="{{ params.slot }}",
        delta=REBUILT,
        tables="{{ params.tables }}",
        max_windows="{{ params.max_windows }}",
        aws_conn_id=AWS_CONN_ID,
        conn_id=SPARK_CONN_ID,
    )
    verify = PgcdcVerifyOperator(
        task_id="verify",
        delta=REBUILT,
        tables="{{ params.tables if params.verify else [] }}",
        postgres_conn_id=POSTGRES_CONN_ID,
        aws_conn_id=AWS_CONN_ID,
    )

    @task
    def swap(merge_result: dict, params=None, ts_nodash=None) -> list[dict]:
        """One overwrite commit per live table from its rebuilt table."""
        from airflow_pgcdc.hooks.pgcdc import PgcdcHook
        from airflow_pgcdc.merge import deltars
        from airflow_pgcdc.store.s3 import delta_storage_options

        if not params["swap"]:
            return []
        storage = delta_storage_options(PgcdcHook(POSTGRES_CONN_ID, AWS_CONN_ID).s3_settings())
        out = []
        for t in merge_result["tables"]:
            segment = t["delta_url"].rstrip("/").rsplit("/", 1)[1]  # {schema}.{table}, encoded
            out.append(deltars.swap(
                t["delta_url"], params["delta"].rstrip("/") + "/" + segment,
                app=t["app_id"], storage_options=storage,
                metadata={"pgcdc.swapped_from": t["delta_url"], "pgcdc.backfill": ts_nodash},
            ))
        return out

    branch = choose()
    branch >> resync >> merge_resynced
    branch >> rebuild >> verify >> swap(rebuild.output)
