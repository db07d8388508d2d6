"""One vocabulary in every library call and operator (issue #30): ``store``, ``delta``,
``publications`` (one name or several), ``s3`` (S3Settings or a client), ``options`` (the
job's options object); the 0.1 names warn for one release. And the copying jobs' options
objects: made once, checked when made, read back as the call reads them."""

from __future__ import annotations

import argparse
import inspect
import warnings

import pytest

from airflow_pgcdc.snapshot.errors import SnapshotError
from airflow_pgcdc.snapshot.options import (
    BaseBackupOptions,
    RecoverOptions,
    ResyncOptions,
    SnapshotOptions,
    as_text_map,
)
from airflow_pgcdc.store.s3 import S3Settings, make_s3_client, s3_argument

NOWHERE = "host=/nonexistent/socket dbname=x connect_timeout=1"


# -- s3 ---------------------------------------------------------------------------------


def test_s3_takes_settings_or_a_client():
    settings = S3Settings(endpoint_url="http://127.0.0.1:1", access_key_id="k", secret_access_key="s",
                          region="us-east-1")
    assert s3_argument("f", settings, {}) == (settings, None)
    client = make_s3_client(settings)
    assert s3_argument("f", client, {}) == (settings, client)  # a client of ours carries its settings
    foreign = object()
    assert s3_argument("f", foreign, {}) == (None, foreign)
    with pytest.raises(TypeError, match="needs S3Settings .* not a client made elsewhere"):
        s3_argument("merge_slot", foreign, {}, needs_settings=True)
    got, none = s3_argument("f", None, {})
    assert isinstance(got, S3Settings) and none is None  # the environment's


def test_the_old_s3_names_warn_and_both_is_a_type_error():
    settings = S3Settings(region="us-east-1")
    fields = {"settings": settings, "other": 1}
    with pytest.warns(DeprecationWarning, match=r"merge_slot\(settings=...\) is now merge_slot\(s3=...\)"):
        assert s3_argument("merge_slot", None, fields) == (settings, None)
    assert fields == {"other": 1}  # taken out: what is left goes to the options
    client = object()
    with pytest.warns(DeprecationWarning, match="s3_client=..., s3_settings=..."):
        assert s3_argument("snapshot_to_s3", None, {"s3_client": client, "s3_settings": settings}) == (settings, client)
    with pytest.raises(TypeError, match="both 's3' and its old name"):
        s3_argument("drain_window", settings, {"s3_client": client})


# -- publications -----------------------------------------------------------------------


def test_publications_one_or_several_and_the_old_name_warns():
    from airflow_pgcdc.options import publications_argument

    assert publications_argument("f", "a", {}) == ("a",)
    assert publications_argument("f", ["a", "b"], {}) == ("a", "b")
    assert publications_argument("f", None, {}) == ()
    fields = {"publication": "old"}
    with pytest.warns(DeprecationWarning, match=r"f\(publication=...\) is now f\(publications=...\)"):
        assert publications_argument("f", None, fields) == ("old",)
    assert fields == {}
    with pytest.raises(TypeError, match="both 'publications' and its old name 'publication'"):
        publications_argument("f", "a", {"publication": "b"})
    with pytest.raises(TypeError, match="missing the publication"):
        publications_argument("resync_tables", None, {}, required=True)


def test_the_trigger_reads_the_name_a_trigger_deferred_before_the_rename_carries():
    from airflow_pgcdc.triggers.changes import PgcdcChangesTrigger

    old = PgcdcChangesTrigger(slot="s", publication="p")  # as the triggerer rebuilds one from its row
    assert old.publications == ["p"]
    _, kwargs = old.serialize()
    assert kwargs["publications"] == ["p"] and "publication" not in kwargs
    assert PgcdcChangesTrigger(**kwargs).publications == ["p"]
    assert PgcdcChangesTrigger(slot="s").publications is None


# -- the copying jobs' options ----------------------------------------------------------


def test_snapshot_options_are_checked_when_made():
    with pytest.raises(SnapshotError, match="workers must be at least 1, got 0"):
        SnapshotOptions(workers=0)
    with pytest.raises(SnapshotError, match="rows_per_part must be at least 1"):
        ResyncOptions(tables=("a.b",), rows_per_part=0)
    with pytest.raises(SnapshotError, match="copy_format must be one of binary, csv, not 'parquet'"):
        RecoverOptions(copy_format="parquet")
    with pytest.raises(TypeError, match="the snapshot has no option 'worker'"):
        SnapshotOptions.of(worker=2)
    o = SnapshotOptions.of({"tables": "public.t", "as_text": {"public.t": ["c", "d"]}, "workers": "3"})
    assert o.tables == ("public.t",) and o.workers == 3
    assert as_text_map(o.as_text) == {"public.t": ["c", "d"]}
    assert hash(o) == hash(SnapshotOptions.of(o.fields()))  # frozen and comparable
    assert as_text_map(SnapshotOptions(as_text=["public.t=c"]).as_text) == ("public.t=c",)


