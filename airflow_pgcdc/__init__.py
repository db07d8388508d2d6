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

Their options objects (:class:`SnapshotOptions`, :class:`ResyncOptions`,
:class:`RecoverOptions`, :class:`BaseBackupOptions`, :class:`DrainOptions`,
:class:`MergeOptions`, :class:`MaintainOptions`), results (:class:`DrainResult`,
:class:`MergeResult`, :class:`TableResult`) and :class:`S3Settings` (every call's ``s3``)
are re-exported the same way.

Layers (imports point down only; ``tests/unit/test_import_graph.py`` pins the ranks,
``docs/design.md`` has the full map):

- ``errors``, ``faults`` — the exception hierarchy; the jobs' fault points (tests only);
- ``protocol/`` — sans-IO parsing and building of the replication protocols;
- ``pg/`` — connections, catalog, slots (psycopg's ``pq`` level);
- ``typemap/`` — the PostgreSQL → Arrow type map and the row decoders (COPY, TupleData)
  the snapshot and the drain share;
- ``changes/`` — a decoded change stream to Arrow change rows, column names;
- ``store/`` — the S3 contract (layout, manifests, Parquet parts);
- ``lake/`` — the Delta side every job shares (table URLs, app ids, read-only views), no Spark;
- ``snapshot/``, ``drain/``, ``merge/``, ``maintain/``, ``verify/``, ``status/`` — the jobs,
  side by side: no job imports another (but verify reads PostgreSQL as the snapshot does);
- ``cli/`` — the ``pgcdc`` command; ``hooks/``, ``operators/``, ``sensors/``,
  ``triggers/``, ``dags/``, ``provider.py`` — the Airflow provider (the only Airflow imports);
- ``testing/`` — the sandbox, the test bed's servers, the demo.
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
    "maintain_slot": "airflow_pgcdc.maintain.job",
    "verify_table": "airflow_pgcdc.verify.job",
    "slot_status": "airflow_pgcdc.status.job",
    "SnapshotOptions": "airflow_pgcdc.snapshot.options",
    "ResyncOptions": "airflow_pgcdc.snapshot.options",
    "RecoverOptions": "airflow_pgcdc.snapshot.options",
    "BaseBackupOptions": "airflow_pgcdc.snapshot.options",
    "DrainOptions": "airflow_pgcdc.drain.options",
    "DrainResult": "airflow_pgcdc.drain.options",
    "MergeOptions": "airflow_pgcdc.merge.options",
    "MergeResult": "airflow_pgcdc.merge.options",
    "TableResult": "airflow_pgcdc.merge.options",
    "MaintainOptions": "airflow_pgcdc.maintain.options",
    "S3Settings": "airflow_pgcdc.store.s3",
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
