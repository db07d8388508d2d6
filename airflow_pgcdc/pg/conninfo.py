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


_LOCAL_HOSTS = frozenset({"localhost", "::1"})
_VERIFYING = frozenset({"verify-ca", "verify-full"})


def unverified_tls(dsn: str, environ=None) -> str | None:
    """A warning when ``dsn`` reaches a host that is not this machine with an ``sslmode``
    that does not verify the server (``disable``, ``allow``, ``prefer`` (libpq's default),
    ``require``): the password (SCRAM excepted) and the data can then go to whoever answers
    on the way. None for local hosts, Unix sockets and ``verify-ca``/``verify-full``."""
    import os

    env = os.environ if environ is None else environ
    try:
        params = parse_conninfo(dsn)
    except InvalidConninfo:
        return None
    hosts = [h for h in (params.get("host") or env.get("PGHOST") or "").split(",") if h]
    remote = [h for h in hosts if not h.startswith("/") and h not in _LOCAL_HOSTS and not h.startswith("127.")]
    if params.get("hostaddr") and not hosts:
        addrs = params["hostaddr"].split(",")
        remote = [a for a in addrs if a not in ("::1",) and not a.startswith("127.")]
    mode = params.get("sslmode") or env.get("PGSSLMODE") or "prefer"
    if not remote or mode in _VERIFYING:
        return None
    return (f"connecting to {', '.join(remote)} with sslmode={mode}, which does not verify the server: anyone "
            "on the path can read the data or pose as the server. Use sslmode=verify-full with sslrootcert "
            "(the CA that signed the server's certificate)")


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
