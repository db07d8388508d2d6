"""``PgcdcHook``: an Airflow ``postgres`` connection (plus an optional AWS connection)
turned into what the library calls need: a libpq DSN and S3 settings.

The DSN carries the password, so it is never logged: use :meth:`PgcdcHook.safe_dsn`
for messages. libpq does TLS and SCRAM; TLS settings come from the connection's
extras (``sslmode``, ``sslrootcert``, ``sslcert``, ``sslkey``, ...).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from airflow_pgcdc.errors import redact as redact_text
from airflow_pgcdc.hooks.compat import BaseHook
from airflow_pgcdc.pg.conninfo import redact
from airflow_pgcdc.store.s3 import S3Settings, make_s3_client

# libpq parameters accepted from a postgres connection's extras
CONNECTION_WRITE_EXTRAS = {"server_side_encryption": "sse", "sse_kms_key_id": "sse_kms_key_id", "acl": "acl"}
"""The ``aws`` connection's extras for what every object written carries: server-side
encryption (``AES256``, ``aws:kms``, ``aws:kms:dsse``), its KMS key, a canned ACL."""

LIBPQ_EXTRAS = (
    "sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword", "sslcrl", "sslcrldir",
    "sslsni", "ssl_min_protocol_version", "channel_binding", "require_auth",
    "application_name", "options", "connect_timeout", "keepalives", "keepalives_idle",
    "keepalives_interval", "keepalives_count", "target_session_attrs", "gssencmode",
    "krbsrvname", "passfile",
)  # fmt: skip


class PgcdcHook(BaseHook):
    """Connections for airflow-pgcdc.

    :param postgres_conn_id: an Airflow connection of type ``postgres`` (or this
        provider's ``pgcdc`` type, the same fields): host, port, login, password,
        schema = database; extras: libpq TLS/auth parameters.
    :param aws_conn_id: an Airflow connection of type ``aws`` for S3, read as the amazon
        provider reads it (:func:`aws_connection_fields`: keys, token, endpoints, region,
        role, profile, ``config_kwargs``; plus ``server_side_encryption``,
        ``sse_kms_key_id`` and ``acl``); ``None`` uses boto3's environment (AWS_* variables).
    """

    conn_name_attr = "postgres_conn_id"
    default_conn_name = "postgres_default"
    conn_type = "pgcdc"  # its own type for the UI; any ``postgres`` connection works as well
    hook_name = "PostgreSQL CDC"

    def __init__(self, postgres_conn_id: str = default_conn_name, aws_conn_id: str | None = None) -> None:
        super().__init__()
        self.postgres_conn_id = postgres_conn_id
        self.aws_conn_id = aws_conn_id

    def get_conn(self) -> str:
        """The libpq DSN (it holds the password: do not log it)."""
        return self.get_dsn()

    def get_dsn(self) -> str:
        from psycopg.conninfo import make_conninfo

        conn = self.get_connection(self.postgres_conn_id)
        params: dict[str, Any] = {
            "host": conn.host or None,
            "port": conn.port or None,
            "user": conn.login or None,
            "password": conn.password or None,
            "dbname": conn.schema or None,
        }
        extra = conn.extra_dejson or {}
        for key in LIBPQ_EXTRAS:
            if extra.get(key) not in (None, ""):
                params[key] = str(extra[key])
        return make_conninfo("", **{k: v for k, v in params.items() if v is not None})

    def test_connection(self) -> tuple[bool, str]:
        """The Airflow UI's Test button and ``airflow connections test`` (with ``[core]
        test_connection = Enabled``): connects and checks what a pipeline needs of the
        server and the role (:func:`airflow_pgcdc.pg.readiness.logical_readiness`); the
        message never holds the password."""
        from psycopg.conninfo import conninfo_to_dict

        from airflow_pgcdc.pg.readiness import logical_readiness

        try:
            dsn = self.get_dsn()
        except Exception as e:  # noqa: BLE001 - the test reports, it does not raise
            return False, f"connection {self.postgres_conn_id!r}: {e}"
        try:
            found = logical_readiness(dsn)
        except Exception as e:  # noqa: BLE001
            params = conninfo_to_dict(dsn)
            text = redact_text(str(e).strip() or type(e).__name__, [params.get("password"), params.get("sslpassword")])
            return False, f"cannot connect to {redact(dsn)}: {text}"
        return found.ready, found.summary()

    def safe_dsn(self) -> str:
        """The DSN with the password replaced by ``***``."""
        return redact(self.get_dsn())

    def s3_settings(self) -> S3Settings:
        """S3 settings from the ``aws`` connection (boto3's environment without one): the
        connection read as the amazon provider's ``AwsBaseHook`` reads it (its connection
        wrapper, when the provider is installed; else the same fields read here)."""
        if not self.aws_conn_id:
            return S3Settings.from_env()
        fields = aws_connection_fields(self.get_connection(self.aws_conn_id))
        return S3Settings.from_env(**_settings_overrides(self.aws_conn_id, fields))

    def s3_client(self):
        return make_s3_client(self.s3_settings())

    @contextmanager
    def pii_key(self, conn_id: str | None) -> Iterator[None]:
        """While the job runs, the column rules' hash key is the password of Airflow
        connection ``conn_id`` (any type), set as :data:`~airflow_pgcdc.typemap.privacy.KEY_ENV`
        for this process only (never on a command line, never logged); ``None``: the
        environment's own."""
        if not conn_id:
            yield
            return
        from airflow_pgcdc.typemap.privacy import KEY_ENV

        secret = self.get_connection(conn_id).password
        if not secret:
            from airflow_pgcdc.typemap.privacy import PiiKeyMissing

            raise PiiKeyMissing(f"connection {conn_id!r} has no password to hash with",
                                hint="store the hash key as the connection's password")
        before = os.environ.get(KEY_ENV)
        os.environ[KEY_ENV] = secret
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(KEY_ENV, None)
            else:
                os.environ[KEY_ENV] = before


