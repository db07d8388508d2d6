"""The DAG runner of the tests: :mod:`airflow_pgcdc.testing.dagrun` (shared with ``make demo``),
a reader of the Asset events a run left in its metadata DB, and (from
:mod:`airflow_pgcdc.testing.observe`, shared with ``make demo``) OpenLineage's file transport and
a StatsD listener."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from airflow_pgcdc.testing.dagrun import DagRunResult, airflow_env, migrate, run_dag
from airflow_pgcdc.testing.observe import StatsdListener, lineage_env, lineage_events

__all__ = ["DagRunResult", "StatsdListener", "airflow_env", "asset_events", "lineage_env", "lineage_events",
           "migrate", "run_dag", "xcom_values"]


def asset_events(home: Path) -> list[dict]:
    """Every Asset event in the metadata DB of ``home`` (an ``AIRFLOW_HOME``): uri, extra,
    source task, and the aliases it came through."""
    with sqlite3.connect(Path(home) / "airflow.db") as db:
        rows = db.execute(
            "SELECT a.uri, e.extra, e.source_task_id, "
            "(SELECT group_concat(al.name) FROM asset_alias_asset_event x "
            " JOIN asset_alias al ON al.id = x.alias_id WHERE x.event_id = e.id) "
            "FROM asset_event e JOIN asset a ON a.id = e.asset_id ORDER BY e.id"
        ).fetchall()
    return [{"uri": u, "extra": json.loads(x), "task": t, "aliases": al} for u, x, t, al in rows]


def xcom_values(home: Path, task: str, key: str) -> list:
    """Every value task ``task`` left in XCom under ``key`` in the metadata DB of ``home`` (an
    ``AIRFLOW_HOME``), oldest first (an operator's extra link: ``_link_{class name}``)."""
    with sqlite3.connect(Path(home) / "airflow.db") as db:
        rows = db.execute("SELECT value FROM xcom WHERE task_id = ? AND key = ? ORDER BY timestamp",
                          (task, key)).fetchall()
    return [json.loads(v) if isinstance(v, (str, bytes)) else v for (v,) in rows]
