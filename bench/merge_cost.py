"""How a merge's cost grows with the table: the same OLTP-like window merged, in one job,
into a table and into one ``--factor`` times larger (issue: lake upkeep, section 1).

Two tables of one schema on PostgreSQL, ``small`` (``--rows``) and ``big`` (``--rows`` x
``--factor``), snapshotted by the real pipeline and bootstrapped into Delta (``pgcdc merge
--max-windows 0``, not timed). Then one workload touches both tables with the same
absolute numbers of changes (``--changes`` change rows per table, in transactions that
touch both): 70 % updates of recent keys (the newest 2 % of the small table's keys, the same
number in each table, so both get the same number of distinct changed rows), 10 %
updates scattered over the whole table, 15 % inserts of new keys, 5 % deletes scattered
over the whole table. One window is drained. Then, per engine (``--engine``), a copy of the
bootstrapped tables gets one ``pgcdc merge`` of that window, both tables in one job.

Printed per table and engine: the table's rows and Delta files before the merge, the
merge's seconds as the job reports them per table (Spark start-up excluded: the job's own
timer around that table), target files scanned (delta-rs' ``num_target_files_scanned``;
delta-spark does not report it, and the job's streamed-source MERGE on deltalake 1.6.6
reports 0: read the rewritten column), files removed (rewritten) and added, and bytes
written (the sizes of the files
the merge's commit added, read from the Delta log), then the ratio big/small of seconds
and bytes written. Target (the issue's): <= 1.5x for a 10x larger table. Both Delta tables
are checked against PostgreSQL (row count and a digest) after each merge.

    .venv/bin/python bench/merge_cost.py [--rows 200000] [--factor 10] [--changes 20000]
                                         [--engine delta-rs|delta-spark|delta-spark-dv|both|all]
                                         [--target-file-mb MB] [--mix 0.70,0.10,0.15,0.05]

``--partitioned``: an events/orders-like table. Both tables get a date column ``day`` in
their key, ``PRIMARY KEY (id, day)``, one day per ``--rows-per-day`` rows, the newest rows on
the latest day, so the big table holds ``--factor`` times as many days (more history, not
fuller days). The same window is merged, per engine, into two bootstraps of the same tables:
**partitioned** by ``day`` (``--table-option public.<t>:partition_by=day`` on every job, the
bootstrap's included; the merge then bounds the target to the batch's partitions) and
**unpartitioned** (the baseline, in the same run). The mix is as above: the recent keys'
updates hit the latest days, the inserts go to a new day ("today", a new partition), the
scattered updates and deletes hit old days. Printed besides: per table the partitions the
window changed (from the workload: distinct days of its keys) and, per merge, the partitions
whose files it rewrote or added out of the table's; the ratio big/small per layout, and
partitioned/unpartitioned for the big table. Defaults then: ``--rows 50000 --factor 10
--changes 5000 --rows-per-day 500`` (100 and 1,000 days; a few minutes per engine):

    .venv/bin/python bench/merge_cost.py --partitioned [--engine delta-rs|both] [--rows-per-day 500]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from merge import current_lsn, key_prefix, run_job, say  # noqa: E402  (bench/merge.py)

from airflow_pgcdc.drain.drain import drain_window  # noqa: E402
from airflow_pgcdc.lake.tables import delta_table_url
from airflow_pgcdc.merge.jars import unavailable_reason  # noqa: E402
from airflow_pgcdc.protocol.lsn import LSN  # noqa: E402
from airflow_pgcdc.protocol.quoting import quote_ident  # noqa: E402
from airflow_pgcdc.snapshot.export import snapshot_to_s3  # noqa: E402
from airflow_pgcdc.store import s3 as s3store  # noqa: E402
from airflow_pgcdc.testing.postgres import PostgresServer  # noqa: E402
from airflow_pgcdc.testing.s3 import S3Server  # noqa: E402

SLOT, PUB, BUCKET = "bench_cost", "bench_cost_pub", "bench"
TABLES = ("small", "big")
WARMUP, WARMUP_ROWS = "warmup", 2000
ORDER = ["--tables", f"public.{WARMUP}", "public.big", "public.small"]
"""The job merges the tables in this order: a small table first takes the job's one-time
costs (the JVM's warm-up, Delta's first log replay: 50-80 s on a loaded machine), which
the first table merged paid otherwise (before, the big table, making it look 2.5x
dearer); then the big table before the small one, so what warm-up is left favours the
small table, not the claim."""
DIGEST = "count(*), sum(id), sum(CAST(qty AS BIGINT)), sum(length(label))"
LAST_DAY = "2026-01-01"
"""``--partitioned``: the day of each table's newest rows; the workload inserts into the next."""
TODAY = "2026-01-02"


