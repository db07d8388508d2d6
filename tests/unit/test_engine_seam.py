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
