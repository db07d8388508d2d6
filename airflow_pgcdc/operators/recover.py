"""``PgcdcRecoverOperator``: a pipeline whose slot lost changes goes on into its existing
Delta tables (:mod:`airflow_pgcdc.snapshot.recover`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator

from airflow_pgcdc.hooks.pgcdc import PgcdcHook
from airflow_pgcdc.operators.assets import default_outlets, emit
from airflow_pgcdc.operators.resync import resync_asset
from airflow_pgcdc.operators.values import number


class PgcdcRecoverOperator(BaseOperator):
    """For a slot that was dropped, lost its WAL or was acknowledged past the store: create
    it again under its name (a slot only ahead is kept), copy every table of the pipeline
    as a resync and record the recovery; the next drain resumes and the next merge replaces
    each Delta table from its copy in one commit. Run it with the pipeline's DAGs paused
    (a manually triggered DAG of its own). A slot that lost nothing fails the task
    (``NothingToRecover``).

    Pushes the recovery record (``{"recovery_id", "cause", "store_end_lsn", "slot_position",
    "copies", "refused", ..., "record": url}``) and an Asset event on
    ``s3://bucket/prefix/<slot>/resync`` (the copies are resyncs) with ``{recovery_id,
    tables}`` as extra.

    :param store: the pipeline's store, ``s3://bucket/prefix`` (templated)
    :param slot: the pipeline's replication slot (templated)
    :param publications: the drains' publications; None: those the store's newest window
        records (templated)
    :param workers: parallel COPY sessions
    :param as_text: ``{"schema.table": ["column", ...]}``, as the drain has it (templated)
    :param two_phase: for a slot created again whose old one is gone (None: as it was, else off)
    :param postgres_conn_id: Airflow ``postgres`` connection
    :param aws_conn_id: Airflow ``aws`` connection; ``None``: boto3's environment
    """

    template_fields: Sequence[str] = ("store", "slot", "publications", "workers", "rows_per_part", "as_text",
                                      "postgres_conn_id", "aws_conn_id")
    ui_color = "#f5b7b1"

    def __init__(
        self,
        *,
        store: str,
        slot: str,
        publications: Sequence[str] | str | None = None,
        workers: int = 4,
        rows_per_part: int = 1_000_000,
        as_text: dict[str, Sequence[str]] | None = None,
        two_phase: bool | None = None,
        postgres_conn_id: str = PgcdcHook.default_conn_name,
        aws_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        if "outlets" not in kwargs:
            kwargs["outlets"] = default_outlets("resync", store, slot, resync_asset)
        super().__init__(**kwargs)
        self.store = store
        self.slot = slot
        self.publications = publications
        self.workers = workers
        self.rows_per_part = rows_per_part
        self.as_text = as_text
        self.two_phase = two_phase
        self.postgres_conn_id = postgres_conn_id
        self.aws_conn_id = aws_conn_id

    def execute(self, context) -> dict[str, Any]:
        from airflow_pgcdc.snapshot.recover import recover_pipeline

        hook = PgcdcHook(self.postgres_conn_id, self.aws_conn_id)
        self.log.info("recovery of slot %s from %s into %s", self.slot, hook.safe_dsn(), self.store)
        done = recover_pipeline(
            hook.get_dsn(), self.store, slot=self.slot, publications=self.publications or None,
            workers=number(self.workers, int, "workers", minimum=1),
            rows_per_part=number(self.rows_per_part, int, "rows_per_part", minimum=1), s3_client=hook.s3_client(),
            as_text=self.as_text, two_phase=self.two_phase,
        )
        result = {**done.recovery.to_dict(), "record": done.url}
        emit(self, context, resync_asset(self.store, self.slot), {
            "recovery_id": done.recovery.recovery_id,
            "tables": sorted(f"{s}.{t}" for s, t in done.recovery.tables),
        })
        return result
