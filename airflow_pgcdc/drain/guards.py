"""What a drain checks before it confirms anything: the errors it raises, and the checks
that keep an operator's mistake from acknowledging changes that no window holds.

* **Publications** (:func:`check_publications`): every publication named must exist
  (PostgreSQL 18 streams nothing for a missing one and only warns; 15 fails late), and
  together they must still cover every table of the pipeline, i.e. the tables the
  previous window recorded as followed (for the first window, the snapshot's tables).
  A table that was dropped leaves the pipeline by itself (its last changes are still
  streamed); a table that still exists but is no longer published would lose every
  change silently, so the drain refuses, unless the operator lets it go explicitly
  (``forget_tables``). The tables covered when a window commits are recorded in it
  (``pipeline_tables``), with the publications (``publications``).
* **The server** (:func:`check_server`): the system identifier must be the one the
  store recorded (a different cluster behind the same DSN); on another timeline, the
  store must not hold anything past the point where the recorded timeline forked
  (a point-in-time restore or a lagging standby promoted: the store would hold
  transactions the server never had, and the slot would skip the ones it has instead).
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from airflow_pgcdc.errors import HintedError
from airflow_pgcdc.pg.errors import ServerError
from airflow_pgcdc.pg.slots import SlotMissing
from airflow_pgcdc.pg.tables import PublicationMissing
from airflow_pgcdc.protocol.lsn import DEFAULT_WAL_SIZES, LSN, WalSizes
from airflow_pgcdc.protocol.quoting import quote_ident, quote_qualified

log = logging.getLogger("airflow_pgcdc.drain.drain")  # the drain's logger, one name for all its modules

__all__ = [
    "DrainBusy",
    "DrainError",
    "DrainTimeout",
    "PipelineTablesUnpublished",
    "PublicationMissing",
    "PublicationNotFound",
    "ServerMismatch",
    "SlotAheadOfStore",
    "SlotNotFound",
    "WindowConflict",
    "check_publications",
    "check_server",
    "partition_leaves",
]

Table = tuple[str, str]


class DrainError(HintedError):
    """The drain could not produce its window."""


SlotNotFound = SlotMissing
"""The 0.1 name of :class:`~airflow_pgcdc.pg.slots.SlotMissing` (one class for a slot that
does not exist, whoever finds out: the drain, the sensor, ``pgcdc slot``)."""


class SlotAheadOfStore(DrainError):
    """The slot acknowledged changes that no committed window holds: data loss upstream."""


class StoreHasNoCopy(DrainError):
    """The store holds neither a snapshot nor a window of the slot: a drain would start it at
    the slot's position and acknowledge past it, so a mistyped ``--store`` would take the
    slot away from the store that really follows it (recoverable only by a new snapshot).
    Refused unless the caller starts a changes-only store on purpose
    (``start_without_snapshot``)."""


class DrainBusy(DrainError):
    """Another run owns the slot (its lock or its stream), or committed the window this one
    planned meanwhile: this drain wrote nothing and acknowledged nothing."""


class WindowConflict(DrainBusy):
    """Another drain committed this window first."""


class DrainTimeout(DrainError):
    """The stream did not reach the window's end in time."""


PublicationNotFound = PublicationMissing
"""The drain's 0.1 name of :class:`~airflow_pgcdc.pg.tables.PublicationMissing`."""


class PipelineTablesUnpublished(DrainError):
    """Tables of the pipeline exist but no publication of the drain covers them any more:
    their changes would be skipped by the server. Nothing was acknowledged."""

    def __init__(self, message: str, *, hint: str | None = None, tables: Sequence[Table] = ()) -> None:
        super().__init__(message, hint=hint)
        self.tables = tuple(tables)


class ServerMismatch(DrainError):
    """The server behind the DSN is not the one whose changes the store holds."""


@dataclass(frozen=True)
class PublicationCheck:
    """What :func:`check_publications` found: the tables the publications cover now, the
    pipeline tables that no longer exist (dropped), and those let go on purpose."""

    covered: frozenset[Table]
    dropped: tuple[Table, ...]
    forgotten: tuple[Table, ...]


