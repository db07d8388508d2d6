"""Which columns the part writer dictionary-encodes (store.parquet.choose_dictionary_columns)."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

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


def test_only_the_leading_rows_are_counted():
    # unique over the first 100 rows, then one value repeated: judged on the first 100
    t = pa.table({"c": pa.array(list(range(100)) + [0] * 10_000)})
    assert choose_dictionary_columns(t, 100) == []
    assert choose_dictionary_columns(t, 20_000) == ["c"]
    assert choose_dictionary_columns(t) == ["c"]  # DICTIONARY_SAMPLE_ROWS
    assert pqstore.choose_encodings(t, sample_rows=100)["use_dictionary"] == []
    assert pqstore.TableEncodings(100).choose(t)["use_dictionary"] == []


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


# -- delta encoding (store.parquet.choose_delta_columns) and the per-table choice


def stepped(n: int) -> pa.Table:
    import numpy as np

    rng = np.random.default_rng(7)
    return pa.table(
        {
            "key": pa.array(np.arange(n, dtype=np.int64) * 3 + 1_000_000),
            "at": pa.array(np.cumsum(rng.integers(0, 2_000_000, n)), pa.timestamp("us", "UTC")),
            "random": pa.array(rng.integers(-(2**62), 2**62, n)),
            "small": pa.array((np.arange(n) // 1000).astype(np.int32)),
            "score": pa.array(rng.random(n)),
            "maybe": pa.array([None if i % 3 == 0 else i for i in range(n)], pa.int64()),
        }
    )


def test_sorted_or_stepping_integers_are_delta_encoded_random_ones_are_not():
    t = stepped(20_000)
    chosen = pqstore.choose_delta_columns(t)
    assert set(chosen) == {"key", "at", "small", "maybe"}
    assert set(chosen.values()) == {"DELTA_BINARY_PACKED"}
    # a dictionary-encoded column keeps its dictionary
    assert "small" not in pqstore.choose_delta_columns(t, skip=["small"])


def test_delta_estimate_follows_the_encodings_bit_widths():
    import numpy as np

    assert pqstore._delta_packed_bytes(np.arange(12_800, dtype=np.int64)) <= 1_000  # zero-width deltas
    wide = np.random.default_rng(1).integers(0, 2**40, 12_800)
    assert pqstore._delta_packed_bytes(wide) >= 5 * 12_800  # ~41 bits a value


def test_a_written_file_uses_the_chosen_encodings_and_reads_back_equal():
    t = stepped(20_000)
    sink = io.BytesIO()
    sink.close = lambda: None  # keep the bytes
    writer = ParquetPartWriter(sink, t.schema, name="p")
    writer.write_table(t)
    writer.close()
    data = sink.getvalue()
    assert pq.read_table(io.BytesIO(data)).equals(t)
    meta = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0)
    encodings = {meta.column(i).path_in_schema: meta.column(i).encodings for i in range(meta.num_columns)}
    assert "DELTA_BINARY_PACKED" in encodings["key"] and "DELTA_BINARY_PACKED" in encodings["at"]
    assert "DELTA_BINARY_PACKED" not in encodings["random"]


def test_parts_of_one_table_share_the_first_choice(monkeypatch):
    calls = []
    real = pqstore.choose_encodings
    monkeypatch.setattr(pqstore, "choose_encodings", lambda sample, **kw: calls.append(sample.num_rows) or real(sample, **kw))
    shared = pqstore.TableEncodings()
    t = stepped(5_000)
    for _ in range(3):
        sink = io.BytesIO()
        sink.close = lambda: None
        writer = ParquetPartWriter(sink, t.schema, encodings=shared)
        writer.write_table(t)
        writer.close()
    assert calls == [5_000]  # chosen once, by the first part
    assert shared.choose(t) == real(t)


def test_choosing_encodings_does_not_import_pandas():
    """Array.to_numpy imports pandas for temporal types (~1 s, ~50 MB in every drain and
    snapshot worker): the choice reads the data buffers instead."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np, pyarrow as pa\n"
        "from airflow_pgcdc.store.parquet import choose_encodings\n"
        "n = 5000\n"
        "def arr(t, values, valid=None):  # pa.array() itself looks for pandas\n"
        "    bitmap = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder='little'))\n"
        "    return pa.Array.from_buffers(t, n, [bitmap, pa.py_buffer(values)])\n"
        "t = pa.table({'ts': arr(pa.timestamp('us', 'UTC'), np.arange(n) * 1000),\n"
        "              'd': arr(pa.date32(), np.arange(n, dtype=np.int32)),\n"
        "              'k': arr(pa.int64(), np.arange(n), np.arange(n) % 5 != 0)})\n"
        "before = 'pandas' in sys.modules\n"
        "choice = choose_encodings(t)\n"
        "assert set(choice['column_encoding']) == {'ts', 'd', 'k'}, choice\n"
        "print(before, 'pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False False"


