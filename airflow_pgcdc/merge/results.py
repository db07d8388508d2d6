"""The merge job's result: whole in the store, summed up for Airflow's XCom.

A job over many tables has a result too big for an XCom or a log line (10,000 tables:
megabytes, most of it tables with no change). The job writes its whole result, every
table's outcome, to the store (``{slot}/merge-results/{run_id}.json``, see
docs/store-format.md; kept :data:`RESULT_DAYS` days, older ones removed by the next job) and
names that document in its result as ``detail``. The merge operator pushes
:func:`summary` as its XCom: the job's fields, the count of tables per action, the rows,
and the tables themselves when there are at most :data:`XCOM_TABLES` of them; past that,
the failed tables first and then the ones that got a commit, up to that many, with
``tables_omitted`` saying how many are left out (tables with no change first). A consumer
that needs every table calls :func:`whole`, which reads the document when tables were
left out."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow_pgcdc.errors import PgcdcError
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout, run_id_time

log = logging.getLogger(__name__)

RESULT_DAYS = 7
"""Days a merge result document is kept in the store (older ones: removed by the next job)."""

XCOM_TABLES = 100
"""Tables a summary lists at most (:func:`summary`'s default)."""

FAILED_NAMED = 20
"""Failed tables a message names (the job's ``TablesFailed``, the operator's); the rest are
counted, every one being in the result."""

QUIET_ACTIONS = frozenset({"up-to-date", "no-changes"})
"""Table actions of a job that did nothing to the table: the first left out of a summary."""

FORMAT = 1
KIND = "merge-result"
_ROWS = ("bootstrap_rows", "change_rows", "merged_rows")


class ResultDetailMissing(PgcdcError):
    """A summed-up merge result left tables out and its whole result cannot be read."""


def write_detail(client: Any, layout: Layout, slot: str, run_id: str, result: Mapping[str, Any], *,
                 now: datetime | None = None) -> str | None:
    """Write ``result`` (a :class:`~.options.MergeResult`'s dict) as the job's result document
    and remove those older than :data:`RESULT_DAYS`; its ``s3://`` URL, or ``None`` when the
    write failed (logged: the tables' commits stand, a lost record must not fail them)."""
    key = layout.merge_result(slot, run_id)
    try:
        _put_document(client, layout.bucket, key, result)
    except s3store.StoreError as e:
        log.warning("slot %s: the merge result was not recorded in the store (%s); the tables' outcomes "
                    "are in the job's output only", slot, e)
        return None
    try:
        prune(client, layout, slot, now=now)
    except s3store.StoreError as e:
        log.warning("slot %s: old merge results not removed (%s); the next job tries again", slot, e)
    return layout.url(key)


def rewrite_detail(client: Any, result: Mapping[str, Any]) -> None:
    """Write ``result`` over its own ``detail`` document (a composed job, a rebuild, whose
    result grew after the merge recorded it); logged and left when the write fails."""
    detail = result.get("detail")
    if not detail:
        return
    loc = s3store.S3Location.parse(detail)
    try:
        _put_document(client, loc.bucket, loc.prefix, result)
    except s3store.StoreError as e:
        log.warning("the merge result %s was not brought up to date (%s)", detail, e)


def _put_document(client: Any, bucket: str, key: str, result: Mapping[str, Any]) -> None:
    body = json.dumps({"format": FORMAT, "kind": KIND, **result}, default=str, separators=(",", ":"))
    s3store.put_bytes(client, bucket, key, body, content_type="application/json")


def _read_document(client: Any, bucket: str, key: str, where: str) -> dict[str, Any]:
    """The result document at ``key`` without its ``format`` and ``kind``;
    :class:`ResultDetailMissing` (naming ``where``) if it is not a merge result we read."""
    doc = s3store.get_json(client, bucket, key)
    if not isinstance(doc, dict) or doc.get("kind") != KIND or doc.get("format") != FORMAT:
        raise ResultDetailMissing(f"{where}: {s3store.S3Location(bucket, key).url} is not a merge result of "
                                  f"format {FORMAT}")
    return {k: v for k, v in doc.items() if k not in ("format", "kind")}


def _client(call: str, s3: Any) -> Any:
    settings, client = s3store.s3_argument(call, s3, {})
    return client or s3store.make_s3_client(settings)


def prune(client: Any, layout: Layout, slot: str, *, now: datetime | None = None,
          days: float = RESULT_DAYS) -> int:
    """Remove the result documents of jobs that started more than ``days`` ago (their run
    id starts with the UTC time, ``20250131T235959Z-…``); names not of that form are left."""
    cutoff = ((now or datetime.now(UTC)) - timedelta(days=days)).astimezone(UTC)
    prefix = layout.merge_results_prefix(slot)
    old = []
    for key in s3store.list_keys(client, layout.bucket, prefix):
        started = run_id_time(key[len(prefix):])
        if started is not None and started < cutoff:
            old.append(key)
    return s3store.delete_keys(client, layout.bucket, old, what="old merge results") if old else 0


def summary(result: Mapping[str, Any], limit: int = XCOM_TABLES) -> dict[str, Any]:
    """``result`` (the job's whole result, as printed) summed up: its fields but ``tables``,
    plus ``actions`` (tables per action), ``rows`` (``bootstrap_rows``, ``change_rows``,
    ``merged_rows`` summed), ``tables_total``, ``tables`` (every table when there are at most
    ``limit``; else the failed ones, then those the job did something to, at most ``limit``)
    and ``tables_omitted`` (how many are not listed: read them with :func:`whole`)."""
    if limit < 0:
        raise ValueError(f"limit must be 0 or more, got {limit}")
    tables = list(result.get("tables") or ())
    out = {k: v for k, v in result.items() if k != "tables"}
    out["actions"] = dict(sorted(Counter(str(t.get("action")) for t in tables).items()))
    out["rows"] = {k: sum(int(t.get(k) or 0) for t in tables) for k in _ROWS}
    out["tables_total"] = len(tables)
    if len(tables) <= limit:
        listed = tables
    else:
        failed = [t for t in tables if t.get("action") == "failed"]
        acted = [t for t in tables if t.get("action") not in QUIET_ACTIONS and t.get("action") != "failed"]
        listed = (failed + acted)[:limit]
    out["tables"] = listed
    out["tables_omitted"] = len(tables) - len(listed)
    return out


def whole(value: Mapping[str, Any], s3: Any = None) -> dict[str, Any]:
    """The whole merge result from ``value``, a job's result or its :func:`summary` (the
    merge operator's XCom): ``value`` itself when it lists every table, else the document
    its ``detail`` names, read with ``s3`` (an :class:`~airflow_pgcdc.store.s3.S3Settings`
    or a client; default: the environment's). :class:`ResultDetailMissing` if it cannot."""
    if not value.get("tables_omitted"):
        return dict(value)
    detail = value.get("detail")
    where = (f"the merge result of slot {value.get('slot')} lists {len(value.get('tables') or ())} of "
             f"{value.get('tables_total')} tables")
    if not detail:
        raise ResultDetailMissing(f"{where} and names no whole result in the store (it was not recorded)",
                                  hint="rerun the merge: a rerun merges nothing twice and records its result")
    loc = s3store.S3Location.parse(detail)
    try:
        return _read_document(_client("whole", s3), loc.bucket, loc.prefix, where)
    except s3store.ObjectNotFound:
        raise ResultDetailMissing(f"{where}; its whole result {detail} is gone (kept {RESULT_DAYS} days)",
                                  hint="rerun the merge: a rerun merges nothing twice") from None


def latest(store: str, slot: str, s3: Any = None) -> dict[str, Any] | None:
    """The whole result of the newest merge job of ``slot`` recorded in the store at
    ``store`` (``None`` when none is): what a task after a job submitted elsewhere
    (Databricks, EMR, Kubernetes: :mod:`.platforms`) reads, the job's stdout being in that
    platform's logs."""
    client = _client("latest", s3)
    layout = Layout.parse(store)
    prefix = layout.merge_results_prefix(slot)
    keys = sorted(k for k in s3store.list_keys(client, layout.bucket, prefix) if run_id_time(k[len(prefix):]))
    if not keys:
        return None
    return _read_document(client, layout.bucket, keys[-1], f"the newest merge result of slot {slot}")
