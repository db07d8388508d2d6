"""The drain (pgoutput → Parquet windows on the S3 server) vs ``pg_recvlogical -f /dev/null``.

Same server, same WAL, same pgoutput options (protocol 4, ``streaming parallel``,
``messages``), slots created before the workload, the two consumers alternated in one
run. Wall time: from the call until the window is committed and acknowledged (ours),
until ``--endpos`` is reached (pg_recvlogical). Workloads:

* ``inserts``: 1,000,000 rows inserted in 10 transactions;
* ``updates``: 200,000 single-row update transactions;
* ``memory``: one 5,000,000-row transaction (streamed, spooled to disk): the peak RSS
  of a ``pgcdc drain`` process (target <= 300 MB).

Printed: throughput ratio ours / pg_recvlogical (target >= 0.8) and the peak RSS.

    .venv/bin/python bench/drain.py [--server pg18|pg15] [--rounds 2] [--workload inserts|updates|memory|all]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stream import fill_inserts, fill_updates  # noqa: E402  (the same workloads as bench/stream.py)

from airflow_pgcdc.drain.drain import drain_window  # noqa: E402
from airflow_pgcdc.protocol.lsn import LSN  # noqa: E402
from airflow_pgcdc.sandbox import PostgresServer, S3Server  # noqa: E402
from airflow_pgcdc.testing.memory import wait_with_peak  # noqa: E402


def setup(conn: psycopg.Connection) -> None:
    conn.execute("CREATE TABLE bench (id bigint PRIMARY KEY, a int, b text, c timestamptz, d numeric(12,2))")
    conn.execute("CREATE PUBLICATION bench_pub FOR TABLE bench")


def create_slots(server: PostgresServer, names: list[str]) -> None:
    with psycopg.connect(server.socket_dsn, autocommit=True) as c:
        for s in names:
            c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (s,))


def drop_slots(server: PostgresServer, names: list[str]) -> None:
    with psycopg.connect(server.socket_dsn, autocommit=True) as c:
        for s in names:
            c.execute("SELECT pg_drop_replication_slot(%s)", (s,))


def current_lsn(server: PostgresServer) -> LSN:
    with psycopg.connect(server.socket_dsn, autocommit=True) as c:
        return LSN.parse(c.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])


def run_ours(server: PostgresServer, s3: S3Server, url: str, slot: str, target: LSN) -> tuple[float, int]:
    t0 = time.perf_counter()
    r = drain_window(server.dsn, url, slot=slot, publications="bench_pub", until_lsn=target,
                     s3_client=s3.client())
    return time.perf_counter() - t0, r.rows


def run_recvlogical(server: PostgresServer, slot: str, target: LSN) -> float:
    version = 4 if server.version_num >= 160000 else 2
    streaming = "parallel" if server.version_num >= 160000 else "on"
    cmd = [
        str(server.bin_dir / "pg_recvlogical"),
        "-d", server.dsn, "-S", slot, "--start", "--no-loop",
        "-o", f"proto_version={version}", "-o", "publication_names=bench_pub",
        "-o", "messages=true", "-o", f"streaming={streaming}",
        "--endpos", str(target), "-f", "/dev/null", "-s", "10",
    ]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - t0


def bench(server: PostgresServer, s3: S3Server, url: str, name: str, fill, rounds: int) -> float:
    slots = [f"bench_{name}_{i}" for i in range(2 * rounds)]
    create_slots(server, slots)
    t0 = time.perf_counter()
    with psycopg.connect(server.socket_dsn, autocommit=True) as c:
        fill(c)
    target = current_lsn(server)
    print(f"[{name}] workload written in {time.perf_counter() - t0:.1f}s, end LSN {target}", flush=True)
    ours, theirs = [], []
    rows = 0
    for i in range(rounds):
        order = ("ours", "theirs") if i % 2 == 0 else ("theirs", "ours")
        for who in order:
            if who == "ours":
                dt, rows = run_ours(server, s3, url, slots[2 * i], target)
                ours.append(dt)
            else:
                theirs.append(run_recvlogical(server, slots[2 * i + 1], target))
            print(f"[{name}] round {i + 1} {who:6s} {(ours if who == 'ours' else theirs)[-1]:.2f}s", flush=True)
    drop_slots(server, slots)
    o, t = statistics.median(ours), statistics.median(theirs)
    ratio = t / o
    print(f"RESULT {name}: ours {o:.2f}s ({rows / o:,.0f} rows/s), pg_recvlogical {t:.2f}s "
          f"({rows / t:,.0f} rows/s); throughput ratio ours/pg_recvlogical = {ratio:.2f}", flush=True)
    return ratio


def bench_memory(server: PostgresServer, s3: S3Server, url: str, rows: int, first: int) -> float:
    slot = "bench_memory"
    create_slots(server, [slot])
    t0 = time.perf_counter()
    with psycopg.connect(server.socket_dsn, autocommit=True) as c:
        fill_inserts(c, rows, 1, first=first)
    target = current_lsn(server)
    print(f"[memory] one {rows:,}-row transaction written in {time.perf_counter() - t0:.1f}s", flush=True)
    env = {**os.environ, **s3.aws_env()}
    cmd = [sys.executable, "-m", "airflow_pgcdc.cli", "drain", "--dsn", server.dsn, "--slot", slot,
           "--publication", "bench_pub", "--to", url, "--until-lsn", str(target)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    status, peak, _usage = wait_with_peak(proc)  # VmHWM: ru_maxrss would carry this process' own size
    dt = time.perf_counter() - t0
    if status != 0:
        raise RuntimeError(f"the drain failed ({status})")
    peak_mb = peak / (1 << 20)
    drop_slots(server, [slot])
    print(f"RESULT memory: one {rows:,}-row streamed transaction drained in {dt:.1f}s "
          f"({rows / dt:,.0f} rows/s), peak RSS {peak_mb:.0f} MB (target <= 300 MB)", flush=True)
    return peak_mb


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", choices=("pg18", "pg15"), default="pg18")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--txns", type=int, default=10)
    ap.add_argument("--updates", type=int, default=200_000)
    ap.add_argument("--big", type=int, default=5_000_000)
    ap.add_argument("--workload", choices=("inserts", "updates", "memory", "all"), default="all")
    args = ap.parse_args()
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
    settings = {"max_wal_size": "8GB", "wal_sender_timeout": "0", "checkpoint_timeout": "30min"}
    results = {}
    with PostgresServer(args.server, settings=settings) as server, S3Server(volume_size_limit_mb=1024) as s3:
        bucket = s3.create_bucket("bench")
        url = f"s3://{bucket}/lake"
        with psycopg.connect(server.socket_dsn, autocommit=True) as c:
            setup(c)
        if args.workload in ("inserts", "updates", "all"):
            results["inserts"] = bench(server, s3, url, "inserts",
                                       lambda c: fill_inserts(c, args.rows, args.txns), args.rounds)
        if args.workload in ("updates", "all"):
            results["updates"] = bench(server, s3, url, "updates", lambda c: fill_updates(c, args.updates),
                                       args.rounds)
        if args.workload in ("memory", "all"):
            peak = bench_memory(server, s3, url, args.big, first=args.rows + 1)
    for k, v in results.items():
        print(f"ratio {k}: {v:.2f} (target >= 0.80)")
    if args.workload in ("memory", "all"):
        print(f"peak RSS of a {args.big:,}-row transaction: {peak:.0f} MB (target <= 300 MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
