"""Unit tests of the store contract: key layout and name encoding, manifests, S3 settings
and errors, Parquet part writers on a local sink. No server needed."""

from __future__ import annotations

import io
import json
import pickle
from datetime import UTC, datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from botocore.exceptions import ClientError
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_pgcdc.errors import PgcdcError
from airflow_pgcdc.store import layout as L
from airflow_pgcdc.store.manifest import (
    ArchiveEntry,
    BaseBackupInfo,
    ColumnEntry,
    ManifestError,
    PartEntry,
    SnapshotManifest,
    TableEntry,
    UnsupportedManifestFormat,
)
from airflow_pgcdc.store.multipart import MultipartWriter
from airflow_pgcdc.store.parquet import ParquetPartWriter, ParquetWriteError, PartSequence
from airflow_pgcdc.store.s3 import (
    AccessDenied,
    AlreadyExists,
    InvalidS3Url,
    ObjectNotFound,
    S3Location,
    S3RequestError,
    S3Settings,
    StoreError,
    _wrap,
    delta_storage_options,
    make_s3_client,
)

HOSTILE = [
    "public",
    "Orders",
    "my.schema",
    "a/b",
    "../../etc",
    "..",
    ".",
    ".hidden",
    "_hidden",
    "__",
    "100%",
    "%2E",
    "%",
    'quote"d',
    "it's",
    "a b",
    " lead",
    "tab\there",
    "new\nline",
    "\x01\x1f\x7f",
    "x=1",
    "w=000000000001",
    "back\\slash",
    "?#&*:;<>|{}[]^`~!@$+,",
    "données",
    "表",
    "emoji🦆",
    "zero\u200bwidth",
    "rtl\u202eoverride",
    "e\u0301",  # decomposed é: must stay distinct from the composed one
    "é",
    "a" * 63,
    "é" * 31,
    "part-00000.parquet",
    "_manifest.json",
]


# --------------------------------------------------------------------------- name encoding


@pytest.mark.parametrize("name", HOSTILE)
def test_encode_name_round_trips_and_is_safe(name: str) -> None:
    enc = L.encode_name(name)
    assert L.decode_name(enc) == name
    assert enc.isascii()
    assert "." not in enc and "/" not in enc and "=" not in enc
    assert not enc.startswith(("_", "."))
    assert all(ch.isalnum() or ch in "-_%" for ch in enc)


@pytest.mark.parametrize("schema", HOSTILE[:12])
@pytest.mark.parametrize("table", HOSTILE[10:])
def test_table_segment_round_trips(schema: str, table: str) -> None:
    seg = L.encode_table_segment(schema, table)
    assert seg.count(".") == 1 and "/" not in seg
    assert L.decode_table_segment(seg) == (schema, table)


def test_table_segment_examples() -> None:
    assert L.encode_table_segment("public", "orders") == "public.orders"
    assert L.encode_table_segment("my.schema", "a/b") == "my%2Eschema.a%2Fb"
    assert L.encode_table_segment("_x", "100%") == "%5Fx.100%25"
    assert L.encode_table_segment("s", "a_b") == "s.a_b"  # only a leading _ is encoded
    assert L.encode_table_segment("données", "t") == "donn%C3%A9es.t"
    assert L.encode_table_segment("a=b", "c d") == "a%3Db.c%20d"
    # schema "a.b" + table "c" and schema "a" + table "b.c" do not collide
    assert L.encode_table_segment("a.b", "c") != L.encode_table_segment("a", "b.c")
    # case matters, as in quoted PostgreSQL names
    assert L.encode_table_segment("S", "T") != L.encode_table_segment("s", "t")


@settings(max_examples=300, deadline=None)
@given(
    st.text(
        st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
        min_size=1,
        max_size=70,
    ),
    st.text(
        st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
        min_size=1,
        max_size=70,
    ),
)
def test_table_segment_round_trips_any_name(schema: str, table: str) -> None:
    seg = L.encode_table_segment(schema, table)
    assert seg.isascii() and seg.count(".") == 1 and "/" not in seg
    assert L.decode_table_segment(seg) == (schema, table)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "%41",  # 'A' must be literal
        "%2e",  # lowercase hex
        "%2",
        "%ZZ",
        "%FF",  # not UTF-8
        "%C3",  # truncated UTF-8
        "a b",  # space must be escaped
        "a.b",
        "a/b",
        "_x",  # leading _ must be escaped
        "é",  # non-ASCII must be escaped
        "%00",  # NUL cannot be a PostgreSQL name
    ],
)
def test_decode_name_refuses_non_canonical(text: str) -> None:
    with pytest.raises(L.LayoutError):
        L.decode_name(text)


