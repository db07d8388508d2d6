"""The PostgreSQL side of ``pgcdc verify``: the key (replica identity, primary key, the
user's columns, or none: a multiset) and the table read as the snapshot reads it, in one
``REPEATABLE READ READ ONLY`` transaction."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pyarrow as pa

from airflow_pgcdc.errors import redact
from airflow_pgcdc.verify.compare import Comparer
from airflow_pgcdc.verify.results import KeyColumnError, NoKey, SourceTableNotFound

__all__ = [
    "resolve_key",
]

MULTISET = "no key: every column, equal rows by count"


def resolve_key(info, key: Sequence[str] | None) -> tuple[tuple[str, ...], str]:
    """``(key columns, source)`` for a :class:`~airflow_pgcdc.pg.tables.TableInfo`: the
    given columns (``"given"``), else the replica identity index or primary key."""
    names = [c.name for c in info.columns]
    if key:
        unknown = [k for k in key if k not in names]
        if unknown:
            raise KeyColumnError(
                f"key column(s) {', '.join(unknown)} not in {info.display} "
                f"(columns: {', '.join(names)})",
                hint="--key takes column names exactly as PostgreSQL spells them, comma-separated",
            )
        return tuple(key), "given"
    if info.key_columns:
        return tuple(info.key_columns), info.key_source or "primary key"
    raise NoKey(
        f"table {info.display} has no primary key or replica identity index: rows cannot be matched",
        hint="give the columns that identify a row with --key a,b",
    )


def _read_postgres(dsn: str, schema: str, table: str, key: Sequence[str] | None, delta_schema: pa.Schema,
                   comparer_kw: dict, privacy=None) -> tuple[Comparer, str, str | None]:
    import psycopg

    from airflow_pgcdc.pg.catalog import check_encoding
    from airflow_pgcdc.pg.errors import ConnectionFailed
    from airflow_pgcdc.pg.tables import TableNotFound, describe_table
    from airflow_pgcdc.snapshot.convert import SESSION_SETUP, table_converter, without_excluded

    try:
        conn = psycopg.connect(dsn, autocommit=True)
    except psycopg.Error as e:
        raise ConnectionFailed(f"cannot connect to {redact(dsn)}: {str(e).strip()}") from None
    with conn:
        check_encoding(conn)
        for stmt in SESSION_SETUP:
            conn.execute(stmt)
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            info = describe_table(conn, schema, table, generated=True)
        except TableNotFound:
            raise SourceTableNotFound(
                f"table {schema}.{table} does not exist in database {conn.info.dbname!r}",
                hint='--table takes schema.table; quote names with dots or capitals: \'s."Odd.Name"\'',
            ) from None
        # a stored generated column is compared when the Delta table has it (a PostgreSQL 18
        # publication streams it, and the snapshot copied it: pg/tables.py), else left out
        # as the snapshot and the stream leave it out
        info = dataclasses.replace(info, columns=tuple(
            c for c in info.columns if not c.generated or c.name in delta_schema.names))
        # the lake's view of the rows: excluded columns not read, hashed and masked ones as written
        rules = privacy.rules_for(schema, table, info.oid, {c.name: c.attnum for c in info.columns}) if privacy else None
        info = without_excluded(info, rules, strict=False)
        try:
            key_columns, key_source = resolve_key(info, key)
            multiset = False
        except NoKey:  # a table without a key: its rows as a multiset (duplicates by count)
            key_columns, key_source, multiset = (), MULTISET, True
        conv = table_converter(conn, info, privacy=rules)
        compared = conv.columns if rules is None else tuple(
            dataclasses.replace(c, as_text=True) if c.name in rules.rules else c for c in conv.columns)
        comparer = Comparer(compared, key_columns, delta_schema, table=info.display, multiset=multiset,
                            **comparer_kw)
        lsn = conn.execute(
            "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
            "ELSE pg_current_wal_lsn() END)::text"
        ).fetchone()[0]
        sql = f"COPY (SELECT {conv.select_list} FROM {info.from_clause}) TO STDOUT {conv.copy_options}"
        decoder = conv.decoder()
        with conn.cursor().copy(sql) as copy:
            for batch in decoder.decode_stream(copy):
                comparer.add_postgres(batch if rules is None else rules.apply_batch(conv.columns, batch))
        conn.execute("COMMIT")
    return comparer, key_source, lsn

