"""A standalone Hive Metastore (4.0.1) for the catalog's tests: Java 17, the jars `make hms`
fetched into ``jvm/hms/lib`` (``jvm/hms/pom.xml``), embedded Derby, Thrift on a free loopback
port. The Derby schema is made once per machine by the metastore's schema tool (from the
SQL committed in ``jvm/hms/scripts``, ~10 s) into a template folder, then copied for each
server, which starts in ~6 s. Nothing here is used by the product."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from airflow_pgcdc.testing.processes import (
    SandboxError,
    free_port,
    kill_group,
    spawn,
    tail_of,
    wait_gone,
)

__all__ = ["HMS_LIB", "Metastore", "unavailable_reason"]

ROOT = Path(__file__).resolve().parents[2]
HMS_DIR = ROOT / "jvm" / "hms"
HMS_LIB = HMS_DIR / "lib"
TEMPLATE = ROOT / ".pgcdc" / "hms-template"

_SITE = """<?xml version="1.0"?>
<configuration>
  <property><name>javax.jdo.option.ConnectionURL</name><value>jdbc:derby:;databaseName={db};create=true</value></property>
  <property><name>javax.jdo.option.ConnectionDriverName</name><value>org.apache.derby.jdbc.EmbeddedDriver</value></property>
  <property><name>javax.jdo.option.ConnectionUserName</name><value>APP</value></property>
  <property><name>javax.jdo.option.ConnectionPassword</name><value>mine</value></property>
  <!-- async logging needs a jar the metastore does not depend on -->
  <property><name>metastore.async.log.enabled</name><value>false</value></property>
  <!-- the defaults name classes of hive-exec, which a standalone metastore has not -->
  <property><name>metastore.task.threads.always</name><value>org.apache.hadoop.hive.metastore.events.EventCleanerTask</value></property>
  <property><name>metastore.expression.proxy</name><value>org.apache.hadoop.hive.metastore.DefaultPartitionExpressionProxy</value></property>
  <property><name>metastore.thrift.port</name><value>{port}</value></property>
  <property><name>metastore.thrift.bind.host</name><value>127.0.0.1</value></property>
  <property><name>metastore.warehouse.dir</name><value>file://{base}/warehouse</value></property>
  <property><name>metastore.warehouse.external.dir</name><value>file://{base}/warehouse-external</value></property>
</configuration>
"""


def unavailable_reason() -> str | None:
    """Why no metastore can start here (no jars, no java), or None."""
    if not (HMS_LIB / ".complete").exists():
        error = ROOT / "jvm" / "hms-error.txt"
        why = error.read_text().strip() if error.exists() else "run make hms"
        return f"the Hive Metastore's jars are not in {HMS_LIB} ({why})"
    if shutil.which("java") is None:
        return "no java on PATH"
    return None


def _conf(base: Path, db: Path, port: int) -> Path:
    conf = base / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "metastore-site.xml").write_text(_SITE.format(db=db, port=port, base=base))
    shutil.copy(HMS_DIR / "conf" / "metastore-log4j2.properties", conf)
    return conf


def _template() -> Path:
    """The Derby database with the metastore's schema, made once (a lock file keeps two
    test processes from making it at once)."""
    db = TEMPLATE / "metastore_db"
    if db.exists():
        return db
    TEMPLATE.mkdir(parents=True, exist_ok=True)
    import fcntl

    with open(TEMPLATE.parent / "hms-template.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if db.exists():
            return db
        work = Path(tempfile.mkdtemp(prefix="hms-schema-", dir=TEMPLATE.parent))
        try:
            conf = _conf(work, work / "metastore_db", 0)
            log = work / "schematool.log"
            with open(log, "wb") as out:
                done = subprocess.run(
                    ["java", "-cp", f"{conf}:{HMS_LIB}/*",
                     "org.apache.hadoop.hive.metastore.tools.schematool.MetastoreSchemaTool",
                     "-initSchema", "-dbType", "derby"],
                    cwd=work, env={**os.environ, "METASTORE_HOME": str(HMS_DIR)}, stdout=out,
                    stderr=subprocess.STDOUT, timeout=600, check=False)
            if done.returncode != 0:
                raise SandboxError(f"the metastore's schema tool failed:\n{tail_of(log)}")
            (work / "metastore_db").rename(db)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return db


class Metastore:
    """One metastore server: :meth:`start`, :attr:`uri`, :meth:`stop`."""

    def __init__(self, base_dir: Path | None = None, *, startup_timeout: float = 300.0) -> None:
        self._temp = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="pgcdc-hms-"))
        self.startup_timeout = startup_timeout
        self.port = 0
        self.popen: subprocess.Popen | None = None
        self.log_file = self.base_dir / "metastore.log"

    @property
    def uri(self) -> str:
        return f"thrift://127.0.0.1:{self.port}"

    def start(self) -> Metastore:
        why = unavailable_reason()
        if why:
            raise SandboxError(why)
        db = self.base_dir / "metastore_db"
        if not db.exists():
            shutil.copytree(_template(), db)
        (db / "db.lck").unlink(missing_ok=True)
        self.port = free_port()
        conf = _conf(self.base_dir, db, self.port)
        self.popen = spawn(["java", "-Xmx512m", "-XX:+UseSerialGC", "-cp", f"{conf}:{HMS_LIB}/*",
                            "org.apache.hadoop.hive.metastore.HiveMetaStore"],
                           log_file=self.log_file, detached=False, env=dict(os.environ), cwd=self.base_dir)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise SandboxError(f"the Hive Metastore exited during startup:\n{tail_of(self.log_file)}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return self
            time.sleep(0.25)
        self.stop()
        raise SandboxError(f"the Hive Metastore did not listen on {self.port} in {self.startup_timeout:.0f} s:\n"
                           f"{tail_of(self.log_file)}")

    def stop(self, timeout: float = 20.0) -> None:
        p, self.popen = self.popen, None
        if p is not None and p.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGTERM)
            if not wait_gone(p.pid, p, timeout):
                kill_group(p.pid)
                wait_gone(p.pid, p, 10)

    def close(self) -> None:
        try:
            self.stop()
        finally:
            if self._temp:
                shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> Metastore:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
