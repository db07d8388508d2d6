"""The package root is the public surface: the library calls resolve from it, lazily (a
bare ``import airflow_pgcdc`` loads neither pyarrow nor psycopg, so the CLI and Spark
executors stay light), and nothing but the public modules sits beside ``__init__``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import airflow_pgcdc


def test_library_calls_resolve_from_the_root():
    for name in airflow_pgcdc.__all__:
        fn = getattr(airflow_pgcdc, name)
        assert callable(fn) and fn.__name__ == name, name


def test_import_is_light():
    code = "import sys, airflow_pgcdc; print(sorted(m for m in ('pyarrow', 'psycopg', 'deltalake', 'pyspark') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_root_holds_only_the_public_modules():
    root = Path(airflow_pgcdc.__file__).parent
    assert sorted(p.name for p in root.glob("*.py")) == ["__init__.py", "errors.py", "faults.py", "options.py", "provider.py"]
