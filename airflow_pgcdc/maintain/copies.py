"""Upkeep of the store's table copies: the slot's snapshot and the copies of its resyncs.

A copy of a table serves one purpose: creating (or replacing) that table's Delta table.
Once that is done and the copy is older than the retention, it serves nothing the
pipeline does; on a table of any size it is the biggest single thing the store keeps
(the soak's initial snapshot was 56 % of the table's own size). A table's parts in a copy
are **expired** when the copy finished before the retention's cutoff and

* the slot's snapshot: the table's Delta table exists (bootstrapped from it, or replaced
  by a resync since);
* a resync's copy: the table's Delta table has applied that resync or a later one (its
  ``{app}:resync`` app transaction is at or after the copy's consistent point).

A table whose Delta table does not exist under the Delta root ``pgcdc maintain`` is given
(not merged yet, merged with ``--tables`` leaving it out, or dropped) keeps its parts; a
Delta table that cannot be read (S3 down, a broken log) stops this step with that error
before anything of it is removed.

Expiring removes the table's part objects; the copy's ``_manifest.json`` stays (the merge
reads the tables, columns and keys the pipeline knows from it, and the resyncs' order),
and ``{slot}/maintain/expired.json`` lists the expired tables of each copy (``copies``:
``{manifest key: ["schema.table", …]}``), written before anything is deleted. A merge that
would need such parts again (the Delta table was dropped, or a ``__scd2`` history table is
added after the fact) stops that table with :class:`~airflow_pgcdc.merge.errors.CopyExpired`
and the ``pgcdc resync`` that gives it a new copy; the other tables go on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout, encode_table_segment
from airflow_pgcdc.store.maintenance import read_expired_copies, update_expired

log = logging.getLogger("airflow_pgcdc.maintain")


def expire_copies(
    client,
    layout: Layout,
    slot: str,
    copies: Iterable[tuple[Layout, str, Any]],
    *,
    done: Callable[[Any, str, str], bool],
    cutoff: datetime,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Remove the parts of the tables of ``copies`` that expired (see the module doc).
    ``copies``: ``(layout, slot, SnapshotManifest)``, the layout and slot the copy's keys are
    under (the slot's own, or a resync's). ``done(manifest, schema, table)``: whether the
    table's Delta table no longer needs this copy. Returns ``{"expired": {snapshot id:
    [schema.table]}, "kept": {why: [id:schema.table]}, "objects", "bytes", "dry_run"}``."""
    recorded = read_expired_copies(client, layout, slot)
    newly: dict[str, list[str]] = {}
    victims: list[dict] = []
    out: dict[str, Any] = {"expired": {}, "kept": {}, "dry_run": dry_run}
    for lay, copy_slot, manifest in copies:
        key = lay.snapshot_manifest(copy_slot, manifest.snapshot_id)
        parts = _CopyObjects(client, lay, lay.snapshot_prefix(copy_slot, manifest.snapshot_id))
        for t in manifest.tables:
            name = f"{t.schema}.{t.table}"
            if name in recorded.get(key, ()):  # expired before: a crash may have left some parts
                victims.extend(parts.of(t.schema, t.table))
                continue
            why = None
            if manifest.finished_at >= cutoff:
                why = "younger than the retention"
            elif not done(manifest, t.schema, t.table):
                why = "its Delta table does not hold this copy yet (not created, or the resync not applied)"
            if why:
                out["kept"].setdefault(why, []).append(f"{manifest.snapshot_id}:{name}")
                continue
            newly.setdefault(key, []).append(name)
            out["expired"].setdefault(manifest.snapshot_id, []).append(name)
            victims.extend(parts.of(t.schema, t.table))
    out["objects"] = len(victims)
    out["bytes"] = sum(int(o["Size"]) for o in victims)
    if dry_run or not victims:
        return out
    if newly:  # the record first: a crash after it leaves tables listed whose parts may remain
        merged = {k: set(v) for k, v in recorded.items()}
        for k, names in newly.items():
            merged.setdefault(k, set()).update(names)
        update_expired(client, layout, slot, copies={k: sorted(v) for k, v in merged.items()})
    s3store.delete_keys(client, layout.bucket, (o["Key"] for o in victims), what="expired copies")
    log.info("slot %s: expired the copies of %s: %d object(s), %d bytes", slot,
             "; ".join(f"{sid}: {', '.join(names)}" for sid, names in out["expired"].items()) or "(leftovers)",
             out["objects"], out["bytes"])
    return out


class _CopyObjects:
    """The objects of one copy, listed once (when first asked), by table: one listing of
    the copy instead of one per table (every run looks again at the tables expired before,
    for parts a crash left)."""

    def __init__(self, client, layout: Layout, prefix: str) -> None:
        self.client, self.layout, self.prefix = client, layout, prefix
        self._by_segment: dict[str, list[dict]] | None = None

    def of(self, schema: str, table: str) -> list[dict]:
        if self._by_segment is None:
            self._by_segment = {}
            for o in s3store.list_objects(self.client, self.layout.bucket, self.prefix):
                segment, sep, _ = o["Key"][len(self.prefix):].partition("/")
                if sep:  # a table's object, not the copy's manifest
                    self._by_segment.setdefault(segment, []).append(o)
        return self._by_segment.get(encode_table_segment(schema, table), [])
