"""``pgcdc status --prometheus``: a slot's status in Prometheus' text exposition format, for a
cron job writing node-exporter's textfile folder, or any scraper of a file. Every metric has
the label ``slot``; a table's, ``table`` (``schema.table``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["prometheus_text"]

# (name, help, where in the status document)
_SLOT = (
    ("pgcdc_slot_pending_bytes", "WAL bytes the slot has not had acknowledged", ("slot", "pending_bytes")),
    ("pgcdc_slot_retained_bytes", "WAL bytes the server keeps for the slot", ("slot", "retained_bytes")),
    ("pgcdc_slot_active", "1 while a drain streams the slot", ("slot", "active")),
    ("pgcdc_windows_committed", "change windows committed to the store", ("store", "windows_committed")),
    ("pgcdc_windows_not_merged", "committed windows not merged into every Delta table",
     ("store", "windows_not_merged")),
    ("pgcdc_lag_seconds", "seconds the Delta tables are behind the source (the stalest table, or the WAL)",
     ("store", "freshness", "lag_seconds")),
    ("pgcdc_wal_wait_seconds", "seconds the oldest unacknowledged change has waited, as far as the server "
     "can tell", ("store", "freshness", "wal_wait_seconds")),
)


def _label(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: Any) -> str | None:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float)):
        return repr(float(value)) if isinstance(value, float) else str(value)
    return None


def _get(doc: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(doc, Mapping):
            return None
        doc = doc.get(key)
    return doc


def _lines(status: Mapping[str, Any]) -> Iterator[str]:
    slot = _label((status.get("slot") or {}).get("slot", ""))
    for name, text, path in _SLOT:
        value = _number(_get(status, path))
        if value is None:
            continue
        yield f"# HELP {name} {text}"
        yield f"# TYPE {name} gauge"
        yield f'{name}{{slot="{slot}"}} {value}'
    yield "# HELP pgcdc_slot_problem 1 when the slot cannot be drained (lost, unreserved, mismatched)"
    yield "# TYPE pgcdc_slot_problem gauge"
    yield f'pgcdc_slot_problem{{slot="{slot}"}} {1 if status.get("problem") else 0}'
    tables = _get(status, ("store", "freshness", "tables")) or {}
    if tables:
        yield "# HELP pgcdc_table_lag_seconds seconds a Delta table is behind its source (its oldest change not merged)"
        yield "# TYPE pgcdc_table_lag_seconds gauge"
        for table, t in sorted(tables.items()):
            yield f'pgcdc_table_lag_seconds{{slot="{slot}",table="{_label(table)}"}} {float(t["lag_seconds"])!r}'
        merged = [(table, t["merged_through"]) for table, t in sorted(tables.items())
                  if t.get("merged_through") is not None]
        if merged:
            yield "# HELP pgcdc_table_merged_window the last change window merged into a Delta table"
            yield "# TYPE pgcdc_table_merged_window gauge"
            for table, seq in merged:
                yield f'pgcdc_table_merged_window{{slot="{slot}",table="{_label(table)}"}} {int(seq)}'


def prometheus_text(status: Mapping[str, Any]) -> str:
    """The status document of :func:`~airflow_pgcdc.status.job.slot_status` as Prometheus text."""
    return "\n".join(_lines(status)) + "\n"
