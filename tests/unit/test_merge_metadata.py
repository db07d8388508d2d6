"""merge.metadata: the CDC metadata columns a copy's rows and a batch get (Arrow side; the
Spark side is run against real servers in test_metadata_columns.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from airflow_pgcdc.merge.errors import ReservedColumnName
from airflow_pgcdc.merge.metadata import (
    METADATA_COLUMNS,
    copy_metadata,
    metadata_fields,
    reserved_clash,
    with_merged_at,
)

WHEN = datetime(2026, 11, 29, 6, 0, tzinfo=UTC)


def test_a_copy_s_rows_get_r_its_point_no_commit_time_and_when():
    rows = copy_metadata(pa.table({"id": [1, 2]}), 0x16B3748, WHEN)
    assert rows.column_names == ["id", *METADATA_COLUMNS]
    assert rows.schema.field("_pgcdc_commit_ts").type == pa.timestamp("us", tz="UTC")
    assert rows.to_pylist()[1] == {"id": 2, "_pgcdc_op": "R", "_pgcdc_commit_lsn": 0x16B3748,
                                   "_pgcdc_commit_ts": None, "_pgcdc_merged_at": WHEN}
    assert pa.schema([pa.field("id", pa.int64()), *metadata_fields()]).names == rows.column_names


def test_a_batch_gets_merged_at_last():
    rows = with_merged_at(pa.table({"id": [1], "_pgcdc_op": ["U"]}), WHEN)
    assert rows.column_names[-1] == "_pgcdc_merged_at" and rows.column("_pgcdc_merged_at").to_pylist() == [WHEN]


def test_a_column_named_like_one_refuses_the_table_with_the_way_out():
    reserved_clash("s.t", ["id", "_pgcdc_merged_atx"])
    with pytest.raises(ReservedColumnName, match=r"\['_pgcdc_merged_at'\]") as e:
        reserved_clash("s.t", ["id", "_pgcdc_merged_at"])
    assert "--table-option s.t:metadata_columns=false" in e.value.hint
