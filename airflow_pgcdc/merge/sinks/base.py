"""The one interface the merge writes Delta tables through (:class:`DeltaSink`), and what a
commit records (:class:`Commit`). An engine is chosen once per job
(:func:`.engines.sink_class`, then ``JobContext.sink``): the table-level code (:mod:`.table`, the
history tables, keyless tables) calls the sink's methods and never asks which engine it is.
Adding a Delta feature (a table property, metadata columns, a change feed, partitioning)
touches the two implementations in :mod:`.engines`, not the callers.

Rows come as a Spark DataFrame, or, where the engine merges Arrow on the driver
(:attr:`DeltaSink.driver_batches`) and the caller chose to, as an Arrow table (no Spark job).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_pgcdc.lake.tables import CHANGE_DATA_FEED

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_pgcdc.merge.context import JobContext

__all__ = ["Commit", "DeltaSink"]


@dataclass(frozen=True)
class Commit:
    """What one commit records beside its rows: the table's app transaction ``(app,
    version)`` (the last window it holds whole), the app transactions of a replay's cut or a
    slice (``cut``; only engines with :attr:`DeltaSink.multi_transaction` take them), and the
    commit's metadata."""

    app: str
    version: int
    metadata: Mapping[str, str]
    cut: Mapping[str, int] = field(default_factory=dict)


