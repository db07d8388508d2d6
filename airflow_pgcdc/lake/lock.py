"""The Delta root's lock: ``pgcdc maintain`` and a merge on Delta's Spark engine never run
on one Delta root at once.

delta-rs commits a Delta log entry with a conditional put (``If-None-Match``): of two
writers of one version, one is refused and retries on the new version. Delta's Spark engine
on S3 does not (hadoop-aws checks with a HEAD, then puts), so a delta-spark merge that
raced ``pgcdc maintain``'s compaction could overwrite its commit, and the log would lose
it. Both therefore hold this lock for their run (a merge on delta-rs takes none: its
commits are conditional): the object ``{delta}/_pgcdc_lock.json``, created with
``If-None-Match`` (one holder), naming its holder and renewed every ``ttl / 3`` seconds by a
thread while held. A job that finds it held waits (``wait`` seconds) and then fails
(:class:`DeltaRootBusy`, naming the holder).

A holder that died (a job killed with SIGKILL, a lost container) leaves its lock behind. It
is taken over, with a warning:

- at once when the holder ran on this machine and its process is gone: the lock records the
  host name, the kernel's boot id, the PID namespace, the pid and the process's start time,
  and all of the first three match the waiter's own while the pid is gone or is another
  process now (a job retried where it ran, as a killed ``pgcdc merge`` rerun by the same
  Airflow worker, waits for nothing);
- after ``ttl`` seconds without renewal otherwise (another machine or container: its
  processes cannot be seen from here).
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
from contextlib import contextmanager, nullcontext
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


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot, ``/proc/<pid>/stat``), or
    ``None`` when there is no such process (or no ``/proc``): with the pid, it names one
    process, whatever pid reuse does."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _first_line(path: str, *, link: bool = False) -> str | None:
    try:
        if link:
            return os.readlink(path)
        with open(path) as f:
            return f.readline().strip() or None
    except OSError:
        return None


def this_process() -> dict[str, Any]:
    """What a lock records of its holder: enough for a waiter on the same machine to tell
    whether that process still runs (:func:`holder_gone`)."""
    pid = os.getpid()
    return {
        "host": socket.gethostname(), "pid": pid, "pid_start": process_start(pid),
        "boot_id": _first_line("/proc/sys/kernel/random/boot_id"),
        "pid_ns": _first_line("/proc/self/ns/pid", link=True),
    }


def holder_gone(held: dict[str, Any], me: dict[str, Any] | None = None) -> bool:
    """Whether the process that holds the lock ``held`` is known to be gone: it ran on this
    machine (same host name, boot and PID namespace as ``me``, this process by default) and
    its pid is free or another process now. ``False`` when that cannot be known (another
    machine, another container, a lock without these fields)."""
    me = me or this_process()
    if not (me.get("boot_id") and me.get("pid_ns") and held.get("pid_start")):
        return False
    if any(held.get(k) != me[k] for k in ("host", "boot_id", "pid_ns")):
        return False
    pid = held.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    return process_start(pid) != held.get("pid_start")


def _read(client: Any, bucket: str, key: str) -> dict | None:
    try:
        doc = json.loads(s3store.get_bytes(client, bucket, key))
    except s3store.ObjectNotFound:
        return None
    except ValueError:  # not ours to read: treated as held, renewed now
        return {"owner": "?", "job": "unknown (unreadable lock)", "renewed_at": time.time()}
    return doc if isinstance(doc, dict) else None


def root_lock_if(needed: bool, client: Any, delta: str, *, job: str, wait: float | None = None):
    """:func:`delta_root_lock` of ``delta`` for a job that commits there (``needed``), or a
    context that does nothing: not needed (a dry run, a delta-rs merge) or a root not on S3
    (a local root has one writer). ``wait`` ``None``: :data:`DEFAULT_WAIT`."""
    if not needed or not delta.startswith("s3://"):
        return nullcontext()
    return delta_root_lock(client, delta, job=job, wait=DEFAULT_WAIT if wait is None else wait)


@contextmanager
def delta_root_lock(client: Any, delta: str, *, job: str, wait: float = DEFAULT_WAIT,
                    ttl: float = DEFAULT_TTL, poll: float = 1.0) -> Iterator[dict]:
    """Hold the lock of the Delta root ``delta`` for the ``with`` block (see the module).
    ``job`` names the holder in the lock and in a waiter's messages."""
    bucket, key = lock_key(delta)
    owner = uuid.uuid4().hex
    me = {"owner": owner, "job": job, **this_process(), "acquired_at": time.time()}
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
        gone = holder_gone(held, me)
        if gone or age > ttl:
            log.warning("the lock of %s was held by %s (pid %s on %s), %s: taking it over", delta,
                        held.get("job"), held.get("pid"), held.get("host"),
                        "whose process is gone" if gone else f"not renewed for {age:.0f} s (its job died)")
            again = _read(client, bucket, key)  # not a lock another waiter took over meanwhile
            if again is not None and again.get("owner") == held.get("owner"):
                s3store.delete_keys(client, bucket, [key], what=key)
            continue
        if time.monotonic() >= deadline:
            raise DeltaRootBusy(
                f"{job}: {delta} is locked by {held.get('job')} (pid {held.get('pid')} on {held.get('host')}, "
                f"renewed {age:.0f} s ago); waited {wait:.0f} s. A merge on Delta's Spark engine and pgcdc "
                "maintain must not commit to one Delta root at once (Delta's Spark engine does not commit "
                "conditionally on S3)",
                hint=f"run it again once that job ends (in Airflow: let the task retry); a lock whose job died is "
                     f"taken over at once on the machine it ran on, elsewhere after {ttl:.0f} s without renewal "
                     f"(s3://{bucket}/{key})",
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
