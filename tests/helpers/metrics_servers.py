"""Real InfluxDB 1.x and Prometheus servers for tests, each in a temporary directory on free
loopback ports under `timeout -s KILL` (so a forgotten one dies anyway). Both come from their Debian
packages (`influxdb`, `prometheus`; `.ci/run` installs them); `INFLUXD`/`PROMETHEUS` are None when
missing, and a test then skips saying so.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from tests.helpers.role_all import free_ports

T = TypeVar("T")
INFLUXD = shutil.which("influxd")
PROMETHEUS = shutil.which("prometheus")
DATABASE = "tfusion"
SERVER_LIFETIME_S = "600"  # the servers are killed after this even if a test forgets them
INFLUXD_MISSING = "influxd is not installed (Debian package influxdb); .ci/run installs it"
PROMETHEUS_MISSING = "prometheus is not installed (Debian package prometheus); .ci/run installs it"


def poll(what: str, check: Callable[[], T | None], timeout: float = 60.0, log: Callable[[], str] = str) -> T:
    """`check()`'s first truthy result, polled until `timeout`; the test fails naming `what` after it."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
            last = result
        except (httpx.TransportError, AssertionError, KeyError, ValueError) as exc:
            last = exc
        time.sleep(0.2)
    pytest.fail(f"{what} not seen after {timeout} s (last: {last!r})\n{log()}")


def start_group(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(["timeout", "-s", "KILL", SERVER_LIFETIME_S, *args], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def kill_group(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


class Influx:
    """One influxd in `root`, on free loopback ports; `kill()` and `start()` again keep its data."""

    def __init__(self, root: Path) -> None:
        assert INFLUXD is not None
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        http_port, rpc_port = free_ports(2)
        self.url = f"http://127.0.0.1:{http_port}"
        self.config = root / "influxdb.conf"
        self.config.write_text(f"""reporting-disabled = true
bind-address = "127.0.0.1:{rpc_port}"
[meta]
  dir = "{root / 'meta'}"
[data]
  dir = "{root / 'data'}"
  wal-dir = "{root / 'wal'}"
  query-log-enabled = false
[http]
  enabled = true
  bind-address = "127.0.0.1:{http_port}"
  log-enabled = false
[monitor]
  store-enabled = false
[continuous_queries]
  enabled = false
""")
        self.log = root / "influxd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert INFLUXD is not None
        self.proc = start_group([INFLUXD, "-config", str(self.config)], self.log)
        poll("influxd answering /ping", lambda: httpx.get(f"{self.url}/ping", timeout=2).status_code == 204,
             log=lambda: self.log.read_text(errors="replace"))

    def kill(self) -> None:
        kill_group(self.proc)
        self.proc = None

    def query(self, q: str) -> list[dict[str, Any]]:
        response = httpx.post(f"{self.url}/query", params={"db": DATABASE, "epoch": "ms"}, data={"q": q},
                              timeout=10)
        assert response.status_code == 200, response.text
        result = response.json()["results"][0]
        assert "error" not in result, result
        series: list[dict[str, Any]] = result.get("series") or []
        return series

    def write(self, lines: str, database: str = DATABASE) -> None:
        """InfluxDB line protocol with millisecond timestamps, as the metrics push sends it."""
        response = httpx.post(f"{self.url}/write", params={"db": database, "precision": "ms"},
                              content=lines.encode(), timeout=10)
        assert response.status_code == 204, response.text

    def keys(self, q: str) -> set[str]:
        return {row[0] for s in self.query(q) for row in s["values"]}

    def times(self, measure: str, field: str) -> set[int]:
        return {row[0] for s in self.query(f'SELECT "{field}" FROM "{measure}"') for row in s["values"]}


class Prometheus:
    """Prometheus servers started in `root`, each scraping `targets` (job -> host:port); `stop()` kills all."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, targets: dict[str, str], scrape_interval: str = "3s") -> str:
        """The server's base URL, once it is ready. A generous default interval: on a loaded machine one
        scrape of a whole --role=all can take a while (the timeout is the interval)."""
        assert PROMETHEUS is not None
        root = self.root / f"prometheus-{len(self.procs)}"
        root.mkdir(parents=True)
        (port,) = free_ports(1)
        config = root / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval,
                       "evaluation_interval": scrape_interval},
            "scrape_configs": [{"job_name": job, "metrics_path": "/metrics",
                                "static_configs": [{"targets": [target]}]} for job, target in targets.items()]}))
        log = root / "prometheus.log"
        self.procs.append(start_group([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={root / 'data'}",
                                       f"--web.listen-address=127.0.0.1:{port}"], log))
        url = f"http://127.0.0.1:{port}"
        poll("prometheus ready", lambda: httpx.get(f"{url}/-/ready", timeout=2).status_code == 200,
             log=lambda: log.read_text(errors="replace"))
        return url

    def stop(self) -> None:
        for proc in self.procs:
            kill_group(proc)


def prom_query(url: str, query: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{url}/api/v1/query", params={"query": query}, timeout=10)
    assert response.status_code == 200, response.text
    result: list[dict[str, Any]] = response.json()["data"]["result"]
    return result
