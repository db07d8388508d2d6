"""The operators' metrics, through Airflow's ``Stats`` (StatsD or OpenTelemetry, as the
deployment's ``[metrics]`` section configures; nothing when metrics are off). Every name
starts ``pgcdc.{slot}.``, under Airflow's own prefix (``airflow.`` by default); a table's part
of a name is ``{schema}.{table}`` with every character outside ``[A-Za-z0-9_-]`` as ``_``.
Each name, its kind and unit is listed in docs/operations.md ("Metrics")."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from airflow_pgcdc.merge.results import QUIET_ACTIONS

__all__ = ["drain_metrics", "freshness_metrics", "maintain_metrics", "merge_metrics", "metric_name", "resync_metrics",
           "slot_metrics"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def metric_name(slot: str, *parts: str) -> str:
    """``pgcdc.{slot}.{part}...``, each part made safe for StatsD (``public.Odd Name`` is
    ``public.Odd_Name``: the schema and the table stay two parts)."""
    safe = [".".join(_UNSAFE.sub("_", piece) or "_" for piece in p.split(".", 1)) for p in parts]
    return ".".join(["pgcdc", _UNSAFE.sub("_", slot), *safe])[:250]


def _stats():
    from airflow_pgcdc.hooks.compat import Stats

    return Stats


def drain_metrics(slot: str, result: Mapping[str, Any]) -> None:
    """A drain's window: ``drain.windows`` (count), ``drain.rows`` and ``drain.bytes``
    (counts), ``drain.transactions`` (count), ``drain.seconds`` (timing, ms)."""
    s = _stats()
    if result.get("window_seq") is None:
        s.incr(metric_name(slot, "drain.empty"))
        return
    s.incr(metric_name(slot, "drain.windows"))
    s.incr(metric_name(slot, "drain.rows"), int(result.get("rows") or 0))
    s.incr(metric_name(slot, "drain.bytes"), int(result.get("bytes") or 0))
    s.incr(metric_name(slot, "drain.transactions"), int(result.get("transactions") or 0))
    if result.get("seconds") is not None:
        s.timing(metric_name(slot, "drain.seconds"), float(result["seconds"]) * 1000.0)


def merge_metrics(slot: str, result: Mapping[str, Any]) -> None:
    """A merge job: ``merge.tables_failed`` (gauge), ``merge.rows`` (count of change rows
    merged and rows bootstrapped), ``merge.seconds`` (timing, ms); per table that did work:
    ``{table}.merge_rows`` (count) and ``{table}.merge_seconds`` (timing, ms)."""
    s = _stats()
    failed = rows = 0
    for t in result.get("tables", ()):
        if t.get("action") == "failed":
            failed += 1
            continue
        n = int(t.get("merged_rows") or 0) + int(t.get("bootstrap_rows") or 0)
        rows += n
        if n or t.get("action") not in QUIET_ACTIONS:
            s.incr(metric_name(slot, t["table"], "merge_rows"), n)
            if t.get("seconds") is not None:
                s.timing(metric_name(slot, t["table"], "merge_seconds"), float(t["seconds"]) * 1000.0)
    s.gauge(metric_name(slot, "merge.tables_failed"), failed)
    s.incr(metric_name(slot, "merge.rows"), rows)
    if result.get("seconds") is not None:
        s.timing(metric_name(slot, "merge.seconds"), float(result["seconds"]) * 1000.0)


def slot_metrics(slot: str, health: Mapping[str, Any]) -> None:
    """The slot's ``slot.pending_bytes`` (WAL not acknowledged) and ``slot.retained_bytes``
    (WAL the server keeps for it), gauges in bytes, when known."""
    s = _stats()
    for field in ("pending_bytes", "retained_bytes"):
        if isinstance(health.get(field), int):
            s.gauge(metric_name(slot, f"slot.{field}"), health[field])


def freshness_metrics(slot: str, fresh: Mapping[str, Any]) -> None:
    """``lag_seconds`` (gauge, the pipeline's), ``wal_wait_seconds`` (gauge, when the server
    can tell) and ``{table}.lag_seconds`` (gauge) per table."""
    s = _stats()
    s.gauge(metric_name(slot, "lag_seconds"), float(fresh.get("lag_seconds") or 0.0))
    if fresh.get("wal_wait_seconds") is not None:
        s.gauge(metric_name(slot, "wal_wait_seconds"), float(fresh["wal_wait_seconds"]))
    for name, t in (fresh.get("tables") or {}).items():
        s.gauge(metric_name(slot, name, "lag_seconds"), float(t.get("lag_seconds") or 0.0))


def resync_metrics(slot: str, result: Mapping[str, Any], seconds: float) -> None:
    """A resync's copy: ``resync.tables`` and ``resync.rows`` (counts), ``resync.seconds``
    (timing, ms)."""
    s = _stats()
    s.incr(metric_name(slot, "resync.tables"), len(result.get("tables") or {}))
    s.incr(metric_name(slot, "resync.rows"), int(result.get("rows") or 0))
    s.timing(metric_name(slot, "resync.seconds"), float(seconds) * 1000.0)


def maintain_metrics(slot: str, result: Mapping[str, Any]) -> None:
    """An upkeep run (``pgcdc maintain``): ``maintain.tables_failed`` (gauge),
    ``maintain.files_removed`` (count: data files a compaction took out of the tables, net of
    those it added), ``maintain.bytes_removed`` (count: bytes deleted from S3, vacuum, logs,
    expired windows, copies and staging), ``maintain.windows_expired`` (count) and
    ``maintain.seconds`` (timing, ms)."""
    s = _stats()
    tables = result.get("tables") or ()
    s.gauge(metric_name(slot, "maintain.tables_failed"), len(result.get("failed") or ()))
    s.incr(metric_name(slot, "maintain.files_removed"),
           sum(max(int(t.get("files_before") or 0) - int(t.get("files_after") or 0), 0) for t in tables))
    s.incr(metric_name(slot, "maintain.bytes_removed"), int(result.get("bytes_removed") or 0))
    s.incr(metric_name(slot, "maintain.windows_expired"), len((result.get("windows") or {}).get("expired") or ()))
    if result.get("seconds") is not None:
        s.timing(metric_name(slot, "maintain.seconds"), float(result["seconds"]) * 1000.0)
