"""The params every pipeline DAG shares, with the pipeline's values as defaults (a
triggered run's conf may override them)."""

from __future__ import annotations

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


def dag_tags(p: Pipeline) -> list[str]:
    return ["pgcdc", *([p.name] if p.name != "pgcdc" else []), *p.tags]
