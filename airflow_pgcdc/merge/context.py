"""What one merge job works with (:class:`JobContext`: Spark, the store, the Delta root,
the engine and reader) and the steps every table's merge shares: reading a window's change
parts (the Python data source or Spark's s3a reader), staging a batch, the window metadata
of a commit, one commit attempt with a concurrent writer told apart."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from airflow_pgcdc.changes.columns import COMMIT_LSN, OP, SEQ, UNCHANGED_TOAST
from airflow_pgcdc.changes.rows import META_FIELDS
from airflow_pgcdc.lake.inspect import open_table, table_url
from airflow_pgcdc.lake.sizing import DEFAULT_TARGET_FILE_MB
from airflow_pgcdc.lake.tables import CHANGELOG_SUFFIX, SCD2_SUFFIX, app_id
from airflow_pgcdc.merge.plan import TablePlan, version_fills
from airflow_pgcdc.merge.rows.arrow import DRIVER_ROWS
from airflow_pgcdc.merge.sinks import deltars
from airflow_pgcdc.merge.spark_io import encode_schema
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout, encode_table_segment

log = logging.getLogger(__name__)

__all__ = [
    "JobContext",
    "META",
    "STAGING_TTL_HOURS",
    "read_changes",
    "read_changes_on_driver",
    "read_files",
    "read_parts",
    "sorted_by_key",
    "is_starter",
    "read_s3a",
    "remove_old_staging",
    "spark_commit_once",
    "stage",
    "window_metadata",
]


STAGING_TTL_HOURS = 6

META = {f.name: f for f in META_FIELDS}

_START_LOCK = threading.Lock()


@dataclass
class JobContext:
    # the Spark session, or a callable that starts it when a table first needs Spark (:attr:`spark`)
    session: Any
    layout: Layout
    client: Any
    fs: Any
    storage: dict[str, str]
    slot: str
    delta: str
    run_id: str
    s3_options: dict[str, str]
    engine: str = "delta-rs"
    # the job's DeltaSink (merge/sinks/engines.py), chosen once from ``engine`` by the job
    sink: Any = None
    history: str | None = None
    reader: str = "python"
    target_file_mb: float = DEFAULT_TARGET_FILE_MB
    # delta-spark: tables get deletion vectors (--deletion-vectors)
    deletion_vectors: bool = False
    # the job's MergeOptions: what each table asks for itself (wants_…, partition_columns: for_table)
    options: Any = None
    # a replay to a point (merge/point.py: --until-lsn/--until-time), resolved by the job,
    # which then reads every window manifest (the tables index would skip the point's)
    point: Any = None
    every_window: bool = False
    # delta-rs: a table's batch of at most this many change rows is compacted on the driver
    # (merge/rows/arrow.py: no Spark job); 0: every batch through Spark
    driver_rows: int = DRIVER_ROWS
    # the slot's committed resyncs (store/resyncs.py), oldest first; its slices (merge/slices.py)
    resyncs: list = field(default_factory=list)
    slices: list = field(default_factory=list)
    # windows whose parts pgcdc maintain removed ({slot}/maintain/expired.json)
    expired: frozenset[int] = frozenset()
    # the tables whose parts pgcdc maintain removed from each copy: {manifest key: {schema.table}}
    expired_copies: dict[str, set[str]] = field(default_factory=dict)
    # "schema.table" -> window N: no window up to N holds the table after its last merged
    # one (the tables index says so), so its merge starts after N (see _load_windows)
    anchors: dict[str, int] = field(default_factory=dict)
    # Delta tables _load_windows already opened (url -> DeltaTable or None), each handed
    # out once by open(): a job loads a table's log once, not twice
    loaded: dict[str, Any] = field(default_factory=dict)
    # (schema, table) of the job's tables whose legacy Delta location another shares
    # (deltars.table_url), and each table's resolved location
    legacy_shared: frozenset = frozenset()
    urls: dict[tuple[str, str], str] = field(default_factory=dict)
    # with table workers (the job's threads, merge.job.each_table): the turn a table takes
    # (take_turn) when it first needs Spark or holds a batch above a quarter of the driver's
    # limits, kept until the table ends (release_spark_turn): two such at once would double
    # the driver's memory; small tables never ask and run at once
    spark_turns: Any = None
    # tables merged at once (--table-workers): also how many Delta logs are read at once
    table_workers: int = 1
    # the job's S3 settings when its credentials are an assumed role's (renewed by STS):
    # follow_credentials makes storage and fs again with the current ones
    settings: Any = None
    _turn: threading.local = field(default_factory=threading.local, repr=False)
    _credentials: Any = field(default=None, repr=False)
    _credentials_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def follow_credentials(self) -> None:
        """Before each table of a job whose credentials are an assumed role's: when STS
        renewed them, the delta-rs storage options and the Arrow filesystem are made again
        with the new ones and the logs the first pass kept open are dropped (they hold the
        old ones), so a table starts with credentials that last at least 15 minutes (boto3
        renews them below that) however long the job. A table already running keeps its own."""
        if self.settings is None or not getattr(self.settings, "role_arn", None):
            return
        from airflow_pgcdc.store.s3 import delta_storage_options, make_pyarrow_fs

        now = self.settings.handed_credentials()
        with self._credentials_lock:
            if now == self._credentials:
                return
            renewed = self._credentials is not None
            self._credentials = now
            self.storage = delta_storage_options(self.settings)
            self.fs = make_pyarrow_fs(self.settings)
            if renewed:
                self.loaded.clear()

    @property
    def spark(self):
        """The job's Spark session, started on first use when the job was given a starter
        (once, whichever of the job's table threads asks first). With table workers, the
        asking table waits for its turn (:attr:`spark_turns`) and keeps it to its end."""
        self.take_turn()
        if is_starter(self.session):
            with _START_LOCK:
                if is_starter(self.session):
                    self.session = self.session()
        if self.spark_turns is not None:
            _make_active(self.session)
        return self.session

    def take_turn(self) -> None:
        """With table workers: wait for the job's turn for a large table (one that needs
        Spark, or a large batch on the driver) and keep it until the table ends; nothing
        when this thread holds it already, or when the job runs one table at a time."""
        if self.spark_turns is not None and not getattr(self._turn, "held", False):
            self.spark_turns.acquire()
            self._turn.held = True

    def release_spark_turn(self) -> None:
        """End this thread's turn with Spark, if it took one (its table is done)."""
        if getattr(self._turn, "held", False):
            self._turn.held = False
            self.spark_turns.release()

    def table_url(self, schema: str, table: str) -> str:
        """Where the Delta table of ``schema.table`` is (:func:`.deltars.table_url`), once per job."""
        url = self.urls.get((schema, table))
        if url is None:
            url = self.urls[(schema, table)] = table_url(
                self.delta, schema, table, self.storage, shared=(schema, table) in self.legacy_shared)
        return url

    def wants_change_data_feed(self, name: str) -> bool:
        """Whether the Delta table of ``name`` (``schema.table``) is to have the change data
        feed (``--change-data-feed``, or the table's own ``--table-option``)."""
        return bool(self.options is not None and self.options.for_table(name, "change_data_feed"))

    def wants_metadata_columns(self, name: str) -> bool:
        """Whether the Delta table of ``name`` carries the CDC metadata columns
        (``--metadata-columns``, or the table's own ``--table-option``; :mod:`.metadata`)."""
        return bool(self.options is not None and self.options.for_table(name, "metadata_columns"))

    def wants_soft_deletes(self, name: str) -> bool:
        """Whether a row the source deletes stays in ``name``'s Delta table, marked
        (``--soft-deletes``, or the table's own ``--table-option``)."""
        return bool(self.options is not None and self.options.for_table(name, "soft_deletes"))

    def partition_columns(self, name: str, columns: Sequence[str]) -> tuple[str, ...]:
        """The partition columns ``name`` asks for (``--table-option …:partition_by=a,b``;
        ``date(ts) [as day]``, a generated date column, by its name: :mod:`.generated`),
        checked against its ``columns`` (:class:`~.errors.MergeError` naming a missing one)."""
        from airflow_pgcdc.merge.generated import partition_names

        given = self.options.for_table(name, "partition_by") if self.options is not None else None
        return partition_names(name, str(given), columns) if given else ()

    def generated_columns(self, name: str, fields: Sequence[pa.Field]):
        """The generated date columns ``name``'s ``partition_by`` asks for, over the table's
        own ``fields`` (:func:`.generated.parse_partition_by`: each checked), for a table
        being created; an existing table has those of its Delta schema."""
        from airflow_pgcdc.merge.generated import parse_partition_by

        given = self.options.for_table(name, "partition_by") if self.options is not None else None
        return parse_partition_by(name, str(given), fields)[1] if given else ()

    def cluster_columns(self, name: str, columns: Sequence[str]) -> tuple[str, ...]:
        """The liquid-clustering columns ``name`` asks for (``--table-option …:cluster_by=a,b``),
        checked against its ``columns`` (:class:`~.options.BadMergeOption` naming a missing one);
        the sink decides whether its engine can write them (Delta's Spark engine only)."""
        given = self.options.for_table(name, "cluster_by") if self.options is not None else None
        if not given:
            return ()
        cols = tuple(c.strip() for c in str(given).split(",") if c.strip())
        missing = [c for c in cols if c not in set(columns)]
        if missing or not cols:
            from airflow_pgcdc.merge.options import BadMergeOption

            raise BadMergeOption(f"table {name}: cluster_by names column(s) {missing or [given]} it does not have",
                                 hint=f"--table-option {name}:cluster_by=<columns of the table, comma-separated>")
        return cols

    def open(self, url: str):
        """The Delta table at ``url`` (``None`` when there is none)."""
        if url in self.loaded:
            return self.loaded.pop(url)
        return open_table(url, self.storage)

    def after(self, name: str, merged: int | None) -> int | None:
        """Where ``name``'s windows start: after ``merged``, or after its anchor."""
        anchor = self.anchors.get(name)
        if anchor is not None and (merged is None or merged < anchor):
            return anchor
        return merged

    def staging(self, schema: str, table: str, what: str) -> str:
        """``bucket/…/merge-staging/{run}/{segment}/{what}/`` (a pyarrow fs path)."""
        prefix = self.layout.merge_staging_prefix(self.slot, self.run_id)
        return f"{self.layout.bucket}/{prefix}{encode_table_segment(schema, table)}/{what}/"