def build(pg: PostgresServer, sizes: dict[str, int], per_day: int | None = None) -> None:
    """The tables; ``per_day`` (``--partitioned``): with a last column ``day`` in the key, one
    day per ``per_day`` rows by ``id``, the newest rows on :data:`LAST_DAY`."""
    with psycopg.connect(pg.socket_dsn, autocommit=True) as c:
        for table, rows in sizes.items():
            t0, name = time.perf_counter(), quote_ident(table)
            key = ", day date, PRIMARY KEY (id, day)" if per_day else ""
            c.execute(f"CREATE TABLE {name} (id bigint{'' if per_day else ' PRIMARY KEY'}, qty int, label text, "
                      f"amount numeric(12,2), ts timestamptz, flag bool{key})")
            day, extra = (", %s::date - ((%s - g) / %s)::int", (LAST_DAY, rows, per_day)) if per_day else ("", ())
            c.execute(f"INSERT INTO {name} SELECT g, (g %% 1000)::int, md5(g::text), (g / 7.0)::numeric(12,2), "
                      f"timestamptz '2024-01-01' + g * interval '1 second', g %% 3 = 0{day} "
                      "FROM generate_series(1, %s) g", (*extra, rows))
            c.execute(f"VACUUM ANALYZE {name}")
            say(f"table {table}: {rows:,} rows in {time.perf_counter() - t0:.1f}s")
        c.execute(f"CREATE PUBLICATION {quote_ident(PUB)} FOR TABLE {', '.join(map(quote_ident, sizes))}")


