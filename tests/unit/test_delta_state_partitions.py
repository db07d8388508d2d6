"""How many partitions Delta's Spark engine builds a table's state in, around a statement
of the delta-spark sink (:func:`airflow_pgcdc.merge.sinks.deltaspark.sized_state`): sized by the
table's files, Delta's default 50 only for the largest, and never over a job's own
setting. Pure code: the session's conf is a stand-in dict."""

from __future__ import annotations

import pytest

from airflow_pgcdc.merge.sinks.deltaspark import (
    FILES_PER_STATE_PARTITION,
    sized_state,
    state_partitions,
)

KEY = "spark.databricks.delta.snapshotPartitions"


class _Conf:
    def __init__(self, values):
        self.values = dict(values)

    def get(self, key, default=None):
        return self.values.get(key, default)

    def set(self, key, value):
        self.values[key] = value

    def unset(self, key):
        self.values.pop(key, None)


class _Session:
    def __init__(self, **values):
        self.conf = _Conf(values)


@pytest.mark.parametrize(("files", "parts"), [
    (0, 1), (1, 1), (FILES_PER_STATE_PARTITION, 1), (FILES_PER_STATE_PARTITION + 1, 2),
    (10 * FILES_PER_STATE_PARTITION, 10), (10_000_000, 50), (-3, 1),
])
def test_partitions_follow_the_files(files, parts):
    assert state_partitions(files) == parts


def test_set_around_the_statement_and_removed_after():
    s = _Session()
    with sized_state(s, 12):
        assert s.conf.get(KEY) == "1"
    assert KEY not in s.conf.values


def test_removed_after_a_failed_statement():
    s = _Session()
    with pytest.raises(RuntimeError), sized_state(s, 3 * FILES_PER_STATE_PARTITION):
        assert s.conf.get(KEY) == "3"
        raise RuntimeError("the MERGE failed")
    assert KEY not in s.conf.values


def test_the_jobs_own_setting_is_kept():
    s = _Session(**{KEY: "200"})  # --conf spark.databricks.delta.snapshotPartitions=200
    with sized_state(s, 12):
        assert s.conf.get(KEY) == "200"
    assert s.conf.get(KEY) == "200"


def test_no_session_no_change():
    with sized_state(None, 12):
        pass
