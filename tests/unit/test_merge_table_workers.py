"""Tables merged at once by driver threads (``--table-workers``, issue #31): results in the
job's table order whatever order they end in, a table's own error stays its own (the job's
``one`` reports it), a store-wide error stops the tables not started and is raised, and the
option is checked, carried by the CLI and ``spark-submit`` arguments, and refused where the
engine merges one table at a time."""

from __future__ import annotations

import threading
import time

import pytest

from airflow_pgcdc.merge.errors import WindowGap
from airflow_pgcdc.merge.job import each_table
from airflow_pgcdc.merge.options import BadMergeOption, MergeOptions

TABLES = [("s", f"t{i}") for i in range(12)]


def test_results_come_in_the_jobs_order_and_tables_overlap():
    running, most = 0, 0
    lock = threading.Lock()

    def one(name):
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.02 * (12 - int(name[1][1:])) / 12)  # the later tables end first
        with lock:
            running -= 1
        return name[1]

    assert each_table(one, TABLES, 4) == [t for _, t in TABLES]
    assert 2 <= most <= 4  # at once, never more than asked


def test_one_worker_runs_in_this_thread_one_after_another():
    seen = []
    assert each_table(lambda n: seen.append(threading.current_thread()) or n[1], TABLES, 1) == [t for _, t in TABLES]
    assert set(seen) == {threading.current_thread()}


def test_a_store_wide_error_stops_the_tables_not_started_and_is_raised():
    started = []

    def one(name):
        started.append(name)
        if name == ("s", "t1"):
            raise WindowGap("window 7 is missing")
        time.sleep(0.05)
        return name[1]

    with pytest.raises(WindowGap, match="window 7"):
        each_table(one, TABLES, 2)
    assert len(started) < len(TABLES)  # the rest were never begun


def test_the_option_is_checked_and_travels_to_spark_submit():
    with pytest.raises(BadMergeOption, match="table_workers must be an integer 1 or more, got 0"):
        MergeOptions(table_workers=0)
    with pytest.raises(BadMergeOption, match="table_workers"):
        MergeOptions(table_workers=True)
    o = MergeOptions(table_workers=8)
    assert o.to_args() == ["--table-workers", "8"]
    import argparse

    from airflow_pgcdc.merge.spark_app import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert MergeOptions.from_args(parser.parse_args(
        ["--store", "s3://b/p", "--slot", "s", "--delta", "s3://b/l", *o.to_args()])) == o


def test_delta_spark_refuses_more_than_one_table_worker():
    from airflow_pgcdc.merge.errors import MergeError
    from airflow_pgcdc.merge.job import merge_slot
    from airflow_pgcdc.store.s3 import S3Settings

    with pytest.raises(MergeError, match="the delta-spark engine merges one table at a time"):
        merge_slot(None, store="s3://b/p", slot="s", delta="s3://b/l", engine="delta-spark", table_workers=2,
                   s3=S3Settings(region="us-east-1"))


def test_tables_that_need_spark_take_turns_and_small_ones_do_not_wait():
    """A table that asks for the Spark session keeps its turn until it ends: a second such
    table waits; a table that never asks (a small batch on the driver) runs meanwhile."""
    from airflow_pgcdc.merge.context import JobContext

    session = object()
    ctx = JobContext(session=session, layout=None, client=None, fs=None, storage={}, slot="s", delta="d",
                     run_id="r", s3_options={}, spark_turns=threading.Lock())
    order: list[str] = []
    first_has_it = threading.Event()

    def big(name, hold):
        assert ctx.spark is session
        assert ctx.spark is session  # asking again in the same table does not wait for itself
        order.append(f"{name} got spark")
        first_has_it.set()
        time.sleep(hold)
        order.append(f"{name} done")
        ctx.release_spark_turn()

    def small():
        first_has_it.wait(5)
        order.append("small ran")

    a = threading.Thread(target=big, args=("a", 0.3))
    a.start()
    first_has_it.wait(5)
    b = threading.Thread(target=big, args=("b", 0))
    c = threading.Thread(target=small)
    b.start()
    c.start()
    for t in (a, b, c):
        t.join(5)
    assert order.index("small ran") < order.index("a done")  # did not wait for a's turn
    assert order.index("a done") < order.index("b got spark")  # b waited for it
    ctx.release_spark_turn()  # a thread without a turn: nothing to release
    assert not ctx.spark_turns.locked()


def test_a_batch_above_a_quarter_of_the_drivers_limits_takes_the_turn_too():
    """The driver reads batches up to --driver-rows rows and DRIVER_BYTES itself; with table
    workers only one batch above a quarter of either limit is held at once (and no table
    that needs Spark beside it), so four workers hold at most about twice one table's."""
    from airflow_pgcdc.merge.context import JobContext
    from airflow_pgcdc.merge.rows.arrow import DRIVER_BYTES
    from airflow_pgcdc.merge.sinks.table import _fits_driver

    ctx = JobContext(session=object(), layout=None, client=None, fs=None, storage={}, slot="s", delta="d",
                     run_id="r", s3_options={}, driver_rows=100, spark_turns=threading.Lock())
    assert _fits_driver(ctx, 20, 1000) and not ctx.spark_turns.locked()  # small: no turn
    assert not _fits_driver(ctx, 101, 1000) and not ctx.spark_turns.locked()  # Spark's: it asks later
    assert _fits_driver(ctx, 30, 1000) and ctx.spark_turns.locked()  # above 25 rows: the turn
    assert _fits_driver(ctx, 30, 1000)  # the same thread again: no wait for itself
    ctx.release_spark_turn()
    assert _fits_driver(ctx, 1, DRIVER_BYTES // 4 + 1) and ctx.spark_turns.locked()  # by bytes too
    ctx.release_spark_turn()
    one_at_a_time = JobContext(session=object(), layout=None, client=None, fs=None, storage={}, slot="s",
                               delta="d", run_id="r", s3_options={}, driver_rows=100)
    assert _fits_driver(one_at_a_time, 90, 1000)  # no workers: nothing to take


@pytest.mark.parametrize("tables", [3, 12])
def test_the_first_pass_keeps_open_logs_only_for_a_job_of_few_tables(monkeypatch, tables):
    """Each table's log is read once in the job's first pass; it is kept for the table's
    merge when the job has few tables, and dropped (only the merged version kept) when it
    has many: holding every table's open log made a 10,000-table merge peak at 2 GB."""
    from airflow_pgcdc.merge import windows
    from airflow_pgcdc.merge.context import JobContext

    opened = []
    monkeypatch.setattr(windows, "open_table", lambda url, storage: opened.append(url) or f"dt:{url}")
    monkeypatch.setattr(windows, "merged_version", lambda dt, app: 4)
    monkeypatch.setattr(windows, "KEEP_OPEN_TABLES", 5)
    ctx = JobContext(session=object(), layout=None, client=None, fs=None, storage={}, slot="s", delta="d",
                     run_id="r", s3_options={}, table_workers=4)
    wanted = [("s", f"t{i}") for i in range(tables)]
    ctx.urls.update({name: f"d/{name[1]}" for name in wanted})  # where each table is (no S3 here)
    assert windows._merged_floor(ctx, wanted, through=9, last_seen={name: 6 for name in wanted}) == 4
    assert sorted(opened) == sorted(f"d/{t}" for _, t in wanted)  # each log read once, every table
    assert len(ctx.loaded) == (tables if tables <= 5 else 0)
