"""``{name}_backfill``: rebuild Delta tables from S3 (the snapshot, then every committed
window) into a fresh location, optionally verify, then swap them in.

When: a Delta table was damaged or deleted, a merge bug was fixed, or a table's layout
must change. The change store is the source of truth: the snapshot plus the windows
replay the history of the slot, for as long as the store keeps every window since the
snapshot. Upkeep (``{name}_maintenance``, ``pgcdc maintain``) deletes merged windows older
than its retention (``retention_hours``, default 168 h): past that, a rebuild fails those
tables (``WindowsExpired``, ``CopyExpired``) and ``mode=resync`` (a fresh copy from
PostgreSQL) is the way.

Consistency rule: the rebuilt table equals the source as of its last merged window's
``end_lsn`` (the job refuses gaps, as always). The swap is one overwrite commit on the
live table carrying the rebuilt table's app transaction version: readers see the old
contents or the new, never a mix, and time travel keeps the old versions. Windows the
live table merged while the rebuild ran are merged again by the next ``{name}_incremental``
run (merging is idempotent per key, and windows are applied in order).

Mode ``resync`` (``params.mode``): copy ``tables`` again from PostgreSQL while the slot
keeps streaming (``PgcdcResyncOperator``: a temporary slot's exported snapshot), then
merge them into the live root: each Delta table is replaced from the copy in one commit
and gets only the changes committed after it. For a table added to the publication after
the initial load (add it to the publication first), or one whose history in the store
cannot rebuild it. The other params of the rebuild mode are ignored.

Asset events: the swap emits one per live table it replaced (through the ``pgcdc-delta``
alias, as the merges do), so consumers scheduled on a live table run after a rebuild; the
rebuild's own location is scratch and gets none. After every table is swapped in, the run's
rebuild folder is removed (with ``swap`` false it is kept, for a look before swapping).

Runs of this DAG are triggered (no schedule; with or without a logical date): an Airflow
backfill of ``{name}_incremental`` is refused by its first task, pointing here.

Params: ``mode`` (``rebuild``, the default, or ``resync``), ``tables`` (which tables;
null, the default: every table of the slot; ``resync`` needs them), ``store``, ``slot``,
``delta`` (the live root), ``rebuild_root`` (default ``{delta}_rebuild``; each run
builds under ``{rebuild_root}/{run id}``), ``max_windows`` (stop after N windows;
null: all), ``verify`` (compare the rebuilt tables with PostgreSQL: only meaningful on a
quiet source), ``swap`` (default true), ``where`` (``mode=resync``: copy only the rows
matching this SQL predicate, a slice the merge upserts), ``until_time`` (the tables as they were at that
time, then swapped in: the next incremental merge goes on from there; see
:mod:`airflow_pgcdc.merge.point`).

Layout (what a rebuild is often for): ``target_file_mb`` and ``deletion_vectors`` (with
the pipeline's ``engine="delta-spark"``) shape the rebuilt tables; the swap keeps their
properties, their rows' order and that file size (:func:`airflow_pgcdc.merge.rebuild.swap_in`).
The same rebuild outside Airflow: ``pgcdc rebuild``; as one task: ``PgcdcRebuildOperator``.
"""

from __future__ import annotations

import re

from airflow.sdk import DAG, Asset, Param, task

from airflow_pgcdc.dags.params import common_params, merge_task, pipeline_dag
from airflow_pgcdc.dags.pipeline import Pipeline
from airflow_pgcdc.operators.merge import delta_alias
from airflow_pgcdc.operators.resync import PgcdcResyncOperator
from airflow_pgcdc.operators.verify import PgcdcVerifyOperator

REBUILT = "{{ (params.rebuild_root or params.delta ~ '_rebuild') ~ '/' ~ path_segment(run_id) }}"


def path_segment(run_id: str) -> str:
    """A run id as one folder name (run ids may hold ``:``, ``+`` or ``/``)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", run_id)


def whole_result(p: Pipeline, value: dict) -> dict:
    """The rebuild's whole merge result from its XCom (a summary past 100 tables: the rest
    read from the store with the pipeline's ``aws`` connection)."""
    from airflow_pgcdc.merge.results import whole

    if not value.get("tables_omitted"):
        return value
    from airflow_pgcdc.hooks.pgcdc import PgcdcHook

    return whole(value, PgcdcHook(aws_conn_id=p.aws_conn_id).s3_settings())


