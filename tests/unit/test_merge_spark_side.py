"""Pure code of the Spark side: which jars are used, the S3A settings, the delta-spark SQL."""

from __future__ import annotations

import json

import pytest

from airflow_pgcdc.merge import jars
from airflow_pgcdc.merge.clauses import build_merge_spec, build_scd2_spec
from airflow_pgcdc.merge.sinks.deltaspark import merge_sql, s3a, scd2_sql, table_ref
from airflow_pgcdc.store.s3 import S3Settings


def _fake_dir(tmp_path, complete=True, names=("delta-spark_4.2_2.13-4.4.0.jar", "delta-storage-4.4.0.jar",
                                               "hadoop-aws-3.5.0.jar", "bundle-2.35.4.jar")):
    for n in names:
        (tmp_path / n).write_bytes(b"PK")
    if complete:
        (tmp_path / jars.COMPLETE_STAMP).touch()
    return tmp_path


def test_jars_come_from_the_folder_only_when_complete(tmp_path, monkeypatch):
    monkeypatch.delenv(jars.JARS_ENV, raising=False)
    monkeypatch.setattr(jars, "jars_dir", lambda: tmp_path)
    _fake_dir(tmp_path, complete=False)
    assert jars.find_jars() == [] and "could not fetch" in jars.unavailable_reason()
    (tmp_path / jars.COMPLETE_STAMP).touch()
    assert [p.rsplit("/", 1)[1] for p in jars.find_jars()] == sorted(p.name for p in tmp_path.glob("*.jar"))
    assert jars.unavailable_reason() is None
    (tmp_path / "hadoop-aws-3.5.0.jar").unlink()  # a folder missing one artifact is not used
    assert jars.find_jars() == []


def test_the_reason_names_mvns_error(tmp_path, monkeypatch):
    monkeypatch.delenv(jars.JARS_ENV, raising=False)
    (tmp_path / "jars").mkdir()
    monkeypatch.setattr(jars, "jars_dir", lambda: tmp_path / "jars")
    (tmp_path / jars.ERROR_FILE).write_text("[ERROR] cannot reach the registry\n")
    assert "[ERROR] cannot reach the registry" in jars.unavailable_reason()


def test_the_environment_overrides(tmp_path, monkeypatch):
    monkeypatch.setattr(jars, "jars_dir", lambda: _fake_dir(tmp_path))
    monkeypatch.setenv(jars.JARS_ENV, "/a/x.jar, s3://b/y.jar")
    assert jars.find_jars() == ["/a/x.jar", "s3://b/y.jar"]
    monkeypatch.setenv(jars.JARS_ENV, "none")
    assert jars.find_jars() == [] and jars.provided_by_cluster() and jars.unavailable_reason() is None
    assert "spark.jars" not in jars.delta_conf()
    assert jars.delta_conf(["/a.jar"])["spark.jars"] == "/a.jar"


def test_s3a_settings_from_the_job_settings():
    s = S3Settings(endpoint_url="http://127.0.0.1:9000", access_key_id="AK", secret_access_key="SK", region="r1")
    assert jars.s3a_settings(s) == {
        "fs.s3a.endpoint": "http://127.0.0.1:9000", "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.path.style.access": "true", "fs.s3a.endpoint.region": "r1",
        "fs.s3a.access.key": "AK", "fs.s3a.secret.key": "SK",
    }
    tok = jars.s3a_settings(S3Settings(access_key_id="AK", secret_access_key="SK", session_token="T",
                                       addressing_style="virtual"))
    assert tok["fs.s3a.session.token"] == "T" and tok["fs.s3a.path.style.access"] == "false"
    assert tok["fs.s3a.aws.credentials.provider"].endswith("TemporaryAWSCredentialsProvider")
    assert jars.s3a_settings(S3Settings()) == {}  # S3A's own chain (instance role...)


