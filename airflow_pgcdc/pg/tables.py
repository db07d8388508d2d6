"""Which tables to copy and stream, and what they look like: catalog queries.

Tables come from a publication (``pg_publication_tables``, honouring PostgreSQL 15+
column lists and row filters) or from an explicit list. Each table's key is its
replica identity index when ``REPLICA IDENTITY USING INDEX`` is set, else its primary
key; a table with neither has no key (``has_key`` is False) and the merge will need
``REPLICA IDENTITY FULL`` or key columns given by the user.

Generated columns: a table's columns are those its publication streams. Before PostgreSQL
18 pgoutput never streams a generated column, and it is left out; on 18 a stored generated
column is streamed when the publication says ``publish_generated_columns = stored`` or its
column list names it, and then it is copied too (``pg_publication_tables.attnames`` on 18
lists exactly the streamed columns; before 18 it also lists generated columns, which are
not streamed). Without a publication (``describe_table``), generated columns are left out
unless ``generated=True`` (stored ones only; PostgreSQL 18's virtual ones are never
streamed).

Run these on a connection that has imported the exported snapshot, so the catalog
is read as of the snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import psycopg

from airflow_pgcdc.errors import HintedError, PgcdcError
from airflow_pgcdc.protocol.quoting import quote_ident, quote_qualified


class CatalogError(PgcdcError):
    """The catalog does not have what was asked for."""


class PublicationMissing(HintedError, CatalogError):
    """A publication a job is to read or stream does not exist in the database (or covers no
    table); nothing was read or acknowledged. The one error for it, whichever job meets it
    (the snapshot's catalog reads, the slot checks, the drain)."""

    kind = "publication_missing"

    def __init__(self, message: str, *, publication: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.publication = publication


PublicationNotFound = PublicationMissing
"""The 0.1 name of :class:`PublicationMissing` (here and in the drain): the same class."""


class PublicationsDisagree(HintedError, CatalogError):
    """Two publications publish one table with different column lists: the server refuses
    to stream it ("cannot use different column lists for table ... in different
    publications"), so the copy refuses it too."""


class TableNotFound(CatalogError):
    """A table named by the user does not exist (or is not a table)."""


class PartitionPublishedOtherwise(HintedError, CatalogError):
    """A partitioned table, or a partition, was named, but the publication streams its rows
    under other names (``publish_via_partition_root``): a copy under the given name would
    be a Delta table no change ever reaches. ``names`` are the names the stream uses."""

    def __init__(self, message: str, *, hint: str | None = None, names: Sequence[str] = ()) -> None:
        super().__init__(message, hint=hint)
        self.names = tuple(names)


class PublishedPerLeaf(PartitionPublishedOtherwise):
    """A partitioned table named, published per leaf (``publish_via_partition_root = false``)."""


class PublishedViaRoot(PartitionPublishedOtherwise):
    """A partition named, published through its root (``publish_via_partition_root = true``)."""


@dataclass(frozen=True, slots=True)
class ColumnInfo:
    name: str
    attnum: int
    type_oid: int
    typmod: int
    not_null: bool
    type_name: str  # format_type(): e.g. "numeric(12,2)", "character varying(10)", "text[]"
    ndims: int = 0  # pg_attribute.attndims (declared array dimensions)
    generated: bool = False  # a stored generated column (attgenerated = 's')
    xmin: str | None = None  # the transaction that last wrote its pg_attribute row


@dataclass(frozen=True, slots=True)
class TableInfo:
    oid: int
    schema: str
    name: str
    relkind: str  # r (table) or p (partitioned)
    replica_identity: str  # d, f, i, n
    columns: tuple[ColumnInfo, ...]
    key_columns: tuple[str, ...]
    key_source: str | None  # "primary key" | "replica identity index" | None
    relpages: int
    reltuples: float
    row_filter: str | None = None
    column_list: tuple[str, ...] | None = None
    partitions: tuple[tuple[str, str], ...] = field(default=())  # a partitioned table's leaves
    relfilenode: int = 0  # its file (0: a partitioned table has none)
    # a slice resync (pgcdc resync --where): only the rows matching this predicate are copied
    slice_where: str | None = None

    @property
    def has_key(self) -> bool:
        return bool(self.key_columns)

    @property
    def qualified(self) -> str:
        """``"schema"."table"``, quoted."""
        return quote_qualified(self.schema, self.name)

    @property
    def from_clause(self) -> str:
        """What a query reads the table's own rows from: ``ONLY "schema"."table"`` for a
        plain table (an inheritance parent's children are tables of their own: published,
        their rows stream under their own names; not published, they are not part of the
        parent's changes either), the whole tree for a partitioned table (its partitions'
        rows are its rows)."""
        return self.qualified if self.relkind == "p" else "ONLY " + self.qualified

    @property
    def display(self) -> str:
        return f"{self.schema}.{self.name}"

    def key_warning(self) -> str | None:
        """A message for the user when the table has no key, else None."""
        if self.has_key:
            return None
        if self.replica_identity == "f":
            return (
                f"table {self.display} has no primary key: it is copied, and the merge will "
                "match rows on all columns (REPLICA IDENTITY FULL); give key columns for a real key"
            )
        return (
            f"table {self.display} has no primary key or replica identity index: it is copied "
            "and flagged; updates and deletes cannot be merged until you set "
            f"ALTER TABLE {self.qualified} REPLICA IDENTITY FULL or give its key columns"
        )

    def select_list(self) -> str:
        return ", ".join(quote_ident(c.name) for c in self.columns)


_TABLE_SQL = """
SELECT c.oid, n.nspname, c.relname, c.relkind::text, c.relreplident::text,
       c.relpages, c.reltuples, c.relfilenode::bigint
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')
"""

_COLUMNS_SQL = """
SELECT a.attname, a.attnum, a.atttypid, a.atttypmod, a.attnotnull,
       format_type(a.atttypid, a.atttypmod), a.attndims, a.attgenerated <> '', a.xmin::text
FROM pg_attribute a
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated IN ('', 's')
ORDER BY a.attnum
"""

_KEY_SQL = """
SELECT i.indisprimary, i.indisreplident, array_agg(a.attname ORDER BY k.ord)
FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s AND (i.indisprimary OR i.indisreplident)
  AND k.ord <= i.indnkeyatts  -- the key columns, not the INCLUDE (covering) ones
GROUP BY i.indexrelid, i.indisprimary, i.indisreplident
"""

_PARTITIONS_SQL = """
SELECT n.nspname, c.relname FROM pg_partition_tree(%s::regclass) t
JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE t.isleaf ORDER BY 1, 2
"""


def describe_table(
    conn: psycopg.Connection,
    schema: str,
    name: str,
    *,
    row_filter: str | None = None,
    column_list: Sequence[str] | None = None,
    generated: bool = False,
) -> TableInfo:
    """The table ``schema.name`` as the catalog has it. Its columns: every column, stored
    generated ones only with ``generated``; only those ``column_list`` names when given
    (a publication's column list, recorded on the result)."""
    row = conn.execute(_TABLE_SQL, (schema, name)).fetchone()
    if row is None:
        raise TableNotFound(f"table {schema}.{name} does not exist (or is not a table)")
    oid, nsp, rel, relkind, replident, relpages, reltuples, relfilenode = row
    columns = [ColumnInfo(*r) for r in conn.execute(_COLUMNS_SQL, (oid,)).fetchall()]
    if not generated:
        columns = [c for c in columns if not c.generated]
    if column_list is not None:
        wanted = set(column_list)
        columns = [c for c in columns if c.name in wanted]
    key_columns: tuple[str, ...] = ()
    key_source = None
    keys = conn.execute(_KEY_SQL, (oid,)).fetchall()
    replident_idx = [cols for _pk, ri, cols in keys if ri]
    primary = [cols for pk, _ri, cols in keys if pk]
    if replident == "i" and replident_idx:
        key_columns, key_source = tuple(replident_idx[0]), "replica identity index"
    elif primary and replident != "n":
        key_columns, key_source = tuple(primary[0]), "primary key"
    partitions: tuple[tuple[str, str], ...] = ()
    if relkind == "p":
        partitions = tuple(
            (str(s), str(t)) for s, t in conn.execute(_PARTITIONS_SQL, (quote_qualified(nsp, rel),)).fetchall()
        )
    return TableInfo(
        oid=oid,
        schema=nsp,
        name=rel,
        relkind=relkind,
        replica_identity=replident,
        columns=tuple(columns),
        key_columns=key_columns,
        key_source=key_source,
        relpages=max(0, int(relpages)),
        reltuples=float(reltuples),
        row_filter=row_filter,
        column_list=tuple(column_list) if column_list is not None else None,
        partitions=partitions,
        relfilenode=int(relfilenode or 0),
    )


def publication_tables(conn: psycopg.Connection, publication: str) -> list[TableInfo]:
    """The tables of ``publication``, with their column lists and row filters (15+)."""
    if conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)).fetchone() is None:
        raise PublicationMissing(
            f"publication {publication!r} does not exist in database {conn.info.dbname!r}",
            publication=publication,
            hint=f"check the spelling (`SELECT pubname FROM pg_publication`), or create it: "
                 f"pgcdc publication ensure --name {publication} --tables ...",
        )
    if conn.info.server_version >= 150000:
        rows = conn.execute(
            "SELECT schemaname, tablename, attnames, rowfilter FROM pg_publication_tables "
            "WHERE pubname = %s ORDER BY 1, 2",
            (publication,),
        ).fetchall()
    else:
        rows = [
            (s, t, None, None)
            for s, t in conn.execute(
                "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1, 2",
                (publication,),
            ).fetchall()
        ]
    # PostgreSQL 18: attnames is exactly what the stream carries, stored generated columns
    # included when published (publish_generated_columns = stored, or a column list naming
    # them). Before 18 generated columns are never streamed (attnames lists them anyway).
    pg18 = conn.info.server_version >= 180000
    gencols = pg18 and conn.execute(
        "SELECT pubgencols::text = 's' FROM pg_catalog.pg_publication WHERE pubname = %s", (publication,)
    ).fetchone()[0]
    return [_as_streamed(conn, schema, table, attnames, rowfilter, bool(gencols), pg18)
            for schema, table, attnames, rowfilter in rows]


