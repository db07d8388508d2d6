"""The merge job (``pgcdc merge``, Spark + delta-rs) vs a bare delta-rs MERGE of the same
changes, already compacted, into the same Delta table, alternated in one run.

Inputs are made by the real pipeline: a ``--rows``-row, 8-column table (int8 key, int4,
text, numeric(12,2), timestamptz, bool, float8, jsonb) on PostgreSQL, snapshotted to the
S3 server (:func:`snapshot_to_s3`), then a workload of ``--changes`` change rows over
``--changes / 3`` keys (each key changed 3 times in 3 passes of ~10,000-row transactions:
90% of the keys exist and are updated 3 times, a ninth of those updated twice then
deleted (10% of all keys), 10% are new keys inserted then updated twice), drained into
``--windows`` windows (:func:`drain_window`). The Delta table is bootstrapped once
(``pgcdc merge --max-windows 0``, not timed) and copied, per round, to two locations:

* **job**: ``python -m airflow_pgcdc.cli merge --from … --slot … --delta <copy A>`` as a
  child process (Spark start-up, reading the window parts, compaction, staging, the
  delta-rs MERGE and commit, process exit: all of it). The child's process tree (the
  CLI's Python, the Spark JVM, the Python workers) is sampled from /proc every 0.25 s:
  peak of the summed RSS (counts pages shared after ``fork`` once per process: an upper
  bound) and of the summed PSS (shared pages divided among their users). Also printed:
  ``wait4``'s ``ru_maxrss``: the largest single process among those the CLI waited for
  (the Spark JVM is not one of them). The job's interpreters get a byte-code cache
  (``--pycache``; ``PYTHONDONTWRITEBYTECODE`` unset for them), as an installed package has.
* **bare**: in this process, ``DeltaTable(copy B).merge(compacted)`` with delete when
  ``_pgcdc_op = 'D'``, update all, insert all (delta-rs defaults), where ``compacted`` is
  the last change per key by ``(_pgcdc_commit_lsn, _pgcdc_seq)`` over the window parts,
  computed with pyarrow before the clock starts.

Both must end in the same table: row counts and an aggregate digest of A, B and the
PostgreSQL table are compared, and A and B are joined row by row (a ``WARNING`` line when
they differ). The job runs with a Spark event log (``PYSPARK_SUBMIT_ARGS``), from which
the time per Spark stage is printed, next to delta-rs' MERGE metrics of both sides.

Printed: both wall times, the ratio job/bare (target <= 2.5), change rows/s, and the
peak memory of the job's process tree (target <= 4 GB).

``--cluster``: the same inputs on a Spark standalone cluster started here (a Master and 2
Workers, 1 core each, :class:`airflow_pgcdc.testing.spark.SparkCluster`), Delta's own Spark
engine on both sides, alternated per round:

* **job**: ``pgcdc merge --master spark://… --engine delta-spark --reader s3a`` (child
  process: Spark start-up, reading, compaction, MERGE, commit);
* **hand-written**: a child process that starts a Spark session on the same cluster with
  the same jars and runs ``MERGE INTO delta.`s3a://…` USING <the compacted changes>``
  (delete / update every column / insert), the job a user would otherwise write; the
  compacted changes are written to S3 as Parquet before the clock starts.

Both sides' wall times include Spark start-up. Also printed: the driver's peak memory
(the process tree of the child: its Python and the driver JVM; executors live under the
workers) when merging 1 window vs all ``--windows`` windows (target: flat, <= 1.2x).

    .venv/bin/python bench/merge.py [--rows 5000000] [--changes 1000000] [--rounds 1] [--keep]
    .venv/bin/python bench/merge.py --cluster --windows 4 [--rows 1000000 --changes 300000 --rounds 2]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_pgcdc.drain.drain import drain_window  # noqa: E402
from airflow_pgcdc.lake.tables import delta_table_url
from airflow_pgcdc.merge.plan import plan_table, select_windows
from airflow_pgcdc.protocol.lsn import LSN  # noqa: E402
from airflow_pgcdc.snapshot.export import snapshot_to_s3  # noqa: E402
from airflow_pgcdc.store import s3 as s3store  # noqa: E402
from airflow_pgcdc.store.layout import Layout  # noqa: E402
from airflow_pgcdc.store.manifest import committed_snapshot  # noqa: E402
from airflow_pgcdc.store.window import committed_window_seqs, read_window  # noqa: E402
from airflow_pgcdc.testing.postgres import PostgresServer  # noqa: E402
from airflow_pgcdc.testing.s3 import S3Server  # noqa: E402

SLOT, PUB, BUCKET = "bench_merge", "bench_pub", "bench"
COLUMNS = ("id", "qty", "label", "amount", "ts", "flag", "score", "payload")
T0 = time.perf_counter()


def say(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


# --------------------------------------------------------------------------- PostgreSQL


def build_table(pg: PostgresServer, rows: int) -> None:
    t0 = time.perf_counter()
    with psycopg.connect(pg.socket_dsn, autocommit=True) as c:
        c.execute(
            "CREATE TABLE t (id bigint PRIMARY KEY, qty int, label text, amount numeric(12,2), "
            "ts timestamptz, flag bool, score float8, payload jsonb)"
        )
        c.execute(
            "INSERT INTO t SELECT g, (g %% 100000)::int, md5(g::text), (g / 7.0)::numeric(12,2), "
            "timestamptz '2024-01-01' + g * interval '1 second', g %% 3 = 0, g * 1.25::float8, "
            "jsonb_build_object('k', g %% 1000, 'v', 0, 'tag', 'x' || (g %% 97)) "
            "FROM generate_series(1, %s) g",
            (rows,),
        )
        c.execute("VACUUM ANALYZE t")
        c.execute(f"CREATE PUBLICATION {PUB} FOR TABLE t")
        size = c.execute("SELECT pg_total_relation_size('t')").fetchone()[0]
    say(f"table t: {rows:,} rows, {size / 1e6:,.0f} MB with index, built in {time.perf_counter() - t0:.1f}s")


def workload(pg: PostgresServer, rows: int, changes: int, batch: int) -> dict[str, int]:
    """``changes`` change rows over ``changes // 3`` keys, 3 passes; returns counts."""
    nkeys = changes // 3
    stride = max(1, rows // nkeys)
    k = np.arange(nkeys, dtype=np.int64)
    new = k % 10 == 9
    ids = np.where(new, rows + 1 + k, k * stride + 1)
    if ids[~new].max() > rows:
        raise SystemExit(f"--changes {changes:,} needs more than --rows {rows:,} existing keys")
    deleted = k % 10 == 0
    upd = (
        "UPDATE t SET qty = qty + 1, label = md5(label), amount = amount + 0.01, "
        "ts = ts + interval '1 minute', flag = NOT flag, score = score * 1.5, "
        "payload = jsonb_set(payload, '{v}', to_jsonb(%s::int)) WHERE id = ANY(%s)"
    )
    ins = (
        "INSERT INTO t SELECT i, (i %% 100000)::int, md5(i::text), (i / 7.0)::numeric(12,2), "
        "now(), true, i * 0.5::float8, jsonb_build_object('k', i %% 1000, 'v', 1, 'new', true) "
        "FROM unnest(%s::bigint[]) i"
    )
    counts = {"I": 0, "U": 0, "D": 0, "transactions": 0}
    t0 = time.perf_counter()
    with psycopg.connect(pg.socket_dsn) as c:
        c.execute("SET synchronous_commit = off")
        c.commit()
        for p in (1, 2, 3):
            for lo in range(0, nkeys, batch):
                sl = slice(lo, lo + batch)
                b_ids, b_new, b_del = ids[sl], new[sl], deleted[sl]
                if p == 1:
                    c.execute(ins, (b_ids[b_new].tolist(),))
                    todo = b_ids[~b_new]
                    counts["I"] += int(b_new.sum())
                elif p == 2:
                    todo = b_ids
                else:
                    c.execute("DELETE FROM t WHERE id = ANY(%s)", (b_ids[b_del].tolist(),))
                    todo = b_ids[~b_del]
                    counts["D"] += int(b_del.sum())
                c.execute(upd, (p, todo.tolist()))
                counts["U"] += len(todo)
                c.commit()
                counts["transactions"] += 1
            say(f"workload pass {p}/3 done ({time.perf_counter() - t0:.1f}s)")
    total = counts["I"] + counts["U"] + counts["D"]
    say(f"workload: {total:,} change rows ({counts['I']:,} inserts, {counts['U']:,} updates, "
        f"{counts['D']:,} deletes) over {nkeys:,} keys in {counts['transactions']} transactions, "
        f"{time.perf_counter() - t0:.1f}s")
    return counts


def current_lsn(pg: PostgresServer) -> LSN:
    with psycopg.connect(pg.socket_dsn, autocommit=True) as c:
        return LSN.parse(c.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])


