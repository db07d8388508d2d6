"""Change windows in the store: the window manifest (model, JSON, reading) and the
window writer (Parquet parts per table and relation version, uploaded off the
replication thread).

A window lives in ``{prefix}/{slot}/changes/w={window_seq:012d}/`` (see
:mod:`airflow_pgcdc.store.layout`)::

    {schema}.{table}/v{relation_version:04d}-part-{n:05d}.parquet   change rows (changes.rows)
    messages/part-{n:05d}.parquet                                    logical decoding messages
    prepared/{xid}-{gid}.spool                                       held prepared transactions
    _manifest.json                                                   written LAST, If-None-Match

The window exists if and only if ``_manifest.json`` does, and a folder with a manifest
is never rewritten: the objects the manifest lists stay as they are. Each attempt at a
window names its parts with its own attempt id, so attempts never overwrite each other;
objects no manifest lists are debris of attempts that did not commit, removed by the
attempt that commits the window (:meth:`WindowWriter.sweep`), never before.

Manifest (``"format": 1``, ``"kind": "window"``)::

    slot, window_seq, start_lsn, end_lsn          (LSNs as X/Y; commits in [start, end))
    end_reason                                    until_lsn | max_rows | max_bytes | max_seconds | caught_up
    system_id, timeline, snapshot_id              (snapshot_id: the snapshot this stream continues)
    transactions, first_commit_lsn, last_commit_lsn, rows, bytes
    tables: [{schema, table, rows, bytes, [key_moves_unchanged_toast,]
              relation_versions: [{version, relation_oid, replica_identity,
                                   [relfilenode,] columns: [{name, pg_type, type_oid, typmod, key, [attnum, attxmin]}],
                                   old_columns, rows, bytes, parts: [{path, rows, bytes}],
                                   [missing_values,] [rewritten_columns]}]}]
    truncates: [{seq, xid, commit_lsn, tables: ["schema.table"], relations: [[schema, table]],
                 cascade, restart_identity}]
    origins: [{xid, commit_lsn, origin, origin_lsn}]   skipped_transactions
    messages: {transactional, non_transactional, parts: [{path, rows, bytes}]}
    prepared: {pending: [{gid, xid, prepare_lsn, prepare_end_lsn, prepare_ts, window_seq, path,
                          bytes, changes, origin}],
               committed: [{gid, xid, commit_lsn}], rolled_back: [{gid, xid, lsn}]}
    streamed: {committed, aborted}
    timings: {started_at, finished_at, receive_seconds, finish_seconds}
    publications: [name]                          the publications streamed
    pipeline_tables: [[schema, table]]            the tables they covered at commit: the next
                                                  drain refuses if one of them is no longer
                                                  published but still exists
    attempt                                       the drain attempt that wrote it (its parts
                                                  carry the same 8 hex digits in their names)

A relation version may carry (each only when there is something to say; readers of
windows written before them read them as absent):

* ``missing_values``: one Arrow IPC row (base64) with the value rows older than an
  ``ADD COLUMN … DEFAULT`` read for each such column (``attmissingval``);
* ``rewritten_columns``: ``[{name, expression}]``, the version's columns whose rows
  already there a table rewrite filled, which no change carries (``ADD COLUMN …
  DEFAULT random()``, ``… GENERATED ALWAYS AS (…) STORED``, a constant default a later
  ``VACUUM FULL`` materialized): the catalog, read by the drain when the version first
  appears, shows a default without ``attmissingval`` on a table whose file
  (``relfilenode``) is newer than the default. The merge refuses the table while its
  Delta table lacks such a column (``TableRewritten``: ``pgcdc resync`` it).

``key_moves_unchanged_toast`` (only when non-zero): the table's key-changing updates whose
unchanged TOAST values the server did not send (no ``REPLICA IDENTITY FULL``); the merge
then matches such a row on its old key to keep those values.

``prepared.pending`` lists every prepared transaction not yet resolved at ``end_lsn``,
including those prepared in earlier windows (``window_seq`` says whose folder holds the
data): a reader of the latest window alone knows everything that is held. Its
``path`` is relative to that window's folder. Paths of parts are relative to this
window's folder. Readers must ignore unknown fields (kept in ``extra``).

Why one module of about 850 lines: the manifest's model and the writer that produces it
are one contract. The writer's commit rules (parts first, the manifest last with
If-None-Match, debris swept only by the attempt that commits) and the manifest's fields
are defined together above, and every field the writer fills is checked by the same
module's reader; splitting them would put the rules in one file and their only
enforcement in another.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from airflow_pgcdc.changes.columns import COMMIT_LSN, SEQ, XID
from airflow_pgcdc.changes.rows import ChangeChunk, RelationVersion
from airflow_pgcdc.protocol.lsn import LSN, InvalidLSN, lsn_text
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import (
    MANIFEST_NAME,
    Layout,
    encode_name,
    validate_attempt,
    window_folder,
)
from airflow_pgcdc.store.manifest import FORMAT_VERSION as MANIFEST_FORMAT
from airflow_pgcdc.store.manifest import ManifestError, load_document
from airflow_pgcdc.store.multipart import MultipartWriter
from airflow_pgcdc.store.packs import (
    PACK_MAX_BYTES,
    PACK_MAX_PART_BYTES,
    PartPacker,
    open_part,
    part_ref,
)
from airflow_pgcdc.store.parquet import DEFAULT_TARGET_PART_BYTES, PartSequence, TableEncodings
from airflow_pgcdc.store.s3 import StoreError
from airflow_pgcdc.typemap import arrays
from airflow_pgcdc.typemap.map import ValueConversionError

__all__ = [
    "FORMAT_VERSION",
    "MESSAGES_SCHEMA",
    "WindowManifest",
    "WindowManifestError",
    "WindowWriter",
    "committed_window_seqs",
    "latest_window",
    "prepared_key",
    "read_window",
    "read_window_rows",
    "window_folders",
]

log = logging.getLogger(__name__)

FORMAT_VERSION = MANIFEST_FORMAT  # one format number for every manifest
PACKED_FORMAT = 2
"""A window manifest some of whose parts are byte ranges of a pack object (``offset``,
``length``; :mod:`.packs`): readers of format 1 refuse it rather than read a pack as one part."""
KIND = "window"

MESSAGES_SCHEMA = pa.schema([
    pa.field(SEQ, pa.int64()),  # order in the window (transactional), else null
    pa.field("transactional", pa.bool_(), nullable=False),
    pa.field(XID, pa.int64()),
    pa.field(COMMIT_LSN, pa.int64()),
    pa.field("lsn", pa.int64(), nullable=False),
    pa.field("prefix", pa.string(), nullable=False),
    pa.field("content", pa.binary(), nullable=False),
])


WindowManifestError = ManifestError
"""The 0.1 name of a window manifest's error: every manifest raises :class:`ManifestError`."""


