"""Progressive migration end to end: one in-process controller (webhook, built-in scheduler, node
reconciler) against the embedded API server, which calls the webhook through its Service. A
native-GPU pod comes back with only `schedulerName` changed, is bound onto the node that runs no
TensorFusion worker (and only where its nvidia.com/gpu fits), waits with the explanation while
every GPU node runs workers; the used-by taint follows the workers; with the mode off nothing of
this happens."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.controller import controllers, kube_client
from tests.helpers.progressive import NATIVE_GPUS, running_worker
from tests.helpers.scheduler import create_node
from tests.helpers.webhook import create_pool_and_provider, serve_webhook, webhook_settings
from tfusion.api import annotations as tfa
from tfusion.controller.webhook.registration import CONFIGURATION_NAME, MUTATING_WEBHOOK_CONFIGURATIONS
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient

pytestmark = pytest.mark.anyio

SCHEDULER = "tensor-fusion-scheduler"
TAINT = {"key": tfa.USED_BY, "value": tfa.USED_BY_TENSOR_FUSION, "effect": "PreferNoSchedule"}
OTHER_TAINT = {"key": "team", "value": "ml", "effect": "PreferNoSchedule"}


@pytest.fixture
async def kube(apiserver: Any) -> AsyncIterator[KubeClient]:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as client:
        await create_pool_and_provider(client)
        await create_node(client, "node-a", taints=[OTHER_TAINT], allocatable=NATIVE_GPUS)
        await create_node(client, "node-b", allocatable=NATIVE_GPUS)
        yield client


def native_pod(name: str, gpus: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "train", "image": "pytorch",
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


async def taints_of(kube: KubeClient, node: str) -> list[dict[str, Any]]:
    return list((await kube.get(r.NODES, node)).get("spec", {}).get("taints") or [])


async def node_of(kube: KubeClient, name: str) -> str:
    return str((await kube.get(r.PODS, name, namespace="default"))["spec"].get("nodeName") or "")


async def unschedulable_message(kube: KubeClient, name: str) -> str:
    pod = await kube.get(r.PODS, name, namespace="default")
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition["type"] == "PodScheduled" and condition["status"] == "False":
            assert condition["reason"] == "Unschedulable"
            return str(condition["message"])
    return ""


async def test_native_gpu_pods_go_to_nodes_without_workers(apiserver: Any, kube: KubeClient, tmp_path: Path) -> None:
    settings = webhook_settings(apiserver, tmp_path, progressive_migration=True)
    async with controllers() as tg:
        await serve_webhook(tg, kube, settings)
        config = await kube.get(MUTATING_WEBHOOK_CONFIGURATIONS, CONFIGURATION_NAME)
        assert config["webhooks"][0]["objectSelector"]["matchExpressions"][0]["operator"] == "NotIn"

        await kube.create(r.PODS, running_worker("worker-a", "node-a"))
        for i in (1, 2):  # node-b holds more pods: spreading alone would pick node-a
            await kube.create(r.PODS, {"metadata": {"name": f"web-{i}", "namespace": "default"},
                                       "spec": {"nodeName": "node-b", "containers": [{"name": "w", "image": "web"}]}})

        async def node_a_tainted() -> bool:
            return await taints_of(kube, "node-a") == [OTHER_TAINT, TAINT]

        await eventually(node_a_tainted, what="the used-by taint on node-a, the team taint kept")
        assert await taints_of(kube, "node-b") == []

        sent = native_pod("native-1", 1)
        created = await kube.create(r.PODS, sent)
        assert created["spec"]["schedulerName"] == SCHEDULER
        assert not created["metadata"].get("labels") and not created["metadata"].get("annotations")
        container = created["spec"]["containers"][0]
        assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
        assert "env" not in container and "initContainers" not in created["spec"]
        assert "tolerations" not in created["spec"]

        async def native_1_bound() -> str:
            return await node_of(kube, "native-1")

        assert await eventually(native_1_bound, what="native-1 bound") == "node-b"
        bound = await kube.get(r.PODS, "native-1", namespace="default")
        assert tfa.GPU_IDS not in (bound["metadata"].get("annotations") or {})
        assert not list(await kube.list(r.TENSORFUSIONWORKLOADS, namespace="default"))
        # the scheduler's Binding is not a worker: node-b stays untainted
        assert await taints_of(kube, "node-b") == []

        # 2 GPUs do not fit beside native-1 on node-b, and node-a runs a worker
        await kube.create(r.PODS, native_pod("native-2", 2))

        async def native_2_message() -> str:
            return await unschedulable_message(kube, "native-2")

        message = await eventually(native_2_message, what="native-2 unschedulable")
        assert message == ("0/2 nodes are available: 1 Insufficient nvidia.com/gpu, "
                           "1 node(s) run TensorFusion workers.")

        # a worker on node-b too: every GPU node runs workers, and the message says so
        await kube.create(r.PODS, running_worker("worker-b", "node-b"))

        async def every_node_busy() -> bool:
            return "Every node with nvidia.com/gpu runs TensorFusion workers" in await native_2_message()

        await eventually(every_node_busy, timeout=30, what="native-2's message naming the busy nodes")
        assert (await native_2_message()).startswith("0/2 nodes are available: 2 node(s) run TensorFusion workers.")

        async def failed_scheduling_reported() -> bool:  # the event recorder writes in the background
            return any(e["involvedObject"].get("name") == "native-2" and e.get("reason") == "FailedScheduling"
                       for e in await kube.list(r.EVENTS, namespace="default"))

        await eventually(failed_scheduling_reported, what="native-2's FailedScheduling event")

        # node-a's worker leaves: its taint goes (the team taint stays), and native-2 fits there
        await kube.delete(r.PODS, "worker-a", namespace="default")

        async def node_a_idle() -> bool:
            return await taints_of(kube, "node-a") == [OTHER_TAINT]

        await eventually(node_a_idle, timeout=20, what="node-a's used-by taint removed")

        async def native_2_bound() -> str:
            return await node_of(kube, "native-2")

        assert await eventually(native_2_bound, timeout=30, what="native-2 bound") == "node-a"

        async def node_b_tainted() -> bool:  # the node reconciler's write, not the scheduler's view
            return any(t == TAINT for t in await taints_of(kube, "node-b"))

        await eventually(node_b_tainted, what="the used-by taint on node-b (worker-b runs there)")


async def test_with_the_mode_off_native_pods_and_taints_are_left_alone(apiserver: Any, kube: KubeClient,
                                                                       tmp_path: Path) -> None:
    async with controllers() as tg:
        ctl = await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path))
        config = await kube.get(MUTATING_WEBHOOK_CONFIGURATIONS, CONFIGURATION_NAME)
        assert config["webhooks"][0]["objectSelector"]["matchExpressions"][0]["operator"] == "In"
        await kube.create(r.PODS, running_worker("worker-a", "node-a"))
        # the worker is in the controller's cache, so the node reconciler has seen it
        pods = ctl.runtime.informer(r.PODS)

        async def cached() -> bool:
            return pods.get("default/worker-a") is not None

        await eventually(cached, what="worker-a in the controller's pod cache")
        created = await kube.create(r.PODS, native_pod("native-1", 1))
        assert created["spec"].get("schedulerName", "default-scheduler") == "default-scheduler"
        # the webhook was asked (the Service routes to it) and answered with no patch
        review = ctl.runtime.webhook
        assert review is not None
        reviews = review.reviews
        labelled = native_pod("native-2", 1)
        labelled["metadata"]["labels"] = {tfa.ENABLED: "true"}
        labelled["metadata"]["annotations"] = {tfa.TFLOPS_REQUEST: "10", tfa.VRAM_REQUEST: "1Gi"}
        assert (await kube.create(r.PODS, labelled))["spec"]["schedulerName"] == SCHEDULER
        assert review.reviews == reviews + 1
        assert await taints_of(kube, "node-a") == [OTHER_TAINT]
