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


def test_the_thrift_interface_ships_in_the_py_files_zip_and_loads_from_it(tmp_path):
    """Under spark-submit --py-files the package is a zip: the interface file must be in it and
    be read as package data (a file path into the zip would not open)."""
    import subprocess
    import sys
    import zipfile

    from airflow_pgcdc.merge.session import build_py_files

    pytest.importorskip("thriftpy2", reason="the catalog extra (thriftpy2) is not installed here: the floor "
                                            "environment leaves it out")

    zipped = build_py_files(tmp_path)
    assert "airflow_pgcdc/lake/hive_metastore.thrift" in zipfile.ZipFile(zipped).namelist()
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import airflow_pgcdc.lake.catalog as c; "
             "assert c.__file__.startswith(sys.argv[1]), c.__file__; print(c._idl().ThriftHiveMetastore.__name__)")
    done = subprocess.run([sys.executable, "-c", probe, zipped], capture_output=True, text=True, check=False,
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0 and done.stdout.strip() == "ThriftHiveMetastore", done.stderr[-2000:]