def _lsn(value: Any, what: str, key: str | None) -> str:
    try:
        return lsn_text(value)
    except (InvalidLSN, TypeError, AttributeError) as e:
        raise ManifestError(f"{what}: {e}", key=key) from None


DEFAULT_MEMORY_BUDGET = 256 << 20
"""Bytes of Arrow data the open parts of one window may hold before the largest are finished."""

SETTLE_MIN_ROWS = 256
"""An idle table's open part is encoded early (:meth:`WindowWriter.submit_rows`'s
``settle``) only when it holds at least this many unencoded rows: fewer would make a row
group too small to be worth its metadata (they wait for the next row group, or the end)."""

ENCODING_SAMPLE_ROWS = 16_384
"""Rows of a relation version's first row group counted to choose its columns' encodings
(:class:`~airflow_pgcdc.store.parquet.TableEncodings`; one choice for all its parts in the
window). Fewer than a snapshot counts: window parts are read once, by the merge, and the
count is the drain's CPU (on the 60-column ~2 KB-row table of ``bench/drain.py``, about
0.1 s for the 32,768 rows of a 64 MiB row group, 0.06 s for 16,384; same choice)."""

WINDOW_ROW_GROUP_BYTES = 16 << 20
"""Arrow bytes of a window part's row group (snapshot copies keep the Parquet writer's
64 MiB): the rows of a table's open row group wait in memory, unencoded, until it is full
or the window ends, so a smaller row group means less memory and less encoding left for
the window's finish. A window part is read once, by the merge, a row group at a time
(`merge/spark_io.py`, pyarrow's ``iter_batches``): smaller ones bound its reader's memory
too, and add some footer metadata (the merge was not timed on them).
``bench/drain.py --workload wide`` (60 columns, ~2 KB rows): the drain's peak RSS
325 → 249 MB, throughput unchanged within the runs' noise."""

DEFAULT_UPLOAD_THREADS = 8
"""Threads completing finished parts' uploads concurrently (see :class:`_Completions`)."""

COMPLETION_BYTES = 32 << 20
"""Bytes of finished parts' not-yet-uploaded data the completions may hold at once."""

KEY_MOVES_FIELD = "key_moves_unchanged_toast"
"""A table entry's count of key-changing updates with unsent TOAST values (see above)."""

REFUSED_FIELD = "refused"
"""A table entry whose changes the drain could not store (a column named like the change
metadata): ``{error, first_commit_lsn, last_commit_lsn, changes}``, no relation versions.
The merge refuses the table (its copy must be taken again, ``pgcdc resync``, once fixed)."""

COMMIT_TIMES_FIELD = "commit_times"
"""The window's first and last commit time: ``{first, last}`` (ISO 8601, UTC offset), the
way a replay to a time (``--until-time``) finds the window that holds the time without
reading the window's rows. A window written before the field existed has none: its rows'
``_pgcdc_commit_ts`` tell. Each truncate entry has its ``commit_time`` alike."""

RESUMED_FIELD = "resumed"
"""On the first window after ``pgcdc recover``: ``{recovery, cause, from_lsn, resumed_at,
copied_from, tables}``. The window starts at the store's end (``from_lsn``, so windows tile)
but its stream started at the slot's position ``resumed_at``: the changes in between are in
the recovery's copies only, so the merge applies it only to tables copied at or after
``resumed_at`` (:mod:`airflow_pgcdc.store.recoveries`)."""

_CORE = (
    "format", "kind", "slot", "window_seq", "start_lsn", "end_lsn", "end_reason", "system_id",
    "timeline", "snapshot_id", "transactions", "first_commit_lsn", "last_commit_lsn", "rows",
    "bytes", "tables", "truncates", "origins", "skipped_transactions", "messages", "prepared",
    "streamed", "timings", "publications", "pipeline_tables", "attempt",
)  # fmt: skip