@pytest.mark.parametrize("seg", ["public", "a.b.c", "", ".t", "s."])
def test_decode_table_segment_refuses_bad_segments(seg: str) -> None:
    with pytest.raises(L.LayoutError):
        L.decode_table_segment(seg)


@pytest.mark.parametrize("bad", ["", "a\x00b", "\ud800"])
def test_encode_name_refuses_impossible_names(bad: str) -> None:
    with pytest.raises(L.LayoutError):
        L.encode_name(bad)


# --------------------------------------------------------------------------- layout


def test_layout_keys() -> None:
    lay = L.Layout.parse("s3://bkt/some/prefix/")
    sid = "20250131T235959Z-1a2b3c4d"
    assert lay.snapshot_part("slot_1", sid, "public", "orders", 7) == (
        f"some/prefix/slot_1/snapshot/{sid}/public.orders/part-00007.parquet"
    )
    assert (
        lay.snapshot_manifest("slot_1", sid) == f"some/prefix/slot_1/snapshot/{sid}/_manifest.json"
    )
    assert lay.snapshot_prefix("slot_1", sid) == f"some/prefix/slot_1/snapshot/{sid}/"
    assert lay.snapshot_table_prefix("slot_1", sid, "a.b", "c/d") == (
        f"some/prefix/slot_1/snapshot/{sid}/a%2Eb.c%2Fd/"
    )
    assert lay.window_prefix("slot_1", 42) == "some/prefix/slot_1/changes/w=000000000042/"
    assert (
        lay.window_manifest("slot_1", 42)
        == "some/prefix/slot_1/changes/w=000000000042/_manifest.json"
    )
    assert lay.window_part("slot_1", 42, "public", "t", 3, 1) == (
        "some/prefix/slot_1/changes/w=000000000042/public.t/v0003-part-00001.parquet"
    )
    assert lay.window_messages_part("slot_1", 1, 0) == (
        "some/prefix/slot_1/changes/w=000000000001/messages/part-00000.parquet"
    )
    assert lay.basebackup_archive("b1", "base.tar.zst") == "some/prefix/basebackup/b1/base.tar.zst"
    assert lay.basebackup_archive("b1", "16385.tar") == "some/prefix/basebackup/b1/16385.tar"
    assert lay.basebackup_manifest("b1") == "some/prefix/basebackup/b1/backup_manifest"
    assert lay.basebackup_info("b1") == "some/prefix/basebackup/b1/backup.json"
    assert lay.parse_window_key("slot_1", lay.window_manifest("slot_1", 42)) == 42
    # no prefix
    assert (
        L.Layout.parse("s3://bkt").window_manifest("s", 0)
        == "s/changes/w=000000000000/_manifest.json"
    )


def test_window_folders_sort_like_numbers() -> None:
    seqs = [0, 1, 9, 10, 99, 100, 12345, 10**12 - 1]
    folders = [L.window_folder(s) for s in seqs]
    assert sorted(folders) == folders
    assert [L.parse_window_folder(f) for f in folders] == seqs
    for bad in (-1, 10**12, True, "1"):
        with pytest.raises(L.LayoutError):
            L.window_folder(bad)  # type: ignore[arg-type]
    for bad in ("w=1", "w=0000000000001", "x=000000000001"):
        with pytest.raises(L.LayoutError):
            L.parse_window_folder(bad)


def test_part_names() -> None:
    assert L.part_name(0) == "part-00000.parquet"
    assert L.part_name(99999) == "part-99999.parquet"
    assert L.part_name(3, relation_version=2) == "v0002-part-00003.parquet"
    assert L.parse_part_name("part-00012.parquet") == (None, 12)
    assert L.parse_part_name("v0002-part-00003.parquet") == (2, 3)
    for bad in (-1, 100000):
        with pytest.raises(L.LayoutError):
            L.part_name(bad)
    with pytest.raises(L.LayoutError):
        L.parse_part_name("part-1.parquet")


