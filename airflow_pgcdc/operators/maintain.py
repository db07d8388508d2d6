"""``PgcdcMaintainOperator``: lake upkeep of a slot's Delta tables and change store
(:mod:`airflow_pgcdc.maintain`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator

from airflow_pgcdc.hooks.pgcdc import PgcdcHook
from airflow_pgcdc.operators.lineage import ReportsLineage
from airflow_pgcdc.operators.metrics import maintain_metrics
from airflow_pgcdc.operators.renamed import renamed_argument
from airflow_pgcdc.operators.values import flag, number, rendered_options


class PgcdcMaintainOperator(ReportsLineage, BaseOperator):
    """Compact, vacuum and checkpoint every Delta table of ``slot`` under ``delta`` (each on
    its own), then remove the parts of the change windows every table has merged and old
    merge staging (``pgcdc maintain``). No Spark, no PostgreSQL: delta-rs and S3 only.

    Pushes the result (per table: files and bytes before/after, compaction, vacuum and log
    figures, app transaction versions; the windows expired and kept, with why; staging
    debris; ``bytes_removed``). Fails naming the tables that failed, after maintaining the
    others. Run it at most once at a time per slot (``max_active_runs=1`` or a pool of one
    slot): two at once are safe for the Delta tables (conflict checks) but waste work.

    :param store: the store, ``s3://bucket/prefix`` (templated)
    :param slot: the pipeline's replication slot (templated)
    :param delta: the Delta root (templated)
    :param tables: only these ``schema.table`` Delta tables (templated; default all)
    :param retention_hours: how long removed files, merged windows and staging are kept
        (default 168; below it a warning: time travel and running readers of older versions break)
    :param zorder: Z-order each table on its key columns instead of plain compaction
    :param dry_run: report, remove nothing
    :param aws_conn_id: Airflow ``aws`` connection; ``None``: boto3's environment
    """

    template_fields: Sequence[str] = ("store", "slot", "delta", "tables", "retention_hours", "zorder", "aws_conn_id",
                                      "options")
    ui_color = "#e8f6f3"

    def __init__(
        self,
        *,
        store: str | None = None,
        slot: str,
        delta: str,
        tables: Sequence[str] | str | None = None,
        retention_hours: float | None = None,
        zorder: bool = False,
        dry_run: bool = False,
        options: Any = None,
        aws_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        store = renamed_argument(kwargs, "source", "store", store, "PgcdcMaintainOperator")
        super().__init__(**kwargs)
        self.store = store
        self.slot = slot
        self.delta = delta
        self.tables = tables
        self.retention_hours = retention_hours
        self.zorder = zorder
        self.dry_run = dry_run
        # upkeep's options as one MaintainOptions or dict (templated), instead of the fields above
        self.options = options
        given = [n for n, v in (("tables", tables), ("retention_hours", retention_hours), ("zorder", zorder),
                                ("dry_run", dry_run)) if v not in (None, False)]
        if options is not None and given:
            raise ValueError(f"give options or upkeep's fields ({', '.join(given)}), not both")
        self.aws_conn_id = aws_conn_id

    def execute(self, context) -> dict[str, Any]:
        from airflow_pgcdc.maintain import TablesFailed, maintain_slot

        tables = [self.tables] if isinstance(self.tables, str) else (list(self.tables) if self.tables else None)
        settings = PgcdcHook(aws_conn_id=self.aws_conn_id).s3_settings()
        retention = number(self.retention_hours, float, "retention_hours", minimum=0)
        from airflow_pgcdc.maintain.options import MaintainOptions

        options = rendered_options(self.options, MaintainOptions) or MaintainOptions.of(
            tables=tables, retention_hours=retention, zorder=flag(self.zorder, "zorder"),
            dry_run=flag(self.dry_run, "dry_run"))
        try:
            result = maintain_slot(store=self.store, slot=self.slot, delta=self.delta, options=options,
                                   s3=settings).to_dict()
        except TablesFailed as e:
            self.log.error("maintain result: %s", e.result.to_dict())
            maintain_metrics(self.slot, e.result.to_dict())
            raise
        self.log.info("removed %d bytes; windows expired %s", result["bytes_removed"], result["windows"].get("expired"))
        maintain_metrics(self.slot, result)
        from airflow_pgcdc.operators.lineage import delta_table, s3_dataset
        from airflow_pgcdc.store.s3 import delta_storage_options

        rewritten = [t["url"] for t in result["tables"] if t.get("version_after") != t.get("version_before")]
        self._lineage = lambda: ([s3_dataset(u) for u in rewritten],
                                 [delta_table(u, storage_options=delta_storage_options(settings)) for u in rewritten])
        return result

