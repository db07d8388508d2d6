"""The object-store contract: S3 primitives, key layout, Parquet part writers, manifests.

May import ``changes``, pyarrow and boto3; never Airflow. See ``DESIGN.md``,
"Contracts that other people depend on".

- :mod:`.s3`: locations, settings and clients (boto3, pyarrow, delta-rs), conditional
  puts, listing and deletion, typed errors (re-exported here);
- :mod:`.multipart`: MultipartWriter, a streaming multipart upload;
- :mod:`.layout`: every key of the store and the ``{schema}.{table}`` segment encoding;
- :mod:`.parquet`: ParquetPartWriter and PartSequence (imports pyarrow);
- :mod:`.manifest`: SnapshotManifest and BaseBackupInfo (``"format": 1``).
"""

from airflow_pgcdc.store.multipart import MultipartWriter
from airflow_pgcdc.store.s3 import (
    AccessDenied,
    AlreadyExists,
    CorruptObject,
    InvalidS3Url,
    ObjectNotFound,
    S3Location,
    S3RequestError,
    S3Settings,
    StoreError,
    UploadAborted,
    abort_uploads_under,
    commit_if_absent,
    delete_keys,
    delete_prefix,
    delta_storage_options,
    exists,
    get_bytes,
    get_json,
    list_keys,
    list_objects,
    make_pyarrow_fs,
    make_s3_client,
    pending_uploads,
    put_bytes,
    put_if_absent,
)

__all__ = [
    "AccessDenied",
    "AlreadyExists",
    "CorruptObject",
    "InvalidS3Url",
    "MultipartWriter",
    "ObjectNotFound",
    "S3Location",
    "S3RequestError",
    "S3Settings",
    "StoreError",
    "UploadAborted",
    "abort_uploads_under",
    "commit_if_absent",
    "delete_keys",
    "delete_prefix",
    "delta_storage_options",
    "exists",
    "get_bytes",
    "get_json",
    "list_keys",
    "list_objects",
    "make_pyarrow_fs",
    "make_s3_client",
    "pending_uploads",
    "put_bytes",
    "put_if_absent",
]
