"""Stream consumer vs pg_recvlogical, same server, same WAL, alternated in one run.

Both consumers read the same WAL range from their own slots, all created before the
workload: ours receives every message and decodes it into typed objects
(:class:`airflow_pgcdc.pg.logical.LogicalStream`); the baseline is
``pg_recvlogical -f /dev/null`` with the same pgoutput options. Wall time is measured
from process/connection start until the consumer has passed the workload's end LSN.
Printed ratio: our throughput / pg_recvlogical's (>= 0.9 is the target).

    .venv/bin/python bench/stream.py [--server pg18|pg15] [--rounds 2] [--workload inserts|updates|all]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_pgcdc.pg.logical import LogicalStream  # noqa: E402
from airflow_pgcdc.pg.replication import ReplicationConnection  # noqa: E402
from airflow_pgcdc.protocol.lsn import LSN  # noqa: E402
from airflow_pgcdc.protocol.pgoutput.options import PgoutputOptions  # noqa: E402
from airflow_pgcdc.testing.postgres import PostgresServer  # noqa: E402

PROTO = 1  # the same pgoutput options for both consumers


def workload_inserts(conn: psycopg.Connection, rows: int, txns: int) -> None:
    conn.execute(
        "CREATE TABLE bench (id bigint PRIMARY KEY, a int, b text, c timestamptz, d numeric(12,2))"
    )
    conn.execute("CREATE PUBLICATION bench_pub FOR TABLE bench")


def fill_inserts(conn: psycopg.Connection, rows: int, txns: int, first: int = 1) -> None:
    """``rows`` rows with ids from ``first``, inserted in ``txns`` transactions."""
    per = rows // txns
    for t in range(txns):
        lo = first - 1 + t * per
        conn.execute(
            "INSERT INTO bench SELECT g, g %% 1000, md5(g::text), now(), g / 7.0 "
            "FROM generate_series(%s::bigint, %s::bigint) g",
            (lo + 1, lo + per),
        )


def fill_updates(conn: psycopg.Connection, count: int) -> None:
    conn.execute("SET synchronous_commit = off")
    conn.execute(
        f"""DO $$ BEGIN
              FOR i IN 1..{count} LOOP
                UPDATE bench SET a = a + 1 WHERE id = i; COMMIT;
              END LOOP; END $$"""
    )


def run_ours(server: PostgresServer, slot: str, target: LSN) -> tuple[float, int]:
    t0 = time.perf_counter()
    rows = 0
    with ReplicationConnection.connect(server.dsn) as conn:
        stream = LogicalStream.pgoutput(
            conn, slot, PgoutputOptions(publications=("bench_pub",), proto_version=PROTO)
        )
        for frame, msg in stream:
            if msg is None:
                if frame.wal_end >= target:
                    break
                continue
            t = msg.type
            if t == "insert" or t == "update" or t == "delete":
                rows += 1
            elif t == "commit" and msg.end_lsn >= target:
                break
        conn.stop()
    return time.perf_counter() - t0, rows


def run_recvlogical(server: PostgresServer, slot: str, target: LSN) -> float:
    cmd = [
        str(server.bin_dir / "pg_recvlogical"),
        "-d", server.dsn, "-S", slot, "--start", "--no-loop",
        "-o", f"proto_version={PROTO}", "-o", "publication_names=bench_pub",
        "--endpos", str(target), "-f", "/dev/null", "-s", "10",
    ]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - t0


def bench(server: PostgresServer, name: str, fill, rounds: int) -> float:
    slots = [f"bench_{name}_{i}" for i in range(2 * rounds)]
    with psycopg.connect(server.socket_dsn, autocommit=True) as c:
        for s in slots:
            c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (s,))
        t0 = time.perf_counter()
        fill(c)
        target = LSN.parse(c.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])
        print(f"[{name}] workload written in {time.perf_counter() - t0:.1f}s, end LSN {target}", flush=True)
    ours, theirs = [], []
    rows = None
    for i in range(rounds):
        order = ("ours", "theirs") if i % 2 == 0 else ("theirs", "ours")
        for who in order:
            if who == "ours":
                dt, rows = run_ours(server, slots[2 * i], target)
                ours.append(dt)
            else:
                theirs.append(run_recvlogical(server, slots[2 * i + 1], target))
            print(f"[{name}] round {i + 1} {who:6s} {(ours if who == 'ours' else theirs)[-1]:.2f}s", flush=True)
    with psycopg.connect(server.socket_dsn, autocommit=True) as c:
        for s in slots:
            c.execute("SELECT pg_drop_replication_slot(%s)", (s,))
    o, t = statistics.median(ours), statistics.median(theirs)
    ratio = t / o
    print(
        f"RESULT {name}: ours {o:.2f}s ({rows / o:,.0f} rows/s), pg_recvlogical {t:.2f}s "
        f"({rows / t:,.0f} rows/s); throughput ratio ours/pg_recvlogical = {ratio:.2f}",
        flush=True,
    )
    return ratio


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", choices=("pg18", "pg15"), default="pg18")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--txns", type=int, default=10)
    ap.add_argument("--updates", type=int, default=200_000)
    ap.add_argument("--workload", choices=("inserts", "updates", "all"), default="all")
    args = ap.parse_args()
    with PostgresServer(args.server, settings={"max_wal_size": "4GB", "wal_sender_timeout": "0"}) as server:
        with psycopg.connect(server.socket_dsn, autocommit=True) as c:
            workload_inserts(c, args.rows, args.txns)
        results = {}
        if args.workload in ("inserts", "all"):
            results["inserts"] = bench(server, "inserts", lambda c: fill_inserts(c, args.rows, args.txns), args.rounds)
        if args.workload in ("updates", "all"):
            if args.workload == "updates":
                with psycopg.connect(server.socket_dsn, autocommit=True) as c:
                    fill_inserts(c, args.updates, 1)
            results["updates"] = bench(server, "updates", lambda c: fill_updates(c, args.updates), args.rounds)
    for k, v in results.items():
        print(f"ratio {k}: {v:.2f} (target >= 0.90)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
