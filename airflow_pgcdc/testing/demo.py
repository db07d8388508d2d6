"""``make demo``: the main job on the embedded default.

1. starts the sandbox (PostgreSQL 18 from the embedded wheel + an S3 server) under
   ``.pgcdc/``;
2. creates a demo schema (``shop.customers``, ``shop.orders``, ``shop.products``) with
   realistic types and data;
3. runs the ``pgcdc_initial_load`` DAG for real (``dag.test()``: ensure publication →
   exported snapshot → Spark bootstrap of the Delta tables → verify);
4. starts a concurrent write workload (inserts, updates, deletes, a key change, large
   values) and runs the ``pgcdc_incremental`` DAG three times (changes sensor → drain
   one window → Spark merge); the workload stops before the third run, which catches up;
5. verifies every Delta table against PostgreSQL and prints a summary per table;
6. shows what a monitoring stack gets from those runs: the merge's OpenLineage event (the
   provider's file transport, ``.pgcdc/observe/openlineage/``), the ``pgcdc.*`` metrics a
   StatsD server received (``.pgcdc/observe/statsd.txt``), and ``pgcdc status --history 1
   --plot .pgcdc/observe/health.png``.

Exits non-zero if a DAG run fails or a table differs. Every rerun starts afresh (the
demo's slot, publication and S3 prefixes are dropped first).
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg

from airflow_pgcdc.testing.observe import StatsdListener, lineage_env, lineage_events
from airflow_pgcdc.testing.sandbox import Sandbox

log = logging.getLogger("pgcdc.demo")

SLOT = "pgcdc_demo"
PUBLICATION = "pgcdc_demo_pub"
TABLES = ["shop.customers", "shop.orders", "shop.products"]
STORE_PREFIX, DELTA_PREFIX = "cdc", "delta"

SCHEMA = """
DROP SCHEMA IF EXISTS shop CASCADE;
CREATE SCHEMA shop;
CREATE TYPE shop.order_status AS ENUM ('new', 'paid', 'shipped', 'cancelled');
CREATE TABLE shop.customers (
    id bigint PRIMARY KEY,
    email text NOT NULL UNIQUE,
    name text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    birthday date,
    profile jsonb
);
CREATE TABLE shop.products (
    sku text PRIMARY KEY,
    title text NOT NULL,
    price numeric(10, 2) NOT NULL,
    tags text[],
    description text,
    available_from time,
    uid uuid NOT NULL DEFAULT gen_random_uuid()
);
ALTER TABLE shop.products ALTER COLUMN description SET STORAGE EXTERNAL;
CREATE TABLE shop.orders (
    id bigint PRIMARY KEY,
    customer_id bigint NOT NULL,
    status shop.order_status NOT NULL DEFAULT 'new',
    total numeric(12, 2) NOT NULL,
    items text[] NOT NULL,
    placed_at timestamptz NOT NULL DEFAULT now(),
    shipping interval
);
"""

SEED = [
    "INSERT INTO shop.customers (id, email, name, birthday, profile) "
    "SELECT g, 'user' || g || '@example.com', 'User ' || g, DATE '1970-01-01' + (g % 15000), "
    "jsonb_build_object('tier', g % 3, 'tags', jsonb_build_array('a', g % 7)) FROM generate_series(1, 20000) g",
    "INSERT INTO shop.products (sku, title, price, tags, description, available_from) "
    "SELECT 'sku-' || g, 'Product ' || g, (g % 500) + 0.99, ARRAY['t' || (g % 5), 't' || (g % 11)], "
    "CASE WHEN g % 10 = 0 THEN repeat('long description ' || g || ' ', 300) END, "
    "TIME '08:00' + (g % 600) * interval '1 minute' FROM generate_series(1, 2000) g",
    "INSERT INTO shop.orders (id, customer_id, total, items, shipping) "
    "SELECT g, 1 + (g % 20000), (g % 900) + 0.5, ARRAY['sku-' || (1 + g % 2000)], (g % 5) * interval '1 day' "
    "FROM generate_series(1, 100000) g",
]


class Workload(threading.Thread):
    """Writes until stopped: new orders, status changes, deletes, customer and product
    updates (the product description is a TOASTed value left unchanged), a key change."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True, name="demo-workload")
        self.dsn = dsn
        self.stop_event = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        rnd = random.Random(42)
        next_order, next_customer = 100_001, 20_001
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stop_event.is_set():
                    with conn.transaction():
                        conn.execute(
                            "INSERT INTO shop.orders (id, customer_id, total, items) "
                            "SELECT g, 1 + (g %% 20000), 9.99, ARRAY['sku-1'] FROM generate_series(%s, %s) g",
                            (next_order, next_order + 49),
                        )
                        next_order += 50
                        lo = rnd.randint(1, 99_000)
                        conn.execute("UPDATE shop.orders SET status = 'paid' WHERE id BETWEEN %s AND %s",
                                     (lo, lo + 20))
                        conn.execute("DELETE FROM shop.orders WHERE id = %s", (rnd.randint(1, 100_000),))
                    conn.execute("UPDATE shop.products SET price = price + 1 WHERE sku = %s",
                                 (f"sku-{rnd.randint(1, 200) * 10}",))  # description: unchanged TOAST
                    conn.execute(
                        "INSERT INTO shop.customers (id, email, name) VALUES (%s, %s, 'New')",
                        (next_customer, f"new{next_customer}@example.com"),
                    )
                    conn.execute("UPDATE shop.customers SET id = id + 1000000 WHERE id = %s",
                                 (next_customer - 5,))  # a key change
                    next_customer += 1
                    self.transactions += 4
                    time.sleep(0.05)
        except BaseException as e:  # noqa: BLE001 - reported by the demo
            self.error = e

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=30)


