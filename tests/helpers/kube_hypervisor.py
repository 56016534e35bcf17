"""A hypervisor on the kubernetes backend in a test, its pool and node, and worker pods for it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.apiserver_fixture import ApiServerHandle, apply_crds
from tfusion.api import annotations as tfa
from tfusion.hypervisor import role
from tfusion.kube.client import KubeClient
from tfusion.kube.resources import GPUNODES, GPUPOOLS, PODS
from tfusion.settings import Settings

NODE = "gpu-node-1"


SPEC = "sim:2xA100-SXM4-80GB,1xH100-SXM5-80GB"


@asynccontextmanager
async def kube_hypervisor(apiserver: ApiServerHandle, state: Path, *, node: str = NODE, devices: str = SPEC,
                          plugin_dir: Path | None = None,
                          extra: dict[str, object] | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """The hypervisor role on the kubernetes backend in this process, its state (and shared memory)
    under `state`; with `plugin_dir`, its device plugins serve there; `extra` adds settings (flag
    values by attribute). Yields a client of its API."""
    values: dict[str, object] = {
        "backend": "kubernetes", "devices": devices, "hypervisor_port": 0, "node_name": node,
        "kube": apiserver.kubeconfig, "state_dir": str(state), "shm_root": str(state / "shm"),
        "metrics_output_path": str(state / "metrics.log")}
    if plugin_dir is not None:
        values["device_plugin_dir"] = str(plugin_dir)
    values.update(extra or {})
    settings = Settings.load(values, env={}, roles=("hypervisor",))
    async with anyio.create_task_group() as tg:
        port = await tg.start(role.run, settings)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            yield http
        tg.cancel_scope.cancel()


@pytest.fixture(name="kube")
async def kube_with_crds(apiserver: ApiServerHandle) -> AsyncIterator[KubeClient]:
    await apply_crds(apiserver)
    client = await KubeClient.connect(apiserver.kubeconfig)
    try:
        yield client
    finally:
        await client.close()


async def create_pool_and_node(kube: KubeClient) -> dict[str, Any]:
    pool = await kube.create(GPUPOOLS, {"metadata": {"name": "pool-a"}, "spec": {"nodeManagerConfig": {}}})
    return await kube.create(GPUNODES, {"metadata": {"name": NODE, "ownerReferences": [{
        "apiVersion": "tensor-fusion.ai/v1", "kind": "GPUPool", "name": "pool-a", "uid": pool["metadata"]["uid"],
        "controller": True}]}, "spec": {}})


async def worker_pod(kube: KubeClient, name: str, gpu_ids: list[str], **notes: str) -> dict[str, Any]:
    return await kube.create(PODS, {
        "metadata": {"name": name, "namespace": "default", "labels": {tfa.COMPONENT: "worker"},
                     "annotations": {tfa.GPU_IDS: ",".join(gpu_ids), tfa.GPU_POOL: "pool-a",
                                     tfa.TFLOPS_REQUEST: "100", tfa.VRAM_REQUEST: "8Gi",
                                     tfa.TFLOPS_LIMIT: "200", tfa.VRAM_LIMIT: "16Gi", **notes}},
        "spec": {"nodeName": NODE, "serviceAccountName": "default",
                 "containers": [{"name": "main", "image": "busybox"}]}})
