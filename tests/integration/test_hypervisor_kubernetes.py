"""The hypervisor's Kubernetes backend against the embedded API server, over real HTTP:
GPU objects and GPUNode totals, worker pods from the informer, and TokenReview on the limiter routes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.apiserver_fixture import ApiServerHandle, apply_crds
from tfusion.allocator import gpu_from_object
from tfusion.api import annotations
from tfusion.api.quantity import Quantity
from tfusion.hypervisor import role
from tfusion.kube.client import KubeClient, NotFound
from tfusion.kube.resources import GPUNODES, GPUPOOLS, GPUS, PODS, SERVICEACCOUNTS
from tfusion.settings import Settings

pytestmark = pytest.mark.anyio

NODE = "gpu-node-1"
SPEC = "sim:2xA100-SXM4-80GB,1xH100-SXM5-80GB"


@asynccontextmanager
async def kube_hypervisor(apiserver: ApiServerHandle, state: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings.load({"backend": "kubernetes", "devices": SPEC, "hypervisor_port": 0, "node_name": NODE,
                              "kube": apiserver.kubeconfig, "state_dir": str(state),
                              "metrics_output_path": str(state / "metrics.log")}, env={}, roles=("hypervisor",))
    async with anyio.create_task_group() as tg:
        port = await tg.start(role.run, settings)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            yield http
        tg.cancel_scope.cancel()


@pytest.fixture
async def kube(apiserver: ApiServerHandle) -> AsyncIterator[KubeClient]:
    await apply_crds(apiserver)
    client = await KubeClient.connect(apiserver.kubeconfig)
    try:
        yield client
    finally:
        await client.close()


def canonical(quantity: str) -> bool:
    """Written as Kubernetes itself prints the quantity."""
    return str(Quantity(quantity)) == quantity


async def eventually(check: Any, timeout: float = 10.0) -> Any:
    """Retry `check()` (async, raising AssertionError/NotFound while not yet true) until it passes."""
    with anyio.fail_after(timeout):
        while True:
            try:
                return await check()
            except (AssertionError, NotFound, KeyError):
                await anyio.sleep(0.1)


async def create_pool_and_node(kube: KubeClient) -> dict[str, Any]:
    pool = await kube.create(GPUPOOLS, {"metadata": {"name": "pool-a"}, "spec": {"nodeManagerConfig": {}}})
    return await kube.create(GPUNODES, {"metadata": {"name": NODE, "ownerReferences": [{
        "apiVersion": "tensor-fusion.ai/v1", "kind": "GPUPool", "name": "pool-a", "uid": pool["metadata"]["uid"],
        "controller": True}]}, "spec": {}})


async def test_gpu_objects_follow_the_devices(apiserver: ApiServerHandle, kube: KubeClient, tmp_path: Path) -> None:
    async with kube_hypervisor(apiserver, tmp_path) as http:
        ready = await http.get("/readyz")
        assert ready.status_code == 503
        gpunode_condition = next(c for c in ready.json()["conditions"] if c["name"] == "gpunode")
        assert gpunode_condition == {"name": "gpunode", "ready": False,
                                     "message": f"waiting for GPUNode {NODE} (the controller creates it)"}
        assert len(await kube.list(GPUS)) == 0  # nothing is written before the GPUNode exists
        gpunode = await create_pool_and_node(kube)

        async def all_ready() -> None:
            assert (await http.get("/readyz")).status_code == 200

        await eventually(all_ready)
        devices = (await http.get("/api/v1/devices")).json()["data"]
        uuids = [d["UUID"] for d in devices]

        async def three_gpus() -> list[dict[str, Any]]:
            gpus = sorted((await kube.list(GPUS)).items, key=lambda g: (g.get("status") or {}).get("index", -1))
            assert all("capacity" in (g.get("status") or {}) for g in gpus)
            assert [g["metadata"]["name"] for g in gpus] == uuids
            return gpus

        gpus = await eventually(three_gpus)
        h100 = gpus[2]
        meta = h100["metadata"]
        assert meta["labels"] == {annotations.MANAGED_BY: NODE, annotations.GPU_POOL: "pool-a"}
        assert set(meta["annotations"]) == {annotations.LAST_SYNC, annotations.VIRTUALIZATION_CAPABILITIES}
        assert json.loads(meta["annotations"][annotations.VIRTUALIZATION_CAPABILITIES])["SupportsSoftIsolation"]
        # the allocator reads back what the reporter wrote (PascalCase keys): soft and hard allowed
        assert gpu_from_object(h100).virtualization == frozenset({"shared", "soft", "hard"})
        assert meta["ownerReferences"] == [{"apiVersion": "tensor-fusion.ai/v1", "kind": "GPUNode", "name": NODE,
                                            "uid": gpunode["metadata"]["uid"], "controller": True,
                                            "blockOwnerDeletion": True}]
        status = h100["status"]
        assert status["capacity"] == {"tflops": "989", "vram": "81559Mi"}
        assert gpus[0]["status"]["capacity"] == {"tflops": "312", "vram": "80Gi"}  # canonical, not 81920Mi
        assert all(canonical(v) for g in gpus for v in g["status"]["capacity"].values())
        assert status["available"] == status["capacity"]
        assert (status["uuid"], status["gpuModel"], status["index"], status["vendor"]) == (
            uuids[2], "NVIDIA H100 80GB HBM3", 2, "NVIDIA")
        assert status["nodeSelector"] == {"kubernetes.io/hostname": NODE}
        assert (status["usedBy"], status["phase"], status["message"]) == ("tensor-fusion", "Pending", "managed")
        assert (status["isolationMode"], status["isolationPolicy"]) == ("soft", "Static")

        async def node_totals() -> None:
            node_status = (await kube.get(GPUNODES, NODE))["status"]
            assert node_status["totalTFlops"] == "1613" and node_status["totalGPUs"] == 3
            assert node_status["managedGPUs"] == 3 and node_status["managedGPUDeviceIDs"] == uuids
            assert node_status["totalVRAM"] == str(2 * 80 * 1024 + 81559) + "Mi"
            quantities = [node_status["totalTFlops"], node_status["totalVRAM"], *node_status["nodeInfo"].values()]
            assert all(canonical(q) for q in quantities), quantities

        await eventually(node_totals)

        # the controller owns available and runningApps: rediscovery must not touch them
        owned = {"available": {"tflops": "889", "vram": "70Gi"}, "runningApps": [{
            "name": "wl", "namespace": "default", "count": 1}]}
        await kube.patch(GPUS, uuids[2], {"status": owned}, subresource="status")
        await kube.patch(GPUS, uuids[0], {"status": {"phase": "Running"}}, subresource="status")
        (tmp_path / "sim-load.json").write_text(json.dumps({"devices": {
            "0": {"present": False}, "2": {"present": False}, "1": {"healthy": False, "healthMessage": "XID 79"}}}))
        assert (await http.post("/api/v1/devices/discover")).status_code == 200

        async def retired() -> None:
            names = {g["metadata"]["name"]: g for g in (await kube.list(GPUS)).items}
            assert uuids[0] not in names  # idle: deleted
            busy = names[uuids[2]]  # still runs a workload: kept, marked missing
            assert busy["status"]["phase"] == "Unknown"
            assert annotations.GPU_MISSING_SINCE in busy["metadata"]["annotations"]
            assert busy["status"]["available"] == owned["available"]
            assert busy["status"]["runningApps"] == owned["runningApps"]
            sick = names[uuids[1]]["status"]
            assert sick["phase"] == "Unknown" and sick["message"] == "unhealthy: XID 79"

        await eventually(retired)

        # the device comes back: missing-since cleared, phase back to Pending, available untouched
        (tmp_path / "sim-load.json").write_text(json.dumps({"devices": {
            "0": {"present": True}, "2": {"present": True}, "1": {"healthy": True}}}))
        assert (await http.post("/api/v1/devices/discover")).status_code == 200

        async def back() -> None:
            gpu = await kube.get(GPUS, uuids[2])
            assert annotations.GPU_MISSING_SINCE not in (gpu["metadata"].get("annotations") or {})
            assert gpu["status"]["phase"] == "Pending" and gpu["status"]["available"] == owned["available"]
            assert (await kube.get(GPUS, uuids[0]))["status"]["available"]["tflops"] == "312"

        await eventually(back)


async def worker_pod(kube: KubeClient, name: str, gpu_ids: list[str], **notes: str) -> dict[str, Any]:
    return await kube.create(PODS, {
        "metadata": {"name": name, "namespace": "default", "labels": {annotations.COMPONENT: "worker"},
                     "annotations": {annotations.GPU_IDS: ",".join(gpu_ids), annotations.GPU_POOL: "pool-a",
                                     annotations.TFLOPS_REQUEST: "100", annotations.VRAM_REQUEST: "8Gi",
                                     annotations.TFLOPS_LIMIT: "200", annotations.VRAM_LIMIT: "16Gi", **notes}},
        "spec": {"nodeName": NODE, "serviceAccountName": "default",
                 "containers": [{"name": "main", "image": "busybox"}]}})


async def test_worker_pods_and_token_review(apiserver: ApiServerHandle, kube: KubeClient, tmp_path: Path) -> None:
    await create_pool_and_node(kube)
    try:
        await kube.create(SERVICEACCOUNTS, {"metadata": {"name": "default", "namespace": "default"}})
    except Exception:  # the API server may create it itself
        pass
    async with kube_hypervisor(apiserver, tmp_path) as http:
        devices = (await http.get("/api/v1/devices")).json()["data"]
        a100, h100 = devices[0]["UUID"], devices[2]["UUID"]
        pod = await worker_pod(kube, "infer-0", [h100], **{annotations.ISOLATION: "hard",
                                                           annotations.QOS: "high"})
        uid = pod["metadata"]["uid"]
        other_node = await kube.create(PODS, {
            "metadata": {"name": "elsewhere", "namespace": "default", "labels": {annotations.COMPONENT: "worker"},
                         "annotations": {annotations.GPU_IDS: a100}},
            "spec": {"nodeName": "another-node", "containers": [{"name": "main", "image": "busybox"}]}})

        async def listed() -> list[dict[str, Any]]:
            workers = (await http.get("/api/v1/workers")).json()["data"]
            assert [w["WorkerInfo"]["WorkerUID"] for w in workers] == [uid]
            return workers

        workers = await eventually(listed)
        allocation = workers[0]
        assert allocation["Envs"] == {"NVIDIA_VISIBLE_DEVICES": "GPU-" + h100[4:], "TF_CUDA_SM_PERCENT_LIMIT": "21"}
        assert allocation["WorkerInfo"]["Limits"] == {"tflops": "200", "compute": "0", "vram": "16Gi"}
        assert allocation["WorkerInfo"]["QoS"] == "high" and allocation["DeviceInfos"][0]["UUID"] == h100
        one = (await http.get(f"/api/v1/workers/{uid}")).json()["data"]
        assert one["worker_uid"] == uid and one["metrics"] == {h100: {}}
        assert (await http.get(f"/api/v1/workers/{other_node['metadata']['uid']}")).status_code == 404

        token = await kube.request_token("default", "default", bound_pod={"name": "infer-0", "uid": uid})
        assert token
        good = await http.get("/api/v1/pod", params={"container_name": "main"},
                              headers={"Authorization": f"Bearer {token}"})
        assert good.status_code == 200, good.text
        assert good.json() == {"success": True, "message": "Pod infer-0 information retrieved successfully", "data": {
            "pod_name": "infer-0", "namespace": "default", "gpu_uuids": ["GPU-" + h100[4:]], "tflops_limit": 200.0,
            "vram_limit": 16 * 1024**3, "qos_level": "High", "compute_shard": False, "isolation": "hard"}}

        # a token for a pod that is not a worker here: the reviewed identity is used, nothing else
        stranger = await kube.request_token("default", "default",
                                            bound_pod={"name": "elsewhere", "uid": other_node["metadata"]["uid"]})
        foreign_pod = await http.get("/api/v1/pod", headers={"Authorization": f"Bearer {stranger}"})
        assert foreign_pod.status_code == 401, foreign_pod.text
        assert "default/elsewhere" in foreign_pod.json()["error"]

        header, payload, _ = token.split(".")
        forged = f"{header}.{payload}.c2lnbmF0dXJl"  # same claims, wrong signature
        for headers in ({}, {"Authorization": "Bearer not-a-jwt"}, {"Authorization": f"Bearer {forged}"},
                        {"Authorization": f"Basic {token}"}):
            refused = await http.get("/api/v1/pod", params={"container_name": "main"}, headers=headers)
            assert refused.status_code == 401, (headers, refused.text)
            assert "error" in refused.json()
        process = await http.post("/api/v1/process", params={"container_name": "main", "container_pid": "1"},
                                  headers={"Authorization": f"Bearer {forged}"})
        assert process.status_code == 401
        process = await http.post("/api/v1/process", params={"container_name": "main", "container_pid": "4242"},
                                  headers={"Authorization": f"Bearer {token}"})
        assert process.json()["success"] is False  # no such process in this machine's /proc
        assert "process not found for pod default/infer-0 container main pid 4242" in process.json()["message"]

        legacy = (await http.get("/api/v1/pod")).json()
        assert legacy == {"pods": [{"pod_name": "infer-0", "namespace": "default", "gpu_uuids": [h100],
                                    "tflops_limit": 200.0, "vram_limit": 16 * 1024**3, "qos_level": "high"}]}
        assert (await http.post("/api/v1/workers", json={"name": "x"})).status_code == 405

        # requests without limits: no limit (the original's rule), so /api/v1/pod omits the limits
        burst = await kube.create(PODS, {
            "metadata": {"name": "burst-0", "namespace": "default", "labels": {annotations.COMPONENT: "worker"},
                         "annotations": {annotations.GPU_IDS: a100, annotations.GPU_POOL: "pool-a",
                                         annotations.TFLOPS_REQUEST: "50", annotations.VRAM_REQUEST: "4Gi"}},
            "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "busybox"}]}})

        async def burst_listed() -> dict[str, Any]:
            pods = {p["pod_name"]: p for p in (await http.get("/api/v1/pod")).json()["pods"]}
            assert "burst-0" in pods
            return pods["burst-0"]

        assert await eventually(burst_listed) == {"pod_name": "burst-0", "namespace": "default",
                                                  "gpu_uuids": [a100], "qos_level": "medium"}
        burst_worker = (await http.get("/api/v1/workers")).json()["data"]
        limits = next(w["WorkerInfo"]["Limits"] for w in burst_worker
                      if w["WorkerInfo"]["WorkerUID"] == burst["metadata"]["uid"])
        assert limits == {"tflops": "0", "compute": "0", "vram": "0"}
        await kube.delete(PODS, "burst-0", namespace="default", grace_period_seconds=0)

        await kube.delete(PODS, "infer-0", namespace="default", grace_period_seconds=0)

        async def gone() -> None:
            assert (await http.get("/api/v1/workers")).json() == {"data": []}

        await eventually(gone)
