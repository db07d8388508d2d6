"""``pgcdc resync``: a fresh snapshot of some tables of a running pipeline.

A table added to the publication after the pipeline's snapshot, or one to rebuild after an
incident, needs a starting copy that fits the change windows exactly: every transaction in
that copy or in a later window for that table, never both, never neither. A resync takes
it the same way the pipeline's snapshot was taken, on the side, while drains and merges
of the slot go on:

1. Every table must already be in the publication (else :class:`TableNotPublished`, whose
   hint is the ``ALTER PUBLICATION`` statement): from then on the slot's stream carries its
   changes.
2. A *temporary* logical slot is created with ``SNAPSHOT 'export'``; its consistent point
   ``C`` splits the transactions: those whose commit record is before ``C`` are in the
   exported snapshot, those at or after ``C`` are decoded after it, by every slot, so the
   pipeline's windows hold them with ``_pgcdc_commit_lsn >= C``. The tables are copied
   under that snapshot (the snapshot code, workers and all), and the temporary slot goes
   with the connection: it never outlives the run, even a killed one, and never holds WAL.
3. The copy is committed as an ordinary snapshot manifest under
   ``{prefix}/{slot}/resync/{temporary slot}/snapshot/{id}/`` (:meth:`Layout.resync_layout`).

The merge (:mod:`airflow_pgcdc.merge.job`) then replaces each resynced table's Delta table
from that copy in one commit, and applies only the changes at or after ``C``. A failed
resync leaves nothing the merge reads (no manifest), and its rerun starts over.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg

from airflow_pgcdc.errors import HintedError
from airflow_pgcdc.options import publications_argument
from airflow_pgcdc.pg.conninfo import redact
from airflow_pgcdc.pg.tables import check_partitions_as_published, parse_table_names
from airflow_pgcdc.protocol.quoting import quote_ident, quote_qualified, shell_qualified
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.snapshot.options import ResyncOptions, SnapshotOptions
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout, store_argument, validate_slot
from airflow_pgcdc.store.privacy import resolve_privacy
from airflow_pgcdc.store.resyncs import Resync, committed_resyncs

__all__ = ["BadSlice", "Resync", "ResyncError", "TableNotPublished", "committed_resyncs", "resync_tables"]

log = logging.getLogger(__name__)

RESYNC_SLOT_PREFIX = "pgcdc_rs_"


class ResyncError(HintedError):
    """The resync could not be taken (nothing was committed)."""


class TableNotPublished(ResyncError):
    """A table to resync is not in the publication: the slot would not stream its changes."""


class BadSlice(ResyncError):
    """``--where`` cannot slice a table: the predicate is not valid SQL on it (PostgreSQL's
    message says why), or the table has no key to merge the slice's rows on."""


class PublicationNotStreamed(ResyncError):
    """The resync's publication is not one the slot's drains stream (recorded in every
    window): a table taken through it would be replaced from its copy and then never get
    a change."""


def _check_store(client, layout: Layout, slot: str, publications: tuple[str, ...]) -> None:
    """The store must follow ``slot`` (a snapshot or a window of it), and each of
    ``publications`` must be one of those its drains stream (the newest window's ``publications``)."""
    from airflow_pgcdc.store.manifest import committed_snapshot
    from airflow_pgcdc.store.window import latest_window

    newest = latest_window(client, layout, slot)
    store = f"s3://{layout.bucket}/{layout.root.prefix}".rstrip("/")
    if newest is None:
        if committed_snapshot(client, layout, slot) is None:
            raise ResyncError(
                f"{store} holds no snapshot and no window of slot {slot!r}: a resync adds tables to a "
                "running pipeline's store; nothing was copied",
                hint=f"check the store URL and the slot (pgcdc status --slot {slot} --store <url>)",
            )
        return
    foreign = [p for p in publications if newest.publications and p not in newest.publications]
    if foreign:
        raise PublicationNotStreamed(
            f"slot {slot}'s drains stream publication(s) {', '.join(sorted(newest.publications))} (window "
            f"{newest.window_seq}), not {', '.join(map(repr, foreign))}: a table copied through it would be replaced in Delta "
            "and then never get a change; nothing was copied",
            hint=f"--publication {sorted(newest.publications)[0]} (add the table to it first if needed: the "
                 "error then gives the ALTER PUBLICATION)",
        )


