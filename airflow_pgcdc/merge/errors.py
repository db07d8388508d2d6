"""The merge's errors, each a :class:`MergeError` with a ``hint``: those that stop a table
(the job reports them per table and goes on with the others) and :class:`TablesFailed`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_pgcdc.errors import HintedError

__all__ = [
    "KeyNotCovered",
    "MergeError",
    "NoMergeKey",
    "WindowGap",
    "WindowOrderError",
    "ColumnIdentityChanged",
    "CopyExpired",
    "IncompatibleSchemaChange",
    "KeylessChange",
    "NeedsSnapshot",
    "PartitionsChanged",
    "PastThePoint",
    "PointError",
    "ReservedColumnName",
    "SliceNotMerged",
    "TableOfAnotherSlot",
    "TableRewritten",
    "TablesFailed",
    "ValueNotCarried",
    "WindowsExpired",
]


class MergeError(HintedError):
    """The merge cannot go on; the message names table and window (``hint``: what to do)."""


class WindowGap(MergeError):
    """A window between the last merged one and a later committed one is not committed."""


class WindowOrderError(MergeError):
    """Windows do not tile the LSN line (or do not start at the snapshot's consistent point)."""


class NoMergeKey(MergeError):
    """A table without a primary key or replica identity index and no key given."""


class KeyNotCovered(MergeError):
    """The replica identity of a relation version does not include every key column."""


class IncompatibleSchemaChange(MergeError):
    """A source column's type changed in a way the Delta table cannot follow."""

class KeylessChange(MergeError):
    """A table without a key has changes that cannot be applied: an update or a delete
    without the old row (not under ``REPLICA IDENTITY FULL``), an unsent TOAST value, a
    column that cannot be compared (see :mod:`.keyless`)."""

class PointError(MergeError):
    """``--until-lsn``/``--until-time`` names a point the store cannot replay to (see
    :mod:`.point`): the job merges nothing."""

class PastThePoint(MergeError):
    """A table already holds changes after the point of a replay: a merge never takes them
    back out (``pgcdc rebuild --until-…`` builds it anew and swaps it in)."""

class SliceNotMerged(MergeError):
    """A slice (``pgcdc resync --where``) of a table cannot be merged yet: its Delta table
    does not exist, the table has no key, or the job's engine is Delta's Spark engine."""

class NeedsSnapshot(MergeError):
    """A table has changes in the windows but no starting copy: it joined the publication
    after the pipeline's snapshot (or was left out of it). Merging its changes alone would
    make a partial Delta table."""

class WindowsExpired(MergeError):
    """A table needs the changes of windows whose parts ``pgcdc maintain`` removed (listed in
    ``{slot}/maintain/expired.json``): its Delta table is missing, rebuilt from the snapshot
    into a new root, or behind the expiry. Nothing of it is read or merged (a missing Parquet
    file is never read, changes are never skipped). ``windows``: the expired windows it
    needs, ``start_lsn``/``end_lsn``: their span."""

    def __init__(self, message: str, *, hint: str | None = None, table: str = "",
                 windows: Sequence[int] = (), start_lsn: str | None = None, end_lsn: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.table = table
        self.windows = tuple(windows)
        self.start_lsn = start_lsn
        self.end_lsn = end_lsn

class CopyExpired(MergeError):
    """A table's Delta table must be created (or replaced) from a copy in the store (the
    slot's snapshot or a resync's) whose parts of that table ``pgcdc maintain`` removed
    (listed in ``{slot}/maintain/expired.json``): its Delta table had held the copy and was
    dropped since, or a ``__scd2`` history table is added after the fact. Nothing of it is
    read; ``pgcdc resync`` gives the table a new copy. ``copy``: the copy's manifest URL."""

    def __init__(self, message: str, *, hint: str | None = None, table: str = "", copy: str = "") -> None:
        super().__init__(message, hint=hint)
        self.table = table
        self.copy = copy

class PartitionsChanged(MergeError):
    """A partitioned table published through its root had partitions attached (holding
    rows), detached or dropped after its copy: PostgreSQL streams none of those rows, so
    its Delta table would miss or keep them. The root needs a new copy (``pgcdc resync``)."""

class TableOfAnotherSlot(MergeError):
    """The Delta table was created by another slot's pipeline and this slot never merged
    into it: merging this slot's windows onto it would start from the other pipeline's
    state (after a lost slot, the changes between the two slots' points would be missing)."""

class ValueNotCarried(MergeError):
    """The drain left a table's changes out of a window because one of its values has no
    form in the column's mapped type (an array whose lower bound is not 1, say): merging the
    rest would lose them. Map the column as text, then take the table again."""

class ReservedColumnName(MergeError):
    """A table has a column named like the change metadata or the merge's own columns."""

class TableRewritten(MergeError):
    """PostgreSQL rewrote the table without logical changes: a column the Delta table has
    not got yet was filled in the rows already there (a volatile default, a stored
    generated column; the drain records it, ``rewritten_columns``), or a column it has was
    altered by a statement that rewrote every row (``ALTER COLUMN … TYPE … USING`` that
    keeps the Delta type), and no change carries those values. The table needs a new copy
    (``pgcdc resync``)."""

class ColumnIdentityChanged(MergeError):
    """A column of the table is not the column its Delta table holds under that name: it
    was renamed (``RENAME COLUMN``, same ``attnum``, new name), or dropped and added again
    under its old name (new ``attnum``). Following the new name as a new column would
    split one column in two, or mix the old column's values into the new one. The table
    needs a new copy (``pgcdc resync``). ``column``: the name in question."""

    def __init__(self, message: str, *, hint: str | None = None, table: str = "", column: str = "") -> None:
        super().__init__(message, hint=hint)
        self.table = table
        self.column = column

class RecoveryGap(MergeError):
    """The slot lost changes (``pgcdc recover`` resumed it past the store's end) and no copy
    of the table taken at or after the point where the stream resumed holds them (the
    recovery's copy left the table out): merging the windows after the gap would go on
    without those changes. The table needs a new copy (``pgcdc resync``)."""

class TablesFailed(MergeError):
    """Some tables could not be merged; the others were (``result`` holds every table's
    outcome, the failed ones with ``action == "failed"``, their error and hint)."""

    def __init__(self, message: str, *, hint: str | None = None, result: Any = None) -> None:
        super().__init__(message, hint=hint)
        self.result = result
        self.outcome: dict | None = None  # a composed job's own result (a rebuild's), printed instead

    def outcome_dict(self) -> dict | None:
        """What the job prints for the tables that were done: ``outcome`` or ``result``."""
        if self.outcome is not None:
            return self.outcome
        return self.result.to_dict() if self.result is not None else None


class CatalogNotUpdated(TablesFailed):
    """Every table was merged, but the Hive Metastore (``--catalog``) was not brought up to
    date (``result.catalog["error"]`` says why); the next merge tries again."""
