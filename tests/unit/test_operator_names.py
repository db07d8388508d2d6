"""One vocabulary: every operator is named ``Pgcdc*`` and takes the change store as
``store``. The 0.1 names (two operators, ``to=``/``source=``) keep working for one release,
with a deprecation warning (a DAG written against 0.1 still parses and runs)."""

from __future__ import annotations

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning

from airflow_pgcdc.operators.basebackup import PgBaseBackupToS3Operator, PgcdcBaseBackupOperator
from airflow_pgcdc.operators.snapshot import PgcdcSnapshotOperator, PgSnapshotToS3Operator


def test_old_names_warn_and_build_the_new_operators():
    with pytest.warns(AirflowProviderDeprecationWarning, match="PgSnapshotToS3Operator is now PgcdcSnapshotOperator"):
        snap = PgSnapshotToS3Operator(task_id="snap", store="s3://b/p", slot="s", publications="pub", workers=2)
    assert isinstance(snap, PgcdcSnapshotOperator)
    assert (snap.store, snap.slot, snap.publications, snap.workers) == ("s3://b/p", "s", "pub", 2)
    with pytest.warns(AirflowProviderDeprecationWarning, match="PgBaseBackupToS3Operator is now PgcdcBaseBackupOperator"), \
            pytest.warns(AirflowProviderDeprecationWarning, match=r"\(to=...\) is now PgcdcBaseBackupOperator\(store=...\)"):
        backup = PgBaseBackupToS3Operator(task_id="bb", to="s3://b/backups", backup_id="b1")
    assert isinstance(backup, PgcdcBaseBackupOperator)
    assert (backup.store, backup.backup_id) == ("s3://b/backups", "b1"), "to=: the 0.1 name of store="
    assert PgcdcBaseBackupOperator(task_id="bb2", store="s3://b/backups").store == "s3://b/backups"
    with pytest.raises(TypeError, match="give store= only"):
        PgcdcBaseBackupOperator(task_id="bb3", store="s3://b/backups", to="s3://b/other")


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


@pytest.mark.parametrize("old", ["to", "source"])
def test_the_store_under_its_old_names(old):
    from airflow_pgcdc.operators.drain import PgcdcDrainOperator
    from airflow_pgcdc.operators.maintain import PgcdcMaintainOperator
    from airflow_pgcdc.operators.merge import PgcdcSparkMergeOperator
    from airflow_pgcdc.operators.resync import PgcdcResyncOperator

    cases = {
        "to": [(PgcdcSnapshotOperator, {"slot": "s", "publications": "p"}), (PgcdcDrainOperator, {"slot": "s", "publications": "p"}),
               (PgcdcResyncOperator, {"slot": "s", "publications": "p", "tables": ["a.b"]})],
        "source": [(PgcdcSparkMergeOperator, {"slot": "s", "delta": "s3://b/l"}), (PgcdcMaintainOperator, {"slot": "s", "delta": "s3://b/l"})],
    }[old]
    for cls, rest in cases:
        with pytest.warns(AirflowProviderDeprecationWarning, match=rf"{cls.__name__}\({old}=...\) is now {cls.__name__}\(store=...\)"):
            op = cls(task_id="t", **{old: "s3://b/cdc"}, **rest)
        assert op.store == "s3://b/cdc" and "store" in cls.template_fields and old not in cls.template_fields
        with pytest.raises(TypeError, match=f"give store= only \\({old}= is its former name\\)"):
            cls(task_id="t2", store="s3://b/cdc", **{old: "s3://b/other"}, **rest)
        with pytest.raises(TypeError, match="needs store="):
            cls(task_id="t3", **rest)


@pytest.mark.parametrize(
    ("command", "old", "rest"),
    [
        ("snapshot", "--to", ["--slot", "s", "--publication", "p"]),
        ("drain", "--to", ["--slot", "s", "--publication", "p"]),
        ("resync", "--to", ["--slot", "s", "--publication", "p", "--tables", "a.b"]),
        ("merge", "--from", ["--slot", "s", "--delta", "s3://b/l"]),
        ("maintain", "--from", ["--slot", "s", "--delta", "s3://b/l"]),
        ("status", "--from", ["--slot", "s"]),
    ],
)
def test_cli_takes_the_store_as_store_and_under_its_old_flag(command, old, rest):
    from airflow_pgcdc.cli import build_parser

    parser = build_parser()
    for flag in ("--store", old):
        args = parser.parse_args([command, flag, "s3://b/cdc", *rest])
        assert args.store == "s3://b/cdc", (command, flag)
    assert "--store" in parser._subparsers._group_actions[0].choices[command].format_help()


def test_library_calls_take_store_and_warn_on_source():
    """merge_slot/maintain_slot: ``store`` (``source``, the 0.1 name, warns; both or neither: TypeError)."""
    from airflow_pgcdc.store.layout import store_argument

    assert store_argument("merge_slot", "s3://b/cdc", "source", None) == "s3://b/cdc"
    with pytest.warns(DeprecationWarning, match=r"merge_slot\(source=...\) is now merge_slot\(store=...\)"):
        assert store_argument("merge_slot", None, "source", "s3://b/old") == "s3://b/old"
    with pytest.raises(TypeError, match="both 'store' and its old name 'source'"):
        store_argument("maintain_slot", "s3://b/a", "source", "s3://b/b")
    with pytest.raises(TypeError, match=r"maintain_slot\(\) missing the store"):
        store_argument("maintain_slot", None, "source", None)
    import inspect

    from airflow_pgcdc.maintain import maintain_slot
    from airflow_pgcdc.merge.job import merge_slot

    for fn in (merge_slot, maintain_slot):
        params = inspect.signature(fn).parameters
        # the 0.1 name arrives among **fields (store_argument takes it out; see above)
        assert "store" in params and "source" not in params, fn.__name__
        assert params["fields"].kind is inspect.Parameter.VAR_KEYWORD, fn.__name__