def check_publications(
    sql: psycopg.Connection,
    publications: Sequence[str],
    pipeline: Iterable[Table],
    *,
    slot: str,
    forget: Iterable[Table] = (),
) -> PublicationCheck:
    """Raise :class:`PublicationMissing` or :class:`PipelineTablesUnpublished` unless every
    publication exists and every table of ``pipeline`` is covered by one of them, was
    dropped, or is in ``forget``."""
    pubs = list(dict.fromkeys(publications))
    if not pubs:
        raise PublicationMissing(f"slot {slot}: no publication given", hint="name the pipeline's publication")
    found = {r[0] for r in sql.execute(
        "SELECT pubname::text FROM pg_catalog.pg_publication WHERE pubname = ANY(%s)", (pubs,)
    ).fetchall()}
    missing = [p for p in pubs if p not in found]
    if missing:
        raise PublicationMissing(
            f"slot {slot}: publication(s) {', '.join(repr(p) for p in missing)} do not exist in database "
            f"{sql.info.dbname!r}; PostgreSQL would stream nothing for them and the drain would acknowledge "
            "changes no window holds. Nothing was read or acknowledged",
            hint="check the spelling (`SELECT pubname FROM pg_publication`), or create it: "
                 + "; ".join(f"CREATE PUBLICATION {quote_ident(p)} FOR TABLE ..." for p in missing),
        )
    covered = frozenset((s, t) for s, t in sql.execute(
        "SELECT DISTINCT schemaname::text, tablename::text FROM pg_catalog.pg_publication_tables "
        "WHERE pubname = ANY(%s)", (pubs,)
    ).fetchall())
    forget_set = set(forget)
    uncovered = sorted(set(pipeline) - covered)
    dropped, forgotten, lost = [], [], []
    for t in uncovered:
        if t in forget_set:
            forgotten.append(t)
        elif sql.execute("SELECT to_regclass(%s) IS NULL", (quote_qualified(*t),)).fetchone()[0]:
            dropped.append(t)
        else:
            lost.append(t)
    if lost:
        names = ", ".join(f"{s}.{t}" for s, t in lost)
        adds = "; ".join(f"ALTER PUBLICATION {quote_ident(pubs[0])} ADD TABLE {quote_qualified(*t)}" for t in lost)
        forget_flags = " ".join(f"--forget-table {shlex.quote(quote_qualified(*t))}" for t in lost)
        raise PipelineTablesUnpublished(
            f"slot {slot}: table(s) {names} belong to the pipeline but publication(s) "
            f"{', '.join(pubs)} no longer cover them: PostgreSQL skips their changes, and the drain "
            "would acknowledge them. Nothing was read or acknowledged",
            hint=f"put them back ({adds}); changes made while they were out of the publication are "
                 "not streamed, so re-snapshot them afterwards. To stop following them on purpose "
                 f"(their Delta tables stay as they are), drain once with {forget_flags}",
            tables=lost,
        )
    if not covered:
        raise PublicationMissing(
            f"slot {slot}: publication(s) {', '.join(pubs)} cover no table: nothing would be streamed",
            hint="add the pipeline's tables to the publication (ALTER PUBLICATION ... ADD TABLE ...)",
        )
    return PublicationCheck(covered, tuple(dropped), tuple(forgotten))


def check_server(
    *,
    slot: str,
    system_id: str,
    timeline: int,
    recorded_system_id: str | None,
    recorded_timeline: int | None,
    store_end: LSN,
    where: str,
    history: Callable[[int], list[tuple[int, LSN]]],
    windows: int = 0,
    window_at: Callable[[int], tuple[int | None, LSN]] | None = None,
    flushed: LSN | None = None,
    wal_sizes: WalSizes = DEFAULT_WAL_SIZES,
) -> str | None:
    """Raise :class:`ServerMismatch` if the server is not the one the store followed.

    ``where`` names what recorded the identity (a window or the snapshot). ``history(tli)``
    returns the ``(timeline, switchpoint)`` entries of timeline ``tli``'s history file
    (``TIMELINE_HISTORY``). ``windows``: how many windows the store holds (seqs ``0`` to
    ``windows - 1``); ``window_at(seq)`` returns window ``seq``'s recorded timeline and
    start: with them, every timeline the store went through is checked against the
    server's history, not only the last one (:func:`_check_branch`). ``flushed``: the
    server's WAL flush position (``IDENTIFY_SYSTEM``); the store's end is a position the
    server had flushed when the window committed, so a server whose WAL ends before it
    never had those changes (an older copy started as the primary, on the same timeline).
    A store end just after a WAL page's header is compared as the page's start, where the
    flush position stays when the last record ended there (``wal_sizes.passed_at``, with
    the server's sizes). Returns a warning to log when the timeline changed safely."""
    if recorded_system_id is not None and str(recorded_system_id) != str(system_id):
        raise ServerMismatch(
            f"slot {slot}: the server behind the DSN has system identifier {system_id}, but {where} "
            f"was taken from system {recorded_system_id}: this is another cluster (a restore, a "
            "re-initialised server, or the wrong host). Nothing was read or acknowledged",
            hint="point the DSN at the server the pipeline follows; for a new cluster, take a new "
                 "snapshot into a new store prefix",
        )
    note = _check_timeline(
        slot=slot, timeline=timeline, recorded_timeline=recorded_timeline, store_end=store_end,
        where=where, history=history, windows=windows, window_at=window_at,
    )
    if flushed is not None and wal_sizes.passed_at(store_end) > flushed:
        raise ServerMismatch(
            f"slot {slot}: the store holds changes up to {store_end}, but this server's WAL ends at "
            f"{flushed} (timeline {timeline}): it never had the store's last transactions (an older "
            "copy of the cluster: a restored backup or disk snapshot started as the primary). Nothing "
            "was read or acknowledged",
            hint="point the DSN at the server the pipeline follows; if this copy is the primary now, the "
                 "Delta tables hold changes it lacks: take a new snapshot into a new store prefix (and a "
                 "new slot)",
        )
    return note


