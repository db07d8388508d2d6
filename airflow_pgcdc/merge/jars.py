"""The JVM side of the merge: Delta Lake's Spark engine and Hadoop's S3A filesystem.

``--engine delta-spark`` and ``--reader s3a`` need, beside the pinned pyspark (Spark 4.2.0,
Scala 2.13, hadoop-client 3.5.0), the jars of :data:`COORDINATES` and what they depend
on. ``make setup`` fetches them with Maven (``jvm/pom.xml``) into ``jvm/jars/`` of the
source tree, where :func:`find_jars` finds them; ``PGCDC_SPARK_JARS`` overrides that (a
comma-separated list of jar paths or URLs, or ``none`` when the cluster already provides
Delta and hadoop-aws, e.g. through ``--packages`` or its own install).

S3A is configured at run time (:func:`configure_s3a`) from the same
:class:`~airflow_pgcdc.store.s3.S3Settings` as every other S3 client of the job, into the
driver's Hadoop configuration, which Spark ships to the executors with their tasks: the
secret key is never a ``--conf`` on a command line.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "COORDINATES",
    "DELTA_SESSION_CONF",
    "JARS_ENV",
    "configure_s3a",
    "delta_conf",
    "find_jars",
    "jars_dir",
    "unavailable_reason",
]

JARS_ENV = "PGCDC_SPARK_JARS"
COORDINATES = (
    "io.delta:delta-spark_4.2_2.13:4.4.0",
    "org.apache.hadoop:hadoop-aws:3.5.0",
)
"""What a cluster running pyspark 4.2.0 needs for ``--engine delta-spark`` /
``--reader s3a`` (``--packages`` resolves the rest: ``io.delta:delta-storage:4.4.0``,
the Delta kernel jars, ``software.amazon.awssdk:bundle:2.35.4``)."""

DELTA_SESSION_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
COMPLETE_STAMP = ".complete"
ERROR_FILE = "jars-error.txt"
_MARKERS = ("delta-spark_", "delta-storage-", "hadoop-aws-", "bundle-")


def jars_dir() -> Path:
    """``jvm/jars`` of the source tree this package is installed from (an editable install):
    beside this file's package, or, when the code runs from a ``--py-files`` zip, where the
    installed distribution's ``direct_url.json`` points."""
    here = Path(__file__).resolve().parents[2] / "jvm" / "jars"
    if here.is_dir():
        return here
    try:
        import importlib.metadata as md
        import json as _json
        from urllib.parse import unquote, urlparse

        for dist in md.distributions(name="airflow-pgcdc"):
            info = _json.loads(dist.read_text("direct_url.json") or "{}")
            url = urlparse(info.get("url", ""))
            if url.scheme == "file" and info.get("dir_info", {}).get("editable"):
                found = Path(unquote(url.path)) / "jvm" / "jars"
                if found.is_dir():
                    return found
    except Exception:  # metadata unreadable: no jars found here
        pass
    return here


def _from_dir(folder: Path) -> list[str]:
    if not (folder / COMPLETE_STAMP).exists():
        return []
    jars = sorted(str(p) for p in folder.glob("*.jar"))
    names = [Path(j).name for j in jars]
    if not all(any(n.startswith(m) for n in names) for m in _MARKERS):
        return []
    return jars


def find_jars() -> list[str]:
    """The jars to put on the Spark classpath for delta-spark and s3a: ``PGCDC_SPARK_JARS``
    when set (``none``: nothing, the cluster has them), else those ``make setup`` fetched,
    else ``[]``."""
    env = os.environ.get(JARS_ENV)
    if env is not None and env.strip():
        if env.strip().lower() == "none":
            return []
        return [j.strip() for j in env.split(",") if j.strip()]
    return _from_dir(jars_dir())


def provided_by_cluster() -> bool:
    """``PGCDC_SPARK_JARS=none``: Delta and hadoop-aws come with the cluster or ``--packages``."""
    return os.environ.get(JARS_ENV, "").strip().lower() == "none"


def unavailable_reason() -> str | None:
    """Why the delta-spark/s3a jars are not at hand, or ``None`` when they are."""
    if find_jars() or provided_by_cluster():
        return None
    folder = jars_dir()
    err = folder.parent / ERROR_FILE
    detail = ""
    if err.exists():
        lines = [ln for ln in err.read_text(errors="replace").splitlines() if ln.strip()]
        detail = ": " + lines[0][:300] if lines else ""
    return (
        f"no Delta/hadoop-aws jars: `make setup` could not fetch them with mvn into {folder}{detail} "
        f"(set {JARS_ENV} to the jars, or to 'none' when the cluster provides them)"
    )


