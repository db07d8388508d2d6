"""Packed window parts: a window's small Parquet parts written as one object, not one each.

A window that touches many tables a little has many parts of a few kilobytes; one PUT per
part made such a window cost a request per table (500 tables: about as long as receiving
the whole window). The window writer (:mod:`airflow_pgcdc.store.window`) hands every
finished part of at most :data:`PACK_MAX_PART_BYTES` to a :class:`PartPacker` instead of
uploading it; the packer writes them back to back into pack objects
(``{window}/pack-{n:05d}-{attempt}.pack``, at most :data:`PACK_MAX_BYTES` each, less with a
small memory budget), one whenever the waiting parts fill it and the last at the window's
end, before the manifest. Each part stays a whole, valid Parquet file inside its pack: the manifest
lists it with the pack's ``path``, its ``offset`` and its ``length`` (window manifest
format 2, which readers of format 1 refuse), and a reader reads that byte range.

Inside the merge a part is named by a string, ``bucket/key`` (or ``key``); a packed part
by ``…/pack-00000-ab12cd.pack#range=OFFSET-LENGTH`` (:func:`part_ref`): the keys of the
store never hold ``#`` (table names are percent-encoded, :mod:`.layout`). :func:`open_part`
opens either for pyarrow. Spark's own Parquet reader (``--reader s3a``) cannot read a
range: the merge reads packed parts with its Python reader (:mod:`airflow_pgcdc.merge.spark_io`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

PACK_MAX_PART_BYTES = 1 << 20
"""Finished parts up to this size are packed (0: none); bigger ones are objects of their own."""

PACK_MAX_BYTES = 64 << 20
"""A pack object is closed at this size and the next one started."""

RANGE_MARK = "#range="


def part_ref(base: str, entry: Mapping[str, Any]) -> str:
    """The reference to a manifest's part ``entry`` under ``base`` (the folder's key prefix,
    or ``bucket/`` + it): ``base + path``, with the byte range of a packed part."""
    ref = base + str(entry["path"])
    if entry.get("offset") is not None:
        ref += f"{RANGE_MARK}{int(entry['offset'])}-{int(entry['length'])}"
    return ref


def split_ref(ref: str) -> tuple[str, int | None, int | None]:
    """``(path, offset, length)`` of a part reference; ``offset``/``length`` are ``None``
    for a part that is its own object."""
    path, mark, span = ref.rpartition(RANGE_MARK)
    if not mark:
        return ref, None, None
    offset, _, length = span.partition("-")
    if not (offset.isdigit() and length.isdigit()):
        raise ValueError(f"part reference {ref!r}: the range is not OFFSET-LENGTH")
    return path, int(offset), int(length)


def is_packed(ref: str) -> bool:
    return RANGE_MARK in ref


WHOLE_PACK_BYTES = 16 << 20
"""A pack up to this size is read whole at its first use and kept (:data:`PACK_CACHE_BYTES`
over all packs, least recently used dropped first): a merge reads every small table's part
from it, and each table's schema check and rows, without a request each. A bigger pack, and
a pack once dropped from the cache, is read by range: no pack is downloaded whole twice."""

PACK_CACHE_BYTES = 256 << 20

_packs: OrderedDict[str, bytes] = OrderedDict()
_packs_lock = threading.Lock()
_loading: dict[str, threading.Lock] = {}
_ranged: set[str] = set()  # packs read by range: over WHOLE_PACK_BYTES, or dropped from the cache


def open_part(fs: Any, ref: str):
    """A pyarrow-readable file of the part ``ref`` (a ``bucket/key`` reference) on the Arrow
    filesystem ``fs``: the object itself, or its byte range, in memory (a packed part is
    small by construction; a pack is immutable, so its bytes are kept for the process's
    next parts, see :data:`WHOLE_PACK_BYTES`)."""
    path, offset, length = split_ref(ref)
    if offset is None:
        return fs.open_input_file(path)
    import pyarrow as pa

    pack = _whole_pack(fs, path)
    if pack is not None:
        data = pack[offset:offset + length]
    else:
        with fs.open_input_file(path) as f:
            data = f.read_at(length, offset)
    if len(data) != length:
        raise ValueError(f"packed part {ref!r}: {len(data)} bytes read, {length} expected (a truncated pack)")
    return pa.BufferReader(data)


def _whole_pack(fs: Any, path: str) -> bytes | None:
    """The bytes of the pack at ``path`` when it is at most :data:`WHOLE_PACK_BYTES` (read
    once per process, by one thread while the others wait), else ``None``."""
    with _packs_lock:
        if path in _packs:
            _packs.move_to_end(path)
            return _packs[path]
        if path in _ranged:
            return None
        loading = _loading.setdefault(path, threading.Lock())
    with loading:
        with _packs_lock:
            if path in _packs or path in _ranged:
                return _packs.get(path)
        with fs.open_input_file(path) as f:
            if f.size() > WHOLE_PACK_BYTES:
                data = None
            else:
                data = f.read()
        with _packs_lock:
            _loading.pop(path, None)
            if data is None:
                _ranged.add(path)
            else:
                _packs[path] = data
                while sum(len(v) for v in _packs.values()) > PACK_CACHE_BYTES and len(_packs) > 1:
                    # an evicted pack is read by range from then on: a merge going table by table
                    # over more windows than the cache holds never downloads a pack twice
                    _ranged.add(_packs.popitem(last=False)[0])
        return data


class PartPacker:
    """Collects a window's small finished parts (:meth:`add`) and writes them as pack
    objects: ``key_for(number)`` names pack ``number``, ``put(key, body)`` writes it. A pack
    is written as soon as the parts waiting reach ``max_pack_bytes`` (so the parts held in
    memory stay under it, whatever the number of tables), the rest by :meth:`write` at the
    window's end. Parts are packed in the order added."""

    def __init__(self, key_for: Callable[[int], str], put: Callable[[str, bytes], None], *,
                 max_pack_bytes: int = PACK_MAX_BYTES) -> None:
        self._key_for = key_for
        self._put = put
        self.max_pack_bytes = max_pack_bytes
        self._body = bytearray()
        self._members: list[tuple[str, int, int]] = []
        self._placed: dict[str, tuple[str, int, int]] = {}
        self._number = 0
        self._lock = threading.Lock()

    def add(self, key: str, body: bytes) -> None:
        with self._lock:
            if self._members and len(self._body) + len(body) > self.max_pack_bytes:
                self._put(*self._place())
            self._members.append((key, len(self._body), len(body)))
            self._body += body

    def write(self) -> dict[str, tuple[str, int, int]]:
        """Write the parts still waiting: ``{part key: (pack key, offset, length)}`` of every
        part added."""
        with self._lock:
            if self._members:
                self._put(*self._place())
            return dict(self._placed)

    def discard(self) -> None:
        with self._lock:
            self._body, self._members = bytearray(), []

    def _place(self) -> tuple[str, bytes]:
        key = self._key_for(self._number)
        self._placed.update({k: (key, o, n) for k, o, n in self._members})
        body = bytes(self._body)
        self._number += 1
        self._body, self._members = bytearray(), []
        return key, body
