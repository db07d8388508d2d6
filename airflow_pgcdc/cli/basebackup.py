"""``pgcdc basebackup``: a physical base backup (``BASE_BACKUP``) streamed to S3.

Prints the backup's ``backup.json`` on stdout; progress goes to stderr. S3 endpoint and
credentials follow boto3's conventions (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, …).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TextIO

_LOGGER = "airflow_pgcdc.snapshot.basebackup"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "basebackup",
        help="stream a physical base backup (BASE_BACKUP) to S3",
        description=(
            "Take a base backup of a PostgreSQL 15+ cluster with BASE_BACKUP and stream each "
            "archive straight into S3 under <prefix>/basebackup/<backup id>/: base.tar[.gz|.lz4|.zst], "
            "one <tablespace oid>.tar… per tablespace, backup_manifest, and backup.json written "
            "last. Prints backup.json on stdout. The role needs the REPLICATION attribute. "
            "S3 endpoint and credentials come from the environment (AWS_ENDPOINT_URL, "
            "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, or a profile)."
        ),
    )
    add_arguments(p)
    p.set_defaults(handler=run, _parser=p)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from airflow_pgcdc.cli import add_dsn_argument

    add_dsn_argument(p, 'of the source cluster')
    p.add_argument("--store", "--to", dest="store", required=True, metavar="S3URL",
                   help="destination: s3://bucket/prefix (--to: its 0.1 name)")
    p.add_argument("--backup-id", metavar="ID", help="backup id (default: a new time-sorted id)")
    p.add_argument("--label", default="pgcdc", help="backup label (default: pgcdc)")
    p.add_argument(
        "--checkpoint", choices=("fast", "spread"), default="fast",
        help="checkpoint at the start: fast (default) or spread",
    )
    p.add_argument("--no-wal", dest="wal", action="store_false", help="do not include the WAL (a restore then needs a WAL archive)")
    p.add_argument("--no-wait", dest="wait", action="store_false", help="do not wait for the last WAL segment to be archived")
    p.add_argument("--compression", choices=("gzip", "lz4", "zstd"), help="server-side compression (as the server build supports)")
    p.add_argument("--compression-detail", metavar="DETAIL", help="a level, or level=N[,workers=N] (workers: zstd)")
    p.add_argument("--max-rate", type=int, metavar="KB", help="limit the transfer rate, in kB/s (32..1048576; 0: unlimited)")
    p.add_argument("--no-tablespace-map", dest="tablespace_map", action="store_false", help="do not write a tablespace_map file")
    p.add_argument("--no-verify-checksums", dest="verify_checksums", action="store_false", help="do not verify data page checksums")
    p.add_argument(
        "--manifest", choices=("yes", "force-encode", "no"), default="yes",
        help="backup manifest (default: yes)",
    )
    p.add_argument(
        "--manifest-checksums", type=str.upper,
        choices=("NONE", "CRC32C", "SHA224", "SHA256", "SHA384", "SHA512"), default="CRC32C",
        help="checksum algorithm of the manifest (default: CRC32C)",
    )
    p.add_argument(
        "--progress-interval", type=float, default=10.0, metavar="SEC",
        help="log progress every SEC seconds on stderr (default: 10; 0: off)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from airflow_pgcdc.protocol.commands import CommandError
    from airflow_pgcdc.snapshot.basebackup import base_backup_to_s3
    from airflow_pgcdc.snapshot.options import BaseBackupOptions
    from airflow_pgcdc.store.layout import LayoutError
    from airflow_pgcdc.store.s3 import InvalidS3Url

    out = out or sys.stdout
    # progress and notes go to stderr, once (not also through handlers on the root logger)
    handler = None
    logger = logging.getLogger(_LOGGER)
    saved = logger.level, logger.propagate
    if not args.quiet:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("pgcdc: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    try:
        result = base_backup_to_s3(args.dsn, args.store, options=BaseBackupOptions.from_args(args))
    except (CommandError, InvalidS3Url, LayoutError) as e:
        parser = getattr(args, "_parser", None)
        if parser is not None:
            parser.error(str(e))  # a usage error: exit 2
        raise
    finally:
        if handler is not None:
            logger.removeHandler(handler)
            logger.setLevel(saved[0])
            logger.propagate = saved[1]
    out.write(result.info.to_json())
    out.flush()
    return 0
