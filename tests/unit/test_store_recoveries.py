"""The recovery record (``store/recoveries.py``) and the merge's gate after a recovery
(``merge/checks.py`` ``check_recovery_gap``): pure code, no server."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from airflow_pgcdc.merge.checks import check_recovery_gap
from airflow_pgcdc.merge.errors import RecoveryGap
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.store.layout import Layout
from airflow_pgcdc.store.recoveries import Recovery, RecoveryCopy, RecoveryRecordError, covering
from airflow_pgcdc.store.window import RESUMED_FIELD, WindowManifest


def _recovery(seq=3, end="0/100", copies=("0/300", "0/280"), rid="20260101T000000Z-aa") -> Recovery:
    return Recovery(
        slot="s", recovery_id=rid, cause="slot_missing", store_end_lsn=end, next_window_seq=seq,
        slot_position="0/200", slot_recreated=True,
        copies=tuple(RecoveryCopy(f"pgcdc_rs_{i}", f"snap{i}", c, "pub", (("public", f"t{i}"),))
                     for i, c in enumerate(copies)),
        created_at=f"2026-01-01T00:00:0{seq}+00:00", extra={"future": 1})


def test_a_record_reads_back_as_written_with_fields_it_does_not_know():
    r = _recovery()
    back = Recovery.from_dict(r.to_dict(), key="k")
    assert back == r and back.extra == {"future": 1}
    assert back.copied_from == LSN.parse("0/280") and back.tables == {("public", "t0"), ("public", "t1")}


@pytest.mark.parametrize("change, what", [
    ({"format": 2}, "format 2"),
    ({"cause": "bored"}, "cause 'bored'"),
    ({"next_window_seq": -1}, "next_window_seq"),
    ({"store_end_lsn": "nope"}, "nope"),
    ({"copies": []}, "at least one copy"),
])
def test_a_bad_record_names_the_key_and_the_field(change, what):
    doc = {**_recovery().to_dict(), **change}
    with pytest.raises(RecoveryRecordError, match=what) as e:
        Recovery.from_dict(doc, key="cdc/s/recovery/x.json")
    assert e.value.key == "cdc/s/recovery/x.json"
    doc = _recovery().to_dict()
    del doc["copies"]
    with pytest.raises(RecoveryRecordError, match="missing field 'copies'"):
        Recovery.from_dict(doc)


def test_covering_needs_the_same_store_end_and_a_slot_not_past_any_copy():
    old, new = _recovery(rid="20260101T000000Z-aa"), _recovery(rid="20260101T000001Z-bb", copies=("0/290",))
    recs = [old, new]
    at = {"store_end": LSN.parse("0/100"), "next_seq": 3}
    assert covering(recs, **at, confirmed=LSN.parse("0/200")) is new  # the newest that fits
    assert covering(recs, **at, confirmed=LSN.parse("0/280")) is new
    assert covering([old], **at, confirmed=LSN.parse("0/281")) is None  # past a copy: changes missing
    assert covering(recs, store_end=LSN.parse("0/101"), next_seq=3, confirmed=LSN.parse("0/200")) is None
    assert covering(recs, store_end=LSN.parse("0/100"), next_seq=4, confirmed=LSN.parse("0/200")) is None


def test_the_record_key_is_under_the_slot():
    layout = Layout.parse("s3://bkt/cdc")
    assert layout.recovery_record("s", "20260101T000000Z-aa") == "cdc/s/recovery/20260101T000000Z-aa.json"
    assert layout.recoveries_prefix("s") == "cdc/s/recovery/"


def _window(seq, resumed=None, pipeline=(("public", "a"), ("public", "b"))):
    return WindowManifest(slot="s", window_seq=seq, start_lsn="0/100", end_lsn="0/400", end_reason="until_lsn",
                          pipeline_tables=pipeline, extra={RESUMED_FIELD: resumed} if resumed else {})


def test_the_merge_refuses_a_table_not_copied_past_the_gap():
    ctx = SimpleNamespace(slot="s", layout=Layout.parse("s3://bkt/cdc"))
    gap = {"recovery": "r1", "cause": "slot_lost", "from_lsn": "0/100", "resumed_at": "0/200"}
    windows = [_window(2, gap), _window(3)]
    check_recovery_gap(ctx, "public", "a", [_window(3)], None)  # no gap in its windows
    check_recovery_gap(ctx, "public", "a", windows, int(LSN.parse("0/200")))  # copied at the resume point
    check_recovery_gap(ctx, "public", "gone", windows, None)  # left the pipeline before the gap
    for since in (None, int(LSN.parse("0/1ff"))):  # never copied again, or copied before the gap's end
        with pytest.raises(RecoveryGap, match="between 0/100 and 0/200") as e:
            check_recovery_gap(ctx, "public", "b", windows, since)
        assert "pgcdc resync" in e.value.hint and "'\"public\".\"b\"'" in e.value.hint