def test_a_small_first_row_group_keeps_parquets_defaults_without_counting(monkeypatch):
    counted = []
    monkeypatch.setattr(pqstore, "choose_dictionary_columns", lambda sample, rows: counted.append(rows) or [])
    small = table(pqstore.ENCODING_MIN_ROWS - 1)
    assert pqstore.choose_encodings(small) == {"use_dictionary": True}
    assert counted == []
    pqstore.choose_encodings(table(pqstore.ENCODING_MIN_ROWS))
    assert counted == [pqstore.DICTIONARY_SAMPLE_ROWS]


def _written(batches: list[pa.Table], settle_after_first: bool = False, **kw) -> bytes:
    sink = io.BytesIO()
    sink.close = lambda: None  # keep the bytes
    writer = ParquetPartWriter(sink, batches[0].schema, name="p", **kw)
    for i, b in enumerate(batches):
        writer.write_table(b)
        if settle_after_first and i == 0:
            writer.flush_row_group()
    writer.close()
    data = sink.getvalue()
    assert pq.read_table(io.BytesIO(data)).equals(pa.concat_tables(batches))
    return data


def _codecs(data: bytes) -> set[tuple[str, bool]]:
    """(compression, dictionary used) of every column chunk of the file."""
    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    return {(c.compression, c.has_dictionary_page)
            for g in range(meta.num_row_groups) for c in map(meta.row_group(g).column, range(meta.num_columns))}


def test_a_part_of_one_small_row_group_is_snappy_without_dictionary():
    """zstd and dictionaries cost a fixed setup per column chunk: a window touching
    hundreds of tables writes hundreds of parts of a few rows."""
    small = table(pqstore.ENCODING_MIN_ROWS - 1)
    assert _codecs(_written([small])) == {("SNAPPY", False)}
    assert {c for c, _ in _codecs(_written([small], small_part_compression=None))} == {"ZSTD"}
    # enough rows, or a row group written before the last: the usual choice
    assert {c for c, _ in _codecs(_written([table(pqstore.ENCODING_MIN_ROWS)]))} == {"ZSTD"}
    assert {c for c, _ in _codecs(_written([table(10), table(10)], settle_after_first=True))} == {"ZSTD"}


def test_a_few_large_rows_are_not_small():
    big = pa.table({"id": pa.array(range(10), pa.int64()),
                    "doc": pa.array(["x" * (pqstore.SMALL_PART_BYTES // 10 + 1)] * 10)})
    assert {c for c, _ in _codecs(_written([big]))} == {"ZSTD"}


def test_a_small_part_does_not_make_the_tables_choice(monkeypatch):
    """The shared choice is made on a part large enough to judge by, not on a few rows."""
    calls = []
    real = pqstore.choose_encodings
    monkeypatch.setattr(pqstore, "choose_encodings", lambda sample, **kw: calls.append(sample.num_rows) or real(sample, **kw))
    shared = pqstore.TableEncodings()
    _written([table(5)], encodings=shared)
    assert calls == []
    _written([stepped(5_000)], encodings=shared)
    assert calls == [5_000]


def test_the_drain_prefers_jemalloc_unless_the_user_chose_a_pool(monkeypatch) -> None:
    """prefer_jemalloc_pool (called by drain_window) makes jemalloc Arrow's default pool,
    but leaves a pool chosen through ARROW_DEFAULT_MEMORY_POOL alone."""
    from airflow_pgcdc.store.parquet import ARROW_POOL_ENV, prefer_jemalloc_pool

    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:
        pytest.skip("this pyarrow was built without jemalloc: the drain keeps Arrow's default pool")
    before = pa.default_memory_pool()
    try:
        pa.set_memory_pool(pa.system_memory_pool())
        monkeypatch.setenv(ARROW_POOL_ENV, "system")
        assert prefer_jemalloc_pool() == "system" and pa.default_memory_pool().backend_name == "system"
        monkeypatch.delenv(ARROW_POOL_ENV)
        assert prefer_jemalloc_pool() == "jemalloc" and pa.default_memory_pool().backend_name == "jemalloc"
    finally:
        pa.set_memory_pool(before)
