"""Upkeep of one Delta table (delta-rs only, no Spark, no Airflow).

In order: compaction of small files (``optimize.compact()``, or ``optimize.z_order(keys)``),
VACUUM of the files no version within the retention needs (and, for a table with
deletion vectors, of the vector files and orphaned data files delta-rs' VACUUM leaves:
:mod:`~airflow_pgcdc.maintain.unreferenced`), a log checkpoint and the
cleanup of the log entries of versions older than the retention (:func:`expire_log`). Each step reports what it removed and how many bytes.

Tables with deletion vectors (``pgcdc merge --engine delta-spark --deletion-vectors``):
a merge marks replaced rows deleted instead of rewriting their files, so the data files
keep dead rows; bin-packing leaves files above the target size alone, dead rows and all.
When the vectors delete :data:`PURGE_RATIO` or more of the rows in the table's data files,
the compaction becomes a purge: every file is rewritten (``optimize.z_order`` on the merge
key, which delta-rs 1.6 reads through the vectors), live rows only, in key-sorted files of
the target size; the vectors then refer to removed files and VACUUM takes them.

Liquid-clustered tables (``pgcdc merge --engine delta-spark`` with a table's ``cluster_by``):
delta-rs 1.6.6 commits nothing to them (:func:`~airflow_pgcdc.lake.inspect.clustered`), so
their compaction is skipped, with the reason in the result and a warning: ``OPTIMIZE
delta.`s3a://…``` on Delta's Spark engine compacts and clusters them (this upkeep runs no
Spark). Their VACUUM removes the files delta-rs' VACUUM lists (its dry run) itself, without
the ``VACUUM START``/``VACUUM END`` commits delta-rs would add (which it cannot commit there):
the same files go, the table's history just does not show the VACUUM. The checkpoint and the
log cleanup write no commit and run as for any table.

App transactions: a compaction commit carries no ``txn`` action, and Delta's log replay
keeps the latest ``txn`` of every app id across it (and across a checkpoint), so
``transaction_version(app)`` is unchanged; this is checked after every step, and a
version that went down is an error (:class:`AppTransactionLost`).

Concurrency with a merge: both commit through delta-rs' conflict checker. A compaction
that loses the race (a merge rewrote files it compacted) is retried from the new version
(``COMMIT_RETRIES`` times); a merge that loses it (the compaction removed files it read)
is refused by delta-rs and commits nothing (the merge job reports ``ConcurrentCommit`` for
that table: rerun it; its windows stay pending, nothing is lost or doubled).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote

from airflow_pgcdc.errors import PgcdcError
from airflow_pgcdc.lake.inspect import CHECKPOINT_RE, clustered, data_files, object_sizes
from airflow_pgcdc.lake.sizing import DEFAULT_TARGET_FILE_MB, target_bytes
from airflow_pgcdc.maintain.unreferenced import UNREFERENCED_FLOOR_HOURS, vacuum_unreferenced
from airflow_pgcdc.store import s3 as s3store

log = logging.getLogger("airflow_pgcdc.maintain")

DEFAULT_TARGET_SIZE = target_bytes(DEFAULT_TARGET_FILE_MB)
"""Compaction's target file size (bytes): files smaller than it are binned together. The
merge's bootstrap target (``pgcdc merge --target-file-mb``, 32 MB), so a compaction does not
fold the key-sorted files the bootstrap wrote (and the merge prunes by) into bigger ones."""

COMMIT_RETRIES = 3

PURGE_RATIO = 0.10
"""Rows deleted by deletion vectors, as a share of the rows in the data files, from which
a compaction rewrites the whole table (see the module docstring): the dead rows cost at
most about this share of the table's bytes between two maintenance runs."""


CLUSTERED_SKIP = ("liquid-clustered table: delta-rs 1.6.6 commits nothing to it; run OPTIMIZE "
                  "delta.`s3a://…` on Delta's Spark engine to compact and cluster it")
"""Why a clustered table's compaction is skipped (its result's ``compaction.skipped``)."""


class AppTransactionLost(PgcdcError):
    """A maintenance commit left a table's app transaction version lower than before."""


@dataclass
class DeltaTableResult:
    table: str
    url: str
    action: str = "maintained"  # maintained | dry-run | failed
    version_before: int | None = None
    version_after: int | None = None
    app_transactions: dict[str, int | None] = field(default_factory=dict)
    files_before: int = 0
    files_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    compaction: dict[str, Any] = field(default_factory=dict)
    vacuum: dict[str, Any] = field(default_factory=dict)
    log: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)




def _relative(path: str, url: str) -> str:
    root = url.rstrip("/") + "/"
    if path.startswith(root):
        return path[len(root):]
    if "://" in path:  # another spelling of the root (s3a://, …): keep the part after the table segment
        tail = url.rstrip("/").rsplit("/", 1)[-1] + "/"
        return path.split(tail, 1)[-1]
    return path


def _s3a(url: str) -> str:
    return "s3a://" + unquote(url[len("s3://"):]) if url.startswith("s3://") else url


