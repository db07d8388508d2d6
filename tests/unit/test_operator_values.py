"""Operator arguments from templates (``airflow_pgcdc.operators.values``): thresholds and
connection ids can come from a DAG run's params; values given as such are checked when the
DAG is parsed, rendered ones when the task runs, naming the argument."""

from __future__ import annotations

import datetime

import pytest

from airflow_pgcdc.operators.drain import PgcdcDrainOperator
from airflow_pgcdc.operators.values import flag, number, templated
from airflow_pgcdc.sensors.changes import PgcdcChangesSensor


def test_number_and_flag():
    assert number("10", int, "n") == 10 and number(" 2.5 ", float, "x") == 2.5 and number(7, float, "x") == 7.0
    assert number(None, int, "n") is None and number("", int, "n") is None and number("None", int, "n") is None
    for bad in ("ten", 2.5, True, "1.5"):
        with pytest.raises(ValueError, match="n must be an integer, got"):
            number(bad, int, "n")
    with pytest.raises(ValueError, match="n must be an integer of at least 0, got '-1'"):
        number("-1", int, "n", minimum=0)
    assert [flag(v, "f") for v in ("true", "False", "1", "no", "", "None", True, 0)] == [
        True, False, True, False, False, False, True, False]
    with pytest.raises(ValueError, match="f must be true or false, got 'maybe'"):
        flag("maybe", "f")
    assert templated(1, "{{ params.x }}") and not templated(1, "x", None)


def test_the_drain_takes_its_limits_and_connections_from_templates():
    op = PgcdcDrainOperator(task_id="d", store="s3://b/cdc", slot="s", publications="p",
                            max_rows="{{ params.max_rows }}", max_bytes=1000, max_seconds="{{ params.s }}",
                            postgres_conn_id="{{ params.pg }}", aws_conn_id="{{ params.aws }}")
    assert {"max_rows", "max_bytes", "max_seconds", "postgres_conn_id", "aws_conn_id"} <= set(op.template_fields)
    assert op.max_rows == "{{ params.max_rows }}" and op.max_bytes == 1000  # kept until rendered
    with pytest.raises(ValueError, match="max_rows must be an integer of at least 0, got 'many'"):
        PgcdcDrainOperator(task_id="d2", store="s3://b/cdc", slot="s", publications="p", max_rows="many")
    with pytest.raises(ValueError, match="max_seconds must be a number of at least 0, got -5"):
        PgcdcDrainOperator(task_id="d3", store="s3://b/cdc", slot="s", publications="p", max_seconds=-5)


def test_the_sensor_takes_its_thresholds_and_connection_from_templates():
    sensor = PgcdcChangesSensor(task_id="w", slot="s", min_bytes="{{ params.min_bytes }}",
                                max_delay="{{ params.max_delay }}", postgres_conn_id="{{ params.pg }}")
    assert {"min_bytes", "max_delay", "postgres_conn_id"} <= set(sensor.template_fields)
    sensor.min_bytes, sensor.max_delay = "1048576", "600"  # as rendered
    assert (sensor._min_bytes(), sensor._max_delay()) == (1 << 20, 600.0)
    sensor.max_delay = "None"
    assert sensor._max_delay() is None
    sensor.min_bytes = "lots"
    with pytest.raises(ValueError, match="min_bytes must be an integer of at least 0, got 'lots'"):
        sensor._min_bytes()
    given = PgcdcChangesSensor(task_id="w2", slot="s", min_bytes=5, max_delay=datetime.timedelta(minutes=2))
    assert (given._min_bytes(), given._max_delay()) == (5, 120.0)
    with pytest.raises(ValueError, match="min_bytes must be an integer of at least 0"):
        PgcdcChangesSensor(task_id="w3", slot="s", min_bytes=-1)


