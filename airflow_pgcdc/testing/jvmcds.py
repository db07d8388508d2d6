"""A class-data-sharing archive for the test bed's Spark JVMs (AppCDS, JDK 13+).

A Spark JVM spends its first seconds loading and verifying some ten thousand classes from
pyspark's jars, and every test that submits a job starts one (drivers under
``spark-submit``, the cluster's daemons and executors). A dynamic CDS archive holds those
classes already parsed and verified: the JVM maps it instead. Measured on the idle 2-core
machine: a local session, two small jobs and an Arrow round trip 16.2 s -> 9.6 s;
``test_merge.py``'s two killed-merge tests (one ``pgcdc merge`` process each) 48.4 + 31.3 s
-> 38.0 + 22.3 s; ``test_secrets.py`` (two, one on delta-spark) 75.2 s -> 60.6 s.

:func:`build` records the archive once (about 67 s idle): a throw-away local Spark job
(session, Arrow, a Python data source and ``mapInArrow``, Parquet, and a Delta write and
read when Delta's jars are at hand) run with ``-XX:ArchiveClassesAtExit``. :func:`java_options` gives the flags that use it.
A JVM whose class path does not match the recorded one (Spark's launcher, Maven) or any
jar that changed since (the JVM checks sizes and times) runs without it, silently (the
``cds`` log tags are off: a warning there goes to standard output, where the launcher
writes its command). The archive's name carries a digest of the JDK and the jars, so a
new pin records a new one. Test-bed only: the product never sets JVM flags.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["archive_path", "build", "failed_marker", "java_options", "wait_for"]

_SILENT = "-Xlog:cds=off,cds+dynamic=off"

_WORKLOAD = r'''
import os, sys, tempfile
import pandas as pd
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceReader
from airflow_pgcdc.merge.session import spark_session

delta = sys.argv[1] == "1"
spark = spark_session("local[2]", app_name="pgcdc-cds", delta=delta)

class _Source(DataSource):
    @classmethod
    def name(cls):
        return "pgcdc_cds"
    def schema(self):
        return "id long, v string"
    def reader(self, schema):
        return _Reader()

class _Reader(DataSourceReader):
    def read(self, partition):
        yield (1, "a")

spark.dataSource.register(_Source)
d = tempfile.mkdtemp()
pdf = pd.DataFrame({"id": range(100), "v": [str(i) for i in range(100)]})
df = spark.createDataFrame(pdf).withColumn("t", F.current_timestamp())
df.toPandas()
df.groupBy((F.col("id") % 3).alias("k")).agg(F.max("v")).collect()
df.join(spark.read.format("pgcdc_cds").load(), "id", "left_anti").count()
df.write.parquet(os.path.join(d, "p"))
spark.read.parquet(os.path.join(d, "p")).mapInArrow(lambda it: it, df.schema).count()
if delta:
    path = os.path.join(d, "delta")
    df.write.format("delta").save(path)
    spark.read.format("delta").load(path).count()
    jvm = spark.sparkContext._jvm
    loader = jvm.Thread.currentThread().getContextClassLoader()
    for name in ("org.apache.hadoop.fs.s3a.S3AFileSystem",
                 "software.amazon.awssdk.services.s3.S3Client"):
        try:
            jvm.java.lang.Class.forName(name, True, loader)
        except Exception:
            pass
spark.stop()
'''


def _digest() -> str:
    """The JDK's version and every jar the archive may hold: a new pin, a new name."""
    from airflow_pgcdc.merge import jars as jarlib
    from airflow_pgcdc.testing.spark import spark_home

    h = hashlib.sha256()
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=60)
    h.update(java.stderr.encode())
    listed = sorted((spark_home() / "jars").glob("*.jar")) + [Path(p) for p in jarlib.find_jars()]
    for p in listed:
        st = p.stat()
        h.update(f"{p}:{st.st_size}:{int(st.st_mtime)}\n".encode())
    h.update(_WORKLOAD.encode())
    return h.hexdigest()[:16]


def archive_path(directory: Path) -> Path:
    return directory / f"spark-{_digest()}.jsa"


def java_options(archive: Path) -> str:
    """The JVM flags that use ``archive`` (and keep a mismatch silent)."""
    return f"-XX:SharedArchiveFile={archive} {_SILENT}"


def build(directory: Path, *, jvm_options: str = "", timeout: float = 300) -> Path | None:
    """The archive for this JDK and these jars under ``directory``, recorded if missing;
    ``None`` when recording failed (marked by :func:`failed_marker`; the tests then run
    without it: slower, not wrong)."""
    from airflow_pgcdc.merge.jars import unavailable_reason

    directory.mkdir(parents=True, exist_ok=True)
    target = archive_path(directory)
    if target.exists():
        return target
    for old in directory.glob("spark-*.jsa*"):  # other pins' archives and failure marks
        old.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".recording-", suffix=".jsa")
    os.close(fd)
    os.unlink(tmp)  # the JVM writes it at exit
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "JAVA_TOOL_OPTIONS": jvm_options,
           "PYSPARK_SUBMIT_ARGS": f"--driver-java-options -XX:ArchiveClassesAtExit={tmp} pyspark-shell"}
    delta = "1" if unavailable_reason() is None else "0"
    try:
        done = subprocess.run([sys.executable, "-c", _WORKLOAD, delta], env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        Path(tmp).unlink(missing_ok=True)
        failed_marker(target).touch()
        return None
    if done.returncode != 0 or not Path(tmp).exists():
        Path(tmp).unlink(missing_ok=True)
        failed_marker(target).touch()
        sys.stderr.write(f"jvmcds: recording the Spark class archive failed (rc {done.returncode}); "
                         f"the tests run without it:\n{done.stderr[-2000:]}\n")
        return None
    os.replace(tmp, target)
    return target


def failed_marker(archive: Path) -> Path:
    """Written beside ``archive`` when recording it failed: waiters stop waiting."""
    return archive.with_name(archive.name + ".failed")


def wait_for(archive: Path, timeout: float) -> bool:
    """Wait up to ``timeout`` s for a recording under way elsewhere; whether the archive is
    there."""
    deadline = time.monotonic() + timeout
    while not archive.exists() and not failed_marker(archive).exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    return archive.exists()


if __name__ == "__main__":  # python -m airflow_pgcdc.testing.jvmcds DIR: record (the test bed runs it)
    where = Path(sys.argv[1])
    made = build(where, jvm_options=os.environ.get("JAVA_TOOL_OPTIONS", ""))
    if made is None:
        sys.exit(1)
    print(made)
