"""The package's import graph, read from the source (every ``import`` statement, those inside
functions too; not those under ``if TYPE_CHECKING:``, which never run): no cycles, and the layers of ``docs/design.md`` hold (Airflow is imported
only by the provider's folders; ``protocol/`` imports nothing but itself and the errors)."""

from __future__ import annotations

import ast
import gc
from pathlib import Path

import airflow_pgcdc

ROOT = Path(airflow_pgcdc.__file__).parent
PROVIDER = ("airflow_pgcdc.operators", "airflow_pgcdc.sensors", "airflow_pgcdc.triggers", "airflow_pgcdc.hooks",
            "airflow_pgcdc.provider", "airflow_pgcdc.dags")


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (annotations only: never run)."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and getattr(n.test, "id", None) == "TYPE_CHECKING":
            out.update(id(x) for stmt in n.body for x in ast.walk(stmt))
    return out


def _parse(text: str) -> ast.Module:
    """``ast.parse`` that a long test session cannot upset: CPython 3.11's AST constructor
    compares its recursion depth (limit minus remaining) before and after, and raised
    ``SystemError: AST constructor recursion depth mismatch`` once in the full suite, where
    Spark's and py4j's threads live in the same process. The tests below therefore read
    the graph in a fresh interpreter; the collector is off and a retry is allowed here too."""
    for attempt in range(3):
        enabled = gc.isenabled()
        gc.disable()
        try:
            return ast.parse(text)
        except SystemError:
            if attempt == 2:
                raise
        finally:
            if enabled:
                gc.enable()
    raise AssertionError("unreachable")