def test_every_operators_connection_ids_and_numbers_are_templated():
    """A DAG written once for several databases renders each operator's connections (and
    its numeric knobs) per run."""
    from airflow_pgcdc.operators.basebackup import PgcdcBaseBackupOperator
    from airflow_pgcdc.operators.drain import PgcdcDrainOperator
    from airflow_pgcdc.operators.maintain import PgcdcMaintainOperator
    from airflow_pgcdc.operators.merge import PgcdcSparkMergeOperator
    from airflow_pgcdc.operators.recover import PgcdcRecoverOperator
    from airflow_pgcdc.operators.resync import PgcdcResyncOperator
    from airflow_pgcdc.operators.snapshot import PgcdcSnapshotOperator
    from airflow_pgcdc.operators.verify import PgcdcVerifyOperator
    from airflow_pgcdc.sensors.changes import PgcdcChangesSensor

    expected = {
        PgcdcSnapshotOperator: {"postgres_conn_id", "aws_conn_id", "workers", "rows_per_part"},
        PgcdcResyncOperator: {"postgres_conn_id", "aws_conn_id", "workers", "rows_per_part"},
        PgcdcRecoverOperator: {"postgres_conn_id", "aws_conn_id", "workers", "rows_per_part"},
        PgcdcBaseBackupOperator: {"postgres_conn_id", "aws_conn_id"},
        PgcdcDrainOperator: {"postgres_conn_id", "aws_conn_id", "max_rows", "max_bytes", "max_seconds"},
        PgcdcChangesSensor: {"postgres_conn_id", "min_bytes", "max_delay"},
        PgcdcSparkMergeOperator: {"aws_conn_id", "conn_id", "keys", "target_file_mb", "driver_rows"},
        PgcdcVerifyOperator: {"postgres_conn_id", "aws_conn_id", "max_diffs"},
        PgcdcMaintainOperator: {"aws_conn_id", "retention_hours", "zorder"},
    }
    for cls, fields in expected.items():
        assert fields <= set(cls.template_fields), (cls.__name__, fields - set(cls.template_fields))


def test_the_drain_operator_takes_its_options_as_one_rendered_dict():
    from airflow_pgcdc.drain.options import DrainOptions
    from airflow_pgcdc.operators.drain import PgcdcDrainOperator

    op = PgcdcDrainOperator(task_id="d", store="s3://b/p", slot="s", publications="pub", options="{{ params.drain }}")
    assert "options" in op.template_fields
    op.options = ("{'max_rows': '500', 'max_seconds': '2.5', 'binary': 'true', 'skip_origins': 'a, b', "
                  "'forget_tables': 'public.gone', 'as_text': {'public.t': ['c']}, 'max_bytes': 'None'}")
    assert op._options() == DrainOptions(max_rows=500, max_seconds=2.5, binary=True, skip_origins=("a", "b"),
                                         forget_tables=["public.gone"], as_text={"public.t": ["c"]})
    op.options = {"max_rows": "many"}
    with pytest.raises(ValueError, match="max_rows must be an integer"):
        op._options()
    with pytest.raises(ValueError, match="not both"):
        PgcdcDrainOperator(task_id="d2", store="s3://b/p", slot="s", publications="pub", options={"binary": True},
                           max_rows=5)
    with pytest.raises(TypeError, match="the drain has no option 'max_row'"):
        PgcdcDrainOperator(task_id="d3", store="s3://b/p", slot="s", publications="pub", options={"max_row": 5})


def test_upkeep_options_as_one_object_from_the_command_line_or_a_rendered_dict():
    import argparse

    from airflow_pgcdc.maintain.options import DEFAULT_TARGET_SIZE, MaintainOptions
    from airflow_pgcdc.operators.maintain import PgcdcMaintainOperator
    from airflow_pgcdc.operators.values import rendered_options

    args = argparse.Namespace(tables=["public.t"], retention_hours=None, zorder=True, target_file_mb=0.5,
                              dry_run=False, windows=True)
    o = MaintainOptions.from_args(args)
    assert (o.tables, o.retention_hours, o.zorder, o.target_size) == (("public.t",), 168.0, True, 2**19)
    assert MaintainOptions.of(o.fields()) == o and MaintainOptions().target_size == DEFAULT_TARGET_SIZE
    assert rendered_options("{'retention_hours': '0.5', 'dry_run': 'true', 'tables': 'a.b c.d'}",
                            MaintainOptions) == MaintainOptions(retention_hours=0.5, dry_run=True, tables=["a.b", "c.d"])
    with pytest.raises(Exception, match="retention must be 0 hours or more"):
        MaintainOptions(retention_hours=-1)
    with pytest.raises(ValueError, match="not both"):
        PgcdcMaintainOperator(task_id="m", store="s3://b/p", slot="s", delta="s3://b/l", options={"zorder": True},
                              dry_run=True)
