"""Removal of the files under a Delta table that no version within the retention needs
and delta-rs' VACUUM leaves: deletion-vector files and orphaned data files (delta-rs
only, no Spark, no Airflow).

**Deletion vectors.** A table merged with ``--deletion-vectors`` gets a small
``deletion_vector_<uuid>.bin`` file for every data file a merge touches (a new one each
time: a vector is never rewritten in place). delta-rs 1.6's VACUUM keeps the live ones
but never removes one (its ``full`` mode would list live ones too), so without this step
they pile up for ever. A vector is kept, by the rule VACUUM applies to data files, when
the table's latest version uses it (an ``add`` action of the replayed log carries it),
when a file that carried it was removed less than ``retention_hours`` ago (a ``remove``
tombstone within the retention: time travel to a version before that still reads it), or
when the object itself is younger than the retention or than
:data:`UNREFERENCED_FLOOR_HOURS` (a merge running now may have written it and not
committed yet).

**Orphaned data files.** A Parquet file under the table that no action of the log names
(a merge killed between writing its files and its commit; a retried Spark task's output)
is never in a ``remove`` either, and delta-rs' VACUUM (its default, lite, mode) removes
only files a ``remove`` names. Such a file goes once it is older than the retention and
than :data:`UNREFERENCED_FLOOR_HOURS`.

What is read: the newest classic checkpoint (single or multi-part Parquet) and every
commit (``NNN.json``) ``_delta_log`` still holds (after :func:`~.delta.expire_log`, the
versions since the retention, so a few thousand small objects at most; fetched on a
few threads). A ``remove`` without a vector descriptor (the protocol asks writers to
repeat the descriptor; one that does not) keeps every vector seen with that path.
Anything this module does not read (v2 checkpoints with sidecars, catalog-managed
commits, a log entry it cannot parse, a live data file it cannot find under the table)
makes it remove nothing and say why: a vector removed by mistake would make its data
file's deleted rows visible again, a live data file removed would lose its rows.
"""

from __future__ import annotations

import io
import json
import logging
import re
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote

from airflow_pgcdc.lake.inspect import COMMIT_RE
from airflow_pgcdc.store import s3 as s3store

log = logging.getLogger("airflow_pgcdc.maintain")

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {c: i for i, c in enumerate(_Z85)}
_VECTOR_FILE_RE = re.compile(r"(?:^|/)deletion_vector_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.bin$")
_CLASSIC_CHECKPOINT_RE = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d+)\.(\d+))?\.parquet$")
_OTHER_CHECKPOINT_RE = re.compile(r"^\d{20}\.checkpoint\.[0-9a-f-]{36}\.(?:parquet|json)$")
READ_THREADS = 8

UNREFERENCED_FLOOR_HOURS = 24.0
"""A file no log entry names is never removed before it is this old, whatever the
retention: a writer running now (a merge, a resync's bootstrap) writes its files first
and names them in its commit at the end, so a young unreferenced file may be about to be
committed, and removing it (or a new vector file) would break the table. The same bound
as the log's (:data:`~airflow_pgcdc.maintain.tables.LOG_FLOOR_HOURS`): no writer runs that
long. ``maintain_slot(unreferenced_floor_hours=0)`` where no other writer can run (the
benchmarks, a test)."""


class UnreadableLog(Exception):
    """Something in the log this module does not read: it then removes nothing."""


def z85_decode(text: str) -> bytes:
    """ZeroMQ Z85 (the encoding of a vector's UUID in its descriptor): 5 characters → 4 bytes."""
    if len(text) % 5:
        raise ValueError(f"Z85 text of length {len(text)} (not a multiple of 5): {text!r}")
    out = bytearray()
    for i in range(0, len(text), 5):
        value = 0
        for c in text[i:i + 5]:
            if c not in _Z85_VALUE:
                raise ValueError(f"not a Z85 character {c!r} in {text!r}")
            value = value * 85 + _Z85_VALUE[c]
        if value > 0xFFFFFFFF:
            raise ValueError(f"Z85 group {text[i:i + 5]!r} is out of range")
        out += value.to_bytes(4, "big")
    return bytes(out)


