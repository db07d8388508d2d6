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

__all__ = ["SPARK_CONF", "build_py_files", "spark_session"]

SPARK_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.shuffle.partitions": "8",
    "spark.ui.showConsoleProgress": "false",
}


def spark_session(master: str | None = None, *, app_name: str = "pgcdc-merge",
                  conf: Mapping[str, str] | None = None):
    """A Spark session for the merge (``getOrCreate``: under ``spark-submit`` the master and
    conf come from the command line; ``master`` here is for in-process use)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
        if master.startswith("local"):
            builder = builder.config("spark.ui.enabled", "false")
    for k, v in {**SPARK_CONF, **(conf or {})}.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def build_py_files(dest_dir: str | os.PathLike) -> str:
    """Zip the ``airflow_pgcdc`` package (for ``spark-submit --py-files``); returns the path.
    Rebuilt only when a source file is newer than the zip."""
    pkg = Path(__file__).resolve().parents[1]
    dest = Path(dest_dir) / "airflow_pgcdc.zip"
    sources = [p for p in pkg.rglob("*.py") if "__pycache__" not in p.parts]
    if dest.exists() and dest.stat().st_mtime >= max(p.stat().st_mtime for p in sources):
        return str(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".zip.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for p in sorted(sources):
            z.write(p, p.relative_to(pkg.parent).as_posix())
    os.replace(tmp, dest)
    return str(dest)
