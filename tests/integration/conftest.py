"""Fixtures shared by the integration modules that run the pipeline end to end (snapshot →
drains → merge into Delta). The servers themselves (PostgreSQL, S3, the Spark cluster)
come from ``tests/conftest.py``; the helper functions these modules share live in
:mod:`lake_helpers`.

A module whose own ``store`` differs (the drain modules' ``store`` has no lake) defines it
and so overrides these."""

from __future__ import annotations

import pytest
from lake_helpers import release_delta_caches

IN_PROCESS_CONF = {
    # expressions interpreted, not compiled: the in-process tests run hundreds of small
    # statements (Delta's log replays, MERGEs of a few rows), where compiling each plan's
    # generated Java (Janino) costs more than running it; a third of the driver's CPU samples
    # were in the compiler. Measured, test_maintain_delta_spark 112.6 s / 107.9 s -> 102.7 s /
    # 97.9 s. Both modes give the same results (Spark's contract; our code generates none);
    # every Spark job the tests run in a child process (``pgcdc merge``, ``spark-submit``,
    # the cluster's and the DAG runs' jobs) keeps the product's default, code generation on.
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
"""Spark settings of the in-process test session only (see :func:`_spark_session`)."""


@pytest.fixture(scope="session")
def _spark_session():
    """The test process's one ``local[2]`` Spark session, with Delta Lake's Spark engine and
    S3A in it when the jars are there (the tests that need them skip otherwise, saying why).

    One per process, not one per module: a module's session cost ~7 s to start (its first
    ~30 s, with the driver JVM), and the PostgreSQL-grouped order of a run started most
    modules' sessions twice. Each module still starts clean: :func:`spark` restores the SQL
    conf a module changed and drops the Delta log and data caches after it."""
    from airflow_pgcdc.merge.jars import unavailable_reason
    from airflow_pgcdc.merge.session import spark_session

    s = spark_session("local[2]", delta=unavailable_reason() is None, conf=IN_PROCESS_CONF)
    yield s
    release_delta_caches(s)
    s.stop()


@pytest.fixture(scope="module")
def spark(_spark_session):
    """The process's Spark session for this module (``spark_with_delta`` is the same one);
    what the module set in its SQL conf is undone after it, and its caches dropped."""
    before = dict(_spark_session.conf.getAll)
    yield _spark_session
    after = dict(_spark_session.conf.getAll)
    for key, value in after.items():
        if key not in before:
            _spark_session.conf.unset(key)
        elif before[key] != value:
            _spark_session.conf.set(key, before[key])
    _spark_session.catalog.clearCache()
    release_delta_caches(_spark_session)


@pytest.fixture
def driver_rows(request):
    """``merge_slot(driver_rows=…)`` for a test run on both PostgreSQL servers: its pg15 cell
    compacts and copies through Spark (0), its pg18 cell on the driver (the default, ``None``).
    Which path the merge takes does not depend on the server: both paths stay tested without
    doubling the matrix (``test_compact_paths`` proves their compactions equal)."""
    spec = getattr(request.node, "callspec", None)
    return 0 if spec is not None and "pg15" in spec.id.split("-") else None


@pytest.fixture(scope="module")
def spark_with_delta(spark):
    return spark


@pytest.fixture
def store(s3, s3_bucket, monkeypatch):
    """``(client, store URL, lake URL)`` on this test's bucket, with the S3 environment set
    for code that builds its own client (delta-rs, the merge)."""
    for k, v in s3.aws_env().items():
        monkeypatch.setenv(k, v)
    return s3.client(), f"s3://{s3_bucket}/cdc", f"s3://{s3_bucket}/lake"
