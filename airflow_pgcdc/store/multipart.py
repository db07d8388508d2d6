""":class:`MultipartWriter`: a write-only file object streaming one S3 object as a multipart
upload with bounded memory (parts uploaded by background threads).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from airflow_pgcdc.store.s3 import (
    DEFAULT_PART_SIZE,
    MAX_PART_SIZE,
    MAX_PARTS,
    MIN_PART_SIZE,
    ObjectNotFound,
    StoreError,
    UploadAborted,
    _retry_conflict,
    _s3_call,
    validate_bucket,
    validate_key,
    write_args,
)

log = logging.getLogger("airflow_pgcdc.store.s3")  # the name its records had before the move

EARLY_PARTS = 1_000
""":meth:`MultipartWriter.upload_ready` sends at most this many parts of an object (at least
5 MiB each); the rest go as full ``part_size`` buffers, so the largest object stays close to
what ``part_size`` and S3's 10,000 parts allow (a snapshot part of a table never analyzed
is one object for the whole table)."""

# --------------------------------------------------------------------------- multipart writer


class MultipartWriter:
    """A binary, write-only file object streaming to one S3 object with bounded memory.

    Bytes are buffered up to ``part_size``; each full buffer becomes one part of a multipart
    upload, uploaded by up to ``max_in_flight`` background threads (``0``: in the caller's
    thread). At most ``max_in_flight`` parts are in flight, so memory stays below
    ``part_size * (max_in_flight + 1)``. :meth:`close` completes the upload; an object that
    fits in one part goes as a single PutObject instead. On an exception inside ``with``,
    or on :meth:`abort`, the multipart upload is aborted: nothing half-written ever becomes
    visible. ``if_none_match=True`` makes the final put/complete conditional
    (``If-None-Match: *``): :class:`AlreadyExists` if the key exists, and nothing is written.

    :meth:`flush` does not upload (parts below 5 MiB are not allowed); :meth:`tell` and
    :attr:`bytes_written` count the bytes accepted so far. Dropping an unclosed writer
    aborts its upload (best effort); always close or abort explicitly.
    """

    def __init__(
        self,
        client: Any,
        bucket: str,
        key: str,
        *,
        part_size: int = DEFAULT_PART_SIZE,
        max_in_flight: int = 1,
        if_none_match: bool = False,
        content_type: str | None = None,
        metadata: Mapping[str, str] | None = None,
        extra_args: Mapping[str, Any] | None = None,
    ) -> None:
        validate_bucket(bucket)
        validate_key(key, bucket=bucket)
        if not MIN_PART_SIZE <= part_size <= MAX_PART_SIZE:
            raise ValueError(
                f"part_size must be between {MIN_PART_SIZE} and {MAX_PART_SIZE} bytes, got {part_size}"
            )
        if max_in_flight < 0:
            raise ValueError(f"max_in_flight must be >= 0, got {max_in_flight}")
        self.client = client
        self.bucket = bucket
        self.key = key
        self.part_size = part_size
        self.max_in_flight = max_in_flight
        self.if_none_match = if_none_match
        # what every object this client writes carries (encryption, ACL), then the caller's
        self._extra: dict[str, Any] = {**write_args(client), **(extra_args or {})}
        if content_type:
            self._extra["ContentType"] = content_type
        if metadata:
            self._extra["Metadata"] = dict(metadata)
        self._buf = bytearray()
        self._written = 0
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []
        self._pending: deque[Future] = deque()
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._state = "open"  # open | closed | aborted
        self._failure: BaseException | None = None
        self.etag: str | None = None
        self.multipart: bool = False
        self.elapsed: float = 0.0
        self._started = time.monotonic()

    # -- file protocol

    def __repr__(self) -> str:
        return (
            f"<MultipartWriter s3://{self.bucket}/{self.key} {self._state} {self._written} bytes>"
        )

    @property
    def closed(self) -> bool:
        return self._state != "open"

    @property
    def aborted(self) -> bool:
        return self._state == "aborted"

    @property
    def bytes_written(self) -> int:
        return self._written

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def readable(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._written

    def flush(self) -> None:
        self._check_open("flush")

    def fileno(self) -> int:
        raise OSError("MultipartWriter has no file descriptor")

    def isatty(self) -> bool:
        return False

    def __enter__(self) -> MultipartWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    def __del__(self) -> None:  # pragma: no cover - GC timing
        if getattr(self, "_state", None) == "open" and getattr(self, "_upload_id", None):
            with contextlib.suppress(BaseException):
                self.abort()

    def write(self, data: Any) -> int:
        """Accept ``data`` (any bytes-like); upload full parts. Returns ``len(data)`` in bytes."""
        self._check_open("write")
        view = (
            memoryview(data).cast("B")
            if not isinstance(data, (bytes, bytearray))
            else memoryview(data)
        )
        n = len(view)
        pos = 0
        try:
            while pos < n:
                if len(self._buf) >= self.part_size:
                    self._ship(self._take_buffer())
                room = self.part_size - len(self._buf)
                chunk = view[pos : pos + room]
                self._buf += chunk
                pos += len(chunk)
        except BaseException:
            self.abort()
            raise
        self._written += n
        return n

    def upload_ready(self) -> bool:
        """Upload the buffered bytes now, as the next part, if there are at least S3's
        5 MiB for a part that is not the last (:data:`MIN_PART_SIZE`). Called at a natural
        boundary (the Parquet writer after each row group but the last), the upload
        overlaps what is written next, and :meth:`close` has only the tail left to send.
        Returns whether a part was shipped. After
        :data:`EARLY_PARTS` parts it does nothing: smaller parts than ``part_size`` would
        otherwise lower the largest object S3's 10,000 parts allow."""
        self._check_open("upload")
        if len(self._buf) < MIN_PART_SIZE or len(self._parts) + len(self._pending) >= EARLY_PARTS:
            return False
        try:
            self._ship(self._take_buffer())
        except BaseException:
            self.abort()
            raise
        return True

    def writelines(self, lines: Iterable[Any]) -> None:
        for line in lines:
            self.write(line)

    def close(self) -> None:
        """Upload what is left and complete the object. Idempotent once closed.

        Raises :class:`AlreadyExists` (``if_none_match``) or :class:`S3RequestError`; the
        multipart upload is aborted first, so a failed close leaves nothing behind.
        """
        if self._state == "closed":
            return
        if self._state == "aborted":
            raise UploadAborted(
                "the upload was aborted; nothing was written",
                bucket=self.bucket,
                key=self.key,
                operation="close",
            )
        try:
            if self._upload_id is None:
                self._put_single(self._take_buffer())
            else:
                if self._buf:
                    self._ship(self._take_buffer())
                self._drain(0)
                self._complete()
        except BaseException:
            self.abort()
            raise
        self._state = "closed"
        self.elapsed = time.monotonic() - self._started
        self._shutdown_pool()
        log.debug("wrote %s (%d bytes, %d parts)", self.url, self._written, len(self._parts) or 1)

    def detach_small(self, limit: int) -> bytes | None:
        """The whole content, when it is at most ``limit`` bytes and no part of it was
        uploaded: the writer is then closed without writing anything (the caller writes
        the bytes elsewhere, e.g. into a pack, :mod:`.packs`). ``None`` (and the writer
        unchanged) otherwise."""
        if self._state != "open" or self._upload_id is not None or self._pending or self._failure is not None:
            return None
        if len(self._buf) > limit or self._written != len(self._buf):
            return None
        body = bytes(self._take_buffer())
        self._state = "closed"
        self.elapsed = time.monotonic() - self._started
        self._shutdown_pool()
        return body

    def abort(self) -> None:
        """Abort: discard buffered bytes and the multipart upload. Never raises for a
        writer already closed or aborted; errors while aborting are logged, not raised."""
        if self._state != "open":
            return
        self._state = "aborted"
        self._buf = bytearray()
        for fut in self._pending:
            fut.cancel()
        for fut in list(self._pending):
            with contextlib.suppress(BaseException):
                fut.result()
        self._pending.clear()
        self._shutdown_pool()
        if self._upload_id is not None:
            try:
                with _s3_call("AbortMultipartUpload", self.bucket, self.key):
                    self.client.abort_multipart_upload(
                        Bucket=self.bucket, Key=self.key, UploadId=self._upload_id
                    )
            except StoreError as e:
                if not isinstance(e, ObjectNotFound):  # NoSuchUpload: already gone
                    log.warning("could not abort the multipart upload of %s: %s", self.url, e)

    # -- internals

    def _check_open(self, op: str) -> None:
        if self._state == "aborted":
            raise UploadAborted(
                "the upload was aborted", bucket=self.bucket, key=self.key, operation=op
            )
        if self._state == "closed":
            raise ValueError(f"I/O operation on closed MultipartWriter ({self.url})")
        if self._failure is not None:
            raise self._failure

    def _take_buffer(self) -> bytearray:
        buf, self._buf = self._buf, bytearray()
        return buf

    def _put_single(self, body: bytearray) -> None:
        kwargs = dict(self._extra)
        if self.if_none_match:
            kwargs["IfNoneMatch"] = "*"
        with _s3_call("PutObject", self.bucket, self.key):
            resp = _retry_conflict(
                lambda: self.client.put_object(
                    Bucket=self.bucket, Key=self.key, Body=body, **kwargs
                )
            )
        self.etag = resp.get("ETag")

    def _ship(self, body: bytearray) -> None:
        """Upload ``body`` as the next part (starting the multipart upload if needed)."""
        if self._upload_id is None:
            with _s3_call("CreateMultipartUpload", self.bucket, self.key):
                resp = self.client.create_multipart_upload(
                    Bucket=self.bucket, Key=self.key, **self._extra
                )
            self._upload_id = resp["UploadId"]
            self.multipart = True
        number = len(self._parts) + len(self._pending) + 1
        if number > MAX_PARTS:
            raise StoreError(
                f"more than {MAX_PARTS} parts of {self.part_size} bytes: use a larger part_size",
                bucket=self.bucket,
                key=self.key,
                operation="UploadPart",
            )
        if self.max_in_flight == 0:
            self._parts.append(self._upload_part(number, body))
            return
        self._drain(self.max_in_flight - 1)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=self.max_in_flight, thread_name_prefix="pgcdc-s3-upload"
            )
        self._pending.append(self._pool.submit(self._upload_part, number, body))

    def _drain(self, keep: int) -> None:
        """Wait until at most ``keep`` parts are in flight (oldest first, so parts stay ordered)."""
        while len(self._pending) > keep:
            fut = self._pending.popleft()
            try:
                self._parts.append(fut.result())
            except BaseException as e:
                self._failure = e
                raise

    def _upload_part(self, number: int, body: bytearray) -> dict[str, Any]:
        with _s3_call(f"UploadPart {number}", self.bucket, self.key):
            resp = self.client.upload_part(
                Bucket=self.bucket,
                Key=self.key,
                UploadId=self._upload_id,
                PartNumber=number,
                Body=body,
            )
        part = {"PartNumber": number, "ETag": resp["ETag"]}
        for name in (
            "ChecksumCRC32",
            "ChecksumCRC32C",
            "ChecksumSHA1",
            "ChecksumSHA256",
            "ChecksumCRC64NVME",
        ):
            if resp.get(name):
                part[name] = resp[name]
        return part

    def _complete(self) -> None:
        kwargs: dict[str, Any] = {}
        if self.if_none_match:
            kwargs["IfNoneMatch"] = "*"
        parts = sorted(self._parts, key=lambda p: p["PartNumber"])
        with _s3_call("CompleteMultipartUpload", self.bucket, self.key):
            resp = _retry_conflict(
                lambda: self.client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=self.key,
                    UploadId=self._upload_id,
                    MultipartUpload={"Parts": parts},
                    **kwargs,
                )
            )
        self.etag = resp.get("ETag")

    def _shutdown_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