def _imports(path: Path) -> set[str]:
    names = set()
    tree = _parse(path.read_text())
    skip = _type_checking_only(tree)
    for n in ast.walk(tree):
        if id(n) in skip:
            continue
        if isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
            names.add(n.module)
            names.update(f"{n.module}.{a.name}" for a in n.names)
        elif isinstance(n, ast.Import):
            names.update(a.name for a in n.names)
    return names


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: {d for d in _imports(p) if d in mods and d != m} for m, p in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _fresh(expr: str):
    """``expr`` (over this module's functions) evaluated in a fresh interpreter, as JSON."""
    import json
    import subprocess
    import sys

    code = ("import json, runpy, sys; ns = runpy.run_path(sys.argv[1]); "
            f"print(json.dumps(eval({expr!r}, ns), default=sorted))")
    out = subprocess.run([sys.executable, "-c", code, __file__], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_no_import_cycles():
    assert _fresh("_cycles(_graph())") == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_airflow_only_in_the_provider_and_protocol_stands_alone():
    assert _fresh("_layer_violations()") == []


def _layer_violations() -> list[str]:
    out = []
    for module, path in _modules().items():
        imported = _imports(path)
        if not module.startswith(PROVIDER) and not module.startswith("airflow_pgcdc.testing"):
            if {i for i in imported if i == "airflow" or i.startswith("airflow.")}:
                out.append(f"{module} imports Airflow")
        if module.startswith("airflow_pgcdc.protocol"):
            ours = {i for i in imported if i.startswith("airflow_pgcdc")}
            if not all(i.startswith(("airflow_pgcdc.protocol", "airflow_pgcdc.errors")) for i in ours):
                out.append(f"{module} imports {sorted(ours)}")
    return out


# The layers, bottom to top: a module may import its own package and packages of a lower
# rank only. The jobs share one rank, so no job imports another; the one stated exception
# is verify reading PostgreSQL exactly as the snapshot does (verify -> snapshot.convert).
RANKS = {
    "errors": 0, "faults": 0, "options": 0,
    "protocol": 1,
    "pg": 2, "typemap": 2,
    "changes": 3,
    "store": 4,
    "lake": 5,
    "snapshot": 6, "drain": 6, "merge": 6, "maintain": 6, "verify": 6, "status": 6,
    "hooks": 7, "cli": 7,
    "triggers": 8, "operators": 8,
    "sensors": 9,
    "dags": 10, "provider": 10,
    "testing": 11,
}
ALLOWED = {
    ("airflow_pgcdc.verify.postgres", "airflow_pgcdc.snapshot.convert"),  # verify reads as the snapshot does
    ("airflow_pgcdc.cli.sandbox", "airflow_pgcdc.testing.sandbox"),  # `pgcdc sandbox` starts the test bed
    ("airflow_pgcdc.cli.sandbox", "airflow_pgcdc.testing.dagrun"),
}


def _floor(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(root)"


def _rank_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, deps in sorted(graph.items()):
        here = _floor(module)
        for dep in sorted(deps):
            there = _floor(dep)
            if there == here or there == "(root)" or (module, dep) in ALLOWED:
                continue
            if here not in RANKS or there not in RANKS:
                out.append(f"{module} -> {dep}: a package without a rank (add it to RANKS)")
            elif RANKS[there] >= RANKS[here]:
                out.append(f"{module} (rank {RANKS[here]}) imports {dep} (rank {RANKS[there]})")
    return out


def test_layers_import_only_downward_and_jobs_never_import_jobs():
    assert _fresh("_rank_violations(_graph())") == []


def test_the_rank_check_finds_a_job_importing_a_job_and_an_upward_import():
    graph = {
        "airflow_pgcdc.maintain.job": {"airflow_pgcdc.merge.plan", "airflow_pgcdc.lake.tables"},
        "airflow_pgcdc.drain.run": {"airflow_pgcdc.testing.faults"},
        "airflow_pgcdc.verify.postgres": {"airflow_pgcdc.snapshot.convert"},
        "airflow_pgcdc.novel.x": {"airflow_pgcdc.errors"},
    }
    assert _rank_violations(graph) == [
        "airflow_pgcdc.drain.run (rank 6) imports airflow_pgcdc.testing.faults (rank 11)",
        "airflow_pgcdc.maintain.job (rank 6) imports airflow_pgcdc.merge.plan (rank 6)",
        "airflow_pgcdc.novel.x -> airflow_pgcdc.errors: a package without a rank (add it to RANKS)",
    ]


def _type_only_cycles() -> list[set[str]]:
    """Cycles of the graph with the imports under ``if TYPE_CHECKING:`` counted too."""
    mods = _modules()
    graph = {}
    for m, p in mods.items():
        tree = _parse(p.read_text())
        names = set()
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
                names.add(n.module)
                names.update(f"{n.module}.{a.name}" for a in n.names)
            elif isinstance(n, ast.Import):
                names.update(a.name for a in n.names)
        graph[m] = {d for d in names if d in mods and d != m}
    return _cycles(graph)


def test_no_cycles_even_through_type_only_imports():
    assert _fresh("_type_only_cycles()") == []


_EACH_FIRST = r"""
import importlib, sys, traceback
failed = []
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m == "airflow_pgcdc" or m.startswith("airflow_pgcdc.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception:
        failed.append(name + ": " + traceback.format_exc().strip().splitlines()[-1])
print("\n".join(failed))
"""


def test_every_module_imports_when_it_is_the_first_one_imported():
    """A lazy package face (``typemap``'s ``__getattr__``) once answered ``from
    airflow_pgcdc.typemap import arrays`` by importing ``.map``, which imports the codec that
    was asking: ``import airflow_pgcdc.typemap.decode.copy_text`` as a process's first import
    failed, though every import order the suite used worked. Each module is imported here
    with no module of the package loaded before it."""
    import subprocess
    import sys

    names = sorted(n for n in _modules() if not n.endswith("__main__"))
    out = subprocess.run([sys.executable, "-c", _EACH_FIRST, *names], capture_output=True, text=True,
                         timeout=600, check=True).stdout.strip()
    assert out == "", out