@dataclass(frozen=True)
class WindowManifest:
    """``_manifest.json`` of a window (see the module docstring for every field)."""

    slot: str
    window_seq: int
    start_lsn: str
    end_lsn: str
    end_reason: str
    transactions: int = 0
    rows: int = 0
    bytes: int = 0
    tables: tuple[dict, ...] = ()
    truncates: tuple[dict, ...] = ()
    origins: tuple[dict, ...] = ()
    skipped_transactions: int = 0
    messages: Mapping[str, Any] = field(default_factory=dict)
    prepared: Mapping[str, Any] = field(default_factory=dict)
    streamed: Mapping[str, Any] = field(default_factory=dict)
    timings: Mapping[str, Any] = field(default_factory=dict)
    first_commit_lsn: str | None = None
    last_commit_lsn: str | None = None
    system_id: str | None = None
    timeline: int | None = None
    snapshot_id: str | None = None
    publications: tuple[str, ...] = ()
    # None: not recorded (a window written before the field existed)
    pipeline_tables: tuple[tuple[str, str], ...] | None = None
    attempt: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "start_lsn", _lsn(self.start_lsn, "start_lsn", None))
        object.__setattr__(self, "publications", tuple(self.publications))
        if self.pipeline_tables is not None:
            try:
                tables = tuple(sorted((str(s), str(t)) for s, t in self.pipeline_tables))
            except (TypeError, ValueError):
                raise ManifestError(
                    f"pipeline_tables: expected [[schema, table], ...], got {self.pipeline_tables!r}"
                ) from None
            object.__setattr__(self, "pipeline_tables", tables)
        object.__setattr__(self, "end_lsn", _lsn(self.end_lsn, "end_lsn", None))
        if LSN.parse(self.end_lsn) < LSN.parse(self.start_lsn):
            raise ManifestError(f"end_lsn {self.end_lsn} is before start_lsn {self.start_lsn}")
        if not isinstance(self.window_seq, int) or isinstance(self.window_seq, bool) or self.window_seq < 0:
            raise ManifestError(f"window_seq must be a non-negative integer, got {self.window_seq!r}")
        object.__setattr__(self, "tables", tuple(self.tables))
        object.__setattr__(self, "truncates", tuple(self.truncates))
        object.__setattr__(self, "origins", tuple(self.origins))

    @property
    def start(self) -> LSN:
        return LSN.parse(self.start_lsn)

    @property
    def end(self) -> LSN:
        return LSN.parse(self.end_lsn)

    @property
    def table_rows(self) -> dict[str, int]:
        """``{"schema.table": rows}``."""
        return {f"{t['schema']}.{t['table']}": t["rows"] for t in self.tables}

    @property
    def pending_prepared(self) -> list[dict]:
        return list(self.prepared.get("pending", ()))

    @property
    def packed(self) -> bool:
        """Whether a part of this window is inside a pack (:mod:`.packs`): format 2."""
        return any(p.get("offset") is not None for t in self.tables for rv in t.get("relation_versions", ())
                   for p in rv.get("parts", ()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PACKED_FORMAT if self.packed else FORMAT_VERSION,
            "kind": KIND,
            "slot": self.slot,
            "window_seq": self.window_seq,
            "start_lsn": self.start_lsn,
            "end_lsn": self.end_lsn,
            "end_reason": self.end_reason,
            "system_id": self.system_id,
            "timeline": self.timeline,
            "snapshot_id": self.snapshot_id,
            "transactions": self.transactions,
            "first_commit_lsn": self.first_commit_lsn,
            "last_commit_lsn": self.last_commit_lsn,
            "rows": self.rows,
            "bytes": self.bytes,
            "tables": list(self.tables),
            "truncates": list(self.truncates),
            "origins": list(self.origins),
            "skipped_transactions": self.skipped_transactions,
            "messages": dict(self.messages),
            "prepared": dict(self.prepared),
            "streamed": dict(self.streamed),
            "timings": dict(self.timings),
            "publications": list(self.publications),
            "pipeline_tables": (
                None if self.pipeline_tables is None else [list(t) for t in self.pipeline_tables]
            ),
            "attempt": self.attempt,
        } | dict(self.extra)

    def to_json(self) -> str:
        # compact: the C encoder (indent is pure Python: a 500-table window took ~50 ms more)
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes | Mapping[str, Any], *, key: str | None = None) -> WindowManifest:
        data = load_document(text, key, KIND, formats=(FORMAT_VERSION, PACKED_FORMAT))
        for name in ("slot", "window_seq", "start_lsn", "end_lsn"):
            if name not in data:
                raise ManifestError(f"missing field {name!r}", key=key)
        for name in ("transactions", "rows", "bytes"):
            v = data.get(name, 0)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ManifestError(f"{name}: expected a non-negative integer, got {v!r}", key=key)
        for name in ("tables", "truncates", "origins"):
            if not isinstance(data.get(name, []), list):
                raise ManifestError(f"{name}: expected a list", key=key)
        try:
            m = cls(
                slot=data["slot"],
                window_seq=data["window_seq"],
                start_lsn=data["start_lsn"],
                end_lsn=data["end_lsn"],
                end_reason=data.get("end_reason", ""),
                transactions=data.get("transactions", 0),
                rows=data.get("rows", 0),
                bytes=data.get("bytes", 0),
                tables=tuple(data.get("tables", ())),
                truncates=tuple(data.get("truncates", ())),
                origins=tuple(data.get("origins", ())),
                skipped_transactions=data.get("skipped_transactions", 0),
                messages=data.get("messages") or {},
                prepared=data.get("prepared") or {},
                streamed=data.get("streamed") or {},
                timings=data.get("timings") or {},
                first_commit_lsn=data.get("first_commit_lsn"),
                last_commit_lsn=data.get("last_commit_lsn"),
                system_id=data.get("system_id"),
                timeline=data.get("timeline"),
                snapshot_id=data.get("snapshot_id"),
                publications=tuple(data.get("publications") or ()),
                pipeline_tables=data.get("pipeline_tables"),
                attempt=data.get("attempt"),
                extra={k: v for k, v in data.items() if k not in _CORE},
            )
        except ManifestError as e:
            raise ManifestError(e.reason, key=key) from None
        if sum(t.get("rows", 0) for t in m.tables) != m.rows:
            raise ManifestError("rows differs from the sum over the tables", key=key)
        return m