def _airflow_env(env: dict[str, str], root: Path, dags: Path) -> dict[str, str]:
    from airflow_pgcdc.testing.dagrun import airflow_env, sandbox_connections

    thresholds = {"PGCDC_MIN_BYTES": "1", "PGCDC_MAX_DELAY": "5"}  # every change is worth a window
    return airflow_env(root / "airflow", dags, {**env, **sandbox_connections(env), **thresholds})


def _reset(dsn: str, env: dict[str, str], bucket: str) -> None:
    from airflow_pgcdc.store import s3 as s3store

    with psycopg.connect(dsn, autocommit=True) as conn:
        for (pid,) in conn.execute(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s AND active_pid IS NOT NULL", (SLOT,)
        ).fetchall():
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)
        )
        conn.execute(f"DROP PUBLICATION IF EXISTS {PUBLICATION}")
        conn.execute(SCHEMA)
        for stmt in SEED:
            conn.execute(stmt)
        conn.execute("ANALYZE")
    client = s3store.make_s3_client(s3store.S3Settings.from_env(env))
    for prefix in (STORE_PREFIX, DELTA_PREFIX):
        s3store.delete_prefix(client, bucket, prefix + "/")


def _run(dags: Path, dag: str, env: dict[str, str], conf: dict) -> dict:
    from airflow_pgcdc.testing.dagrun import run_dag

    t0 = time.monotonic()
    result = run_dag(dags / f"{dag}.py", dag, env, conf, timeout=600)
    seconds = time.monotonic() - t0
    states = ", ".join(f"{t} {v['state'].split('.')[-1]}" for t, v in result.tasks.items())
    log.info("      %s: %s in %.0fs (%s)", dag, result.state.split(".")[-1], seconds, states)
    if "success" not in result.state:
        tail = "\n".join(result.output.splitlines()[-60:])
        raise SystemExit(f"the {dag} run failed:\n{tail}")
    return {"result": result, "seconds": seconds}


