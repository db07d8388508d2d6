"""A slot's column rules (:mod:`airflow_pgcdc.typemap.privacy`) kept in the store, at
``{prefix}/{slot}/privacy.json``, so that every job of the slot applies the same ones.

The first job given rules (a snapshot, a drain) writes the document with a conditional put;
every later job of the slot applies it, whether it is given rules or not: a drain that is
not told about them still hashes what the snapshot hashed. A job given rules that differ
from the document's is refused (:class:`PiiRulesChanged`), as is a hash key other than the
one the document was written with (:class:`PiiKeyMismatch`, by the key's fingerprint: the
key itself is never stored).

The document::

    {"format": 1, "created_at": "...", "key_fingerprint": "0123abcd..." | null,
     "tables": [{"schema": "public", "table": "users",
                 "columns": {"email": "hash", "ssn": "exclude", "phone": "mask:4"}}]}
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout, LayoutError
from airflow_pgcdc.typemap.privacy import (
    KEY_ENV,
    ColumnRule,
    PiiError,
    PiiKey,
    PiiKeyMismatch,
    PiiKeyMissing,
    PiiRuleError,
    TableRules,
)

__all__ = ["PiiRulesChanged", "SlotPrivacy", "load_privacy", "parse_rules", "resolve_privacy", "save_privacy", "slots_with_rules"]

FORMAT = 1
Rules = dict[tuple[str, str], dict[str, ColumnRule]]


class PiiRulesChanged(PiiError):
    """Rules given to a job differ from the ones the slot's data was written with."""


@dataclass(frozen=True)
class SlotPrivacy:
    """A slot's rules and the key that hashes (None when no rule hashes, or not given)."""

    rules: Rules = field(default_factory=dict)
    key_fingerprint: str | None = None
    key: PiiKey | None = field(default=None, repr=False, compare=False)
    # {(schema, table): (relation oid, {column: attnum})} as the snapshot found the ruled
    # columns: a rule follows its column through a rename (:meth:`rules_for`)
    ids: dict[tuple[str, str], tuple[int, dict[str, int]]] = field(default_factory=dict, compare=False)

    def __bool__(self) -> bool:
        return any(self.rules.values())

    @property
    def hashes(self) -> bool:
        return any(r.action == "hash" for cols in self.rules.values() for r in cols.values())

    def rules_for(self, schema: str, table: str, relation_oid: int | None = None,
                  attnums: Mapping[str, int] | None = None) -> TableRules | None:
        """The rules of ``schema.table`` for its columns as they are now (``attnums``:
        ``{column: attnum}``): a ruled column renamed since the rules were written keeps its
        rule under its new name (same relation, same ``attnum``), and the old name's rule
        stays (a column added under it later gets it too)."""
        rules = dict(self.rules.get((schema, table)) or {})
        if not rules:
            return None
        known = self.ids.get((schema, table))
        if known and attnums and known[0] == relation_oid:
            by_attnum = {a: rules[c] for c, a in known[1].items() if c in rules}
            for name, attnum in attnums.items():
                if name not in rules and attnum in by_attnum:
                    rules[name] = by_attnum[attnum]
        return TableRules(f"{schema}.{table}", rules, self.key)

    def with_ids(self, tables: Iterable[Any]) -> SlotPrivacy:
        """These rules with the ruled columns' identities from ``tables``
        (:class:`~airflow_pgcdc.pg.tables.TableInfo`)."""
        ids = dict(self.ids)
        for t in tables:
            cols = self.rules.get((t.schema, t.name))
            if cols:
                ids[(t.schema, t.name)] = (t.oid, {c.name: c.attnum for c in t.columns if c.name in cols})
        return SlotPrivacy(self.rules, self.key_fingerprint, self.key, ids)

    def describe(self) -> dict[str, dict[str, str]]:
        """``{"schema.table": {"column": "rule"}}`` (results, logs: names and rules only)."""
        return {f"{s}.{t}": {c: str(r) for c, r in sorted(cols.items())} for (s, t), cols in sorted(self.rules.items())}

    def to_json(self) -> str:
        return json.dumps({
            "format": FORMAT,
            "created_at": datetime.now(UTC).isoformat(),
            "key_fingerprint": self.key_fingerprint,
            "tables": [{"schema": s, "table": t, "columns": {c: str(r) for c, r in sorted(cols.items())},
                        **({"oid": self.ids[(s, t)][0], "attnums": self.ids[(s, t)][1]} if (s, t) in self.ids else {})}
                       for (s, t), cols in sorted(self.rules.items())],
        }, indent=1)

    @classmethod
    def from_document(cls, doc: Any, where: str) -> SlotPrivacy:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("tables"), list):
            raise PiiRuleError(f"{where} is not a column rules document of format {FORMAT}",
                               hint="it is written by airflow-pgcdc; restore it from the store's versions")
        rules: Rules = {}
        ids = {}
        for t in doc["tables"]:
            key = (str(t["schema"]), str(t["table"]))
            rules[key] = {str(c): ColumnRule.parse(r, where=f"{where} {key[0]}.{key[1]}.{c}")
                          for c, r in dict(t["columns"]).items()}
            if "oid" in t:
                ids[key] = (int(t["oid"]), {str(c): int(a) for c, a in dict(t.get("attnums") or {}).items()})
        return cls(rules, doc.get("key_fingerprint"), ids=ids)


