"""The suite's own scheduling under pytest-xdist (``make test`` runs two workers with
``--dist loadgroup``): the tests of one ``xdist_group`` run on one worker, as the Spark
cluster module needs (two clusters at once on a 2-core machine doubled its tests' time and
sent one past its hang guard). Runs a small pytest of its own with ``tests/conftest.py``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("xdist", reason="pytest-xdist is in the dev extra; without it no worker is started")

_PROBE = '''
import os
import pytest

pytestmark = pytest.mark.xdist_group("together")


@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    import time

    time.sleep(0.2)  # long enough that an idle second worker would take some of them
    with open(os.environ["PROBE_OUT"], "a") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "none") + "\\n")


@pytest.mark.parametrize("i", range(6))
def test_free(i):
    pass
'''


def test_an_xdist_group_runs_on_one_worker(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(Path(__file__).parents[1] / "conftest.py", suite / "conftest.py")
    (suite / "test_probe.py").write_text(_PROBE)
    out = tmp_path / "workers.txt"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", "-q",
         "-rA", str(suite)],
        cwd=suite, capture_output=True, text=True, timeout=300, env={**os.environ, "PROBE_OUT": str(out)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    workers = out.read_text().split()
    assert len(workers) == 6 and workers[0].startswith("gw"), workers
    assert len(set(workers)) == 1, f"one xdist_group ran on several workers: {sorted(workers)}"
    assert "@together" in proc.stdout, "the group is in the reported node ids"


def test_test_module_basenames_are_unique():
    """The test folders are not packages (rootdir-based module names): two test files with
    one basename make pytest fail to collect the second (a whole CI run lost to
    tests/unit/test_dag_factory.py beside tests/integration/test_dag_factory.py)."""
    from collections import Counter
    from pathlib import Path

    tests = Path(__file__).resolve().parents[1]
    names = Counter(p.name for p in tests.rglob("test_*.py") if "__pycache__" not in p.parts)
    assert [n for n, c in names.items() if c > 1] == []
