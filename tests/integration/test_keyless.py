"""Tables without a key under ``REPLICA IDENTITY FULL``, against real servers (PostgreSQL
15 and 18, the S3 server, Spark in local mode), on both engines: updates and deletes that
hit one of several identical rows, NULLs, floats (``-0``, ``NaN``, arrays of them), a
truncate followed by inserts; the Delta table equals PostgreSQL as a multiset (``pgcdc
verify`` without a key) after each merge, and a replay commits nothing."""

from __future__ import annotations

import pytest
from lake_helpers import drain, sql
from matrix import servers_in_turn

from airflow_pgcdc.lake.tables import app_id, delta_table_url
from airflow_pgcdc.merge.jars import unavailable_reason
from airflow_pgcdc.merge.job import TablesFailed, merge_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout
from airflow_pgcdc.store.window import committed_window_seqs, read_window, read_window_rows
from airflow_pgcdc.verify import MULTISET, verify_table

_NO_JARS = unavailable_reason()
_JARS = pytest.mark.skipif(_NO_JARS is not None, reason=_NO_JARS or "")
# (engine, reader of the store): each engine once and each reader once. The multiset merge
# is the engine's; the reader only hands it the window's rows (its NaN, -0 and NULL handling is
# the python reader's under delta-rs here and the s3a reader's under delta-spark; delta-spark with
# the python reader is covered by test_merge_delta_spark and test_odd_names_delta_spark). The
# delta-spark + python cell, 175 s of the suite, was dropped.
ENGINES = [
    pytest.param(("delta-rs", "python"), id="delta-rs"),
    pytest.param(("delta-spark", "s3a"), id="delta-spark-s3a", marks=_JARS),
]

pytestmark = pytest.mark.delta_spark  # its engine parameters need Delta in the session


EXTRA = "'1 mon 2 days 00:00:03', '{1,NULL}', '\\x00ff', '2024-01-02 03:04:05.123456+00', 'o'"
ROW_A = f"(1, 'a', 1.5, 0.25, '{{1.0,-0}}', 1.50, {EXTRA})"
ROW_NULL = "(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"
ROW_NAN = "(2, 'b', 'NaN', '-0', '{NaN,NULL}', NULL, NULL, '{}', '', 'infinity', '')"
ROW_NEG0 = f"(3, 'c', '-0', 1e-7, '{{}}', 'NaN', {EXTRA})"
ROW_POS0 = f"(3, 'c', 0, 1e-7, '{{}}', 'NaN', {EXTRA})"


def one(where: str) -> str:
    """A ``WHERE`` that hits exactly one of the rows ``where`` selects."""
    return f"ctid = (SELECT ctid FROM k WHERE {where} LIMIT 1)"


def equal(db, lake, table="k"):
    result = verify_table(db, lake, "public", table)
    assert result.key_source == MULTISET
    c = result.comparison
    assert result.equal, (c.postgres_rows, c.delta_rows, c.sample_only_in_postgres, c.sample_only_in_delta)
    return c.postgres_rows


