"""The package's exception hierarchy.

Every error that a user can meet is a subclass of :class:`PgcdcError`, so one
``except PgcdcError`` catches everything we raise on purpose. Errors name *what*
went wrong and *where*; none of them ever carries a password or secret key.
This module has no dependencies so that every layer may import it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping


class PgcdcError(Exception):
    """Base class of every error raised by airflow-pgcdc.

    Pickles with every field it carries, whatever its ``__init__`` takes (errors cross
    process boundaries: Spark executors, snapshot workers, Airflow triggers)."""

    def __reduce__(self):
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(cls, args, state):
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


class HintedError(PgcdcError):
    """An error with a ``hint``: what the user can do about it (the CLI prints it on its
    own line). Every error that carries a hint is one of these."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class ProtocolError(PgcdcError, ValueError):
    """Bytes from a peer that do not follow the protocol.

    ``protocol`` names the protocol (``pgoutput``, ``pglogical``, ``replication``),
    ``message_type`` the message being decoded (e.g. ``"Insert ('I')"``) and
    ``offset`` the byte offset inside that message where decoding failed.
    """

    def __init__(
        self,
        reason: str,
        *,
        protocol: str | None = None,
        message_type: str | None = None,
        offset: int | None = None,
    ) -> None:
        self.reason = reason
        self.protocol = protocol
        self.message_type = message_type
        self.offset = offset
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.protocol:
            where.append(self.protocol)
        if self.message_type:
            where.append(f"message {self.message_type}")
        if self.offset is not None:
            where.append(f"at byte {self.offset}")
        prefix = " ".join(where)
        return f"{prefix}: {self.reason}" if prefix else self.reason



class TruncatedMessage(ProtocolError):
    """The message ended before a field it must contain."""


class UnknownMessageType(ProtocolError):
    """The message (or sub-message, or block) type byte is not one the spec defines."""


class InvalidFieldValue(ProtocolError):
    """A field has a value the spec forbids (reserved bits, negative length, bad kind)."""


class UnexpectedMessage(ProtocolError):
    """A well-formed message arrived where the protocol's message flow does not allow it."""


class TrailingBytes(ProtocolError):
    """A message carried bytes after its last field."""


class QuotingError(PgcdcError, ValueError):
    """An identifier or literal that cannot be quoted safely (NUL byte, too long)."""


# --------------------------------------------------------------------------- secrets

_SECRET_NAME_WORDS = ("password", "secret", "token")
_CONNINFO_PASSWORD = re.compile(r"(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s']+)", re.IGNORECASE)
_URI_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)([^@\s]*)(@)", re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    """Whether a variable, option or field called ``name`` holds a secret
    (``AWS_SECRET_ACCESS_KEY``, ``password``, ``aws_session_token``...)."""
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_NAME_WORDS)


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` safe to log or print: the one redactor of the package. Every value of
    ``secrets`` is replaced by ``***``, and so are passwords in connection strings, both
    key/value (``password=…``, ``sslpassword='…'``, also inside ``?…&password=…``) and URI
    (``postgresql://user:…@host``)."""
    for value in secrets:
        if value:
            text = text.replace(value, "***")
    text = _CONNINFO_PASSWORD.sub(r"\1***", text)
    return _URI_PASSWORD.sub(r"\1***\3", text)


def redact_mapping(values: Mapping[str, str]) -> dict[str, str]:
    """The same mapping with secret-named entries replaced by ``***`` and the others
    passed through :func:`redact` (an environment, a set of options)."""
    secrets = [v for k, v in values.items() if is_secret_name(k)]
    return {k: ("***" if is_secret_name(k) else redact(v, secrets)) for k, v in values.items()}
