"""``PgcdcResyncOperator``: copy some tables again (or for the first time) while the
pipeline runs (:mod:`airflow_pgcdc.snapshot.resync`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from airflow.sdk import Asset, BaseOperator

from airflow_pgcdc.hooks.pgcdc import PgcdcHook
from airflow_pgcdc.operators.assets import default_outlets, emit
from airflow_pgcdc.operators.lineage import ReportsLineage
from airflow_pgcdc.operators.metrics import resync_metrics
from airflow_pgcdc.operators.renamed import renamed_argument
from airflow_pgcdc.operators.values import number, options_or_fields


def resync_asset(to: str, slot: str) -> Asset:
    """The Asset a resync of tables of ``slot`` under ``to`` (s3://bucket/prefix) updates."""
    return Asset(uri=f"{to.rstrip('/')}/{slot}/resync", name=f"pgcdc-resync-{slot}")


class PgcdcResyncOperator(ReportsLineage, BaseOperator):
    """Take a fresh snapshot of ``tables`` for the pipeline of ``slot`` while its drains and
    merges go on (a table added to the publication later, or one to rebuild); the next
    merge replaces those Delta tables from it and applies only the later changes.

    Pushes ``{"slot", "resync_slot", "consistent_point", "manifest", "rows",
    "tables": {"schema.table": {"rows", "parts"}}}`` and an Asset event on
    ``s3://bucket/prefix/<slot>/resync`` with ``{consistent_point, tables}`` as extra.

    :param store: the pipeline's store, ``s3://bucket/prefix`` (templated)
    :param slot: the pipeline's replication slot (templated)
    :param publications: the publication(s) the drains use; the tables must be in them
        (templated; ``publication``: its 0.2 name, warns)
    :param tables: ``["schema.table", ...]`` (templated)
    :param workers: parallel COPY sessions (default 4)
    :param pii_key_conn_id: Airflow connection whose password is the hash key of the slot's
        column rules (default: the worker's ``PGCDC_PII_KEY``) (templated)
    :param as_text: ``{"schema.table": ["column", ...]}``: columns kept as their exact
        PostgreSQL text whatever their type (templated; give the drain the same)
    :param options: the resync's options whole, a
        :class:`~airflow_pgcdc.snapshot.options.ResyncOptions` or a mapping of its fields
        (templated), instead of ``tables``, ``workers``, ``rows_per_part``, ``as_text`` and ``where``
    :param postgres_conn_id: Airflow ``postgres`` connection
    :param aws_conn_id: Airflow ``aws`` connection; ``None``: boto3's environment
    """

    template_fields: Sequence[str] = ("store", "slot", "publications", "tables", "workers", "rows_per_part", "as_text", "pii_key_conn_id",
                                      "postgres_conn_id", "aws_conn_id", "where", "options")
    ui_color = "#d6eaf8"

    def __init__(
        self,
        *,
        store: str | None = None,
        slot: str,
        publications: str | Sequence[str] | None = None,
        tables: Sequence[str] | str | None = None,
        workers: int | None = None,
        rows_per_part: int | None = None,
        as_text: dict[str, Sequence[str]] | None = None,
        pii_key_conn_id: str | None = None,
        where: str | None = None,
        options: Any = None,
        postgres_conn_id: str = PgcdcHook.default_conn_name,
        aws_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        store = renamed_argument(kwargs, "to", "store", store, "PgcdcResyncOperator")
        publications = renamed_argument(kwargs, "publication", "publications", publications, "PgcdcResyncOperator",
                                        required="the publication(s) the drains use")
        options_or_fields("PgcdcResyncOperator", options, tables=tables, workers=workers,
                          rows_per_part=rows_per_part, as_text=as_text, where=where)
        if "outlets" not in kwargs:
            kwargs["outlets"] = default_outlets("resync", store, slot, resync_asset)
        super().__init__(**kwargs)
        self.store = store
        self.slot = slot
        self.publications = publications
        self.tables = tables
        self.workers = workers
        self.rows_per_part = rows_per_part
        self.as_text = as_text
        self.pii_key_conn_id = pii_key_conn_id
        self.where = where  # a slice resync (pgcdc resync --where): the rows to copy again
        self.options = options
        self.postgres_conn_id = postgres_conn_id
        self.aws_conn_id = aws_conn_id

    def execute(self, context) -> dict[str, Any]:
        from airflow_pgcdc.snapshot.options import ResyncOptions
        from airflow_pgcdc.snapshot.resync import resync_tables

        tables = [self.tables] if isinstance(self.tables, str) else (list(self.tables) if self.tables else None)
        options = options_or_fields(
            "PgcdcResyncOperator", self.options, ResyncOptions, tables=tables,
            workers=number(self.workers, int, "workers", minimum=1),
            rows_per_part=number(self.rows_per_part, int, "rows_per_part", minimum=1), as_text=self.as_text or None,
            where=None if self.where in (None, "", "None") else str(self.where))
        hook = PgcdcHook(self.postgres_conn_id, self.aws_conn_id)
        self.log.info("resync of %s from %s into %s, slot %s", list(options.tables), hook.safe_dsn(), self.store,
                      self.slot)
        t0 = time.monotonic()
        with hook.pii_key(self.pii_key_conn_id):  # the slot's column rules apply to the copy
            done = resync_tables(hook.get_dsn(), self.store, slot=self.slot, publications=self.publications,
                                 options=options, s3=hook.s3_client())
        m = done.manifest
        from airflow_pgcdc.operators.lineage import postgres_tables, s3_dataset

        dsn, url = hook.get_dsn(), done.url
        self._lineage = lambda: (postgres_tables(dsn, [f"{t.schema}.{t.table}" for t in m.tables]),
                                 [s3_dataset(url.rsplit("/", 1)[0] if url.endswith(".json") else url, rows=m.rows,
                                             size=m.bytes)])
        result = {
            "slot": self.slot,
            "resync_slot": done.resync_slot,
            "consistent_point": m.consistent_point,
            "manifest": done.url,
            "rows": m.rows,
            "where": options.where,
            "tables": {f"{t.schema}.{t.table}": {"rows": t.rows, "parts": len(t.parts)} for t in m.tables},
        }
        emit(self, context, resync_asset(self.store, self.slot), {
            "consistent_point": m.consistent_point, "tables": sorted(result["tables"]),
        })
        resync_metrics(self.slot, result, time.monotonic() - t0)
        return result

