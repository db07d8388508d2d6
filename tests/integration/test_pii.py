"""Columns kept out of the lake (``--pii SCHEMA.TABLE:COLUMN=RULE``): excluded, hashed
(HMAC-SHA256 of the value's PostgreSQL text under ``PGCDC_PII_KEY``) or masked by the snapshot
and the drain before anything is written, so that neither the store nor Delta ever holds a raw
value; verify compares PostgreSQL's rows transformed the same way.

Checked end to end on PostgreSQL, SeaweedFS and Spark's driver (the delta-rs engine): the
snapshot's rules written to the store and applied by a drain that is not given them; a hashed
primary key through an update that changes it and a delete; a keyless ``REPLICA IDENTITY FULL``
table with an excluded column; a masked column renamed (the merge refuses it, the resync's copy
keeps its rule by its attnum); an excluded column dropped and added again with a default; every object under the store and the lake read back (bytes, and
every value of every Parquet file) for the raw values; the hashes equal to pgcrypto's ``hmac``;
and the refusals: other rules, another key, no key, a typo, a mask on a number, an excluded key
column, a base backup into the store."""

from __future__ import annotations

import hashlib
import hmac
import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lake_helpers import drain, parquet_files, sql

from airflow_pgcdc.lake.tables import delta_table_url
from airflow_pgcdc.merge.errors import TablesFailed
from airflow_pgcdc.merge.job import merge_slot
from airflow_pgcdc.snapshot.basebackup import base_backup_to_s3
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.snapshot.resync import resync_tables
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.store.layout import Layout
from airflow_pgcdc.store.privacy import PiiRulesChanged, resolve_privacy
from airflow_pgcdc.typemap.privacy import KEY_ENV, PiiKeyMismatch, PiiKeyMissing, PiiRuleError
from airflow_pgcdc.verify import verify_table

KEY = "test-pii-key-0123456789abcdef"
RULES = {
    "public.users": {"email": "hash", "ssn": "exclude", "phone": "mask:4", "age": "hash"},
    "public.accounts": {"email": "hash"},
    "public.events": {"payload": "exclude"},
}
# raw values that must be found nowhere under the store or the lake
SECRETS = ["00009c3e00009c3f",  # inside the TOASTed values (see below)
           "alice@example.com", "bob@example.com", "carol@example.com", "SSN-111-22-3333", "SSN-444-55-6666",
           "SSN-777-88-9999", "+1-555-0100-7788", "+1-555-0199-4321", "PAYLOAD-SECRET-1", "PAYLOAD-SECRET-2", "PAYLOAD-SECRET-3",
           "dave@example.com", "SSN-DEFAULT-0000"]


def _h(text: str) -> str:
    return hmac.new(KEY.encode(), text.encode(), hashlib.sha256).hexdigest()


def _table(lake: str, name: str) -> pa.Table:
    from deltalake import DeltaTable

    return DeltaTable(delta_table_url(lake, "public", name), storage_options=s3store.delta_storage_options()
                      ).to_pyarrow_table()


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, bytes):
        return [value.decode("utf-8", "replace")]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _scan(client, bucket: str) -> tuple[int, list[str]]:
    """Every object of the bucket: its bytes searched for each raw value, and every value of
    a Parquet file (compressed pages hide bytes) read back and searched too."""
    found, objects = [], 0
    for key in s3store.list_keys(client, bucket, ""):
        objects += 1
        data = s3store.get_bytes(client, bucket, key)
        texts = [data.decode("utf-8", "replace")]
        for part in parquet_files(data):
            texts += [s for row in pq.read_table(io.BytesIO(part)).to_pylist() for s in _strings(row)]
            md = pq.read_metadata(io.BytesIO(part))
            for rg in range(md.num_row_groups):  # min/max statistics
                for c in range(md.num_columns):
                    st = md.row_group(rg).column(c).statistics
                    if st is not None and st.has_min_max:
                        texts += _strings(st.min) + _strings(st.max)
        for secret in SECRETS:
            if any(secret in t for t in texts):
                found.append(f"{secret} in {key}")
    return objects, found