def vector_file(descriptor: dict[str, Any] | None, table_url: str) -> str | None:
    """The key, relative to the table's root, of the file holding the vector ``descriptor``
    (an ``add``/``remove`` action's ``deletionVector``); None for an inline vector or none.
    Raises :class:`UnreadableLog` for a descriptor it cannot place."""
    if not descriptor:
        return None
    kind, where = descriptor.get("storageType"), descriptor.get("pathOrInlineDv") or ""
    if kind == "i":
        return None
    if kind == "u":
        if len(where) < 20:
            raise UnreadableLog(f"deletion vector descriptor {where!r}: shorter than a UUID")
        prefix, encoded = where[:-20], where[-20:]
        try:
            name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
        except ValueError as exc:
            raise UnreadableLog(f"deletion vector descriptor {where!r}: {exc}") from None
        return f"{prefix}/{name}" if prefix else name
    if kind == "p":
        key = data_file(where, table_url) if "://" in where else None
        if key is None:
            raise UnreadableLog(f"deletion vector at {where!r}: outside the table {table_url}")
        return key
    raise UnreadableLog(f"deletion vector descriptor of unknown storage type {kind!r}")


@dataclass(frozen=True)
class FileAction:
    """One ``add`` or ``remove`` action, reduced to what this module needs."""

    kind: str  # "add" | "remove"
    path: str
    vector: str | None  # the vector file's key relative to the table root
    removed_ms: int | None = None  # a remove's deletionTimestamp


def data_file(path: str, table_url: str) -> str | None:
    """The key, relative to the table's root, of an ``add``/``remove`` action's ``path`` (a
    relative URI, percent-encoded, or an absolute one under the table); None for a path
    outside the table."""
    if "://" in path:
        root = table_url.rstrip("/") + "/"
        for spelling in (root, root.replace("s3://", "s3a://", 1)):
            if path.startswith(spelling):
                return unquote(path[len(spelling):])
        return None
    return unquote(path)


def _action(kind: str, body: dict[str, Any], table_url: str) -> FileAction:
    ts = body.get("deletionTimestamp")
    return FileAction(kind, body.get("path") or "", vector_file(body.get("deletionVector"), table_url),
                      int(ts) if ts is not None else None)


