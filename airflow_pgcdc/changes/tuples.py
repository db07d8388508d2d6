"""Change-stream path: pgoutput TupleData (a batch of rows) → one Arrow RecordBatch.

A row is what :mod:`airflow_pgcdc.protocol.pgoutput` decodes: a tuple with one item per
column, ``None`` (NULL), :data:`~airflow_pgcdc.protocol.pgoutput.UNCHANGED_TOAST`,
``str`` (text format) or ``bytes`` (binary format, ``binary true``).

The batch is transposed once (``zip(*rows)``, in C), each column's values become one
Arrow array (``pa.array``, in C) and the column's codec converts it with compute
kernels, exactly as on the snapshot path, so both produce identical arrays.
Only a column holding unchanged-TOAST markers or a mix of text and binary values
takes a per-value pass to split them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
        if n == 0:
            empty = pa.RecordBatch.from_arrays(
                [pa.array([], f.type) for f in self.schema], schema=self.schema
            )
            return DecodedTuples(empty, pa.array([], UNCHANGED_TOAST_TYPE), [None] * ncols)
        if set(map(len, rows)) != {ncols}:
            for i, row in enumerate(rows):
                if len(row) != ncols:
                    raise ValueConversionError(
                        f"row has {len(row)} values, the relation has {ncols} columns",
                        table=self.table, row=row_offset + i,
                    )
        columns = list(zip(*rows, strict=True))  # lengths checked above
        arrays = []
        masks: list[np.ndarray | None] = []
        for i, values in enumerate(columns):
            arr, mask = self.decode_column(i, values, row_offset=row_offset)
            arrays.append(arr)
            masks.append(mask)
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
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
                return pa.nulls(n, codec.arrow_type), None
            if kinds == _STR:
                return codec.from_text(pa.array(values, pa.string())), None
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
            return codec.from_text(pa.array(texts, pa.string())), mask
        bin_arr = self._binary(codec, column, bins, row_offset)
        if not has_text:
            return bin_arr, mask
        text_arr = codec.from_text(pa.array(texts, pa.string()))
        is_bin = pa.array([b is not None for b in bins])
        return pc.if_else(is_bin, bin_arr, text_arr), mask

    def _unchanged_names(self, n: int, masks: list[np.ndarray | None]) -> pa.Array:
        if all(m is None for m in masks):
            return pa.ListArray.from_arrays(
                pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], pa.string())
            )
        names: list[list[str]] = [[] for _ in range(n)]
        for col, m in zip(self.columns, masks, strict=True):
            if m is None:
                continue
            for r in np.flatnonzero(m):
                names[r].append(col.name)
        return pa.array(names, UNCHANGED_TOAST_TYPE)
