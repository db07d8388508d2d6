"""``PgcdcSparkMergeOperator`` without servers: what it submits (arguments, conf,
environment), how it reads the result back, and which Asset events it emits — the
last two through a stand-in ``spark-submit`` script."""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from pathlib import Path

import pytest
from airflow.sdk import Asset, AssetAlias
from outlet_events import OutletEvents

from airflow_pgcdc.merge.options import parse_keys
from airflow_pgcdc.merge.session import SPARK_CONF
from airflow_pgcdc.merge.spark_app import RESULT_PREFIX, add_arguments
from airflow_pgcdc.operators.merge import (
    PgcdcMergeSubmitHook,
    PgcdcSparkMergeOperator,
    delta_alias,
    merge_application_args,
    merge_spark_conf,
    parse_result_line,
    s3_env,
)
from airflow_pgcdc.store.s3 import S3Settings

SECRET = "s3cr3t/Key+with=chars"


def test_application_args_parse_back_with_the_apps_own_parser():
    import argparse

    args = merge_application_args(
        store="s3://b/cdc", slot="shop", delta="s3://b/lake", tables=["public.a", "s.b"],
        keys={"public.a": ["k1", "k2"], "my.schema.t": ("id",)}, max_windows=3,
    )
    assert args == ["--store", "s3://b/cdc", "--slot", "shop", "--delta", "s3://b/lake",
                    "--tables", "public.a", "s.b", "--key", "public.a=k1,k2", "--key", "my.schema.t=id",
                    "--max-windows", "3"]
    p = argparse.ArgumentParser()
    add_arguments(p)
    ns = p.parse_args(args)
    assert (ns.store, ns.slot, ns.delta, ns.tables, ns.max_windows) == (
        "s3://b/cdc", "shop", "s3://b/lake", ["public.a", "s.b"], 3)
    assert parse_keys(ns.key) == {"public.a": ["k1", "k2"], "my.schema.t": ["id"]}


def test_application_args_history_engine_reader_parse_back():
    import argparse

    args = merge_application_args(store="s3://b/p", slot="s", delta="s3://b/l", history="scd2",
                                  engine="delta-spark", reader="s3a")
    assert args[6:] == ["--history", "scd2", "--engine", "delta-spark", "--reader", "s3a"]
    p = argparse.ArgumentParser()
    add_arguments(p)
    ns = p.parse_args(args)
    assert (ns.history, ns.engine, ns.reader) == ("scd2", "delta-spark", "s3a")
    ns = p.parse_args(merge_application_args(store="s3://b/p", slot="s", delta="s3://b/l"))
    assert (ns.history, ns.engine, ns.reader) == (None, "delta-rs", "python"), "the app's defaults"


def test_until_point_args_parse_back_and_are_templated():
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = merge_application_args(store="s3://b/p", slot="s", delta="s3://b/l", until_time="2026-11-29T06:00:00+00:00")
    assert args[6:] == ["--until-time", "2026-11-29T06:00:00+00:00"]
    ns = p.parse_args(args)
    assert (ns.until_time, ns.until_lsn) == ("2026-11-29T06:00:00+00:00", None)
    assert p.parse_args(merge_application_args(store="s3://b/p", slot="s", delta="s3://b/l",
                                               until_lsn="0/16B3748")).until_lsn == "0/16B3748"
    with pytest.raises(ValueError, match="not both"):
        merge_application_args(store="s3://b/p", slot="s", delta="s3://b/l", until_lsn="0/1", until_time="x")
    op = PgcdcSparkMergeOperator(task_id="m", slot="s", store="s3://b/p", delta="s3://b/l",
                                 until_time="{{ data_interval_end }}")
    assert {"until_lsn", "until_time"} <= set(op.template_fields)


def test_application_args_minimal_and_bad_keys():
    assert merge_application_args(store="s3://b/p", slot="s", delta="s3://b/l") == [
        "--store", "s3://b/p", "--slot", "s", "--delta", "s3://b/l"]
    for bad in ([], ["a,b"], [""]):
        with pytest.raises(ValueError, match="keys"):
            merge_application_args(store="s3://b/p", slot="s", delta="s3://b/l", keys={"t": bad})


