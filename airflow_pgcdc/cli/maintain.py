"""``pgcdc maintain``: compact, vacuum and checkpoint a slot's Delta tables; expire merged windows."""

from __future__ import annotations

import argparse
import json
import logging
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "maintain",
        help="compact and vacuum the slot's Delta tables, expire the windows every table merged",
        description=(
            "Lake upkeep for the pipeline of --slot. Per Delta table (each on its own: a failure is "
            "reported and the others go on): compaction of small files (delta-rs optimize; "
            "--zorder: Z-order on the table's key columns; a table whose deletion vectors delete 10% "
            "or more of its rows is rewritten whole, live rows only, sorted by its key), VACUUM of the "
            "files no version within "
            "the retention needs, a log checkpoint and expired log cleanup (log entries older than the "
            "retention, and than 24 h, before a checkpoint); app transactions are "
            "kept. Then the change store: the parts of windows older than the retention that every "
            "table holding them has merged are removed (their manifests stay; never the latest "
            "window, never an unmerged one; recorded in {slot}/maintain/expired.json), and "
            "merge-staging runs older than the retention. Prints what was removed (objects, "
            "bytes) as JSON; exits 1 naming the tables that failed."
        ),
    )
    p.add_argument("--store", "--from", dest="store", required=True, metavar="S3URL",
                   help="the change store: s3://bucket/prefix (--from: its 0.1 name)")
    p.add_argument("--slot", required=True, help="the pipeline's replication slot")
    p.add_argument("--delta", required=True, metavar="URL", help="the Delta root (as given to pgcdc merge)")
    p.add_argument("--tables", nargs="+", metavar="SCHEMA.TABLE", help="only these tables' Delta tables "
                   "(the store's windows are still expired by every table's progress)")
    p.add_argument("--retention-hours", type=float, default=None, metavar="N",
                   help="keep removed Delta files, merged windows and staging debris this long "
                        "(default 168; any value, 0 included, is honoured, with a warning below 168)")
    p.add_argument("--zorder", action="store_true", help="Z-order each table on its key columns instead of "
                   "plain compaction (rewrites every file)")
    p.add_argument("--target-file-mb", type=float, default=None, metavar="MB",
                   help="compaction's target file size (default 32, as pgcdc merge --target-file-mb: "
                        "give the same value as the merge)")
    p.add_argument("--no-windows", dest="windows", action="store_false",
                   help="leave the change store alone (Delta tables only)")
    p.add_argument("--dry-run", action="store_true", help="report what would be removed, change nothing")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from airflow_pgcdc.maintain import TablesFailed, maintain_slot
    from airflow_pgcdc.maintain.options import MaintainOptions

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    if args.retention_hours is not None and args.retention_hours < 0:
        raise argparse.ArgumentTypeError("--retention-hours must be 0 or more")
    options = MaintainOptions.from_args(args)  # built once from the arguments
    try:
        result = maintain_slot(store=args.store, slot=args.slot, delta=args.delta, options=options)
    except TablesFailed as e:  # the others were maintained: print every outcome, then fail
        json.dump(e.result.to_dict(), sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        raise
    json.dump(result.to_dict(), sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
    return 0
