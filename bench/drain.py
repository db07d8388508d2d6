"""The drain (pgoutput → Parquet windows on the S3 server) vs ``pg_recvlogical -f /dev/null``.

Same server, same WAL, same pgoutput options (protocol 4, ``streaming parallel``,
``messages``), slots created before the workload, the two consumers alternated in one
run. Ours runs in a child process of its own (``bench/drain.py --child``: the drain's
imports done first, then one :func:`drain_window` call), so its CPU time and peak RSS
are the drain's alone. Wall time: from the call until the window is committed and
acknowledged (ours), from the start of ``pg_recvlogical`` until ``--endpos`` is reached
(theirs). Workloads (``--workload``, comma-separated or ``all``):

* ``inserts``: ``--rows`` (1,000,000) rows inserted in ``--txns`` (10) transactions;
* ``updates``: ``--updates`` (200,000) single-row update transactions;
* ``wide``: ``--wide-rows`` (200,000) rows of a 60-column table of mixed types (~2 KB a
  row) in 10 transactions;
* ``tables``: one transaction per table over ``--tables`` (500) tables,
  ``--table-rows`` (1,000) rows each: one window touching them all;
* ``streamed``: one ``--big``-row (5,000,000) transaction (streamed by the server,
  spooled to disk by the drain).

Printed per workload (medians over ``--rounds``, default 3; the order alternates each
round): the drain's rows/s, pg_recvlogical's rows/s, the throughput ratio ours/theirs
(target >= 0.9), the drain's CPU seconds (user + sys, every thread and child process of
the drain) per million rows, and its peak RSS (``VmHWM``; target <= 300 MB for
``tables`` and ``streamed``). On a shared machine compare ratios and CPU per million
rows, not wall times.

    .venv/bin/python bench/drain.py [--server pg18|pg15] [--rounds 3] [--workload all|inserts,updates,...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

# --baseline: the child imports the package from another source tree (PGCDC_BENCH_TREE)
sys.path.insert(0, os.environ.get("PGCDC_BENCH_TREE") or str(Path(__file__).resolve().parents[1]))

from airflow_pgcdc.protocol.lsn import LSN  # noqa: E402

WORKLOADS = ("inserts", "updates", "wide", "tables", "streamed")
PUBLICATION = {"inserts": "bench_pub", "updates": "bench_pub", "streamed": "bench_pub",
               "wide": "wide_pub", "tables": "many_pub"}


# --------------------------------------------------------------------------- workloads


def setup(conn: psycopg.Connection, tables: int) -> None:
    conn.execute("CREATE TABLE bench (id bigint PRIMARY KEY, a int, b text, c timestamptz, d numeric(12,2))")
    conn.execute("CREATE PUBLICATION bench_pub FOR TABLE bench")
    conn.execute(f"CREATE TABLE wide ({', '.join(['id bigint PRIMARY KEY'] + [f'{n} {t}' for n, t, _ in WIDE])})")
    conn.execute("CREATE PUBLICATION wide_pub FOR TABLE wide")
    conn.execute("CREATE TABLE fresh (id bigserial PRIMARY KEY, v bigint)")
    conn.execute("CREATE PUBLICATION fresh_pub FOR TABLE fresh")
    for i in range(tables):
        conn.execute(f"CREATE TABLE many_{i} (id bigint PRIMARY KEY, a int, b text, c timestamptz)")
    if tables:
        conn.execute("CREATE PUBLICATION many_pub FOR TABLE " + ", ".join(f"many_{i}" for i in range(tables)))


# 59 columns besides the key: (name, type, expression of g), about 2 KB a row in all
_WIDE_KINDS = [
    ("int", "(g %% 100000)::int"),
    ("bigint", "g * 7919"),
    ("text", "repeat(md5(g::text), 3)"),  # 96 characters
    ("numeric(14,3)", "(g / 7.0)::numeric(14,3)"),
    ("timestamptz", "now() + g * interval '1 second'"),
    ("boolean", "g %% 3 = 0"),
    ("double precision", "g / 3.0"),
    ("date", "date '2020-01-01' + (g %% 3000)::int"),
    ("uuid", "md5(g::text)::uuid"),
    ("varchar(200)", "repeat(md5((g + 1)::text), 4)"),  # 128 characters
    ("jsonb", "jsonb_build_object('k', g, 'v', md5(g::text))"),
    ("smallint", "(g %% 30000)::smallint"),
]
WIDE = [(f"c{i}", *_WIDE_KINDS[i % len(_WIDE_KINDS)]) for i in range(59)]


def fill_wide(conn: psycopg.Connection, rows: int, txns: int = 10) -> None:
    per = rows // txns
    exprs = ", ".join(e for _, _, e in WIDE)
    for t in range(txns):
        conn.execute(f"INSERT INTO wide SELECT g, {exprs} FROM generate_series(%s::bigint, %s::bigint) g",
                     (t * per + 1, (t + 1) * per))


def fill_tables(conn: psycopg.Connection, tables: int, per_table: int) -> None:
    conn.execute("SET synchronous_commit = off")
    for i in range(tables):
        conn.execute(f"INSERT INTO many_{i} SELECT g, g %% 1000, md5(g::text), now() "
                     "FROM generate_series(1, %s::bigint) g", (per_table,))


# --------------------------------------------------------------------------- one drain, in a child


def child(spec: dict) -> int:
    """``--child``: one drain_window call; prints its wall and CPU seconds as JSON."""
    from airflow_pgcdc.drain.drain import drain_window
    from airflow_pgcdc.store.s3 import make_s3_client

    client = make_s3_client()
    profiles = _profile_threads() if spec.get("profile") else None
    ru0 = (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    t0 = time.perf_counter()
    r = drain_window(spec["dsn"], spec["url"], slot=spec["slot"], publications=spec["publication"],
                     until_lsn=spec["until"], s3=client, start_without_snapshot=True,
                     **spec.get("kw", {}))
    dt = time.perf_counter() - t0
    if profiles is not None:  # every thread's profile, merged (profiling slows the drain: not timed)
        import pstats

        profiles[0].disable()
        stats = pstats.Stats(profiles[0])
        for p in profiles[1:]:
            stats.add(p)
        Path(spec["profile"]).parent.mkdir(parents=True, exist_ok=True)
        stats.dump_stats(spec["profile"])
    ru1 = (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    cpu = sum((b.ru_utime - a.ru_utime) + (b.ru_stime - a.ru_stime) for a, b in zip(ru0, ru1, strict=True))
    timings = {}
    if r.manifest:  # the drain's own split: receiving (and decoding) vs finishing (parts, manifest)
        bucket, key = r.manifest[len("s3://"):].split("/", 1)
        timings = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read()).get("timings", {})
    print(json.dumps({"seconds": dt, "cpu": cpu, "rows": r.rows, "transactions": r.transactions,
                      "end_lsn": r.end_lsn, "manifest": r.manifest,
                      "receive_s": timings.get("receive_seconds"), "finish_s": timings.get("finish_seconds")}),
          flush=True)
    return 0


def _profile_threads() -> list:
    """``--profile``: cProfile this thread and every thread started from now on."""
    import cProfile
    import threading

    profiles = [cProfile.Profile()]
    run = threading.Thread.run

    def profiled(self) -> None:
        p = cProfile.Profile()
        profiles.append(p)
        p.enable()
        try:
            run(self)
        finally:
            p.disable()

    threading.Thread.run = profiled
    profiles[0].enable()
    return profiles


def run_ours(server, s3, url: str, slot: str, publication: str, target: LSN, tree: str | None = None,
             profile: str | None = None) -> dict:
    from airflow_pgcdc.testing.memory import wait_with_peak

    spec = {"dsn": server.dsn, "url": url, "slot": slot, "publication": publication, "until": str(target)}
    if profile:
        spec["profile"] = profile
    env = {**os.environ, **s3.aws_env()}
    if tree:
        env["PGCDC_BENCH_TREE"] = tree
    proc = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(spec)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    status, peak, _usage = wait_with_peak(proc)  # VmHWM: ru_maxrss would carry this process' own size
    out, err = proc.stdout.read(), proc.stderr.read()
    if status != 0:
        raise RuntimeError(f"the drain failed ({status}): {err.decode()[-3000:]}")
    res = json.loads(out.decode().strip().splitlines()[-1])
    res["peak_mb"] = peak / (1 << 20)
    return res


def run_recvlogical(server, slot: str, publication: str, target: LSN) -> float:
    version = 4 if server.version_num >= 160000 else 2
    streaming = "parallel" if server.version_num >= 160000 else "on"
    cmd = [
        str(server.bin_dir / "pg_recvlogical"),
        "-d", server.dsn, "-S", slot, "--start", "--no-loop",
        "-o", f"proto_version={version}", "-o", f"publication_names={publication}",
        "-o", "messages=true", "-o", f"streaming={streaming}",
        "--endpos", str(target), "-f", "/dev/null", "-s", "10",
    ]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - t0


def create_slots(server, names: list[str]) -> None:
    with psycopg.connect(server.socket_dsn, autocommit=True) as c:
        for s in names:
            c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (s,))


def drop_slots(server, names: list[str]) -> None:
    with psycopg.connect(server.socket_dsn, autocommit=True) as c:
        for s in names:
            c.execute("SELECT pg_drop_replication_slot(%s)", (s,))


def current_lsn(server) -> LSN:
    with psycopg.connect(server.socket_dsn, autocommit=True) as c:
        return LSN.parse(c.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])


def bench(server, s3, url: str, name: str, fill, rounds: int, baseline: str | None = None,
          profile: str | None = None) -> dict:
    """Alternated rounds of ours and pg_recvlogical (and, with ``baseline``, the drain of
    that source tree: same WAL, same rounds, the order rotating)."""
    publication = PUBLICATION[name]
    who_all = ("ours", "theirs", "base") if baseline else ("ours", "theirs")
    slots = {(who, i): f"bench_{name}_{who}_{i}" for i in range(rounds) for who in who_all}
    create_slots(server, list(slots.values()))
    t0 = time.perf_counter()
    with psycopg.connect(server.socket_dsn, autocommit=True) as c:
        fill(c)
    target = current_lsn(server)
    print(f"[{name}] workload written in {time.perf_counter() - t0:.1f}s, end LSN {target}", flush=True)
    runs: dict[str, list] = {who: [] for who in who_all}
    for i in range(rounds):
        order = who_all[i % len(who_all):] + who_all[:i % len(who_all)]
        for who in order:
            slot = slots[(who, i)]
            if who == "theirs":
                runs[who].append(run_recvlogical(server, slot, publication, target))
                print(f"[{name}] round {i + 1} theirs {runs[who][-1]:.2f}s", flush=True)
                continue
            r = run_ours(server, s3, url, slot, publication, target, baseline if who == "base" else None,
                         f"{profile}/{name}-{who}-{i}.prof" if profile else None)
            runs[who].append(r)
            print(f"[{name}] round {i + 1} {who:6s} {r['seconds']:.2f}s (receive {r['receive_s']}s, finish "
                  f"{r['finish_s']}s) cpu {r['cpu']:.2f}s peak {r['peak_mb']:.0f} MB rows {r['rows']:,}",
                  flush=True)
    drop_slots(server, list(slots.values()))
    ours, theirs = runs["ours"], runs["theirs"]
    rows = ours[0]["rows"]
    o = statistics.median(r["seconds"] for r in ours)
    t = statistics.median(theirs)
    ratios = [b / a["seconds"] for a, b in zip(ours, theirs, strict=True)]  # per round
    res = {
        "rows": rows, "ours_s": o, "theirs_s": t, "ratio": t / o, "round_ratios": ratios,
        "cpu_per_mrow": statistics.median(r["cpu"] for r in ours) / rows * 1e6 if rows else float("nan"),
        "peak_mb": max(r["peak_mb"] for r in ours),
    }
    print(f"RESULT {name}: {rows:,} rows; ours {o:.2f}s ({rows / o:,.0f} rows/s), pg_recvlogical {t:.2f}s "
          f"({rows / t:,.0f} rows/s); ratio ours/pg_recvlogical {res['ratio']:.2f} (rounds "
          f"{', '.join(f'{x:.2f}' for x in ratios)}); drain CPU {res['cpu_per_mrow']:.1f} s per million rows; "
          f"peak RSS {res['peak_mb']:.0f} MB", flush=True)
    if baseline:
        base = runs["base"]
        res["base"] = {
            "ratio": t / statistics.median(r["seconds"] for r in base),
            "cpu_per_mrow": statistics.median(r["cpu"] for r in base) / rows * 1e6 if rows else float("nan"),
            "peak_mb": max(r["peak_mb"] for r in base),
            "cpu_new_over_base": statistics.median(a["cpu"] / b["cpu"] for a, b in zip(ours, base, strict=True)),
            "time_new_over_base": statistics.median(a["seconds"] / b["seconds"]
                                                    for a, b in zip(ours, base, strict=True)),
        }
        b = res["base"]
        print(f"RESULT {name} baseline ({baseline}): ratio {b['ratio']:.2f}, CPU {b['cpu_per_mrow']:.1f} s per "
              f"million rows, peak RSS {b['peak_mb']:.0f} MB; ours/baseline per round (median): CPU "
              f"{b['cpu_new_over_base']:.2f}, wall {b['time_new_over_base']:.2f}", flush=True)
    return res


# --------------------------------------------------------------------------- freshness


def child_loop(spec: dict) -> int:
    """``--child-loop``: drains back to back (each ``drain_window`` with ``max_seconds``)
    until ``stop_at`` (epoch seconds) and the slot is caught up; for every committed row,
    prints the seconds from its transaction's commit (``_pgcdc_commit_ts``) to the return of
    the call that committed and acknowledged its window."""
    import pyarrow.parquet as pq

    from airflow_pgcdc.drain.drain import drain_window
    from airflow_pgcdc.store.s3 import make_s3_client

    client = make_s3_client()
    latencies: list[float] = []
    windows = 0
    while True:
        started = time.time()
        r = drain_window(spec["dsn"], spec["url"], slot=spec["slot"], publications=spec["publication"],
                         max_seconds=spec["max_seconds"], s3=client, start_without_snapshot=True)
        done = time.time()
        if r.manifest:
            windows += 1
            bucket, key = r.manifest[len("s3://"):].split("/", 1)
            manifest = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
            base = key.rsplit("/", 1)[0] + "/"
            for t in manifest["tables"]:
                for v in t["relation_versions"]:
                    for part in v["parts"]:
                        span = ({} if part.get("offset") is None else  # a part inside the window's pack
                                {"Range": f"bytes={part['offset']}-{part['offset'] + part['length'] - 1}"})
                        body = client.get_object(Bucket=bucket, Key=base + part["path"], **span)["Body"].read()
                        ts = pq.read_table(pa_buffer(body), columns=["_pgcdc_commit_ts"]).column(0)
                        latencies += [done - x.timestamp() for x in ts.to_pylist()]
        if started > spec["stop_at"] and not r.rows:
            break
    print(json.dumps({"windows": windows, "latencies": latencies}), flush=True)
    return 0


def pa_buffer(data: bytes):
    import pyarrow as pa

    return pa.BufferReader(data)


def bench_freshness(server, s3, url: str, rate: int, seconds: int, max_seconds: float) -> dict:
    """A writer commits ``rate`` one-row transactions a second for ``seconds`` while drains
    run back to back with ``max_seconds``: p50/p99 of commit → window committed."""
    import threading

    slot = "bench_freshness"
    create_slots(server, [slot])
    stop_at = time.time() + seconds

    def writer() -> None:
        with psycopg.connect(server.socket_dsn, autocommit=True) as c:
            c.execute("SET synchronous_commit = off")
            c.execute(f"""DO $$ DECLARE t0 timestamptz := clock_timestamp(); i bigint := 0; BEGIN
                  WHILE clock_timestamp() < t0 + interval '{seconds} s' LOOP
                    INSERT INTO fresh (v) VALUES (i); COMMIT; i := i + 1;
                    IF i % 20 = 0 THEN  -- the i-th transaction not before t0 + i / rate
                      PERFORM pg_sleep(greatest(0, extract(epoch FROM
                        t0 + (i / {rate}.0) * interval '1 s' - clock_timestamp())));
                    END IF;
                  END LOOP; END $$""")

    th = threading.Thread(target=writer)
    th.start()
    spec = {"dsn": server.dsn, "url": url, "slot": slot, "publication": "fresh_pub", "stop_at": stop_at,
            "max_seconds": max_seconds}
    env = {**os.environ, **s3.aws_env()}
    out = subprocess.run([sys.executable, __file__, "--child-loop", json.dumps(spec)], env=env,
                         capture_output=True, check=False)
    th.join()
    if out.returncode != 0:
        raise RuntimeError(f"the drain loop failed: {out.stderr.decode()[-3000:]}")
    res = json.loads(out.stdout.decode().strip().splitlines()[-1])
    lat = sorted(res["latencies"])
    drop_slots(server, [slot])

    def q(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))]

    r = {"rows": len(lat), "windows": res["windows"], "rate": len(lat) / seconds, "p50": q(0.5), "p99": q(0.99),
         "max": lat[-1]}
    print(f"RESULT freshness: {r['rows']:,} one-row transactions in {seconds} s ({r['rate']:,.0f} tx/s), "
          f"{r['windows']} windows with --max-seconds {max_seconds:g}: commit -> window committed p50 "
          f"{r['p50']:.2f} s, p99 {r['p99']:.2f} s, max {r['max']:.2f} s (target p99 <= {max_seconds + 2:g} s)",
          flush=True)
    return r


def pin(server, s3) -> None:
    """``--pin``: servers on CPU 0 (the walsenders fork from the postmaster later and inherit
    it), this process and so every consumer it starts on CPU 1."""
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("--pin needs 2 CPUs")
    for pid in (server.pid, s3.pid):
        subprocess.run(["taskset", "-a", "-p", "-c", "0", str(pid)], check=True, stdout=subprocess.DEVNULL)
    os.sched_setaffinity(0, {1})
    print("pinned: PostgreSQL and the S3 server on CPU 0, the drain and pg_recvlogical on CPU 1", flush=True)


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        return child(json.loads(sys.argv[2]))
    if len(sys.argv) == 3 and sys.argv[1] == "--child-loop":
        return child_loop(json.loads(sys.argv[2]))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", choices=("pg18", "pg15"), default="pg18")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--txns", type=int, default=10)
    ap.add_argument("--updates", type=int, default=200_000)
    ap.add_argument("--wide-rows", type=int, default=200_000)
    ap.add_argument("--tables", type=int, default=500)
    ap.add_argument("--table-rows", type=int, default=1_000)
    ap.add_argument("--big", type=int, default=5_000_000)
    ap.add_argument("--freshness", action="store_true",
                    help="also: a steady writer of --rate one-row transactions a second for --seconds while "
                         "drains with --max-seconds run back to back; p50/p99 commit -> window committed")
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--max-seconds", type=float, default=10.0)
    ap.add_argument("--baseline", metavar="DIR",
                    help="another source tree (e.g. `git archive` of a commit): its drain runs in the same "
                         "alternated rounds; printed: its figures and ours/its CPU and wall per round")
    ap.add_argument("--profile", metavar="DIR",
                    help="write a cProfile of each drain run (all its threads) to DIR/<workload>-<who>-<round>.prof "
                         "(profiled runs are slower: use their times only to compare functions)")
    ap.add_argument("--pin", action="store_true",
                    help="the servers (PostgreSQL, its walsenders, the S3 server) on CPU 0, the consumers "
                         "(the drain, pg_recvlogical) on CPU 1: each side on a core of its own, as when the "
                         "drain runs on an Airflow worker and the database elsewhere (needs 2 CPUs)")
    ap.add_argument("--workload", default="all", help="all, none, or a comma-separated subset of " + ", ".join(WORKLOADS))
    args = ap.parse_args()
    chosen = WORKLOADS if args.workload == "all" else () if args.workload == "none" else tuple(args.workload.split(","))
    unknown = set(chosen) - set(WORKLOADS)
    if unknown:
        ap.error(f"unknown workload(s): {', '.join(sorted(unknown))}")
    from stream import fill_inserts, fill_updates  # the same workloads as bench/stream.py

    from airflow_pgcdc.testing.postgres import PostgresServer
    from airflow_pgcdc.testing.s3 import S3Server

    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
    settings = {"max_wal_size": "8GB", "wal_sender_timeout": "0", "checkpoint_timeout": "30min"}
    results = {}
    with PostgresServer(args.server, settings=settings) as server, S3Server(volume_size_limit_mb=1024) as s3:
        if args.pin:
            pin(server, s3)
        bucket = s3.create_bucket("bench")
        url = f"s3://{bucket}/lake"
        with psycopg.connect(server.socket_dsn, autocommit=True) as c:
            setup(c, args.tables if "tables" in chosen else 0)
        next_id = 1
        if "inserts" in chosen:
            results["inserts"] = bench(server, s3, url, "inserts",
                                       lambda c: fill_inserts(c, args.rows, args.txns), args.rounds, args.baseline, args.profile)
            next_id = args.rows + 1
        if "updates" in chosen:
            if next_id <= args.updates:  # rows to update, written before the slots exist
                with psycopg.connect(server.socket_dsn, autocommit=True) as c:
                    fill_inserts(c, args.updates, 1, first=next_id)
                next_id += args.updates
            results["updates"] = bench(server, s3, url, "updates", lambda c: fill_updates(c, args.updates),
                                       args.rounds, args.baseline, args.profile)
        if "wide" in chosen:
            results["wide"] = bench(server, s3, url, "wide", lambda c: fill_wide(c, args.wide_rows), args.rounds, args.baseline, args.profile)
        if "tables" in chosen:
            results["tables"] = bench(server, s3, url, "tables",
                                      lambda c: fill_tables(c, args.tables, args.table_rows), args.rounds, args.baseline, args.profile)
        if "streamed" in chosen:
            first = next_id
            results["streamed"] = bench(server, s3, url, "streamed",
                                        lambda c: fill_inserts(c, args.big, 1, first=first), args.rounds, args.baseline, args.profile)
        fresh = bench_freshness(server, s3, url, args.rate, args.seconds, args.max_seconds) if args.freshness else None
    print("workload   rows        ours rows/s  pg_recvlogical rows/s  ratio (>=0.9)  CPU s/Mrow  peak RSS MB"
          + ("  | baseline: ratio  CPU s/Mrow  peak MB  CPU ours/base  wall ours/base" if args.baseline else ""))
    for k, r in results.items():
        line = (f"{k:10s} {r['rows']:>10,}  {r['rows'] / r['ours_s']:>11,.0f}  {r['rows'] / r['theirs_s']:>21,.0f}"
                f"  {r['ratio']:>13.2f}  {r['cpu_per_mrow']:>10.1f}  {r['peak_mb']:>11.0f}")
        if "base" in r:
            b = r["base"]
            line += (f"  | {b['ratio']:>15.2f}  {b['cpu_per_mrow']:>10.1f}  {b['peak_mb']:>7.0f}"
                     f"  {b['cpu_new_over_base']:>13.2f}  {b['time_new_over_base']:>14.2f}")
        print(line)
    if fresh:
        print(f"freshness at {fresh['rate']:,.0f} tx/s, --max-seconds {args.max_seconds:g}: p50 {fresh['p50']:.2f} s, "
              f"p99 {fresh['p99']:.2f} s (target <= {args.max_seconds + 2:g} s), {fresh['windows']} windows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
