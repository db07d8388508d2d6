"""A table's liquid clustering (``cluster_by``, Delta's Spark engine) as an option: read from
``--table-option`` and ``table_options``, kept through the operator's arguments, refused with
``partition_by``, with no column, with the delta-rs engine, on a column the table does not have,
and wherever delta-rs would write the table (a resync's replacement, a table made at its first
change). What Delta and delta-rs do with such a table: tests/integration/test_clustered_tables.py."""

from __future__ import annotations

import types

import pyarrow as pa
import pytest

from airflow_pgcdc.merge.context import JobContext
from airflow_pgcdc.merge.options import BadMergeOption, MergeOptions, parse_table_options
from airflow_pgcdc.merge.sinks.engines import DeltaRsSink, DeltaSparkSink


def _ctx(**table_options):
    options = MergeOptions(engine="delta-spark", table_options=table_options)
    ctx = types.SimpleNamespace(options=options, deletion_vectors=False)
    ctx.wants_change_data_feed = lambda name: False
    ctx.cluster_columns = lambda name, columns: JobContext.cluster_columns(ctx, name, columns)
    return ctx


def test_cluster_by_is_read_from_the_command_line_and_goes_back_to_it():
    given = parse_table_options(["public.events:cluster_by=a,b"])
    assert given == {"public.events": {"cluster_by": "a,b"}}
    options = MergeOptions(engine="delta-spark", table_options=given)
    assert options.for_table("public.events", "cluster_by") == "a,b"
    assert options.for_table("public.other", "cluster_by") is None
    args = options.to_args()
    assert args[args.index("--table-option") + 1] == "public.events:cluster_by=a,b"


def test_cluster_by_with_partition_by_or_without_a_column_is_refused_naming_table_and_option():
    with pytest.raises(BadMergeOption, match=r"'public\.events'.*cluster_by and partition_by") as refused:
        MergeOptions(engine="delta-spark", table_options={"public.events": {"cluster_by": "a", "partition_by": "d"}})
    assert "public.events:cluster_by" in refused.value.hint and "public.events:partition_by" in refused.value.hint
    with pytest.raises(BadMergeOption, match=r"'public\.events'.*'cluster_by'.*names no column") as refused:
        MergeOptions(table_options={"public.events": {"cluster_by": " , "}})
    assert "cluster_by=COL" in refused.value.hint
    # another table's partitioning is no business of this one's
    MergeOptions(engine="delta-spark", table_options={"public.a": {"cluster_by": "x"}, "public.b": {"partition_by": "y"}})


def test_the_columns_are_those_the_table_has():
    ctx = _ctx(**{"public.events": {"cluster_by": " a , b "}})
    assert JobContext.cluster_columns(ctx, "public.events", ["a", "b", "c"]) == ("a", "b")
    assert JobContext.cluster_columns(ctx, "public.other", ["a"]) == ()
    with pytest.raises(BadMergeOption, match=r"table public\.events: cluster_by names column\(s\) \['b'\]") as refused:
        JobContext.cluster_columns(ctx, "public.events", ["a", "c"])
    assert "public.events:cluster_by" in refused.value.hint


def test_the_delta_rs_engine_refuses_a_job_that_asks_for_clustering():
    ctx = _ctx(**{"public.b": {"cluster_by": "x"}, "public.a": {"cluster_by": "y"}, "public.c": {"soft_deletes": True}})
    with pytest.raises(BadMergeOption, match=r"'public\.a'.*cluster_by.*public\.b.*delta-rs") as refused:
        DeltaRsSink(ctx)
    assert "--engine delta-spark" in refused.value.hint
    DeltaSparkSink(ctx)
    DeltaRsSink(_ctx(**{"public.c": {"soft_deletes": True}}))
    DeltaRsSink(types.SimpleNamespace(deletion_vectors=False))  # no options at all


def test_a_table_delta_rs_writes_is_never_asked_to_be_clustered():
    """A resync's replacement and the empty table made at a first change are delta-rs' writes
    whatever the engine (``by="delta-rs"``): refused for a clustered table before they start;
    the bootstrap (the sink's) and the history tables go on."""
    ctx = _ctx(**{"public.events": {"cluster_by": "a"}})
    fields = [pa.field("a", pa.int64()), pa.field("v", pa.string())]
    sink = DeltaSparkSink(ctx)
    with pytest.raises(BadMergeOption, match=r"table public\.events: cluster_by=a: .*delta-rs") as refused:
        sink.properties(fields, by="delta-rs", table="public.events")
    assert "ALTER TABLE" in refused.value.hint and "CLUSTER BY" in refused.value.hint
    assert sink.properties(fields, table="public.events") is None
    assert sink.properties(fields, by="history") is None
    assert sink.properties(fields, by="delta-rs", table="public.other") is None
