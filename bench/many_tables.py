"""What a table costs the merge when a window touches many tables a little (issue: cost that
follows the changes, not the number of tables).

``--tables`` small tables (``--rows`` rows each: id bigint key, qty int, label text) on
PostgreSQL, one publication, snapshotted by the real pipeline; then one workload updates
``--changes`` rows of every table (and inserts one), and one window is drained. Then, for
each size in ``--sizes`` (the first N tables) and each path, two ``pgcdc merge`` jobs into
a fresh Delta root: the bootstrap (``--max-windows 0``) and the merge of that window:

* ``spark`` (``--driver-rows 0 --table-workers 1``): every table's rows read, compacted
  and staged by a Spark job, then committed by delta-rs, one table after another (what
  every merge did before the driver path);
* ``serial`` (``--table-workers 1``): a small batch read and compacted on the driver in
  Arrow and merged by delta-rs, no Spark job, one table after another (what every merge
  did before the table workers);
* ``driver`` (the default): the same on ``--table-workers`` driver threads (default 4).

``--cluster N``: the jobs run on a standalone Spark cluster of N one-core workers started
here (``--master spark://…``; the ``spark`` path's Spark jobs run on its executors, the
other paths' tables on the driver's threads as before).

Printed per job: wall seconds (Spark's start-up included), the job's own seconds, seconds
per table, and the ratios driver/serial, driver/spark and N-table/first-size. Every merged Delta table is
checked against PostgreSQL (row count and a digest of ids and quantities).

    .venv/bin/python bench/many_tables.py [--sizes 30,300] [--rows 2000] [--changes 5]
                                          [--paths serial,driver[,spark]] [--table-workers N]
                                          [--cluster 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from merge import current_lsn, run_job, say  # noqa: E402  (bench/merge.py)

from airflow_pgcdc.drain.drain import drain_window  # noqa: E402
from airflow_pgcdc.lake.tables import delta_table_url
from airflow_pgcdc.snapshot.export import snapshot_to_s3  # noqa: E402
from airflow_pgcdc.store import s3 as s3store  # noqa: E402
from airflow_pgcdc.testing.postgres import PostgresServer  # noqa: E402
from airflow_pgcdc.testing.s3 import S3Server  # noqa: E402
from airflow_pgcdc.testing.spark import SparkCluster  # noqa: E402

SLOT, PUB, BUCKET = "bench_many", "bench_many_pub", "bench"
PATHS = {"spark": ["--driver-rows", "0", "--table-workers", "1"], "serial": ["--table-workers", "1"], "driver": []}


def peak_rss_mb() -> float:
    """This process's peak resident set (the snapshot's coordinator and the drain run here)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def name(i: int) -> str:
    return f"t{i:05d}"


def build(pg: PostgresServer, tables: int, rows: int) -> None:
    t0 = time.perf_counter()
    with psycopg.connect(pg.socket_dsn, autocommit=True) as c:
        for i in range(tables):
            c.execute(f"CREATE TABLE {name(i)} (id bigint PRIMARY KEY, qty int, label text)")
            c.execute(f"INSERT INTO {name(i)} SELECT g, g %% 1000, md5(g::text) FROM generate_series(1, %s) g",
                      (rows,))
        c.execute(f"CREATE PUBLICATION {PUB} FOR ALL TABLES")
    say(f"{tables} tables of {rows:,} rows in {time.perf_counter() - t0:.1f}s")


def workload(pg: PostgresServer, tables: int, rows: int, changes: int) -> None:
    with psycopg.connect(pg.socket_dsn, autocommit=True) as c:
        for i in range(tables):
            with c.transaction():
                c.execute(f"UPDATE {name(i)} SET qty = qty + 1, label = 'changed' WHERE id <= %s", (changes,))
                c.execute(f"INSERT INTO {name(i)} VALUES (%s, 7, 'new')", (rows + 1,))


def digest_pg(pg: PostgresServer, table: str) -> tuple:
    with psycopg.connect(pg.socket_dsn) as c:
        return tuple(c.execute(f"SELECT count(*), sum(id), sum(qty) FROM {table}").fetchone())


