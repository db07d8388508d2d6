"""The object-store contract: S3 primitives, key layout, Parquet part writers, manifests.

May import ``changes``, pyarrow and boto3; never Airflow. See ``DESIGN.md``,
"Contracts that other people depend on".
"""

from airflow_pgcdc.store.s3 import (
    AccessDenied,
    AlreadyExists,
    CorruptObject,
    InvalidS3Url,
    MultipartWriter,
    ObjectNotFound,
    S3Location,
    S3RequestError,
    S3Settings,
    StoreError,
    UploadAborted,
    delete_prefix,
    delta_storage_options,
    exists,
    get_bytes,
    get_json,
    list_keys,
    make_pyarrow_fs,
    make_s3_client,
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
    "delete_prefix",
    "delta_storage_options",
    "exists",
    "get_bytes",
    "get_json",
    "list_keys",
    "make_pyarrow_fs",
    "make_s3_client",
    "put_bytes",
    "put_if_absent",
]