def _dag_folder(argv: list[str] | None) -> Path:
    """The folder of the example DAGs (the repository's ``dags/``, which ``make demo``
    passes): the package does not guess where a checkout keeps them."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m airflow_pgcdc.testing.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--dags", type=Path, required=True,
                        help="the folder holding pgcdc_initial_load.py and pgcdc_incremental.py (the repository's dags/)")
    dags = parser.parse_args(argv).dags.absolute()
    missing = [n for n in ("pgcdc_initial_load.py", "pgcdc_incremental.py") if not (dags / n).is_file()]
    if missing:
        parser.error(f"{dags} holds no {' or '.join(missing)}: give the example DAGs' folder (the repository's dags/)")
    return dags


def main(argv: list[str] | None = None) -> int:
    dags = _dag_folder(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    t_start = time.monotonic()
    root = Path(".pgcdc").absolute()
    sandbox = Sandbox(root)
    log.info("[1/6] starting the sandbox (PostgreSQL 18 + S3) under %s", root.absolute())
    env, started = sandbox.up()
    dsn = env["PGCDC_DSN"]
    bucket = env["PGCDC_S3_BUCKET"]
    store, delta = f"s3://{bucket}/{STORE_PREFIX}", f"s3://{bucket}/{DELTA_PREFIX}"
    log.info("      sandbox %s; PostgreSQL at %s:%s", "started" if started else "already up", env["PGHOST"], env["PGPORT"])

    log.info("[2/6] creating the demo schema and data (20,000 customers, 2,000 products, 100,000 orders)")
    _reset(dsn, env, bucket)
    observe = root / "observe"
    shutil.rmtree(observe, ignore_errors=True)
    statsd = StatsdListener()
    aenv = {**_airflow_env(env, root, dags), **statsd.airflow_env(), **lineage_env(observe / "openlineage")}
    conf = {"slot": SLOT, "publication": PUBLICATION, "tables": TABLES, "store": store, "delta": delta}

    log.info("[3/6] DAG pgcdc_initial_load: publication, snapshot to S3, Spark bootstrap of Delta, verify")
    initial = _run(dags, "pgcdc_initial_load", aenv, {**conf, "workers": 2})
    snap = initial["result"].xcom("snapshot")
    log.info("      snapshot %s at %s: %s rows", snap["snapshot_id"], snap["consistent_point"], f"{snap['rows']:,}")

    log.info("[4/6] concurrent write workload + DAG pgcdc_incremental, three runs")
    workload = Workload(dsn)
    workload.start()
    runs = []
    for i in range(3):
        if i == 2:
            workload.stop()
            log.info("      workload stopped after %d transactions; the last run catches up", workload.transactions)
        else:
            time.sleep(3)
        if workload.error is not None:
            raise SystemExit(f"the demo workload failed: {workload.error}")
        run = _run(dags, "pgcdc_incremental", aenv, conf)
        window = run["result"].xcom("drain")
        log.info("      run %d: window %s, %s..%s, %s change rows", i + 1, window["window_seq"],
                 window["start_lsn"], window["end_lsn"], f"{window['rows']:,}")
        runs.append(run)
    if workload.error is not None:
        raise SystemExit(f"the demo workload failed: {workload.error}")

    log.info("[5/6] verifying every Delta table against PostgreSQL")
    ok, rows = _summary(dsn, env, delta, runs)
    log.info("[6/6] what monitoring gets: OpenLineage, StatsD, the health plot")
    seen = _observed(observe, statsd, env, store, delta)
    statsd.close()
    log.info("      done in %.0fs", time.monotonic() - t_start)
    _print(rows)
    print(seen)
    print("\nAirflow home: .pgcdc/airflow  ·  Delta tables under", delta)
    print("Stop the sandbox with: .venv/bin/pgcdc sandbox down")
    return 0 if ok else 1


def _summary(dsn: str, env: dict[str, str], delta: str, runs: list[dict]) -> tuple[bool, list[dict]]:
    from airflow_pgcdc.protocol.lsn import LSN
    from airflow_pgcdc.store import s3 as s3store
    from airflow_pgcdc.verify import verify_table

    settings = s3store.S3Settings.from_env(env)
    last_merge = {t["table"]: t for t in runs[-1]["result"].xcom("merge")["tables"]}
    merged_rows: dict[str, int] = {}
    merge_seconds: dict[str, float] = {}
    for run in runs:
        for t in run["result"].xcom("merge")["tables"]:
            name = t["table"]
            merged_rows[name] = merged_rows.get(name, 0) + int(t.get("change_rows") or 0)
            merge_seconds[name] = merge_seconds.get(name, 0.0) + float(t.get("seconds") or 0)
    with psycopg.connect(dsn) as conn:
        current = LSN.parse(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
    end = LSN.parse(runs[-1]["result"].xcom("drain")["end_lsn"])
    ok = True
    rows = []
    for name in TABLES:
        schema, table = name.split(".")
        r = verify_table(dsn, delta, schema, table, s3=settings)
        d = r.to_dict()
        ok &= r.equal
        t = last_merge.get(name, {})
        rows.append({
            "table": name,
            "postgres": d["postgres"]["rows"],
            "delta": d["delta"]["rows"],
            "windows": "-" if t.get("last_window") is None else f"0..{t['last_window']}",
            "lag": f"{max(int(current) - int(end), 0):,} B",
            "changes": merged_rows.get(name, 0),
            "rate": (f"{merged_rows.get(name, 0) / merge_seconds[name]:,.0f} rows/s"
                     if merge_seconds.get(name) else "-"),
            "verify": d["result"] + ("" if r.equal else f" ({d['counts']})"),
        })
    return ok, rows


def _observed(observe: Path, statsd: StatsdListener, env: dict[str, str], store: str, delta: str) -> str:
    """What the runs told a monitoring stack, as text: the last merge's OpenLineage COMPLETE
    event (inputs, outputs, row counts), the ``pgcdc.*`` StatsD lines (all kept in
    ``statsd.txt``), and the history plot ``pgcdc status`` drew."""
    out = ["", "What monitoring received from these runs:"]
    events = [e for e in lineage_events(observe / "openlineage")
              if e.get("eventType") == "COMPLETE" and e.get("job", {}).get("name") == "pgcdc_incremental.merge"]
    if events:
        e = events[-1]
        out.append(f"  OpenLineage {e['eventType']} of job {e['job']['namespace']}/{e['job']['name']} "
                   f"(run {e['run']['runId']}):")
        for d in e.get("inputs", []):
            out.append(f"    input   {d['namespace']}/{d['name']}")
        for d in e.get("outputs", []):
            stats = d.get("outputFacets", {}).get("outputStatistics", {})
            fields = len(d.get("facets", {}).get("schema", {}).get("fields", []))
            out.append(f"    output  {d['namespace']}/{d['name']}  rows {stats.get('rowCount', '-')}, "
                       f"{fields} columns in its schema facet")
        out.append(f"    (every event: {observe / 'openlineage'}/event-*.json)")
    else:
        out.append("  OpenLineage: no merge event (apache-airflow-providers-openlineage not installed?)")
    lines = [ln for ln in statsd.received(settle=2.0) if ".pgcdc." in ln.split(":", 1)[0]]
    (observe / "statsd.txt").write_text("\n".join(lines) + "\n")
    out.append(f"  StatsD: {len(lines)} pgcdc metric lines received (all in {observe / 'statsd.txt'}); the last run's:")
    out += [f"    {ln}" for ln in _last_run(lines)]
    png = observe / "health.png"
    cmd = [sys.executable, "-m", "airflow_pgcdc.cli", "status", "--slot", SLOT, "--store", store, "--delta", delta,
           "--history", "1", "--plot", str(png)]
    done = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    shown = " ".join(["pgcdc", *cmd[3:]])
    if done.returncode == 0 and png.is_file():
        out.append(f"  Health plot: {png} ({png.stat().st_size:,} bytes), from: {shown}")
        out += [f"    {ln}" for ln in done.stdout.strip().splitlines()[:12]]
    else:
        out.append(f"  Health plot: `{shown}` exited {done.returncode}: {done.stderr.strip()[-400:]}")
    return "\n".join(out)


def _last_run(lines: list[str]) -> list[str]:
    """The drain's and merge's metrics of the last run: each name's last line."""
    last: dict[str, str] = {}
    for ln in lines:
        name = ln.split(":", 1)[0]
        if any(k in name for k in (".drain.", ".merge.")):
            last[name] = ln
    return sorted(last.values())


def _print(rows: list[dict]) -> None:
    head = ("table", "rows in PostgreSQL", "rows in Delta", "windows merged", "LSN lag",
            "change rows merged", "merge throughput", "verify")
    keys = ("table", "postgres", "delta", "windows", "lag", "changes", "rate", "verify")
    cells = [[str(r[k]) if not isinstance(r[k], int) else f"{r[k]:,}" for k in keys] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    print()
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)))


if __name__ == "__main__":
    sys.exit(main())
