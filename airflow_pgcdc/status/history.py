"""``pgcdc status --history DAYS [--plot FILE.png]``: the slot's windows over the last days,
one row each, from what the store keeps: the window manifests (rows, bytes, the drain's
times, the window's first and last commit times) and the merge jobs' result documents (kept
7 days: which job merged a window, and when it ended).

Per window: ``stored_lag_seconds`` (the drain's end minus the window's first commit: how old
its oldest change was once stored) and ``lag_seconds`` (the end of the first merge job that
merged the window minus that first commit: how old its oldest change was once in Delta;
None while no recorded job merged it). A window written before commit times were recorded
counts from its drain's start (a lower bound)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout, run_id_time
from airflow_pgcdc.store.slot import SlotStore
from airflow_pgcdc.store.window import COMMIT_TIMES_FIELD, window_folders

__all__ = ["plot_history", "window_history"]


def _time(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text)) if text else None
    except ValueError:
        return None


def _merge_jobs(client: Any, layout: Layout, slot: str, since: datetime) -> list[tuple[datetime, float, int]]:
    """``(ended, seconds, newest window merged)`` of each recorded merge job that started
    after ``since``, oldest first."""
    prefix = layout.merge_results_prefix(slot)
    jobs = []
    for key in sorted(s3store.list_keys(client, layout.bucket, prefix)):
        started = run_id_time(key[len(prefix):])
        if started is None or started < since:
            continue
        doc = s3store.get_json(client, layout.bucket, key)
        if not isinstance(doc, dict):
            continue  # not a merge result document: nothing to learn from it
        windows = [t.get("last_window") for t in doc.get("tables", ()) if t.get("action") != "failed"]
        newest = max((w for w in windows if isinstance(w, int)), default=-1)
        seconds = float(doc.get("seconds") or 0.0)
        jobs.append((started + timedelta(seconds=seconds), seconds, newest))
    return jobs


def window_history(client: Any, store: str, slot: str, *, days: float = 7.0,
                   now: datetime | None = None) -> list[dict[str, Any]]:
    """The committed windows of ``slot`` that ended in the last ``days``, oldest first."""
    layout = Layout.parse(store)
    now = now or datetime.now(UTC)
    since = now - timedelta(days=days)
    folder = SlotStore(client, layout, slot)
    rows: list[dict[str, Any]] = []
    for seq in reversed(window_folders(client, layout, slot)):  # newest back, until older than `days`
        if folder.window_document(seq) is None:
            continue  # not committed (being written, or a crashed drain's)
        w = folder.window(seq)
        t = w.timings or {}
        started, finished = _time(t.get("started_at")), _time(t.get("finished_at"))
        if finished is not None and finished < since:
            break
        times = w.extra.get(COMMIT_TIMES_FIELD) or {}
        first = _time(times.get("first")) or started
        drain = (float(t["receive_seconds"]) + float(t.get("finish_seconds") or 0.0)
                 if t.get("receive_seconds") is not None else
                 ((finished - started).total_seconds() if started and finished else None))
        rows.append({
            "window_seq": seq, "finished_at": finished.isoformat() if finished else None, "rows": w.rows,
            "bytes": w.bytes, "transactions": w.transactions, "drain_seconds": drain,
            "first_commit": first.isoformat() if first else None,
            "last_commit": times.get("last"),
            "stored_lag_seconds": (finished - first).total_seconds() if finished and first else None,
            "merged_at": None, "merge_seconds": None, "lag_seconds": None,
        })
    rows.reverse()
    if rows:
        jobs = _merge_jobs(client, layout, slot, since - timedelta(days=1))
        for r in rows:
            job = next((j for j in jobs if j[2] >= r["window_seq"]), None)
            if job is not None:
                r["merged_at"], r["merge_seconds"] = job[0].isoformat(), job[1]
                first = _time(r["first_commit"])
                r["lag_seconds"] = max((job[0] - first).total_seconds(), 0.0) if first else None
    return rows


def plot_history(rows: Sequence[dict[str, Any]], path: str, *, title: str = "") -> None:
    """A PNG of ``rows`` (:func:`window_history`): the lag (stored, and in Delta), rows per
    window, and the drain's and merge's seconds, over the windows' end times. Needs
    matplotlib (the ``bench`` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from airflow_pgcdc.errors import HintedError

        raise HintedError("--plot needs matplotlib", hint="pip install matplotlib (the bench extra)") from None
    when = [_time(r["finished_at"]) for r in rows]
    fig, (lag, size, secs) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    lag.plot(when, [r["lag_seconds"] for r in rows], "o-", label="oldest change, once in Delta")
    lag.plot(when, [r["stored_lag_seconds"] for r in rows], ".--", label="oldest change, once stored")
    lag.set_ylabel("lag (s)")
    lag.legend(loc="upper left")
    # bars narrower than the closest two windows (a width is in days on a date axis): windows
    # 30 s apart drew 3-minute bars over each other
    gaps = [(b - a).total_seconds() for a, b in zip(sorted(when), sorted(when)[1:], strict=False) if b > a]
    width = min(0.6 * min(gaps), 180.0) if gaps else 180.0
    size.bar(when, [r["rows"] for r in rows], width=max(width, 1.0) / 86400.0)
    size.set_ylabel("change rows per window")
    secs.plot(when, [r["drain_seconds"] for r in rows], "o-", label="drain")
    secs.plot(when, [r["merge_seconds"] for r in rows], "s-", label="merge job")
    secs.set_ylabel("seconds")
    secs.legend(loc="upper left")
    fig.suptitle(title or "pgcdc: windows")
    fig.autofmt_xdate()
    fig.savefig(path, dpi=100)
    plt.close(fig)