def delta_conf(jars: list[str] | None = None) -> dict[str, str]:
    """Session conf for Delta's Spark engine: the Delta SQL extension and catalog, and
    ``spark.jars`` (the jars found, unless the cluster provides them)."""
    jars = find_jars() if jars is None else jars
    conf = dict(DELTA_SESSION_CONF)
    if jars:
        conf["spark.jars"] = ",".join(jars)
    return conf


S3A_WRITE_KEYS = frozenset({"fs.s3a.encryption.algorithm", "fs.s3a.encryption.key", "fs.s3a.acl.default"})
"""What every object S3A writes carries (see :meth:`~airflow_pgcdc.store.s3.S3Settings.s3a_conf`)."""


def s3a_settings(settings) -> dict[str, str]:
    """Hadoop ``fs.s3a.*`` settings for ``settings`` (fields it leaves unset: S3A's own
    defaults and credential chain, e.g. an instance role)."""
    out: dict[str, str] = {}
    if settings.endpoint_url:
        out["fs.s3a.endpoint"] = settings.endpoint_url
        out["fs.s3a.connection.ssl.enabled"] = str(settings.endpoint_url.startswith("https")).lower()
    style = settings.addressing_style or ("path" if settings.endpoint_url else None)
    if style in ("path", "virtual"):
        out["fs.s3a.path.style.access"] = str(style == "path").lower()
    if settings.region:
        out["fs.s3a.endpoint.region"] = settings.region
    if settings.access_key_id and settings.secret_access_key:
        out["fs.s3a.access.key"] = settings.access_key_id
        out["fs.s3a.secret.key"] = settings.secret_access_key
        if settings.session_token:
            out["fs.s3a.session.token"] = settings.session_token
            out["fs.s3a.aws.credentials.provider"] = (
                "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
            )
    if getattr(settings, "role_arn", None):  # S3A assumes the role itself, and renews it
        out.update(_s3a_assumed_role(settings, source=out.pop("fs.s3a.aws.credentials.provider", None)))
    out.update(settings.s3a_conf())  # encryption and ACL of every object S3A writes
    return out


S3A_ROLE_KEYS = frozenset({"fs.s3a.aws.credentials.provider", "fs.s3a.assumed.role.arn",
                           "fs.s3a.assumed.role.session.name", "fs.s3a.assumed.role.session.duration",
                           "fs.s3a.assumed.role.sts.endpoint", "fs.s3a.assumed.role.sts.endpoint.region",
                           "fs.s3a.assumed.role.credentials.provider"})


def _s3a_assumed_role(settings, source: str | None) -> dict[str, str]:
    """S3A's AssumedRoleCredentialProvider for ``settings.role_arn``, from the static keys
    (``source``: the provider they need) or the instance's role."""
    out = {
        "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.auth.AssumedRoleCredentialProvider",
        "fs.s3a.assumed.role.arn": settings.role_arn,
        "fs.s3a.assumed.role.session.name": settings.role_session_name,
        "fs.s3a.assumed.role.session.duration": f"{int(settings.role_seconds)}s",
        "fs.s3a.assumed.role.credentials.provider": source or (
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider" if settings.access_key_id
            else "org.apache.hadoop.fs.s3a.auth.IAMInstanceCredentialsProvider"),
    }
    if settings.sts_endpoint_url:
        from urllib.parse import urlsplit

        from airflow_pgcdc.store.s3 import StoreError

        parts = urlsplit(settings.sts_endpoint_url)
        if parts.scheme != "https":  # S3A puts https:// before what it is given
            raise StoreError(f"S3A (Delta's Spark engine, the s3a reader) reaches STS over https only, not "
                             f"{settings.sts_endpoint_url}: give an https STS endpoint, or use the delta-rs engine "
                             "and the python reader, which reach it as boto3 does")
        out["fs.s3a.assumed.role.sts.endpoint"] = parts.netloc
        out["fs.s3a.assumed.role.sts.endpoint.region"] = settings.region or "us-east-1"
    return out


def configure_s3a(spark, settings) -> None:
    """Point S3A at ``settings``' endpoint and credentials, in the running session's
    Hadoop configuration (shipped with tasks to the executors; not a command line)."""
    hconf = spark.sparkContext._jsc.hadoopConfiguration()
    wanted = s3a_settings(settings)
    for key in (S3A_WRITE_KEYS | S3A_ROLE_KEYS) - wanted.keys():  # a session's earlier job asked for them
        hconf.unset(key)
    for key, value in wanted.items():
        hconf.set(key, value)
