"""Spark Python Data Sources over the store (the path that needs no Hadoop S3 jar).

* ``pgcdc_parquet`` (reader): the Parquet parts named in the ``parts`` option
  (``bucket/key`` paths, JSON list), one Spark partition per part, read on the
  executors through pyarrow's S3 filesystem and conformed to the ``schema`` option (an
  Arrow schema: missing columns become NULL, types are cast, e.g. ``time`` to int64
  microseconds for Delta). Yields Arrow record batches (no per-row Python).
* ``pgcdc_staging`` (writer): each task writes its Arrow batches, conformed to the
  ``schema`` option, to one Parquet file under the ``staging`` prefix; ``commit`` (on
  the driver, after every task succeeded) writes ``_staged.json`` listing exactly the
  files of the successful tasks (a failed or speculative attempt's file is never
  listed); ``abort`` deletes the files it was told of. The Delta commit itself is done
  by the driver program from ``_staged.json`` (see :mod:`.deltars`), which then removes
  the staging prefix.

How executors reach S3: the driver passes its :class:`~airflow_pgcdc.store.s3.S3Settings`
as ``s3.*`` options (:func:`s3_options`); fields it leaves unset fall back to the
executor's own environment and credential chain (an instance role, say). The secret
key and session token travel under option names that Spark's default
``spark.redaction.regex`` masks (``secret``, ``token``) in plans and the UI.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)

__all__ = [
    "READ_BATCH_ROWS",
    "STAGED_LIST",
    "PgcdcParquetSource",
    "PgcdcStagingSink",
    "conform",
    "conformed_batches",
    "decode_schema",
    "encode_schema",
    "register",
    "s3_options",
]

READ_BATCH_ROWS = 65_536
STAGED_LIST = "_staged.json"


def encode_schema(schema: pa.Schema) -> str:
    """An Arrow schema as an option string (IPC, base64)."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def decode_schema(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with exactly ``schema``'s columns, in order: cast where the type differs,
    NULL where the batch lacks the column; other columns dropped."""
    n = batch.num_rows
    names = batch.schema.names
    arrays = []
    for f in schema:
        if f.name in names:
            a = batch.column(f.name)
            if a.type != f.type:
                a = a.cast(f.type)
        else:
            a = pa.nulls(n, f.type)
        arrays.append(a)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def conformed_batches(fs, path: str, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The Parquet file at ``path`` (a ``bucket/key`` path on ``fs``) in batches conformed to
    ``schema`` (:func:`conform`): what the reader's executors and the driver's small-batch
    path (:mod:`.rows.arrow`) both read."""
    import pyarrow.parquet as pq

    from airflow_pgcdc.store.packs import open_part

    with open_part(fs, path) as f:  # a part of a pack: its byte range
        for batch in pq.ParquetFile(f).iter_batches(batch_size=READ_BATCH_ROWS):
            yield conform(batch, schema)


_S3_FIELDS = ("endpoint_url", "region", "addressing_style", "access_key_id",
              "secret_access_key", "session_token", "sse", "sse_kms_key_id", "acl", "role_arn",
              "role_session_name", "external_id", "role_seconds", "sts_endpoint_url")


def s3_options(settings) -> dict[str, str]:
    """The ``s3.*`` options that carry ``settings`` to the executors (set fields only)."""
    return {
        f"s3.{name}": str(getattr(settings, name))
        for name in _S3_FIELDS
        if getattr(settings, name) is not None
    }


def _settings(options):
    from airflow_pgcdc.store.s3 import S3Settings

    given = {n: options[f"s3.{n}"] for n in _S3_FIELDS if options.get(f"s3.{n}")}
    if "role_seconds" in given:
        given["role_seconds"] = int(given["role_seconds"])
    return S3Settings.from_env(**given)


def _fs(options):
    from airflow_pgcdc.store.s3 import make_pyarrow_fs

    return make_pyarrow_fs(_settings(options))


def _open_output(options, path: str, fs=None):
    """A writable file for ``path`` (``bucket/key``): Arrow's (on ``fs`` when given), or with
    server-side encryption asked for (which Arrow's S3 client cannot send) a boto3 upload
    that does."""
    settings = _settings(options)
    if not settings.sse:
        from airflow_pgcdc.store.s3 import make_pyarrow_fs

        return (fs or make_pyarrow_fs(settings)).open_output_stream(path)
    from airflow_pgcdc.store.multipart import MultipartWriter
    from airflow_pgcdc.store.s3 import make_s3_client

    bucket, key = path.split("/", 1)
    return MultipartWriter(make_s3_client(settings), bucket, key, max_in_flight=2)


