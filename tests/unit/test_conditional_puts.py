"""store.s3.check_conditional_puts: a server that ignores If-None-Match is refused before
anything is committed (older MinIO and other S3-compatible stores accept the header and
overwrite). The positive path runs against the real S3 server in test_store_s3."""

from __future__ import annotations

import types

import pytest
from botocore.exceptions import ClientError

from airflow_pgcdc.store import s3 as s3store


class _Server:
    """A bucket's objects behind put_object/delete_object; ``enforce`` answers 412 to an
    If-None-Match put of an existing key, as S3 does, else overwrites."""

    def __init__(self, enforce: bool) -> None:
        self.enforce = enforce
        self.objects: dict[str, bytes] = {}
        self.meta = types.SimpleNamespace(endpoint_url=f"http://fake-{id(self)}")

    def put_object(self, Bucket, Key, Body, IfNoneMatch=None, **kw):  # noqa: N803 - boto3's names
        if IfNoneMatch == "*" and Key in self.objects and self.enforce:
            raise ClientError({"Error": {"Code": "PreconditionFailed", "Message": "At least one of the "
                                         "pre-conditions you specified did not hold"},
                               "ResponseMetadata": {"HTTPStatusCode": 412}}, "PutObject")
        self.objects[Key] = bytes(Body)
        return {}

    def delete_object(self, Bucket, Key):  # noqa: N803
        self.objects.pop(Key, None)


def test_a_server_that_overwrites_is_refused_and_nothing_is_committed():
    server = _Server(enforce=False)
    with pytest.raises(s3store.ConditionalPutsIgnored) as e:
        s3store.commit_if_absent(server, "bkt", "cdc/slot/changes/w=000000000000/_manifest.json", b"{}")
    assert "If-None-Match" in str(e.value) and "412" in str(e.value) and e.value.hint
    assert server.objects == {}  # neither the manifest nor the probe
    with pytest.raises(s3store.ConditionalPutsIgnored):  # and again: a failure is not remembered as a pass
        s3store.check_conditional_puts(server, "bkt")


def test_a_server_that_enforces_is_probed_once():
    server = _Server(enforce=True)
    assert s3store.commit_if_absent(server, "bkt", "k/_manifest.json", b"{}")
    assert list(server.objects) == ["k/_manifest.json"]
    calls = []
    server.put_object = lambda **kw: calls.append(kw)  # probed already: not asked again
    s3store.check_conditional_puts(server, "bkt")
    assert calls == []