def publications_tables(conn: psycopg.Connection, publications: Sequence[str]) -> list[TableInfo]:
    """The tables ``publications`` publish together, as one stream of them carries each
    table (PostgreSQL's own initial table sync reads them so too): a table in several
    publications has the OR of their row filters, or none when one of them has none, and the
    column list they all give it (:class:`PublicationsDisagree` when they differ)."""
    if len(publications) == 1:
        return publication_tables(conn, publications[0])
    found: dict[tuple[str, str], list[tuple[str, TableInfo]]] = {}
    for pub in publications:
        for t in publication_tables(conn, pub):
            found.setdefault((t.schema, t.name), []).append((pub, t))
    out = []
    for (schema, name), given in sorted(found.items()):
        first = given[0][1]
        if len({tuple(c.name for c in t.columns) for _, t in given}) > 1:
            raise PublicationsDisagree(
                f"publications {', '.join(p for p, _ in given)} publish {quote_qualified(schema, name)} with different "
                "columns: PostgreSQL cannot stream it to one subscriber",
                hint="give the table the same column list in every publication, or leave it in one of them")
        filters = [t.row_filter for _, t in given]
        row_filter = None if None in filters else " OR ".join(f"({f})" for f in dict.fromkeys(filters))
        out.append(first if row_filter == first.row_filter else replace(first, row_filter=row_filter))
    return out


