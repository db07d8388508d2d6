"""S3 primitives of the store: locations, clients, conditional puts, object operations.

Streaming uploads are :class:`~airflow_pgcdc.store.multipart.MultipartWriter`'s.
What stays here (about 780 lines: errors, locations, settings and clients, object
operations) is one namespace that the jobs use as ``s3store.<name>`` at over 150 call
sites; its sections are short and independent, and cutting it further would
split that vocabulary without making any piece easier to read.

Everything here is plain boto3 (and pyarrow for :func:`make_pyarrow_fs`); nothing imports
Airflow. Functions take a boto3 S3 client explicitly, so callers decide how clients are
built and shared (boto3 clients are thread-safe; sessions are not).

Settings follow boto3's conventions (:meth:`S3Settings.from_env`):

- ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL`` (both ignored when
  ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS`` is true); path-style addressing is used when an
  endpoint URL is set (S3-compatible servers rarely do virtual-hosted buckets);
- ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``; when absent,
  boto3's credential chain (profiles, SSO, instance metadata) resolves them;
- ``AWS_REGION``, else ``AWS_DEFAULT_REGION``; ``AWS_MAX_ATTEMPTS``, ``AWS_RETRY_MODE``.

Errors are :class:`StoreError` subclasses naming the bucket, the key, the operation and
the S3 error code. Secret keys never appear in errors, logs or ``repr``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from airflow_pgcdc.errors import HintedError, PgcdcError

log = logging.getLogger(__name__)

MiB = 1024 * 1024
MIN_PART_SIZE = 5 * MiB  # S3: every part but the last is at least 5 MiB
MAX_PART_SIZE = 5 * 1024 * MiB  # S3: at most 5 GiB per part
MAX_PARTS = 10_000  # S3: part numbers 1..10000
DEFAULT_PART_SIZE = 16 * MiB
MAX_KEY_BYTES = 1024  # S3: keys are at most 1024 bytes of UTF-8


# --------------------------------------------------------------------------- errors


class StoreError(PgcdcError):
    """An error of the object store; names the bucket, key, operation and S3 error code.

    ``bucket``, ``key``, ``operation`` and ``code`` may be ``None`` when not applicable.
    """

    def __init__(
        self,
        reason: str,
        *,
        bucket: str | None = None,
        key: str | None = None,
        operation: str | None = None,
        code: str | None = None,
    ) -> None:
        self.reason = reason
        self.bucket = bucket
        self.key = key
        self.operation = operation
        self.code = code
        super().__init__(self._render())

    @property
    def url(self) -> str | None:
        if self.bucket is None:
            return self.key
        return f"s3://{self.bucket}/{self.key}" if self.key is not None else f"s3://{self.bucket}"

    def _render(self) -> str:
        where = []
        if self.operation:
            where.append(self.operation)
        if self.url:
            where.append(self.url)
        head = " ".join(where)
        tail = f" [{self.code}]" if self.code else ""
        return f"{head}: {self.reason}{tail}" if head else f"{self.reason}{tail}"



class InvalidS3Url(StoreError, ValueError):
    """An ``s3://bucket/prefix`` URL (or a key) that is malformed."""


class S3RequestError(StoreError):
    """An S3 request failed (after boto3's retries); ``code`` is S3's error code."""


class ObjectNotFound(S3RequestError):
    """The object (or bucket: ``code`` says which) does not exist."""


class AlreadyExists(S3RequestError):
    """A conditional create (``If-None-Match: *``) found the object already there."""


class AccessDenied(S3RequestError):
    """The credentials in use may not perform the request."""


class UploadAborted(StoreError):
    """A :class:`MultipartWriter` was aborted (or failed) and cannot be written or completed."""


class CorruptObject(StoreError):
    """An object's content is not what it must be (e.g. not JSON where JSON is expected)."""


_NOT_FOUND_CODES = {"NoSuchKey", "NoSuchBucket", "NoSuchUpload", "404", "NotFound"}
_ACCESS_CODES = {"AccessDenied", "403", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch"}


def _wrap(
    exc: BaseException,
    *,
    operation: str,
    bucket: str | None,
    key: str | None,
) -> StoreError:
    """Turn a botocore exception into a typed :class:`StoreError` (never mentions secrets)."""
    from botocore.exceptions import BotoCoreError, ClientError

    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {}) or {}
        code = str(
            err.get("Code") or exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or ""
        )
        message = str(err.get("Message") or "request failed")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("PreconditionFailed", "412") or status == 412:
            cls: type[StoreError] = AlreadyExists
            message = "the object already exists (conditional create refused)"
        elif code in _NOT_FOUND_CODES or status == 404:
            cls = ObjectNotFound
            if code in ("404", "NotFound"):
                code = "NoSuchKey" if key else "NoSuchBucket"
        elif code in _ACCESS_CODES or status == 403:
            cls = AccessDenied
        else:
            cls = S3RequestError
        return cls(message, bucket=bucket, key=key, operation=operation, code=code or None)
    if isinstance(exc, BotoCoreError):
        # e.g. EndpointConnectionError, NoCredentialsError, ReadTimeoutError: their text
        # names the endpoint or the missing setting, never a secret.
        return S3RequestError(
            str(exc), bucket=bucket, key=key, operation=operation, code=type(exc).__name__
        )
    return S3RequestError(
        f"{type(exc).__name__}: {exc}",
        bucket=bucket,
        key=key,
        operation=operation,
        code=type(exc).__name__,
    )