def test_merge_sql_quotes_every_identifier_through_one_function():
    spec = build_merge_spec(target_columns=["id", "we`ird", "gone"], source_columns=["id", "we`ird"],
                            key_columns=["id"], keep_columns=["we`ird"], truncated=True, dialect="spark")
    text = merge_sql(spec, table_ref(s3a("s3://b/lake/public.t`x")), "view`1")
    assert text.startswith("MERGE INTO delta.`s3a://b/lake/public.t``x` AS t USING `view``1` AS s ON t.`id` = s.`id`")
    assert "`we``ird` = s.`we``ird`" in text and "`gone` = NULL" in text
    assert text.endswith("WHEN NOT MATCHED BY SOURCE THEN DELETE")
    scd = build_scd2_spec(target_columns=["id", "v"], source_columns=["id", "v"], key_columns=["id"],
                          truncate_lsn=42, dialect="spark")
    assert "WHEN NOT MATCHED BY SOURCE AND t.`__is_current` THEN UPDATE SET" in scd2_sql(scd, "delta.`p`", "v")


@pytest.mark.parametrize("engine, reader, packages, env, expect", [
    ("delta-rs", None, None, None, None),
    ("delta-spark", None, None, None, "found"),
    (None, "s3a", None, None, "found"),
    ("delta-spark", None, "io.delta:delta-spark_4.2_2.13:4.4.0", None, None),
    ("delta-spark", None, None, "none", None),
])
def test_the_operator_passes_the_jars_only_when_needed(engine, reader, packages, env, expect, monkeypatch):
    from airflow_pgcdc.operators.merge import PgcdcSparkMergeOperator

    monkeypatch.setattr(jars, "find_jars", lambda: ["/j/delta.jar", "/j/aws.jar"])
    if env:
        monkeypatch.setenv(jars.JARS_ENV, env)
    else:
        monkeypatch.delenv(jars.JARS_ENV, raising=False)
    op = PgcdcSparkMergeOperator(task_id="m", store="s3://b/c", slot="s", delta="s3://b/l", engine=engine,
                                 reader=reader, packages=packages, jars="/mine.jar")
    got = op._merge_jars("spark://m:7077")
    assert got == ("/mine.jar,/j/delta.jar,/j/aws.jar" if expect else "/mine.jar")
    # local mode: the job puts them on its driver's class loader itself (--jars would have
    # the in-driver executor copy them at every run)
    assert op._merge_jars("local[*]") == "/mine.jar"


@pytest.mark.parametrize("master, local", [
    ("local", True), ("local[2]", True), ("local[*]", True), ("local[4, 3]", True),
    ("local-cluster[2, 1, 1024]", False), ("spark://h:7077", False), ("yarn", False), ("k8s://https://h", False),
    (None, False), ("", False),
])
def test_which_masters_run_the_executor_in_the_driver(master, local):
    from airflow_pgcdc.merge.session import is_local

    assert is_local(master) is local


def test_the_operator_gives_jars_to_a_cluster_and_not_to_local_mode(monkeypatch):
    """The spark-submit command the operator builds: ``--jars`` for a cluster master, none of
    ours for a local one."""
    from airflow_pgcdc.operators.merge import PgcdcSparkMergeOperator

    monkeypatch.setattr(jars, "find_jars", lambda: ["/j/delta.jar", "/j/aws.jar"])
    monkeypatch.delenv(jars.JARS_ENV, raising=False)
    commands = {}
    for master in ("local[2]", "spark://m:7077"):
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": master}))
        op = PgcdcSparkMergeOperator(task_id="m", store="s3://b/c", slot="s", delta="s3://b/l",
                                     engine="delta-spark")
        commands[master] = op._get_hook()._build_spark_submit_command("app.py")
    assert "--jars" not in commands["local[2]"]
    cluster = commands["spark://m:7077"]
    assert cluster[cluster.index("--jars") + 1] == "/j/delta.jar,/j/aws.jar"
