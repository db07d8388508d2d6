"""What a merge is asked (:class:`MergeOptions`) and answers (:class:`MergeResult`, one
:class:`TableResult` per table), and the choices among which (:data:`ENGINES`,
:data:`HISTORIES`, :data:`READERS`): apart from the call (:func:`~.job.merge_slot`), so that
the errors and the other modules of the merge name them without importing the job.

:class:`MergeOptions` is the one definition of the merge's options: the library call takes
it (or its fields as keywords), ``pgcdc merge`` and ``spark_app.py`` build it once from their
arguments (:meth:`MergeOptions.from_args`), and the Airflow operator turns it into
``spark_app.py``'s arguments (:meth:`MergeOptions.to_args`): a new option is added here,
with its flag, and reaches every door.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from airflow_pgcdc.merge.errors import MergeError
from airflow_pgcdc.options import JobOptions

__all__ = ["ENGINES", "HISTORIES", "READERS", "TABLE_OPTIONS", "BadMergeOption", "MergeOptions", "MergeResult",
           "TableResult"]


ENGINES = ("delta-rs", "delta-spark")


HISTORIES = (None, "changelog", "scd2")


READERS = ("python", "s3a")


def parse_keys(items: Sequence[str] | None) -> dict[str, list[str]]:
    """``schema.table=col1,col2`` items (``--key``) → ``{"schema.table": ["col1", "col2"]}``."""
    import argparse

    out: dict[str, list[str]] = {}
    for item in items or ():
        table, sep, cols = item.rpartition("=")
        names = [c.strip() for c in cols.split(",") if c.strip()]
        if not sep or not table or not names:
            raise argparse.ArgumentTypeError(f"--key expects schema.table=col1[,col2...], got {item!r}")
        out[table] = names
    return out


TABLE_OPTIONS: dict[str, type] = {"change_data_feed": bool, "metadata_columns": bool, "soft_deletes": bool,
                                  "catalog_name": str, "partition_by": str, "cluster_by": str}
"""The merge's options a table may set for itself (:attr:`MergeOptions.table_options`,
``--table-option SCHEMA.TABLE:NAME=VALUE``), over the pipeline's: each one's type."""


def parse_table_options(items: Sequence[str] | None) -> dict[str, dict[str, Any]]:
    """``schema.table:name=value`` items (``--table-option``) → ``{"schema.table": {name: value}}``,
    each value read as :data:`TABLE_OPTIONS` types it (:class:`BadMergeOption` otherwise)."""
    out: dict[str, dict[str, Any]] = {}
    for item in items or ():
        left, eq, value = item.partition("=")
        table, colon, name = left.rpartition(":")
        if not eq or not colon or not table or not name:
            raise BadMergeOption(f"--table-option expects SCHEMA.TABLE:NAME=VALUE, got {item!r}",
                                 hint=f"NAME is one of {', '.join(TABLE_OPTIONS)}")
        out.setdefault(table, {})[name.strip()] = value.strip()
    return out


def _table_option_value(table: str, name: str, value: Any) -> Any:
    kind = TABLE_OPTIONS.get(name)
    if kind is None:
        raise BadMergeOption(f"table_options[{table!r}]: unknown option {name!r}",
                             hint=f"a table may set {', '.join(TABLE_OPTIONS)}")
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "1", "yes", "on"):
            return True
        if text in ("false", "0", "no", "off"):
            return False
        raise BadMergeOption(f"table_options[{table!r}][{name!r}] must be true or false, got {value!r}")
    return kind(value)


def _check_cluster_by(table: str, given: Mapping[str, Any]) -> None:
    """A table's ``cluster_by`` (liquid clustering, Delta's Spark engine): at least one column
    name, and not with ``partition_by`` (Delta refuses a table both partitioned and clustered).
    Whether the table has the columns is checked when it is created
    (``JobContext.cluster_columns``); whether the engine can write clustering, by the sink."""
    if "cluster_by" not in given:
        return
    if not [c for c in str(given["cluster_by"]).split(",") if c.strip()]:
        raise BadMergeOption(f"table_options[{table!r}]['cluster_by'] names no column: {given['cluster_by']!r}",
                             hint=f"--table-option {table}:cluster_by=COL[,COL] (columns of the table)")
    if given.get("partition_by"):
        raise BadMergeOption(f"table_options[{table!r}]: cluster_by and partition_by together: a Delta table is "
                             "either liquid-clustered or partitioned, not both",
                             hint=f"keep one of {table}:cluster_by and {table}:partition_by")


class BadMergeOption(MergeError, ValueError):
    """An option of the merge with a value it cannot take (named as in the library call and
    on the command line)."""


DEFAULT_TABLE_WORKERS = 4
"""Tables a delta-rs merge job merges at once (driver threads), unless ``--table-workers``
says otherwise; Delta's Spark engine merges one at a time."""