@contextlib.contextmanager
def _s3_call(operation: str, bucket: str | None, key: str | None = None) -> Iterator[None]:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (ClientError, BotoCoreError) as e:
        raise _wrap(e, operation=operation, bucket=bucket, key=key) from e


# --------------------------------------------------------------------------- locations

# AWS general-purpose bucket names: 3-63 chars, lowercase letters, digits, dots, hyphens,
# starting and ending with a letter or digit; not formatted like an IP address.
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_IP_RE = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")


def validate_bucket(bucket: str) -> str:
    """Return ``bucket`` if it is a valid S3 bucket name, else raise :class:`InvalidS3Url`."""
    if not isinstance(bucket, str) or not _BUCKET_RE.match(bucket):
        raise InvalidS3Url(
            f"invalid bucket name {bucket!r}: 3-63 characters, lowercase letters, digits, '.' "
            "and '-', starting and ending with a letter or digit"
        )
    if ".." in bucket or _IP_RE.match(bucket):
        raise InvalidS3Url(f"invalid bucket name {bucket!r}: no '..' and not an IP address")
    return bucket


def validate_key(key: str, *, bucket: str | None = None) -> str:
    """Return ``key`` if it is usable as an S3 key (non-empty, ≤ 1024 UTF-8 bytes, no NUL)."""
    if not isinstance(key, str) or not key:
        raise InvalidS3Url(
            "an object key must be a non-empty string", bucket=bucket, key=key or None
        )
    if "\x00" in key:
        raise InvalidS3Url(
            "an object key cannot contain NUL", bucket=bucket, key=key.replace("\x00", "\\0")
        )
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError as e:  # lone surrogates
        raise InvalidS3Url(f"an object key must be valid Unicode: {e}", bucket=bucket) from None
    if size > MAX_KEY_BYTES:
        raise InvalidS3Url(
            f"object key is {size} bytes of UTF-8, more than S3's {MAX_KEY_BYTES}",
            bucket=bucket,
            key=key[:80] + "…",
        )
    return key


@dataclass(frozen=True)
class S3Location:
    """A bucket and a key prefix: ``s3://bucket/prefix`` (the prefix has no leading or
    trailing slash and may be empty)."""

    bucket: str
    prefix: str = ""

    def __post_init__(self) -> None:
        validate_bucket(self.bucket)
        _validate_prefix(self.prefix, self.bucket)

    @classmethod
    def parse(cls, url: str) -> S3Location:
        """Parse ``s3://bucket[/prefix[/]]``; raise :class:`InvalidS3Url` saying what is wrong.

        Refused: other schemes, credentials/ports/query/fragment in the URL, invalid bucket
        names, empty (``a//b``) or relative (``.``/``..``) prefix segments, control characters.
        """
        if not isinstance(url, str):
            raise InvalidS3Url(f"an S3 URL must be a string, not {type(url).__name__}")
        if not url.startswith("s3://"):
            scheme = url.split("://", 1)[0] + "://" if "://" in url else "no scheme"
            raise InvalidS3Url(
                f"not an S3 URL ({scheme}): expected s3://bucket/prefix, got {url!r}"
            )
        rest = url[len("s3://") :]
        if "?" in rest or "#" in rest:
            raise InvalidS3Url(f"an S3 URL takes no query or fragment: {url!r}")
        bucket, _, prefix = rest.partition("/")
        if "@" in bucket or ":" in bucket:
            raise InvalidS3Url(
                f"put credentials and endpoints in the environment or connection, not the URL: "
                f"s3://{bucket.rpartition('@')[2]}/…"
            )
        if not bucket:
            raise InvalidS3Url(f"an S3 URL needs a bucket: {url!r}")
        validate_bucket(bucket)
        return cls(bucket, prefix.rstrip("/"))

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def __str__(self) -> str:
        return self.url

    def key(self, *parts: str) -> str:
        """The key ``prefix/part/part…`` (parts joined with ``/``; none may be empty)."""
        for p in parts:
            if not p:
                raise InvalidS3Url("empty key segment", bucket=self.bucket, key=self.prefix)
        key = "/".join(([self.prefix] if self.prefix else []) + [p.strip("/") for p in parts])
        return validate_key(key, bucket=self.bucket)

    def child(self, *parts: str) -> S3Location:
        """The location ``prefix/part/…`` in the same bucket."""
        return S3Location(self.bucket, self.key(*parts))


def _validate_prefix(prefix: str, bucket: str) -> None:
    if not isinstance(prefix, str):
        raise InvalidS3Url(f"prefix must be a string, not {type(prefix).__name__}", bucket=bucket)
    if not prefix:
        return
    if prefix.startswith("/") or prefix.endswith("/"):
        raise InvalidS3Url("a prefix has no leading or trailing '/'", bucket=bucket, key=prefix)
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in prefix):
        raise InvalidS3Url(
            "control characters in the prefix",
            bucket=bucket,
            key=prefix.encode("unicode_escape").decode(),
        )
    for seg in prefix.split("/"):
        if seg in ("", ".", ".."):
            raise InvalidS3Url(
                f"prefix segment {seg!r} is not allowed (empty, '.' or '..')",
                bucket=bucket,
                key=prefix,
            )
    validate_key(prefix, bucket=bucket)


# --------------------------------------------------------------------------- settings and clients

_TRUE = {"1", "true", "yes", "on"}

