"""The key scheme of the store: where every object lives (a public contract, see DESIGN.md).

All keys are relative to a :class:`~airflow_pgcdc.store.s3.S3Location` (``bucket`` +
``prefix``); :class:`Layout` binds one and builds every key::

    {prefix}/{slot}/snapshot/{snapshot_id}/{schema}.{table}/part-00000.parquet
    {prefix}/{slot}/snapshot/{snapshot_id}/_manifest.json                 (written last)
    {prefix}/{slot}/changes/w={window_seq:012d}/{schema}.{table}/v{relation_version:04d}-part-00000-{attempt}.parquet
    {prefix}/{slot}/changes/w={window_seq:012d}/messages/part-00000-{attempt}.parquet
    {prefix}/{slot}/changes/w={window_seq:012d}/pack-00000-{attempt}.pack   (small parts, back to back)
    {prefix}/{slot}/changes/w={window_seq:012d}/_manifest.json            (written last, conditional put)
    {prefix}/{slot}/resync/{resync_slot}/snapshot/{snapshot_id}/...        (a table resync: a snapshot
                                                                            of some tables, same format)
    {prefix}/basebackup/{backup_id}/base.tar[.gz|.lz4|.zst]
    {prefix}/basebackup/{backup_id}/<tablespace oid>.tar[.gz|.lz4|.zst]
    {prefix}/basebackup/{backup_id}/backup_manifest
    {prefix}/basebackup/{backup_id}/backup.json

Window folders are zero-padded to 12 digits, so S3's lexicographic listing order is the
window order.

The table segment ``{schema}.{table}``
--------------------------------------
PostgreSQL names may hold any character but NUL: dots, slashes, quotes, ``%``, spaces,
control characters, any Unicode. :func:`encode_table_segment` makes one reversible,
ASCII-only, S3- and Spark-safe path segment of a (schema, table) pair:

- each name is encoded separately, then the two are joined with one literal ``.``;
- ASCII letters, digits, ``-`` and ``_`` stay as they are, except a ``_`` that starts
  the name, which is encoded (Spark, Hive and pyarrow datasets hide paths whose name
  starts with ``_`` or ``.``);
- every other character is percent-encoded as the bytes of its UTF-8 form, ``%XX``
  with uppercase hex: ``.`` → ``%2E``, ``/`` → ``%2F``, ``%`` → ``%25``, space → ``%20``,
  ``=`` → ``%3D`` (no accidental Hive partition), ``é`` → ``%C3%A9``.

So ``public.orders`` stays ``public.orders``, and ``("my.schema", "a/b")`` becomes
``my%2Eschema.a%2Fb``. Decoding is ``urllib.parse.unquote`` of each side of the single
literal dot; :func:`decode_table_segment` also refuses non-canonical spellings, so each
table has exactly one segment. S3 keys are case-sensitive, like quoted PostgreSQL names.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

from airflow_pgcdc.store.s3 import InvalidS3Url, S3Location, StoreError, validate_key

__all__ = [
    "ARCHIVE_SUFFIXES",
    "Layout",
    "LayoutError",
    "MANIFEST_NAME",
    "archive_name",
    "store_argument",
    "decode_name",
    "decode_table_segment",
    "encode_name",
    "encode_table_segment",
    "new_run_id",
    "part_name",
    "parse_part_name",
    "new_attempt_id",
    "validate_attempt",
    "validate_run_id",
    "validate_slot",
    "window_folder",
]

MANIFEST_NAME = "_manifest.json"
BACKUP_MANIFEST_NAME = "backup_manifest"
BACKUP_INFO_NAME = "backup.json"
MESSAGES_FOLDER = "messages"
ARCHIVE_SUFFIXES = {None: "", "none": "", "gzip": ".gz", "lz4": ".lz4", "zstd": ".zst"}
WINDOW_DIGITS = 12
PART_DIGITS = 5


class LayoutError(StoreError, ValueError):
    """A name that cannot be placed in (or read back from) the key layout."""


# --------------------------------------------------------------------------- names


_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
_ENCODED = [chr(b) if b in _SAFE else f"%{b:02X}" for b in range(256)]


def encode_name(name: str) -> str:
    """One PostgreSQL name as an ASCII path component with no ``.`` or ``/`` (see module doc)."""
    if not isinstance(name, str) or not name:
        raise LayoutError(f"a schema or table name must be a non-empty string, got {name!r}")
    if "\x00" in name:
        raise LayoutError(f"a PostgreSQL name cannot contain NUL: {name!r}")
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError as e:
        raise LayoutError(f"name is not valid Unicode ({e.reason}): {name!r}") from None
    out = "".join(_ENCODED[b] for b in raw)
    if out.startswith("_"):
        out = "%5F" + out[1:]
    return out


_HEX = frozenset("0123456789ABCDEF")


def decode_name(text: str) -> str:
    """Inverse of :func:`encode_name`; refuses anything :func:`encode_name` cannot produce
    (bad escapes, lowercase hex, characters that should have been escaped)."""
    if not isinstance(text, str) or not text:
        raise LayoutError(f"empty encoded name: {text!r}")
    raw = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "%":
            digits = text[i + 1 : i + 3]
            if len(digits) != 2 or not set(digits) <= _HEX:
                raise LayoutError(f"bad percent escape at {i} (expected %XX, uppercase): {text!r}")
            raw.append(int(digits, 16))
            i += 3
        elif ord(ch) < 128:
            raw.append(ord(ch))
            i += 1
        else:
            raise LayoutError(f"non-ASCII character in an encoded name: {text!r}")
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LayoutError(f"escapes are not UTF-8 ({e.reason}): {text!r}") from None
    expected = encode_name(name)
    if expected != text:
        raise LayoutError(
            f"not the canonical encoding of {name!r}: {text!r} (expected {expected!r})"
        )
    return name


def encode_table_segment(schema: str, table: str) -> str:
    """The ``{schema}.{table}`` path segment of a table (reversible; see module doc)."""
    return f"{encode_name(schema)}.{encode_name(table)}"


def decode_table_segment(segment: str) -> tuple[str, str]:
    """``(schema, table)`` of a segment made by :func:`encode_table_segment`."""
    if not isinstance(segment, str) or segment.count(".") != 1:
        raise LayoutError(f"a table segment is <schema>.<table> with exactly one '.': {segment!r}")
    schema, table = segment.split(".")
    return decode_name(schema), decode_name(table)


# Slot names: PostgreSQL allows lowercase letters, digits and underscores, at most 63 bytes.
_SLOT_RE = re.compile(r"[a-z0-9_]{1,63}")
# Run ids (snapshot_id, backup_id): chosen by us or the user; kept to one safe segment.
_RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def validate_slot(slot: str) -> str:
    """Return ``slot`` if it is a valid replication slot name (``[a-z0-9_]{1,63}``)."""
    if not isinstance(slot, str) or not _SLOT_RE.fullmatch(slot):
        raise LayoutError(
            f"invalid replication slot name {slot!r}: 1-63 characters among a-z, 0-9 and _"
        )
    return slot


def validate_run_id(run_id: str, what: str = "run id") -> str:
    """Return ``run_id`` if it is a safe single segment: ``[A-Za-z0-9][A-Za-z0-9._-]*``,
    at most 128 characters, no ``..``."""
    if not isinstance(run_id, str) or not _RUN_ID_RE.fullmatch(run_id) or ".." in run_id:
        raise LayoutError(
            f"invalid {what} {run_id!r}: 1-128 characters among letters, digits, '.', '_' "
            "and '-', starting with a letter or digit, no '..'"
        )
    return run_id


def new_run_id(now: datetime | None = None) -> str:
    """A new snapshot/backup id that sorts by time: ``20250131T235959Z-1a2b3c4d``."""
    now = (now or datetime.now(UTC)).astimezone(UTC)
    return f"{now:%Y%m%dT%H%M%SZ}-{secrets.token_hex(4)}"


def run_id_time(name: str) -> datetime | None:
    """The UTC time a :func:`new_run_id` name starts with (``20250131T235959Z-…``), or None
    for a name not of that form."""
    try:
        return datetime.strptime(name[:16], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def new_attempt_id() -> str:
    """A drain attempt's id: 8 random lowercase hex digits (see :func:`part_name`)."""
    return secrets.token_hex(4)