def test_base_backup_options_refuse_what_base_backup_refuses_before_any_io():
    from airflow_pgcdc.protocol.commands import CommandError

    with pytest.raises(CommandError):
        BaseBackupOptions(checkpoint="slow")
    with pytest.raises(CommandError):
        BaseBackupOptions(max_rate=5)
    o = BaseBackupOptions(compression="zstd", compression_detail={"level": 3}, manifest="no")
    command = o.command()
    assert command["compression_detail"] == {"level": 3} and command["manifest_checksums"] is None


def _parsed(argv: list[str]) -> argparse.Namespace:
    from airflow_pgcdc.cli import build_parser

    return build_parser().parse_args(argv)


def test_the_cli_builds_each_options_object_once_from_its_arguments():
    common = ["--dsn", "dbname=x", "--slot", "s", "--store", "s3://b/p"]
    snap = _parsed(["snapshot", *common, "--publication", "a", "--publication", "b", "--workers", "2",
                    "--as-text", "public.t=c", "--copy-format", "csv"])
    assert snap.publication == ["a", "b"]
    assert SnapshotOptions.from_args(snap) == SnapshotOptions(workers=2, as_text=("public.t=c",), copy_format="csv")
    resync = _parsed(["resync", *common, "--publication", "a", "--tables", "public.t", "--where", "id < 5"])
    assert ResyncOptions.from_args(resync) == ResyncOptions(tables=("public.t",), where="id < 5")
    recover = _parsed(["recover", *common, "--two-phase"])
    assert RecoverOptions.from_args(recover) == RecoverOptions(two_phase=True)
    bb = _parsed(["basebackup", "--dsn", "dbname=x", "--store", "s3://b/p", "--compression", "gzip",
                  "--compression-detail", "5", "--quiet"])
    o = BaseBackupOptions.from_args(bb)
    assert (o.compression, o.compression_detail, o.progress_interval) == ("gzip", 5, 0)


# -- the operators ----------------------------------------------------------------------


def test_the_copying_operators_take_options_whole_or_their_fields_not_both():
    from airflow_pgcdc.operators.basebackup import PgcdcBaseBackupOperator
    from airflow_pgcdc.operators.recover import PgcdcRecoverOperator
    from airflow_pgcdc.operators.resync import PgcdcResyncOperator
    from airflow_pgcdc.operators.snapshot import PgcdcSnapshotOperator

    base = {"store": "s3://b/p", "slot": "s"}
    with pytest.raises(ValueError, match="give options or its separate arguments \\(workers\\), not both"):
        PgcdcSnapshotOperator(task_id="a", publications="p", options={"workers": 2}, workers=3, **base)
    with pytest.raises(ValueError, match="not both"):
        PgcdcResyncOperator(task_id="b", publications="p", options={"tables": ["a.b"]}, tables=["a.c"], **base)
    with pytest.raises(ValueError, match="not both"):
        PgcdcRecoverOperator(task_id="c", options={"workers": 2}, two_phase=True, **base)
    with pytest.raises(ValueError, match="not both"):
        PgcdcBaseBackupOperator(task_id="d", store="s3://b/p", options={"checkpoint": "spread"}, wal=False)
    for cls in (PgcdcSnapshotOperator, PgcdcResyncOperator, PgcdcRecoverOperator, PgcdcBaseBackupOperator):
        assert "options" in cls.template_fields, cls.__name__
    from airflow_pgcdc.operators.values import options_or_fields

    rendered = options_or_fields("PgcdcSnapshotOperator", "{'workers': '2', 'tables': 'public.a public.b'}",
                                 SnapshotOptions, tables=None, workers=None)
    assert rendered == SnapshotOptions(workers=2, tables=("public.a", "public.b"))
    assert options_or_fields("PgcdcBaseBackupOperator", None, BaseBackupOptions, label="x", wal=None) == \
        BaseBackupOptions(label="x")