def _check_timeline(*, slot, timeline, recorded_timeline, store_end, where, history, windows,
                    window_at) -> str | None:
    if recorded_timeline is None:
        return None
    if timeline == recorded_timeline:
        if timeline > 1 and window_at is not None and windows > 0:
            try:
                entries = history(timeline)
            except ServerError as exc:  # a history file lost from pg_wal: do not stop every drain
                return (
                    f"slot {slot}: could not read the history of timeline {timeline} ({exc.message}): "
                    "the timelines the store's windows went through were not checked against this server"
                )
            _check_branch(slot, timeline, entries, windows, window_at)
        return None
    if timeline < recorded_timeline:
        raise ServerMismatch(
            f"slot {slot}: the server is on timeline {timeline}, but {where} was taken on timeline "
            f"{recorded_timeline}: the server is an older copy of the cluster. Nothing was read or "
            "acknowledged",
            hint="point the DSN at the current primary",
        )
    switch = None
    entries = history(timeline)
    for tli, point in entries:
        if tli == recorded_timeline:
            switch = point
            break
    if switch is None:
        raise ServerMismatch(
            f"slot {slot}: the server is on timeline {timeline}, whose history does not contain "
            f"timeline {recorded_timeline} of {where}: the store followed another branch of the "
            "cluster's history. Nothing was read or acknowledged",
            hint="take a new snapshot into a new store prefix",
        )
    if store_end > switch:
        raise ServerMismatch(
            f"slot {slot}: timeline {recorded_timeline} ended at {switch} on this server (it is now on "
            f"timeline {timeline}), but the store holds changes up to {store_end}, past that point: the "
            "store has transactions this server never had (a point-in-time restore, or a standby "
            "promoted before it caught up). Nothing was read or acknowledged",
            hint="the Delta tables hold changes the new primary lacks: take a new snapshot into a new "
                 "store prefix (and a new slot)",
        )
    if window_at is not None:
        _check_branch(slot, timeline, entries, windows, window_at)
    return (
        f"slot {slot}: the server moved from timeline {recorded_timeline} to {timeline} at {switch}; "
        f"the store ends at {store_end}, before the switch: continuing on the new timeline"
    )