_registered: set[int] = set()


def register(spark) -> None:
    """Register both data sources with a Spark session (once per session)."""
    if id(spark) in _registered:
        return
    spark.dataSource.register(PgcdcParquetSource)
    spark.dataSource.register(PgcdcStagingSink)
    _registered.add(id(spark))


# --------------------------------------------------------------------------- reader


class _Part(InputPartition):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


class _PartsReader(DataSourceReader):
    def __init__(self, parts: list[str], schema: pa.Schema, options) -> None:
        self.parts = parts
        self.arrow_schema = schema
        self.options = dict(options)

    def partitions(self):
        return [_Part(p) for p in self.parts]

    def read(self, partition) -> Iterator[pa.RecordBatch]:
        yield from conformed_batches(_fs(self.options), partition.path, self.arrow_schema)


class PgcdcParquetSource(DataSource):
    """``spark.read.format("pgcdc_parquet").option("parts", json).option("schema", enc)``."""

    @classmethod
    def name(cls) -> str:
        return "pgcdc_parquet"

    def _arrow_schema(self) -> pa.Schema:
        return decode_schema(self.options["schema"])

    def schema(self):
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(self._arrow_schema())

    def reader(self, schema):
        return _PartsReader(json.loads(self.options["parts"]), self._arrow_schema(), self.options)


# --------------------------------------------------------------------------- staging writer


@dataclass
class StagedFiles(WriterCommitMessage):
    paths: list[str] = field(default_factory=list)
    rows: int = 0


class _StagingWriter(DataSourceArrowWriter):
    def __init__(self, staging: str, schema: pa.Schema, options) -> None:
        self.staging = staging.rstrip("/") + "/"
        self.arrow_schema = schema
        self.options = dict(options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedFiles:
        import pyarrow.parquet as pq
        from pyspark import TaskContext

        ctx = TaskContext.get()
        pid = ctx.partitionId() if ctx else 0
        attempt = ctx.attemptNumber() if ctx else 0
        path = f"{self.staging}part-{pid:05d}-{attempt}-{uuid.uuid4().hex[:8]}.parquet"
        fs = sink = None
        writer = None
        rows = 0
        try:
            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                if writer is None:
                    fs = _fs(self.options)
                    sink = _open_output(self.options, path, fs)
                    writer = pq.ParquetWriter(sink, self.arrow_schema, compression="zstd")
                writer.write_batch(conform(batch, self.arrow_schema))
                rows += batch.num_rows
        except BaseException:
            if writer is not None:
                writer.close()
                _delete(fs, [path])
            raise
        if writer is None:
            return StagedFiles([], 0)
        writer.close()
        if not sink.closed:  # a boto3 upload: completed here
            sink.close()
        return StagedFiles([path], rows)

    def commit(self, messages) -> None:
        paths = [p for m in messages if m is not None for p in m.paths]
        rows = sum(m.rows for m in messages if m is not None)
        with _open_output(self.options, self.staging + STAGED_LIST) as out:
            out.write(json.dumps({"paths": paths, "rows": rows}).encode())

    def abort(self, messages) -> None:
        paths = [p for m in messages if m is not None for p in m.paths]
        if paths:
            _delete(_fs(self.options), paths)


def _delete(fs, paths: list[str]) -> None:
    for p in paths:
        try:
            fs.delete_file(p)
        except (FileNotFoundError, OSError):
            pass


class PgcdcStagingSink(DataSource):
    """``df.write.format("pgcdc_staging").option("staging", "bucket/prefix/")
    .option("schema", enc).mode("append").save()``."""

    @classmethod
    def name(cls) -> str:
        return "pgcdc_staging"

    def schema(self):  # pragma: no cover - write-only
        raise NotImplementedError("pgcdc_staging is write-only")

    def writer(self, schema, overwrite: bool):
        return _StagingWriter(
            self.options["staging"], decode_schema(self.options["schema"]), self.options
        )
