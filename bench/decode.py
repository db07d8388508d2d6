"""Benchmark: pgoutput decoding speed, in-process, one core.

Builds a realistic stream -- ``Begin``, one ``Relation``, ``--per-txn`` ``Insert`` messages
of 5 text-format columns (an int, a short name, a timestamptz, a numeric, a boolean),
``Commit``, repeated until ``--rows`` rows -- and times
``PgoutputDecoder.decode`` over all of it (best of ``--repeat`` runs).

With ``--capture-from pg18`` (or ``pg15``) the stream is captured from a real server
instead: the bench starts one, inserts the same shape of rows with SQL, and records
the raw XLogData payloads of a pgoutput stream (``--save FILE`` keeps them).
If ``PGCDC_CAPTURE`` names a file of captured messages, that file is decoded instead.
Its format: each message as a 4-byte big-endian length followed by that many bytes
(the payloads of XLogData frames, in stream order). ``--proto`` and
``--parallel-streaming`` must match how the capture was made.

    .venv/bin/python bench/decode.py [--rows 200000] [--per-txn 100] [--repeat 5]
"""

from __future__ import annotations

import argparse
import gc
import os
import struct
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_pgcdc.protocol.lsn import LSN  # noqa: E402
from airflow_pgcdc.protocol.pgoutput import (  # noqa: E402
    Begin,
    Commit,
    Insert,
    PgoutputDecoder,
    Relation,
    RelationColumn,
    encode_message,
)

_NAMES = ["alice", "bob", "carol", "dave", "eve", "mallory", "trent", "peggy", "victor"]


def build_stream(rows: int, per_txn: int, proto: int) -> tuple[list[bytes], int]:
    """Synthetic messages and the number of Insert messages among them."""
    rel = Relation(
        None,
        16384,
        "public",
        "orders",
        "d",
        (
            RelationColumn(1, "id", 20, -1),
            RelationColumn(0, "customer", 25, -1),
            RelationColumn(0, "created_at", 1184, -1),
            RelationColumn(0, "amount", 1700, 655366),
            RelationColumn(0, "paid", 16, -1),
        ),
    )
    t0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    msgs: list[bytes] = []
    lsn = 0x16B374D848
    xid = 1000
    n = 0
    while n < rows:
        batch = min(per_txn, rows - n)
        ts = t0 + timedelta(seconds=n)
        msgs.append(encode_message(Begin(LSN(lsn + 64 * batch + 64), ts, xid), proto))
        msgs.append(encode_message(rel, proto))
        for i in range(n, n + batch):
            created = (t0 + timedelta(microseconds=7_919 * i)).strftime("%Y-%m-%d %H:%M:%S.%f+00")
            row = (
                str(100_000 + i),
                _NAMES[i % len(_NAMES)],
                created,
                f"{(i * 37) % 100_000 / 100:.2f}",
                "t" if i % 3 else "f",
            )
            msgs.append(encode_message(Insert(None, 16384, row), proto))
        lsn += 64 * batch + 128
        msgs.append(encode_message(Commit(0, LSN(lsn - 64), LSN(lsn), ts), proto))
        xid += 1
        n += batch
    return msgs, rows


def load_capture(path: str) -> list[bytes]:
    raw = Path(path).read_bytes()
    msgs = []
    pos = 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise SystemExit(f"{path}: truncated length prefix at byte {pos}")
        (ln,) = struct.unpack_from("!I", raw, pos)
        pos += 4
        if pos + ln > len(raw):
            raise SystemExit(f"{path}: truncated message at byte {pos}")
        msgs.append(raw[pos : pos + ln])
        pos += ln
    return msgs


