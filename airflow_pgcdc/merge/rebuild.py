"""Rebuild: the slot's copy and windows replayed into a scratch Delta root, then each rebuilt
table swapped into the live root in one commit (``pgcdc rebuild``, ``PgcdcRebuildOperator``,
the ``{name}_backfill`` DAG).

When: a Delta table was damaged or deleted, a merge bug was fixed, or its layout must
change (file size, engine, deletion vectors). The store is the source of truth for as
long as it keeps the copy and every window since: upkeep (``pgcdc maintain``) removes
merged windows older than its retention, so :func:`check_replayable` runs first and
refuses before anything is read or written, naming every table that cannot be rebuilt,
the windows or copy it lacks, and the retention that would have kept them.

The swap (:func:`swap_in`) is one overwrite commit per live table (and per history
table, changelog or SCD2, when the rebuild kept one): readers see the old contents or the
new, never a mix, and time travel keeps the old versions. The commit carries the rebuilt
table's app transaction version, so the next merge continues from the window the rebuild
reached; windows the live table merged while the rebuild ran are merged again (a merge is
idempotent per key, and windows are applied in order). The scratch root is removed once
every table is swapped in (kept with ``swap=False`` for a look, or ``keep_scratch``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from airflow_pgcdc.lake.inspect import clustered, foreign_creator, open_table
from airflow_pgcdc.lake.tables import app_id, delta_table_url
from airflow_pgcdc.merge.checks import _ranges_text, check_copy, check_expired, expired_state
from airflow_pgcdc.merge.context import JobContext
from airflow_pgcdc.merge.errors import CopyExpired, MergeError, WindowsExpired
from airflow_pgcdc.merge.options import MergeOptions
from airflow_pgcdc.merge.plan import select_windows
from airflow_pgcdc.merge.sinks import deltars
from airflow_pgcdc.merge.windows import load_windows
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout, new_run_id
from airflow_pgcdc.store.manifest import committed_snapshot
from airflow_pgcdc.store.resyncs import committed_resyncs, latest_resync

log = logging.getLogger(__name__)

__all__ = ["NotReplayable", "check_replayable", "rebuild_slot", "rebuilt_events", "scratch_root", "swap_and_clean",
           "swap_in"]


class NotReplayable(MergeError):
    """Upkeep removed what a rebuild of these tables needs: nothing was read or written.
    ``problems``: per table, the error its merge would have raised."""

    def __init__(self, message: str, *, hint: str | None = None, problems: list[dict] | None = None):
        super().__init__(message, hint=hint)
        self.problems = problems or []


def scratch_root(delta: str, run: str) -> str:
    """Where a rebuild of the live root ``delta`` builds: ``{delta}_rebuild/{run}``."""
    return f"{delta.rstrip('/')}_rebuild/{run}"


def _age_hours(client, layout: Layout, slot: str, seq: int) -> float | None:
    """Hours since window ``seq``'s manifest was written (its object's time), or None."""
    try:
        head = client.head_object(Bucket=layout.bucket, Key=layout.window_manifest(slot, seq))
    except Exception:  # noqa: BLE001 - only for the hint
        return None
    return (datetime.now(UTC) - head["LastModified"]).total_seconds() / 3600


def check_copy_of(ctx: JobContext, schema: str, table: str, layout: Layout, copy_slot: str, manifest) -> None:
    """:func:`.checks.check_copy` for a table about to be rebuilt from a copy."""
    check_copy(ctx, layout, copy_slot, manifest, schema, table, f"{schema}.{table} (rebuilt)")


def check_history(ctx: JobContext, schema: str, table: str, *args) -> None:
    """:func:`.checks.check_expired` for the table's history table."""
    check_expired(ctx, schema, table, *args, history=ctx.history)