def _make_active(session) -> None:
    """Make ``session`` the JVM's active session for this thread. Each Python thread runs its
    Spark calls on a JVM thread of its own (PySpark's pinned threads), whose active session is
    not the one the job set up; a write to a Python data source (``pgcdc_staging``) looks its
    provider up through the active session and did not find the job's registration."""
    try:
        session._jvm.SparkSession.setActiveSession(session._jsparkSession)
    except AttributeError:  # not a classic session (Spark Connect): nothing thread-bound to set
        pass


def is_starter(spark) -> bool:
    """Whether ``spark`` is a callable that starts a session (not a session itself)."""
    return callable(spark) and not hasattr(spark, "sparkContext")


def window_metadata(ctx: JobContext, plan: TablePlan) -> dict[str, str]:
    return {
        "pgcdc.slot": ctx.slot,
        "pgcdc.window_first": str(plan.first_window),
        "pgcdc.window_last": str(plan.last_window),
        "pgcdc.start_lsn": plan.start_lsn,
        "pgcdc.end_lsn": plan.end_lsn,
    } | ({"pgcdc.until_lsn": str(LSN(plan.until_lsn))} if plan.cut_window is not None else {})

def spark_commit_once(run, dt, url: str, app: str, version: int) -> dict[str, Any]:
    """A delta-spark commit of window ``version`` (``run()``) made once: Delta's Spark engine
    refuses a commit that races another writer (``ConcurrentTransactionException`` when
    both carry our app transaction: two merge jobs of one slot at once); the delta-rs
    handle ``dt`` then tells whether the other job merged the window (a success here).
    Delta's state of the table is built in partitions sized by its files
    (:func:`~.deltaspark.sized_state`)."""
    from pyspark.sql import SparkSession

    from airflow_pgcdc.merge.sinks import deltaspark

    with deltaspark.sized_state(SparkSession.getActiveSession(), len(dt.file_uris())):
        return deltars.commit_once(run, dt, url=url, app=app, version=version, refused=deltaspark.is_concurrent)