def _as_streamed(conn, schema: str, table: str, attnames, rowfilter, gencols: bool, pg18: bool) -> TableInfo:
    """The table with the columns its publication streams: those without a column list; a
    column list when ``attnames`` (``pg_publication_tables``) differs."""
    info = describe_table(conn, schema, table, row_filter=rowfilter, generated=gencols)
    names = {c.name for c in info.columns}
    if attnames is not None and (set(attnames) != names if pg18 else len(attnames) < len(names)):
        info = describe_table(conn, schema, table, row_filter=rowfilter, column_list=list(attnames),
                              generated=pg18)
    return info


def streamed_table(conn: psycopg.Connection, publications: Sequence[str], schema: str, table: str) -> TableInfo:
    """``schema.table`` as the first of ``publications`` that publishes it streams it (its
    columns as a Relation message carries them), as :func:`publication_tables` gives it."""
    version = conn.info.server_version
    for pub in publications:
        row = conn.execute(
            ("SELECT p.attnames, p.rowfilter, " + ("b.pubgencols::text = 's'" if version >= 180000 else "false")
             if version >= 150000 else "SELECT NULL::text[], NULL::text, false")
            + " FROM pg_catalog.pg_publication_tables p JOIN pg_catalog.pg_publication b ON b.pubname = p.pubname "
            "WHERE p.pubname = %s AND p.schemaname = %s AND p.tablename = %s", (pub, schema, table)).fetchone()
        if row is not None:
            return _as_streamed(conn, schema, table, row[0], row[1], bool(row[2]), version >= 180000)
    raise TableNotFound(f"table {schema}.{table} is not in publication(s) {', '.join(publications)}")


_REL_SQL = """
SELECT c.oid, c.relkind::text, c.relispartition
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s
"""

_LEAVES_SQL = """
SELECT n.nspname::text, c.relname::text FROM pg_partition_tree(%s::oid::regclass) t
JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE t.isleaf ORDER BY 1, 2
"""

_ANCESTORS_SQL = """
SELECT n.nspname::text, c.relname::text FROM pg_partition_ancestors(%s::oid::regclass) a
JOIN pg_class c ON c.oid = a.relid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE a.relid <> %s::oid::regclass
"""