def test_archive_names() -> None:
    assert L.archive_name() == "base.tar"
    assert L.archive_name(None, "gzip") == "base.tar.gz"
    assert L.archive_name(16385, "lz4") == "16385.tar.lz4"
    assert L.archive_name(16385, "zstd") == "16385.tar.zst"
    with pytest.raises(L.LayoutError):
        L.archive_name(None, "brotli")
    with pytest.raises(L.LayoutError):
        L.archive_name(0)
    for bad in ("base.tar.bz2", "../base.tar", "pg_wal.tar", "0.tar", "base.tar/x"):
        with pytest.raises(L.LayoutError):
            L.validate_archive_name(bad)


@pytest.mark.parametrize("slot", ["", "UPPER", "with-dash", "a" * 64, "a/b", "a.b"])
def test_bad_slot_names(slot: str) -> None:
    with pytest.raises(L.LayoutError):
        L.Layout.parse("s3://bkt/p").changes_prefix(slot)


@pytest.mark.parametrize("run_id", ["", "..", "a/b", "-x", ".x", "a..b", "a b", "x" * 129, "é"])
def test_bad_run_ids(run_id: str) -> None:
    lay = L.Layout.parse("s3://bkt/p")
    with pytest.raises(L.LayoutError):
        lay.snapshot_prefix("slot", run_id)
    with pytest.raises(L.LayoutError):
        lay.basebackup_prefix(run_id)


def test_new_run_id_is_valid_and_sorts_by_time() -> None:
    a = L.new_run_id(datetime(2025, 1, 31, 23, 59, 59, tzinfo=UTC))
    b = L.new_run_id(datetime(2025, 2, 1, tzinfo=UTC))
    assert a.startswith("20250131T235959Z-") and L.validate_run_id(a) == a
    assert a < b


def test_key_too_long_is_refused() -> None:
    lay = L.Layout.parse("s3://bkt/" + "p" * 900)
    with pytest.raises(L.LayoutError, match="1024"):
        lay.snapshot_part("slot", "sid", "é" * 31, "é" * 31, 0)


# --------------------------------------------------------------------------- locations and settings


@pytest.mark.parametrize(
    "url, bucket, prefix",
    [
        ("s3://bucket", "bucket", ""),
        ("s3://bucket/", "bucket", ""),
        ("s3://my-bucket.1/a/b/c/", "my-bucket.1", "a/b/c"),
        ("s3://bkt/données/x y", "bkt", "données/x y"),
    ],
)
def test_s3_location_parse(url: str, bucket: str, prefix: str) -> None:
    loc = S3Location.parse(url)
    assert (loc.bucket, loc.prefix) == (bucket, prefix)
    assert S3Location.parse(loc.url) == loc


@pytest.mark.parametrize(
    "url, match",
    [
        ("bucket/prefix", "not an S3 URL"),
        ("s3a://bucket/prefix", "not an S3 URL"),
        ("https://bucket/x", "not an S3 URL"),
        ("s3://", "needs a bucket"),
        ("s3:///prefix", "needs a bucket"),
        ("s3://Bucket/x", "invalid bucket"),
        ("s3://b/x", "invalid bucket"),
        ("s3://bu_cket/x", "invalid bucket"),
        ("s3://-bucket/x", "invalid bucket"),
        ("s3://a..b/x", "invalid bucket"),
        ("s3://192.168.1.1/x", "IP address"),
        ("s3://key:secret@bucket/x", "credentials"),
        ("s3://bucket:9000/x", "credentials"),
        ("s3://bucket/a//b", "not allowed"),
        ("s3://bucket/a/../b", "not allowed"),
        ("s3://bucket/a/./b", "not allowed"),
        ("s3://bucket/a?versionId=1", "query"),
        ("s3://bucket/a#frag", "query"),
        ("s3://bucket/a\nb", "control"),
        ("s3://bucket/" + "x" * 1025, "1024"),
    ],
)
def test_s3_location_parse_refuses(url: str, match: str) -> None:
    with pytest.raises(InvalidS3Url, match=match) as info:
        S3Location.parse(url)
    assert isinstance(info.value, PgcdcError) and isinstance(info.value, ValueError)
    assert "secret" not in str(info.value)


