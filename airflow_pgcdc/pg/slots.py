"""Replication slots: health, management and the checks a watcher needs.

Health (:func:`slot_health`, :func:`aslot_health`, :func:`list_slots`) is one catalog
query on an ordinary connection, written once and run by a blocking or an asyncio
psycopg connection. It reads ``pg_replication_slots`` (the columns the server's version
has) together with the server's current WAL position, taken in the same statement:

- ``current_lsn``: ``pg_current_wal_insert_lsn()`` on a primary (``pg_last_wal_replay_lsn()``
  on a standby);
- ``pending_bytes`` = ``current_lsn - confirmed_flush_lsn``: WAL the slot has not had
  acknowledged yet. WAL is per cluster, so this counts every database's WAL and
  unpublished tables too: it bounds from above what decoding the slot will produce.
- ``retained_bytes`` = ``current_lsn - restart_lsn``: WAL the server keeps for the slot.

How old is the oldest unacknowledged change? PostgreSQL cannot say directly: no catalog
maps an LSN to a time. :func:`oldest_pending_age` gives what the server can prove, a
*lower bound* (or ``None`` = unknown): with ``track_commit_timestamp = on`` the newest
commit's time (``pg_last_committed_xact()``); on PostgreSQL 17+ an inactive slot's
``inactive_since`` tells when it was last released, so a newest commit after it is
certainly unacknowledged and the oldest pending change is at least that old. On 15/16,
or with ``track_commit_timestamp = off``, it is ``None``. Watchers (the sensor and its
trigger) combine that bound with their own observations in :class:`PendingClock`:
pending WAL seen at time *t* was written before *t*, so while the slot's
``confirmed_flush_lsn`` stays put, the age is at least ``now - t``. The age a watcher
reports is therefore never more than the truth, and it fires at most ``max_delay``
after it started watching.

Errors a watcher acts on are typed (:class:`SlotMissing`, :class:`SlotInUse`,
:class:`SlotLost`, :class:`SlotMismatch`, :class:`PublicationMissing`), each with a
message that says what happened and a ``hint`` that says what to do;
:func:`check_slot_usable` raises them from a :class:`SlotHealth`.

Management: :func:`create_slot` / :func:`drop_slot` run replication commands (or, for a
``failover`` slot on 17+, ``pg_create_logical_replication_slot(..., failover => true)``);
publications are managed by :mod:`airflow_pgcdc.pg.publications`. Every
identifier reaches SQL through :mod:`airflow_pgcdc.protocol.quoting`; names in catalog
queries are bound parameters. Row filters are SQL expressions given by the user and
are inserted as they are (inside parentheses): pass only trusted text.

Why one module of about 670 lines: what stays here is the slot (its typed errors, its
health and the checks on it, creating and dropping it), sections that share the health
query and the errors.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from airflow_pgcdc.errors import HintedError
from airflow_pgcdc.options import names as as_names
from airflow_pgcdc.pg.errors import DuplicateObject, ObjectInUse, UndefinedObject
from airflow_pgcdc.pg.replication import ReplicationConnection
from airflow_pgcdc.pg.tables import (
    CatalogError,
    PublicationMissing,
)
from airflow_pgcdc.protocol.commands import validate_slot_name
from airflow_pgcdc.protocol.lsn import LSN
from airflow_pgcdc.protocol.quoting import quote_literal

__all__ = [
    "PendingClock",
    "PublicationConflict",
    "PublicationMissing",
    "SlotCreated",
    "SlotError",
    "SlotExists",
    "SlotHealth",
    "SlotInUse",
    "SlotLost",
    "SlotMismatch",
    "SlotMissing",
    "UnsupportedFeature",
    "aslot_health",
    "check_slot_usable",
    "create_slot",
    "current_wal_lsn",
    "drop_slot",
    "list_slots",
    "oldest_pending_age",
    "slot_health",
]

log = logging.getLogger(__name__)

PG15, PG16, PG17 = 150000, 160000, 170000


# --------------------------------------------------------------------------- errors


class SlotError(HintedError):
    """A replication slot that cannot be used as asked. ``kind`` names the case (it is the
    ``error`` field of the sensor's failure event), ``hint`` what to do about it."""

    kind = "slot_error"

    def __init__(self, message: str, *, slot: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.slot = slot


class SlotMissing(SlotError):
    """The slot does not exist."""

    kind = "slot_missing"


class SlotExists(SlotError):
    """A slot of that name exists already (on create)."""

    kind = "slot_exists"


class SlotInUse(SlotError):
    """The slot is active for another process (``active_pid``)."""

    kind = "slot_in_use"

    def __init__(self, message: str, *, slot: str | None = None, hint: str | None = None,
                 active_pid: int | None = None) -> None:
        super().__init__(message, slot=slot, hint=hint)
        self.active_pid = active_pid


class SlotLost(SlotError):
    """The slot can no longer deliver every change: its WAL is gone (``wal_status``
    ``'lost'``), about to go (``'unreserved'``), or it was invalidated (``reason``)."""

    kind = "slot_lost"

    def __init__(self, message: str, *, slot: str | None = None, hint: str | None = None,
                 reason: str | None = None) -> None:
        super().__init__(message, slot=slot, hint=hint)
        self.reason = reason


class SlotMismatch(SlotError):
    """The slot exists but is not one we can stream from here (physical, another plugin,
    another database)."""

    kind = "slot_mismatch"


class PublicationConflict(HintedError, CatalogError):
    """The publication exists in a shape that ``ensure_publication`` cannot reach without
    dropping something (e.g. it lists tables and ``FOR ALL TABLES`` was asked)."""

    kind = "publication_conflict"



class UnsupportedFeature(HintedError, ValueError):
    """A feature the server's PostgreSQL version does not have (column lists and row
    filters need 15, failover slots 17)."""



def _resnapshot_hint(slot: str) -> str:
    return (
        f"to go on into the same store and Delta tables: `pgcdc recover --slot {slot} --store <url>` (drops the "
        "lost slot, creates it again and copies every table: the next merge replaces each Delta table in one "
        f"commit); or re-snapshot with a new slot: `pgcdc slot drop --slot {slot}`, then take a new "
        "snapshot (`pgcdc snapshot --slot <new slot> ...` or PgcdcSnapshotOperator) and "
        "stream from the new slot; windows already in the store stay valid up to their end_lsn"
    )


# --------------------------------------------------------------------------- health


@dataclass(frozen=True, slots=True)
class SlotHealth:
    """One slot as ``pg_replication_slots`` shows it, with the server's WAL position.

    Columns a server version does not have are ``None`` (``invalidation_reason``,
    ``failover``, ``synced``, ``inactive_since``: 17+; ``conflicting``: 16+). For a slot
    that does not exist ``exists`` is False and only the server fields are set.
    """

    slot: str
    exists: bool
    current_lsn: LSN | None
    observed_at: datetime | None  # server clock when read (clock_timestamp())
    server_version: int
    current_database: str
    in_recovery: bool = False
    track_commit_timestamp: bool = False
    last_commit_time: datetime | None = None  # pg_last_committed_xact() (track_commit_timestamp)
    publication: str | None = None
    publication_exists: bool | None = None
    plugin: str | None = None
    slot_type: str | None = None
    database: str | None = None
    temporary: bool | None = None
    active: bool | None = None
    active_pid: int | None = None
    two_phase: bool | None = None
    confirmed_flush_lsn: LSN | None = None
    restart_lsn: LSN | None = None
    wal_status: str | None = None  # reserved | extended | unreserved | lost
    safe_wal_size: int | None = None  # bytes writable before the slot is at risk (None: no limit)
    invalidation_reason: str | None = None  # 17+
    conflicting: bool | None = None  # 16+
    failover: bool | None = None  # 17+
    synced: bool | None = None  # 17+
    inactive_since: datetime | None = None  # 17+
    pending_bytes: int | None = None
    retained_bytes: int | None = None

    @property
    def lost(self) -> bool:
        """The slot's WAL is gone or it was invalidated: it can never stream again."""
        return bool(
            self.wal_status == "lost" or self.invalidation_reason or self.conflicting
        )

    @property
    def unreserved(self) -> bool:
        """It holds more WAL than ``max_slot_wal_keep_size``: the next checkpoint removes it."""
        return self.wal_status == "unreserved"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: LSNs as ``X/Y`` text, times as ISO 8601."""
        out: dict[str, Any] = {}
        for name in self.__slots__:  # type: ignore[attr-defined]
            value = getattr(self, name)
            if isinstance(value, LSN):
                value = str(value)
            elif isinstance(value, datetime):
                value = value.isoformat()
            out[name] = value
        out["pending_age_seconds"] = oldest_pending_age(self)
        return out


def _columns(version: int) -> list[tuple[str, str]]:
    """(select expression, field name) of the slot columns this version has."""

    def col(expr: str, name: str, since: int = 0, null: str = "NULL") -> tuple[str, str]:
        return (expr if version >= since else null, name)

    return [
        ("s.slot_name", "slot"),
        ("s.plugin", "plugin"),
        ("s.slot_type", "slot_type"),
        ("s.database", "database"),
        ("s.temporary", "temporary"),
        ("s.active", "active"),
        ("s.active_pid", "active_pid"),
        col("s.two_phase", "two_phase", 140000, "false"),
        ("s.confirmed_flush_lsn::text", "confirmed_flush_lsn"),
        ("s.restart_lsn::text", "restart_lsn"),
        ("s.wal_status", "wal_status"),
        ("s.safe_wal_size", "safe_wal_size"),
        col("s.invalidation_reason", "invalidation_reason", PG17, "NULL::text"),
        col("s.conflicting", "conflicting", PG16, "NULL::boolean"),
        col("s.failover", "failover", PG17, "NULL::boolean"),
        col("s.synced", "synced", PG17, "NULL::boolean"),
        col("s.inactive_since", "inactive_since", PG17, "NULL::timestamptz"),
        ("pg_wal_lsn_diff(w.lsn, s.confirmed_flush_lsn)::bigint", "pending_bytes"),
        ("pg_wal_lsn_diff(w.lsn, s.restart_lsn)::bigint", "retained_bytes"),
    ]


_SERVER = [
    ("w.lsn::text", "current_lsn"),
    ("w.observed_at", "observed_at"),
    ("w.in_recovery", "in_recovery"),
    ("w.current_database", "current_database"),
    ("w.track_commit_timestamp", "track_commit_timestamp"),
    ("w.last_commit_time", "last_commit_time"),
    ("w.missing_publication", "missing_publication"),
]

# The server's position and clock, read once per statement. pg_last_committed_xact()
# raises when track_commit_timestamp is off: the CASE keeps it from running then.
_W = """(SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                 ELSE pg_current_wal_insert_lsn() END AS lsn,
            clock_timestamp() AS observed_at,
            pg_is_in_recovery() AS in_recovery,
            current_database()::text AS current_database,
            current_setting('track_commit_timestamp')::boolean AS track_commit_timestamp,
            CASE WHEN current_setting('track_commit_timestamp')::boolean
                 THEN (SELECT x.timestamp FROM pg_last_committed_xact() x) END AS last_commit_time,
            (SELECT u.name FROM unnest(%(publications)s::text[]) WITH ORDINALITY AS u(name, i)
             WHERE NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = u.name)
             ORDER BY u.i LIMIT 1) AS missing_publication) w"""


def _health_query(version: int, slot: str | None) -> tuple[str, list[str]]:
    cols = _columns(version) + _SERVER
    select = ", ".join(expr for expr, _ in cols)
    if slot is None:
        sql = f"SELECT {select} FROM {_W} CROSS JOIN pg_replication_slots s ORDER BY s.slot_name"
    else:
        sql = f"SELECT {select} FROM {_W} LEFT JOIN pg_replication_slots s ON s.slot_name = %(slot)s::text"
    return sql, [name for _, name in cols]


def _lsn(value: str | None) -> LSN | None:
    return None if value is None else LSN.parse(value)


def _health(row: Sequence[Any], names: list[str], slot: str | None, publications: tuple[str, ...],
            version: int) -> SlotHealth:
    d = dict(zip(names, row, strict=True))
    exists = d["slot"] is not None
    if not exists:
        d["slot"] = slot
    for name in ("current_lsn", "confirmed_flush_lsn", "restart_lsn"):
        d[name] = _lsn(d[name])
    missing = d.pop("missing_publication")
    # publication: the first missing one, else those checked (None: none was)
    publication = missing if missing is not None else (", ".join(publications) or None)
    return SlotHealth(exists=exists, server_version=version, publication=publication,
                      publication_exists=None if not publications else missing is None, **d)


def slot_health(conn: psycopg.Connection | str, slot: str, *,
                publications: Sequence[str] | str | None = None) -> SlotHealth:
    """The health of ``slot`` (and whether ``publications``, one name or several, exist:
    ``publication_exists`` is False and ``publication`` the first missing one when one does
    not).

    ``conn``: a psycopg connection to the slot's database, or a DSN (a connection is
    opened and closed). A missing slot gives ``exists=False``, not an error: use
    :func:`check_slot_usable` to turn a health into an error.
    """
    if isinstance(conn, str):
        with psycopg.connect(conn, autocommit=True) as c:
            return slot_health(c, slot, publications=publications)
    pubs = as_names(publications)
    version = conn.info.server_version
    sql, names = _health_query(version, slot)
    row = conn.execute(sql, {"slot": slot, "publications": list(pubs)}).fetchone()
    return _health(row, names, slot, pubs, version)


async def aslot_health(conn: psycopg.AsyncConnection, slot: str, *,
                       publications: Sequence[str] | str | None = None) -> SlotHealth:
    """:func:`slot_health` on an asyncio connection."""
    pubs = as_names(publications)
    version = conn.info.server_version
    sql, names = _health_query(version, slot)
    cur = await conn.execute(sql, {"slot": slot, "publications": list(pubs)})
    row = await cur.fetchone()
    return _health(row, names, slot, pubs, version)


def list_slots(conn: psycopg.Connection | str) -> list[SlotHealth]:
    """Every replication slot of the cluster (logical and physical), by name."""
    if isinstance(conn, str):
        with psycopg.connect(conn, autocommit=True) as c:
            return list_slots(c)
    version = conn.info.server_version
    sql, names = _health_query(version, None)
    rows = conn.execute(sql, {"publications": []}).fetchall()
    return [_health(r, names, None, (), version) for r in rows]


def current_wal_lsn(conn: psycopg.Connection) -> LSN:
    """The server's current WAL insert position (the replay position on a standby)."""
    (value,) = conn.execute(
        "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
        "ELSE pg_current_wal_insert_lsn() END)::text"
    ).fetchone()
    return LSN.parse(value)


