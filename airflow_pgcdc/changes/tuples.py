"""Change-stream path: pgoutput TupleData (a batch of rows) → one Arrow RecordBatch.

A row is what :mod:`airflow_pgcdc.protocol.pgoutput` decodes: a tuple with one item per
column, ``None`` (NULL), :data:`~airflow_pgcdc.protocol.pgoutput.UNCHANGED_TOAST`,
``str`` (text format) or ``bytes`` (binary format, ``binary true``).

The batch is transposed once (flattened with ``itertools.chain``, then one strided
slice per column, in C), each column's values become one Arrow array (built over
buffers by :mod:`airflow_pgcdc.changes.arrays`, which keeps pyarrow from importing
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

from airflow_pgcdc.changes import arrays
from airflow_pgcdc.changes.codecs import BadValue, Codec
from airflow_pgcdc.changes.typemap import (
    PgColumn,
    ValueConversionError,
    arrow_field,
    codec_for,
    wrap_bad,
)
from airflow_pgcdc.protocol.pgoutput import UNCHANGED_TOAST, TupleData

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
