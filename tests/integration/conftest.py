"""Fixtures shared by the integration modules that run the pipeline end to end (snapshot →
drains → merge into Delta). The servers themselves (PostgreSQL, S3, the Spark cluster)
come from ``tests/conftest.py``; the helper functions these modules share live in
:mod:`lake_helpers`.

A module whose own ``store`` or ``spark`` differs (the drain modules' ``store`` has no lake)
defines it and so overrides these."""

from __future__ import annotations

import pytest
from lake_helpers import release_delta_caches


@pytest.fixture(scope="module")
def spark(request):
    """One ``local[2]`` Spark session per module. A module marked ``delta_spark`` gets Delta
    Lake's Spark engine and S3A in it when the jars are there (its tests skip otherwise)."""
    from airflow_pgcdc.merge.jars import unavailable_reason
    from airflow_pgcdc.merge.session import spark_session

    delta = request.node.get_closest_marker("delta_spark") is not None and unavailable_reason() is None
    s = spark_session("local[2]", delta=delta)
    yield s
    release_delta_caches(s)
    s.stop()


@pytest.fixture
def store(s3, s3_bucket, monkeypatch):
    """``(client, store URL, lake URL)`` on this test's bucket, with the S3 environment set
    for code that builds its own client (delta-rs, the merge)."""
    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    return s3.client(), f"s3://{s3_bucket}/cdc", f"s3://{s3_bucket}/lake"
