"""The one base of the typed messages of every protocol module.

pgoutput's messages (:mod:`.pgoutput.messages`), pglogical's (:mod:`.pglogical.messages`)
and the streaming replication protocol's CopyData frames (:mod:`.frames`) all derive from
:class:`ProtocolMessage`: a ``type`` class attribute that names the message in JSON, and
``to_dict()`` for a JSON-ready dict (each protocol decides how it writes bytes, LSNs and
times there: ``pgcdc peek`` prints them as the tests pin them). :class:`FieldValue` is the
equality-by-fields and ``repr`` that pglogical's values and the frames share; pgoutput's
classes are dataclasses, which bring their own.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = ["FieldValue", "ProtocolMessage"]


class FieldValue:
    """Equality by ``_fields`` (same type, same values), a readable ``repr``, no hash
    (values may hold lists)."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()

    def _values(self) -> tuple:
        return tuple(getattr(self, f) for f in self._fields)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]  # mutable containers inside

    def __repr__(self) -> str:
        args = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
        return f"{type(self).__name__}({args})"


class ProtocolMessage(FieldValue):
    """Base of every typed message of ``airflow_pgcdc.protocol``."""

    __slots__ = ()
    type: ClassVar[str]
    """The message's name in ``to_dict()`` output (``"insert"``, ``"begin"``, ``"w"``...)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: ``{"type": ..., field: value, ...}``."""
        raise NotImplementedError