def check_replayable(*, store: str, slot: str, scratch: str, tables: Sequence[str] | None = None,
                     history: str | None = None, max_windows: int | None = None,
                     settings: s3store.S3Settings | None = None, live: str | None = None) -> list[str]:
    """The tables a rebuild of ``slot`` would replay (``schema.table``); raises
    :class:`NotReplayable` naming every one whose copy or windows upkeep removed, and every
    one whose live Delta table under ``live`` another slot's pipeline made and this slot
    never merged into (a wrong ``--slot`` or ``--delta``: the swap would replace another
    pipeline's table; the merge refuses the same with ``TableOfAnotherSlot``). One list,
    before any work: a rebuild that could do only some tables is refused whole, unless the
    user names the others with ``tables``."""
    settings = settings or s3store.S3Settings.from_env()
    layout = Layout.parse(store)
    client = s3store.make_s3_client(settings)
    ctx = JobContext(session=None, layout=layout, client=client, fs=None,
                     storage=s3store.delta_storage_options(settings), slot=slot, delta=scratch,
                     run_id="check", s3_options={}, history=history)
    snapshot = committed_snapshot(client, layout, slot)
    ctx.resyncs = committed_resyncs(client, layout, slot)
    ctx.expired, ctx.expired_copies = expired_state(ctx)
    # a rebuilt table starts from its copy: every window after it counts, so every manifest is
    # read (the tables index would leave out the windows before a table's anchor: a table no
    # window held was refused with WindowGap once another table's changes had moved the index on)
    ctx.every_window = True
    manifests, wanted = load_windows(ctx, snapshot, tables)
    ctx.anchors.clear()
    problems: list[dict] = []
    for schema, table in wanted:
        name = f"{schema}.{table}"
        url = f"{name} (rebuilt)"
        found = latest_resync(ctx.resyncs, schema, table)
        entry = next((t for t in snapshot.tables if (t.schema, t.table) == (schema, table)), None) if snapshot else None
        # what the merge checks before it copies a table anew: its windows, its copy
        checks: list[tuple] = []
        if found is not None:
            resync = found[0]
            checks += [(check_expired, select_windows(manifests, after=None, limit=max_windows),
                        int(resync.consistent_point), url, None),
                       (check_copy_of, resync.layout, resync.resync_slot, resync.manifest)]
        if entry is not None:
            since_snapshot = select_windows(manifests, after=None, consistent_point=snapshot.consistent_point,
                                            limit=max_windows)
            if found is None:
                checks += [(check_expired, since_snapshot, None, url, None), (check_copy_of, layout, slot, snapshot)]
            if history:  # the history tables start from the pipeline's snapshot
                checks.append((check_history, since_snapshot, None, url, None))
                if history == "scd2":
                    checks.append((check_copy_of, layout, slot, snapshot))
        problem: dict[str, Any] = {}
        for check, *args in checks:
            try:
                check(ctx, schema, table, *args)
            except WindowsExpired as exc:
                problem.setdefault("windows", sorted(set(exc.windows)))
            except CopyExpired as exc:
                problem.setdefault("copy", exc.copy)
        if live is not None:
            live_url = delta_table_url(live, schema, table)
            live_dt = open_table(live_url, ctx.storage)
            other = foreign_creator(client, live_dt, live_url, app_id(slot, schema, table), slot)
            if other is not None:
                problem["other_slot"] = other
                problem["live"] = live_url
            if live_dt is not None and clustered(live_dt):  # the swap is a delta-rs overwrite
                problem["clustered"] = live_url
        if problem:
            if "windows" in problem:
                age = _age_hours(client, layout, slot, problem["windows"][0])
                if age is not None:
                    problem["retention_hours_needed"] = int(age) + 1
            problems.append({"table": name, **problem})
    if problems:
        def what(p: dict) -> str:
            lost = []
            if "windows" in p:
                lost.append(f"window(s) {_ranges_text(p['windows'])} expired")
            if "copy" in p:
                lost.append(f"its copy {p['copy']} expired")
            if "other_slot" in p:
                lost.append(f"its live table {p['live']} belongs to slot {p['other_slot']}'s pipeline")
            if "clustered" in p:
                lost.append(f"its live table {p['clustered']} is liquid-clustered: the swap is a delta-rs commit, "
                            "and delta-rs 1.6.6 commits nothing to a clustered table")
            kept = (f"; a retention over {p['retention_hours_needed']} h would have kept them"
                    if "retention_hours_needed" in p else "")
            return f"{p['table']} ({', '.join(lost)}{kept})"

        raise NotReplayable(
            f"slot {slot}: {len(problems)} of {len(wanted)} table(s) cannot be rebuilt from the store "
            f"{store}: " + "; ".join(what(p) for p in problems) + ". Nothing was read or written",
            hint=("check --slot and --delta: a live table of another slot's pipeline is never replaced; "
                  if any("other_slot" in p for p in problems) else "")
                 + ("a liquid-clustered table is not rebuilt: leave it out (--tables), or remove it and take it "
                    "again (pgcdc resync, without cluster_by); "
                    if any("clustered" in p for p in problems) else "")
                 + "rebuild the other tables (--tables), and copy these again from PostgreSQL: pgcdc resync "
                 f"--slot {slot} --publication <publication> --store {store} --tables "
                 + " ".join(p["table"] for p in problems)
                 + "; to keep rebuilds possible, run pgcdc maintain with a longer --retention-hours (or "
                   "--no-windows): the store then keeps every window's Parquet for that long",
            problems=problems,
        )
    return [f"{s}.{t}" for s, t in wanted]


