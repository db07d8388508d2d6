"""Upkeep of the change store of one slot: expired windows and merge staging debris.

A window is **expired** when it is older than the retention (its manifest's
LastModified), is not the latest committed window, and every table it holds (changes or a
truncate) has merged it: the table's Delta table exists and the app transaction version of
the table (and of its ``__changelog``/``__scd2`` history tables, when they exist) is at
least the window's ``window_seq``. Nothing is expired while a resync is committed but not
yet applied to its Delta table (its merge reads the windows after its copy again).

Expiring a window removes every object of its folder **except its ``_manifest.json``**
(and a held prepared transaction's spool that the latest window still lists as pending):
the parts, the messages, spools no one needs, and the debris of crashed attempts. The
manifest stays as a tombstone (a few kB), so the windows still tile the LSN line: the
merge's gap check (``WindowGap``), its tables index, the drain's start (the latest window)
and its timeline check (which bisects over old manifests) read exactly what they read
before. Before deleting anything, ``{slot}/maintain/expired.json`` records the expired
windows (ranges of ``window_seq``); a reader must not read the parts of a window listed
there. No merge reads them: every table that has changes in such a window merged it.

Window folders below the latest committed window without a manifest (crashed attempts)
older than the retention are removed whole. ``{slot}/merge-staging/{run}/`` folders whose
newest object is older than the retention (and than 6 hours, whatever the retention: a running merge's
staging must stay) are removed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import MANIFEST_NAME, Layout
from airflow_pgcdc.store.window import held_tables, read_window, window_folders

log = logging.getLogger("airflow_pgcdc.maintain")

EXPIRED_FORMAT = 1


def expired_key(layout: Layout, slot: str) -> str:
    """``{prefix}/{slot}/maintain/expired.json``."""
    return layout.changes_prefix(slot)[: -len("changes/")] + "maintain/expired.json"


def seq_ranges(seqs: Iterable[int]) -> list[list[int]]:
    """Window numbers as sorted inclusive ``[first, last]`` runs: ``[1, 2, 3, 7]`` →
    ``[[1, 3], [7, 7]]`` (how ``expired.json`` stores them, and how errors name them)."""
    out: list[list[int]] = []
    for s in sorted(set(seqs)):
        if out and out[-1][1] == s - 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return out


def _expired_doc(client, layout: Layout, slot: str) -> dict[str, Any]:
    try:
        doc = s3store.get_json(client, layout.bucket, expired_key(layout, slot))
    except s3store.ObjectNotFound:
        return {"format": EXPIRED_FORMAT, "slot": slot}
    if doc.get("format") != EXPIRED_FORMAT:
        raise s3store.StoreError(f"expired.json format {doc.get('format')!r} is not supported",
                                 bucket=layout.bucket, key=expired_key(layout, slot))
    return doc


def read_expired_all(client, layout: Layout, slot: str) -> tuple[set[int], dict[str, set[str]]]:
    """``expired.json`` read once: the windows whose parts were removed, and the tables
    whose parts were removed from each copy (``{snapshot manifest key: {schema.table}}``;
    see :mod:`.copies`); both empty when there is no such file."""
    doc = _expired_doc(client, layout, slot)
    windows = {s for a, b in doc.get("windows", ()) for s in range(int(a), int(b) + 1)}
    return windows, {str(k): {str(n) for n in v} for k, v in (doc.get("copies") or {}).items()}


def read_expired(client, layout: Layout, slot: str) -> set[int]:
    """The windows whose parts were removed (``expired.json``), or an empty set."""
    return read_expired_all(client, layout, slot)[0]


def read_expired_copies(client, layout: Layout, slot: str) -> dict[str, set[str]]:
    """The tables whose parts were removed from each copy (``expired.json``'s ``copies``)."""
    return read_expired_all(client, layout, slot)[1]


def update_expired(client, layout: Layout, slot: str, *, windows: set[int] | None = None,
                   copies: dict[str, list[str]] | None = None) -> None:
    """Rewrite ``expired.json`` with ``windows`` and/or ``copies`` (what is not given is kept
    as read)."""
    doc = _expired_doc(client, layout, slot)
    if windows is not None:
        doc["windows"] = seq_ranges(windows)
    if copies is not None:
        doc["copies"] = copies
    doc.update(slot=slot, updated_at=datetime.now(UTC).isoformat(timespec="seconds"))
    s3store.put_bytes(client, layout.bucket, expired_key(layout, slot), json.dumps(doc, indent=1),
                      content_type="application/json")


def expire_windows(
    client,
    layout: Layout,
    slot: str,
    *,
    merged: Callable[[str, str], int | None],
    cutoff: datetime,
    blocked: str | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Remove the parts of the expired windows (see the module doc). ``merged(schema,
    table)``: the last window every Delta table of that source table merged (``None``: no
    Delta table, or one that must not lose its windows). ``blocked``: a reason to expire
    nothing (still cleans the debris of crashed attempts)."""
    folders = window_folders(client, layout, slot)
    done = read_expired(client, layout, slot)
    objects: dict[int, list[dict]] = {}
    base = layout.changes_prefix(slot)
    for o in s3store.list_objects(client, layout.bucket, base):
        try:
            seq = layout.parse_window_key(slot, o["Key"])
        except Exception:  # noqa: BLE001 - not a window's object
            continue
        objects.setdefault(seq, []).append(o)
    committed = {s for s in folders if any(o["Key"].endswith("/" + MANIFEST_NAME) for o in objects.get(s, ()))}
    latest = max(committed, default=None)
    out: dict[str, Any] = {"latest_window": latest, "expired": [], "kept": {}, "debris_windows": [],
                           "objects": 0, "bytes": 0, "dry_run": dry_run}
    if latest is None:
        return out
    latest_m = read_window(client, layout, slot, latest)
    protected = {layout.window_prefix(slot, int(e["stored"]["window_seq"])) + e["stored"]["path"]
                 for e in latest_m.pending_prepared if e.get("stored")}
    victims: list[dict] = []
    newly: set[int] = set()

    def keep(seq: int, why: str) -> None:
        out["kept"].setdefault(why, []).append(seq)

    for seq in folders:
        if seq >= latest:
            continue
        objs = objects.get(seq, [])
        if seq not in committed:  # a crashed attempt's debris
            if objs and max(o["LastModified"] for o in objs) < cutoff:
                out["debris_windows"].append(seq)
                victims.extend(objs)
            continue
        rest = [o for o in objs if not o["Key"].endswith("/" + MANIFEST_NAME) and o["Key"] not in protected]
        if seq in done and not rest:
            continue
        manifest_obj = next(o for o in objs if o["Key"].endswith("/" + MANIFEST_NAME))
        if manifest_obj["LastModified"] >= cutoff:
            keep(seq, "younger than the retention")
            continue
        if blocked:
            keep(seq, blocked)
            continue
        m = read_window(client, layout, slot, seq)
        waiting = sorted(f"{s}.{t}" for s, t in held_tables(m) if (merged(s, t) is None or merged(s, t) < seq))
        if waiting:
            keep(seq, "not merged by " + ", ".join(waiting))
            continue
        newly.add(seq)
        victims.extend(rest)
    out["expired"] = seq_ranges(newly)
    out["kept"] = {why: seq_ranges(seqs) for why, seqs in out["kept"].items()}
    out["debris_windows"] = seq_ranges(out["debris_windows"])
    out["objects"] = len(victims)
    out["bytes"] = sum(int(o["Size"]) for o in victims)
    if dry_run or not victims:
        return out
    if newly:  # the record first: a crash after it leaves windows listed whose parts may remain
        update_expired(client, layout, slot, windows=done | newly)
    s3store.delete_keys(client, layout.bucket, (o["Key"] for o in victims), what=base)
    log.info("slot %s: expired %d window(s) %s, %d debris folder(s): %d object(s), %d bytes", slot,
             len(newly), out["expired"], len(out["debris_windows"]), out["objects"], out["bytes"])
    return out


STAGING_MIN_AGE_HOURS = 6
"""Staging younger than this is never removed, whatever the retention (a running merge's:
removing it fails that merge). The merge job itself removes staging older than this too."""


def remove_staging(client, layout: Layout, slot: str, *, cutoff: datetime, dry_run: bool = False) -> dict[str, Any]:
    """Remove ``merge-staging/{run}/`` folders whose newest object is older than ``cutoff``
    (and than :data:`STAGING_MIN_AGE_HOURS`)."""
    cutoff = min(cutoff, datetime.now(UTC) - timedelta(hours=STAGING_MIN_AGE_HOURS))
    base = layout.merge_staging_prefix(slot)
    runs: dict[str, list[dict]] = {}
    for o in s3store.list_objects(client, layout.bucket, base):
        runs.setdefault(o["Key"][len(base):].split("/", 1)[0], []).append(o)
    old = {r: objs for r, objs in runs.items() if max(o["LastModified"] for o in objs) < cutoff}
    out = {"runs": sorted(old), "objects": sum(len(v) for v in old.values()),
           "bytes": sum(int(o["Size"]) for v in old.values() for o in v), "dry_run": dry_run}
    if not dry_run:
        for r in old:
            s3store.delete_prefix(client, layout.bucket, base + r + "/")
    if old:
        log.info("slot %s: merge staging debris: %d run(s), %d object(s), %d bytes%s", slot, len(old),
                 out["objects"], out["bytes"], " (dry run)" if dry_run else "")
    return out


def cutoff_for(retention_hours: float, now: datetime | None = None) -> datetime:
    return (now or datetime.now(UTC)) - timedelta(hours=retention_hours)


# -- the record of the last maintenance of each Delta table ------------------------------

RECORD_FORMAT = 1


def record_key(layout: Layout, slot: str, table_url: str) -> str:
    """``{prefix}/{slot}/maintain/tables/{segment}.json``: ``{segment}`` is the Delta table's
    folder under its root (``{schema}.{table}`` encoded as in the store, plus ``__changelog``
    or ``__scd2`` for a history table)."""
    segment = table_url.rstrip("/").rsplit("/", 1)[-1]
    return layout.changes_prefix(slot)[: -len("changes/")] + f"maintain/tables/{segment}.json"


def read_records(client, layout: Layout, slot: str, table_url: str) -> dict[str, Any]:
    """``{delta table url: record}`` of the table's folder name (one entry per Delta root
    that ``pgcdc maintain`` was run on), or ``{}`` (never maintained, or an unknown
    ``format``: not this reader's to interpret)."""
    try:
        doc = s3store.get_json(client, layout.bucket, record_key(layout, slot, table_url))
    except s3store.ObjectNotFound:
        return {}
    if not isinstance(doc, dict) or doc.get("format") != RECORD_FORMAT:
        log.warning("%s: maintain record format %r not supported: ignored", table_url,
                    doc.get("format") if isinstance(doc, dict) else None)
        return {}
    runs = doc.get("delta")
    return runs if isinstance(runs, dict) else {}


def last_maintenance(client, layout: Layout, slot: str, table_url: str) -> dict[str, Any] | None:
    """The record of the last ``pgcdc maintain`` of the Delta table at ``table_url`` (see
    :func:`write_record`), or None."""
    return read_records(client, layout, slot, table_url).get(table_url.rstrip("/"))


def write_record(client, layout: Layout, slot: str, table_url: str, record: dict[str, Any]) -> None:
    """Record the last maintenance of one Delta table (read, update this root's entry,
    write; ``pgcdc maintain`` runs one at a time per slot: the example DAG's
    ``max_active_runs=1``). Fields of entries written by other roots are kept as read."""
    try:
        doc = s3store.get_json(client, layout.bucket, record_key(layout, slot, table_url))
        if not isinstance(doc, dict) or doc.get("format") != RECORD_FORMAT:
            doc = None
    except s3store.ObjectNotFound:
        doc = None
    doc = doc or {"format": RECORD_FORMAT, "kind": "maintain-table", "slot": slot, "delta": {}}
    doc.setdefault("delta", {})[table_url.rstrip("/")] = record
    s3store.put_bytes(client, layout.bucket, record_key(layout, slot, table_url),
                      json.dumps(doc, indent=1, default=str), content_type="application/json")
