"""Pure parts of the merge: window selection, table plans, merge clauses, TOAST typing."""

from __future__ import annotations

import pickle

import pytest

from airflow_pgcdc.lake.sql import quote_ident
from airflow_pgcdc.lake.tables import (
    app_id,
    delta_table_url,
    legacy_delta_table_url,
    shared_legacy_places,
)
from airflow_pgcdc.merge.clauses import build_merge_spec, keep_column
from airflow_pgcdc.merge.compact import toastable
from airflow_pgcdc.merge.errors import (
    KeyNotCovered,
    MergeError,
    NoMergeKey,
    WindowGap,
    WindowOrderError,
)
from airflow_pgcdc.merge.plan import plan_table, select_windows
from airflow_pgcdc.store.window import WindowManifest


def win(seq, start, end, tables=(), truncates=()):
    return WindowManifest(slot="s", window_seq=seq, start_lsn=start, end_lsn=end, end_reason="until_lsn",
                          tables=tuple(tables), truncates=tuple(truncates))


def chain(n, first="0/100"):
    out, start = [], int(first.split("/")[1], 16)
    for i in range(n):
        out.append(win(i, f"0/{start + 0x100 * i:X}", f"0/{start + 0x100 * (i + 1):X}"))
    return out


def rv(version=0, cols=(("id", True), ("v", False)), ri="d", parts=("v0000-part-00000.parquet",), rows=3):
    return {
        "version": version, "relation_oid": 1, "replica_identity": ri,
        "columns": [{"name": n, "pg_type": "int4" if n == "id" else "text", "key": k} for n, k in cols],
        "old_columns": ["_pgcdc_old_id"], "rows": rows, "parts": [{"path": p, "rows": rows, "bytes": 1} for p in parts],
    }


def table(*versions, schema="public", name="t"):
    return {"schema": schema, "table": name, "rows": 0, "bytes": 0, "relation_versions": list(versions)}


# ----------------------------------------------------------------- select_windows


def test_select_from_start_and_after_a_merged_window():
    ws = chain(4)
    assert [m.window_seq for m in select_windows(ws, after=None, consistent_point="0/100")] == [0, 1, 2, 3]
    assert [m.window_seq for m in select_windows(ws, after=1)] == [2, 3]
    assert select_windows(ws, after=3) == []
    assert [m.window_seq for m in select_windows(list(reversed(ws)), after=None, limit=2)] == [0, 1]


def test_a_gap_is_refused_never_skipped():
    ws = chain(4)
    del ws[2]
    with pytest.raises(WindowGap, match="window 2 is not committed but window 3 is"):
        select_windows(ws, after=None)
    with pytest.raises(WindowGap):
        select_windows(ws, after=1)
    # a gap beyond the limit is not this batch's business
    assert [m.window_seq for m in select_windows(ws, after=None, limit=2)] == [0, 1]


def test_windows_must_tile_and_start_at_the_consistent_point():
    ws = chain(3)
    with pytest.raises(WindowOrderError, match="consistent point is 0/FF"):
        select_windows(ws, after=None, consistent_point="0/FF")
    bad = [ws[0], win(1, "0/250", "0/300")]
    with pytest.raises(WindowOrderError, match="window 1 starts at 0/250 but window 0's end is 0/200"):
        select_windows(bad, after=None)


# ----------------------------------------------------------------- plan_table


def test_plan_collects_parts_versions_and_the_last_truncate():
    w0 = win(0, "0/100", "0/200", tables=[table(rv(0), rv(1, parts=("v0001-part-00000.parquet", "v0001-part-00001.parquet")))],
             truncates=[{"seq": 4, "commit_lsn": "0/150", "tables": ["public.t"]}])
    w1 = win(1, "0/200", "0/300", tables=[table(rv(0), name="other")],
             truncates=[{"seq": 1, "commit_lsn": "0/250", "tables": ["public.t", "public.other"]},
                        {"seq": 0, "commit_lsn": "0/240", "tables": ["public.other"]}])
    plan = plan_table([w0, w1], schema="public", table="t", key_columns=["id"], window_prefix=lambda s: f"w{s}/t/")
    assert plan.parts == ["w0/t/v0000-part-00000.parquet", "w0/t/v0001-part-00000.parquet", "w0/t/v0001-part-00001.parquet"]
    assert plan.rows == 6 and plan.truncates == 2
    assert plan.truncate_at == (0x250, 1)
    assert (plan.first_window, plan.last_window, plan.start_lsn, plan.end_lsn) == (0, 1, "0/100", "0/300")
    assert plan.has_work
    empty = plan_table([w1], schema="public", table="t", key_columns=["id"], window_prefix=lambda s: "")
    assert empty.parts == [] and empty.has_work, "a truncate alone is work"
    none = plan_table([win(2, "0/300", "0/400")], schema="public", table="t", key_columns=["id"], window_prefix=str)
    assert not none.has_work


