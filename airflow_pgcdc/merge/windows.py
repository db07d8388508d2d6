"""Which windows a merge job reads and each table needs: the window manifests (read
in parallel), the tables index that lets a job skip windows no table needs, the tables a
job selects, and the resyncs pending for a table. Part of the merge job (:mod:`.job`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from airflow_pgcdc.lake.inspect import merged_version, open_table
from airflow_pgcdc.lake.tables import RESYNC_APP_SUFFIX
from airflow_pgcdc.merge.context import (
    JobContext,
    target_url,
)
from airflow_pgcdc.merge.errors import MergeError
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout
from airflow_pgcdc.store.partitions import (
    window_partition_leaves,
)
from airflow_pgcdc.store.resyncs import latest_resync
from airflow_pgcdc.store.window import read_window, truncated_relations, window_folders

log = logging.getLogger("airflow_pgcdc.merge.job")  # the job's one logger, whatever module logs


MANIFEST_READERS = 16
"""Window manifests read at once (the S3 client pools 32 connections): a slot with months
of windows has thousands, and one GET after the other would cost the job minutes."""


def _read_windows(client, layout: Layout, slot: str, seqs: Sequence[int]) -> list:
    """The committed window manifests among ``seqs``, in that order (read concurrently;
    boto3 clients are thread-safe); a folder without a manifest (a crashed attempt, a
    drain in progress) is left out."""

    def read(seq: int):
        try:
            return read_window(client, layout, slot, seq)
        except s3store.ObjectNotFound:
            return None

    if len(seqs) <= 1:
        found = [read(s) for s in seqs]
    else:
        from concurrent.futures import ThreadPoolExecutor

        workers = min(MANIFEST_READERS, len(seqs))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pgcdc-manifests") as pool:
            found = list(pool.map(read, seqs))
    return [m for m in found if m is not None]


TABLES_INDEX_FORMAT = 1


def load_windows(ctx: JobContext, snapshot, only: Sequence[str] | None) -> tuple[list, list[tuple[str, str]]]:
    """The window manifests this job needs and the tables to merge, without reading every
    manifest of a slot that has run for months.

    A merge needs, per table, the windows after its last merged one that hold it; the
    tables are the snapshot's and every table some window holds. The tables index
    (:meth:`Layout.merge_tables_index`, written by the previous job) says which tables
    windows ``0..through`` hold and the last of those windows holding each. This job
    reads the manifests after ``through``; a table that no window up to ``through`` holds
    after its last merged one is anchored at ``through`` (``ctx.anchors``: it needs
    nothing before); the others need the windows from their last merged one, so the
    manifests from the lowest of those (the floor) up to ``through`` are read too. A
    missing, unreadable or stale index (its ``through`` window no longer ends where it
    did) means reading them all."""
    client, layout, slot = ctx.client, ctx.layout, ctx.slot
    folders = window_folders(client, layout, slot)
    through, last_seen = _read_tables_index(ctx, folders)
    newer = _read_windows(client, layout, slot, [s for s in folders if s > through])
    names: dict[tuple[str, str], None] = {}
    if snapshot is not None:
        for t in snapshot.tables:
            names[(t.schema, t.table)] = None
    for name in last_seen:
        names[name] = None
    for r in ctx.resyncs:
        for t in r.manifest.tables:
            names[(t.schema, t.table)] = None
    for m in newer:
        for held in _held_tables(m):
            names[held] = None
    wanted = _select_tables(names, only)
    floor = _merged_floor(ctx, wanted, through, last_seen) if through >= 0 else 0
    for schema, table in wanted:  # a resync (or a slice) to apply moves the table back: it needs every window
        if pending_resync(ctx, schema, table) is not None or slice_pending(ctx, schema, table):
            ctx.anchors.pop(f"{schema}.{table}", None)
            floor = 0
    older = _read_windows(client, layout, slot, [s for s in folders if floor <= s <= through])
    manifests = older + newer
    seen = {m.window_seq: m for m in newer}
    new_through = through
    while new_through + 1 in seen:  # only a gapless run extends what the index covers
        new_through += 1
        for held in _held_tables(seen[new_through]):
            last_seen[held] = new_through
    for name in names:
        last_seen.setdefault(name, -1)
    if new_through > through:
        _write_tables_index(ctx, new_through, seen[new_through].end_lsn, last_seen)
    log.info(
        "slot %s: %d window folder(s); read %d manifest(s) (index through window %d, floor %d, "
        "%d table(s) anchored)", slot, len(folders), len(manifests), through, floor, len(ctx.anchors),
    )
    return manifests, wanted


def table_left_pipeline(manifests, schema: str, table: str) -> bool:
    """Whether the newest window read says the table is no longer in the pipeline (its
    ``pipeline_tables``, recorded since the drain checks publications)."""
    if not manifests:
        return False
    newest = max(manifests, key=lambda m: m.window_seq)
    return newest.pipeline_tables is not None and (schema, table) not in newest.pipeline_tables


def _held_tables(m) -> set[tuple[str, str]]:
    """The tables a window holds changes or a truncate of, and the partitioned roots whose
    leaves it says changed (so that the tables index never lets a merge skip that window:
    the root is refused from it on, see :func:`check_partitions`)."""
    out = {(t["schema"], t["table"]) for t in m.tables}
    out |= {root for root, e in window_partition_leaves(m).items() if e.changed}
    for tr in m.truncates:
        out.update(truncated_relations(tr))
    return out


def _read_tables_index(ctx: JobContext, folders: list[int]) -> tuple[int, dict[tuple[str, str], int]]:
    """``(through, {table: last window up to through holding it, -1: none})`` from the
    index, or ``(-1, {})`` when there is none usable."""
    key = ctx.layout.merge_tables_index(ctx.slot)
    if ctx.every_window:
        return -1, {}
    try:
        doc = s3store.get_json(ctx.client, ctx.layout.bucket, key)
        if doc.get("format") != TABLES_INDEX_FORMAT:
            raise ValueError(f"format {doc.get('format')!r}")
        through = int(doc["through"])
        tables = {(str(t["schema"]), str(t["table"])): int(t["last_window"]) for t in doc["tables"]}
        if through not in folders or read_window(ctx.client, ctx.layout, ctx.slot, through).end_lsn != doc["end_lsn"]:
            raise ValueError(f"window {through} is not the one the index saw")
        return through, tables
    except s3store.ObjectNotFound:
        return -1, {}
    except Exception as exc:  # a cache: never trust a doubtful one, never fail on it
        log.warning("ignoring the merge tables index s3://%s/%s: %s", ctx.layout.bucket, key, exc)
        return -1, {}


def _write_tables_index(ctx: JobContext, through: int, end_lsn: str, last_seen: dict) -> None:
    doc = {
        "format": TABLES_INDEX_FORMAT,
        "slot": ctx.slot,
        "through": through,
        "end_lsn": end_lsn,
        "tables": [{"schema": s, "table": t, "last_window": w} for (s, t), w in sorted(last_seen.items())],
    }
    try:
        s3store.put_bytes(ctx.client, ctx.layout.bucket, ctx.layout.merge_tables_index(ctx.slot),
                          json.dumps(doc, indent=1), content_type="application/json")
    except Exception as exc:  # only a cache: the next job reads more manifests
        log.warning("could not write the merge tables index: %s", exc)


KEEP_OPEN_TABLES = 500
"""Up to this many tables in a job, the first pass keeps each table's open Delta log for its
merge (one log read per table instead of two); above it, memory would grow with the tables."""


def _merged_floor(ctx: JobContext, wanted: list[tuple[str, str]], through: int, last_seen: dict) -> int:
    """The lowest window the tables in ``wanted`` need read (and set ``ctx.anchors``): a
    table's last merged window (over it and its history tables; ``0`` when one has
    merged none), or ``through`` when no window up to ``through`` holds it after that."""
    floor = through
    targets = {}
    for schema, table in wanted:
        targets[(schema, table)] = [target_url(ctx, schema, table)]
        if ctx.history:
            targets[(schema, table)].append(target_url(ctx, schema, table, ctx.history))
    apps = dict(pair for pairs in targets.values() for pair in pairs)
    # a table's open log is kept for its merge (ctx.open) when the job has few tables; with
    # many, each table's state would be held for the whole job (2 GB at 10,000 tables):
    # then only its merged version is kept, and its merge opens it again
    keep = len(apps) <= KEEP_OPEN_TABLES

    def version_of(url: str) -> int | None:
        dt = open_table(url, ctx.storage)
        if keep:
            ctx.loaded[url] = dt
        return merged_version(dt, apps[url])

    if ctx.table_workers > 1 and len(apps) > 1:  # each open is a log read: S3 round trips and Rust, overlapped
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(ctx.table_workers, thread_name_prefix="pgcdc-open") as pool:
            versions = dict(zip(apps, pool.map(version_of, apps), strict=True))
    else:
        versions = {url: version_of(url) for url in apps}
    for (schema, table), pairs in targets.items():
        merged = [versions[url] for url, _app in pairs]
        lowest = min(-1 if v is None else v for v in merged)
        if last_seen.get((schema, table), -1) <= lowest:
            ctx.anchors[f"{schema}.{table}"] = through
        else:
            floor = min(floor, max(lowest, 0))
    return floor


def _select_tables(names: dict, only: Sequence[str] | None) -> list[tuple[str, str]]:
    if only:
        from airflow_pgcdc.pg.tables import parse_table_names  # one parser for --tables everywhere

        asked = parse_table_names(only)
        missing = [f"{s}.{t}" for s, t in asked if (s, t) not in names]
        if missing:
            raise MergeError(
                f"table(s) {missing} are neither in the slot's snapshot nor in any committed window",
                hint="check --tables against `pgcdc status` and the publication (unquoted names are "
                     "lower-cased, as everywhere: \"quote\" case and dots)",
            )
        return asked
    return list(names)


def _resync_mark(ctx: JobContext, schema: str, table: str) -> int:
    """The consistent point of the last resync or slice the table's Delta table applied
    (its ``{app}:resync``), -1 when none (the table is opened once per job, ``ctx.loaded``)."""
    url, app = target_url(ctx, schema, table)
    if url not in ctx.loaded:
        ctx.loaded[url] = open_table(url, ctx.storage)
    applied = merged_version(ctx.loaded[url], app + RESYNC_APP_SUFFIX)
    return -1 if applied is None else applied


def pending_resync(ctx: JobContext, schema: str, table: str):
    """``(resync, entry)`` when the table's newest resync is not in its Delta table yet."""
    found = latest_resync(ctx.resyncs, schema, table)
    if found is None or _resync_mark(ctx, schema, table) >= int(found[0].consistent_point):
        return None
    return found