def oldest_pending_age(health: SlotHealth) -> float | None:
    """Seconds the oldest unacknowledged change has waited, as far as the server can prove.

    ``0.0`` when nothing is pending; a lower bound when the newest commit is provably
    unacknowledged (``track_commit_timestamp`` on and, on 17+, the commit came after the
    slot was last released: ``inactive_since``); ``None`` when the server cannot tell
    (15/16, ``track_commit_timestamp`` off, or the slot is being streamed). See the
    module doc; :class:`PendingClock` adds what a watcher saw itself.
    """
    if not health.exists or health.pending_bytes is None:
        return None
    if health.pending_bytes <= 0:
        return 0.0
    t, since, now = health.last_commit_time, health.inactive_since, health.observed_at
    if t is None or since is None or now is None or health.active:
        return None
    if t <= since:
        return None
    return max(0.0, (now - t).total_seconds())


@dataclass
class PendingClock:
    """How long WAL has been pending for a slot, as one watcher sees it over its polls.

    Pending WAL seen at time *t* was written before *t*: while ``confirmed_flush_lsn`` does
    not move, the oldest pending change is at least ``now - t`` old. :meth:`observe`
    returns that age (merged with :func:`oldest_pending_age`), ``0.0`` when nothing is
    pending, ``None`` for a slot that cannot tell (missing, physical). All times are the
    server's clock (``observed_at``), so a watcher moved to another machine keeps counting
    right: ``since`` and ``confirmed_flush_lsn`` (text) are what to carry over.
    """

    confirmed_flush_lsn: str | None = None
    since: float | None = None  # server epoch seconds when pending WAL was first seen

    def observe(self, health: SlotHealth) -> float | None:
        cf = health.confirmed_flush_lsn
        if not health.exists or cf is None or health.observed_at is None:
            self.confirmed_flush_lsn = None
            self.since = None
            return None
        now = health.observed_at.timestamp()
        if str(cf) != self.confirmed_flush_lsn:
            self.confirmed_flush_lsn = str(cf)
            self.since = None
        if not health.pending_bytes or health.pending_bytes <= 0:
            self.since = None
            return 0.0
        if self.since is None or self.since > now:
            self.since = now
        server = oldest_pending_age(health)
        if server is not None:
            self.since = min(self.since, now - server)
        return max(0.0, now - self.since)


