"""Snapshot path: ``COPY (SELECT …) TO STDOUT (FORMAT csv)`` bytes → Arrow RecordBatches.

Why CSV: pyarrow's CSV reader parses it in C++ (threads optional) straight into typed
columns, and CSV tells an empty string (``""``) from NULL (nothing) exactly; the text
COPY format's backslash escapes have no C++ decoder in pyarrow, and the binary format
has variable-length rows that cannot be split without a per-row loop.

How: :func:`copy_sql` builds the statement (the SELECT list is the columns themselves:
with :data:`~airflow_pgcdc.typemap.SESSION_SETTINGS` every type's text output
is already what the parsers expect, and casting in SQL would only cost server time).
:class:`SnapshotDecoder` takes the COPY data in chunks of any size, cuts them on row
boundaries (a newline outside quotes: quote parity), and parses each block with
``pyarrow.csv.read_csv``, asking it for the final Arrow type of every column it parses
natively (bool, ints, floats, decimal, date, time, timestamps, text) and for a string
for the others (bytea, interval, arrays...), which the column's codec then converts
with compute kernels. When a native parse fails on a block (``NaN`` in a decimal
column, ``infinity`` or a BC date in a timestamp column), that column is re-read as
string and converted by its codec, which handles the specials; from then on the
column stays on the string path ("sticky"), so a table full of ``infinity`` pays the
string path once per block, not twice.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.csv as pacsv

from airflow_pgcdc.protocol.quoting import quote_ident, quote_qualified
from airflow_pgcdc.typemap.codec import BadValue, Codec
from airflow_pgcdc.typemap.map import (
    PgColumn,
    ValueConversionError,
    arrow_field,
    codec_for,
    wrap_bad,
)

__all__ = ["COPY_OPTIONS", "SnapshotDecoder", "copy_select_list", "copy_sql"]

COPY_OPTIONS = "(FORMAT csv)"
"""The COPY options :class:`SnapshotDecoder` reads: CSV, comma, ``"`` quote, NULL as an
unquoted empty field, no header."""

DEFAULT_BLOCK_BYTES = 8 << 20


def copy_select_list(columns: Sequence[PgColumn]) -> str:
    """The SELECT list for :class:`SnapshotDecoder`: each column, quoted."""
    return ", ".join(quote_ident(c.name) for c in columns)


def copy_sql(schema: str, table: str, columns: Sequence[PgColumn], where: str | None = None) -> str:
    """``COPY (SELECT <columns> FROM schema.table [WHERE …]) TO STDOUT (FORMAT csv)``.

    ``where`` is SQL text appended as is (the caller builds it, quoting its literals).
    """
    sql = f"SELECT {copy_select_list(columns)} FROM {quote_qualified(schema, table)}"
    if where:
        sql += f" WHERE {where}"
    return f"COPY ({sql}) TO STDOUT {COPY_OPTIONS}"


_CSV_COLUMN_RE = re.compile(r"CSV column #(\d+)")
_CSV_ROW_RE = re.compile(r"Row #(\d+)")


class SnapshotDecoder:
    """Streaming decoder of ``COPY … (FORMAT csv)`` output for ``columns``.

    ``feed(data)`` accepts bytes of any size (a COPY data message, a socket read) and
    returns the RecordBatches completed so far (often none: it parses in blocks of
    about ``block_bytes``); ``finish()`` parses the rest and checks the data ended on
    a row boundary. Every batch has :attr:`schema`. ``table`` names the table in
    errors. ``use_threads``: let pyarrow parse a block on several threads (pays on a
    machine with idle cores; on a 2-core machine next to the server it does not).
    """

    def __init__(
        self,
        columns: Sequence[PgColumn],
        *,
        table: str | None = None,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        use_threads: bool = False,
    ) -> None:
        if not columns:
            raise ValueError("SnapshotDecoder needs at least one column")
        self.columns = list(columns)
        self.table = table
        self.block_bytes = block_bytes
        self.codecs: list[Codec] = [codec_for(c) for c in self.columns]
        self.schema = pa.schema([arrow_field(c, k) for c, k in zip(self.columns, self.codecs, strict=True)])
        self._native = [k.csv_type is not None for k in self.codecs]
        self._names = [f"c{i}" for i in range(len(self.columns))]
        self.use_threads = use_threads
        # a row of one NULL column is an empty line: it must not be skipped
        self._parse_options = pacsv.ParseOptions(
            newlines_in_values=True, double_quote=True, ignore_empty_lines=False
        )
        self._parts: list[bytes] = []  # pending data, from a row boundary
        self._pending = 0  # bytes in _parts
        self._threshold = block_bytes  # parse when _pending reaches this
        self._no_row_end_before = 0  # a search found no row end before this offset
        self.rows = 0
        """Rows decoded so far."""
        self.bytes = 0
        """Bytes decoded so far (complete rows only)."""
        self._finished = False

    # ---- public

    def feed(self, data: bytes | bytearray | memoryview) -> list[pa.RecordBatch]:
        """Add COPY bytes; return the batches completed so far (often none).

        Cheap per call (about 0.3 µs), so feeding one COPY data message (one row) at a
        time is fine; :meth:`decode_stream` is cheaper still for an iterable of them.
        ``bytes`` are kept by reference until parsed, other buffers are copied.
        """
        if self._finished:
            raise ValueError("feed() after finish()")
        if data.__class__ is not bytes:
            data = bytes(data)
        self._parts.append(data)
        self._pending += len(data)
        if self._pending < self._threshold:
            return []
        return self._flush()

    def decode_stream(self, chunks: Iterable[bytes | bytearray | memoryview]) -> Iterator[pa.RecordBatch]:
        """Feed every chunk (e.g. ``for batch in dec.decode_stream(psycopg_copy)``), yield
        the batches as they complete, then :meth:`finish`."""
        if self._finished:
            raise ValueError("decode_stream() after finish()")
        parts = self._parts
        append = parts.append
        for data in chunks:
            if data.__class__ is not bytes:
                data = bytes(data)
            append(data)
            self._pending += len(data)
            if self._pending >= self._threshold:
                yield from self._flush()
                parts = self._parts
                append = parts.append
        yield from self.finish()

    def finish(self) -> list[pa.RecordBatch]:
        """Decode what is left; the data must end on a row boundary."""
        if self._finished:
            return []
        self._finished = True
        buf = b"".join(self._parts)
        self._parts = []
        self._pending = 0
        if not buf:
            return []
        if buf.count(b'"') & 1 or not buf.endswith(b"\n"):
            raise ValueConversionError(
                "COPY data ends inside a row (truncated stream?)",
                table=self.table, row=self.rows, offset=self.bytes,
            )
        return self._decode(buf)

    def _flush(self) -> list[pa.RecordBatch]:
        parts = self._parts
        buf = parts[0] if len(parts) == 1 and parts[0].__class__ is bytes else b"".join(parts)
        cut = _last_row_end(buf, None, self._no_row_end_before)
        if cut <= 0:
            # no complete row yet (a huge value): wait for twice as much, so that the
            # rescans of a growing buffer stay linear overall
            self._parts = [buf]
            self._no_row_end_before = len(buf)
            self._threshold = max(self.block_bytes, 2 * len(buf))
            return []
        rest = buf[cut:]  # the incomplete last row: a small copy
        self._parts = [rest] if rest else []
        self._pending = len(rest)
        self._threshold = self.block_bytes
        self._no_row_end_before = 0
        return self._decode(memoryview(buf)[:cut] if rest else buf)

    def decode_all(self, data: bytes) -> pa.Table:
        """Convenience: decode a whole COPY output at once."""
        batches = self.feed(data) + self.finish()
        return pa.Table.from_batches(batches, schema=self.schema)

    # ---- internals

    def _decode(self, block: bytes | memoryview) -> list[pa.RecordBatch]:
        start_offset = self.bytes
        whole = False
        while True:
            types = {
                name: (codec.csv_type if native else pa.string())
                for name, codec, native in zip(self._names, self.codecs, self._native, strict=True)
            }
            convert = pacsv.ConvertOptions(
                column_types=types,
                null_values=[""],
                strings_can_be_null=True,
                quoted_strings_can_be_null=False,
                true_values=["t"],
                false_values=["f"],
            )
            # pyarrow needs every row inside one of its blocks: single-threaded, the whole
            # block is one; threaded, split it and fall back to one block for huge rows
            size = len(block) + 1
            if self.use_threads and not whole:
                size = min(size, max(self.block_bytes // 2, 1 << 20))
            read_options = pacsv.ReadOptions(
                column_names=self._names, use_threads=self.use_threads, block_size=size
            )
            try:
                table = pacsv.read_csv(pa.py_buffer(block), read_options, self._parse_options, convert)
                break
            except pa.ArrowInvalid as e:
                msg = str(e)
                if "straddl" in msg and not whole:
                    whole = True
                    continue
                m = _CSV_COLUMN_RE.search(msg)
                col = int(m.group(1)) if m else None
                if col is not None and 0 <= col < len(self._native) and self._native[col]:
                    self._native[col] = False  # sticky: this column goes the string way
                    continue
                row = _CSV_ROW_RE.search(msg)
                raise ValueConversionError(
                    f"malformed COPY CSV data: {msg}",
                    table=self.table,
                    column=self.columns[col].name if col is not None and col < len(self.columns) else None,
                    row=self.rows + int(row.group(1)) - 1 if row else self.rows,
                    offset=start_offset,
                ) from None
        out = []
        for batch in table.to_batches():
            arrays = []
            for i, codec in enumerate(self.codecs):
                arr = batch.column(i)
                if not self._native[i] and not codec.identity_text:
                    try:
                        arr = codec.from_text(arr)
                    except BadValue as e:
                        raise wrap_bad(
                            e, self.columns[i], table=self.table, row_offset=self.rows, offset=start_offset
                        ) from None
                elif arr.type != codec.arrow_type:
                    arr = arr.cast(codec.arrow_type)
                arrays.append(arr)
            rb = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
            self.rows += rb.num_rows
            out.append(rb)
        self.bytes += len(block)
        return out


def _last_row_end(buf: bytes | bytearray, quotes_parity: int | None = None, lo: int = 0) -> int:
    """Index just past the last newline of ``buf`` that ends a row, or 0 when none does.

    ``buf`` starts on a row boundary; a newline ends a row when the number of quotes
    before it is even (PostgreSQL quotes every field holding a newline and doubles
    quotes inside fields). ``quotes_parity``: the parity of all quotes in ``buf`` if
    known (saves counting them); ``lo``: no row ends before this index (a previous
    search). Walks back by quoted field, not by newline, so a huge multi-line value
    costs one scan.
    """
    if quotes_parity is None:
        quotes_parity = buf.count(b'"') & 1
    pos = buf.rfind(b"\n", lo)
    if pos < 0:
        return 0
    parity = (quotes_parity - buf.count(b'"', pos)) & 1
    while parity:
        # pos is inside a quoted field opened by the last quote before it; just before
        # that quote we are outside quotes, so look for a newline before it
        q = buf.rfind(b'"', lo, pos)
        if q < 0:
            return 0
        pos = buf.rfind(b"\n", lo, q)
        if pos < 0:
            return 0
        parity = buf.count(b'"', pos, q) & 1
    return pos + 1
