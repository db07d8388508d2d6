"""``pgcdc merge``: bootstrap Delta tables from the slot's snapshot and merge its windows."""

from __future__ import annotations

import argparse
import json
import logging
import sys


def register(subparsers) -> None:
    from airflow_pgcdc.merge.spark_app import add_arguments

    p = subparsers.add_parser(
        "merge",
        help="bootstrap Delta tables from the snapshot and merge the change windows (Spark)",
        description=(
            "Run the merge job in-process on a local Spark (or --master): for every table of "
            "the slot, create its Delta table from the snapshot if needed, then merge the "
            "committed windows after the table's last merged one, in order, exactly once. "
            "Prints the per-table result as JSON. For a cluster, submit "
            "airflow_pgcdc/merge/spark_app.py with spark-submit (same arguments)."
        ),
    )
    add_arguments(p)
    add_spark_arguments(p)
    p.set_defaults(handler=run)


def add_spark_arguments(p: argparse.ArgumentParser) -> None:
    """``--master`` and ``--conf`` of a job run in-process (``pgcdc merge``, ``pgcdc rebuild``)."""
    p.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", type=_conf_pair,
                   help="a Spark setting for this job's session, as spark-submit --conf "
                        "(repeat; e.g. spark.cores.max=4, spark.executor.memory=8g)")


def _conf_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not key.startswith("spark."):
        raise argparse.ArgumentTypeError(f"expected spark.KEY=VALUE, got {text!r}")
    return key.strip(), value


def run(args: argparse.Namespace) -> int:
    from airflow_pgcdc.merge.job import TablesFailed
    from airflow_pgcdc.merge.spark_app import run as run_job

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        out = run_job(args, lazy=True)  # no JVM when no table needs Spark
    except TablesFailed as e:  # the others were merged: print every table's outcome, then fail
        if e.outcome_dict() is not None:
            json.dump(e.outcome_dict(), sys.stdout, indent=2)
            sys.stdout.write("\n")
        raise
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
