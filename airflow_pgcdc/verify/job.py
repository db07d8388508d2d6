"""``pgcdc verify``: does a Delta table hold exactly what its PostgreSQL table holds?

Both sides become Arrow with the type map's types (``docs/types.md``):

* PostgreSQL: the table is read like the snapshot reads it (``describe_table`` →
  ``table_converter`` → ``COPY (SELECT …) TO STDOUT (FORMAT csv)`` →
  :class:`~airflow_pgcdc.typemap.decode.copy_text.SnapshotDecoder`), in one ``REPEATABLE
  READ READ ONLY`` transaction, with the session settings the decoder relies on;
* Delta: the table at ``{delta_url}/{schema}.{table}`` (the store's segment encoding),
  read with delta-rs, each column brought back to the type map's type by
  :func:`airflow_pgcdc.lake.types.from_delta_array` (``time`` is int64 µs in
  Delta); any other type difference is reported, not cast.

Rows are matched on the key (primary key or replica identity index, or the columns
given by the user); a table without one and no key given is compared as a multiset: rows
are matched on every column, equal rows by count (the k-th copy of a row on one side
with the k-th on the other). Values are compared exactly: fixed-width types (ints, floats,
decimals, dates, times, timestamps, bool) by their raw Arrow values, which both sides
hold in the same type (equal raw values ⟺ equal PostgreSQL text; every NaN counts as
PostgreSQL's one NaN), every other type through PostgreSQL's own text output of the
mapped value (:func:`~airflow_pgcdc.typemap.array_to_pg_text`): ``1.50`` is not
``1.5`` in an unconstrained numeric, ``infinity`` is not the largest timestamp, NULL is
not ``''``, ``{1,NULL}`` is not ``{1}``. Per row only a 16-byte BLAKE2b digest of the
values and the rendered key are kept (memory: both tables in Arrow plus about 60 bytes
a row); keys are matched with an Arrow hash join, and only the first ``max_diffs``
differences of each kind are rendered, column by column, as PostgreSQL text.

The result says: row counts, keys only in PostgreSQL, keys only in Delta, keys whose
rows differ (with the columns and both values), keys that occur more than once on a
side, source columns missing from Delta or stored with another type (differences), and
columns only in Delta (a note: a column dropped in PostgreSQL stays in Delta).

A stored generated column is compared when the Delta table has it (a PostgreSQL 18
publication with ``publish_generated_columns = stored`` or a column list naming it streams
it, and the snapshot copies it), and left out otherwise, as the snapshot and the stream
leave it out (before PostgreSQL 18 always; a virtual column always).

The library never imports Airflow or Spark.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from airflow_pgcdc.errors import redact
from airflow_pgcdc.lake.types import DeltaTypeMismatch
from airflow_pgcdc.verify.compare import Comparer, compare_tables
from airflow_pgcdc.verify.delta import (
    _HINT_DELTA,
    _delta_batches,
    _delta_source,
    _last_commit,
    _scrub,
    _storage_options,
    delta_table_location,
    open_delta_table,
)
from airflow_pgcdc.verify.delta import (
    check_metadata as _check_metadata,
)
from airflow_pgcdc.verify.options import VerifyOptions
from airflow_pgcdc.verify.postgres import MULTISET, _read_postgres, resolve_key
from airflow_pgcdc.verify.results import (
    ChangedRow,
    ColumnDiff,
    Comparison,
    DeltaReadError,
    DeltaTableNotFound,
    DuplicateKey,
    KeyColumnError,
    NoKey,
    SourceTableNotFound,
    TypeMismatch,
    VerifyError,
    VerifyResult,
)

__all__ = [
    "MULTISET",
    "ChangedRow",
    "ColumnDiff",
    "Comparer",
    "Comparison",
    "DeltaReadError",
    "DeltaTableNotFound",
    "DuplicateKey",
    "KeyColumnError",
    "NoKey",
    "SourceTableNotFound",
    "TypeMismatch",
    "VerifyError",
    "VerifyResult",
    "compare_tables",
    "delta_table_location",
    "open_delta_table",
    "resolve_key",
    "verify_table",
]


def verify_table(
    dsn: str,
    delta: str | None = None,
    schema: str | None = None,
    table: str | None = None,
    *,
    key: Sequence[str] | None = None,
    s3: Any = None,
    progress: Callable[[str], None] | None = None,
    options: VerifyOptions | Mapping[str, Any] | None = None,
    **old: Any,
) -> VerifyResult:
    """Compare PostgreSQL table ``schema.table`` (``dsn``) with its Delta table under
    ``delta`` (``s3://bucket/lake`` or a local path; ``delta_url``: its 0.1 name, warns),
    matching rows on ``key`` (default: the replica identity index or primary key). Returns a
    :class:`VerifyResult`; raises a :class:`VerifyError` subclass (with a ``hint``) when it
    cannot compare. ``progress`` is called with a short message at each phase. ``s3``: how
    to reach an ``s3://`` root (S3Settings, or a client made by ``make_s3_client``; default:
    the environment's settings). ``storage_options`` (delta-rs' own options, the 0.1 way to
    say it) is accepted for one release with a :class:`DeprecationWarning`. ``options``: a
    :class:`~.options.VerifyOptions` (or a mapping of its fields), or its fields given as
    keywords: ``max_diffs``, ``check_metadata``, ``privacy``. ``check_metadata``:
    also check the Delta table's CDC metadata columns (``--metadata-columns``; the comparison
    itself leaves them out): :attr:`VerifyResult.metadata`, :attr:`VerifyResult.metadata_ok`.
    ``privacy``: the pipeline's column rules (a :class:`~airflow_pgcdc.store.privacy.SlotPrivacy`,
    ``resolve_privacy(client, layout, slot)``): PostgreSQL's rows are compared as the lake
    holds them (excluded columns not read, hashed and masked ones transformed)."""
    import warnings

    from airflow_pgcdc.options import renamed_field

    delta_url = renamed_field("verify_table", old, "delta", delta, "delta_url",
                              required="the Delta root (s3://bucket/lake)")
    storage_options = old.pop("storage_options", None)
    o = VerifyOptions.of(options, **old)
    max_diffs, check_metadata, privacy = o.max_diffs, o.check_metadata, o.privacy
    if storage_options is not None:
        if s3 is not None:
            raise TypeError("verify_table() got both 's3' and the old 'storage_options': give 's3' only")
        warnings.warn("verify_table(storage_options=...) is now verify_table(s3=...) (S3Settings, or a client); "
                      "storage_options goes in the next release", DeprecationWarning, stacklevel=2)
    elif s3 is not None:
        from airflow_pgcdc.store import s3 as s3store

        settings, _ = s3store.s3_argument("verify_table", s3, {}, needs_settings=True)
        storage_options = s3store.delta_storage_options(settings)
    if schema is None or table is None:
        raise TypeError("verify_table() needs the table: give schema and table")
    say = progress or (lambda _m: None)

    dt, location = open_delta_table(delta_url, schema, table, storage_options=storage_options)
    try:
        delta_schema = pa.schema(dt.schema().to_arrow())
        version = dt.version()
    except Exception as e:
        raise DeltaReadError(f"cannot read the Delta table at {location}: {type(e).__name__}: {e}") from None
    say(f"reading {schema}.{table} from PostgreSQL ({redact(dsn)})")
    comparer, key_source, lsn = _read_postgres(
        dsn, schema, table, key, delta_schema, {"max_diffs": max_diffs}, privacy
    )
    say(f"read {comparer.pg.rows} rows; reading {location} (version {version})")
    try:
        source = _delta_source(dt, comparer.delta_columns)
        for batch in _delta_batches(source, comparer.delta_columns):
            comparer.add_delta(batch)
    except DeltaTypeMismatch as e:  # a data file that does not hold the table's types
        raise DeltaReadError(f"cannot read the Delta table at {location}: {e}") from None
    except OSError as e:
        raise DeltaReadError(
            f"cannot read the Delta table at {location}: "
            f"{_scrub(str(e), _storage_options(location, storage_options))}",
            hint=_HINT_DELTA,
        ) from None
    say(f"read {comparer.delta.rows} rows; comparing")
    metadata = None
    if check_metadata:  # the source's columns are compared above; these are the merge's own
        say("checking the CDC metadata columns")
        metadata = _check_metadata(dt, location)
    return VerifyResult(
        table=f"{schema}.{table}",
        postgres=redact(dsn),
        delta_url=location,
        key_source=key_source,
        comparison=comparer.result(),
        postgres_lsn=lsn,
        delta_version=version,
        delta_last_commit=_last_commit(dt),
        metadata=metadata,
    )