def _check_branch(
    slot: str,
    timeline: int,
    entries: list[tuple[int, LSN]],
    windows: int,
    window_at: Callable[[int], tuple[int | None, LSN]],
) -> None:
    """Every timeline the store's windows went through must be one of this server's, and
    left no later than this server left it.

    The last window's timeline alone does not tell branches apart: two copies of a cluster
    promoted at different points are both on timeline 2, and a store that followed one of
    them would take the other's slot position as a lost acknowledgement and skip its
    transactions. Windows record the timeline they were drained on, never decreasing along
    the store, so for each ``(tli, switchpoint)`` of the server's history the first window
    drained on a later timeline is found by bisection (a few manifest reads): the windows
    before it hold changes of timelines up to ``tli`` up to its start, which must not be
    past ``switchpoint``; and its timeline must be in the server's history."""
    if windows <= 0:
        return
    known = {tli for tli, _ in entries} | {timeline}
    for tli, switch in sorted(entries):
        lo, hi = 0, windows  # the first window whose timeline is later than tli
        while lo < hi:
            mid = (lo + hi) // 2
            if (window_at(mid)[0] or 0) > tli:
                hi = mid
            else:
                lo = mid + 1
        if lo == windows:
            continue  # every window is on tli or before: the store's end was checked against switch
        later, start = window_at(lo)
        if later not in known:
            raise ServerMismatch(
                f"slot {slot}: the store's windows from window {lo} on were drained on timeline {later}, "
                f"which is not in this server's history (timeline {timeline}: "
                f"{', '.join(str(t) for t, _ in sorted(entries))}): the store followed another branch of "
                "the cluster's history. Nothing was read or acknowledged",
                hint="point the DSN at the server the pipeline follows; otherwise take a new snapshot into "
                     "a new store prefix (and a new slot)",
            )
        if lo > 0 and start > switch:
            raise ServerMismatch(
                f"slot {slot}: timeline {tli} ended at {switch} on this server (it is now on timeline "
                f"{timeline}), but the store's windows 0 to {lo - 1} hold changes of timeline {tli} or "
                f"earlier up to {start}, past that point: this server is another branch of the cluster "
                f"(another copy promoted to timeline {timeline} at another point), it never had those "
                "transactions. Nothing was read or acknowledged",
                hint="point the DSN at the server the pipeline follows; otherwise take a new snapshot into "
                     "a new store prefix (and a new slot)",
            )


# --------------------------------------------------------------------------- partitions

_TREE_SQL = """
SELECT t.relid::oid::bigint, t.parentrelid::oid::bigint, t.isleaf, n.nspname::text, c.relname::text,
       i.xmin::text, (i.xmin = COALESCE(ty.xmin, c.xmin)) AS created_as_partition, i.cmin::text::bigint
FROM pg_catalog.pg_partition_tree(%s::oid::regclass) t
JOIN pg_catalog.pg_class c ON c.oid = t.relid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_catalog.pg_type ty ON ty.oid = c.reltype
LEFT JOIN pg_catalog.pg_inherits i ON i.inhrelid = c.oid
WHERE t.level > 0
"""


def partition_leaves(
    sql: psycopg.Connection,
    tables: Iterable[Table],
    *,
    client: Any = None,
    layout: Any = None,
    slot: str | None = None,
    seq: int | None = None,
) -> dict[str, Any]:
    """``{"partition_leaves": [...]}`` (:mod:`airflow_pgcdc.store.partitions`) for the
    partitioned tables among ``tables`` (the tables the publications cover: a partitioned
    table is among them only when it is published through its root), ``{}`` when there is
    none (the window manifest then carries no field).

    Read when the window's changes have been received, right before its manifest is
    committed: every ATTACH/DETACH committed before the window's end is seen; one
    committed a moment after the end may be seen too, and then counts as this window's
    (the merge refuses the root one window early, never late). Each root's ``attached``
    and ``detached`` compare with window ``seq - 1``'s entry for it (read from the store
    through ``client``/``layout``), or, when that window has none (window 0, a window
    written before the field existed), with the root's newest copy (snapshot or resync)."""
    names = sorted(set(tables))
    if not names:
        return {}
    rows = sql.execute(
        "SELECT n.nspname::text, c.relname::text, c.oid::bigint FROM pg_catalog.pg_class c "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relkind = 'p' AND (n.nspname::text, c.relname::text) IN "
        "(SELECT * FROM unnest(%s::text[], %s::text[]))",
        ([s for s, _ in names], [t for _, t in names]),
    ).fetchall()
    if not rows:
        return {}
    from airflow_pgcdc.store import partitions as sp

    previous = _previous_leaves(client, layout, slot, seq)
    copies: dict | None = None
    out = []
    for schema, table, oid in sorted(rows):
        leaves, own_links = _leaves_now(sql, oid)
        before = previous.get((schema, table))
        copied = None
        if before is None:
            if copies is None:
                copies = _copied_leaves(client, layout, slot)
            copied = copies.get((schema, table))
        # a leaf new since the window before (or not in the copy) is judged on its rows too
        if before is not None:
            then = {leaf.identity for leaf in before.leaves}
            leaves = [leaf if leaf.identity in then else _judge_rows(sql, leaf, own_links.get(leaf.oid))
                      for leaf in leaves]
        elif copied is not None:
            leaves = [leaf if leaf.name in copied else _judge_rows(sql, leaf, own_links.get(leaf.oid))
                      for leaf in leaves]
        if before is not None:
            attached, detached = sp.changes_since_window(leaves, before)
        else:
            attached, detached = sp.changes_since_copy(leaves, copied) if copied is not None else ((), ())
        out.append(sp.RootLeaves(schema, table, tuple(leaves), attached, detached).to_dict())
    return {sp.PARTITION_LEAVES_FIELD: out}


