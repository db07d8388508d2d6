"""Joins a table description (pg.tables) to the type map's snapshot decoders."""

from __future__ import annotations

import dataclasses
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
from airflow_pgcdc.typemap.privacy import PiiRuleError, TableRules

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
    privacy: TableRules | None = field(default=None, compare=False)
    """The table's column rules: every batch is transformed before it is yielded (its
    excluded columns are not even read)."""

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
        rules = self.privacy
        if rules is not None:
            for batch in self._batches(session, where, copy_format):
                yield rules.apply_batch(self.columns, batch)
        else:
            yield from self._batches(session, where, copy_format)

    def _batches(self, session, where: str, copy_format: str) -> Iterator[pa.RecordBatch]:
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


def without_excluded(table: TableInfo, rules: TableRules | None, *, strict: bool = True) -> TableInfo:
    """``table`` without its excluded columns (never read, never listed). ``strict``: a
    rule naming a column the table lacks is an error (a typo would leave a column raw)."""
    if rules is None:
        return table
    names = {c.name for c in table.columns}
    unknown = sorted(set(rules.rules) - names)
    if unknown and strict:
        raise PiiRuleError(f"column rules name column(s) {unknown} that table {table.display} does not have "
                           f"(columns: {', '.join(sorted(names))})",
                           hint="give the columns as the table names them (exact case)")
    keyed = sorted(rules.excluded & set(table.key_columns))
    if keyed:
        raise PiiRuleError(f"table {table.display}: key column(s) {keyed} cannot be excluded: rows could not be "
                           "matched", hint="hash them instead (equal values hash equal)")
    if not rules.excluded & names:
        return table
    return dataclasses.replace(table, columns=tuple(c for c in table.columns if c.name not in rules.excluded))


def function_casts(conn) -> frozenset[int]:
    """The types whose cast to text is not their output function
    (:data:`~airflow_pgcdc.typemap.decode.copy_binary.FUNCTION_CASTS_SQL`): one catalog query,
    for every table of a run."""
    return frozenset(row[0] for row in conn.execute(FUNCTION_CASTS_SQL))


def table_converter(conn, table: TableInfo, casts: frozenset[int] | None = None, *,
                    as_text: Collection[str] = (), privacy: TableRules | None = None) -> TableConverter:
    """The converter for ``table``; ``conn`` is a psycopg connection for type lookups;
    ``casts``: :func:`function_casts` (queried here when not given); ``as_text``: columns
    kept as their exact PostgreSQL text (a name the table lacks is an error); ``privacy``:
    the table's column rules (its excluded columns must already be left out of ``table``:
    :func:`without_excluded`)."""
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
    if privacy is not None:
        privacy.check(columns, table.key_columns)
    return TableConverter(
        table=table,
        columns=columns,
        privacy=privacy,
        schema=probe.schema if privacy is None else privacy.schema(columns),
        select_list=copy_select_list(columns),
        binary_select_list=binary_select_list(columns, probe.codecs, known_casts),
    )