def _history_urls(table: dict) -> list[tuple[str, str, str]]:
    """``(rebuilt url, app id, kind)`` of a result table's history tables."""
    out = []
    hist = table.get("history") or {}
    for kind in ("changelog", "scd2"):
        if hist.get(kind):
            out.append((hist[kind], f"{table['app_id']}:{kind}", kind))
    return out


def swap_in(result: dict[str, Any], delta: str, *, settings: s3store.S3Settings, run: str,
            metadata: dict[str, str] | None = None, target_file_mb: float | None = None,
            lock_wait: float | None = None) -> list[dict[str, Any]]:
    """Swap every rebuilt table of a merge ``result`` (the merge into the scratch root) into
    the live root ``delta``: one overwrite commit per table and per history table
    (:func:`.deltars.swap`; files of ``target_file_mb``, default
    :data:`.pruning.DEFAULT_TARGET_FILE_MB`), holding the live root's lock (a Delta Spark
    merge there commits without a conditional put: it holds the lock too,
    :mod:`airflow_pgcdc.lake.lock`; ``lock_wait``: how long to wait for it, default
    600 s). A failed table is left out. Returns one record per swap."""
    from airflow_pgcdc.lake.lock import root_lock_if
    from airflow_pgcdc.lake.sizing import DEFAULT_TARGET_FILE_MB, target_bytes

    with root_lock_if(True, s3store.make_s3_client(settings), delta, job=f"pgcdc rebuild {run} (the swap)",
                      wait=lock_wait):
        return _swap_all(result, delta, storage_options=s3store.delta_storage_options(settings), run=run,
                         metadata=metadata, size=target_bytes(target_file_mb or DEFAULT_TARGET_FILE_MB))


