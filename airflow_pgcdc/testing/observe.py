"""What a DAG run tells a monitoring stack, caught for the tests and ``make demo``: a StatsD
server (one UDP socket on a free loopback port, read by a thread) and OpenLineage's file
transport (one file per event). Nothing here is used by the product."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

__all__ = ["StatsdListener", "lineage_env", "lineage_events"]


def lineage_env(directory: Path) -> dict[str, str]:
    """The environment that has the OpenLineage provider's listener write its events to files
    under ``directory``, as a deployment configures it. One file per event: in append mode the
    processes of a run (scheduler, task runners) share one file, and an event larger than a
    write buffer can interleave with another's lines. Named by time, job and event type (the
    transport's ``debug_mode``): by time alone, two tasks' events in one microsecond wrote one
    file over each other (CI: ``Extra data`` reading it)."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    return {"AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "append": False, "debug_mode": True,
                                                           "log_file_path": str(Path(directory) / "event")})}


def lineage_events(directory: Path) -> list[dict]:
    """The OpenLineage events written under ``directory`` (see :func:`lineage_env`), in time order."""
    events = [json.loads(f.read_text()) for f in Path(directory).glob("event-*.json")]
    return sorted(events, key=lambda e: str(e.get("eventTime", "")))


class StatsdListener:
    """A StatsD server: one UDP socket on a free loopback port; a thread keeps every line it
    receives (so nothing is dropped while no one asks)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, name="statsd-listener", daemon=True)
        self._thread.start()

    def __enter__(self) -> StatsdListener:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536).decode(errors="replace")
            except (TimeoutError, OSError):
                continue
            with self._lock:
                self.lines += data.splitlines()

    def airflow_env(self) -> dict[str, str]:
        """Airflow's settings that send its metrics here."""
        return {"AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
                "AIRFLOW__METRICS__STATSD_PORT": str(self.sock.getsockname()[1])}

    def received(self, settle: float = 0.0) -> list[str]:
        """Every line received, after ``settle`` seconds (for packets still on their way)."""
        time.sleep(settle)
        return self._wait(0.0, None)

    def _wait(self, timeout: float, want: str | None) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                lines = list(self.lines)
            if want is None or any(ln.startswith(want + ":") for ln in lines) or time.monotonic() >= deadline:
                return lines
            time.sleep(0.05)

    @staticmethod
    def _metrics(lines: list[str], kinds: tuple[str, ...]) -> list[tuple[str, float]]:
        out = []
        for line in lines:
            name, _, rest = line.partition(":")
            value, _, kind = rest.partition("|")
            if kind.split("|")[0] in kinds:
                out.append((name, float(value)))
        return out

    def gauges(self, *, timeout: float = 0.0, want: str | None = None) -> dict[str, float]:
        """``{name: last value}`` of the gauges received, waiting until ``want`` came (or ``timeout``)."""
        return dict(self._metrics(self._wait(timeout, want), ("g",)))

    def counters(self, *, timeout: float = 0.0, want: str | None = None) -> dict[str, float]:
        """``{name: sum}`` of the counters received, waiting until ``want`` came (or ``timeout``)."""
        out: dict[str, float] = {}
        for name, value in self._metrics(self._wait(timeout, want), ("c",)):
            out[name] = out.get(name, 0.0) + value
        return out

    def timers(self) -> dict[str, list[float]]:
        """``{name: [ms, ...]}`` of the timings received so far."""
        out: dict[str, list[float]] = {}
        for name, value in self._metrics(self._wait(0.0, None), ("ms",)):
            out.setdefault(name, []).append(value)
        return out