def workload(pg: PostgresServer, sizes: dict[str, int], changes: int, batch: int = 500,
             mix: tuple[float, ...] = (0.70, 0.10, 0.15, 0.05), recent: int | None = None,
             day: str | None = None) -> dict[str, list[tuple[str, int]]]:
    """``changes`` change rows per table, the same mix on each (see the module docstring;
    ``mix``: the fractions of recent updates, scattered updates, inserts, scattered deletes;
    ``day``: the inserts' ``day``, ``--partitioned``). Returns the ``(op, id)`` per table."""
    rng = np.random.default_rng(7)
    plan = {}
    for name, rows in sizes.items():
        n_hot, n_wide, n_ins, n_del = (int(changes * f) for f in mix)
        recent = recent or max(1, min(sizes.values()) // 50)  # the same recent keys' count in every table
        dels = rng.choice(np.arange(1, rows - recent), size=n_del, replace=False)
        wide = rng.integers(1, rows - recent, size=n_wide)
        wide = wide[~np.isin(wide, dels)]
        hot = rng.integers(rows - recent + 1, rows + 1, size=n_hot)
        ins = np.arange(rows + 1, rows + 1 + n_ins)
        ops = [("U", int(k)) for k in hot] + [("U", int(k)) for k in wide] + [("I", int(k)) for k in ins] \
            + [("D", int(k)) for k in dels]
        order = rng.permutation(len(ops))
        plan[name] = [ops[i] for i in order]
    t0 = time.perf_counter()
    with psycopg.connect(pg.socket_dsn) as c:
        c.execute("SET synchronous_commit = off")
        n = max(len(v) for v in plan.values())
        for lo in range(0, n, batch):
            for table, ops in plan.items():
                apply_ops(c, quote_ident(table), ops[lo:lo + batch], day)
            c.commit()
    say(f"workload: {changes:,} statements' worth of changes per table in {time.perf_counter() - t0:.1f}s")
    return plan


def apply_ops(c, name: str, chunk, day: str | None = None) -> None:
    """One batch of ``(op, id)`` on the quoted table ``name``: updates, inserts, deletes
    (``U``/``I``/``D``), one statement each; the caller commits. Shared by bench/soak.py.
    ``day``: the table has a last column ``day`` (``--partitioned``), the inserts' value."""
    for op in "UID":
        ids = [k for o, k in chunk if o == op]
        if not ids:
            continue
        if op == "U":
            c.execute(f"UPDATE {name} SET qty = qty + 1, label = md5(label) WHERE id = ANY(%s)", (ids,))
        elif op == "I":
            c.execute(f"INSERT INTO {name} SELECT i, 1, md5(i::text), 0, now(), true"
                      f"{', %s::date' if day else ''} FROM unnest(%s::bigint[]) i", (*([day] if day else []), ids))
        else:
            c.execute(f"DELETE FROM {name} WHERE id = ANY(%s)", (ids,))


def copy_prefix(client, bucket: str, src: str, dst: str) -> int:
    """Copy every object under ``src`` to ``dst`` (s3a's folder markers, keys ending in
    ``/``, are left out: the S3 server refuses to copy them)."""
    n = 0
    for key in s3store.list_keys(client, bucket, src):
        if not key.endswith("/"):
            client.copy_object(Bucket=bucket, Key=dst + key[len(src):], CopySource={"Bucket": bucket, "Key": key})
            n += 1
    return n


def engine_args(engine: str) -> list[str]:
    """``pgcdc merge`` arguments of a benchmarked engine (``delta-spark-dv``: with deletion vectors)."""
    if engine == "delta-rs":
        return ["--engine", "delta-rs"]
    return ["--engine", "delta-spark", "--reader", "s3a", *(["--deletion-vectors"] if engine.endswith("-dv") else [])]


def objects(client, url: str) -> dict[str, int]:
    """Every object of the Delta table at ``url`` but its log (key -> size)."""
    bucket, _, prefix = url[len("s3://"):].partition("/")
    prefix = unquote(prefix).rstrip("/") + "/"
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", ()):
            if "/_delta_log/" not in o["Key"] and not o["Key"].endswith("/"):
                out[o["Key"]] = o["Size"]
    return out


def digest_pg(pg: PostgresServer, name: str, digest: str = DIGEST) -> tuple:
    with psycopg.connect(pg.socket_dsn) as c:
        return tuple(str(v) for v in c.execute(f"SELECT {digest} FROM {quote_ident(name)}").fetchone())


def digest_delta(url: str, storage: dict[str, str], digest: str = DIGEST) -> tuple:
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    qb = QueryBuilder().register("d", DeltaTable(url, storage_options=storage))
    row = pa.table(qb.execute(f"SELECT {digest} FROM d").read_all()).to_pylist()[0]
    return tuple(str(v) for v in row.values())


def files(url: str, storage: dict[str, str], version: int | None = None) -> dict[str, int]:
    """The table's data files at ``version`` (path -> size in bytes)."""
    import pyarrow as pa
    from deltalake import DeltaTable

    dt = DeltaTable(url, storage_options=storage, version=version)
    adds = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
    return dict(zip(adds["path"], adds["size_bytes"], strict=True))


def file_days(url: str, storage: dict[str, str]) -> dict[str, object]:
    """The table's data files' ``day`` partition (path -> value; empty: not partitioned by it)."""
    import pyarrow as pa
    from deltalake import DeltaTable

    adds = pa.table(DeltaTable(url, storage_options=storage).get_add_actions(flatten=True)).to_pydict()
    return dict(zip(adds["path"], adds["partition.day"], strict=True)) if "partition.day" in adds else {}


def window_days(ops: list[tuple[str, int]], rows: int, per_day: int) -> set[int]:
    """The days (0: :data:`LAST_DAY`, -1: :data:`TODAY`, n: n days before) the ``(op, id)`` of a
    table of ``rows`` rows (``build``'s days) change."""
    return {-1 if k > rows else (rows - k) // per_day for _op, k in ops}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, help="rows of the small table (200,000; --partitioned: 50,000)")
    ap.add_argument("--factor", type=int, default=10, help="the big table has factor x rows")
    ap.add_argument("--changes", type=int, help="change rows per table (20,000; --partitioned: 5,000)")
    ap.add_argument("--engine", choices=("delta-rs", "delta-spark", "delta-spark-dv", "both", "all"), default="both",
                    help="both: delta-rs and delta-spark; delta-spark-dv: delta-spark with --deletion-vectors; "
                    "all: the three")
    ap.add_argument("--server", choices=("pg18", "pg15"), default="pg18")
    ap.add_argument("--target-file-mb", type=float, help="the bootstrap's data file size (pgcdc merge's default)")
    ap.add_argument("--mix", default="0.70,0.10,0.15,0.05", metavar="HOT,WIDE,INS,DEL",
                    help="fractions of recent updates, scattered updates, inserts, scattered deletes")
    ap.add_argument("--partitioned", action="store_true",
                    help="key (id, day); the same window merged into the tables partitioned by day and unpartitioned")
    ap.add_argument("--rows-per-day", type=int, default=500, help="--partitioned: rows per day of both tables")
    args = ap.parse_args()
    if args.rows is None:
        args.rows = 50_000 if args.partitioned else 200_000
    if args.changes is None:
        args.changes = 5_000 if args.partitioned else 20_000
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    engines = {"both": ["delta-rs", "delta-spark"], "all": ["delta-rs", "delta-spark", "delta-spark-dv"]}.get(
        args.engine, [args.engine])
    if unavailable_reason():
        print(f"delta-spark left out: {unavailable_reason()}", flush=True)
        engines = [e for e in engines if e == "delta-rs"]
    print(f"load average at start: {os.getloadavg()}; {os.cpu_count()} CPUs", flush=True)
    pg = PostgresServer(args.server, settings={"max_wal_size": "4GB", "wal_sender_timeout": "0"})
    s3 = S3Server(volume_size_limit_mb=1024)
    pg.start()
    s3.start()
    try:
        return run(args, engines, pg, s3)
    finally:
        s3.close()
        pg.close()


def run(args, engines: list[str], pg: PostgresServer, s3: S3Server) -> int:
    os.environ.update(s3.aws_env())
    client = s3.client()
    s3.create_bucket(BUCKET)
    storage = s3store.delta_storage_options(s3store.S3Settings.from_env())
    env = {**os.environ}
    sizes = {"small": args.rows, "big": args.rows * args.factor}
    src = f"s3://{BUCKET}/cdc"
    per_day = args.rows_per_day if args.partitioned else None
    build(pg, {WARMUP: WARMUP_ROWS, **sizes}, per_day)
    snap = snapshot_to_s3(pg.dsn, src, slot=SLOT, publications=PUB, workers=2, s3=client)
    say(f"snapshot: {sum(t.rows for t in snap.tables):,} rows")
    work = tempfile.mkdtemp(prefix="bench-merge-cost-")
    # --partitioned: each engine bootstraps and merges the tables twice, partitioned by day
    # (the option on every job, the bootstrap's included) and not (the baseline)
    layouts = [("partitioned", [a for t in (WARMUP, *TABLES) for a in ("--table-option", f"public.{t}:partition_by=day")]),
               ("unpartitioned", [])] if args.partitioned else [("", [])]
    runs = [(engine, layout, opts, f"{engine}-{layout}" if layout else engine)
            for engine in engines for layout, opts in layouts]
    bases = {}
    for engine, layout, opts, key in runs:  # each engine bootstraps its own tables: the file layout is its own
        base = f"s3://{BUCKET}/base-{key}"
        boot = run_job(["--from", src, "--slot", SLOT, "--delta", base, "--max-windows", "0", *engine_args(engine),
                        *(["--target-file-mb", str(args.target_file_mb)] if args.target_file_mb else []), *opts], env,
                       os.path.join(work, f"boot-{key}"))
        bases[key] = base
        say(f"bootstrap with {engine}{' ' + layout if layout else ''} (not timed): {boot['wall']:.1f}s")
    mix = tuple(float(f) for f in args.mix.split(","))
    day = TODAY if per_day else None
    workload(pg, {WARMUP: WARMUP_ROWS}, max(20, args.changes // 100), mix=mix, recent=WARMUP_ROWS // 50, day=day)
    plan = workload(pg, sizes, args.changes, mix=mix, day=day)
    changed_days = {}
    if per_day:
        for t in TABLES:
            days = window_days(plan[t], sizes[t], per_day)
            changed_days[t] = len(days)
            say(f"window: {t}: changes in {len(days)} of its {-(-sizes[t] // per_day) + 1} days ({TODAY}, the "
                f"inserts' new day, included; {sum(1 for d in days if 0 <= d < 7)} of the 7 latest before it)")
    target = current_lsn(pg)
    w = drain_window(pg.dsn, src, slot=SLOT, publications=PUB, until_lsn=target, s3=client)
    say(f"drained window {w.window_seq}: {w.rows:,} change rows {w.tables}")
    if LSN.parse(w.end_lsn) < target:
        raise SystemExit(f"the window ended at {w.end_lsn}, before {target}")
    digest = DIGEST + (", count(DISTINCT day)" if per_day else "")
    expect = {t: digest_pg(pg, t, digest) for t in TABLES}
    rows_out = []
    for engine, layout, opts, key in runs:
        lake = f"s3://{BUCKET}/lake-{key}"
        copy_prefix(client, BUCKET, key_prefix(bases[key]), key_prefix(lake))
        before = {t: files(delta_table_url(lake, "public", t), storage) for t in TABLES}
        days_before = {t: file_days(delta_table_url(lake, "public", t), storage) for t in TABLES}
        stored = {t: objects(client, delta_table_url(lake, "public", t)) for t in TABLES}
        job = run_job(["--from", src, "--slot", SLOT, "--delta", lake, *engine_args(engine), *opts, *ORDER], env,
                      os.path.join(work, f"merge-{key}"))
        say(f"merge with {engine}{' ' + layout if layout else ''}: job {job['wall']:.1f}s (Spark start-up included)")
        for res in job["result"]["tables"]:
            name = res["table"].split(".", 1)[1]
            if name == WARMUP:
                say(f"{engine}: warm-up table merged in {res['seconds']:.1f}s (not compared)")
                continue
            url = delta_table_url(lake, "public", name)
            after = files(url, storage)
            added = {p: s for p, s in after.items() if p not in before[name]}
            # bytes written: every new object of the table but its log (data files, and
            # the deletion vectors' files, which are no add action of their own)
            new_objects = {k: v for k, v in objects(client, url).items() if k not in stored[name]}
            removed = [p for p in before[name] if p not in after]
            # the partitions whose files the merge rewrote or added, of the table's after it
            days_after = file_days(url, storage)
            parts = ((len({days_before[name][p] for p in removed} | {days_after[p] for p in added}),
                      len(set(days_after.values()))) if days_after else None)
            m = res.get("metrics") or {}
            got = digest_delta(url, storage, digest)
            rows_out.append({
                "engine": engine, "layout": layout, "table": name, "rows": sizes[name],
                "files_before": len(before[name]),
                "bytes_before": sum(before[name].values()), "seconds": res["seconds"],
                "scanned": m.get("num_target_files_scanned"), "removed": len(removed), "added": len(added),
                "bytes_written": sum(new_objects.values()), "change_rows": res["change_rows"],
                "dv_files": sum(1 for k in new_objects if "deletion_vector_" in k), "parts": parts,
                "equal": got == expect[name],
            })
            if got != expect[name]:
                print(f"WARNING: {engine}{' ' + layout if layout else ''} {name}: Delta {got} != PostgreSQL {expect[name]}", flush=True)
    print()
    lay_head = f"{'layout':<14}" if per_day else ""
    part_head = f"{'partitions':>11}" if per_day else ""
    print(f"{'engine':<12}{lay_head}{'table':<7}{'rows':>11}{'files':>7}{'MB':>8}{'changes':>9}{'merge s':>9}"
          f"{'scanned':>9}{'rewritten':>10}{'added':>7}{'DVs':>5}{'MB written':>11}{part_head}  equal")
    for r in rows_out:
        lay = f"{r['layout']:<14}" if per_day else ""
        part = (f"{'-' if r['parts'] is None else '{}/{}'.format(*r['parts']):>11}" if per_day else "")
        print(f"{r['engine']:<12}{lay}{r['table']:<7}{r['rows']:>11,}{r['files_before']:>7}"
              f"{r['bytes_before'] / 1e6:>8.1f}"
              f"{r['change_rows']:>9,}{r['seconds']:>9.1f}{'-' if r['scanned'] is None else r['scanned']:>9}"
              f"{r['removed']:>10}{r['added']:>7}{r['dv_files']:>5}{r['bytes_written'] / 1e6:>11.1f}{part}"
              f"  {r['equal']}")
    print()
    if per_day:
        print(f"the window changed rows in {changed_days['big']} of the big table's days and {changed_days['small']} "
              f"of the small table's ({args.rows_per_day} rows a day; {TODAY}: the inserts' new day)")
    for engine in engines:
        got = {}
        for layout, _opts in layouts:
            by = got[layout] = {r["table"]: r for r in rows_out if r["engine"] == engine and r["layout"] == layout}
            label = engine + (" (deletion vectors)" if engine.endswith("-dv") else "") + (f" {layout}" if layout else "")
            s, b = by["small"], by["big"]
            parts = (f"; partitions rewritten or added {'{}/{}'.format(*b['parts'])} vs {'{}/{}'.format(*s['parts'])}"
                     if b["parts"] and s["parts"] else "")
            print(f"{label}: big/small ({args.factor}x the rows): merge seconds {b['seconds'] / s['seconds']:.2f}x "
                  f"({b['seconds']:.1f} vs {s['seconds']:.1f}), bytes written "
                  f"{b['bytes_written'] / max(1, s['bytes_written']):.2f}x "
                  f"({b['bytes_written'] / 1e6:.1f} vs {s['bytes_written'] / 1e6:.1f} MB); target <= 1.5x{parts}")
        if per_day:
            for t in ("big", "small"):
                p, u = got["partitioned"][t], got["unpartitioned"][t]
                print(f"{engine} {t}: partitioned/unpartitioned: merge seconds {p['seconds'] / u['seconds']:.2f}x "
                      f"({p['seconds']:.1f} vs {u['seconds']:.1f}), bytes written "
                      f"{p['bytes_written'] / max(1, u['bytes_written']):.3f}x "
                      f"({p['bytes_written'] / 1e6:.2f} vs {u['bytes_written'] / 1e6:.2f} MB)")
    return 0 if all(r["equal"] for r in rows_out) else 1


if __name__ == "__main__":
    sys.exit(main())
