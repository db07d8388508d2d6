"""The history tables a merge job can keep beside a table: ``{table}__changelog`` (every
change row appended) and ``{table}__scd2`` (SCD type 2: one row per version of a row, with
its LSN validity). Part of the merge job (:mod:`.job`)."""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa

from airflow_pgcdc.changes.columns import COMMIT_LSN, COMMIT_TS, OP, SEQ, UNCHANGED_TOAST, XID
from airflow_pgcdc.lake.inspect import merged_version, open_table
from airflow_pgcdc.merge.checks import check_expired
from airflow_pgcdc.merge.clauses import keep_column
from airflow_pgcdc.merge.context import (
    META,
    JobContext,
    read_parts,
    read_table_files,
    target_url,
    window_metadata,
)
from airflow_pgcdc.merge.plan import plan_table, select_windows
from airflow_pgcdc.merge.schema import (
    batch_fields,
    change_inputs,
    evolve,
    merge_key_columns,
)
from airflow_pgcdc.merge.sinks.base import Commit
from airflow_pgcdc.merge.sinks.table import snapshot_input
from airflow_pgcdc.merge.windows import holds_table
from airflow_pgcdc.protocol.lsn import LSN

log = logging.getLogger("airflow_pgcdc.merge.job")  # the job's one logger, whatever module logs


CHANGELOG_META = (OP, COMMIT_LSN, SEQ, XID, COMMIT_TS, UNCHANGED_TOAST)


def changelog_history(ctx: JobContext, schema: str, table: str, manifests, keys, entry, max_windows) -> dict:
    """Append every change row of the windows not yet in the changelog table (its own app
    transaction ``…:changelog``), as they are: one row per change, in commit order, with
    the ``_pgcdc_`` metadata; truncates are not rows (they are in the window manifests)."""
    name = f"{schema}.{table}"
    url, app = target_url(ctx, schema, table, "changelog")
    dt = ctx.open(url)
    merged = merged_version(dt, app)
    windows = select_windows(manifests, after=ctx.after(name, merged), limit=max_windows)
    if not windows or not holds_table(windows, schema, table):
        return {"changelog": url, "rows": 0}
    check_expired(ctx, schema, table, windows, None, url, merged, history="changelog")
    plan = plan_table(
        windows, schema=schema, table=table, key_columns=merge_key_columns(name, entry, windows, keys),
        window_prefix=lambda seq: ctx.layout.window_prefix(ctx.slot, seq), keyless=True,  # rows as they are
    )
    if not plan.parts:
        return {"changelog": url, "rows": 0}
    meta = [META[n] for n in CHANGELOG_META]
    fields = batch_fields(ctx, plan)
    dt, _added = evolve(ctx, plan, url, dt, fields + meta, {"pgcdc.changelog": name})
    schema_out = pa.schema(fields + meta)
    done = ctx.sink.append(url, dt, read_parts(ctx, plan.parts, schema_out), schema_out,
                           Commit(app, plan.last_window, window_metadata(ctx, plan)),
                           where=(schema, table, f"changelog-w{plan.last_window}"))
    if done.get("concurrent_commit"):
        return {"changelog": url, "rows": 0, "concurrent_commit": True}
    return {"changelog": url, "rows": int(done.get("numOutputRows", done.get("num_source_rows", plan.rows)))}


def _scd2_fields() -> list[pa.Field]:
    from airflow_pgcdc.merge.compact import HIST_OP, IS_CURRENT, VALID_FROM, VALID_TO

    return [pa.field(VALID_FROM, pa.int64()), pa.field(VALID_TO, pa.int64()),
            pa.field(IS_CURRENT, pa.bool_()), pa.field(HIST_OP, pa.string())]


