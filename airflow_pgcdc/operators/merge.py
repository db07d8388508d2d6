"""``PgcdcSparkMergeOperator``: the Spark merge (snapshot + change windows → Delta tables)
submitted with ``spark-submit`` — a :class:`SparkSubmitOperator` that fills in the
application, its arguments, the ``--py-files`` zip and the Spark conf itself.

What is submitted: ``airflow_pgcdc/merge/spark_app.py`` of the installed package, with
``--py-files airflow_pgcdc.zip`` (:func:`airflow_pgcdc.merge.session.build_py_files`),
``--from/--slot/--delta [--tables …] [--key …] [--max-windows N]``, and the conf of
:data:`airflow_pgcdc.merge.session.SPARK_CONF` plus ``spark.pyspark.python`` and
``spark.pyspark.driver.python`` = this worker's interpreter (so a ``local[*]`` master
runs the merge in the same virtual environment); ``conf=`` given to the operator wins.

S3 endpoint and credentials (from ``aws_conn_id``, read as :class:`PgcdcHook` reads
it) reach the job only through the environment of the ``spark-submit`` process
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_REGION``): never in the application arguments, the
operator's Spark conf, or its (rendered, stored) template fields. The driver reads them (:meth:`S3Settings.from_env`) and hands them to its Python
data sources as reader options, so executors need no environment of their own. The
secret key and session token are also registered with Airflow's secrets masker. On YARN
the provider additionally turns ``env_vars`` into ``spark.yarn.appMasterEnv.*`` conf (its
logged command masks values of keys containing ``SECRET``); on Kubernetes it turns them
into ``spark.kubernetes.driverEnv.*`` only, so a Kubernetes *client*-mode driver gets no
S3 environment from the connection (not supported; tested: ``local[*]``).

The result: ``spark_app.py`` prints one line ``PGCDC_MERGE_RESULT {json}`` on stdout;
the provider's hook streams spark-submit's output into the task log line by line
(:meth:`SparkSubmitHook._process_spark_submit_log`), and :class:`PgcdcMergeSubmitHook`
picks that line out of the stream on its way through. This needs the driver's stdout,
i.e. client deploy mode (the default: ``local[*]``, standalone or YARN client); cluster
deploy mode is refused.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Asset, AssetAlias, BaseOperator

from airflow_pgcdc.hooks.compat import AirflowException
from airflow_pgcdc.hooks.pgcdc import PgcdcHook
from airflow_pgcdc.merge.options import MergeOptions
from airflow_pgcdc.merge.results import FAILED_NAMED, QUIET_ACTIONS, XCOM_TABLES, summary
from airflow_pgcdc.merge.session import is_local
from airflow_pgcdc.merge.spark_app import RESULT_PREFIX
from airflow_pgcdc.operators import assets
from airflow_pgcdc.operators.lineage import ReportsLineage
from airflow_pgcdc.operators.links import PgcdcSparkUILink, spark_ui_link
from airflow_pgcdc.operators.metrics import merge_metrics
from airflow_pgcdc.operators.renamed import renamed_argument
from airflow_pgcdc.operators.values import (
    checked,
    columns_per_table,
    flag,
    mapping,
    number,
    rendered_options,
    templated,
)
from airflow_pgcdc.store.s3 import ROLE_ENV, WRITE_ENV

__all__ = [
    "MERGED_ACTIONS",
    "ON_FAILED_TABLES",
    "PgcdcMergeCheckOperator",
    "PgcdcMergeSubmitHook",
    "PgcdcSparkMergeOperator",
    "PgcdcTablesFailed",
    "delta_alias",
    "failed_tables",
    "merge_application_args",
    "merge_spark_conf",
    "merged_tables",
    "s3_env",
    "tables_failed_message",
]

MERGED_ACTIONS = frozenset({"bootstrapped", "merged", "bootstrapped+merged", "resynced", "resynced+merged"})
"""Table actions that made a Delta commit (and get an Asset event)."""

ON_FAILED_TABLES = ("fail", "succeed")
"""What :class:`PgcdcSparkMergeOperator` does when the job failed some tables and merged
the others (``on_failed_tables``)."""

_OWNED = ("application", "application_args")


class PgcdcTablesFailed(AirflowException):
    """The merge job failed some tables (the others were merged and committed); the
    message names each failed table with its error and hint."""


def failed_tables(result: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """The tables of a merge result (or its summary: those it lists, failed ones first) the
    job failed (``action == "failed"``)."""
    return [t for t in (result or {}).get("tables", ()) if t.get("action") == "failed"]


def merged_tables(result: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """The tables of a merge result whose Delta table got a commit (:data:`MERGED_ACTIONS`)."""
    return [t for t in (result or {}).get("tables", ()) if t.get("action") in MERGED_ACTIONS]


def _named(names: Sequence[str], count: int) -> str:
    """The first :data:`~airflow_pgcdc.merge.results.FAILED_NAMED` of ``names``, and how many
    more of ``count`` there are."""
    shown = list(names[:FAILED_NAMED])
    return ", ".join(shown) + (f" and {count - len(shown)} more" if count > len(shown) else "")


def tables_failed_message(result: Mapping[str, Any]) -> str:
    """One message naming the failed tables of ``result`` (a job's result or its summary)
    with their error and hint, and the tables that did get a commit, up to
    :data:`FAILED_NAMED` of each (the rest counted)."""
    failed = failed_tables(result)
    moved = merged_tables(result)
    actions = result.get("actions") or {}
    n_failed = actions.get("failed", len(failed))
    n_moved = sum(actions.get(a, 0) for a in MERGED_ACTIONS) if actions else len(moved)
    total = result.get("tables_total", len(result.get("tables", ())))
    named = _named([t["table"] for t in moved], n_moved) if moved else ""
    lines = [f"{n_failed} of {total} table(s) not merged"
             + (f" (merged and committed: {named})" if named else "") + ":"]
    for t in failed[:FAILED_NAMED]:
        lines.append(f"  {t.get('table')}: {t.get('error')}" + (f" (hint: {t['hint']})" if t.get("hint") else ""))
    if n_failed > min(len(failed), FAILED_NAMED):
        lines.append(f"  and {n_failed - min(len(failed), FAILED_NAMED)} more: every one in "
                     f"{result.get('detail') or 'the XCom result'}")
    return "\n".join(lines)



def delta_alias(slot: str | None = None) -> AssetAlias:
    """The AssetAlias through which the merge of ``slot`` emits its per-table Asset events
    (``pgcdc-delta-{slot}``; ``pgcdc-delta`` when the slot is only known at run time)."""
    return assets.alias("delta", slot)


def _check_deletion_vectors(engine: str | None, deletion_vectors: bool) -> None:
    """Deletion vectors are Delta's Spark engine's: refused with another engine at parse time."""
    if deletion_vectors and engine != "delta-spark":
        raise ValueError(f"deletion_vectors needs engine='delta-spark' (the {engine or 'delta-rs'} engine writes none)")


def merge_application_args(
    *,
    store: str,
    slot: str,
    delta: str,
    tables: Sequence[str] | None = None,
    keys: Mapping[str, Sequence[str]] | None = None,
    max_windows: int | None = None,
    history: str | None = None,
    engine: str | None = None,
    reader: str | None = None,
    target_file_mb: float | None = None,
    deletion_vectors: bool = False,
    driver_rows: int | None = None,
    until_lsn: str | None = None,
    until_time: str | None = None,
    change_data_feed: bool = False,
    metadata_columns: bool = False,
    soft_deletes: bool = False,
    catalog: str | None = None,
    catalog_prefix: str | None = None,
    table_options: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[str]:
    """The arguments of ``spark_app.py`` (see :func:`airflow_pgcdc.merge.spark_app.add_arguments`):
    the merge's options through :meth:`~airflow_pgcdc.merge.options.MergeOptions.to_args`, their
    one definition."""
    _check_deletion_vectors(engine, deletion_vectors)
    options = MergeOptions.of(
        tables=tables, keys=keys, max_windows=max_windows, history=history, engine=engine, reader=reader,
        target_file_mb=target_file_mb, deletion_vectors=deletion_vectors, driver_rows=driver_rows,
        until_lsn=until_lsn, until_time=until_time, change_data_feed=change_data_feed, metadata_columns=metadata_columns,
        soft_deletes=soft_deletes, catalog=catalog, catalog_prefix=catalog_prefix, table_options=table_options)
    return ["--store", store, "--slot", slot, "--delta", delta, *options.to_args()]


def merge_spark_conf(conf: Mapping[str, Any] | None = None, *, python: str | None = None) -> dict[str, Any]:
    """:data:`SPARK_CONF`, the interpreter for driver and workers (``python``, default this
    one), then ``conf`` on top."""
    from airflow_pgcdc.merge.session import SPARK_CONF

    python = python or sys.executable
    return {
        **SPARK_CONF,
        "spark.pyspark.python": python,
        "spark.pyspark.driver.python": python,
        **(conf or {}),
    }


def s3_env(settings) -> dict[str, str]:
    """boto3's environment variables for :class:`~airflow_pgcdc.store.s3.S3Settings`
    (set fields only). Holds the secret key: for a process environment, never a log."""
    env: dict[str, str] = {}
    if settings.endpoint_url:
        # both: an AWS_ENDPOINT_URL_S3 inherited from the worker would win over AWS_ENDPOINT_URL
        env["AWS_ENDPOINT_URL"] = env["AWS_ENDPOINT_URL_S3"] = settings.endpoint_url
    if settings.access_key_id:
        env["AWS_ACCESS_KEY_ID"] = settings.access_key_id
    if settings.secret_access_key:
        env["AWS_SECRET_ACCESS_KEY"] = settings.secret_access_key
    if settings.session_token:
        env["AWS_SESSION_TOKEN"] = settings.session_token
    if settings.region:
        env["AWS_REGION"] = env["AWS_DEFAULT_REGION"] = settings.region
    for name, field_name in (WRITE_ENV | ROLE_ENV).items():  # what every object carries; the role to assume
        if getattr(settings, field_name) and (field_name not in ("role_session_name", "role_seconds") or settings.role_arn):
            env[name] = str(getattr(settings, field_name))
    return env


def parse_result_line(line: str) -> dict[str, Any] | None:
    """The JSON of a ``PGCDC_MERGE_RESULT {json}`` line (anywhere in ``line``), else ``None``."""
    at = line.find(RESULT_PREFIX)
    if at < 0:
        return None
    try:
        value = json.loads(line[at + len(RESULT_PREFIX):])
    except ValueError as e:
        raise ValueError(f"unreadable {RESULT_PREFIX.strip()} line ({e}): {line[:300]!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{RESULT_PREFIX.strip()} is not a JSON object: {line[:300]!r}")
    return value


LOGGED_RESULT_CHARS = 20_000
"""A merge result line longer than this is logged summed up (the whole one: ``detail``)."""


class PgcdcMergeSubmitHook(SparkSubmitHook):
    """:class:`SparkSubmitHook` that keeps the merge's result line (``merge_result``) while
    the provider logs spark-submit's output as usual, and finds ``spark-submit`` next to
    this interpreter (pyspark's venv ``bin/``) when it is not on ``PATH``."""

    merge_result: dict[str, Any] | None = None
    merge_result_error: str | None = None

    def _scan(self, lines: Iterator[Any]) -> Iterator[Any]:
        # never raise here: the provider must read spark-submit's output to the end and wait for it
        for line in lines:
            try:
                value = parse_result_line(str(line))
            except ValueError as e:
                self.merge_result_error = str(e)
                value = None
            if value is not None:
                self.merge_result, self.merge_result_error = value, None
                if len(line) > LOGGED_RESULT_CHARS:  # one line of megabytes in the task's log: its summary
                    short = {k: v for k, v in summary(value, 0).items() if k != "tables"}
                    line = f"{RESULT_PREFIX}(summed up: {len(line):,} characters) {json.dumps(short)}"
            yield line

    def _process_spark_submit_log(self, itr: Iterator[Any]) -> None:
        super()._process_spark_submit_log(self._scan(itr))

    def use_spark_beside_python(self) -> None:
        """When ``spark-submit`` is not on ``PATH`` but pyspark installed it beside this
        interpreter (a virtual environment's ``bin/``, not activated), submit with that one
        and, unless ``SPARK_HOME`` is set, point ``SPARK_HOME`` at the pyspark package (its
        launcher would otherwise look for pyspark with whatever ``python3`` is on ``PATH``)."""
        binary = self._connection["spark_binary"]
        if shutil.which(binary) is not None:
            return
        beside = Path(sys.executable).parent / binary
        if not beside.is_file():
            return
        self._connection["spark_binary"] = str(beside)
        if not os.environ.get("SPARK_HOME") and not (self._env_vars or {}).get("SPARK_HOME"):
            spec = importlib.util.find_spec("pyspark")
            if spec is not None and spec.origin:
                self._env_vars = {"SPARK_HOME": str(Path(spec.origin).parent), **(self._env_vars or {})}


class PgcdcSparkMergeOperator(ReportsLineage, SparkSubmitOperator):
    """Merge the snapshot and the committed change windows of ``slot`` (in the store at
    ``source``) into one Delta table per source table under ``delta``, with
    ``spark-submit`` (see :mod:`airflow_pgcdc.merge.job`).

    Which windows: every committed window after each table's last merged one, in order,
    exactly once (the Delta app transaction records the last merged window), at most
    ``max_windows`` per table and run. The operator needs no window numbers: running it
    after any number of drains merges what they committed, and a rerun merges nothing
    twice. ``max_windows`` is templated, e.g. to bound a catch-up run.

    Returns (XCom ``return_value``) the job's result as ``spark_app.py`` prints it
    (:meth:`airflow_pgcdc.merge.options.MergeResult.to_dict`), summed up by
    :func:`airflow_pgcdc.merge.results.summary` so that it stays small however many tables
    the slot has: ``actions`` (tables per action), ``rows``, ``tables_total``,
    ``tables_omitted``, ``detail`` (the whole result's document in the store), and
    ``tables``: every table when there are at most ``xcom_tables`` (100), else the failed
    ones, then those that got a commit, up to that many
    (:func:`airflow_pgcdc.merge.results.whole` reads every table back)::

        {"slot", "source", "delta", "seconds", "detail", "actions", "rows", "tables_total", "tables_omitted",
         "tables": [{"table": "schema.table", "delta_url": "s3://…/schema.table",
                     "action": "bootstrapped+merged" | "bootstrapped" | "merged"
                               | "up-to-date" | "no-changes" | "merged-by-concurrent-job"
                               | "skipped" (a table dropped before any copy: "note" says why),
                     "bootstrap_rows", "first_window", "last_window", "start_lsn", "end_lsn",
                     "change_rows", "merged_rows", "truncates", "added_columns",
                     "delta_version", "metrics", "seconds", ...}]}

    Asset events: one per table whose Delta table got a commit (``action`` in
    :data:`MERGED_ACTIONS`), on ``Asset(uri=<the table's Delta location>)``
    (:func:`airflow_pgcdc.merge.plan.delta_table_url`; name = uri), extra
    ``{window_seq: last_window, start_lsn, end_lsn, delta_version, action}``
    (window fields ``None`` for a bootstrap without windows). They are emitted through
    the operator's AssetAlias outlet (default :func:`delta_alias`), or directly on an
    ``Asset`` given in ``outlets`` with the same uri; none with ``outlets=[]`` (a merge
    into a scratch location, as a rebuild's). Consumers schedule on
    ``Asset("s3://bucket/lake/public.orders")`` or on the alias.

    When the job fails some tables and merges the others (``TablesFailed``), see
    ``on_failed_tables``: Airflow records Asset events only for a task that succeeds, so
    either the task fails (default; the result is still its XCom) or it succeeds with the
    moved tables' events and a :class:`PgcdcMergeCheckOperator` downstream fails the run::

        merge = PgcdcSparkMergeOperator(task_id="merge", ..., on_failed_tables="succeed")
        merge >> PgcdcMergeCheckOperator(task_id="merge_check", merge_task_id="merge")

    :param store: the change store, ``s3://bucket/prefix`` (templated)
    :param slot: the replication slot (templated)
    :param delta: the Delta root, ``s3://bucket/lake`` (templated)
    :param tables: only these ``schema.table`` (templated; a list, or one string of
        names separated by commas/spaces)
    :param keys: merge key per table without primary key / replica identity index,
        ``{"schema.table": ["col1", "col2"]}`` (templated: a template may render the
        mapping as JSON or as a Python literal, e.g. ``"{{ params.keys }}"``)
    :param max_windows: merge at most N windows per table in this run (templated)
    :param history: also keep a history table per table: ``changelog`` or ``scd2`` (templated)
    :param engine: ``delta-rs`` (default) or ``delta-spark`` (templated; needs the Delta and
        hadoop-aws jars: found by the job itself after ``make setup``, see
        :mod:`airflow_pgcdc.merge.jars`, or given by the cluster)
    :param reader: ``python`` (default) or ``s3a`` (templated; Spark's Parquet reader, needs hadoop-aws)
    :param target_file_mb: data file size when a table is bootstrapped or replaced by a
        resync, rows sorted by the key (``--target-file-mb``; default the job's, 32 MB; templated)
    :param deletion_vectors: with ``engine="delta-spark"``: the Delta tables get deletion
        vectors, so a merge of scattered updates writes the changed rows, not every file
        they touch (``--deletion-vectors``; readers must support the feature; templated:
        ``"true"``/``"false"``)
    :param driver_rows: with the delta-rs engine, a table's batch of at most this many change
        rows is compacted on the driver in Arrow, without a Spark job (``--driver-rows``;
        default the job's, 20,000; 0: every batch through Spark; templated)
    :param change_data_feed: the Delta tables get the change data feed
        (``--change-data-feed``; turned on for existing tables at their next merge;
        templated: ``"true"``/``"false"``)
    :param metadata_columns: the Delta tables (with a key) get the CDC metadata columns
        ``_pgcdc_op``, ``_pgcdc_commit_lsn``, ``_pgcdc_commit_ts``, ``_pgcdc_merged_at``
        (``--metadata-columns``; templated: ``"true"``/``"false"``)
    :param soft_deletes: a row the source deletes stays in its Delta table (keyed tables),
        marked by ``_pgcdc_deleted_at`` (``--soft-deletes``; templated: ``"true"``/``"false"``)
    :param catalog: a Hive Metastore, ``thrift://host:port``, kept in step with the Delta
        tables (``--catalog``; the ``catalog`` extra on the worker that runs the job; templated)
    :param catalog_prefix: prefix of its database names (``--catalog-prefix``; templated)
    :param table_options: a table's own value of an option, over the pipeline's,
        ``{"schema.table": {"change_data_feed": False}}`` (``--table-option``; templated:
        the mapping as JSON or a Python literal)
    :param aws_conn_id: Airflow ``aws`` connection for S3 (login = access key id,
        password = secret key, extras ``endpoint_url``, ``region_name``); ``None``: the
        worker's environment (boto3's conventions) is inherited by spark-submit (templated)
    :param conn_id: Airflow Spark connection (default ``spark_default``); for local
        mode: ``{"conn_type": "spark", "host": "local[*]"}`` (templated)
    :param py_files_dir: where to keep the ``airflow_pgcdc.zip`` shipped with
        ``--py-files`` (rebuilt when a source is newer); default: a temporary directory
        per run, removed afterwards
    :param on_failed_tables: what to do when the job failed some tables and merged the
        others (``TablesFailed``, exit 1; each table's result still printed): ``"fail"``
        (default): the task fails, its message naming every failed table with its error
        and hint, the result is still pushed as the XCom ``return_value``, and no Asset
        event is emitted — Airflow (3.x) records Asset events only for a task instance that
        succeeds; ``"succeed"``: the task succeeds with the Asset events of the tables that
        got a commit and the result (failed tables included) as its XCom, logging the failed
        tables as an error — put :class:`PgcdcMergeCheckOperator` downstream so that the run
        still fails naming them. Any other failure of the job (``WindowGap``, a lost
        executor, no result) fails the task either way.
    :param xcom_tables: the most tables the XCom result lists (templated; default 100)
    :param kwargs: any other :class:`SparkSubmitOperator` argument (``conf`` is laid
        over the merge's conf; ``py_files`` and ``env_vars`` are added to the merge's;
        ``application`` and ``application_args`` are the operator's own)
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields, "store", "slot", "delta", "tables", "keys", "max_windows",
        "history", "engine", "reader", "target_file_mb", "deletion_vectors", "driver_rows", "aws_conn_id", "conn_id",
        "until_lsn", "until_time", "options", "xcom_tables", "change_data_feed", "metadata_columns",
        "soft_deletes", "catalog", "catalog_prefix", "table_options", "spark_ui_url",
    )
    ui_color = "#fdebd0"
    operator_extra_links = (PgcdcSparkUILink(),)

    def __init__(
        self,
        *,
        store: str | None = None,
        slot: str,
        delta: str,
        tables: Sequence[str] | str | None = None,
        keys: Mapping[str, Sequence[str]] | None = None,
        max_windows: int | str | None = None,
        history: str | None = None,
        engine: str | None = None,
        reader: str | None = None,
        target_file_mb: float | None = None,
        deletion_vectors: bool = False,
        driver_rows: int | None = None,
        until_lsn: str | None = None,
        until_time: str | None = None,
        change_data_feed: bool | str = False,
        metadata_columns: bool | str = False,
        soft_deletes: bool | str = False,
        catalog: str | None = None,
        catalog_prefix: str | None = None,
        table_options: Mapping[str, Mapping[str, Any]] | str | None = None,
        options: MergeOptions | Mapping[str, Any] | str | None = None,
        aws_conn_id: str | None = None,
        conn_id: str = "spark_default",
        py_files_dir: str | None = None,
        on_failed_tables: str = "fail",
        xcom_tables: int | str = XCOM_TABLES,
        conf: Mapping[str, Any] | None = None,
        name: str = "pgcdc-merge",
        spark_ui_url: str | None = None,
        **kwargs: Any,
    ) -> None:
        store = renamed_argument(kwargs, "source", "store", store, "PgcdcSparkMergeOperator")
        if on_failed_tables not in ON_FAILED_TABLES:
            raise ValueError(f"on_failed_tables must be one of {', '.join(ON_FAILED_TABLES)}, got {on_failed_tables!r}")
        given = [k for k in _OWNED if k in kwargs]
        if given:
            raise TypeError(f"PgcdcSparkMergeOperator sets {', '.join(given)} itself; do not pass them")
        if "outlets" not in kwargs:
            kwargs["outlets"] = [delta_alias(slot)]
        from airflow_pgcdc.merge import spark_app

        super().__init__(
            application=str(Path(spark_app.__file__).resolve()),
            conf=merge_spark_conf(conf),
            conn_id=conn_id,
            name=name,
            **kwargs,
        )
        self.store = store
        self.slot = slot
        self.delta = delta
        self.tables = tables
        self.keys = checked(keys, columns_per_table, "keys")
        self.conn_id = conn_id  # the provider keeps it private (_conn_id), untemplated
        self.max_windows = max_windows
        self.history = history
        self.engine = engine
        self.reader = reader
        self.target_file_mb = target_file_mb
        self.deletion_vectors = deletion_vectors
        self.driver_rows = driver_rows
        # a replay to a point (merge/point.py), e.g. until_time="{{ data_interval_end }}"
        self.until_lsn = until_lsn
        self.until_time = until_time
        self.change_data_feed = change_data_feed
        self.metadata_columns = metadata_columns
        self.soft_deletes = soft_deletes
        self.catalog = catalog
        self.catalog_prefix = catalog_prefix
        self.table_options = table_options
        self.spark_ui_url = spark_ui_url  # the "Spark UI" link's page: operators/links.py
        self.spark_ui_link = ""
        # the merge's options as one object or dict (templated: e.g. "{{ params.merge }}"),
        # instead of the fields above
        self.options = options
        fields = dict(tables=tables, keys=keys, max_windows=max_windows, history=history, engine=engine,
                      reader=reader, target_file_mb=target_file_mb, deletion_vectors=deletion_vectors,
                      driver_rows=driver_rows, until_lsn=until_lsn, until_time=until_time,
                      change_data_feed=change_data_feed, metadata_columns=metadata_columns,
                      soft_deletes=soft_deletes, catalog=catalog, catalog_prefix=catalog_prefix,
                      table_options=table_options)
        given = [name for name, value in fields.items() if value not in (None, False)]
        if options is not None and given:
            raise ValueError(f"give options or the merge's fields ({', '.join(given)}), not both")
        if options is not None and not templated(options):
            self._options()  # a bad option fails when the DAG is parsed
        self.aws_conn_id = aws_conn_id
        self.py_files_dir = py_files_dir
        self.on_failed_tables = on_failed_tables
        self.xcom_tables = xcom_tables
        if not templated(xcom_tables):
            self._xcom_tables()
        # bad keys, file size or driver rows fail at parse time (templated ones when rendered)
        merge_application_args(
            store=store, slot=slot, delta=delta, keys=None if templated(keys) else self.keys,
            target_file_mb=None if templated(target_file_mb) else number(target_file_mb, float, "target_file_mb"),
            driver_rows=None if templated(driver_rows) else number(driver_rows, int, "driver_rows"),
            engine=None if engine in (None, "", "None") or templated(engine) else engine,
            deletion_vectors=not templated(engine, deletion_vectors) and flag(deletion_vectors, "deletion_vectors"),
            change_data_feed=not templated(change_data_feed) and flag(change_data_feed, "change_data_feed"),
            metadata_columns=not templated(metadata_columns) and flag(metadata_columns, "metadata_columns"),
            soft_deletes=not templated(soft_deletes) and flag(soft_deletes, "soft_deletes"),
            catalog=None if catalog in (None, "", "None") or templated(catalog) else catalog,
            catalog_prefix=None if catalog_prefix in (None, "", "None") or templated(catalog_prefix) else catalog_prefix,
            table_options=None if templated(table_options) else mapping(table_options, "table_options"))

    # ------------------------------------------------------------------ building

    def _tables(self) -> list[str] | None:
        value = self.tables
        if value is None or value == "" or value == "None":
            return None
        if isinstance(value, str):
            return [t for t in value.replace(",", " ").split() if t] or None
        return [str(t) for t in value] or None

    def _max_windows(self) -> int | None:
        value = self.max_windows
        if value is None or value == "" or value == "None":
            return None
        n = int(value)
        if n < 1:
            raise ValueError(f"max_windows must be at least 1, got {n}")
        return n

    def _merge_jars(self, master: str | None = None) -> str | None:
        """``--jars``: the user's, plus for delta-spark/s3a the jars ``make setup`` fetched
        (:func:`airflow_pgcdc.merge.jars.find_jars`), unless ``packages``,
        ``spark.jars.packages`` or ``PGCDC_SPARK_JARS=none`` say the cluster brings them, or
        ``master`` is local: the job then puts them on its driver's class loader itself
        (:func:`airflow_pgcdc.merge.session.spark_session`), where ``--jars`` would have its
        in-driver executor copy them (686 MB) at every run."""
        from airflow_pgcdc.merge import jars as jarlib
        from airflow_pgcdc.merge.session import needs_delta_jars

        options = self._options()
        if options is not None:
            engine, reader = options.engine, options.reader
        else:
            engine = None if self.engine in (None, "", "None") else self.engine
            reader = None if self.reader in (None, "", "None") else self.reader
        given = [j for j in (self.jars or "").split(",") if j]
        if not needs_delta_jars(engine, reader) or self.packages or "spark.jars.packages" in (self.conf or {}):
            return ",".join(given) or None
        if any("delta-spark" in j for j in given) or jarlib.provided_by_cluster() or is_local(master):
            return ",".join(given) or None
        return ",".join([*given, *jarlib.find_jars()]) or None

    def _get_hook(self) -> PgcdcMergeSubmitHook:
        self._conn_id = self.conn_id  # rendered
        hook = super()._get_hook()
        # The provider's _get_hook builds a SparkSubmitHook from ~35 operator attributes;
        # rebuilding it here would silently drop any it adds later. Our subclass only adds
        # methods and the merge_result(_error) attributes, so the built hook is re-classed.
        hook.__class__ = PgcdcMergeSubmitHook
        hook.merge_result = hook.merge_result_error = None
        hook.use_spark_beside_python()
        if hook._connection["deploy_mode"] == "cluster":
            raise ValueError(
                "PgcdcSparkMergeOperator reads the merge result from the driver's stdout, which "
                "spark-submit only streams back in client deploy mode; use deploy_mode='client'"
            )
        master = str(hook._connection["master"])
        hook._jars = self._merge_jars(master)
        if is_local(master) and "spark.ui.enabled" not in hook._conf:
            hook._conf["spark.ui.enabled"] = "false"
        env = self._s3_env()
        if env:
            # only on the hook (the spark-submit process environment), not on self.env_vars:
            # template fields are rendered, stored and shown in the UI
            hook._env_vars = {**(hook._env_vars or {}), **env}
        return hook

    def _s3_env(self) -> dict[str, str]:
        if not self.aws_conn_id:
            return {}
        from airflow.sdk.log import mask_secret

        settings = PgcdcHook(aws_conn_id=self.aws_conn_id).s3_settings()
        for secret in (settings.secret_access_key, settings.session_token):
            if secret:
                mask_secret(secret)
        return s3_env(settings)

    def _options(self) -> MergeOptions | None:
        """``options``, rendered: a :class:`MergeOptions`, or a mapping of its fields whose
        values may be rendered text (``"8"``, ``"true"``, ``"None"``)."""
        options = rendered_options(self.options, MergeOptions)
        if options is None:
            return None
        _check_deletion_vectors(options.engine, options.deletion_vectors)
        return options

    def _application_args(self) -> list[str]:
        """``spark_app.py``'s arguments, from the rendered fields (or ``options``)."""
        options = self._options()
        if options is not None:
            return ["--store", self.store, "--slot", self.slot, "--delta", self.delta, *options.to_args()]
        return merge_application_args(
            store=self.store, slot=self.slot, delta=self.delta, tables=self._tables(),
            keys=columns_per_table(self.keys, "keys"), max_windows=self._max_windows(),
            history=None if self.history in (None, "", "None") else self.history,
            engine=None if self.engine in (None, "", "None") else self.engine,
            reader=None if self.reader in (None, "", "None") else self.reader,
            target_file_mb=number(self.target_file_mb, float, "target_file_mb"),
            deletion_vectors=flag(self.deletion_vectors, "deletion_vectors"),
            driver_rows=number(self.driver_rows, int, "driver_rows"),
            until_lsn=None if self.until_lsn in (None, "", "None") else str(self.until_lsn),
            until_time=None if self.until_time in (None, "", "None") else str(self.until_time),
            change_data_feed=flag(self.change_data_feed, "change_data_feed"),
            metadata_columns=flag(self.metadata_columns, "metadata_columns"),
            soft_deletes=flag(self.soft_deletes, "soft_deletes"),
            catalog=None if self.catalog in (None, "", "None") else str(self.catalog),
            catalog_prefix=None if self.catalog_prefix in (None, "", "None") else str(self.catalog_prefix),
            table_options=mapping(self.table_options, "table_options"),
        )

    def _xcom_tables(self) -> int:
        n = number(self.xcom_tables, int, "xcom_tables", minimum=0)
        return XCOM_TABLES if n is None else n

    def _describe(self) -> str:
        """The start line: the tables and windows asked, from ``options`` when given there."""
        given = self._options()
        tables = list(given.tables or ()) if given is not None else self._tables()
        windows = given.max_windows if given is not None else self._max_windows()
        return (f"merge of slot {self.slot} from {self.store} into {self.delta} (tables "
                f"{', '.join(tables) if tables else 'all'}, max windows {windows or 'all'})")

    # ------------------------------------------------------------------ running

    def execute(self, context) -> dict[str, Any]:
        from airflow_pgcdc.merge.session import build_py_files

        self.application_args = self._application_args()
        user_py_files = [p for p in (self.py_files or "").split(",") if p]
        with tempfile.TemporaryDirectory(prefix="pgcdc-merge-") as tmp:
            zip_path = build_py_files(self.py_files_dir or tmp)
            self.py_files = ",".join([zip_path, *user_py_files])
            self.log.info("%s", self._describe())
            submit_error: Exception | None = None
            try:
                super().execute(context)
            except Exception as e:  # noqa: BLE001 - spark-submit's non-zero exit: see the result below
                submit_error = e
            finally:
                self.py_files = ",".join(user_py_files) or None
        hook = self._hook
        result = getattr(hook, "merge_result", None)
        if submit_error is not None and not failed_tables(result):
            raise submit_error  # not a per-table failure (WindowGap, a lost executor...): as it was
        if result is None:
            error = getattr(hook, "merge_result_error", None)
            raise RuntimeError(
                f"spark-submit finished but its merge result is unknown: {error}" if error else
                f"spark-submit finished but printed no {RESULT_PREFIX.strip()} line: the merge "
                "result is unknown (see the spark-submit output above)"
            )
        short = summary(result, self._xcom_tables())
        merge_metrics(str(result.get("slot") or self.slot), result)
        self.spark_ui_link = spark_ui_link(result.get("spark"), self.spark_ui_url)
        self._lineage = lambda: self._lineage_of(result)
        quiet = 0
        for t in result.get("tables", ()):
            if t.get("action") in QUIET_ACTIONS:
                quiet += 1
                continue
            self.log.info("%s: %s, windows %s..%s (%s..%s), Delta version %s", t.get("table"),
                          t.get("action"), t.get("first_window"), t.get("last_window"),
                          t.get("start_lsn"), t.get("end_lsn"), t.get("delta_version"))
        self.log.info("%d table(s): %s%s; %s", short["tables_total"],
                      ", ".join(f"{n} {a}" for a, n in short["actions"].items()) or "none",
                      f" ({quiet} with nothing to merge, not listed above)" if quiet else "",
                      f"the whole result: {result['detail']}" if result.get("detail") else
                      "the whole result was not recorded in the store")
        if failed_tables(result):
            return self._tables_failed(context, result, short)
        self._emit_asset_events(context, result)
        return short

    def _tables_failed(self, context, result: dict[str, Any], short: dict[str, Any]) -> dict[str, Any]:
        message = tables_failed_message(result)
        moved = [t["table"] for t in merged_tables(result)]
        named = _named(moved, len(moved))
        if self.on_failed_tables == "succeed":
            self.log.error("%s\nthe task succeeds (on_failed_tables='succeed'): Asset events for %s; "
                           "the failed tables are in the XCom result", message, named or "no table")
            self._emit_asset_events(context, result)
            return short
        ti = context.get("ti") if hasattr(context, "get") else None
        if ti is not None:  # the runner pushes a return value only for a task that succeeds
            ti.xcom_push(key="return_value", value=short)
        if moved:
            self.log.warning(
                "%s were merged and committed, but get no Asset event from this run: Airflow records "
                "Asset events only for a task that succeeds (on_failed_tables='succeed' with a "
                "PgcdcMergeCheckOperator downstream emits them and still fails the run)", named)
        raise PgcdcTablesFailed(message)


    def _lineage_of(self, result: Mapping[str, Any]):
        """The store's windows and copy in, each Delta table the job wrote out (its schema for
        the first :data:`LINEAGE_SCHEMAS`, read with delta-rs whichever engine committed)."""
        from airflow_pgcdc.operators.lineage import delta_table, s3_dataset
        from airflow_pgcdc.store.s3 import delta_storage_options

        written = [t for t in result.get("tables", ()) if t.get("action") in MERGED_ACTIONS]
        if not written:
            return None
        options = delta_storage_options(PgcdcHook(aws_conn_id=self.aws_conn_id).s3_settings())
        root = f"{self.store.rstrip('/')}/{self.slot}"
        inputs = [s3_dataset(f"{root}/changes")]
        if any(str(t.get("action", "")).startswith(("bootstrapped", "resynced")) for t in written):
            inputs.append(s3_dataset(f"{root}/snapshot"))
        outputs = []
        for i, t in enumerate(written):
            rows = int(t.get("merged_rows") or 0) + int(t.get("bootstrap_rows") or 0)
            url = str(t["delta_url"]).replace("s3a://", "s3://", 1)
            outputs.append(delta_table(url, rows=rows, storage_options=options) if i < LINEAGE_SCHEMAS
                           else s3_dataset(url, rows=rows))
        return inputs, outputs

    def _emit_asset_events(self, context, result: Mapping[str, Any]) -> None:
        if not self.outlets:  # outlets=[]: a scratch location (a rebuild), nothing to announce
            self.log.info("outlets=[]: no Asset event for the tables of this merge")
            return
        for t in result.get("tables", ()):
            if t.get("action") not in MERGED_ACTIONS:
                continue
            assets.emit(self, context, Asset(uri=t["delta_url"]), {
                "window_seq": t.get("last_window"),
                "start_lsn": t.get("start_lsn"),
                "end_lsn": t.get("end_lsn"),
                "delta_version": t.get("delta_version"),
                "action": t.get("action"),
            })


LINEAGE_SCHEMAS = 50
"""Delta tables whose schema a merge's OpenLineage event carries (one delta-rs read each)."""


class PgcdcMergeCheckOperator(BaseOperator):
    """Fails when the merge task ``merge_task_id`` (a :class:`PgcdcSparkMergeOperator` with
    ``on_failed_tables="succeed"``) reported failed tables, naming each with its error and
    hint; succeeds otherwise. Put it downstream of the merge: the merge task emits the Asset
    events of the tables that moved, this task fails the run for the others.

    Returns (XCom) ``{"failed": []}`` when nothing failed.
    """

    template_fields: Sequence[str] = ("merge_task_id",)
    ui_color = "#fdebd0"

    def __init__(self, *, merge_task_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.merge_task_id = merge_task_id

    def execute(self, context) -> dict[str, Any]:
        result = context["ti"].xcom_pull(task_ids=self.merge_task_id, key="return_value")
        if not isinstance(result, Mapping):
            raise AirflowException(f"no merge result from task {self.merge_task_id!r} (XCom return_value): {result!r}")
        if failed_tables(result) or (result.get("actions") or {}).get("failed"):
            raise PgcdcTablesFailed(tables_failed_message(result))
        lag = (result.get("catalog") or {}).get("error")
        if lag:  # every table merged, the metastore not told (--catalog)
            raise PgcdcTablesFailed(f"the merge of slot {result.get('slot')} left its catalog behind: {lag} (the "
                                    "tables are merged; the next merge registers them again)")
        return {"failed": []}
