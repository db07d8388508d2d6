"""Typed errors for the I/O layer. Server errors carry SQLSTATE and the server's message."""

from __future__ import annotations

from airflow_pgcdc.errors import HintedError, PgcdcError


class PgError(PgcdcError):
    """Something went wrong talking to PostgreSQL."""


class ConnectionFailed(PgError):
    """libpq could not connect (bad host, auth failure, TLS failure...)."""


class ConnectionLost(PgError):
    """The connection broke while in use."""


class ReplicationTimeout(PgError):
    """A wait on the server exceeded its deadline."""


class ReplicationStateError(PgError):
    """An operation that the connection's current state does not allow (e.g. reading
    frames when no stream is running, or starting a second stream)."""


class ServerError(HintedError, PgError):
    """An ErrorResponse from the server.

    ``sqlstate``, ``severity``, ``message`` (primary), ``detail``, ``hint`` and
    ``command`` (the command that failed) are kept as attributes.
    """

    sqlstate_class: str | None = None  # set on subclasses that map one SQLSTATE

    def __init__(
        self,
        message: str,
        *,
        sqlstate: str = "",
        severity: str = "ERROR",
        detail: str | None = None,
        hint: str | None = None,
        command: str | None = None,
    ) -> None:
        self.message = message
        self.sqlstate = sqlstate
        self.severity = severity
        self.detail = detail
        self.command = command
        text = f"{severity}: {message} (SQLSTATE {sqlstate})"
        if detail:
            text += f"\nDETAIL: {detail}"
        if hint:
            text += f"\nHINT: {hint}"
        if command:
            text += f"\nCOMMAND: {command}"
        super().__init__(text, hint=hint)


class DuplicateObject(ServerError):
    """42710: e.g. the replication slot already exists."""


class UndefinedObject(ServerError):
    """42704: e.g. the replication slot or publication does not exist."""


class UndefinedTable(ServerError):
    """42P01: the relation does not exist."""


class ObjectInUse(ServerError):
    """55006: e.g. the replication slot is active for another process."""


class InsufficientPrivilege(ServerError):
    """42501: the role lacks REPLICATION or another privilege."""


class ProtocolViolation(ServerError):
    """08P01: the server says we broke the protocol."""


class FeatureNotSupported(ServerError):
    """0A000: e.g. an option the server version does not know."""


class InvalidParameterValue(ServerError):
    """22023: e.g. a bad plugin option value."""


class ConfigurationError(ServerError):
    """55000 (object not in prerequisite state), e.g. wal_level is not logical."""


class AdminShutdown(ServerError):
    """57P01/57P02/57P03: the server is shutting down or restarting."""


_BY_SQLSTATE: dict[str, type[ServerError]] = {
    "42710": DuplicateObject,
    "42704": UndefinedObject,
    "42P01": UndefinedTable,
    "55006": ObjectInUse,
    "42501": InsufficientPrivilege,
    "08P01": ProtocolViolation,
    "0A000": FeatureNotSupported,
    "22023": InvalidParameterValue,
    "55000": ConfigurationError,
    "57P01": AdminShutdown,
    "57P02": AdminShutdown,
    "57P03": AdminShutdown,
}


def server_error_class(sqlstate: str) -> type[ServerError]:
    return _BY_SQLSTATE.get(sqlstate, ServerError)
