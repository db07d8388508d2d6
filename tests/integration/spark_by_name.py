"""Run by test_catalog.py in a process of its own (a Spark session with Hive support needs a
SparkContext of its own): read tables by name through Spark SQL from the Hive Metastore at
argv[1] (Spark's isolated Hive 4.0.1 client: the jars ``make hms`` fetched), Delta's Spark
engine and S3A to the store's S3 server (its endpoint and keys from the environment). Prints
one JSON line per statement of argv[2:]: its rows."""

from __future__ import annotations

import json
import sys
import tempfile

from airflow_pgcdc.merge.jars import configure_s3a
from airflow_pgcdc.merge.session import spark_session
from airflow_pgcdc.store.s3 import S3Settings
from airflow_pgcdc.testing.hms import HMS_LIB


def main() -> None:
    uri, statements = sys.argv[1], sys.argv[2:]
    spark = spark_session("local[1]", app_name="pgcdc-catalog-read", delta=True, conf={
        "spark.sql.catalogImplementation": "hive",
        "spark.hadoop.hive.metastore.uris": uri,
        "spark.sql.hive.metastore.version": "4.0.1",
        "spark.sql.hive.metastore.jars": "path",
        "spark.sql.hive.metastore.jars.path": f"file://{HMS_LIB}/client/*.jar",
        "spark.sql.warehouse.dir": "file://" + tempfile.mkdtemp(prefix="pgcdc-spark-warehouse-"),
    })
    configure_s3a(spark, S3Settings.from_env())
    for statement in statements:
        rows = [[None if v is None else str(v) for v in r] for r in spark.sql(statement).collect()]
        print(json.dumps(rows), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