def scd2_history(ctx: JobContext, schema: str, table: str, snapshot, entry, manifests, keys, max_windows) -> dict:
    """Keep ``{schema}.{table}__scd2``: bootstrapped from the snapshot (every row a version
    valid from the consistent point, ``__op`` = ``S``), then one version per insert and
    update, ended by the key's next change (``__valid_to_lsn``; NULL while current), in
    one commit per batch with its own app transaction (``…:scd2``). LSNs are int64.
    A truncate ends every version current at that point at its LSN, including versions
    made earlier in the same batch."""
    from pyspark.sql import functions as F

    from airflow_pgcdc.merge.clauses import build_scd2_spec
    from airflow_pgcdc.merge.compact import (
        HIST_OP,
        IS_CURRENT,
        KIND,
        VALID_FROM,
        VALID_TO,
        scd2_rows,
    )

    name = f"{schema}.{table}"
    url, app = target_url(ctx, schema, table, "scd2")
    out: dict[str, Any] = {"scd2": url, "versions": 0, "bootstrap_rows": 0}
    dt = ctx.open(url)
    if dt is None and entry is not None:
        check_expired(ctx, schema, table, select_windows(
            manifests, after=ctx.after(name, None), consistent_point=snapshot.consistent_point,
            limit=max_windows), None, url, None, history="scd2")
        parts, fields = snapshot_input(ctx, snapshot, entry, url)
        schema_h = pa.schema(fields + _scd2_fields())
        df = read_parts(ctx, parts, pa.schema(fields)).select(
            "*",
            F.lit(int(LSN.parse(snapshot.consistent_point))).cast("bigint").alias(VALID_FROM),
            F.lit(None).cast("bigint").alias(VALID_TO),
            F.lit(True).alias(IS_CURRENT),
            F.lit("S").alias(HIST_OP),
        )
        metadata = {"pgcdc.slot": ctx.slot, "pgcdc.scd2": name, "pgcdc.snapshot_id": snapshot.snapshot_id}
        rows = ctx.sink.create(url, df, schema_h, metadata=metadata, configuration=ctx.sink.properties(fields, by="history"),
                               where=(schema, table, "scd2-bootstrap"), sized=False)
        out["bootstrap_rows"] = rows
        dt = open_table(url, ctx.storage)
    after = ctx.after(name, merged_version(dt, app))
    consistent = snapshot.consistent_point if (after is None and entry is not None) else None
    windows = select_windows(manifests, after=after, consistent_point=consistent, limit=max_windows)
    if not windows or not holds_table(windows, schema, table):
        return out
    check_expired(ctx, schema, table, windows, None, url, merged_version(dt, app), history="scd2")
    key_columns = merge_key_columns(name, entry, windows, keys)
    plan = plan_table(
        windows, schema=schema, table=table, key_columns=key_columns,
        window_prefix=lambda seq: ctx.layout.window_prefix(ctx.slot, seq),
    )
    if not plan.has_work:
        return out
    fields = batch_fields(ctx, plan)
    dt, _added = evolve(ctx, plan, url, dt, fields + _scd2_fields(), {"pgcdc.scd2": name})
    columns, toast, read_schema = change_inputs(plan, fields, key_columns)
    rows = scd2_rows(
        read_parts(ctx, plan.parts, read_schema), table_columns=columns, key_columns=key_columns,
        toast_columns=toast, truncate_at=plan.truncate_at,
    )
    if toast:  # values not in the batch: the key's current version in the history
        hist_schema = pa.schema(fields + _scd2_fields())
        current = (
            read_table_files(ctx, dt, hist_schema)  # a partitioned table's partition columns too
            .where(F.col(IS_CURRENT))
            .select(*[F.col(k) for k in key_columns], *[F.col(c).alias("_pgcdc_h_" + c) for c in toast])
        )
        rows = rows.join(current, on=list(key_columns), how="left").select(
            *[
                (F.when(F.col(keep_column(c)), F.col("_pgcdc_h_" + c)).otherwise(F.col(c)).alias(c)
                 if c in toast else F.col(c))
                for c in columns
            ],
            F.col(VALID_FROM), F.col(VALID_TO), F.col(IS_CURRENT), F.col(HIST_OP), F.col(KIND),
        )
    else:
        rows = rows.select(*columns, VALID_FROM, VALID_TO, IS_CURRENT, HIST_OP, KIND)
    stage_schema = pa.schema(fields + _scd2_fields() + [pa.field(KIND, pa.string())])
    target = pa.schema(dt.schema().to_arrow())
    truncate_lsn = plan.truncate_at[0] if plan.truncate_at is not None else None
    spec_args = dict(
        target_columns=target.names, source_columns=columns + [f.name for f in _scd2_fields()],
        key_columns=key_columns, truncate_lsn=truncate_lsn,
    )
    metrics = ctx.sink.merge(url, dt, rows, stage_schema, lambda dialect: build_scd2_spec(**spec_args, dialect=dialect),
                             Commit(app, plan.last_window, window_metadata(ctx, plan)),
                             where=(schema, table, f"scd2-w{plan.last_window}"), scd2=True)
    out["versions"] = int(metrics.get("num_target_rows_inserted", 0))
    out["closed"] = int(metrics.get("num_target_rows_updated", 0))
    return out