# --------------------------------------------------------------------------- checks


def _lost_message(h: SlotHealth) -> tuple[str, str]:
    """(what happened, reason code) for a lost or unreserved slot."""
    reason = h.invalidation_reason
    if reason == "wal_removed" or (reason is None and h.wal_status == "lost"):
        return (
            "the WAL it still needed was removed (wal_status 'lost'): the slot fell more than "
            "max_slot_wal_keep_size behind the server, and the changes it had not delivered "
            "are gone",
            "wal_removed",
        )
    if reason == "rows_removed" or (reason is None and h.conflicting):
        return (
            "it was invalidated because catalog rows it needed were removed "
            "(a recovery conflict on a standby)",
            "rows_removed",
        )
    if reason == "wal_level_insufficient":
        return (
            "it was invalidated because wal_level on the primary is no longer 'logical'",
            reason,
        )
    if reason == "idle_timeout":
        return (
            "it was invalidated after staying idle longer than idle_replication_slot_timeout",
            reason,
        )
    if reason:
        return f"it was invalidated ({reason})", reason
    return (
        "it holds more WAL than max_slot_wal_keep_size allows (wal_status 'unreserved'): the "
        "next checkpoint removes WAL it still needs, and then its undelivered changes are gone",
        "unreserved",
    )


def check_slot_usable(
    health: SlotHealth,
    *,
    plugin: str | None = "pgoutput",
    allow_pid: int | None = None,
    allow_active: bool = False,
    allow_unreserved: bool = False,
) -> SlotHealth:
    """Return ``health`` if the slot can be streamed from this database, else raise.

    - :class:`SlotMissing`: no such slot;
    - :class:`SlotMismatch`: physical, another output ``plugin`` (None: any), or another
      database than the connection's;
    - :class:`SlotLost`: ``wal_status`` 'lost' or 'unreserved' (unless ``allow_unreserved``:
      a watcher must then drain it at once, its only rescue), or invalidated;
    - :class:`PublicationMissing`: the health was read with a publication that does not exist;
    - :class:`SlotInUse`: active for a process other than ``allow_pid`` (unless ``allow_active``).
    """
    slot = health.slot
    if not health.exists:
        raise SlotMissing(
            f"replication slot {slot!r} does not exist on this server",
            slot=slot,
            hint=f"create it with a snapshot (`pgcdc snapshot --slot {slot} ...`), or without "
            f"one (`pgcdc slot create --slot {slot}`) if the tables need no initial copy; a running pipeline "
            f"whose slot was dropped goes on with `pgcdc recover --slot {slot} --store <url>`",
        )
    if health.slot_type != "logical":
        raise SlotMismatch(
            f"replication slot {slot!r} is a {health.slot_type} slot, not a logical one",
            slot=slot,
            hint="use a logical slot (pgcdc slot create)",
        )
    if health.database != health.current_database:
        raise SlotMismatch(
            f"replication slot {slot!r} belongs to database {health.database!r}, "
            f"not to {health.current_database!r}",
            slot=slot,
            hint=f"connect to database {health.database!r}: a logical slot decodes one database",
        )
    if plugin is not None and health.plugin != plugin:
        raise SlotMismatch(
            f"replication slot {slot!r} uses output plugin {health.plugin!r}, not {plugin!r}",
            slot=slot,
            hint=f"create a slot with plugin {plugin!r}",
        )
    if health.lost or (health.unreserved and not allow_unreserved):
        what, reason = _lost_message(health)
        raise SlotLost(
            f"replication slot {slot!r} can no longer deliver every change: {what}",
            slot=slot,
            reason=reason,
            hint=(
                "drain right now may still save an 'unreserved' slot; otherwise "
                if reason == "unreserved"
                else ""
            )
            + _resnapshot_hint(slot),
        )
    if health.publication is not None and health.publication_exists is False:
        raise PublicationMissing(
            f"publication {health.publication!r} does not exist in database "
            f"{health.current_database!r}",
            publication=health.publication,
            hint=f"create it: `pgcdc publication ensure --name {health.publication} --tables ...`",
        )
    if health.active and not allow_active and (allow_pid is None or health.active_pid != allow_pid):
        raise SlotInUse(
            f"replication slot {slot!r} is in use by process {health.active_pid}",
            slot=slot,
            active_pid=health.active_pid,
            hint="another drain (or a consumer) is streaming from it: wait for it to finish, "
            f"or end it (SELECT pg_terminate_backend({health.active_pid}))",
        )
    return health


