"""Catalog queries for type information: what the PostgreSQL → Arrow type map needs.

:func:`load_type_info` resolves OIDs (from a table's columns, or from pgoutput
Relation/Type messages) into :class:`~airflow_pgcdc.protocol.pgtypes.PgTypeInfo`
trees: domains to their base types, arrays to their element types, enums with their
labels, composites with their attributes, ranges and multiranges with their subtypes.
:func:`load_table_columns` gives a table's columns as
:class:`~airflow_pgcdc.protocol.pgtypes.PgColumn` objects ready for the type map.

Every value reaches SQL as a psycopg parameter; nothing is formatted into the text.
Works on any psycopg 3 connection (sync), inside or outside a transaction (for the
snapshot: inside the snapshot's repeatable-read transaction, so the types are the
ones the snapshot sees).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from airflow_pgcdc.errors import HintedError
from airflow_pgcdc.pg.errors import PgError
from airflow_pgcdc.protocol.pgtypes import PgAttribute, PgColumn, PgTypeInfo

__all__ = ["TypeNotFound", "UnsupportedEncoding", "check_encoding", "load_table_columns", "load_type_info"]


class UnsupportedEncoding(HintedError, PgError):
    """The database's encoding is SQL_ASCII: its text has no known character set (bytes are
    stored as sent), so neither psycopg nor Arrow can read it as text."""


def check_encoding(conn) -> None:
    """Refuse a SQL_ASCII database up front (:class:`UnsupportedEncoding`), before anything
    is created or read: psycopg passes text to it as bytes, and every catalog query then
    failed with ``operator does not exist: name = bytea``."""
    encoding = conn.info.parameter_status("server_encoding")
    if encoding == "SQL_ASCII":
        raise UnsupportedEncoding(
            f"database {conn.info.dbname!r} is encoded SQL_ASCII: its text is bytes of no known character "
            "set, which airflow-pgcdc cannot carry as text; nothing was done",
            hint="copy the data into a database created with ENCODING 'UTF8' (after checking which "
                 "encoding the application really wrote) and point the pipeline there",
        )


class TypeNotFound(PgError):
    """A type OID (or a table) that the catalogs do not know (dropped meanwhile?)."""


_TYPE_SQL = """
SELECT t.oid::int8, t.typname::text, n.nspname::text, t.typtype::text,
       t.typcategory::text, t.typdelim::text,
       CASE WHEN t.typelem <> 0 AND e.typarray = t.oid THEN t.typelem::int8 END,
       CASE WHEN t.typtype = 'd' THEN t.typbasetype::int8 END,
       t.typtypmod, t.typndims,
       COALESCE(r.rngsubtype, mr.rngsubtype)::int8,
       mr.rngtypid::int8,
       CASE WHEN t.typtype = 'e' THEN ARRAY(
           SELECT l.enumlabel::text FROM pg_catalog.pg_enum l
           WHERE l.enumtypid = t.oid ORDER BY l.enumsortorder) END,
       CASE WHEN t.typtype = 'c' THEN ARRAY(
           SELECT a.attname::text FROM pg_catalog.pg_attribute a
           WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped
           ORDER BY a.attnum) END,
       CASE WHEN t.typtype = 'c' THEN ARRAY(
           SELECT a.atttypid::int8 FROM pg_catalog.pg_attribute a
           WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped
           ORDER BY a.attnum) END,
       CASE WHEN t.typtype = 'c' THEN ARRAY(
           SELECT a.atttypmod FROM pg_catalog.pg_attribute a
           WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped
           ORDER BY a.attnum) END
