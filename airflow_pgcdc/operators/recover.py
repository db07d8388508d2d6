"""``PgcdcRecoverOperator``: a pipeline whose slot lost changes goes on into its existing
Delta tables (:mod:`airflow_pgcdc.snapshot.recover`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator

from airflow_pgcdc.hooks.pgcdc import PgcdcHook
from airflow_pgcdc.operators.assets import default_outlets, emit
from airflow_pgcdc.operators.lineage import ReportsLineage
from airflow_pgcdc.operators.resync import resync_asset
from airflow_pgcdc.operators.values import flag, number, options_or_fields


class PgcdcRecoverOperator(ReportsLineage, BaseOperator):
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
    :param workers: parallel COPY sessions (default 4)
    :param pii_key_conn_id: Airflow connection whose password is the hash key of the slot's
        column rules (default: the worker's ``PGCDC_PII_KEY``) (templated)
    :param as_text: ``{"schema.table": ["column", ...]}``, as the drain has it (templated)
    :param two_phase: for a slot created again whose old one is gone (None: as it was, else off)
    :param options: the recovery's options whole, a
        :class:`~airflow_pgcdc.snapshot.options.RecoverOptions` or a mapping of its fields
        (templated), instead of ``workers``, ``rows_per_part``, ``as_text`` and ``two_phase``
    :param postgres_conn_id: Airflow ``postgres`` connection
    :param aws_conn_id: Airflow ``aws`` connection; ``None``: boto3's environment
    """

    template_fields: Sequence[str] = ("store", "slot", "publications", "workers", "rows_per_part", "as_text", "pii_key_conn_id",
                                      "postgres_conn_id", "aws_conn_id", "options")
    ui_color = "#f5b7b1"

    def __init__(
        self,
        *,
        store: str,
        slot: str,
        publications: Sequence[str] | str | None = None,
        workers: int | None = None,
        rows_per_part: int | None = None,
        as_text: dict[str, Sequence[str]] | None = None,
        pii_key_conn_id: str | None = None,
        two_phase: bool | None = None,
        options: Any = None,
        postgres_conn_id: str = PgcdcHook.default_conn_name,
        aws_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        options_or_fields("PgcdcRecoverOperator", options, workers=workers, rows_per_part=rows_per_part,
                          as_text=as_text, two_phase=two_phase)
        if "outlets" not in kwargs:
            kwargs["outlets"] = default_outlets("resync", store, slot, resync_asset)
        super().__init__(**kwargs)
        self.store = store
        self.slot = slot
        self.publications = publications
        self.options = options
        self.workers = workers
        self.rows_per_part = rows_per_part
        self.as_text = as_text
        self.pii_key_conn_id = pii_key_conn_id
        self.two_phase = two_phase
        self.postgres_conn_id = postgres_conn_id
        self.aws_conn_id = aws_conn_id

    def execute(self, context) -> dict[str, Any]:
        from airflow_pgcdc.snapshot.options import RecoverOptions
        from airflow_pgcdc.snapshot.recover import recover_pipeline

        hook = PgcdcHook(self.postgres_conn_id, self.aws_conn_id)
        self.log.info("recovery of slot %s from %s into %s", self.slot, hook.safe_dsn(), self.store)
        options = options_or_fields(
            "PgcdcRecoverOperator", self.options, RecoverOptions, workers=number(self.workers, int, "workers", minimum=1),
            rows_per_part=number(self.rows_per_part, int, "rows_per_part", minimum=1), as_text=self.as_text or None,
            two_phase=None if self.two_phase is None else flag(self.two_phase, "two_phase"))
        with hook.pii_key(self.pii_key_conn_id):  # the slot's column rules apply to the copies
            done = recover_pipeline(hook.get_dsn(), self.store, slot=self.slot,
                                    publications=self.publications or None, options=options, s3=hook.s3_client())
        result = {**done.recovery.to_dict(), "record": done.url}
        from airflow_pgcdc.operators.lineage import postgres_tables, s3_dataset

        dsn, copies = hook.get_dsn(), f"{self.store.rstrip('/')}/{self.slot}/resync"
        tables = sorted(f"{s}.{t}" for s, t in done.recovery.tables)
        self._lineage = lambda: (postgres_tables(dsn, tables), [s3_dataset(copies)])
        emit(self, context, resync_asset(self.store, self.slot), {
            "recovery_id": done.recovery.recovery_id,
            "tables": sorted(f"{s}.{t}" for s, t in done.recovery.tables),
        })
        return result

