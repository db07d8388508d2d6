"""The DAG runner's reading of a run's output (:mod:`airflow_pgcdc.testing.dagrun`)."""

from airflow_pgcdc.testing.dagrun import _once


def test_a_record_airflow_3_0_logs_twice_is_read_once():
    text = ("[2026-11-29 17:41:29,203] {spark_submit.py:474} INFO - Spark-Submit cmd: a\n"
            "[2026-11-29T17:41:29.203+0000] {spark_submit.py:474} INFO - Spark-Submit cmd: a\n")
    assert _once(text).count("Spark-Submit cmd") == 1


def test_lines_that_are_not_one_record_are_all_kept():
    text = ("[2026-11-29T17:41:29.203+0000] {x.py:1} INFO - same\n"
            "[2026-11-29T17:41:29.204+0000] {x.py:1} INFO - same\n"  # a millisecond later: a second record
            "[2026-11-29T17:41:29.204+0000] {x.py:1} INFO - other\n"
            "plain\nplain\n")
    assert _once(text) == text
