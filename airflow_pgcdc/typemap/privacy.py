"""Columns kept out of the lake: a table's column excluded, hashed or masked before any row
of it is written anywhere (:mod:`airflow_pgcdc.store.privacy` keeps the rules of a slot).

- ``exclude``: the column is never read by the snapshot (left out of its ``COPY``) and is
  dropped from every change row; the store, Delta and the manifests' column lists never
  have it. A column of the merge key cannot be excluded.
- ``hash``: the value becomes the lowercase hex of HMAC-SHA256 under a secret key of the
  value's PostgreSQL text (``col::text`` under the type map's session settings), so
  ``encode(hmac(col::text, key, 'sha256'), 'hex')`` in PostgreSQL (pgcrypto) finds the same
  string. Equal values hash equal: joins and the merge key still work. NULL stays NULL.
- ``mask`` / ``mask:N``: a text value has every character but its last ``N`` (default 0)
  written as ``*``; its length shows. Text columns only, never a key column.

Hashed and masked columns are text in the store and in Delta: their Arrow field is the one a
``--as-text`` column gets, with metadata ``pgcdc_pii`` naming the rule.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from airflow_pgcdc.errors import HintedError
from airflow_pgcdc.protocol.pgtypes import PgColumn
from airflow_pgcdc.typemap.map import array_to_pg_text, arrow_field

__all__ = [
    "ACTIONS",
    "KEY_ENV",
    "ColumnRule",
    "PiiError",
    "PiiKey",
    "PiiKeyMismatch",
    "PiiKeyMissing",
    "PiiRuleError",
    "TableRules",
]

ACTIONS = ("exclude", "hash", "mask")
KEY_ENV = "PGCDC_PII_KEY"
"""The environment variable the hash key is read from when none is given (an operator's
``pii_key_conn_id`` gives it from a connection's password instead)."""
PII_FIELD = b"pgcdc_pii"
"""A transformed column's Arrow field metadata: the rule it was written under."""
_CHECK_MESSAGE = b"airflow-pgcdc pii key check v1"


class PiiError(HintedError):
    """Base class of the column rules' errors."""


class PiiRuleError(PiiError):
    """A rule that cannot be applied: bad syntax, a column the table lacks, a mask on a column
    that is not text, a key column excluded or masked."""


class PiiKeyMissing(PiiError):
    """A hash rule and no key to hash with."""


class PiiKeyMismatch(PiiError):
    """The key given is not the key the slot's rules were first applied with: its hashes
    would not equal the ones already in the lake."""


@dataclass(frozen=True, slots=True)
class ColumnRule:
    action: str
    keep_last: int = 0  # mask:N

    @classmethod
    def parse(cls, text: str, *, where: str = "") -> ColumnRule:
        raw = str(text).strip().lower()
        action, _, arg = raw.partition(":")
        if action not in ACTIONS or (arg and action != "mask"):
            raise PiiRuleError(f"{where}: unknown column rule {text!r}",
                               hint="a rule is exclude, hash, mask or mask:N (keep the last N characters)")
        keep = 0
        if arg:
            if not arg.isdigit():
                raise PiiRuleError(f"{where}: mask:N needs a whole number of characters, got {text!r}",
                                   hint="e.g. mask:4 keeps the last four characters")
            keep = int(arg)
        return cls(action, keep)

    def __str__(self) -> str:
        return f"mask:{self.keep_last}" if self.action == "mask" and self.keep_last else self.action


class PiiKey:
    """A hash key. Never printed: its ``repr`` and ``str`` hide it; :attr:`fingerprint`
    (an HMAC of a fixed message) tells two keys apart without showing either."""

    __slots__ = ("_secret",)

    def __init__(self, secret: str | bytes) -> None:
        value = secret.encode() if isinstance(secret, str) else bytes(secret)
        if not value:
            raise PiiKeyMissing("the hash key is empty", hint=f"set {KEY_ENV} to a long random secret")
        self._secret = value

    @classmethod
    def from_env(cls, name: str = KEY_ENV) -> PiiKey | None:
        value = os.environ.get(name)
        return cls(value) if value else None

    @property
    def fingerprint(self) -> str:
        return hmac.new(self._secret, _CHECK_MESSAGE, hashlib.sha256).hexdigest()[:16]

    def hash_texts(self, texts: Iterable[str | None]) -> list[str | None]:
        secret = self._secret
        digest = hmac.digest
        return [None if t is None else digest(secret, t.encode(), "sha256").hex() for t in texts]

    def __repr__(self) -> str:
        return "PiiKey(<hidden>)"

    __str__ = __repr__

    def __reduce__(self):  # to snapshot worker processes through their pipe, never argv
        return (PiiKey, (self._secret,))


@dataclass(frozen=True)
class TableRules:
    """One table's rules and the key they hash with; :meth:`apply` transforms its Arrow
    columns as the type map decoded them."""

    table: str  # schema.table, for messages
    rules: Mapping[str, ColumnRule]
    key: PiiKey | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def excluded(self) -> frozenset[str]:
        return frozenset(c for c, r in self.rules.items() if r.action == "exclude")

    def keep(self, columns: Iterable[PgColumn]) -> list[PgColumn]:
        return [c for c in columns if c.name not in self.excluded]

    def check(self, columns: Sequence[PgColumn], key_columns: Iterable[str] = ()) -> None:
        """Raise :class:`PiiRuleError` when a rule cannot hold for these columns (checked
        where the columns are known: the snapshot, each relation version of the drain)."""
        keys = set(key_columns)
        by_name = {c.name: c for c in columns}
        for name, rule in self.rules.items():
            where = f"table {self.table}, column {name}"
            col = by_name.get(name)
            if col is None:
                continue  # a rule for a dropped column (or one not yet added) holds nothing
            if rule.action in ("exclude", "mask") and name in keys:
                raise PiiRuleError(f"{where}: a key column cannot be {rule.action}ed: rows could not be matched",
                                   hint="hash it instead (equal values hash equal)")
            if rule.action == "mask" and not pa.types.is_string(arrow_field(col).type):
                raise PiiRuleError(f"{where}: mask needs a text column; it is {col.type.name}",
                                   hint="hash or exclude it")
            if rule.action == "hash" and self.key is None:
                raise PiiKeyMissing(f"{where}: the hash rule needs a key",
                                    hint=f"set {KEY_ENV} (or the operator's pii_key_conn_id)")

    def field(self, column: PgColumn) -> pa.Field:
        """The Arrow field ``column`` is written as."""
        rule = self.rules.get(column.name)
        if rule is None or rule.action == "exclude":
            return arrow_field(column)
        f = arrow_field(dataclasses.replace(column, as_text=True))
        return f.with_metadata({**(f.metadata or {}), PII_FIELD: str(rule).encode()})

    def transform(self, column: PgColumn, values: pa.Array) -> pa.Array:
        """``values`` (the type map's array of ``column``) as the lake may hold it."""
        rule = self.rules.get(column.name)
        if rule is None:
            return values
        if rule.action == "hash":
            assert self.key is not None  # check() refused the rule without one
            return pa.array(self.key.hash_texts(array_to_pg_text(values, column)), pa.string())
        if rule.action == "mask":
            n = rule.keep_last
            return pa.array([None if v is None else ("*" * max(len(v) - n, 0)) + (v[-n:] if n else "")
                             for v in values.to_pylist()], pa.string())
        raise ValueError(f"{self.table}.{column.name} is excluded: it has no values to transform")

    def transformed(self, columns: Sequence[PgColumn]) -> bool:
        return any(c.name in self.rules for c in columns)

    def apply(self, columns: Sequence[PgColumn], arrays_: Sequence[pa.Array]) -> list[pa.Array]:
        """The arrays of ``columns`` (all of them, in order) with the excluded ones left out
        and the others transformed."""
        return [self.transform(c, a) for c, a in zip(columns, arrays_, strict=True) if c.name not in self.excluded]

    def schema(self, columns: Sequence[PgColumn]) -> pa.Schema:
        return pa.schema([self.field(c) for c in columns if c.name not in self.excluded])

    def apply_batch(self, columns: Sequence[PgColumn], batch: pa.RecordBatch) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays(self.apply(columns, batch.columns), schema=self.schema(columns))
