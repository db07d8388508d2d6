"""Replay to a point: ``--until-lsn`` / ``--until-time`` on ``pgcdc merge`` and ``pgcdc rebuild``.

A table merged *until* a point P (an LSN) holds every change committed at or before P and
none after: the table as the source was at that moment (an audit, or the state before a bad
deploy, which a rebuild swaps in). A time T becomes the LSN just before the first commit (in
commit order) made after T, from the windows' ``commit_times`` and, in the window that holds
T, its rows' ``_pgcdc_commit_ts``.

Windows are the store's unit and P usually falls inside one, window k. The merge applies
windows ``..k-1`` whole and window k's rows with ``_pgcdc_commit_lsn <= P`` (and its
truncates up to P), in ONE commit per table that carries two app transactions:

* the table's own, at version ``k-1`` (``deltars.NONE_MERGED`` when k is 0): the windows it
  holds whole;
* the cut's, ``{app}:until-w{k}`` at version P: "window k is in up to P".

Both are written by the same commit, so a crash leaves neither or both. The next merge,
until-merge or not, finds the cut of the window after the table's last whole one
(:func:`applied_until`) and applies that window's rows after P only: the pipeline catches
up from the point with nothing applied twice (a keyless table's appends included) and
nothing skipped. A cut of a window the table has since merged whole is never read again.

Refused, before anything is written: a point before the copy the pipeline started from,
a point past the windows the store holds (changes up to it may not be drained yet), a
table already past the point (:class:`PastThePoint`: rebuild it instead), history tables
(changelog, SCD2), and Delta's Spark engine (it commits one app transaction per commit).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from airflow_pgcdc.changes.columns import COMMIT_LSN, COMMIT_TS
from airflow_pgcdc.lake.inspect import app_version
from airflow_pgcdc.lake.tables import cut_app
from airflow_pgcdc.merge.errors import PointError
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.store.manifest import POINT_TIME
from airflow_pgcdc.store.window import COMMIT_TIMES_FIELD

log = logging.getLogger(__name__)

__all__ = [
    "Point",
    "applied_until",
    "before_point",
    "commit_lsn_span",
    "past_the_point",
    "parse_until_time",
    "resolve_point",
]

@dataclass(frozen=True)
class Point:
    """Replay until ``lsn`` (inclusive: commits at or before it); ``window``: the window
    that holds it (its rows after ``lsn`` are left out); ``asked``: what the user gave."""

    lsn: int
    window: int
    asked: str

    @property
    def text(self) -> str:
        return str(LSN(self.lsn))


def applied_until(dt, app: str, last_merged: int | None) -> int | None:
    """The LSN up to which the window after ``last_merged`` (the table's app transaction
    version) is already applied, when an until-merge cut it; else ``None``."""
    if dt is None:
        return None
    return app_version(dt, cut_app(app, 0 if last_merged is None else last_merged + 1))


def past_the_point(point: Point, since: int | None, last_merged: int | None, applied: int | None) -> str | None:
    """Why a table (its last whole window ``last_merged``, the point ``applied`` its next
    window is in up to, a resync's copy point ``since``) is past ``point``; ``"at"`` when it
    is exactly there; ``None`` when the merge can take it there."""
    last = -1 if last_merged is None else last_merged
    if since is not None and since > point.lsn:
        return f"it was copied again (a resync) at {LSN(since)}"
    if last >= point.window:
        return f"it holds window {last} whole, and the point is in window {point.window}"
    if last == point.window - 1 and applied is not None:
        if applied == point.lsn:
            return "at"
        if applied > point.lsn:
            return f"window {point.window} is in it up to {LSN(applied)}"
    return None


def parse_until_time(text: str) -> datetime:
    """An ISO 8601 time; without an offset it is UTC."""
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        raise PointError(f"--until-time {text!r} is not an ISO 8601 time",
                         hint="e.g. 2026-11-29T06:00:00+00:00 (without an offset: UTC)") from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t


def _window_rows_after(ctx, m, until: datetime) -> int | None:
    """The lowest commit LSN among window ``m``'s rows committed after ``until`` (its
    parts' ``_pgcdc_commit_lsn``/``_pgcdc_commit_ts``, and its truncates), or ``None``."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from airflow_pgcdc.store.packs import open_part, part_ref

    if m.window_seq in ctx.expired:
        raise PointError(f"the time is inside window {m.window_seq} of slot {ctx.slot}, whose parts pgcdc maintain "
                         "removed: its commits' times cannot be read", hint="ask for a later time, or an LSN")
    base = ctx.layout.window_prefix(ctx.slot, m.window_seq)
    lowest = None
    for t in m.tables:
        for rv in t.get("relation_versions", ()):
            for p in rv.get("parts", ()):
                with open_part(ctx.fs, part_ref(f"{ctx.layout.bucket}/{base}", p)) as f:
                    cols = pq.read_table(f, columns=[COMMIT_LSN, COMMIT_TS])
                later = cols.filter(pc.greater(cols[COMMIT_TS], _ts_scalar(until)))
                if later.num_rows:
                    low = pc.min(later[COMMIT_LSN]).as_py()
                    lowest = low if lowest is None else min(lowest, low)
    for tr in m.truncates:
        when = tr.get("commit_time")
        if when and datetime.fromisoformat(when) > until:
            low = int(LSN.parse(tr["commit_lsn"]))
            lowest = low if lowest is None else min(lowest, low)
    return lowest


def _ts_scalar(t: datetime):
    import pyarrow as pa

    return pa.scalar(t.astimezone(UTC), pa.timestamp("us", tz="UTC"))


def resolve_point(ctx, manifests: Sequence, snapshot, *, until_lsn: str | None = None,
                  until_time: str | datetime | None = None) -> Point | None:
    """The point of ``until_lsn`` or ``until_time`` over the slot's committed windows
    (``manifests``, every one), or ``None`` when neither is given. Raises :class:`PointError`."""
    if until_lsn is None and until_time is None:
        return None
    if until_lsn is not None and until_time is not None:
        raise PointError("give --until-lsn or --until-time, not both")
    windows = sorted(manifests, key=lambda m: m.window_seq)
    if not windows:
        raise PointError(f"slot {ctx.slot} has no committed window: there is nothing to replay to a point",
                         hint="drain first (pgcdc drain)")
    last = windows[-1]
    if until_lsn is not None:
        try:
            lsn = int(LSN.parse(until_lsn))
        except (ValueError, TypeError):
            raise PointError(f"--until-lsn {until_lsn!r} is not an LSN", hint="e.g. 0/16B3748") from None
        asked = f"LSN {until_lsn}"
    else:
        when = parse_until_time(until_time) if isinstance(until_time, str) else until_time
        asked = f"time {when.isoformat()}"
        copied = snapshot and (snapshot.extra.get(POINT_TIME) or snapshot.finished_at.isoformat())
        if copied and when < datetime.fromisoformat(copied):  # before any window is read
            raise PointError(
                f"{asked} is before slot {ctx.slot}'s copy (snapshot {snapshot.snapshot_id}, taken at {copied}): "
                "the copy may hold commits made after that time", hint=f"ask for a time at or after {copied}")
        lsn = None
        for m in windows:
            times = m.extra.get(COMMIT_TIMES_FIELD) or {}
            if times and datetime.fromisoformat(times["last"]) <= when:
                continue  # every commit of it (truncates' too) is at or before the time: no row read
            if times and datetime.fromisoformat(times["first"]) > when and m.first_commit_lsn:
                lsn = int(LSN.parse(m.first_commit_lsn)) - 1
                break
            first_after = _window_rows_after(ctx, m, when) if m.transactions else None
            if first_after is not None:
                lsn = first_after - 1
                break
        if lsn is None:
            last_time = (last.extra.get(COMMIT_TIMES_FIELD) or {}).get("last")
            raise PointError(
                f"no commit in slot {ctx.slot}'s windows is after {when.isoformat()} (they end at LSN {last.end_lsn}"
                + (f", last commit at {last_time}" if last_time else "") + "): changes committed up to that "
                "time may not be drained yet, so the state at that time is not known",
                hint="drain, then ask again; or merge without --until-time to apply every window")
    if snapshot is not None and lsn < int(LSN.parse(snapshot.consistent_point)):
        raise PointError(
            f"{asked} (LSN {LSN(max(lsn, 0))}) is before slot {ctx.slot}'s copy (snapshot {snapshot.snapshot_id} "
            f"at {snapshot.consistent_point}): the store holds no state of the tables before it",
            hint=f"ask for a point at or after {snapshot.consistent_point}")
    if lsn >= int(LSN.parse(last.end_lsn)):
        raise PointError(
            f"{asked} is at or past the end of slot {ctx.slot}'s windows (LSN {last.end_lsn}, window "
            f"{last.window_seq}): changes committed up to it may not be drained yet",
            hint="drain, then ask again; or merge without --until-lsn to apply every window")
    window = next(m.window_seq for m in windows if int(LSN.parse(m.start_lsn)) <= lsn < int(LSN.parse(m.end_lsn)))
    point = Point(lsn=lsn, window=window, asked=asked)
    log.info("replaying slot %s until %s: commits at or before LSN %s (window %d is cut there)",
             ctx.slot, asked, point.text, window)
    return point


def commit_lsn_span(ctx, parts: Sequence[str]) -> tuple[int, int] | None:
    """The lowest and highest ``_pgcdc_commit_lsn`` of the change parts ``parts`` (keys in the
    store's bucket), from their Parquet statistics; None when a row group has none."""
    import pyarrow.parquet as pq

    from airflow_pgcdc.store.packs import open_part

    low = high = None
    for key in parts:
        with open_part(ctx.fs, f"{ctx.layout.bucket}/{key}") as f:  # a packed part: its range
            meta = pq.read_metadata(f)
        idx = next((j for j in range(meta.num_columns) if meta.schema.column(j).path == COMMIT_LSN), -1)
        for i in range(meta.num_row_groups):
            stats = meta.row_group(i).column(idx).statistics if idx >= 0 else None
            if stats is None or not stats.has_min_max:
                return None
            low = stats.min if low is None else min(low, stats.min)
            high = stats.max if high is None else max(high, stats.max)
    return (low, high) if low is not None else None


def before_point(ctx, plan, windows: Sequence, until: int):
    """``plan`` without the relation versions whose every change committed after ``until``
    (so the table's columns are those it had at the point), read from the windows'
    ``first_commit_lsn`` and, in the window that spans the point, the parts' statistics."""
    import dataclasses

    by_seq = {m.window_seq: m for m in windows}
    keep = []
    for v in plan.versions:
        m = by_seq[v.window_seq]
        if m.first_commit_lsn and int(LSN.parse(m.first_commit_lsn)) > until:
            continue
        if v.parts and (span := commit_lsn_span(ctx, v.parts)) is not None and span[0] > until:
            continue
        keep.append(v)
    if len(keep) == len(plan.versions):
        return plan
    return dataclasses.replace(plan, versions=tuple(keep))
