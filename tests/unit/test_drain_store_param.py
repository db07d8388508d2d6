"""drain_window's store parameter: ``store`` (positional or keyword), its 0.1 name ``to``
for one release with a DeprecationWarning, both at once a TypeError."""

from __future__ import annotations

import warnings

import pytest

from airflow_pgcdc.drain import drain as drain_mod


class Reached(Exception):
    pass


@pytest.fixture
def seen(monkeypatch):
    """The store location drain_window resolved; it stops at the catalog connection."""
    got = []
    real = drain_mod.Layout

    def layout(location):
        got.append(location)
        return real(location)

    def connect(*a, **kw):
        raise Reached

    monkeypatch.setattr(drain_mod, "Layout", layout)
    monkeypatch.setattr(drain_mod.psycopg, "connect", connect)
    return got


KW = {"slot": "s1", "publications": "pub", "s3": object()}


@pytest.mark.parametrize("call", [
    lambda: drain_mod.drain_window("dbname=x", "s3://bkt/lake", **KW),
    lambda: drain_mod.drain_window("dbname=x", store="s3://bkt/lake", **KW),
])
def test_store_positional_or_keyword(seen, call):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no deprecation for the new name
        with pytest.raises(Reached):
            call()
    assert [str(x) for x in seen] == ["s3://bkt/lake"]


def test_to_still_works_with_a_deprecation_warning(seen):
    with pytest.warns(DeprecationWarning, match="store="), pytest.raises(Reached):
        drain_mod.drain_window("dbname=x", to="s3://bkt/lake", **KW)
    assert [str(x) for x in seen] == ["s3://bkt/lake"]


def test_store_and_to_together_is_a_type_error(seen):
    with pytest.raises(TypeError, match="both 'store' and its old name 'to'"):
        drain_mod.drain_window("dbname=x", "s3://bkt/lake", to="s3://bkt/other", **KW)
    assert seen == []


def test_no_store_is_a_type_error(seen):
    with pytest.raises(TypeError, match="store"):
        drain_mod.drain_window("dbname=x", **KW)


def test_options_are_collected_once():
    from airflow_pgcdc.drain.options import DrainOptions
    from airflow_pgcdc.store.window import DEFAULT_MEMORY_BUDGET

    o = DrainOptions(publications="pub", skip_origins=("a",), max_rows=5, forget_tables=['s."Odd.T"'],
                     as_text=["public.t=a,b"])
    assert o.max_rows == 5 and o.skip_origins == ("a",) and o.memory_budget == DEFAULT_MEMORY_BUDGET
    assert o.publications == ("pub",) and o.forget == {("s", "Odd.T")} and o.as_text == {("public", "t"): {"a", "b"}}
    assert DrainOptions.of(o.fields()) == o, "its fields give it back"
    with pytest.raises(AttributeError):
        o.max_rows = 6  # frozen
    with pytest.raises(TypeError, match="the drain has no option 'max_row'"):
        DrainOptions.of(max_row=5)


def test_drain_window_takes_options_or_their_fields_not_both(seen):
    from airflow_pgcdc.drain.options import DrainOptions

    with pytest.raises(TypeError, match="not both"):
        drain_mod.drain_window("dbname=x", "s3://bkt/lake", options=DrainOptions(max_rows=1), max_rows=2, **KW)
    with pytest.raises(TypeError, match="no option 'max_row'"):
        drain_mod.drain_window("dbname=x", "s3://bkt/lake", max_row=2, **KW)
    assert seen == []


def test_one_name_for_the_store_and_the_delta_root_in_every_call():
    """snapshot_to_s3, resync_tables and base_backup_to_s3 take ``store`` (``to``: their 0.1
    name), slot_status ``store``/``delta`` (``store_url``/``delta_url``), verify_table
    ``delta`` (``delta_url``): both names at once is a TypeError before any connection, the
    old name alone warns."""
    from airflow_pgcdc.snapshot.basebackup import base_backup_to_s3
    from airflow_pgcdc.snapshot.export import snapshot_to_s3
    from airflow_pgcdc.snapshot.resync import resync_tables
    from airflow_pgcdc.status.job import slot_status
    from airflow_pgcdc.verify import verify_table

    nowhere = "host=/nonexistent/socket dbname=x connect_timeout=1"
    with pytest.raises(TypeError, match="both 'store' and its old name 'to'"):
        snapshot_to_s3(nowhere, "s3://b/p", to="s3://b/q", slot="s", publications="p")
    with pytest.raises(TypeError, match="both 'store' and its old name 'to'"):
        resync_tables(nowhere, "s3://b/p", to="s3://b/q", slot="s", publications="p", tables=["t"])
    with pytest.raises(TypeError, match="both 'store' and its old name 'to'"):
        base_backup_to_s3(nowhere, "s3://b/p", to="s3://b/q")
    with pytest.raises(TypeError, match="both 'store' and its old name 'store_url'"):
        slot_status(nowhere, "s", store="s3://b/p", store_url="s3://b/q")
    with pytest.raises(TypeError, match="both 'delta' and its old name 'delta_url'"):
        verify_table(nowhere, "s3://b/l", "public", "t", delta_url="s3://b/m")
    with pytest.raises(TypeError, match="missing the Delta root"):
        verify_table(nowhere, schema="public", table="t")
    with pytest.warns(DeprecationWarning, match=r"slot_status\(delta_url=...\) is now slot_status\(delta=...\)"):
        with pytest.raises(Exception):  # noqa: B017 - the warning is the point; then it cannot connect
            slot_status(nowhere, "s", delta_url="s3://b/l")
