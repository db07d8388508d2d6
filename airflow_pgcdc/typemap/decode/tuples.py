"""Change-stream path: pgoutput TupleData (a batch of rows) → one Arrow RecordBatch.

A row is what :mod:`airflow_pgcdc.protocol.pgoutput` decodes: a tuple with one item per
column, ``None`` (NULL), :data:`~airflow_pgcdc.protocol.pgoutput.UNCHANGED_TOAST`,
``str`` (text format) or ``bytes`` (binary format, ``binary true``).

The batch is transposed once (flattened with ``itertools.chain``, then one strided
slice per column, in C), each column's values become one Arrow array (built over
buffers by :mod:`airflow_pgcdc.typemap.arrays`, which keeps pyarrow from importing
pandas) and the column's codec converts it with compute kernels, exactly as on the
snapshot path, so both produce identical arrays. Only a column holding
unchanged-TOAST markers or a mix of text and binary values takes a per-value pass to
split them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_pgcdc.protocol.pgoutput import UNCHANGED_TOAST, TupleData
from airflow_pgcdc.typemap import arrays
from airflow_pgcdc.typemap.codec import BadValue, Codec
from airflow_pgcdc.typemap.map import (
    PgColumn,
    ValueConversionError,
    arrow_field,
    codec_for,
    wrap_bad,
)

try:  # the native splitter (setup.py builds it when a C compiler is there); else numpy does it
    from airflow_pgcdc.typemap.decode import _textcols
except ImportError:  # pragma: no cover - depends on the install
    _textcols = None

__all__ = ["DecodedTuples", "TupleDecoder"]

UNCHANGED_TOAST_TYPE = pa.list_(pa.string())
_NONE = type(None)
_STR = {str}
_BYTES = {bytes}


@dataclass(frozen=True, slots=True)
class DecodedTuples:
    """A decoded batch of rows.

    ``batch`` has the type map's schema; unchanged TOAST values are null in it and
    ``unchanged_toast`` (``list<string>``, one entry per row) names those columns
    (an empty list for rows that have none). ``unchanged_masks`` has, per column,
    None or a numpy bool array of the rows where that column was not sent.
    """

    batch: pa.RecordBatch
    unchanged_toast: pa.Array
    unchanged_masks: list[np.ndarray | None]


class TupleDecoder:
    """Decodes batches of pgoutput rows of one relation (version) into RecordBatches."""

    def __init__(self, columns: Sequence[PgColumn], *, table: str | None = None) -> None:
        self.columns = list(columns)
        self.table = table
        self.codecs: list[Codec] = [codec_for(c) for c in self.columns]
        self.schema = pa.schema([arrow_field(c, k) for c, k in zip(self.columns, self.codecs, strict=True)])

    def decode(self, rows: Sequence[TupleData], *, row_offset: int = 0) -> DecodedTuples:
        """Decode ``rows``; ``row_offset`` is added to row numbers in errors."""
        ncols = len(self.columns)
        n = len(rows)
        if n and set(map(len, rows)) != {ncols}:
            for i, row in enumerate(rows):
                if len(row) != ncols:
                    raise ValueConversionError(
                        f"row has {len(row)} values, the relation has {ncols} columns",
                        table=self.table, row=row_offset + i,
                    )
        flat = list(chain.from_iterable(rows))  # row-major; lengths checked above
        return self.decode_columns([flat[i::ncols] for i in range(ncols)], n, row_offset=row_offset)

    def decode_columns(
        self, columns: Sequence[Sequence], n: int, *, row_offset: int = 0
    ) -> DecodedTuples:
        """Decode a batch of ``n`` rows given column by column (``columns[i]``: the
        values of column ``i``, ``n`` each)."""
        if n == 0:
            empty = pa.RecordBatch.from_arrays([arrays.nulls(0, f.type) for f in self.schema], schema=self.schema)
            return DecodedTuples(empty, self._unchanged_names(0, []), [None] * len(self.columns))
        out = []
        masks: list[np.ndarray | None] = []
        for i, values in enumerate(columns):
            arr, mask = self.decode_column(i, values, row_offset=row_offset)
            out.append(arr)
            masks.append(mask)
        batch = pa.RecordBatch.from_arrays(out, schema=self.schema)
        return DecodedTuples(batch, self._unchanged_names(n, masks), masks)

    def decode_column(
        self, index: int, values: Sequence, *, row_offset: int = 0
    ) -> tuple[pa.Array, np.ndarray | None]:
        """One column's values → (Arrow array, unchanged-TOAST mask or None)."""
        column, codec = self.columns[index], self.codecs[index]
        n = len(values)
        kinds = set(map(type, values))  # one C-level pass: which kinds of items are here
        kinds.discard(_NONE)
        try:
            if not kinds:
                return arrays.nulls(n, codec.arrow_type), None
            if kinds == _STR:
                return codec.from_text(arrays.strings(values)), None
            if kinds == _BYTES:
                return self._binary(codec, column, list(values), row_offset), None
            return self._mixed(codec, column, values, row_offset)
        except BadValue as e:
            raise wrap_bad(e, column, table=self.table, row_offset=row_offset) from None

    def decode_raw_inserts(self, messages: Sequence[bytes], *, row_offset: int = 0) -> DecodedTuples | None:
        """Decode a batch of pgoutput Insert messages as received (``I``, relation OID,
        ``N``, TupleData; outside a stream block, UTF-8 text; or Updates carrying only
        their new row, ``U``, OID, ``N``, TupleData: the same layout) without a Python object per
        value: the messages are joined into one buffer and cut column by column with numpy
        (each column's kind bytes and lengths for every row at once), each column's text
        becomes one Arrow string array over the gathered bytes, and the codecs convert it
        as in :meth:`decode`, so the batch is the one :meth:`decode` makes of the decoded
        rows. ``None`` when a message is not that simple (a binary or unchanged-TOAST value,
        a column count that is not the relation's, bytes that do not parse, text that is not
        UTF-8): the caller then decodes the messages one by one, which says what is wrong.
        The cutting is done by the native splitter (:mod:`airflow_pgcdc.typemap.decode._textcols`,
        one memcpy per value) when it is built, else by numpy (one gather per byte); both
        give the same batch."""
        n = len(messages)
        ncols = len(self.columns)
        if n == 0:
            return None
        if _textcols is not None and type(messages) is list:
            try:
                split = _textcols.split(messages, ncols)
            except TypeError:  # an item that is not bytes (a memoryview...): numpy takes any buffer
                pass
            else:
                return None if split is None else self._from_split(split, n, row_offset)
        return self._decode_raw_numpy(messages, row_offset=row_offset)

    def _from_split(self, split: list, n: int, row_offset: int) -> DecodedTuples | None:
        """The batch of :meth:`decode_raw_inserts` from the native splitter's column
        buffers (:mod:`airflow_pgcdc.typemap.decode._textcols`)."""

        def columns():
            for offsets, data, valid, nulls in split:
                if nulls == n:
                    yield None, b""
                    continue
                yield pa.Array.from_buffers(
                    pa.string(), n,
                    [None if valid is None else pa.py_buffer(valid), pa.py_buffer(offsets), pa.py_buffer(data)],
                    nulls,
                ), data

        return self._text_batch(columns(), n, row_offset)

    def _text_batch(self, columns, n: int, row_offset: int) -> DecodedTuples | None:
        """``columns``: per column ``(Arrow string array, its data bytes)``, or ``(None, b"")``
        when every value is NULL; converted by the codecs into the batch of
        :meth:`decode_raw_inserts` (None when a value is not UTF-8)."""
        out = []
        i = 0
        try:
            for i, (arr, data) in enumerate(columns):
                codec = self.codecs[i]
                if arr is None:
                    out.append(arrays.nulls(n, codec.arrow_type))
                    continue
                if data and not data.isascii():
                    arr.validate(full=True)  # not UTF-8: pa.lib.ArrowInvalid below
                out.append(codec.from_text(arr))
        except pa.ArrowInvalid:
            return None
        except BadValue as e:
            raise wrap_bad(e, self.columns[i], table=self.table, row_offset=row_offset) from None
        batch = pa.RecordBatch.from_arrays(out, schema=self.schema)
        masks: list[np.ndarray | None] = [None] * len(self.columns)
        return DecodedTuples(batch, self._unchanged_names(n, masks), masks)

    def _decode_raw_numpy(self, messages: Sequence[bytes], *, row_offset: int = 0) -> DecodedTuples | None:
        """:meth:`decode_raw_inserts` without the native splitter (the same result)."""
        n = len(messages)
        ncols = len(self.columns)
        lengths = np.fromiter(map(len, messages), dtype=np.int64, count=n)
        ends = np.cumsum(lengths)
        starts = ends - lengths
        buf = np.frombuffer(b"".join(messages), dtype=np.uint8)
        total = len(buf)
        if int(lengths.min()) < 8:
            return None
        head_ok = ((buf[starts] == 73) | (buf[starts] == 85)) & (buf[starts + 5] == 78)  # 'I' or 'U' ... 'N'
        counts = (buf[starts + 6].astype(np.int64) << 8) | buf[starts + 7]
        if not head_ok.all() or not (counts == ncols).all():
            return None
        pos = starts + 8
        cols: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (value starts, lengths, null mask)
        for _ in range(ncols):
            if int(pos.max()) >= total or (pos >= ends).any():
                return None
            kind = buf[pos]
            is_t = kind == 116
            is_n = kind == 110
            if not (is_t | is_n).all():  # 'b' (binary), 'u' (unchanged TOAST) or garbage
                return None
            if is_t.any():
                if int(pos[is_t].max()) + 4 >= total:
                    return None
                p = pos + 1
                ln = np.where(is_t, (buf[np.minimum(p, total - 1)].astype(np.int64) << 24)
                              | (buf[np.minimum(p + 1, total - 1)].astype(np.int64) << 16)
                              | (buf[np.minimum(p + 2, total - 1)].astype(np.int64) << 8)
                              | buf[np.minimum(p + 3, total - 1)], 0)
                nxt = np.where(is_t, pos + 5 + ln, pos + 1)
            else:
                ln = np.zeros(n, dtype=np.int64)
                nxt = pos + 1
            if (nxt > ends).any():
                return None
            cols.append((pos + 5, ln, is_n))
            pos = nxt
        if not (pos == ends).all():
            return None

        def columns():
            for vstart, ln, null in cols:
                if null.all():
                    yield None, b""
                    continue
                valid = ~null
                ln_valid = ln[valid]
                size = int(ln_valid.sum())
                if size:
                    starts_valid = vstart[valid]
                    # gather the values' bytes: for each value, its start repeated over its length
                    # plus 0, 1, 2...
                    offs = np.cumsum(ln_valid) - ln_valid
                    idx = np.repeat(starts_valid - offs, ln_valid) + np.arange(size, dtype=np.int64)
                    data = buf[idx].tobytes()
                else:
                    data = b""
                yield arrays._varlen(pa.string(), n, ln_valid, data, None if not null.any() else valid), data

        return self._text_batch(columns(), n, row_offset)

    # ---- internals

    def _binary(self, codec: Codec, column: PgColumn, values: list, row_offset: int) -> pa.Array:
        if not codec.binary_supported:
            raise ValueConversionError(
                "binary format not supported for this type; stream with binary false",
                table=self.table, column=column.name, pg_type=codec.pg.name, row=row_offset,
            )
        return codec.from_binary(values)

    def _mixed(self, codec: Codec, column: PgColumn, values: Sequence, row_offset: int):
        n = len(values)
        unchanged = np.zeros(n, dtype=bool)
        texts: list = [None] * n
        bins: list | None = None
        has_text = False
        for i, v in enumerate(values):
            if v is None:
                continue
            if v is UNCHANGED_TOAST:
                unchanged[i] = True
            elif isinstance(v, str):
                texts[i] = v
                has_text = True
            elif isinstance(v, bytes | bytearray | memoryview):
                if bins is None:
                    bins = [None] * n
                bins[i] = bytes(v)
            else:
                raise BadValue(i, f"not a TupleData value: {type(v).__name__}")
        mask = unchanged if unchanged.any() else None
        if bins is None:
            return codec.from_text(arrays.strings(texts)), mask
        bin_arr = self._binary(codec, column, bins, row_offset)
        if not has_text:
            return bin_arr, mask
        text_arr = codec.from_text(arrays.strings(texts))
        is_bin = arrays.bools([b is not None for b in bins])
        return pc.if_else(is_bin, bin_arr, text_arr), mask

    def _unchanged_names(self, n: int, masks: list[np.ndarray | None]) -> pa.Array:
        if all(m is None for m in masks):
            return arrays.list_array(np.zeros(n + 1, dtype=np.int32), arrays.strings(()), UNCHANGED_TOAST_TYPE)
        # row-major (row, column) pairs: each row's names in column order
        marked = np.stack([np.zeros(n, dtype=bool) if m is None else m for m in masks], axis=1)
        rows_at, cols_at = np.nonzero(marked)
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(np.bincount(rows_at, minlength=n), out=offsets[1:])
        names = [self.columns[c].name for c in cols_at.tolist()]
        return arrays.list_array(offsets, arrays.strings(names), UNCHANGED_TOAST_TYPE)
