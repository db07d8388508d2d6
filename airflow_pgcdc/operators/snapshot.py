"""``PgcdcSnapshotOperator`` (formerly ``PgSnapshotToS3Operator``): the initial copy (exported snapshot -> Parquet on S3)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.exceptions import AirflowProviderDeprecationWarning
from airflow.sdk import Asset, BaseOperator

from airflow_pgcdc.hooks.pgcdc import PgcdcHook
from airflow_pgcdc.operators.assets import default_outlets, emit
from airflow_pgcdc.operators.lineage import ReportsLineage
from airflow_pgcdc.operators.renamed import renamed_argument
from airflow_pgcdc.operators.values import flag, number, options_or_fields


def snapshot_asset(to: str, slot: str) -> Asset:
    """The Asset a snapshot of ``slot`` under ``to`` (s3://bucket/prefix) updates."""
    return Asset(uri=f"{to.rstrip('/')}/{slot}/snapshot", name=f"pgcdc-snapshot-{slot}")


class PgcdcSnapshotOperator(ReportsLineage, BaseOperator):
    """Create ``slot`` with an exported snapshot and copy the tables to S3 as Parquet.

    Pushes (return value / XCom ``return_value``)::

        {"snapshot_id", "slot", "consistent_point", "snapshot_name", "system_id", "timeline",
         "manifest": "s3://.../_manifest.json", "rows", "bytes",
         "tables": {"schema.table": {"rows", "parts", "has_key"}}}

    and an Asset event on ``s3://bucket/prefix/<slot>/snapshot`` with
    ``{snapshot_id, consistent_point, rows}`` as extra (through the AssetAlias
    ``pgcdc-snapshot[-<slot>]`` when ``store`` or ``slot`` is templated; see
    :mod:`airflow_pgcdc.operators.assets`).

    :param store: ``s3://bucket/prefix`` (templated)
    :param slot: replication slot to create (templated)
    :param publications: copy their tables: a name or a list of names (templated); or
        ``tables`` (``publication``: its 0.2 name, warns)
    :param tables: ``["schema.table", ...]`` (templated)
    :param workers: parallel COPY sessions (default 4)
    :param rows_per_part: rows per Parquet part (CTID ranges; default 1,000,000)
    :param two_phase: create the slot with TWO_PHASE
    :param as_text: ``{"schema.table": ["column", ...]}``: columns kept as their exact
        PostgreSQL text whatever their type (templated; give the drain the same)
    :param pii: the slot's column rules, ``{"schema.table": {"column": "hash" | "exclude" |
        "mask" | "mask:N"}}`` (templated): written to the store, applied by every later job
    :param pii_key_conn_id: Airflow connection whose password is the hash key of the slot's
        column rules (any connection type; default: the worker's ``PGCDC_PII_KEY``) (templated)
    :param options: the snapshot's options whole, a
        :class:`~airflow_pgcdc.snapshot.options.SnapshotOptions` or a mapping of its fields
        (templated), instead of the separate arguments above
    :param postgres_conn_id: Airflow ``postgres`` connection
    :param aws_conn_id: Airflow ``aws`` connection; ``None``: boto3's environment
    """

    template_fields: Sequence[str] = ("store", "slot", "publications", "tables", "workers", "rows_per_part", "as_text",
                                      "pii", "pii_key_conn_id", "postgres_conn_id", "aws_conn_id", "options")
    ui_color = "#d6eaf8"

    def __init__(
        self,
        *,
        store: str | None = None,
        slot: str,
        publications: str | Sequence[str] | None = None,
        tables: Sequence[str] | None = None,
        workers: int | None = None,
        rows_per_part: int | None = None,
        two_phase: bool | None = None,
        as_text: dict[str, Sequence[str]] | None = None,
        pii: Mapping[str, Mapping[str, str]] | None = None,
        pii_key_conn_id: str | None = None,
        options: Any = None,
        postgres_conn_id: str = PgcdcHook.default_conn_name,
        aws_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        store = renamed_argument(kwargs, "to", "store", store, "PgcdcSnapshotOperator")
        publications = renamed_argument(kwargs, "publication", "publications", publications, "PgcdcSnapshotOperator",
                                        required=None)
        options_or_fields("PgcdcSnapshotOperator", options, tables=tables, workers=workers,
                          rows_per_part=rows_per_part, two_phase=two_phase, as_text=as_text, pii=pii)
        if "outlets" not in kwargs:
            kwargs["outlets"] = default_outlets("snapshot", store, slot, snapshot_asset)
        super().__init__(**kwargs)
        self.store = store
        self.slot = slot
        self.publications = publications
        self.tables = list(tables) if tables else None
        self.workers = workers
        self.rows_per_part = rows_per_part
        self.two_phase = two_phase
        self.as_text = as_text
        self.pii = pii
        self.pii_key_conn_id = pii_key_conn_id
        self.options = options
        self.postgres_conn_id = postgres_conn_id
        self.aws_conn_id = aws_conn_id


    def execute(self, context) -> dict[str, Any]:
        from airflow_pgcdc.snapshot.export import snapshot_to_s3
        from airflow_pgcdc.snapshot.options import SnapshotOptions
        from airflow_pgcdc.store.layout import Layout

        hook = PgcdcHook(self.postgres_conn_id, self.aws_conn_id)
        self.log.info("snapshot of %s into %s, slot %s", hook.safe_dsn(), self.store, self.slot)
        options = options_or_fields(
            "PgcdcSnapshotOperator", self.options, SnapshotOptions, tables=self.tables,
            workers=number(self.workers, int, "workers", minimum=1),
            rows_per_part=number(self.rows_per_part, int, "rows_per_part", minimum=1),
            two_phase=None if self.two_phase is None else flag(self.two_phase, "two_phase"),
            as_text=self.as_text or None, pii=self.pii or None)
        with hook.pii_key(self.pii_key_conn_id):
            manifest = snapshot_to_s3(hook.get_dsn(), self.store, slot=self.slot,
                                      publications=self.publications or None, options=options, s3=hook.s3_client())
        layout = Layout.parse(self.store)
        from airflow_pgcdc.operators.lineage import postgres_tables, s3_dataset

        dsn, store, slot = hook.get_dsn(), self.store, self.slot
        self._lineage = lambda: (postgres_tables(dsn, [f"{t.schema}.{t.table}" for t in manifest.tables]),
                                 [s3_dataset(f"{store.rstrip('/')}/{slot}/snapshot", rows=manifest.rows,
                                             size=manifest.bytes)])
        result = {
            "snapshot_id": manifest.snapshot_id,
            "slot": manifest.slot,
            "consistent_point": manifest.consistent_point,
            "snapshot_name": manifest.snapshot_name,
            "system_id": manifest.system_id,
            "timeline": manifest.timeline,
            "manifest": layout.url(layout.snapshot_manifest(manifest.slot, manifest.snapshot_id)),
            "rows": manifest.rows,
            "bytes": manifest.bytes,
            "tables": {
                f"{t.schema}.{t.table}": {"rows": t.rows, "parts": len(t.parts), "has_key": t.has_key}
                for t in manifest.tables
            },
        }
        emit(self, context, snapshot_asset(self.store, self.slot), {
            "snapshot_id": manifest.snapshot_id,
            "consistent_point": manifest.consistent_point,
            "rows": manifest.rows,
        })
        return result


class PgSnapshotToS3Operator(PgcdcSnapshotOperator):
    """The name PgcdcSnapshotOperator had before 0.2: kept for one release, with a deprecation warning."""

    def __init__(self, **kwargs: Any) -> None:
        warnings.warn(
            "PgSnapshotToS3Operator is now PgcdcSnapshotOperator (airflow_pgcdc.operators.snapshot); the old name goes in the next release",
            AirflowProviderDeprecationWarning,
            stacklevel=2,
        )
        super().__init__(**kwargs)
