"""merge/columns.py: columns followed by ``attnum`` across relation versions (pure)."""

from __future__ import annotations

from airflow_pgcdc.merge.columns import ColumnId, ColumnState, follow, version_state


def rv(*cols, relfilenode=100):
    """A relation version dict: ``cols`` are ``(name, attnum, xmin)`` (attnum None: unrecorded)."""
    out = {"version": 0, "columns": []}
    for name, attnum, xmin in cols:
        c = {"name": name, "pg_type": "integer", "key": name == "id"}
        if attnum is not None:
            c |= {"attnum": attnum, "attxmin": xmin}
        out["columns"].append(c)
    if relfilenode:
        out["relfilenode"] = relfilenode
    return out


BASE = version_state(rv(("id", 1, "700"), ("a", 2, "700"), ("v", 3, "700")), "window 4")
DELTA = ["id", "a", "v"]


def test_the_same_columns_and_a_new_one_pass():
    assert follow(BASE, DELTA, [("window 5", rv(("id", 1, "700"), ("a", 2, "700"), ("v", 3, "700")))]) is None
    assert follow(BASE, DELTA, [("window 5", rv(("id", 1, "700"), ("a", 2, "700"), ("v", 3, "700"),
                                                ("n", 5, "800")))]) is None


def test_a_rename_is_refused_naming_both_names():
    r = follow(BASE, DELTA, [("window 5", rv(("id", 1, "700"), ("a", 2, "700"), ("title", 3, "800")))])
    assert r is not None and r.kind == "renamed" and r.old_name == "v" and r.column == "title"
    assert "'v' was renamed to 'title'" in r.message and "window 4" in r.message


def test_a_rename_inside_the_batch_is_refused():
    r = follow(None, DELTA, [
        ("window 5", rv(("id", 1, "700"), ("a", 2, "700"), ("v", 3, "700"))),
        ("window 5", rv(("id", 1, "700"), ("a", 2, "700"), ("w", 3, "800"))),
    ])
    assert r is not None and r.kind == "renamed"


def test_a_column_dropped_and_added_again_is_refused():
    r = follow(BASE, DELTA, [("window 5", rv(("id", 1, "700"), ("a", 2, "700"), ("v", 4, "800")))])
    assert r is not None and r.kind == "readded" and r.column == "v"


def test_a_column_the_delta_table_kept_after_a_drop_coming_back_is_refused():
    base = version_state(rv(("id", 1, "700"), ("a", 2, "700")), "window 4")  # v dropped before window 4
    r = follow(base, DELTA, [("window 5", rv(("id", 1, "700"), ("a", 2, "700"), ("v", 4, "800")))])
    assert r is not None and r.kind == "readded" and "dropped since" in r.message
    # a new name the Delta table lacks is just a new column
    assert follow(base, DELTA, [("window 5", rv(("id", 1, "700"), ("a", 2, "700"), ("w", 4, "800")))]) is None


def test_an_altered_column_in_a_rewritten_table_is_refused_but_each_alone_passes():
    altered = rv(("id", 1, "700"), ("a", 2, "900"), ("v", 3, "700"), relfilenode=101)
    r = follow(BASE, DELTA, [("window 5", altered)])
    assert r is not None and r.kind == "rewritten" and r.column == "a" and "100 -> 101" in r.message
    retyped = rv(("id", 1, "700"), ("a", 2, "900"), ("v", 3, "700"), relfilenode=101)
    retyped["columns"][1]["pg_type"] = "bigint"
    assert "its type from integer to bigint" in follow(BASE, DELTA, [("window 5", retyped)]).message
    # VACUUM FULL alone: a new file, no column row written
    assert follow(BASE, DELTA, [("window 5", rv(("id", 1, "700"), ("a", 2, "700"), ("v", 3, "700"),
                                                relfilenode=101))]) is None
    # varchar(10) -> varchar(20) without USING: the column row written, the same file
    assert follow(BASE, DELTA, [("window 5", rv(("id", 1, "700"), ("a", 2, "900"), ("v", 3, "700")))]) is None


def test_versions_without_identities_are_compared_on_what_they_have():
    old = rv(("id", None, None), ("a", None, None), ("v", None, None), relfilenode=None)
    assert follow(BASE, DELTA, [("window 5", old)]) is None
    # no baseline with identities: the first version becomes the baseline, later ones compared to it
    unknown = ColumnState({"id": ColumnId(None, None), "a": ColumnId(None, None)}, None, "the copy")
    assert follow(unknown, DELTA, [("window 5", rv(("id", 1, "7"), ("a", 2, "7")))]) is None
    r = follow(unknown, DELTA, [("window 5", rv(("id", 1, "7"), ("a", 2, "7"))),
                                ("window 6", rv(("id", 1, "7"), ("b", 2, "8")))])
    assert r is not None and r.kind == "renamed" and r.old_name == "a"
