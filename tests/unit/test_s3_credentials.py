"""Which credentials each component gets (no server: the mapping only; the role assumed for
real against the test bed's STS is in tests/integration/test_s3_role.py)."""

from __future__ import annotations

import json
import types

import pytest

from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.s3 import S3Settings, StoreError


def _chain(monkeypatch, method: str) -> None:
    """boto3's chain finding credentials by ``method`` (what an instance, a container or a
    web identity would give)."""
    found = types.SimpleNamespace(method=method, get_frozen_credentials=lambda: types.SimpleNamespace(
        access_key="ASIACHAIN", secret_key="chain-secret", token="chain-token"))
    monkeypatch.setattr(s3store, "credentials", lambda settings: found)


@pytest.mark.parametrize("method", sorted(s3store.SELF_REFRESHING))
def test_delta_rs_and_arrow_renew_an_instance_container_or_web_identity_role_themselves(monkeypatch, method):
    _chain(monkeypatch, method)
    settings = S3Settings(region="eu-west-1")
    assert settings.handed_credentials() is None
    opts = s3store.delta_storage_options(settings)
    assert not any(k.startswith(("AWS_ACCESS_KEY_ID", "AWS_SECRET", "AWS_SESSION_TOKEN")) for k in opts)
    assert settings.resolved_credentials() == ("ASIACHAIN", "chain-secret", "chain-token")  # boto3's own use


@pytest.mark.parametrize("method", ["shared-credentials-file", "sso", "custom-process", "env"])
def test_credentials_only_boto3_finds_are_handed_over(monkeypatch, method):
    _chain(monkeypatch, method)
    opts = s3store.delta_storage_options(S3Settings(region="eu-west-1"))
    assert (opts["AWS_ACCESS_KEY_ID"], opts["AWS_SESSION_TOKEN"]) == ("ASIACHAIN", "chain-token")


def test_static_keys_travel_as_given():
    settings = S3Settings(access_key_id="AKID", secret_access_key="s", region="eu-west-1")
    assert settings.handed_credentials() == ("AKID", "s", None)


def test_the_role_from_the_environment_and_its_checks():
    env = {"AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "s", "PGCDC_S3_ROLE_ARN": "arn:aws:iam::1:role/lake",
           "PGCDC_S3_EXTERNAL_ID": "ext", "PGCDC_S3_ROLE_SECONDS": "7200", "AWS_ENDPOINT_URL_STS": "https://sts.x"}
    s = S3Settings.from_env(env)
    assert (s.role_arn, s.external_id, s.role_seconds, s.sts_endpoint_url, s.role_session_name) == (
        "arn:aws:iam::1:role/lake", "ext", 7200, "https://sts.x", "pgcdc")
    assert "ext" not in repr(s)
    with pytest.raises(StoreError, match="must be an ARN"):
        S3Settings(role_arn="lake")
    with pytest.raises(StoreError, match="900 to 43200 seconds"):
        S3Settings(role_arn="arn:aws:iam::1:role/lake", role_seconds=60)
    with pytest.raises(StoreError, match="PGCDC_S3_ROLE_SECONDS must be an integer"):
        S3Settings.from_env({"PGCDC_S3_ROLE_SECONDS": "1h"})


def test_s3a_assumes_the_role_itself():
    from airflow_pgcdc.merge.jars import s3a_settings

    static = s3a_settings(S3Settings(access_key_id="AKID", secret_access_key="s", region="eu-west-1",
                                     role_arn="arn:aws:iam::1:role/lake", sts_endpoint_url="https://sts.x"))
    assert static["fs.s3a.aws.credentials.provider"] == "org.apache.hadoop.fs.s3a.auth.AssumedRoleCredentialProvider"
    assert static["fs.s3a.assumed.role.credentials.provider"] == "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
    assert (static["fs.s3a.assumed.role.arn"], static["fs.s3a.assumed.role.session.duration"],
            static["fs.s3a.assumed.role.sts.endpoint"]) == ("arn:aws:iam::1:role/lake", "3600s", "sts.x")
    with pytest.raises(StoreError, match="reaches STS over https only"):
        s3a_settings(S3Settings(role_arn="arn:aws:iam::1:role/lake", sts_endpoint_url="http://127.0.0.1:9000"))
    temporary = s3a_settings(S3Settings(access_key_id="ASIA", secret_access_key="s", session_token="t",
                                        role_arn="arn:aws:iam::1:role/lake"))
    assert temporary["fs.s3a.assumed.role.credentials.provider"].endswith("TemporaryAWSCredentialsProvider")
    instance = s3a_settings(S3Settings(role_arn="arn:aws:iam::1:role/lake"))
    assert instance["fs.s3a.assumed.role.credentials.provider"].endswith("IAMInstanceCredentialsProvider")
    assert "fs.s3a.assumed.role.arn" not in s3a_settings(S3Settings(access_key_id="AKID", secret_access_key="s"))