ASSUME_ROLE_METHODS = (None, "assume_role")
"""The ``aws`` connection's ``assume_role_method`` values this hook follows (the amazon
provider's default, ``assume_role``); web identity and SAML are refused by name."""


@dataclass(frozen=True)
class AwsConnectionFields:
    """What an ``aws`` connection says, as the amazon provider resolves it: keys from login
    and password (else the extras' ``aws_access_key_id``/``aws_secret_access_key`` or
    ``session_kwargs``), the S3 endpoint (``service_config.s3.endpoint_url`` over
    ``endpoint_url``), the STS endpoint for assuming a role (``service_config.sts`` only),
    region, role, profile; ``extra``: the extras as given (``config_kwargs``, this hook's
    write settings)."""

    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    endpoint_url: str | None = None
    region: str | None = None
    role_arn: str | None = None
    assume_role_method: str | None = None
    assume_role_kwargs: dict[str, Any] = field(default_factory=dict)
    profile: str | None = None
    sts_endpoint_url: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def aws_connection_fields(conn: Any) -> AwsConnectionFields:
    """The fields of the ``aws`` connection ``conn``: read by the amazon provider's
    ``AwsConnectionWrapper`` (what ``AwsBaseHook.conn_config`` is) when the provider is
    installed, else by :func:`_fields_from_extras`, the same rules for the fields used here."""
    try:
        from airflow.providers.amazon.aws.utils.connection_wrapper import AwsConnectionWrapper
    except ImportError:
        return _fields_from_extras(conn)
    w = AwsConnectionWrapper(conn=conn)
    return AwsConnectionFields(
        access_key_id=w.aws_access_key_id, secret_access_key=w.aws_secret_access_key,
        session_token=w.aws_session_token, endpoint_url=w.get_service_endpoint_url("s3"),
        region=w.region_name, role_arn=w.role_arn, assume_role_method=w.assume_role_method,
        assume_role_kwargs=dict(w.assume_role_kwargs or {}), profile=w.profile_name,
        sts_endpoint_url=w.get_service_endpoint_url("sts", sts_connection_assume=True),
        extra=dict(conn.extra_dejson or {}),
    )


