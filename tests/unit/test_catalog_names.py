"""lake.catalog: metastore names of PostgreSQL tables (no two source names meet) and Hive types."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_pgcdc.lake.catalog import (
    CatalogError,
    _address,
    catalog_names,
    hive_name,
    hive_type,
    table_entry,
)

_PG_NAME = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), min_size=1, max_size=20)


@pytest.mark.parametrize("name,expected", [
    ("orders", "orders"), ("line_items", "line_items"), ("t2", "t2"),
    ("Orders", "__4f_rders"), ("my table", "my__20_table"), ("a__b", "a__5f___5f_b"), ("a_B", "a__5f___42_"),
    ("é", "__e9_"), ("", ""),
])
def test_a_plain_name_is_itself_and_any_other_is_spelled_out(name, expected):
    assert hive_name(name) == expected


@given(_PG_NAME, _PG_NAME)
def test_two_names_never_meet(a, b):
    if a != b:
        assert hive_name(a) != hive_name(b)
    assert set(hive_name(a)) <= set("abcdefghijklmnopqrstuvwxyz0123456789_")


def test_catalog_names_prefix_given_and_limits():
    assert catalog_names("public", "orders") == ("public", "orders")
    assert catalog_names("Sales", "Odd Name", prefix="crm_") == ("crm___53_ales", "__4f_dd__20___4e_ame")
    assert catalog_names("public", "orders", given="shop.line_items") == ("shop", "line_items")
    for bad in ("shop", "Shop.items", "shop.line-items"):
        with pytest.raises(CatalogError, match="must be database.table"):
            catalog_names("public", "orders", given=bad)
    with pytest.raises(CatalogError, match="longer than 128") as e:
        catalog_names("public", "X" * 40)
    assert "catalog_name=db.name" in e.value.hint


def test_hive_types_and_the_entry():
    schema = pa.schema([("a", pa.int64()), ("b", pa.decimal128(12, 2)), ("c", pa.timestamp("us", tz="UTC")),
                        ("d", pa.list_(pa.string())), ("e", pa.struct([("x", pa.int32())])), ("f", pa.bool_()),
                        ("g", pa.date32()), ("h", pa.binary()), ("i", pa.map_(pa.string(), pa.float64()))])
    entry = table_entry("public", "t", "s3://b/lake/public.t", schema, {"pgcdc.slot": "s"})
    assert entry.columns == (("a", "bigint"), ("b", "decimal(12,2)"), ("c", "timestamp"), ("d", "array<string>"),
                             ("e", "struct<x:int>"), ("f", "boolean"), ("g", "date"), ("h", "binary"),
                             ("i", "map<string,double>"))
    assert entry.path == "s3a://b/lake/public.t" and hive_type(pa.null()) == "string"
    assert _address("thrift://hms:9083") == ("hms", 9083)
    with pytest.raises(CatalogError, match="thrift://host:port"):
        _address("http://hms:9083")
