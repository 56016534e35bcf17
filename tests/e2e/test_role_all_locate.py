"""`tfusion --role=all` as a user meets it: the leader advertises its HTTP API in the leader-info
ConfigMap, `tfusion why` finds the controller there without `--controller`, and the controller's
`GET /api/usage` answers with the simulated node's hypervisor asked.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import httpx

from tests.helpers.role_all import RoleAll

P = "tensor-fusion.ai/"
PODS = "/api/v1/namespaces/default/pods"
LEADER_INFO = "/api/v1/namespaces/tensor-fusion-sys/configmaps/tensor-fusion-operator-leader-info"


def refusal(run: RoleAll, name: str) -> str | None:
    pod: dict[str, Any] = run.get(f"{PODS}/{name}")
    found = [c for c in (pod.get("status") or {}).get("conditions") or []
             if c["type"] == "PodScheduled" and c["status"] == "False"]
    return found[0]["message"] if found else None


def test_why_finds_the_controller_through_the_leader_info(role_all_ready: RoleAll) -> None:
    run = role_all_ready
    info = run.wait_for("the leader's api-url", lambda: run.get(LEADER_INFO)["data"].get("api-url"), timeout=30)
    assert info == run.controller, "bound to loopback in --role=all: the loopback URL"

    created = httpx.post(f"{run.api}{PODS}", timeout=10, **run._api_auth(), json={
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "huge", "labels": {P + "enabled": "true"},
                     "annotations": {P + "tflops-request": "10", P + "vram-request": "500Gi"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}})
    assert created.status_code == 201, created.text
    run.wait_for("the huge pod refused", lambda: refusal(run, "huge"), timeout=30)
    why = subprocess.run([sys.executable, "-m", "tfusion", "why", "--kube", str(run.kubeconfig), "huge"],
                         capture_output=True, text=True, timeout=60)
    assert why.returncode == 0, why.stderr
    assert "Why: 0/1 nodes are available" in why.stdout, why.stdout
    assert "shown: the pod's condition only" not in why.stdout, why.stdout


def test_the_controller_serves_current_usage(role_all_ready: RoleAll) -> None:
    run = role_all_ready

    def answered() -> dict[str, Any] | None:
        response = httpx.get(f"{run.controller}/api/usage", timeout=10)
        return response.json() if response.status_code == 200 else None

    body = run.wait_for("GET /api/usage from the leader", answered, timeout=30)
    assert body["unreachable"] == {}, "the simulated node's hypervisor answers"
    assert isinstance(body["data"], list) and body["at"] > 0