def drain_all(pg: PostgresServer, client, src: str, target: LSN, total: int, windows: int) -> int:
    per = -(-total // windows)
    rows = 0
    t0 = time.perf_counter()
    while True:
        r = drain_window(pg.dsn, src, slot=SLOT, publications=PUB, until_lsn=target, max_rows=per,
                         s3=client)
        if r.window_seq is None:
            break
        rows += r.rows
        say(f"drained window {r.window_seq}: {r.rows:,} rows, {r.transactions} transactions, "
            f"{r.start_lsn}..{r.end_lsn} ({r.end_reason}), {r.seconds:.1f}s")
        if LSN.parse(r.end_lsn) >= target:
            break
    say(f"drain: {rows:,} change rows in {time.perf_counter() - t0:.1f}s")
    return rows


# --------------------------------------------------------------------------- S3 / Delta


def key_prefix(url: str) -> str:
    """``s3://bucket/a/b`` -> ``a/b/``."""
    return url.split("/", 3)[3].rstrip("/") + "/"


def copy_prefix(client, bucket: str, src: str, dst: str) -> int:
    n = 0
    for key in s3store.list_keys(client, bucket, src):
        client.copy_object(Bucket=bucket, Key=dst + key[len(src):], CopySource={"Bucket": bucket, "Key": key})
        n += 1
    return n


def compacted_changes(client, fs, src: str) -> tuple[pa.Table, int]:
    """The last change per key over the slot's windows (table columns + ``_pgcdc_op``)
    and the number of change rows read."""
    layout = Layout.parse(src)
    snap = committed_snapshot(client, layout, SLOT)
    manifests = [read_window(client, layout, SLOT, s) for s in committed_window_seqs(client, layout, SLOT)]
    windows = select_windows(manifests, after=None, consistent_point=snap.consistent_point)
    plan = plan_table(windows, schema="public", table="t", key_columns=("id",),
                      window_prefix=lambda seq: layout.window_prefix(SLOT, seq))
    if plan.truncate_at is not None:
        raise SystemExit("the windows hold a truncate: not this benchmark's workload")
    cols = [*COLUMNS, "_pgcdc_op", "_pgcdc_commit_lsn", "_pgcdc_seq"]
    parts = [pq.read_table(f"{layout.bucket}/{p}", filesystem=fs, columns=cols) for p in plan.parts]
    allrows = pa.concat_tables(parts)
    s = allrows.sort_by([("id", "ascending"), ("_pgcdc_commit_lsn", "ascending"), ("_pgcdc_seq", "ascending")])
    ids = s.column("id").to_numpy()
    last = np.ones(len(ids), dtype=bool)
    last[:-1] = ids[:-1] != ids[1:]
    out = s.filter(pa.array(last)).select([*COLUMNS, "_pgcdc_op"])
    return out.combine_chunks(), allrows.num_rows


def bare_merge(url: str, storage: dict[str, str], source: pa.Table) -> tuple[float, dict]:
    from deltalake import DeltaTable

    t0 = time.perf_counter()
    dt = DeltaTable(url, storage_options=storage)
    metrics = (
        dt.merge(source, predicate="t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_delete(predicate="s._pgcdc_op = 'D'")
        .when_matched_update_all(predicate="s._pgcdc_op <> 'D'", except_cols=["_pgcdc_op"])
        .when_not_matched_insert_all(predicate="s._pgcdc_op <> 'D'", except_cols=["_pgcdc_op"])
        .execute()
    )
    return time.perf_counter() - t0, metrics


DIGEST = (
    "count(*)", "sum(id)", "sum(CAST(qty AS BIGINT))", "sum(amount)", "sum(length(label))",
    "sum(CASE WHEN flag THEN 1 ELSE 0 END)", "count(score)", "sum(length(payload))",
)


def delta_digest(url: str, storage: dict[str, str]) -> tuple:
    from deltalake import DeltaTable, QueryBuilder

    qb = QueryBuilder().register("d", DeltaTable(url, storage_options=storage))
    row = pa.table(qb.execute("SELECT " + ", ".join(DIGEST) + " FROM d").read_all()).to_pylist()[0]
    return tuple(str(v) for v in row.values())


def pg_digest(pg: PostgresServer) -> tuple:
    sel = ", ".join(DIGEST).replace("length(payload)", "length(payload::text)")
    with psycopg.connect(pg.socket_dsn) as c:
        return tuple(str(v) for v in c.execute(f"SELECT {sel} FROM t").fetchone())


def delta_diff(url_a: str, url_b: str, storage: dict[str, str]) -> int:
    """Rows present on one side only or different in any column."""
    from deltalake import DeltaTable, QueryBuilder

    qb = (QueryBuilder().register("a", DeltaTable(url_a, storage_options=storage))
          .register("b", DeltaTable(url_b, storage_options=storage)))
    same = " AND ".join(f"(a.{c} IS NOT DISTINCT FROM b.{c})" for c in COLUMNS)
    q = f"SELECT count(*) AS n FROM a FULL OUTER JOIN b ON a.id = b.id WHERE NOT ({same})"
    return pa.table(qb.execute(q).read_all()).column("n")[0].as_py()


# --------------------------------------------------------------------------- the job


class TreeSampler(threading.Thread):
    """Peak summed RSS and PSS of ``root`` and its descendants, from /proc."""

    def __init__(self, root: int, interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.peak_rss = self.peak_pss = self.peak_procs = self.samples = 0
        self._halt = threading.Event()
        self._page = os.sysconf("SC_PAGE_SIZE")

    def tree(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
        out, todo = [], [self.root]
        while todo:
            p = todo.pop()
            out.append(p)
            todo.extend(children.get(p, ()))
        return out

    def sample(self) -> None:
        rss = pss = 0
        pids = self.tree()
        for p in pids:
            try:
                with open(f"/proc/{p}/statm", "rb") as f:
                    rss += int(f.read().split()[1]) * self._page
                with open(f"/proc/{p}/smaps_rollup", "rb") as f:
                    for line in f:
                        if line.startswith(b"Pss:"):
                            pss += int(line.split()[1]) * 1024
                            break
            except (OSError, ValueError, IndexError):
                continue
        self.samples += 1
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_pss = max(self.peak_pss, pss)
        self.peak_procs = max(self.peak_procs, len(pids))

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def run_job(args_cli: list[str], env: dict[str, str], event_dir: str, cmd: list[str] | None = None) -> dict:
    """Run ``pgcdc merge`` (or ``cmd``) as a child; wall time, memory, CPU, its result and its log.
    ``BENCH_PROFILE=1`` in the environment: the child runs under cProfile, its profile kept as
    ``job.prof`` in ``event_dir`` (the threads' Rust time shows as the Python calls into it)."""
    os.makedirs(event_dir, exist_ok=True)
    env = {
        **env,
        "PYSPARK_SUBMIT_ARGS": (
            f"--conf spark.eventLog.enabled=true --conf spark.eventLog.dir=file://{event_dir} "
            "--conf spark.eventLog.compress=false pyspark-shell"
        ),
    }
    profile = ["-m", "cProfile", "-o", os.path.join(event_dir, "job.prof")] if os.environ.get("BENCH_PROFILE") else []
    cmd = cmd or [sys.executable, *profile, "-m", "airflow_pgcdc.cli", "merge", *args_cli]
    err_path = Path(event_dir) / "stderr.log"
    with open(err_path, "wb") as err:
        spawn = time.time()
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err)
        sampler = TreeSampler(proc.pid)
        sampler.start()
        out = proc.stdout.read()
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        end = time.time()
        sampler.stop()
    stderr = err_path.read_text(errors="replace")
    if status != 0:
        raise SystemExit(f"pgcdc merge failed ({status}): {stderr[-3000:]}")
    return {
        "cmd": cmd, "wall": wall, "spawn": spawn, "end": end, "result": json.loads(out),
        "peak_rss": sampler.peak_rss, "peak_pss": sampler.peak_pss, "procs": sampler.peak_procs,
        "samples": sampler.samples, "ru_maxrss": usage.ru_maxrss * 1024,
        "cpu": usage.ru_utime + usage.ru_stime, "stderr": stderr, "event_dir": event_dir,
    }


def _log_time(line: str) -> float | None:
    m = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ", line)
    if not m:
        return None
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(m.group(2)) / 1000


def _acc(stage: dict, name: str) -> int:
    for a in stage.get("Accumulables", ()):
        if a.get("Name") == name:
            try:
                return int(a.get("Value", 0))
            except (TypeError, ValueError):
                return 0
    return 0


def job_timeline(job: dict) -> list[str]:
    """Where the job's wall time went: Spark event log + the job's own log lines."""
    spawn = job["spawn"]
    rel = lambda t: t - spawn  # noqa: E731
    lines = []
    files = sorted(  # Spark 4 writes event log v2: a directory of events_N_<app> files
        p for p in glob.glob(os.path.join(job["event_dir"], "**", "*local-*"), recursive=True)
        if os.path.isfile(p) and not os.path.basename(p).startswith((".", "appstatus"))
    )
    events = []
    for path in files:
        with open(path, errors="replace") as f:
            for raw in f:
                try:
                    events.append(json.loads(raw))
                except ValueError:
                    continue
    app_start = next((e["Timestamp"] / 1000 for e in events if e["Event"] == "SparkListenerApplicationStart"), None)
    if app_start is not None:
        lines.append(f"  {rel(app_start):7.1f}s  SparkContext started (interpreter, imports, JVM launch)")
    jobs: dict[int, dict] = {}
    for e in events:
        if e["Event"] == "SparkListenerJobStart":
            jobs[e["Job ID"]] = {"start": e["Submission Time"] / 1000, "stages": e.get("Stage IDs", [])}
        elif e["Event"] == "SparkListenerJobEnd" and e["Job ID"] in jobs:
            jobs[e["Job ID"]]["end"] = e["Completion Time"] / 1000
    stages = {}
    for e in events:
        if e["Event"] == "SparkListenerStageCompleted":
            s = e["Stage Info"]
            stages[s["Stage ID"]] = s
    for jid, j in sorted(jobs.items()):
        end = j.get("end")
        lines.append(f"  {rel(j['start']):7.1f}s  Spark job {jid} ({(end or j['start']) - j['start']:.1f}s)")
        for sid in sorted(j["stages"]):
            s = stages.get(sid)
            if s is None or "Submission Time" not in s:
                continue
            dur = (s["Completion Time"] - s["Submission Time"]) / 1000
            gc = _acc(s, "internal.metrics.jvmGCTime") / 1000
            run = _acc(s, "internal.metrics.executorRunTime") / 1000
            cpu = _acc(s, "internal.metrics.executorCpuTime") / 1e9
            sw = _acc(s, "internal.metrics.shuffle.write.bytesWritten")
            sr = _acc(s, "internal.metrics.shuffle.read.localBytesRead") + _acc(
                s, "internal.metrics.shuffle.read.remoteBytesRead")
            recs = _acc(s, "internal.metrics.shuffle.write.recordsWritten") or _acc(
                s, "internal.metrics.shuffle.read.recordsRead")
            spill = _acc(s, "internal.metrics.diskBytesSpilled")
            name = s.get("Stage Name", "?").split(" at ")[0]
            lines.append(
                f"           stage {sid} {name!r}: {s.get('Number of Tasks')} tasks, {dur:.1f}s wall, "
                f"task time {run:.1f}s (JVM CPU {cpu:.1f}s, GC {gc:.1f}s), shuffle write "
                f"{sw / 1e6:,.0f} MB / read {sr / 1e6:,.0f} MB, {recs:,} records, spilled {spill / 1e6:,.0f} MB"
            )
    last_spark = max((j.get("end", 0) for j in jobs.values()), default=None)
    first_spark = min((j["start"] for j in jobs.values()), default=None)
    if app_start is not None and first_spark is not None:
        lines.append(f"  SparkContext start -> first Spark job: {first_spark - app_start:.1f}s (session, data source "
                     "registration, manifests, plan, Python data source schema/partitions, compaction plan)")
    for line in job["stderr"].splitlines():
        t = _log_time(line)
        if t is not None and " INFO " in line:
            msg = line.split(" INFO ", 1)[1]
            lines.append(f"  {rel(t):7.1f}s  log: {msg[:160]}")
    lines.append(f"  {rel(job['end']):7.1f}s  process exited")
    if last_spark:
        lines.append(f"  after the last Spark job: {job['end'] - last_spark:.1f}s (read staged files + delta-rs "
                     "MERGE + commit + cleanup + exit)")
    return lines


# --------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--changes", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--windows", type=int, default=3, help="windows the changes are drained into")
    ap.add_argument("--batch", type=int, default=10_000, help="keys per workload transaction")
    ap.add_argument("--workers", type=int, default=2, help="snapshot workers")
    ap.add_argument("--server", choices=("pg18", "pg15"), default="pg18")
    ap.add_argument("--keep", action="store_true", help="leave the servers running (and their files)")
    ap.add_argument("--cluster", action="store_true",
                    help="delta-spark on a Spark standalone cluster: our job vs a hand-written MERGE INTO")
    ap.add_argument("--pycache", default=os.path.join(tempfile.gettempdir(), "bench-merge-pycache"),
                    help="PYTHONPYCACHEPREFIX for the job, PYTHONDONTWRITEBYTECODE unset ('': the "
                         "environment as it is)")
    args = ap.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    print(f"load average at start: {os.getloadavg()}; {os.cpu_count()} CPUs", flush=True)
    settings = {"max_wal_size": "8GB", "wal_sender_timeout": "0", "checkpoint_timeout": "30min"}
    if args.keep:  # own dirs: a temp-dir server whose owner died is reaped by the next test bed
        keep_dir = Path(tempfile.mkdtemp(prefix="bench-merge-servers-"))
        keep_dir.chmod(0o711)  # PostgreSQL runs as `postgres` when we are root
        pg = PostgresServer(args.server, settings=settings, detached=True, base_dir=keep_dir / "pg")
        s3 = S3Server(detached=True, base_dir=keep_dir / "s3", volume_size_limit_mb=1024)
    else:
        pg, s3 = PostgresServer(args.server, settings=settings), S3Server(volume_size_limit_mb=1024)
    pg.start()
    s3.start()
    try:
        return run(args, pg, s3)
    finally:
        if args.keep:
            print(f"kept: PostgreSQL {pg.dsn} (pid {pg.pid}, {pg.base_dir}); S3 {s3.endpoint_url} "
                  f"key {s3.access_key} secret {s3.secret_key} (pid {s3.pid}, {s3.base_dir})", flush=True)
        else:
            s3.close()
            pg.close()


def run(args, pg: PostgresServer, s3: S3Server) -> int:
    os.environ.update(s3.aws_env())
    client = s3.client()
    s3.create_bucket(BUCKET)
    src, env = f"s3://{BUCKET}/cdc", {**os.environ}
    if args.pycache:  # byte-code cache for the job's interpreters (driver and Spark's Python workers)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = args.pycache
    settings = s3store.S3Settings.from_env()
    storage, fs = s3store.delta_storage_options(settings), s3store.make_pyarrow_fs(settings)
    build_table(pg, args.rows)
    t0 = time.perf_counter()
    snap = snapshot_to_s3(pg.dsn, src, slot=SLOT, publications=PUB, workers=args.workers, s3=client,
                          progress_interval=30)
    say(f"snapshot {snap.snapshot_id}: {sum(t.rows for t in snap.tables):,} rows, "
        f"{sum(len(t.parts) for t in snap.tables)} parts, {time.perf_counter() - t0:.1f}s")
    counts = workload(pg, args.rows, args.changes, args.batch)
    total = counts["I"] + counts["U"] + counts["D"]
    drained = drain_all(pg, client, src, current_lsn(pg), total, args.windows)
    if drained != total:
        print(f"WARNING: drained {drained:,} change rows, the workload made {total:,}", flush=True)
    expect = pg_digest(pg)

    work = tempfile.mkdtemp(prefix="bench-merge-")  # event logs and stderr of the job runs
    base = f"s3://{BUCKET}/base"
    boot = run_job(["--from", src, "--slot", SLOT, "--delta", base, "--max-windows", "0"], env,
                   os.path.join(work, "bootstrap"))
    say(f"bootstrap (pgcdc merge --max-windows 0, not timed): {boot['wall']:.1f}s, "
        f"{boot['result']['tables'][0]['bootstrap_rows']:,} rows, peak tree PSS {boot['peak_pss'] / 1e6:,.0f} MB")
    t0 = time.perf_counter()
    compacted, read_rows = compacted_changes(client, fs, src)
    ops = dict(zip(*np.unique(compacted.column("_pgcdc_op").to_numpy(zero_copy_only=False), return_counts=True),
                   strict=True))
    say(f"compacted with pyarrow (not timed): {read_rows:,} change rows -> {compacted.num_rows:,} keys "
        f"{ {k: int(v) for k, v in ops.items()} } in {time.perf_counter() - t0:.1f}s")
    base_prefix = key_prefix(base)
    if args.cluster:
        return run_cluster(args, src, env, work, base_prefix, compacted, fs, storage, client, expect, total)
    jobs, bares = [], []
    for i in range(args.rounds):
        lake_a, lake_b = f"s3://{BUCKET}/lake-job-{i}", f"s3://{BUCKET}/lake-bare-{i}"
        for lake in (lake_a, lake_b):
            n = copy_prefix(client, BUCKET, base_prefix, key_prefix(lake))
        say(f"round {i + 1}: copied the bootstrapped table twice ({n} objects each)")
        order = ("job", "bare") if i % 2 == 0 else ("bare", "job")
        for who in order:
            if who == "job":
                cli = ["--from", src, "--slot", SLOT, "--delta", lake_a]
                job = run_job(cli, env, os.path.join(work, f"job-{i}"))
                jobs.append(job)
                say(f"round {i + 1} job  {job['wall']:7.1f}s  peak tree RSS {job['peak_rss'] / 1e6:,.0f} MB, "
                    f"PSS {job['peak_pss'] / 1e6:,.0f} MB ({job['procs']} processes at most), "
                    f"ru_maxrss {job['ru_maxrss'] / 1e6:,.0f} MB, driver CPU {job['cpu']:.1f}s")
            else:
                cpu0 = time.process_time()
                dt, metrics = bare_merge(delta_table_url(lake_b, "public", "t"), storage, compacted)
                bares.append({"wall": dt, "metrics": metrics, "cpu": time.process_time() - cpu0})
                say(f"round {i + 1} bare {dt:7.1f}s  CPU {bares[-1]['cpu']:.1f}s")
        url_a, url_b = delta_table_url(lake_a, "public", "t"), delta_table_url(lake_b, "public", "t")
        da, db = delta_digest(url_a, storage), delta_digest(url_b, storage)
        diff = delta_diff(url_a, url_b, storage)
        say(f"round {i + 1} check: job {da[0]} rows, bare {db[0]} rows, PostgreSQL {expect[0]} rows; "
            f"rows differing job vs bare: {diff}")
        if da != db or diff:
            print(f"WARNING: the job's table and the bare merge's differ: {da} vs {db}, {diff} rows", flush=True)
        if da != expect:
            print(f"WARNING: the job's table differs from PostgreSQL: {da} vs {expect}", flush=True)
        if db != expect:
            print(f"WARNING: the bare merge's table differs from PostgreSQL: {db} vs {expect}", flush=True)

    job = jobs[-1]
    tr = job["result"]["tables"][0]
    print(f"job command: {shlex.join(job['cmd'])}  (env: S3 endpoint/credentials, SPARK_LOCAL_IP, "
          f"PYSPARK_SUBMIT_ARGS with the Spark event log, PYTHONPYCACHEPREFIX={args.pycache or '(as is)'})")
    print(f"job result (last round): action {tr['action']}, windows {tr['first_window']}..{tr['last_window']}, "
          f"{tr['change_rows']:,} change rows -> {tr['merged_rows']:,} merged rows, job says {tr['seconds']:.1f}s "
          f"in the table, merge_slot {job['result']['seconds']:.1f}s")
    keep = ("num_source_rows", "num_target_rows_inserted", "num_target_rows_updated", "num_target_rows_deleted",
            "num_target_rows_copied", "num_target_files_scanned", "num_target_files_skipped_during_scan",
            "num_target_files_added", "num_target_files_removed", "execution_time_ms", "scan_time_ms",
            "rewrite_time_ms")
    print("delta-rs MERGE metrics, job:  " + json.dumps({k: tr["metrics"].get(k) for k in keep}))
    print("delta-rs MERGE metrics, bare: " + json.dumps({k: bares[-1]["metrics"].get(k) for k in keep}))
    print("job timeline (seconds since the child was spawned):")
    for line in job_timeline(job):
        print(line)
    j, b = statistics.median(x["wall"] for x in jobs), statistics.median(x["wall"] for x in bares)
    peak_rss = max(x["peak_rss"] for x in jobs)
    peak_pss = max(x["peak_pss"] for x in jobs)
    print(f"load average at end: {os.getloadavg()}")
    print(
        f"RESULT merge of {total:,} change rows ({compacted.num_rows:,} keys) into a {args.rows:,}-row Delta table: "
        f"job {j:.1f}s ({total / j:,.0f} change rows/s, Spark start-up included) vs bare delta-rs MERGE "
        f"{b:.1f}s ({total / b:,.0f} change rows/s of the same changes, {compacted.num_rows / b:,.0f} compacted "
        f"rows/s); ratio job/bare = {j / b:.2f} (target <= 2.5); job process tree peak: summed RSS "
        f"{peak_rss / 1e9:.2f} GB, summed PSS {peak_pss / 1e9:.2f} GB (target <= 4 GB; /proc sampled every "
        f"0.25 s), largest process the CLI waited for {max(x['ru_maxrss'] for x in jobs) / 1e9:.2f} GB "
        f"(ru_maxrss: not the JVM); "
        f"rounds {args.rounds}",
        flush=True,
    )
    if args.keep:
        print(f"kept: the job runs' stderr and Spark event logs in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


BARE_SPARK = r"""
import json, sys, time
from airflow_pgcdc.merge.clauses import quote_ident
from airflow_pgcdc.merge.jars import configure_s3a
from airflow_pgcdc.merge.session import spark_session
from airflow_pgcdc.store.s3 import S3Settings

master, source, target, cols = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
spark = spark_session(master, app_name="bench-hand-written-merge", delta=True)
configure_s3a(spark, S3Settings.from_env())
q = lambda n: quote_ident(n, "spark")
t0 = time.perf_counter()
spark.read.parquet(source).createOrReplaceTempView("changes")
sets = ", ".join(f"{q(c)} = s.{q(c)}" for c in cols)
names = ", ".join(q(c) for c in cols)
values = ", ".join(f"s.{q(c)}" for c in cols)
spark.sql(
    f"MERGE INTO delta.{q(target)} AS t USING changes AS s ON t.{q('id')} = s.{q('id')} "
    f"WHEN MATCHED AND s._pgcdc_op = 'D' THEN DELETE "
    f"WHEN MATCHED THEN UPDATE SET {sets} "
    f"WHEN NOT MATCHED AND s._pgcdc_op <> 'D' THEN INSERT ({names}) VALUES ({values})"
).collect()
row = spark.sql(f"DESCRIBE HISTORY delta.{q(target)} LIMIT 1").collect()[0]
print(json.dumps({"merge_seconds": time.perf_counter() - t0, "metrics": dict(row["operationMetrics"])}))
spark.stop()
"""


def run_cluster(args, src, env, work, base_prefix, compacted, fs, storage, client, expect, total) -> int:
    from airflow_pgcdc.merge.jars import unavailable_reason
    from airflow_pgcdc.merge.sinks.deltaspark import s3a
    from airflow_pgcdc.testing.spark import SparkCluster

    if unavailable_reason():
        raise SystemExit(unavailable_reason())
    changes = f"{BUCKET}/compacted/part-00000.parquet"
    pq.write_table(compacted, changes, filesystem=fs)
    cluster = SparkCluster(workers=2, cores=1).start()
    say(f"Spark cluster {cluster.master_url}: 2 workers, 1 core each (not timed)")
    try:
        jobs, bares, ones = [], [], []
        for i in range(args.rounds):
            lake_a, lake_b = f"s3://{BUCKET}/cl-job-{i}", f"s3://{BUCKET}/cl-hand-{i}"
            for lake in (lake_a, lake_b):
                copy_prefix(client, BUCKET, base_prefix, key_prefix(lake))
            order = ("job", "hand") if i % 2 == 0 else ("hand", "job")
            for who in order:
                if who == "job":
                    cli = ["--from", src, "--slot", SLOT, "--delta", lake_a, "--master", cluster.master_url,
                           "--engine", "delta-spark", "--reader", "s3a"]
                    jobs.append(run_job(cli, env, os.path.join(work, f"cl-job-{i}")))
                    j = jobs[-1]
                    say(f"round {i + 1} job          {j['wall']:7.1f}s  driver tree peak PSS "
                        f"{j['peak_pss'] / 1e6:,.0f} MB, RSS {j['peak_rss'] / 1e6:,.0f} MB")
                else:
                    target = s3a(delta_table_url(lake_b, "public", "t"))
                    cmd = [sys.executable, "-c", BARE_SPARK, cluster.master_url, f"s3a://{changes}", target,
                           json.dumps(list(COLUMNS))]
                    bares.append(run_job([], env, os.path.join(work, f"cl-hand-{i}"), cmd=cmd))
                    b = bares[-1]
                    say(f"round {i + 1} hand-written {b['wall']:7.1f}s  (MERGE statement "
                        f"{b['result']['merge_seconds']:.1f}s) driver tree peak PSS {b['peak_pss'] / 1e6:,.0f} MB")
            url_a, url_b = delta_table_url(lake_a, "public", "t"), delta_table_url(lake_b, "public", "t")
            da, db = delta_digest(url_a, storage), delta_digest(url_b, storage)
            diff = delta_diff(url_a, url_b, storage)
            say(f"round {i + 1} check: job {da[0]} rows, hand-written {db[0]} rows, PostgreSQL {expect[0]} rows; "
                f"rows differing: {diff}")
            if da != expect or db != expect or diff:
                print(f"WARNING: tables differ: job {da}, hand-written {db}, PostgreSQL {expect}", flush=True)
        # driver memory as the batch grows: 1 window vs all of them
        lake_c = f"s3://{BUCKET}/cl-one"
        copy_prefix(client, BUCKET, base_prefix, key_prefix(lake_c))
        cli = ["--from", src, "--slot", SLOT, "--delta", lake_c, "--master", cluster.master_url,
               "--engine", "delta-spark", "--reader", "s3a", "--max-windows", "1"]
        ones.append(run_job(cli, env, os.path.join(work, "cl-one")))
        one, many = ones[-1], jobs[-1]
        r1, rn = one["result"]["tables"][0], many["result"]["tables"][0]
        say(f"1 window: {r1['change_rows']:,} change rows, driver tree peak PSS {one['peak_pss'] / 1e6:,.0f} MB; "
            f"{rn['last_window'] + 1} windows: {rn['change_rows']:,} change rows, {many['peak_pss'] / 1e6:,.0f} MB")
    finally:
        cluster.close()
    j = statistics.median(x["wall"] for x in jobs)
    b = statistics.median(x["wall"] for x in bares)
    growth = max(x["peak_pss"] for x in jobs) / one["peak_pss"]
    print(
        f"RESULT cluster (2 workers x 1 core), delta-spark: merge of {total:,} change rows "
        f"({compacted.num_rows:,} keys): job {j:.1f}s vs hand-written MERGE INTO of the compacted changes "
        f"{b:.1f}s (both with Spark start-up); ratio job/hand-written = {j / b:.2f} (target <= 1.5); "
        f"driver peak PSS {one['peak_pss'] / 1e6:,.0f} MB at 1 window ({r1['change_rows']:,} rows) vs "
        f"{max(x['peak_pss'] for x in jobs) / 1e6:,.0f} MB at {rn['last_window'] + 1} windows "
        f"({rn['change_rows']:,} rows): growth {growth:.2f}x (target <= 1.2x); rounds {args.rounds}",
        flush=True,
    )
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
