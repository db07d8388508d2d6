"""Parquet part files streamed to S3 with bounded memory.

:class:`ParquetPartWriter` writes Arrow record batches as one Parquet file into a binary
sink (a :class:`~airflow_pgcdc.store.multipart.MultipartWriter`, or any writable file object).
Small batches are gathered into row groups of at most ``row_group_rows`` rows and about
``row_group_bytes`` bytes of Arrow data, so the file has sensible row groups whatever
the batch size, and memory holds at most one row group plus the sink's upload buffers.

:class:`PartSequence` writes a stream of batches as ``part-00000.parquet``,
``part-00001.parquet``… rolling over to a new part at ``max_rows`` rows (exact) or
``target_bytes`` bytes (checked after each row group, so a part may exceed it by at most
one compressed row group).

Memory bound of a sequence writing to S3: one row group of Arrow data
(``row_group_bytes``) + Parquet's encoding buffers for that row group (at most its
compressed size) + ``upload_part_size * (max_in_flight + 1)``.

Why about 640 lines in one module: the per-column encoding choice (dictionary, delta,
plain, sampled on a part's first row group) is the part writer's own decision, made once
per part and shared by a sequence's later parts; it has no other user.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_pgcdc.store.layout import part_name
from airflow_pgcdc.store.multipart import MultipartWriter
from airflow_pgcdc.store.s3 import DEFAULT_PART_SIZE, MiB, StoreError

__all__ = [
    "DEFAULT_ROW_GROUP_BYTES",
    "DEFAULT_ROW_GROUP_ROWS",
    "DEFAULT_TARGET_PART_BYTES",
    "ParquetPartWriter",
    "ParquetWriteError",
    "PartInfo",
    "PartSequence",
    "TableEncodings",
    "choose_delta_columns",
    "choose_dictionary_columns",
    "choose_encodings",
    "prefer_jemalloc_pool",
]

DEFAULT_ROW_GROUP_ROWS = 128 * 1024
DEFAULT_ROW_GROUP_BYTES = 64 * MiB
DEFAULT_TARGET_PART_BYTES = 256 * MiB


ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"
"""Arrow's own setting of its default memory pool: when set, :func:`prefer_jemalloc_pool`
leaves the choice alone."""


def prefer_jemalloc_pool() -> str:
    """Make jemalloc Arrow's default memory pool in this process, unless the user chose a
    pool (:data:`ARROW_POOL_ENV`) or this pyarrow has no jemalloc; returns the default
    pool's backend name. The drain builds and frees tens of megabytes of Arrow buffers per
    window chunk: with mimalloc, pyarrow's usual default on Linux, fresh (huge) pages were
    faulted in and zeroed again and again (3–4% of the window writer's thread in a
    profile). ``bench/drain.py --rounds 3 --workload wide``, six runs per pool, pools
    alternated: peak RSS 246–250 MB with mimalloc, 225–232 with jemalloc, every run; the
    drain's CPU 9.4–10.9 s per million rows with mimalloc, 9.0–9.8 with jemalloc (within
    the runs' noise). Buffers allocated before the switch are still freed by their own pool."""
    current = pa.default_memory_pool()
    if os.environ.get(ARROW_POOL_ENV) or current.backend_name == "jemalloc":
        return current.backend_name
    try:
        pool = pa.jemalloc_memory_pool()
    except NotImplementedError:  # pyarrow built without jemalloc (ArrowNotImplementedError is one)
        return current.backend_name
    pa.set_memory_pool(pool)
    return pool.backend_name


class ParquetWriteError(StoreError, ValueError):
    """Batches that cannot be written to a part (schema mismatch, writer already closed)."""