def read_changes(ctx: JobContext, plan: TablePlan, schema: pa.Schema):
    """The plan's change rows; after a resync only those committed at or after its
    consistent point (the earlier ones are in the table's copy), in a replay to a point
    only those committed at or before it (:mod:`.point`). Rows of relation versions
    older than an ``ADD COLUMN … DEFAULT`` of the batch read that default in the new
    column, as PostgreSQL's do (:func:`~airflow_pgcdc.merge.plan.version_fills`)."""
    fills = version_fills(plan)
    if not plan.parts:  # a batch of slices only (merge/slices.py)
        df = None
    elif not fills:
        df = read_parts(ctx, plan.parts, schema)
    else:
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_type

        plain = [p for v in plan.versions if (v.window_seq, v.version) not in fills for p in v.parts]
        frames = [read_parts(ctx, plain, schema)] if plain else []
        for v in plan.versions:
            fill = fills.get((v.window_seq, v.version))
            if fill is None:
                continue
            part = read_parts(ctx, list(v.parts), schema)
            for name, value in fill.items():
                if name in schema.names:
                    part = part.withColumn(name, F.lit(value.as_py()).cast(from_arrow_type(schema.field(name).type)))
            frames.append(part)
        df = frames[0]
        for more in frames[1:]:
            df = df.unionByName(more)
    if df is not None and (plan.since_lsn is not None or plan.until_lsn is not None):
        from pyspark.sql import functions as F

        if plan.since_lsn is not None:
            df = df.where(F.col(COMMIT_LSN) >= F.lit(plan.since_lsn))
        if plan.until_lsn is not None:  # a replay to a point (merge/point.py)
            df = df.where(F.col(COMMIT_LSN) <= F.lit(plan.until_lsn))
    for s in plan.slices:  # upserts just before each slice's point (merge/slices.py)
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_type

        # the copy's columns read; the change metadata set, and NULL for what it lacks (old key
        # columns, columns added after its point)
        present = pa.schema([f for f in schema if f.name in set(s.columns)])
        rows = read_parts(ctx, list(s.parts), present)
        meta = _slice_meta(s)
        for f in schema:
            if f.name in present.names:
                continue
            value = F.array() if f.name == UNCHANGED_TOAST else F.lit(meta.get(f.name))
            rows = rows.withColumn(f.name, value.cast(from_arrow_type(f.type)))
        rows = rows.select(*schema.names)
        df = rows if df is None else df.unionByName(rows)
    return df


