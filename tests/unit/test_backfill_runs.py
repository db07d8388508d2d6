"""``airflow_pgcdc.operators.runs``: a task of the live pipeline refuses Airflow backfill runs
(their logical date names a past interval no drain can read) and takes part in every other
run type. The DAG run itself is tested in ``tests/integration/test_dags.py``."""

from __future__ import annotations

import datetime
from types import SimpleNamespace

import pytest
from airflow.sdk.api.datamodels._generated import DagRunType

from airflow_pgcdc.hooks.compat import AirflowFailException
from airflow_pgcdc.operators.runs import refuse_backfill_run, run_type


def context(kind):
    run = SimpleNamespace(run_type=kind, run_id="backfill__2024-06-01T00:00:00+00:00",
                          logical_date=datetime.datetime(2024, 6, 1, tzinfo=datetime.UTC))
    return {"dag_run": run}


@pytest.mark.parametrize("kind", [DagRunType.MANUAL, "scheduled", "asset_triggered", None])
def test_other_runs_pass(kind):
    refuse_backfill_run(context(kind), "drain d")
    assert refuse_backfill_run({}, "drain d") is None  # no dag_run in the context at all


@pytest.mark.parametrize("kind", [DagRunType.BACKFILL, "backfill"])
def test_a_backfill_run_is_refused_with_what_to_do(kind):
    assert run_type(context(kind)) == "backfill"
    with pytest.raises(AirflowFailException) as e:
        refuse_backfill_run(context(kind), "drain d (slot s)")
    text = str(e.value)
    assert "drain d (slot s)" in text and "backfill__2024-06-01T00:00:00+00:00" in text and "2024-06-01" in text
    assert "pgcdc_backfill" in text and "pgcdc resync" in text