@dataclass(frozen=True)
class PartInfo:
    """One finished part file: its key (or name), rows, bytes (the file size) and row groups."""

    key: str
    number: int
    rows: int
    bytes: int
    row_groups: int

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    def to_dict(self, base: str = "") -> dict[str, Any]:
        """``{"path", "rows", "bytes"}`` as manifests list parts; ``path`` is relative to
        ``base`` (a key prefix ending in ``/``) when given."""
        path = self.key
        if base:
            if not path.startswith(base):
                raise ParquetWriteError(f"part {path!r} is not under {base!r}")
            path = path[len(base) :]
        return {"path": path, "rows": self.rows, "bytes": self.bytes}


class _Sink:
    """What pyarrow sees: writes go through, ``close`` is ours to call (not pyarrow's)."""

    def __init__(self, target: Any) -> None:
        self._target = target
        self.closed = False

    def write(self, data: Any) -> int:
        return self._target.write(data)

    def tell(self) -> int:
        return self._target.tell()

    def flush(self) -> None:
        pass

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


DICTIONARY_MAX_DISTINCT_RATIO = 0.5
"""A column is dictionary-encoded when its first row group has at most this share of
distinct values (see :func:`choose_dictionary_columns`)."""

DICTIONARY_SAMPLE_ROWS = 131_072
"""How many leading rows of the first row group :func:`choose_dictionary_columns` counts."""


def choose_dictionary_columns(sample: pa.Table, sample_rows: int = DICTIONARY_SAMPLE_ROWS) -> list[str] | bool:
    """The columns worth Parquet dictionary encoding, judged on ``sample`` (a row group).

    Dictionary encoding pays for repeated values (status codes, dates, foreign keys) and
    is pure cost for unique ones (keys, hashes, timestamps, measures): the writer builds
    a hash table of every value, then falls back to plain encoding when the dictionary
    outgrows its page, having spent the work, and the file comes out larger. Measured on
    the snapshot benchmark's table (1M rows, 8 columns): 0.39 s and 39 MB with every
    column dictionary-encoded, 0.18 s and 29 MB with only its low-cardinality columns.
    A column whose distinct count (``pyarrow.compute.count_distinct``) over the first
    :data:`DICTIONARY_SAMPLE_ROWS` rows is at most :data:`DICTIONARY_MAX_DISTINCT_RATIO` of
    those rows keeps the dictionary; types the kernel cannot count (nested ones) keep it
    too. Returns ``True`` for an empty sample (Parquet's default). ``sample_rows``: how
    many leading rows to count (default :data:`DICTIONARY_SAMPLE_ROWS`).

    Counting is bounded because it is not cheap (a hash table per column, superlinear in
    practice): on that table, 0.70 s for all 1M rows of a part, 0.04 s for 131,072. The
    price: a column whose values only start repeating after that many rows (100,000
    distinct values in a 1M-row part, in key order) is judged unique; that cost 1% of
    file size there (27.4 vs 27.1 MB).
    """
    sample = sample.slice(0, sample_rows)
    rows = sample.num_rows
    if rows == 0:
        return True
    chosen = []
    for name, column in zip(sample.column_names, sample.columns, strict=True):
        if pa.types.is_boolean(column.type) or pa.types.is_null(column.type):
            continue  # Parquet does not dictionary-encode these anyway
        try:
            distinct = pc.count_distinct(column, mode="all").as_py()
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
            chosen.append(name)
            continue
        if distinct <= rows * DICTIONARY_MAX_DISTINCT_RATIO:
            chosen.append(name)
    return chosen


DELTA_MAX_SIZE_RATIO = 0.5
"""An integer column is written DELTA_BINARY_PACKED when its sample's deltas would take at
most this share of the plain encoding's bytes (see :func:`choose_delta_columns`)."""

_DELTA_BLOCK = 128  # Parquet's DELTA_BINARY_PACKED block: 128 values, 4 miniblocks of 32
_DELTA_MINIBLOCK = 32


