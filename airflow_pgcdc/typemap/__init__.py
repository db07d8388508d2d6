"""PostgreSQL types → Arrow, shared by the snapshot and the drain.

* :mod:`.map`: the mapping (``TypeMap``, ``PgColumn``, ``arrow_field``), its errors and the
  session settings both readers use;
* :mod:`.arrays`: the Arrow builders every codec and decoder uses (imports nothing of the
  package);
* :mod:`.codec`, :mod:`.numeric`, :mod:`.text`, :mod:`.times`, :mod:`.pgarray`: one codec per
  type family;
* :mod:`.decode`: COPY text and binary output and pgoutput TupleData → Arrow batches.

This face re-exports :mod:`.map`'s names lazily (``from airflow_pgcdc.typemap import TypeMap``
keeps working); the package's own modules import from :mod:`.map` directly.
"""

from __future__ import annotations

import importlib
import importlib.util


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    # ``from airflow_pgcdc.typemap import arrays`` asks this hook first (hasattr): a submodule
    # must not pull in .map, which imports the codecs that are asking.
    if importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    value = getattr(importlib.import_module("airflow_pgcdc.typemap.map"), name)
    globals()[name] = value
    return value