# --------------------------------------------------------------------------- slots


@dataclass(frozen=True, slots=True)
class SlotCreated:
    slot: str
    consistent_point: LSN
    plugin: str
    two_phase: bool
    failover: bool
    temporary: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "consistent_point": str(self.consistent_point),
            "plugin": self.plugin,
            "two_phase": self.two_phase,
            "failover": self.failover,
            "temporary": self.temporary,
        }


def _with_replication(dsn_or_conn: str | ReplicationConnection, fn):
    if isinstance(dsn_or_conn, ReplicationConnection):
        return fn(dsn_or_conn)
    with ReplicationConnection.connect(dsn_or_conn) as conn:
        return fn(conn)


def create_slot(
    dsn_or_conn: str | ReplicationConnection,
    name: str,
    *,
    plugin: str = "pgoutput",
    two_phase: bool = False,
    failover: bool = False,
    temporary: bool = False,
) -> SlotCreated:
    """Create logical slot ``name`` (no exported snapshot: use the snapshot job for that).

    ``failover`` (17+) makes the slot follow a failover to a synchronized standby; it is
    created with ``pg_create_logical_replication_slot(..., failover => true)``. A
    ``temporary`` slot lives as long as the session that made it: pass an open
    :class:`ReplicationConnection` to keep it (with a DSN it is gone on return).
    Raises :class:`SlotExists`, :class:`UnsupportedFeature`, or the server's error.
    """
    validate_slot_name(name)
    if failover and temporary:
        raise ValueError("a temporary slot cannot be a failover slot")

    def run(conn: ReplicationConnection) -> SlotCreated:
        version = conn.server_version
        if failover and version < PG17:
            raise UnsupportedFeature(
                f"failover slots need PostgreSQL 17 or later; the server is {version // 10000}",
                hint="leave out failover, or upgrade the server",
            )
        if two_phase and version < PG15:
            raise UnsupportedFeature(
                f"two-phase slots from a replication connection need PostgreSQL 15 or later; "
                f"the server is {version // 10000}"
            )
        try:
            if failover:
                rows = conn.execute(
                    "SELECT lsn::text FROM pg_create_logical_replication_slot("
                    f"{quote_literal(name)}, {quote_literal(plugin)}, temporary => false, "
                    f"twophase => {'true' if two_phase else 'false'}, failover => true)"
                )
                lsn = LSN.parse(rows[-1].one()[0])
            else:
                created = conn.create_slot(
                    name,
                    output_plugin=plugin,
                    temporary=temporary,
                    two_phase=True if two_phase else None,
                    snapshot="nothing" if version >= PG15 else None,
                    legacy_syntax=version < PG15,
                )
                lsn = created.consistent_point
        except DuplicateObject as e:
            raise SlotExists(
                f"replication slot {name!r} already exists",
                slot=name,
                hint=f"use it, or drop it first (`pgcdc slot drop --slot {name}`)",
            ) from e
        return SlotCreated(name, LSN(lsn), plugin, bool(two_phase), bool(failover), bool(temporary))

    log.info("creating replication slot %s (%s%s%s)", name, plugin,
             ", two_phase" if two_phase else "", ", failover" if failover else "")
    return _with_replication(dsn_or_conn, run)


def drop_slot(
    dsn_or_conn: str | ReplicationConnection,
    name: str,
    *,
    wait: bool = True,
    missing_ok: bool = False,
) -> bool:
    """``DROP_REPLICATION_SLOT name [WAIT]``; True if dropped, False if it was missing
    and ``missing_ok``. ``wait``: wait for an active slot to be released (without it an
    active slot raises :class:`SlotInUse`)."""
    validate_slot_name(name)

    def run(conn: ReplicationConnection) -> bool:
        try:
            conn.drop_slot(name, wait=wait)
        except UndefinedObject as e:
            if missing_ok:
                return False
            raise SlotMissing(f"replication slot {name!r} does not exist", slot=name) from e
        except ObjectInUse as e:
            raise SlotInUse(
                f"replication slot {name!r} is in use: {e.message}",
                slot=name,
                hint="wait for the consumer to stop, or drop with wait",
            ) from e
        return True

    log.info("dropping replication slot %s", name)
    return _with_replication(dsn_or_conn, run)


