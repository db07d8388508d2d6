"""The merge chooses its Delta engine once (merge/sinks/engines.py: sink_class, then
JobContext.sink): no module of the merge compares an engine name itself, so a Delta feature
(a table property, metadata columns, a change feed) is added in the sinks, not in branches.
Read from the source, as the import-graph test does."""

from __future__ import annotations

import ast
from pathlib import Path

import airflow_pgcdc

MERGE = Path(airflow_pgcdc.__file__).parent / "merge"
ENGINE_NAMES = {"delta-rs", "delta-spark"}
# the sinks themselves; the session's jar choice, made before any job (from the CLI's words);
# the clauses, which compare the SQL dialect the sink hands them ("delta-rs" is also a dialect)
ALLOWED = {"sinks/engines.py", "session.py", "clauses.py"}


def _engine_comparisons(path: Path) -> list[int]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            names = {o.value for o in operands if isinstance(o, ast.Constant) and isinstance(o.value, str)}
            tuples = {e.value for o in operands if isinstance(o, ast.Tuple | ast.Set | ast.List) for e in o.elts
                      if isinstance(e, ast.Constant)}
            if (names | tuples) & ENGINE_NAMES:
                out.append(node.lineno)
    return out


def _branches() -> dict[str, list[int]]:
    found = {}
    for path in sorted(MERGE.rglob("*.py")):
        rel = path.relative_to(MERGE).as_posix()
        if rel not in ALLOWED and (lines := _engine_comparisons(path)):
            found[rel] = lines
    return found


def test_no_module_of_the_merge_branches_on_the_engine_name():
    assert _branches() == {}


def test_the_check_sees_a_branch(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('def f(ctx):\n    if ctx.engine == "delta-spark":\n        pass\n    return x in ("delta-rs",)\n')
    assert _engine_comparisons(probe) == [2, 4]


def test_table_properties_are_decided_by_the_sink_for_every_table_a_job_creates():
    """One place decides a new table's properties (DeltaSink.properties): deletion vectors
    only on the tables Delta's Spark engine creates for the pipeline when asked, never on a
    history table or a table delta-rs writes (an empty table at a first change, a resync's
    replacement); the statistics columns on every one."""
    import types

    import pyarrow as pa

    from airflow_pgcdc.merge.sinks.engines import DeltaRsSink, DeltaSparkSink

    fields = [pa.field("id", pa.int64()), pa.field("d", pa.date32())]  # a date column: left out of the stats
    ctx = types.SimpleNamespace(deletion_vectors=True)
    common = DeltaRsSink(ctx).properties(fields)
    assert common == {"delta.dataSkippingStatsColumns": "`id`"}
    spark = DeltaSparkSink(ctx)
    assert spark.properties(fields) == {**common, "delta.enableDeletionVectors": "true"}
    assert spark.properties(fields, by="history") == spark.properties(fields, by="delta-rs") == common
    assert DeltaSparkSink(types.SimpleNamespace(deletion_vectors=False)).properties(fields) == common
    assert all(DeltaRsSink(ctx).properties(fields, by=by) == common for by in ("sink", "history", "delta-rs"))