SSE_ALGORITHMS = ("AES256", "aws:kms", "aws:kms:dsse")
"""Server-side encryption of every object written (``S3Settings.sse``): SSE-S3, SSE-KMS,
dual-layer SSE-KMS, as S3's ``x-amz-server-side-encryption`` header names them."""

CANNED_ACLS = ("private", "bucket-owner-full-control", "bucket-owner-read")
"""Canned ACLs every object written may carry (``S3Settings.acl``)."""

_S3A_ENCRYPTION = {"AES256": "AES256", "aws:kms": "SSE-KMS", "aws:kms:dsse": "DSSE-KMS"}
_S3A_ACL = {"private": "Private", "bucket-owner-full-control": "BucketOwnerFullControl",
            "bucket-owner-read": "BucketOwnerRead"}


WRITE_ENV = {"PGCDC_S3_SSE": "sse", "PGCDC_S3_SSE_KMS_KEY_ID": "sse_kms_key_id", "PGCDC_S3_ACL": "acl"}
"""The environment variables of :meth:`S3Settings.from_env` for what every written object
carries (boto3 has none of its own for them)."""

ROLE_ENV = {"PGCDC_S3_ROLE_ARN": "role_arn", "PGCDC_S3_ROLE_SESSION_NAME": "role_session_name",
            "PGCDC_S3_EXTERNAL_ID": "external_id", "PGCDC_S3_ROLE_SECONDS": "role_seconds",
            "AWS_ENDPOINT_URL_STS": "sts_endpoint_url"}
"""The environment variables of :meth:`S3Settings.from_env` for the role to assume."""

SELF_REFRESHING = frozenset({"iam-role", "container-role", "assume-role-with-web-identity"})
"""boto3's credential methods that delta-rs (object_store) and Arrow (the AWS C++ SDK) find
in the same environment and refresh themselves (instance metadata, the container's
endpoint, ``AWS_ROLE_ARN`` + ``AWS_WEB_IDENTITY_TOKEN_FILE``): they are given no keys, so a
job of any length keeps fresh ones. Other methods (a profile's files, SSO, a process) are
resolved by boto3 and handed over as they are when the client is made."""


