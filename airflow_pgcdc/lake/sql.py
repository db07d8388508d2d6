"""SQL identifiers for the two Delta engines' SQL: the one identifier quoting function of the
lake (any name, any character), for DataFusion (delta-rs) and Spark SQL (delta-spark). String
literals never come from data in the SQL the jobs build."""

from __future__ import annotations

__all__ = ["DIALECTS", "quote_ident", "quote_literal"]


DIALECTS = ("delta-rs", "spark")


def quote_ident(name: str, dialect: str) -> str:
    """The one identifier quoting function of the merge (any name, any character)."""
    if dialect == "delta-rs":
        return '"' + name.replace('"', '""') + '"'
    if dialect == "spark":
        return "`" + name.replace("`", "``") + "`"
    raise ValueError(f"unknown SQL dialect {dialect!r} (expected one of {DIALECTS})")


def quote_literal(value: str, dialect: str) -> str:
    """The one string-literal quoting function of the merge's SQL: Spark SQL reads a
    backslash as an escape (so both it and the quote are escaped by one), DataFusion
    (delta-rs) the SQL standard's doubled quote."""
    if not isinstance(value, str) or "\x00" in value:
        raise ValueError(f"a SQL string literal must be a str without NUL bytes, got {value!r}")
    if dialect == "delta-rs":
        return "'" + value.replace("'", "''") + "'"
    if dialect == "spark":
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    raise ValueError(f"unknown SQL dialect {dialect!r} (expected one of {DIALECTS})")
