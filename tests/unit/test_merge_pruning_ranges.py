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