def part_name(number: int, *, relation_version: int | None = None, attempt: str | None = None) -> str:
    """``part-00042.parquet``, or ``v0003-part-00042.parquet`` for a change part;
    ``attempt`` (a drain attempt's id, 8 lowercase hex digits) makes it
    ``v0003-part-00042-1a2b3c4d.parquet``, so two attempts at one window never write the
    same key."""
    name = _numbered("part", number, attempt, "parquet")
    if relation_version is None:
        return name
    if not isinstance(relation_version, int) or not 0 <= relation_version < 10_000:
        raise LayoutError(f"relation version must be 0..9999, got {relation_version!r}")
    return f"v{relation_version:04d}-{name}"


def _numbered(stem: str, number: int, attempt: str | None, extension: str) -> str:
    """``{stem}-{number:05d}[-{attempt}].{extension}`` (a part's or a pack's name)."""
    if not isinstance(number, int) or not 0 <= number < 10**PART_DIGITS:
        raise LayoutError(f"{stem} number must be 0..{10**PART_DIGITS - 1}, got {number!r}")
    suffix = "" if attempt is None else "-" + validate_attempt(attempt)
    return f"{stem}-{number:05d}{suffix}.{extension}"


_ATTEMPT_RE = re.compile(r"[0-9a-f]{8}")


