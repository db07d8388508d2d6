"""The one place where identifiers and literals are quoted for SQL and replication commands.

Both the SQL grammar and the replication command grammar (``repl_gram.y``) accept
identifiers as ``"..."`` with ``""`` for a quote, and literals as ``'...'`` with
``''`` for a quote, where a backslash is an ordinary character. Our sessions run
with ``standard_conforming_strings=on`` (the default since PostgreSQL 9.1; the
connection layer sets it explicitly), so the same literal form is right for both.
"""

from __future__ import annotations

from airflow_pgcdc.errors import QuotingError

NAMEDATALEN = 64
"""PostgreSQL's identifier buffer: names longer than NAMEDATALEN-1 bytes are truncated."""


def quote_ident(name: str) -> str:
    """Quote ``name`` as an SQL / replication-command identifier.

    Always quotes (so case and reserved words are preserved). Refuses NUL bytes, the
    empty string, and names longer than 63 bytes in UTF-8, which PostgreSQL would
    silently truncate into the name of a *different* object.
    """
    if not isinstance(name, str):
        raise QuotingError(f"identifier must be a str, not {type(name).__name__}")
    if not name:
        raise QuotingError("identifier must not be empty")
    if "\x00" in name:
        raise QuotingError(f"identifier contains a NUL byte: {name!r}")
    size = len(name.encode("utf-8"))
    if size >= NAMEDATALEN:
        raise QuotingError(
            f"identifier is {size} bytes long; PostgreSQL would truncate it to "
            f"{NAMEDATALEN - 1} bytes and name another object: {name!r}"
        )
    return '"' + name.replace('"', '""') + '"'


def quote_qualified(schema: str, name: str) -> str:
    """``schema.name``, each part quoted by :func:`quote_ident`."""
    return f"{quote_ident(schema)}.{quote_ident(name)}"


def shell_qualified(schema: str, name: str) -> str:
    """``schema.name`` as one shell word for a hint's ``--tables`` (:func:`quote_qualified`,
    then quoted for a POSIX shell): what a user copies from a hint names exactly the table,
    whatever its case or the dots and spaces in its names."""
    import shlex

    return shlex.quote(quote_qualified(schema, name))


def quote_literal(value: str) -> str:
    """Quote ``value`` as a string literal (``'...'``, quotes doubled, backslash literal)."""
    if not isinstance(value, str):
        raise QuotingError(f"literal must be a str, not {type(value).__name__}")
    if "\x00" in value:
        raise QuotingError(f"literal contains a NUL byte: {value!r}")
    return "'" + value.replace("'", "''") + "'"