# --------------------------------------------------------------------------- reading


def window_folders(client: Any, layout: Layout, slot: str) -> list[int]:
    """The ``window_seq`` of every window folder (committed or not), ascending."""
    prefix = layout.changes_prefix(slot)
    seqs = []
    paginator = client.get_paginator("list_objects_v2")
    with s3store._s3_call("ListObjectsV2", layout.bucket, prefix):
        for page in paginator.paginate(Bucket=layout.bucket, Prefix=prefix, Delimiter="/"):
            for p in page.get("CommonPrefixes", ()) or ():
                name = p["Prefix"][len(prefix):].rstrip("/")
                try:
                    seqs.append(layout.parse_window_key(slot, prefix + name + "/x"))
                except Exception:  # something else under changes/: not ours
                    continue
    return sorted(seqs)


TRUNCATE_RELATIONS = "relations"
"""A truncate entry's tables as ``[schema, table]`` pairs (exact whatever the names hold);
its ``tables`` (``"schema.table"`` text, kept for older readers) is ambiguous when a name
holds a dot, and is read only where ``relations`` is missing (windows written before it)."""


def truncated_relations(tr: dict) -> list[tuple[str, str]]:
    """The ``(schema, table)`` pairs a window's truncate entry names (older entries: their
    ``schema.table`` text split at the first dot, as it was read before the pairs)."""
    pairs = tr.get(TRUNCATE_RELATIONS)
    if pairs is not None:
        return [(str(a), str(b)) for a, b in pairs]
    return [tuple(name.partition(".")[::2]) for name in tr.get("tables", ())]  # type: ignore[misc]


def truncates_table(tr: dict, schema: str, table: str) -> bool:
    """Whether a window's truncate entry names ``schema.table`` (by pair; older entries by
    their text, which also names ``"a"."b.c"`` for ``"a.b"."c"``: the reason for the pairs)."""
    pairs = tr.get(TRUNCATE_RELATIONS)
    if pairs is not None:
        return any((str(a), str(b)) == (schema, table) for a, b in pairs)
    return f"{schema}.{table}" in tr.get("tables", ())


def held_tables(m: WindowManifest) -> set[tuple[str, str]]:
    """The tables a window holds changes or a truncate of."""
    out = {(t["schema"], t["table"]) for t in m.tables}
    for tr in m.truncates:
        out.update(truncated_relations(tr))
    return out


def read_window(client: Any, layout: Layout, slot: str, window_seq: int, *,
                document: bytes | None = None) -> WindowManifest:
    """The committed window (:class:`ObjectNotFound` if it is not committed); ``document``:
    its manifest already read (``None``: read it now)."""
    key = layout.window_manifest(slot, window_seq)
    if document is None:
        document = s3store.get_bytes(client, layout.bucket, key)
    m = WindowManifest.from_json(document, key=key)
    if m.window_seq != window_seq or m.slot != slot:
        raise ManifestError(
            f"the manifest says slot {m.slot} window {m.window_seq}", bucket=layout.bucket, key=key
        )
    return m


def committed_window_seqs(client: Any, layout: Layout, slot: str) -> list[int]:
    return [
        s for s in window_folders(client, layout, slot)
        if s3store.exists(client, layout.bucket, layout.window_manifest(slot, s))
    ]


def latest_window(client: Any, layout: Layout, slot: str) -> WindowManifest | None:
    """The committed window with the highest ``window_seq``, or ``None``."""
    for seq in reversed(window_folders(client, layout, slot)):
        try:
            return read_window(client, layout, slot, seq)
        except s3store.ObjectNotFound:
            continue  # debris of a crashed attempt
    return None


