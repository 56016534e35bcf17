"""A hypervisor with soft isolation and the node and pool it serves."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx

from tests.apiserver_fixture import ApiServerHandle
from tfusion.hypervisor import role
from tfusion.kube.client import KubeClient
from tfusion.kube.resources import GPUNODES, GPUPOOLS, SERVICEACCOUNTS
from tfusion.settings import Settings

NODE = "gpu-node-soft"


SPEC = "sim:2xA100-SXM4-80GB,1xH100-SXM5-80GB"


@asynccontextmanager
async def hypervisor(apiserver: ApiServerHandle, state: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings.load({"backend": "kubernetes", "devices": SPEC, "hypervisor_port": 0, "node_name": NODE,
                              "kube": apiserver.kubeconfig, "state_dir": str(state), "shm_root": str(state / "shm"),
                              "metrics_output_path": str(state / "metrics.log")}, env={}, roles=("hypervisor",))
    async with anyio.create_task_group() as tg:
        port = await tg.start(role.run, settings)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            yield http
        tg.cancel_scope.cancel()


async def setup_node(kube: KubeClient) -> None:
    pool = await kube.create(GPUPOOLS, {"metadata": {"name": "pool-soft"}, "spec": {"nodeManagerConfig": {}}})
    await kube.create(GPUNODES, {"metadata": {"name": NODE, "ownerReferences": [{
        "apiVersion": "tensor-fusion.ai/v1", "kind": "GPUPool", "name": "pool-soft",
        "uid": pool["metadata"]["uid"], "controller": True}]}, "spec": {}})
    try:
        await kube.create(SERVICEACCOUNTS, {"metadata": {"name": "default", "namespace": "default"}})
    except Exception:  # the API server may have made it
        pass
