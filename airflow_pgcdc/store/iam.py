"""The least an AWS IAM policy must allow for a pipeline: :func:`pipeline_policy`.

Every S3 call the product makes, by the store and the Delta root it reads and writes:
GetObject (and HeadObject), PutObject (and the multipart upload's calls, conditional puts
included), DeleteObject(s) (a drain's discarded attempts, the merge's staging files and old
results, upkeep's expired windows and vacuumed Delta files, each job's probe of conditional
puts), AbortMultipartUpload under the store, the Delta root and its rebuild root
(``{delta}_rebuild``), and ListBucket / ListBucketMultipartUploads on their buckets. With SSE-KMS, the key's GenerateDataKey and Decrypt. The snapshot, drain, merge
and upkeep all need the same on the store and the Delta root (each writes to both or to
one of them), so one policy covers a pipeline's role; ``tests/integration/test_s3_iam.py``
runs the pipeline under exactly this policy on the test bed's S3 server, which enforces it."""

from __future__ import annotations

from typing import Any

from airflow_pgcdc.store.s3 import S3Location

OBJECT_ACTIONS = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload")
BUCKET_ACTIONS = ("s3:ListBucket", "s3:ListBucketMultipartUploads")


def pipeline_policy(store: str, delta: str, *, kms_key_arn: str | None = None) -> dict[str, Any]:
    """An IAM policy document allowing what the pipeline with change store ``store`` and
    Delta root ``delta`` (``s3://bucket/prefix`` each) does on S3, and no more."""
    # the Delta root, and where a rebuild builds by default ({delta}_rebuild/{run})
    places = [S3Location.parse(url) for url in (store, delta, delta.rstrip("/") + "_rebuild")]
    buckets = sorted({p.bucket for p in places})
    statements: list[dict[str, Any]] = [{
        "Sid": "PgcdcObjects",
        "Effect": "Allow",
        "Action": list(OBJECT_ACTIONS),
        "Resource": sorted({f"arn:aws:s3:::{p.bucket}/{p.prefix + '/' if p.prefix else ''}*" for p in places}),
    }]
    # listing is granted on the bucket, without an s3:prefix condition: HeadBucket (which
    # tells a missing bucket from a missing key) carries no prefix, and without ListBucket
    # S3 answers 403 instead of 404 for a key that does not exist
    statements.append({"Sid": "PgcdcList", "Effect": "Allow", "Action": list(BUCKET_ACTIONS),
                       "Resource": [f"arn:aws:s3:::{bucket}" for bucket in buckets]})
    if kms_key_arn:
        statements.append({"Sid": "PgcdcKms", "Effect": "Allow", "Action": ["kms:GenerateDataKey", "kms:Decrypt"],
                           "Resource": [kms_key_arn]})
    return {"Version": "2012-10-17", "Statement": statements}
