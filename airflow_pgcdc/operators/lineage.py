"""OpenLineage for the operators (``get_openlineage_facets_on_complete``), as the official
providers give it: datasets named by OpenLineage's naming spec, PostgreSQL tables as
``postgres://{host}:{port}`` / ``{database}.{schema}.{table}``, S3 objects as ``s3://{bucket}``
/ ``{key prefix}``. Without the OpenLineage provider (the ``openlineage`` extra) every call
here returns None and the operators emit nothing."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["ReportsLineage", "delta_table", "lineage", "lineage_of", "postgres_tables", "s3_dataset"]


def _facets():
    try:
        from airflow.providers.common.compat.openlineage.facet import (
            InputDataset,
            OutputDataset,
            OutputStatisticsOutputDatasetFacet,
            SchemaDatasetFacet,
            SchemaDatasetFacetFields,
        )
        from airflow.providers.openlineage.extractors import OperatorLineage
    except ImportError:  # the provider is not installed: no lineage
        return None
    return {"InputDataset": InputDataset, "OutputDataset": OutputDataset, "OperatorLineage": OperatorLineage,
            "OutputStatistics": OutputStatisticsOutputDatasetFacet, "Schema": SchemaDatasetFacet,
            "SchemaField": SchemaDatasetFacetFields}


def _s3_name(url: str) -> tuple[str, str]:
    from airflow_pgcdc.store.s3 import S3Location

    loc = S3Location.parse(url.replace("s3a://", "s3://", 1))
    return f"s3://{loc.bucket}", loc.prefix.strip("/") or "/"


def postgres_tables(dsn: str, tables: Iterable[str]) -> list[dict[str, str]]:
    """The datasets of ``schema.table`` names read through ``dsn`` (its host, port and
    database only: never a password)."""
    from psycopg.conninfo import conninfo_to_dict

    info = conninfo_to_dict(dsn)
    host = str(info.get("host") or "localhost").split(",")[0]
    port = str(info.get("port") or "5432").split(",")[0]
    db = info.get("dbname") or info.get("user") or "postgres"
    return [{"namespace": f"postgres://{host}:{port}", "name": f"{db}.{t}"} for t in sorted(set(tables))]


def s3_dataset(url: str, *, rows: int | None = None, size: int | None = None) -> dict[str, Any]:
    namespace, name = _s3_name(url)
    return {"namespace": namespace, "name": name, "rows": rows, "size": size}


def delta_table(url: str, *, rows: int | None = None, storage_options: Mapping[str, str] | None = None
                ) -> dict[str, Any]:
    """A Delta table's dataset, with its schema (read with delta-rs: what the table holds
    whichever engine committed) when it can be read."""
    out = s3_dataset(url, rows=rows)
    try:
        from deltalake import DeltaTable

        fields = DeltaTable(url, storage_options=dict(storage_options or {})).schema().to_arrow()
        out["schema"] = [(f.name, str(f.type)) for f in fields]
    except Exception:  # noqa: BLE001 - lineage never fails a task: the dataset goes without its schema
        pass
    return out


def lineage(inputs: Iterable[Mapping[str, Any]], outputs: Iterable[Mapping[str, Any]]):
    """An ``OperatorLineage`` of these datasets (dicts from the functions above), or None."""
    f = _facets()
    if f is None:
        return None

    def out(d: Mapping[str, Any]):
        facets = {}
        if d.get("schema"):
            facets["schema"] = f["Schema"](fields=[f["SchemaField"](name=n, type=t) for n, t in d["schema"]])
        stats = {}
        if d.get("rows") is not None or d.get("size") is not None:
            stats["outputStatistics"] = f["OutputStatistics"](rowCount=d.get("rows"), size=d.get("size"))
        return f["OutputDataset"](namespace=d["namespace"], name=d["name"], facets=facets, outputFacets=stats)

    return f["OperatorLineage"](
        inputs=[f["InputDataset"](namespace=d["namespace"], name=d["name"]) for d in inputs],
        outputs=[out(d) for d in outputs])


def lineage_of(operator, build) -> Any:
    """``lineage(*build())`` for ``operator``'s run (``build``: what its ``execute`` left, a
    callable giving ``(inputs, outputs)`` or None), or None: lineage is built only when the
    listener asks, and a failure to build it is logged, never raised into the task."""
    if build is None or _facets() is None:
        return None
    try:
        found = build()
        return lineage(*found) if found else None
    except Exception as exc:  # noqa: BLE001 - lineage is a report: the task's work is done
        operator.log.warning("no OpenLineage datasets for this run: %s: %s", type(exc).__name__, exc)
        return None


class ReportsLineage:
    """An operator whose ``execute`` leaves ``self._lineage`` (a callable giving ``(inputs,
    outputs)``): OpenLineage's listener gets them on completion (:func:`lineage_of`: built
    only when it asks, and never failing the task)."""

    def get_openlineage_facets_on_complete(self, task_instance):
        return lineage_of(self, getattr(self, "_lineage", None))
