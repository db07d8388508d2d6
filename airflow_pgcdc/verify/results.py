"""What ``pgcdc verify`` reports (:class:`VerifyResult`, :class:`Comparison` and their
parts, values cut at ``VALUE_CHARS``) and the errors it raises when it cannot compare
(:class:`VerifyError` and its subclasses, each with a ``hint``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_pgcdc.errors import HintedError

__all__ = [
    "ChangedRow",
    "ColumnDiff",
    "Comparison",
    "DeltaReadError",
    "DeltaTableNotFound",
    "DuplicateKey",
    "KeyColumnError",
    "NoKey",
    "SourceTableNotFound",
    "TypeMismatch",
    "VerifyError",
    "VerifyResult",
]

VALUE_CHARS = 1000


class VerifyError(HintedError):
    """``pgcdc verify`` cannot compare; ``hint`` says what to do."""


class SourceTableNotFound(VerifyError):
    """The PostgreSQL table does not exist."""


class DeltaTableNotFound(VerifyError):
    """There is no Delta table where the table's should be."""


class DeltaReadError(VerifyError):
    """The Delta table exists but cannot be read (storage, protocol)."""


class NoKey(VerifyError):
    """The table has no primary key or replica identity index and no key was given."""


class KeyColumnError(VerifyError):
    """A key column that the table (or the Delta table) does not have, or cannot match on."""


@dataclass(frozen=True)
class ColumnDiff:
    """One differing column of a changed row: PostgreSQL's text output of each side's
    value (None: NULL), cut to :data:`VALUE_CHARS` characters; ``*_chars`` are the
    uncut lengths (None for NULL)."""

    column: str
    postgres: str | None
    delta: str | None
    postgres_chars: int | None = None
    delta_chars: int | None = None

    @classmethod
    def of(cls, column: str, postgres: str | None, delta: str | None) -> ColumnDiff:
        return cls(
            column, _cut(postgres), _cut(delta),
            None if postgres is None else len(postgres), None if delta is None else len(delta),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"postgres": self.postgres, "delta": self.delta}
        for side in ("postgres", "delta"):
            n = getattr(self, f"{side}_chars")
            if n is not None and n > len(getattr(self, side)):
                out[f"{side}_chars"] = n  # the value was cut
        return out


@dataclass(frozen=True)
class ChangedRow:
    key: dict[str, str | None]
    columns: tuple[ColumnDiff, ...]


@dataclass(frozen=True)
class DuplicateKey:
    side: str  # "postgres" | "delta"
    key: dict[str, str | None]
    count: int


@dataclass(frozen=True)
class TypeMismatch:
    column: str
    pg_type: str  # the PostgreSQL type, as format_type prints it
    expected: str  # the Arrow type Delta should have (the Delta form of the type map's)
    found: str


@dataclass(frozen=True)
class Comparison:
    """What :func:`compare_tables` found (pure data; see :class:`VerifyResult`)."""

    key_columns: tuple[str, ...]
    compared_columns: tuple[str, ...]
    postgres_rows: int
    delta_rows: int
    only_in_postgres: int
    only_in_delta: int
    changed: int
    duplicate_keys_postgres: int
    duplicate_keys_delta: int
    missing_in_delta: tuple[str, ...]  # source columns the Delta table lacks
    type_mismatches: tuple[TypeMismatch, ...]
    delta_only_columns: tuple[str, ...]  # a note, not a difference
    sample_only_in_postgres: tuple[dict[str, str | None], ...]
    sample_only_in_delta: tuple[dict[str, str | None], ...]
    sample_changed: tuple[ChangedRow, ...]
    sample_duplicates: tuple[DuplicateKey, ...]
    max_diffs: int

    @property
    def equal(self) -> bool:
        return not (
            self.only_in_postgres
            or self.only_in_delta
            or self.changed
            or self.duplicate_keys_postgres
            or self.duplicate_keys_delta
            or self.missing_in_delta
            or self.type_mismatches
            or self.postgres_rows != self.delta_rows
        )


@dataclass(frozen=True)
class VerifyResult:
    """:func:`verify_table`'s answer: the comparison plus where both sides came from."""

    table: str  # schema.table
    postgres: str  # the DSN, redacted
    delta_url: str
    key_source: str  # "primary key" | "replica identity index" | "given" | MULTISET
    comparison: Comparison
    postgres_lsn: str | None = None  # the server's WAL position when the table was read
    delta_version: int | None = None
    delta_last_commit: dict[str, Any] = field(default_factory=dict)
    # check_metadata: the Delta table's CDC metadata columns checked (verify.delta.check_metadata)
    metadata: dict[str, Any] | None = None

    @property
    def equal(self) -> bool:
        return self.comparison.equal

    @property
    def metadata_ok(self) -> bool:
        """No row with invalid metadata columns (True when they were not checked)."""
        return self.metadata is None or self.metadata["invalid"] == 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``pgcdc verify --json``)."""
        c = self.comparison
        return {
            "table": self.table,
            "result": "EQUAL" if self.equal else "DIFFERENT",
            "equal": self.equal,
            "postgres": {"dsn": self.postgres, "rows": c.postgres_rows, "lsn": self.postgres_lsn},
            "delta": {
                "url": self.delta_url,
                "rows": c.delta_rows,
                "version": self.delta_version,
                "last_commit": self.delta_last_commit,
            },
            "key": {"columns": list(c.key_columns), "source": self.key_source},
            "compared_columns": list(c.compared_columns),
            "counts": {
                "only_in_postgres": c.only_in_postgres,
                "only_in_delta": c.only_in_delta,
                "changed": c.changed,
                "duplicate_keys_postgres": c.duplicate_keys_postgres,
                "duplicate_keys_delta": c.duplicate_keys_delta,
            },
            "schema": {
                "missing_in_delta": list(c.missing_in_delta),
                "type_mismatches": [vars(m) for m in c.type_mismatches],
                "delta_only_columns": list(c.delta_only_columns),
            },
            "max_diffs": c.max_diffs,
            "only_in_postgres": [dict(k) for k in c.sample_only_in_postgres],
            "only_in_delta": [dict(k) for k in c.sample_only_in_delta],
            "changed": [
                {"key": dict(r.key), "columns": {d.column: d.to_dict() for d in r.columns}}
                for r in c.sample_changed
            ],
            "duplicate_keys": [vars(d) for d in c.sample_duplicates],
            "metadata": self.metadata,
        }


def _cut(text: str | None, limit: int = VALUE_CHARS) -> str | None:
    return text if text is None or len(text) <= limit else text[:limit]

