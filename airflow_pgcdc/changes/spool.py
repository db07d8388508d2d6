"""The spool of one transaction: its pgoutput messages in a local file, so a streamed
(``streaming on|parallel``) or prepared transaction of any size costs bounded memory until
its commit (see :mod:`.assembly`, which fills, replays and holds spools)."""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Iterator
from typing import Any

from airflow_pgcdc.errors import PgcdcError
from airflow_pgcdc.protocol import pgoutput as po
from airflow_pgcdc.protocol.lsn import LSN

SPOOL_MAGIC = b"PGCDCSP1"
_REC = struct.Struct("!BII")
SPOOL_READ_CHUNK = 1 << 16  # bytes read at once when a spool is replayed
F_IN_STREAM = 1
F_RELATION = 2


class AssemblyError(PgcdcError):
    """The message stream does not form valid transactions (a change outside a
    transaction, a commit for an unknown stream or gid, an unknown relation)."""


class Spool:
    """The messages of one transaction in a local file (see the module docstring)."""

    def __init__(self, directory: str, xid: int, proto_version: int, *, path: str | None = None):
        self.xid = xid
        self.proto_version = proto_version
        self.aborted: set[int] = set()
        self.relations_written: dict[int, bytes] = {}  # oid -> raw Relation last recorded
        self.origin: tuple[str, LSN] | None = None
        self.changes = 0
        if path is None:
            fd, path = tempfile.mkstemp(prefix=f"xid{xid}-", suffix=".spool", dir=directory)
            self._f = os.fdopen(fd, "w+b", buffering=1 << 16)
            self._f.write(SPOOL_MAGIC + bytes((proto_version,)))
        else:
            self._f = open(path, "r+b", buffering=1 << 16)  # noqa: SIM115
            head = self._f.read(9)
            if head[:8] != SPOOL_MAGIC:
                raise AssemblyError(f"{path}: not a pgcdc spool file")
            self.proto_version = head[8]
            self._f.seek(0, os.SEEK_END)
        self.path = path

    @property
    def size(self) -> int:
        return self._f.tell() if not self._f.closed else os.path.getsize(self.path)

    def append(self, raw: bytes, *, in_stream: bool, subxid: int = 0, relation: bool = False) -> None:
        flags = (F_IN_STREAM if in_stream else 0) | (F_RELATION if relation else 0)
        self._f.write(_REC.pack(flags, subxid & 0xFFFFFFFF, len(raw)))
        self._f.write(raw)
        if not relation:
            self.changes += 1

    def abort_subxact(self, subxid: int) -> None:
        self.aborted.add(subxid)

    def records(self) -> Iterator[tuple[int, int, bytes]]:
        """``(flags, subxid, raw)`` of every record not dropped by a subxact abort.

        Read in chunks of :data:`SPOOL_READ_CHUNK` bytes with ``pread`` and cut in memory
        (a buffered file's ``tell``/``read`` per record cost more than the decoding)."""
        f = self._f
        f.flush()
        end = f.tell()
        fd = f.fileno()
        aborted = self.aborted
        head = _REC.size
        unpack = _REC.unpack_from
        buf = b""
        base = 9  # file offset of buf[0]
        pos = 0
        try:
            while base + pos < end:
                if pos + head > len(buf):
                    buf, base, pos = self._refill(fd, buf, base, pos, head, end)
                flags, subxid, n = unpack(buf, pos)
                stop = pos + head + n
                if stop > len(buf):
                    buf, base, pos = self._refill(fd, buf, base, pos, head + n, end)
                    stop = pos + head + n
                start = pos + head
                pos = stop
                if not (flags & F_RELATION) and subxid in aborted:
                    continue
                yield flags, subxid, buf[start:stop]
        finally:
            f.seek(end)

    def _refill(self, fd: int, buf: bytes, base: int, pos: int, need: int, end: int) -> tuple[bytes, int, int]:
        """``buf[pos:]`` followed by what the file holds next (at least ``need`` bytes
        from ``pos``, else the spool is truncated); returns ``(buf, base, 0)``."""
        rest = buf[pos:]
        at = base + len(buf)
        want = min(max(SPOOL_READ_CHUNK, need) - len(rest), end - at)
        data = os.pread(fd, want, at) if want > 0 else b""
        buf = rest + data if rest else data
        if len(buf) < need:
            raise AssemblyError(f"{self.path}: truncated spool record")
        return buf, base + pos, 0

    def write_filtered(self, out) -> int:
        """Write a spool file without the aborted subtransactions' records to ``out``
        (a binary file object); returns the bytes written."""
        n = out.write(SPOOL_MAGIC + bytes((self.proto_version,)))
        for flags, subxid, raw in self.records():
            n += out.write(_REC.pack(flags, subxid, len(raw)))
            n += out.write(raw)
        return n

    def messages(self, *, raw_inserts: bool = False) -> Iterator[tuple[Any, int]]:
        """``(decoded message, size)`` in order (a fresh decoder per spool, primed for
        stream records). With ``raw_inserts``, Insert messages are not decoded: they come
        as the bytes of an Insert outside a stream block (a stream record's xid removed)."""
        plain = po.PgoutputDecoder(self.proto_version)
        streamed = None
        for flags, _subxid, raw in self.records():
            if raw_inserts and raw[0] == 73:  # 'I'
                if flags & F_IN_STREAM:
                    if len(raw) >= 12 and raw[9] == 78:  # 'I' xid oid 'N' ncols
                        yield b"I" + raw[5:], len(raw)
                        continue
                elif len(raw) >= 8 and raw[5] == 78:
                    yield raw, len(raw)
                    continue
            if flags & F_IN_STREAM:
                if streamed is None:
                    streamed = po.PgoutputDecoder(self.proto_version)
                    streamed.decode(po.StreamStart(self.xid, True).encode(self.proto_version))
                yield streamed.decode(raw), len(raw)
            else:
                yield plain.decode(raw), len(raw)

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    def discard(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