def check_partitions_as_published(
    conn: psycopg.Connection, publication: str, names: Iterable[tuple[str, str]]
) -> None:
    """Raise :class:`PublishedPerLeaf` when a named table is a partitioned table whose
    publication streams its leaves under their own names (``publish_via_partition_root =
    false``), or :class:`PublishedViaRoot` when it is a partition the publication streams
    under its root's name (``true``). Names the publication holds as given, and tables
    that are neither, pass (a table not published at all is the caller's business)."""
    published = {(str(s), str(t)) for s, t in conn.execute(
        "SELECT schemaname::text, tablename::text FROM pg_catalog.pg_publication_tables WHERE pubname = %s",
        (publication,),
    ).fetchall()}
    for schema, table in names:
        if (schema, table) in published:
            continue
        row = conn.execute(_REL_SQL, (schema, table)).fetchone()
        if row is None:
            continue
        oid, relkind, is_partition = row
        given = quote_qualified(schema, table)
        if relkind == "p":
            leaves = [t for t in conn.execute(_LEAVES_SQL, (oid,)).fetchall() if tuple(t) in published]
            if leaves:
                names_ = [quote_qualified(s, t) for s, t in leaves]
                raise PublishedPerLeaf(
                    f"{given} is partitioned and publication {publication!r} publishes its partitions one "
                    f"by one (publish_via_partition_root = false): the stream names its leaves "
                    f"{', '.join(names_)}, never {given}; a copy of {given} would be a Delta table no "
                    "change reaches",
                    hint=f"name the leaves instead: --tables {' '.join(_shell(n) for n in names_)} (one Delta "
                         "table each); for one Delta table holding every partition, the publication needs "
                         "publish_via_partition_root = true before the pipeline's snapshot",
                    names=names_,
                )
        if is_partition:
            roots = [t for t in conn.execute(_ANCESTORS_SQL, (oid, oid)).fetchall() if tuple(t) in published]
            if roots:
                root = quote_qualified(*roots[0])
                raise PublishedViaRoot(
                    f"{given} is a partition and publication {publication!r} publishes it through its root "
                    f"{root} (publish_via_partition_root = true): its changes stream as {root}'s; a copy "
                    f"of {given} alone would be a Delta table no change reaches",
                    hint=f"copy the root: --tables {_shell(root)} (one Delta table holding every partition)",
                    names=[root],
                )


def _shell(text: str) -> str:
    import shlex

    return shlex.quote(text)


def parse_table_names(names: Iterable[str]) -> list[tuple[str, str]]:
    """``["public.t", "s.\\"Odd.Name\\""]`` -> ``[("public", "t"), ("s", "Odd.Name")]``.

    A name without a schema means ``public``; double quotes protect dots and case.
    """
    out = []
    for text in names:
        parts = _split_qualified(text)
        if len(parts) == 1:
            out.append(("public", parts[0]))
        elif len(parts) == 2:
            out.append((parts[0], parts[1]))
        else:
            raise CatalogError(f"not a table name (schema.table): {text!r}")
    return out


ColumnMap = dict[tuple[str, str], frozenset[str]]
"""``{(schema, table): {column, ...}}``: per-table column options (``as_text``)."""


def parse_column_map(items: Iterable[str] | Mapping[str, Iterable[str]] | None, what: str = "--as-text") -> ColumnMap:
    """``["public.t=a,b", 's."Odd.T"=c']`` (or ``{"public.t": ["a", "b"]}``, the operators'
    form) -> ``{("public", "t"): {"a", "b"}, ("s", "Odd.T"): {"c"}}``. The table is read as
    ``--tables`` reads it (quotes protect dots and case); the columns are exact names
    separated by commas. A table given twice gets the union."""
    pairs: list[tuple[str, list[str]]] = []
    if isinstance(items, Mapping):
        pairs = [(str(k), [str(c) for c in v]) for k, v in items.items()]
    else:
        for item in items or ():
            table, sep, cols = str(item).rpartition("=")
            pairs.append((table if sep else "", [c.strip() for c in cols.split(",") if c.strip()]))
    out: dict[tuple[str, str], set[str]] = {}
    for table, cols in pairs:
        if not table or not cols:
            raise CatalogError(f"{what} expects schema.table=column[,column...], got {table!r}={','.join(cols)!r}")
        (name,) = parse_table_names([table])
        out.setdefault(name, set()).update(cols)
    return {k: frozenset(v) for k, v in out.items()}


def _split_qualified(text: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    i, n = 0, len(text)
    quoted_part = False
    while i < n:
        ch = text[i]
        if ch == '"':
            j = i + 1
            while True:
                k = text.find('"', j)
                if k < 0:
                    raise CatalogError(f"unterminated quote in table name {text!r}")
                if k + 1 < n and text[k + 1] == '"':
                    cur.append(text[j:k] + '"')
                    j = k + 2
                    continue
                cur.append(text[j:k])
                i = k + 1
                quoted_part = True
                break
            continue
        if ch == ".":
            parts.append("".join(cur))
            cur, quoted_part = [], False
        else:
            cur.append(ch if quoted_part else ch.lower())
        i += 1
    parts.append("".join(cur))
    if any(p == "" for p in parts):
        raise CatalogError(f"not a table name (schema.table): {text!r}")
    return parts