def capture_from_server(flavour: str, rows: int, per_txn: int, proto: int) -> list[bytes]:
    """Raw pgoutput payloads from a real server for ``rows`` inserts (5 columns)."""
    import psycopg

    from airflow_pgcdc.pg.replication import ReplicationConnection
    from airflow_pgcdc.protocol.frames import PrimaryKeepalive
    from airflow_pgcdc.protocol.pgoutput.options import PgoutputOptions
    from airflow_pgcdc.testing.postgres import PostgresServer

    with PostgresServer(flavour) as server:
        with psycopg.connect(server.socket_dsn, autocommit=True) as c:
            c.execute(
                "CREATE TABLE orders (id bigint PRIMARY KEY, customer text, "
                "created_at timestamptz, amount numeric(12,2), paid bool)"
            )
            c.execute("CREATE PUBLICATION pub FOR TABLE orders")
            c.execute("SELECT pg_create_logical_replication_slot('bench', 'pgoutput')")
            names = "ARRAY[" + ",".join(f"'{n}'" for n in _NAMES) + "]"
            for lo in range(0, rows, per_txn):
                c.execute(
                    f"INSERT INTO orders SELECT g, ({names})[1 + g %% {len(_NAMES)}], "
                    "now() + g * interval '7919 microseconds', (g * 37 %% 100000) / 100.0, g %% 3 <> 0 "
                    "FROM generate_series(%s::bigint, %s::bigint) g",
                    (lo + 1, min(rows, lo + per_txn)),
                )
            target = LSN.parse(c.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])
        msgs: list[bytes] = []
        with ReplicationConnection.connect(server.dsn) as conn:
            opts = PgoutputOptions(publications=("pub",), proto_version=proto)
            conn.start_replication("bench", 0, options=opts.start_options(conn.server_version))
            while True:
                frame = conn.read_message(30)
                if frame is None:
                    raise SystemExit("capture: the server went quiet before the end LSN")
                if isinstance(frame, PrimaryKeepalive):
                    if frame.wal_end >= target:
                        break
                    continue
                msgs.append(bytes(frame.data))
            conn.stop()
    return msgs


def run(msgs: list[bytes], proto: int, parallel: bool) -> tuple[float, int]:
    decoder = PgoutputDecoder(proto, parallel_streaming=parallel)
    decode = decoder.decode
    rows = 0
    gc.collect()
    gc.disable()
    try:
        t = time.perf_counter()
        for m in msgs:
            decode(m)
        elapsed = time.perf_counter() - t
    finally:
        gc.enable()
    for m in msgs:  # count rows outside the timed loop
        if m[:1] in (b"I", b"U", b"D"):
            rows += 1
    return elapsed, rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000, help="Insert messages to build")
    ap.add_argument("--per-txn", type=int, default=100, help="Inserts per transaction")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs; the best counts")
    ap.add_argument("--proto", type=int, default=4, help="pgoutput proto_version")
    ap.add_argument("--parallel-streaming", action="store_true")
    ap.add_argument("--capture-from", choices=("pg18", "pg15"), help="capture the stream from a real server")
    ap.add_argument("--save", metavar="FILE", help="with --capture-from: write the capture (PGCDC_CAPTURE format)")
    args = ap.parse_args(argv)

    capture = os.environ.get("PGCDC_CAPTURE")
    if args.capture_from:
        msgs = capture_from_server(args.capture_from, args.rows, args.per_txn, args.proto)
        source = f"captured from {args.capture_from}: {args.rows} inserts x 5 columns, {args.per_txn} per transaction"
        if args.save:
            with open(args.save, "wb") as f:
                for m in msgs:
                    f.write(struct.pack("!I", len(m)))
                    f.write(m)
    elif capture:
        msgs = load_capture(capture)
        source = f"capture {capture}"
    else:
        msgs, _ = build_stream(args.rows, args.per_txn, args.proto)
        source = f"synthetic: {args.rows} inserts x 5 text columns, {args.per_txn} per transaction"
    total_bytes = sum(len(m) for m in msgs)

    best = None
    rows = 0
    for _ in range(max(1, args.repeat)):
        elapsed, rows = run(msgs, args.proto, args.parallel_streaming)
        best = elapsed if best is None else min(best, elapsed)
    assert best is not None
    print(f"pgoutput decode ({source})")
    print(f"  python      {sys.version.split()[0]}")
    print(f"  messages    {len(msgs)} ({total_bytes / len(msgs):.1f} bytes avg)")
    print(f"  best of {args.repeat}   {best:.3f} s")
    print(f"  messages/s  {len(msgs) / best:,.0f}")
    print(f"  rows/s      {rows / best:,.0f}")
    if rows:
        print(f"  us/row      {best / rows * 1e6:.3f}")
    print(f"  MB/s        {total_bytes / best / 1e6:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
