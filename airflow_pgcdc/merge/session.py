"""The Spark session of a merge job, and the ``--py-files`` zip that ships this package.

Settings every merge needs whatever the master: session time zone UTC (timestamps are
instants, never shifted), Arrow batches between the JVM and Python. In local mode the
Python workers run the driver's own interpreter (``PYSPARK_PYTHON``), so the project's
virtual environment is used; on a cluster, ``spark.pyspark.python`` and ``--py-files``
(see :func:`build_py_files`) say which interpreter and code the executors use.
"""

from __future__ import annotations

import os
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path

__all__ = ["SPARK_CONF", "build_py_files", "is_local", "needs_delta_jars", "spark_session"]

SPARK_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.shuffle.partitions": "8",
    "spark.ui.showConsoleProgress": "false",
    # Delta files written by Spark: int64 microseconds, as delta-rs writes them (Spark's
    # default INT96 reads back as nanoseconds, which cannot hold the ±infinity sentinels)
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
}


def needs_delta_jars(engine: str | None, reader: str | None) -> bool:
    """Whether a job with this engine and reader needs Delta's and hadoop-aws' jars."""
    return engine == "delta-spark" or reader == "s3a"


def spark_session(master: str | None = None, *, app_name: str = "pgcdc-merge",
                  conf: Mapping[str, str] | None = None, delta: bool = False):
    """A Spark session for the merge (``getOrCreate``: under ``spark-submit`` the master and
    conf come from the command line; ``master`` here is for in-process use).

    ``delta``: with Delta Lake's Spark engine and S3A (:mod:`.jars`): the jars ``make
    setup`` fetched (or ``PGCDC_SPARK_JARS``) go onto the driver's class loader and, on a
    cluster, into ``spark.jars`` (shipped to the executors); nothing is added when the
    driver already has Delta (``--packages``/``--jars`` given, or a cluster that installs
    it). In local mode the executor is the driver's JVM: the jars go onto its class loader
    only (the driver JVM is started first when it is not up yet), because ``spark.jars``
    would make that executor copy every jar (the AWS SDK bundle alone is 686 MB) into the
    application's temporary folder at its first task, on every run."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    settings = {"spark.app.name": app_name, **SPARK_CONF}
    if master:
        settings["spark.master"] = master
        if is_local(master):
            settings["spark.ui.enabled"] = "false"
    if delta:
        settings.update(_delta_settings(master, {**settings, **(conf or {})}))
    builder = SparkSession.builder
    for k, v in {**settings, **(conf or {})}.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if delta and not _jvm_has(spark.sparkContext._jvm, _DELTA_CLASS):
        from airflow_pgcdc.merge.errors import MergeError

        raise MergeError(
            "this Spark session has no Delta Lake classes (a session started earlier in this "
            "process without them, or spark.jars without delta-spark)",
            hint="start the job in a fresh process; see `pgcdc merge --help` for the jars",
        )
    return spark


_DELTA_CLASS = "io.delta.sql.DeltaSparkSessionExtension"


def _jvm_has(jvm, name: str) -> bool:
    try:
        loader = jvm.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(name, False, loader)
        return True
    except Exception:  # py4j wraps ClassNotFoundException
        return False


def _running_driver_jvm():
    """The driver JVM when it is already up and no SparkContext runs on it (its class path
    is fixed by then): under ``spark-submit``, or in a process whose earlier session (local
    mode, without the Delta jars) was stopped; else ``None``."""
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None:
        return None
    if "PYSPARK_GATEWAY_PORT" not in os.environ and SparkContext._gateway is None:
        return None
    SparkContext._ensure_initialized()
    return SparkContext._jvm


def is_local(master: str | None) -> bool:
    """Whether ``master`` runs the executor inside the driver's JVM (``local``, ``local[4]``,
    ``local[*, 2]``, ``local-cluster`` excluded: its executors are JVMs of their own)."""
    return bool(master) and (master == "local" or master.startswith("local["))


def _start_driver_jvm(settings: Mapping[str, str]):
    """Start this process's driver JVM with ``settings`` (what the session builder would
    hand it: JVM options take effect only at launch), without a SparkContext yet."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized(conf=SparkConf(loadDefaults=False).setAll(list(settings.items())))
    return SparkContext._jvm


def _delta_settings(master: str | None, settings: Mapping[str, str]) -> dict[str, str]:
    """The session conf for delta-spark and s3a; the jars go onto the driver JVM's class
    loader (started here for a local master, as :func:`spark_session` says why) and, for
    a cluster, into ``spark.jars``."""
    from airflow_pgcdc.merge import jars as jarlib
    from airflow_pgcdc.merge.errors import MergeError

    conf = dict(jarlib.DELTA_SESSION_CONF)
    jvm = _running_driver_jvm()
    if jvm is not None and _jvm_has(jvm, _DELTA_CLASS):
        return conf  # spark-submit --packages/--jars, or the cluster's own install
    found = jarlib.find_jars()
    if not found:
        if jarlib.provided_by_cluster():
            return conf
        raise MergeError(jarlib.unavailable_reason() or "no Delta jars",
                         hint="run `make setup`, or give the jars with PGCDC_SPARK_JARS")
    if jvm is not None:
        master = master or jvm.System.getProperty("spark.master")
    # jars at URLs (PGCDC_SPARK_JARS=s3://...) are fetched by Spark's own file systems
    local = is_local(master) and all("://" not in j or j.startswith("file:") for j in found)
    if jvm is None and local:
        jvm = _start_driver_jvm(settings)
    if jvm is not None:
        loader = jvm.Thread.currentThread().getContextClassLoader()
        for jar in found:
            url = jar if "://" in jar else jvm.java.io.File(jar).toURI().toString()
            loader.addURL(jvm.java.net.URI(url).toURL())
        if local:
            return conf
        given = jvm.System.getProperty("spark.jars")
        if given:
            found = [*[j for j in str(given).split(",") if j], *found]
    conf["spark.jars"] = ",".join(found)
    return conf


def build_py_files(dest_dir: str | os.PathLike) -> str:
    """Zip the ``airflow_pgcdc`` package (for ``spark-submit --py-files``): its modules and its
    data files (the metastore's Thrift interface); returns the path. Rebuilt only when a
    source file is newer than the zip."""
    pkg = Path(__file__).resolve().parents[1]
    dest = Path(dest_dir) / "airflow_pgcdc.zip"
    sources = [p for pattern in ("*.py", "*.thrift") for p in pkg.rglob(pattern) if "__pycache__" not in p.parts]
    if dest.exists() and dest.stat().st_mtime >= max(p.stat().st_mtime for p in sources):
        return str(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".zip.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for p in sorted(sources):
            z.write(p, p.relative_to(pkg.parent).as_posix())
    os.replace(tmp, dest)
    return str(dest)
