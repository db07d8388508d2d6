"""A table's columns on their way into Delta: the Arrow fields of the snapshot's and the
windows' parts, their Delta types and table properties, new columns added to a Delta table
(filled with ``ADD COLUMN … DEFAULT`` values), type changes refused, and the merge key of a
table. Part of the merge job (:mod:`.job`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from airflow_pgcdc.changes.columns import COMMIT_LSN, OP, SEQ, UNCHANGED_TOAST
from airflow_pgcdc.changes.rows import (
    META_NAMES,
    OLD_PREFIX,
)
from airflow_pgcdc.lake.inspect import open_table
from airflow_pgcdc.lake.tables import CHANGE_DATA_FEED
from airflow_pgcdc.lake.types import to_delta_schema
from airflow_pgcdc.merge.compact import toastable
from airflow_pgcdc.merge.context import (
    META,
    JobContext,
)
from airflow_pgcdc.merge.errors import (
    IncompatibleSchemaChange,
    MergeError,
)
from airflow_pgcdc.merge.plan import (
    TablePlan,
    missing_values,  # noqa: F401 - it lived here: importable as before
)
from airflow_pgcdc.merge.sinks import deltars
from airflow_pgcdc.protocol.quoting import shell_qualified

log = logging.getLogger("airflow_pgcdc.merge.job")  # the job's one logger, whatever module logs


def merge_key_columns(name: str, entry, windows, keys) -> tuple[str, ...]:
    """The merge key; ``()`` for a table without one (appended, see :func:`append_only`)."""
    if name in keys:
        return tuple(keys[name])
    if entry is not None:
        return tuple(entry.key_columns)
    # a table that appeared after the snapshot: its replica identity, from the windows
    for m in windows:
        for t in m.tables:
            if f"{t['schema']}.{t['table']}" != name:
                continue
            for rv in t["relation_versions"]:
                if rv.get("replica_identity") in ("d", "i"):
                    return tuple(c["name"] for c in rv["columns"] if c.get("key"))
    return ()  # FULL or NOTHING: no key (appended)


def table_fields(schema: pa.Schema) -> list[pa.Field]:
    """A part's table columns: all but the change metadata (a table's own column may start
    with ``_pgcdc_``; only the metadata names are reserved, see changes.rows.META_NAMES)."""
    return [f for f in schema if f.name not in META_NAMES and not f.name.startswith(OLD_PREFIX)]


def _nullable_type(t: pa.DataType) -> pa.DataType:
    """``t`` with every nested field nullable (Spark hands back a NULL struct's children
    as NULLs, e.g. an interval's ``months``)."""
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_nullable_type(f.type)).with_nullable(True) for f in t])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_nullable_type(t.value_type)).with_nullable(True))
    return t


def delta_fields(fields: list[pa.Field]) -> list[pa.Field]:
    """Type-map fields → the Delta table's fields: Delta storage types, all nullable."""
    return [
        f.with_type(_nullable_type(f.type)).with_nullable(True)
        for f in to_delta_schema(pa.schema(fields))
    ]