def build(p: Pipeline) -> DAG:
    params = {
        **common_params(p),
        "tables": Param(None, type=["null", "array"],
                        description="schema.table names (null: every table of the slot; resync needs them)"),
        "mode": Param("rebuild", enum=["rebuild", "resync"],
                      description="rebuild from the store, or resync the tables from PostgreSQL"),
        "rebuild_root": Param(None, type=["null", "string"],
                              description="where to rebuild (default {delta}_rebuild)"),
        "max_windows": Param(None, type=["null", "integer"], minimum=0,
                             description="merge at most N windows (null: all)"),
        "target_file_mb": Param(None, type=["null", "number"], exclusiveMinimum=0,
                                description="the rebuilt tables' data file size in MB (null: the job's default, 32)"),
        "deletion_vectors": Param(False, type="boolean",
                                  description="rebuilt tables with deletion vectors (needs the delta-spark engine)"),
        "where": Param(None, type=["null", "string"],
                       description="mode=resync: copy only the rows matching this SQL predicate (a slice, "
                                   "upserted by the merge; e.g. tenant_id = 42)"),
        "until_time": Param(None, type=["null", "string"],
                            description="rebuild the tables as they were at this time (ISO 8601, e.g. "
                                        "2026-11-29T06:00:00+00:00); null: through every window"),
        "verify": Param(False, type="boolean", description="verify the rebuilt tables (quiet source only)"),
        "swap": Param(True, type="boolean", description="swap the rebuilt tables in"),
    }
    with pipeline_dag(p, "backfill", __doc__, schedule=None, params=params,
                      user_defined_macros={"path_segment": path_segment,
                                           "rebuilt_tables": lambda value: [t["table"] for t in
                                                                            whole_result(p, value)["tables"]]}) as dag:
        @task.branch
        def choose(params=None) -> str:
            if params["mode"] == "resync" and not params["tables"]:
                from airflow_pgcdc.hooks.compat import AirflowFailException

                raise AirflowFailException("mode=resync copies the tables named in params.tables: give them "
                                           "(e.g. [\"public.orders\"]); a whole-slot copy is a new initial load")
            if params.get("until_time") and (params["mode"] == "resync" or params["verify"]):
                from airflow_pgcdc.hooks.compat import AirflowFailException

                raise AirflowFailException(
                    "until_time rebuilds the tables as of a past time: mode=resync copies them as they are now, and "
                    "verify compares with PostgreSQL now; leave until_time out, or mode=rebuild with verify false")
            if params.get("where") and params["mode"] != "resync":
                from airflow_pgcdc.hooks.compat import AirflowFailException

                raise AirflowFailException("where slices a resync (mode=resync): a rebuild replays whole tables")
            return "resync" if params["mode"] == "resync" else "rebuild"

        resync = PgcdcResyncOperator(
            task_id="resync",
            store="{{ params.store }}",
            slot="{{ params.slot }}",
            publications="{{ params.publication }}",
            tables="{{ params.tables }}",
            where="{{ params.where }}",
            workers=p.workers,
            as_text=p.as_text,
            pii_key_conn_id=p.pii_key_conn_id,
            postgres_conn_id=p.postgres_conn_id,
            aws_conn_id=p.aws_conn_id,
        )
        merge_resynced = merge_task(p, "merge_resynced", tables="{{ params.tables }}")
        rebuild = merge_task(p, "rebuild", delta=REBUILT, tables="{{ params.tables }}",
                             until_time="{{ params.until_time }}",
                             # a replay to a point commits with delta-rs (merge/point.py); the
                             # pipeline's delta-spark merges go on from it
                             engine=p.engine if p.engine in (None, "delta-rs") else
                             "{{ 'delta-rs' if params.until_time else '" + p.engine + "' }}",
                             max_windows="{{ params.max_windows }}", target_file_mb="{{ params.target_file_mb }}",
                             deletion_vectors="{{ params.deletion_vectors }}",
                             catalog=None,  # scratch tables: the swap registers the live ones
                             outlets=[])  # scratch: the swap emits the live tables' events
        verify = PgcdcVerifyOperator(
            task_id="verify",
            delta=REBUILT,
            tables="{{ (params.tables or rebuilt_tables(ti.xcom_pull(task_ids='rebuild')))"
                   " if params.verify else [] }}",
            store="{{ params.store }}",
            slot="{{ params.slot }}",
            pii_key_conn_id=p.pii_key_conn_id,
            postgres_conn_id=p.postgres_conn_id,
            aws_conn_id=p.aws_conn_id,
        )

        @task(outlets=[delta_alias()])
        def swap(merge_result: dict, params=None, run_id=None, outlet_events=None) -> list[dict]:
            """One overwrite commit per live table from its rebuilt table, an Asset event for
            each live table; then the run's rebuild folder is removed."""
            from airflow_pgcdc.hooks.pgcdc import PgcdcHook
            from airflow_pgcdc.merge.rebuild import rebuilt_events, swap_and_clean
            from airflow_pgcdc.merge.results import whole

            if not params["swap"]:
                return []
            settings = PgcdcHook(aws_conn_id=p.aws_conn_id).s3_settings()
            merge_result = whole(merge_result, settings)  # every table, when its XCom left some out
            # merge_result["delta"]: the run's rebuild root (REBUILT, rendered), removed after
            out = swap_and_clean(merge_result, params["delta"], settings=settings, run=run_id,
                                 target_file_mb=params["target_file_mb"])["swapped"]
            for uri, extra in rebuilt_events(merge_result["tables"], out):
                outlet_events[delta_alias()].add(Asset(uri=uri), extra=extra)
            if p.catalog:  # the live tables, as they are now, in the pipeline's metastore
                from airflow_pgcdc.merge.options import MergeOptions
                from airflow_pgcdc.merge.rebuild import register_live

                options = MergeOptions(catalog=p.catalog, catalog_prefix=p.catalog_prefix or "",
                                       table_options=p.table_options or {})
                failed = register_live(merge_result, params["delta"], options, params["slot"], settings)
                if failed is not None:
                    raise failed
            return out

        branch = choose()
        branch >> resync >> merge_resynced
        branch >> rebuild >> verify >> swap(rebuild.output)
    return dag
