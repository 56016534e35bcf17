"""`--role=all` serves the autoscaler's default usage source without a database: a worker pod's real
process (POD_NAME/POD_NAMESPACE in its environment, as the kubelet would set them) appears in the
simulated driver's process list with a scripted load, and the hypervisor's `GET /api/v1/usage`,
read through the hypervisor source, gives its per-GPU TFLOPS and memory under its workload.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.role_all import NODE, RoleAll
from tfusion.controller.autoscaler.sources import HypervisorUsage, UsageSample

POD = "usage-e2e"
GIB = 1024 ** 3


@pytest.fixture
def run(tmp_path: Path) -> Iterator[RoleAll]:
    process = RoleAll(tmp_path)
    process.args.extend(["--metrics-interval", "1s"])  # how often the hypervisor samples the devices
    process.start()
    try:
        yield process
    finally:
        process.shut_down()


def test_a_worker_process_usage_reaches_the_hypervisor_source(run: RoleAll, tmp_path: Path) -> None:
    run.wait_for("tfusion to be ready", run.ready, timeout=60)
    created = httpx.post(f"{run.api}/api/v1/namespaces/default/pods", timeout=10, **run._api_auth(), json={
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": POD, "labels": {"tensor-fusion.ai/enabled": "true"},
                     "annotations": {"tensor-fusion.ai/tflops-request": "20", "tensor-fusion.ai/vram-request": "8Gi"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}})
    assert created.status_code == 201, created.text

    def running() -> dict[str, Any] | None:
        pod: dict[str, Any] = run.get(f"/api/v1/namespaces/default/pods/{POD}")
        return pod if (pod.get("status") or {}).get("phase") == "Running" else None

    pod = run.wait_for("the worker pod to run", running, timeout=60)
    gpu = pod["metadata"]["annotations"]["tensor-fusion.ai/gpu-ids"]
    workload = pod["metadata"]["labels"]["tensor-fusion.ai/workload"]
    env = {**os.environ, "POD_NAME": POD, "POD_NAMESPACE": "default"}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)
    try:
        load = tmp_path / "hv" / "sim-load.json"  # the simulated driver's script, in --state-dir
        load.parent.mkdir(exist_ok=True)
        load.write_text(json.dumps({"processes": [
            {"pid": child.pid, "device": gpu, "memoryBytes": 2 * GIB, "computePercent": 25}]}))
        source = HypervisorUsage(lambda: {NODE: run.hypervisor})

        def measured() -> list[UsageSample] | None:
            samples = asyncio.run(source.samples(0, 1))
            return samples if any(s.vram_bytes for s in samples) else None

        (sample,) = run.wait_for("the worker's usage from the hypervisor source", measured, timeout=30)
        devices = httpx.get(f"{run.hypervisor}/api/v1/devices/{gpu}", timeout=5).json()["data"]
        assert (sample.namespace, sample.workload, sample.worker, sample.gpu) == ("default", workload, POD, gpu)
        assert sample.vram_bytes == 2 * GIB
        assert sample.tflops_milli == pytest.approx(0.25 * devices["MaxTflops"] * 1000)
        (row,) = httpx.get(f"{run.hypervisor}/api/v1/usage", timeout=5).json()["data"]
        assert row["worker"] == pod["metadata"]["uid"] and row["pod"] == POD
    finally:
        child.kill()
        child.wait()