class DeltaSink(ABC):
    """Writes one job's Delta tables with one engine; each method is one commit (or, for
    :meth:`create`, the creation) and returns what the engine reports."""

    engine: ClassVar[str]
    """The ``--engine`` name."""
    dialect: ClassVar[str]
    """The SQL dialect of its MERGE clauses (:func:`airflow_pgcdc.lake.sql.quote_ident`)."""
    driver_batches: ClassVar[bool]
    """Small batches and copies may come as Arrow tables read on the driver (no Spark job)."""
    multi_transaction: ClassVar[bool]
    """A commit records several app transactions (a replay's cut, a slice's point)."""
    writes_deletion_vectors: ClassVar[bool]
    """``--deletion-vectors`` is honoured."""
    conditional_commits: ClassVar[bool]
    """Commits are conditional puts on S3: no lock of the Delta root is needed against upkeep."""
    needs_jars: ClassVar[bool]
    """The Spark session needs Delta's and hadoop-aws' jars."""
    concurrent_tables: ClassVar[bool]
    """Tables of one job may be merged at once by driver threads (``--table-workers`` above 1;
    each table's commit stays its own, with its app transaction)."""

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx

    # ``where``, in every writing method: ``(schema, table, label)``, the folder under the job's
    # staging prefix an engine that stages rows puts them in

    def properties(self, fields: Sequence[pa.Field], *, by: str = "sink",
                   table: str | None = None) -> dict[str, str] | None:
        """The table properties of a table this job creates, the one place that decides them
        (a new property is added here, or in an engine's override). ``by``: what creates it:
        ``"sink"`` (this engine: a pipeline table's bootstrap), ``"history"`` (a changelog or
        SCD2 table), ``"delta-rs"`` (delta-rs whatever the engine: the empty table made at a
        table's first change, a resync's replacement). ``table``: the pipeline table's
        ``schema.table``, for what it asks for itself (the change data feed)."""
        from airflow_pgcdc.merge.schema import table_configuration

        conf = table_configuration(list(fields)) or {}
        if by != "history" and table is not None and self.ctx.wants_change_data_feed(table):
            conf[CHANGE_DATA_FEED] = "true"
        if by not in ("sink", "history") and table is not None:  # delta-rs writes it, whatever the engine
            self._refuse_clustering_by_delta_rs(table, fields)
        return conf or None

    def _refuse_clustering_by_delta_rs(self, table: str, fields: Sequence[pa.Field]) -> None:
        """A table that asks for liquid clustering (``cluster_by``) is not written by delta-rs,
        which can neither create nor replace a clustered table (:func:`~airflow_pgcdc.lake.inspect.clustered`):
        :class:`~..options.BadMergeOption` naming the table and what to do."""
        cols = self.ctx.cluster_columns(table, [f.name for f in fields])
        if not cols:
            return
        from airflow_pgcdc.merge.options import BadMergeOption

        raise BadMergeOption(
            f"table {table}: cluster_by={','.join(cols)}: its Delta table would be written by delta-rs here (a "
            "resync's replacement, or the empty table made at the first change of a table no snapshot held), and "
            "delta-rs 1.6.6 can neither create nor replace a liquid-clustered table",
            hint=f"leave cluster_by out for {table} (a resync of a table that is clustered already also needs its "
                 "Delta table removed first: delta-rs cannot replace it), then cluster the new table on Delta's "
                 "Spark engine: ALTER TABLE delta.`s3a://…` CLUSTER BY (…); see docs/operations.md, liquid clustering")

    def enable_change_data_feed(self, url: str, dt) -> None:
        """Turn the change data feed on for the existing table ``dt`` at ``url`` (one commit
        that sets the property and raises the protocol to what it needs)."""
        dt.alter.set_table_properties({CHANGE_DATA_FEED: "true"}, raise_if_not_exists=False)

    def add_clustered_columns(self, name: str, url: str, fields: Sequence[pa.Field]) -> None:
        """Add the new nullable columns ``fields`` to ``name``'s liquid-clustered Delta table at
        ``url``. delta-rs commits nothing to a clustered table: refused here (a
        :class:`~..errors.MergeError` naming the table); Delta's Spark engine adds them."""
        from airflow_pgcdc.merge.errors import MergeError

        raise MergeError(f"table {name}: new column(s) {[f.name for f in fields]}, and its Delta table {url} is "
                         "liquid-clustered: delta-rs 1.6.6 commits nothing to a clustered table",
                         hint="merge it with --engine delta-spark (engine='delta-spark'), as the job that clustered it did")

    def before_merge(self, name: str, url: str, dt):
        """``dt`` made ready for a MERGE of this job (the table reloaded if it changed)."""
        return dt

    @abstractmethod
    def create(self, url: str, rows, schema: pa.Schema, *, metadata: Mapping[str, str],
               configuration: Mapping[str, str] | None, where: tuple[str, str, str], keys: Sequence[str] = (),
               copy_bytes: int | None = None, sized: bool = True, partition_by: Sequence[str] = (),
               cluster_by: Sequence[str] = ()) -> int:
        """Create the table from ``rows`` in one commit (``TableExists`` if it is there);
        returns the row count. ``keys``: sort the rows by them (the merge key; key-sorted
        files are what a merge prunes by); ``copy_bytes``: the copy's Parquet bytes (the file
        count); ``sized``: files of the job's target size; ``partition_by``: its partition
        columns; ``cluster_by``: its liquid-clustering columns (an engine that cannot write
        them refuses, :class:`~..options.BadMergeOption`)."""

    @abstractmethod
    def append(self, url: str, dt, rows, schema: pa.Schema, commit: Commit, *, where: tuple[str, str, str],
               mode: str = "append") -> dict[str, Any]:
        """Append ``rows`` (``mode="overwrite"``: replace the table's) in one commit."""

    @abstractmethod
    def merge(self, url: str, dt, rows, schema: pa.Schema, spec: Callable[[str], Any], commit: Commit, *,
              where: tuple[str, str, str], bound_key: str | None = None, scd2: bool = False) -> dict[str, Any]:
        """One MERGE commit of ``rows`` with the clauses ``spec(dialect)`` builds; ``bound_key``:
        bound the target to the batch's key ranges on that integer key (:mod:`..pruning`);
        ``scd2``: the clauses are an SCD2 history's."""

    @abstractmethod
    def keyless(self, url: str, dt, rows, source, fields: Sequence[pa.Field], spec: Callable[[str], Any],
                commit: Commit, *, where: tuple[str, str, str]) -> dict[str, Any]:
        """A keyless table's commit: ``rows`` replace the table (a truncate), or the multiset
        ``source`` is merged by ``spec(dialect)`` (an empty one: an empty append, for the app
        transaction alone)."""

    @abstractmethod
    def read(self, url: str, dt, fields: Sequence[pa.Field]):
        """The table's rows at ``dt``'s version, as a Spark DataFrame of ``fields``."""

