"""``PgcdcDrainOperator``: one window of logical changes from a slot to S3."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, BaseOperator

from airflow_pgcdc.hooks.pgcdc import PgcdcHook
from airflow_pgcdc.operators.assets import default_outlets, emit
from airflow_pgcdc.operators.lineage import ReportsLineage
from airflow_pgcdc.operators.metrics import drain_metrics
from airflow_pgcdc.operators.renamed import renamed_argument
from airflow_pgcdc.operators.runs import refuse_backfill_run
from airflow_pgcdc.operators.values import checked, number, rendered_options, templated

if TYPE_CHECKING:
    from airflow_pgcdc.drain.options import DrainOptions


def changes_asset(to: str, slot: str) -> Asset:
    """The Asset the windows of ``slot`` under ``to`` (s3://bucket/prefix) update."""
    return Asset(uri=f"{to.rstrip('/')}/{slot}/changes", name=f"pgcdc-changes-{slot}")


class PgcdcDrainOperator(ReportsLineage, BaseOperator):
    """Drain one window of ``slot`` into ``to`` and acknowledge it once committed
    (see :mod:`airflow_pgcdc.drain.drain`).

    The window ends at ``until_lsn`` if given (templated), else at the ``observed_lsn``
    that the task ``sensor_task_id`` (a ``PgcdcChangesSensor``) returned, else at the
    server's current WAL insert position; ``max_rows`` / ``max_bytes`` / ``max_seconds``
    may end it earlier, at a transaction boundary.

    Returns (XCom ``return_value``)::

        {"window_seq", "start_lsn", "end_lsn", "end_reason", "transactions", "rows",
         "tables": {"schema.table": rows}, "bytes", "manifest": "s3://…/_manifest.json"}

    ``window_seq`` is ``None`` when there was nothing to drain. A committed window emits an
    Asset event on ``s3://bucket/prefix/<slot>/changes`` (extra: window_seq, end_lsn,
    rows; through the AssetAlias ``pgcdc-changes[-<slot>]`` when ``store`` or ``slot`` is
    templated, see :mod:`airflow_pgcdc.operators.assets`).

    :param store: ``s3://bucket/prefix`` (templated)
    :param slot: the logical replication slot (pgoutput) (templated)
    :param publications: publication name, or a list of names (templated; ``publication``:
        its 0.2 name, warns)
    :param until_lsn: window end ``X/Y`` (templated)
    :param sensor_task_id: take the window end from this sensor task's ``observed_lsn``
    :param skip_origins: drop transactions from these replication origins
    :param message_prefixes: keep only logical messages with these prefixes
    :param binary: ask pgoutput for binary values
    :param forget_tables: ``schema.table`` names that left the publications on purpose: they
        leave the pipeline (without this the drain refuses to acknowledge past their removal)
    :param as_text: ``{"schema.table": ["column", ...]}``: columns kept as their exact
        PostgreSQL text whatever their type (templated; as the copy did)
    :param pii: column rules (``{"schema.table": {"column": "hash"}}``), for a slot whose store
        has none yet (a pipeline without a snapshot); the store's rules apply whether given or
        not, and other rules are refused (templated)
    :param pii_key_conn_id: Airflow connection whose password is the hash key of the slot's
        column rules (any connection type; default: the worker's ``PGCDC_PII_KEY``) (templated)
    :param start_without_snapshot: start a store that holds no snapshot and no window of the
        slot at the slot's position (changes only); without it such a store is refused
        (``StoreHasNoCopy``: a mistyped store would otherwise take the slot over)

    Another run of the slot (an overlapping DAG run, a manual ``pgcdc drain``) makes the task
    skip (``AirflowSkipException``): it wrote and acknowledged nothing, the other run drains.
    :param max_rows: end the window at the first transaction boundary past this many rows
        (templated)
    :param max_bytes: … past this many bytes of changes received (templated)
    :param max_seconds: … once it has drained this long (templated)
    :param postgres_conn_id: Airflow ``postgres`` connection (templated)
    :param aws_conn_id: Airflow ``aws`` connection; ``None``: boto3's environment (templated)
    """

    template_fields: Sequence[str] = ("store", "slot", "publications", "until_lsn", "as_text", "max_rows", "max_bytes",
                                      "max_seconds", "pii", "pii_key_conn_id", "postgres_conn_id", "aws_conn_id",
                                      "options")
    ui_color = "#d5f5e3"

    def __init__(
        self,
        *,
        store: str | None = None,
        slot: str,
        publications: str | Sequence[str] | None = None,
        until_lsn: str | None = None,
        sensor_task_id: str | None = None,
        max_rows: int | None = None,
        max_bytes: int | None = None,
        max_seconds: float | None = None,
        skip_origins: Sequence[str] = (),
        message_prefixes: Sequence[str] | None = None,
        binary: bool = False,
        max_wait: float = 300.0,
        forget_tables: Sequence[str] = (),
        start_without_snapshot: bool = False,
        as_text: dict[str, Sequence[str]] | None = None,
        pii: Mapping[str, Mapping[str, str]] | None = None,
        pii_key_conn_id: str | None = None,
        options: DrainOptions | Mapping[str, Any] | str | None = None,
        postgres_conn_id: str = PgcdcHook.default_conn_name,
        aws_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        store = renamed_argument(kwargs, "to", "store", store, "PgcdcDrainOperator")
        publications = renamed_argument(kwargs, "publication", "publications", publications, "PgcdcDrainOperator",
                                        required="the publication(s) to stream")
        if "outlets" not in kwargs:
            kwargs["outlets"] = default_outlets("changes", store, slot, changes_asset)
        super().__init__(**kwargs)
        self.store = store
        self.slot = slot
        self.publications = publications
        self.until_lsn = until_lsn
        self.sensor_task_id = sensor_task_id
        self.max_rows = checked(max_rows, number, int, "max_rows", minimum=0)
        self.max_bytes = checked(max_bytes, number, int, "max_bytes", minimum=0)
        self.max_seconds = checked(max_seconds, number, float, "max_seconds", minimum=0)
        self.skip_origins = list(skip_origins)
        self.message_prefixes = list(message_prefixes) if message_prefixes is not None else None
        self.binary = binary
        self.max_wait = max_wait
        self.forget_tables = list(forget_tables)
        self.start_without_snapshot = bool(start_without_snapshot)
        self.as_text = as_text
        self.pii = pii
        self.pii_key_conn_id = pii_key_conn_id
        # the drain's options as one object or dict (templated), instead of the fields above
        self.options = options
        given = [name for name, v in (("max_rows", max_rows), ("max_bytes", max_bytes), ("max_seconds", max_seconds),
                                      ("skip_origins", skip_origins), ("message_prefixes", message_prefixes),
                                      ("binary", binary), ("forget_tables", forget_tables), ("as_text", as_text), ("pii", pii),
                                      ("start_without_snapshot", start_without_snapshot))
                 if v not in (None, False, ())]
        if options is not None and given:
            raise ValueError(f"give options or the drain's fields ({', '.join(given)}), not both")
        if options is not None and not templated(options):
            self._options()  # a bad option fails when the DAG is parsed
        self.postgres_conn_id = postgres_conn_id
        self.aws_conn_id = aws_conn_id

    def _window_end(self, context) -> str | None:
        if self.until_lsn:
            return str(self.until_lsn)
        if not self.sensor_task_id:
            return None
        ti = context["ti"]
        value = ti.xcom_pull(task_ids=self.sensor_task_id)
        if isinstance(value, dict) and value.get("observed_lsn"):
            return str(value["observed_lsn"])
        value = ti.xcom_pull(task_ids=self.sensor_task_id, key="observed_lsn")
        return str(value) if value else None


    def execute(self, context) -> dict[str, Any]:
        from airflow_pgcdc.drain.drain import DrainBusy, drain_window
        from airflow_pgcdc.hooks.compat import AirflowSkipException

        refuse_backfill_run(context, f"drain {self.task_id} (slot {self.slot})")
        hook = PgcdcHook(self.postgres_conn_id, self.aws_conn_id)
        publications = [self.publications] if isinstance(self.publications, str) else list(self.publications)
        until = self._window_end(context)
        self.log.info("drain of slot %s (%s) into %s, window end %s", self.slot, hook.safe_dsn(), self.store,
                      until or "current WAL insert position")
        try:
            with hook.pii_key(self.pii_key_conn_id):
                result = self._drain(drain_window, hook, publications, until)
        except DrainBusy as e:
            raise AirflowSkipException(f"{e} (hint: {e.hint})") from None
        out = result.to_dict()
        drain_metrics(self.slot, out)
        if result.window_seq is not None:
            from airflow_pgcdc.operators.lineage import postgres_tables, s3_dataset

            dsn, store, slot = hook.get_dsn(), self.store, self.slot
            self._lineage = lambda: (postgres_tables(dsn, out["tables"]),
                                     [s3_dataset(f"{store.rstrip('/')}/{slot}/changes", rows=result.rows,
                                                 size=result.bytes)])
        self.log.info("window %s [%s, %s): %s transactions, %s rows, %s bytes", out["window_seq"],
                      out["start_lsn"], out["end_lsn"], out["transactions"], out["rows"], out["bytes"])
        if result.window_seq is not None:
            emit(self, context, changes_asset(self.store, self.slot), {
                "window_seq": result.window_seq, "end_lsn": str(result.end_lsn), "rows": result.rows,
            })
        return out

    def _options(self) -> DrainOptions | None:
        from airflow_pgcdc.drain.options import DrainOptions

        return rendered_options(self.options, DrainOptions)

    def _drain(self, drain_window, hook: PgcdcHook, publications: list[str], until: str | None):
        options = self._options()
        if options is not None:
            if until:
                options = dataclasses.replace(options, until_lsn=until)
            return drain_window(hook.get_dsn(), self.store, slot=self.slot, publications=publications,
                                options=options, s3=hook.s3_client())
        return drain_window(
            hook.get_dsn(),
            self.store,
            slot=self.slot,
            publications=publications,
            until_lsn=until,
            max_rows=number(self.max_rows, int, "max_rows", minimum=0),
            max_bytes=number(self.max_bytes, int, "max_bytes", minimum=0),
            max_seconds=number(self.max_seconds, float, "max_seconds", minimum=0),
            skip_origins=self.skip_origins,
            message_prefixes=self.message_prefixes,
            binary=self.binary,
            max_wait=self.max_wait,
            s3=hook.s3_client(),
            forget_tables=self.forget_tables,
            start_without_snapshot=self.start_without_snapshot,
            as_text=self.as_text,
            pii=self.pii or None,
        )