def read_window_rows(client: Any, layout: Layout, slot: str, manifest: WindowManifest,
                     *, fs: Any = None) -> dict[str, pa.Table]:
    """Every table's change rows of a committed window, ``{"schema.table": Table}``
    (relation versions concatenated when their schemas allow, else the last version's
    columns are promoted), sorted by ``_pgcdc_seq``. For tests and small tools."""
    import pyarrow.parquet as pq

    fs = fs or s3store.make_pyarrow_fs()
    base = layout.window_prefix(slot, manifest.window_seq)
    out = {}
    for t in manifest.tables:
        tables = []
        for rv in t["relation_versions"]:
            for p in rv["parts"]:
                with open_part(fs, part_ref(f"{layout.bucket}/{base}", p)) as f:
                    tables.append(pq.read_table(f))
        if tables:
            table = pa.concat_tables(tables, promote_options="permissive")
            out[f"{t['schema']}.{t['table']}"] = table.sort_by(SEQ)
    return out


def messages_batch(rows: list[dict]) -> pa.RecordBatch:
    """Rows of logical decoding messages (dicts with the fields of
    :data:`MESSAGES_SCHEMA`) as a record batch, built over buffers
    (``RecordBatch.from_pylist`` would make pyarrow import pandas)."""
    build = {pa.int64(): arrays.ints, pa.bool_(): arrays.bools, pa.string(): arrays.strings,
             pa.binary(): arrays.binaries}
    columns = [build[f.type]([r[f.name] for r in rows]) for f in MESSAGES_SCHEMA]
    return pa.RecordBatch.from_arrays(columns, schema=MESSAGES_SCHEMA)


def prepared_key(layout: Layout, slot: str, window_seq: int, xid: int, gid: str,
                 attempt: str | None = None) -> str:
    """``…/w=…/prepared/{xid}-{gid encoded}[-{attempt}].spool``."""
    suffix = "" if attempt is None else "-" + validate_attempt(attempt)
    return layout.window_prefix(slot, window_seq) + f"prepared/{xid}-{encode_name(gid)}{suffix}.spool"


# --------------------------------------------------------------------------- writing


class _Completions:
    """Completes finished parts' uploads (the last PutObject, or the last part and
    CompleteMultipartUpload) on a bounded thread pool, so a window closing hundreds of
    small parts does not wait for each request in turn (botocore releases the GIL while
    it waits on the network).

    A part handed over here is Parquet-complete (footer written, size known); only its
    upload is outstanding. At most ``max_pending`` completions are queued or running,
    holding at most about ``max_bytes`` of not-yet-uploaded bytes (a part larger than
    that waits until nothing else is pending): :meth:`submit` blocks the window writer's
    thread, never the replication thread. :meth:`wait` waits for every completion and
    raises the first failure: the window then fails (no manifest, no acknowledgement).
    """

    def __init__(self, threads: int, max_pending: int, max_bytes: int) -> None:
        self.threads = threads
        self.max_pending = max(1, max_pending)
        self.max_bytes = max_bytes
        self._pool: ThreadPoolExecutor | None = None
        self._cond = threading.Condition()
        self._pending = 0
        self._pending_bytes = 0
        self._futures: list[tuple[Future, _FaultSink]] = []
        self._error: BaseException | None = None

    def submit(self, sink: _FaultSink) -> None:
        if self.threads <= 0:
            sink.complete()
            return
        size = min(sink.tell(), self.max_bytes)
        with self._cond:
            while self._error is None and self._pending and (
                self._pending >= self.max_pending or self._pending_bytes + size > self.max_bytes
            ):
                self._cond.wait()
            if self._error is not None:
                sink.abort()
                raise self._error
            self._pending += 1
            self._pending_bytes += size
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="pgcdc-part-upload")
        try:
            self._futures.append((self._pool.submit(self._complete, sink, size), sink))
        except BaseException:
            with self._cond:
                self._pending -= 1
                self._pending_bytes -= size
            sink.abort()
            raise

    def _complete(self, sink: _FaultSink, size: int) -> None:
        try:
            sink.complete()
        except BaseException as e:  # noqa: BLE001 - raised by submit() / wait()
            with self._cond:
                self._error = self._error or e
            raise
        finally:
            with self._cond:
                self._pending -= 1
                self._pending_bytes -= size
                self._cond.notify_all()

    def wait(self) -> None:
        """Wait for every completion submitted; raise the first failure."""
        for fut, _ in self._futures:
            try:
                fut.result()
            except BaseException:  # noqa: BLE001 - the first one recorded is raised below
                pass
        self._futures = []
        self._shutdown()
        if self._error is not None:
            raise self._error

    def abort(self) -> None:
        """Cancel the completions not started (their uploads are aborted); wait for the
        running ones (objects they complete are debris no manifest lists)."""
        with self._cond:
            self._error = self._error or StoreError("the window writer was aborted")
            self._cond.notify_all()
        for fut, sink in self._futures:
            if fut.cancel():
                with contextlib.suppress(Exception):
                    sink.abort()
        self._futures = []
        self._shutdown()

    def _shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class _FaultSink:
    """Forwards to a MultipartWriter. Its :meth:`close` (called by the Parquet writer once
    the footer is written) hands the upload's completion to ``completions``; the
    completion calls ``on_close`` (the drain's fault hook) before completing the upload."""

    def __init__(self, inner: MultipartWriter, on_close: Callable[[], None] | None,
                 completions: _Completions | None = None, packer: PartPacker | None = None,
                 pack_max: int = 0) -> None:
        self._inner = inner
        self._on_close = on_close
        self._completions = completions
        self._packer = packer
        self._pack_max = pack_max
        self.key = inner.key

    def write(self, data):
        return self._inner.write(data)

    def tell(self):
        return self._inner.tell()

    def upload_ready(self) -> bool:
        return self._inner.upload_ready()

    @property
    def bytes_written(self):
        return self._inner.bytes_written

    def close(self):
        if self._packer is not None:  # a small part goes into the window's pack, not to a PUT of its own
            body = self._inner.detach_small(self._pack_max)
            if body is not None:
                if self._on_close is not None:
                    self._on_close()
                self._packer.add(self.key, body)
                return None
        if self._completions is None:
            return self.complete()
        return self._completions.submit(self)

    def complete(self):
        try:
            if self._on_close is not None:
                self._on_close()
        except BaseException:
            self._inner.abort()
            raise
        return self._inner.close()

    def abort(self):
        return self._inner.abort()