def _unsafe_for_stats(t: pa.DataType) -> bool:
    """Whether a column of type ``t`` must be left out of the statistics: ``date`` and
    ``timestamp`` without time zone (delta-rs panics computing them for the ±infinity
    sentinels), and the types Delta's Spark engine refuses statistics for (bool, binary,
    arrays, maps), nested or not."""
    if pa.types.is_date32(t) or (pa.types.is_timestamp(t) and t.tz is None):
        return True
    if pa.types.is_boolean(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        return True
    if pa.types.is_struct(t):
        return any(_unsafe_for_stats(f.type) for f in t)
    return False


def table_configuration(fields: list[pa.Field]) -> dict[str, str] | None:
    """Delta table properties for a new table: statistics are collected for every column
    but those :func:`_unsafe_for_stats` names (docs/types.md), so both engines can write
    the table."""
    from airflow_pgcdc.lake.sql import quote_ident

    if not any(_unsafe_for_stats(f.type) for f in fields):
        return None
    safe = [quote_ident(f.name, "spark") for f in fields if not _unsafe_for_stats(f.type)]
    return {"delta.dataSkippingStatsColumns": ",".join(safe)}


def with_deletion_vectors(ctx: JobContext, name: str, url: str, dt):
    """``dt``, with deletion vectors turned on first when the job asks for them and the
    table (created earlier, or by delta-rs) has them off; returns the reloaded table."""
    from airflow_pgcdc.merge.sinks import deltaspark

    if not ctx.deletion_vectors or deltaspark.has_deletion_vectors(dt):
        return dt
    log.info("%s: turning deletion vectors on for %s (its readers must support the deletionVectors feature)",
             name, url)
    deltaspark.enable_deletion_vectors(ctx.spark, deltaspark.s3a(url))
    dt.update_incremental()
    return dt


def with_change_data_feed(ctx: JobContext, name: str, url: str, dt):
    """``dt``, with the change data feed turned on first when the job asks it for the table
    (``--change-data-feed``, ``--table-option``) and the table (created before, or without
    it) has it off; returns the reloaded table. Never turned off here: a table keeps the
    feed its readers follow (the property is the user's to unset)."""
    if dt is None or not ctx.wants_change_data_feed(name):
        return dt
    if str((dt.metadata().configuration or {}).get(CHANGE_DATA_FEED, "")).lower() == "true":
        return dt
    log.info("%s: turning the change data feed on for %s (changes from this merge on are in it)", name, url)
    ctx.sink.enable_change_data_feed(url, dt)
    dt.update_incremental()
    return dt


def part_schema(ctx: JobContext, key: str) -> pa.Schema:
    import pyarrow.parquet as pq

    from airflow_pgcdc.store.packs import open_part

    with open_part(ctx.fs, f"{ctx.layout.bucket}/{key}") as f:
        return pq.read_schema(f)


def _spark_type(t: pa.DataType) -> str:
    from pyspark.sql.pandas.types import from_arrow_type

    return from_arrow_type(t).simpleString()


def _union_fields(plan: TablePlan, schemas: list[tuple[str, pa.Schema]]) -> list[pa.Field]:
    """The table's columns over every relation version, first appearance first; a column
    whose type differs between versions is an incompatible change."""
    name = plan.qualified_name
    out: dict[str, pa.Field] = {}
    seen_in: dict[str, str] = {}
    for where, schema in schemas:
        for f in table_fields(schema):
            old = out.get(f.name)
            if old is None:
                out[f.name] = f
                seen_in[f.name] = where
            elif _spark_type(old.type) != _spark_type(f.type):
                raise IncompatibleSchemaChange(
                    f"table {name}, column {f.name!r}: type changed from "
                    f"{_pg_type(old)} ({old.type}) in {seen_in[f.name]} to {_pg_type(f)} "
                    f"({f.type}) in {where}; the Delta table cannot follow",
                    hint=_type_change_hint(plan),
                )
    return list(out.values())


def _pg_type(f: pa.Field) -> str:
    md = f.metadata or {}
    return (md.get(b"pg_type") or b"?").decode()


def check_case(name: str, names: Sequence[str]) -> None:
    """Delta (and Spark) resolve column names without regard to case: ``"Name"`` and
    ``name``, two columns in PostgreSQL, cannot both live in one Delta table."""
    seen: dict[str, list[str]] = {}
    for n in names:
        seen.setdefault(n.casefold(), []).append(n)
    dups = [group for group in seen.values() if len(group) > 1]
    if dups:
        raise IncompatibleSchemaChange(
            f"table {name}: column names {'; '.join(', '.join(repr(n) for n in g) for g in dups)} differ "
            "only in case, and a Delta table's column names are case-insensitive",
            hint="rename one of them in PostgreSQL (then pgcdc resync the table), or leave it out of "
                 "the publication's column list",
        )


def _check_target(plan: TablePlan, target: pa.Schema, fields: list[pa.Field]) -> list[pa.Field]:
    """New fields to add to the target; raises on a type the target cannot hold."""
    name = plan.qualified_name
    check_case(name, sorted({f.name for f in fields} | set(target.names)))
    have = {f.name: f for f in target}
    new = []
    for f in fields:
        old = have.get(f.name)
        if old is None:
            new.append(f)
        elif _spark_type(old.type) != _spark_type(f.type):
            raise IncompatibleSchemaChange(
                f"table {name}, column {f.name!r}: the Delta table has {old.type} but the "
                f"source now sends {_pg_type(f)} ({f.type})",
                hint=_type_change_hint(plan),
            )
    return new


def _type_change_hint(plan: TablePlan) -> str:
    """A type change rewrote the table (``ALTER COLUMN … TYPE … USING``): no change carries
    the rows' new values, so the table is taken again."""
    return (f"pgcdc resync --tables {shell_qualified(plan.schema, plan.table)} (with the pipeline's --slot, "
            "--publication and --store): a copy with the new type, the next merge replaces the Delta table from it; or cast back in "
            "PostgreSQL to the old type")


def batch_fields(ctx: JobContext, plan: TablePlan) -> list[pa.Field]:
    """The table's columns over the batch's relation versions, as Delta stores them."""
    schemas = [(f"the slice at {s.lsn}", part_schema(ctx, s.parts[0])) for s in plan.slices if s.parts]
    for v in plan.versions:
        if v.parts:
            schemas.append((f"window {v.window_seq} version {v.version}", part_schema(ctx, v.parts[0])))
    return delta_fields(_union_fields(plan, schemas))


def evolve(ctx: JobContext, plan: TablePlan, url: str, dt, fields: list[pa.Field], created: dict[str, str],
            missing: dict[str, Any] | None = None):
    """The Delta table at ``url`` with every column of ``fields``: created empty when
    missing, new columns added (rows already there read ``missing[column]`` when
    PostgreSQL gives them one: ``ADD COLUMN … DEFAULT``, else NULL). Returns ``(table,
    added column names)``."""
    if dt is None:
        deltars.bootstrap(
            url, pa.RecordBatchReader.from_batches(pa.schema(fields), iter(())),
            storage_options=ctx.storage, configuration=ctx.sink.properties(fields, by="delta-rs",
                                                                           table=plan.qualified_name),
            partition_by=ctx.partition_columns(plan.qualified_name, [f.name for f in fields]),
            metadata={"pgcdc.slot": ctx.slot, **created},
        )
        return open_table(url, ctx.storage), []
    new = _check_target(plan, pa.schema(dt.schema().to_arrow()), fields)
    if not new:
        return dt, []
    fill = {f.name: missing[f.name] for f in new if missing and f.name in missing}
    from airflow_pgcdc.lake.inspect import clustered

    if clustered(dt):  # delta-rs commits nothing to a liquid-clustered table: Delta's Spark engine adds them
        _add_clustered_columns(ctx, plan, url, new, fill)
    elif fill:
        deltars.add_filled_columns(dt, new, fill, metadata={"pgcdc.slot": ctx.slot, "pgcdc.filled": ",".join(fill)})
    else:
        deltars.add_columns(dt, new)
    return open_table(url, ctx.storage), [f.name for f in new]


def _add_clustered_columns(ctx: JobContext, plan: TablePlan, url: str, new: list[pa.Field],
                           fill: dict[str, Any]) -> None:
    """New nullable columns of a liquid-clustered Delta table, added by the sink (Delta's Spark
    engine: ``ALTER TABLE … ADD COLUMNS``, one commit that keeps the clustering; delta-rs
    refuses). Columns whose existing rows must read a value (``ADD COLUMN … DEFAULT``: filled
    by rewriting the table through delta-rs) are refused, naming the table."""
    name = plan.qualified_name
    if fill:
        raise MergeError(f"table {name}: column(s) {sorted(fill)} were added with a DEFAULT the existing rows read, and "
                         f"its Delta table {url} is liquid-clustered: the merge fills such a column by rewriting the "
                         "table through delta-rs, which commits nothing to a clustered table",
                         hint="in PostgreSQL, add such a column without a DEFAULT and set its value with UPDATEs (the "
                              "merge applies them as changes); or remove this Delta table and take the table again "
                              f"(pgcdc resync --tables {name}, without cluster_by: delta-rs writes the copy)")
    ctx.sink.add_clustered_columns(name, url, new)


def change_inputs(plan: TablePlan, fields: list[pa.Field], keys) -> tuple[list[str], list[str], pa.Schema]:
    """For a batch's change rows: the table columns, those that may hold an unchanged TOAST
    value (variable-length, not a key), and the schema to read the parts with (columns,
    the old key columns, the ``_pgcdc_`` metadata the compaction needs)."""
    by_name = {f.name: f for f in fields}
    columns = [f.name for f in fields]
    latest_types = _pg_types(plan)
    toast = [c for c in columns if c not in keys and toastable(latest_types.get(c, "text"))]
    # REPLICA IDENTITY FULL in every version: the whole old row, so the compaction can tell a
    # moved row from another that took its key in the same transaction (merge.compact)
    full = bool(plan.versions) and all(v.replica_identity == "f" for v in plan.versions)
    olds = columns if full else list(keys)
    read_schema = pa.schema(
        fields
        + [by_name[k].with_name(OLD_PREFIX + k) for k in olds]
        + [META[n] for n in (OP, COMMIT_LSN, SEQ, UNCHANGED_TOAST)]
    )
    return columns, toast, read_schema


def _pg_types(plan: TablePlan) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in plan.versions:
        for c in v.columns:
            out[c["name"]] = c.get("pg_type", "text")
    return out
