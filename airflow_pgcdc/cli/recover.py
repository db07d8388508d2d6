"""``pgcdc recover``: back from a lost slot without a new pipeline."""

from __future__ import annotations

import argparse
import json
import logging
import sys


def register(subparsers) -> None:
    from airflow_pgcdc.cli import add_dsn_argument

    p = subparsers.add_parser(
        "recover",
        help="after a lost slot: create it again and copy every table into the existing Delta tables",
        description=(
            "For a pipeline whose slot lost changes (dropped, its WAL removed, or acknowledged past "
            "the store: the drain refuses it with SlotMissing, a lost slot or SlotAheadOfStore). "
            "Creates the slot again under its name (a slot only ahead is kept), copies every table "
            "of the pipeline as a resync (a temporary slot exports each copy), and records the "
            "recovery in the store. The next drain then goes on from the slot's position, and the "
            "next merge replaces each Delta table from its copy in one commit (the old versions stay "
            "readable by time travel) and applies the later changes. Pause the pipeline's DAGs "
            "meanwhile. Prints the recovery record as JSON; exit 1 when there is nothing to "
            "recover or it cannot be done (nothing recorded)."
        ),
    )
    add_dsn_argument(p, "of the source database")
    p.add_argument("--slot", required=True, help="the pipeline's replication slot")
    p.add_argument("--store", required=True, metavar="S3URL",
                   help="the pipeline's change store: s3://bucket/prefix")
    p.add_argument("--publication", action="append", default=[], metavar="NAME",
                   help="the publication(s) the pipeline's drains use (repeatable; default: those the "
                        "store's newest window records)")
    p.add_argument("--workers", type=int, default=4, help="parallel COPY sessions (default 4)")
    p.add_argument("--rows-per-part", type=int, default=1_000_000, help="rows per Parquet part (default 1000000)")
    p.add_argument("--as-text", action="append", default=[], metavar="SCHEMA.TABLE=COL[,COL]",
                   help="keep these columns as their exact PostgreSQL text (repeatable), as the drain does")
    p.add_argument("--two-phase", action="store_true", default=None,
                   help="create the slot with two-phase decoding (default: as the lost slot was)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from airflow_pgcdc.snapshot.options import RecoverOptions
    from airflow_pgcdc.snapshot.recover import recover_pipeline

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    done = recover_pipeline(args.dsn, args.store, slot=args.slot, publications=args.publication or None,
                            options=RecoverOptions.from_args(args))
    out = done.recovery.to_dict()
    out["record"] = done.url
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
