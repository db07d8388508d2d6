"""Provider registration and the hook's connection handling (no servers needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from airflow_pgcdc.provider import get_provider_info


def airflow_cli(tmp_path, *args: str) -> str:
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    proc = subprocess.run(
        [sys.executable, "-m", "airflow", *args], env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_provider_info_names_modules_that_import():
    import importlib

    info = get_provider_info()
    assert info["package-name"] == "airflow-pgcdc"
    for section in ("hooks", "operators", "sensors", "triggers"):
        for entry in info.get(section, []):
            for mod in entry["python-modules"]:
                importlib.import_module(mod)
    for ct in info["connection-types"]:
        module, _, cls = ct["hook-class-name"].rpartition(".")
        hook = getattr(importlib.import_module(module), cls)
        assert hook.conn_type == ct["connection-type"]


def test_provider_info_lists_every_operator_module():
    import importlib

    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    modules = [m for e in get_provider_info()["operators"] for m in e["python-modules"]]
    for name in ("snapshot", "basebackup", "drain", "merge", "verify"):
        assert f"airflow_pgcdc.operators.{name}" in modules
    merge = importlib.import_module("airflow_pgcdc.operators.merge")
    assert issubclass(merge.PgcdcSparkMergeOperator, SparkSubmitOperator)


def test_airflow_lists_the_provider_and_its_hook(tmp_path):
    assert "airflow-pgcdc" in airflow_cli(tmp_path, "providers", "list")
    assert "airflow_pgcdc.hooks.pgcdc.PgcdcHook" in airflow_cli(tmp_path, "providers", "hooks")
    triggers = [line for line in airflow_cli(tmp_path, "providers", "triggers").splitlines() if "airflow-pgcdc" in line]
    assert triggers and "airflow_pgcdc.triggers.changes" in triggers[0], "Airflow lists trigger modules"


def test_hook_builds_dsn_with_tls_extras_and_hides_password(monkeypatch):
    from airflow_pgcdc.hooks.pgcdc import PgcdcHook

    monkeypatch.setenv(
        "AIRFLOW_CONN_SRC",
        json.dumps({
            "conn_type": "postgres", "host": "db.example", "port": 6432, "login": "cdc",
            "password": "s3cr3t pass'", "schema": "app",
            "extra": {"sslmode": "verify-full", "sslrootcert": "/etc/ca.pem", "application_name": "pgcdc", "ignored": "x"},
        }),
    )
    hook = PgcdcHook("src")
    dsn = hook.get_dsn()
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(dsn)
    assert params == {
        "host": "db.example", "port": "6432", "user": "cdc", "password": "s3cr3t pass'", "dbname": "app",
        "sslmode": "verify-full", "sslrootcert": "/etc/ca.pem", "application_name": "pgcdc",
    }
    assert "s3cr3t" not in hook.safe_dsn()


def test_hook_s3_settings_from_aws_connection(monkeypatch):
    from airflow_pgcdc.hooks.pgcdc import PgcdcHook

    monkeypatch.setenv(
        "AIRFLOW_CONN_S3",
        json.dumps({"conn_type": "aws", "login": "AKIDEXAMPLE", "password": "secretkey",
                    "extra": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"}}),
    )
    monkeypatch.setenv("AIRFLOW_CONN_SRC", json.dumps({"conn_type": "postgres", "host": "h"}))
    s = PgcdcHook("src", aws_conn_id="s3").s3_settings()
    assert (s.access_key_id, s.secret_access_key, s.endpoint_url, s.region) == (
        "AKIDEXAMPLE", "secretkey", "http://127.0.0.1:9000", "eu-west-1")
    assert "secretkey" not in repr(s)


def test_hook_s3_settings_carry_the_encryption_and_acl_of_the_aws_connection(monkeypatch):
    from airflow_pgcdc.hooks.pgcdc import PgcdcHook
    from airflow_pgcdc.operators.merge import s3_env

    monkeypatch.setenv("AIRFLOW_CONN_S3", json.dumps({"conn_type": "aws", "extra": {
        "server_side_encryption": "aws:kms", "sse_kms_key_id": "alias/lake", "acl": "bucket-owner-full-control"}}))
    s = PgcdcHook(aws_conn_id="s3").s3_settings()
    assert s.write_args() == {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "alias/lake",
                              "ACL": "bucket-owner-full-control"}
    # the merge's spark-submit gets them in its environment, where S3Settings.from_env reads them
    env = s3_env(s)
    assert {k: env[k] for k in ("PGCDC_S3_SSE", "PGCDC_S3_SSE_KMS_KEY_ID", "PGCDC_S3_ACL")} == {
        "PGCDC_S3_SSE": "aws:kms", "PGCDC_S3_SSE_KMS_KEY_ID": "alias/lake", "PGCDC_S3_ACL": "bucket-owner-full-control"}
    from airflow_pgcdc.store.s3 import S3Settings

    assert S3Settings.from_env(env) == S3Settings(sse="aws:kms", sse_kms_key_id="alias/lake",
                                                  acl="bucket-owner-full-control")


def test_encryption_reaches_every_writer_and_bad_values_are_refused():
    from airflow_pgcdc.merge.jars import s3a_settings
    from airflow_pgcdc.store.s3 import (
        S3Settings,
        StoreError,
        delta_storage_options,
        make_s3_client,
        write_args,
    )

    s = S3Settings(access_key_id="k", secret_access_key="s", region="eu-west-1", sse="AES256",
                   acl="bucket-owner-full-control")
    assert write_args(make_s3_client(s)) == {"ServerSideEncryption": "AES256", "ACL": "bucket-owner-full-control"}
    assert write_args(object()) == {}  # a client made elsewhere: nothing known, nothing added
    opts = delta_storage_options(s)
    assert opts["AWS_SERVER_SIDE_ENCRYPTION"] == "AES256" and "AWS_SSE_KMS_KEY_ID" not in opts
    kms = s.with_(sse="aws:kms:dsse", sse_kms_key_id="arn:aws:kms:eu-west-1:1:key/x", acl=None)
    assert {k: v for k, v in s3a_settings(kms).items() if "encryption" in k or "acl" in k} == {
        "fs.s3a.encryption.algorithm": "DSSE-KMS", "fs.s3a.encryption.key": "arn:aws:kms:eu-west-1:1:key/x"}
    assert s3a_settings(s)["fs.s3a.encryption.algorithm"] == "AES256"
    assert s3a_settings(s)["fs.s3a.acl.default"] == "BucketOwnerFullControl"
    with pytest.raises(StoreError, match="server-side encryption must be one of AES256, aws:kms"):
        S3Settings(sse="aes256")
    with pytest.raises(StoreError, match="KMS key id .* needs server-side encryption aws:kms"):
        S3Settings(sse="AES256", sse_kms_key_id="alias/x")
    with pytest.raises(StoreError, match="ACL must be one of"):
        S3Settings(acl="public-read")


def test_missing_connection_is_an_error():
    from airflow_pgcdc.hooks.pgcdc import PgcdcHook

    with pytest.raises(Exception, match="no_such_conn"):
        PgcdcHook("no_such_conn").get_dsn()


def test_one_version_everywhere():
    """pyproject.toml's version is the provider's, ``pgcdc --version``'s and
    ``airflow_pgcdc.__version__``."""
    import subprocess
    import sys
    import tomllib
    from pathlib import Path

    import airflow_pgcdc

    declared = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]["version"]
    assert get_provider_info()["versions"] == [declared]
    assert airflow_pgcdc.__version__ == declared
    out = subprocess.run([sys.executable, "-m", "airflow_pgcdc.cli", "--version"], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.split() == ["pgcdc", declared], out
