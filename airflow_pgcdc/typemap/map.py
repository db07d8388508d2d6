"""The PostgreSQL → Arrow type map, shared by the snapshot and the change stream.

The package: this module is the mapping and the public API; the codecs, one module per type
family, are internal: :mod:`.codec` (the base, constants, shared helpers), :mod:`.text`,
:mod:`.numeric`, :mod:`.times`, :mod:`.pgarray`.

One rule decides the Arrow type of a column from its type, typmod and declared array
dimensions (:func:`arrow_field`), so a table's snapshot parts and its change rows
have the same schema. The table of mappings, with how NaN, ±infinity, ``24:00:00``,
multi-dimensional arrays and the rest are represented, is ``docs/types.md``.

Converters:

* snapshot: :class:`~airflow_pgcdc.typemap.decode.copy_text.SnapshotDecoder` (COPY CSV
  bytes → RecordBatches), with :func:`~airflow_pgcdc.typemap.decode.copy_text.copy_sql`;
* change stream: :class:`~airflow_pgcdc.typemap.decode.tuples.TupleDecoder` (pgoutput
  TupleData, text or binary → RecordBatch);
* single column: :func:`convert_text` / :func:`convert_binary`;
* the inverse, for verification: :func:`to_pg_text` / :func:`array_to_pg_text` give
  PostgreSQL's own text output of a mapped value.

Text values must come from a session with :data:`SESSION_SETTINGS` (ISO dates,
``postgres`` intervals, shortest-exact floats, hex bytea, UTF-8): run
:func:`session_setup_sql` on snapshot sessions and pass :data:`SESSION_OPTIONS` as the
libpq ``options`` of replication connections.

Errors: a value that cannot be converted raises :class:`ValueConversionError` (or its
subclass :class:`UnrepresentableValue` for a valid PostgreSQL value that has no lossless
form in the mapped type), naming table, column, type, row and value.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import pyarrow as pa

from airflow_pgcdc.errors import PgcdcError
from airflow_pgcdc.protocol.pgoutput import Relation, Type
from airflow_pgcdc.protocol.pgtypes import (
    BUILTIN_TYPES,
    PgAttribute,
    PgColumn,
    PgTypeInfo,
    builtin_type,
    format_type,
    numeric_precision_scale,
)
from airflow_pgcdc.protocol.quoting import quote_literal
from airflow_pgcdc.typemap import arrays
from airflow_pgcdc.typemap.codec import (
    DATE_NEG_INFINITY,
    DATE_POS_INFINITY,
    INTERVAL_NEG_INFINITY,
    INTERVAL_POS_INFINITY,
    INTERVAL_TYPE,
    TIME_24H_US,
    TIMESTAMP_NEG_INFINITY,
    TIMESTAMP_POS_INFINITY,
    BadValue,
    Codec,
)
from airflow_pgcdc.typemap.numeric import (
    BoolCodec,
    DecimalCodec,
    FloatCodec,
    IntCodec,
    NumericTextCodec,
)
from airflow_pgcdc.typemap.pgarray import ArrayCodec
from airflow_pgcdc.typemap.text import ByteaCodec, TextCodec
from airflow_pgcdc.typemap.times import (
    DateCodec,
    IntervalCodec,
    TimeCodec,
    TimestampCodec,
    TimetzCodec,
)

__all__ = [
    "BUILTIN_TYPES",
    "DATE_NEG_INFINITY",
    "DATE_POS_INFINITY",
    "INTERVAL_NEG_INFINITY",
    "INTERVAL_POS_INFINITY",
    "INTERVAL_TYPE",
    "SESSION_OPTIONS",
    "SESSION_SETTINGS",
    "TIMESTAMP_NEG_INFINITY",
    "TIMESTAMP_POS_INFINITY",
    "TIME_24H_US",
    "PgAttribute",
    "PgColumn",
    "PgTypeInfo",
    "TypeMapError",
    "UnrepresentableValue",
    "ValueConversionError",
    "array_to_pg_text",
    "arrow_field",
    "arrow_schema",
    "arrow_type",
    "binary_supported",
    "builtin_type",
    "codec_for",
    "columns_from_relation",
    "convert_binary",
    "convert_text",
    "format_type",
    "session_setup_sql",
    "to_pg_text",
]

SESSION_SETTINGS: dict[str, str] = {
    "DateStyle": "ISO, YMD",
    "IntervalStyle": "postgres",
    "TimeZone": "UTC",
    "extra_float_digits": "1",
    "bytea_output": "hex",
    "client_encoding": "UTF8",
}
"""The output settings the text parsers rely on. ``TimeZone`` only makes timestamptz
text cheaper to parse (any zone parses exactly); the others change what the text
means."""

SESSION_OPTIONS = " ".join(f"-c {k}={v.replace(' ', '')}" for k, v in SESSION_SETTINGS.items())
""":data:`SESSION_SETTINGS` as a libpq ``options`` value (replication connections)."""


def session_setup_sql() -> list[str]:
    """``SET`` statements applying :data:`SESSION_SETTINGS` to a session."""
    return [f"SET {name} TO {quote_literal(value)}" for name, value in SESSION_SETTINGS.items()]


# --------------------------------------------------------------------------- errors


class TypeMapError(PgcdcError):
    """Base class of the type map's errors."""


