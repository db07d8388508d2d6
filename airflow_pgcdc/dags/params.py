"""The params every pipeline DAG shares, with the pipeline's values as defaults (a
triggered run's conf may override them)."""

from __future__ import annotations

import datetime
from typing import Any

from airflow.sdk import Param

from airflow_pgcdc.dags.pipeline import Pipeline


def common_params(p: Pipeline, *names: str) -> dict[str, Any]:
    """``slot``, ``publication``, ``tables``, ``store``, ``delta`` (or the ``names`` given)."""
    params = {
        "slot": Param(p.slot, type="string", pattern="^[a-z0-9_]{1,63}$",
                      description="logical replication slot (created by the initial load)"),
        "publication": Param(p.publication, type="string", description="publication to stream"),
        "tables": Param(list(p.tables), type="array", description="schema.table names to publish, copy and merge"),
        "store": Param(p.store, type="string", description="change store: s3://bucket/prefix"),
        "delta": Param(p.delta, type="string", description="Delta root: s3://bucket/lake"),
    }
    return {k: params[k] for k in (names or params)}


def pipeline_dag(p: Pipeline, kind: str, doc: str, *, schedule: Any, params: dict[str, Any], **extra: Any):
    """The pipeline's DAG ``{name}_{kind}``: what every one of its DAGs shares (no catch-up,
    one run at a time, native rendering of params, the pipeline's tags, ``doc`` with
    ``{name}`` filled in); use it as ``with pipeline_dag(...) as dag:``."""
    from airflow.sdk import DAG

    return DAG(
        p.dag_id(kind),
        schedule=schedule,
        start_date=datetime.datetime(2024, 1, 1),
        catchup=False,
        max_active_runs=1,
        render_template_as_native_obj=True,
        params=params,
        tags=["pgcdc", *([p.name] if p.name != "pgcdc" else []), *p.tags],
        doc_md=doc.replace("{name}", p.name),
        **extra,
    )


def merge_task(p: Pipeline, task_id: str, *, delta: str = "{{ params.delta }}", **kwargs: Any):
    """The pipeline's Spark merge of the run's slot and store into ``delta`` (default: the
    live Delta root), on its engine and connections."""
    from airflow_pgcdc.operators.merge import PgcdcSparkMergeOperator

    kwargs.setdefault("engine", p.engine)
    kwargs.setdefault("change_data_feed", p.change_data_feed)
    kwargs.setdefault("metadata_columns", p.metadata_columns)
    kwargs.setdefault("soft_deletes", p.soft_deletes)
    kwargs.setdefault("catalog", p.catalog)
    kwargs.setdefault("catalog_prefix", p.catalog_prefix)
    kwargs.setdefault("table_options", p.table_options)
    return PgcdcSparkMergeOperator(task_id=task_id, store="{{ params.store }}", slot="{{ params.slot }}",
                                   delta=delta, aws_conn_id=p.aws_conn_id, conn_id=p.spark_conn_id, **kwargs)
