"""``pgcdc drain``: one window of logical changes from a slot to S3, then the acknowledgement."""

from __future__ import annotations

import argparse
import json
import logging
import sys


def register(subparsers) -> None:
    from airflow_pgcdc.cli import add_dsn_argument

    p = subparsers.add_parser(
        "drain",
        help="drain one window of logical changes to S3",
        description=(
            "Read the slot's changes from where the last committed window ended (or the "
            "snapshot's consistent point) up to --until-lsn (default: the current WAL insert "
            "position), write them to S3 as one window (Parquet parts + _manifest.json, "
            "written last), then acknowledge them to PostgreSQL. Prints the window summary "
            "as JSON. S3 endpoint and credentials follow boto3's conventions."
        ),
    )
    add_dsn_argument(p, 'of the source database')
    p.add_argument("--slot", required=True, help="logical replication slot (pgoutput)")
    p.add_argument("--publication", required=True, action="append",
                   help="publication to stream (repeat for several)")
    p.add_argument("--store", "--to", dest="store", required=True, metavar="S3URL",
                   help="the change store: s3://bucket/prefix (--to: its 0.1 name)")
    p.add_argument("--until-lsn", metavar="LSN", help="window end (X/Y); default pg_current_wal_insert_lsn()")
    p.add_argument("--max-bytes", type=int, help="end the window after this many bytes of changes")
    p.add_argument("--max-rows", type=int, help="end the window after this many change rows")
    p.add_argument("--max-seconds", type=float, help="end the window after this many seconds")
    p.add_argument("--skip-origin", action="append", default=[], metavar="NAME",
                   help="drop transactions replicated from this origin (repeatable)")
    p.add_argument("--message-prefix", action="append", metavar="PREFIX",
                   help="keep only logical messages with this prefix (repeatable; default all)")
    p.add_argument("--binary", action="store_true", help="ask pgoutput for binary values")
    p.add_argument("--no-heartbeat", action="store_true",
                   help="never emit a heartbeat message to move a stalled stream past the window end")
    p.add_argument("--max-wait", type=float, default=300.0, metavar="SEC",
                   help="give up if the stream receives nothing (heartbeats aside) for this long "
                        "before reaching the window end (default 300)")
    p.add_argument("--connect-options", metavar="OPTS",
                   help="extra libpq options for the replication connection, e.g. '-c wal_sender_timeout=10s'")
    p.add_argument("--spool-dir", help="where streamed transactions are spooled (default: a temp dir)")
    p.add_argument("--forget-table", action="append", default=[], metavar="SCHEMA.TABLE",
                   help="let a table that no publication covers any more leave the pipeline (its Delta "
                        "table keeps its last state); without it the drain refuses (repeatable)")
    p.add_argument("--memory-budget-mb", type=int, default=256, metavar="MB",
                   help="change data the window keeps in memory over all its tables before the largest "
                        "tables' parts are finished early (default 256)")
    p.add_argument("--pack-parts-under-kb", type=int, default=1024, metavar="KB",
                   help="parts of at most this size are written into the window's pack objects (one "
                        "request for many small tables; default 1024); 0: every part an object of its own")
    p.add_argument("--busy-wait", type=float, default=10.0, metavar="SEC",
                   help="wait this long for another drain or snapshot of the slot to end before giving "
                        "up with exit code 75 (default 10)")
    p.add_argument("--as-text", action="append", default=[], metavar="SCHEMA.TABLE=COL[,COL]",
                   help="keep these columns as their exact PostgreSQL text whatever their type (repeatable): "
                        "for values the typed mapping cannot carry, e.g. arrays whose lower bound is not 1; "
                        "give the snapshot, resync and drain the same")
    p.add_argument("--pii", action="append", default=[], metavar="SCHEMA.TABLE:COLUMN=RULE",
                   help="keep a column out of the lake (repeatable): RULE is exclude (never read), hash (HMAC-SHA256 "
                        "of its text under the key in $PGCDC_PII_KEY, hex) or mask[:N] (text: every character but the "
                        "last N as *). Written to the store with the slot's data: every later job of the slot applies "
                        "the same rules")
    p.add_argument("--start-without-snapshot", action="store_true",
                   help="start a store that holds no snapshot and no window of the slot at the slot's "
                        "position (changes only, no initial copy); without it such a store is refused, "
                        "so a mistyped --store cannot take the slot over")
    p.set_defaults(handler=run)


EXIT_BUSY = 75  # EX_TEMPFAIL: another run of the slot had it; nothing was written


def run(args: argparse.Namespace) -> int:
    from airflow_pgcdc.cli import error
    from airflow_pgcdc.drain.drain import DrainBusy, drain_window

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        result = _drain(args, drain_window)
    except DrainBusy as e:  # not a failure of this pipeline: another run is doing the work
        error(str(e), e.hint)
        return EXIT_BUSY
    json.dump(result.to_dict(), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _drain(args: argparse.Namespace, drain_window):
    from airflow_pgcdc.drain.options import DrainOptions

    options = DrainOptions.of(  # built once from the arguments (None: the default)
        until_lsn=args.until_lsn,
        max_rows=args.max_rows,
        max_bytes=args.max_bytes,
        max_seconds=args.max_seconds,
        skip_origins=args.skip_origin,
        message_prefixes=args.message_prefix,
        binary=args.binary,
        heartbeat=not args.no_heartbeat,
        max_wait=args.max_wait,
        connect_options=args.connect_options,
        spool_dir=args.spool_dir,
        forget_tables=args.forget_table,
        busy_wait=args.busy_wait,
        memory_budget=args.memory_budget_mb << 20,
        pack_parts_under=args.pack_parts_under_kb << 10,
        start_without_snapshot=args.start_without_snapshot,
        as_text=args.as_text,
        pii=args.pii,
    )
    return drain_window(args.dsn, args.store, slot=args.slot, publications=args.publication, options=options)