def test_the_aws_connection_extras_as_the_amazon_provider_reads_them(monkeypatch):
    from airflow_pgcdc.hooks.pgcdc import PgcdcHook
    from airflow_pgcdc.operators.merge import s3_env

    monkeypatch.setenv("AIRFLOW_CONN_S3", json.dumps({"conn_type": "aws", "login": "AKID", "password": "secret", "extra": {
        "role_arn": "arn:aws:iam::123456789012:role/lake", "assume_role_method": "assume_role",
        "assume_role_kwargs": {"RoleSessionName": "airflow", "ExternalId": "x-1", "DurationSeconds": 1800},
        "service_config": {"sts": {"endpoint_url": "https://sts.eu-west-1.amazonaws.com"}},
        "region_name": "eu-west-1", "config_kwargs": {"connect_timeout": 5, "retries": {"max_attempts": 9, "mode": "adaptive"}},
    }}))
    s = PgcdcHook(aws_conn_id="s3").s3_settings()
    assert (s.role_arn, s.role_session_name, s.external_id, s.role_seconds, s.sts_endpoint_url) == (
        "arn:aws:iam::123456789012:role/lake", "airflow", "x-1", 1800, "https://sts.eu-west-1.amazonaws.com")
    assert (s.connect_timeout, s.max_attempts, s.retry_mode, s.access_key_id) == (5.0, 10, "adaptive", "AKID")
    env = s3_env(s)  # spark-submit's merge assumes the same role
    assert S3Settings.from_env(env).role_arn == s.role_arn and env["PGCDC_S3_ROLE_SECONDS"] == "1800"
    monkeypatch.setenv("AIRFLOW_CONN_S3", json.dumps({"conn_type": "aws", "extra": {
        "role_arn": "arn:aws:iam::1:role/x", "assume_role_method": "assume_role_with_web_identity"}}))
    with pytest.raises(ValueError, match="assume_role_with_web_identity' is not supported here"):
        PgcdcHook(aws_conn_id="s3").s3_settings()


def _amazon_provider() -> bool:
    try:
        import airflow.providers.amazon.aws.utils.connection_wrapper  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(params=["amazon provider", "without it"])
def reader(request, monkeypatch):
    """The aws connection read by the amazon provider's wrapper, or by the hook itself (the
    provider made unimportable)."""
    if request.param == "amazon provider" and not _amazon_provider():
        pytest.skip("apache-airflow-providers-amazon is not installed here (the `amazon` extra; the floor "
                    "environment tests the hook without it)")
    if request.param == "without it":
        import sys

        monkeypatch.setitem(sys.modules, "airflow.providers.amazon.aws.utils.connection_wrapper", None)
    return request.param


SHAPES = {
    "keys in the extras": {"extra": {"aws_access_key_id": "AKEXTRA", "aws_secret_access_key": "extra-secret",
                                     "aws_session_token": "tok"}},
    "login over the extras' keys": {"login": "AKLOGIN", "password": "login-secret",
                                    "extra": {"aws_access_key_id": "AKEXTRA", "aws_secret_access_key": "x"}},
    "keys in session_kwargs": {"extra": {"session_kwargs": {"aws_access_key_id": "AKSESSION",
                                                            "aws_secret_access_key": "session-secret"}}},
    "the s3 service's endpoint over the global one": {"extra": {
        "endpoint_url": "http://global:9000", "service_config": {"s3": {"endpoint_url": "http://s3-only:9000"}}}},
    "the global endpoint, region and profile": {"extra": {"endpoint_url": "http://global:9000",
                                                          "region_name": "ap-south-1", "profile_name": "lake"}},
    "a role without a method": {"extra": {"role_arn": "arn:aws:iam::1:role/x",
                                          "assume_role_kwargs": {"DurationSeconds": 3600}}},
    "encryption and acl": {"extra": {"server_side_encryption": "aws:kms", "sse_kms_key_id": "k-1",
                                     "acl": "bucket-owner-full-control"}},
}
EXPECTED = {
    "keys in the extras": {"access_key_id": "AKEXTRA", "secret_access_key": "extra-secret", "session_token": "tok"},
    "login over the extras' keys": {"access_key_id": "AKLOGIN", "secret_access_key": "login-secret"},
    "keys in session_kwargs": {"access_key_id": "AKSESSION", "secret_access_key": "session-secret"},
    "the s3 service's endpoint over the global one": {"endpoint_url": "http://s3-only:9000"},
    "the global endpoint, region and profile": {"endpoint_url": "http://global:9000", "region": "ap-south-1",
                                                "profile": "lake"},
    "a role without a method": {"role_arn": "arn:aws:iam::1:role/x", "role_seconds": 3600},
    "encryption and acl": {"sse": "aws:kms", "sse_kms_key_id": "k-1", "acl": "bucket-owner-full-control"},
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_each_connection_shape_read_alike_with_or_without_the_amazon_provider(monkeypatch, reader, shape):
    from airflow_pgcdc.hooks.pgcdc import PgcdcHook

    for name in list(__import__("os").environ):
        if name.startswith(("AWS_", "PGCDC_S3_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AIRFLOW_CONN_S3", json.dumps({"conn_type": "aws", **SHAPES[shape]}))
    s = PgcdcHook(aws_conn_id="s3").s3_settings()
    assert {k: getattr(s, k) for k in EXPECTED[shape]} == EXPECTED[shape]
