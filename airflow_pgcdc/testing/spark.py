"""A Spark standalone cluster on this machine, from pyspark's own ``bin/spark-class``: one
Master and N Workers, each its own JVM, on 127.0.0.1 only, on free ports.

Used two ways, like the servers of :mod:`airflow_pgcdc.testing.postgres` and :mod:`airflow_pgcdc.testing.s3`:

- by the test bed (``tests/conftest.py``, fixture ``spark_cluster``): in a temporary
  directory, as children of the test process that die with it (each JVM leads its own
  process group, with a parent-death signal; stopped at session end and ``atexit``);
- by ``pgcdc sandbox up --spark``: detached, state under ``.pgcdc/spark``.

Each process logs to its own file (:attr:`SparkProcess.log_file`); executors log under
the workers' work directories (:meth:`SparkCluster.executor_logs`). The daemons get a
small heap (``SPARK_DAEMON_MEMORY``); each worker offers ``cores`` cores and ``memory``
to executors. Executors run as children of the workers (same process group), so killing
a worker's group stops its executors and their Python workers too.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_pgcdc.testing.processes import (
    SandboxError,
    free_port,
    kill_group,
    make_temp_base,
    pid_alive,
    register_live,
    spawn,
    wait_gone,
)

__all__ = ["SparkCluster", "SparkProcess", "spark_home"]

def spark_home() -> Path:
    """pyspark's package directory (it holds ``bin/spark-class`` and ``jars/``)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.origin:
        raise SandboxError("pyspark is not installed", hint="run `make setup`")
    return Path(spec.origin).parent


@dataclass
class SparkProcess:
    """One daemon of the cluster: ``master`` or ``worker-<n>``."""

    name: str
    port: int
    webui_port: int
    log_file: Path
    pid: int | None = None
    popen: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return pid_alive(self.pid) and _is_spark_daemon(self.pid)


def _is_spark_daemon(pid: int | None) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"org.apache.spark.deploy." in cmdline