class ValueConversionError(TypeMapError, ValueError):
    """A value that cannot be converted to its mapped Arrow type.

    ``table``, ``column``, ``pg_type`` say what; ``row`` (0-based, counted from the
    start of the stream or batch the decoder was given) and ``offset`` (byte offset of
    the COPY chunk holding the row, snapshot path) say where; ``value`` is the
    offending text (or bytes), shortened.
    """

    def __init__(
        self,
        reason: str,
        *,
        table: str | None = None,
        column: str | None = None,
        pg_type: str | None = None,
        row: int | None = None,
        offset: int | None = None,
        value: Any = None,
    ) -> None:
        self.reason = reason
        self.table = table
        self.column = column
        self.pg_type = pg_type
        self.row = row
        self.offset = offset
        self.value = value
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.table:
            where.append(f"table {self.table}")
        if self.column is not None:
            where.append(f"column {self.column}" + (f" ({self.pg_type})" if self.pg_type else ""))
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.offset is not None:
            where.append(f"COPY chunk at byte {self.offset}")
        text = ", ".join(where)
        text = f"{text}: {self.reason}" if text else self.reason
        if self.value is not None:
            v = repr(self.value)
            text += f" (value {v[:80] + '...' if len(v) > 80 else v})"
        return text


class UnrepresentableValue(ValueConversionError):
    """A valid PostgreSQL value with no lossless form in the column's Arrow type (a
    timestamp after 294247 AD, an array whose dimensions or lower bounds a list cannot
    hold). The message says how to keep it (e.g. map the column ``as_text``)."""


def wrap_bad(
    bad: BadValue, column: PgColumn, *, table: str | None = None, row_offset: int = 0,
    offset: int | None = None,
) -> ValueConversionError:
    """The public error for a codec's :class:`BadValue`."""
    cls = UnrepresentableValue if bad.unrepresentable else ValueConversionError
    return cls(
        bad.reason,
        table=table,
        column=column.name,
        pg_type=format_type(column.type, column.typmod, column.ndims),
        row=row_offset + bad.index,
        offset=offset,
        value=bad.value,
    )


# --------------------------------------------------------------------------- the map


class AsTextCodec(TextCodec):
    """A column mapped ``as_text``: exact text; binary values go through the typed codec
    and back to text."""

    def __init__(self, inner: Codec):
        super().__init__(inner.pg, inner.typmod, None, encoding="text")
        self.inner = inner
        self.binary_supported = inner.binary_supported

    def from_binary(self, values):
        if isinstance(self.inner, ArrayCodec):
            return arrays.strings(self.inner.binary_to_text(values))
        return arrays.strings(self.inner.to_text(self.inner.from_binary(values)))