def _leaves_now(sql: psycopg.Connection, oid: int) -> tuple[list, dict[int, tuple[str, int]]]:
    """The root's leaves now, and each leaf's own link to its parent (``pg_inherits``'
    ``xmin`` and ``cmin``) when the catalog says it was made with the table."""
    from airflow_pgcdc.store.partitions import Leaf

    nodes = {relid: (parent, leaf, s, t, xid, created, cmin)
             for relid, parent, leaf, s, t, xid, created, cmin in sql.execute(_TREE_SQL, (oid,)).fetchall()}
    leaves, own = [], {}
    for relid, (_parent, leaf, s, t, xid, created, cmin) in nodes.items():
        if not leaf:
            continue
        links, attached, node = [], False, relid
        while node in nodes:  # up to the root (level 0, not in nodes)
            parent, _l, _s, _t, link_xid, link_created, _c = nodes[node]
            links.append(str(link_xid))
            attached = attached or not link_created
            node = parent
        if created and cmin is not None:
            own[int(relid)] = (str(xid), int(cmin))
        leaves.append(Leaf(s, t, int(relid), "/".join(links), bool(attached)))
    return sorted(leaves, key=lambda x: x.name), own


def _judge_rows(sql: psycopg.Connection, leaf, link: tuple[str, int] | None):
    """``leaf`` judged attached after its creation also when its link was made in the
    transaction that created it but after rows were written into it: the "load a staging
    table, then ATTACH it" pattern in one transaction (``CREATE TABLE … (LIKE root); INSERT
    …; ALTER TABLE root ATTACH PARTITION …``), whose rows PostgreSQL never streamed (the
    table was not a partition when they were written). The catalog alone cannot tell it from
    ``CREATE TABLE … PARTITION OF`` (same transaction for both): a row version of that
    transaction whose command came before the link's (``cmin``) can. Read once per new
    leaf (a scan of it, when it is new: usually empty or small)."""
    if leaf.attached_after_creation or link is None:
        return leaf
    import dataclasses

    xid, cmin = link
    try:
        with sql.transaction():
            sql.execute("SET LOCAL lock_timeout = '5s'")  # a leaf locked by DDL: judged, not waited for
            early = sql.execute(
                f"SELECT EXISTS (SELECT 1 FROM ONLY {quote_qualified(leaf.schema, leaf.table)} "
                "WHERE xmin = %s::xid AND cmin::text::bigint < %s)", (xid, cmin),
            ).fetchone()[0]
    except psycopg.Error as exc:  # cannot read it: judged attached (the merge refuses, never misses)
        log.warning("partition %s.%s: cannot read it to tell whether rows predate its partition link (%s): "
                    "counted as attached", leaf.schema, leaf.table, exc)
        early = True
    if early:
        log.warning("partition %s.%s was attached in the transaction that created it, after rows were "
                    "written into it (never streamed): counted as attached", leaf.schema, leaf.table)
    return dataclasses.replace(leaf, attached_after_creation=True) if early else leaf


def _previous_leaves(client, layout, slot, seq) -> dict:
    if client is None or not seq:
        return {}
    from airflow_pgcdc.store import s3 as s3store
    from airflow_pgcdc.store.partitions import window_partition_leaves
    from airflow_pgcdc.store.window import read_window

    try:
        return window_partition_leaves(read_window(client, layout, slot, seq - 1))
    except s3store.ObjectNotFound:
        return {}


def _copied_leaves(client, layout, slot) -> dict:
    """``{root: leaves}`` of the newest copy (snapshot, then resyncs) of each root."""
    if client is None:
        return {}
    from airflow_pgcdc.store.manifest import committed_snapshot
    from airflow_pgcdc.store.partitions import copied_leaves
    from airflow_pgcdc.store.resyncs import committed_resyncs

    out = {}
    snapshot = committed_snapshot(client, layout, slot)
    for t in snapshot.tables if snapshot is not None else ():
        out[(t.schema, t.table)] = copied_leaves(t)
    for r in committed_resyncs(client, layout, slot):  # oldest first: the newest copy wins
        for t in r.manifest.tables:
            out[(t.schema, t.table)] = copied_leaves(t)
    return {k: v for k, v in out.items() if v is not None}


