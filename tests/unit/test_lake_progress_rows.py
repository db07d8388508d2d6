"""The rows a long write streams into a Delta table, logged at intervals
(:func:`airflow_pgcdc.lake.progress.logged_reader`): a fake clock, real Arrow batches."""

from __future__ import annotations

import logging

import pyarrow as pa

from airflow_pgcdc.lake.progress import logged_reader


def test_a_reader_logs_rows_percent_and_eta_while_read_and_a_last_line(caplog):
    batches = [pa.record_batch([pa.array(range(i * 100, i * 100 + 100))], names=["id"]) for i in range(4)]
    reader = pa.RecordBatchReader.from_batches(batches[0].schema, iter(batches))
    ticks = iter([0.0, 10.0, 40.0, 50.0, 80.0, 90.0])
    log = logging.getLogger("test.progress")
    with caplog.at_level(logging.INFO, logger="test.progress"):
        out = logged_reader(reader, total_rows=400, label="public.t: bootstrap into Delta", log=log,
                            interval=30.0, clock=lambda: next(ticks))
        assert out.read_all().num_rows == 400
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("public.t: bootstrap into Delta: 200/400 rows (50.0%), ") and "40s" in lines[0]
    assert lines[0].endswith("5 rows/s, ETA 40s"), lines
    assert lines[1].startswith("public.t: bootstrap into Delta: 400/400 rows (100.0%)") and lines[1].endswith("ETA 0s")
    assert len(lines) == 3 and lines[2].endswith("ETA 0s")


def test_a_quick_read_logs_nothing(caplog):
    batch = pa.record_batch([pa.array([1, 2])], names=["id"])
    with caplog.at_level(logging.INFO):
        out = logged_reader(pa.RecordBatchReader.from_batches(batch.schema, iter([batch])), total_rows=2,
                            label="x", log=logging.getLogger("test.progress"), clock=lambda: 0.0)
        assert out.read_all().num_rows == 2
    assert not caplog.records
