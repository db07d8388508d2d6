"""Slices: ``pgcdc resync --tables t --where PREDICATE`` merged as upserts.

A slice is a copy of the rows of a table that match a predicate, taken like any resync
under a temporary slot's exported snapshot at its consistent point C (every transaction
committed before C is in the copy, every later one in the pipeline's windows), kept apart
from whole-table copies (:meth:`~airflow_pgcdc.store.layout.Layout.slice_layout`). It
repairs a range of a Delta table (a tenant, rows changed since a date) without replacing it.

The merge applies a pending slice as part of one ordinary batch: the slice's rows enter the
batch as upserts committed just before C (``_pgcdc_commit_lsn = C - 1``), beside every
change of the windows from the first one C does not cover (re-read when the table merged
them already), and the compaction keeps each key's last row. So a sliced key ends as the
slice left it plus every change after C, and every other key ends as its last change
says, which is what the table held already: applying windows again is idempotent per key,
truncates included. One commit records the table's app transaction and the slice's
(``{app}:resync`` = C, the same mark a whole-table resync leaves, which upkeep reads to
remove the copy's parts). A crash before it leaves the table as it was; the rerun does it
again.

What a slice does not do: remove a Delta row the source does not hold (the predicate is
PostgreSQL's and cannot be evaluated on the lake; resync the whole table for that); slice a
table without a key; merge with Delta's Spark engine (one app transaction per commit: the
table fails with the command that merges it with delta-rs, which the engines share); or
apply in a replay to a point (windows after the point are not read; the slice waits for the
next merge).
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_pgcdc.lake.inspect import merged_version
from airflow_pgcdc.lake.tables import RESYNC_APP_SUFFIX
from airflow_pgcdc.merge.errors import SliceNotMerged
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.quoting import shell_qualified
from airflow_pgcdc.store.manifest import SLICE_WHERE

__all__ = ["SliceInput", "pending_slices", "slice_start"]



@dataclass(frozen=True)
class SliceInput:
    """A slice's rows of one table: its parts (keys in the store's bucket), its point (the
    rows enter the batch at ``lsn - 1``), its columns and predicate."""

    parts: tuple[str, ...]
    lsn: int
    columns: tuple[str, ...]
    where: str
    url: str
    rows: int = 0
    bytes: int = 0


def pending_slices(ctx, schema: str, table: str, dt, app: str, since: int | None) -> list[SliceInput]:
    """The slices of the table its Delta table ``dt`` has not applied (their point is after
    its ``{app}:resync`` mark and after a whole-table copy at ``since``), oldest first."""
    found = []
    if not ctx.slices:
        return found
    applied = merged_version(dt, app + RESYNC_APP_SUFFIX) if dt is not None else None
    floor = max(x for x in (applied, since, -1) if x is not None)
    for r in ctx.slices:
        entry = r.entry(schema, table)
        if entry is None or int(r.consistent_point) <= floor:
            continue
        if f"{schema}.{table}" in ctx.expired_copies.get(r.layout.snapshot_manifest(r.resync_slot,
                                                                                   r.manifest.snapshot_id), ()):
            continue  # upkeep removed its parts once a table applied it (a rebuilt table needs no repair)
        found.append(SliceInput(parts=tuple(r.prefix + p.path for p in entry.parts), lsn=int(r.consistent_point),
                                columns=tuple(c.name for c in entry.columns), url=r.url,
                                where=str((entry.extra or {}).get(SLICE_WHERE, "")),
                                rows=sum(p.rows for p in entry.parts), bytes=sum(p.bytes for p in entry.parts)))
    if not found:
        return found
    name = f"{schema}.{table}"
    if not ctx.sink.multi_transaction:
        raise SliceNotMerged(
            f"{name}: the slice {found[-1].url} is merged by the delta-rs engine (its commit records the table's "
            "app transaction and the slice's; Delta's Spark engine records one): nothing merged",
            hint=f"pgcdc merge --tables {shell_qualified(schema, table)} (without --engine) once; the tables stay "
                 "Delta tables the delta-spark merges go on with")
    if dt is None:
        raise SliceNotMerged(
            f"{name}: the slice {found[-1].url} repairs rows of a Delta table there is none of yet",
            hint="merge once so the table is created from its copy, then merge again; or resync the whole table")
    return found


def slice_start(manifests, slices: list[SliceInput], merged: int | None) -> int | None:
    """Where the batch's windows start: after the last window every slice's copy covers
    (re-reading windows the table merged), or after ``merged`` when that is earlier;
    ``None``: from window 0."""
    covered = min(max((m.window_seq for m in manifests if m.end <= LSN(s.lsn)), default=-1) for s in slices)
    start = min(-1 if merged is None else merged, covered)
    return None if start < 0 else start
