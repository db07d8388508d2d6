"""``pgcdc resync``: a fresh snapshot of some tables of a running pipeline."""

from __future__ import annotations

import argparse
import json
import logging
import sys


def register(subparsers) -> None:
    from airflow_pgcdc.cli import add_dsn_argument

    p = subparsers.add_parser(
        "resync",
        help="copy some tables again (or for the first time) while the pipeline runs",
        description=(
            "Take a fresh snapshot of the given tables for the pipeline of --slot, while its "
            "drains and merges go on: for a table added to the publication after the "
            "pipeline's snapshot, or one to rebuild. A temporary slot exports the snapshot (it "
            "never outlives the command); its consistent point splits the changes: those "
            "committed before it are in the copy, the later ones in the slot's windows. The "
            "next merge replaces each table's Delta table from the copy in one commit, then "
            "applies only the later changes. The tables must be in the publication already. "
            "Prints the committed resync manifest as JSON."
        ),
    )
    add_dsn_argument(p, "of the source database")
    p.add_argument("--slot", required=True, help="the pipeline's replication slot")
    p.add_argument("--publication", required=True, action="append", metavar="NAME",
                   help="the publication the pipeline's drains use (repeatable)")
    p.add_argument("--store", "--to", dest="store", required=True, metavar="S3URL",
                   help="the pipeline's change store: s3://bucket/prefix (--to: its 0.1 name)")
    p.add_argument("--tables", nargs="+", required=True, metavar="SCHEMA.TABLE", help="the tables to copy")
    p.add_argument("--workers", type=int, default=4, help="parallel COPY sessions (default 4)")
    p.add_argument("--rows-per-part", type=int, default=1_000_000, help="rows per Parquet part (default 1000000)")
    p.add_argument("--as-text", action="append", default=[], metavar="SCHEMA.TABLE=COL[,COL]",
                   help="keep these columns as their exact PostgreSQL text whatever their type (repeatable): "
                        "for values the typed mapping cannot carry, e.g. arrays whose lower bound is not 1; "
                        "give the snapshot, resync and drain the same")
    p.add_argument("--where", metavar="PREDICATE",
                   help="copy only the rows matching this SQL predicate (a slice: a damaged range, a tenant, "
                        "rows changed since a date); the next merge upserts them, the other rows stay. The "
                        "tables need a key; the predicate runs as the given user in a read-only transaction")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from airflow_pgcdc.snapshot.options import ResyncOptions
    from airflow_pgcdc.snapshot.resync import resync_tables

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    done = resync_tables(args.dsn, args.store, slot=args.slot, publications=args.publication,
                         options=ResyncOptions.from_args(args))
    out = json.loads(done.manifest.to_json())
    out["manifest"] = done.url
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