def slice_pending(ctx: JobContext, schema: str, table: str) -> bool:
    """Whether a slice of the table (``pgcdc resync --where``) is not in its Delta table yet:
    its merge reads the windows after the slice's copy again (merge/slices.py)."""
    points = [int(r.consistent_point) for r in ctx.slices if r.entry(schema, table) is not None]
    return bool(points) and max(points) > _resync_mark(ctx, schema, table)


def covered_windows(manifests, point: LSN) -> int:
    """The last window whose every transaction committed before ``point`` (its end is at or
    before it), or -1: the windows a copy taken at ``point`` already holds."""
    return max((m.window_seq for m in manifests if m.end <= point), default=-1)


def holds_table(windows, schema: str, table: str) -> bool:
    """Whether one of ``windows`` holds changes or a truncate of the table: a table
    without any has nothing to merge, and a table that appeared after the snapshot has no
    key to merge on but in the windows that hold it."""
    return any((schema, table) in _held_tables(m) for m in windows)


def renamed_from(snapshot, resyncs, manifests, schema: str, table: str) -> tuple[str, str] | None:
    """The copied table ``schema.table`` is, renamed (``ALTER TABLE … RENAME``): a copy (the
    snapshot or a resync, which record each table's ``relation_oid``) of another name with the
    OID of the windows' relation versions of ``schema.table``; None when none is."""
    oids = {int(rv["relation_oid"]) for m in manifests for t in m.tables
            if (t["schema"], t["table"]) == (schema, table) for rv in t["relation_versions"] if "relation_oid" in rv}
    if not oids:
        return None
    copies = list(snapshot.tables if snapshot is not None else ()) + [t for r in resyncs for t in r.manifest.tables]
    for t in copies:
        oid = (t.extra or {}).get("relation_oid")
        if oid is not None and int(oid) in oids and (t.schema, t.table) != (schema, table):
            return t.schema, t.table
    return None


def copy_refusal(snapshot, resyncs, schema: str, table: str) -> dict | None:
    """The newest copy's record of leaving ``schema.table`` out (``refused_tables`` of a
    snapshot or resync manifest: a table it could not copy), with ``copy`` naming it."""
    copies = [("snapshot " + snapshot.snapshot_id, snapshot)] if snapshot is not None else []
    copies += [(f"resync at {r.manifest.consistent_point}", r.manifest) for r in resyncs]
    for what, m in reversed(copies):
        for r in (m.extra or {}).get("refused_tables") or ():
            if (r.get("schema"), r.get("table")) == (schema, table):
                return {**r, "copy": what}
    return None
