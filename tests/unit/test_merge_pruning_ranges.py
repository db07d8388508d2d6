"""The merge's target bound and file sizing (airflow_pgcdc.merge.pruning), no server."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_pgcdc.lake.sizing import target_bytes
from airflow_pgcdc.merge import pruning
from airflow_pgcdc.merge.clauses import build_merge_spec


def test_key_ranges_split_at_the_widest_gaps():
    assert pruning.key_ranges([]) == []
    assert pruning.key_ranges([3, 1, 3]) == [(1, 1), (3, 3)]
    assert pruning.key_ranges([5, 1, 2, 3, 100, 101, 1000], 3) == [(1, 5), (100, 101), (1000, 1000)]
    keys = list(range(1000)) + [10**9] + list(range(5000, 5100))
    got = pruning.key_ranges(keys, 4)
    assert len(got) <= 4 and (10**9, 10**9) in got
    assert all(any(lo <= k <= hi for lo, hi in got) for k in keys)


def test_bounds_predicate_quotes_the_column_per_dialect():
    assert pruning.bounds_predicate("id", [], "spark") is None
    rs = pruning.bounds_predicate('i"d', [(1, 3), (7, 7)], "delta-rs")
    assert rs == '((t."i""d" >= 1 AND t."i""d" <= 3) OR t."i""d" = 7)'
    sp = pruning.bounds_predicate("i`d", [(-5, 2)], "spark")
    assert sp == "((t.`i``d` >= -5 AND t.`i``d` <= 2))"


def test_bounded_spec_keeps_the_key_equality():
    spec = build_merge_spec(target_columns=["id", "v"], source_columns=["id", "v"], key_columns=["id"])
    out = pruning.bounded(spec, pruning.bounds_predicate("id", [(1, 2)], "delta-rs"))
    assert out.predicate == 't."id" = s."id" AND ((t."id" >= 1 AND t."id" <= 2))'
    assert pruning.bounded(spec, None) is spec


def test_only_one_integer_key_is_bounded():
    types = {"id": pa.int64(), "s": pa.string(), "n": pa.int32()}
    assert pruning.prunable_key(["id"], types) == "id"
    assert pruning.prunable_key(["s"], types) is None
    assert pruning.prunable_key(["id", "n"], types) is None


def test_file_count_and_target_bytes():
    assert pruning.file_count(0, 32) == 1
    assert pruning.file_count(10 * 2**20, 32) == 1
    assert pruning.file_count(100 * 2**20, 32) == 4
    assert target_bytes(0.5) == 2**19
    with pytest.raises(ValueError):
        target_bytes(0)


def test_the_partitions_of_a_batch_bound_the_target():
    import datetime

    import pyarrow as pa

    from airflow_pgcdc.merge.pruning import partition_values, partitions_predicate

    rows = pa.table({"id": [1, 2, 3], "day": [datetime.date(2026, 11, 2)] * 2 + [datetime.date(2026, 11, 9)],
                     "region": ["eu", "o'hare", "eu"], "f": [1.5, 2.5, 1.5]})
    fields = {f.name: f for f in rows.schema}
    values = partition_values(rows, ["day", "region"])
    assert values == {"day": [datetime.date(2026, 11, 2), datetime.date(2026, 11, 9)], "region": ["eu", "o'hare"]}
    assert partitions_predicate(values, fields, "delta-rs") == (
        "(t.\"day\" IN (CAST('2026-11-02' AS DATE), CAST('2026-11-09' AS DATE)) AND t.\"region\" IN ('eu', 'o''hare'))")
    assert partitions_predicate({"id": [3, 1]}, fields, "spark") == "(t.`id` IN (3, 1))"
    assert partitions_predicate({"region": ["o'hare"]}, fields, "spark") == "(t.`region` IN ('o\\'hare'))"
    # no bound when a type has no literal here, when there are too many, or when there is nothing
    assert partitions_predicate({"f": [1.5]}, fields, "delta-rs") is None
    assert partition_values(rows, ["id"], limit=2) is None
    assert partitions_predicate(None, fields, "spark") is None and partitions_predicate({}, fields, "spark") is None


def test_one_string_literal_function_per_dialect():
    from airflow_pgcdc.lake.sql import quote_literal

    assert quote_literal("it's", "delta-rs") == "'it''s'"
    assert quote_literal("it's \\ done", "spark") == "'it\\'s \\\\ done'"
    for bad in ("a\x00b", 5):
        with pytest.raises(ValueError, match="without NUL"):
            quote_literal(bad, "spark")
    with pytest.raises(ValueError, match="unknown SQL dialect"):
        quote_literal("x", "mysql")
