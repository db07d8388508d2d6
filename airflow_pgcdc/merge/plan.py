"""What to merge: pure planning over manifests (no Spark, no I/O).

For one Delta table (one source table), the plan names the committed windows to merge
next, in order, and checks that they can be merged:

* windows are contiguous: the first is the one after the table's last merged window
  (its Delta app transaction version), or window 0 for a table only bootstrapped;
  a missing or uncommitted window in between stops the plan (:class:`WindowGap`);
  nothing is ever skipped;
* windows tile the LSN line: each starts where the previous one ended, and window 0
  starts at the snapshot's ``consistent_point`` (:class:`WindowOrderError`);
* every relation version's replica identity covers the merge key, so deletes and
  key-changing updates can be matched (:class:`KeyNotCovered`).

A batch of windows is merged as one Delta commit whose app transaction version is the
last window's ``window_seq`` (so a replay of any window already merged is a no-op).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_pgcdc.lake.tables import (
    RESYNC_APP_SUFFIX,
    cut_app,
)
from airflow_pgcdc.merge.errors import KeyNotCovered, NoMergeKey, WindowGap, WindowOrderError
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.quoting import quote_qualified
from airflow_pgcdc.store.packs import part_ref
from airflow_pgcdc.store.window import KEY_MOVES_FIELD, truncates_table

__all__ = [
    "TablePlan",
    "VersionInput",
    "plan_table",
    "select_windows",
]
























def select_windows(
    manifests: Sequence,
    *,
    after: int | None,
    consistent_point: str | None = None,
    limit: int | None = None,
) -> list:
    """The committed windows to merge after window ``after`` (``None``: none merged yet),
    in order. ``manifests``: every committed window manifest of the slot (any order).

    Raises :class:`WindowGap` when a later window is committed but one before it is not,
    and :class:`WindowOrderError` when the windows do not tile.
    """
    by_seq = {m.window_seq: m for m in manifests}
    nxt = 0 if after is None else after + 1
    out = []
    prev_end = None
    if after is not None and after in by_seq:
        prev_end = by_seq[after].end
    elif after is None and consistent_point is not None:
        prev_end = LSN.parse(consistent_point)
    while nxt in by_seq and (limit is None or len(out) < limit):
        m = by_seq[nxt]
        if prev_end is not None and m.start != prev_end:
            what = "the snapshot's consistent point" if nxt == 0 or (after is None and not out) else f"window {nxt - 1}'s end"
            raise WindowOrderError(
                f"window {nxt} starts at {m.start_lsn} but {what} is {prev_end}: "
                "the windows do not tile the LSN line; nothing merged from it"
            )
        out.append(m)
        prev_end = m.end
        nxt += 1
    later = sorted(s for s in by_seq if s > nxt)
    if later and (limit is None or len(out) < limit):
        raise WindowGap(
            f"window {nxt} is not committed but window {later[0]} is: refusing to skip it "
            f"(merged so far: {after if after is not None else 'none'}); a drain rerun "
            "recreates a missing window only if its changes are still in the slot"
        )
    return out


@dataclass(frozen=True)
class VersionInput:
    """One relation version of the table in one window: its parts (keys relative to the
    bucket) and its columns as the manifest describes them."""

    window_seq: int
    version: int
    columns: tuple[dict, ...]
    replica_identity: str
    old_columns: tuple[str, ...]
    parts: tuple[str, ...]
    rows: int
    # the manifest's missing_values: what rows older than an ADD COLUMN … DEFAULT read
    missing_values: str | None = None
    bytes: int = 0  # the parts' Parquet bytes


@dataclass(frozen=True)
class TablePlan:
    """The windows of one table to merge as one Delta commit."""

    schema: str
    table: str
    key_columns: tuple[str, ...]
    first_window: int
    last_window: int
    start_lsn: str
    end_lsn: str
    versions: tuple[VersionInput, ...] = ()
    # the last truncate of the table in the batch: (commit_lsn, seq); changes at or
    # before it are superseded, and target rows not in the source are deleted
    truncate_at: tuple[int, int] | None = None
    # the commit time of that truncate (ISO 8601; None when its window did not record it)
    truncate_time: str | None = None
    truncates: int = 0
    # key-changing updates whose unchanged TOAST values were not sent (the windows'
    # ``key_moves_unchanged_toast``): the compaction then matches such rows on the old key
    key_moves: int = 0
    # a resync's consistent point: changes committed before it are in the table's copy
    # (only rows with _pgcdc_commit_lsn >= since_lsn are applied; earlier truncates too)
    since_lsn: int | None = None
    # a replay to a point (merge/point.py): only rows with _pgcdc_commit_lsn <= until_lsn are
    # applied (later truncates neither); cut_window: the plan's last window, cut at that point
    until_lsn: int | None = None
    cut_window: int | None = None
    # slices of the table to upsert in this batch (merge/slices.py: SliceInput), oldest first
    slices: tuple = ()
    extra: dict = field(default_factory=dict)

    @property
    def commit_version(self) -> int:
        """The app transaction version the plan's commit records: its last window, or the
        one before a window it cut (-1: none whole)."""
        return self.last_window if self.cut_window is None else self.cut_window - 1

    def cut_transactions(self, app: str) -> dict[str, int]:
        """The app transactions beside ``app``'s that the commit records: a cut's (a replay
        to a point), the newest slice's (``{app}:resync``: its point)."""
        out = {} if self.cut_window is None else {cut_app(app, self.cut_window): int(self.until_lsn)}
        if self.slices:
            out[app + RESYNC_APP_SUFFIX] = max(s.lsn for s in self.slices)
        return out

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def rows(self) -> int:
        return sum(v.rows for v in self.versions) + sum(s.rows for s in self.slices)

    @property
    def bytes(self) -> int:
        return sum(v.bytes for v in self.versions) + sum(s.bytes for s in self.slices)

    @property
    def parts(self) -> list[str]:
        return [p for v in self.versions for p in v.parts]

    @property
    def has_work(self) -> bool:
        return bool(self.parts) or self.truncate_at is not None or bool(self.slices)

    def latest_columns(self) -> tuple[dict, ...]:
        """The columns of the newest relation version (the table's shape at the end)."""
        return self.versions[-1].columns if self.versions else ()