def _delta_packed_bytes(values: np.ndarray) -> int:
    """The bytes DELTA_BINARY_PACKED would give ``values`` (int64), bit widths counted
    the way the encoding sets them: per miniblock of 32 deltas, relative to the smallest
    delta of their block of 128. Headers are counted roughly (10 bytes a block)."""
    deltas = np.diff(values)  # wraps on overflow, as the encoding does
    whole = len(deltas) - len(deltas) % _DELTA_BLOCK
    if not whole:
        return 8 * len(values)
    blocks = deltas[:whole].reshape(-1, _DELTA_BLOCK)
    relative = (blocks - blocks.min(axis=1, keepdims=True)).view(np.uint64)
    widest = relative.reshape(len(blocks), -1, _DELTA_MINIBLOCK).max(axis=2)
    widths = np.zeros(widest.shape, dtype=np.int64)
    nonzero = widest > 0
    widths[nonzero] = np.floor(np.log2(widest[nonzero].astype(np.float64))).astype(np.int64) + 1
    per_value = widths.sum() * _DELTA_MINIBLOCK / 8 / whole
    return int(per_value * len(values) + 10 * len(blocks) * len(values) / whole)


def choose_delta_columns(sample: pa.Table, skip: Iterable[str] = (),
                         sample_rows: int = DICTIONARY_SAMPLE_ROWS) -> dict[str, str]:
    """``{column: "DELTA_BINARY_PACKED"}`` for the integer-like columns (ints, dates,
    times, timestamps) of ``sample`` whose values move in small steps: keys and serials,
    event times, anything sorted or clustered.

    Plain encoding stores every such value at full width (4 or 8 bytes) and leaves the
    order to zstd; delta encoding stores the bit-packed differences. On the snapshot
    benchmark's table (1M rows), encoding its bigint key and its timestamp as deltas
    made the part 23.9 MB instead of 27.4 and its encoding 0.14 CPU-s instead of 0.16.
    A column qualifies when its non-null sample values would take at most
    :data:`DELTA_MAX_SIZE_RATIO` of their plain bytes (estimated by
    :func:`_delta_packed_bytes`); values in random order never do. ``skip``: columns
    that are dictionary-encoded (Parquet takes one or the other). ``sample_rows``: as in
    :func:`choose_dictionary_columns`.
    """
    sample = sample.slice(0, sample_rows)
    skip = set(skip)
    chosen = {}
    for name, column in zip(sample.column_names, sample.columns, strict=True):
        t = column.type
        if name in skip or pa.types.is_dictionary(t):
            continue
        if pa.types.is_integer(t) and t.bit_width in (32, 64):
            width = t.bit_width // 8
        elif pa.types.is_date32(t) or pa.types.is_time32(t):
            width = 4
        elif pa.types.is_timestamp(t) or pa.types.is_time64(t):
            width = 8
        else:
            continue
        if pa.types.is_unsigned_integer(t) and width == 8:
            continue  # uint64 is not an integer type Parquet delta-encodes losslessly here
        values = column.drop_null().combine_chunks()
        if len(values) < 2 * _DELTA_BLOCK:
            continue
        # the data buffer as it is (Array.to_numpy would import pandas for temporal types)
        dtype = np.int32 if width == 4 else np.int64
        as_int = np.frombuffer(values.buffers()[1], dtype=dtype, count=values.offset + len(values))[values.offset :]
        if _delta_packed_bytes(as_int.astype(np.int64)) <= DELTA_MAX_SIZE_RATIO * width * len(values):
            chosen[name] = "DELTA_BINARY_PACKED"
    return chosen


ENCODING_MIN_ROWS = 2 * _DELTA_BLOCK
"""A first row group of fewer rows keeps Parquet's default encodings (see :func:`choose_encodings`)."""


