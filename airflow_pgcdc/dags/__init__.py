"""The DAG factory: a pipeline's four DAGs from its settings (:class:`Pipeline`), so a team
with several source databases writes one DAG file, not four per database.

* ``{name}_initial_load`` (triggered): publication, exported snapshot, bootstrap, verify;
* ``{name}_incremental`` (on ``schedule``): wait for changes, drain a window, merge, check;
* ``{name}_backfill`` (triggered): rebuild the Delta tables from the store and swap them
  in, or re-copy some tables from PostgreSQL (``mode=resync``);
* ``{name}_maintenance`` (on ``maintenance_schedule``): lake and store upkeep.

A DAG file::

    from airflow_pgcdc.dags import load_pipelines, register

    register(globals(), load_pipelines("/opt/airflow/dags/pipelines.yaml"))

or, in Python, ``register(globals(), [Pipeline(name="sales", slot=..., ...), ...])``. The
example DAGs in ``dags/`` are this factory applied to the sandbox's pipeline.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from typing import Any

from airflow_pgcdc.dags.pipeline import Pipeline, PipelineConfigError, load_pipelines

__all__ = ["KINDS", "Pipeline", "PipelineConfigError", "load_pipelines", "pipeline_dags", "register"]

KINDS = ("initial_load", "incremental", "backfill", "maintenance")


def pipeline_dags(p: Pipeline, kinds: Iterable[str] = KINDS) -> dict[str, Any]:
    """``{dag_id: DAG}`` for ``p``: each of ``kinds`` (default all four)."""
    import importlib

    out = {}
    for kind in kinds:
        if kind not in KINDS:
            raise PipelineConfigError(f"no DAG kind {kind!r} (kinds: {', '.join(KINDS)})")
        dag = importlib.import_module(f"airflow_pgcdc.dags.{kind}").build(p)
        out[dag.dag_id] = dag
    return out


def register(namespace: MutableMapping[str, Any], pipelines: Iterable[Pipeline],
             kinds: Iterable[str] = KINDS) -> list[str]:
    """Build every pipeline's DAGs into ``namespace`` (a DAG file's ``globals()``, where the
    DAG processor finds them); returns the DAG ids. Two pipelines may not share a name."""
    ids: list[str] = []
    names: set[str] = set()
    for p in pipelines:
        if p.name in names:
            raise PipelineConfigError(f"two pipelines are named {p.name!r}: each pipeline's DAG ids start "
                                      "with its name")
        names.add(p.name)
        dags = pipeline_dags(p, kinds)
        namespace.update(dags)
        ids += dags
    return ids