def test_the_operators_old_publication_argument_warns():
    from airflow.exceptions import AirflowProviderDeprecationWarning

    from airflow_pgcdc.operators.drain import PgcdcDrainOperator
    from airflow_pgcdc.operators.resync import PgcdcResyncOperator
    from airflow_pgcdc.operators.snapshot import PgcdcSnapshotOperator
    from airflow_pgcdc.sensors.changes import PgcdcChangesSensor

    for cls, rest in ((PgcdcSnapshotOperator, {"store": "s3://b/p"}), (PgcdcDrainOperator, {"store": "s3://b/p"}),
                      (PgcdcResyncOperator, {"store": "s3://b/p", "tables": ["a.b"]}), (PgcdcChangesSensor, {})):
        with pytest.warns(AirflowProviderDeprecationWarning, match=r"\(publication=...\) is now .*\(publications=...\)"):
            op = cls(task_id="t", slot="s", publication="p", **rest)
        assert op.publications == "p" and "publications" in cls.template_fields
    with pytest.raises(TypeError, match="needs publications="):
        PgcdcDrainOperator(task_id="t2", slot="s", store="s3://b/p")


# -- the calls ---------------------------------------------------------------------------


PUBLIC_CALLS = [
    ("airflow_pgcdc.snapshot.export", "snapshot_to_s3"),
    ("airflow_pgcdc.snapshot.resync", "resync_tables"),
    ("airflow_pgcdc.snapshot.recover", "recover_pipeline"),
    ("airflow_pgcdc.snapshot.basebackup", "base_backup_to_s3"),
    ("airflow_pgcdc.drain.drain", "drain_window"),
    ("airflow_pgcdc.merge.job", "merge_slot"),
    ("airflow_pgcdc.merge.rebuild", "rebuild_slot"),
    ("airflow_pgcdc.maintain.job", "maintain_slot"),
    ("airflow_pgcdc.status.job", "slot_status"),
    ("airflow_pgcdc.verify.job", "verify_table"),
]


@pytest.mark.parametrize(("module", "name"), PUBLIC_CALLS)
def test_every_public_call_takes_about_eight_named_parameters_and_one_name_each(module, name):
    """At most nine (rebuild_slot: the merge's plus its scratch root, swap and keep_scratch);
    the options travel in the job's options object, the 0.1 names in ``**fields``."""
    import importlib

    params = inspect.signature(getattr(importlib.import_module(module), name)).parameters
    named = [p for p in params.values() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    assert len(named) <= 9, [p.name for p in named]
    old = {"to", "publication", "s3_client", "s3_settings", "settings", "source", "store_url", "delta_url",
           "storage_options"}
    assert not old & set(params), sorted(old & set(params))
    if "s3" not in params:
        pytest.fail(f"{name} has no s3 parameter")


@pytest.mark.parametrize("call", [
    lambda: __import__("airflow_pgcdc.snapshot.export", fromlist=["x"]).snapshot_to_s3(
        NOWHERE, "s3://b/p", slot="s", publications="p", s3_settings=S3Settings(), s3=S3Settings()),
    lambda: __import__("airflow_pgcdc.snapshot.resync", fromlist=["x"]).resync_tables(
        NOWHERE, "s3://b/p", slot="s", publications="p", publication="q", tables=["a.b"]),
    lambda: __import__("airflow_pgcdc.status.job", fromlist=["x"]).slot_status(NOWHERE, "s", storage="x"),
    lambda: __import__("airflow_pgcdc.verify.job", fromlist=["x"]).verify_table(
        NOWHERE, "s3://b/l", "public", "t", s3=S3Settings(), storage_options={}),
])
def test_two_names_for_one_thing_or_an_unknown_name_is_a_type_error_before_any_io(call):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(TypeError):
            call()


def test_every_jobs_options_and_result_are_frozen():
    """What a job is asked and what it answers cannot be changed after the fact (a DAG's
    XCom, a log line and the object the caller holds say the same)."""
    import dataclasses

    import airflow_pgcdc as root
    from airflow_pgcdc.maintain.job import MaintainResult
    from airflow_pgcdc.snapshot.basebackup import BaseBackupResult
    from airflow_pgcdc.snapshot.recover import RecoveryDone
    from airflow_pgcdc.store.manifest import SnapshotManifest
    from airflow_pgcdc.store.resyncs import Resync

    objects = [root.SnapshotOptions, root.ResyncOptions, root.RecoverOptions, root.BaseBackupOptions,
               root.DrainOptions, root.MergeOptions, root.MaintainOptions, root.DrainResult, root.MergeResult,
               MaintainResult, SnapshotManifest, Resync, RecoveryDone, BaseBackupResult]
    assert [c.__name__ for c in objects if not dataclasses.fields(c) or not c.__dataclass_params__.frozen] == []
    result = root.DrainResult(slot="s", window_seq=None, start_lsn="0/1", end_lsn="0/2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.rows = 5