def choose_encodings(sample: pa.Table, sample_rows: int = DICTIONARY_SAMPLE_ROWS) -> dict[str, Any]:
    """The writer options (``use_dictionary``, ``column_encoding``) for files whose first
    row group is ``sample``: :func:`choose_dictionary_columns`, then
    :func:`choose_delta_columns` among the rest. A sample of fewer than
    :data:`ENCODING_MIN_ROWS` rows (a small part: a window touching many tables writes
    hundreds of them) keeps Parquet's defaults without counting anything: no column
    would be delta-encoded anyway, and on so few rows the choice changes a few bytes
    while counting costs a dozen pyarrow calls per part. ``sample_rows``: how many of the
    sample's leading rows are counted (see :func:`choose_dictionary_columns`)."""
    if sample.num_rows < ENCODING_MIN_ROWS:
        return {"use_dictionary": True}
    dictionary = choose_dictionary_columns(sample, sample_rows)
    if dictionary is True:
        return {"use_dictionary": True}
    delta = choose_delta_columns(sample, skip=dictionary, sample_rows=sample_rows)
    return {"use_dictionary": dictionary, "column_encoding": delta} if delta else {"use_dictionary": dictionary}


SMALL_PART_BYTES = 256 << 10
"""A part whose only row group has fewer than :data:`ENCODING_MIN_ROWS` rows and at most
this many bytes of Arrow data is written with ``small_part_compression`` and no dictionary
(see :class:`ParquetPartWriter`)."""


class TableEncodings:
    """One encoding choice shared by the part files of one table.

    A part whose writer opens before any choice exists makes one (:func:`choose_encodings`
    on its first row group); parts opened after that reuse it, so a table split into many
    parts counts its distinct values about once instead of once per part. Parts that
    start together (one per worker) each choose, without waiting for each other: the
    choice is a few dozen short pyarrow calls, and a worker blocked on them behind a busy
    GIL would stall its COPY. Thread-safe. ``sample_rows``: how many leading rows of the
    first row group are counted (:func:`choose_encodings`).
    """

    def __init__(self, sample_rows: int = DICTIONARY_SAMPLE_ROWS) -> None:
        self._choice: dict[str, Any] | None = None
        self.sample_rows = sample_rows

    def choose(self, sample: pa.Table) -> dict[str, Any]:
        choice = self._choice
        if choice is None:  # a race only repeats the work
            choice = self._choice = choose_encodings(sample, sample_rows=self.sample_rows)
        return choice


