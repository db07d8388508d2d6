"""Joins a table description (pg.tables) to the type map's snapshot decoders."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from airflow_pgcdc.pg.catalog import load_type_info
from airflow_pgcdc.pg.tables import TableInfo
from airflow_pgcdc.protocol.pgtypes import PgColumn
from airflow_pgcdc.store.parquet import TableEncodings
from airflow_pgcdc.typemap.decode.copy_binary import (
    BINARY_COPY_OPTIONS,
    FUNCTION_CASTS_SQL,
    BinaryCopyDecoder,
    binary_select_list,
)
from airflow_pgcdc.typemap.decode.copy_text import COPY_OPTIONS, SnapshotDecoder, copy_select_list
from airflow_pgcdc.typemap.map import session_setup_sql

SESSION_SETUP = session_setup_sql()
"""SET statements every COPY session runs: the text output the decoders expect."""

COPY_FORMATS = ("binary", "csv")
"""``binary`` (the default: cheaper for the server, see :mod:`airflow_pgcdc.typemap.decode.copy_binary`)
or ``csv`` (every column as text, parsed by pyarrow's CSV reader)."""


@dataclass(frozen=True)
class TableConverter:
    table: TableInfo
    columns: tuple[PgColumn, ...]
    schema: pa.Schema
    select_list: str
    """The CSV path's SELECT list."""
    binary_select_list: str = ""
    """The binary path's SELECT list (types without a binary decoder as text)."""
    copy_options: str = COPY_OPTIONS
    encodings: TableEncodings = field(default_factory=TableEncodings, compare=False)
    """The Parquet encodings every part of the table uses (chosen by its first row group)."""

    def decoder(self) -> SnapshotDecoder:
        """The CSV decoder (``COPY (SELECT select_list …) TO STDOUT copy_options``)."""
        return SnapshotDecoder(self.columns, table=self.table.display)

    def copy_sql(self, where: str = "", copy_format: str = "binary") -> str:
        """The COPY statement for ``copy_format``; ``where`` (`` WHERE …``, quoted by the
        caller) is appended to the SELECT."""
        if copy_format == "binary":
            select, options = self.binary_select_list, BINARY_COPY_OPTIONS
        elif copy_format == "csv":
            select, options = self.select_list, self.copy_options
        else:
            raise ValueError(f"copy_format must be one of {COPY_FORMATS}, not {copy_format!r}")
        return f"COPY (SELECT {select} FROM {self.table.from_clause}{where}) TO STDOUT {options}"

    def batches(self, session, where: str = "", copy_format: str = "binary") -> Iterator[pa.RecordBatch]:
        """Run the COPY on ``session`` (a :class:`ReplicationConnection` with
        :data:`SESSION_SETUP` applied) and yield its rows as batches of :attr:`schema`."""
        sql = self.copy_sql(where, copy_format)
        if copy_format == "binary":
            dec = BinaryCopyDecoder(self.columns, table=self.table.display)
            for chunk, lengths in session.copy_to(sql, row_lengths=True):
                yield from dec.feed(chunk, lengths)
        else:
            dec = self.decoder()
            for chunk in session.copy_to(sql):
                yield from dec.feed(chunk)
        yield from dec.finish()


def function_casts(conn) -> frozenset[int]:
    """The types whose cast to text is not their output function
    (:data:`~airflow_pgcdc.typemap.decode.copy_binary.FUNCTION_CASTS_SQL`): one catalog query,
    for every table of a run."""
    return frozenset(row[0] for row in conn.execute(FUNCTION_CASTS_SQL))


def table_converter(conn, table: TableInfo, casts: frozenset[int] | None = None, *,
                    as_text: Collection[str] = ()) -> TableConverter:
    """The converter for ``table``; ``conn`` is a psycopg connection for type lookups;
    ``casts``: :func:`function_casts` (queried here when not given); ``as_text``: columns
    kept as their exact PostgreSQL text (a name the table lacks is an error)."""
    missing = sorted(set(as_text) - {c.name for c in table.columns})
    if missing:
        from airflow_pgcdc.errors import HintedError

        raise HintedError(f"--as-text names column(s) {missing} that table {table.display} does not have",
                          hint="give the columns as the table names them (exact case)")
    types = load_type_info(conn, {c.type_oid for c in table.columns})
    columns = tuple(
        PgColumn(name=c.name, type=types[c.type_oid], typmod=c.typmod, ndims=c.ndims, as_text=c.name in as_text)
        for c in table.columns
    )
    known_casts = function_casts(conn) if casts is None else casts
    probe = BinaryCopyDecoder(columns, table=table.display)
    return TableConverter(
        table=table,
        columns=columns,
        schema=probe.schema,
        select_list=copy_select_list(columns),
        binary_select_list=binary_select_list(columns, probe.codecs, known_casts),
    )
