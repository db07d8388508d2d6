"""Log sequence numbers: 64-bit WAL positions, written by PostgreSQL as ``X/Y`` (hex)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from airflow_pgcdc.errors import PgcdcError

_MAX = (1 << 64) - 1
_LSN_RE = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")


class InvalidLSN(PgcdcError, ValueError):
    """A string or number that is not a valid LSN."""


class LSN(int):
    """A WAL position. An ``int`` subclass: ordering and hashing are the integer's.

    ``LSN.parse("16/B374D848")`` reads PostgreSQL's text form, ``str(lsn)`` writes it.
    ``lsn + n`` and ``lsn - n`` (bytes) give an LSN; ``lsn1 - lsn2`` gives the byte
    distance as a plain ``int``.
    """

    __slots__ = ()

    def __new__(cls, value: int = 0) -> LSN:
        if isinstance(value, str):
            return cls.parse(value)
        value = int(value)
        if not 0 <= value <= _MAX:
            raise InvalidLSN(f"LSN out of range (0 .. 2^64-1): {value}")
        return super().__new__(cls, value)

    @classmethod
    def parse(cls, text: str) -> LSN:
        m = _LSN_RE.fullmatch(text.strip()) if isinstance(text, str) else None
        if m is None:
            raise InvalidLSN(f"not an LSN (expected X/Y in hex, like 16/B374D848): {text!r}")
        return super().__new__(cls, (int(m.group(1), 16) << 32) | int(m.group(2), 16))

    def __str__(self) -> str:
        v = int(self)
        return f"{v >> 32:X}/{v & 0xFFFFFFFF:X}"

    def __repr__(self) -> str:
        return f"LSN('{self}')"

    def __add__(self, other: int) -> LSN:
        if isinstance(other, int):
            return LSN(int(self) + int(other))
        return NotImplemented

    __radd__ = __add__

    def __sub__(self, other: int):
        if isinstance(other, LSN):
            return int(self) - int(other)
        if isinstance(other, int):
            return LSN(int(self) - other)
        return NotImplemented

    # Keep JSON/pickle friendly: an LSN serialises as its text form via str().
    def __reduce__(self):
        return (LSN, (int(self),))


_new_lsn = int.__new__


def wire_lsn(value: int) -> LSN:
    """An LSN from a 64-bit unsigned wire field (a ``struct`` ``"Q"`` read), which is always
    in range: built without the checks of ``LSN(value)``, for the decoders' hot paths (the
    replication frames and pglogical; pgoutput's inlined loops call ``int.__new__`` directly)."""
    return _new_lsn(LSN, value)



def lsn_text(value: int | str) -> str:
    """The canonical ``X/Y`` text of an LSN given as an int or as text (``"16/b374d848"``
    gives ``"16/B374D848"``); :class:`InvalidLSN` for anything else (the manifests store
    LSNs this way)."""
    return str(LSN(value) if isinstance(value, int) else LSN.parse(value))

WAL_BLOCK_SIZE = 8192
"""PostgreSQL's default WAL page size (``wal_block_size``, fixed when the server is built)."""
WAL_SEGMENT_SIZE = 16 * 1024 * 1024
"""PostgreSQL's default WAL segment size (``wal_segment_size``, set by ``initdb``)."""
WAL_PAGE_HEADER = 24
"""The size of a WAL page's short header (``SizeOfXLogShortPHD`` on 64-bit builds)."""
WAL_LONG_PAGE_HEADER = 40
"""The size of a segment's first page's long header (``SizeOfXLogLongPHD``, 64-bit)."""


def passed_at(target: int, wal_block_size: int = WAL_BLOCK_SIZE,
              wal_segment_size: int = WAL_SEGMENT_SIZE) -> LSN:
    """The stream position from which ``target`` counts as passed: ``target`` itself, or
    the start of its WAL page when ``target`` is the position just after the page's
    header (24 bytes; 40 on a segment's first page).

    ``pg_current_wal_insert_lsn()`` names that position when the last record ended
    exactly at a page boundary (after ``pg_switch_wal()`` or ``archive_timeout``, always:
    the switch record fills its segment); but a walsender reports how far it decoded as
    the end of the last record, the boundary itself, until another record is written,
    and the server's flush position stays there too. Nothing lies between the two (a
    header is no record): reaching the boundary is reaching ``target``. Any other
    position is exact.
    """
    target = LSN(target)
    offset = int(target) % wal_block_size
    if offset == WAL_PAGE_HEADER or (
            offset == WAL_LONG_PAGE_HEADER and int(target) % wal_segment_size == WAL_LONG_PAGE_HEADER):
        return target - offset
    return target


_SIZE_RE = re.compile(r"\s*(\d+)\s*(B|kB|MB|GB|TB)?\s*")
_SIZE_UNITS = {None: 1, "B": 1, "kB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}


@dataclass(frozen=True, slots=True)
class WalSizes:
    """A server's WAL page and segment sizes (``SHOW wal_block_size``, ``wal_segment_size``)."""

    block: int = WAL_BLOCK_SIZE
    segment: int = WAL_SEGMENT_SIZE

    @classmethod
    def parse(cls, block: str | None, segment: str | None) -> WalSizes:
        """From the text ``SHOW`` gives (``"8192"``, ``"16MB"``); the default for ``None``."""
        return cls(_size(block, "wal_block_size", WAL_BLOCK_SIZE),
                   _size(segment, "wal_segment_size", WAL_SEGMENT_SIZE))

    def passed_at(self, target: int) -> LSN:
        """:func:`passed_at` with these sizes."""
        return passed_at(target, self.block, self.segment)


DEFAULT_WAL_SIZES = WalSizes()
"""A server built and initialised with the defaults (8 kB pages, 16 MB segments)."""


def _size(text: str | None, name: str, default: int) -> int:
    if text is None:
        return default
    m = _SIZE_RE.fullmatch(text)
    if m is None:
        raise ValueError(f"{name}: not a size: {text!r}")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2)]


INVALID_LSN = LSN(0)
"""PostgreSQL's InvalidXLogRecPtr (``0/0``): "no position"."""
