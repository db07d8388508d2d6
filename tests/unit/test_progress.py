"""progress: a job's progress over its tables, at intervals (a fake clock); the drain's line."""

from __future__ import annotations

from airflow_pgcdc.lake.progress import TablesProgress


def test_a_line_at_each_interval_and_one_at_the_end_once_any_was_logged():
    now = [100.0]
    p = TablesProgress(4, interval=30, clock=lambda: now[0])
    now[0] = 110.0
    assert p.done("merged", rows_bootstrapped=0, change_rows_merged=5) is None  # within the interval
    now[0] = 131.0
    line = p.done("failed")
    assert line == ("merge: 2/4 tables (50.0%), 1 failed, 0 rows bootstrapped, 5 change rows merged, 31s, "
                    "0.06 tables/s, ETA 31s")
    now[0] = 140.0
    assert p.done("bootstrapped", rows_bootstrapped=2000) is None
    now[0] = 141.0
    last = p.done("merged", change_rows_merged=1)
    assert last is not None and last.startswith("merge: 4/4 tables (100.0%), 1 failed, 2,000 rows bootstrapped, "
                                                "6 change rows merged") and last.endswith("ETA 0s")


def test_a_short_job_logs_nothing():
    now = [0.0]
    p = TablesProgress(2, interval=30, clock=lambda: now[0])
    assert p.done("merged") is None and p.done("no-changes") is None


def test_a_receiving_window_says_how_far_it_got():
    from airflow_pgcdc.drain.run import progress_line

    assert progress_line(120_000, 0x1000000, 0x1400000, 0x2000000, 30.0) == (
        "120,000 change rows, at 0/1400000, 30s, 4,000 rows/s, 25.0% of [0/1000000, 0/2000000), ETA 90s")
    assert progress_line(5, 0x100, 0x100, None, 2.0) == "5 change rows, at 0/100, 2s, 2 rows/s"
    assert progress_line(0, 0x100, 0x100, 0x200, 0.0).endswith("0.0% of [0/100, 0/200), ETA unknown")