class SparkCluster:
    """A standalone Spark cluster: ``master_url`` (``spark://127.0.0.1:port``) once
    :meth:`start` returned (every worker registered)."""

    def __init__(
        self,
        *,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1536m",
        daemon_memory: str = "256m",
        base_dir: str | os.PathLike | None = None,
        detached: bool = False,
        startup_timeout: float = 90.0,
        state: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._temp = base_dir is None
        self.base_dir = make_temp_base("spark") if base_dir is None else Path(base_dir).absolute()
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.daemon_memory = daemon_memory
        self.detached = detached
        self.startup_timeout = startup_timeout
        self.extra_env = dict(env or {})
        if state:
            self.processes = [
                SparkProcess(p["name"], p["port"], p["webui_port"], Path(p["log_file"]), p.get("pid"))
                for p in state["processes"]
            ]
        else:
            self.processes = [SparkProcess("master", free_port(), free_port(), self.base_dir / "master.log")]
            for n in range(1, workers + 1):
                self.processes.append(
                    SparkProcess(f"worker-{n}", free_port(), free_port(), self.base_dir / f"worker-{n}.log")
                )
        if not detached:
            register_live(self)

    def __repr__(self) -> str:
        return f"<SparkCluster {self.master_url} {'running' if self.running else 'stopped'} {self.base_dir}>"

    # ---- facts

    @property
    def master(self) -> SparkProcess:
        return self.processes[0]

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master.port}"

    @property
    def webui_url(self) -> str:
        return f"http://127.0.0.1:{self.master.webui_port}"

    @property
    def running(self) -> bool:
        return all(p.running for p in self.processes)

    @property
    def log_files(self) -> list[Path]:
        return [p.log_file for p in self.processes]

    def work_dir(self, worker: SparkProcess) -> Path:
        return self.base_dir / "work" / worker.name

    def executor_logs(self) -> list[Path]:
        """Every executor's ``stderr``/``stdout`` under the workers' work directories."""
        return sorted(self.base_dir.glob("work/*/app-*/*/std*"))

    def state(self) -> dict[str, Any]:
        """What :class:`SparkCluster` needs to find the running cluster again (``state=``)."""
        return {
            "base_dir": str(self.base_dir),
            "master_url": self.master_url,
            "processes": [
                {"name": p.name, "port": p.port, "webui_port": p.webui_port,
                 "log_file": str(p.log_file), "pid": p.pid}
                for p in self.processes
            ],
        }

    def status(self) -> dict[str, Any]:
        """The master's JSON status (``aliveworkers``, ``cores``, ``activeapps``...)."""
        with urllib.request.urlopen(self.webui_url + "/json/", timeout=5) as r:
            return json.loads(r.read())

    # ---- lifecycle

    def _env(self) -> dict[str, str]:
        home = spark_home()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8", "TZ": "UTC",
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": self.daemon_memory,
            "SPARK_NO_DAEMONIZE": "1",
            "SPARK_CONF_DIR": str(self.base_dir / "conf"),
            "PYSPARK_PYTHON": sys.executable,
        }
        for name in ("JAVA_HOME", "JAVA_TOOL_OPTIONS"):  # the JDK, and JVM flags for daemons and executors
            if os.environ.get(name):
                env[name] = os.environ[name]
        env.update(self.extra_env)
        return env

    def _argv(self, p: SparkProcess) -> list[str]:
        spark_class = str(spark_home() / "bin" / "spark-class")
        common = ["--host", "127.0.0.1", "--port", str(p.port), "--webui-port", str(p.webui_port)]
        if p.name == "master":
            return [spark_class, "org.apache.spark.deploy.master.Master", *common]
        return [
            spark_class, "org.apache.spark.deploy.worker.Worker", *common,
            "--cores", str(self.cores), "--memory", self.memory,
            "--work-dir", str(self.work_dir(p)), self.master_url,
        ]

    def _launch(self, p: SparkProcess) -> None:
        if p.name != "master":
            self.work_dir(p).mkdir(parents=True, exist_ok=True)
        p.popen = spawn(self._argv(p), log_file=p.log_file, detached=self.detached, env=self._env(),
                         cwd=self.base_dir, death_signal=signal.SIGKILL)
        p.pid = p.popen.pid

    def start(self) -> SparkCluster:
        """Start the master, then the workers; return once every worker is registered."""
        if self.running:
            return self
        self.stop()
        (self.base_dir / "conf").mkdir(parents=True, exist_ok=True)
        (self.base_dir / "conf" / "spark-defaults.conf").write_text(
            "spark.ui.showConsoleProgress false\n"
            "spark.master.rest.enabled false\n"
            "spark.worker.ui.retainedExecutors 20\n"
        )
        try:
            self._launch(self.master)
            self._wait(lambda s: s.get("status") == "ALIVE", "the master")
            for p in self.processes[1:]:
                self._launch(p)
            self._wait(lambda s: s.get("aliveworkers", 0) >= self.workers,
                       f"{self.workers} worker(s) to register")
        except BaseException:
            self.stop()
            raise
        return self

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            dead = [p for p in self.processes if p.popen is not None and p.popen.poll() is not None]
            if dead:
                raise SandboxError(f"Spark {dead[0].name} exited during startup:\n{self.log_tail(dead[0])}")
            with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
                if ready(self.status()):
                    return
            time.sleep(0.2)
        raise SandboxError(
            f"Spark cluster: timed out after {self.startup_timeout:.0f}s waiting for {what}:\n"
            + "\n".join(self.log_tail(p, 15) for p in self.processes)
        )

    def log_tail(self, p: SparkProcess, lines: int = 30) -> str:
        try:
            text = p.log_file.read_text(errors="replace")
        except OSError:
            return f"({p.name}: no log)"
        return f"--- {p.name} ({p.log_file})\n" + "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 20.0) -> None:
        """Workers first (their executors with them), then the master: SIGTERM to each
        process group, SIGKILL after ``timeout``."""
        for p in reversed(self.processes):
            pid = p.pid
            if pid is None or not p.running:
                if p.popen is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.popen.wait(1)
                p.popen = None
                continue
            # each daemon leads its own process group (pgid = pid), its executors in it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)
            if not wait_gone(pid, p.popen, timeout):
                kill_group(pid)
                wait_gone(pid, p.popen, 10)
            with contextlib.suppress(ProcessLookupError, PermissionError):  # what is left of the group
                os.killpg(pid, signal.SIGKILL)
            p.popen = None

    def close(self, mode: str = "fast") -> None:
        try:
            if mode == "immediate":
                for p in self.processes:
                    if p.pid is not None and p.running:
                        kill_group(p.pid)
            self.stop()
        finally:
            if self._temp:
                shutil.rmtree(self.base_dir, ignore_errors=True)
            from airflow_pgcdc.testing import processes

            processes.live_servers.discard(self)

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