def _slice_meta(s) -> dict[str, Any]:
    """A slice's rows' change metadata: upserts committed just before its point."""
    return {OP: "I", COMMIT_LSN: s.lsn - 1, SEQ: -1, UNCHANGED_TOAST: []}

def read_changes_on_driver(ctx: JobContext, plan: TablePlan, schema: pa.Schema) -> pa.Table:
    """:func:`read_changes` without Spark: the plan's change rows as one Arrow table, read
    by the driver (a small batch, see :mod:`.rows.arrow`): the same fills of an ``ADD
    COLUMN … DEFAULT`` and the same cut at a resync's consistent point."""
    import pyarrow.compute as pc

    from airflow_pgcdc.merge.rows.arrow import read_table

    fills = version_fills(plan)
    pieces = []
    for v in plan.versions:
        if not v.parts:
            continue
        part = read_table(ctx.fs, [f"{ctx.layout.bucket}/{p}" for p in v.parts], schema)
        for name, value in fills.get((v.window_seq, v.version), {}).items():
            if name in schema.names:
                i = schema.get_field_index(name)
                part = part.set_column(i, schema.field(i), pa.repeat(value.cast(schema.field(i).type), part.num_rows))
        pieces.append(part)
    table = pa.concat_tables(pieces) if pieces else schema.empty_table()
    if plan.since_lsn is not None:
        table = table.filter(pc.greater_equal(table[COMMIT_LSN], pa.scalar(plan.since_lsn, pa.int64())))
    if plan.until_lsn is not None:
        table = table.filter(pc.less_equal(table[COMMIT_LSN], pa.scalar(plan.until_lsn, pa.int64())))
    for s in plan.slices:  # upserts just before each slice's point (merge/slices.py)
        rows = read_table(ctx.fs, [f"{ctx.layout.bucket}/{p}" for p in s.parts], schema)
        for name, value in _slice_meta(s).items():
            if name in schema.names:
                i = schema.get_field_index(name)
                rows = rows.set_column(i, schema.field(i), pa.array([value] * rows.num_rows, schema.field(i).type))
        table = pa.concat_tables([table, rows])
    return table

