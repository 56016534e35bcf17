"""Real `tfusion --role=controller` processes against the embedded API server, with the default
leader-election timings (lease 15 s, renew deadline 10 s, retry 2 s): racing replicas elect one
leader; SIGTERM of the leader releases the Lease so a standby leads within 5 s; after kill -9 of
the leader a standby leads within 20 s (the lease must expire: ≤ 15 s + one retry period)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.apiserver_fixture import apply_crds_sync
from tests.helpers.controller_process import ControllerProcess, seconds_until
from tfusion.kube.leader import LEASE_NAME


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


def lease_holder(apiserver: Any) -> str:
    url = f"{apiserver.url}/apis/coordination.k8s.io/v1/namespaces/tensor-fusion-sys/leases/{LEASE_NAME}"
    response = httpx.get(url, headers=apiserver.headers, verify=apiserver.ssl_context, timeout=5)
    return str(response.json()["spec"]["holderIdentity"])


def test_racing_controllers_elect_one_and_sigterm_hands_over_within_5s(apiserver: Any, spawn: Any) -> None:
    a, b = spawn("ctl-a"), spawn("ctl-b")
    a.wait_listening()
    b.wait_listening()
    seconds_until(lambda: a.is_leader() or b.is_leader(), 10, "a leader elected")
    time.sleep(2.5)  # more than a retry period: the follower has tried and must have lost
    metrics = (a.leader_metric(), b.leader_metric())
    assert sorted(metrics) == [0.0, 1.0], metrics
    leader, follower = (a, b) if metrics[0] == 1.0 else (b, a)
    assert lease_holder(apiserver) == leader.name, "the identity is the pod name (stable)"
    ready = httpx.get(f"http://127.0.0.1:{follower.port}/readyz", timeout=2)
    assert ready.status_code == 200, ready.text

    signalled = time.monotonic()
    leader.proc.send_signal(signal.SIGTERM)
    handover = seconds_until(follower.is_leader, 5, "the follower leading after SIGTERM")
    print(f"handover after SIGTERM: {handover:.1f} s")
    assert handover < 5
    assert leader.proc.wait(max(0.1, 5 - (time.monotonic() - signalled))) == 0, "".join(leader.lines)
    assert time.monotonic() - signalled < 5, "SIGTERM must shut the controller down within 5 s"
    assert lease_holder(apiserver) == follower.name


@pytest.mark.slow
def test_kill_9_of_the_leader_fails_over_within_20s(apiserver: Any, spawn: Any) -> None:
    a = spawn("ctl-a")
    a.wait_listening()
    seconds_until(a.is_leader, 10, "the first controller leading")
    b = spawn("ctl-b")
    b.wait_listening()
    time.sleep(2.5)
    assert b.leader_metric() == 0.0
    a.proc.kill()
    a.proc.wait(5)
    failover = seconds_until(b.is_leader, 20, "the standby leading after kill -9")
    print(f"failover after kill -9: {failover:.1f} s")
    assert failover < 20
    assert lease_holder(apiserver) == "ctl-b"


def test_a_restarted_replica_takes_its_own_lease_back_at_once(apiserver: Any, spawn: Any) -> None:
    """After kill -9 the Lease still names the dead process for up to 15 s; a replica restarted
    with the same identity (the pod name) renews it at once instead of waiting it out."""
    first = spawn("ctl-same")
    first.wait_listening()
    seconds_until(first.is_leader, 10, "the controller leading")
    first.proc.kill()
    first.proc.wait(5)
    again = spawn("ctl-same")
    again.wait_listening()
    took = seconds_until(again.is_leader, 20, "the restarted replica leading")
    print(f"a restarted replica led again after {took:.1f} s")
    assert took < 10, "it must not wait for its own Lease to expire (15 s after the kill)"
    assert lease_holder(apiserver) == "ctl-same"
