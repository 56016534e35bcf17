"""Real `tfusion --role=controller` processes against the embedded API server, with the default
leader-election timings (lease 15 s, renew deadline 10 s, retry 2 s): racing replicas elect one
leader; SIGTERM of the leader releases the Lease so a standby leads within 5 s; after kill -9 of
the leader a standby leads within 20 s (the lease must expire: ≤ 15 s + one retry period)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.apiserver_fixture import apply_crds_sync
from tfusion.kube.leader import LEASE_NAME

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


@pytest.fixture
def spawn(apiserver: Any, tmp_path: Path) -> Iterator[Any]:
    apply_crds_sync(apiserver)
    started: list[ControllerProcess] = []

    def start(name: str) -> ControllerProcess:
        process = ControllerProcess(name, str(apiserver.kubeconfig), tmp_path)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


def wait_until(predicate: Any, timeout: float, what: str) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(0.05)
    return time.monotonic() - started


def lease_holder(apiserver: Any) -> str:
    url = f"{apiserver.url}/apis/coordination.k8s.io/v1/namespaces/tensor-fusion-sys/leases/{LEASE_NAME}"
    response = httpx.get(url, headers=apiserver.headers, verify=apiserver.ssl_context, timeout=5)
    return str(response.json()["spec"]["holderIdentity"])


def test_racing_controllers_elect_one_and_sigterm_hands_over_within_5s(apiserver: Any, spawn: Any) -> None:
    a, b = spawn("ctl-a"), spawn("ctl-b")
    a.wait_listening()
    b.wait_listening()
    wait_until(lambda: a.is_leader() or b.is_leader(), 10, "a leader elected")
    time.sleep(2.5)  # more than a retry period: the follower has tried and must have lost
    metrics = (a.leader_metric(), b.leader_metric())
    assert sorted(metrics) == [0.0, 1.0], metrics
    leader, follower = (a, b) if metrics[0] == 1.0 else (b, a)
    assert lease_holder(apiserver) == leader.name, "the identity is the pod name (stable)"
    ready = httpx.get(f"http://127.0.0.1:{follower.port}/readyz", timeout=2)
    assert ready.status_code == 200, ready.text

    signalled = time.monotonic()
    leader.proc.send_signal(signal.SIGTERM)
    handover = wait_until(follower.is_leader, 5, "the follower leading after SIGTERM")
    print(f"handover after SIGTERM: {handover:.1f} s")
    assert handover < 5
    assert leader.proc.wait(max(0.1, 5 - (time.monotonic() - signalled))) == 0, "".join(leader.lines)
    assert time.monotonic() - signalled < 5, "SIGTERM must shut the controller down within 5 s"
    assert lease_holder(apiserver) == follower.name


@pytest.mark.slow
def test_kill_9_of_the_leader_fails_over_within_20s(apiserver: Any, spawn: Any) -> None:
    a = spawn("ctl-a")
    a.wait_listening()
    wait_until(a.is_leader, 10, "the first controller leading")
    b = spawn("ctl-b")
    b.wait_listening()
    time.sleep(2.5)
    assert b.leader_metric() == 0.0
    a.proc.kill()
    a.proc.wait(5)
    failover = wait_until(b.is_leader, 20, "the standby leading after kill -9")
    print(f"failover after kill -9: {failover:.1f} s")
    assert failover < 20
    assert lease_holder(apiserver) == "ctl-b"


def test_a_restarted_replica_takes_its_own_lease_back_at_once(apiserver: Any, spawn: Any) -> None:
    """After kill -9 the Lease still names the dead process for up to 15 s; a replica restarted
    with the same identity (the pod name) renews it at once instead of waiting it out."""
    first = spawn("ctl-same")
    first.wait_listening()
    wait_until(first.is_leader, 10, "the controller leading")
    first.proc.kill()
    first.proc.wait(5)
    again = spawn("ctl-same")
    again.wait_listening()
    took = wait_until(again.is_leader, 20, "the restarted replica leading")
    print(f"a restarted replica led again after {took:.1f} s")
    assert took < 10, "it must not wait for its own Lease to expire (15 s after the kill)"
    assert lease_holder(apiserver) == "ctl-same"
