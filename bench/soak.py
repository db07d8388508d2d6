"""Soak: does the lake stay small and the merge stay fast over many cycles, with and
without ``pgcdc maintain`` (issue #14, lake upkeep)?

Two pipelines run side by side in one invocation, on one PostgreSQL and one S3 server (each
its own database, table, slot, store prefix and Delta root), fed the same workload (same
seed): ``maintain`` runs ``pgcdc maintain`` (``maintain_slot``: compaction to
``--target-file-mb``, VACUUM and window expiry with ``--retention-hours``, checkpoint) after
every ``--every`` cycles; ``none`` never does. A cycle is, per pipeline: an OLTP-like
workload of ``--changes`` change rows (``--mix``: updates of recent keys, the newest 2 % of
the table, updates scattered over the table, inserts of new keys, deletes scattered over
the table; transactions of 500), one ``pgcdc drain`` window, one ``pgcdc merge`` of it
(``merge_slot`` in this process, on a ``local[2]`` Spark session started once: Spark
start-up is not in the merge seconds) and, on ``maintain``, the maintenance. The two
pipelines' cycles alternate (cycle i of ``maintain``, then cycle i of ``none``), so both
see the same load of the machine.

Recorded per cycle and pipeline (CSV ``--out``/soak-<engine>.csv, plot soak-<engine>.png):
drain seconds, merge seconds, maintain seconds, the Delta table's live data files and
their bytes (the table's size), its stored bytes (every object under the table: live
files, files removed but not vacuumed, the log), the store's bytes (everything under
``{prefix}/{slot}/``: the snapshot, whose parts ``pgcdc maintain`` removes once the Delta
table holds it and it is older than the retention (its manifest stays), the windows,
state; the snapshot's and the windows' bytes also apart), storage = Delta stored + store,
storage ÷ table size, and the same without the snapshot; the Delta log's bytes and the
deletion-vector files' bytes apart, and the ratio without the snapshot and the log (the log
keeps every commit of the last 24 hours at least, ``maintain.tables.LOG_FLOOR_HOURS``, so
in a soak shorter than a day it only grows); read after the cycle (after the maintenance
on a cycle that has one). Printed at the end: per pipeline, storage ÷ table size (last, and the maximum over
the second half, with and without the snapshot), live files (last), merge seconds (mean of the first and of the last
decile of cycles, their ratio, and the least-squares slope in seconds per cycle), and
whether the Delta table equals PostgreSQL (row count and a digest). Cycle 1 (the first
merge in the process: warm-up) is left out of the merge-seconds figures, not of the CSV.

Targets (the issue's): with maintenance, storage within 2x the table's size and merge
seconds flat over 100 cycles.

    SPARK_LOCAL_IP=127.0.0.1 .venv/bin/python bench/soak.py [--cycles 100] [--rows 200000]
        [--changes 2000] [--engine deltars|delta-spark|delta-spark-dv] [--every 5] [--retention-hours 0]
        [--target-file-mb 1] [--mix 0.75,0.05,0.15,0.05] [--out DIR] [--server pg18|pg15]
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from merge_cost import apply_ops  # noqa: E402  (bench/merge_cost.py)

from airflow_pgcdc.drain.drain import drain_window  # noqa: E402
from airflow_pgcdc.lake.inspect import table_figures
from airflow_pgcdc.lake.sizing import target_bytes
from airflow_pgcdc.lake.tables import delta_table_url
from airflow_pgcdc.maintain import maintain_slot  # noqa: E402
from airflow_pgcdc.merge.jars import unavailable_reason  # noqa: E402
from airflow_pgcdc.merge.job import merge_slot  # noqa: E402
from airflow_pgcdc.protocol.quoting import quote_ident  # noqa: E402
from airflow_pgcdc.snapshot.export import snapshot_to_s3  # noqa: E402
from airflow_pgcdc.store import s3 as s3store  # noqa: E402
from airflow_pgcdc.testing.postgres import PostgresServer  # noqa: E402
from airflow_pgcdc.testing.s3 import S3Server  # noqa: E402

BUCKET, TABLE, PUB = "soak", "t", "soak_pub"
RUNS = ("maintain", "none")
DIGEST = "count(*), sum(id), sum(CAST(qty AS BIGINT)), sum(length(label))"
FIELDS = ("run", "cycle", "change_rows", "drain_s", "merge_s", "maintain_s", "files", "table_bytes",
          "delta_stored_bytes", "store_bytes", "snapshot_bytes", "changes_bytes", "storage_bytes", "storage_ratio",
          "ratio_without_snapshot", "versions_kept", "log_bytes", "vector_bytes", "ratio_without_snapshot_and_log")
T0 = time.perf_counter()


def say(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


class Pipeline:
    """One database + table + slot + store prefix + Delta root, and its workload's state."""

    def __init__(self, name: str, pg: PostgresServer, rows: int, seed: int) -> None:
        self.name = name
        self.db = f"soak_{name}"
        self.dsn = pg.create_database(self.db)
        self.slot = f"soak_{name}"
        self.src = f"s3://{BUCKET}/{name}/cdc"
        self.lake = f"s3://{BUCKET}/{name}/lake"
        self.url = delta_table_url(self.lake, "public", TABLE)
        self.rng = np.random.default_rng(seed)
        self.max_id = rows
        self.deleted: set[int] = set()
        with psycopg.connect(self.dsn, autocommit=True) as c:
            c.execute(f"CREATE TABLE {quote_ident(TABLE)} (id bigint PRIMARY KEY, qty int, label text, "
                      "amount numeric(12,2), ts timestamptz, flag bool)")
            c.execute(f"INSERT INTO {quote_ident(TABLE)} SELECT g, (g %% 1000)::int, md5(g::text), "
                      "(g / 7.0)::numeric(12,2), timestamptz '2024-01-01' + g * interval '1 second', g %% 3 = 0 "
                      "FROM generate_series(1, %s) g", (rows,))
            c.execute(f"VACUUM ANALYZE {quote_ident(TABLE)}")
            c.execute(f"CREATE PUBLICATION {quote_ident(PUB)} FOR TABLE {quote_ident(TABLE)}")

    def workload(self, changes: int, mix: tuple[float, ...], batch: int = 500) -> None:
        n_hot, n_wide, n_ins, n_del = (int(changes * f) for f in mix)
        recent = max(1, self.max_id // 50)
        old_hi = self.max_id - recent
        hot = self.rng.integers(old_hi + 1, self.max_id + 1, size=n_hot)
        wide = self.rng.integers(1, old_hi, size=n_wide)
        cand = self.rng.integers(1, old_hi, size=n_del * 2)
        dels = [int(k) for k in dict.fromkeys(cand.tolist()) if k not in self.deleted][:n_del]
        self.deleted.update(dels)
        ins = np.arange(self.max_id + 1, self.max_id + 1 + n_ins)
        self.max_id += n_ins
        ops = [("U", int(k)) for k in hot] + [("U", int(k)) for k in wide] + [("I", int(k)) for k in ins] \
            + [("D", k) for k in dels]
        ops = [ops[i] for i in self.rng.permutation(len(ops))]
        name = quote_ident(TABLE)
        with psycopg.connect(self.dsn) as c:
            c.execute("SET synchronous_commit = off")
            for lo in range(0, len(ops), batch):
                apply_ops(c, name, ops[lo:lo + batch])
                c.commit()

    def digest_pg(self) -> tuple:
        with psycopg.connect(self.dsn) as c:
            return tuple(str(v) for v in c.execute(f"SELECT {DIGEST} FROM {quote_ident(TABLE)}").fetchone())


def prefix_bytes(client, url: str) -> int:
    loc = s3store.S3Location.parse(url)
    return sum(int(o["Size"]) for o in s3store.list_objects(client, loc.bucket, loc.prefix.rstrip("/") + "/"))


def digest_delta(url: str, storage: dict[str, str]) -> tuple:
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    qb = QueryBuilder().register("d", DeltaTable(url, storage_options=storage))
    row = pa.table(qb.execute(f"SELECT {DIGEST} FROM d").read_all()).to_pylist()[0]
    return tuple(str(v) for v in row.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=100)
    ap.add_argument("--rows", type=int, default=200_000, help="rows of the table at the start")
    ap.add_argument("--changes", type=int, default=2_000, help="change rows per cycle")
    ap.add_argument("--engine", choices=("deltars", "delta-spark", "delta-spark-dv"), default="deltars",
                    help="the merge's engine (delta-spark: Delta's Spark engine, local[2], s3a reader; "
                    "delta-spark-dv: the same with --deletion-vectors)")
    ap.add_argument("--every", "-k", type=int, default=5, help="maintain after every k cycles")
    ap.add_argument("--retention-hours", type=float, default=0.0, help="pgcdc maintain --retention-hours")
    ap.add_argument("--target-file-mb", type=float, default=1.0,
                    help="the bootstrap's and the compaction's data file size")
    ap.add_argument("--mix", default="0.75,0.05,0.15,0.05", metavar="HOT,WIDE,INS,DEL",
                    help="fractions of recent updates, scattered updates, inserts, scattered deletes")
    ap.add_argument("--server", choices=("pg18", "pg15"), default="pg18")
    ap.add_argument("--out", default=None, help="folder of the CSV and the PNG (default: a new temporary one)")
    args = ap.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if args.engine.startswith("delta-spark") and unavailable_reason():
        print(f"delta-spark is not available: {unavailable_reason()}", flush=True)
        return 2
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {os.getloadavg()}; {os.cpu_count()} CPUs; {vars(args)}", flush=True)
    pg = PostgresServer(args.server, settings={"max_wal_size": "4GB", "wal_sender_timeout": "0"})
    s3 = S3Server(volume_size_limit_mb=1024)
    pg.start()
    s3.start()
    try:
        return run(args, pg, s3, out)
    finally:
        s3.close()
        pg.close()


def run(args, pg: PostgresServer, s3: S3Server, out: Path) -> int:
    from airflow_pgcdc.merge.session import spark_session

    os.environ.update(s3.aws_env())
    client = s3.client()
    s3.create_bucket(BUCKET)
    storage = s3store.delta_storage_options(s3store.S3Settings.from_env())
    mix = tuple(float(f) for f in args.mix.split(","))
    engine = "delta-spark" if args.engine.startswith("delta-spark") else "delta-rs"
    merge_kw = {"engine": engine, "target_file_mb": args.target_file_mb}
    if engine == "delta-spark":
        merge_kw["reader"] = "s3a"
    if args.engine == "delta-spark-dv":
        merge_kw["deletion_vectors"] = True
    spark = spark_session("local[2]", delta=engine == "delta-spark")
    pipes = {}
    for name in RUNS:
        p = Pipeline(name, pg, args.rows, seed=7)
        snapshot_to_s3(p.dsn, p.src, slot=p.slot, publications=PUB, s3=client)
        t0 = time.perf_counter()
        merge_slot(spark, store=p.src, slot=p.slot, delta=p.lake, **merge_kw)  # the bootstrap
        f = table_figures(p.url, storage_options=storage, client=client)
        say(f"{name}: {args.rows:,} rows snapshotted and bootstrapped ({time.perf_counter() - t0:.1f}s): "
            f"{f['files']} files, {f['bytes'] / 1e6:.1f} MB")
        pipes[name] = p
    csv_path = out / f"soak-{args.engine}.csv"
    rows: list[dict] = []
    with open(csv_path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        writer.writeheader()
        for cycle in range(1, args.cycles + 1):
            for name, p in pipes.items():
                p.workload(args.changes, mix)
                t0 = time.perf_counter()
                w = drain_window(p.dsn, p.src, slot=p.slot, publications=PUB, s3=client)
                drain_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                res = merge_slot(spark, store=p.src, slot=p.slot, delta=p.lake, **merge_kw)
                merge_s = time.perf_counter() - t0
                bad = [t for t in res.to_dict()["tables"] if t.get("action") == "failed"]
                if bad:
                    raise SystemExit(f"{name} cycle {cycle}: the merge failed: {bad}")
                maintain_s = None
                if name == "maintain" and cycle % args.every == 0:
                    t0 = time.perf_counter()
                    maintain_slot(store=p.src, slot=p.slot, delta=p.lake, retention_hours=args.retention_hours,
                                  target_size=target_bytes(args.target_file_mb),
                                  unreferenced_floor_hours=0)  # no other writer: see maintain/unreferenced.py
                    maintain_s = time.perf_counter() - t0
                f = table_figures(p.url, storage_options=storage, client=client)
                store = prefix_bytes(client, f"{p.src}/{p.slot}")
                snap = prefix_bytes(client, f"{p.src}/{p.slot}/snapshot")
                changes = prefix_bytes(client, f"{p.src}/{p.slot}/changes")
                row = {
                    "run": name, "cycle": cycle, "change_rows": w.rows, "drain_s": round(drain_s, 3),
                    "merge_s": round(merge_s, 3), "maintain_s": None if maintain_s is None else round(maintain_s, 3),
                    "files": f["files"], "table_bytes": f["bytes"], "delta_stored_bytes": f["stored_bytes"],
                    "store_bytes": store, "snapshot_bytes": snap, "changes_bytes": changes,
                    "storage_bytes": f["stored_bytes"] + store,
                    "storage_ratio": round((f["stored_bytes"] + store) / max(1, f["bytes"]), 3),
                    "ratio_without_snapshot": round((f["stored_bytes"] + store - snap) / max(1, f["bytes"]), 3),
                    "versions_kept": f["versions_kept"],
                    "log_bytes": f["log_bytes"], "vector_bytes": f["vector_bytes"],
                    "ratio_without_snapshot_and_log": round(
                        (f["stored_bytes"] + store - snap - f["log_bytes"]) / max(1, f["bytes"]), 3),
                }
                writer.writerow(row)
                fh.flush()
                rows.append(row)
            last = {r["run"]: r for r in rows[-len(pipes):]}
            say(f"cycle {cycle}: " + "; ".join(
                f"{n}: drain {r['drain_s']:.1f}s merge {r['merge_s']:.1f}s"
                + (f" maintain {r['maintain_s']:.1f}s" if r["maintain_s"] is not None else "")
                + f", {r['files']} files, storage {r['storage_bytes'] / 1e6:.1f} MB = {r['storage_ratio']:.2f}x"
                for n, r in last.items()))
    equal = {n: digest_delta(p.url, storage) == p.digest_pg() for n, p in pipes.items()}
    spark.stop()
    png = plot(rows, out / f"soak-{args.engine}.png", args)
    summary(rows, args, equal)
    print(f"\nCSV: {csv_path}\nplot: {png}")
    return 0 if all(equal.values()) else 1


def plot(rows: list[dict], path: Path, args) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(9, 10), sharex=True)
    for name, style in zip(RUNS, ("-", "--"), strict=True):
        rs = [r for r in rows if r["run"] == name]
        x = [r["cycle"] for r in rs]
        label = f"maintain every {args.every}" if name == "maintain" else "no maintenance"
        axes[0].plot(x, [r["storage_ratio"] for r in rs], style, label=label)
        axes[1].plot(x, [r["files"] for r in rs], style, label=label)
        axes[2].plot(x, [r["merge_s"] for r in rs], style, label=f"merge, {label}")
        axes[2].plot(x, [r["drain_s"] for r in rs], style, alpha=0.5, label=f"drain, {label}")
    axes[0].axhline(2.0, color="grey", lw=0.8)
    axes[0].set_ylabel("storage / table size")
    axes[1].set_ylabel("live data files")
    axes[2].set_ylabel("seconds")
    axes[2].set_xlabel("cycle")
    for ax in axes:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"soak, {args.engine}: {args.rows:,} rows, {args.changes:,} changes/cycle, mix {args.mix}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def summary(rows: list[dict], args, equal: dict[str, bool]) -> None:
    print()
    print(f"{'run':<10}{'cycles':>7}{'storage/table last':>20}{'max 2nd half':>14}{'w/o snapshot':>14}{'files last':>11}"
          f"{'table MB':>10}{'merge s 1st dec':>17}{'last dec':>10}{'last/1st':>10}{'slope s/cycle':>15}"
          f"{'drain s mean':>14}{'log MB':>8}{'vectors MB':>11}{'w/o snap+log':>13}  equal")
    for name in RUNS:
        rs = [r for r in rows if r["run"] == name]
        n = len(rs)
        dec = max(1, n // 10)
        timed = rs[1:] if n > 2 else rs  # cycle 1 is the first merge in this process (warm-up): left out
        first = float(np.mean([r["merge_s"] for r in timed[:dec]]))
        lastd = float(np.mean([r["merge_s"] for r in timed[-dec:]]))
        slope = float(np.polyfit([r["cycle"] for r in timed], [r["merge_s"] for r in timed], 1)[0]) \
            if len(timed) > 1 else 0.0
        half = max(r["storage_ratio"] for r in rs[n // 2:])
        half_ns = max(r["ratio_without_snapshot"] for r in rs[n // 2:])
        print(f"{name:<10}{n:>7}{rs[-1]['storage_ratio']:>20.2f}{half:>14.2f}{half_ns:>14.2f}{rs[-1]['files']:>11}"
              f"{rs[-1]['table_bytes'] / 1e6:>10.1f}{first:>17.2f}{lastd:>10.2f}{lastd / first:>10.2f}"
              f"{slope:>15.4f}{float(np.mean([r['drain_s'] for r in rs])):>14.2f}{rs[-1]['log_bytes'] / 1e6:>8.1f}"
              f"{rs[-1]['vector_bytes'] / 1e6:>11.2f}{max(r['ratio_without_snapshot_and_log'] for r in rs[n // 2:]):>13.2f}"
              f"  {equal[name]}")
    print("target (with maintenance): storage/table <= 2.0, merge seconds flat (last/1st ~ 1, slope ~ 0)")


if __name__ == "__main__":
    sys.exit(main())
