"""Snapshot to S3 vs plain COPY, same server, same table, alternated in one run.

A table of ``--rows`` rows and 8 mixed columns (int8, int4, text, numeric(12,2),
timestamptz, bool, float8, date) is snapshotted to the S3 server by ``pgcdc snapshot``
(a child process and its worker processes: exported snapshot, parallel CTID parts,
binary COPY -> Arrow -> Parquet, multipart uploads), against ``psql -c "COPY t TO STDOUT" > /dev/null``. Printed: wall
times, the ratio snapshot/COPY (target <= 1.5), rows/s, MB/s of COPY text, and the
peak memory of the snapshot's processes (coordinator and worker processes; PSS summed, in
an extra untimed run; target <= 1 GB).

    .venv/bin/python bench/snapshot.py [--rows 5000000] [--workers 2] [--rounds 2] [--copy-format binary|csv]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_pgcdc.testing.postgres import PostgresServer  # noqa: E402
from airflow_pgcdc.testing.s3 import S3Server  # noqa: E402


def _tree(root: int) -> list[int]:
    """``root`` and its descendants (the snapshot's worker processes)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += [c for c, p in parents.items() if p == pid]
    return out


def _memory(pids: list[int]) -> tuple[int, int]:
    """Summed PSS and RSS (bytes) of ``pids``: PSS splits the pages forked workers share."""
    pss = rss = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
                    elif line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
        except OSError:
            continue
    return pss, rss


def peak_memory(cmd: list[str], env: dict) -> tuple[int, int]:
    """Peak summed PSS and RSS of ``cmd``'s process tree, sampled every 50 ms (an untimed
    run: sampling costs CPU)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak_pss = peak_rss = 0
    while proc.poll() is None:
        pss, rss = _memory(_tree(proc.pid))
        peak_pss, peak_rss = max(peak_pss, pss), max(peak_rss, rss)
        time.sleep(0.05)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:3]} failed ({proc.returncode}): {proc.stderr.read().decode(errors='replace')[-2000:]}")
    return peak_pss, peak_rss


def timed_child(cmd: list[str], env: dict, stdout=subprocess.DEVNULL) -> tuple[float, int, float]:
    """Wall seconds, peak RSS (bytes) and CPU seconds (user + system) of a child process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=stdout, stderr=subprocess.PIPE)
    _pid, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if status != 0:
        raise SystemExit(f"{cmd[:3]} failed ({status}): {err[-2000:]}")
    return elapsed, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rows-per-part", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--server", choices=("pg18", "pg15"), default="pg18")
    ap.add_argument("--copy-format", choices=("binary", "csv"), default="binary")
    args = ap.parse_args()
    with PostgresServer(args.server, settings={"max_wal_size": "4GB"}) as pg, S3Server(volume_size_limit_mb=1024) as s3:
        bucket = s3.create_bucket("bench")
        with psycopg.connect(pg.socket_dsn, autocommit=True) as c:
            t0 = time.perf_counter()
            c.execute(
                "CREATE TABLE t AS SELECT g::bigint AS id, (g %% 100000)::int AS qty, md5(g::text) AS label, "
                "(g / 7.0)::numeric(12,2) AS amount, timestamptz '2024-01-01' + g * interval '1 second' AS ts, "
                "g %% 3 = 0 AS flag, g * 1.25::float8 AS score, date '2020-01-01' + (g %% 3000) AS day "
                "FROM generate_series(1, %s) g",
                (args.rows,),
            )
            c.execute("ALTER TABLE t ADD PRIMARY KEY (id)")
            c.execute("VACUUM ANALYZE t")
            c.execute("CREATE PUBLICATION bench_pub FOR TABLE t")
            size = c.execute("SELECT pg_relation_size('t')").fetchone()[0]
            print(f"table: {args.rows:,} rows, {size / 1e6:,.0f} MB heap, built in {time.perf_counter() - t0:.1f}s", flush=True)
        env = {**os.environ, **s3.aws_env()}
        copy_bytes = None
        snap, plain, cpus = [], [], []

        def snapshot_cmd(i: int) -> list[str]:
            return [sys.executable, "-m", "airflow_pgcdc.cli", "snapshot", "--dsn", pg.dsn, "--slot", f"bench_{i}",
                    "--publication", "bench_pub", "--to", f"s3://{bucket}/round{i}",
                    "--workers", str(args.workers), "--rows-per-part", str(args.rows_per_part),
                    "--progress-interval", "5", "--copy-format", args.copy_format]

        def drop_slot(i: int) -> None:
            with psycopg.connect(pg.socket_dsn, autocommit=True) as c:
                c.execute("SELECT pg_drop_replication_slot(%s)", (f"bench_{i}",))

        for i in range(args.rounds):
            order = ("copy", "snapshot") if i % 2 == 0 else ("snapshot", "copy")
            for who in order:
                if who == "copy":
                    cmd = [str(pg.bin_dir / "psql"), pg.dsn, "-X", "-q", "-c", "COPY t TO STDOUT"]
                    dt, _, _ = timed_child(cmd, env)
                    plain.append(dt)
                    if copy_bytes is None:
                        with psycopg.connect(pg.socket_dsn) as c:
                            copy_bytes = c.execute("SELECT sum(octet_length(t::text)) + count(*) FROM t").fetchone()[0]
                else:
                    dt, _peak, cpu = timed_child(snapshot_cmd(i), env)
                    snap.append(dt)
                    cpus.append(cpu)
                    drop_slot(i)
                last = (plain if who == "copy" else snap)[-1]
                cpu_note = f" ({cpus[-1]:.2f} CPU-s in the snapshot's processes)" if who == "snapshot" else ""
                print(f"round {i + 1} {who:8s} {last:6.2f}s{cpu_note}", flush=True)
        # one more, untimed: the memory of every process of the snapshot, sampled
        pss, rss = peak_memory(snapshot_cmd(args.rounds), env)
        drop_slot(args.rounds)
    s, p = statistics.median(snap), statistics.median(plain)
    print(
        f"RESULT snapshot {s:.2f}s ({args.rows / s:,.0f} rows/s, {copy_bytes / s / 1e6:,.1f} MB/s of COPY text) "
        f"vs plain COPY {p:.2f}s ({args.rows / p:,.0f} rows/s); ratio snapshot/COPY = {s / p:.2f} (target <= 1.5); "
        f"peak memory of all its processes {pss / 1e6:,.0f} MB PSS ({rss / 1e6:,.0f} MB RSS summed; target <= 1000); "
        f"workers {args.workers}, COPY format {args.copy_format}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