class ParquetPartWriter:
    """One Parquet file written into ``sink`` (zstd, bounded row groups).

    ``sink`` needs ``write`` and ``tell``; if it has ``abort`` (a MultipartWriter), a failure
    or :meth:`abort` calls it so nothing half-written becomes visible. :meth:`close` writes
    the footer, closes the sink and returns a :class:`PartInfo` (``key`` is ``name``, or the
    sink's ``key`` attribute).

    A part that is one small row group (closed with fewer than :data:`ENCODING_MIN_ROWS`
    rows and at most :data:`SMALL_PART_BYTES` of Arrow data buffered, nothing written
    before) is written with ``small_part_compression`` (default snappy) and no dictionary:
    zstd and dictionaries cost a fixed setup per column chunk that, on a 200-row part of a
    12-column table, is 60% of the encoding (0.52 ms vs 0.22 ms; 10 vs 15 KB), and a window
    touching hundreds of tables writes hundreds of such parts. ``None`` keeps ``compression``.
    """

    def __init__(
        self,
        sink: Any,
        schema: pa.Schema,
        *,
        name: str | None = None,
        number: int = 0,
        row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
        row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
        compression: str = "zstd",
        compression_level: int | None = None,
        encodings: TableEncodings | None = None,
        small_part_compression: str | None = "snappy",
        **parquet_options: Any,
    ) -> None:
        if row_group_rows < 1 or row_group_bytes < 1:
            raise ValueError("row_group_rows and row_group_bytes must be positive")
        self.schema = schema
        self.sink = sink
        self.key = name if name is not None else getattr(sink, "key", "")
        self.number = number
        self.row_group_rows = row_group_rows
        self.row_group_bytes = row_group_bytes
        self.rows = 0
        self.row_groups = 0
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._pending_bytes = 0
        self._state = "open"
        self._options = {
            "write_statistics": True,
            "store_schema": True,
            "compression": compression,
            "compression_level": compression_level,
        } | parquet_options
        self.encodings = encodings
        self.small_part_compression = small_part_compression
        # the Parquet writer opens with the first row group, which decides each column's
        # encoding (see choose_encodings; shared by a table's parts through ``encodings``);
        # until then nothing is written
        self._writer: pq.ParquetWriter | None = None
        # a sink that can upload what it holds at a row group's end (MultipartWriter.upload_ready)
        # is told so after each row group but the last: the upload overlaps the next row group's
        # encoding instead of waiting for the part's close
        self._upload_ready = getattr(sink, "upload_ready", None)

    # -- properties

    @property
    def closed(self) -> bool:
        return self._state != "open"

    @property
    def bytes_written(self) -> int:
        """Bytes handed to the sink so far (whole row groups; excludes buffered rows)."""
        return self.sink.tell()

    @property
    def buffered_rows(self) -> int:
        return self._pending_rows

    # -- writing

    def write_batch(self, batch: pa.RecordBatch) -> None:
        """Add ``batch`` (its schema must equal the writer's, metadata aside)."""
        self._check_open()
        if not batch.schema.equals(self.schema, check_metadata=False):
            self.abort()
            raise ParquetWriteError(
                f"batch schema differs from the part's schema:\n{batch.schema}\nvs\n{self.schema}",
                key=self.key or None,
            )
        try:
            offset = 0
            n = batch.num_rows
            while offset < n:
                room = self.row_group_rows - self._pending_rows
                piece = batch.slice(offset, room) if offset or room < n else batch
                self._pending.append(piece)
                self._pending_rows += piece.num_rows
                self._pending_bytes += piece.nbytes
                offset += piece.num_rows
                if (
                    self._pending_rows >= self.row_group_rows
                    or self._pending_bytes >= self.row_group_bytes
                ):
                    self.flush_row_group()
        except BaseException:
            self.abort()
            raise

    def write_table(self, table: pa.Table) -> None:
        for batch in table.to_batches():
            self.write_batch(batch)

    def write_batches(self, batches: Iterable[pa.RecordBatch]) -> None:
        for batch in batches:
            self.write_batch(batch)

    def flush_row_group(self) -> None:
        """Write the buffered rows as one row group (no-op when none are buffered)."""
        self._flush(last=False)

    def _flush(self, last: bool) -> None:
        self._check_open()
        if not self._pending_rows:
            return
        table = pa.Table.from_batches(self._pending, schema=self.schema)
        self._pending = []
        rows = self._pending_rows
        small = last and rows < ENCODING_MIN_ROWS and self._pending_bytes <= SMALL_PART_BYTES
        self._pending_rows = 0
        self._pending_bytes = 0
        try:
            self._open_writer(table, small)
            self._writer.write_table(table, row_group_size=max(rows, 1))
            if not last and self._upload_ready is not None:  # the row group's bytes go now (see __init__)
                self._upload_ready()
        except BaseException:
            self.abort()
            raise
        self.rows += rows
        self.row_groups += 1

    def close(self) -> PartInfo:
        """Flush, write the footer, close (complete) the sink; return the part's info."""
        self._check_open()
        try:
            self._flush(last=True)
            self._open_writer(None)
            self._writer.close()
            size = self.sink.tell()
            self.sink.close()
        except BaseException:
            self.abort()
            raise
        self._state = "closed"
        return PartInfo(
            key=self.key,
            number=self.number,
            rows=self.rows,
            bytes=size,
            row_groups=self.row_groups,
        )

    def abort(self) -> None:
        """Drop buffered rows and abort the sink; nothing becomes visible. Idempotent."""
        if self._state != "open":
            return
        self._state = "aborted"
        self._pending = []
        self._pending_rows = self._pending_bytes = 0
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        self._abort_sink()

    def __enter__(self) -> ParquetPartWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif not self.closed:
            self.close()

    # -- internals

    def _open_writer(self, first: pa.Table | None, small: bool = False) -> None:
        """Open the Parquet writer (once), choosing the encodings from ``first``; ``small``:
        ``first`` is all the part will hold, and small (see the class's docstring)."""
        if self._writer is not None:
            return
        options = dict(self._options)
        if first is not None and "use_dictionary" not in options and "column_encoding" not in options:
            if small and self.small_part_compression is not None:
                options |= {"use_dictionary": False, "compression": self.small_part_compression,
                            "compression_level": None}
            else:
                options |= self.encodings.choose(first) if self.encodings is not None else choose_encodings(first)
        self._writer = pq.ParquetWriter(_Sink(self.sink), self.schema, **options)

    def _check_open(self) -> None:
        if self._state != "open":
            raise ParquetWriteError(f"the part writer is {self._state}", key=self.key or None)

    def _abort_sink(self) -> None:
        abort = getattr(self.sink, "abort", None)
        if abort is not None:
            abort()
        else:
            with contextlib.suppress(Exception):
                self.sink.close()