@dataclass
class _VersionOut:
    version: RelationVersion
    parts: PartSequence
    open_bytes: int = 0  # Arrow bytes written to the open part: what it may still hold in memory


class WindowWriter:
    """Writes one window's objects from a background thread.

    The replication thread calls :meth:`submit_rows` / :meth:`submit_messages` /
    :meth:`submit_prepared`; each blocks only while the bounded queue is full, and then
    calls ``wait()`` every ``wait_interval`` seconds (the drain sends standby status
    updates there, so the server never times out a slow window). :meth:`finish` closes
    every part (same ``wait`` loop) and returns the manifest fragments; the caller
    then commits with :meth:`commit`. An error in the writer thread is raised by the
    next call. ``on_part_close`` is the drain's fault-injection hook (tests only).
    A finished part's upload is completed by one of ``upload_threads`` threads
    (:class:`_Completions`; 0: in the writer thread), so a window of many small parts
    does not wait for each request in turn; parts of at most ``pack_max_part_bytes`` go into
    the window's pack objects instead (:mod:`.packs`); :meth:`finish` returns only once every
    part and pack is durably written, and raises if any is not (the window then fails).
    """

    def __init__(
        self,
        client: Any,
        layout: Layout,
        slot: str,
        window_seq: int,
        *,
        target_part_bytes: int = DEFAULT_TARGET_PART_BYTES,
        queue_size: int = 4,
        wait_interval: float = 0.5,
        on_part_close: Callable[[], None] | None = None,
        attempt: str | None = None,
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        upload_threads: int = DEFAULT_UPLOAD_THREADS,
        pack_max_part_bytes: int = PACK_MAX_PART_BYTES,
    ) -> None:
        window_folder(window_seq)  # validates
        self._completions = _Completions(upload_threads, 2 * upload_threads, COMPLETION_BYTES)
        # finished parts up to pack_max_part_bytes go into the window's pack objects (0: none)
        self.pack_max_part_bytes = pack_max_part_bytes
        # a pack is written once its parts reach a quarter of the memory budget (they wait in memory)
        self._packer = (PartPacker(self._pack_key, self._write_pack, max_pack_bytes=max(pack_max_part_bytes, min(
            PACK_MAX_BYTES, memory_budget // 4))) if pack_max_part_bytes > 0 else None)
        self.attempt = validate_attempt(attempt) if attempt is not None else None
        self.memory_budget = memory_budget
        self._open_total = 0  # sum of open_bytes over the open parts
        self.client = client
        self.layout = layout
        self.slot = slot
        self.window_seq = window_seq
        self.base = layout.window_prefix(slot, window_seq)
        self.target_part_bytes = target_part_bytes
        self.wait_interval = wait_interval
        self.on_part_close = on_part_close
        self._q: queue.Queue = queue.Queue(maxsize=queue_size)
        self._versions: dict[int, _VersionOut] = {}  # id(RelationVersion) -> out
        self._order: list[_VersionOut] = []
        self._messages: PartSequence | None = None
        self._prepared: list[dict] = []
        self._error: BaseException | None = None
        # tables one of whose values the type map cannot carry: their rows are left out of
        # the window ({(schema, table): {error, first_commit_lsn, last_commit_lsn, changes}})
        self.refused: dict[tuple[str, str], dict[str, Any]] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pgcdc-window-{window_seq}", daemon=True)
        self._thread.start()

    # -- API (replication thread)

    def submit_rows(self, version: RelationVersion, chunk: ChangeChunk, wait: Callable[[], None], *,
                    settle: bool = False) -> None:
        """Write ``chunk``'s rows to ``version``'s parts. ``settle``: the table is idle,
        encode its open part's rows now (a row group, when it has at least
        :data:`SETTLE_MIN_ROWS`) rather than at the next row group or the finish."""
        if len(chunk):
            self._put(("rows", version, chunk, settle), wait)

    def submit_messages(self, rows: list[dict], wait: Callable[[], None]) -> None:
        if rows:
            self._put(("messages", rows), wait)

    def submit_prepared(self, entry: dict, write: Callable[[Any], int], wait: Callable[[], None]) -> None:
        """Upload a held prepared transaction: ``write(fileobj)`` writes its spool;
        ``entry`` (a dict) gets ``path`` and ``bytes`` and goes to the manifest."""
        self._put(("prepared", entry, write), wait)

    def declare(self, version: RelationVersion, wait: Callable[[], None]) -> None:
        """Make sure ``version`` has a part sequence (and so a part 0, even if empty)."""
        self._put(("declare", version), wait)

    def finish(self, wait: Callable[[], None]) -> dict[str, Any]:
        """Close every part; returns ``{"tables", "messages", "prepared", "bytes"}``."""
        self._put(("finish",), wait)
        while not self._done.wait(self.wait_interval):
            wait()
        self._raise()
        return self._result

    def abort(self) -> None:
        try:
            self._q.put_nowait(("abort",))
        except queue.Full:
            pass
        self._error = self._error or RuntimeError("aborted")

    def commit(self, manifest: WindowManifest) -> bool:
        """Write the manifest with If-None-Match: True if this call committed the window
        (also when the put was retried after a success the client did not see: the
        manifest found is then byte for byte this one)."""
        key = self.layout.window_manifest(self.slot, self.window_seq)
        return s3store.commit_if_absent(
            self.client, self.layout.bucket, key, manifest.to_json().encode("utf-8"),
            content_type="application/json",
        )

    def _listed(self, manifest: WindowManifest) -> set[str]:
        """The keys of this window's folder that ``manifest`` lists (its manifest aside)."""
        listed = set()
        for t in manifest.tables:
            for v in t.get("relation_versions", ()):
                listed.update(self.base + p["path"] for p in v.get("parts", ()))
        listed.update(self.base + p["path"] for p in manifest.messages.get("parts", ()))
        for e in manifest.pending_prepared:
            if e.get("path") and e.get("window_seq") == self.window_seq:
                listed.add(self.base + e["path"])
        return listed

    def sweep(self, manifest: WindowManifest) -> int:
        """Once ``manifest`` (this window's) is committed: delete the objects of the folder
        it does not list and abort the folder's pending uploads (attempts that did not
        commit; none of them can commit any more). Returns the objects deleted."""
        keep = self._listed(manifest) | {self.base + MANIFEST_NAME}
        s3store.abort_uploads_under(self.client, self.layout.bucket, self.base)
        stale = [k for k in s3store.list_keys(self.client, self.layout.bucket, self.base) if k not in keep]
        return s3store.delete_keys(self.client, self.layout.bucket, stale, what=self.base)

    def discard(self, manifest: WindowManifest) -> int:
        """After a lost commit: delete this attempt's own objects (``manifest`` is the one
        that was refused; its parts carry this attempt's id, so they are no one else's)."""
        if self.attempt is None:
            return 0
        ours = sorted(k for k in self._listed(manifest) if self.attempt in k.rsplit("/", 1)[-1])
        return s3store.delete_keys(self.client, self.layout.bucket, ours, what=self.base)

    # -- internals

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _put(self, item, wait) -> None:
        while True:
            self._raise()
            if self._done.is_set():
                raise StoreError("the window writer has stopped")
            try:
                self._q.put(item, timeout=self.wait_interval)
                return
            except queue.Full:
                wait()

    def _run(self) -> None:
        try:
            while True:
                item = self._q.get()
                kind = item[0]
                if kind == "rows":
                    _, version, chunk, settle = item
                    if self._refused_rows(version, chunk):
                        continue
                    out = self._out(version)
                    try:
                        batch = version.to_batch(chunk)
                    except ValueConversionError as exc:
                        self._refuse(version, chunk, exc)
                        continue
                    finished = len(out.parts.parts)
                    out.parts.write_batch(batch)
                    if len(out.parts.parts) != finished:  # a part completed by size: its memory is gone
                        self._open_total -= out.open_bytes
                        out.open_bytes = 0
                    out.open_bytes += batch.nbytes
                    self._open_total += batch.nbytes
                    if settle:
                        out.parts.flush_row_group(SETTLE_MIN_ROWS)
                    if self._open_total > self.memory_budget:
                        self._roll_largest()
                elif kind == "declare":
                    if (item[1].schema, item[1].table) not in self.refused:
                        self._out(item[1])
                elif kind == "messages":
                    self._write_messages(item[1])
                elif kind == "prepared":
                    self._write_prepared(item[1], item[2])
                elif kind == "finish":
                    self._result = self._close_all()
                    return
                elif kind == "abort":
                    self._abort_all()
                    return
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            self._error = e
            self._abort_all()
        finally:
            self._done.set()

    def _refused_rows(self, version: RelationVersion, chunk: ChangeChunk) -> bool:
        """Count ``chunk`` against its table when the table is refused already."""
        entry = self.refused.get((version.schema, version.table))
        if entry is None:
            return False
        entry["changes"] += len(chunk)
        entry["last_commit_lsn"] = str(LSN(max(chunk.commit_lsns)))
        return True

    def _refuse(self, version: RelationVersion, chunk: ChangeChunk, exc: Exception) -> None:
        """One table's value cannot be carried (an array with lower bounds other than 1 mapped
        as an array, say): the table's rows are left out of the window, its parts aborted,
        and the manifest says so (``refused``); the other tables go on, and the merge refuses
        that table alone. Before, the error stopped the drain, and every later drain of the
        slot, for every table."""
        key = (version.schema, version.table)
        lsns = chunk.commit_lsns
        self.refused[key] = {
            "error": f"{type(exc).__name__}: {exc}", "kind": "value",
            "first_commit_lsn": str(LSN(min(lsns))) if lsns else "", "last_commit_lsn": str(LSN(max(lsns))) if lsns else "",
            "changes": len(chunk),
        }
        for out in [o for o in self._order if (o.version.schema, o.version.table) == key]:
            self._order.remove(out)
            self._versions.pop(id(out.version), None)
            self._open_total -= out.open_bytes
            try:
                out.parts.abort()
            except Exception:  # noqa: BLE001 - its objects are not listed: swept after the commit
                pass
        log.error("%s.%s: a value cannot be stored (%s): the table's changes are left out of window %d "
                  "(the other tables go on; the merge refuses this table)", key[0], key[1], exc, self.window_seq)

    def _roll_largest(self) -> None:
        """Keep the memory of the open parts under ``memory_budget`` whatever the number of
        tables: finish the parts holding the most until half the budget is left (each
        table's next rows go to a new part)."""
        for out in sorted(self._order, key=lambda o: o.open_bytes, reverse=True):
            if self._open_total <= self.memory_budget // 2 or out.open_bytes == 0:
                break
            out.parts.roll()
            self._open_total -= out.open_bytes
            out.open_bytes = 0

    def _open_sink(self, key: str, *, pack: bool = True):
        inner = MultipartWriter(
            self.client, self.layout.bucket, key, content_type="application/vnd.apache.parquet"
        )
        return _FaultSink(inner, self.on_part_close, self._completions, self._packer if pack else None,
                          self.pack_max_part_bytes)

    def _pack_key(self, number: int) -> str:
        return self.layout.window_pack(self.slot, self.window_seq, number, attempt=self.attempt)

    def _write_pack(self, key: str, body: bytes) -> None:
        with MultipartWriter(self.client, self.layout.bucket, key, content_type="application/octet-stream") as w:
            w.write(body)

    def _out(self, version: RelationVersion) -> _VersionOut:
        out = self._versions.get(id(version))
        if out is None:
            v = version

            def key_for(n: int, v=v) -> str:
                return self.layout.window_part(
                    self.slot, self.window_seq, v.schema, v.table, v.version, n, attempt=self.attempt
                )

            out = _VersionOut(version, PartSequence(
                version.schema_arrow, key_for, open_sink=self._open_sink,
                target_bytes=self.target_part_bytes, encodings=TableEncodings(ENCODING_SAMPLE_ROWS),
                row_group_bytes=WINDOW_ROW_GROUP_BYTES,
            ))
            self._versions[id(version)] = out
            self._order.append(out)
        return out

    def _write_messages(self, rows: list[dict]) -> None:
        if self._messages is None:
            self._messages = PartSequence(
                MESSAGES_SCHEMA,
                lambda n: self.layout.window_messages_part(self.slot, self.window_seq, n, attempt=self.attempt),
                open_sink=lambda key: self._open_sink(key, pack=False),  # messages parts stay objects
                target_bytes=self.target_part_bytes,
            )
        self._messages.write_batch(messages_batch(rows))

    def _write_prepared(self, entry: dict, write: Callable[[Any], int]) -> None:
        key = prepared_key(self.layout, self.slot, self.window_seq, entry["xid"], entry["gid"], self.attempt)
        with MultipartWriter(self.client, self.layout.bucket, key,
                             content_type="application/octet-stream") as w:
            size = write(w)
        entry["path"] = key[len(self.base):]
        entry["bytes"] = size
        entry["window_seq"] = self.window_seq
        self._prepared.append(entry)

    def _close_all(self) -> dict[str, Any]:
        tables: dict[tuple[str, str], dict] = {}
        total = 0
        closed = [(out, out.parts.close()) for out in self._order]
        messages = self._messages.close() if self._messages is not None else []
        placed = self._packer.write() if self._packer is not None else {}

        def entry_of(p) -> dict[str, Any]:
            d = p.to_dict(self.base)
            if p.key in placed:  # inside a pack: its path, offset and length
                pack, offset, length = placed[p.key]
                d.update(path=pack[len(self.base):], offset=offset, length=length)
            return d

        for out, parts in closed:
            v = out.version
            t = tables.setdefault((v.schema, v.table), {
                "schema": v.schema, "table": v.table, "rows": 0, "bytes": 0, "relation_versions": [],
            })
            entry = v.describe()
            entry["parts"] = [entry_of(p) for p in parts]
            entry["rows"] = sum(p.rows for p in parts)
            entry["bytes"] = sum(p.bytes for p in parts)
            t["rows"] += entry["rows"]
            t["bytes"] += entry["bytes"]
            t["relation_versions"].append(entry)
            total += entry["bytes"]
        messages_parts = [entry_of(p) for p in messages]
        total += sum(p["bytes"] for p in messages_parts)
        total += sum(p["bytes"] for p in self._prepared)
        self._completions.wait()  # every part durably written, or the window fails here
        return {
            "tables": list(tables.values()),
            "messages_parts": messages_parts,
            "prepared": list(self._prepared),
            "bytes": total,
        }

    def _abort_all(self) -> None:
        self._completions.abort()
        if self._packer is not None:
            self._packer.discard()
        for out in self._order:
            try:
                out.parts.abort()
            except Exception:  # noqa: BLE001
                pass
        if self._messages is not None:
            try:
                self._messages.abort()
            except Exception:  # noqa: BLE001
                pass

