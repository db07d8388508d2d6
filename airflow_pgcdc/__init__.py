"""airflow-pgcdc: PostgreSQL snapshot + logical changes into Delta Lake on S3.

The library calls a script or a notebook uses (each is also a ``pgcdc`` command and an
Airflow operator; they are imported on first use, so ``import airflow_pgcdc`` stays light):

- :func:`snapshot_to_s3` — create the slot with an exported snapshot and copy the tables;
- :func:`resync_tables` — copy some tables again while the pipeline runs;
- :func:`recover_pipeline` — after a lost slot: the slot again, every table copied into the
  existing Delta tables;
- :func:`base_backup_to_s3` — a physical ``BASE_BACKUP`` into S3;
- :func:`drain_window` — one window of logical changes into the store, then the ack;
- :func:`merge_slot` — bootstrap and merge the slot's windows into Delta tables (Spark);
- :func:`maintain_slot` — compaction, vacuum, checkpoints, expired windows;
- :func:`verify_table` — compare a Delta table with its PostgreSQL table;
- :func:`slot_status` — the slot's health and the pipeline's progress.

Layers (imports point down only; ``docs/design.md`` has the full map):

- ``errors`` — the exception hierarchy, imported by every layer;
- ``protocol/`` — sans-IO parsing and building of the replication protocols;
- ``pg/`` — connections, catalog, slots (psycopg's ``pq`` level);
- ``typemap/`` — the PostgreSQL → Arrow type map the snapshot and the drain share;
- ``changes/`` — decoded messages to Arrow change rows, column names;
- ``store/`` — the S3 contract (layout, manifests, Parquet parts);
- ``snapshot/``, ``drain/``, ``merge/``, ``maintain/``, ``verify/``, ``ops/`` — the jobs;
- ``cli/`` — the ``pgcdc`` command; ``hooks/``, ``operators/``, ``sensors/``,
  ``triggers/``, ``provider.py`` — the Airflow provider (the only Airflow imports);
- ``testing/`` — the sandbox, the test bed's servers, the demo, fault injection.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "snapshot_to_s3": "airflow_pgcdc.snapshot.export",
    "resync_tables": "airflow_pgcdc.snapshot.resync",
    "recover_pipeline": "airflow_pgcdc.snapshot.recover",
    "base_backup_to_s3": "airflow_pgcdc.snapshot.basebackup",
    "drain_window": "airflow_pgcdc.drain.drain",
    "merge_slot": "airflow_pgcdc.merge.job",
    "maintain_slot": "airflow_pgcdc.maintain",
    "verify_table": "airflow_pgcdc.verify",
    "slot_status": "airflow_pgcdc.status.job",
}

__all__ = sorted(_EXPORTS)


def package_version() -> str:
    """The installed distribution's version: ``pyproject.toml``'s, the one version the
    provider metadata, ``pgcdc --version`` and ``airflow_pgcdc.__version__`` show."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("airflow-pgcdc")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        return package_version()
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'airflow_pgcdc' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