@dataclass(frozen=True)
class S3Settings:
    """How to reach S3: one object from which boto3, pyarrow and delta-rs clients are built.

    ``None`` means "let the SDK decide" (credential chain, configured region). Secrets are
    excluded from ``repr``.
    """

    endpoint_url: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    region: str | None = None
    profile: str | None = None
    addressing_style: str | None = None  # "path" | "virtual" | "auto"; None: path iff endpoint_url
    max_attempts: int = 5  # total attempts, first one included (as AWS_MAX_ATTEMPTS)
    retry_mode: str = "standard"
    connect_timeout: float = 10.0
    read_timeout: float = 120.0
    max_pool_connections: int = 32
    # every object written: server-side encryption (SSE_ALGORITHMS), its KMS key (id, ARN or
    # alias; None: the account's default key) and a canned ACL (CANNED_ACLS)
    sse: str | None = None
    sse_kms_key_id: str | None = None
    acl: str | None = None
    # a role assumed with STS (AssumeRole) from the credentials above (or the chain's), its
    # credentials refreshed by every boto3 client and by S3A; sts_endpoint_url: STS' address
    # (None: boto3's, which honours AWS_ENDPOINT_URL_STS)
    role_arn: str | None = None
    role_session_name: str = "pgcdc"
    external_id: str | None = field(default=None, repr=False)
    role_seconds: int = 3600
    sts_endpoint_url: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> S3Settings:
        """Settings from boto3's environment variables (``os.environ`` by default)."""
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            value = env.get(name)
            return value if value not in (None, "") else None

        endpoint = None
        if (get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS") or "").lower() not in _TRUE:
            endpoint = get("AWS_ENDPOINT_URL_S3") or get("AWS_ENDPOINT_URL")
        values: dict[str, Any] = dict(
            endpoint_url=endpoint,
            access_key_id=get("AWS_ACCESS_KEY_ID"),
            secret_access_key=get("AWS_SECRET_ACCESS_KEY"),
            session_token=get("AWS_SESSION_TOKEN"),
            region=get("AWS_REGION") or get("AWS_DEFAULT_REGION"),
            profile=get("AWS_PROFILE"),
        )
        if get("AWS_MAX_ATTEMPTS"):
            try:
                values["max_attempts"] = int(get("AWS_MAX_ATTEMPTS"))  # type: ignore[arg-type]
            except ValueError:
                raise StoreError(
                    f"AWS_MAX_ATTEMPTS must be an integer, got {get('AWS_MAX_ATTEMPTS')!r}"
                ) from None
        if get("AWS_RETRY_MODE"):
            values["retry_mode"] = get("AWS_RETRY_MODE")
        for name, field_name in (WRITE_ENV | ROLE_ENV).items():
            if get(name):
                values[field_name] = get(name)
        if "role_seconds" in values:
            try:
                values["role_seconds"] = int(values["role_seconds"])
            except ValueError:
                raise StoreError(f"PGCDC_S3_ROLE_SECONDS must be an integer, got {values['role_seconds']!r}") from None
        values.update(overrides)
        return cls(**values)

    def __post_init__(self) -> None:
        if self.endpoint_url is not None:
            url = self.endpoint_url
            if not isinstance(url, str) or "@" in url:
                raise StoreError(
                    "S3 endpoint URL must be http(s)://host[:port], without credentials"
                )
            parts = urlsplit(url)
            try:
                parts.port  # noqa: B018 - raises on a bad port
            except ValueError:
                raise StoreError(f"S3 endpoint URL has a bad port: {url!r}") from None
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise StoreError(f"S3 endpoint URL must be http(s)://host[:port], got {url!r}")
            if parts.query or parts.fragment:
                raise StoreError(f"S3 endpoint URL takes no query or fragment: {url!r}")
        if self.addressing_style not in (None, "path", "virtual", "auto"):
            raise StoreError(
                f"addressing_style must be path, virtual or auto, got {self.addressing_style!r}"
            )
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise StoreError("set both the access key id and the secret access key, or neither")
        if self.sse is not None and self.sse not in SSE_ALGORITHMS:
            raise StoreError(f"server-side encryption must be one of {', '.join(SSE_ALGORITHMS)}, got {self.sse!r} "
                             "(PGCDC_S3_SSE, or the aws connection's extra server_side_encryption)")
        if self.sse_kms_key_id is not None and not (self.sse or "").startswith("aws:kms"):
            raise StoreError(f"a KMS key id ({self.sse_kms_key_id!r}) needs server-side encryption aws:kms or "
                             f"aws:kms:dsse, not {self.sse!r}")
        if self.role_arn is not None and not str(self.role_arn).startswith("arn:"):
            raise StoreError(f"role_arn must be an ARN (arn:aws:iam::<account>:role/<name>), got {self.role_arn!r}")
        if not 900 <= int(self.role_seconds) <= 43200:
            raise StoreError(f"the assumed role's session must last 900 to 43200 seconds (STS' limits), "
                             f"got {self.role_seconds!r}")
        if self.acl is not None and self.acl not in CANNED_ACLS:
            raise StoreError(f"the objects' ACL must be one of {', '.join(CANNED_ACLS)}, got {self.acl!r} "
                             "(PGCDC_S3_ACL, or the aws connection's extra acl)")

    def write_args(self) -> dict[str, str]:
        """boto3's arguments for every PutObject and CreateMultipartUpload: the encryption
        and the ACL these settings ask for (empty when none)."""
        args: dict[str, str] = {}
        if self.sse:
            args["ServerSideEncryption"] = self.sse
        if self.sse_kms_key_id:
            args["SSEKMSKeyId"] = self.sse_kms_key_id
        if self.acl:
            args["ACL"] = self.acl
        return args

    def s3a_conf(self) -> dict[str, str]:
        """Hadoop S3A's settings for the same encryption and ACL (without the ``spark.hadoop.``
        prefix)."""
        conf: dict[str, str] = {}
        if self.sse:
            conf["fs.s3a.encryption.algorithm"] = _S3A_ENCRYPTION[self.sse]
        if self.sse_kms_key_id:
            conf["fs.s3a.encryption.key"] = self.sse_kms_key_id
        if self.acl:
            conf["fs.s3a.acl.default"] = _S3A_ACL[self.acl]
        return conf

    @property
    def effective_addressing_style(self) -> str:
        if self.addressing_style:
            return self.addressing_style
        return "path" if self.endpoint_url else "auto"

    @property
    def allow_http(self) -> bool:
        return bool(self.endpoint_url and self.endpoint_url.startswith("http://"))

    def with_(self, **changes: Any) -> S3Settings:
        return replace(self, **changes)

    def resolved_credentials(self) -> tuple[str, str, str | None] | None:
        """(access key, secret key, session token) now: the settings' own, the assumed
        role's (refreshed when less than 15 minutes are left) or boto3's chain's."""
        if self.access_key_id and self.secret_access_key and not self.role_arn:
            return self.access_key_id, self.secret_access_key, self.session_token
        creds = credentials(self)
        if creds is None:
            return None
        frozen = creds.get_frozen_credentials()
        return frozen.access_key, frozen.secret_key, frozen.token

    def handed_credentials(self) -> tuple[str, str, str | None] | None:
        """What delta-rs and Arrow are given: :meth:`resolved_credentials`, except ``None``
        when they find and refresh the same credentials themselves (boto3's chain found them
        by a :data:`SELF_REFRESHING` method)."""
        if not (self.access_key_id and self.secret_access_key) and not self.role_arn:
            creds = credentials(self)
            if creds is None or getattr(creds, "method", None) in SELF_REFRESHING:
                return None
            frozen = creds.get_frozen_credentials()
            return frozen.access_key, frozen.secret_key, frozen.token
        return self.resolved_credentials()

    def resolved_region(self) -> str:
        if self.region:
            return self.region
        import boto3

        session = boto3.Session(profile_name=self.profile) if self.profile else boto3.Session()
        return session.region_name or "us-east-1"


_loader: Any = None
_loader_lock = threading.Lock()
_credentials: dict[tuple, Any] = {}
_credentials_lock = threading.Lock()


def credentials(settings: S3Settings) -> Any:
    """botocore credentials for ``settings``: with a ``role_arn``, refreshable ones from STS
    AssumeRole (renewed before they expire), one object per process and source; else boto3's
    chain's for the profile, looked up now (the environment may have changed); ``None`` when
    the chain finds none. Static keys without a role need none of this."""
    if not settings.role_arn:
        return _session(settings.profile).get_credentials()
    key = (settings.role_arn, settings.role_session_name, settings.external_id, settings.role_seconds,
           settings.sts_endpoint_url, settings.region, settings.profile, settings.access_key_id,
           settings.secret_access_key, settings.session_token)
    with _credentials_lock:
        if key not in _credentials:
            _credentials[key] = _assumed_role(settings)
        return _credentials[key]


def _assumed_role(settings: S3Settings) -> Any:
    from botocore.credentials import RefreshableCredentials

    source = _session(settings.profile)
    kwargs: dict[str, Any] = {}
    if settings.access_key_id:
        kwargs = {"aws_access_key_id": settings.access_key_id, "aws_secret_access_key": settings.secret_access_key,
                  "aws_session_token": settings.session_token}
    if settings.sts_endpoint_url:
        kwargs["endpoint_url"] = settings.sts_endpoint_url
    sts = source.client("sts", region_name=settings.region or source.region_name or "us-east-1", **kwargs)
    ask: dict[str, Any] = {"RoleArn": settings.role_arn, "RoleSessionName": settings.role_session_name,
                           "DurationSeconds": int(settings.role_seconds)}
    if settings.external_id:
        ask["ExternalId"] = settings.external_id

    def fetch() -> dict[str, str]:
        with _s3_call("AssumeRole", None, settings.role_arn):
            got = sts.assume_role(**ask)["Credentials"]
        log.info("assumed role %s (session %s) until %s", settings.role_arn, settings.role_session_name,
                 got["Expiration"].isoformat())
        return {"access_key": got["AccessKeyId"], "secret_key": got["SecretAccessKey"],
                "token": got["SessionToken"], "expiry_time": got["Expiration"].isoformat()}

    return RefreshableCredentials.create_from_metadata(fetch(), fetch, "assume-role")


def _session(profile: str | None):
    """A new boto3 session sharing this process's botocore data loader.

    A fresh session parses botocore's S3 model and endpoint rules again: 75 ms of CPU
    per client here, 8 ms with the loader shared. Only the (immutable) parsed data is
    shared; credentials and region are resolved by each session, from the environment
    as it is then. A process forked after a client was made inherits the parsed data.
    """
    global _loader
    import boto3
    import botocore.loaders
    import botocore.session

    with _loader_lock:
        if _loader is None:
            _loader = botocore.loaders.create_loader()
    core = botocore.session.get_session()
    core.register_component("data_loader", _loader)
    return boto3.Session(botocore_session=core, profile_name=profile)


def make_s3_client(settings: S3Settings | None = None, **overrides: Any):
    """A boto3 S3 client from ``settings`` (default: :meth:`S3Settings.from_env`).

    ``overrides`` replace fields of the settings (e.g. ``endpoint_url=...``). Retries use
    botocore's ``standard`` mode, timeouts are bounded, and path-style addressing is used
    when an endpoint URL is set.
    """
    from botocore.config import Config

    if settings is None:
        settings = S3Settings.from_env(**overrides)
    elif overrides:
        settings = replace(settings, **overrides)
    config = Config(
        s3={"addressing_style": settings.effective_addressing_style},
        retries={"total_max_attempts": settings.max_attempts, "mode": settings.retry_mode},
        connect_timeout=settings.connect_timeout,
        read_timeout=settings.read_timeout,
        max_pool_connections=settings.max_pool_connections,
    )
    session = _session(settings.profile)
    kwargs: dict[str, Any] = {"config": config}
    if settings.endpoint_url:
        kwargs["endpoint_url"] = settings.endpoint_url
    if settings.region:
        kwargs["region_name"] = settings.region
    if settings.role_arn:  # the role's refreshable credentials: the client renews them itself
        session._session._credentials = credentials(settings)
    elif settings.access_key_id:
        kwargs["aws_access_key_id"] = settings.access_key_id
        kwargs["aws_secret_access_key"] = settings.secret_access_key
        if settings.session_token:
            kwargs["aws_session_token"] = settings.session_token
    client = session.client("s3", **kwargs)
    client.pgcdc_settings = settings  # see settings_of
    return client


S3_OLD_NAMES = ("s3_client", "s3_settings", "settings")
"""The 0.1 names of a library call's ``s3`` parameter (accepted for one release)."""


def s3_argument(call: str, s3: Any, fields: dict[str, Any], *, needs_settings: bool = False
                ) -> tuple[S3Settings | None, Any]:
    """``(settings, client)`` from a library call's ``s3`` parameter: an :class:`S3Settings`
    (client ``None``: the call makes one when it needs one), or a boto3 S3 client (its
    settings known when :func:`make_s3_client` made it, else ``None``); ``None`` means the
    environment's settings. The 0.1 names ``s3_client``, ``s3_settings`` and ``settings`` are
    taken out of ``fields`` and accepted for one release with a :class:`DeprecationWarning`
    (the old pair of a client and its settings still works); giving ``s3`` and an old name is
    a :class:`TypeError`, and so is a client made elsewhere where ``needs_settings`` (delta-rs
    and Spark are given settings, not a client)."""
    import warnings

    old = {name: fields.pop(name) for name in S3_OLD_NAMES if fields.get(name) is not None}
    for name in S3_OLD_NAMES:
        fields.pop(name, None)
    if old:
        if s3 is not None:
            raise TypeError(f"{call}() got both 's3' and its old name(s) {', '.join(map(repr, old))}: give 's3' only")
        warnings.warn(f"{call}({'=..., '.join(old)}=...) is now {call}(s3=...) (S3Settings, or a client); the old "
                      "names go in the next release", DeprecationWarning, stacklevel=3)
    settings = client = None
    for value in (*old.values(), s3):
        if isinstance(value, S3Settings):
            settings = value
        elif value is not None:
            client = value
    if settings is None and client is not None:
        settings = settings_of(client)
    elif settings is None:
        settings = S3Settings.from_env()
    if needs_settings and settings is None:
        raise TypeError(f"{call}() needs S3Settings (or a client made by make_s3_client, which carries them), "
                        "not a client made elsewhere: delta-rs and Spark are given settings")
    return settings, client


def write_args(client: Any) -> dict[str, str]:
    """What every object ``client`` writes carries (:meth:`S3Settings.write_args` of the
    settings :func:`make_s3_client` made it from; none for a client made elsewhere)."""
    settings = settings_of(client)
    return settings.write_args() if settings is not None else {}


def settings_of(client: Any) -> S3Settings | None:
    """The settings ``client`` was made from by :func:`make_s3_client` (None for a client
    made elsewhere): what another process needs to make the same client."""
    settings = getattr(client, "pgcdc_settings", None)
    return settings if isinstance(settings, S3Settings) else None


def make_pyarrow_fs(settings: S3Settings | None = None, **overrides: Any):
    """A :class:`pyarrow.fs.S3FileSystem` reaching the same S3 as :func:`make_s3_client`.

    Paths on it are ``bucket/key`` (no scheme).
    """
    from pyarrow import fs as pafs

    if settings is None:
        settings = S3Settings.from_env(**overrides)
    elif overrides:
        settings = replace(settings, **overrides)
    kwargs: dict[str, Any] = {
        "region": settings.resolved_region(),
        "connect_timeout": settings.connect_timeout,
        "request_timeout": settings.read_timeout,
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=settings.max_attempts),
        "allow_bucket_creation": False,
        "allow_bucket_deletion": False,
    }
    creds = settings.handed_credentials()
    if creds is not None:
        kwargs["access_key"], kwargs["secret_key"] = creds[0], creds[1]
        if creds[2]:
            kwargs["session_token"] = creds[2]
    if settings.endpoint_url:
        parts = urlsplit(settings.endpoint_url)
        kwargs["scheme"] = parts.scheme
        kwargs["endpoint_override"] = parts.netloc + parts.path.rstrip("/")
    if settings.effective_addressing_style == "virtual":
        kwargs["force_virtual_addressing"] = True
    if settings.acl:  # Arrow sends it on every object it writes; encryption it cannot (see sse_sink)
        kwargs["default_metadata"] = {"ACL": settings.acl}
    return pafs.S3FileSystem(**kwargs)


