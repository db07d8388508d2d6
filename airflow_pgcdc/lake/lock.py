"""The Delta root's lock: ``pgcdc maintain`` and a merge on Delta's Spark engine never run
on one Delta root at once.

delta-rs commits a Delta log entry with a conditional put (``If-None-Match``): of two
writers of one version, one is refused and retries on the new version. Delta's Spark engine
on S3 does not (hadoop-aws checks with a HEAD, then puts), so a delta-spark merge that
raced ``pgcdc maintain``'s compaction could overwrite its commit, and the log would lose
it. ``pgcdc maintain`` holds this lock for its run (the merge does not take it yet: a
killed delta-spark merge would leave it behind for ``ttl``): the object ``{delta}/_pgcdc_lock.json``,
created with ``If-None-Match`` (one holder), naming its holder and renewed every
``ttl / 3`` seconds by a thread while held. A job that finds it held waits (``wait``
seconds) and then fails (:class:`DeltaRootBusy`, naming the holder); a lock not renewed
for ``ttl`` seconds belonged to a job that died and is taken over, with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow_pgcdc.errors import HintedError
from airflow_pgcdc.store import s3 as s3store

log = logging.getLogger(__name__)

LOCK_NAME = "_pgcdc_lock.json"
DEFAULT_WAIT = 600.0
DEFAULT_TTL = 300.0


class DeltaRootBusy(HintedError):
    """Another job (a merge on Delta's Spark engine, or ``pgcdc maintain``) holds the Delta
    root's lock and did not release it within the wait."""


def lock_key(delta: str) -> tuple[str, str]:
    """``(bucket, key)`` of the lock of the Delta root ``delta`` (``s3://bucket/prefix``)."""
    loc = s3store.S3Location.parse(delta)
    prefix = loc.prefix.rstrip("/")
    return loc.bucket, (prefix + "/" if prefix else "") + LOCK_NAME


def _read(client: Any, bucket: str, key: str) -> dict | None:
    try:
        doc = json.loads(s3store.get_bytes(client, bucket, key))
    except s3store.ObjectNotFound:
        return None
    except ValueError:  # not ours to read: treated as held, renewed now
        return {"owner": "?", "job": "unknown (unreadable lock)", "renewed_at": time.time()}
    return doc if isinstance(doc, dict) else None


@contextmanager
def delta_root_lock(client: Any, delta: str, *, job: str, wait: float = DEFAULT_WAIT,
                    ttl: float = DEFAULT_TTL, poll: float = 1.0) -> Iterator[dict]:
    """Hold the lock of the Delta root ``delta`` for the ``with`` block (see the module).
    ``job`` names the holder in the lock and in a waiter's messages."""
    bucket, key = lock_key(delta)
    owner = uuid.uuid4().hex
    me = {"owner": owner, "job": job, "host": socket.gethostname(), "pid": os.getpid(), "acquired_at": time.time()}
    deadline = time.monotonic() + wait
    said = False
    while True:
        me["renewed_at"] = time.time()
        if s3store.put_if_absent(client, bucket, key, json.dumps(me), content_type="application/json"):
            break
        held = _read(client, bucket, key)
        if held is None:
            continue  # released meanwhile: try again at once
        age = time.time() - float(held.get("renewed_at") or 0)
        if age > ttl:
            log.warning("the lock of %s was held by %s (pid %s on %s) and not renewed for %.0f s: it died; "
                        "taking it over", delta, held.get("job"), held.get("pid"), held.get("host"), age)
            s3store.delete_keys(client, bucket, [key], what=key)
            continue
        if time.monotonic() >= deadline:
            raise DeltaRootBusy(
                f"{job}: {delta} is locked by {held.get('job')} (pid {held.get('pid')} on {held.get('host')}, "
                f"renewed {age:.0f} s ago); waited {wait:.0f} s. A merge on Delta's Spark engine and pgcdc "
                "maintain must not commit to one Delta root at once (Delta's Spark engine does not commit "
                "conditionally on S3)",
                hint=f"run it again once that job ends (in Airflow: let the task retry); a lock whose job died is "
                     f"taken over after {ttl:.0f} s without renewal (s3://{bucket}/{key})",
            )
        if not said:
            log.info("%s: waiting for %s, which holds the lock of %s", job, held.get("job"), delta)
            said = True
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(ttl / 3):
            try:
                held = _read(client, bucket, key)
                if held is None or held.get("owner") != owner:
                    log.error("%s: the lock of %s was taken from it (by %s)", job, delta,
                              (held or {}).get("job", "no one"))
                    return
                s3store.put_bytes(client, bucket, key, json.dumps({**me, "renewed_at": time.time()}),
                                  content_type="application/json")
            except Exception as exc:  # noqa: BLE001 - the next round tries again; a waiter sees the age
                log.warning("%s: could not renew the lock of %s: %s", job, delta, exc)

    th = threading.Thread(target=renew, name="pgcdc-delta-lock", daemon=True)
    th.start()
    try:
        yield me
    finally:
        stop.set()
        th.join(timeout=30)
        try:
            held = _read(client, bucket, key)
            if held is not None and held.get("owner") == owner:
                s3store.delete_keys(client, bucket, [key], what=key)
        except Exception as exc:  # noqa: BLE001 - a lock left behind is taken over after ttl
            log.warning("%s: could not release the lock of %s: %s", job, delta, exc)