FROM pg_catalog.pg_type t
JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
LEFT JOIN pg_catalog.pg_type e ON e.oid = t.typelem
LEFT JOIN pg_catalog.pg_range r ON r.rngtypid = t.oid
LEFT JOIN pg_catalog.pg_range mr ON mr.rngmultitypid = t.oid
WHERE t.oid = ANY(%s::oid[])
"""


def _fetch_rows(conn: Any, oids: Iterable[int]) -> dict[int, tuple]:
    """The raw catalog rows of ``oids`` and of every type they refer to."""
    rows: dict[int, tuple] = {}
    pending = {int(o) for o in oids}
    while pending:
        batch = sorted(pending)
        found = conn.execute(_TYPE_SQL, (batch,)).fetchall()
        got = {row[0]: row for row in found}
        missing = [o for o in batch if o not in got]
        if missing:
            raise TypeNotFound(f"type OID(s) not found in pg_type: {missing}")
        rows.update(got)
        pending = set()
        for row in found:
            element, base, subtype, range_oid, att_types = row[6], row[7], row[10], row[11], row[14]
            for ref in (element, base, subtype, range_oid, *(att_types or ())):
                if ref is not None and ref != 0 and ref not in rows:
                    pending.add(ref)
    return rows


def load_type_info(conn: Any, oids: Iterable[int]) -> dict[int, PgTypeInfo]:
    """``{oid: PgTypeInfo}`` for every OID in ``oids`` (a psycopg connection).

    Domains are resolved to their base type (``base``, with the innermost domain's
    ``typtypmod``/``typndims``), arrays to their element type, enums get their labels
    in sort order, composites their live attributes in order, ranges and multiranges
    their subtype. Unknown OIDs raise :class:`TypeNotFound`.
    """
    wanted = [int(o) for o in oids]
    if not wanted:
        return {}
    rows = _fetch_rows(conn, wanted)
    built: dict[int, PgTypeInfo] = {}

    def build(oid: int, depth: int = 0) -> PgTypeInfo:
        info = built.get(oid)
        if info is not None:
            return info
        if depth > 64:
            raise TypeNotFound(f"type OID {oid}: type definitions nest too deeply")
        (_, name, schema, kind, category, delim, element, base, typmod, ndims, subtype,
         range_oid, labels, att_names, att_types, att_typmods) = rows[oid]
        kw: dict[str, Any] = {}
        if element is not None:
            kw["element"] = build(element, depth + 1)
        if kind == "d" and base is not None:
            base_info = build(base, depth + 1)
            if base_info.kind == "d":  # nested domain: take the innermost base and typmod
                kw["base"] = base_info.base
                kw["base_typmod"] = base_info.base_typmod if typmod == -1 else typmod
                kw["base_ndims"] = base_info.base_ndims if not ndims else ndims
            else:
                kw["base"] = base_info
                kw["base_typmod"] = typmod
                kw["base_ndims"] = ndims
        if kind == "e":
            kw["labels"] = tuple(labels or ())
        if kind == "c":
            kw["attributes"] = tuple(
                PgAttribute(n, build(t, depth + 1), m)
                for n, t, m in zip(att_names or (), att_types or (), att_typmods or (), strict=True)
            )
        if subtype is not None:
            kw["subtype"] = build(subtype, depth + 1)
        if range_oid is not None:
            kw["range"] = build(range_oid, depth + 1)
        info = PgTypeInfo(
            oid=oid, name=name, schema=schema, kind=kind, category=category,
            delimiter=delim, **kw,
        )
        built[oid] = info
        return info

    return {oid: build(oid) for oid in wanted}


_COLUMNS_SQL = """
SELECT a.attname::text, a.atttypid::int8, a.atttypmod, a.attndims
FROM pg_catalog.pg_attribute a
JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""


def load_table_columns(conn: Any, schema: str, table: str) -> list[PgColumn]:
    """The live columns of ``schema.table`` in order, with resolved types."""
    rows = conn.execute(_COLUMNS_SQL, (schema, table)).fetchall()
    if not rows:
        raise TypeNotFound(f"table {schema}.{table} not found (or has no columns)")
    types = load_type_info(conn, {r[1] for r in rows})
    return [
        PgColumn(name=name, type=types[oid], typmod=typmod, ndims=ndims)
        for name, oid, typmod, ndims in rows
    ]
