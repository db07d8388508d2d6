"""One pipeline's settings: a source database (its Airflow connections), a slot and a
publication, the change store and the Delta root, and the knobs of its DAGs.

:func:`load_pipelines` reads them from a JSON or YAML file (a list of mappings, or a
mapping with a ``pipelines`` list): one entry per source database. A bad entry fails with
:class:`PipelineConfigError`, naming the file, the entry and the field."""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["Pipeline", "PipelineConfigError", "load_pipelines"]

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}$")
_SLOT = re.compile(r"^[a-z0-9_]{1,63}$")


class PipelineConfigError(ValueError):
    """A pipeline's settings are wrong: the message names where and which field."""


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """The settings the DAG factory (:func:`airflow_pgcdc.dags.pipeline_dags`) builds a
    pipeline's DAGs from. They are the defaults of the DAGs' params (a triggered run's
    conf may override them) and the connection ids of every task.

    :param name: prefix of the DAG ids (``{name}_initial_load``, ``{name}_incremental``,
        ``{name}_backfill``, ``{name}_maintenance``) and a tag of each DAG
    :param slot: the logical replication slot (created by the initial load)
    :param publication: the publication to stream (created or widened by the initial load)
    :param tables: ``schema.table`` names the initial load adds to the publication (it
        never narrows one); empty: the publication as it is (say, one a DBA made ``FOR ALL
        TABLES``). The snapshot copies whatever the publication publishes
    :param store: the change store, ``s3://bucket/prefix``
    :param delta: the Delta root, ``s3://bucket/lake``
    :param postgres_conn_id: the source database's Airflow connection (``postgres`` or ``pgcdc``)
    :param aws_conn_id: the S3 connection (``aws``); ``None``: the workers' environment
    :param spark_conn_id: the Spark connection the merges are submitted through
    :param schedule: the incremental DAG's schedule (a cron string, a preset, or a
        ``timedelta``; an integer is minutes)
    :param maintenance_schedule: the maintenance DAG's schedule
    :param min_bytes: pending WAL that makes a window worth draining
    :param max_delay: seconds the oldest change may wait (``None``: no limit)
    :param max_rows: end a window after this many change rows (``None``: no limit)
    :param max_bytes: end a window after this many bytes of changes
    :param max_seconds: end a window after this many seconds
    :param workers: snapshot and resync connections
    :param retention_hours: what upkeep keeps (removed Delta files, merged windows)
    :param as_text: columns carried as PostgreSQL's text output, ``{"schema.table":
        ["col", ...]}`` (values the type map cannot carry: see docs/types.md); given to
        the snapshot, the drain and the resync alike
    :param pii: the slot's column rules, ``{"schema.table": {"column": "hash" | "exclude" |
        "mask" | "mask:N"}}``: the snapshot writes them to the store, the drain, the resync and
        verify apply them (see docs/operations.md, "Columns kept out of the lake")
    :param pii_key_conn_id: the connection whose password is the hash key (``None``: the
        workers' ``PGCDC_PII_KEY``)
    :param max_lag_seconds: the incremental DAG's SLA: a ``freshness`` task after the merge
        fails the run when a Delta table is further behind its source
        (:class:`~airflow_pgcdc.operators.freshness.PgcdcFreshnessCheckOperator`; ``None``: no task)
    :param table_max_lag_seconds: a table's own SLA, ``{"schema.table": seconds}``
    :param engine: the merge engine (``None``: the job's default, delta-rs)
    :param change_data_feed: the Delta tables get the change data feed (every merge of the
        pipeline's DAGs: ``--change-data-feed``)
    :param metadata_columns: the Delta tables get the CDC metadata columns (every merge:
        ``--metadata-columns``)
    :param soft_deletes: a row the source deletes stays in its Delta table, marked (every
        merge: ``--soft-deletes``)
    :param catalog: a Hive Metastore (``thrift://host:port``) every merge keeps in step with
        the Delta tables (``--catalog``); ``catalog_prefix``: its database names' prefix
    :param table_options: a table's own value of a merge option over the pipeline's,
        ``{"schema.table": {"change_data_feed": false}}`` (``--table-option``)
    :param tags: extra tags of every DAG
    """

    slot: str
    publication: str
    store: str
    delta: str
    name: str = "pgcdc"
    tables: tuple[str, ...] = ()
    postgres_conn_id: str = "pgcdc_postgres"
    aws_conn_id: str | None = "pgcdc_s3"
    spark_conn_id: str = "spark_default"
    schedule: Any = datetime.timedelta(minutes=5)
    maintenance_schedule: Any = "@daily"
    min_bytes: int = 16 << 20
    max_delay: float | None = 600.0
    max_rows: int | None = None
    max_bytes: int | None = None
    max_seconds: float | None = None
    workers: int = 2
    retention_hours: float = 168
    as_text: Mapping[str, Sequence[str]] | None = None
    pii: Mapping[str, Mapping[str, str]] | None = None
    pii_key_conn_id: str | None = None
    max_lag_seconds: float | None = None
    table_max_lag_seconds: Mapping[str, float] | None = None
    engine: str | None = None
    change_data_feed: bool = False
    metadata_columns: bool = False
    soft_deletes: bool = False
    catalog: str | None = None
    catalog_prefix: str | None = None
    table_options: Mapping[str, Mapping[str, Any]] | None = None
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        def bad(field: str, why: str) -> PipelineConfigError:
            return PipelineConfigError(f"pipeline {self.name!r}: {field} {why}")

        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise bad("name", f"must be letters, digits, '_', '.' or '-' (a DAG id prefix), got {self.name!r}")
        if not isinstance(self.slot, str) or not _SLOT.match(self.slot):
            raise bad("slot", f"must be 1-63 lower-case letters, digits or '_', got {self.slot!r}")
        for field in ("publication", "postgres_conn_id", "spark_conn_id"):
            if not isinstance(getattr(self, field), str) or not getattr(self, field):
                raise bad(field, f"must be a non-empty string, got {getattr(self, field)!r}")
        for field in ("store", "delta"):
            if not isinstance(getattr(self, field), str) or not getattr(self, field).startswith("s3://"):
                raise bad(field, f"must be an s3://bucket/prefix URL, got {getattr(self, field)!r}")
        if isinstance(self.tables, str) or not all(isinstance(t, str) and "." in t for t in self.tables):
            raise bad("tables", f"must be a list of schema.table names, got {self.tables!r}")
        object.__setattr__(self, "tables", tuple(self.tables))
        object.__setattr__(self, "tags", tuple(self.tags))
        if isinstance(self.schedule, int) and not isinstance(self.schedule, bool):
            object.__setattr__(self, "schedule", datetime.timedelta(minutes=self.schedule))
        for field, kind, minimum in (("min_bytes", int, 0), ("max_delay", float, 0), ("max_rows", int, 0),
                                     ("max_bytes", int, 0), ("max_seconds", float, 0), ("workers", int, 1),
                                     ("retention_hours", float, 0), ("max_lag_seconds", float, 0)):
            value = getattr(self, field)
            if value is None and field not in ("min_bytes", "workers", "retention_hours"):
                continue
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not ok or (kind is int and isinstance(value, float)) or value < minimum:
                raise bad(field, f"must be {'an integer' if kind is int else 'a number'} of at least "
                                 f"{minimum}, got {value!r}")
        if self.as_text is not None:
            if not isinstance(self.as_text, Mapping) or not all(
                    isinstance(cols, (list, tuple)) and cols and all(isinstance(c, str) for c in cols)
                    for cols in self.as_text.values()):
                raise bad("as_text", f"must map schema.table to a list of column names, got {self.as_text!r}")
            object.__setattr__(self, "as_text", {str(t): list(c) for t, c in self.as_text.items()})
        if self.table_max_lag_seconds is not None:
            lags = self.table_max_lag_seconds
            if not isinstance(lags, Mapping) or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in lags.values()):
                raise bad("table_max_lag_seconds", f"must map schema.table to seconds (>= 0), got {lags!r}")
            if self.max_lag_seconds is None:
                raise bad("table_max_lag_seconds", "needs max_lag_seconds (every other table's SLA)")
            object.__setattr__(self, "table_max_lag_seconds", {str(t): float(v) for t, v in lags.items()})
        if self.pii is not None:
            from airflow_pgcdc.store.privacy import parse_rules
            from airflow_pgcdc.typemap.privacy import PiiError

            try:
                parse_rules(self.pii, "pii")
            except PiiError as exc:
                raise bad("pii", str(exc)) from None
            object.__setattr__(self, "pii", {str(t): dict(c) for t, c in self.pii.items()})
        for field in ("change_data_feed", "metadata_columns", "soft_deletes"):
            if not isinstance(getattr(self, field), bool):
                raise bad(field, f"must be true or false, got {getattr(self, field)!r}")
        if self.catalog is not None or self.catalog_prefix is not None:
            from airflow_pgcdc.merge.options import BadMergeOption, MergeOptions

            try:
                MergeOptions(catalog=self.catalog, catalog_prefix=self.catalog_prefix or "")
            except BadMergeOption as e:
                raise bad("catalog", str(e)) from None
        if self.table_options is not None:
            from airflow_pgcdc.merge.options import BadMergeOption, MergeOptions

            try:
                checked = MergeOptions(table_options=self.table_options).table_options
            except BadMergeOption as e:
                raise bad("table_options", str(e)) from None
            object.__setattr__(self, "table_options", checked or None)

    def dag_id(self, kind: str) -> str:
        return f"{self.name}_{kind}"

    @classmethod
    def from_mapping(cls, entry: Mapping[str, Any], *, where: str = "") -> Pipeline:
        """A pipeline from one config entry; unknown fields are refused by name."""
        if not isinstance(entry, Mapping):
            raise PipelineConfigError(f"{where}a pipeline must be a mapping of settings, got {entry!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(entry) - known)
        if unknown:
            raise PipelineConfigError(f"{where}unknown setting(s) {', '.join(unknown)} "
                                      f"(known: {', '.join(sorted(known))})")
        missing = sorted(f.name for f in dataclasses.fields(cls)
                         if f.default is dataclasses.MISSING and f.name not in entry)
        if missing:
            raise PipelineConfigError(f"{where}missing setting(s) {', '.join(missing)}")
        values = dict(entry)
        for field in ("tables", "tags"):
            if field in values and isinstance(values[field], list):
                values[field] = tuple(values[field])
        try:
            return cls(**values)
        except PipelineConfigError as e:
            raise PipelineConfigError(f"{where}{e}") from None


def load_pipelines(path: str | Path) -> list[Pipeline]:
    """The pipelines of a JSON (``.json``) or YAML (``.yaml``/``.yml``) file: a list of
    entries, or a mapping whose ``pipelines`` is that list. Names must be unique."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise PipelineConfigError(f"{path}: cannot read the pipelines file: {e}") from None
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            doc = yaml.safe_load(text)
        else:
            import json

            doc = json.loads(text)
    except Exception as e:  # noqa: BLE001 - any parse error, named with the file
        kind = "YAML" if path.suffix.lower() in (".yaml", ".yml") else "JSON"
        raise PipelineConfigError(f"{path}: not valid {kind}: {e}") from None
    entries = doc.get("pipelines") if isinstance(doc, Mapping) else doc
    if not isinstance(entries, list) or not entries:
        raise PipelineConfigError(f"{path}: expected a non-empty list of pipelines (or a mapping with one "
                                  f"under 'pipelines'), got {type(entries).__name__}")
    out = [Pipeline.from_mapping(e, where=f"{path}, pipeline {i + 1}: ") for i, e in enumerate(entries)]
    names = [p.name for p in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise PipelineConfigError(f"{path}: pipeline name(s) {', '.join(twice)} used more than once "
                                  "(each pipeline's DAG ids start with its name)")
    return out