class PartSequence:
    """Batches of one schema written as numbered Parquet parts, rolling over by size.

    ``key_for(number)`` names part ``number`` (e.g. ``lambda n: layout.snapshot_part(slot,
    sid, schema, table, n)``); by default parts are :class:`MultipartWriter` uploads to
    ``client``/``bucket``. ``open_sink(key)`` replaces that (a local file, a test double).

    The parts share one encoding choice (``encodings``, a :class:`TableEncodings`; by
    default one of the sequence's own), made on the first part's first row group.

    :meth:`close` returns every :class:`PartInfo` in order. With ``write_empty`` (default)
    a sequence that received no rows still writes ``part 0`` with zero rows, so every table
    has at least one file carrying its schema. :meth:`abort` aborts the open part; parts
    already completed stay (their keys are in :attr:`parts`; remove the prefix to undo).
    """

    def __init__(
        self,
        schema: pa.Schema,
        key_for: Callable[[int], str] | None = None,
        *,
        client: Any = None,
        bucket: str | None = None,
        open_sink: Callable[[str], Any] | None = None,
        max_rows: int | None = None,
        target_bytes: int | None = DEFAULT_TARGET_PART_BYTES,
        row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
        row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
        upload_part_size: int = DEFAULT_PART_SIZE,
        max_in_flight: int = 1,
        first_number: int = 0,
        write_empty: bool = True,
        compression: str = "zstd",
        compression_level: int | None = None,
        encodings: TableEncodings | None = None,
        **parquet_options: Any,
    ) -> None:
        if open_sink is None and (client is None or bucket is None):
            raise ValueError("give client and bucket (S3 parts) or open_sink")
        if max_rows is not None and max_rows < 1:
            raise ValueError(f"max_rows must be positive, got {max_rows}")
        self.schema = schema
        self.key_for = key_for or part_name
        self.client = client
        self.bucket = bucket
        self._open_sink = open_sink
        self.max_rows = max_rows
        self.target_bytes = target_bytes
        self.row_group_rows = min(row_group_rows, max_rows) if max_rows else row_group_rows
        self.row_group_bytes = row_group_bytes
        self.upload_part_size = upload_part_size
        self.max_in_flight = max_in_flight
        self.write_empty = write_empty
        # one encoding choice for all the parts (counted on the first part's first row group)
        self.encodings = encodings if encodings is not None else TableEncodings()
        self._writer_options = dict(
            compression=compression, compression_level=compression_level, encodings=self.encodings,
            **parquet_options,
        )
        self.parts: list[PartInfo] = []
        self._next = first_number
        self._current: ParquetPartWriter | None = None
        self._state = "open"

    @property
    def rows(self) -> int:
        """Rows in finished parts plus rows accepted by the open part."""
        current = self._current
        extra = (current.rows + current.buffered_rows) if current else 0
        return sum(p.rows for p in self.parts) + extra

    @property
    def bytes(self) -> int:
        """Bytes of finished parts plus bytes already sent for the open part."""
        current = self._current
        return sum(p.bytes for p in self.parts) + (current.bytes_written if current else 0)

    def write_batch(self, batch: pa.RecordBatch) -> None:
        if self._state != "open":
            raise ParquetWriteError(f"the part sequence is {self._state}")
        n = batch.num_rows
        if n == 0:
            return  # an empty part is written by close() if need be
        try:
            offset = 0
            while offset < n:
                writer = self._writer()
                room = n - offset
                if self.max_rows is not None:
                    room = min(room, self.max_rows - writer.rows - writer.buffered_rows)
                writer.write_batch(batch if room == n else batch.slice(offset, room))
                offset += room
                if self._full(writer):
                    self._finish()
        except BaseException:
            self.abort()
            raise

    def write_table(self, table: pa.Table) -> None:
        for batch in table.to_batches():
            self.write_batch(batch)

    def write_batches(self, batches: Iterable[pa.RecordBatch]) -> None:
        for batch in batches:
            self.write_batch(batch)

    def flush_row_group(self, min_rows: int = 1) -> None:
        """Encode the open part's buffered rows as a row group now, when there are at
        least ``min_rows`` of them (else nothing happens)."""
        current = self._current
        if self._state != "open" or current is None or current.buffered_rows < max(min_rows, 1):
            return
        try:
            current.flush_row_group()
        except BaseException:
            self.abort()
            raise

    def close(self) -> list[PartInfo]:
        """Finish the open part (or write an empty part 0) and return all parts."""
        if self._state == "closed":
            return list(self.parts)
        if self._state != "open":
            raise ParquetWriteError(f"the part sequence is {self._state}")
        try:
            if self._current is not None:
                self._finish()
            elif not self.parts and self.write_empty:
                self._writer()
                self._finish()
        except BaseException:
            self.abort()
            raise
        self._state = "closed"
        return list(self.parts)

    def roll(self) -> None:
        """Finish the open part now (its memory is released once uploaded); the next batch
        opens a new part. Nothing happens when no part is open."""
        if self._state != "open":
            raise ParquetWriteError(f"the part sequence is {self._state}")
        if self._current is not None:
            try:
                self._finish()
            except BaseException:
                self.abort()
                raise

    def abort(self) -> None:
        if self._state != "open":
            return
        self._state = "aborted"
        if self._current is not None:
            self._current.abort()
            self._current = None

    def __enter__(self) -> PartSequence:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    # -- internals

    def _writer(self) -> ParquetPartWriter:
        if self._current is None:
            number = self._next
            self._next += 1
            key = self.key_for(number)
            if self._open_sink is not None:
                sink = self._open_sink(key)
            else:
                sink = MultipartWriter(
                    self.client,
                    self.bucket,  # type: ignore[arg-type]
                    key,
                    part_size=self.upload_part_size,
                    max_in_flight=self.max_in_flight,
                    content_type="application/vnd.apache.parquet",
                )
            self._current = ParquetPartWriter(
                sink,
                self.schema,
                name=key,
                number=number,
                row_group_rows=self.row_group_rows,
                row_group_bytes=self.row_group_bytes,
                **self._writer_options,
            )
        return self._current

    def _full(self, writer: ParquetPartWriter) -> bool:
        if self.max_rows is not None and writer.rows + writer.buffered_rows >= self.max_rows:
            return True
        return self.target_bytes is not None and writer.bytes_written >= self.target_bytes

    def _finish(self) -> None:
        writer, self._current = self._current, None
        assert writer is not None
        self.parts.append(writer.close())