def validate_attempt(attempt: str) -> str:
    if not isinstance(attempt, str) or not _ATTEMPT_RE.fullmatch(attempt):
        raise LayoutError(f"an attempt id is 8 lowercase hex digits, got {attempt!r}")
    return attempt


_PART_RE = re.compile(r"(?:v(\d{4})-)?part-(\d{5})(?:-[0-9a-f]{8})?\.parquet")


def parse_part_name(name: str) -> tuple[int | None, int]:
    """``(relation_version or None, part number)`` of a name made by :func:`part_name`."""
    m = _PART_RE.fullmatch(name)
    if m is None:
        raise LayoutError(f"not a part file name: {name!r}")
    return (int(m.group(1)) if m.group(1) else None), int(m.group(2))


def window_folder(window_seq: int) -> str:
    """``w=000000000042``."""
    if (
        not isinstance(window_seq, int)
        or isinstance(window_seq, bool)
        or not 0 <= window_seq < 10**WINDOW_DIGITS
    ):
        raise LayoutError(f"window_seq must be 0..{10**WINDOW_DIGITS - 1}, got {window_seq!r}")
    return f"w={window_seq:012d}"


_WINDOW_RE = re.compile(r"w=(\d{12})")


def parse_window_folder(folder: str) -> int:
    """Inverse of :func:`window_folder`."""
    m = _WINDOW_RE.fullmatch(folder)
    if m is None:
        raise LayoutError(f"not a window folder (w= and 12 digits): {folder!r}")
    return int(m.group(1))


def archive_name(tablespace_oid: int | None = None, compression: str | None = None) -> str:
    """``base.tar``, ``16385.tar.zst``…: the archive names BASE_BACKUP uses."""
    if compression not in ARCHIVE_SUFFIXES:
        raise LayoutError(f"unknown archive compression {compression!r} (gzip, lz4, zstd or none)")
    if tablespace_oid is None:
        stem = "base"
    elif isinstance(tablespace_oid, int) and 0 < tablespace_oid < 2**32:
        stem = str(tablespace_oid)
    else:
        raise LayoutError(f"tablespace oid must be 1..2^32-1, got {tablespace_oid!r}")
    return f"{stem}.tar{ARCHIVE_SUFFIXES[compression]}"


_ARCHIVE_RE = re.compile(r"(base|[1-9][0-9]{0,9})\.tar(\.gz|\.lz4|\.zst)?")


def validate_archive_name(name: str) -> str:
    """Return ``name`` if it is ``base.tar`` or ``<oid>.tar``, optionally ``.gz``/``.lz4``/``.zst``."""
    if not isinstance(name, str) or not _ARCHIVE_RE.fullmatch(name):
        raise LayoutError(
            f"not a base backup archive name (base.tar or <oid>.tar, optionally .gz/.lz4/.zst): {name!r}"
        )
    return name


# --------------------------------------------------------------------------- the layout


