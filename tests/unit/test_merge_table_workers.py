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
