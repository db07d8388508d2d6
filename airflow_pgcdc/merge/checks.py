"""What the merge job refuses before it touches a Delta table, each with a typed error
and a hint (:mod:`.errors`): windows the drain refused for the table, partitions attached
or detached under a root published via its root, windows ``pgcdc maintain`` expired, a
table rewritten in PostgreSQL since its copy, reserved column names; and the windows a
resync's copy already covers. Part of the merge job (:mod:`.job`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pyarrow as pa

from airflow_pgcdc.changes.rows import (
    REWRITTEN_FIELD,
)
from airflow_pgcdc.merge.clauses import MATCH_PREFIX, keep_column
from airflow_pgcdc.merge.columns import ColumnState, copy_state, follow, version_state
from airflow_pgcdc.merge.context import (
    JobContext,
)
from airflow_pgcdc.merge.errors import (
    ColumnIdentityChanged,
    CopyExpired,
    PartitionsChanged,
    RecoveryGap,
    ReservedColumnName,
    TableRewritten,
    ValueNotCarried,
    WindowsExpired,
)
from airflow_pgcdc.merge.plan import (
    TablePlan,
)
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.quoting import quote_qualified, shell_qualified
from airflow_pgcdc.store.partitions import (
    changes_since_copy,
    copied_leaves,
    window_partition_leaves,
)
from airflow_pgcdc.store.window import REFUSED_FIELD, RESUMED_FIELD

log = logging.getLogger("airflow_pgcdc.merge.job")  # the job's one logger, whatever module logs


def check_refused(schema: str, table: str, windows, since: int | None) -> None:
    """The drain left the table's changes out of a window (a column named like the change
    metadata): merging the rest would lose them. Changes before a resync's point are in
    its copy."""
    name = f"{schema}.{table}"
    for m in windows:
        for t in m.tables:
            refused = t.get(REFUSED_FIELD)
            if refused and f"{t['schema']}.{t['table']}" == name and (
                since is None or int(LSN.parse(refused["last_commit_lsn"])) >= since
            ):
                if refused.get("kind") == "value":
                    raise ValueNotCarried(
                        f"table {name}: the drain could not store {refused['changes']} change(s) of window "
                        f"{m.window_seq} (from commit {refused['first_commit_lsn']}): {refused['error']}",
                        hint=f"keep such values as exact text: --as-text {shell_qualified(schema, table)}=<column> "
                             f"on pgcdc drain (as_text= on the operator), then take the table again: pgcdc resync "
                             f"--tables {shell_qualified(schema, table)} --as-text … (the other tables are not "
                             "affected)",
                    )
                raise ReservedColumnName(
                    f"table {name}: the drain could not store {refused['changes']} change(s) of window "
                    f"{m.window_seq} (from commit {refused['first_commit_lsn']}): {refused['error']}",
                    hint=f"rename the column(s) in PostgreSQL, then take the table again: pgcdc resync "
                         f"--tables {shell_qualified(schema, table)} (the other tables are not affected)",
                )


def check_recovery_gap(ctx: JobContext, schema: str, table: str, windows, since: int | None) -> None:
    """A window the drain resumed after ``pgcdc recover`` (``resumed``) misses the changes
    between the store's end and the slot's position: they reach the table only through a
    copy taken at or after that position (``since``: its newest resync's point). A table
    that had left the pipeline before the gap is not concerned."""
    for m in windows:
        resumed = m.extra.get(RESUMED_FIELD)
        if not resumed or (m.pipeline_tables is not None and (schema, table) not in m.pipeline_tables):
            continue
        if since is not None and since >= int(LSN.parse(resumed["resumed_at"])):
            continue
        raise RecoveryGap(
            f"table {schema}.{table}: the slot lost the changes committed between {resumed['from_lsn']} and "
            f"{resumed['resumed_at']} (window {m.window_seq} resumed after recovery {resumed.get('recovery')}, "
            f"{resumed.get('cause')}), and no copy of the table taken since holds them (the recovery's copies "
            "left it out): merging on would leave them out; nothing merged",
            hint=f"pgcdc resync --slot {ctx.slot} --publication <publication> --store {ctx.layout.root.url} "
                 f"--tables {shell_qualified(schema, table)} (fix first what kept the recovery from copying it: its "
                 "record's 'refused' says why)",
        )


def check_partitions(ctx: JobContext, schema: str, table: str, windows, entry, copied_at: int | None) -> None:
    """A partitioned root published through it whose leaves changed since its copy
    (``entry``, taken at ``copied_at``): refused from the first window that says so
    (:mod:`airflow_pgcdc.store.partitions`). A window records the root's leaves as the
    catalog showed them when it committed and what changed since the window before (the
    drain judges a leaf attached when it first sees it, by its partition link's
    transaction). A window is refused when a leaf of the copy is gone (by name), or when it
    lists a change (an ATTACH after the copy, a partition created after the copy and then
    detached or dropped, a leaf detached and attached again). The window in which the copy
    was taken (it starts before ``copied_at``) is compared with the copy alone, attached
    leaves included: what changed in it before the copy's point is in the copy. Windows
    written before the field existed say nothing and pass."""
    copied = copied_leaves(entry) if entry is not None else None
    name = f"{schema}.{table}"
    for m in windows:
        rec = window_partition_leaves(m).get((schema, table))
        if rec is None:
            continue
        attached: set = set()
        detached: set = set()
        spans_copy = copied_at is not None and int(m.start) < copied_at
        if copied is not None:
            a, d = changes_since_copy(rec.leaves, copied)
            detached |= set(d)
            if spans_copy:  # judged once, here; later a rename or ALTER ... OWNER would fake an ATTACH
                attached |= set(a)
        if rec.changed and not spans_copy:
            attached |= set(rec.attached)
            detached |= set(rec.detached)
        if not attached and not detached:
            continue
        what = []
        if attached:
            what.append("attached " + ", ".join(quote_qualified(*n) for n in sorted(attached)))
        if detached:
            what.append("detached or dropped " + ", ".join(quote_qualified(*n) for n in sorted(detached)))
        raise PartitionsChanged(
            f"table {name} is published through its partitioned root and its partitions changed in window "
            f"{m.window_seq} ({m.start_lsn}..{m.end_lsn}) or just before it was committed: {'; '.join(what)}. "
            "PostgreSQL streams neither the rows an attached partition already held nor a delete for a "
            "detached one's, so its Delta table would silently miss or keep them: nothing merged from that "
            "window on",
            hint=f"pgcdc resync --slot {ctx.slot} --publication <publication> --store s3://{ctx.layout.bucket}/"
                 f"{ctx.layout.root.prefix} --tables {shell_qualified(schema, table)} (a copy of "
                 "the root with its partitions now; the next merge replaces the Delta table from it and goes "
                 "on; the other tables are not affected)",
        )


def expired_state(ctx: JobContext) -> tuple[frozenset[int], dict[str, set[str]]]:
    """What ``pgcdc maintain`` removed (``expired.json``, one read; nothing when there is
    no such file): the windows whose parts are gone, and the tables whose parts are gone
    from each copy (see :mod:`airflow_pgcdc.maintain.copies`)."""
    from airflow_pgcdc.store.maintenance import read_expired_all

    windows, copies = read_expired_all(ctx.client, ctx.layout, ctx.slot)
    return frozenset(windows), copies


def check_copy(ctx: JobContext, layout, copy_slot: str, manifest, schema: str, table: str, url: str) -> None:
    """Raise :class:`CopyExpired` when ``pgcdc maintain`` removed the parts of
    ``schema.table`` from the copy ``manifest`` (under ``layout``/``copy_slot``: the slot's
    snapshot or a resync's): it is about to be read to create or replace ``url``."""
    key = layout.snapshot_manifest(copy_slot, manifest.snapshot_id)
    name = f"{schema}.{table}"
    if name not in ctx.expired_copies.get(key, ()):
        return
    store = f"s3://{ctx.layout.bucket}/{ctx.layout.root.prefix}"
    raise CopyExpired(
        f"{url} must be created from the copy of table {name} in s3://{layout.bucket}/{key} (taken at "
        f"{manifest.consistent_point}), but pgcdc maintain removed its parts once the table's Delta table held "
        f"them and the copy was older than the retention (listed in s3://{ctx.layout.bucket}/"
        f"{ctx.layout.changes_prefix(ctx.slot)[:-len('changes/')]}maintain/expired.json): the Delta table was "
        "dropped since, or a history table is added after the fact. Nothing of this table was read or merged",
        hint=f"pgcdc resync --slot {ctx.slot} --publication <publication> --store {store} --tables "
             f"{shell_qualified(schema, table)} (a new copy: the next merge creates the Delta table from it); a __scd2 history "
             "table starts from the pipeline's snapshot and cannot be added once its copy expired",
        table=name, copy=layout.url(key),
    )


def _ranges_text(seqs: Sequence[int]) -> str:
    from airflow_pgcdc.store.maintenance import seq_ranges

    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in seq_ranges(seqs))


def check_expired(ctx: JobContext, schema: str, table: str, windows, since: int | None, url: str,
                   merged: int | None, *, history: str | None = None) -> None:
    """Raise :class:`WindowsExpired` when one of ``windows`` whose change parts the table
    needs was expired by ``pgcdc maintain``: its parts are gone, and merging without them
    would skip changes. A window holding only a truncate of the table needs no part (the
    truncate is in the manifest). With ``since`` (a resync's point), a window whose every
    transaction committed before it is not needed (in the copy)."""
    if not ctx.expired:
        return
    needed = []
    for m in windows:
        if m.window_seq not in ctx.expired:
            continue
        if since is not None and m.last_commit_lsn and int(LSN.parse(m.last_commit_lsn)) < since:
            continue
        for t in m.tables:
            if (t["schema"], t["table"]) == (schema, table) and any(
                rv.get("parts") for rv in t.get("relation_versions", ())
            ):
                needed.append(m)
                break
    if not needed:
        return
    name = f"{schema}.{table}"
    seqs = [m.window_seq for m in needed]
    start, end = needed[0].start_lsn, needed[-1].end_lsn
    what = f"{history} table of {name}" if history else f"table {name}"
    state = (f"its Delta table {url} has merged through window {merged}" if merged is not None else
             f"its Delta table {url} has merged no window yet (missing, or rebuilt from the copy)")
    store = f"s3://{ctx.layout.bucket}/{ctx.layout.root.prefix}"
    if history:
        hint = (f"the {history} table cannot get those changes back (pgcdc resync does not rebuild history "
                f"tables): keep windows longer where history tables may be added or rebuilt (pgcdc maintain "
                f"--retention-hours N, or --no-windows); merge without --history {history} meanwhile")
    else:
        hint = (f"pgcdc resync --slot {ctx.slot} --publication <publication> --store {store} --tables "
                f"{shell_qualified(schema, table)} (a new copy: the next merge replaces the Delta table from it and needs "
                "only the windows after it), or keep windows longer where rebuilds from the store must be "
                "possible (pgcdc maintain --retention-hours N, or --no-windows)")
    raise WindowsExpired(
        f"{what} needs the changes of window(s) {_ranges_text(seqs)} ({start}..{end}), but pgcdc maintain "
        f"removed their parts (listed in s3://{ctx.layout.bucket}/{ctx.layout.changes_prefix(ctx.slot)[:-len('changes/')]}"
        f"maintain/expired.json): {state}. Nothing of this table was read or merged",
        hint=hint, table=name, windows=seqs, start_lsn=start, end_lsn=end,
    )


def after_point(ctx: JobContext, plan: TablePlan, windows, since: int) -> TablePlan:
    """After a resync: ``plan`` without the relation versions whose every change committed
    before its consistent point (their rows are in the copy, and so is what DDL did to the
    table then: an older column type, a rewritten column). A window that spans the point
    is read per version from its parts' ``_pgcdc_commit_lsn`` statistics."""
    import dataclasses

    from airflow_pgcdc.merge.point import commit_lsn_span

    by_seq = {m.window_seq: m for m in windows}
    keep = []
    for v in plan.versions:
        m = by_seq[v.window_seq]
        if m.first_commit_lsn and int(LSN.parse(m.first_commit_lsn)) >= since:
            keep.append(v)
        elif m.last_commit_lsn and int(LSN.parse(m.last_commit_lsn)) < since:
            continue
        elif v.parts and (span := commit_lsn_span(ctx, v.parts)) is not None and span[1] < since:
            continue
        else:
            keep.append(v)
    if len(keep) == len(plan.versions):
        return plan
    log.info("%s: %d relation version(s) committed before the resync's point left out (in the copy)",
             plan.qualified_name, len(plan.versions) - len(keep))
    return dataclasses.replace(plan, versions=tuple(keep))


def check_rewritten(ctx: JobContext, schema: str, table: str, windows, plan: TablePlan, dt) -> None:
    """A relation version of the batch has a column the drain saw filled by a table
    rewrite (``rewritten_columns``) and the Delta table has not got it yet: adding it
    would leave its rows already there NULL, not the values PostgreSQL wrote. A column
    the Delta table has (from a copy taken after the DDL: a resync) is fine."""
    if dt is None:
        return
    name = f"{schema}.{table}"
    have = set(pa.schema(dt.schema().to_arrow()).names)
    kept = {(v.window_seq, v.version) for v in plan.versions}
    for m in windows:
        for t in m.tables:
            if f"{t['schema']}.{t['table']}" != name:
                continue
            for rv in t["relation_versions"]:
                cols = [c for c in rv.get(REWRITTEN_FIELD, ()) if c["name"] not in have]
                if cols and (m.window_seq, int(rv["version"])) in kept:
                    raise TableRewritten(
                        f"table {name}: PostgreSQL rewrote the table to fill column(s) "
                        + ", ".join(f"{c['name']!r} ({c.get('expression', '?')})" for c in cols)
                        + f" in the rows already there (window {m.window_seq}), and logical decoding "
                        "carries none of those values: the Delta table cannot follow",
                        hint=f"pgcdc resync --slot {ctx.slot} --publication <publication> --store "
                             f"s3://{ctx.layout.bucket}/{ctx.layout.root.prefix} --tables "
                             f"{shell_qualified(schema, table)} (a copy "
                             "taken after the DDL; the next merge replaces the Delta table from it; the "
                             "other tables are not affected)",
                    )


def column_baseline(ctx: JobContext, schema: str, table: str, manifests, entry, copy_where: str,
                    last_merged: int | None, since: int | None, from_copy: bool) -> ColumnState | None:
    """What was known of the table's columns when its Delta table was last written (see
    :mod:`.columns`): the copy when the Delta table was just created or replaced from it, or
    has merged no window since (``from_copy``, ``last_merged`` None, or a last merged window
    that started before the resync's point ``since``); else the newest relation version of
    the table in its last merged window (one manifest read when the job has not read it).
    None when unknown (that window does not hold the table)."""
    if entry is not None and (from_copy or last_merged is None):
        return copy_state(entry, copy_where)
    if last_merged is None:
        return None
    m = next((w for w in manifests if w.window_seq == last_merged), None)
    if m is None:
        from airflow_pgcdc.store.window import read_window

        m = read_window(ctx.client, ctx.layout, ctx.slot, last_merged)
    if since is not None and entry is not None and int(m.start) < since:
        return copy_state(entry, copy_where)
    rvs = [rv for t in m.tables if (t["schema"], t["table"]) == (schema, table) for rv in t["relation_versions"]]
    if not rvs:
        return None
    newest = max(rvs, key=lambda rv: int(rv["version"]))
    return version_state(newest, f"window {last_merged}")


def check_columns(ctx: JobContext, schema: str, table: str, windows, plan: TablePlan, dt,
                  baseline: ColumnState | None) -> None:
    """Refuse the table when a column of the batch is not the column its Delta table holds
    under that name (renamed, dropped and added again: :class:`ColumnIdentityChanged`) or was
    rewritten without logical changes (:class:`TableRewritten`); see :mod:`.columns`."""
    if dt is None:
        return
    kept = {(v.window_seq, v.version) for v in plan.versions}
    versions = [
        (f"window {m.window_seq}", rv)
        for m in windows for t in m.tables if (t["schema"], t["table"]) == (schema, table)
        for rv in sorted(t["relation_versions"], key=lambda rv: int(rv["version"]))
        if (m.window_seq, int(rv["version"])) in kept
    ]
    refusal = follow(baseline, pa.schema(dt.schema().to_arrow()).names, versions)
    if refusal is None:
        return
    name = f"{schema}.{table}"
    hint = (f"pgcdc resync --slot {ctx.slot} --publication <publication> --store s3://{ctx.layout.bucket}/"
            f"{ctx.layout.root.prefix} --tables {shell_qualified(schema, table)} (a copy taken "
            "after the DDL; the next merge replaces the Delta table from it in one commit, its older versions "
            "stay readable by time travel; the other tables are not affected)")
    if refusal.kind == "rewritten":
        raise TableRewritten(f"table {name}: {refusal.message}: the Delta table cannot follow", hint=hint)
    raise ColumnIdentityChanged(
        f"table {name}: {refusal.message}. Following it by name would "
        + ("split one column in two, each partly NULL" if refusal.kind == "renamed"
           else "mix the old column's values into the new one")
        + ": nothing merged", hint=hint, table=name, column=refusal.column)


def check_internal_names(name: str, columns: list[str], keys, toast: list[str]) -> None:
    """Names the compaction adds beside the table's columns must not be the table's own."""
    internal = {keep_column(c) for c in toast} | {MATCH_PREFIX + k for k in keys}
    clash = sorted(set(columns) & internal)
    if clash:
        raise ReservedColumnName(
            f"table {name}: column(s) {clash} have the name of a column the merge adds while it "
            "compacts the changes", hint="rename the column(s) in PostgreSQL, then pgcdc resync the table",
        )