@dataclass(frozen=True)
class Layout:
    """Every key of the store under one ``s3://bucket/prefix``."""

    root: S3Location

    @classmethod
    def parse(cls, url: str) -> Layout:
        return cls(S3Location.parse(url))

    @property
    def bucket(self) -> str:
        return self.root.bucket

    def _key(self, *parts: str) -> str:
        try:
            return self.root.key(*parts)
        except InvalidS3Url as e:
            raise LayoutError(e.reason, bucket=e.bucket, key=e.key) from None

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    # -- snapshot

    def snapshot_prefix(self, slot: str, snapshot_id: str) -> str:
        """``{prefix}/{slot}/snapshot/{snapshot_id}/`` (with the trailing slash)."""
        return (
            self._key(validate_slot(slot), "snapshot", validate_run_id(snapshot_id, "snapshot id"))
            + "/"
        )

    def snapshot_table_prefix(self, slot: str, snapshot_id: str, schema: str, table: str) -> str:
        return self.snapshot_prefix(slot, snapshot_id) + encode_table_segment(schema, table) + "/"

    def snapshot_part(
        self, slot: str, snapshot_id: str, schema: str, table: str, number: int
    ) -> str:
        return _checked(
            self.snapshot_table_prefix(slot, snapshot_id, schema, table) + part_name(number),
            self.bucket,
        )

    def snapshot_manifest(self, slot: str, snapshot_id: str) -> str:
        return self.snapshot_prefix(slot, snapshot_id) + MANIFEST_NAME

    def snapshots_prefix(self, slot: str) -> str:
        """``{prefix}/{slot}/snapshot/``: list with delimiter ``/`` to find snapshot ids."""
        return self._key(validate_slot(slot), "snapshot") + "/"

    def resync_layout(self, slot: str) -> Layout:
        """Where ``pgcdc resync`` keeps the table snapshots it takes for ``slot``: a layout
        rooted at ``{prefix}/{slot}/resync``, inside which each resync is an ordinary
        snapshot (``{resync_slot}/snapshot/{snapshot_id}/…``) named after the temporary
        slot that exported it."""
        key = self._key(validate_slot(slot), "resync")
        return Layout(S3Location(self.bucket, key))

    def slice_layout(self, slot: str) -> Layout:
        """Where ``pgcdc resync --where`` keeps its slices of tables for ``slot``: like
        :meth:`resync_layout`, rooted at ``{prefix}/{slot}/slice`` (apart: a slice is not a
        table's copy, see :mod:`airflow_pgcdc.store.resyncs`)."""
        key = self._key(validate_slot(slot), "slice")
        return Layout(S3Location(self.bucket, key))

    def catalog_object(self, slot: str, digest: str) -> str:
        """``{prefix}/{slot}/catalog/{digest}.json``: the pipeline's tables' column
        fingerprints a drain saw at a window's end, named by their content's SHA-256."""
        return self._key(validate_slot(slot), "catalog", validate_run_id(digest, "catalog digest") + ".json")

    def privacy_rules(self, slot: str) -> str:
        """``{prefix}/{slot}/privacy.json``: the slot's column rules (excluded, hashed and
        masked columns: :mod:`airflow_pgcdc.store.privacy`)."""
        return self._key(validate_slot(slot), "privacy.json")

    def recoveries_prefix(self, slot: str) -> str:
        """``{prefix}/{slot}/recovery/``: the slot's recovery records (``pgcdc recover``)."""
        return self._key(validate_slot(slot), "recovery") + "/"

    def recovery_record(self, slot: str, recovery_id: str) -> str:
        """``{prefix}/{slot}/recovery/{recovery_id}.json``."""
        return self.recoveries_prefix(slot) + validate_run_id(recovery_id, "recovery id") + ".json"

    # -- changes

    def changes_prefix(self, slot: str) -> str:
        """``{prefix}/{slot}/changes/``: list with delimiter ``/`` to find windows."""
        return self._key(validate_slot(slot), "changes") + "/"

    def window_prefix(self, slot: str, window_seq: int) -> str:
        return self.changes_prefix(slot) + window_folder(window_seq) + "/"

    def window_manifest(self, slot: str, window_seq: int) -> str:
        return self.window_prefix(slot, window_seq) + MANIFEST_NAME

    def merge_tables_index(self, slot: str) -> str:
        """``{prefix}/{slot}/merge-state/tables.json``: the tables the slot's windows hold,
        up to a window (a merge job's cache, so that it need not read every manifest)."""
        return self._key(validate_slot(slot), "merge-state", "tables.json")

    def merge_results_prefix(self, slot: str) -> str:
        """``{prefix}/{slot}/merge-results/``: one document per merge job, its whole result
        (every table's outcome), named by the job's run id (they sort by time)."""
        return self._key(validate_slot(slot), "merge-results") + "/"

    def merge_result(self, slot: str, run_id: str) -> str:
        """``{prefix}/{slot}/merge-results/{run_id}.json``."""
        return self.merge_results_prefix(slot) + validate_run_id(run_id) + ".json"

    def merge_staging_prefix(self, slot: str, run_id: str | None = None) -> str:
        """``{prefix}/{slot}/merge-staging/[{run_id}/]``: files a merge job stages for its
        Delta commits (removed after each commit; debris of a killed job is removed later)."""
        base = self._key(validate_slot(slot), "merge-staging") + "/"
        return base if run_id is None else base + validate_run_id(run_id) + "/"

    def window_table_prefix(self, slot: str, window_seq: int, schema: str, table: str) -> str:
        return self.window_prefix(slot, window_seq) + encode_table_segment(schema, table) + "/"

    def window_part(
        self,
        slot: str,
        window_seq: int,
        schema: str,
        table: str,
        relation_version: int,
        number: int,
        attempt: str | None = None,
    ) -> str:
        """``…/w=…/{schema}.{table}/v{relation_version:04d}-part-{number:05d}[-{attempt}].parquet``."""
        return _checked(
            self.window_table_prefix(slot, window_seq, schema, table)
            + part_name(number, relation_version=relation_version, attempt=attempt),
            self.bucket,
        )

    def window_messages_part(self, slot: str, window_seq: int, number: int, attempt: str | None = None) -> str:
        """Non-transactional logical decoding messages of a window."""
        return self.window_prefix(slot, window_seq) + f"{MESSAGES_FOLDER}/" + part_name(number, attempt=attempt)

    def window_pack(self, slot: str, window_seq: int, number: int, attempt: str | None = None) -> str:
        """``…/w=…/pack-{number:05d}[-{attempt}].pack``: a window's small parts, back to back
        (:mod:`.packs`)."""
        return _checked(self.window_prefix(slot, window_seq) + _numbered("pack", number, attempt, "pack"), self.bucket)

    def parse_window_key(self, slot: str, key: str) -> int:
        """The window_seq of any key under ``changes/w=…/``."""
        base = self.changes_prefix(slot)
        if not key.startswith(base):
            raise LayoutError(f"not under {self.url(base)}", bucket=self.bucket, key=key)
        return parse_window_folder(key[len(base) :].split("/", 1)[0])

    # -- base backup

    def basebackup_prefix(self, backup_id: str) -> str:
        return self._key("basebackup", validate_run_id(backup_id, "backup id")) + "/"

    def basebackup_archive(self, backup_id: str, name: str) -> str:
        """An archive as BASE_BACKUP names it (``base.tar``, ``16385.tar.zst``, …)."""
        return self.basebackup_prefix(backup_id) + validate_archive_name(name)

    def basebackup_manifest(self, backup_id: str) -> str:
        return self.basebackup_prefix(backup_id) + BACKUP_MANIFEST_NAME

    def basebackup_info(self, backup_id: str) -> str:
        return self.basebackup_prefix(backup_id) + BACKUP_INFO_NAME


def _checked(key: str, bucket: str) -> str:
    try:
        return validate_key(key, bucket=bucket)
    except InvalidS3Url as e:
        raise LayoutError(e.reason, bucket=bucket, key=e.key) from None


def store_argument(call: str, store: str | None, old_name: str, old: str | None) -> str:
    """The change store URL a library call was given: ``store``, or its 0.1 name ``old_name``
    (accepted for one release with a :class:`DeprecationWarning`); both, or neither, is a
    :class:`TypeError` naming ``call``."""
    from airflow_pgcdc.options import renamed_parameter

    return renamed_parameter(call, "store", store, old_name, old, required="the store (s3://bucket/prefix)",
                             stacklevel=4)
