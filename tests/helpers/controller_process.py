"""A controller started as a separate process, and a wall-clock wait for what it does."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

LISTENING = re.compile(r"controller HTTP API listening on http://[\d.]+:(\d+)")


KILL_GRACE_S = 5.0


class ControllerProcess:
    """One controller subprocess; its stderr is drained by a thread (which also finds its port)."""

    def __init__(self, name: str, kubeconfig: str, tmp_path: Path) -> None:
        self.name = name
        self.lines: list[str] = []
        self.port: int | None = None
        self._port_known = threading.Event()
        env = {**os.environ, "POD_NAME": name}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tfusion", "--role=controller", f"--kube={kubeconfig}",
             "--controller-listen", "127.0.0.1:0", "--health-probe-bind-address", "127.0.0.1:0",
             "--webhook-listen", "127.0.0.1:0",
             "--dynamic-config", str(tmp_path / f"{name}.yaml")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            match = LISTENING.search(line)
            if match:
                self.port = int(match.group(1))
                self._port_known.set()

    def wait_listening(self, timeout: float = 15) -> int:
        if not self._port_known.wait(timeout):
            raise AssertionError(f"{self.name} never listened; stderr:\n{''.join(self.lines)}")
        assert self.port is not None
        return self.port

    def leader_metric(self) -> float | None:
        try:
            text = httpx.get(f"http://127.0.0.1:{self.wait_listening()}/metrics", timeout=2).text
        except httpx.HTTPError:
            return None
        for line in text.splitlines():
            if line.startswith("tfusion_leader "):
                return float(line.split()[1])
        return None

    def is_leader(self) -> bool:
        return self.leader_metric() == 1.0

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period (`timeout -s KILL` semantics)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def seconds_until(predicate: Any, timeout: float, what: str) -> float:
    """`wait_until` that returns how long it took, for tests that bound a hand-over or fail-over time."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(0.05)
    return time.monotonic() - started
