"""``PgcdcRebuildOperator``: ``pgcdc rebuild`` as a Spark application (see
:mod:`airflow_pgcdc.merge.rebuild`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import Asset

from airflow_pgcdc.operators import assets
from airflow_pgcdc.operators.merge import PgcdcSparkMergeOperator
from airflow_pgcdc.operators.values import flag

__all__ = ["PgcdcRebuildOperator"]


class PgcdcRebuildOperator(PgcdcSparkMergeOperator):
    """Rebuild the Delta tables of a slot under ``delta`` (the live root) from the store: the
    copy and every committed window replayed into a scratch root (``scratch``, default
    ``{delta}_rebuild/{run id}``), each rebuilt table (and its ``history`` table) swapped
    into the live root in one overwrite commit, the scratch root removed. Refused before any
    work, naming the tables, when upkeep removed windows or a copy they need.

    Takes every argument of :class:`PgcdcSparkMergeOperator` (``engine``,
    ``target_file_mb``, ``deletion_vectors``, ``history``: the rebuilt tables' layout), and
    ``swap`` (default True; False keeps the rebuilt tables in the scratch root for a look)
    and ``keep_scratch``. Asset events: one per live table swapped in (action ``rebuilt``);
    none with ``swap=False``. Returns the rebuild's result (the merge's, with ``rebuild``:
    the scratch root and each swap)."""

    template_fields: Sequence[str] = (*PgcdcSparkMergeOperator.template_fields, "scratch", "swap", "keep_scratch")
    ui_color = "#f9e0b7"

    def __init__(self, *, scratch: str | None = None, swap: bool | str = True, keep_scratch: bool | str = False,
                 name: str = "pgcdc-rebuild", **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)
        self.scratch = scratch
        self.swap = swap
        self.keep_scratch = keep_scratch

    def _application_args(self) -> list[str]:
        args = [*super()._application_args(), "--rebuild"]
        if self.scratch not in (None, "", "None"):
            args += ["--scratch", str(self.scratch)]
        if not flag(self.swap, "swap"):
            args.append("--no-swap")
        if flag(self.keep_scratch, "keep_scratch"):
            args.append("--keep-scratch")
        return args

    def _emit_asset_events(self, context, result: Mapping[str, Any]) -> None:
        if not self.outlets:
            self.log.info("outlets=[]: no Asset event for the rebuilt tables")
            return
        from airflow_pgcdc.merge.rebuild import rebuilt_events

        swapped = (result.get("rebuild") or {}).get("swapped", [])
        for uri, extra in rebuilt_events(list(result.get("tables", ())), swapped):
            assets.emit(self, context, Asset(uri=uri), extra)

    def _lineage_of(self, result: Mapping[str, Any]):
        """OpenLineage of a rebuild: the store's copy and windows in, each live Delta table it
        swapped in out (with its schema); the scratch tables are a step, not an output. None
        when nothing was swapped (``swap=False``, every table failed)."""
        from airflow_pgcdc.operators.lineage import delta_table, s3_dataset
        from airflow_pgcdc.operators.merge import LINEAGE_SCHEMAS, PgcdcHook
        from airflow_pgcdc.store.s3 import delta_storage_options

        swapped = [d for d in (result.get("rebuild") or {}).get("swapped", []) if d.get("live")]
        if not swapped:
            return None
        options = delta_storage_options(PgcdcHook(aws_conn_id=self.aws_conn_id).s3_settings())
        root = f"{self.store.rstrip('/')}/{self.slot}"
        outputs = [delta_table(str(d["live"]), storage_options=options) if i < LINEAGE_SCHEMAS
                   else s3_dataset(str(d["live"])) for i, d in enumerate(swapped)]
        return [s3_dataset(f"{root}/snapshot"), s3_dataset(f"{root}/changes")], outputs