def _swap_all(result: dict[str, Any], delta: str, *, storage_options: dict[str, str], run: str,
              metadata: dict[str, str] | None, size: int) -> list[dict[str, Any]]:
    scratch = result["delta"].rstrip("/")
    out = []
    for t in result["tables"]:
        if t.get("action") == "failed" or not t.get("delta_url"):
            continue
        for rebuilt, app, history in [(t["delta_url"], t["app_id"], None), *_history_urls(t)]:
            if not rebuilt.startswith(scratch + "/"):
                raise MergeError(f"rebuilt table {rebuilt} is not under the rebuild root {scratch}")
            live = delta.rstrip("/") + rebuilt[len(scratch):]
            table = open_table(rebuilt, storage_options)
            if table is None:
                continue  # a history table with nothing to keep
            done = deltars.swap(rebuilt, live, app=app, storage_options=storage_options, target_file_size=size,
                                rebuilt=table,
                                metadata={"pgcdc.swapped_from": rebuilt, "pgcdc.rebuild": run, **(metadata or {})})
            log.info("%s: swapped in from %s (window %s, live version %s)", live, rebuilt, done["window"],
                     done["live_version"])
            out.append({"table": t["table"], "history": history, **done})
    return out


def swap_and_clean(result: dict[str, Any], delta: str, *, settings: s3store.S3Settings, run: str,
                   target_file_mb: float | None = None, keep_scratch: bool = False) -> dict[str, Any]:
    """:func:`swap_in`, then the scratch root (``result["delta"]``) removed unless
    ``keep_scratch``: ``{"swapped": [...], "objects_removed": n}``."""
    swaps = swap_in(result, delta, settings=settings, run=run, target_file_mb=target_file_mb)
    scratch = result["delta"].rstrip("/")
    removed = 0
    if not keep_scratch and scratch.startswith("s3://"):
        where = s3store.S3Location.parse(scratch)
        removed = s3store.delete_prefix(s3store.make_s3_client(settings), where.bucket, where.prefix + "/")
        log.info("removed the rebuild root %s (%d objects)", scratch, removed)
    return {"swapped": swaps, "objects_removed": removed}


