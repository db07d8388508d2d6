"""Joins a table description (pg.tables) to the type map's snapshot decoder."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from airflow_pgcdc.changes.snapshot_copy import COPY_OPTIONS, SnapshotDecoder, copy_select_list
from airflow_pgcdc.changes.typemap import session_setup_sql
from airflow_pgcdc.pg.catalog import load_type_info
from airflow_pgcdc.pg.tables import TableInfo
from airflow_pgcdc.protocol.pgtypes import PgColumn

SESSION_SETUP = session_setup_sql()
"""SET statements every COPY session runs: the text output the decoders expect."""


@dataclass(frozen=True)
class TableConverter:
    table: TableInfo
    columns: tuple[PgColumn, ...]
    schema: pa.Schema
    select_list: str
    copy_options: str = COPY_OPTIONS

    def decoder(self) -> SnapshotDecoder:
        return SnapshotDecoder(self.columns, table=self.table.display)


def table_converter(conn, table: TableInfo) -> TableConverter:
    """The converter for ``table``; ``conn`` is a psycopg connection for type lookups."""
    types = load_type_info(conn, {c.type_oid for c in table.columns})
    columns = tuple(
        PgColumn(name=c.name, type=types[c.type_oid], typmod=c.typmod, ndims=c.ndims)
        for c in table.columns
    )
    probe = SnapshotDecoder(columns, table=table.display)
    return TableConverter(
        table=table, columns=columns, schema=probe.schema, select_list=copy_select_list(columns)
    )
