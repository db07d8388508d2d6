"""The partition leaves a window records and how two records compare
(airflow_pgcdc/store/partitions.py, pure code)."""

from __future__ import annotations

from types import SimpleNamespace

from airflow_pgcdc.store.partitions import (
    Leaf,
    RootLeaves,
    changes_since_copy,
    changes_since_window,
    copied_leaves,
    window_partition_leaves,
)

EU = Leaf("public", "m_eu", 10, "700", False)
US = Leaf("public", "m_us", 11, "701", False)


def test_window_comparison_follows_oid_and_link():
    before = RootLeaves("public", "m", (EU, US))
    # unchanged, and a rename (same oid and link): no change
    assert changes_since_window([EU, US], before) == ((), ())
    assert changes_since_window([Leaf("public", "m_europe", 10, "700", True), US], before) == ((), ())
    # a partition created as one: no change; one attached after its creation: attached
    assert changes_since_window([EU, US, Leaf("public", "m_sa", 12, "800", False)], before) == ((), ())
    asia = Leaf("public", "m_asia", 13, "801", True)
    assert changes_since_window([EU, US, asia], before) == ((("public", "m_asia"),), ())
    # detached or dropped; detached and attached again (a new link)
    assert changes_since_window([EU], before) == ((), (("public", "m_us"),))
    again = Leaf("public", "m_us", 11, "900", True)
    assert changes_since_window([EU, again], before) == ((("public", "m_us"),), (("public", "m_us"),))


def test_copy_comparison_is_by_name():
    copied = {("public", "m_eu"), ("public", "m_us")}
    assert changes_since_copy([EU, US], copied) == ((), ())
    assert changes_since_copy([EU], copied) == ((), (("public", "m_us"),))
    assert changes_since_copy([EU, US, Leaf("public", "m_sa", 12, "800", False)], copied) == ((), ())
    assert changes_since_copy([EU, US, Leaf("public", "m_x", 12, "800", True)], copied) == (
        (("public", "m_x"),), ())


def test_records_round_trip_and_old_manifests_say_nothing():
    r = RootLeaves("s", "m.x", (EU,), attached=(("s", "a"),))
    d = r.to_dict()
    assert "detached" not in d and d["attached"] == [["s", "a"]]
    m = SimpleNamespace(extra={"partition_leaves": [d]})
    assert window_partition_leaves(m) == {("s", "m.x"): r} and r.changed
    assert window_partition_leaves(SimpleNamespace(extra={})) == {}
    assert copied_leaves(SimpleNamespace(extra={})) is None
    assert copied_leaves(SimpleNamespace(extra={"partitions": [["public", "m_eu"]]})) == {("public", "m_eu")}