def test_s3_location_keys() -> None:
    loc = S3Location.parse("s3://bkt/pre")
    assert loc.key("a", "b") == "pre/a/b"
    assert loc.child("x").url == "s3://bkt/pre/x"
    assert S3Location("bkt").key("k") == "k"
    with pytest.raises(InvalidS3Url):
        loc.key("")


SECRET = "sEcReT/KeY+ThAt+MuSt+NeVeR+LeAk"


def test_settings_from_env_follow_boto3_conventions() -> None:
    env = {
        "AWS_ENDPOINT_URL": "http://generic:1",
        "AWS_ENDPOINT_URL_S3": "http://s3specific:2",
        "AWS_ACCESS_KEY_ID": "AKID",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "eu-west-3",
        "AWS_MAX_ATTEMPTS": "7",
    }
    s = S3Settings.from_env(env)
    assert s.endpoint_url == "http://s3specific:2"  # service-specific wins
    assert s.region == "eu-west-3" and s.max_attempts == 7
    assert s.effective_addressing_style == "path" and s.allow_http
    assert SECRET not in repr(s)
    assert S3Settings.from_env({**env, "AWS_REGION": "us-west-2"}).region == "us-west-2"
    assert S3Settings.from_env(
        {k: v for k, v in env.items() if k != "AWS_ENDPOINT_URL_S3"}
    ).endpoint_url == ("http://generic:1")
    ignored = S3Settings.from_env({**env, "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true"})
    assert ignored.endpoint_url is None and ignored.effective_addressing_style == "auto"
    assert S3Settings.from_env(env, region="x-1").region == "x-1"


def test_settings_refuse_bad_values_without_leaking() -> None:
    with pytest.raises(StoreError, match="both"):
        S3Settings(access_key_id="AKID")
    with pytest.raises(StoreError) as info:
        S3Settings(endpoint_url=f"http://user:{SECRET}@host:9000")
    assert SECRET not in str(info.value)
    with pytest.raises(StoreError):
        S3Settings(endpoint_url="ftp://host")
    with pytest.raises(StoreError):
        S3Settings(addressing_style="sideways")
    with pytest.raises(StoreError):
        S3Settings.from_env({"AWS_MAX_ATTEMPTS": "many"})


def test_make_s3_client_uses_settings() -> None:
    s = S3Settings(
        endpoint_url="http://127.0.0.1:9",
        access_key_id="AKID",
        secret_access_key=SECRET,
        region="eu-central-1",
        max_attempts=4,
    )
    client = make_s3_client(s)
    assert client.meta.endpoint_url == "http://127.0.0.1:9"
    assert client.meta.region_name == "eu-central-1"
    assert client.meta.config.s3["addressing_style"] == "path"
    assert (
        client.meta.config.retries["total_max_attempts"] == 4
    )  # AWS_MAX_ATTEMPTS counts the first try
    assert client.meta.config.connect_timeout == s.connect_timeout
    aws = make_s3_client(S3Settings(region="us-east-1", access_key_id="A", secret_access_key="B"))
    assert "amazonaws.com" in aws.meta.endpoint_url


