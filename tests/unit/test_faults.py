"""The fault points (airflow_pgcdc/faults.py): named once, checked by name, inert unless asked.
The kill itself is exercised by the crash tests (test_drain_crash, test_merge's killed merges)."""

from __future__ import annotations

import pytest

from airflow_pgcdc.faults import DRAIN_POINTS, FaultPoint, armed, fault_after, fault_point


def test_the_drain_points_in_the_order_a_window_reaches_them():
    assert [str(p) for p in DRAIN_POINTS] == [
        "after-receive", "during-upload", "after-parts", "after-manifest", "after-ack"]
    assert FaultPoint("merge-after-commit") is FaultPoint.MERGE_AFTER_COMMIT


def test_a_name_that_is_not_a_point_is_refused(monkeypatch):
    monkeypatch.setenv("PGCDC_FAULT", "after-recieve")
    with pytest.raises(ValueError, match="after-recieve"):
        fault_point("after-recieve")


def test_inert_unless_the_environment_names_the_point(monkeypatch):
    monkeypatch.delenv("PGCDC_FAULT", raising=False)
    monkeypatch.delenv("PGCDC_PAUSE", raising=False)
    fault_point(FaultPoint.MERGE_AFTER_STAGE)  # nothing happens
    assert not armed(FaultPoint.DRAIN_AFTER_RECEIVE) and fault_after() is None
    monkeypatch.setenv("PGCDC_FAULT", "after-receive")
    monkeypatch.setenv("PGCDC_FAULT_AFTER", "3")
    assert armed(FaultPoint.DRAIN_AFTER_RECEIVE) and fault_after() == 3
    fault_point(FaultPoint.DRAIN_AFTER_PARTS)  # another point: still alive


def test_a_pause_happens_once_and_leaves_its_marker(monkeypatch, tmp_path):
    marker = tmp_path / "paused"
    monkeypatch.delenv("PGCDC_FAULT", raising=False)
    monkeypatch.setenv("PGCDC_PAUSE", "merge-after-stage")
    monkeypatch.setenv("PGCDC_PAUSE_FILE", str(marker))
    monkeypatch.setenv("PGCDC_PAUSE_SECONDS", "0")
    fault_point(FaultPoint.MERGE_AFTER_STAGE)
    assert marker.read_text() == "merge-after-stage"
    marker.unlink()
    fault_point(FaultPoint.MERGE_AFTER_STAGE)
    assert not marker.exists()