@pytest.mark.slow
# PostgreSQL 15 (Debian's, with contrib): pgcrypto checks the hashes; the embedded 18 has no
# contrib, and the rules are applied by our own decoders, the same for either server
@pytest.mark.parametrize("pg_server", ["pg15"], indirect=True)
def test_pii_never_reaches_the_store_or_the_lake(fresh_db, slot_name, store, spark, s3_bucket, monkeypatch):
    client, src, lake = store
    db, slot = fresh_db, slot_name()
    monkeypatch.setenv(KEY_ENV, KEY)
    sql(db, "CREATE TABLE users (id int PRIMARY KEY, email text, ssn text, phone text, age int, note text)")
    sql(db, "CREATE TABLE accounts (email text PRIMARY KEY, balance int)")
    sql(db, "CREATE TABLE events (id int, payload text, n int)")
    sql(db, "ALTER TABLE events REPLICA IDENTITY FULL")
    sql(db, "INSERT INTO users VALUES (1, 'alice@example.com', 'SSN-111-22-3333', '+1-555-0100-7788', 42, 'a'), "
            "(2, 'bob@example.com', 'SSN-444-55-6666', NULL, NULL, 'b')")
    sql(db, "INSERT INTO accounts VALUES ('alice@example.com', 10), ('bob@example.com', 20)")
    sql(db, "INSERT INTO events VALUES (1, 'PAYLOAD-SECRET-1', 1), (2, 'PAYLOAD-SECRET-1', 1)")
    sql(db, "CREATE PUBLICATION pub FOR TABLE users, accounts, events")

    # refused before a row is copied: a typo, a mask on a number, an excluded key column
    for bad, what in (({"public.users": {"emial": "hash"}}, "emial"), ({"public.users": {"age": "mask"}}, "mask"),
                      ({"public.accounts": {"email": "exclude"}}, "cannot be excluded"),
                      ({"public.nosuch": {"x": "hash"}}, "nosuch")):
        with pytest.raises(PiiRuleError, match=what):
            snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False,
                           pii=bad)
    assert not list(s3store.list_keys(client, s3_bucket, "cdc/" + slot + "/privacy"))

    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=2, worker_processes=True, pii=RULES)
    layout = Layout.parse(src)
    assert resolve_privacy(client, layout, slot).describe()["public.users"] == {
        "age": "hash", "email": "hash", "phone": "mask:4", "ssn": "exclude"}

    # changes, drained without being told the rules: the store's apply
    sql(db, "INSERT INTO users VALUES (3, 'carol@example.com', 'SSN-777-88-9999', '+1-555-0199-4321', 7, 'c')")
    sql(db, "UPDATE users SET email = 'dave@example.com', age = 43 WHERE id = 1")
    sql(db, "DELETE FROM users WHERE id = 2")
    sql(db, "UPDATE accounts SET email = 'carol@example.com' WHERE email = 'bob@example.com'")  # a hashed key moves
    sql(db, "UPDATE accounts SET balance = 11 WHERE email = 'alice@example.com'")
    sql(db, "INSERT INTO events VALUES (3, 'PAYLOAD-SECRET-2', 2)")
    sql(db, "DELETE FROM events WHERE id = 1")
    sql(db, "UPDATE events SET n = 5 WHERE id = 2")
    # TOASTed values of an excluded and a hashed column, unchanged by an update: the server
    # sends neither; the merge keeps what Delta holds (nothing, and the hash)
    big = "".join(f"{i:08x}" for i in range(40_000))  # 320 kB, past the TOAST threshold
    sql(db, "INSERT INTO users (id, email, ssn, note) VALUES (5, %s, %s, 'e')", ("BIG" + big, "BIG" + big))
    drain(db, src, slot, client)
    sql(db, "UPDATE users SET note = 'e2' WHERE id = 5")
    # a masked column renamed keeps its rule; a column added with a default under no rule is
    # plain, and ssn's old name keeps its rule for a column added under it again
    sql(db, "ALTER TABLE users RENAME COLUMN phone TO mobile")
    sql(db, "ALTER TABLE events RENAME COLUMN payload TO body")  # excluded under its new name too
    sql(db, "INSERT INTO events VALUES (9, 'PAYLOAD-SECRET-3', 9)")
    sql(db, "INSERT INTO users VALUES (4, 'x4@example.org', 'SSN-x', '+44-20-7946-0958', 1, 'd')")
    sql(db, "ALTER TABLE users DROP COLUMN ssn")
    sql(db, "ALTER TABLE users ADD COLUMN ssn text DEFAULT 'SSN-DEFAULT-0000'")
    sql(db, "UPDATE users SET note = 'n' WHERE id = 3")
    drain(db, src, slot, client)
    # the merge refuses a renamed column (ColumnIdentityChanged) until a resync: the resync
    # applies the rules too, the renamed column's by its attnum
    with pytest.raises(TablesFailed, match="renamed") as failed:
        merge_slot(spark, store=src, slot=slot, delta=lake, engine="delta-rs")
    assert [t.table for t in failed.value.result.tables if t.action == "failed"] == ["public.users"]
    resync_tables(db, src, slot=slot, publications="pub", tables=["public.users"], s3=client, workers=1,
                  worker_processes=False)
    result = merge_slot(spark, store=src, slot=slot, delta=lake, engine="delta-rs")
    assert not result.failed, result

    users = {r["id"]: r for r in _table(lake, "users").to_pylist()}
    assert set(users) == {1, 3, 4, 5}
    assert users[5]["email"] == _h("BIG" + big) and users[5]["note"] == "e2"
    assert users[1]["email"] == _h("dave@example.com") and users[1]["age"] == _h("43")
    assert users[3]["email"] == _h("carol@example.com") and users[3]["age"] == _h("7")
    assert users[3]["mobile"] == "************4321" and users[4]["mobile"] == "************0958"
    assert "ssn" not in users[3] or users[3]["ssn"] is None  # excluded: never a value
    assert "phone" not in users[4] or users[4]["phone"] is None
    accounts = {r["email"]: r["balance"] for r in _table(lake, "accounts").to_pylist()}
    assert accounts == {_h("alice@example.com"): 11, _h("carol@example.com"): 20}
    events = _table(lake, "events")
    assert {"payload", "body"}.isdisjoint(events.column_names)
    assert sorted(events.column("id").to_pylist()) == [2, 3, 9]

    # the lake's hashes are pgcrypto's: a user finds a row by its value with SQL alone
    sql(db, "CREATE EXTENSION IF NOT EXISTS pgcrypto")
    (row,) = sql(db, "SELECT encode(hmac(email, %s, 'sha256'), 'hex'), encode(hmac(age::text, %s, 'sha256'), "
                     "'hex') FROM users WHERE id = 1", (KEY, KEY))
    assert row == (users[1]["email"], users[1]["age"])

    privacy = resolve_privacy(client, layout, slot)
    for name in ("users", "accounts", "events"):
        r = verify_table(db, lake, "public", name, privacy=privacy)
        assert r.equal, (name, r.comparison)
    raw = verify_table(db, lake, "public", "accounts")  # without the rules: raw keys match nothing
    assert not raw.equal

    objects, found = _scan(client, s3_bucket)
    assert objects > 20 and not found, found
    probe = io.BytesIO()  # the scan finds a raw value a Parquet encoding splits in its bytes
    pq.write_table(pa.table({"x": [SECRETS[2][:-2] + "z", SECRETS[2]]}), probe, compression="none",
                   use_dictionary=False, column_encoding={"x": "DELTA_BYTE_ARRAY"}, write_statistics=False)
    assert SECRETS[2].encode() not in probe.getvalue()
    s3store.put_bytes(client, s3_bucket, "probe/x.parquet", probe.getvalue())
    assert _scan(client, s3_bucket)[1] == [f"{SECRETS[2]} in probe/x.parquet"]
    s3store.delete_keys(client, s3_bucket, ["probe/x.parquet"])

    # refused: other rules, another key, no key; a base backup into the store
    with pytest.raises(PiiRulesChanged, match="differ"):
        drain(db, src, slot, client, pii={"public.users": {"email": "exclude"}})
    monkeypatch.setenv(KEY_ENV, "another key")
    with pytest.raises(PiiKeyMismatch, match="fingerprint"):
        drain(db, src, slot, client)
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(PiiKeyMissing, match=KEY_ENV):
        drain(db, src, slot, client)
    with pytest.raises(PiiRuleError, match="base backup"):
        base_backup_to_s3(db, f"s3://{s3_bucket}/cdc", s3=client)
