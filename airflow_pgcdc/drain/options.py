"""What a drain is asked (:class:`DrainOptions`) and what it answers (:class:`DrainResult`):
the drain's two public objects, apart from the call (:func:`~.drain.drain_window`) so that
every module of the drain can name them without importing the entry point."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from airflow_pgcdc.options import JobOptions
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.store.packs import PACK_MAX_PART_BYTES
from airflow_pgcdc.store.window import DEFAULT_MEMORY_BUDGET

__all__ = ["DrainOptions", "DrainResult"]


@dataclass(frozen=True)
class DrainResult:
    """What one drain did. ``window_seq`` is ``None`` when there was nothing to drain
    (``end_lsn <= start_lsn``); ``acknowledged_only`` when it only re-sent a lost
    acknowledgement."""

    slot: str
    window_seq: int | None
    start_lsn: str
    end_lsn: str
    end_reason: str | None = None
    transactions: int = 0
    rows: int = 0
    bytes: int = 0
    tables: dict[str, int] = field(default_factory=dict)
    manifest: str | None = None
    acknowledged_lost: bool = False
    seconds: float = 0.0
    # {"schema.table": {"updates", "columns", "first_commit_lsn"}}: key-changing updates
    # whose unchanged TOAST values the server did not send (the merge recovers them from
    # the old key's row when it can, see merge.compact; else it writes NULL there)
    lost_toast: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "window_seq": self.window_seq,
            "start_lsn": self.start_lsn,
            "end_lsn": self.end_lsn,
            "end_reason": self.end_reason,
            "transactions": self.transactions,
            "rows": self.rows,
            "bytes": self.bytes,
            "tables": dict(self.tables),
            "manifest": self.manifest,
            "acknowledged_lost": self.acknowledged_lost,
            "lost_toast": {k: dict(v) for k, v in self.lost_toast.items()},
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True, kw_only=True)
class DrainOptions(JobOptions):
    """What :func:`~.drain.drain_window` is asked, past the DSN, the store, the slot and the
    publications (each field's meaning is the call's). Given as the call takes them
    (``forget_tables`` and ``as_text`` as text or a mapping) and kept parsed."""

    job: ClassVar[str] = "the drain"

    publications: tuple[str, ...] = ()
    until_lsn: LSN | str | int | None = None
    max_rows: int | None = None
    max_bytes: int | None = None
    max_seconds: float | None = None
    skip_origins: tuple[str, ...] = ()
    message_prefixes: tuple[str, ...] | None = None
    binary: bool = False
    heartbeat: bool = True
    heartbeat_after: float = 1.0
    max_wait: float = 300.0
    status_interval: float = 1.0
    spool_dir: str | None = None
    connect_options: str | None = None
    target_part_bytes: int | None = None
    forget_tables: frozenset[tuple[str, str]] = frozenset()
    busy_wait: float = 10.0
    memory_budget: int = DEFAULT_MEMORY_BUDGET
    pack_parts_under: int = PACK_MAX_PART_BYTES
    start_without_snapshot: bool = False
    as_text: Mapping[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    pii: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from airflow_pgcdc.pg.tables import parse_column_map, parse_table_names
        from airflow_pgcdc.store.privacy import parse_rules

        self._put("publications", self._names(self.publications))
        self._put("skip_origins", self._names(self.skip_origins))
        if self.message_prefixes is not None:
            self._put("message_prefixes", self._names(self.message_prefixes))
        forget = self.forget_tables
        self._put("forget_tables", frozenset(
            t if isinstance(t, tuple) else parse_table_names([t])[0] for t in ((forget,) if isinstance(forget, str)
                                                                                else forget)))
        as_text = self.as_text
        if not (isinstance(as_text, Mapping) and all(isinstance(k, tuple) for k in as_text)):
            as_text = parse_column_map(as_text)
        self._put("as_text", {k: frozenset(v) for k, v in as_text.items()})
        pii = self.pii
        if not (isinstance(pii, Mapping) and all(isinstance(k, tuple) for k in pii)):
            pii = parse_rules(pii)
        self._put("pii", dict(pii))
        self._put("binary", bool(self.binary))
        self._put("heartbeat", bool(self.heartbeat))
        self._put("start_without_snapshot", bool(self.start_without_snapshot))

    @property
    def forget(self) -> frozenset[tuple[str, str]]:
        """``forget_tables``, parsed: ``(schema, table)`` pairs."""
        return self.forget_tables