def _codec(t: PgTypeInfo, typmod: int, ndims: int) -> Codec:
    if t.kind == "d" and t.base is not None:
        ndims = ndims or t.base_ndims
        t, typmod = t.base, (t.base_typmod if t.base_typmod != -1 else typmod)
    if t.element is not None:
        element = _codec(t.element, typmod, 0)
        return ArrayCodec(t, typmod, element, ndims, t.element.delimiter or ",")
    if t.kind == "e":
        return TextCodec(t, typmod, "utf8", encoding="enum")
    if t.kind != "b" or not t.is_builtin:
        # composites, ranges, multiranges, extension types (hstore, citext, ...): exact text
        return TextCodec(t, typmod, None)
    name = t.name
    if name == "bool":
        return BoolCodec(t, typmod)
    if name == "int2":
        return IntCodec(t, typmod, pa.int16(), ">i2")
    if name == "int4":
        return IntCodec(t, typmod, pa.int32(), ">i4")
    if name == "int8":
        return IntCodec(t, typmod, pa.int64(), ">i8")
    if name in ("oid", "xid", "cid"):
        return IntCodec(t, typmod, pa.int64(), ">u4")
    if name in ("float4", "float8"):
        return FloatCodec(t, typmod, single=name == "float4")
    if name == "numeric":
        ps = numeric_precision_scale(typmod)
        if ps is not None and DecimalCodec.fits(*ps):
            return DecimalCodec(t, typmod, *ps)
        return NumericTextCodec(t, typmod)
    if name in ("text", "varchar", "bpchar", "name", "json", "unknown"):
        return TextCodec(t, typmod, "utf8", encoding="json" if name == "json" else "text")
    if name == "jsonb":
        return TextCodec(t, typmod, "jsonb", encoding="json")
    if name == "char":
        return TextCodec(t, typmod, "char")
    if name == "uuid":
        return TextCodec(t, typmod, "uuid", encoding="uuid")
    if name == "bytea":
        return ByteaCodec(t, typmod)
    if name == "date":
        return DateCodec(t, typmod)
    if name == "time":
        return TimeCodec(t, typmod)
    if name == "timetz":
        return TimetzCodec(t, typmod)
    if name == "timestamp":
        return TimestampCodec(t, typmod, tz=False)
    if name == "timestamptz":
        return TimestampCodec(t, typmod, tz=True)
    if name == "interval":
        return IntervalCodec(t, typmod)
    return TextCodec(t, typmod, None)


def codec_for(column: PgColumn) -> Codec:
    """The codec converting ``column``'s values (internal API of the converters)."""
    codec = _codec(column.type, column.typmod, column.ndims)
    if column.as_text and not codec.identity_text:
        codec = AsTextCodec(codec)
    return codec


def arrow_type(column: PgColumn) -> pa.DataType:
    """The Arrow type of ``column``'s values."""
    return codec_for(column).arrow_type


def arrow_field(column: PgColumn, codec: Codec | None = None) -> pa.Field:
    """The Arrow field of ``column``: always nullable (an unchanged TOAST value of a NOT
    NULL column is null in a change row), with metadata ``pg_type`` (e.g.
    ``numeric(12,2)``, ``int4[]``, ``public.mood``), ``pg_type_oid``, ``pg_typmod``,
    ``pg_encoding`` (how values are represented: ``int``, ``decimal``, ``text``,
    ``timestamptz``, ``array``...), ``pg_base_type`` for domains, ``pg_numeric_nan``
    (the NaN sentinel of a decimal column) and ``pg_infinity`` (the +/- infinity
    sentinels of date and timestamp columns, as integers)."""
    codec = codec or codec_for(column)
    md = {
        b"pg_type": format_type(column.type, column.typmod, column.ndims).encode(),
        b"pg_type_oid": str(column.type.oid).encode(),
        b"pg_typmod": str(column.typmod).encode(),
    }
    if column.type.kind == "d" and column.type.base is not None:
        md[b"pg_base_type"] = format_type(
            column.type.base, column.type.base_typmod, column.type.base_ndims
        ).encode()
    if column.ndims:
        md[b"pg_ndims"] = str(column.ndims).encode()
    md.update(codec.metadata())
    inner = codec
    while isinstance(inner, ArrayCodec):
        inner = inner.element
    if inner is not codec:
        md.update({k: v for k, v in inner.metadata().items() if k != b"pg_encoding"})
        md[b"pg_element_encoding"] = inner.encoding.encode()
    return pa.field(column.name, codec.arrow_type, nullable=True, metadata=md)