# --------------------------------------------------------------------------- DDL without changes

_SHAPES_SQL = """
SELECT n.nspname::text, c.relname::text, c.oid::bigint, c.relreplident::text,
       array_agg(a.attname::text ORDER BY a.attnum), array_agg(a.atttypid::bigint ORDER BY a.attnum),
       array_agg(a.atttypmod ORDER BY a.attnum), array_agg(a.attgenerated::text ORDER BY a.attnum)
FROM unnest(%s::text[], %s::text[]) AS p(s, t)
JOIN pg_catalog.pg_namespace n ON n.nspname = p.s
JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = p.t AND c.relkind IN ('r', 'p')
JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
GROUP BY 1, 2, 3, 4
"""


def _streamable(gen: str, pg18: bool) -> bool:
    return gen == "" or (pg18 and gen == "s")  # stored generated columns stream on 18 when published


def follow_catalog(sql: psycopg.Connection, sink, publications: Sequence[str], pipeline: Iterable[Table],
                   previous: dict[Table, tuple[int, str]] | None) -> dict[Table, tuple[int, str]]:
    """pgoutput describes a relation (its Relation message) only before its next change, so
    DDL on a table that then has no change (``ADD COLUMN`` on a table left alone, a column an
    inheritance child gets from its parent) or DDL after its last change in the window would
    reach the Delta table only with its next change. At the window's end this reads the
    columns of every table of the pipeline (one query) and, for a table whose columns are not
    those of its last relation version in the window, or, without one, changed since the
    previous window's end (``previous``: ``{table: (oid, fingerprint)}``, None when not
    recorded), gives the window a relation version as the publications would stream it now,
    with no rows (``sink.follow``): the merge then adds the column (with the rows' default,
    ``attmissingval``), or refuses a rename, as for a version that came with changes. Returns
    this window's fingerprints. The catalog's state at the end of the window, not at its end
    LSN: DDL committed after that LSN can show one window early."""
    import hashlib
    import json

    from airflow_pgcdc.pg.tables import TableNotFound, streamed_table
    from airflow_pgcdc.protocol.pgoutput.messages import Relation, RelationColumn

    tables = sorted(set(pipeline))
    pg18 = sql.info.server_version >= 180000
    prints: dict[Table, tuple[int, str]] = {}
    follow = []
    for s, t, oid, replident, names, typids, typmods, gens in sql.execute(
            _SHAPES_SQL, ([s for s, _ in tables], [t for _, t in tables])).fetchall():
        fp = hashlib.sha256(json.dumps([replident, names, typids, typmods, gens]).encode()).hexdigest()[:20]
        prints[(s, t)] = (int(oid), fp)
        versions = sink.versions.get((s, t))
        if versions:
            last = versions[-1]
            now = {(n, ty, mod) for n, ty, mod, g in zip(names, typids, typmods, gens, strict=True)
                   if _streamable(g, pg18)}
            had = {(c.name, c.type.oid, c.typmod) for c in last.columns}
            added = {n for n, g in zip(names, gens, strict=True) if g == ""} - {c.name for c in last.columns}
            if last.replica_identity != replident or not had <= now or added:
                follow.append((s, t))
        elif previous is not None and previous.get((s, t), (None,))[0] == int(oid) and previous[(s, t)][1] != fp:
            follow.append((s, t))
    for s, t in follow:
        try:
            info = streamed_table(sql, publications, s, t)
        except TableNotFound:  # left the publications meanwhile: the publication check says so
            continue
        keys = set(info.key_columns)
        flags = [1 if info.replica_identity == "f" or (info.replica_identity != "n" and c.name in keys) else 0
                 for c in info.columns]
        rel = Relation(None, info.oid, s, t, info.replica_identity,
                       tuple(RelationColumn(f, c.name, c.type_oid, c.typmod)
                             for f, c in zip(flags, info.columns, strict=True)))
        try:
            added = sink.follow(rel)
        except Exception as exc:  # noqa: BLE001 - this table only: its columns follow with its next change
            log.warning("%s.%s: its columns changed without a change to carry them, but no relation version could "
                        "be made from the catalog (%s): they reach its Delta table with its next change", s, t, exc)
            if previous and (s, t) in previous:  # so the next window's end compares it again
                prints[(s, t)] = previous[(s, t)]
            continue
        if added:
            log.info("%s.%s: its columns changed without a change to carry them (DDL on a table left alone, or "
                     "after its last change): the window gets a relation version with no rows", s, t)
    return prints
