"""Where a pipeline's Delta tables are and how they are named: the table URLs under a Delta
root (the main table, its changelog and SCD2 history), and the app transaction ids that
record what each table holds. Strings only (no delta-rs, no Spark): every job that finds a
table (merge, maintain, verify, status, rebuild) names it here."""

from __future__ import annotations

from airflow_pgcdc.store.layout import encode_table_segment

__all__ = [
    "CHANGELOG_SUFFIX", "CHANGE_DATA_FEED", "RESYNC_APP_SUFFIX", "SCD2_SUFFIX", "app_id", "changelog_url", "cut_app",
    "delta_table_url", "legacy_delta_table_url", "scd2_url", "shared_legacy_places",
]


CHANGE_DATA_FEED = "delta.enableChangeDataFeed"
"""The Delta table property of the change data feed (``--change-data-feed``): each commit
also writes what it changed (``_change_data/``), read by ``readChangeFeed`` / ``table_changes``
or delta-rs' ``load_cdf``."""


def app_id(slot: str, schema: str, table: str) -> str:
    """The Delta app transaction id of a table: ``pgcdc:{slot}:{schema}.{table}``."""
    return f"pgcdc:{slot}:{schema}.{table}"


RESYNC_APP_SUFFIX = ":resync"
"""A Delta table's app transaction ``{app}:resync`` holds the consistent point (as an
integer LSN) of the resync (or slice, :mod:`airflow_pgcdc.merge.slices`) it last applied."""


def cut_app(app: str, window: int) -> str:
    """The app transaction id recording that ``window`` is applied up to a point (its
    version: the point's LSN; see :mod:`airflow_pgcdc.merge.point`)."""
    return f"{app}:until-w{window}"


def delta_table_url(delta_root: str, schema: str, table: str) -> str:
    """``{delta_root}/{schema}.{table}``: the store's reversible segment encoding with ``~``
    as its escape instead of ``%`` (``my~2Eschema.a~2Fb``; the encoding escapes ``~`` and
    ``%`` themselves, so this is one-to-one too). delta-rs decodes ``%`` escapes in a
    table's URL (and its log reader decodes them again), so with ``%`` two names decoded
    to one key: ``"a.b"."c"`` and ``"a"."b.c"`` were one Delta table (``a.b.c``, see
    :func:`legacy_delta_table_url`). ``~`` is left alone by URL decoding, delta-rs and
    Hadoop's paths. Names that need no escape are unchanged."""
    return delta_root.rstrip("/") + "/" + encode_table_segment(schema, table).replace("%", "~")


def legacy_delta_table_url(delta_root: str, schema: str, table: str) -> str:
    """Where earlier versions put a table: the segment with ``%`` escapes, which delta-rs
    decodes, so its objects are under ``my.schema.Odd Table``, a key two names can share.
    Equal to :func:`delta_table_url` for names that need no escape."""
    return delta_root.rstrip("/") + "/" + encode_table_segment(schema, table)


def shared_legacy_places(tables) -> frozenset[tuple[str, str]]:
    """Those of ``tables`` (``(schema, table)`` pairs) whose legacy Delta location
    (:func:`legacy_delta_table_url`: the segment decoded) another of them shares."""
    from collections import Counter
    from urllib.parse import unquote

    place = {t: unquote(encode_table_segment(*t)) for t in set(tables)}
    counts = Counter(place.values())
    return frozenset(t for t, p in place.items() if counts[p] > 1)


CHANGELOG_SUFFIX = "__changelog"


def changelog_url(delta: str, schema: str, table: str) -> str:
    """``{delta}/{schema}.{table}__changelog``: the append-only history of a table."""
    return delta_table_url(delta, schema, table) + CHANGELOG_SUFFIX


SCD2_SUFFIX = "__scd2"


def scd2_url(delta: str, schema: str, table: str) -> str:
    """``{delta}/{schema}.{table}__scd2``: the SCD type 2 history of a table."""
    return delta_table_url(delta, schema, table) + SCD2_SUFFIX