@pytest.mark.slow
@servers_in_turn("engine", ENGINES)  # the engines read the same windows from either server
def test_keyless_full_table_updates_and_deletes_as_a_multiset(engine, fresh_db, slot_name, store, spark):
    client, src, lake = store
    db = fresh_db
    sql(db, "CREATE TABLE k (a int, t text, f float8, r real, arr float8[], n numeric, iv interval, ints int[], "
            'b bytea, ts timestamptz, "odd""q""`b`.c" text)')
    sql(db, "ALTER TABLE k REPLICA IDENTITY FULL")
    sql(db, f"INSERT INTO k VALUES {ROW_A}, {ROW_A}, {ROW_A}, {ROW_NULL}, {ROW_NULL}, {ROW_NAN}, {ROW_NAN}, "
            f"{ROW_NEG0}, {ROW_POS0}")
    # keyless at the snapshot; later it gets a replica identity index: its updates then
    # arrive without the old row, and the merge cannot place them
    sql(db, "CREATE TABLE m (x int NOT NULL, y text)")
    sql(db, "ALTER TABLE m REPLICA IDENTITY FULL")
    sql(db, "INSERT INTO m VALUES (1, 'one'), (2, 'two')")
    sql(db, "CREATE PUBLICATION pub FOR TABLE k, m")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    url = delta_table_url(lake, "public", "k")
    app = app_id(slot, "public", "k")

    def merge():
        return merge_slot(spark, store=src, slot=slot, delta=lake, engine=engine[0], reader=engine[1])

    # window 0: inserts of duplicates, updates and deletes of one of several equal rows
    sql(db, f"INSERT INTO k VALUES {ROW_A}, {ROW_NULL}, "
            f"(4, 'd', NULL, NULL, NULL, 4, {EXTRA}), (4, 'd', NULL, NULL, NULL, 4, {EXTRA})")
    sql(db, f"UPDATE k SET ints = '{{7}}' WHERE {one('a = 1')}")
    sql(db, f"UPDATE k SET t = 'a2' WHERE {one('a = 1')}")
    sql(db, f"DELETE FROM k WHERE {one('a IS NULL')}")
    neg0, pos0, nan = one("a = 3 AND f::text = '-0'"), one("a = 3 AND f::text = '0'"), one("a = 2 AND f = 'NaN'")
    sql(db, f"UPDATE k SET r = 2 WHERE {neg0}")  # the -0 row, not the 0 one
    sql(db, f"DELETE FROM k WHERE {nan}")
    sql(db, f"UPDATE k SET a = a WHERE {one('a = 4')}")  # a no-op update of a duplicate
    sql(db, "INSERT INTO k (a, t) VALUES (9, 'gone')")
    sql(db, "DELETE FROM k WHERE a = 9")
    sql(db, "INSERT INTO m VALUES (3, 'three')")
    drain(db, src, slot, client)
    # the drain sent the whole old row: an update's _pgcdc_old_* columns, a delete's own
    layout = Layout.parse(src)
    seen = ["_pgcdc_op", "a", "t", "arr", "_pgcdc_old_t", "_pgcdc_old_arr"]  # (no infinity: to_pylist)
    windows = [read_window_rows(client, layout, slot, read_window(client, layout, slot, seq))  # through the manifests
               for seq in committed_window_seqs(client, layout, slot)]
    rows = [r for w in windows if "public.k" in w for r in w["public.k"].select(seen).to_pylist()]
    upd = [r for r in rows if r["_pgcdc_op"] == "U" and r["t"] == "a2"]
    assert upd and upd[0]["_pgcdc_old_t"] == "a" and upd[0]["_pgcdc_old_arr"] == [1.0, -0.0]
    assert any(r["_pgcdc_op"] == "D" and r["a"] == 2 and r["arr"][1] is None for r in rows)
    first = {t.table: t for t in merge().tables}
    assert first["public.k"].action == "bootstrapped+merged", first["public.k"]
    assert equal(db, lake) == 11
    assert equal(db, lake, "m") == 3
    from deltalake import DeltaTable

    opts = s3store.delta_storage_options()
    version = DeltaTable(url, storage_options=opts).version()
    assert DeltaTable(url, storage_options=opts).transaction_version(app) == 0
    # a replay commits nothing
    again = {t.table: t for t in merge().tables}
    assert again["public.k"].action == "up-to-date"
    assert DeltaTable(url, storage_options=opts).version() == version

    # window 1: changes before a truncate (gone), the truncate, then inserts and updates
    sql(db, f"DELETE FROM k WHERE {one('a = 4')}")
    sql(db, "UPDATE k SET a = a + 10 WHERE a = 1")  # every copy, one statement
    sql(db, "TRUNCATE k")
    sql(db, f"INSERT INTO k VALUES {ROW_A}, {ROW_A}, {ROW_NULL}, {ROW_NEG0}, {ROW_POS0}, {ROW_NAN}")
    sql(db, f"UPDATE k SET n = 7 WHERE {one('a = 1')}")
    sql(db, f"DELETE FROM k WHERE {pos0}")
    drain(db, src, slot, client)
    second = {t.table: t for t in merge().tables}
    assert second["public.k"].action == "merged" and second["public.k"].truncates == 1
    assert equal(db, lake) == 5

    # window 2: only an insert and a delete that cancel out (the commit records the window alone),
    # and m gets a replica identity index: its update arrives without the old row
    sql(db, "INSERT INTO k (a, t) VALUES (8, 'tmp')")
    sql(db, "DELETE FROM k WHERE a = 8")
    sql(db, "CREATE UNIQUE INDEX m_x ON m (x)")
    sql(db, "ALTER TABLE m REPLICA IDENTITY USING INDEX m_x")
    sql(db, "UPDATE m SET y = 'uno' WHERE x = 1")
    drain(db, src, slot, client)
    with pytest.raises(TablesFailed, match="public.m") as ei:
        merge()
    outcome = {t.table: t for t in ei.value.result.tables}
    assert outcome["public.m"].action == "failed" and "KeylessChange" in outcome["public.m"].error
    assert "without the old row" in outcome["public.m"].error and "REPLICA IDENTITY FULL" in outcome["public.m"].hint
    assert outcome["public.k"].action == "merged"
    assert DeltaTable(url, storage_options=opts).transaction_version(app) == 2
    assert equal(db, lake) == 5

    # window 3: a plain workload on the duplicates again; a replay of it commits nothing
    sql(db, f"INSERT INTO k VALUES {ROW_A}, {ROW_A}")
    sql(db, f"UPDATE k SET arr = '{{-0,0}}' WHERE {one('a = 1 AND n = 1.50')}")
    sql(db, f"DELETE FROM k WHERE {one('a = 1 AND n = 1.50')}")
    sql(db, f"UPDATE k SET f = 'NaN' WHERE {one('a IS NULL')}")
    sql(db, f"UPDATE k SET iv = '-1 day', b = '\\x01' WHERE {one('a = 3')}")
    drain(db, src, slot, client)
    with pytest.raises(TablesFailed, match="public.m"):
        merge()
    assert equal(db, lake) == 6
    version = DeltaTable(url, storage_options=opts).version()
    with pytest.raises(TablesFailed, match="public.m"):
        merge()
    assert DeltaTable(url, storage_options=opts).version() == version
    assert equal(db, lake) == 6


