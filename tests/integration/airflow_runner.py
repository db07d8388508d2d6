"""The DAG runner of the tests: :mod:`airflow_pgcdc.testing.dagrun` (shared with ``make demo``),
a reader of the Asset events a run left in its metadata DB, OpenLineage's file transport, and a
StatsD listener."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from airflow_pgcdc.testing.dagrun import DagRunResult, airflow_env, migrate, run_dag

__all__ = ["DagRunResult", "airflow_env", "asset_events", "lineage_env", "lineage_events", "migrate", "run_dag"]


def asset_events(home: Path) -> list[dict]:
    """Every Asset event in the metadata DB of ``home`` (an ``AIRFLOW_HOME``): uri, extra,
    source task, and the aliases it came through."""
    with sqlite3.connect(Path(home) / "airflow.db") as db:
        rows = db.execute(
            "SELECT a.uri, e.extra, e.source_task_id, "
            "(SELECT group_concat(al.name) FROM asset_alias_asset_event x "
            " JOIN asset_alias al ON al.id = x.alias_id WHERE x.event_id = e.id) "
            "FROM asset_event e JOIN asset a ON a.id = e.asset_id ORDER BY e.id"
        ).fetchall()
    return [{"uri": u, "extra": json.loads(x), "task": t, "aliases": al} for u, x, t, al in rows]


def lineage_env(directory: Path) -> dict[str, str]:
    """The environment that has the OpenLineage provider's listener write its events to files
    under ``directory``, as a deployment configures it. One file per event: in append mode the
    processes of a run (scheduler, task runners) share one file, and an event larger than a
    write buffer can interleave with another's lines."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    return {"AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "append": False,
                                                           "log_file_path": str(Path(directory) / "event")})}


def lineage_events(directory: Path) -> list[dict]:
    """The OpenLineage events written under ``directory`` (see :func:`lineage_env`), in time order."""
    return [json.loads(f.read_text()) for f in sorted(Path(directory).glob("event-*.json"))]


class StatsdListener:
    """A StatsD server: one UDP socket on a free port, every packet it receives kept."""

    def __init__(self) -> None:
        import socket

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.lines: list[str] = []

    def __enter__(self) -> StatsdListener:
        return self

    def __exit__(self, *exc) -> None:
        self.sock.close()

    def airflow_env(self) -> dict[str, str]:
        return {"AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
                "AIRFLOW__METRICS__STATSD_PORT": str(self.sock.getsockname()[1])}

    def _read(self, timeout: float, want: str) -> None:
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not any(ln.startswith(want + ":") for ln in self.lines):
            try:
                data = self.sock.recv(65536).decode()
            except TimeoutError:
                continue
            self.lines += data.splitlines()

    def _metrics(self, kinds: tuple[str, ...]) -> list[tuple[str, float]]:
        out = []
        for line in self.lines:
            name, _, rest = line.partition(":")
            value, _, kind = rest.partition("|")
            if kind.split("|")[0] in kinds:
                out.append((name, float(value)))
        return out

    def gauges(self, *, timeout: float, want: str) -> dict[str, float]:
        """``{name: last value}`` of the gauges received, reading until ``want`` came (or ``timeout``)."""
        self._read(timeout, want)
        return dict(self._metrics(("g",)))

    def counters(self, *, timeout: float, want: str) -> dict[str, float]:
        """``{name: sum}`` of the counters received, reading until ``want`` came (or ``timeout``)."""
        self._read(timeout, want)
        out: dict[str, float] = {}
        for name, value in self._metrics(("c",)):
            out[name] = out.get(name, 0.0) + value
        return out

    def timers(self) -> dict[str, list[float]]:
        """``{name: [ms, ...]}`` of the timings received so far."""
        out: dict[str, list[float]] = {}
        for name, value in self._metrics(("ms",)):
            out.setdefault(name, []).append(value)
        return out