@dataclass(frozen=True, kw_only=True)
class MergeOptions(JobOptions):
    """What :func:`~.job.merge_slot` is asked, past the store, the Delta root and the slot
    (each field's meaning is the call's; ``None``: the default). Checked when made
    (:class:`BadMergeOption`); whether the engine can do what is asked (deletion vectors, a
    replay to a point) is the job's check, made with the engine's sink."""

    job: ClassVar[str] = "the merge"

    tables: tuple[str, ...] | None = None
    keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    max_windows: int | None = None
    engine: str = "delta-rs"
    history: str | None = None
    reader: str = "python"
    target_file_mb: float | None = None
    deletion_vectors: bool = False
    driver_rows: int | None = None
    table_workers: int | None = None
    lock_wait: float | None = None
    until_lsn: str | None = None
    until_time: str | datetime | None = None
    change_data_feed: bool = False
    metadata_columns: bool = False
    soft_deletes: bool = False
    catalog: str | None = None
    catalog_prefix: str = ""
    table_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.tables is not None:
            self._put("tables", self._names(self.tables))
        keys = {}
        for table, cols in (self.keys or {}).items():
            cols = (cols,) if isinstance(cols, str) else tuple(cols)
            if not cols or any(not c or "," in c for c in cols):
                raise BadMergeOption(f"keys[{table!r}] must be a non-empty list of column names without ',': "
                                     f"{list(cols)!r}", hint="--key SCHEMA.TABLE=COL[,COL]")
            keys[table] = cols
        self._put("keys", keys)
        if self.engine not in ENGINES:
            raise BadMergeOption(f"unknown engine {self.engine!r}", hint=f"one of {', '.join(ENGINES)}")
        if self.reader not in READERS:
            raise BadMergeOption(f"unknown reader {self.reader!r}", hint=f"one of {', '.join(READERS)}")
        if self.history not in HISTORIES:
            raise BadMergeOption(f"unknown history {self.history!r}", hint="history is 'changelog', 'scd2' or none")
        if self.max_windows is not None and (isinstance(self.max_windows, bool) or not isinstance(self.max_windows, int)
                                             or self.max_windows < 0):
            raise BadMergeOption(f"max_windows (--max-windows) must be an integer 0 or more (0: bootstrap only), "
                                 f"got {self.max_windows!r}")
        if self.target_file_mb is not None:
            if isinstance(self.target_file_mb, bool) or not float(self.target_file_mb) > 0:
                raise BadMergeOption(f"target_file_mb must be positive, got {self.target_file_mb!r} "
                                     "(--target-file-mb: the data files' size in MB)")
            self._put("target_file_mb", float(self.target_file_mb))
        if self.driver_rows is not None and (isinstance(self.driver_rows, bool) or not isinstance(self.driver_rows, int)
                                             or self.driver_rows < 0):
            raise BadMergeOption(f"driver_rows must be an integer 0 or more, got {self.driver_rows!r} (--driver-rows)")
        if self.table_workers is not None and (isinstance(self.table_workers, bool)
                                               or not isinstance(self.table_workers, int) or self.table_workers < 1):
            raise BadMergeOption(f"table_workers must be an integer 1 or more, got {self.table_workers!r} "
                                 "(--table-workers)")
        if self.until_lsn and self.until_time:
            raise BadMergeOption("give until_lsn or until_time, not both (--until-lsn, --until-time)")
        self._put("deletion_vectors", bool(self.deletion_vectors))
        self._put("change_data_feed", bool(self.change_data_feed))
        self._put("metadata_columns", bool(self.metadata_columns))
        self._put("soft_deletes", bool(self.soft_deletes))
        if self.catalog is not None and not str(self.catalog).startswith("thrift://"):
            raise BadMergeOption(f"catalog must be a Hive Metastore's thrift://host:port, got {self.catalog!r}",
                                 hint="--catalog thrift://metastore:9083")
        if not re.fullmatch(r"[a-z0-9_]*", self.catalog_prefix or ""):
            raise BadMergeOption(f"catalog_prefix must be lower-case letters, digits and '_', got {self.catalog_prefix!r}",
                                 hint="--catalog-prefix sales_ puts schema public in database sales_public")
        per_table: dict[str, dict[str, Any]] = {}
        if not isinstance(self.table_options or {}, Mapping):
            raise BadMergeOption(f"table_options must map schema.table to its options, got {self.table_options!r}",
                                 hint="e.g. {'shop.orders': {'change_data_feed': False}}")
        for table, given in (self.table_options or {}).items():
            if not isinstance(table, str) or "." not in table or not isinstance(given, Mapping):
                raise BadMergeOption(f"table_options: {table!r} must be a schema.table name mapped to its options, "
                                     f"got {given!r}", hint="--table-option SCHEMA.TABLE:NAME=VALUE")
            per_table[table] = {name: _table_option_value(table, name, v) for name, v in given.items()}
            _check_cluster_by(table, per_table[table])
        self._put("table_options", per_table)

    def for_table(self, name: str, option: str) -> Any:
        """``option`` (one of :data:`TABLE_OPTIONS`) for the table ``name`` (``schema.table``):
        its own value (:attr:`table_options`), else the pipeline's (None for an option only a
        table has: ``catalog_name``, ``partition_by``, ``cluster_by``)."""
        own = self.table_options.get(name, {})
        return own[option] if option in own else getattr(self, option, None)

    @classmethod
    def from_args(cls, args: Any) -> MergeOptions:
        """From ``spark_app.py``'s (``pgcdc merge``'s) parsed arguments."""
        pick = lambda name: getattr(args, name, None)  # noqa: E731
        return cls(tables=pick("tables"), keys=parse_keys(pick("key")), max_windows=pick("max_windows"),
                   engine=pick("engine") or "delta-rs", history=pick("history"), reader=pick("reader") or "python",
                   target_file_mb=pick("target_file_mb"), deletion_vectors=bool(pick("deletion_vectors")),
                   driver_rows=pick("driver_rows"), table_workers=pick("table_workers"), until_lsn=pick("until_lsn"),
                   until_time=pick("until_time"), change_data_feed=bool(pick("change_data_feed")),
                   metadata_columns=bool(pick("metadata_columns")), soft_deletes=bool(pick("soft_deletes")),
                   catalog=pick("catalog"), catalog_prefix=pick("catalog_prefix") or "", table_options=parse_table_options(pick("table_option")))

    def to_args(self) -> list[str]:
        """``spark_app.py``'s arguments for these options (the defaults left out); parsed back
        by :meth:`from_args` to the same options. ``lock_wait`` has no flag."""
        args: list[str] = []
        for flag, value, default in (("--history", self.history, None), ("--engine", self.engine, "delta-rs"),
                                     ("--reader", self.reader, "python"), ("--until-lsn", self.until_lsn, None),
                                     ("--until-time", self.until_time, None)):
            if value is not None and value != default:
                args += [flag, value.isoformat() if isinstance(value, datetime) else str(value)]
        if self.tables:
            args += ["--tables", *self.tables]
        for table, cols in self.keys.items():
            args += ["--key", f"{table}={','.join(cols)}"]
        if self.max_windows is not None:
            args += ["--max-windows", str(int(self.max_windows))]
        if self.target_file_mb is not None:
            args += ["--target-file-mb", f"{self.target_file_mb:g}"]
        if self.deletion_vectors:
            args.append("--deletion-vectors")
        if self.change_data_feed:
            args.append("--change-data-feed")
        if self.metadata_columns:
            args.append("--metadata-columns")
        if self.soft_deletes:
            args.append("--soft-deletes")
        if self.catalog:
            args += ["--catalog", self.catalog]
        if self.catalog_prefix:
            args += ["--catalog-prefix", self.catalog_prefix]
        for table, given in self.table_options.items():
            for name, value in given.items():
                args += ["--table-option", f"{table}:{name}={str(value).lower() if isinstance(value, bool) else value}"]
        if self.driver_rows is not None:
            args += ["--driver-rows", str(self.driver_rows)]
        if self.table_workers is not None:
            args += ["--table-workers", str(self.table_workers)]
        return args