def parse_rules(items: Sequence[str] | Mapping[str, Mapping[str, str]] | None, what: str = "--pii") -> Rules:
    """``["public.users:email=hash", "public.users:ssn=exclude"]`` (the CLI's form) or
    ``{"public.users": {"email": "hash", "ssn": "exclude"}}`` (the operators') ->
    ``{("public", "users"): {"email": ColumnRule("hash"), ...}}``. The table is read as
    ``--tables`` reads it; the column is its exact name; the last ``:`` before the ``=``
    splits table from column."""
    from airflow_pgcdc.pg.tables import CatalogError, parse_table_names

    pairs: list[tuple[str, str, str]] = []
    if isinstance(items, Mapping):
        for table, cols in items.items():
            if not isinstance(cols, Mapping):
                raise PiiRuleError(f"{what}: {table!r} needs a mapping of column to rule, got {cols!r}",
                                   hint='e.g. {"public.users": {"email": "hash"}}')
            pairs += [(str(table), str(c), str(r)) for c, r in cols.items()]
    else:
        for item in items or ():
            left, eq, rule = str(item).rpartition("=")
            table, colon, column = left.rpartition(":")
            if not eq or not colon or not table or not column:
                raise PiiRuleError(f"{what} expects SCHEMA.TABLE:COLUMN=RULE, got {item!r}",
                                   hint="e.g. --pii public.users:email=hash --pii public.users:ssn=exclude")
            pairs.append((table, column, rule))
    out: Rules = {}
    for table, column, rule in pairs:
        try:
            (name,) = parse_table_names([table])
        except CatalogError as exc:
            raise PiiRuleError(f"{what}: {exc}", hint="the table as --tables takes it: schema.table") from None
        where = f"{what} {name[0]}.{name[1]}.{column}"
        parsed = ColumnRule.parse(rule, where=where)
        seen = out.setdefault(name, {})
        if column in seen and seen[column] != parsed:
            raise PiiRuleError(f"{where}: two rules ({seen[column]}, {parsed})", hint="give each column one rule")
        seen[column] = parsed
    return out


def load_privacy(client: Any, layout: Layout, slot: str) -> SlotPrivacy | None:
    """The slot's document, or None when it has none."""
    key = layout.privacy_rules(slot)
    try:
        doc = s3store.get_json(client, layout.bucket, key)
    except s3store.ObjectNotFound:
        return None
    return SlotPrivacy.from_document(doc, f"s3://{layout.bucket}/{key}")


