"""``pgcdc status --prometheus``: the status document in Prometheus' text format, parsed back
line by line (names, labels with odd table names escaped, values; absent figures left out)."""

from __future__ import annotations

import re

from airflow_pgcdc.status.prometheus import prometheus_text

SAMPLE = re.compile(r'^(?P<name>[a-z_]+)\{(?P<labels>(?:[a-z]+="(?:[^"\\]|\\.)*",?)+)\} (?P<value>\S+)$')


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) [a-z_]+ ", line), line
            continue
        m = SAMPLE.match(line)
        assert m, line
        labels = tuple(re.findall(r'([a-z]+)="((?:[^"\\]|\\.)*)"', m["labels"]))
        out[(m["name"], labels)] = float(m["value"])
    return out


def test_a_status_becomes_gauges_per_slot_and_table():
    status = {
        "slot": {"slot": "sales", "pending_bytes": 4096, "retained_bytes": 1 << 20, "active": False},
        "problem": None,
        "store": {"windows_committed": 7, "windows_not_merged": 2, "freshness": {
            "lag_seconds": 12.5, "wal_wait_seconds": None, "lag_known": False,
            "tables": {"public.orders": {"lag_seconds": 12.5, "merged_through": 4},
                       'sales."Odd"\nName': {"lag_seconds": 0.0, "merged_through": None}}}},
    }
    got = _samples(prometheus_text(status))
    slot = (("slot", "sales"),)
    assert got[("pgcdc_slot_pending_bytes", slot)] == 4096 and got[("pgcdc_slot_active", slot)] == 0
    assert got[("pgcdc_windows_not_merged", slot)] == 2 and got[("pgcdc_lag_seconds", slot)] == 12.5
    assert got[("pgcdc_table_lag_seconds", slot + (("table", "public.orders"),))] == 12.5
    assert got[("pgcdc_table_lag_seconds", slot + (("table", 'sales.\\"Odd\\"\\nName'),))] == 0.0
    assert got[("pgcdc_table_merged_window", slot + (("table", "public.orders"),))] == 4
    assert ("pgcdc_wal_wait_seconds", slot) not in got  # unknown: left out, not 0
    assert got[("pgcdc_slot_problem", slot)] == 0


def test_a_slot_alone_has_its_own_gauges_and_a_problem_is_one():
    got = _samples(prometheus_text({"slot": {"slot": "s", "pending_bytes": 0}, "problem": {"error": "slot_lost"}}))
    assert got == {("pgcdc_slot_pending_bytes", (("slot", "s"),)): 0, ("pgcdc_slot_problem", (("slot", "s"),)): 1}