def test_multiset_arithmetic_in_commit_order(spark):
    """The per-value arithmetic (Spark, no server): ``max(c + S, S - M)`` copies, which is
    ``c + S`` on a table in step, and the changes one by one (a removal of a row that is
    not there removes nothing) on one that is not; a value whose count shrinks is deleted
    whole and its remaining copies inserted again."""
    import pyarrow as pa

    from airflow_pgcdc.merge.keyless import _values, merge_source, rows_after_truncate

    fields = [pa.field("v", pa.string()), pa.field("x", pa.float64())]
    ev = [  # (v, x, +1/-1, lsn, seq, sub)
        ("grow", 1.0, 1, 1, 1, 1), ("grow", 1.0, 1, 1, 2, 1),
        ("shrink", None, -1, 1, 3, 0), ("shrink", None, 1, 2, 1, 1), ("shrink", None, -1, 2, 2, 0),
        ("absent", 0.0, -1, 1, 4, 0), ("absent", 0.0, 1, 1, 5, 1),  # delete first: missing in the table
        ("negzero", -0.0, -1, 1, 6, 0), ("same", 2.0, -1, 1, 7, 0), ("same", 2.0, 1, 1, 7, 1),
    ]
    events = spark.createDataFrame(
        ev, "v string, x double, _pgcdc_delta int, _pgcdc_commit_lsn long, _pgcdc_seq long, _pgcdc_sub int")
    target = spark.createDataFrame(
        [("grow", 1.0), ("shrink", None), ("shrink", None), ("shrink", None), ("negzero", -0.0),
         ("negzero", 0.0), ("same", 2.0)], "v string, x double")
    values = _values(events, fields)
    got = sorted((r["v"], r["x"], r["_pgcdc_kind"]) for r in merge_source(values, target, fields).collect())
    assert got == sorted([
        ("grow", 1.0, "ins"), ("grow", 1.0, "ins"),  # 1 + 2: two more copies
        ("shrink", None, "del"), ("shrink", None, "ins"), ("shrink", None, "ins"),  # 3 - 1: deleted, 2 back
        ("absent", 0.0, "ins"),  # delete of a row not there is a no-op, then the insert
        ("negzero", -0.0, "del"),  # -0 is not 0: only the -0 row goes (no copy back)
    ]), got
    after = sorted((r["v"], r["x"]) for r in rows_after_truncate(values, fields).collect())
    assert after == [("absent", 0.0), ("grow", 1.0), ("grow", 1.0), ("same", 2.0)], after  # from nothing


def test_keyless_clauses_quote_every_name_and_compare_floats_by_text():
    from airflow_pgcdc.merge.clauses import build_keyless_spec

    rs = build_keyless_spec(columns=['a"b', "f", "arr"], float_columns=["f"], nested_float_columns=["arr"])
    assert rs.predicate == (
        """s."_pgcdc_kind" = 'del' AND (t."a""b" IS NOT DISTINCT FROM s."a""b") AND """
        """(CAST(t."f" AS VARCHAR) IS NOT DISTINCT FROM CAST(s."f" AS VARCHAR)) AND """
        """(t."arr" IS NOT DISTINCT FROM s."arr")"""
    )
    assert rs.updates == {} and rs.inserts['"a""b"'] == 's."a""b"'
    sp = build_keyless_spec(columns=["a`b", "f", "arr"], float_columns=["f"], nested_float_columns=["arr"],
                            dialect="spark")
    assert sp.predicate == (
        "s.`_pgcdc_kind` = 'del' AND (t.`a``b` <=> s.`a``b`) AND "
        "(CAST(t.`f` AS STRING) <=> CAST(s.`f` AS STRING)) AND (to_json(t.`arr`) <=> to_json(s.`arr`))"
    )


def test_verify_compares_a_keyless_table_by_count():
    """``pgcdc verify`` on a table without a key: equal rows match by count."""
    import pyarrow as pa

    from airflow_pgcdc.protocol.pgtypes import BUILTIN_BY_NAME, PgColumn
    from airflow_pgcdc.verify import compare_tables

    cols = [PgColumn("a", BUILTIN_BY_NAME["int4"]), PgColumn("f", BUILTIN_BY_NAME["float8"])]
    pg = pa.table({"a": pa.array([1, 1, None, 2], pa.int32()), "f": pa.array([0.0, 0.0, None, -0.0])})
    assert compare_tables(pg, pg, columns=cols, key=(), multiset=True).equal
    fewer = compare_tables(pg, pg.slice(1), columns=cols, key=(), multiset=True)
    assert (fewer.only_in_postgres, fewer.only_in_delta) == (1, 0)
    zero = pa.table({"a": pa.array([1, 1, None, 2], pa.int32()), "f": pa.array([0.0, 0.0, None, 0.0])})
    other = compare_tables(pg, zero, columns=cols, key=(), multiset=True)  # -0 is not 0
    assert (other.only_in_postgres, other.only_in_delta) == (1, 1) and not other.equal