def save_privacy(client: Any, layout: Layout, slot: str, privacy: SlotPrivacy) -> None:
    """Write the slot's document unless it has one (with the same rules: else
    :class:`PiiRulesChanged`)."""
    if not privacy or s3store.commit_if_absent(client, layout.bucket, layout.privacy_rules(slot),
                                                privacy.to_json().encode(), content_type="application/json"):
        return
    stored = load_privacy(client, layout, slot)
    if stored is not None and stored.rules != privacy.rules:
        raise PiiRulesChanged(f"slot {slot}: another job wrote other column rules ({_text(stored)}) meanwhile",
                              hint="give every job of the slot the same rules")


def slots_with_rules(client: Any, layout: Layout) -> list[str]:
    """The slots under ``layout``'s root whose data is written under column rules."""
    prefix = layout.root.prefix + "/" if layout.root.prefix else ""
    folders = []
    with s3store._s3_call("ListObjectsV2", layout.bucket, prefix):  # a missing bucket: a StoreError
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=layout.bucket, Prefix=prefix,
                                                                      Delimiter="/"):
            folders += [p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", ())]
    found = []
    for slot in folders:
        try:
            if slot and s3store.exists(client, layout.bucket, layout.privacy_rules(slot)):
                found.append(slot)
        except LayoutError:  # a folder that is not a slot's name
            continue
    return found


def resolve_privacy(client: Any, layout: Layout, slot: str, given: Rules | None = None,
                    key: PiiKey | None = None, *, write: bool = True) -> SlotPrivacy:
    """The rules a job of ``slot`` applies: the store's document; ``given`` rules are
    written as it when there is none (``write``), else must equal it. The key (``key``,
    else :data:`~airflow_pgcdc.typemap.privacy.KEY_ENV`) is checked against the document's
    fingerprint when a rule hashes."""
    where = f"s3://{layout.bucket}/{layout.privacy_rules(slot)}"
    stored = load_privacy(client, layout, slot)
    key = key or PiiKey.from_env()
    if given:
        wanted = SlotPrivacy({k: dict(v) for k, v in given.items() if v})
        if any(r.action == "hash" for cols in wanted.rules.values() for r in cols.values()):
            if key is None:
                raise PiiKeyMissing("a hash rule needs a key", hint=f"set {KEY_ENV} (or the operator's pii_key_conn_id)")
            wanted = SlotPrivacy(wanted.rules, key.fingerprint)
        if stored is None and write:
            save_privacy(client, layout, slot, wanted)
            stored = load_privacy(client, layout, slot)
        if stored is not None and stored.rules != wanted.rules:
            raise PiiRulesChanged(
                f"slot {slot}: the column rules given ({_text(wanted)}) differ from the ones its data was "
                f"written with ({_text(stored)}, {where})",
                hint="give the same rules, or none (the store's apply); new rules need a new slot and snapshot",
            )
        if stored is None:
            stored = wanted
    if stored is None:
        return SlotPrivacy()
    if stored.hashes:
        if key is None:
            raise PiiKeyMissing(f"slot {slot} hashes columns ({_text(stored)}) and no key was given ({KEY_ENV} is not set)",
                                hint=f"set {KEY_ENV} (or the operator's pii_key_conn_id) to the key it was first run with")
        if stored.key_fingerprint and key.fingerprint != stored.key_fingerprint:
            raise PiiKeyMismatch(f"slot {slot}: the hash key given is not the one its columns were hashed with "
                                 f"(fingerprint {key.fingerprint}, the store's {stored.key_fingerprint})",
                                 hint=f"set {KEY_ENV} to the slot's key")
    return SlotPrivacy(stored.rules, stored.key_fingerprint, key if stored.hashes else None, stored.ids)


def _text(p: SlotPrivacy) -> str:
    return "; ".join(f"{t}: " + ", ".join(f"{c}={r}" for c, r in cols.items()) for t, cols in p.describe().items()) or "none"