def delta_storage_options(settings: S3Settings | None = None, **overrides: Any) -> dict[str, str]:
    """``storage_options`` for delta-rs (``deltalake``) reaching the same S3.

    delta-rs (object_store) takes its own keys: ``AWS_ENDPOINT_URL``, ``AWS_ALLOW_HTTP``
    (plain-http endpoints), ``AWS_REGION``, credentials, ``AWS_VIRTUAL_HOSTED_STYLE_REQUEST``.
    delta-rs 1.x commits with S3 conditional puts (``If-None-Match``; AWS S3 since 2024, and
    the test bed's server), so neither a locking provider (``AWS_S3_LOCKING_PROVIDER``, gone
    in 1.0) nor ``AWS_S3_ALLOW_UNSAFE_RENAME`` is set. Credentials: the settings' own, the
    assumed role's or boto3's chain's as they are now (:meth:`S3Settings.handed_credentials`;
    delta-rs does not read ``~/.aws`` profiles itself), or none when delta-rs finds and
    refreshes the chain's itself (an instance or container role, web identity).
    """
    if settings is None:
        settings = S3Settings.from_env(**overrides)
    elif overrides:
        settings = replace(settings, **overrides)
    opts: dict[str, str] = {"AWS_REGION": settings.resolved_region()}
    creds = settings.handed_credentials()
    if creds is not None:
        opts["AWS_ACCESS_KEY_ID"], opts["AWS_SECRET_ACCESS_KEY"] = creds[0], creds[1]
        if creds[2]:
            opts["AWS_SESSION_TOKEN"] = creds[2]
    if settings.endpoint_url:
        opts["AWS_ENDPOINT_URL"] = settings.endpoint_url
        if settings.allow_http:
            opts["AWS_ALLOW_HTTP"] = "true"
    opts["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = (
        "true" if settings.effective_addressing_style == "virtual" else "false"
    )
    if settings.acl:
        _warn_acl_once(settings.acl)
    if settings.sse:  # object_store sends it on every put of a data file and a log entry
        opts["AWS_SERVER_SIDE_ENCRYPTION"] = settings.sse
    if settings.sse_kms_key_id:
        opts["AWS_SSE_KMS_KEY_ID"] = settings.sse_kms_key_id
    return opts