@dataclass
class TableResult:
    table: str
    delta_url: str
    # bootstrapped[+merged] | resynced[+merged] | merged | merged-by-concurrent-job |
    # up-to-date | no-changes | skipped (``note`` says why) | failed
    action: str
    app_id: str = ""
    bootstrap_rows: int = 0
    first_window: int | None = None
    last_window: int | None = None
    start_lsn: str | None = None
    end_lsn: str | None = None
    change_rows: int = 0
    merged_rows: int = 0
    truncates: int = 0
    added_columns: list[str] = field(default_factory=list)
    delta_version: int | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    history: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None  # action "failed": what went wrong, and what to do
    hint: str | None = None
    # the table is no longer in the pipeline (dropped, or out of the publication) as of the
    # newest window read: its Delta table keeps its last state
    left_pipeline: bool = False
    note: str | None = None  # why a table was skipped


@dataclass(frozen=True)
class MergeResult:
    slot: str
    source: str
    delta: str
    tables: list[TableResult] = field(default_factory=list)
    seconds: float = 0.0
    # a replay to a point: {lsn, window (the one cut there), asked}
    until: dict[str, Any] | None = None
    # the whole result's document in the store (merge.results): what a summary left out
    detail: str | None = None
    # --catalog: {"db.table": created|updated|unchanged}, or {"error": …}
    catalog: dict[str, str] | None = None

    @property
    def failed(self) -> list[TableResult]:
        return [t for t in self.tables if t.action == "failed"]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