def read_parts(ctx: JobContext, parts: list[str], schema: pa.Schema):
    """The store's Parquet parts (keys in the store's bucket) as a DataFrame of ``schema``."""
    return read_files(ctx, [f"{ctx.layout.bucket}/{p}" for p in parts], schema)

def read_files(ctx: JobContext, paths: list[str], schema: pa.Schema):
    """Parquet files (``bucket/key`` paths) as a DataFrame of ``schema``. Parts inside a
    pack (:mod:`airflow_pgcdc.store.packs`) are byte ranges Spark's own reader cannot read:
    with ``--reader s3a`` they are read by the Python reader, the rest by s3a."""
    from airflow_pgcdc.store.packs import is_packed

    packed = [p for p in paths if is_packed(p)]
    if ctx.reader == "s3a" and len(packed) < len(paths):
        whole = read_s3a(ctx, [p for p in paths if not is_packed(p)], schema)
        return whole.unionByName(_python_reader(ctx, packed, schema)) if packed else whole
    return _python_reader(ctx, paths, schema)


def read_table_files(ctx: JobContext, dt, schema: pa.Schema):
    """The rows of the Delta table ``dt`` (delta-rs' view of it) as a DataFrame of ``schema``,
    read from its data files (:func:`read_files`). A partitioned table's files do not hold
    their partition columns: each file's values come from its add action (per partition, a
    literal column; the files of one partition are read together)."""
    from urllib.parse import unquote

    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema, from_arrow_type

    from airflow_pgcdc.lake.sql import quote_ident

    uris = dt.file_uris()
    paths = [u.split("://", 1)[1] if "://" in u else u for u in uris]
    parts = [p for p in (dt.metadata().partition_columns or ()) if p in schema.names]
    if not paths:
        return ctx.spark.createDataFrame([], from_arrow_schema(schema))
    if not parts:
        return read_files(ctx, paths, schema)
    actions = pa.table(dt.get_add_actions(flatten=True)).select(["path"] + [f"partition.{p}" for p in parts])
    if actions.num_rows != len(paths):
        raise RuntimeError(f"Delta table {dt.table_uri}: {actions.num_rows} add actions but {len(paths)} files")
    groups: dict[tuple, list[str]] = {}
    for path, row in zip(paths, actions.to_pylist(), strict=True):
        if not unquote(path).endswith(unquote(row["path"])):  # the two lists are in one order
            raise RuntimeError(f"Delta table {dt.table_uri}: file {path} is not its add action's {row['path']}")
        groups.setdefault(tuple(row[f"partition.{p}"] for p in parts), []).append(path)
    file_schema = pa.schema([f for f in schema if f.name not in parts])
    out = None
    for values, files in groups.items():
        df = read_files(ctx, files, file_schema)
        for p, v in zip(parts, values, strict=True):
            df = df.withColumn(p, F.lit(v).cast(from_arrow_type(schema.field(p).type)))
        df = df.select(*[F.col(quote_ident(f.name, "spark")) for f in schema])
        out = df if out is None else out.unionByName(df)
    return out