def test_delta_storage_options() -> None:
    s = S3Settings(
        endpoint_url="http://127.0.0.1:9",
        access_key_id="AKID",
        secret_access_key=SECRET,
        region="r-1",
    )
    opts = delta_storage_options(s)
    assert opts["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9"
    assert opts["AWS_ALLOW_HTTP"] == "true"
    assert opts["AWS_ACCESS_KEY_ID"] == "AKID" and opts["AWS_SECRET_ACCESS_KEY"] == SECRET
    assert opts["AWS_REGION"] == "r-1"
    assert opts["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] == "false"
    assert "AWS_S3_ALLOW_UNSAFE_RENAME" not in opts and "AWS_S3_LOCKING_PROVIDER" not in opts
    tls = delta_storage_options(s.with_(endpoint_url="https://s3.example"))
    assert "AWS_ALLOW_HTTP" not in tls


# --------------------------------------------------------------------------- errors


def _client_error(code: str, status: int, op: str = "PutObject") -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": f"msg {code}"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        op,
    )


@pytest.mark.parametrize(
    "code, status, cls",
    [
        ("PreconditionFailed", 412, AlreadyExists),
        ("NoSuchKey", 404, ObjectNotFound),
        ("404", 404, ObjectNotFound),
        ("NoSuchBucket", 404, ObjectNotFound),
        ("AccessDenied", 403, AccessDenied),
        ("SlowDown", 503, S3RequestError),
    ],
)
def test_client_errors_become_typed(code: str, status: int, cls: type) -> None:
    err = _wrap(_client_error(code, status), operation="PutObject", bucket="bkt", key="a/b")
    assert type(err) is cls
    assert isinstance(err, StoreError) and isinstance(err, PgcdcError)
    assert "s3://bkt/a/b" in str(err) and "PutObject" in str(err)
    assert err.code and err.bucket == "bkt" and err.key == "a/b"
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is cls and str(copy) == str(err) and copy.code == err.code


def test_head_404_names_missing_key() -> None:
    err = _wrap(
        _client_error("404", 404, "HeadObject"), operation="HeadObject", bucket="bkt", key="k"
    )
    assert err.code == "NoSuchKey"


# --------------------------------------------------------------------------- manifests


def _t(minutes: int = 0) -> datetime:
    return datetime(2025, 3, 1, 12, 0, tzinfo=UTC) + timedelta(minutes=minutes)


def _table(schema: str = "public", table: str = "orders", *, key: bool = True) -> TableEntry:
    cols = [
        ColumnEntry("id", "bigint", nullable=False, key=key, type_oid=20),
        ColumnEntry("amount", "numeric", typmod=(12 << 16 | 2) + 4),
        ColumnEntry("tags", "text[]"),
    ]
    return TableEntry(
        schema,
        table,
        cols,
        key_columns=["id"] if key else [],
        parts=[
            PartEntry(f"{L.encode_table_segment(schema, table)}/part-00000.parquet", 1000, 12345),
            PartEntry(f"{L.encode_table_segment(schema, table)}/part-00001.parquet", 10, 999),
        ],
        row_filter="amount > 0" if key else None,
        column_list=["id", "amount"] if key else None,
    )


def _manifest(**changes) -> SnapshotManifest:
    values = dict(
        slot="slot_1",
        snapshot_id="20250301T120000Z-00ff00ff",
        snapshot_name="00000003-0000001B-1",
        consistent_point="16/B374D848",
        system_id="7318273981273981273",
        timeline=1,
        started_at=_t(),
        finished_at=_t(5),
        tables=[_table(), _table('we"ird.sch', "a/b", key=False)],
    )
    values.update(changes)
    return SnapshotManifest(**values)


def test_snapshot_manifest_round_trip() -> None:
    m = _manifest()
    text = m.to_json()
    doc = json.loads(text)
    assert doc["format"] == 1 and doc["kind"] == "snapshot"
    assert doc["consistent_point"] == "16/B374D848"
    assert doc["rows"] == 2020 and doc["bytes"] == 2 * 13344
    t0 = doc["tables"][0]
    assert t0["columns"][1]["typmod"] == (12 << 16 | 2) + 4 and "typmod" not in t0["columns"][0]
    assert t0["has_key"] is True and t0["key_columns"] == ["id"] and t0["rows"] == 1010
    assert doc["tables"][1]["has_key"] is False and "row_filter" not in doc["tables"][1]
    back = SnapshotManifest.from_json(text, key="k/_manifest.json")
    assert back == m and back.to_json() == text
    assert [t.qualified_name for t in back.tables_without_key] == ['we"ird.sch.a/b']
    assert back.table("public", "orders").parts[1].rows == 10
    assert SnapshotManifest.from_json(text.encode()) == m
    assert SnapshotManifest.from_json(doc) == m


def test_snapshot_manifest_normalizes_values() -> None:
    m = _manifest(consistent_point="16/b374d848", system_id=7318273981273981273)
    assert m.consistent_point == "16/B374D848" and m.system_id == "7318273981273981273"


def test_manifest_keeps_unknown_fields() -> None:
    doc = json.loads(_manifest().to_json())
    doc["future_field"] = {"x": 1}
    doc["tables"][0]["columns"][0]["collation"] = "C"
    doc["tables"][0]["parts"][0]["sha256"] = "abc"
    m = SnapshotManifest.from_json(json.dumps(doc))
    assert json.loads(m.to_json()) == doc


KEY = "pre/slot_1/snapshot/sid/_manifest.json"


def _mutated(mutate) -> str:
    doc = json.loads(_manifest().to_json())
    mutate(doc)
    return json.dumps(doc)


@pytest.mark.parametrize(
    "mutate, error, match",
    [
        (lambda d: d.pop("format"), UnsupportedManifestFormat, 'no "format"'),
        (lambda d: d.update(format=2), UnsupportedManifestFormat, "format 2 is not supported"),
        (lambda d: d.update(format="1"), UnsupportedManifestFormat, "not supported"),
        (lambda d: d.update(format=True), UnsupportedManifestFormat, "not supported"),
        (lambda d: d.update(kind="window"), ManifestError, "expected a 'snapshot'"),
        (lambda d: d.pop("consistent_point"), ManifestError, "consistent_point: missing"),
        (
            lambda d: d.update(consistent_point="16-B3"),
            ManifestError,
            "consistent_point: not an LSN",
        ),
        (lambda d: d.update(timeline=0), ManifestError, "timeline: must be >= 1"),
        (lambda d: d.update(timeline="1"), ManifestError, "timeline: must be an integer"),
        (lambda d: d.update(system_id="-5"), ManifestError, "system_id"),
        (lambda d: d.update(started_at="2025-03-01T12:00:00"), ManifestError, "UTC offset"),
        (lambda d: d.update(finished_at="yesterday"), ManifestError, "finished_at"),
        (lambda d: d.update(started_at="2025-03-02T12:00:00+00:00"), ManifestError, "before"),
        (lambda d: d.update(tables={}), ManifestError, "tables: must be a list"),
        (lambda d: d.update(rows=1), ManifestError, "rows: 1 differs"),
        (lambda d: d["tables"][0].pop("has_key"), ManifestError, r"tables\[0\].has_key: missing"),
        (
            lambda d: d["tables"][1]["columns"][0].pop("pg_type"),
            ManifestError,
            r"tables\[1\].columns\[0\].pg_type",
        ),
        (
            lambda d: d["tables"][0]["columns"][0].update(nullable="no"),
            ManifestError,
            "true or false",
        ),
        (
            lambda d: d["tables"][0]["parts"][1].update(rows=-1),
            ManifestError,
            r"parts\[1\].rows: must be >= 0",
        ),
        (
            lambda d: d["tables"][0]["parts"][1].update(path="../x"),
            ManifestError,
            r"parts\[1\].path",
        ),
        (lambda d: d["tables"][0]["parts"][1].update(path="/abs"), ManifestError, "relative"),
        (lambda d: d["tables"][0]["parts"][1].update(path="s3://b/k"), ManifestError, "relative"),
        (lambda d: d["tables"][0].update(rows=5), ManifestError, r"tables\[0\].*rows 5 differ"),
        (lambda d: d["tables"][0].update(has_key=False), ManifestError, "has_key"),
        (
            lambda d: d["tables"][0].update(key_columns=["nope"]),
            ManifestError,
            "not among its columns",
        ),
        (lambda d: d["tables"][0]["columns"][2].update(key=True), ManifestError, "flagged key"),
        (lambda d: d["tables"][0].update(column_list=["ghost"]), ManifestError, "column_list"),
        (lambda d: d["tables"].append(d["tables"][0]), ManifestError, "listed twice"),
        (
            lambda d: d["tables"][0]["columns"].append(d["tables"][0]["columns"][0]),
            ManifestError,
            "duplicate",
        ),
    ],
)
def test_snapshot_manifest_validation(mutate, error, match) -> None:
    with pytest.raises(error, match=match) as info:
        SnapshotManifest.from_json(_mutated(mutate), key=KEY)
    assert info.value.key == KEY and KEY in str(info.value)
    assert isinstance(info.value, StoreError)


@pytest.mark.parametrize("text", ["", "not json", "[1, 2]", '"x"', "{"])
def test_manifest_refuses_non_objects(text: str) -> None:
    with pytest.raises(ManifestError) as info:
        SnapshotManifest.from_json(text, key=KEY)
    assert info.value.key == KEY


def test_manifest_constructor_validates() -> None:
    with pytest.raises(ManifestError, match="UTC offset"):
        _manifest(started_at=datetime(2025, 1, 1))
    with pytest.raises(ManifestError, match="not an LSN"):
        _manifest(consistent_point="x")
    with pytest.raises(ManifestError, match="no columns"):
        TableEntry("s", "t", [])
    # non-UTC offsets are fine and kept
    m = _manifest(started_at=_t().astimezone(timezone(timedelta(hours=2))))
    assert SnapshotManifest.from_json(m.to_json()) == m


def _backup(**changes) -> BaseBackupInfo:
    values = dict(
        backup_id="20250301T120000Z-abcdef01",
        label="nightly",
        start_lsn="0/2000028",
        end_lsn="0/2000100",
        timeline=1,
        compression="zstd",
        manifest=True,
        system_id="7318273981273981273",
        archives=[
            ArchiveEntry("base.tar.zst", 123456),
            ArchiveEntry(
                "16385.tar.zst", 789, tablespace_oid=16385, tablespace_location="/srv/ts1"
            ),
        ],
        started_at=_t(),
        finished_at=_t(1),
    )
    values.update(changes)
    return BaseBackupInfo(**values)


def test_basebackup_info_round_trip() -> None:
    info = _backup()
    doc = json.loads(info.to_json())
    assert doc["format"] == 1 and doc["kind"] == "basebackup" and doc["bytes"] == 124245
    assert doc["archives"][0] == {"name": "base.tar.zst", "bytes": 123456}
    back = BaseBackupInfo.from_json(info.to_json(), key="k")
    assert back == info and back.to_json() == info.to_json()
    plain = _backup(
        compression=None, manifest=False, archives=[ArchiveEntry("base.tar", 1)], label=""
    )
    assert BaseBackupInfo.from_json(plain.to_json()) == plain


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda d: d.pop("format"), "format"),
        (lambda d: d.update(kind="snapshot"), "expected a 'basebackup'"),
        (lambda d: d.pop("compression"), "compression: missing"),
        (lambda d: d.update(compression="brotli"), "compression"),
        (lambda d: d.update(end_lsn="0/1000000"), "before start_lsn"),
        (lambda d: d.pop("start_lsn"), "start_lsn: missing"),
        (lambda d: d.update(manifest="yes"), "manifest: must be true or false"),
        (lambda d: d["archives"].pop(0), "exactly one base.tar"),
        (lambda d: d["archives"][1].update(name="16385.tar.gz"), "do not match compression"),
        (lambda d: d["archives"][1].update(tablespace_oid=1), "not named after tablespace"),
        (lambda d: d["archives"][1].pop("tablespace_oid"), "does not match its name"),
        (lambda d: d["archives"][0].update(name="../base.tar.zst"), "archive name"),
        (lambda d: d.update(bytes=1), "bytes: 1 differs"),
    ],
)
def test_basebackup_info_validation(mutate, match) -> None:
    doc = json.loads(_backup().to_json())
    mutate(doc)
    with pytest.raises(ManifestError, match=match) as info:
        BaseBackupInfo.from_json(json.dumps(doc), key="pre/basebackup/b/backup.json")
    assert info.value.key == "pre/basebackup/b/backup.json"


