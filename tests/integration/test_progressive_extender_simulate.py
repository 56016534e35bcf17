"""Progressive migration outside the built-in loop, in-process controller against the embedded API
server over real HTTP: with `--scheduler=extender` a native-GPU pod (nvidia.com/gpu, no
TensorFusion annotations) is filtered off nodes that run TensorFusion workers in both
nodeCacheCapable modes, scored 0, refused at bind on a busy node and bound plainly (no GPU, no
annotation) on a free one; a worker bound through the extender makes its node busy; when every GPU
node is busy `/api/why` says so. `POST /api/simulate-schedule` reports `progressiveNodeNames` for
such a pod (and the node the scheduler would pick, or each node's reason) and null for a
TensorFusion pod."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.controller import (
    controllers,
    create_gpu,
    create_pool,
    kube_client,
    probe_pod,
    settings_for,
    start_controller,
)
from tests.helpers.progressive import NATIVE_GPUS, running_worker
from tests.helpers.scheduler import create_node, gpu_pod, scheduler_of
from tfusion.api import annotations as tfa
from tfusion.controller.scheduling import progressive
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient

pytestmark = pytest.mark.anyio

SCHEDULER = "tensor-fusion-scheduler"
NODES = ["node-a", "node-b"]


def native_pod(name: str, gpus: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"schedulerName": SCHEDULER, "containers": [
                {"name": "train", "image": "pytorch", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


@pytest.fixture
async def kube(apiserver: Any) -> AsyncIterator[KubeClient]:
    """Two GPU nodes (2 nvidia.com/gpu each, one TensorFusion GPU on node-b); node-a runs a worker."""
    await apply_crds(apiserver)
    async with kube_client(apiserver) as client:
        await create_pool(client)
        await client.create(r.PROVIDERCONFIGS, {"metadata": {"name": "nvidia"}, "spec": {
            "vendor": "NVIDIA", "images": {"middleware": "mw:1"}, "inUseResourceNames": ["nvidia.com/gpu"]}})
        for node in NODES:
            await create_node(client, node, allocatable=NATIVE_GPUS)
        await create_gpu(client, "gpu-b1", "node-b")
        await client.create(r.PODS, running_worker("worker-a", "node-a"))
        yield client


async def controller(tg: Any, apiserver: Any, tmp_path: Path, **settings: Any) -> Any:
    """A controller in progressive mode whose caches hold the ProviderConfig and worker-a, with its
    allocator ready. No webhook: the pods here are written as it would leave them."""
    ctl = await start_controller(tg, settings_for(apiserver, tmp_path, progressive_migration=True,
                                                  enable_webhooks=False, **settings))
    scheduler = scheduler_of(ctl)

    async def ready() -> bool:
        return (ctl.service.allocator is not None and scheduler.native_resource_names() == ("nvidia.com/gpu",)
                and scheduler.nodes_with_workers() == {"node-a"} and len(scheduler.nodes_by_name()) == 2)

    await eventually(ready, what="the allocator ready and the ProviderConfig, nodes and worker-a cached")
    return ctl


async def test_extender_confines_a_native_gpu_pod_in_both_cache_modes(apiserver: Any, kube: KubeClient,
                                                                      tmp_path: Path) -> None:
    async with controllers() as tg:
        ctl = await controller(tg, apiserver, tmp_path, scheduler="extender")
        http = ctl.http
        pod = await kube.create(r.PODS, native_pod("native-1", 1))

        cached = (await http.post("/scheduler/filter", json={"Pod": pod, "Nodes": None, "NodeNames": NODES})).json()
        assert cached == {"Nodes": None, "NodeNames": ["node-b"], "FailedNodes": {"node-a": progressive.RUNS_WORKERS},
                          "FailedAndUnresolvableNodes": {}, "Error": ""}
        items = [await kube.get(r.NODES, n) for n in NODES]
        node_list = {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": items}
        full = (await http.post("/scheduler/filter", json={"Pod": pod, "Nodes": node_list, "NodeNames": None})).json()
        assert full["NodeNames"] is None
        assert full["Nodes"]["items"] == [items[1]]  # node-b, whole
        assert full["FailedNodes"] == {"node-a": progressive.RUNS_WORKERS}

        scores = (await http.post("/scheduler/prioritize", json={"Pod": pod, "NodeNames": NODES})).json()
        assert scores == [{"Host": "node-a", "Score": 0}, {"Host": "node-b", "Score": 0}]

        args = {"PodName": "native-1", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"]}
        refused = (await http.post("/scheduler/bind", json={**args, "Node": "node-a"})).json()["Error"]
        assert "runs TensorFusion workers" in refused and "node-a" in refused
        assert not (await kube.get(r.PODS, "native-1", namespace="default"))["spec"].get("nodeName")

        assert (await http.post("/scheduler/bind", json={**args, "Node": "node-b"})).json() == {"Error": ""}
        bound = await kube.get(r.PODS, "native-1", namespace="default")
        assert bound["spec"]["nodeName"] == "node-b"
        assert tfa.GPU_IDS not in (bound["metadata"].get("annotations") or {})
        allocator = ctl.service.allocator
        assert allocator is not None and allocator.allocations() == {}  # no GPU taken for it


async def test_a_worker_bound_by_the_extender_makes_its_node_busy(apiserver: Any, kube: KubeClient,
                                                                  tmp_path: Path) -> None:
    async with controllers() as tg:
        ctl = await controller(tg, apiserver, tmp_path, scheduler="extender")
        http = ctl.http
        worker = await kube.create(r.PODS, gpu_pod("w1", scheduler="default-scheduler"))
        answer = (await http.post("/scheduler/bind", json={
            "PodName": "w1", "PodNamespace": "default", "PodUID": worker["metadata"]["uid"], "Node": "node-b"})).json()
        assert answer == {"Error": ""}

        pod = await kube.create(r.PODS, native_pod("native-2", 1))
        result = (await http.post("/scheduler/filter", json={"Pod": pod, "NodeNames": NODES})).json()
        assert result["NodeNames"] == []
        assert result["FailedNodes"] == dict.fromkeys(NODES, progressive.RUNS_WORKERS)
        assert result["FailedAndUnresolvableNodes"] == {}

        why = (await http.get("/api/why", params={"name": "native-2"})).json()
        assert why["message"] == ("0/2 nodes are available: 2 node(s) run TensorFusion workers. "
                                  + progressive.every_gpu_node_busy(["nvidia.com/gpu"]))
        assert set(why["nodes"]) == set(NODES) and why["code"] == "Unschedulable"

        # a native pod's bind onto the worker's node is refused as well
        bind = {"PodName": "native-2", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": "node-b"}
        assert "runs TensorFusion workers" in (await http.post("/scheduler/bind", json=bind)).json()["Error"]


async def test_simulate_schedule_reports_progressive_node_names(apiserver: Any, kube: KubeClient,
                                                                tmp_path: Path) -> None:
    async with controllers() as tg:
        ctl = await controller(tg, apiserver, tmp_path)
        http = ctl.http

        fits = await http.post("/api/simulate-schedule", content=json.dumps(native_pod("sim-1", 1)))
        assert fits.status_code == 200, fits.text
        body = fits.json()
        assert body["progressiveNodeNames"] == {"count": 1, "nodes": ["node-b"]}
        assert body["scheduleResult"] == {"SuggestedHost": "node-b", "EvaluatedNodes": 2, "FeasibleNodes": 1}
        assert body["error"] is None and body["gpuSchedulerState"]["FinalGPUs"] == []
        assert body["filterDetail"]["FilterStageDetails"] == [] and body["suggestions"] == []

        # 3 GPUs: more than node-b has, and node-a runs a worker
        too_big = (await http.post("/api/simulate-schedule", content=json.dumps(native_pod("sim-2", 3)))).json()
        assert too_big["progressiveNodeNames"] == {"count": 1, "nodes": ["node-b"]}
        assert too_big["scheduleResult"]["SuggestedHost"] == "" and too_big["scheduleResult"]["FeasibleNodes"] == 0
        error = too_big["error"]
        assert error["message"] == ("0/2 nodes are available: 1 Insufficient nvidia.com/gpu, "
                                    "1 node(s) run TensorFusion workers.")
        statuses = error["diagnosis"]["nodeToStatus"]["nodes"]
        assert statuses["node-a"] == {"code": "Unschedulable", "plugin": progressive.CHECK,
                                      "reasons": [progressive.RUNS_WORKERS], "message": progressive.RUNS_WORKERS}
        assert statuses["node-b"]["plugin"] == "NodeResourcesFit"
        assert statuses["node-b"]["message"] == "Insufficient nvidia.com/gpu: requested 3, available 2"
        assert error["diagnosis"]["unschedulablePlugins"] == ["NodeResourcesFit", progressive.CHECK]
        assert error["explanation"]["message"] == error["message"]

        # a TensorFusion pod is judged by the GPU filters, and has no progressive node names
        tf_pod = (await http.post("/api/simulate-schedule", content=json.dumps(probe_pod()))).json()
        assert tf_pod["progressiveNodeNames"] is None
        assert tf_pod["scheduleResult"]["SuggestedHost"] == "node-b"
        assert tf_pod["gpuSchedulerState"]["FinalGPUs"] == ["gpu-b1"]
