"""One part of a snapshot copy (:class:`SnapshotPart`: a CTID block range of a table), the same in the coordinator's threads and in a worker
process (:mod:`airflow_pgcdc.snapshot.workers`): a session that imports the exported
snapshot, the copy of a part's CTID range into Parquet on S3, and the progress counters
it reports to. Neither :mod:`.export` nor :mod:`.workers` is imported here."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from airflow_pgcdc.pg.replication import ReplicationConnection
from airflow_pgcdc.pg.tables import TableInfo
from airflow_pgcdc.protocol.quoting import quote_literal
from airflow_pgcdc.snapshot.convert import SESSION_SETUP, TableConverter
from airflow_pgcdc.store.layout import Layout
from airflow_pgcdc.store.parquet import PartSequence

__all__ = ["Progress", "SnapshotPart", "copy_part", "import_snapshot"]


@dataclass(frozen=True, slots=True)
class SnapshotPart:
    table: TableInfo
    number: int
    start_block: int | None  # None: from the start
    end_block: int | None  # exclusive; None: to the end
    pages: int  # for progress

    @property
    def expected_rows(self) -> float:
        """Rows the statistics promise this part (``reltuples`` per page); 0 when unknown."""
        t = self.table
        return t.reltuples * self.pages / t.relpages if t.relpages > 0 and t.reltuples > 0 else 0.0

    def where(self) -> str:
        conds = []
        if self.start_block is not None:
            conds.append(f"ctid >= {quote_literal(f'({self.start_block},0)')}::tid")
        if self.end_block is not None:
            conds.append(f"ctid < {quote_literal(f'({self.end_block},0)')}::tid")
        if self.table.row_filter:
            conds.append(f"({self.table.row_filter})")
        if self.table.slice_where:
            conds.append(f"({self.table.slice_where})")
        return (" WHERE " + " AND ".join(conds)) if conds else ""


@dataclass
class Progress:
    """Counters of a running copy. The percentage is by heap pages: a finished part counts
    its pages; a running one the share of its pages its rows so far make, by the table's
    rows per page (``reltuples / relpages``), so the figure moves inside large parts."""

    total_pages: int
    started: float = field(default_factory=time.monotonic)
    done_pages: int = 0
    rows: int = 0
    bytes: int = 0
    parts_done: int = 0
    tables_done: int = 0
    running: dict = field(default_factory=dict)  # (table oid, part number) -> (part, rows so far)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def part_rows(self, part: SnapshotPart, rows: int) -> None:
        """``rows`` more rows of ``part`` (call with the lock held)."""
        key = (part.table.oid, part.number)
        _, done = self.running.get(key, (part, 0))
        self.running[key] = (part, done + rows)
        self.rows += rows

    def part_done(self, part: SnapshotPart, size: int) -> None:
        """``part`` is copied and uploaded (call with the lock held)."""
        self.running.pop((part.table.oid, part.number), None)
        self.bytes += size
        self.done_pages += part.pages
        self.parts_done += 1

    def percent(self) -> float:
        if not self.total_pages:
            return 100.0
        pages = self.done_pages + sum(
            part.pages * min(done / part.expected_rows, 1.0)
            for part, done in self.running.values()
            if part.expected_rows > 0
        )
        return min(100.0 * pages / self.total_pages, 100.0)

    def line(self, tables: int, parts: int) -> str:
        elapsed = time.monotonic() - self.started
        pct = self.percent()
        rate = self.rows / elapsed if elapsed > 0 else 0.0
        eta = f"{elapsed * (100.0 - pct) / pct:,.0f}s" if pct > 0 else "unknown"
        return (
            f"snapshot: {self.tables_done}/{tables} tables, {self.parts_done}/{parts} parts, "
            f"{self.rows:,} rows, {self.bytes / 1e6:,.1f} MB, {pct:.1f}% of pages, "
            f"{rate:,.0f} rows/s, ETA {eta}"
        )


def import_snapshot(dsn: str, snapshot_name: str) -> ReplicationConnection:
    conn = ReplicationConnection.connect(dsn, replication="false", application_name="pgcdc-snapshot")
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
    conn.execute(f"SET TRANSACTION SNAPSHOT {quote_literal(snapshot_name)}")
    for stmt in SESSION_SETUP:
        conn.execute(stmt)
    return conn


def copy_part(
    session: ReplicationConnection,
    part: SnapshotPart,
    conv: TableConverter,
    client,
    layout: Layout,
    slot: str,
    sid: str,
    progress: Progress,
    copy_format: str,
) -> tuple[int, str, int, int]:
    t = part.table
    key = layout.snapshot_part(slot, sid, t.schema, t.name, part.number)
    seq = PartSequence(
        conv.schema,
        key_for=lambda _n: key,
        client=client,
        bucket=layout.bucket,
        target_bytes=None,
        first_number=part.number,
        encodings=conv.encodings,
    )
    try:
        for batch in conv.batches(session, part.where(), copy_format):
            seq.write_batch(batch)
            with progress.lock:
                progress.part_rows(part, batch.num_rows)
        infos = seq.close()
    except BaseException:
        seq.abort()
        raise
    rows = sum(i.rows for i in infos)
    size = sum(i.bytes for i in infos)
    with progress.lock:
        progress.part_done(part, size)
    relative = key[len(layout.snapshot_prefix(slot, sid)) :].lstrip("/")
    return part.number, relative, rows, size
