"""``pgcdc snapshot``: create a slot with an exported snapshot and copy the tables to S3."""

from __future__ import annotations

import argparse
import json
import logging
import sys


def register(subparsers) -> None:
    from airflow_pgcdc.cli import add_dsn_argument

    p = subparsers.add_parser(
        "snapshot",
        help="initial copy: exported snapshot -> Parquet on S3",
        description=(
            "Create a logical replication slot with an exported snapshot and copy the "
            "published tables (or --tables) to S3 as Parquet, in parallel, all from that one "
            "snapshot; the change stream later starts at the slot's consistent point. S3 "
            "endpoint and credentials follow boto3's conventions (AWS_ENDPOINT_URL, "
            "AWS_ACCESS_KEY_ID, ...). Prints the committed manifest as JSON."
        ),
    )
    add_dsn_argument(p, 'of the source database')
    p.add_argument("--slot", required=True, help="logical replication slot to create")
    p.add_argument("--publication", action="append", metavar="NAME",
                   help="copy this publication's tables (column lists and row filters honoured; repeatable: the "
                        "tables of several, as one stream of them carries each)")
    p.add_argument("--store", "--to", dest="store", required=True, metavar="S3URL",
                   help="the change store: s3://bucket/prefix (--to: its 0.1 name)")
    p.add_argument("--tables", nargs="+", metavar="SCHEMA.TABLE", help="copy these tables (default: the publication's)")
    p.add_argument("--workers", type=int, default=4, help="parallel COPY sessions (default 4)")
    p.add_argument("--rows-per-part", type=int, default=1_000_000, help="rows per Parquet part (default 1000000)")
    p.add_argument("--two-phase", action="store_true", help="create the slot with TWO_PHASE")
    p.add_argument("--snapshot-id", help="name of this snapshot's folder (default: a UTC timestamp id)")
    p.add_argument("--progress-interval", type=float, default=10.0, metavar="SEC")
    p.add_argument(
        "--copy-format",
        choices=("binary", "csv"),
        default="binary",
        help="COPY format: binary (default; types without a binary decoder travel as text) or csv",
    )
    p.add_argument("--as-text", action="append", default=[], metavar="SCHEMA.TABLE=COL[,COL]",
                   help="keep these columns as their exact PostgreSQL text whatever their type (repeatable): "
                        "for values the typed mapping cannot carry, e.g. arrays whose lower bound is not 1; "
                        "give the snapshot, resync and drain the same")
    p.add_argument("--pii", action="append", default=[], metavar="SCHEMA.TABLE:COLUMN=RULE",
                   help="keep a column out of the lake (repeatable): RULE is exclude (never read), hash (HMAC-SHA256 "
                        "of its text under the key in $PGCDC_PII_KEY, hex) or mask[:N] (text: every character but the "
                        "last N as *). Written to the store with the slot's data: every later job of the slot applies "
                        "the same rules")
    p.set_defaults(handler=run, _parser=p)


def run(args: argparse.Namespace) -> int:
    from airflow_pgcdc.snapshot.export import snapshot_to_s3
    from airflow_pgcdc.snapshot.options import SnapshotOptions

    if not args.publication and not args.tables:
        args._parser.error("give --publication or --tables")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    manifest = snapshot_to_s3(args.dsn, args.store, slot=args.slot, publications=args.publication,
                              options=SnapshotOptions.from_args(args))
    json.dump(json.loads(manifest.to_json()), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