def test_plan_after_a_resync_skips_the_truncates_in_the_copy():
    """A resync copied the table at 0/245: the truncate at 0/150 is in the copy (applying it
    again would delete the copy's rows), the one at 0/250 is after it."""
    w0 = win(0, "0/100", "0/200", tables=[table(rv(0))], truncates=[{"seq": 4, "commit_lsn": "0/150", "tables": ["public.t"]}])
    w1 = win(1, "0/200", "0/300", truncates=[{"seq": 1, "commit_lsn": "0/250", "tables": ["public.t"]}])
    plan = plan_table([w0, w1], schema="public", table="t", key_columns=["id"], window_prefix=str, since_lsn=0x245)
    assert (plan.truncate_at, plan.truncates, plan.since_lsn) == ((0x250, 1), 1, 0x245)
    only = plan_table([w0], schema="public", table="t", key_columns=["id"], window_prefix=str, since_lsn=0x245)
    assert only.truncate_at is None and only.truncates == 0 and only.rows == 3, "rows are filtered when read"


def test_plan_needs_a_key_covered_by_the_replica_identity():
    w = win(0, "0/1", "0/2", tables=[table(rv(cols=(("id", False), ("v", True))))])
    with pytest.raises(KeyNotCovered, match=r"does not include the merge key column\(s\) \['id'\]") as e:
        plan_table([w], schema="public", table="t", key_columns=["id"], window_prefix=str)
    assert e.value.hint.startswith('ALTER TABLE "public"."t" REPLICA IDENTITY FULL'), e.value.hint
    full = win(0, "0/1", "0/2", tables=[table(rv(cols=(("id", False), ("v", False)), ri="f"))])
    assert plan_table([full], schema="public", table="t", key_columns=["id"], window_prefix=str).rows == 3
    with pytest.raises(NoMergeKey):
        plan_table([full], schema="public", table="t", key_columns=[], window_prefix=str)


def test_errors_keep_their_hint_across_pickling():
    e = pickle.loads(pickle.dumps(MergeError("boom", hint="do this")))
    assert str(e) == "boom" and e.hint == "do this"


def test_names():
    assert app_id("slot1", "public", "t") == "pgcdc:slot1:public.t"
    # the segment's escapes with ~ (URL decoding leaves them): one key per table
    assert delta_table_url("s3://b/lake/", "my.schema", "a/b") == "s3://b/lake/my~2Eschema.a~2Fb"
    assert delta_table_url("s3://b/lake/", "t~1", "50%") == "s3://b/lake/t~7E1.50~25"
    assert legacy_delta_table_url("s3://b/lake/", "my.schema", "a/b") == "s3://b/lake/my%2Eschema.a%2Fb"
    assert delta_table_url("s3://b/lake", "public", "t") == legacy_delta_table_url("s3://b/lake", "public", "t")
    assert shared_legacy_places([("a.b", "c"), ("a", "b.c"), ("a", "b"), ("public", "t")]) == {
        ("a.b", "c"), ("a", "b.c")}


# ----------------------------------------------------------------- clauses


def test_quote_ident_per_dialect():
    assert quote_ident('we"ird col', "delta-rs") == '"we""ird col"'
    assert quote_ident("we`ird", "spark") == "`we``ird`"
    with pytest.raises(ValueError):
        quote_ident("x", "mysql")


def test_merge_spec_clauses():
    spec = build_merge_spec(target_columns=["id", "v", "big", "dropped"], source_columns=["id", "v", "big"],
                            key_columns=["id"], keep_columns=["big"])
    assert spec.predicate == 't."id" = s."id"'
    assert spec.delete_when == "s.\"_pgcdc_op\" = 'D'" and spec.update_when == "s.\"_pgcdc_op\" <> 'D'"
    assert spec.updates == {
        '"id"': 's."id"', '"v"': 's."v"',
        '"big"': f'CASE WHEN s."{keep_column("big")}" THEN t."big" ELSE s."big" END',
        '"dropped"': "NULL",
    }
    assert spec.inserts == {'"id"': 's."id"', '"v"': 's."v"', '"big"': 's."big"'}
    assert not spec.delete_not_matched_by_source


def test_merge_spec_after_truncate_and_in_spark_dialect():
    spec = build_merge_spec(target_columns=["a", "b", "v"], source_columns=["a", "b", "v"], key_columns=["a", "b"],
                            keep_columns=["v"], truncated=True, dialect="spark")
    assert spec.predicate == "t.`a` = s.`a` AND t.`b` = s.`b`"
    assert spec.updates["`v`"] == "s.`v`", "after a truncate the target's values are gone"
    assert spec.delete_not_matched_by_source


