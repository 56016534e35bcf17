"""Soft isolation in `tfusion --role=all`: a soft pod bound to a simulated GPU gets its shared-memory
file (under the state directory) with its limits and a live heartbeat; a C program reading the file
agrees with `/api/v1/pod`; `POST /api/v1/process` puts a real process's PID in the set; the Node
lists the device plugins' index resources."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import c as creader
from tests.helpers.role_all import NODE, RoleAll

POD = "soft-e2e"


@pytest.fixture
def run(tmp_path: Path) -> Iterator[RoleAll]:
    process = RoleAll(tmp_path)
    process.start()
    try:
        yield process
    finally:
        if process.proc is not None and process.proc.poll() is None:
            code, _ = process.stop()
            assert code == 0, process.output()


def test_a_soft_pod_gets_its_shared_memory(run: RoleAll, tmp_path: Path) -> None:
    if creader.gcc() is None:
        pytest.skip("no C compiler")
    reader = creader.build(tmp_path / "reader")
    run.wait_for("tfusion to be ready", run.ready, timeout=60)
    node = run.get(f"/api/v1/nodes/{NODE}")
    assert node["status"]["allocatable"]["tensor-fusion.ai/index_0"] == "36"
    assert node["status"]["allocatable"]["tensor-fusion.ai/index_f"] == "36"

    auth = run._api_auth()
    pods = f"{run.api}/api/v1/namespaces/default/pods"
    created = httpx.post(pods, timeout=10, **auth, json={
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": POD, "labels": {"tensor-fusion.ai/enabled": "true"},
                     "annotations": {"tensor-fusion.ai/tflops-request": "20", "tensor-fusion.ai/tflops-limit": "40",
                                     "tensor-fusion.ai/vram-request": "4Gi", "tensor-fusion.ai/vram-limit": "8Gi"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}})
    assert created.status_code == 201, created.text

    def running() -> dict[str, Any] | None:
        pod: dict[str, Any] = run.get(f"/api/v1/namespaces/default/pods/{POD}")
        return pod if (pod.get("status") or {}).get("phase") == "Running" else None

    pod = run.wait_for("the soft pod to run", running, timeout=60)
    assert pod["metadata"]["annotations"]["tensor-fusion.ai/isolation"] == "soft"
    shm = tmp_path / "shm" / "default" / POD / "shm"

    def mapped() -> dict[str, Any] | None:
        if not shm.is_file():
            return None
        seen: dict[str, Any] = creader.run(reader, shm)
        return seen if seen["devices"] else None

    seen = run.wait_for("the pod's shared-memory file", mapped, timeout=30)
    legacy = httpx.get(f"{run.hypervisor}/api/v1/pod", timeout=5).json()
    mine = next(p for p in legacy["pods"] if p["pod_name"] == POD)
    device = seen["devices"][0]
    assert [device["uuid"].lower()] == mine["gpu_uuids"]
    assert device["mem_limit"] == mine["vram_limit"] == 8 * 1024**3
    gpu = pod["metadata"]["annotations"]["tensor-fusion.ai/gpu-ids"]
    assert device["uuid"].lower() == gpu and device["is_active"] == 1
    run.wait_for("a live heartbeat", lambda: creader.run(reader, shm)["last_heartbeat"] > seen["last_heartbeat"])

    token = _pod_token(run, pod)
    env = {**os.environ, "POD_NAME": POD, "POD_NAMESPACE": "default", "CONTAINER_NAME": "main"}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        answer = httpx.post(f"{run.hypervisor}/api/v1/process", timeout=10,
                            params={"container_name": "main", "container_pid": str(child.pid)},
                            headers={"Authorization": f"Bearer {token}"}).json()
        assert answer["success"] is True, answer
        assert creader.run(reader, shm, "pids")["pids"] == [child.pid]
    finally:
        child.kill()
        child.wait()

    assert httpx.delete(f"{pods}/{POD}", timeout=5, **auth).status_code == 200
    run.wait_for("the shared memory to go with the pod", lambda: not shm.parent.exists(), timeout=30)


def _pod_token(run: RoleAll, pod: dict[str, Any]) -> str:
    account = pod["spec"].get("serviceAccountName") or "default"
    url = f"{run.api}/api/v1/namespaces/default/serviceaccounts/{account}/token"
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": POD,
                                        "uid": pod["metadata"]["uid"]}}}
    response = run.wait_for("a token for the pod", lambda: (lambda r: r if r.status_code == 201 else None)(
        httpx.post(url, json=body, timeout=5, **run._api_auth())))
    token: str = response.json()["status"]["token"]
    return token
