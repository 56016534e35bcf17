"""The autoscaler's end-to-end scene in `--role=all`: an autoscaled worker pod asking 40 TFLOPS / 8 GiB
(limits 80 / 16 GiB) whose real process, in the simulated driver's script, uses a steady share of its
GPU; its workload's autoScalingConfig made short enough for a test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.helpers.role_all import TF, RoleAll
from tfusion.api.quantity import Quantity

GIB = 1024 ** 3
USED_TFLOPS = 10.0
USED_VRAM = 2 * GIB
AUTO_SET = {"enable": True, "initialDelayPeriod": "0s", "historyDataPeriod": "1h"}


def quantity(text: object) -> float:
    return Quantity.parse(str(text)).milli_value() / 1000


def interval_config(tmp: Path) -> Path:
    """A dynamic config with a one-second autoscaling interval."""
    config = tmp / "dynamic-config.yaml"
    config.write_text("autoScalingInterval: 1s\n")
    return config


def scaling_role_all(tmp: Path, *extra: str) -> RoleAll:
    """A --role=all process (not started) whose autoscaler passes every second."""
    process = RoleAll(tmp)
    process.args.extend(["--dynamic-config", str(interval_config(tmp)), *extra])
    return process


@contextmanager
def running(process: RoleAll) -> Iterator[RoleAll]:
    """The process started, shut down after, and the shipped RBAC never refused it."""
    process.start()
    try:
        yield process
    finally:
        process.shut_down()
    assert process.denials() == [], "the shipped RBAC refused the controller or the hypervisor"


def create_worker(run: RoleAll, name: str) -> dict[str, Any]:
    """The autoscaled pod, running on a GPU (the webhook enables autoSetResources from the annotation)."""
    created = httpx.post(f"{run.api}/api/v1/namespaces/default/pods", timeout=10, **run._api_auth(), json={
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"tensor-fusion.ai/enabled": "true"},
                     "annotations": {"tensor-fusion.ai/tflops-request": "40", "tensor-fusion.ai/tflops-limit": "80",
                                     "tensor-fusion.ai/vram-request": "8Gi", "tensor-fusion.ai/vram-limit": "16Gi",
                                     "tensor-fusion.ai/autoscale": "true"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}})
    assert created.status_code == 201, created.text

    def running() -> dict[str, Any] | None:
        pod: dict[str, Any] = run.get(f"/api/v1/namespaces/default/pods/{name}")
        return pod if (pod.get("status") or {}).get("phase") == "Running" else None

    return run.wait_for("the autoscaled worker to run", running, timeout=60)


def patch_autoscaling(run: RoleAll, workload: str, config: dict[str, Any]) -> None:
    auth = run._api_auth()
    response = httpx.patch(f"{run.api}{TF}/namespaces/default/tensorfusionworkloads/{workload}", timeout=10,
                           verify=auth["verify"], headers={**auth["headers"],
                                                           "content-type": "application/merge-patch+json"},
                           json={"spec": {"autoScalingConfig": config}})
    assert response.status_code == 200, response.text


def workload_of(run: RoleAll, workload: str) -> dict[str, Any]:
    found: dict[str, Any] = run.get(f"{TF}/namespaces/default/tensorfusionworkloads/{workload}")
    return found


@contextmanager
def steady_load(run: RoleAll, pod: dict[str, Any]) -> Iterator[None]:
    """A real process of the pod (POD_NAME/POD_NAMESPACE as the kubelet sets them) using USED_TFLOPS and
    USED_VRAM of its GPU, through the simulated driver's load file in the state directory."""
    name = pod["metadata"]["name"]
    gpu = pod["metadata"]["annotations"]["tensor-fusion.ai/gpu-ids"]
    device = httpx.get(f"{run.hypervisor}/api/v1/devices/{gpu}", timeout=5).json()["data"]
    percent = USED_TFLOPS / float(device["MaxTflops"]) * 100
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             env={**os.environ, "POD_NAME": name, "POD_NAMESPACE": "default"})
    try:
        load = run.tmp / "hv" / "sim-load.json"
        load.parent.mkdir(exist_ok=True)
        load.write_text(json.dumps({"processes": [
            {"pid": child.pid, "device": gpu, "memoryBytes": USED_VRAM, "computePercent": percent}]}))
        yield
    finally:
        child.kill()
        child.wait()


def near(value: float, expected: float, error: float = 0.06) -> bool:
    """Within the histograms' bucket error (under 5 %) of `expected`."""
    return abs(value - expected) <= expected * error
