"""Read-only views of a pipeline's Delta tables with delta-rs (no Spark), for every job:
open a table (:func:`open_table`) at its place (:func:`table_url`, which follows a legacy
location), what it holds of a slot's windows (:func:`merged_version`, :func:`merge_progress`),
who created it (:func:`creator_slot`, :func:`foreign_creator`), features delta-rs' pyarrow
datasets would read wrong (:func:`unreadable_features`), whether delta-rs can commit to it
(:func:`clustered`: liquid clustering, which it cannot), and its figures: files, bytes, log
entries and checkpoints (:func:`table_figures`, :func:`object_sizes`)."""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any
from urllib.parse import unquote

from airflow_pgcdc.lake.tables import app_id, delta_table_url, legacy_delta_table_url
from airflow_pgcdc.store import s3 as s3store

__all__ = [
    "CHECKPOINT_RE", "CLUSTERING", "COMMIT_RE", "NONE_MERGED", "app_version", "clustered", "creator_slot",
    "data_files", "foreign_creator",
    "latest_version", "merge_progress", "merged_version", "object_sizes", "open_table", "table_figures",
    "table_url", "unreadable_features",
]

log = logging.getLogger("airflow_pgcdc.lake")


COMMIT_RE = re.compile(r"^(\d{20})\.json$")
"""A commit's name in ``_delta_log`` (its version in group 1)."""


def unreadable_features(table) -> list[str]:
    """The features of ``table`` (a ``DeltaTable``) that its pyarrow dataset would read
    wrong, without an error: ``column mapping`` (a table Delta's Spark engine created with
    column names that need it), ``deletion vectors``."""
    mode = (table.metadata().configuration or {}).get("delta.columnMapping.mode", "none")
    out = ["column mapping"] if mode not in ("", "none") else []
    if "deletionVectors" in set(table.protocol().reader_features or ()):
        out.append("deletion vectors")
    return out


CLUSTERING = "clustering"
"""The writer feature of a liquid-clustered Delta table (Delta's Spark engine, ``CLUSTER BY``;
its columns in the ``delta.clustering`` domain metadata, with the ``domainMetadata`` feature)."""


def clustered(table) -> bool:
    """Whether ``table`` (a ``DeltaTable``) is liquid-clustered (the :data:`CLUSTERING` writer
    feature). delta-rs 1.6.6 reads such a table but commits nothing to it: its appends,
    MERGEs, overwrites, ``optimize``, ``alter`` and a VACUUM that removes files all fail with
    ``CommitFailedError: Unsupported table features required: [ClusteredTable,
    DomainMetadata]``; Delta's Spark engine writes it (docs/operations.md, liquid clustering)."""
    return CLUSTERING in set(table.protocol().writer_features or ())