# --------------------------------------------------------------------------- parquet parts (local sink)


class _Sink(io.BytesIO):
    """A local sink with MultipartWriter's close/abort semantics."""

    def __init__(self) -> None:
        super().__init__()
        self.state = "open"

    def close(self) -> None:
        self.state = "closed"

    def abort(self) -> None:
        self.state = "aborted"


SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("price", pa.decimal128(12, 2))])


def _batch(start: int, n: int) -> pa.RecordBatch:
    import decimal

    return pa.record_batch(
        [
            pa.array(range(start, start + n), pa.int64()),
            pa.array([None if i % 7 == 0 else f"name {i}" for i in range(start, start + n)]),
            pa.array(
                [decimal.Decimal(i) / 100 for i in range(start, start + n)], pa.decimal128(12, 2)
            ),
        ],
        schema=SCHEMA,
    )


def test_part_writer_gathers_small_batches_into_row_groups() -> None:
    sink = _Sink()
    w = ParquetPartWriter(sink, SCHEMA, name="x/part-00000.parquet", row_group_rows=1000)
    for i in range(25):
        w.write_batch(_batch(i * 100, 100))
    info = w.close()
    assert sink.state == "closed"
    assert (info.rows, info.row_groups, info.bytes) == (2500, 3, len(sink.getvalue()))
    f = pq.ParquetFile(io.BytesIO(sink.getvalue()))
    assert [f.metadata.row_group(i).num_rows for i in range(3)] == [1000, 1000, 500]
    assert f.metadata.row_group(0).column(0).compression == "ZSTD"
    assert f.read().equals(pa.Table.from_batches([_batch(0, 2500)]))
    assert info.to_dict("x/") == {"path": "part-00000.parquet", "rows": 2500, "bytes": info.bytes}


