"""A started logical stream and its decoder: frames in, decoded messages out.

This is the one place that joins a replication connection to an output-plugin
decoder; ``pgcdc peek``, the benchmarks and the drain all read through it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from airflow_pgcdc.pg.errors import ReplicationTimeout
from airflow_pgcdc.pg.replication import ReplicationConnection, StreamEnded
from airflow_pgcdc.protocol.frames import PrimaryKeepalive, XLogData
from airflow_pgcdc.protocol.lsn import DEFAULT_WAL_SIZES, LSN, WalSizes
from airflow_pgcdc.protocol.pglogical import PglogicalDecoder
from airflow_pgcdc.protocol.pgoutput import PgoutputDecoder
from airflow_pgcdc.protocol.pgoutput.options import PgoutputOptions


class LogicalStream:
    """Reads ``(frame, message)`` pairs: ``message`` is the decoded plugin message of an
    XLogData frame, or ``None`` for a keepalive."""

    def __init__(self, conn: ReplicationConnection, decoder, *, plugin: str,
                 wal_sizes: WalSizes = DEFAULT_WAL_SIZES) -> None:
        self.conn = conn
        self.decoder = decoder
        self.plugin = plugin
        self.wal_sizes = wal_sizes  # the server's (read before streaming)

    def passed_at(self, target: LSN | int | str) -> LSN:
        """The position from which this stream has passed ``target``
        (:func:`~airflow_pgcdc.protocol.lsn.passed_at` with the server's WAL sizes)."""
        return self.wal_sizes.passed_at(LSN(target))

    @classmethod
    def pgoutput(
        cls,
        conn: ReplicationConnection,
        slot_name: str,
        options: PgoutputOptions,
        start_lsn: LSN | int | str = 0,
    ) -> LogicalStream:
        """Negotiate ``options`` with the server and start streaming ``slot_name``."""
        resolved = options.resolve(conn.server_version)
        sizes = conn.wal_sizes()
        conn.start_replication(
            slot_name, start_lsn, options=resolved.start_options(conn.server_version)
        )
        decoder = PgoutputDecoder(
            resolved.proto_version, parallel_streaming=resolved.parallel_streaming
        )
        stream = cls(conn, decoder, plugin="pgoutput", wal_sizes=sizes)
        stream.options = resolved
        return stream

    @classmethod
    def pglogical(
        cls,
        conn: ReplicationConnection,
        slot_name: str,
        options: Sequence[tuple[str, str | None]],
        start_lsn: LSN | int | str = 0,
    ) -> LogicalStream:
        sizes = conn.wal_sizes()
        conn.start_replication(slot_name, start_lsn, options=list(options))
        return cls(conn, PglogicalDecoder(), plugin="pglogical_output", wal_sizes=sizes)

    def read(self, timeout: float | None = None):
        """The next ``(frame, message)``; ``None`` after ``timeout`` seconds of silence.
        Raises :class:`~airflow_pgcdc.pg.replication.StreamEnded` at the end."""
        frame = self.conn.read_message(timeout)
        if frame is None:
            return None
        if type(frame) is XLogData:
            return frame, self.decoder.decode(frame.data)
        return frame, None

    def __iter__(self) -> Iterator[tuple[XLogData | PrimaryKeepalive, object]]:
        decode = self.decoder.decode
        read = self.conn.read_message
        while True:
            try:
                frame = read(None)
            except StreamEnded:
                return
            if frame is None:
                continue
            if type(frame) is XLogData:
                yield frame, decode(frame.data)
            else:
                yield frame, None

    def read_until(self, until_lsn: LSN | int | str, *, timeout: float = 60.0) -> list:
        """Decoded messages until the stream has passed ``until_lsn``.

        "Passed" means a keepalive reports ``wal_end >= until_lsn`` (the walsender has
        decoded everything before it) or a transaction-ending message ends at or after
        it (``until_lsn`` just after a page header: at or after that page's start, see
        :meth:`passed_at`). Raises :class:`ReplicationTimeout` if that takes longer than
        ``timeout``. Nothing is acknowledged.
        """
        target = LSN(until_lsn)
        reach = self.passed_at(target)
        deadline = time.monotonic() + timeout
        out: list = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ReplicationTimeout(
                    f"the stream did not reach {target} within {timeout}s "
                    f"(received up to {self.conn.received_lsn}, {len(out)} messages)"
                )
            item = self.read(min(left, 1.0))
            if item is None:
                continue
            frame, msg = item
            if msg is None:
                if frame.wal_end >= reach:
                    return out
                continue
            out.append(msg)
            end = transaction_end_lsn(msg)
            if end is not None and end >= reach:
                return out


_ENDS_TRANSACTION = frozenset(
    {"commit", "stream_commit", "prepare", "stream_prepare", "commit_prepared"}
)


def transaction_end_lsn(msg) -> LSN | None:
    """The end LSN of a message that ends a transaction's delivery (commit, stream
    commit, prepare, stream prepare, commit/rollback prepared), else ``None``.
    (Begin Prepare also has an ``end_lsn``, but it opens the transaction.)"""
    t = msg.type
    if t in _ENDS_TRANSACTION:
        return msg.end_lsn
    if t == "rollback_prepared":
        return msg.rollback_end_lsn
    return None
