"""Which columns the part writer dictionary-encodes (store.parquet.choose_dictionary_columns)."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_pgcdc.store import parquet as pqstore
from airflow_pgcdc.store.parquet import ParquetPartWriter, choose_dictionary_columns


def table(n: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "status": pa.array([("new", "paid", "shipped")[i % 3] for i in range(n)]),
            "flag": pa.array([i % 2 == 0 for i in range(n)]),
            "tags": pa.array([[i % 4] for i in range(n)], pa.list_(pa.int32())),
        }
    )


def test_repeated_columns_keep_the_dictionary_unique_ones_do_not():
    chosen = choose_dictionary_columns(table(1000))
    assert "status" in chosen and "id" not in chosen
    assert "flag" not in chosen  # Parquet never dictionary-encodes booleans
    assert "tags" in chosen  # nested: the kernel cannot count it, Parquet's default stays


def test_ratio_threshold():
    n = 1000
    limit = int(n * pqstore.DICTIONARY_MAX_DISTINCT_RATIO)
    at = pa.table({"c": pa.array([i % limit for i in range(n)])})
    over = pa.table({"c": pa.array([i % (limit + 1) for i in range(n)])})
    assert choose_dictionary_columns(at) == ["c"]
    assert choose_dictionary_columns(over) == []


def test_empty_sample_keeps_parquets_default():
    assert choose_dictionary_columns(table(0)) is True


def test_only_the_leading_rows_are_counted(monkeypatch):
    monkeypatch.setattr(pqstore, "DICTIONARY_SAMPLE_ROWS", 100)
    # unique over the first 100 rows, then one value repeated: judged on the first 100
    t = pa.table({"c": pa.array(list(range(100)) + [0] * 10_000)})
    assert choose_dictionary_columns(t) == []
    monkeypatch.setattr(pqstore, "DICTIONARY_SAMPLE_ROWS", 20_000)
    assert choose_dictionary_columns(t) == ["c"]


def test_written_part_uses_the_choice():
    class Sink(io.BytesIO):
        def close(self):  # keep the bytes readable after the writer closes its sink
            self.final = self.getvalue()
            super().close()

    sink = Sink()
    t = table(5000)
    writer = ParquetPartWriter(sink, t.schema, name="p")
    writer.write_table(t)
    info = writer.close()
    assert info.rows == 5000
    meta = pq.ParquetFile(io.BytesIO(sink.final)).metadata
    encodings = {meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i).encodings for i in range(meta.num_columns)}
    assert any("DICTIONARY" in e for e in encodings["status"])
    assert not any("DICTIONARY" in e for e in encodings["id"])
