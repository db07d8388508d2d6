"""The error hierarchy: every error pickles with all its fields (they cross into Spark
executors, snapshot worker processes and Airflow triggers), and every error that carries a
hint is a :class:`~airflow_pgcdc.errors.HintedError` (one base, one ``hint`` attribute)."""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil

import pytest

import airflow_pgcdc
from airflow_pgcdc.drain.guards import PipelineTablesUnpublished
from airflow_pgcdc.errors import HintedError, PgcdcError, TruncatedMessage
from airflow_pgcdc.merge.job import TablesFailed, WindowsExpired
from airflow_pgcdc.pg.errors import ServerError, UndefinedObject
from airflow_pgcdc.pg.slots import PublicationMissing, SlotInUse, UnsupportedFeature
from airflow_pgcdc.snapshot.basebackup import BaseBackupServerError
from airflow_pgcdc.snapshot.export import SlotTaken, SnapshotBusy
from airflow_pgcdc.store.s3 import StoreError
from airflow_pgcdc.testing.processes import SandboxError
from airflow_pgcdc.typemap.map import ValueConversionError

SAMPLES = [
    SlotInUse("busy", slot="s", hint="wait", active_pid=5),
    PublicationMissing("no pub", publication="p", hint="create it"),
    UnsupportedFeature("old server", hint="upgrade"),
    ServerError("relation does not exist", sqlstate="42P01", hint="check the name", command="COPY"),
    UndefinedObject("no such slot", sqlstate="42704"),
    BaseBackupServerError("refused", backup_id="b1", stage="streaming", hint="see the log"),
    SlotTaken("slot s is taken", hint="drop it yourself"),
    SnapshotBusy("another run"),
    StoreError("denied", bucket="b", key="k", operation="put", code="AccessDenied"),
    TruncatedMessage("short", protocol="pgoutput", message_type="Insert ('I')", offset=3),
    SandboxError("no server", hint="make setup"),
    ValueConversionError("bad date", table="public.t", column="d", pg_type="date", row=3, value="2024-13-01"),
    PipelineTablesUnpublished("left", hint="add them back", tables=[("public", "t")]),
    WindowsExpired("expired", hint="resync", table="public.t", windows=[1, 2], start_lsn="0/10", end_lsn="0/20"),
    TablesFailed("1 of 2 failed", hint="see the result", result=None),
]


@pytest.mark.parametrize("err", SAMPLES, ids=lambda e: type(e).__name__)
def test_errors_pickle_with_every_field(err):
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and str(back) == str(err)
    assert back.__dict__ == err.__dict__ and back.__dict__  # the keyword fields came along


def test_a_hint_means_a_hinted_error():
    """A PgcdcError class whose constructor takes ``hint`` is a HintedError (so ``except
    HintedError`` and the CLI's hint line see all of them)."""
    package = airflow_pgcdc.__path__
    loose = []
    for info in pkgutil.walk_packages(package, "airflow_pgcdc."):
        if ".testing.demo" in info.name or info.name.endswith(".__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__ or not issubclass(cls, PgcdcError):
                continue
            if "hint" in inspect.signature(cls.__init__).parameters and not issubclass(cls, HintedError):
                loose.append(f"{cls.__module__}.{name}")
    assert loose == []


def test_one_class_for_a_missing_publication_whichever_job_meets_it():
    import airflow_pgcdc.drain as drain
    from airflow_pgcdc.drain import guards
    from airflow_pgcdc.pg import slots, tables

    assert tables.PublicationMissing is slots.PublicationMissing is drain.PublicationMissing
    assert tables.PublicationNotFound is guards.PublicationNotFound is tables.PublicationMissing  # the 0.1 names
    e = tables.PublicationMissing("publication 'p' does not exist", publication="p", hint="create it")
    assert isinstance(e, tables.CatalogError) and e.kind == "publication_missing"
    back = pickle.loads(pickle.dumps(e))
    assert (type(back), back.publication, back.hint) == (tables.PublicationMissing, "p", "create it")
