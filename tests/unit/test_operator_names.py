"""Every operator is named ``Pgcdc*``; the two that were not keep their old names for one
release, as subclasses that warn (a DAG written against 0.1 still parses and runs)."""

from __future__ import annotations

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning

from airflow_pgcdc.operators.basebackup import PgBaseBackupToS3Operator, PgcdcBaseBackupOperator
from airflow_pgcdc.operators.snapshot import PgcdcSnapshotOperator, PgSnapshotToS3Operator


def test_old_names_warn_and_build_the_new_operators():
    with pytest.warns(AirflowProviderDeprecationWarning, match="PgSnapshotToS3Operator is now PgcdcSnapshotOperator"):
        snap = PgSnapshotToS3Operator(task_id="snap", to="s3://b/p", slot="s", publication="pub", workers=2)
    assert isinstance(snap, PgcdcSnapshotOperator)
    assert (snap.to, snap.slot, snap.publication, snap.workers) == ("s3://b/p", "s", "pub", 2)
    with pytest.warns(AirflowProviderDeprecationWarning, match="PgBaseBackupToS3Operator is now PgcdcBaseBackupOperator"):
        backup = PgBaseBackupToS3Operator(task_id="bb", to="s3://b/backups", backup_id="b1")
    assert isinstance(backup, PgcdcBaseBackupOperator)
    assert backup.backup_id == "b1"


def test_every_operator_of_the_provider_is_named_pgcdc():
    import importlib
    import inspect

    from airflow.sdk import BaseOperator

    from airflow_pgcdc.provider import get_provider_info

    names = []
    for group in ("operators", "sensors"):
        for entry in get_provider_info()[group]:
            for module in entry["python-modules"]:
                for name, obj in inspect.getmembers(importlib.import_module(module), inspect.isclass):
                    if issubclass(obj, BaseOperator) and obj.__module__ == module and "before 0.2" not in (obj.__doc__ or ""):
                        names.append(name)
    assert names and all(n.startswith("Pgcdc") for n in names), names
