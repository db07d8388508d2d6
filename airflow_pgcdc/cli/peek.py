"""``pgcdc peek``: what is in a slot, as JSON lines.

It is the tool a user reaches for to see what a slot holds, and it proves the decoders
end to end. By default it prints one line per row change (pgoutput): the operation, the
table, the transaction's commit LSN and time, and the row as ``{column: value}`` with
typed values (booleans, integers, floats, JSON; other types as PostgreSQL prints them);
``--protocol`` prints every decoded protocol message instead (always so for
pglogical_output). When the slot is quiet it says so on stderr.

It never acknowledges unless asked: the slot stays where it was, so the same changes can
be peeked again, and a pipeline's slot is not moved past its store (whose next drain would
then fail with ``SlotAheadOfStore``, recoverable only by a new snapshot). ``--ack``
acknowledges each transaction after printing it; on a slot this run did not create it
also needs ``--force-ack``, the deliberate "no store follows this slot".
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
            "Print what is in a logical replication slot as JSON lines: one line per row "
            "change with column names and typed values (--protocol: one line per decoded "
            "protocol message). The slot does not move unless --ack is given (with "
            "--force-ack on a slot this run did not create: acknowledging a pipeline's slot "
            "loses its store's next window). Without a stop option it runs until interrupted."
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
    p.add_argument("--protocol", action="store_true",
                   help="print every decoded protocol message (begin, relation, insert, commit, ...) "
                        "instead of one line per row change")
    p.add_argument("--ack", action="store_true",
                   help="acknowledge each transaction after printing it: the slot advances for good")
    p.add_argument("--force-ack", action="store_true",
                   help="with --ack, on a slot this run did not create: no pgcdc store follows this "
                        "slot (a store's next drain fails once its slot moved past it)")
    p.add_argument("--no-ack", action="store_true", help="the default now (kept for old command lines)")
    p.add_argument("--quiet-after", type=float, default=5.0, metavar="SEC",
                   help="say on stderr that the slot is quiet after SEC seconds without changes (default 5)")


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


def _ensure_slot(args: argparse.Namespace) -> bool:
    """Create the slot; whether this run created it."""
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
            return False
        log.info("created slot %s at %s", created.slot_name, created.consistent_point)
        return True


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    if args.max_messages is not None and args.max_messages < 1:
        _usage(args, "--max-messages must be at least 1")
    if args.plugin == "pgoutput" and not args.publication:
        _usage(args, "pgoutput needs at least one --publication")
    if args.ack and args.no_ack:
        _usage(args, "--ack and --no-ack contradict each other")
    if args.force_ack and not args.ack:
        _usage(args, "--force-ack goes with --ack")
    created = _ensure_slot(args) if args.create_slot else False
    if args.ack and not (created or args.force_ack):
        from airflow_pgcdc.cli import error

        error(f"--ack would move slot {args.slot!r} past what is printed, for good: if a pgcdc store follows "
              "this slot, its next drain fails (SlotAheadOfStore) and only a new snapshot recovers it",
              "leave --ack out to look without moving the slot; add --force-ack only if no store follows "
              "this slot")
        return 1
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
    ack = args.ack
    count = 0
    last_data = time.monotonic()
    quiet_said = False
    dumps = json.dumps
    write = out.write
    rows = None if args.protocol or args.plugin != "pgoutput" else RowView()
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
                if not quiet_said and now - last_data >= args.quiet_after:
                    quiet_said = True
                    out.flush()
                    print(f"pgcdc peek: waiting for changes on slot {args.slot} (nothing for "
                          f"{now - last_data:.0f} s; Ctrl-C to stop)", file=sys.stderr, flush=True)
                continue
            last_data = now
            quiet_said = False
            msg = item[1]
            line = msg.to_dict() if rows is None else rows.render(msg)
            if line is not None:
                write(dumps(line, ensure_ascii=False, default=str))
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


_BOOL, _INTS, _FLOATS, _JSONS = 16, frozenset((20, 21, 23, 26)), frozenset((700, 701)), frozenset((114, 3802))


def _typed(type_oid: int, value):
    """A pgoutput tuple value as JSON: NULL None, text typed for booleans, integers,
    finite floats and JSON, else as PostgreSQL printed it; a binary value ``{"binary": b64}``."""
    if value is None or not isinstance(value, str):
        if value is None:
            return None
        import base64

        return {"binary": base64.b64encode(bytes(value)).decode("ascii")}
    try:
        if type_oid == _BOOL:
            return value == "t"
        if type_oid in _INTS:
            return int(value)
        if type_oid in _FLOATS and value not in ("NaN", "Infinity", "-Infinity"):
            return float(value)
        if type_oid in _JSONS:
            return json.loads(value)
    except ValueError:
        pass
    return value


class RowView:
    """pgoutput messages as row changes (see the module): remembers each relation's columns
    (Relation messages) and the open transaction (Begin, or a streamed one's xid)."""

    def __init__(self) -> None:
        self.relations: dict[int, object] = {}
        self.txn: dict = {}

    def _row(self, rel, values) -> tuple[dict, list[str]]:
        from airflow_pgcdc.protocol.pgoutput import UNCHANGED_TOAST

        row, unchanged = {}, []
        for col, v in zip(rel.columns, values, strict=False):
            if v is UNCHANGED_TOAST:
                unchanged.append(col.name)
            else:
                row[col.name] = _typed(col.type_oid, v)
        return row, unchanged

    def _table(self, oid: int) -> tuple[object | None, str]:
        rel = self.relations.get(oid)
        return rel, (f"{rel.namespace or 'pg_catalog'}.{rel.relation_name}" if rel is not None else f"oid {oid}")

    def render(self, msg) -> dict | None:
        t = msg.type
        if t == "relation":
            self.relations[msg.relation_oid] = msg
            return None
        if t in ("begin", "begin_prepare"):
            self.txn = {"xid": msg.xid, "commit_lsn": str(getattr(msg, "final_lsn", getattr(msg, "prepare_lsn", ""))),
                        "commit_time": msg.commit_timestamp.isoformat() if hasattr(msg, "commit_timestamp")
                        else msg.prepare_timestamp.isoformat()}
            return None
        if t == "stream_start":
            self.txn = {"xid": msg.xid, "commit_lsn": None, "commit_time": None, "streamed": True}
            return None
        if t in ("insert", "update", "delete"):
            rel, name = self._table(msg.relation_oid)
            out = {"op": t, "table": name, **self.txn}
            if rel is None:
                out["protocol"] = msg.to_dict()
                return out
            if t != "delete":
                out["row"], unchanged = self._row(rel, msg.new)
                if unchanged:
                    out["unchanged_toast"] = unchanged
            old, key = getattr(msg, "old", None), getattr(msg, "key", None)  # an insert has neither
            if old is not None:  # REPLICA IDENTITY FULL: the whole old row
                out["old"] = self._row(rel, old)[0]
            elif key is not None:  # the old key (its other columns are sent as NULL)
                out["key"] = {c.name: _typed(c.type_oid, v) for c, v in zip(rel.columns, key, strict=False)
                              if c.is_key}
            return out
        if t == "truncate":
            return {"op": "truncate", "tables": [self._table(o)[1] for o in msg.relation_oids],
                    "cascade": msg.cascade, "restart_identity": msg.restart_identity, **self.txn}
        if t == "message":
            d = msg.to_dict()
            return {"op": "message", "prefix": msg.prefix, "transactional": msg.transactional,
                    "lsn": str(msg.lsn), "content": d.get("content_text", {"binary": d["content"]}),
                    **(self.txn if msg.transactional else {})}
        return None
