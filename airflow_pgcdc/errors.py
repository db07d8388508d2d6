"""The package's exception hierarchy.

Every error that a user can meet is a subclass of :class:`PgcdcError`, so one
``except PgcdcError`` catches everything we raise on purpose. Errors name *what*
went wrong and *where*; none of them ever carries a password or secret key.
This module has no dependencies so that every layer may import it.
"""

from __future__ import annotations


class PgcdcError(Exception):
    """Base class of every error raised by airflow-pgcdc."""


class HintedError(PgcdcError):
    """An error with a ``hint``: what the user can do about it (the CLI prints it on its
    own line). Pickles with its hint (Spark workers, multiprocessing)."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint

    def __reduce__(self):
        return (_rebuild_hinted, (type(self), str(self), self.hint))


def _rebuild_hinted(cls, message, hint):
    return cls(message, hint=hint)


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

    def __reduce__(self):  # keep the keyword fields across pickling (Spark, multiprocessing)
        return (
            _rebuild_protocol_error,
            (type(self), self.reason, self.protocol, self.message_type, self.offset),
        )


def _rebuild_protocol_error(cls, reason, protocol, message_type, offset):
    return cls(reason, protocol=protocol, message_type=message_type, offset=offset)


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