def test_part_writer_schema_mismatch_aborts_the_sink() -> None:
    sink = _Sink()
    w = ParquetPartWriter(sink, SCHEMA)
    w.write_batch(_batch(0, 10))
    other = pa.record_batch([pa.array([1])], names=["id"])
    with pytest.raises(ParquetWriteError, match="schema"):
        w.write_batch(other)
    assert sink.state == "aborted" and w.closed
    with pytest.raises(ParquetWriteError):
        w.write_batch(_batch(0, 1))


def test_part_writer_context_manager_aborts_on_error() -> None:
    sink = _Sink()
    with pytest.raises(RuntimeError), ParquetPartWriter(sink, SCHEMA) as w:
        w.write_batch(_batch(0, 10))
        raise RuntimeError("boom")
    assert sink.state == "aborted"


def test_part_sequence_rolls_over_by_rows() -> None:
    sinks: dict[str, _Sink] = {}

    def open_sink(key: str) -> _Sink:
        sinks[key] = _Sink()
        return sinks[key]

    seq = PartSequence(SCHEMA, lambda n: f"t/{L.part_name(n)}", open_sink=open_sink, max_rows=1000)
    for i in range(7):
        seq.write_batch(_batch(i * 350, 350))
    assert seq.rows == 2450
    parts = seq.close()
    assert [p.key for p in parts] == [
        "t/part-00000.parquet",
        "t/part-00001.parquet",
        "t/part-00002.parquet",
    ]
    assert [p.rows for p in parts] == [1000, 1000, 450]
    assert all(s.state == "closed" for s in sinks.values())
    table = pa.concat_tables(pq.read_table(io.BytesIO(sinks[p.key].getvalue())) for p in parts)
    assert table.equals(pa.Table.from_batches([_batch(0, 2450)]))
    assert seq.bytes == sum(p.bytes for p in parts)


