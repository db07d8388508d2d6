"""Publications: :func:`ensure_publication` (create or complete one, idempotent; column lists
and row filters on PostgreSQL 15+) and :func:`set_replica_identity_full`.

Every identifier reaches SQL through :mod:`airflow_pgcdc.protocol.quoting`; names in catalog
queries are bound parameters. Row filters are SQL expressions given by the user and are
inserted as they are (inside parentheses): pass only trusted text.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import errors as pgerr

from airflow_pgcdc.pg.slots import PG15, PublicationConflict, UnsupportedFeature
from airflow_pgcdc.pg.tables import (
    CatalogError,
    TableNotFound,
    parse_table_names,
)
from airflow_pgcdc.protocol.quoting import quote_ident, quote_qualified

log = logging.getLogger("airflow_pgcdc.pg.slots")  # the name its records had before the move

__all__ = [
    "PublicationEnsured",
    "ensure_publication",
    "set_replica_identity_full",
]

# --------------------------------------------------------------------------- publications


TableRef = str | tuple[str, str]


def _table_refs(tables: Iterable[TableRef] | None) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for t in tables or ():
        if isinstance(t, tuple):
            if len(t) != 2 or not all(isinstance(x, str) for x in t):
                raise CatalogError(f"a table is 'schema.table' or (schema, table), not {t!r}")
            ref = (t[0], t[1])
        else:
            (ref,) = parse_table_names([t])
        if ref not in out:
            out.append(ref)
    return out


def _keyed(mapping: Mapping[TableRef, Any] | None, tables: list[tuple[str, str]], what: str) -> dict:
    out: dict[tuple[str, str], Any] = {}
    for key, value in (mapping or {}).items():
        (ref,) = _table_refs([key])
        if ref not in tables:
            raise CatalogError(f"{what} given for {ref[0]}.{ref[1]}, which is not among the tables")
        out[ref] = value
    return out


def _table_oid(conn: psycopg.Connection, schema: str, table: str) -> tuple[int, str, str]:
    row = conn.execute(
        "SELECT c.oid, c.relkind::text, c.relreplident::text FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
        (schema, table),
    ).fetchone()
    if row is None:
        raise TableNotFound(f"table {schema}.{table} does not exist (or is not a table)")
    return row


@dataclass(frozen=True, slots=True)
class PublicationEnsured:
    """What :func:`ensure_publication` found and did."""

    name: str
    created: bool
    all_tables: bool
    added: tuple[str, ...] = ()  # schema.table added by this call
    present: tuple[str, ...] = ()  # asked for and already published
    notes: tuple[str, ...] = field(default=())  # differences left alone (never narrowed/dropped)

    def to_dict(self) -> dict[str, Any]:
        return {
            "publication": self.name,
            "created": self.created,
            "all_tables": self.all_tables,
            "added": list(self.added),
            "present": list(self.present),
            "notes": list(self.notes),
        }


def _spec(schema: str, table: str, columns: Sequence[str] | None, row_filter: str | None) -> str:
    text = quote_qualified(schema, table)
    if columns:
        text += " (" + ", ".join(quote_ident(c) for c in columns) + ")"
    if row_filter:
        if "\x00" in row_filter:
            raise CatalogError("a row filter cannot contain a NUL byte")
        text += f" WHERE ({row_filter})"
    return text


def ensure_publication(
    conn: psycopg.Connection,
    name: str,
    tables: Sequence[TableRef] | None = None,
    *,
    all_tables: bool = False,
    column_lists: Mapping[TableRef, Sequence[str]] | None = None,
    row_filters: Mapping[TableRef, str] | None = None,
) -> PublicationEnsured:
    """Make publication ``name`` publish at least ``tables`` (or all tables). Idempotent.

    Creates it when missing; otherwise adds the tables it lacks. It never drops or narrows:
    a table already published with another column list or row filter is left as it is
    (reported in ``notes``). ``column_lists`` / ``row_filters`` (PostgreSQL 15+) are keyed
    by table (``"schema.table"`` or ``(schema, table)``) and apply to tables this call
    adds; row filters are SQL expressions inserted as given (trusted text only).
    Raises :class:`PublicationConflict` when the existing publication cannot become what
    is asked without dropping (table list vs ``FOR ALL TABLES``), :class:`TableNotFound`.
    """
    refs = _table_refs(tables)
    if all_tables and refs:
        raise ValueError("give tables or all_tables, not both")
    cols = _keyed(column_lists, refs, "a column list")
    filters = _keyed(row_filters, refs, "a row filter")
    version = conn.info.server_version
    if (cols or filters) and version < PG15:
        raise UnsupportedFeature(
            f"column lists and row filters need PostgreSQL 15 or later; the server is {version // 10000}"
        )
    qname = quote_ident(name)
    with conn.transaction():
        oids = {ref: _table_oid(conn, *ref)[0] for ref in refs}
        row = conn.execute(
            "SELECT oid, puballtables FROM pg_publication WHERE pubname = %s", (name,)
        ).fetchone()
        if row is None:
            if all_tables:
                sql = f"CREATE PUBLICATION {qname} FOR ALL TABLES"
            elif refs:
                specs = ", ".join(_spec(s, t, cols.get((s, t)), filters.get((s, t))) for s, t in refs)
                sql = f"CREATE PUBLICATION {qname} FOR TABLE {specs}"
            else:
                sql = f"CREATE PUBLICATION {qname}"
            try:
                with conn.transaction():  # a savepoint: a concurrent create is not an error
                    conn.execute(sql)
                log.info("created publication %s", name)
                return PublicationEnsured(
                    name, True, all_tables, added=tuple(f"{s}.{t}" for s, t in refs)
                )
            except (pgerr.DuplicateObject, pgerr.UniqueViolation):
                row = conn.execute(
                    "SELECT oid, puballtables FROM pg_publication WHERE pubname = %s", (name,)
                ).fetchone()
        pub_oid, puballtables = row
        if puballtables:
            if cols or filters:
                raise PublicationConflict(
                    f"publication {name!r} is FOR ALL TABLES: it cannot take column lists or row filters",
                    hint="use another publication for filtered tables",
                )
            return PublicationEnsured(
                name, False, True, present=tuple(f"{s}.{t}" for s, t in refs)
            )
        if all_tables:
            raise PublicationConflict(
                f"publication {name!r} exists with a list of tables; it cannot become FOR ALL "
                "TABLES without being dropped",
                hint=f"DROP PUBLICATION {qname} and ensure it again, or give its tables",
            )
        present, missing, notes = [], [], []
        for ref in refs:
            schema, table = ref
            member = _publication_member(conn, pub_oid, oids[ref], version)
            if member is None:
                missing.append(ref)
                continue
            present.append(f"{schema}.{table}")
            have_cols, have_filter = member
            want_cols, want_filter = cols.get(ref), filters.get(ref)
            if want_cols is not None and sorted(want_cols) != sorted(have_cols or []):
                notes.append(
                    f"{schema}.{table} is published with column list {have_cols or 'all columns'}, "
                    f"not {list(want_cols)}: left as it is"
                )
            if want_filter is not None and have_filter is None:
                notes.append(f"{schema}.{table} is published without a row filter: left as it is")
            elif want_filter is not None and _norm(want_filter) != _norm(have_filter):
                notes.append(
                    f"{schema}.{table} is published with row filter {have_filter}, not "
                    f"({want_filter}): left as it is"
                )
        if missing:
            specs = ", ".join(_spec(s, t, cols.get((s, t)), filters.get((s, t))) for s, t in missing)
            conn.execute(f"ALTER PUBLICATION {qname} ADD TABLE {specs}")
            log.info("publication %s: added %s", name, ", ".join(f"{s}.{t}" for s, t in missing))
        for note in notes:
            log.warning("publication %s: %s", name, note)
        return PublicationEnsured(
            name, False, False,
            added=tuple(f"{s}.{t}" for s, t in missing), present=tuple(present), notes=tuple(notes),
        )


def _norm(expr: str | None) -> str:
    text = "".join((expr or "").split())
    while text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    return text


def _publication_member(conn, pub_oid: int, rel_oid: int, version: int):
    """None if the table is not published by the publication, else (columns or None,
    row filter or None). Tables in a published schema (15+) count as members."""
    if version >= PG15:
        row = conn.execute(
            "SELECT (SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_attribute a "
            "        WHERE a.attrelid = pr.prrelid AND a.attnum = ANY(pr.prattrs)), "
            "       pg_get_expr(pr.prqual, pr.prrelid) "
            "FROM pg_publication_rel pr WHERE pr.prpubid = %s AND pr.prrelid = %s",
            (pub_oid, rel_oid),
        ).fetchone()
        if row is not None:
            return row[0], row[1]
        in_schema = conn.execute(
            "SELECT 1 FROM pg_publication_namespace pn JOIN pg_class c ON c.relnamespace = pn.pnnspid "
            "WHERE pn.pnpubid = %s AND c.oid = %s",
            (pub_oid, rel_oid),
        ).fetchone()
        return (None, None) if in_schema else None
    row = conn.execute(
        "SELECT 1 FROM pg_publication_rel WHERE prpubid = %s AND prrelid = %s", (pub_oid, rel_oid)
    ).fetchone()
    return (None, None) if row else None


def set_replica_identity_full(conn: psycopg.Connection, tables: Sequence[TableRef]) -> list[str]:
    """``ALTER TABLE ... REPLICA IDENTITY FULL`` on each table (and each partition of a
    partitioned one) that does not have it yet. Returns the tables changed."""
    changed: list[str] = []
    with conn.transaction():
        for schema, table in _table_refs(tables):
            oid, relkind, _ = _table_oid(conn, schema, table)
            targets = [(schema, table)]
            if relkind == "p":
                targets += conn.execute(
                    "SELECT n.nspname, c.relname FROM pg_partition_tree(%s::oid::regclass) t "
                    "JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE t.relid <> %s::oid::regclass AND c.relkind IN ('r', 'p') ORDER BY 1, 2",
                    (oid, oid),
                ).fetchall()
            for s, t in targets:
                (ident,) = conn.execute(
                    "SELECT c.relreplident::text FROM pg_class c JOIN pg_namespace n "
                    "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
                    (s, t),
                ).fetchone()
                if ident != "f":
                    conn.execute(f"ALTER TABLE {quote_qualified(s, t)} REPLICA IDENTITY FULL")
                    changed.append(f"{s}.{t}")
    if changed:
        log.info("REPLICA IDENTITY FULL set on %s", ", ".join(changed))
    return changed
