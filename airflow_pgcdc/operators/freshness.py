"""``PgcdcFreshnessCheckOperator``: fails a run when a Delta table is further behind its
source than its SLA (``pgcdc status --max-lag-seconds``, per table)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator

from airflow_pgcdc.hooks.compat import AirflowFailException
from airflow_pgcdc.hooks.pgcdc import PgcdcHook
from airflow_pgcdc.operators.metrics import freshness_metrics, slot_metrics
from airflow_pgcdc.operators.values import number

__all__ = ["PgcdcFreshnessCheckOperator", "PgcdcTablesStale"]


class PgcdcTablesStale(AirflowFailException):
    """A Delta table is behind its source past its SLA (no retry helps: the pipeline must catch up)."""


class PgcdcFreshnessCheckOperator(BaseOperator):
    """Read each table's lag (:func:`~airflow_pgcdc.status.job.slot_status`'s ``freshness``:
    now minus the commit time of its oldest change not merged yet) and fail when one is past
    its SLA, naming every late table with its lag; the pipeline's own lag (changes still in
    the WAL, as far as the server can tell) is held to ``max_lag_seconds``.

    Returns (XCom) the freshness document: ``{as_of, lag_seconds, lag_known,
    wal_wait_seconds, tables: {"schema.table": {merged_through, oldest_unmerged_commit,
    lag_seconds}}}``.

    :param store: the change store ``s3://bucket/prefix`` (templated)
    :param delta: the Delta root (templated)
    :param slot: the pipeline's slot (templated)
    :param max_lag_seconds: every table's SLA (templated)
    :param table_max_lag_seconds: a table's own SLA, ``{"schema.table": seconds}`` (templated)
    :param postgres_conn_id: Airflow ``postgres`` connection
    :param aws_conn_id: Airflow ``aws`` connection; ``None``: boto3's environment
    """

    template_fields: Sequence[str] = ("store", "delta", "slot", "max_lag_seconds", "table_max_lag_seconds",
                                      "postgres_conn_id", "aws_conn_id")
    ui_color = "#fcf3cf"

    def __init__(self, *, store: str, delta: str, slot: str, max_lag_seconds: float | str,
                 table_max_lag_seconds: Mapping[str, float] | None = None,
                 postgres_conn_id: str = PgcdcHook.default_conn_name, aws_conn_id: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.store = store
        self.delta = delta
        self.slot = slot
        self.max_lag_seconds = max_lag_seconds
        self.table_max_lag_seconds = dict(table_max_lag_seconds or {})
        self.postgres_conn_id = postgres_conn_id
        self.aws_conn_id = aws_conn_id

    def execute(self, context) -> dict[str, Any]:
        from airflow_pgcdc.status.job import slot_status

        limit = number(self.max_lag_seconds, float, "max_lag_seconds", minimum=0)
        own = {str(t): number(v, float, f"table_max_lag_seconds[{t}]", minimum=0)
               for t, v in self.table_max_lag_seconds.items()}
        hook = PgcdcHook(self.postgres_conn_id, self.aws_conn_id)
        status = slot_status(hook.get_dsn(), self.slot, store=self.store, delta=self.delta, s3=hook.s3_client())
        fresh = (status.get("store") or {}).get("freshness")
        if fresh is None:
            raise AirflowFailException(f"slot {self.slot}: nothing in {self.store} to measure (no copy, no window)")
        slot_metrics(self.slot, status.get("slot") or {})
        freshness_metrics(self.slot, fresh)
        late = {n: t["lag_seconds"] for n, t in fresh["tables"].items() if t["lag_seconds"] > own.get(n, limit)}
        wal = fresh.get("wal_wait_seconds")
        self.log.info("slot %s: %s%.1f s behind the source (%d tables; WAL wait %s)", self.slot,
                      "" if fresh["lag_known"] else "at least ", fresh["lag_seconds"], len(fresh["tables"]),
                      "unknown" if wal is None else f"{wal:.1f} s")
        if late or (wal is not None and wal > limit):
            what = ", ".join(f"{n} {s:,.0f} s (SLA {own.get(n, limit):g} s)" for n, s in sorted(late.items()))
            raise PgcdcTablesStale(
                f"slot {self.slot}: " + (what if what else f"changes have waited {wal:,.0f} s in the WAL")
                + " behind the source: run the drain and the merge, or see why they fail (pgcdc status)")
        return fresh
