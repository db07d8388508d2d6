"""One slot's folder in the store, as an object a job asks (:class:`SlotStore`): the
committed snapshot, the resyncs and slices, window manifests by sequence number, the merge's
tables index, the tables the pipeline has copied. Each is read from S3 once per object (the
object lives for one run of a job: a later run makes a new one and sees what changed since),
so a job that asks the same thing in five places reads it once."""

from __future__ import annotations

import functools
from typing import Any

from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout

__all__ = ["SlotStore"]


class SlotStore:
    """The reads of ``slot``'s folder under ``layout`` (the store) through ``client``,
    memoized. Nothing here writes."""

    def __init__(self, client: Any, layout: Layout, slot: str) -> None:
        self.client = client
        self.layout = layout
        self.slot = slot
        self._windows: dict[int, Any] = {}
        self._documents: dict[int, bytes | None] = {}
        self._resyncs: dict[bool, list] = {}

    @functools.cached_property
    def snapshot(self):
        """The committed snapshot's manifest, or ``None``."""
        from airflow_pgcdc.store.manifest import committed_snapshot

        return committed_snapshot(self.client, self.layout, self.slot)

    def resyncs(self, *, slices: bool = False) -> list:
        """The committed resyncs (``slices``: the slice resyncs), oldest first."""
        if slices not in self._resyncs:
            from airflow_pgcdc.store.resyncs import committed_resyncs

            self._resyncs[slices] = committed_resyncs(self.client, self.layout, self.slot, slices=slices)
        return self._resyncs[slices]

    def window_document(self, seq: int) -> bytes | None:
        """The committed window ``seq``'s manifest as stored, or ``None`` when the window is
        not committed (one GET either way)."""
        if seq not in self._documents:
            try:
                self._documents[seq] = s3store.get_bytes(self.client, self.layout.bucket,
                                                         self.layout.window_manifest(self.slot, seq))
            except s3store.ObjectNotFound:
                self._documents[seq] = None
        return self._documents[seq]

    def window(self, seq: int):
        """The committed window ``seq``'s manifest (``ObjectNotFound`` if not committed),
        parsed from :meth:`window_document`."""
        if seq not in self._windows:
            from airflow_pgcdc.store.window import read_window

            self._windows[seq] = read_window(self.client, self.layout, self.slot, seq,
                                             document=self.window_document(seq))
        return self._windows[seq]

    @functools.cached_property
    def tables_index(self) -> dict | None:
        """The merge's tables index (``{slot}/merge/tables.json``), or ``None`` when there is
        none or it cannot be read (a cache: nobody fails on it)."""
        try:
            doc = s3store.get_json(self.client, self.layout.bucket, self.layout.merge_tables_index(self.slot))
        except Exception:  # noqa: BLE001 - a cache
            return None
        return doc if isinstance(doc, dict) else None

    @functools.cached_property
    def copied_tables(self) -> list[tuple[str, str]]:
        """Every table the snapshot or a resync copied, ``(schema, table)``, snapshot first,
        once each."""
        tables: dict[tuple[str, str], None] = {}
        for t in self.snapshot.tables if self.snapshot is not None else ():
            tables[(t.schema, t.table)] = None
        for r in self.resyncs():
            for t in r.manifest.tables:
                tables[(t.schema, t.table)] = None
        return list(tables)