def rebuilt_events(tables: list[dict[str, Any]], swapped: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """``(live table URI, Asset event extra)`` per live table swapped in (a history table's
    swap gets none: its table's event stands for it); ``tables``: the merge result's."""
    ends = {t["table"]: t.get("end_lsn") for t in tables}
    return [(done["live"], {"window_seq": done["window"], "end_lsn": ends.get(done["table"]),
                            "delta_version": done["live_version"], "action": "rebuilt"})
            for done in swapped if done.get("history") is None]


def rebuild_slot(
    spark,
    *,
    store: str,
    slot: str,
    delta: str,
    scratch: str | None = None,
    swap: bool = True,
    keep_scratch: bool = False,
    options: MergeOptions | Mapping[str, Any] | None = None,
    s3: Any = None,
    **fields: Any,
) -> dict[str, Any]:
    """Rebuild the Delta tables of ``slot`` under the live root ``delta`` from the store
    (see the module doc): :func:`check_replayable`, the merge job into ``scratch``
    (default :func:`scratch_root` with a new run id), :func:`swap_in`, the scratch root
    removed. ``options``: the merge's (:class:`~.options.MergeOptions`, or its fields as
    keywords: tables, engine, reader, history, target_file_mb, deletion_vectors, keys,
    max_windows, driver_rows, until_lsn, until_time). ``s3``: S3Settings (or a client made by
    ``make_s3_client``; ``settings``, the 0.1 name, warns). Returns the merge's
    result whose tables point at the live tables, with ``rebuild``: the scratch root, the
    swaps and what was removed. A table that failed is reported (the others are swapped)
    and :class:`.job.TablesFailed` raised after."""
    from airflow_pgcdc.merge.errors import CatalogNotUpdated
    from airflow_pgcdc.merge.job import TablesFailed, merge_slot
    from airflow_pgcdc.merge.results import rewrite_detail

    settings, _ = s3store.s3_argument("rebuild_slot", s3, fields, needs_settings=True)
    options = MergeOptions.of(options, **fields)
    tables = options.tables
    t0 = time.monotonic()
    run = new_run_id()
    scratch = (scratch or scratch_root(delta, run)).rstrip("/")
    if scratch == delta.rstrip("/") or scratch.startswith(delta.rstrip("/") + "/"):
        raise MergeError(f"the rebuild root {scratch} must not be the live root {delta} or inside it",
                         hint="leave --scratch out (default {delta}_rebuild/{run}) or name another folder")
    names = check_replayable(store=store, slot=slot, scratch=scratch, tables=tables, history=options.history,
                             max_windows=options.max_windows, settings=settings,
                             live=delta if swap else None)
    log.info("slot %s: rebuilding %d table(s) into %s", slot, len(names), scratch)
    failed: TablesFailed | None = None
    try:  # the scratch tables are not registered: the live ones are, once swapped in
        result = merge_slot(spark, store=store, slot=slot, delta=scratch, s3=settings,
                            options=dataclasses.replace(options, catalog=None)).to_dict()
    except TablesFailed as exc:
        if exc.result is None:
            raise
        failed, result = exc, exc.result.to_dict()
    done = {"swapped": [], "objects_removed": 0}
    if swap:
        done = swap_and_clean(result, delta, settings=settings, run=run, keep_scratch=keep_scratch,
                              target_file_mb=options.target_file_mb)
        # the result names the live tables: the ones users read, and the Asset events' URIs
        versions = {s["live"]: s["live_version"] for s in done["swapped"]}
        for t in result["tables"]:
            if t.get("delta_url", "").startswith(scratch + "/"):
                t["delta_url"] = live_url(t["delta_url"], scratch, delta)
                t["delta_version"] = versions.get(t["delta_url"], t.get("delta_version"))
        result["delta"] = delta
    catalog_error = register_live(result, delta, options, slot, settings) if swap and options.catalog else None
    result["rebuild"] = {"scratch": scratch, **done, "swap": swap, "seconds": round(time.monotonic() - t0, 3)}
    rewrite_detail(s3store.make_s3_client(settings), result)  # the store's copy names the live tables too
    if failed is None and catalog_error is not None:
        failed = CatalogNotUpdated(f"every table rebuilt, but the catalog {options.catalog} was not brought up to "
                                   f"date: {catalog_error}", hint=catalog_error.hint)
    if failed is not None:
        failed.outcome = result  # what the CLI and the operator print and read
        raise failed
    return result


def register_live(result: dict[str, Any], delta: str, options: MergeOptions, slot: str, settings):
    """The live tables under ``delta`` that a rebuild (its merge ``result``, whose tables may
    still name the rebuild root ``result["delta"]``) swapped in, registered in the catalog
    ``options.catalog`` (``result["catalog"]``); the error when the metastore was not brought
    up to date, else None. The rebuild's own merge registers nothing: its tables are scratch."""
    from airflow_pgcdc.lake.catalog import CatalogError
    from airflow_pgcdc.merge.catalog import NO_TABLE, catalog_failure, register_tables
    from airflow_pgcdc.store.layout import decode_table_segment

    scratch = str(result.get("delta") or "").rstrip("/")
    items = []
    for t in result["tables"]:
        if t.get("action") in NO_TABLE or not t.get("delta_url"):
            continue
        url = live_url(t["delta_url"], scratch, delta) if scratch else t["delta_url"]
        schema, table = decode_table_segment(url.rsplit("/", 1)[1].replace("~", "%"))
        items.append((schema, table, url, bool(t.get("left_pipeline"))))
    try:
        result["catalog"] = register_tables(options, slot, s3store.delta_storage_options(settings), items)
    except CatalogError as exc:
        log.error("catalog %s not brought up to date after the rebuild: %s", options.catalog, exc)
        result["catalog"] = catalog_failure(exc)
        return exc
    return None


def live_url(url: str, scratch: str, delta: str) -> str:
    """``url`` of a rebuilt table under the rebuild root ``scratch``, as its live table's under
    ``delta``; any other URL as it is."""
    scratch = scratch.rstrip("/")
    return delta.rstrip("/") + url[len(scratch):] if url.startswith(scratch + "/") else url