def open_table(url: str, storage_options: dict[str, str]):
    """The Delta table at ``url``, or ``None`` when there is none."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(url, storage_options=storage_options)
    except TableNotFoundError:
        return None


def latest_version(dt, url: str, storage_options: dict[str, str]) -> int | None:
    """The newest version of the Delta table at ``url``: ``dt`` (already open) brought up to
    date, which reads only the commits after its own; opened when ``dt`` is ``None``."""
    if dt is None:
        dt = open_table(url, storage_options)
        return None if dt is None else dt.version()
    dt.update_incremental()
    return dt.version()


def table_url(delta: str, schema: str, table: str, storage_options: dict[str, str], *,
              shared: bool = False) -> str:
    """Where the Delta table of ``schema.table`` under the root ``delta`` is:
    :func:`~.tables.delta_table_url`, except for a table an earlier version wrote at its legacy
    place (:func:`~.tables.legacy_delta_table_url`, only for names with escapes) while none
    exists at the new one: it is followed there, unless ``shared`` says another table of the
    pipeline has the same legacy place (then both would be one Delta table: the new place is
    used, and the merge bootstraps it from the copy). A legacy table is logged with where to
    move it."""
    url = delta_table_url(delta, schema, table)
    legacy = legacy_delta_table_url(delta, schema, table)
    if legacy == url or shared or open_table(url, storage_options) is not None:
        return url
    if open_table(legacy, storage_options) is None:
        return url
    log.warning("%s.%s: its Delta table is at its legacy location %s (a key another table's name can share); "
                "it is followed there. Move it to %s (every object, same relative keys) to make it unique",
                schema, table, legacy, url)
    return legacy


def foreign_creator(client: Any, table, url: str, app: str, slot: str) -> str | None:
    """The other slot whose pipeline created the Delta table ``table`` at ``url`` when
    ``slot`` never merged a window into it (its app transaction ``app``); else None. Merging
    (or swapping a rebuild) into it would put ``slot``'s windows on that pipeline's state."""
    if table is None or merged_version(table, app) is not None:
        return None
    other = creator_slot(client, url)  # one small read, only before the table's first window
    return other if other is not None and other != slot else None


def creator_slot(client: Any, url: str) -> str | None:
    """The slot whose merge created the Delta table at ``url`` (``pgcdc.slot`` in its first
    commit: a delta-rs commit's own key, a delta-spark commit's ``userMetadata``), read from
    ``_delta_log/00000000000000000000.json``; None when unknown (not on S3, that entry
    removed by log cleanup, no such key)."""
    if not url.startswith("s3://"):
        return None
    loc = s3store.S3Location.parse(url)
    key = unquote(loc.prefix.rstrip("/")) + "/_delta_log/" + "0" * 20 + ".json"
    try:
        text = s3store.get_bytes(client, loc.bucket, key).decode("utf-8", "replace")
    except Exception:  # noqa: BLE001 - unknown: nothing to compare
        return None
    for line in text.splitlines():
        try:
            info = json.loads(line).get("commitInfo")
        except ValueError:
            continue
        if not isinstance(info, dict):
            continue
        if info.get("pgcdc.slot"):
            return str(info["pgcdc.slot"])
        try:
            meta = json.loads(info.get("userMetadata") or "{}")
        except ValueError:
            meta = {}
        return str(meta["pgcdc.slot"]) if isinstance(meta, dict) and meta.get("pgcdc.slot") else None
    return None


NONE_MERGED = -1
"""The app transaction version of a table that holds no window whole: a replay to a point
inside window 0 (:mod:`airflow_pgcdc.merge.point`), or a rebuilt table that merged none swapped in."""


def app_version(table, app: str) -> int | None:
    """``table.transaction_version(app)`` (``table``: a ``DeltaTable``), read once per version
    of the handle: delta-rs answers each call by scanning the loaded log's app transactions
    (~1.5 ms), and a merged table asks up to five times. The answers are kept on the handle
    for the version it has loaded; a commit or a reload changes that version, and the next
    call reads again."""
    loaded = table.version()
    cached = getattr(table, "_pgcdc_app_versions", None)
    if cached is None or cached[0] != loaded:
        cached = (loaded, {})
        table._pgcdc_app_versions = cached
    versions = cached[1]
    if app not in versions:
        versions[app] = table.transaction_version(app)
    return versions[app]


def merged_version(table, app: str) -> int | None:
    """The last window merged into ``table`` (its app transaction version), or ``None``."""
    version = None if table is None else app_version(table, app)
    return None if version is None or version <= NONE_MERGED else version


def merge_progress(delta: str, slot: str, tables: list[tuple[str, str]], *,
                   storage_options: dict[str, str], raw: bool = False) -> dict[str, int | None]:
    """``{"schema.table": last merged window_seq or None}`` read from each Delta table's
    app transaction (no Spark: the driver-side view of what the merge job did). ``raw``:
    the app transaction's version as it is, ``NONE_MERGED`` for a table without one (the
    copy alone merged), None when there is no Delta table."""
    out: dict[str, int | None] = {}
    for schema, table in tables:
        dt = open_table(table_url(delta, schema, table, storage_options), storage_options)
        app = app_id(slot, schema, table)
        if raw:  # a table bootstrapped from the copy has no app transaction until a window is merged
            out[f"{schema}.{table}"] = None if dt is None else (v if (v := app_version(dt, app)) is not None
                                                                 else NONE_MERGED)
        else:
            out[f"{schema}.{table}"] = merged_version(dt, app)
    return out

def object_sizes(client, url: str, under: str = "") -> dict[str, int]:
    """``{key relative to the table root: size}`` of every object under the table (under
    its folder ``under``, e.g. ``_delta_log/``, when given)."""
    loc = s3store.S3Location.parse(url)
    # the objects delta-rs wrote for this URL: it percent-decodes the path (my%2Eschema.t → my.schema.t)
    base = unquote(loc.prefix.rstrip("/")) + "/"
    return {o["Key"][len(base):]: int(o["Size"]) for o in s3store.list_objects(client, loc.bucket, base + under)}


def data_files(dt) -> tuple[int, int]:
    adds = dt.get_add_actions(flatten=True)
    return adds.num_rows, int(sum(adds.column("size_bytes").to_pylist())) if adds.num_rows else 0


CHECKPOINT_RE = re.compile(r"^(\d{20})\.checkpoint(?:\.\d+\.\d+)?(?:\.[0-9a-f-]+)?\.(?:parquet|json)$")


def _objects(client, url: str) -> dict[str, int]:
    """``{key relative to the table root: size}`` of every object under ``url`` (S3 or a local path)."""
    if url.startswith(("s3://", "s3a://")):
        return object_sizes(client, url.replace("s3a://", "s3://", 1))
    root = url[len("file://"):] if url.startswith("file://") else url
    out = {}
    for folder, _, names in os.walk(root):
        for n in names:
            path = os.path.join(folder, n)
            out[os.path.relpath(path, root).replace(os.sep, "/")] = os.path.getsize(path)
    return out


def table_figures(url: str, *, storage_options: dict[str, str], client, dt=None) -> dict[str, Any]:
    """What a Delta table holds now, written by either engine (read with delta-rs and one
    listing of the table's folder): ``version`` (latest), ``files``/``bytes`` (live data files:
    the add actions of the latest version), ``versions_kept`` (commit files ``_delta_log``
    still holds; ``oldest_version`` the first of them), ``checkpoint_version`` (the newest
    checkpoint, or None), ``log_bytes`` (``_delta_log``), ``vector_bytes`` (deletion-vector files) and ``stored_bytes`` (every object
    under the table: live files, files removed but not vacuumed yet, the log)."""
    from deltalake import DeltaTable

    if dt is None:
        dt = DeltaTable(url, storage_options=storage_options)
    files, size = data_files(dt)
    objects = _objects(client, url)
    commits, checkpoints, log_bytes, vector_bytes = [], [], 0, 0
    for key, n in objects.items():
        if not key.startswith("_delta_log/"):
            vector_bytes += n if "deletion_vector_" in key.rsplit("/", 1)[-1] else 0
            continue
        log_bytes += n
        name = key[len("_delta_log/"):]
        if m := COMMIT_RE.match(name):
            commits.append(int(m.group(1)))
        elif m := CHECKPOINT_RE.match(name):
            checkpoints.append(int(m.group(1)))
    return {
        "version": dt.version(),
        "files": files,
        "bytes": size,
        "versions_kept": len(commits),
        "oldest_version": min(commits, default=None),
        "checkpoint_version": max(checkpoints, default=None),
        "log_bytes": log_bytes,
        "vector_bytes": vector_bytes,
        "stored_bytes": sum(objects.values()),
    }

