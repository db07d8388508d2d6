"""The recoveries of a slot in the store (see :mod:`airflow_pgcdc.snapshot.recover`).

A recovery record says: the store's changes end at ``store_end_lsn`` (the next window is
``next_window_seq``), the slot lost the changes after it (it was dropped, lost its WAL, or
was acknowledged past the store), and every table of the pipeline was copied again after
that, by the resyncs it lists, each at its consistent point. The next drain of the slot
then starts the stream at the slot's position instead of refusing it, as long as that
position is not past any of those points (:func:`covering`): every change of the gap is in
the copies. The window it writes keeps tiling the LSN line (it starts at the store's end)
and records the gap (``resumed``); the merge applies it only to tables whose copy is at or
after the gap's end (:func:`~airflow_pgcdc.merge.checks.check_recovery_gap`).

``{prefix}/{slot}/recovery/{recovery_id}.json``, created with ``If-None-Match``: one object
per recovery, never rewritten. Pure store code: the drain and the merge read it without
PostgreSQL.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from airflow_pgcdc.protocol.lsn import LSN, InvalidLSN
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout
from airflow_pgcdc.store.s3 import StoreError

__all__ = ["KIND", "Recovery", "RecoveryRecordError", "committed_recoveries", "covering", "write_recovery"]

KIND = "recovery"
FORMAT_VERSION = 1
CAUSES = ("slot_missing", "slot_lost", "slot_ahead")


class RecoveryRecordError(StoreError, ValueError):
    """A recovery record that is not valid (names the key and the field)."""


@dataclass(frozen=True)
class RecoveryCopy:
    """One resync of the recovery: its tables, copied at ``consistent_point``."""

    resync_slot: str
    snapshot_id: str
    consistent_point: str
    publication: str | None
    tables: tuple[tuple[str, str], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"resync_slot": self.resync_slot, "snapshot_id": self.snapshot_id,
                "consistent_point": self.consistent_point, "publication": self.publication,
                "tables": [list(t) for t in self.tables]}


@dataclass(frozen=True)
class Recovery:
    """A committed recovery of ``slot`` (see the module docstring)."""

    slot: str
    recovery_id: str
    cause: str
    store_end_lsn: str  # the store's end when the slot was found lost: the next window starts here
    next_window_seq: int
    slot_position: str  # the slot's confirmed position once recovered (re-created, or as found)
    slot_recreated: bool
    copies: tuple[RecoveryCopy, ...]
    refused: tuple[dict, ...] = ()  # tables the copies left out ({schema, table, error, hint})
    created_at: str | None = None
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def copied_from(self) -> LSN:
        """The earliest consistent point of its copies: a stream started at or before it
        misses nothing of the copied tables."""
        return min(LSN.parse(c.consistent_point) for c in self.copies)

    @property
    def tables(self) -> frozenset[tuple[str, str]]:
        return frozenset(t for c in self.copies for t in c.tables)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.extra, "format": FORMAT_VERSION, "kind": KIND, "slot": self.slot,
            "recovery_id": self.recovery_id, "cause": self.cause, "store_end_lsn": self.store_end_lsn,
            "next_window_seq": self.next_window_seq, "slot_position": self.slot_position,
            "slot_recreated": self.slot_recreated, "copies": [c.to_dict() for c in self.copies],
            "refused": list(self.refused), "created_at": self.created_at,
        }

    @classmethod
    def from_dict(cls, doc: Any, key: str | None = None) -> Recovery:
        def bad(what: str) -> RecoveryRecordError:
            return RecoveryRecordError(f"recovery record: {what}", key=key)

        if not isinstance(doc, dict):
            raise bad(f"expected a JSON object, got {type(doc).__name__}")
        if doc.get("format") != FORMAT_VERSION or doc.get("kind") != KIND:
            raise bad(f"format {doc.get('format')!r} kind {doc.get('kind')!r}: expected {FORMAT_VERSION} {KIND!r}")
        try:
            copies = tuple(
                RecoveryCopy(str(c["resync_slot"]), str(c["snapshot_id"]), str(LSN.parse(c["consistent_point"])),
                             c.get("publication"), tuple((str(s), str(t)) for s, t in c["tables"]))
                for c in doc["copies"])
            seq = doc["next_window_seq"]
            if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
                raise bad(f"next_window_seq must be a non-negative integer, got {seq!r}")
            if doc["cause"] not in CAUSES:
                raise bad(f"cause {doc['cause']!r} is not one of {', '.join(CAUSES)}")
            if not copies:
                raise bad("copies: a recovery holds at least one copy")
            known = {"format", "kind", "slot", "recovery_id", "cause", "store_end_lsn", "next_window_seq",
                     "slot_position", "slot_recreated", "copies", "refused", "created_at"}
            return cls(
                slot=str(doc["slot"]), recovery_id=str(doc["recovery_id"]), cause=doc["cause"],
                store_end_lsn=str(LSN.parse(doc["store_end_lsn"])), next_window_seq=seq,
                slot_position=str(LSN.parse(doc["slot_position"])), slot_recreated=bool(doc["slot_recreated"]),
                copies=copies, refused=tuple(doc.get("refused") or ()), created_at=doc.get("created_at"),
                extra={k: v for k, v in doc.items() if k not in known},
            )
        except KeyError as e:
            raise bad(f"missing field {e.args[0]!r}") from None
        except (InvalidLSN, TypeError, ValueError) as e:
            if isinstance(e, RecoveryRecordError):
                raise
            raise bad(str(e)) from None


def write_recovery(client, layout: Layout, recovery: Recovery) -> str:
    """Commit ``recovery`` (never overwriting one); returns its URL."""
    key = layout.recovery_record(recovery.slot, recovery.recovery_id)
    body = json.dumps(recovery.to_dict(), indent=2, sort_keys=True)
    if not s3store.commit_if_absent(client, layout.bucket, key, body, content_type="application/json"):
        raise RecoveryRecordError(f"a recovery record {recovery.recovery_id} exists already", key=key)
    return layout.url(key)


def committed_recoveries(client, layout: Layout, slot: str) -> list[Recovery]:
    """Every recovery record of ``slot``, oldest store end first."""
    prefix = layout.recoveries_prefix(slot)
    found = []
    for key in s3store.list_keys(client, layout.bucket, prefix):
        if key.endswith(".json") and "/" not in key[len(prefix):]:
            found.append(Recovery.from_dict(s3store.get_json(client, layout.bucket, key), key=key))
    return sorted(found, key=lambda r: (r.next_window_seq, r.created_at or ""))


def covering(recoveries: list[Recovery], *, store_end: LSN, next_seq: int, confirmed: LSN) -> Recovery | None:
    """The recovery that lets a drain whose store ends at ``store_end`` (next window
    ``next_seq``) start at the slot's ``confirmed`` position: one taken at that very end
    whose every copy is at or after ``confirmed`` (the newest such). None when none is."""
    fits = [r for r in recoveries if r.next_window_seq == next_seq and LSN.parse(r.store_end_lsn) == store_end
            and confirmed <= r.copied_from]
    return fits[-1] if fits else None
