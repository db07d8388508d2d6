"""Column rules (typemap/privacy.py, store/privacy.py): parsing, the transforms against
PostgreSQL's text of a value, the key kept out of every printout, the store document, and a
rule following its column through a rename."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import pickle

import pyarrow as pa
import pytest

from airflow_pgcdc.changes.rows import RelationVersion
from airflow_pgcdc.protocol.pgtypes import PgColumn, builtin_type
from airflow_pgcdc.store.privacy import SlotPrivacy, parse_rules
from airflow_pgcdc.typemap.map import arrow_field
from airflow_pgcdc.typemap.privacy import (
    ColumnRule,
    PiiKey,
    PiiKeyMissing,
    PiiRuleError,
    TableRules,
)

KEY = PiiKey("k3y")


def _h(text: str) -> str:
    return hmac.new(b"k3y", text.encode(), hashlib.sha256).hexdigest()


OIDS = {"bool": 16, "int4": 23, "text": 25, "date": 1082, "numeric": 1700}


def col(name: str, typ: str) -> PgColumn:
    return PgColumn(name, builtin_type(OIDS[typ]), -1, 0)


def test_rules_parse_from_the_cli_and_the_operators_forms_alike():
    cli = parse_rules(["public.users:email=hash", 'Sales."Odd:Name":ssn=exclude', "users:phone=MASK:4"])
    ops = parse_rules({"public.users": {"email": "hash", "phone": "mask:4"}, 'sales."Odd:Name"': {"ssn": "exclude"}})
    assert cli == ops == {("public", "users"): {"email": ColumnRule("hash"), "phone": ColumnRule("mask", 4)},
                          ("sales", "Odd:Name"): {"ssn": ColumnRule("exclude")}}
    for bad, what in (("public.users=hash", "SCHEMA.TABLE:COLUMN=RULE"), ("public.users:email=encrypt", "unknown"),
                      ("public.users:email=mask:x", "whole number"), ("public.users:email=hash:2", "unknown")):
        with pytest.raises(PiiRuleError, match=what):
            parse_rules([bad])
    with pytest.raises(PiiRuleError, match="two rules"):
        parse_rules(["t:c=hash", "t:c=exclude"])


@pytest.mark.parametrize(("typ", "value", "text"), [
    ("text", "alice@example.com", "alice@example.com"),
    ("int4", 42, "42"),
    ("numeric", "12.50", "12.50"),  # unconstrained numeric: its exact text
    ("date", dt.date(2024, 2, 29), "2024-02-29"),
    ("bool", True, "t"),
])
def test_a_hash_is_hmac_sha256_of_the_values_postgresql_text(typ, value, text):
    c = col("c", typ)
    arr = pa.array([value, None], arrow_field(c).type)
    out = TableRules("s.t", {"c": ColumnRule("hash")}, KEY).transform(c, arr)
    assert out.type == pa.string() and out.to_pylist() == [_h(text), None]


def test_a_mask_keeps_the_last_characters_and_only_takes_text():
    rules = TableRules("s.t", {"p": ColumnRule("mask", 4), "q": ColumnRule("mask")}, KEY)
    assert rules.transform(col("p", "text"), pa.array(["+1-555-0100", "12", None])).to_pylist() == [
        "*******0100", "12", None]
    assert rules.transform(col("q", "text"), pa.array(["abc"])).to_pylist() == ["***"]
    with pytest.raises(PiiRuleError, match="mask needs a text column"):
        TableRules("s.t", {"n": ColumnRule("mask")}, KEY).check([col("n", "int4")])


def test_key_columns_can_be_hashed_not_excluded_or_masked_and_a_hash_needs_a_key():
    cols = [col("id", "text"), col("v", "text")]
    TableRules("s.t", {"id": ColumnRule("hash")}, KEY).check(cols, ["id"])
    for rule in ("exclude", "mask"):
        with pytest.raises(PiiRuleError, match="key column"):
            TableRules("s.t", {"id": ColumnRule(rule)}, KEY).check(cols, ["id"])
    with pytest.raises(PiiKeyMissing):
        TableRules("s.t", {"v": ColumnRule("hash")}, None).check(cols)


def test_the_key_never_shows_and_crosses_processes_by_pickle():
    key = PiiKey("very-secret-value")
    assert "very-secret" not in repr(key) + str(key) + repr(TableRules("s.t", {}, key))
    assert pickle.loads(pickle.dumps(key)).fingerprint == key.fingerprint != PiiKey("other").fingerprint
    doc = SlotPrivacy({("s", "t"): {"c": ColumnRule("hash")}}, key.fingerprint, key).to_json()
    assert "very-secret" not in doc and key.fingerprint in doc


def test_a_relation_version_writes_only_what_the_rules_let_through():
    cols = (col("id", "int4"), col("email", "text"), col("ssn", "text"))
    rules = TableRules("public.u", {"email": ColumnRule("hash"), "ssn": ColumnRule("exclude")}, KEY)
    rv = RelationVersion(1, "public", "u", "f", cols, (True, True, True), privacy=rules)
    names = rv.schema_arrow.names
    assert "ssn" not in names and "_pgcdc_old_ssn" not in names and "_pgcdc_old_email" in names
    assert rv.schema_arrow.field("email").type == pa.string()
    assert rv.schema_arrow.field("email").metadata[b"pgcdc_pii"] == b"hash"
    described = rv.describe()
    assert [c["name"] for c in described["columns"]] == ["id", "email"]
    assert described["columns"][1]["pii"] == "hash" and described["old_columns"] == ["_pgcdc_old_id",
                                                                                     "_pgcdc_old_email"]


def test_a_rule_follows_its_column_through_a_rename_and_keeps_its_old_name():
    p = SlotPrivacy({("s", "t"): {"phone": ColumnRule("mask", 4)}}, ids={("s", "t"): (77, {"phone": 4})})
    assert p.rules_for("s", "t", 77, {"id": 1, "mobile": 4}).rules == {"phone": ColumnRule("mask", 4),
                                                                        "mobile": ColumnRule("mask", 4)}
    assert "mobile" not in p.rules_for("s", "t", 78, {"mobile": 4}).rules  # another table of that name
    again = SlotPrivacy.from_document(__import__("json").loads(p.to_json()), "doc")
    assert again == p and again.ids == p.ids


def test_an_operators_key_connection_is_the_jobs_key_while_it_runs_and_only_then(monkeypatch):
    import json
    import os

    from airflow_pgcdc.hooks.pgcdc import PgcdcHook
    from airflow_pgcdc.typemap.privacy import KEY_ENV

    monkeypatch.setenv("AIRFLOW_CONN_PII_KEY", json.dumps({"conn_type": "generic", "password": "from-airflow"}))
    monkeypatch.setenv("AIRFLOW_CONN_NO_PASSWORD", json.dumps({"conn_type": "generic", "host": "x"}))
    monkeypatch.setenv(KEY_ENV, "workers-own")
    hook = PgcdcHook()
    with hook.pii_key("pii_key"):
        assert PiiKey.from_env().fingerprint == PiiKey("from-airflow").fingerprint
    assert os.environ[KEY_ENV] == "workers-own"
    with hook.pii_key(None):
        assert os.environ[KEY_ENV] == "workers-own"
    with pytest.raises(PiiKeyMissing, match="no_password"), hook.pii_key("no_password"):
        pass