def test_spark_conf_defaults_python_and_user_override():
    conf = merge_spark_conf()
    assert {k: conf[k] for k in SPARK_CONF} == SPARK_CONF
    assert conf["spark.pyspark.python"] == conf["spark.pyspark.driver.python"] == sys.executable
    conf = merge_spark_conf({"spark.sql.shuffle.partitions": "64", "spark.pyspark.python": "/opt/py"}, python="/x/py")
    assert conf["spark.sql.shuffle.partitions"] == "64" and conf["spark.pyspark.python"] == "/opt/py"
    assert conf["spark.pyspark.driver.python"] == "/x/py"


def test_s3_env_has_set_fields_only():
    env = s3_env(S3Settings(endpoint_url="http://127.0.0.1:9000", access_key_id="AK", secret_access_key=SECRET,
                            region="eu-west-1"))
    assert env == {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9000",
                   "AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": SECRET,
                   "AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "eu-west-1"}
    assert s3_env(S3Settings()) == {}
    assert s3_env(S3Settings(session_token="tok"))["AWS_SESSION_TOKEN"] == "tok"


def test_result_line():
    assert parse_result_line("26/11/23 INFO something") is None
    assert parse_result_line(RESULT_PREFIX + '{"slot": "s", "tables": []}') == {"slot": "s", "tables": []}
    assert parse_result_line("noise " + RESULT_PREFIX + '{"a": 1}') == {"a": 1}
    with pytest.raises(ValueError, match="unreadable"):
        parse_result_line(RESULT_PREFIX + "{truncated")
    with pytest.raises(ValueError, match="not a JSON object"):
        parse_result_line(RESULT_PREFIX + "[1]")


def test_operator_fields_conf_and_outlets():
    op = PgcdcSparkMergeOperator(task_id="m", store="s3://b/cdc", slot="shop", delta="s3://b/lake",
                                 conf={"spark.executor.memory": "2g"}, py_files="/x/extra.zip")
    for f in ("store", "slot", "delta", "tables", "max_windows", "application_args", "conf", "env_vars"):
        assert f in op.template_fields
    assert Path(op.application).name == "spark_app.py" and Path(op.application).is_file()
    assert op.conf["spark.executor.memory"] == "2g" and op.conf["spark.sql.session.timeZone"] == "UTC"
    assert op.outlets == [AssetAlias(name="pgcdc-delta-shop")]
    templated = PgcdcSparkMergeOperator(task_id="m2", store="s3://b/cdc", slot="{{ params.slot }}", delta="s3://b/l")
    assert templated.outlets == [delta_alias(None)] == [AssetAlias(name="pgcdc-delta")]
    with pytest.raises(TypeError, match="application_args"):
        PgcdcSparkMergeOperator(task_id="m3", store="s", slot="s", delta="d", application_args=["x"])
    with pytest.raises(ValueError, match="keys"):
        PgcdcSparkMergeOperator(task_id="m4", store="s", slot="s", delta="d", keys={"t": []})


@pytest.mark.parametrize(("tables", "expect"), [
    (None, None), ("None", None), ("", None), ("public.a, s.b", ["public.a", "s.b"]),
    ("public.a s.b", ["public.a", "s.b"]), (["public.a"], ["public.a"]), ([], None),
])
def test_rendered_tables(tables, expect):
    op = PgcdcSparkMergeOperator(task_id="m", store="s", slot="s", delta="d", tables=tables)
    assert op._tables() == expect


@pytest.mark.parametrize(("value", "expect"), [(None, None), ("None", None), ("", None), ("4", 4), (2, 2)])
def test_rendered_max_windows(value, expect):
    op = PgcdcSparkMergeOperator(task_id="m", store="s", slot="s", delta="d", max_windows=value)
    assert op._max_windows() == expect


def test_max_windows_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        PgcdcSparkMergeOperator(task_id="m", store="s", slot="s", delta="d", max_windows="0")._max_windows()


# --------------------------------------------------------------------------- a stand-in spark-submit

RESULT = {
    "slot": "shop", "source": "s3://b/cdc", "delta": "s3://b/lake", "seconds": 1.0,
    "tables": [
        {"table": "public.a", "delta_url": "s3://b/lake/public.a", "action": "bootstrapped+merged",
         "first_window": 0, "last_window": 2, "start_lsn": "0/10", "end_lsn": "0/90", "delta_version": 1},
        {"table": "public.b", "delta_url": "s3://b/lake/public.b", "action": "merged",
         "first_window": 1, "last_window": 2, "start_lsn": "0/40", "end_lsn": "0/90", "delta_version": 7},
        {"table": "public.c", "delta_url": "s3://b/lake/public.c", "action": "up-to-date",
         "first_window": None, "last_window": None, "start_lsn": None, "end_lsn": None, "delta_version": 3},
    ],
}


@pytest.fixture
def fake_spark(tmp_path, monkeypatch):
    """``spark-submit`` on PATH that records its arguments and environment, then prints
    noise, the result line and more noise (as Spark's shutdown logging does)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "result.json").write_text(json.dumps(RESULT))
    script = bin_dir / "spark-submit"
    script.write_text(f"""#!/bin/sh
printf '%s\\n' "$@" > {tmp_path}/args.txt
env > {tmp_path}/env.txt
echo "26/11/23 07:57:45 INFO SparkContext: Running Spark version 4.2.0"
printf '{RESULT_PREFIX}'; cat {tmp_path}/result.json; echo
echo "26/11/23 07:58:33 INFO ShutdownHookManager: Shutdown hook called"
exit "${{FAKE_EXIT:-0}}"
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[*]"}))
    monkeypatch.setenv("AIRFLOW_CONN_S3", json.dumps({
        "conn_type": "aws", "login": "AKIDEXAMPLE", "password": SECRET,
        "extra": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"}}))
    for k in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(k)
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


def test_execute_submits_reads_the_result_and_emits_asset_events(fake_spark):
    declared = Asset(uri="s3://b/lake/public.b")
    op = PgcdcSparkMergeOperator(
        task_id="m", store="s3://b/cdc", slot="shop", delta="s3://b/lake", tables="public.a,public.b",
        keys={"public.a": ["id"]}, max_windows="5", aws_conn_id="s3",
        outlets=[AssetAlias(name="lake"), declared], env_vars={"EXTRA": "1"},
    )
    events = _Events()
    out = op.execute({"outlet_events": events})
    assert out == {**RESULT, "actions": {"bootstrapped+merged": 1, "merged": 1, "up-to-date": 1}, "tables_total": 3,
                   "rows": {"bootstrap_rows": 0, "change_rows": 0, "merged_rows": 0}, "tables_omitted": 0}
    args = (fake_spark / "args.txt").read_text().splitlines()
    cmd = " ".join(args)
    assert args[args.index("--master") + 1] == "local[*]"
    assert "spark.ui.enabled=false" in args and f"spark.pyspark.python={sys.executable}" in args
    zip_path = args[args.index("--py-files") + 1]
    assert zip_path.endswith("/airflow_pgcdc.zip") and not Path(zip_path).exists()  # a per-run temp dir
    app = args.index(op.application)
    assert args[app + 1:] == ["--store", "s3://b/cdc", "--slot", "shop", "--delta", "s3://b/lake",
                              "--tables", "public.a", "public.b", "--key", "public.a=id", "--max-windows", "5"]
    assert SECRET not in cmd and "AKIDEXAMPLE" not in cmd
    env = dict(line.split("=", 1) for line in (fake_spark / "env.txt").read_text().splitlines() if "=" in line)
    assert env["AWS_SECRET_ACCESS_KEY"] == SECRET and env["AWS_ACCESS_KEY_ID"] == "AKIDEXAMPLE"
    assert env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000" and env["AWS_REGION"] == "eu-west-1"
    assert env["EXTRA"] == "1"
    # nothing secret stays on the operator (its template fields are rendered and stored)
    assert SECRET not in repr(op.env_vars) and SECRET not in repr(op.conf)
    # public.a through the alias, public.b on the declared Asset, public.c (no commit) none
    alias_events = events[AssetAlias(name="lake")].added
    assert [(a.uri, e) for a, e in alias_events] == [("s3://b/lake/public.a", {
        "window_seq": 2, "start_lsn": "0/10", "end_lsn": "0/90", "delta_version": 1, "action": "bootstrapped+merged"})]
    assert events[declared].extra == {"window_seq": 2, "start_lsn": "0/40", "end_lsn": "0/90",
                                      "delta_version": 7, "action": "merged"}
    assert isinstance(op._hook, PgcdcMergeSubmitHook)


def test_no_result_line_is_an_error(fake_spark):
    (fake_spark / "result.json").write_text("")  # the prefix alone, then nothing parseable
    op = PgcdcSparkMergeOperator(task_id="m", store="s3://b/cdc", slot="shop", delta="s3://b/lake")
    with pytest.raises(RuntimeError, match="merge result is unknown: unreadable"):
        op.execute({"outlet_events": _Events()})
    script = fake_spark / "bin" / "spark-submit"
    script.write_text(script.read_text().replace(f"printf '{RESULT_PREFIX}'", "printf ''"))
    (fake_spark / "result.json").write_text("{}")
    op = PgcdcSparkMergeOperator(task_id="m", store="s3://b/cdc", slot="shop", delta="s3://b/lake")
    with pytest.raises(RuntimeError, match="no PGCDC_MERGE_RESULT line"):
        op.execute({"outlet_events": _Events()})


def test_failed_submit_fails_the_task(fake_spark, monkeypatch):
    monkeypatch.setenv("FAKE_EXIT", "1")
    op = PgcdcSparkMergeOperator(task_id="m", store="s3://b/cdc", slot="shop", delta="s3://b/lake")
    with pytest.raises(Exception, match="Error code is: 1"):
        op.execute({"outlet_events": _Events()})


def test_cluster_deploy_mode_is_refused(fake_spark):
    op = PgcdcSparkMergeOperator(task_id="m", store="s3://b/cdc", slot="shop", delta="s3://b/lake",
                                 deploy_mode="cluster")
    with pytest.raises(ValueError, match="client deploy mode"):
        op.execute({"outlet_events": _Events()})


def test_spark_submit_beside_the_interpreter(tmp_path, monkeypatch):
    """Not on PATH (a venv that is not activated): pyspark's own, with SPARK_HOME."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[*]"}))
    op = PgcdcSparkMergeOperator(task_id="m", store="s3://b/cdc", slot="shop", delta="s3://b/lake")
    hook = op._get_hook()
    beside = Path(sys.executable).parent / "spark-submit"
    if not beside.is_file():
        pytest.skip("pyspark installed no spark-submit beside this interpreter")
    assert hook._get_spark_binary_path() == [str(beside)]
    assert (Path(hook._env_vars["SPARK_HOME"]) / "bin" / "spark-class").is_file()


def test_target_file_mb_reaches_the_job(fake_spark):
    op = PgcdcSparkMergeOperator(task_id="m", store="s3://b/cdc", slot="shop", delta="s3://b/lake", target_file_mb=64)
    op.execute({"outlet_events": _Events()})
    args = (fake_spark / "args.txt").read_text().splitlines()
    assert args[-2:] == ["--target-file-mb", "64"]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(args[args.index(op.application) + 1:]).target_file_mb == 64.0
    assert "--target-file-mb" not in merge_application_args(store="s", slot="s", delta="d")
    with pytest.raises(ValueError, match="target_file_mb must be positive"):
        PgcdcSparkMergeOperator(task_id="m2", store="s", slot="s", delta="d", target_file_mb=0)


def test_driver_rows_reach_the_job(fake_spark):
    op = PgcdcSparkMergeOperator(task_id="m", store="s3://b/cdc", slot="shop", delta="s3://b/lake", driver_rows=0)
    op.execute({"outlet_events": _Events()})
    args = (fake_spark / "args.txt").read_text().splitlines()
    assert args[-2:] == ["--driver-rows", "0"]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(args[args.index(op.application) + 1:]).driver_rows == 0
    assert "--driver-rows" not in merge_application_args(store="s", slot="s", delta="d")
    for bad in (-1, "ten", True, 2.5, "-3"):
        with pytest.raises(ValueError, match="driver_rows must be an integer"):
            PgcdcSparkMergeOperator(task_id="m2", store="s", slot="s", delta="d", driver_rows=bad)


def test_layout_and_path_options_are_templated(fake_spark):
    """``target_file_mb``, ``deletion_vectors`` and ``driver_rows`` from a run's params (a
    template renders to a string): checked when rendered, not at parse time."""
    op = PgcdcSparkMergeOperator(task_id="m", store="s3://b/cdc", slot="shop", delta="s3://b/lake",
                                 engine="{{ params.engine }}", target_file_mb="{{ params.mb }}",
                                 deletion_vectors="{{ params.dv }}", driver_rows="{{ params.rows }}")
    assert {"target_file_mb", "deletion_vectors", "driver_rows"} <= set(op.template_fields)
    op.engine, op.target_file_mb, op.deletion_vectors, op.driver_rows = "delta-spark", "8", "true", "10"
    op.execute({"outlet_events": _Events()})
    args = (fake_spark / "args.txt").read_text().splitlines()
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parsed = parser.parse_args(args[args.index(op.application) + 1:])
    assert (parsed.target_file_mb, parsed.deletion_vectors, parsed.driver_rows) == (8.0, True, 10)
    op.deletion_vectors, op.target_file_mb = "false", "None"
    op._hook = None  # SparkSubmitOperator keeps its first hook (one execute per task instance)
    op.execute({"outlet_events": _Events()})
    args = (fake_spark / "args.txt").read_text().splitlines()
    assert "--deletion-vectors" not in args and "--target-file-mb" not in args
    for field, bad, message in (("deletion_vectors", "maybe", "deletion_vectors must be true or false"),
                                ("target_file_mb", "big", "target_file_mb must be a number"),
                                ("driver_rows", "1.5", "driver_rows must be an integer")):
        setattr(op, field, bad)
        with pytest.raises(ValueError, match=message):
            op.execute({"outlet_events": _Events()})
        setattr(op, field, None)


def test_keys_and_the_spark_connection_are_templated(fake_spark, monkeypatch):
    """``keys`` from a run's params (a dict param renders to its Python literal, or JSON) and
    ``conn_id`` rendered per run: the job gets ``--key`` and the rendered connection's master."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_SECOND", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    op = PgcdcSparkMergeOperator(task_id="m", store="s3://b/cdc", slot="shop", delta="s3://b/lake",
                                 keys="{{ params.keys }}", conn_id="{{ params.spark }}")
    assert {"keys", "conn_id"} <= set(op.template_fields)
    op.keys, op.conn_id = "{'public.nokey': ['k', 'v'], 'public.other': 'id'}", "spark_second"
    op.execute({"outlet_events": _Events()})
    args = (fake_spark / "args.txt").read_text().splitlines()
    assert args[args.index("--master") + 1] == "local[1]"
    keys = [args[i + 1] for i, a in enumerate(args) if a == "--key"]
    assert keys == ["public.nokey=k,v", "public.other=id"]
    op._hook = None
    op.keys = '{"public.nokey": ["k"]}'
    op.execute({"outlet_events": _Events()})
    args = (fake_spark / "args.txt").read_text().splitlines()
    assert [args[i + 1] for i, a in enumerate(args) if a == "--key"] == ["public.nokey=k"]
    op._hook, op.keys = None, "public.nokey"
    with pytest.raises(ValueError, match="keys must be a mapping of table to key columns"):
        op.execute({"outlet_events": _Events()})


def test_deletion_vectors_reach_the_job_with_delta_spark_only(fake_spark):
    op = PgcdcSparkMergeOperator(task_id="m", store="s3://b/cdc", slot="shop", delta="s3://b/lake",
                                 engine="delta-spark", deletion_vectors=True)
    op.execute({"outlet_events": _Events()})
    args = (fake_spark / "args.txt").read_text().splitlines()
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parsed = parser.parse_args(args[args.index(op.application) + 1:])
    assert parsed.deletion_vectors is True and parsed.engine == "delta-spark"
    assert "--deletion-vectors" not in merge_application_args(store="s", slot="s", delta="d", engine="delta-spark")
    with pytest.raises(ValueError, match="deletion_vectors needs engine='delta-spark'"):
        PgcdcSparkMergeOperator(task_id="m2", store="s", slot="s", delta="d", deletion_vectors=True)
    with pytest.raises(ValueError, match="the delta-rs engine writes none"):
        merge_application_args(store="s", slot="s", delta="d", engine="delta-rs", deletion_vectors=True)
    # a templated engine is checked when the task runs, not when the DAG is parsed
    PgcdcSparkMergeOperator(task_id="m3", store="s", slot="s", delta="d", engine="{{ params.engine }}",
                            deletion_vectors=True)


def test_rebuild_operator_submits_a_rebuild_and_announces_the_live_tables(fake_spark):
    """``PgcdcRebuildOperator``: the merge's arguments plus ``--rebuild`` and its own options
    (they parse back with the job's parser); one Asset event per live table swapped in
    (action ``rebuilt``, the live version), none for a history table."""
    from airflow_pgcdc.merge.spark_app import add_rebuild_arguments
    from airflow_pgcdc.operators.rebuild import PgcdcRebuildOperator

    swapped = [{"table": "public.a", "history": None, "live": "s3://b/lake/public.a", "window": 2, "live_version": 9},
               {"table": "public.a", "history": "changelog", "live": "s3://b/lake/public.a__changelog", "window": 2,
                "live_version": 4}]
    (fake_spark / "result.json").write_text(json.dumps(
        {**RESULT, "tables": RESULT["tables"][:1], "rebuild": {"scratch": "s3://b/x/r1", "swapped": swapped}}))
    op = PgcdcRebuildOperator(task_id="r", store="s3://b/cdc", slot="shop", delta="s3://b/lake", aws_conn_id="s3",
                              history="changelog", engine="delta-spark", deletion_vectors="true",
                              target_file_mb="64", scratch="{{ 's3://b/x/r1' }}", keep_scratch="false",
                              outlets=[AssetAlias(name="lake")])
    assert {"scratch", "swap", "keep_scratch"} <= set(op.template_fields)
    op.scratch = "s3://b/x/r1"  # as rendered
    events = _Events()
    op.execute({"outlet_events": events})
    args = (fake_spark / "args.txt").read_text().splitlines()
    job = args[args.index(op.application) + 1:]
    assert job[-3:] == ["--rebuild", "--scratch", "s3://b/x/r1"], job
    p = argparse.ArgumentParser()
    add_arguments(p)
    add_rebuild_arguments(p, flag=True)
    parsed = p.parse_args(job)
    assert (parsed.rebuild, parsed.scratch, parsed.swap, parsed.keep_scratch) == (True, "s3://b/x/r1", True, False)
    assert (parsed.engine, parsed.history, parsed.deletion_vectors, parsed.target_file_mb) == (
        "delta-spark", "changelog", True, 64.0)
    assert [(a.uri, e) for a, e in events[AssetAlias(name="lake")].added] == [("s3://b/lake/public.a", {
        "window_seq": 2, "end_lsn": "0/90", "delta_version": 9, "action": "rebuilt"})]
    op.swap, op.keep_scratch = "false", True
    assert op._application_args()[-2:] == ["--no-swap", "--keep-scratch"]


def test_merge_options_are_one_definition_for_the_call_the_command_and_the_operator(fake_spark):
    """MergeOptions: its command-line arguments parse back to the same options, and the
    operator given them as one dict of rendered text passes the same arguments as its fields."""
    from airflow_pgcdc.merge.options import BadMergeOption, MergeOptions

    full = MergeOptions(tables=["public.a", "s.b"], keys={"public.a": ["k1", "k2"]}, max_windows=3,
                        engine="delta-spark", history="scd2", reader="s3a", target_file_mb=8,
                        deletion_vectors=True, driver_rows=0, until_lsn="0/16B3748")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    ns = parser.parse_args(["--store", "s3://b/p", "--slot", "s", "--delta", "s3://b/l", *full.to_args()])
    assert MergeOptions.from_args(ns) == full
    assert MergeOptions.from_args(parser.parse_args(["--store", "x", "--slot", "s", "--delta", "d"])) == MergeOptions()
    assert MergeOptions.of({"engine": "delta-rs", "history": None}) == MergeOptions()
    for bad, message in (({"engine": "spark"}, "unknown engine"), ({"driver_rows": -1}, "driver_rows"),
                         ({"keys": {"t": []}}, "keys"), ({"until_lsn": "0/1", "until_time": "x"}, "not both")):
        with pytest.raises(BadMergeOption, match=message):
            MergeOptions.of(bad)
    with pytest.raises(TypeError, match="no option 'enigne'"):
        MergeOptions.of({"enigne": "delta-rs"})
    with pytest.raises(TypeError, match="not both"):
        MergeOptions.of(full, engine="delta-rs")

    op = PgcdcSparkMergeOperator(task_id="m", store="s3://b/cdc", slot="shop", delta="s3://b/lake",
                                 options="{{ params.merge }}")
    assert "options" in op.template_fields
    op.options = ("{'tables': 'public.a s.b', 'keys': {'public.a': ['k1', 'k2']}, 'max_windows': '3', "
                  "'engine': 'delta-spark', 'history': 'scd2', 'reader': 's3a', 'target_file_mb': '8', "
                  "'deletion_vectors': 'true', 'driver_rows': '0', 'until_lsn': '0/16B3748'}")
    assert op._application_args() == ["--store", "s3://b/cdc", "--slot", "shop", "--delta", "s3://b/lake",
                                      *full.to_args()]
    with pytest.raises(ValueError, match="not both"):
        PgcdcSparkMergeOperator(task_id="m2", store="s", slot="s", delta="d", options={"engine": "delta-spark"},
                                history="scd2")
    with pytest.raises(ValueError, match="deletion_vectors needs engine='delta-spark'"):
        PgcdcSparkMergeOperator(task_id="m3", store="s", slot="s", delta="d", options={"deletion_vectors": True})


def test_merge_slot_takes_options_or_their_fields_not_both():
    from airflow_pgcdc.merge.job import merge_slot
    from airflow_pgcdc.merge.options import MergeOptions

    with pytest.raises(TypeError, match="not both"):
        merge_slot(None, store="s3://b/p", slot="s", delta="s3://b/l", options=MergeOptions(), tables=["t"])
    with pytest.raises(TypeError, match="no option 'tabels'"):
        merge_slot(None, store="s3://b/p", slot="s", delta="s3://b/l", tabels=["t"])


def test_options_choose_the_jars_a_cluster_gets_as_the_fields_do():
    """The jars shipped to a cluster follow the engine and reader given in ``options``, as
    they follow the separate fields (a delta-spark job without them fails on the executors)."""
    master = "spark://h:7077"
    by_fields = PgcdcSparkMergeOperator(task_id="f", store="s", slot="s", delta="d", engine="delta-spark",
                                        reader="s3a")._merge_jars(master)
    by_options = PgcdcSparkMergeOperator(task_id="o", store="s", slot="s", delta="d",
                                         options={"engine": "delta-spark", "reader": "s3a"})._merge_jars(master)
    assert by_options == by_fields
    plain = PgcdcSparkMergeOperator(task_id="p", store="s", slot="s", delta="d", options={"history": "scd2"})
    assert plain._merge_jars(master) is None


def test_the_start_line_names_the_tables_and_windows_options_ask_for():
    """With options=, the start line said "tables all, max windows all" whatever the options
    asked (it read only the separate fields)."""
    op = PgcdcSparkMergeOperator(task_id="m", store="s3://b/cdc", slot="s", delta="s3://b/l",
                                 options={"tables": ["public.a", "public.b"], "max_windows": 3})
    assert op._describe().endswith("(tables public.a, public.b, max windows 3)")
    fields = PgcdcSparkMergeOperator(task_id="m2", store="s3://b/cdc", slot="s", delta="s3://b/l", tables=["x.y"])
    assert fields._describe().endswith("(tables x.y, max windows all)")
    assert PgcdcSparkMergeOperator(task_id="m3", store="s3://b/cdc", slot="s", delta="s3://b/l")._describe() \
        .endswith("(tables all, max windows all)")


def test_the_change_data_feed_and_a_table_s_own_options_reach_every_door(fake_spark):
    """``change_data_feed`` and ``table_options``: the command line parses back to the same
    options, a table's own value wins over the pipeline's, the operator (fields, or rendered
    text) passes the same arguments, and bad ones fail when the DAG is parsed, by name."""
    from airflow_pgcdc.dags.pipeline import Pipeline, PipelineConfigError
    from airflow_pgcdc.merge.options import BadMergeOption, MergeOptions, parse_table_options

    opts = MergeOptions(change_data_feed=True, metadata_columns=True, soft_deletes=True,
                        table_options={"shop.orders": {"change_data_feed": "false", "metadata_columns": "off",
                                                       "soft_deletes": False},
                                       "odd:schema.t": {"change_data_feed": True}})
    assert opts.table_options == {"shop.orders": {"change_data_feed": False, "metadata_columns": False,
                                                  "soft_deletes": False},
                                  "odd:schema.t": {"change_data_feed": True}}
    assert (opts.for_table("shop.orders", "metadata_columns"), opts.for_table("x.y", "metadata_columns")) == (
        False, True)
    assert (opts.for_table("shop.orders", "change_data_feed"), opts.for_table("shop.items", "change_data_feed"),
            opts.for_table("odd:schema.t", "change_data_feed")) == (False, True, True)
    assert MergeOptions(table_options={"a.b": {"change_data_feed": True}}).for_table("a.c", "change_data_feed") is False
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    ns = parser.parse_args(["--store", "s3://b/p", "--slot", "s", "--delta", "s3://b/l", *opts.to_args()])
    assert MergeOptions.from_args(ns) == opts
    assert parse_table_options(["a:b.c:change_data_feed=on"]) == {"a:b.c": {"change_data_feed": "on"}}
    for bad, message in ((["orders=true"], "SCHEMA.TABLE:NAME=VALUE"), (["shop.orders:cdf"], "SCHEMA.TABLE:NAME")):
        with pytest.raises(BadMergeOption, match=message):
            parse_table_options(bad)
    for bad, message in (({"shop.orders": {"cdf": True}}, "unknown option 'cdf'"),
                         ({"shop.orders": {"change_data_feed": "maybe"}}, "true or false"),
                         ({"orders": {"change_data_feed": True}}, "schema.table"),
                         ({"shop.orders": True}, "schema.table")):
        with pytest.raises(BadMergeOption, match=message):
            MergeOptions(table_options=bad)

    op = PgcdcSparkMergeOperator(task_id="m", store="s3://b/cdc", slot="shop", delta="s3://b/lake",
                                 metadata_columns="{{ params.meta }}")
    op.metadata_columns = "true"
    assert op._application_args()[-1] == "--metadata-columns"
    op = PgcdcSparkMergeOperator(task_id="sd", store="s3://b/cdc", slot="shop", delta="s3://b/lake",
                                 soft_deletes="{{ params.soft }}")
    op.soft_deletes = "true"
    assert op._application_args()[-1] == "--soft-deletes"
    by_fields = PgcdcSparkMergeOperator(task_id="f", store="s3://b/cdc", slot="shop", delta="s3://b/lake",
                                        change_data_feed=True,
                                        table_options={"shop.orders": {"change_data_feed": False}})
    templated_op = PgcdcSparkMergeOperator(task_id="t", store="s3://b/cdc", slot="shop", delta="s3://b/lake",
                                           change_data_feed="{{ params.cdf }}", table_options="{{ params.per }}")
    templated_op.change_data_feed, templated_op.table_options = "true", "{'shop.orders': {'change_data_feed': False}}"
    expected = ["--store", "s3://b/cdc", "--slot", "shop", "--delta", "s3://b/lake", "--change-data-feed",
                "--table-option", "shop.orders:change_data_feed=false"]
    assert by_fields._application_args() == expected
    assert templated_op._application_args() == expected
    assert {"change_data_feed", "table_options"} <= set(by_fields.template_fields)
    with pytest.raises(BadMergeOption, match="unknown option 'cfd'"):
        PgcdcSparkMergeOperator(task_id="b", store="s", slot="s", delta="d", table_options={"a.b": {"cfd": True}})

    base = dict(slot="shop", publication="p", store="s3://b/cdc", delta="s3://b/lake")
    p = Pipeline(**base, change_data_feed=True, table_options={"shop.orders": {"change_data_feed": False}})
    assert p.table_options == {"shop.orders": {"change_data_feed": False}}
    with pytest.raises(PipelineConfigError, match="table_options.*unknown option 'x'"):
        Pipeline(**base, table_options={"shop.orders": {"x": 1}})
    with pytest.raises(PipelineConfigError, match="change_data_feed must be true or false"):
        Pipeline(**base, change_data_feed="yes")
