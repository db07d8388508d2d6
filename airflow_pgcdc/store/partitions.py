"""The leaves of partitioned tables published through their root, as the store records
them (window manifests' optional ``partition_leaves`` field, format 1; a copy's table
entry ``partitions``), and how two records compare. Pure code: the drain fills the field
(:func:`airflow_pgcdc.drain.guards.partition_leaves`), the merge refuses a root whose
leaves changed (:mod:`airflow_pgcdc.merge.job`).

Why: with ``publish_via_partition_root = true`` the stream names the root, and
``ATTACH``/``DETACH PARTITION`` (and ``DROP`` of a partition) stream no rows: the rows an
attached table held, or a detached one holds, enter or leave the root in PostgreSQL and
never reach its Delta table. A partition created with ``CREATE TABLE … PARTITION OF`` is
harmless (its rows are streamed as the root's).

A window's entry for a root::

    {"schema": "public", "table": "m",
     "leaves": [{"schema", "table", "oid", "link", "attached_after_creation"}, ...],
     "attached": [[schema, table], ...], "detached": [[schema, table], ...]}

``leaves``: the root's leaf partitions when the window was committed. ``link``: the
transaction ids of the partition links from the leaf up to the root (``pg_inherits.xmin``),
``/``-joined: a leaf detached and attached again gets a new one.
``attached_after_creation``: a link on that path was made after the table was created
(``ATTACH PARTITION``), not by ``CREATE TABLE … PARTITION OF``. ``attached`` and
``detached`` (present only when not empty): what changed since the previous window's entry
for the root (by oid and link), or, when the previous window has none, since the root's
newest copy (by name): leaves attached after their creation, and leaves gone (detached,
dropped, or attached again).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "PARTITION_LEAVES_FIELD",
    "Leaf",
    "RootLeaves",
    "changes_since_copy",
    "changes_since_window",
    "copied_leaves",
    "window_partition_leaves",
]

PARTITION_LEAVES_FIELD = "partition_leaves"
COPY_PARTITIONS_FIELD = "partitions"  # a copy's table entry (snapshot/export.py)

Name = tuple[str, str]


@dataclass(frozen=True)
class Leaf:
    schema: str
    table: str
    oid: int | None = None
    link: str | None = None
    attached_after_creation: bool = False

    @property
    def name(self) -> Name:
        return (self.schema, self.table)

    @property
    def identity(self) -> tuple:
        """What stays the same while the leaf stays attached (a rename keeps it)."""
        return (self.oid, self.link) if self.oid is not None else self.name

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "table": self.table, "oid": self.oid, "link": self.link,
                "attached_after_creation": self.attached_after_creation}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Leaf:
        return cls(str(d["schema"]), str(d["table"]), None if d.get("oid") is None else int(d["oid"]),
                   None if d.get("link") is None else str(d["link"]), bool(d.get("attached_after_creation")))


@dataclass(frozen=True)
class RootLeaves:
    schema: str
    table: str
    leaves: tuple[Leaf, ...]
    attached: tuple[Name, ...] = ()
    detached: tuple[Name, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.attached or self.detached)

    @property
    def names(self) -> frozenset[Name]:
        return frozenset(leaf.name for leaf in self.leaves)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"schema": self.schema, "table": self.table,
                             "leaves": [leaf.to_dict() for leaf in self.leaves]}
        if self.attached:
            d["attached"] = [list(n) for n in self.attached]
        if self.detached:
            d["detached"] = [list(n) for n in self.detached]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RootLeaves:
        return cls(
            str(d["schema"]), str(d["table"]), tuple(Leaf.from_dict(x) for x in d.get("leaves", ())),
            tuple((str(s), str(t)) for s, t in d.get("attached", ())),
            tuple((str(s), str(t)) for s, t in d.get("detached", ())),
        )


def window_partition_leaves(manifest) -> dict[Name, RootLeaves]:
    """A window manifest's entries by root; ``{}`` for a window written before the field
    existed, or without partitioned roots."""
    raw = (getattr(manifest, "extra", None) or {}).get(PARTITION_LEAVES_FIELD)
    if not isinstance(raw, list):
        return {}
    out = {}
    for d in raw:
        r = RootLeaves.from_dict(d)
        out[(r.schema, r.table)] = r
    return out


def copied_leaves(entry) -> frozenset[Name] | None:
    """The leaves a copy (snapshot or resync table entry) of a partitioned root holds, or
    ``None`` when the entry records none (not a partitioned table, or an older copy)."""
    raw = (getattr(entry, "extra", None) or {}).get(COPY_PARTITIONS_FIELD)
    if not isinstance(raw, list):
        return None
    return frozenset((str(s), str(t)) for s, t in raw)


def changes_since_window(now: Iterable[Leaf], before: RootLeaves) -> tuple[tuple[Name, ...], tuple[Name, ...]]:
    """``(attached, detached)`` from a previous window's entry to ``now``: leaves whose
    identity is new and were attached after their creation; leaves whose identity is gone
    (detached, dropped, or detached and attached again)."""
    now = list(now)
    then = {leaf.identity for leaf in before.leaves}
    current = {leaf.identity for leaf in now}
    attached = sorted({leaf.name for leaf in now if leaf.identity not in then and leaf.attached_after_creation})
    detached = sorted({leaf.name for leaf in before.leaves if leaf.identity not in current})
    return tuple(attached), tuple(detached)


def changes_since_copy(now: Iterable[Leaf], copied: Iterable[Name]) -> tuple[tuple[Name, ...], tuple[Name, ...]]:
    """``(attached, detached)`` from a copy's leaves (names) to ``now``: leaves not in the
    copy that were attached after their creation; the copy's leaves no longer there (by
    name: a renamed leaf counts as detached)."""
    now = list(now)
    copied = set(copied)
    names = {leaf.name for leaf in now}
    attached = sorted({leaf.name for leaf in now if leaf.name not in copied and leaf.attached_after_creation})
    detached = sorted(copied - names)
    return tuple(attached), tuple(detached)
