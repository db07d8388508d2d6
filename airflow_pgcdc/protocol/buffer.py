"""A bounds-checked big-endian reader shared by every decoder in this package.

Every read checks the remaining length first and raises
:class:`~airflow_pgcdc.errors.TruncatedMessage` naming the protocol, the message and
the byte offset, so no decoder can leak ``IndexError`` or ``struct.error``.
Hot loops (TupleData) may use ``struct.unpack_from`` on ``reader.buf`` directly, as
long as they check lengths against ``reader.end`` themselves.
"""

from __future__ import annotations

import struct

from airflow_pgcdc.errors import InvalidFieldValue, ProtocolError, TrailingBytes, TruncatedMessage

_U8 = struct.Struct("!B")
_I16 = struct.Struct("!h")
_U16 = struct.Struct("!H")
_I32 = struct.Struct("!i")
_U32 = struct.Struct("!I")
_I64 = struct.Struct("!q")
_U64 = struct.Struct("!Q")


class Reader:
    __slots__ = ("buf", "pos", "end", "protocol", "message_type")

    def __init__(
        self,
        buf: bytes,
        pos: int = 0,
        end: int | None = None,
        *,
        protocol: str,
        message_type: str | None = None,
    ) -> None:
        self.buf = bytes(buf) if not isinstance(buf, bytes) else buf
        self.pos = pos
        self.end = len(self.buf) if end is None else end
        self.protocol = protocol
        self.message_type = message_type

    # -- errors -------------------------------------------------------------------
    def error(self, cls: type[ProtocolError], reason: str, offset: int | None = None):
        return cls(
            reason,
            protocol=self.protocol,
            message_type=self.message_type,
            offset=self.pos if offset is None else offset,
        )

    def need(self, n: int, what: str) -> None:
        if n < 0:
            raise self.error(InvalidFieldValue, f"negative length {n} for {what}")
        if self.pos + n > self.end:
            raise self.error(
                TruncatedMessage,
                f"truncated: {what} needs {n} bytes, {self.end - self.pos} left",
            )

    # -- fixed-size fields -----------------------------------------------------------
    def _fixed(self, st: struct.Struct, what: str) -> int:
        pos = self.pos
        if pos + st.size > self.end:
            raise self.error(
                TruncatedMessage,
                f"truncated: {what} needs {st.size} bytes, {self.end - pos} left",
            )
        self.pos = pos + st.size
        return st.unpack_from(self.buf, pos)[0]

    def u8(self, what: str = "Int8") -> int:
        return self._fixed(_U8, what)

    def byte(self, what: str = "Byte1") -> str:
        """One byte as a one-character ASCII/latin-1 string (a message or kind tag)."""
        return chr(self._fixed(_U8, what))

    def i16(self, what: str = "Int16") -> int:
        return self._fixed(_I16, what)

    def u16(self, what: str = "Int16") -> int:
        return self._fixed(_U16, what)

    def i32(self, what: str = "Int32") -> int:
        return self._fixed(_I32, what)

    def u32(self, what: str = "Int32") -> int:
        return self._fixed(_U32, what)

    def i64(self, what: str = "Int64") -> int:
        return self._fixed(_I64, what)

    def u64(self, what: str = "Int64") -> int:
        return self._fixed(_U64, what)

    # -- variable-size fields ----------------------------------------------------------
    def bytes(self, n: int, what: str = "Byten") -> bytes:
        self.need(n, what)
        pos = self.pos
        self.pos = pos + n
        return self.buf[pos : pos + n]

    def cstring(self, what: str = "String", encoding: str = "utf-8") -> str:
        """A NUL-terminated string, decoded (server encoding is UTF-8 for our sessions)."""
        pos = self.pos
        nul = self.buf.find(b"\x00", pos, self.end)
        if nul < 0:
            raise self.error(TruncatedMessage, f"truncated: {what} has no NUL terminator")
        self.pos = nul + 1
        try:
            return self.buf[pos:nul].decode(encoding)
        except UnicodeDecodeError as exc:
            raise self.error(
                InvalidFieldValue, f"{what} is not valid {encoding}: {exc.reason}", pos
            ) from None

    def rest(self) -> bytes:
        pos = self.pos
        self.pos = self.end
        return self.buf[pos : self.end]

    def remaining(self) -> int:
        return self.end - self.pos

    def finish(self) -> None:
        """Raise :class:`TrailingBytes` if anything is left after the last field."""
        if self.pos != self.end:
            raise self.error(
                TrailingBytes, f"{self.end - self.pos} unexpected bytes after the last field"
            )