def arrow_schema(columns: Sequence[PgColumn]) -> pa.Schema:
    """The Arrow schema of a table's columns (see :func:`arrow_field`)."""
    return pa.schema([arrow_field(c) for c in columns])


def binary_supported(column: PgColumn | PgTypeInfo) -> bool:
    """Whether binary-format values (pgoutput ``binary true``) of this column/type can
    be decoded. A drain should ask for binary mode only if every published column's
    type says yes."""
    if isinstance(column, PgTypeInfo):
        column = PgColumn("?", column)
    return codec_for(column).binary_supported


def columns_from_relation(
    relation: Relation,
    types: Mapping[int, PgTypeInfo] | None = None,
    *,
    ndims: Mapping[str, int] | None = None,
    as_text: Collection[str] = (),
    type_messages: Mapping[int, Type] | None = None,
) -> list[PgColumn]:
    """The :class:`PgColumn` list of a pgoutput Relation message, for :class:`TupleDecoder`.

    A column's type comes from ``types`` (``pg.catalog.load_type_info`` of the
    relation's type OIDs: the only way to map user types like the snapshot does), else
    from the built-ins, else it is exact text named after its Type message (if given).
    ``ndims`` (declared array dimensions by column name, as ``load_table_columns``
    reports them) and ``as_text`` must match what the snapshot used, or the schemas
    differ.
    """
    types = types or {}
    ndims = ndims or {}
    out = []
    for rc in relation.columns:
        info = types.get(rc.type_oid) or builtin_type(rc.type_oid)
        if info is None:
            msg = (type_messages or {}).get(rc.type_oid)
            info = (
                PgTypeInfo.unknown(rc.type_oid, msg.type_name, msg.namespace)
                if msg is not None
                else PgTypeInfo.unknown(rc.type_oid)
            )
        out.append(
            PgColumn(rc.name, info, rc.type_modifier, ndims.get(rc.name, 0), rc.name in as_text)
        )
    return out


# --------------------------------------------------------------------------- one column


def convert_text(
    values: pa.Array | Sequence[str | None],
    column: PgColumn,
    *,
    table: str | None = None,
    row_offset: int = 0,
) -> pa.Array:
    """PostgreSQL text values (``None`` = NULL) of one column → an Arrow array of its
    mapped type."""
    codec = codec_for(column)
    arr = values if isinstance(values, pa.Array) else arrays.strings(values)
    try:
        return codec.from_text(arr)
    except BadValue as e:
        raise wrap_bad(e, column, table=table, row_offset=row_offset) from None


def convert_binary(
    values: Sequence[bytes | None],
    column: PgColumn,
    *,
    table: str | None = None,
    row_offset: int = 0,
) -> pa.Array:
    """Binary-format values (``typsend`` output, ``None`` = NULL) of one column → Arrow."""
    codec = codec_for(column)
    if not codec.binary_supported:
        raise ValueConversionError(
            "binary format not supported for this type; use text format (binary false)",
            table=table, column=column.name,
            pg_type=format_type(column.type, column.typmod, column.ndims), row=row_offset,
        )
    try:
        return codec.from_binary(list(values))
    except BadValue as e:
        raise wrap_bad(e, column, table=table, row_offset=row_offset) from None


# --------------------------------------------------------------------------- inverse


def array_to_pg_text(arr: pa.Array | pa.ChunkedArray, column: PgColumn) -> list[str | None]:
    """PostgreSQL's text output (``col::text``) of each mapped value (None for NULL)."""
    codec = codec_for(column)
    if isinstance(arr, pa.ChunkedArray):
        out: list[str | None] = []
        for chunk in arr.chunks:
            out.extend(codec.to_text(chunk))
        return out
    return codec.to_text(arr)


def to_pg_text(value: pa.Scalar, column: PgColumn | PgTypeInfo, typmod: int = -1) -> str | None:
    """PostgreSQL's text output of one mapped value: ``to_pg_text(batch.column(i)[r], col)``
    equals ``SELECT col::text`` of that row (with :data:`SESSION_SETTINGS`)."""
    if isinstance(column, PgTypeInfo):
        column = PgColumn("?", column, typmod)
    return array_to_pg_text(pa.repeat(value, 1), column)[0]