def commit_actions(text: str, table_url: str) -> list[FileAction]:
    """The ``add``/``remove`` actions of one commit file (newline-delimited JSON)."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError as exc:
            raise UnreadableLog(f"line {n}: not JSON ({exc})") from None
        for kind in ("add", "remove"):
            if isinstance(entry.get(kind), dict):
                out.append(_action(kind, entry[kind], table_url))
    return out


def checkpoint_actions(table, table_url: str) -> list[FileAction]:
    """The ``add``/``remove`` actions of a classic checkpoint part (a pyarrow table)."""
    names = set(table.column_names)
    if "sidecar" in names and table.column("sidecar").null_count < table.num_rows:
        raise UnreadableLog("a v2 checkpoint with sidecar files")
    out = []
    for kind in ("add", "remove"):
        if kind in names:
            out.extend(_action(kind, body, table_url) for body in table.column(kind).to_pylist() if body)
    return out


def needed_vectors(checkpoint: Iterable[FileAction], commits: Iterable[tuple[int, list[FileAction]]],
                   checkpoint_version: int, cutoff_ms: int) -> set[str]:
    """The vector files some version within the retention reads (see the module docstring):
    those of the latest version's files, replayed from the checkpoint's ``add`` actions and
    the commits after it in version order, and those of files removed at ``cutoff_ms`` or
    later (a ``remove`` without a descriptor keeps every vector seen with its path)."""
    by_path: dict[str, set[str]] = {}
    tombstones: list[FileAction] = []
    for a in [*checkpoint, *(a for _v, acts in commits for a in acts)]:
        if a.vector:
            by_path.setdefault(a.path, set()).add(a.vector)
        if a.kind == "remove" and (a.removed_ms is None or a.removed_ms >= cutoff_ms):
            tombstones.append(a)
    needed = {vector for _path, vector in _replay(checkpoint, commits, checkpoint_version) if vector}
    for a in tombstones:
        needed |= {a.vector} if a.vector else by_path.get(a.path, set())
    return needed


def live_paths(checkpoint: Iterable[FileAction], commits: Iterable[tuple[int, list[FileAction]]],
               checkpoint_version: int) -> set[str]:
    """The ``path`` of every data file of the latest version (the log's spelling)."""
    return {path for path, _vector in _replay(checkpoint, commits, checkpoint_version)}


def _replay(checkpoint: Iterable[FileAction], commits: Iterable[tuple[int, list[FileAction]]],
            checkpoint_version: int) -> set[tuple[str, str | None]]:
    """The latest version's logical files ``(path, vector)``: the checkpoint's ``add``
    actions, then the commits after it in version order."""
    live: dict[str, set[str | None]] = {}
    for a in checkpoint:
        if a.kind == "add":
            live.setdefault(a.path, set()).add(a.vector)
    for version, actions in sorted(commits, key=lambda c: c[0]):
        if version <= checkpoint_version:
            continue
        for a in actions:  # removes first: a commit that swaps a file's vector removes (p, old), adds (p, new)
            if a.kind == "remove":
                if a.vector is None:
                    live.pop(a.path, None)
                elif a.path in live:
                    live[a.path].discard(a.vector)
                    if not live[a.path]:
                        del live[a.path]
        for a in actions:
            if a.kind == "add":
                live.setdefault(a.path, set()).add(a.vector)
    return {(path, vector) for path, vectors in live.items() for vector in vectors}


def unreferenced_files(keys: Iterable[str], actions: Iterable[FileAction], table_url: str) -> set[str]:
    """Of ``keys`` (objects under the table's root, relative), the data files no action of
    the log read names: files a writer wrote and never committed (a merge killed before its
    commit, a retried task's output). delta-rs' VACUUM removes only files a ``remove``
    names, so these stay for ever otherwise. Hidden folders and files (``_delta_log``,
    ``_change_data``, a leading dot) and deletion-vector files are not data files."""
    named = {data_file(a.path, table_url) for a in actions}
    out = set()
    for key in keys:
        if any(part.startswith(("_", ".")) for part in key.split("/")) or _VECTOR_FILE_RE.search(key):
            continue
        if key.endswith(".parquet") and key not in named:
            out.add(key)
    return out


def expired_change_data(client, bucket: str, base: str, objects: dict[str, dict], old: set[str], *,
                        dry_run: bool) -> dict[str, int]:
    """Remove the change data feed's files (``_change_data/``) older than the retention
    (``old``: the table's keys written before it), as Delta's VACUUM does: a feed file is read
    only for its own version's changes, never part of a version's data, and delta-rs 1.6's
    VACUUM leaves them all. The feed is readable for the versions within the retention.
    Returns ``{"files", "bytes"}`` (what a dry run would remove)."""
    doomed = sorted(rel for rel in old if rel.startswith("_change_data/"))
    if doomed and not dry_run:
        s3store.delete_keys(client, bucket, [base + rel for rel in doomed], what="expired change data feed files")
    return {"files": len(doomed), "bytes": sum(int(objects[k]["Size"]) for k in doomed)}


def _log_entries(client, bucket: str, base: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for o in s3store.list_objects(client, bucket, base + "_delta_log/"):
        yield o["Key"][len(base) + len("_delta_log/"):], o


def vacuum_unreferenced(client, url: str, retention_hours: float, *, floor_hours: float = UNREFERENCED_FLOOR_HOURS,
                        dry_run: bool = False, now: datetime | None = None,
                        live: Iterable[str] | None = None) -> dict[str, Any]:
    """Remove the deletion-vector files of the S3 table at ``url`` that no version within
    ``retention_hours`` needs, and the data files no log entry names (see
    :func:`unreferenced_files`), both only when older than the retention and than
    ``floor_hours`` (:data:`UNREFERENCED_FLOOR_HOURS`). Returns
    ``{"deletion_vectors": {"files", "bytes", "kept"}, "orphans": {"files", "bytes"}, "change_data":
    {"files", "bytes"}, "dry_run"}`` (``change_data``: :func:`expired_change_data`),
    or ``{"skipped": why}`` when it removed nothing because it could not be sure.

    ``live``: the paths of the latest version's data files (``add`` actions), when the caller
    has them: if no deletion-vector file is under the table and every data file old enough
    to go is among them, there is nothing to find and the log is not read (``"log_read":
    False``). The log is read, one GET per commit it keeps, only when a candidate exists:
    a file removed within the retention (time travel) and an orphan look the same from the
    listing."""
    if not url.startswith("s3://"):
        return {"skipped": "not an S3 table"}
    loc = s3store.S3Location.parse(url)
    base = unquote(loc.prefix.rstrip("/")) + "/"  # where delta-rs put the objects (see lake.inspect.object_sizes)
    now = now or datetime.now(UTC)
    cutoff = now - timedelta(hours=retention_hours)  # tombstones: time travel
    written_before = now - timedelta(hours=max(retention_hours, floor_hours))  # files: a writer still running
    objects = {o["Key"][len(base):]: o for o in s3store.list_objects(client, loc.bucket, base)}
    vectors = {rel: o for rel, o in objects.items() if not rel.startswith("_") and _VECTOR_FILE_RE.search(rel)}
    old = {rel for rel, o in objects.items() if o["LastModified"] <= written_before}
    feed = expired_change_data(client, loc.bucket, base, objects, old, dry_run=dry_run)
    if live is not None and not vectors:
        current = {data_file(p, url) for p in live}
        if not unreferenced_files(old, (), url) - current:  # every old data file is live: nothing to find
            return {"deletion_vectors": {"files": 0, "bytes": 0, "kept": 0}, "orphans": {"files": 0, "bytes": 0},
                    "change_data": feed, "log_read": False, "dry_run": dry_run}
    try:
        needed, actions, live = _read_log(client, loc.bucket, base, url, int(cutoff.timestamp() * 1000))
        missing = sorted(str(key) for key in (data_file(path, url) for path in live) if key not in objects)
        if missing:  # a live file not where this module looks: its idea of the paths is wrong
            raise UnreadableLog(f"{len(missing)} live data file(s) not found under the table, first {missing[0]!r}")
    except (UnreadableLog, s3store.StoreError) as exc:
        log.warning("%s: unreferenced files kept, the log was not read to the end: %s", url, exc)
        return {"skipped": str(exc)}
    doomed_vectors = sorted(rel for rel in vectors if rel not in needed and rel in old)
    orphans = sorted(unreferenced_files(old, actions, url))
    doomed = doomed_vectors + orphans
    if doomed and not dry_run:
        s3store.delete_keys(client, loc.bucket, [base + rel for rel in doomed], what="unreferenced files")

    def size(keys: list[str]) -> int:
        return sum(int(objects[k]["Size"]) for k in keys)

    out = {"deletion_vectors": {"files": len(doomed_vectors), "bytes": size(doomed_vectors),
                                "kept": len(vectors) - len(doomed_vectors)},
           "orphans": {"files": len(orphans), "bytes": size(orphans)}, "change_data": feed, "log_read": True,
           "dry_run": dry_run}
    log.info("%s: %sdeletion vectors: %d of %d file(s) removed, %d bytes; orphaned data files: %d, %d bytes", url,
             "(dry run) " if dry_run else "", len(doomed_vectors), len(vectors), size(doomed_vectors), len(orphans),
             size(orphans))
    return out


def _read_log(client, bucket: str, base: str, url: str, cutoff_ms: int) -> tuple[set[str], list[FileAction], set[str]]:
    """``(vectors needed, every add/remove action read, the latest version's data paths)``."""
    import pyarrow.parquet as pq

    commits: dict[int, str] = {}
    parts: dict[int, dict[int, str]] = {}
    declared: dict[int, int] = {}
    for name, _o in _log_entries(client, bucket, base):
        if name.endswith("/"):  # a folder's marker object (Delta 4 makes _delta_log/_staged_commits/)
            continue
        if name.startswith(("_sidecars/", "_staged_commits/", "_commits/")):
            raise UnreadableLog(f"_delta_log/{name}: a sidecar or a catalog-managed table's commit")
        if m := COMMIT_RE.match(name):
            commits[int(m.group(1))] = name
        elif m := _CLASSIC_CHECKPOINT_RE.match(name):
            v = int(m.group(1))
            parts.setdefault(v, {})[int(m.group(2) or 1)] = name
            declared[v] = int(m.group(3) or 1)
        elif _OTHER_CHECKPOINT_RE.match(name):
            raise UnreadableLog(f"_delta_log/{name}: a UUID-named (v2) checkpoint")
    complete = [v for v, p in parts.items() if len(p) == declared[v]]
    checkpoint_version = max(complete, default=-1)
    if checkpoint_version < 0 and 0 not in commits:
        raise UnreadableLog("neither a checkpoint nor the first commit in _delta_log")
    if [v for v in range(checkpoint_version + 1, max(commits, default=checkpoint_version) + 1) if v not in commits]:
        raise UnreadableLog(f"commits missing after version {checkpoint_version}")

    def fetch(name: str) -> bytes:
        return s3store.get_bytes(client, bucket, base + "_delta_log/" + name)

    with ThreadPoolExecutor(READ_THREADS) as pool:
        texts = dict(zip(commits, pool.map(lambda n: fetch(n).decode(), commits.values()), strict=True))
        blobs = list(pool.map(fetch, parts.get(checkpoint_version, {}).values()))
    checkpoint: list[FileAction] = []
    for blob in blobs:
        part = pq.ParquetFile(io.BytesIO(blob))
        wanted = [c for c in ("add", "remove", "sidecar") if c in part.schema_arrow.names]
        table = part.read(columns=wanted)
        checkpoint.extend(checkpoint_actions(table, url))
    parsed = []
    for v, text in texts.items():
        try:
            parsed.append((v, commit_actions(text, url)))
        except UnreadableLog as exc:
            raise UnreadableLog(f"_delta_log/{commits[v]}: {exc}") from None
    actions = checkpoint + [a for _v, acts in parsed for a in acts]
    return needed_vectors(checkpoint, parsed, checkpoint_version, cutoff_ms), actions, \
        live_paths(checkpoint, parsed, checkpoint_version)
