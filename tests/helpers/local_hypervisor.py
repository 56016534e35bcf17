"""A hypervisor on the local backend in a test, a worker on it with a scripted load, and the Node and
GPUNode through which a controller reaches it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx

from tests.helpers import eventually
from tfusion.hypervisor import role
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient
from tfusion.settings import Settings

SPEC = "sim:2xA100-SXM4-80GB,1xH100-SXM5-80GB"
GIB = 1024 ** 3


def settings_for(state: Path, **extra: Any) -> Settings:
    flags = {"backend": "local", "devices": SPEC, "hypervisor_port": 0, "state_dir": str(state),
             "metrics_output_path": str(state / "metrics.log"), "metrics_interval": 0.3, "node_name": "box-1",
             **extra}
    return Settings.load(flags, env={}, roles=("hypervisor",))


@asynccontextmanager
async def hypervisor(state: Path, **extra: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with anyio.create_task_group() as tg:
        port = await tg.start(role.run, settings_for(state, **extra))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            yield client
        tg.cancel_scope.cancel()


async def worker_with_load(http: httpx.AsyncClient, state: Path) -> tuple[str, str]:
    """A local worker "trainer" whose process the simulated driver shows on the H100 at 40 % and 3 GiB;
    returns (its UID, the H100's UUID) once the hypervisor's sample has it."""
    h100 = (await http.get("/api/v1/devices")).json()["data"][2]["UUID"]
    created = await http.post("/api/v1/workers", json={
        "name": "trainer", "requests": {"tflops": "100", "vram": "8Gi"}, "gpuIds": [h100],
        "command": ["sleep", "60"]})
    assert created.status_code == 201, created.text
    info = created.json()["data"]["WorkerInfo"]
    (state / "sim-load.json").write_text(json.dumps({"processes": [
        {"pid": info["WorkerRunningInfo"]["pid"], "device": 2, "memoryBytes": 3 * GIB, "computePercent": 40}]}))

    async def sampled() -> bool:
        rows = (await http.get("/api/v1/usage")).json()["data"]
        return any(row["memory_bytes"] for row in rows)

    await eventually(sampled, what="the worker's usage in the hypervisor's sample")
    return info["WorkerUID"], h100


async def gpunode_at(kube: KubeClient, name: str, address: str, phase: str) -> None:
    """A Node with InternalIP `address` and its GPUNode in `phase` (no GPUs)."""
    await kube.create(r.NODES, {"metadata": {"name": name}})
    await kube.patch(r.NODES, name, {"status": {"addresses": [{"type": "InternalIP", "address": address}]}},
                     subresource="status")
    await kube.create(r.GPUNODES, {"metadata": {"name": name}, "spec": {}})
    await kube.patch(r.GPUNODES, name, {"status": {"phase": phase, "managedGPUs": 0, "totalGPUs": 0,
                                                   "totalTFlops": "0", "totalVRAM": "0"}}, subresource="status")
