"""Generated date partition columns (:mod:`airflow_pgcdc.merge.generated`): the option's text,
the Delta schema read back, the values computed in Arrow, 'infinity' refused."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from airflow_pgcdc.merge.errors import MergeError
from airflow_pgcdc.merge.generated import (
    DateColumn,
    from_schema,
    parse_partition_by,
    partition_names,
    refuse_infinite,
    with_generated,
)

FIELDS = [pa.field("id", pa.int32()), pa.field("created_at", pa.timestamp("us", tz="UTC")),
          pa.field("at", pa.timestamp("us")), pa.field("region", pa.string()), pa.field("Odd `Name`", pa.timestamp("us"))]


def test_the_option_text_gives_names_and_generated_columns():
    assert parse_partition_by("s.t", "region", FIELDS) == (("region",), ())
    names, gen = parse_partition_by("s.t", "date(created_at), region", FIELDS)
    assert names == ("created_at_date", "region") and gen == (DateColumn("created_at_date", "created_at"),)
    names, gen = parse_partition_by("s.t", " DATE( at )  AS  day ", FIELDS)
    assert names == ("day",) and gen == (DateColumn("day", "at"),)
    _, gen = parse_partition_by("s.t", 'date("Odd `Name`") as d', FIELDS)
    assert gen[0].expression == "CAST(`Odd ``Name``` AS DATE)"
    assert partition_names("s.t", "date(at) as day,region", ["day", "region", "at"]) == ("day", "region")
    # a table without the date column (a history table) is partitioned by the others
    assert partition_names("s.t", "date(at) as day,region", ["region", "at"]) == ("region",)
    with pytest.raises(MergeError, match="does not have"):  # a date() of no column stays an error
        partition_names("s.t", "date(nope),region", ["region", "at"])


@pytest.mark.parametrize(("given", "says"), [
    ("date(region)", "is string, not a timestamp"),
    ("date(nope)", "names column 'nope', which it does not have"),
    ("nope", "it does not have"),
    ("date(at) as region", "would add column 'region', which the table has"),
    ("region, region", "names a column twice"),
    (" , ", "names no column"),
])
def test_bad_option_text_is_refused_naming_the_table(given, says):
    with pytest.raises(MergeError, match="table s.t") as e:
        parse_partition_by("s.t", given, FIELDS)
    assert says in str(e.value) and e.value.hint


def test_the_delta_schema_is_read_back_and_a_foreign_expression_refused():
    schema = pa.schema(FIELDS + [DateColumn("d", "Odd `Name`").field()])
    assert from_schema("s.t", schema) == (DateColumn("d", "Odd `Name`"),)
    other = pa.schema(FIELDS + [pa.field("y", pa.int32(), metadata={"delta.generationExpression": "YEAR(at)"})])
    with pytest.raises(MergeError, match="does not compute"):
        from_schema("s.t", other)


def test_values_are_the_utc_day_and_infinity_is_refused():
    ts = pa.array([dt.datetime(1969, 12, 31, 23, 0, tzinfo=dt.UTC), None, dt.datetime(2026, 1, 2, 0, 0, tzinfo=dt.UTC)],
                  pa.timestamp("us", tz="UTC"))
    rows = pa.table({"created_at": ts, "_pgcdc_op": ["I", "U", "D"]})
    out = with_generated(rows, [DateColumn("d", "created_at")])
    assert out.column("d").to_pylist() == [dt.date(1969, 12, 31), None, dt.date(2026, 1, 2)]
    assert out.schema.field("d").metadata == {b"delta.generationExpression": b"CAST(`created_at` AS DATE)"}
    inf = pa.table({"created_at": pa.array([0, 2**63 - 1], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                    "_pgcdc_op": ["I", "D"]})
    refuse_infinite("s.t", inf, [DateColumn("d", "created_at")], deletes=True)  # only a delete holds it
    with pytest.raises(MergeError, match="'created_at' holds 'infinity'"):
        refuse_infinite("s.t", inf, [DateColumn("d", "created_at")])
