"""One window once its stream has started: :class:`WindowRun` receives, writes the parts,
commits the manifest and only then acknowledges; with its helpers (the heartbeat, the
spool folder, I/O run while the replication connection is kept alive) and the drain's
fault points (:mod:`airflow_pgcdc.faults`). Part of the drain (:mod:`airflow_pgcdc.drain.drain`)."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
import threading
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import psycopg

from airflow_pgcdc.changes.assembly import HeldPrepared, TransactionAssembler, event_position
from airflow_pgcdc.changes.rows import ROW_OVERHEAD
from airflow_pgcdc.drain.guards import (
    DrainTimeout,
    WindowConflict,
    check_publications,
    follow_catalog,
    partition_leaves,
)
from airflow_pgcdc.drain.plan import Plan
from airflow_pgcdc.drain.window import CHUNK_BYTES, HEARTBEAT_PREFIX, TypeResolver, WindowSink
from airflow_pgcdc.faults import FaultPoint, fault_after, fault_point
from airflow_pgcdc.protocol import pgoutput as po
from airflow_pgcdc.protocol.frames import XLogData
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.catalog import CATALOG_FIELD, read_fingerprints, write_fingerprints
from airflow_pgcdc.store.layout import Layout, new_attempt_id
from airflow_pgcdc.store.privacy import resolve_privacy
from airflow_pgcdc.store.window import (
    COMMIT_TIMES_FIELD,
    KEY_MOVES_FIELD,
    REFUSED_FIELD,
    RESUMED_FIELD,
    WindowManifest,
    WindowWriter,
)

if TYPE_CHECKING:
    from airflow_pgcdc.drain.options import DrainOptions, DrainResult

log = logging.getLogger("airflow_pgcdc.drain.drain")  # the drain's logger, one name for all its modules

PROGRESS_SECONDS = 30.0
"""How often a window being received logs its progress (:func:`progress_line`)."""


def progress_line(rows: int, start: int, at: int, end: int | None, elapsed: float) -> str:
    """A receiving window's progress: rows so far, the stream's position, and with a known
    end (``end_lsn``) the percent of the LSN range read and an ETA at the rate so far."""
    rate = rows / elapsed if elapsed > 0 else 0.0
    text = f"{rows:,} change rows, at {LSN(at)}, {elapsed:,.0f}s, {rate:,.0f} rows/s"
    if end is not None and end > start:
        done = min(max(at - start, 0) / (end - start), 1.0)
        eta = f"{elapsed * (1 - done) / done:,.0f}s" if done > 0 else "unknown"
        text += f", {100 * done:.1f}% of [{LSN(start)}, {LSN(end)}), ETA {eta}"
    return text

HEARTBEAT_RECORD_SLACK = 512  # bytes past a heartbeat's LSN that its own record may take
GATHER_SECONDS = 0.002
"""The replication connection's ``gather_seconds`` while the drain reads: after waiting for
the socket, let the walsender's one-message sends gather for this long. Measured
(bench/drain.py, 1,000,000 inserts, 2 rounds, idle 2-core machine): 0 s, 1.27x
pg_recvlogical at 4.5 CPU-s per million rows; 0.1 ms, 1.41x at 3.5; 0.5 ms, 1.62x at 2.9;
2 ms, 2.18x at 1.2."""



class WindowRun:
    """One window once its stream has started (the slot is ours): :meth:`run` receives
    up to ``end_lsn`` (or a limit), then writes the parts, commits the manifest and only
    then acknowledges."""

    def __init__(self, conn, stream, sql: psycopg.Connection, types: TypeResolver, client, layout: Layout,
                 slot: str, plan: Plan, options: DrainOptions, *, end_lsn: LSN, spool: str,
                 result: DrainResult, ident, t0: float, started_at: datetime) -> None:
        self.conn = conn
        self.stream = stream
        self.sql = sql
        self.types = types
        self.client = client
        self.layout = layout
        self.slot = slot
        self.plan = plan
        self.seq = plan.seq
        self.start = plan.start
        self.options = options
        self.end_lsn = end_lsn
        self.spool = spool
        self.result = result
        self.ident = ident
        self.t0 = t0
        self.started_at = started_at
        # the folder may hold debris of attempts that did not commit: it is left alone until this
        # attempt commits (an attempt of a drain that lost its slot may still be uploading, and its
        # commit would be refused anyway), then swept; our parts carry our attempt id in their names
        self.attempt = new_attempt_id()
        self._last_status = time.monotonic()
        self._last_progress = self._receive_t0 = self._last_status
        self._part_closed = False

    def pump(self) -> None:
        """Send a standby status update when one is due (keeps the walsender from timing out);
        log the window's progress every :data:`PROGRESS_SECONDS`."""
        now = time.monotonic()
        if now - self._last_status >= min(self.options.status_interval, 1.0):
            self.conn.send_feedback()
            self._last_status = now
        if now - self._last_progress >= PROGRESS_SECONDS and getattr(self, "window", None) is not None:
            self._last_progress = now
            log.info("slot %s: window %d receiving: %s", self.slot, self.seq, progress_line(
                self.window.rows, int(self.start), int(self.conn.received_lsn),
                None if self.end_lsn is None else int(self.end_lsn), now - self._receive_t0))

    def _on_part_close(self) -> None:
        if not self._part_closed:
            self._part_closed = True
            fault_point(FaultPoint.DRAIN_DURING_UPLOAD, log)

    def _fetch(self, h: HeldPrepared) -> str:
        e = h.stored or {}
        key = self.layout.window_prefix(self.slot, e["window_seq"]) + e["path"]
        fd, path = tempfile.mkstemp(prefix=f"held-{h.xid}-", suffix=".spool", dir=self.spool)
        with os.fdopen(fd, "wb") as f:  # streamed to disk, status updates going on meanwhile
            _while_pumping(lambda: s3store.download_to(self.client, self.layout.bucket, key, f), self.pump)
        return path

    def run(self) -> DrainResult:
        o = self.options
        writer_kw = {"target_part_bytes": o.target_part_bytes} if o.target_part_bytes else {}
        self.writer = WindowWriter(self.client, self.layout, self.slot, self.seq, on_part_close=self._on_part_close,
                                   attempt=self.attempt, memory_budget=o.memory_budget,
                                   pack_max_part_bytes=o.pack_parts_under, **writer_kw)
        # the slot's column rules: the store's (a drain given none still applies them)
        privacy = resolve_privacy(self.client, self.layout, self.slot, o.pii or None)
        self.window = WindowSink(self.writer, self.types, self.pump,
                                 buffer_budget=max(o.memory_budget // 4, CHUNK_BYTES), as_text=o.as_text,
                                 privacy=privacy or None)
        self.asm = TransactionAssembler(
            self.window, proto_version=self.stream.options.proto_version, spool_dir=self.spool,
            skip_origins=frozenset(o.skip_origins),
            message_prefixes=tuple(o.message_prefixes) if o.message_prefixes is not None else None,
            held=self.plan.held, fetch_prepared=self._fetch,
        )
        try:
            reason, window_end, receive_seconds = self._receive()
            manifest = self._commit(reason, window_end, receive_seconds)
        except BaseException:
            self.writer.abort()
            raise
        finally:
            self.asm.close()
        return self._report(manifest, window_end)

    def _receive(self) -> tuple[str | None, LSN, float]:
        """Receive until the window's end: ``(reason, window_end, receive_seconds)``."""
        o = self.options
        conn, stream, sql, asm, window = self.conn, self.stream, self.sql, self.asm, self.window
        slot, end_lsn, pump = self.slot, self.end_lsn, self.pump
        max_rows, max_bytes, max_seconds, max_wait = o.max_rows, o.max_bytes, o.max_seconds, o.max_wait
        heartbeat, heartbeat_after = o.heartbeat, o.heartbeat_after
        # the after-receive point is checked after every transaction: read the environment once
        kill_after = fault_after()
        receive_t0 = time.monotonic()
        deadline = receive_t0 + max_seconds if max_seconds is not None else None
        safe = self.plan.floor  # the furthest position where a window could end right now
        received = 0
        last_progress = time.monotonic()
        last_heartbeat = 0.0
        last_data = last_progress  # the last progress other than a heartbeat (for max_wait)
        # A walsender reading WAL that holds nothing for us (a busy unpublished table, a catch-up
        # from an old restart_lsn) sends nothing at all while our status updates keep it from
        # pinging: after a silent while, ask for a keepalive (reply_requested); its wal_end is how
        # far decoding got, which is progress (for max_wait) and, outside a transaction, a
        # position where the window may end
        ping_every = min(1.0, max_wait / 4, max_seconds / 3 if max_seconds else 1.0)
        last_ping = 0.0
        last_wal_end = safe
        # the server's position moving only past our own heartbeat record is not progress (an end
        # the stream never reaches must still time out)
        hb_lsn: LSN | None = None
        reach = stream.passed_at(end_lsn)  # a keepalive at or past it: end_lsn was passed
        reason = None
        n = 0  # XLogData frames received
        n_seen = 0  # ... as of the last silent read (changes do not touch last_progress)
        n_heartbeats = n_data_seen = 0
        read = conn.read_message
        decode = stream.decoder.decode
        feed = asm.feed
        take_raw = asm.take_raw
        in_block = False  # inside a stream block (a streamed transaction's changes are spooled)
        # the native receive path (pg.copyrun): once a plain transaction's insert (or new-row
        # update) was taken as received, the like messages of its table that follow are taken
        # in bulk, straight from libpq, into the table's open chunk
        conn.gather_seconds = GATHER_SECONDS
        read_run = conn.read_run if conn.can_read_runs() else None
        run_target, took_run, raw_run_oid = window.run_target, window.took_run, asm.raw_run_oid
        run_oid = None
        while True:
            if run_oid is None:
                frame = read(0.2)
            else:
                k, nbytes, frame = read_run(run_oid, *run_target(), ROW_OVERHEAD, 0.2)
                if k:
                    took_run(k, nbytes)
                    received += nbytes
                    if (n + k) >> 12 != n >> 12:  # as below: a status update every 4,096 frames
                        pump()
                    n += k
                    if frame is None:
                        continue
                if frame is not None:
                    run_oid = None  # something else came: the run is over
            if type(frame) is XLogData:
                data = frame.data
                n += 1
                # the hottest path: a plain transaction's insert, or a change in a stream block,
                # taken undecoded (decoded in batches by the writer, or when replayed)
                if data and (in_block or data[0] == 73 or data[0] == 85) and take_raw(data):
                    received += len(data)
                    if n & 4095 == 0:
                        pump()
                    if read_run is not None and not in_block:
                        run_oid = raw_run_oid(data)
                    continue
                msg = decode(data)
                t = type(msg)
                if t is po.Insert or t is po.Update or t is po.Delete:  # the hot path
                    received += len(data)
                    feed(msg, data)
                    if n & 4095 == 0:
                        pump()
                    continue
                now = time.monotonic()
                last_progress = now
                if t is po.LogicalMessage and msg.prefix == HEARTBEAT_PREFIX:
                    n_heartbeats += 1
                else:
                    last_data = now
                if n & 255 == 0:
                    pump()
                pos = event_position(msg)
                if pos is not None and pos >= end_lsn:
                    reason = "until_lsn"
                    break
                received += len(data)
                window.txn_ended = False
                feed(msg, data)
                in_block = asm.in_stream_block
                if window.txn_ended:
                    if window.last_end is not None and window.last_end > safe:
                        safe = window.last_end
                    if kill_after is not None and window.transactions >= kill_after:
                        fault_point(FaultPoint.DRAIN_AFTER_RECEIVE, log)
                    if max_rows is not None and window.rows >= max_rows:
                        reason = "max_rows"
                    elif max_bytes is not None and received >= max_bytes:
                        reason = "max_bytes"
                    elif deadline is not None and now >= deadline:
                        reason = "max_seconds"
                    if reason is not None and not asm.in_transaction:
                        break
                    reason = None
                continue
            now = time.monotonic()
            if frame is None:
                if n != n_seen:  # frames (maybe only changes) arrived since the last silent read
                    n_seen = n
                    last_progress = now
                    if n - n_heartbeats != n_data_seen:
                        n_data_seen = n - n_heartbeats
                        last_data = now
                if deadline is not None and now >= deadline and not asm.in_transaction:
                    reason = "max_seconds"
                    break
                if now - last_progress > heartbeat_after and heartbeat and now - last_heartbeat > heartbeat_after:
                    hb_lsn = _emit_heartbeat(sql) or hb_lsn
                    last_heartbeat = now
                if now - last_data >= ping_every and now - last_ping >= ping_every:
                    conn.send_feedback(reply_requested=True)
                    self._last_status = last_ping = now
                if now - last_data > max_wait:
                    raise DrainTimeout(
                        f"slot {slot}: the stream did not reach {end_lsn}: no progress for {max_wait}s "
                        f"(nothing received, and the server's position stayed at {last_wal_end}; received up "
                        f"to {conn.received_lsn})"
                    )
                pump()
                continue
            # a keepalive: outside a transaction, everything before wal_end was decoded
            pump()
            if frame.wal_end > last_wal_end:  # the walsender moved on: progress, even in silence
                last_wal_end = frame.wal_end
                if hb_lsn is None or frame.wal_end > hb_lsn + HEARTBEAT_RECORD_SLACK:
                    last_data = now
            if not asm.in_transaction:
                if frame.wal_end >= reach:
                    reason = "until_lsn"
                    break
                if frame.wal_end > safe:
                    safe = frame.wal_end
                    last_progress = now
                if deadline is not None and now >= deadline:
                    reason = "max_seconds"
                    break
        window_end = end_lsn if reason == "until_lsn" else max(safe, self.plan.floor)
        receive_seconds = time.monotonic() - receive_t0
        return reason, window_end, receive_seconds

    def _follow_catalog(self) -> str | None:
        """DDL the stream did not describe (:func:`~airflow_pgcdc.drain.guards.follow_catalog`),
        before the parts are finished; the digest of this window's fingerprints. A failure
        only logs: those tables' columns then follow with their next change, as before."""
        if not self.plan.pipeline:
            return None
        try:
            previous = (read_fingerprints(self.client, self.layout, self.slot, self.plan.catalog)
                        if self.plan.catalog else None)
            prints = follow_catalog(self.sql, self.window, self.options.publications, self.plan.pipeline, previous)
            return write_fingerprints(self.client, self.layout, self.slot, prints)
        except Exception as exc:  # noqa: BLE001 - an addition to the stream's own descriptions
            log.warning("slot %s: window %d: could not compare the tables' columns with the catalog (%s): DDL on "
                        "a table without changes reaches its Delta table with its next change", self.slot,
                        self.seq, exc)
            return None

    def _commit(self, reason: str | None, window_end: LSN, receive_seconds: float) -> WindowManifest:
        """Parts, held prepared transactions, the manifest, then the acknowledgement."""
        o = self.options
        conn, sql, client, layout, asm, window, writer = (
            self.conn, self.sql, self.client, self.layout, self.asm, self.window, self.writer)
        slot, seq, start, pump, ident, attempt = self.slot, self.seq, self.start, self.pump, self.ident, self.attempt
        publications, pipeline, forget = o.publications, self.plan.pipeline, o.forget
        started_at, snapshot_id = self.started_at, self.plan.snapshot_id
        # ---- finish: parts, held prepared transactions, manifest, then the acknowledgement
        fin_t0 = time.monotonic()
        window.flush()
        pending = []
        for h in asm.held.values():
            if h.stored is not None:
                pending.append(dict(h.stored))
                continue
            entry = {
                "gid": h.gid, "xid": h.xid, "prepare_lsn": str(h.prepare_lsn),
                "prepare_end_lsn": str(h.prepare_end_lsn),
                "prepare_ts": h.prepare_ts.isoformat() if h.prepare_ts else None,
                "origin": h.origin, "changes": h.spool.changes if h.spool else 0,
            }
            if h.spool is None:  # skipped by origin: nothing to keep but the gid
                entry |= {"window_seq": seq, "path": None, "bytes": 0, "skipped": True}
                pending.append(entry)
                continue
            writer.submit_prepared(entry, h.spool.write_filtered, pump)
            pending.append(entry)  # completed (path, bytes) by the writer
        catalog = self._follow_catalog()
        out = writer.finish(pump)
        for t in out["tables"]:  # tells the merge to take those values from the old key's row
            lost = window.lost_toast.get(f"{t['schema']}.{t['table']}")
            if lost:
                t[KEY_MOVES_FIELD] = lost["updates"]
        refused_tables = {**writer.refused, **window.refused}  # a reserved name wins: the first cause
        for key, more in writer.refused.items():
            if key in window.refused:
                refused_tables[key] = {**window.refused[key],
                                       "changes": window.refused[key]["changes"] + more["changes"]}
        out["tables"] = [t for t in out["tables"] if (t["schema"], t["table"]) not in refused_tables]
        for (schema, table), refused in refused_tables.items():
            out["tables"].append({"schema": schema, "table": table, "rows": 0, "bytes": 0,
                                  "relation_versions": [], REFUSED_FIELD: refused})
        fault_point(FaultPoint.DRAIN_AFTER_PARTS, log)
        # before anything is committed or confirmed: the publications still cover the pipeline
        # (dropped or altered during the window?); the query also proves the catalog session,
        # and with it the slot lock, is alive
        pubs = check_publications(sql, publications, pipeline or (), slot=slot, forget=forget)
        for what, tables in (("dropped", pubs.dropped), ("forgotten (--forget-table)", pubs.forgotten)):
            if tables:
                log.warning("slot %s: window %d: table(s) %s left the pipeline: %s; their Delta tables "
                            "keep their last state", slot, seq, ", ".join(f"{a}.{b}" for a, b in tables), what)
        manifest = WindowManifest(
            slot=slot, window_seq=seq, start_lsn=str(start), end_lsn=str(window_end),
            end_reason=reason or "until_lsn", transactions=window.transactions,
            rows=sum(t["rows"] for t in out["tables"]), bytes=out["bytes"], tables=tuple(out["tables"]),
            truncates=tuple(window.truncates), origins=tuple(window.origins),
            skipped_transactions=asm.skipped_transactions,
            messages={"transactional": window.n_messages[0], "non_transactional": window.n_messages[1],
                      "parts": out["messages_parts"]},
            prepared={"pending": pending, "committed": window.committed_prepared,
                      "rolled_back": window.rolled_back_prepared},
            streamed={"committed": asm.streamed_committed, "aborted": asm.streamed_aborted},
            timings={"started_at": started_at.isoformat(), "finished_at": datetime.now(UTC).isoformat(),
                     "receive_seconds": round(receive_seconds, 3),
                     "finish_seconds": round(time.monotonic() - fin_t0, 3)},
            first_commit_lsn=str(window.first_commit) if window.first_commit is not None else None,
            last_commit_lsn=str(window.last_commit) if window.last_commit is not None else None,
            system_id=ident.systemid, timeline=ident.timeline, snapshot_id=snapshot_id,
            publications=tuple(publications), pipeline_tables=tuple(sorted(pubs.covered)), attempt=attempt,
            extra={**partition_leaves(sql, pubs.covered, client=client, layout=layout, slot=slot, seq=seq),
                   **({COMMIT_TIMES_FIELD: {"first": window.commit_times[0].isoformat(),
                                            "last": window.commit_times[1].isoformat()}}
                      if None not in window.commit_times else {}),
                   **({RESUMED_FIELD: self.plan.resumed} if self.plan.resumed else {}),
                   **({CATALOG_FIELD: catalog} if catalog else {})},
        )
        if not _while_pumping(lambda: writer.commit(manifest), pump):
            try:
                _while_pumping(lambda: writer.discard(manifest), pump)
            except Exception as exc:  # only garbage: the committed window does not list them
                log.warning("slot %s: window %d: could not remove this attempt's parts: %s", slot, seq, exc)
            raise WindowConflict(
                f"window {seq} of slot {slot} was committed by another drain meanwhile "
                f"(s3://{layout.bucket}/{layout.window_manifest(slot, seq)}); this drain's parts are "
                "removed and nothing was acknowledged",
                hint="runs of one slot must not overlap; the committed window stands",
            )
        fault_point(FaultPoint.DRAIN_AFTER_MANIFEST, log)
        try:
            swept = _while_pumping(lambda: writer.sweep(manifest), pump)
            if swept:
                log.info("slot %s: window %d: removed %d object(s) of attempts that did not commit", slot, seq, swept)
        except Exception as exc:  # committed: leftovers are garbage no reader lists
            log.warning("slot %s: window %d: could not remove other attempts' objects: %s", slot, seq, exc)
        conn.confirm(window_end)
        fault_point(FaultPoint.DRAIN_AFTER_ACK, log)
        try:
            conn.stop()
        except Exception as exc:  # the window is committed and acknowledged: only log
            log.warning("slot %s: ending the stream: %s", slot, exc)
        return manifest

    def _report(self, manifest: WindowManifest, window_end: LSN) -> DrainResult:
        window, result, slot, seq, start, layout = (
            self.window, self.result, self.slot, self.seq, self.start, self.layout)
        log.info("slot %s: window %d committed [%s, %s) %s: %d transactions, %d rows, %.1f MB",
                 slot, seq, start, window_end, manifest.end_reason, manifest.transactions, manifest.rows,
                 manifest.bytes / 1e6)
        for table, lost in window.lost_toast.items():
            log.warning(
                "slot %s: window %d: %d key-changing update(s) of %s left TOASTed column(s) %s unchanged "
                "(first at commit %s); without REPLICA IDENTITY FULL PostgreSQL sends neither those values "
                "nor the old row: the merge keeps them from the old key's row unless that key changed "
                "earlier in the same batch (then NULL); set REPLICA IDENTITY FULL on %s to be sure",
                slot, seq, lost["updates"], table, ", ".join(lost["columns"]), lost["first_commit_lsn"], table,
            )
        return dataclasses.replace(
            result, lost_toast=window.lost_toast, window_seq=seq, end_lsn=str(window_end),
            end_reason=manifest.end_reason, transactions=manifest.transactions, rows=manifest.rows,
            bytes=manifest.bytes, tables=manifest.table_rows, manifest=layout.url(layout.window_manifest(slot, seq)),
            seconds=time.monotonic() - self.t0)


def _while_pumping(fn, pump, interval: float = 0.5):
    """Run ``fn()`` in a thread; meanwhile keep the replication connection alive."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            box["error"] = e

    th = threading.Thread(target=target, name="pgcdc-drain-io", daemon=True)
    th.start()
    while True:
        th.join(interval)
        if not th.is_alive():
            break
        pump()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def make_spool(base: str | None, slot: str) -> str:
    """This run's spool folder, ``{base}/pgcdc-spool-{slot}-{pid}-{random}`` (``base``: the
    system's temporary folder by default), removed when the run ends. A killed drain
    cannot remove its own (streamed transactions can spool gigabytes), so the next drain of
    the slot removes the folders of the slot whose process is gone."""
    base = base or tempfile.gettempdir()
    os.makedirs(base, exist_ok=True)
    prefix = f"pgcdc-spool-{slot}-"
    for name in os.listdir(base):
        pid = name[len(prefix):].split("-", 1)[0] if name.startswith(prefix) else ""
        if pid.isdigit() and not _alive(int(pid)):
            log.info("removing the spool folder of a drain that died: %s", os.path.join(base, name))
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=base)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _emit_heartbeat(sql: psycopg.Connection) -> LSN | None:
    """Write the heartbeat message; returns its record's LSN (None if it failed)."""
    try:
        if sql.info.server_version >= 170000:
            row = sql.execute("SELECT pg_logical_emit_message(false, %s, ''::text, true)::text",
                              (HEARTBEAT_PREFIX,)).fetchone()
        else:
            row = sql.execute("SELECT pg_logical_emit_message(false, %s, ''::text)::text",
                              (HEARTBEAT_PREFIX,)).fetchone()
        return LSN.parse(row[0])
    except psycopg.Error as exc:  # e.g. a read-only standby: the drain just waits longer
        log.warning("heartbeat failed: %s", exc)
        return None
