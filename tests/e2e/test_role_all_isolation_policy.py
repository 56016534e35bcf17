"""`tfusion --role=all` with TF_ISOLATION_MODE_POLICY=static and =dynamic: both start and place a pod;
the in-process hypervisor reports the controller's policy on its GPUs (`status.isolationPolicy`),
and under dynamic the pod's GPU shows the active mode the pod set."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.role_all import TF, RoleAll, reported_gpus

POD = "policy-e2e"


@pytest.fixture(params=["static", "DYNAMIC"])  # the original reads the variable case-insensitively
def policy_run(request: pytest.FixtureRequest, tmp_path: Path,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RoleAll, bool]]:
    monkeypatch.setenv("TF_ISOLATION_MODE_POLICY", request.param)
    process = RoleAll(tmp_path)
    process.start()
    try:
        yield process, request.param == "DYNAMIC"
    finally:
        process.shut_down()


def test_role_all_starts_and_places_a_pod_under_the_policy(policy_run: tuple[RoleAll, bool]) -> None:
    run, dynamic = policy_run
    run.wait_for("tfusion to be ready", run.ready, timeout=60)
    gpus = run.wait_for("the GPUs to be reported", lambda: reported_gpus(run), timeout=60)
    assert {g["status"].get("isolationPolicy") for g in gpus} == {"Dynamic" if dynamic else "Static"}

    created = httpx.post(f"{run.api}/api/v1/namespaces/default/pods", timeout=10, **run._api_auth(), json={
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": POD, "labels": {"tensor-fusion.ai/enabled": "true"},
                     "annotations": {"tensor-fusion.ai/tflops-request": "10", "tensor-fusion.ai/vram-request": "1Gi"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}})
    assert created.status_code == 201, created.text

    def placed() -> dict[str, Any] | None:
        pod: dict[str, Any] = run.get(f"/api/v1/namespaces/default/pods/{POD}")
        return pod if pod["spec"].get("nodeName") else None

    pod = run.wait_for("the pod to be placed", placed, timeout=60)
    gpu_name = pod["metadata"]["annotations"]["tensor-fusion.ai/gpu-ids"]

    def active_mode() -> str | None:
        status = run.get(f"{TF}/gpus/{gpu_name}").get("status") or {}
        if not dynamic:
            return "absent" if "activeIsolationMode" not in status else None
        return status.get("activeIsolationMode")

    assert run.wait_for("the GPU's active mode", active_mode, timeout=30) == ("soft" if dynamic else "absent")
