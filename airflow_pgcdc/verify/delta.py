"""The Delta side of ``pgcdc verify``: open the table at ``{delta_url}/{schema}.{table}``
with delta-rs, read it in batches of the columns compared, and say what its last commit
was. Storage secrets never reach a message."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from airflow_pgcdc.changes.columns import DELETED_AT
from airflow_pgcdc.errors import is_secret_name, redact
from airflow_pgcdc.verify.results import DeltaReadError, DeltaTableNotFound

__all__ = [
    "delta_table_location",
    "open_delta_table",
]

DELTA_BATCH_ROWS = 65_536


def _delta_batches(delta: Any, names: list[str]) -> Iterator[pa.RecordBatch]:
    """The live rows' ``names`` columns: a row the merge kept as deleted (soft deletes, its
    ``_pgcdc_deleted_at`` set) is not the source's."""
    import pyarrow.compute as pc

    if isinstance(delta, pa.Table):
        if DELETED_AT in delta.column_names:
            delta = delta.filter(pc.field(DELETED_AT).is_null())
        yield from delta.select(names).to_batches()
    elif isinstance(delta, pa.RecordBatchReader):
        yield from delta  # _delta_query's: live rows only
    else:  # a pyarrow dataset
        live = pc.field(DELETED_AT).is_null() if DELETED_AT in delta.schema.names else None
        yield from delta.to_batches(columns=names, filter=live, batch_size=DELTA_BATCH_ROWS)


def delta_table_location(delta_url: str, schema: str, table: str, *,
                         storage_options: Mapping[str, str] | None = None) -> str:
    """``{delta_url}/{schema}.{table}``: where the merge keeps the table (one rule, the
    merge's: :func:`airflow_pgcdc.lake.inspect.table_url`; with ``storage_options`` a table
    an earlier version left at its legacy location is found there)."""
    from airflow_pgcdc.lake.tables import delta_table_url

    if storage_options is None:
        return delta_table_url(delta_url, schema, table)
    from airflow_pgcdc.lake.inspect import table_url

    return table_url(delta_url, schema, table, dict(storage_options))


def _storage_options(url: str, storage_options: Mapping[str, str] | None) -> dict[str, str] | None:
    if storage_options is not None:
        return dict(storage_options)
    if url.startswith("s3://"):
        from airflow_pgcdc.store.s3 import S3Location, delta_storage_options

        S3Location.parse(url)  # a clear error for a malformed URL
        return delta_storage_options()
    return None


def _scrub(text: str, options: Mapping[str, str] | None) -> str:
    return redact(text, [v for k, v in (options or {}).items() if is_secret_name(k)])


_HINT_DELTA = (
    "--delta is the Delta root (e.g. s3://bucket/lake), the table's Delta table is at "
    "<root>/<schema>.<table>; S3 endpoint and keys come from AWS_ENDPOINT_URL, "
    "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY"
)


def open_delta_table(
    delta_url: str, schema: str, table: str, *, storage_options: Mapping[str, str] | None = None
):
    """``(DeltaTable, location)`` of ``schema.table``'s Delta table under ``delta_url``
    (S3 options from the environment for ``s3://`` URLs unless given). Raises
    :class:`DeltaTableNotFound` or :class:`DeltaReadError`."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    options = _storage_options(delta_url, storage_options)
    location = delta_table_location(delta_url, schema, table, storage_options=options)
    try:
        return DeltaTable(location, storage_options=options), location
    except TableNotFoundError:
        raise DeltaTableNotFound(
            f"no Delta table at {location} (for {schema}.{table})",
            hint=_HINT_DELTA + "; has the merge run for this table?",
        ) from None
    except Exception as e:  # storage errors: wrong endpoint, keys, bucket
        msg = _scrub(str(e).strip().splitlines()[0] if str(e).strip() else "", options)
        raise DeltaReadError(
            f"cannot open the Delta table at {location}: {type(e).__name__}: {msg}", hint=_HINT_DELTA
        ) from None


def _delta_source(dt, names: list[str]):
    """A dataset of the Delta table, or (tables with deletion vectors or column mapping,
    which pyarrow datasets read wrong: column mapping gives NULL in every column, without
    an error) a RecordBatchReader from delta-rs' SQL engine, which reads them right."""
    from deltalake.exceptions import DeltaProtocolError

    from airflow_pgcdc.lake.inspect import unreadable_features

    if unreadable_features(dt):
        return _delta_query(dt, names)
    try:
        return dt.to_pyarrow_dataset()
    except DeltaProtocolError:
        return _delta_query(dt, names)


