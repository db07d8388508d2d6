"""``PgcdcSparkMergeOperator`` when the job failed some tables and merged the others
(``TablesFailed``: exit 1 after the result line), without servers: the pure helpers, and
the operator through a stand-in ``spark-submit`` that prints a result and exits 1."""

from __future__ import annotations

import json
import os
import stat

import pytest
from airflow.sdk import AssetAlias
from outlet_events import OutletEvents

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

# what the XCom adds to a result of three tables (all listed)
SUMMED = {"actions": {"bootstrapped+merged": 1, "failed": 1, "no-changes": 1},
          "rows": {"bootstrap_rows": 0, "change_rows": 0, "merged_rows": 0}, "tables_total": 3, "tables_omitted": 0}


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


class _Events(OutletEvents):
    def __init__(self) -> None:
        super().__init__(_Event)


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
    assert ti.pushed == {"return_value": {**RESULT, **SUMMED}}
    assert all(not ev.added and not ev.extra for ev in events.values())  # Airflow would drop them anyway


def test_succeed_mode_emits_the_moved_tables_events(failing_spark):
    op = PgcdcSparkMergeOperator(task_id="m", store="s3://b/cdc", slot="shop", delta="s3://b/lake",
                                 on_failed_tables="succeed")
    events = _Events()
    assert op.execute({"outlet_events": events, "ti": _TI()}) == {**RESULT, **SUMMED}
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
    # every table merged but the metastore not told (--catalog): the run still fails, saying so
    merged = {**RESULT, "tables": [RESULT["tables"][0]]}
    with pytest.raises(PgcdcTablesFailed, match="left its catalog behind: CatalogError: cannot reach"):
        check.execute({"ti": _TI({**merged, "catalog": {"error": "CatalogError: cannot reach the Hive Metastore"}})})
    assert check.execute({"ti": _TI({**merged, "catalog": {"public.ok": "updated"}})}) == {"failed": []}


def _many(n_quiet: int, n_merged: int, n_failed: int) -> dict:
    """A result of many tables: quiet ones first, then merged, then failed (the job's order)."""
    tables = [{"table": f"public.q{i:05}", "delta_url": f"s3://b/lake/public.q{i:05}", "action": "no-changes"}
              for i in range(n_quiet)]
    tables += [{"table": f"public.m{i}", "delta_url": f"s3://b/lake/public.m{i}", "action": "merged",
                "change_rows": 2, "merged_rows": 2, "last_window": 7, "delta_version": 3} for i in range(n_merged)]
    tables += [{"table": f"public.f{i}", "delta_url": f"s3://b/lake/public.f{i}", "action": "failed",
                "error": "MergeError: boom", "hint": "fix it"} for i in range(n_failed)]
    return {**RESULT, "tables": tables, "detail": "s3://b/cdc/shop/merge-results/20261129T000000Z-00000000.json"}


def test_a_result_of_many_tables_is_summed_up_in_the_xcom_and_the_log(failing_spark, capfd):
    big = _many(3000, 150, 2)
    (failing_spark / "result.json").write_text(json.dumps(big))
    op = PgcdcSparkMergeOperator(task_id="m", store="s3://b/cdc", slot="shop", delta="s3://b/lake",
                                 on_failed_tables="succeed", xcom_tables="40")
    events = _Events()
    out = op.execute({"outlet_events": events, "ti": _TI()})
    # the failed tables first, then those that got a commit, 40 in all; the quiet ones counted only
    assert [t["table"] for t in out["tables"]] == ["public.f0", "public.f1", *(f"public.m{i}" for i in range(38))]
    assert out["actions"] == {"failed": 2, "merged": 150, "no-changes": 3000}
    assert out["rows"] == {"bootstrap_rows": 0, "change_rows": 300, "merged_rows": 300}
    assert (out["tables_total"], out["tables_omitted"]) == (3152, 3112)
    assert out["detail"] == big["detail"]
    assert len(json.dumps(out)) < 20_000
    # every committed table still gets its Asset event: they come from the whole result
    assert len(events[AssetAlias(name="pgcdc-delta-shop")].added) == 150
    logged = "".join(capfd.readouterr())  # the task's log (structlog writes to the process' streams)
    assert "PGCDC_MERGE_RESULT (summed up:" in logged and "public.q00001" not in logged
    assert "3152 table(s): 2 failed, 150 merged, 3000 no-changes (3000 with nothing to merge" in logged


def test_the_check_operator_fails_on_failed_tables_its_summary_does_not_list():
    summed = {**RESULT, "tables": [], "actions": {"failed": 30, "merged": 5}, "tables_total": 35,
              "tables_omitted": 35, "detail": "s3://b/cdc/shop/merge-results/x.json"}
    check = PgcdcMergeCheckOperator(task_id="c", merge_task_id="m")
    with pytest.raises(PgcdcTablesFailed, match=r"30 of 35 table\(s\) not merged") as e:
        check.execute({"ti": _TI(pulled=summed)})
    assert "and 30 more: every one in s3://b/cdc/shop/merge-results/x.json" in str(e.value)


def test_the_message_names_twenty_failed_tables_and_counts_the_rest():
    msg = tables_failed_message(_many(0, 25, 23)).splitlines()
    assert msg[0].startswith("23 of 48 table(s) not merged (merged and committed: public.m0, ")
    assert msg[0].endswith("public.m19 and 5 more):")
    assert len(msg) == 1 + 20 + 1 and msg[-1].startswith("  and 3 more: every one in s3://b/cdc/")


@pytest.mark.parametrize("bad", [-1, "many", 2.5])
def test_a_bad_xcom_tables_fails_when_the_dag_is_parsed(bad):
    with pytest.raises(ValueError, match="xcom_tables must be an integer"):
        PgcdcSparkMergeOperator(task_id="m", store="s3://b/cdc", slot="shop", delta="s3://b/lake", xcom_tables=bad)
