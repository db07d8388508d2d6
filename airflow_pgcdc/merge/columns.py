"""Columns followed by their identity, not their name: what the merge refuses when a
column of the batch is not the column its Delta table holds under that name. No Spark,
no I/O: the job (:mod:`.checks`) hands in what the store recorded.

PostgreSQL identifies a column by its ``attnum``. ``RENAME COLUMN`` keeps it under a new
name; ``DROP COLUMN`` then ``ADD COLUMN`` under the old name gives a new one. Logical
decoding sends names only, so the drain records, on each relation version, each column's
``attnum``, the transaction that last wrote its ``pg_attribute`` row (``attxmin``) and the
table's file (``relfilenode``), as the catalog has them when it reads them; a copy
(snapshot or resync) records the same, taken with its rows. The merge compares, in commit
order, each relation version of the batch with what was known before it (the *baseline*:
the newest relation version of the table's last merged window, or the copy when nothing
was merged since it), and refuses the table (:class:`ColumnIdentityChanged`) when

* an ``attnum`` it knows comes under another name: a rename, which the Delta table would
  otherwise split into the old column (values up to the rename) and a new one (values
  after it), both partly NULL;
* a name it knows comes with another ``attnum``, or a name the Delta table has but the
  baseline does not (a column dropped before it) comes back: a column dropped and added
  again, whose Delta column still holds the old column's values;

and refuses it with :class:`TableRewritten` when a column keeps its ``attnum`` but its
catalog row was written again *and* the table got a new file since: ``ALTER COLUMN … TYPE …
USING`` rewrote every row without a logical change (when the Delta type stays the same,
``int USING a * 10`` or ``varchar(10)`` to ``varchar(20) USING upper(v)``, nothing else would
see it). That rule also refuses, although harmless, a column altered otherwise (``SET
DEFAULT``, ``SET NOT NULL``, a column ``GRANT``) and a file changed otherwise (``VACUUM
FULL``, ``CLUSTER``, ``TRUNCATE``) between two changes the merge sees: both leave the same
marks in the catalog.

Because the drain reads the catalog after the changes, a rename is seen by the first window
drained after it, even one whose changes came before it: that window is refused too (the
table needs a new copy either way). Versions without identities (windows and copies written
before they were recorded, a column renamed or dropped before the drain read the catalog)
are compared on what they have.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from airflow_pgcdc.changes.rows import ATTNUM_FIELD, ATTXMIN_FIELD, RELFILENODE_FIELD


class ColumnId(NamedTuple):
    """A column's identity as recorded: ``attnum`` and ``attxmin`` (None when not recorded)
    and its PostgreSQL type (for messages)."""

    attnum: int | None
    xmin: str | None
    pg_type: str | None = None


@dataclass
class ColumnState:
    """What is known of a table's columns at one point: ``columns`` maps each name to its
    :class:`ColumnId`, ``relfilenode`` the table's file (None: not recorded), ``where``
    says where it was learnt (for messages)."""

    columns: dict[str, ColumnId] = field(default_factory=dict)
    relfilenode: int | None = None
    where: str = ""

    @property
    def has_identities(self) -> bool:
        return any(c.attnum is not None for c in self.columns.values())

    def by_attnum(self) -> dict[int, str]:
        return {c.attnum: n for n, c in self.columns.items() if c.attnum is not None}


def copy_state(entry, where: str) -> ColumnState:
    """The state a copy (a snapshot or resync manifest's table entry) recorded."""
    rfn = entry.extra.get(RELFILENODE_FIELD) if entry.extra else None
    return ColumnState({c.name: ColumnId(c.attnum, c.attxmin, c.pg_type) for c in entry.columns},
                       int(rfn) if rfn else None, where)


def _version_columns(rv: Mapping) -> dict[str, ColumnId]:
    # pg_type: format_type() with the modifier, in windows and copies alike
    return {c["name"]: ColumnId(c.get(ATTNUM_FIELD), c.get(ATTXMIN_FIELD), c.get("pg_type")) for c in rv["columns"]}


def version_state(rv: Mapping, where: str) -> ColumnState:
    """The state one relation version of a window manifest (a dict) recorded."""
    rfn = rv.get(RELFILENODE_FIELD)
    return ColumnState(_version_columns(rv), int(rfn) if rfn else None, where)


@dataclass(frozen=True)
class Refusal:
    """Why the table cannot follow: ``kind`` is ``renamed``, ``readded`` or ``rewritten``."""

    kind: str
    column: str
    message: str
    old_name: str | None = None


def follow(baseline: ColumnState | None, delta_columns: Iterable[str],
           versions: Iterable[tuple[str, Mapping]]) -> Refusal | None:
    """Walk ``versions`` (``(where, relation version dict)``, in commit order) from
    ``baseline`` (None: unknown) and return the first :class:`Refusal`, or None when every
    column is the one the Delta table (``delta_columns``: its column names) holds under its
    name. The state carried from version to version keeps every name ever seen, as the
    Delta table keeps a dropped column."""
    have = set(delta_columns)
    state = ColumnState(dict(baseline.columns), baseline.relfilenode, baseline.where) if baseline else None
    for where, rv in versions:
        ids = _version_columns(rv)
        rfn = rv.get(RELFILENODE_FIELD)
        if state is None or not state.has_identities:
            state = ColumnState({**(state.columns if state else {}), **ids}, int(rfn) if rfn else None, where)
            continue
        by_attnum = state.by_attnum()
        new_file = bool(rfn and state.relfilenode and int(rfn) != state.relfilenode)
        for name, (attnum, xmin, pg_type) in ids.items():
            if attnum is None:
                continue
            known = state.columns.get(name)
            old = by_attnum.get(attnum)
            if old is not None and old != name:
                return Refusal("renamed", name, (
                    f"column {old!r} was renamed to {name!r} (attnum {attnum}: {state.where} knew it as "
                    f"{old!r}, {where} as {name!r})"), old_name=old)
            if known is not None and known.attnum is not None and known.attnum != attnum:
                return Refusal("readded", name, (
                    f"column {name!r} was dropped and added again under its name (attnum {known.attnum} in "
                    f"{state.where}, {attnum} in {where}): its Delta column holds the old column's values"))
            if known is None and name in have:
                return Refusal("readded", name, (
                    f"column {name!r} of {where} (attnum {attnum}) is new, but the Delta table has a column "
                    f"of that name from before ({state.where} no longer had it: dropped since): it holds the "
                    "old column's values"))
            if known is not None and known.attnum == attnum and new_file and known.xmin and xmin and known.xmin != xmin:
                typed = (f", its type from {known.pg_type} to {pg_type}"
                         if known.pg_type and pg_type and known.pg_type != pg_type else "")
                return Refusal("rewritten", name, (
                    f"column {name!r} was altered (its catalog row was written by transaction {xmin}, "
                    f"{known.xmin} in {state.where}{typed}) and the table was rewritten (file "
                    f"{state.relfilenode} -> {int(rfn)}) since {state.where}: ALTER COLUMN … TYPE … USING "
                    "changes every row's value without a logical change"))
        for name, ident in ids.items():
            if ident.attnum is not None or name not in state.columns:
                state.columns[name] = ident
        if rfn:
            state.relfilenode = int(rfn)
        state.where = where
    return None
