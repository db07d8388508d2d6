"""Connection strings: building replication conninfo and redacting secrets for logs."""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from airflow_pgcdc.errors import PgcdcError
from airflow_pgcdc.errors import redact as redact_text

_SECRET_KEYS = frozenset({"password", "sslpassword"})


class InvalidConninfo(PgcdcError, ValueError):
    """A DSN that libpq cannot parse."""


def parse_conninfo(dsn: str) -> dict[str, str]:
    try:
        return {k: str(v) for k, v in conninfo_to_dict(dsn).items()}
    except Exception as exc:  # psycopg.ProgrammingError; message never includes the password
        raise InvalidConninfo(f"invalid connection string: {type(exc).__name__}") from None


def redact(dsn: str) -> str:
    """The DSN with its passwords replaced by ``***`` (safe to log): the package's one
    redactor, :func:`airflow_pgcdc.errors.redact`."""
    return redact_text(dsn)


def has_password(dsn: str) -> bool:
    """Whether ``dsn`` (key/value or URI form) carries a password."""
    try:
        return any(parse_conninfo(dsn).get(k) for k in _SECRET_KEYS)
    except InvalidConninfo:
        return False


def replication_conninfo(dsn: str, *, replication: str = "database", **overrides: str) -> str:
    """``dsn`` with ``replication=`` set and ``standard_conforming_strings=on``
    appended to ``options`` (our literal quoting relies on it)."""
    if replication not in ("database", "true", "false"):
        raise ValueError(f"replication must be 'database', 'true' or 'false', not {replication!r}")
    params = parse_conninfo(dsn)
    params.update(overrides)
    options = params.get("options", "")
    if "standard_conforming_strings" not in options:
        options = (options + " -c standard_conforming_strings=on").strip()
    params["options"] = options
    if replication != "false":
        params["replication"] = replication
    return make_conninfo("", **params)