def _remove_files(client, url: str, rel: Sequence[str]) -> None:
    """Remove the files ``rel`` (keys relative to the S3 table at ``url``, as VACUUM lists them)."""
    loc = s3store.S3Location.parse(url)
    base = unquote(loc.prefix.rstrip("/")) + "/"
    s3store.delete_keys(client, loc.bucket, [base + p for p in rel], what=f"files VACUUM lists under {url}")


def _total_size(stats) -> int:
    """``totalSize`` of optimize's ``filesAdded``/``filesRemoved`` (a JSON string in delta-rs 1.x)."""
    if isinstance(stats, str):
        stats = json.loads(stats or "{}")
    return int((stats or {}).get("totalSize", 0) or 0)




def deleted_rows(dt) -> tuple[int, int]:
    """``(rows in the data files, rows of them the deletion vectors delete)`` of the Delta
    table ``dt`` (0 deleted without the feature: nothing is counted then)."""
    adds = dt.get_add_actions(flatten=True)
    physical = int(sum(v or 0 for v in adds.column("num_records").to_pylist())) if adds.num_rows else 0
    if "deletionVectors" not in (dt.protocol().reader_features or ()) or not physical:
        return physical, 0
    import pyarrow as pa
    from deltalake import QueryBuilder

    live = pa.table(QueryBuilder().register("t", dt).execute("SELECT count(*) AS n FROM t").read_all())
    return physical, max(0, physical - int(live.column("n")[0].as_py()))