_ACL_WARNED: set[str] = set()


def _warn_acl_once(acl: str) -> None:
    """delta-rs (object_store) has no setting for a canned ACL: its Delta files and log
    entries are written without it. Said once per process."""
    if acl not in _ACL_WARNED:
        _ACL_WARNED.add(acl)
        log.warning("the ACL %s is sent on every object this package writes itself (the store, the Spark "
                    "engine's and the staging files) but not on the Delta files delta-rs writes: it has no ACL "
                    "setting; with S3 Object Ownership 'bucket owner enforced' (AWS's default) the bucket owner "
                    "owns them anyway", acl)


def _retry_conflict(call, attempts: int = 5):
    """Retry a conditional write on 409 ConditionalRequestConflict (AWS asks callers to)."""
    from botocore.exceptions import ClientError

    for attempt in range(attempts):
        try:
            return call()
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code")
            if code != "ConditionalRequestConflict" or attempt == attempts - 1:
                raise
            time.sleep(0.05 * 2**attempt)
    raise AssertionError("unreachable")  # pragma: no cover


# --------------------------------------------------------------------------- object operations


def put_if_absent(
    client: Any,
    bucket: str,
    key: str,
    body: bytes | str,
    *,
    content_type: str | None = None,
) -> bool:
    """Create ``key`` with ``body`` only if no object has that key (``If-None-Match: *``).

    Returns ``True`` if this call created it, ``False`` if it already existed (left
    unchanged). This is the window-commit primitive: whoever creates the manifest owns
    the window. Other failures raise :class:`S3RequestError`.
    """
    validate_key(key, bucket=bucket)
    data = body.encode("utf-8") if isinstance(body, str) else bytes(body)
    kwargs: dict[str, Any] = {"IfNoneMatch": "*", **write_args(client)}
    if content_type:
        kwargs["ContentType"] = content_type
    try:
        with _s3_call("PutObject", bucket, key):
            _retry_conflict(lambda: client.put_object(Bucket=bucket, Key=key, Body=data, **kwargs))
    except AlreadyExists:
        return False
    return True


