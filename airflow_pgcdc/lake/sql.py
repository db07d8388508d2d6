"""SQL identifiers for the two Delta engines' SQL: the one identifier quoting function of the
lake (any name, any character), for DataFusion (delta-rs) and Spark SQL (delta-spark). String
literals never come from data in the SQL the jobs build."""

from __future__ import annotations

__all__ = ["DIALECTS", "quote_ident"]


DIALECTS = ("delta-rs", "spark")


def quote_ident(name: str, dialect: str) -> str:
    """The one identifier quoting function of the merge (any name, any character)."""
    if dialect == "delta-rs":
        return '"' + name.replace('"', '""') + '"'
    if dialect == "spark":
        return "`" + name.replace("`", "``") + "`"
    raise ValueError(f"unknown SQL dialect {dialect!r} (expected one of {DIALECTS})")

