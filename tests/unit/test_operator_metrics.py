"""The operators' metrics (:mod:`airflow_pgcdc.operators.metrics`) as names and values, given
a job's result: a recording ``Stats`` in place of Airflow's (the DAG-run tests check the
drain's, merge's, resync's and freshness check's over a real StatsD socket)."""

from __future__ import annotations

import pytest

from airflow_pgcdc.operators import metrics


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float]] = []

    def incr(self, name, count=1):
        self.calls.append(("c", name, count))

    def gauge(self, name, value):
        self.calls.append(("g", name, value))

    def timing(self, name, ms):
        self.calls.append(("ms", name, ms))


@pytest.fixture
def stats(monkeypatch):
    rec = _Recorder()
    monkeypatch.setattr(metrics, "_stats", lambda: rec)
    return rec


def test_names_are_made_safe_and_keep_schema_and_table_apart():
    assert metrics.metric_name("s:1", "public.Odd Name", "merge_rows") == "pgcdc.s_1.public.Odd_Name.merge_rows"


def test_maintain_reports_failures_files_bytes_windows_and_time(stats):
    metrics.maintain_metrics("s", {
        "tables": [{"files_before": 7, "files_after": 2}, {"files_before": 1, "files_after": 3}],
        "failed": ["public.x"], "bytes_removed": 1234, "windows": {"expired": [[0, 3], [4, 4]]}, "seconds": 1.5})
    assert stats.calls == [("g", "pgcdc.s.maintain.tables_failed", 1), ("c", "pgcdc.s.maintain.files_removed", 5),
                           ("c", "pgcdc.s.maintain.bytes_removed", 1234),
                           ("c", "pgcdc.s.maintain.windows_expired", 2), ("ms", "pgcdc.s.maintain.seconds", 1500.0)]


def test_resync_reports_tables_rows_and_time(stats):
    metrics.resync_metrics("s", {"rows": 30, "tables": {"public.a": {}, "public.b": {}}}, 0.25)
    assert stats.calls == [("c", "pgcdc.s.resync.tables", 2), ("c", "pgcdc.s.resync.rows", 30),
                           ("ms", "pgcdc.s.resync.seconds", 250.0)]
