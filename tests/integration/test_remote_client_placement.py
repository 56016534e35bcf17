"""A remote vGPU client pod holds no GPU (its workers do), yet it keeps the GPU request annotations
and may name tensor-fusion-scheduler (deploy/examples/my-pod.yaml made remote does). The built-in
scheduler and the kube-scheduler extender place it as any pod, by the node checks alone and without
gpu-ids, as the original's GPU plugins skip every pod that is not a worker. It used to stay Pending
("the pod asks for GPUs but lacks the label tensor-fusion.ai/component=worker") while its worker ran.
In-process controller against the embedded API server, over HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.controller import controllers, create_gpu, create_pool, kube_client, settings_for, start_controller
from tests.helpers.scheduler import bound, create_node, gpu_pod
from tfusion.api import annotations as tfa
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient

pytestmark = pytest.mark.anyio


def client_pod(name: str) -> dict[str, Any]:
    """A pod as the webhook leaves a remote client: component=client, its request annotations kept."""
    pod = gpu_pod(name, extra={tfa.IS_LOCAL_GPU: "false"})
    pod["metadata"]["labels"] = {tfa.COMPONENT: tfa.COMPONENT_CLIENT}
    return pod


async def one_node(kube: KubeClient) -> None:
    """node-a with one GPU of the pool, which the client must not take."""
    await create_pool(kube)
    await create_node(kube, "node-a")
    await create_gpu(kube, "gpu-a1", "node-a")


async def test_the_builtin_scheduler_binds_a_client_pod_without_gpus(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await one_node(kube)
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path, scheduler="builtin",
                                                          enable_webhooks=False))
            await kube.create(r.PODS, client_pod("client-1"))
            pod = await eventually(lambda: bound(kube, "client-1"), 15, what="the client pod bound")
            assert pod["spec"]["nodeName"] == "node-a"
            assert tfa.GPU_IDS not in pod["metadata"]["annotations"]
            allocator = ctl.service.allocator
            assert allocator is not None and allocator.allocations() == {}


async def test_the_extender_passes_and_binds_a_client_pod_without_gpus(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await one_node(kube)
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path, scheduler="extender",
                                                          enable_webhooks=False))
            await eventually(lambda: ctl.service.allocator is not None, what="the allocator ready")
            pod = await kube.create(r.PODS, client_pod("client-2"))
            names = ["node-a"]
            passed = (await ctl.http.post("/scheduler/filter", json={"Pod": pod, "NodeNames": names})).json()
            assert (passed["NodeNames"], passed["FailedNodes"], passed["Error"]) == (names, {}, "")
            answer = (await ctl.http.post("/scheduler/bind", json={
                "PodName": "client-2", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"],
                "Node": "node-a"})).json()
            assert answer == {"Error": ""}
            placed = await kube.get(r.PODS, "client-2", namespace="default")
            assert placed["spec"]["nodeName"] == "node-a"
            assert tfa.GPU_IDS not in placed["metadata"]["annotations"]
            allocator = ctl.service.allocator
            assert allocator is not None and allocator.allocations() == {}
