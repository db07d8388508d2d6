"""The resyncs of a slot in the store (see :mod:`airflow_pgcdc.snapshot.resync`): table
snapshots taken after the pipeline's own, each at its consistent point, in the ordinary
snapshot format under ``{prefix}/{slot}/resync/{resync slot}/snapshot/{id}/``. Pure store
code: the merge reads them without PostgreSQL."""

from __future__ import annotations

from dataclasses import dataclass

from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout
from airflow_pgcdc.store.manifest import SnapshotManifest, TableEntry, read_snapshot_manifest

__all__ = ["Resync", "committed_resyncs", "latest_resync"]


@dataclass(frozen=True)
class Resync:
    """A committed resync: a snapshot of some tables at ``consistent_point``."""

    manifest: SnapshotManifest
    layout: Layout  # the slot's resync layout (Layout.resync_layout)
    resync_slot: str  # the temporary slot that exported the snapshot

    @property
    def consistent_point(self) -> LSN:
        return LSN.parse(self.manifest.consistent_point)

    @property
    def prefix(self) -> str:
        """The key prefix of its parts (a table entry's part paths are relative to it)."""
        return self.layout.snapshot_prefix(self.resync_slot, self.manifest.snapshot_id)

    @property
    def url(self) -> str:
        return self.layout.url(self.layout.snapshot_manifest(self.resync_slot, self.manifest.snapshot_id))

    def entry(self, schema: str, table: str) -> TableEntry | None:
        return next((t for t in self.manifest.tables if t.schema == schema and t.table == table), None)


def committed_resyncs(client, layout: Layout, slot: str, *, slices: bool = False) -> list[Resync]:
    """Every committed resync of ``slot`` in the store, oldest consistent point first (a
    folder without a manifest, a failed or running resync, is left out). ``slices``: the
    slice resyncs instead (``pgcdc resync --where``, under :meth:`Layout.slice_layout`:
    kept apart, a slice is not a table's copy and only the merge reads them)."""
    rl = layout.slice_layout(slot) if slices else layout.resync_layout(slot)
    found = []
    base = rl.root.prefix + "/"
    for key in s3store.list_keys(client, rl.bucket, base):
        parts = key[len(base):].split("/")
        if len(parts) == 4 and parts[1] == "snapshot" and parts[3] == "_manifest.json":
            manifest = read_snapshot_manifest(client, rl.bucket, key)
            found.append(Resync(manifest=manifest, layout=rl, resync_slot=parts[0]))
    return sorted(found, key=lambda r: int(r.consistent_point))


def latest_resync(resyncs: list[Resync], schema: str, table: str) -> tuple[Resync, TableEntry] | None:
    """The newest resync (of :func:`committed_resyncs`' list) holding the table."""
    for r in reversed(resyncs):
        entry = r.entry(schema, table)
        if entry is not None:
            return r, entry
    return None