class ConditionalPutsIgnored(StoreError, HintedError):
    """The S3 server accepts ``If-None-Match: *`` but overwrites an existing object anyway
    (older MinIO releases and other S3-compatible stores): every commit of ours (manifests)
    and of delta-rs (Delta log entries) relies on that put failing, so two writers could
    both "commit" and one be lost. Refused before anything is committed."""

    def __init__(self, reason: str, *, hint: str | None = None, **where: Any) -> None:
        super().__init__(reason, **where)
        self.hint = hint


_CONDITIONAL_OK: set[tuple[str, str]] = set()  # (endpoint, bucket) probed in this process
PROBE_NAME = "_pgcdc_probe-"


def check_conditional_puts(client: Any, bucket: str, prefix: str = "") -> None:
    """Prove once per process and bucket that the server honours ``If-None-Match: *``: a
    probe object ``{prefix}_pgcdc_probe-<random>`` (beside what the caller writes: a policy
    that allows writes under a prefix allows it) is created, a second conditional put of
    it must be refused (412), and it is removed. Raises :class:`ConditionalPutsIgnored`
    when the second put overwrote."""
    endpoint = str(getattr(getattr(client, "meta", None), "endpoint_url", ""))
    if (endpoint, bucket) in _CONDITIONAL_OK:
        return
    import secrets as _secrets

    key = prefix + PROBE_NAME + _secrets.token_hex(8)
    try:
        if not put_if_absent(client, bucket, key, b"1"):
            raise ConditionalPutsIgnored(
                f"s3://{bucket}: a conditional put of a new object ({key}) was refused as if it existed",
                bucket=bucket, key=key)
        if put_if_absent(client, bucket, key, b"2"):
            raise ConditionalPutsIgnored(
                f"the S3 server at {endpoint or 'the default endpoint'} overwrote s3://{bucket}/{key} although "
                "the put said If-None-Match: * (it must answer 412 Precondition Failed): airflow-pgcdc's "
                "commits and delta-rs' Delta commits rely on that answer, so nothing is committed here",
                bucket=bucket, key=key,
                hint="use an S3 server that enforces conditional writes (AWS S3, a current MinIO, SeaweedFS, "
                     "Ceph RGW 18+, ...); see docs/operations.md")
    finally:
        try:
            client.delete_object(Bucket=bucket, Key=key)
        except Exception:  # noqa: BLE001 - a probe object left behind is harmless
            pass
    _CONDITIONAL_OK.add((endpoint, bucket))


def commit_if_absent(
    client: Any,
    bucket: str,
    key: str,
    body: bytes | str,
    *,
    content_type: str | None = None,
) -> bool:
    """:func:`put_if_absent` for a commit object (a manifest): ``True`` if the object
    now holds ``body`` because of this call. A put that the client retried after a
    success it did not see (a timeout, a dropped connection) answers "already exists"
    although the object is ours: the object is read back and compared, so that case is
    a success and only another writer's object is a lost race (``False``). ``body``
    must be unique to its writer (a manifest carries its attempt id and times)."""
    data = body.encode("utf-8") if isinstance(body, str) else bytes(body)
    check_conditional_puts(client, bucket, key.rpartition("/")[0] + "/" if "/" in key else "")  # once a bucket
    if put_if_absent(client, bucket, key, data, content_type=content_type):
        return True
    try:
        return get_bytes(client, bucket, key) == data
    except ObjectNotFound:  # removed meanwhile by someone: still not ours to claim
        return False


def put_bytes(
    client: Any,
    bucket: str,
    key: str,
    body: bytes | str,
    *,
    content_type: str | None = None,
) -> None:
    """Write ``key`` unconditionally (one PutObject)."""
    validate_key(key, bucket=bucket)
    data = body.encode("utf-8") if isinstance(body, str) else bytes(body)
    kwargs: dict[str, Any] = {**write_args(client), **({"ContentType": content_type} if content_type else {})}
    with _s3_call("PutObject", bucket, key):
        client.put_object(Bucket=bucket, Key=key, Body=data, **kwargs)


def get_bytes(client: Any, bucket: str, key: str) -> bytes:
    """The content of ``key``; :class:`ObjectNotFound` if absent."""
    with _s3_call("GetObject", bucket, key):
        resp = client.get_object(Bucket=bucket, Key=key)
        return resp["Body"].read()


