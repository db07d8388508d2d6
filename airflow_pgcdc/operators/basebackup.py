"""``PgcdcBaseBackupOperator`` (formerly ``PgBaseBackupToS3Operator``): a physical ``BASE_BACKUP`` streamed into S3."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from airflow.exceptions import AirflowProviderDeprecationWarning
from airflow.sdk import BaseOperator

from airflow_pgcdc.hooks.pgcdc import PgcdcHook
from airflow_pgcdc.operators.renamed import renamed_argument
from airflow_pgcdc.operators.values import options_or_fields


class PgcdcBaseBackupOperator(BaseOperator):
    """Stream ``BASE_BACKUP`` archives (and ``backup_manifest``) into
    ``{to}/basebackup/{backup_id}/``, never buffering an archive in memory.

    Pushes ``{"backup_id", "url", "start_lsn", "end_lsn", "timeline", "archives":
    {name: bytes}, "seconds"}``. The role needs ``REPLICATION``.

    :param store: ``s3://bucket/prefix`` (templated; ``to``: its 0.1 name, warns)
    :param backup_id: folder name (templated; default: a time-sorted id)
    :param backup_label: the BASE_BACKUP LABEL (templated; ``label`` is taken by BaseOperator)
    :param checkpoint: ``fast`` or ``spread``
    :param compression: server-side ``gzip``, ``lz4`` or ``zstd`` (None: uncompressed)
    :param compression_detail: level, or ``{"level": n, "workers": n}`` (zstd)
    :param max_rate: KB/s limit on the server's send rate
    :param wal: include the WAL that makes the backup consistent
    :param manifest: ``yes``, ``force-encode`` or ``no``
    :param options: the backup's options whole, a
        :class:`~airflow_pgcdc.snapshot.options.BaseBackupOptions` or a mapping of its fields
        (templated; ``label`` there is the BASE_BACKUP label), instead of the separate
        arguments above
    """

    template_fields: Sequence[str] = ("store", "backup_id", "backup_label", "postgres_conn_id", "aws_conn_id",
                                      "options")
    ui_color = "#d5f5e3"

    def __init__(
        self,
        *,
        store: str | None = None,
        backup_id: str | None = None,
        backup_label: str | None = None,
        checkpoint: str | None = None,
        compression: str | None = None,
        compression_detail: Any = None,
        max_rate: int | None = None,
        wal: bool | None = None,
        verify_checksums: bool | None = None,
        manifest: str | None = None,
        manifest_checksums: str | None = None,
        options: Any = None,
        postgres_conn_id: str = PgcdcHook.default_conn_name,
        aws_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        store = renamed_argument(kwargs, "to", "store", store, "PgcdcBaseBackupOperator")
        options_or_fields("PgcdcBaseBackupOperator", options, **self._fields(locals()))
        super().__init__(**kwargs)
        self.store = store
        self.backup_id = backup_id
        self.backup_label = backup_label
        self.checkpoint = checkpoint
        self.compression = compression
        self.compression_detail = compression_detail
        self.max_rate = max_rate
        self.wal = wal
        self.verify_checksums = verify_checksums
        self.manifest = manifest
        self.manifest_checksums = manifest_checksums
        self.options = options
        self.postgres_conn_id = postgres_conn_id
        self.aws_conn_id = aws_conn_id

    @staticmethod
    def _fields(given: dict[str, Any]) -> dict[str, Any]:
        """The backup's options among the operator's arguments, by their options' names."""
        names = ("backup_id", "checkpoint", "compression", "compression_detail", "max_rate", "wal",
                 "verify_checksums", "manifest", "manifest_checksums")
        out = {n: given.get(n) for n in names}
        out["backup_id"] = out["backup_id"] or None
        out["label"] = given.get("backup_label")
        return out

    def execute(self, context) -> dict[str, Any]:
        from airflow_pgcdc.snapshot.basebackup import base_backup_to_s3
        from airflow_pgcdc.snapshot.options import BaseBackupOptions

        hook = PgcdcHook(self.postgres_conn_id, self.aws_conn_id)
        self.log.info("base backup of %s into %s", hook.safe_dsn(), self.store)
        options = options_or_fields("PgcdcBaseBackupOperator", self.options, BaseBackupOptions,
                                    **self._fields(vars(self)))
        result = base_backup_to_s3(hook.get_dsn(), self.store, options=options, s3=hook.s3_client())
        info = result.info
        return {
            "backup_id": result.backup_id,
            "url": result.url,
            "start_lsn": info.start_lsn,
            "end_lsn": info.end_lsn,
            "timeline": info.timeline,
            "archives": {a.name: a.bytes for a in info.archives},
            "seconds": round(result.seconds, 3),
        }


class PgBaseBackupToS3Operator(PgcdcBaseBackupOperator):
    """The name PgcdcBaseBackupOperator had before 0.2: kept for one release, with a deprecation warning."""

    def __init__(self, **kwargs: Any) -> None:
        warnings.warn(
            "PgBaseBackupToS3Operator is now PgcdcBaseBackupOperator (airflow_pgcdc.operators.basebackup); the old name goes in the next release",
            AirflowProviderDeprecationWarning,
            stacklevel=2,
        )
        super().__init__(**kwargs)
