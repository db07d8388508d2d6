"""``PgcdcHook``: an Airflow ``postgres`` connection (plus an optional AWS connection)
turned into what the library calls need: a libpq DSN and S3 settings.

The DSN carries the password, so it is never logged: use :meth:`PgcdcHook.safe_dsn`
for messages. libpq does TLS and SCRAM; TLS settings come from the connection's
extras (``sslmode``, ``sslrootcert``, ``sslcert``, ``sslkey``, ...).
"""

from __future__ import annotations

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
    :param aws_conn_id: an Airflow connection of type ``aws`` for S3 (login = access key
        id, password = secret key; extras ``endpoint_url``, ``region_name``,
        ``aws_session_token``); ``None`` uses boto3's environment (AWS_* variables).
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
        if not self.aws_conn_id:
            return S3Settings.from_env()
        conn = self.get_connection(self.aws_conn_id)
        extra = conn.extra_dejson or {}
        overrides: dict[str, Any] = {}
        if conn.login:
            overrides["access_key_id"] = conn.login
        if conn.password:
            overrides["secret_access_key"] = conn.password
        if extra.get("aws_session_token"):
            overrides["session_token"] = extra["aws_session_token"]
        endpoint = extra.get("endpoint_url") or (extra.get("service_config") or {}).get("s3", {}).get("endpoint_url")
        if endpoint:
            overrides["endpoint_url"] = endpoint
        if extra.get("region_name"):
            overrides["region"] = extra["region_name"]
        for name, field_name in CONNECTION_WRITE_EXTRAS.items():  # what every object written carries
            if extra.get(name):
                overrides[field_name] = extra[name]
        overrides.update(_role_extras(self.aws_conn_id, extra))
        return S3Settings.from_env(**overrides)

    def s3_client(self):
        return make_s3_client(self.s3_settings())


ASSUME_ROLE_METHODS = (None, "assume_role")
"""The ``aws`` connection's ``assume_role_method`` values this hook follows (the amazon
provider's default, ``assume_role``); web identity and SAML are refused by name."""


def _role_extras(conn_id: str, extra: dict[str, Any]) -> dict[str, Any]:
    """:class:`S3Settings` fields from the ``aws`` connection's extras as the amazon
    provider's ``AwsBaseHook`` reads them: ``role_arn``, ``assume_role_method``,
    ``assume_role_kwargs`` (``RoleSessionName``, ``ExternalId``, ``DurationSeconds``),
    ``profile_name``, ``service_config.sts.endpoint_url`` and, from ``config_kwargs`` (or
    ``botocore_config``), timeouts, retries and the connection pool."""
    out: dict[str, Any] = {}
    method = extra.get("assume_role_method")
    if extra.get("role_arn"):
        if method not in ASSUME_ROLE_METHODS:
            raise ValueError(
                f"aws connection {conn_id!r}: assume_role_method {method!r} is not supported here (only "
                "assume_role); for web identity set AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE in the "
                "workers' environment and leave role_arn out: every component then finds and renews it")
        out["role_arn"] = extra["role_arn"]
        kwargs = extra.get("assume_role_kwargs") or {}
        for key, field_name in (("RoleSessionName", "role_session_name"), ("ExternalId", "external_id"),
                                ("DurationSeconds", "role_seconds")):
            if kwargs.get(key) is not None:
                out[field_name] = int(kwargs[key]) if field_name == "role_seconds" else str(kwargs[key])
    if extra.get("profile_name"):
        out["profile"] = extra["profile_name"]
    sts = ((extra.get("service_config") or {}).get("sts") or {}).get("endpoint_url")
    if sts:
        out["sts_endpoint_url"] = sts
    config = extra.get("config_kwargs") or extra.get("botocore_config") or {}
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
