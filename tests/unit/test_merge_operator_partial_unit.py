"""``PgcdcSparkMergeOperator`` when the job failed some tables and merged the others
(``TablesFailed``: exit 1 after the result line), without servers: the pure helpers, and
the operator through a stand-in ``spark-submit`` that prints a result and exits 1."""

from __future__ import annotations

import json
import os
import stat

import pytest
from airflow.sdk import AssetAlias

from airflow_pgcdc.merge.spark_app import RESULT_PREFIX
from airflow_pgcdc.operators.merge import (
    PgcdcMergeCheckOperator,
    PgcdcSparkMergeOperator,
    PgcdcTablesFailed,
    failed_tables,
    merged_tables,
    tables_failed_message,
)

RESULT = {
    "slot": "shop", "source": "s3://b/cdc", "delta": "s3://b/lake", "seconds": 1.0,
    "tables": [
        {"table": "public.good", "delta_url": "s3://b/lake/public.good", "action": "bootstrapped+merged",
         "first_window": 0, "last_window": 1, "start_lsn": "0/10", "end_lsn": "0/90", "delta_version": 1},
        {"table": "public.bad", "delta_url": "s3://b/lake/public.bad", "action": "failed",
         "error": "MergeError: columns Name and name differ only in case", "hint": "rename one, then pgcdc resync"},
        {"table": "public.quiet", "delta_url": "s3://b/lake/public.quiet", "action": "no-changes"},
    ],
}


def test_failed_and_merged_tables_and_the_message():
    assert [t["table"] for t in failed_tables(RESULT)] == ["public.bad"]
    assert [t["table"] for t in merged_tables(RESULT)] == ["public.good"]
    assert failed_tables(None) == [] and merged_tables({}) == []
    msg = tables_failed_message(RESULT)
    assert msg.splitlines() == [
        "1 of 3 table(s) not merged (merged and committed: public.good):",
        "  public.bad: MergeError: columns Name and name differ only in case (hint: rename one, then pgcdc resync)",
    ]


@pytest.fixture
def failing_spark(tmp_path, monkeypatch):
    """``spark-submit`` that prints the result line of a job that failed one table, then
    exits 1 as ``spark_app.py`` does on ``TablesFailed``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "result.json").write_text(json.dumps(RESULT))
    script = bin_dir / "spark-submit"
    script.write_text(f"""#!/bin/sh
printf '{RESULT_PREFIX}'; cat {tmp_path}/result.json; echo
echo "pgcdc merge: error: 1 of 3 table(s) not merged" >&2
exit 1
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[*]"}))
    return tmp_path


class _Event:
    def __init__(self):
        self.extra = {}
        self.added = []

    def add(self, asset, extra=None):
        self.added.append((asset, extra))


class _Events(dict):
    def __missing__(self, key):
        self[key] = _Event()
        return self[key]


class _TI:
    def __init__(self, pulled=None):
        self.pushed = {}
        self.pulled = pulled

    def xcom_push(self, key, value):
        self.pushed[key] = value

    def xcom_pull(self, task_ids=None, key=None):
        return self.pulled


def test_fail_mode_fails_naming_the_tables_and_pushes_the_result(failing_spark):
    op = PgcdcSparkMergeOperator(task_id="m", store="s3://b/cdc", slot="shop", delta="s3://b/lake")
    events, ti = _Events(), _TI()
    with pytest.raises(PgcdcTablesFailed, match=r"public\.bad: MergeError: columns Name") as e:
        op.execute({"outlet_events": events, "ti": ti})
    assert "merged and committed: public.good" in str(e.value)
    assert ti.pushed == {"return_value": RESULT}
    assert all(not ev.added and not ev.extra for ev in events.values())  # Airflow would drop them anyway


def test_succeed_mode_emits_the_moved_tables_events(failing_spark):
    op = PgcdcSparkMergeOperator(task_id="m", store="s3://b/cdc", slot="shop", delta="s3://b/lake",
                                 on_failed_tables="succeed")
    events = _Events()
    assert op.execute({"outlet_events": events, "ti": _TI()}) == RESULT
    added = events[AssetAlias(name="pgcdc-delta-shop")].added
    assert [(a.uri, x["action"]) for a, x in added] == [("s3://b/lake/public.good", "bootstrapped+merged")]


def test_exit_1_without_failed_tables_is_the_submit_error(failing_spark):
    ok = {**RESULT, "tables": [RESULT["tables"][0]]}
    (failing_spark / "result.json").write_text(json.dumps(ok))
    op = PgcdcSparkMergeOperator(task_id="m", store="s3://b/cdc", slot="shop", delta="s3://b/lake",
                                 on_failed_tables="succeed")
    with pytest.raises(Exception, match="Error code is: 1"):
        op.execute({"outlet_events": _Events(), "ti": _TI()})


def test_bad_on_failed_tables_is_refused():
    with pytest.raises(ValueError, match="on_failed_tables must be one of fail, succeed"):
        PgcdcSparkMergeOperator(task_id="m", store="s", slot="s", delta="d", on_failed_tables="ignore")


def test_check_operator():
    check = PgcdcMergeCheckOperator(task_id="c", merge_task_id="merge")
    with pytest.raises(PgcdcTablesFailed, match=r"public\.bad"):
        check.execute({"ti": _TI(RESULT)})
    assert check.execute({"ti": _TI({**RESULT, "tables": [RESULT["tables"][0]]})}) == {"failed": []}
    with pytest.raises(Exception, match="no merge result from task 'merge'"):
        check.execute({"ti": _TI(None)})
