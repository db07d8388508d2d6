"""``pgcdc peek``: what is in a slot, as JSON lines (one decoded message per line).

It is the tool a user reaches for to see what a slot holds, and it proves the
decoders end to end. By default it acknowledges each transaction after printing it
(the slot advances); ``--no-ack`` leaves the slot where it was, so the same changes
can be peeked again.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import TextIO

from airflow_pgcdc.pg.errors import DuplicateObject
from airflow_pgcdc.pg.logical import LogicalStream, transaction_end_lsn
from airflow_pgcdc.pg.replication import ReplicationConnection, StreamEnded
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.pglogical import (
    binary_compat_params_for_server,
    pglogical_start_options,
)
from airflow_pgcdc.protocol.pgoutput.options import PgoutputOptions

log = logging.getLogger(__name__)

PLUGINS = ("pgoutput", "pglogical_output")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "peek",
        help="print what is in a slot as JSON lines",
        description=(
            "Print what is in a logical replication slot as JSON lines, one decoded "
            "message per line. Each transaction is acknowledged after it is printed "
            "(the slot advances) unless --no-ack is given. Without a stop option it "
            "runs until interrupted."
        ),
    )
    add_arguments(p)
    p.set_defaults(handler=run, _parser=p)


def _usage(args: argparse.Namespace, message: str):
    parser = getattr(args, "_parser", None)
    if parser is not None:
        parser.error(message)  # exits 2
    raise SystemExit(f"pgcdc peek: error: {message}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from airflow_pgcdc.cli import add_dsn_argument

    add_dsn_argument(p, 'of the source database')
    p.add_argument("--slot", required=True, help="logical replication slot to read")
    p.add_argument("--create-slot", action="store_true", help="create the slot if it does not exist")
    p.add_argument("--plugin", choices=PLUGINS, default="pgoutput", help="output plugin (default: pgoutput)")
    p.add_argument(
        "--publication",
        action="append",
        default=[],
        metavar="P",
        help="publication to read (pgoutput, repeatable); replication set for pglogical_output",
    )
    p.add_argument("--proto-version", type=int, choices=(1, 2, 3, 4), help="pgoutput protocol version (default: the highest the server supports)")
    p.add_argument("--binary", action="store_true", help="ask for binary tuple values")
    p.add_argument("--streaming", choices=("on", "parallel"), help="stream large in-progress transactions")
    p.add_argument("--two-phase", action="store_true", help="decode prepared transactions at PREPARE (slot must be two-phase)")
    p.add_argument("--messages", action="store_true", help="include logical decoding messages")
    stop = p.add_mutually_exclusive_group()
    stop.add_argument("--until-lsn", type=LSN.parse, metavar="LSN", help="stop once the stream has passed LSN (X/Y)")
    stop.add_argument("--max-messages", type=int, metavar="N", help="stop after N decoded messages")
    stop.add_argument("--idle-timeout", type=float, metavar="SEC", help="stop after SEC seconds without data")
    p.add_argument("--no-ack", action="store_true", help="do not acknowledge: the slot does not advance")


def _plugin_options(args: argparse.Namespace, server_version: int) -> list[tuple[str, str]] | PgoutputOptions:
    if args.plugin == "pgoutput":
        if not args.publication:
            _usage(args, "pgoutput needs at least one --publication")
        return PgoutputOptions(
            publications=tuple(args.publication),
            proto_version=args.proto_version,
            binary=args.binary,
            messages=args.messages,
            streaming=args.streaming or "off",
            two_phase=args.two_phase,
        )
    binary = binary_compat_params_for_server(server_version) if args.binary else {}
    return pglogical_start_options(
        pglogical_replication_set_names=args.publication or ["default"],
        binary_want_binary_basetypes=args.binary,
        **binary,
    )


def _ensure_slot(args: argparse.Namespace) -> None:
    with ReplicationConnection.connect(args.dsn) as conn:
        try:
            created = conn.create_slot(
                args.slot,
                output_plugin=args.plugin,
                two_phase=True if args.two_phase else None,
                snapshot="nothing",
            )
        except DuplicateObject:
            log.info("slot %s exists already; reading it", args.slot)
            return
        log.info("created slot %s at %s", created.slot_name, created.consistent_point)


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    if args.max_messages is not None and args.max_messages < 1:
        _usage(args, "--max-messages must be at least 1")
    if args.plugin == "pgoutput" and not args.publication:
        _usage(args, "pgoutput needs at least one --publication")
    if args.create_slot:
        _ensure_slot(args)
    with ReplicationConnection.connect(args.dsn) as conn:
        opts = _plugin_options(args, conn.server_version)
        if isinstance(opts, PgoutputOptions):
            stream = LogicalStream.pgoutput(conn, args.slot, opts)
        else:
            stream = LogicalStream.pglogical(conn, args.slot, opts)
        count = _pump(stream, args, out)
        conn.stop()
    log.info("%d messages", count)
    return 0


def _pump(stream: LogicalStream, args: argparse.Namespace, out: TextIO) -> int:
    conn = stream.conn
    ack = not args.no_ack
    count = 0
    last_data = time.monotonic()
    dumps = json.dumps
    write = out.write
    poll = 1.0 if args.idle_timeout is None else min(1.0, args.idle_timeout)
    reach = stream.passed_at(args.until_lsn) if args.until_lsn is not None else None
    try:
        while True:
            try:
                item = stream.read(poll)
            except StreamEnded:
                return count
            now = time.monotonic()
            if item is None or item[1] is None:
                if args.idle_timeout is not None and now - last_data >= args.idle_timeout:
                    return count
                if item is not None and reach is not None and item[0].wal_end >= reach:
                    return count
                continue
            last_data = now
            msg = item[1]
            write(dumps(msg.to_dict(), ensure_ascii=False))
            write("\n")
            count += 1
            end = transaction_end_lsn(msg)
            if end is not None:
                out.flush()  # printed before acknowledged
                if ack:
                    conn.confirm(end)
                if reach is not None and end >= reach:
                    return count
            if args.max_messages is not None and count >= args.max_messages:
                out.flush()
                return count
    except BrokenPipeError:  # `pgcdc peek ... | head`
        return count
    except KeyboardInterrupt:
        return count
