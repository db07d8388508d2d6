"""Helpers shared by the integration modules that run the pipeline end to end: SQL on a
test database, a drain with the tests' settings, the rows of a PostgreSQL table and of its
Delta table, and the comparison of both. Fixtures are in ``conftest.py`` beside this."""

from __future__ import annotations

import io
import json
from decimal import Decimal

import psycopg
import pyarrow.parquet as pq
from deltalake import DeltaTable

from airflow_pgcdc.drain.drain import drain_window
from airflow_pgcdc.lake.tables import delta_table_url
from airflow_pgcdc.store import s3 as s3store

SMALL_WORK_MEM = "-c logical_decoding_work_mem=64kB"


def sql(dsn, query, params=None):
    with psycopg.connect(dsn, autocommit=True) as c:
        cur = c.execute(query, params)
        return cur.fetchall() if cur.description else None


def pg_rows(dsn, table, key):
    with psycopg.connect(dsn) as c:
        cur = c.execute(f"SELECT * FROM {table} ORDER BY {key}")
        names = [d.name for d in cur.description]
        return [_norm(dict(zip(names, r, strict=True))) for r in cur.fetchall()]


def delta_rows(url, key, columns=None):
    dt = DeltaTable(url, storage_options=s3store.delta_storage_options())
    t = dt.to_pyarrow_table()
    if columns is not None:
        t = t.select(columns)
    return [_norm(r) for r in t.sort_by(key).to_pylist()]


def _norm(row):
    out = {}
    for k, v in row.items():
        if isinstance(v, dict | list) and k == "j":  # jsonb from psycopg
            v = json.dumps(v, sort_keys=True)
        elif isinstance(v, str) and v[:1] in "{[" and k == "j":
            v = json.dumps(json.loads(v), sort_keys=True)
        elif isinstance(v, Decimal):
            v = str(v)
        out[k] = v
    return out


def assert_equal(dsn, lake, table, key):
    schema, name = table.split(".")
    url = delta_table_url(lake, schema, name)
    expect = pg_rows(dsn, table, key)
    cols = list(expect[0]) if expect else None
    got = delta_rows(url, key, cols)
    assert len(got) == len(expect), f"{table}: {len(got)} rows in Delta, {len(expect)} in PostgreSQL"
    for g, e in zip(got, expect, strict=True):
        assert g == e, f"{table} key {e.get(key)}"


def drain(dsn, url, slot, client, **kw):
    return drain_window(dsn, url, slot=slot, publications="pub", s3=client,
                        connect_options=SMALL_WORK_MEM, **{"start_without_snapshot": True, **kw})


def read_windows(client, src, slot):
    from airflow_pgcdc.store.layout import Layout
    from airflow_pgcdc.store.window import read_window, window_folders

    layout = Layout.parse(src)
    return [read_window(client, layout, slot, seq) for seq in window_folders(client, layout, slot)]


def parquet_files(data: bytes) -> list[bytes]:
    """The Parquet files in an object: one, or several end to end (a window's pack of small
    parts); an object that begins as Parquet and cannot be read whole is an error."""
    out, start = [], 0
    while data[start:start + 4] == b"PAR1":
        end = data.find(b"PAR1", start + 4)
        while end >= 0:
            try:
                pq.read_metadata(io.BytesIO(data[start:end + 4]))
                break
            except OSError:
                end = data.find(b"PAR1", end + 4)
        assert end >= 0, f"unreadable Parquet at byte {start}"
        out.append(data[start:end + 4])
        start = end + 4
    return out


def release_delta_caches(session) -> None:
    """Drop the driver JVM's cache of Delta logs (``DeltaLog.clearCache``): the JVM outlives
    this module's session, and the cache of every table every module touched grew it out of
    memory. Without Delta's jars loaded there is nothing to drop."""
    try:
        session._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    except Exception:  # noqa: BLE001 - no Delta in this JVM (its class is missing): nothing cached
        pass
