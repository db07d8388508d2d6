"""The merge as a Spark application: ``spark-submit [--py-files airflow_pgcdc.zip]
airflow_pgcdc/merge/spark_app.py --from s3://… --slot S --delta s3://… [...]``.

Prints the result as one JSON line prefixed ``PGCDC_MERGE_RESULT `` on stdout (what
the Airflow operator reads back), and exits 1 with a one-line error on failure.
S3 endpoint and credentials come from the environment (boto3's conventions).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from airflow_pgcdc.merge.options import ENGINES, MergeOptions

RESULT_PREFIX = "PGCDC_MERGE_RESULT "

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", "--from", dest="store", required=True, metavar="S3URL",
                   help="the change store: s3://bucket/prefix (as given to snapshot and drain; --from: its 0.1 name)")
    p.add_argument("--slot", required=True, help="the replication slot whose snapshot and windows to merge")
    p.add_argument("--delta", required=True, metavar="S3URL",
                   help="where the Delta tables live: s3://bucket/lake (one table per source table)")
    p.add_argument("--tables", nargs="+", metavar="SCHEMA.TABLE", help="only these tables")
    p.add_argument("--key", action="append", metavar="SCHEMA.TABLE=COL[,COL]",
                   help="merge key for a table without primary key / replica identity index")
    p.add_argument("--max-windows", type=int, metavar="N", help="merge at most N windows per table")
    p.add_argument("--engine", choices=ENGINES, default="delta-rs",
                   help="Delta sink (default delta-rs; delta-spark needs the Delta and hadoop-aws jars)")
    p.add_argument("--reader", choices=("python", "s3a"), default="python",
                   help="how executors read the store: python (default: pyarrow's S3 filesystem in "
                   "a Spark Python Data Source) or s3a (Spark's Parquet reader; needs hadoop-aws)")
    p.add_argument("--target-file-mb", type=float, metavar="MB",
                   help="data file size when a table is bootstrapped or replaced by a resync, rows sorted "
                   "by the key so a merge rewrites only the files of the keys it touches (default 32)")
    p.add_argument("--driver-rows", type=int, metavar="N",
                   help="delta-rs: a table's batch of at most N change rows is compacted on the driver in "
                   "Arrow, with no Spark job (most tables of most windows); larger ones by Spark. 0: every "
                   "batch by Spark (default 20000)")
    p.add_argument("--table-workers", type=int, metavar="N",
                   help="delta-rs: merge N tables at once on the driver's threads (default 4; each table's "
                   "commit stays its own): a window touching many small tables is paid once, not per table. "
                   "delta-spark: 1")
    p.add_argument("--deletion-vectors", action="store_true",
                   help="delta-spark only: Delta tables get deletion vectors (delta.enableDeletionVectors), "
                   "so a MERGE marks changed rows deleted instead of rewriting every file they are in; "
                   "readers must support the deletionVectors feature (see docs/store-format.md)")
    p.add_argument("--change-data-feed", action="store_true",
                   help="Delta tables get the change data feed (delta.enableChangeDataFeed): each merge also "
                   "records what it changed, for readChangeFeed / table_changes readers; turned on for existing "
                   "tables at their next merge (see docs/operations.md)")
    p.add_argument("--metadata-columns", action="store_true",
                   help="Delta tables get CDC metadata columns: _pgcdc_op (I, U; R: from a copy), _pgcdc_commit_lsn, "
                   "_pgcdc_commit_ts and _pgcdc_merged_at (keyed tables; see docs/store-format.md)")
    p.add_argument("--soft-deletes", action="store_true",
                   help="a row the source deletes stays in its Delta table, with its last values and "
                   "_pgcdc_deleted_at (the delete's commit time; a truncate marks every row); a new row of the key "
                   "revives it (keyed tables; see docs/store-format.md)")
    p.add_argument("--catalog", metavar="THRIFT_URI",
                   help="keep this Hive Metastore (thrift://host:port) in step with the Delta tables: each table "
                   "registered by name, {prefix}{schema}.{table} (see docs/operations.md); needs the catalog extra")
    p.add_argument("--catalog-prefix", metavar="PREFIX", default="",
                   help="prefix of the metastore database names (lower-case letters, digits, '_')")
    p.add_argument("--table-option", action="append", metavar="SCHEMA.TABLE:NAME=VALUE",
                   help="a table's own value of a merge option, over the pipeline's (NAME: change_data_feed, "
                   "metadata_columns, soft_deletes, catalog_name=db.name, partition_by=col[,col], "
                   "cluster_by=col[,col] with --engine delta-spark); repeatable")
    p.add_argument("--history", choices=("changelog", "scd2"),
                   help="also keep a history table: changelog = every change row appended to "
                   "{schema}.{table}__changelog; scd2 = one row per version in {schema}.{table}__scd2")
    until = p.add_mutually_exclusive_group()
    until.add_argument("--until-lsn", metavar="LSN",
                       help="replay to a point: the tables as the source was at this LSN (commits at or before "
                       "it); the pipeline's next merge goes on from there (delta-rs, no --history)")
    until.add_argument("--until-time", metavar="ISO8601",
                       help="replay to a point in time: every commit made at or before it (e.g. "
                       "2026-11-29T06:00:00+00:00; without an offset: UTC)")


def add_rebuild_arguments(p: argparse.ArgumentParser, *, flag: bool) -> None:
    """The options of a rebuild (``pgcdc rebuild``; ``spark_app.py --rebuild``)."""
    if flag:
        p.add_argument("--rebuild", action="store_true",
                       help="rebuild the tables under --delta from the store and swap them in (pgcdc rebuild)")
    p.add_argument("--scratch", metavar="S3URL",
                   help="where to rebuild (default {delta}_rebuild/{run id}); removed after the swap")
    p.add_argument("--no-swap", dest="swap", action="store_false",
                   help="rebuild only: leave the live tables alone and keep the rebuilt ones for a look")
    p.add_argument("--keep-scratch", action="store_true", help="keep the rebuild root after the swap")


def run(args: argparse.Namespace, spark=None, *, lazy: bool = False) -> dict:
    from airflow_pgcdc.merge.job import merge_slot
    from airflow_pgcdc.merge.session import is_local, needs_delta_jars, spark_session

    master = getattr(args, "master", None)
    if spark is None:
        def start_spark():
            log.info("starting the Spark session (master %s)", master or "from spark-submit")
            session = spark_session(master, delta=needs_delta_jars(args.engine, args.reader),
                                    conf=dict(getattr(args, "conf", None) or ()))
            if master and not is_local(master):
                ship_package(session)
            return session

        # lazy (pgcdc merge in-process, or spark-submit to a local master): the job starts
        # Spark when a table first needs it, so a run whose batches are all small starts no
        # JVM (in-process) or no SparkContext (under spark-submit); under spark-submit to a
        # cluster the session is made at once (its manager waits for the application's
        # SparkContext)
        spark = start_spark if lazy else start_spark()
    options = MergeOptions.from_args(args)  # built once, here, from the arguments
    if getattr(args, "rebuild", False):
        from airflow_pgcdc.merge.rebuild import rebuild_slot

        return rebuild_slot(spark, store=args.store, slot=args.slot, delta=args.delta, scratch=args.scratch,
                            swap=args.swap, keep_scratch=args.keep_scratch, options=options)
    return merge_slot(spark, store=args.store, slot=args.slot, delta=args.delta, options=options).to_dict()


def ship_package(spark) -> None:
    """In-process on a cluster master (``pgcdc merge --master spark://…``): ship this package
    to the executors, as ``--py-files`` does under ``spark-submit``."""
    import tempfile

    from airflow_pgcdc.merge.session import build_py_files

    spark.sparkContext.addPyFile(build_py_files(tempfile.mkdtemp(prefix="pgcdc-pyfiles-")))


def _submitted_to_a_local_master() -> bool:
    """Whether this is ``spark-submit --master local[…]`` (the master read from the
    launching JVM, which spark-submit started; no SparkContext is made for it): nothing
    waits for the application's SparkContext there, so the job may start it only when a
    table needs Spark, as ``pgcdc merge`` does. Measured: ``tests/integration/test_dags.py``
    (six such merges of small windows) 159 s before, 118 s after (alone, then beside two
    other DAG-run tests)."""
    if not os.environ.get("PYSPARK_GATEWAY_PORT"):  # not launched by spark-submit
        return False
    from pyspark import SparkConf, SparkContext

    from airflow_pgcdc.merge.session import is_local

    SparkContext._ensure_initialized()  # the gateway to spark-submit's JVM, no SparkContext
    return is_local(SparkConf().get("spark.master", None))


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s",
                        stream=sys.stderr)
    p = argparse.ArgumentParser(prog="spark_app.py", description="airflow-pgcdc merge job")
    add_arguments(p)
    add_rebuild_arguments(p, flag=True)
    args = p.parse_args(argv)
    from airflow_pgcdc.errors import PgcdcError
    from airflow_pgcdc.merge.job import TablesFailed

    try:
        out = run(args, lazy=_submitted_to_a_local_master())
    except TablesFailed as e:  # the healthy tables were merged: their result still counts
        if e.outcome_dict() is not None:
            print(RESULT_PREFIX + json.dumps({**e.outcome_dict(), **_application()}), flush=True)
        print(f"pgcdc merge: error: {e}", file=sys.stderr)
        if e.hint:
            print(f"hint: {e.hint}", file=sys.stderr)
        return 1
    except PgcdcError as e:
        print(f"pgcdc merge: error: {e}", file=sys.stderr)
        hint = getattr(e, "hint", None)
        if hint:
            print(f"hint: {hint}", file=sys.stderr)
        return 1
    print(RESULT_PREFIX + json.dumps({**out, **_application()}), flush=True)
    return 0


def _application() -> dict:
    """``{"spark": {app_id, master, ui}}`` of the job's Spark application, when it started one
    (a job on a local master starts none for small batches): the operator's link to it."""
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None:
        return {}
    return {"spark": {"app_id": sc.applicationId, "master": sc.master, "ui": sc.uiWebUrl}}


if __name__ == "__main__":
    sys.exit(main())