def _python_reader(ctx: JobContext, paths: list[str], schema: pa.Schema):
    from pyspark.sql.pandas.types import from_arrow_schema

    return (
        ctx.spark.read.format("pgcdc_parquet")
        .schema(from_arrow_schema(schema))  # given: Spark need not ask the source (a Python worker)
        .options(**ctx.s3_options)
        .option("parts", json.dumps(paths))
        .option("schema", encode_schema(schema))
        .load()
    )

def read_s3a(ctx: JobContext, paths: list[str], schema: pa.Schema):
    """The same files through Spark's own Parquet reader (``s3a://``, hadoop-aws on the
    classpath, S3A configured by :func:`~airflow_pgcdc.merge.jars.configure_s3a`), conformed
    to ``schema`` like the Python reader: missing columns NULL, types cast. A Parquet
    ``TIME`` column (PostgreSQL ``time``) is read as Spark's TIME type
    (``spark.sql.timeType.enabled``, set by :func:`merge_slot`) and turned into the int64
    microseconds since midnight Delta stores (``24:00:00`` included)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import TimeType

    from airflow_pgcdc.lake.sql import quote_ident

    df = ctx.spark.read.option("mergeSchema", "true").parquet(*[f"s3a://{p}" for p in paths])
    have = {f.name: f.dataType for f in df.schema.fields}
    cols = []
    for f in schema:
        t = from_arrow_type(f.type)
        quoted = quote_ident(f.name, "spark")
        if f.name not in have:
            col = F.lit(None).cast(t)
        elif isinstance(have[f.name], TimeType) and pa.types.is_integer(f.type):
            col = F.expr(f"time_diff('MICROSECOND', TIME'00:00:00', {quoted})").cast(t)
        else:
            col = F.col(quoted).cast(t)
        cols.append(col.alias(f.name))
    return df.select(*cols)

def sorted_by_key(df, keys):
    """``df`` sorted by the merge key (range partitions, each sorted): the staged files,
    read in partition order, stream the rows in key order (see :mod:`.pruning`)."""
    from airflow_pgcdc.merge.compact import col

    return df.orderBy(*[col(k) for k in keys]) if keys else df


def stage(ctx: JobContext, df, staging: str, schema: pa.Schema) -> None:
    (
        df.write.format("pgcdc_staging")
        .options(**ctx.s3_options)
        .option("staging", staging)
        .option("schema", encode_schema(schema))
        .mode("append")
        .save()
    )

def remove_old_staging(ctx: JobContext) -> None:
    prefix = ctx.layout.merge_staging_prefix(ctx.slot)
    cutoff = datetime.now(UTC) - timedelta(hours=STAGING_TTL_HOURS)
    old_runs = set()
    for key in s3store.list_keys(ctx.client, ctx.layout.bucket, prefix):
        run = key[len(prefix):].split("/", 1)[0]
        try:
            started = datetime.strptime(run.split("-", 1)[0], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
        except ValueError:
            continue
        if started < cutoff:
            old_runs.add(run)
    for run in sorted(old_runs):
        s3store.delete_prefix(ctx.client, ctx.layout.bucket, prefix + run + "/")
        log.info("removed merge staging debris of run %s", run)


def target_url(ctx: JobContext, schema: str, table: str, history: str | None = None) -> tuple[str, str]:
    """``(url, app id)`` of a table's Delta table, or of its ``history`` table
    (``changelog`` or ``scd2``, whose app id ends in ``:changelog``/``:scd2``)."""
    app = app_id(ctx.slot, schema, table)
    base = ctx.table_url(schema, table)
    if history is None:
        return base, app
    return base + (CHANGELOG_SUFFIX if history == "changelog" else SCD2_SUFFIX), f"{app}:{history}"