def plan_table(
    windows: Sequence,
    *,
    schema: str,
    table: str,
    key_columns: Sequence[str],
    window_prefix,
    keyless: bool = False,
    since_lsn: int | None = None,
    until_lsn: int | None = None,
) -> TablePlan:
    """The plan for one table over ``windows`` (from :func:`select_windows`, non-empty).
    ``window_prefix(seq)`` gives a window folder's key prefix (with a trailing ``/``).
    ``keyless``: the table has no key (its changes are appended, see the merge job).
    ``since_lsn``: the table was copied at this consistent point (a resync): changes and
    truncates committed before it are in the copy already. ``until_lsn``: a replay to that
    point (:mod:`.point`): truncates committed after it are left out, and the last window
    is cut there unless it ends at or before it."""
    name = f"{schema}.{table}"
    if not key_columns and not keyless:
        raise NoMergeKey(
            f"table {name} has no primary key or replica identity index: the merge cannot "
            "match its changes to rows",
            hint="add a primary key, or give the key columns (--key schema.table=col1,col2)",
        )
    versions: list[VersionInput] = []
    truncate_at = None
    truncate_time = None
    truncates = 0
    key_moves = 0
    for m in windows:
        base = window_prefix(m.window_seq)
        for t in m.tables:
            if t["schema"] != schema or t["table"] != table:
                continue
            key_moves += int(t.get(KEY_MOVES_FIELD, 0))
            for rv in t["relation_versions"]:
                cols = tuple(rv["columns"])
                _check_key_covered((schema, table), m.window_seq, rv, key_columns)
                versions.append(VersionInput(
                    window_seq=m.window_seq,
                    version=int(rv["version"]),
                    columns=cols,
                    replica_identity=rv.get("replica_identity", "d"),
                    old_columns=tuple(rv.get("old_columns", ())),
                    parts=tuple(part_ref(base, p) for p in rv.get("parts", ())),  # packed: a byte range
                    rows=int(rv.get("rows", 0)),
                    missing_values=rv.get("missing_values"),
                    bytes=int(rv.get("bytes") or sum(int(p.get("bytes", 0)) for p in rv.get("parts", ()))),
                ))
        for tr in m.truncates:
            if truncates_table(tr, schema, table):
                point = (int(LSN.parse(tr["commit_lsn"])), int(tr["seq"]))
                if since_lsn is not None and point[0] < since_lsn:
                    continue
                if until_lsn is not None and point[0] > until_lsn:
                    continue
                truncates += 1
                if truncate_at is None or point > truncate_at:
                    truncate_at, truncate_time = point, tr.get("commit_time")
    return TablePlan(
        schema=schema,
        table=table,
        key_columns=tuple(key_columns),
        first_window=windows[0].window_seq,
        last_window=windows[-1].window_seq,
        start_lsn=windows[0].start_lsn,
        end_lsn=windows[-1].end_lsn,
        versions=tuple(versions),
        truncate_at=truncate_at,
        truncate_time=truncate_time,
        truncates=truncates,
        key_moves=key_moves,
        since_lsn=since_lsn,
        until_lsn=until_lsn,
        cut_window=(windows[-1].window_seq if until_lsn is not None and windows[-1].end > until_lsn + 1 else None),
    )


