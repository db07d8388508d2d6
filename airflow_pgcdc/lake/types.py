"""Arrow types of the type map (``docs/types.md``) ↔ the types stored in Delta tables.

Delta Lake has every Arrow type the type map produces except one: ``time``. A PostgreSQL
``time(p)`` column (Arrow ``time64[us]``) is stored in Delta as ``int64`` microseconds
since midnight (the Parquet ``TIME(MICROS)`` storage value; ``24:00:00`` is
86,400,000,000), and so is the element of a ``time[]`` column (``list<time64[us]>`` →
``list<int64>``). Every other type is stored as it is.

* :func:`to_delta_schema` / :func:`to_delta_type` / :func:`to_delta_batch`: what the
  merge writes (field names, nullability and metadata kept);
* :func:`from_delta_array`: what a reader (``pgcdc verify``) does to get the type map's
  Arrow type back from a Delta column, refusing any other difference of type.

Pure pyarrow: no Airflow, no Spark (the module ships to Spark executors).
"""

from __future__ import annotations

import pyarrow as pa

__all__ = [
    "DeltaTypeMismatch",
    "from_delta_array",
    "to_delta_batch",
    "to_delta_schema",
    "to_delta_type",
]

_TIME_US = pa.time64("us")
_UTC_NAMES = frozenset({"UTC", "+00:00", "Etc/UTC", "Z", "utc", "GMT", "Etc/GMT"})


class DeltaTypeMismatch(TypeError):
    """A Delta column whose type is not the Delta form of the type map's type."""


def _is_time(t: pa.DataType) -> bool:
    return t == _TIME_US


def to_delta_type(t: pa.DataType) -> pa.DataType:
    """The Delta storage type of type-map type ``t``: ``time64[us]`` → ``int64``,
    ``list<time64[us]>`` → ``list<int64>``; anything else unchanged."""
    if _is_time(t):
        return pa.int64()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = to_delta_type(t.value_type)
        if inner is t.value_type or inner == t.value_type:
            return t
        field = t.value_field.with_type(inner)
        return pa.list_(field) if pa.types.is_list(t) else pa.large_list(field)
    return t


def to_delta_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with each field's type replaced by :func:`to_delta_type` (names,
    nullability, field and schema metadata kept)."""
    return pa.schema(
        [f.with_type(to_delta_type(f.type)) for f in schema], metadata=schema.metadata
    )


def _to_delta_array(arr: pa.Array) -> pa.Array:
    t = arr.type
    if _is_time(t):
        return arr.view(pa.int64())
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and to_delta_type(t) != t:
        return arr.cast(to_delta_type(t))  # list<time64[us]> → list<int64>: the same integers
    return arr


def to_delta_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` in Delta storage form (:func:`to_delta_schema`): values unchanged,
    ``time`` columns as int64 microseconds since midnight."""
    schema = to_delta_schema(batch.schema)
    if schema.equals(batch.schema, check_metadata=False):
        return batch
    arrays = [_to_delta_array(batch.column(i)) for i in range(batch.num_columns)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# --------------------------------------------------------------------------- reading back


def _normal(t: pa.DataType) -> pa.DataType:
    """``t`` with its physical variants collapsed: large/view strings, binaries and
    lists to the plain ones, dictionaries to their values, UTC spellings to ``UTC``,
    recursively."""
    if pa.types.is_dictionary(t):
        return _normal(t.value_type)
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if (
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
    ):
        return pa.list_(_normal(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _normal(f.type)) for f in t])
    if pa.types.is_timestamp(t) and t.tz is not None and t.tz in _UTC_NAMES:
        return pa.timestamp(t.unit, tz="UTC")
    return t


def _from_delta(arr: pa.Array, target: pa.DataType) -> pa.Array:
    if arr.type == target:
        return arr
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
        if arr.type == target:
            return arr
    delta_type = to_delta_type(target)
    if _normal(arr.type) != _normal(delta_type):
        raise DeltaTypeMismatch(f"expected {delta_type} (for {target}), found {arr.type}")
    if _is_time(target):  # int64 (or int64 in a physical variant): view, no range check
        return arr.view(_TIME_US)
    if pa.types.is_struct(target) and isinstance(arr, pa.StructArray):
        return _struct_from_delta(arr, target)
    # lists of time and the physical variants: casts between these types keep the values
    return arr.cast(target)


def _struct_from_delta(arr: pa.StructArray, target: pa.StructType) -> pa.StructArray:
    """A struct column back in the type map's struct type. Delta (and Spark) make every
    nested field nullable, so a NULL struct (a NULL ``interval``) comes back with NULL
    children: under a NULL parent they are placeholders, set to zero where the type map
    declares the child non-nullable; a NULL child under a non-NULL parent is a real
    difference and still fails the cast."""
    import pyarrow.compute as pc

    parent_null = arr.is_null()
    children = []
    for i, f in enumerate(target):
        child = arr.field(i)
        if not f.nullable and child.null_count and pa.types.is_integer(f.type):
            child = pc.if_else(parent_null, pa.scalar(0, child.type), child)
        children.append(_from_delta(child, f.type))
    mask = parent_null if arr.null_count else None
    return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)


def from_delta_array(
    arr: pa.Array | pa.ChunkedArray, field_from_typemap: pa.Field | pa.DataType
) -> pa.Array | pa.ChunkedArray:
    """A Delta column's values in the type map's type (``field_from_typemap``'s, e.g.
    :func:`airflow_pgcdc.typemap.arrow_field`): int64 µs back to
    ``time64[us]`` (``24:00:00`` included: no range check), ``list<int64>`` to
    ``list<time64[us]>``, large/view/dictionary variants to the plain types. Values are never
    changed; any other type difference raises :class:`DeltaTypeMismatch`."""
    target = field_from_typemap.type if isinstance(field_from_typemap, pa.Field) else field_from_typemap
    if isinstance(arr, pa.ChunkedArray):
        chunks = [_from_delta(c, target) for c in arr.chunks]
        return pa.chunked_array(chunks, type=target)
    return _from_delta(arr, target)
