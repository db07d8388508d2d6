"""The columns of a pipeline's tables as a drain saw them in the catalog at a window's end:
one fingerprint per table, so that the next drain sees DDL on a table that had no change
since (``ALTER TABLE … ADD COLUMN`` on a table then left alone, a column an inheritance
child gets from its parent): pgoutput describes a relation only before its next change.

``{prefix}/{slot}/catalog/{sha256}.json`` holds ``{"format": 1, "kind": "catalog",
"tables": [[schema, table, relation oid, fingerprint], ...]}``, named by its content (a
window whose tables did not change writes nothing new); the window manifest names it
(``catalog``). Pure store code."""

from __future__ import annotations

import hashlib
import json

from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout

__all__ = ["CATALOG_FIELD", "read_fingerprints", "write_fingerprints"]

CATALOG_FIELD = "catalog"
"""The window manifest's field naming its catalog fingerprints object (its digest)."""

Fingerprints = dict[tuple[str, str], tuple[int, str]]


def write_fingerprints(client, layout: Layout, slot: str, prints: Fingerprints) -> str:
    """Store ``{(schema, table): (oid, fingerprint)}``; returns its digest (the object's name)."""
    body = json.dumps({"format": 1, "kind": "catalog",
                       "tables": [[s, t, oid, fp] for (s, t), (oid, fp) in sorted(prints.items())]},
                      separators=(",", ":")).encode()
    digest = hashlib.sha256(body).hexdigest()
    s3store.put_if_absent(client, layout.bucket, layout.catalog_object(slot, digest), body,
                          content_type="application/json")  # there already: the same content
    return digest


def read_fingerprints(client, layout: Layout, slot: str, digest: str) -> Fingerprints:
    doc = s3store.get_json(client, layout.bucket, layout.catalog_object(slot, digest))
    if not isinstance(doc, dict) or doc.get("format") != 1 or doc.get("kind") != "catalog":
        raise s3store.StoreError("not a catalog fingerprints object (format 1)", bucket=layout.bucket,
                                 key=layout.catalog_object(slot, digest))
    return {(str(s), str(t)): (int(oid), str(fp)) for s, t, oid, fp in doc["tables"]}