def _fields_from_extras(conn: Any) -> AwsConnectionFields:
    """:func:`aws_connection_fields` without the amazon provider."""
    extra = dict(conn.extra_dejson or {})
    session = extra.get("session_kwargs") or {}
    if conn.login and conn.password:
        key, secret = conn.login, conn.password
    elif extra.get("aws_access_key_id") and extra.get("aws_secret_access_key"):
        key, secret = extra["aws_access_key_id"], extra["aws_secret_access_key"]
    else:
        key, secret = session.get("aws_access_key_id"), session.get("aws_secret_access_key")
    services = extra.get("service_config") or {}
    return AwsConnectionFields(
        access_key_id=key, secret_access_key=secret,
        session_token=extra.get("aws_session_token") or session.get("aws_session_token"),
        endpoint_url=(services.get("s3") or {}).get("endpoint_url", extra.get("endpoint_url")),
        region=extra.get("region_name"), role_arn=extra.get("role_arn"),
        assume_role_method=extra.get("assume_role_method") or ("assume_role" if extra.get("role_arn") else None),
        assume_role_kwargs=dict(extra.get("assume_role_kwargs") or {}), profile=extra.get("profile_name"),
        sts_endpoint_url=(services.get("sts") or {}).get("endpoint_url"), extra=extra,
    )


def _settings_overrides(conn_id: str, f: AwsConnectionFields) -> dict[str, Any]:
    """:class:`S3Settings` fields from the connection's: keys and token, endpoint, region,
    what every object written carries (``CONNECTION_WRITE_EXTRAS``), the role
    (``role_arn``, ``assume_role_kwargs``: ``RoleSessionName``, ``ExternalId``,
    ``DurationSeconds``; ``assume_role_method`` web identity and SAML are refused by name),
    the profile, the STS endpoint and, from ``config_kwargs`` (or ``botocore_config``),
    timeouts, retries and the connection pool."""
    out: dict[str, Any] = {}
    for value, name in ((f.access_key_id, "access_key_id"), (f.secret_access_key, "secret_access_key"),
                        (f.session_token, "session_token"), (f.endpoint_url, "endpoint_url"), (f.region, "region"),
                        (f.profile, "profile"), (f.sts_endpoint_url, "sts_endpoint_url")):
        if value:
            out[name] = value
    for name, field_name in CONNECTION_WRITE_EXTRAS.items():
        if f.extra.get(name):
            out[field_name] = f.extra[name]
    if f.role_arn:
        if f.assume_role_method not in ASSUME_ROLE_METHODS:
            raise ValueError(
                f"aws connection {conn_id!r}: assume_role_method {f.assume_role_method!r} is not supported here "
                "(only assume_role); for web identity set AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE in the "
                "workers' environment and leave role_arn out: every component then finds and renews it")
        out["role_arn"] = f.role_arn
        for key, field_name in (("RoleSessionName", "role_session_name"), ("ExternalId", "external_id"),
                                ("DurationSeconds", "role_seconds")):
            if f.assume_role_kwargs.get(key) is not None:
                value = f.assume_role_kwargs[key]
                out[field_name] = int(value) if field_name == "role_seconds" else str(value)
    config = f.extra.get("config_kwargs") or f.extra.get("botocore_config") or {}
    retries = config.get("retries") or {}
    for key, field_name, kind in (("connect_timeout", "connect_timeout", float), ("read_timeout", "read_timeout", float),
                                  ("max_pool_connections", "max_pool_connections", int)):
        if config.get(key) is not None:
            out[field_name] = kind(config[key])
    attempts = retries.get("total_max_attempts") or (retries["max_attempts"] + 1 if retries.get("max_attempts")
                                                     is not None else None)
    if attempts:
        out["max_attempts"] = int(attempts)
    if retries.get("mode"):
        out["retry_mode"] = retries["mode"]
    return out