def download_to(client: Any, bucket: str, key: str, fileobj: Any, *, chunk_bytes: int = 8 << 20) -> int:
    """Stream ``key`` into ``fileobj`` in chunks (never whole in memory); returns the bytes
    written. :class:`ObjectNotFound` if absent."""
    total = 0
    with _s3_call("GetObject", bucket, key):
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        for chunk in body.iter_chunks(chunk_bytes):
            fileobj.write(chunk)
            total += len(chunk)
    return total


def get_json(client: Any, bucket: str, key: str) -> Any:
    """The JSON document at ``key``; :class:`ObjectNotFound` if absent,
    :class:`CorruptObject` if it is not UTF-8 JSON."""
    return json_document(get_bytes(client, bucket, key), bucket, key)


def json_document(data: bytes, bucket: str, key: str) -> Any:
    """``data``, the object ``key``'s content, as JSON; :class:`CorruptObject` if it is not
    UTF-8 JSON."""
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptObject(
            f"not a JSON document: {e}", bucket=bucket, key=key, operation="GetObject"
        ) from None


def exists(client: Any, bucket: str, key: str) -> bool:
    """Whether an object ``key`` exists (HeadObject). A missing bucket raises
    :class:`ObjectNotFound` with code ``NoSuchBucket`` (HEAD answers a bare 404 for both,
    so a miss is confirmed with HeadBucket)."""
    try:
        with _s3_call("HeadObject", bucket, key):
            client.head_object(Bucket=bucket, Key=key)
    except ObjectNotFound as e:
        if e.code == "NoSuchBucket":
            raise
        try:
            with _s3_call("HeadBucket", bucket):
                client.head_bucket(Bucket=bucket)
        except ObjectNotFound as b:
            raise ObjectNotFound(
                "the bucket does not exist",
                bucket=bucket,
                key=key,
                operation="HeadObject",
                code="NoSuchBucket",
            ) from b
        return False
    return True


def list_keys(client: Any, bucket: str, prefix: str = "") -> Iterator[str]:
    """Every key starting with ``prefix``, in S3's (UTF-8 binary) order, all pages."""
    paginator = client.get_paginator("list_objects_v2")
    with _s3_call("ListObjectsV2", bucket, prefix or None):
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", ()) or ():
                yield obj["Key"]


def list_objects(client: Any, bucket: str, prefix: str = "") -> Iterator[dict[str, Any]]:
    """Like :func:`list_keys` but yields S3's entries (``Key``, ``Size``, ``ETag``, …)."""
    paginator = client.get_paginator("list_objects_v2")
    with _s3_call("ListObjectsV2", bucket, prefix or None):
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
            yield from page.get("Contents", ()) or ()


def delete_prefix(client: Any, bucket: str, prefix: str, *, abort_uploads: bool = True) -> int:
    """Delete every object whose key starts with ``prefix`` (1000 per DeleteObjects call);
    with ``abort_uploads`` also abort pending multipart uploads under it. Returns the
    number of objects deleted. An empty prefix is refused (it would empty the bucket)."""
    if not prefix:
        raise StoreError(
            "refusing to delete an empty prefix (the whole bucket)",
            bucket=bucket,
            operation="DeleteObjects",
        )
    deleted = delete_keys(client, bucket, list_keys(client, bucket, prefix), what=prefix)
    if abort_uploads:
        abort_uploads_under(client, bucket, prefix)
    return deleted


def delete_keys(client: Any, bucket: str, keys: Iterable[str], *, what: str | None = None) -> int:
    """Delete these objects (1000 per DeleteObjects call); returns how many. ``what``
    names them in an error (default: the first key of the failing batch)."""
    deleted = 0
    batch: list[dict[str, str]] = []

    def flush() -> None:
        nonlocal deleted
        if not batch:
            return
        with _s3_call("DeleteObjects", bucket, what or batch[0]["Key"]):
            resp = client.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
        errors = resp.get("Errors") or []
        if errors:
            first = errors[0]
            raise S3RequestError(
                f"{len(errors)} of {len(batch)} deletes failed, first: {first.get('Message', '')}",
                bucket=bucket,
                key=first.get("Key"),
                operation="DeleteObjects",
                code=first.get("Code"),
            )
        deleted += len(batch)
        batch.clear()

    for key in keys:
        batch.append({"Key": key})
        if len(batch) == 1000:
            flush()
    flush()
    return deleted


def abort_uploads_under(client: Any, bucket: str, prefix: str) -> int:
    """Abort every pending multipart upload whose key starts with ``prefix``; return how many."""
    count = 0
    paginator = client.get_paginator("list_multipart_uploads")
    with _s3_call("ListMultipartUploads", bucket, prefix or None):
        pages = list(paginator.paginate(Bucket=bucket, Prefix=prefix))
    for page in pages:
        for upload in page.get("Uploads", ()) or ():
            try:
                with _s3_call("AbortMultipartUpload", bucket, upload["Key"]):
                    client.abort_multipart_upload(
                        Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                    )
                count += 1
            except ObjectNotFound:
                pass
    return count


def pending_uploads(client: Any, bucket: str, prefix: str = "") -> list[dict[str, Any]]:
    """Pending (neither completed nor aborted) multipart uploads under ``prefix``."""
    paginator = client.get_paginator("list_multipart_uploads")
    out: list[dict[str, Any]] = []
    with _s3_call("ListMultipartUploads", bucket, prefix or None):
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
            out.extend(page.get("Uploads", ()) or ())
    return out
