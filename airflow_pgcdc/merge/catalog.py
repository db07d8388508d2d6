"""The merge's step that keeps a Hive Metastore in step with the Delta tables (``--catalog``,
:mod:`airflow_pgcdc.lake.catalog`): after the tables are merged, each one that has a Delta
table is registered, or its entry brought up to date (columns added, the table gone from the
pipeline, a rebuild's or resync's table swapped in at the same place). A table that failed is
left as its entry was. The metastore is written only where an entry differs."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import pyarrow as pa

from airflow_pgcdc.lake.catalog import CatalogError, Metastore, catalog_names, table_entry
from airflow_pgcdc.lake.inspect import open_table
from airflow_pgcdc.merge.context import JobContext
from airflow_pgcdc.merge.options import TableResult

__all__ = ["NO_TABLE", "catalog_failure", "register_tables", "sync_catalog"]

log = logging.getLogger("airflow_pgcdc.merge.job")

NO_TABLE = frozenset({"failed", "skipped"})
"""A table result's actions that leave no Delta table to register."""


def sync_catalog(ctx: JobContext, names: Sequence[tuple[str, str]], results: Sequence[TableResult]) -> dict[str, str]:
    """Register the tables of ``results`` (``names``: their ``(schema, table)``, in the same
    order) in the job's metastore (:func:`register_tables`)."""
    return register_tables(ctx.options, ctx.slot, ctx.storage, [
        (schema, table, res.delta_url, res.left_pipeline)
        for (schema, table), res in zip(names, results, strict=True) if res.action not in NO_TABLE])


def register_tables(options, slot: str, storage: dict[str, str],
                    tables: Iterable[tuple[str, str, str, bool]]) -> dict[str, str]:
    """Register ``tables`` (``(schema, table, Delta URL, left the pipeline)``) in the metastore
    ``options.catalog`` (a :class:`~.options.MergeOptions`); ``{"db.table":
    created|updated|unchanged}``. Raises :class:`~airflow_pgcdc.lake.catalog.CatalogError`."""
    o = options
    entries = []
    for schema, table, url, left in tables:
        dt = open_table(url, storage)
        if dt is None:
            continue
        qualified = f"{schema}.{table}"
        db, name = catalog_names(schema, table, prefix=o.catalog_prefix,
                                 given=o.table_options.get(qualified, {}).get("catalog_name"))
        params = {"pgcdc.slot": slot, "pgcdc.source_schema": schema, "pgcdc.source_table": table}
        if left:
            params["pgcdc.left_pipeline"] = "true"
        entries.append(table_entry(db, name, url, pa.schema(dt.schema().to_arrow()), params))
    with Metastore(o.catalog) as metastore:
        done = metastore.register(entries)
    changed = {k: v for k, v in done.items() if v != "unchanged"}
    log.info("catalog %s: %d table(s) registered, %d unchanged%s", o.catalog, len(changed), len(done) - len(changed),
             "".join(f"; {k} {v}" for k, v in sorted(changed.items())[:20]))
    return done


def catalog_failure(exc: CatalogError) -> dict[str, str]:
    """What a result's ``catalog`` says when the metastore was not brought up to date."""
    return {"error": f"{type(exc).__name__}: {exc}"}