def _check(dsn: str, slot: str, publications: tuple[str, ...], tables: Sequence[tuple[str, str]]) -> None:
    with psycopg.connect(dsn, autocommit=True, application_name="pgcdc-resync") as conn:
        row = conn.execute(
            "SELECT database = current_database() FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()
        if row is None or not row[0]:
            raise ResyncError(
                f"slot {slot!r} does not exist in database {conn.info.dbname!r}: a resync adds tables to "
                "a running pipeline",
                hint="start the pipeline with `pgcdc snapshot` (it creates the slot)",
            )
        found = {r[0] for r in conn.execute("SELECT pubname::text FROM pg_publication WHERE pubname = ANY(%s)",
                                            (list(publications),))}
        for publication in publications:
            if publication not in found:
                raise ResyncError(f"publication {publication!r} does not exist in database {conn.info.dbname!r}",
                                  hint="give the publication the pipeline's drains use")
        published = set(conn.execute(
            "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = ANY(%s)",
            (list(publications),),
        ).fetchall())
        for publication in publications:  # before "not published": its hint would mislead
            check_partitions_as_published(conn, publication, [n for n in tables if n not in published])
    missing = [(s, t) for s, t in tables if (s, t) not in published]
    if missing:
        names = ", ".join(f"{quote_ident(s)}.{quote_ident(t)}" for s, t in missing)
        shown = ", ".join(map(repr, publications))
        raise TableNotPublished(
            f"not in publication(s) {shown}: {names}; the slot would not stream their changes",
            hint=f"ALTER PUBLICATION {quote_ident(publications[0])} ADD TABLE {names}; then rerun the resync",
        )


def _check_slice(dsn: str, tables: Sequence[tuple[str, str]], where: str) -> None:
    """Before any slot exists: ``where`` must be one SQL predicate on each table, run in a
    read-only transaction (``SELECT 1 FROM t WHERE (where) LIMIT 0``: one statement, so a
    predicate that closes the parenthesis to add another fails here), and each table needs
    a primary key or replica identity index (the merge upserts the slice's rows by key)."""
    if not where.strip() or "\x00" in where:
        raise BadSlice("--where needs a predicate, e.g. \"tenant_id = 42\"")
    with psycopg.connect(dsn, autocommit=False, application_name="pgcdc-resync") as conn:
        conn.execute("SET TRANSACTION READ ONLY")
        for s, t in tables:
            name = quote_qualified(s, t)
            try:
                with conn.transaction():
                    conn.execute(f"SELECT 1 FROM {name} WHERE ({where}) LIMIT 0")
            except psycopg.Error as exc:
                raise BadSlice(f"--where {where!r} is not a predicate on {name}: "
                               f"{str(exc).strip().splitlines()[0]}",
                               hint="one SQL boolean expression over the table's columns") from None
            keyed = conn.execute(
                "SELECT 1 FROM pg_index WHERE indrelid = %s::regclass AND (indisprimary OR indisreplident)",
                (name,)).fetchone()
            if keyed is None:
                raise BadSlice(f"{name} has no primary key or replica identity index: the merge could not "
                               "match a slice's rows to the Delta table's",
                               hint="resync the whole table (leave --where out): pgcdc resync --tables "
                                    f"{shell_qualified(s, t)}")


def resync_tables(
    dsn: str,
    store: str | None = None,
    *,
    slot: str,
    publications: Sequence[str] | str | None = None,
    options: ResyncOptions | Mapping[str, Any] | None = None,
    s3: Any = None,
    on_slot_created: Callable[[str, str], None] | None = None,
    **fields: Any,
) -> Resync:
    """Take a resync of ``options.tables`` (``schema.table``) for the pipeline of ``slot``
    whose store is ``store``, through ``publications`` (one name or several, each one the
    slot's drains stream); returns it once committed. See the module doc. ``options``: a
    :class:`~.options.ResyncOptions` (or a mapping of its fields), or its fields given as
    keywords (``tables``, ``where``, ``workers``, ``rows_per_part``, ``copy_format``,
    ``worker_processes``, ``as_text``). ``as_text``: columns kept as exact text
    (:func:`~airflow_pgcdc.snapshot.export.snapshot_to_s3`). ``where``: a slice, only the
    rows matching this SQL predicate, kept apart (:meth:`Layout.slice_layout`); the merge
    upserts them (the tables' other rows stay), see :mod:`airflow_pgcdc.merge.slices`.
    ``s3``: S3Settings or a client. The 0.1 names ``to``, ``publication``, ``s3_client`` and
    ``s3_settings`` are accepted for one release, with a :class:`DeprecationWarning`."""
    store = store_argument("resync_tables", store, "to", fields.pop("to", None))
    publications = publications_argument("resync_tables", publications, fields, required=True)
    settings, client = s3store.s3_argument("resync_tables", s3, fields)
    o = ResyncOptions.of(options, **fields)
    where = o.where
    validate_slot(slot)
    names = parse_table_names(o.tables)
    if not names:
        raise ResyncError("name the tables to resync", hint="--tables schema.table [...]")
    _check(dsn, slot, publications, names)
    if where is not None:
        _check_slice(dsn, names, where)
    layout = Layout.parse(store)
    client = client or s3store.make_s3_client(settings)
    _check_store(client, layout, slot, publications)
    rl = layout.resync_layout(slot) if where is None else layout.slice_layout(slot)
    resync_slot = RESYNC_SLOT_PREFIX + secrets.token_hex(6)
    log.info("resync of %s for slot %s from %s (temporary slot %s)",
             ", ".join(f"{s}.{t}" for s, t in names), slot, redact(dsn), resync_slot)
    copy = SnapshotOptions(tables=tuple(f"{quote_ident(s)}.{quote_ident(t)}" for s, t in names),
                           workers=o.workers, rows_per_part=o.rows_per_part, copy_format=o.copy_format,
                           worker_processes=o.worker_processes, temporary=True, as_text=o.as_text, slice_where=where)
    # the pipeline's column rules, not its temporary slot's (which has none)
    privacy = resolve_privacy(client, layout, slot)
    manifest = snapshot_to_s3(dsn, rl.root, slot=resync_slot, publications=publications, options=copy,
                              s3=client, on_slot_created=on_slot_created, privacy=privacy)
    done = Resync(manifest=manifest, layout=rl, resync_slot=resync_slot)
    log.info("resync committed at consistent point %s: %s (%d rows); the next merge %s these tables",
             manifest.consistent_point, done.url, manifest.rows,
             "replaces" if where is None else "upserts these rows of")
    return done