def _delta_query(dt, names: list[str]) -> pa.RecordBatchReader:
    from deltalake import QueryBuilder

    from airflow_pgcdc.lake.sql import quote_ident

    cols = ", ".join(quote_ident(n, "delta-rs") for n in names) if names else "1"
    live = (f" WHERE {quote_ident(DELETED_AT, 'delta-rs')} IS NULL"
            if DELETED_AT in dt.schema().to_arrow().names else "")
    reader = QueryBuilder().register("t", dt).execute(f"SELECT {cols} FROM t{live}")
    return pa.RecordBatchReader.from_stream(reader)


def check_metadata(dt, location: str) -> dict[str, Any]:
    """The CDC metadata columns of the Delta table ``dt`` (``pgcdc merge --metadata-columns``)
    checked on every row, through delta-rs' SQL engine: ``rows``; ``without`` (all four NULL:
    rows merged before the columns were added, unchanged since); ``invalid``: a row whose
    ``_pgcdc_op`` is not ``R``/``I``/``U`` (``D`` only on a row marked deleted), whose LSN or
    merge time is missing, which says ``I``/``U``/``D`` without a commit time or ``R`` with one;
    ``newest_commit_lsn``. :class:`DeltaReadError` when the table has no such columns."""
    from deltalake import QueryBuilder

    from airflow_pgcdc.changes.columns import COMMIT_LSN, COMMIT_TS, MERGED_AT, OP
    from airflow_pgcdc.lake.sql import quote_ident

    names = set(dt.schema().to_arrow().names)
    missing = [c for c in (OP, COMMIT_LSN, COMMIT_TS, MERGED_AT) if c not in names]
    if missing:
        raise DeltaReadError(f"the Delta table at {location} has no metadata column(s) {missing}",
                             hint="they come with pgcdc merge --metadata-columns; leave --check-metadata out")
    op, lsn, ts, at = (quote_ident(c, "delta-rs") for c in (OP, COMMIT_LSN, COMMIT_TS, MERGED_AT))
    marked = f"{quote_ident(DELETED_AT, 'delta-rs')} IS NOT NULL" if DELETED_AT in names else "FALSE"
    empty = f"{op} IS NULL AND {lsn} IS NULL AND {ts} IS NULL AND {at} IS NULL"
    bad = (f"{op} IS NULL OR NOT ({op} IN ('R', 'I', 'U') OR ({op} = 'D' AND {marked})) OR {lsn} IS NULL "
           f"OR {at} IS NULL OR ({op} IN ('I', 'U', 'D') AND {ts} IS NULL) OR ({op} = 'R' AND {ts} IS NOT NULL)")
    query = (f"SELECT count(*) AS n, sum(CASE WHEN {empty} THEN 1 ELSE 0 END) AS without, "
             f"sum(CASE WHEN NOT ({empty}) AND ({bad}) THEN 1 ELSE 0 END) AS invalid, max({lsn}) AS newest FROM t")
    row = pa.table(QueryBuilder().register("t", dt).execute(query).read_all()).to_pylist()[0]
    newest = row["newest"]
    return {"rows": int(row["n"] or 0), "without": int(row["without"] or 0), "invalid": int(row["invalid"] or 0),
            "newest_commit_lsn": None if newest is None else f"{int(newest) >> 32:X}/{int(newest) & 0xFFFFFFFF:X}"}


_COMMIT_STANDARD = {
    "operationParameters", "operationMetrics", "engineInfo", "clientVersion", "readVersion",
    "isBlindAppend", "isolationLevel", "txnId",
}


def _last_commit(dt) -> dict[str, Any]:
    try:
        history = dt.history(1)
    except Exception:
        return {}
    if not history:
        return {}
    info = {k: v for k, v in history[0].items() if k not in _COMMIT_STANDARD}
    ts = info.get("timestamp")
    if isinstance(ts, int):
        info["timestamp"] = datetime.fromtimestamp(ts / 1000, UTC).isoformat()
    return info