def test_part_sequence_rolls_over_by_bytes() -> None:
    sinks: dict[str, _Sink] = {}

    def open_sink(key: str) -> _Sink:
        sinks[key] = _Sink()
        return sinks[key]

    seq = PartSequence(SCHEMA, open_sink=open_sink, target_bytes=20_000, row_group_rows=1000)
    for i in range(20):
        seq.write_batch(_batch(i * 1000, 1000))
    parts = seq.close()
    assert len(parts) > 1 and sum(p.rows for p in parts) == 20_000
    assert all(p.bytes >= 20_000 for p in parts[:-1])
    assert [p.number for p in parts] == list(range(len(parts)))


def test_part_sequence_empty_writes_one_empty_part() -> None:
    sinks: dict[str, _Sink] = {}

    def open_sink(key: str) -> _Sink:
        sinks[key] = _Sink()
        return sinks[key]

    parts = PartSequence(SCHEMA, open_sink=open_sink).close()
    assert [(p.key, p.rows) for p in parts] == [("part-00000.parquet", 0)]
    assert pq.read_table(io.BytesIO(sinks["part-00000.parquet"].getvalue())).schema.equals(SCHEMA)
    assert PartSequence(SCHEMA, open_sink=open_sink, write_empty=False).close() == []


def test_part_sequence_abort_aborts_open_part() -> None:
    sinks: list[_Sink] = []

    def open_sink(key: str) -> _Sink:
        sinks.append(_Sink())
        return sinks[-1]

    with pytest.raises(KeyError), PartSequence(SCHEMA, open_sink=open_sink, max_rows=100) as seq:
        seq.write_batch(_batch(0, 150))
        raise KeyError("boom")
    assert [s.state for s in sinks] == ["closed", "aborted"]


def test_multipart_writer_argument_checks() -> None:
    with pytest.raises(ValueError, match="part_size"):
        MultipartWriter(None, "bkt", "k", part_size=1024)
    with pytest.raises(InvalidS3Url):
        MultipartWriter(None, "bkt", "")
    with pytest.raises(InvalidS3Url):
        MultipartWriter(None, "BAD", "k")