def test_a_soft_deleting_spec_marks_instead_of_deleting_and_a_truncate_marks_the_rest():
    from airflow_pgcdc.merge.sinks.deltaspark import merge_sql

    target = ["id", "v", "_pgcdc_op", "_pgcdc_commit_lsn", "_pgcdc_commit_ts", "_pgcdc_merged_at",
              "_pgcdc_deleted_at"]
    source = ["id", "v", "_pgcdc_commit_ts", "_pgcdc_op", "_pgcdc_commit_lsn", "_pgcdc_merged_at"]
    spec = build_merge_spec(target_columns=target, source_columns=source, key_columns=["id"], soft_delete=True)
    assert spec.delete_updates == {'"_pgcdc_deleted_at"': 's."_pgcdc_commit_ts"', '"_pgcdc_op"': 's."_pgcdc_op"',
                                   '"_pgcdc_commit_lsn"': 's."_pgcdc_commit_lsn"',
                                   '"_pgcdc_commit_ts"': 's."_pgcdc_commit_ts"',
                                   '"_pgcdc_merged_at"': 's."_pgcdc_merged_at"'}
    assert spec.updates['"_pgcdc_deleted_at"'] == "NULL", "an update or insert of the key revives the row"
    assert '"_pgcdc_deleted_at"' not in spec.inserts and spec.not_matched_by_source_updates is None
    whole = build_merge_spec(target_columns=target, source_columns=source, key_columns=["id"], soft_delete=True,
                             delete_values=True)
    assert whole.delete_updates['"v"'] == 's."v"' and '"id"' not in whole.delete_updates
    cut = build_merge_spec(target_columns=target, source_columns=source, key_columns=["id"], soft_delete=True,
                           truncated=True, truncate_time="2026-11-29T06:00:00.000000Z", dialect="spark")
    assert not cut.delete_not_matched_by_source
    assert cut.not_matched_by_source_updates == {"`_pgcdc_deleted_at`": "CAST('2026-11-29T06:00:00.000000Z' AS TIMESTAMP)"}
    assert cut.not_matched_by_source_when == "t.`_pgcdc_deleted_at` IS NULL"
    text = merge_sql(cut, "delta.`x`", "v")
    assert "THEN DELETE" not in text and "WHEN MATCHED AND s.`_pgcdc_op` = 'D' THEN UPDATE SET" in text
    assert text.endswith("WHEN NOT MATCHED BY SOURCE AND t.`_pgcdc_deleted_at` IS NULL THEN UPDATE SET "
                         "`_pgcdc_deleted_at` = CAST('2026-11-29T06:00:00.000000Z' AS TIMESTAMP)")
    with pytest.raises(ValueError, match="truncate's commit time"):
        build_merge_spec(target_columns=target, source_columns=source, key_columns=["id"], soft_delete=True,
                         truncated=True)
    with pytest.raises(ValueError, match="_pgcdc_commit_ts"):
        build_merge_spec(target_columns=target, source_columns=["id", "v"], key_columns=["id"], soft_delete=True)


def test_a_truncate_mark_is_its_commit_time_in_utc_or_the_merge_s():
    from datetime import UTC, datetime

    from airflow_pgcdc.merge.metadata import truncate_mark

    assert truncate_mark("2026-11-29T08:00:00.5+02:00", datetime.now(UTC)) == "2026-11-29T06:00:00.500000Z"
    assert truncate_mark(None, datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)) == "2026-01-02T03:04:05.000000Z"


def test_merge_spec_rejects_bad_input():
    with pytest.raises(ValueError, match="at least one key"):
        build_merge_spec(target_columns=["a"], source_columns=["a"], key_columns=[])
    with pytest.raises(ValueError, match="missing"):
        build_merge_spec(target_columns=["a"], source_columns=["b"], key_columns=["a"])
    with pytest.raises(ValueError, match="keep flags"):
        build_merge_spec(target_columns=["a", "x"], source_columns=["a"], key_columns=["a"], keep_columns=["x"])


@pytest.mark.parametrize("pg_type,expected", [
    ("int4", False), ("integer", False), ("timestamptz(3)", False), ("timestamp(3) with time zone", False),
    ("uuid", False), ('"char"', False), ("interval", False), ("bool", False),
    ("text", True), ("varchar(10)", True), ("character(5)", True), ("bpchar(5)", True), ("numeric(12,2)", True),
    ("jsonb", True), ("bytea", True), ("int4[]", True), ("integer[]", True), ("public.mood", True),
])
def test_toastable(pg_type, expected):
    assert toastable(pg_type) is expected