def digest_delta(url: str, storage: dict[str, str]) -> tuple:
    from deltalake import DeltaTable

    t = DeltaTable(url, storage_options=storage).to_pyarrow_table(columns=["id", "qty"])
    return (t.num_rows, sum(t["id"].to_pylist()), sum(t["qty"].to_pylist()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="30,300", help="table counts merged, comma-separated")
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--changes", type=int, default=5, help="rows updated per table (one more inserted)")
    ap.add_argument("--paths", default="serial,driver",
                    help="serial (baseline: one table at a time), driver (table workers), spark (--driver-rows 0)")
    ap.add_argument("--table-workers", type=int, help="the driver path's --table-workers (default: the job's)")
    ap.add_argument("--cluster", type=int, default=0, help="run the jobs on a standalone cluster of N 1-core workers")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    paths = args.paths.split(",")
    if args.table_workers:
        PATHS["driver"] = ["--table-workers", str(args.table_workers)]
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    print(f"load average at start: {os.getloadavg()}; {os.cpu_count()} CPUs", flush=True)
    pg = PostgresServer("pg18", settings={"max_wal_size": "4GB", "wal_sender_timeout": "0",
                                          "max_locks_per_transaction": "1024"})
    s3 = S3Server(volume_size_limit_mb=1024)
    pg.start()
    s3.start()
    cluster = SparkCluster(workers=args.cluster, cores=1).start() if args.cluster else None
    try:
        if cluster is not None:
            say(f"standalone cluster {cluster.master_url}: {args.cluster} worker(s) of 1 core")
            for path in PATHS:
                PATHS[path] = [*PATHS[path], "--master", cluster.master_url]
        return run(args, sizes, paths, pg, s3)
    finally:
        if cluster is not None:
            cluster.close()
        s3.close()
        pg.close()


def run(args, sizes: list[int], paths: list[str], pg: PostgresServer, s3: S3Server) -> int:
    os.environ.update(s3.aws_env())
    client = s3.client()
    s3.create_bucket(BUCKET)
    src, env = f"s3://{BUCKET}/cdc", {**os.environ}
    storage = s3store.delta_storage_options(s3store.S3Settings.from_env())
    most = max(sizes)
    build(pg, most, args.rows)
    t0 = time.perf_counter()
    snapshot_to_s3(pg.dsn, src, slot=SLOT, publications=PUB, workers=2, s3=client)
    say(f"snapshot of {most} tables: {time.perf_counter() - t0:.1f}s (this process's peak RSS so far "
        f"{peak_rss_mb():,.0f} MB; the copies ran in worker processes)")
    workload(pg, most, args.rows, args.changes)
    t0 = time.perf_counter()
    w = drain_window(pg.dsn, src, slot=SLOT, publications=PUB, s3=client, until_lsn=current_lsn(pg))
    say(f"one window drained: {w.rows:,} change rows of {most} tables in {time.perf_counter() - t0:.1f}s "
        f"(peak RSS so far {peak_rss_mb():,.0f} MB)")
    expect = {name(i): digest_pg(pg, name(i)) for i in range(most)}
    work = tempfile.mkdtemp(prefix="bench-many-")
    results: dict[tuple[str, int, str], dict] = {}
    for n in sizes:
        tables = [f"public.{name(i)}" for i in range(n)]
        for path in paths:
            lake = f"s3://{BUCKET}/lake-{path}-{n}"
            common = ["--store", src, "--slot", SLOT, "--delta", lake, "--tables", *tables, *PATHS[path]]
            for step, extra in (("bootstrap", ["--max-windows", "0"]), ("merge", [])):
                job = run_job([*common, *extra], env, os.path.join(work, f"{path}-{n}-{step}"))
                inside = job["result"]["seconds"]
                results[(path, n, step)] = {"wall": job["wall"], "inside": inside}
                say(f"{n:5d} tables  {path:6s}  {step:9s}  wall {job['wall']:7.1f}s  in the job {inside:7.1f}s  "
                    f"{inside / n:6.3f} s/table  peak tree PSS {job['peak_pss'] / 1e6:,.0f} MB")
            bad = [t for t in tables if digest_delta(delta_table_url(lake, "public", t.split(".")[1]), storage)
                   != expect[t.split(".")[1]]]
            if bad:
                print(f"MISMATCH: {path} {n} tables: {len(bad)} Delta table(s) differ from PostgreSQL: {bad[:5]}")
                return 1
    print("\nratios (seconds inside the job):")
    for step in ("bootstrap", "merge"):
        for n in sizes:
            for base in ("serial", "spark"):
                if base in paths and "driver" in paths:
                    s, d = results[(base, n, step)]["inside"], results[("driver", n, step)]["inside"]
                    print(f"  {step:9s} {n:5d} tables: driver/{base} = {d / s:.3f}  ({d / n:.3f} vs {s / n:.3f} "
                          "s/table)")
        if len(sizes) > 1:
            for path in paths:
                a, b = results[(path, sizes[0], step)]["inside"], results[(path, sizes[-1], step)]["inside"]
                print(f"  {step:9s} {path:6s}: {sizes[-1]} tables / {sizes[0]} tables = {b / a:.2f}x "
                      f"(tables {sizes[-1] / sizes[0]:.0f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