def maintain_table(
    url: str,
    *,
    name: str,
    apps: Sequence[str],
    storage_options: dict[str, str],
    client,
    retention_hours: float,
    zorder: Sequence[str] | None = None,
    target_size: int | None = DEFAULT_TARGET_SIZE,
    dry_run: bool = False,
    keys: Sequence[str] = (),
    purge_ratio: float = PURGE_RATIO,
    unreferenced_floor_hours: float = UNREFERENCED_FLOOR_HOURS,
    dt=None,
) -> DeltaTableResult:
    """Compact, vacuum and checkpoint the Delta table at ``url``; ``apps``: the app ids
    whose transaction versions must survive. ``keys``: the merge key, the purge's sort
    order (see the module docstring). ``dt``: the table, just opened by the caller (else
    it is opened here). Raises on failure (the caller reports it)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError

    t0 = time.monotonic()
    res = DeltaTableResult(table=name, url=url)
    if dt is None:
        dt = DeltaTable(url, storage_options=storage_options)
    res.version_before = dt.version()
    before = {a: dt.transaction_version(a) for a in apps}
    res.files_before, res.bytes_before = data_files(dt)

    def check(where: str) -> None:
        dt.update_incremental()
        for a, v in before.items():
            now = dt.transaction_version(a)
            if v is not None and (now is None or now < v):
                raise AppTransactionLost(f"{name}: after {where}, app transaction {a} is at {now}, it was at {v}")

    # -- compaction (a purge when deletion vectors hide enough dead rows)
    physical, dead = deleted_rows(dt)
    purge = bool(dead) and dead >= purge_ratio * physical
    order = list(zorder or ()) or (list(keys) if purge else [])
    if purge and not order:  # no key known (a history table, a keyless table): its first column
        order = [dt.schema().to_arrow().field(0).name]
    is_clustered = clustered(dt)
    if dry_run:
        res.compaction = {"skipped": "dry run", "small_files": res.files_before,
                          "deleted_rows": dead, "purge": purge}
    elif is_clustered:
        res.compaction = {"skipped": CLUSTERED_SKIP, "small_files": res.files_before, "deleted_rows": dead}
        log.warning("%s: compaction skipped (%s)", name, CLUSTERED_SKIP.replace("s3a://…", _s3a(url)))
    else:
        for attempt in range(COMMIT_RETRIES + 1):
            try:
                opt = dt.optimize
                metrics = (opt.z_order(order, target_size=target_size) if order
                           else opt.compact(target_size=target_size))
                break
            except CommitFailedError as exc:  # a merge committed first: compact its result
                if attempt == COMMIT_RETRIES:
                    raise
                log.warning("%s: compaction lost a race with another commit (%s); retrying", name,
                            str(exc).splitlines()[0][:200])
                dt.update_incremental()
        res.compaction = {
            "mode": "purge" if purge else "z_order" if zorder else "compact",
            "z_order_columns": order,
            "rows_in_files": physical,
            "deleted_rows_purged": dead if purge else 0,
            "files_removed": int(metrics.get("numFilesRemoved", 0)),
            "files_added": int(metrics.get("numFilesAdded", 0)),
            "bytes_removed": _total_size(metrics.get("filesRemoved")),
            "bytes_added": _total_size(metrics.get("filesAdded")),
        }
        check("the compaction")
        log.info("%s: compaction: %d file(s) → %d", name, res.compaction["files_removed"], res.compaction["files_added"])

    # -- vacuum (enforce_retention_duration=False: the retention is the caller's, checked there)
    sizes = object_sizes(client, url)
    paths = dt.vacuum(retention_hours=vacuum_hours(retention_hours), dry_run=dry_run or is_clustered,
                      enforce_retention_duration=False)
    rel = [_relative(p, url) for p in paths]
    if is_clustered and not dry_run:  # the files delta-rs' VACUUM would remove, without its commits
        _remove_files(client, url, rel)
    res.vacuum = {
        "retention_hours": retention_hours,
        "files": len(rel),
        "bytes": sum(sizes.get(p, 0) for p in rel),
        "dry_run": dry_run,
    }
    log.info("%s: vacuum%s: %d file(s), %d bytes", name, " (dry run)" if dry_run else "",
             res.vacuum["files"], res.vacuum["bytes"])
    # the files delta-rs' VACUUM leaves: deletion vectors, data files no log entry names
    dt.update_incremental()
    live = dt.get_add_actions(flatten=True).column("path").to_pylist()
    gone = vacuum_unreferenced(client, url, retention_hours, floor_hours=unreferenced_floor_hours,
                               dry_run=dry_run, live=live)
    res.vacuum.update(gone if "skipped" not in gone else {"unreferenced_skipped": gone["skipped"]})

    # -- log checkpoint and expired log files
    if dry_run:
        res.log = {"skipped": "dry run"}
    else:
        dt.update_incremental()
        dt.create_checkpoint()
        log_before = object_sizes(client, url, "_delta_log/")
        dt.cleanup_metadata()  # the table's own log retention (30 days unless set)
        expire_log(client, url, retention_hours)  # and ours: --retention-hours
        log_after = object_sizes(client, url, "_delta_log/")
        gone = [k for k in log_before if k not in log_after]
        res.log = {"checkpoint_version": dt.version(), "log_files_removed": len(gone),
                   "bytes": sum(log_before[k] for k in gone)}
        check("the checkpoint")
    dt.update_incremental()
    res.version_after = dt.version()
    res.files_after, res.bytes_after = data_files(dt)
    res.app_transactions = {a: dt.transaction_version(a) for a in apps}
    res.action = "dry-run" if dry_run else "maintained"
    res.seconds = round(time.monotonic() - t0, 3)
    return res




LOG_FLOOR_HOURS = 24
""":func:`expire_log` never removes a log entry younger than this, whatever the retention: a
writer that read the table at an older version and commits later puts its commit at the
next version after the one it read, and would overwrite a removed entry's name (the
conditional put finds no file) instead of noticing the commits it missed. No merge runs
that long."""

_LOG_ENTRY_RE = re.compile(r"^(\d{20})\.(?:json|crc|checkpoint(?:\.\d+\.\d+)?(?:\.[0-9a-f-]+)?\.(?:parquet|json))$")


def vacuum_hours(retention_hours: float) -> int:
    """delta-rs' VACUUM takes whole hours: the retention rounded up, never down (``0.9``
    was cut to 0, which removed files a reader of a version 50 minutes old still needs)."""
    import math

    return max(0, math.ceil(retention_hours))


def expire_log(client, url: str, retention_hours: float, *, now: datetime | None = None) -> list[str]:
    """Remove the log entries (commits, their ``.crc``, checkpoints) of the versions before
    the newest checkpoint written ``retention_hours`` ago or earlier (at least
    :data:`LOG_FLOOR_HOURS`); returns their keys.

    Every version from that checkpoint on stays readable (the checkpoint holds the state,
    app transactions included, and the commits after it follow), so time travel works for
    every version within the retention, as after VACUUM. delta-rs' own cleanup keeps the
    table's ``delta.logRetentionDuration`` (30 days unless set) whatever ``--retention-hours``
    says, and a table merged every five minutes writes about 8,600 commits in 30 days: their
    log outweighed a small table's data (``bench/soak.py``). S3 tables only (a local
    table keeps delta-rs' cleanup)."""
    if not url.startswith("s3://"):
        return []
    loc = s3store.S3Location.parse(url)
    base = unquote(loc.prefix.rstrip("/")) + "/_delta_log/"
    cutoff = (now or datetime.now(UTC)) - timedelta(hours=max(retention_hours, LOG_FLOOR_HOURS))
    entries = []
    for o in s3store.list_objects(client, loc.bucket, base):
        name = o["Key"][len(base):]
        found = _LOG_ENTRY_RE.match(name)
        if found:
            entries.append((int(found.group(1)), name, o))
    settled = [v for v, name, o in entries if CHECKPOINT_RE.match(name) and o["LastModified"] <= cutoff]
    if not settled:
        return []
    floor = max(settled)
    doomed = [base + name for v, name, _o in entries if v < floor]
    for i in range(0, len(doomed), 1000):
        client.delete_objects(Bucket=loc.bucket, Delete={"Objects": [{"Key": k} for k in doomed[i:i + 1000]],
                                                         "Quiet": True})
    if doomed:
        log.info("%s: removed %d log entries before the checkpoint of version %d", url, len(doomed), floor)
    return doomed