def test_merge_tables_are_parsed_as_everywhere_else():
    """--tables for merge and maintain was exact text while snapshot, resync and verify parse
    names (quotes for case and dots, unquoted lower-cased): one parser now."""
    from airflow_pgcdc.merge.windows import _select_tables

    names = dict.fromkeys([("public", "Orders"), ("a.b", "c"), ("a", "b.c"), ("public", "t")])
    assert _select_tables(names, ['public."Orders"', '"a.b".c', 'a."b.c"', "t"]) == [
        ("public", "Orders"), ("a.b", "c"), ("a", "b.c"), ("public", "t")]
    with pytest.raises(MergeError, match="public.orders"):
        _select_tables(names, ["public.Orders"])


def test_a_type_change_names_the_table_quoted_in_its_hint():
    """The hint of a column type the Delta table cannot follow quotes the table as one shell
    word, as every other hint does (it printed ``--tables my.schema.T`` unquoted)."""
    import pyarrow as pa

    from airflow_pgcdc.merge.errors import IncompatibleSchemaChange
    from airflow_pgcdc.merge.plan import TablePlan
    from airflow_pgcdc.merge.schema import _check_target

    plan = TablePlan(schema="my.schema", table="T", key_columns=("id",), first_window=0, last_window=0,
                     start_lsn="0/0", end_lsn="0/1")
    target = pa.schema([pa.field("id", pa.int32()), pa.field("v", pa.int32())])
    with pytest.raises(IncompatibleSchemaChange) as e:
        _check_target(plan, target, [pa.field("id", pa.int32()), pa.field("v", pa.string())])
    assert "pgcdc resync --tables '\"my.schema\".\"T\"'" in e.value.hint, e.value.hint


# ----------------------------------------------------------------- replay to a point


def test_a_plan_until_a_point_cuts_its_last_window_and_records_the_cut():
    from airflow_pgcdc.lake.tables import cut_app

    trunc = [{"seq": 1, "commit_lsn": "0/240", "tables": ["public.t"]},
             {"seq": 5, "commit_lsn": "0/2A0", "tables": ["public.t"]}]
    w0, w1 = win(0, "0/100", "0/200", [table(rv())]), win(1, "0/200", "0/300", [table(rv())], trunc)
    plan = plan_table([w0, w1], schema="public", table="t", key_columns=["id"], window_prefix=str,
                      until_lsn=0x250)
    assert (plan.until_lsn, plan.cut_window, plan.commit_version) == (0x250, 1, 0)
    assert plan.truncate_at == (0x240, 1) and plan.truncates == 1, "the truncate after the point is left out"
    app = app_id("s", "public", "t")
    assert plan.cut_transactions(app) == {cut_app(app, 1): 0x250} == {f"{app}:until-w1": 0x250}
    # a cut inside window 0: no window whole
    first = plan_table([w0], schema="public", table="t", key_columns=["id"], window_prefix=str, until_lsn=0x150)
    assert (first.cut_window, first.commit_version) == (0, -1)
    # a point at the last window's last byte holds it whole: no cut
    whole = plan_table([w0], schema="public", table="t", key_columns=["id"], window_prefix=str, until_lsn=0x1FF)
    assert (whole.cut_window, whole.commit_version, whole.cut_transactions(app)) == (None, 0, {})
    plain = plan_table([w0, w1], schema="public", table="t", key_columns=["id"], window_prefix=str)
    assert (plain.cut_window, plain.commit_version, plain.truncates) == (None, 1, 2)


def test_past_the_point_compares_the_table_with_the_point():
    from airflow_pgcdc.merge.point import Point, past_the_point

    p = Point(lsn=0x250, window=1, asked="LSN 0/250")
    assert past_the_point(p, None, None, None) is None  # only copied
    assert past_the_point(p, None, 0, None) is None  # window 0 whole
    assert past_the_point(p, None, 0, 0x230) is None  # window 1 up to an earlier point
    assert past_the_point(p, None, 0, 0x250) == "at"
    assert "up to 0/260" in past_the_point(p, None, 0, 0x260)
    assert "holds window 1 whole" in past_the_point(p, None, 1, None)
    assert "copied again" in past_the_point(p, 0x251, None, None)
    assert past_the_point(p, 0x250, None, None) is None  # a resync at the point itself
    assert past_the_point(Point(lsn=0x150, window=0, asked=""), None, None, 0x150) == "at"


def test_until_time_is_iso_8601_and_utc_without_an_offset():
    from datetime import UTC, datetime, timedelta, timezone

    from airflow_pgcdc.merge.errors import PointError
    from airflow_pgcdc.merge.point import parse_until_time

    assert parse_until_time("2026-11-29 06:00:00") == datetime(2026, 11, 29, 6, tzinfo=UTC)
    assert parse_until_time("2026-11-29T07:00:00+01:00") == datetime(2026, 11, 29, 7,
                                                                      tzinfo=timezone(timedelta(hours=1)))
    with pytest.raises(PointError, match="is not an ISO 8601 time"):
        parse_until_time("last tuesday")