def _check_key_covered(table: tuple[str, str], seq: int, rv: dict, key_columns: Sequence[str]) -> None:
    name = f"{table[0]}.{table[1]}"
    if rv.get("replica_identity") == "f":
        return
    flagged = {c["name"] for c in rv["columns"] if c.get("key")}
    missing = [k for k in key_columns if k not in flagged]
    if missing:
        raise KeyNotCovered(
            f"table {name}, window {seq}: the replica identity ({sorted(flagged) or 'nothing'}) "
            f"does not include the merge key column(s) {missing}: deletes and key changes "
            "could not be matched",
            hint=f"ALTER TABLE {quote_qualified(*table)} REPLICA IDENTITY FULL, or make the key the replica "
                 "identity",
        )












def missing_values(plan: TablePlan) -> dict[str, Any]:
    """``{column: pyarrow scalar in its Delta type}``: what rows older than an ``ADD COLUMN
    … DEFAULT`` read, from the batch's relation versions (the drain records them)."""
    from airflow_pgcdc.changes.rows import decode_missing_values
    from airflow_pgcdc.lake.types import to_delta_batch

    out: dict[str, Any] = {}
    for v in plan.versions:
        if v.missing_values:
            batch = to_delta_batch(decode_missing_values(v.missing_values))
            for col_name, column in zip(batch.schema.names, batch.columns, strict=True):
                out.setdefault(col_name, column[0])
    return out


def version_fills(plan: TablePlan) -> dict[tuple[int, int], dict[str, Any]]:
    """``{(window_seq, version): {column: pyarrow scalar}}``: the batch's relation versions
    that come before an ``ADD COLUMN … DEFAULT`` of the batch and lack that column. A row
    they changed existed when the column was added, so PostgreSQL reads the default there
    (``attmissingval``), not NULL: its change row, which has no such column, must carry the
    default into the merge (versions after a later ``DROP COLUMN`` are left NULL)."""
    first_with: dict[str, int] = {}
    for i, v in enumerate(plan.versions):
        for c in v.columns:
            first_with.setdefault(c["name"], i)
    values = missing_values(plan)
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for i, v in enumerate(plan.versions):
        names = {c["name"] for c in v.columns}
        fill = {col: value for col, value in values.items()
                if col not in names and first_with.get(col, -1) > i and value.is_valid}
        if fill and v.parts:
            out[(v.window_seq, v.version)] = fill
    return out
