"""The hypervisor's Kubernetes backend against the embedded API server, over real HTTP:
GPU objects and GPUNode totals, worker pods from the informer, and TokenReview on the limiter routes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver_fixture import ApiServerHandle
from tests.helpers import eventually
from tests.helpers.kube_hypervisor import (
    NODE,
    create_pool_and_node,
    kube_hypervisor,
    kube_with_crds,  # noqa: F401  (the `kube` fixture of these tests)
    worker_pod,
)
from tfusion.allocator import gpu_from_object
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Gpu
from tfusion.api.quantity import Quantity
from tfusion.kube.client import KubeClient, NotFound
from tfusion.kube.resources import GPUNODES, GPUS, PODS, SERVICEACCOUNTS

#: what a check raises while the hypervisor has not caught up yet
NOT_YET = (AssertionError, NotFound, KeyError)

pytestmark = pytest.mark.anyio


def canonical(quantity: str) -> bool:
    """Written as Kubernetes itself prints the quantity."""
    return str(Quantity(quantity)) == quantity


async def test_gpu_objects_follow_the_devices(apiserver: ApiServerHandle, kube: KubeClient, tmp_path: Path) -> None:
    async with kube_hypervisor(apiserver, tmp_path) as http:
        ready = await http.get("/readyz")
        assert ready.status_code == 503
        gpunode_condition = next(c for c in ready.json()["conditions"] if c["name"] == "gpunode")
        assert gpunode_condition == {"name": "gpunode", "ready": False,
                                     "message": f"waiting for GPUNode {NODE} (the controller creates it)"}
        assert len(await kube.list(GPUS)) == 0  # nothing is written before the GPUNode exists
        gpunode = await create_pool_and_node(kube)

        async def all_ready() -> bool:
            assert (await http.get("/readyz")).status_code == 200
            return True

        await eventually(all_ready, 10, retry_on=NOT_YET)
        devices = (await http.get("/api/v1/devices")).json()["data"]
        uuids = [d["UUID"] for d in devices]

        async def three_gpus() -> list[dict[str, Any]]:
            gpus = sorted((await kube.list(GPUS)).items, key=lambda g: (g.get("status") or {}).get("index", -1))
            assert all("capacity" in (g.get("status") or {}) for g in gpus)
            assert [g["metadata"]["name"] for g in gpus] == uuids
            return gpus

        gpus = await eventually(three_gpus, 10, retry_on=NOT_YET)
        h100 = gpus[2]
        meta = h100["metadata"]
        assert meta["labels"] == {tfa.MANAGED_BY: NODE, tfa.GPU_POOL: "pool-a"}
        assert set(meta["annotations"]) == {tfa.LAST_SYNC, tfa.VIRTUALIZATION_CAPABILITIES}
        assert json.loads(meta["annotations"][tfa.VIRTUALIZATION_CAPABILITIES])["SupportsSoftIsolation"]
        # the allocator reads back what the reporter wrote (PascalCase keys): soft and hard allowed, and
        # partitioned since the sim's H100 has the MIG model
        assert gpu_from_object(Gpu(h100)).virtualization == frozenset({"shared", "soft", "hard", "partitioned"})
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

        async def node_totals() -> bool:
            node_status = (await kube.get(GPUNODES, NODE))["status"]
            assert node_status["totalTFlops"] == "1613" and node_status["totalGPUs"] == 3
            assert node_status["managedGPUs"] == 3 and node_status["managedGPUDeviceIDs"] == uuids
            assert node_status["totalVRAM"] == str(2 * 80 * 1024 + 81559) + "Mi"
            quantities = [node_status["totalTFlops"], node_status["totalVRAM"], *node_status["nodeInfo"].values()]
            assert all(canonical(q) for q in quantities), quantities
            return True

        await eventually(node_totals, 10, retry_on=NOT_YET)

        # the controller owns available and runningApps: rediscovery must not touch them
        owned = {"available": {"tflops": "889", "vram": "70Gi"}, "runningApps": [{
            "name": "wl", "namespace": "default", "count": 1}]}
        await kube.patch(GPUS, uuids[2], {"status": owned}, subresource="status")
        await kube.patch(GPUS, uuids[0], {"status": {"phase": "Running"}}, subresource="status")
        (tmp_path / "sim-load.json").write_text(json.dumps({"devices": {
            "0": {"present": False}, "2": {"present": False}, "1": {"healthy": False, "healthMessage": "XID 79"}}}))
        assert (await http.post("/api/v1/devices/discover")).status_code == 200

        async def retired() -> bool:
            names = {g["metadata"]["name"]: g for g in (await kube.list(GPUS)).items}
            assert uuids[0] not in names  # idle: deleted
            busy = names[uuids[2]]  # still runs a workload: kept, marked missing
            assert busy["status"]["phase"] == "Unknown"
            assert tfa.GPU_MISSING_SINCE in busy["metadata"]["annotations"]
            assert busy["status"]["available"] == owned["available"]
            assert busy["status"]["runningApps"] == owned["runningApps"]
            sick = names[uuids[1]]["status"]
            assert sick["phase"] == "Unknown" and sick["message"] == "unhealthy: XID 79"
            return True

        await eventually(retired, 10, retry_on=NOT_YET)

        # the device comes back: missing-since cleared, phase back to Pending, available untouched
        (tmp_path / "sim-load.json").write_text(json.dumps({"devices": {
            "0": {"present": True}, "2": {"present": True}, "1": {"healthy": True}}}))
        assert (await http.post("/api/v1/devices/discover")).status_code == 200

        async def back() -> bool:
            gpu = await kube.get(GPUS, uuids[2])
            assert tfa.GPU_MISSING_SINCE not in (gpu["metadata"].get("annotations") or {})
            assert gpu["status"]["phase"] == "Pending" and gpu["status"]["available"] == owned["available"]
            assert (await kube.get(GPUS, uuids[0]))["status"]["available"]["tflops"] == "312"
            return True

        await eventually(back, 10, retry_on=NOT_YET)


async def test_gpu_status_reports_the_sim_topology(apiserver: ApiServerHandle, kube: KubeClient,
                                                  tmp_path: Path) -> None:
    spec = "sim:4xA100-SXM4-80GB;nvlink=0-1,2-3;pcie-switch=0-1-2-3"
    async with kube_hypervisor(apiserver, tmp_path, devices=spec) as http:
        await create_pool_and_node(kube)

        async def four_gpus() -> list[dict[str, Any]]:
            gpus = sorted((await kube.list(GPUS)).items, key=lambda g: (g.get("status") or {}).get("index", -1))
            assert len(gpus) == 4 and all("topology" in (g.get("status") or {}) for g in gpus)
            return gpus

        gpus = await eventually(four_gpus, 10, retry_on=NOT_YET)
        uuids = [g["metadata"]["name"] for g in gpus]
        assert uuids == [d["UUID"] for d in (await http.get("/api/v1/devices")).json()["data"]]
        peers = {g["status"]["index"]: g["status"]["topology"]["peers"] for g in gpus}
        assert sorted(peers[0], key=lambda p: str(p["peerGPUUUID"])) == sorted([
            {"peerGPUUUID": uuids[1], "tier": 0, "linkType": "NVLink"},
            {"peerGPUUUID": uuids[2], "tier": 1, "linkType": "PCIeSwitch"},
            {"peerGPUUUID": uuids[3], "tier": 1, "linkType": "PCIeSwitch"}], key=lambda p: str(p["peerGPUUUID"]))
        nvlink_peer = {i: [p["peerGPUUUID"] for p in ps if p["tier"] == 0] for i, ps in peers.items()}
        assert nvlink_peer == {0: [uuids[1]], 1: [uuids[0]], 2: [uuids[3]], 3: [uuids[2]]}
        assert {g["status"]["numaNode"] for g in gpus} == {0}
    # the same node without a topology in its spec: what was reported goes away
    async with kube_hypervisor(apiserver, tmp_path / "again", devices="sim:4xA100-SXM4-80GB"):

        async def no_topology() -> bool:
            statuses = [g.get("status") or {} for g in (await kube.list(GPUS)).items]
            assert len(statuses) == 4 and not any("topology" in s for s in statuses)
            return True

        await eventually(no_topology, 10, retry_on=NOT_YET)


async def test_worker_pods_and_token_review(apiserver: ApiServerHandle, kube: KubeClient, tmp_path: Path) -> None:
    await create_pool_and_node(kube)
    try:
        await kube.create(SERVICEACCOUNTS, {"metadata": {"name": "default", "namespace": "default"}})
    except Exception:  # the API server may create it itself
        pass
    async with kube_hypervisor(apiserver, tmp_path) as http:
        devices = (await http.get("/api/v1/devices")).json()["data"]
        a100, h100 = devices[0]["UUID"], devices[2]["UUID"]
        pod = await worker_pod(kube, "infer-0", [h100], **{tfa.ISOLATION: "hard",
                                                           tfa.QOS: "high"})
        uid = pod["metadata"]["uid"]
        other_node = await kube.create(PODS, {
            "metadata": {"name": "elsewhere", "namespace": "default", "labels": {tfa.COMPONENT: "worker"},
                         "annotations": {tfa.GPU_IDS: a100}},
            "spec": {"nodeName": "another-node", "containers": [{"name": "main", "image": "busybox"}]}})

        async def listed() -> list[dict[str, Any]]:
            workers: list[dict[str, Any]] = (await http.get("/api/v1/workers")).json()["data"]
            assert [w["WorkerInfo"]["WorkerUID"] for w in workers] == [uid]
            return workers

        workers = await eventually(listed, 10, retry_on=NOT_YET)
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
            "metadata": {"name": "burst-0", "namespace": "default", "labels": {tfa.COMPONENT: "worker"},
                         "annotations": {tfa.GPU_IDS: a100, tfa.GPU_POOL: "pool-a",
                                         tfa.TFLOPS_REQUEST: "50", tfa.VRAM_REQUEST: "4Gi"}},
            "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "busybox"}]}})

        async def burst_listed() -> dict[str, Any]:
            pods: dict[str, dict[str, Any]] = {p["pod_name"]: p for p in (await http.get("/api/v1/pod")).json()["pods"]}
            assert "burst-0" in pods
            return pods["burst-0"]

        assert await eventually(burst_listed, 10, retry_on=NOT_YET) == {"pod_name": "burst-0", "namespace": "default",
                                                  "gpu_uuids": [a100], "qos_level": "medium"}
        burst_worker = (await http.get("/api/v1/workers")).json()["data"]
        limits = next(w["WorkerInfo"]["Limits"] for w in burst_worker
                      if w["WorkerInfo"]["WorkerUID"] == burst["metadata"]["uid"])
        assert limits == {"tflops": "0", "compute": "0", "vram": "0"}
        await kube.delete(PODS, "burst-0", namespace="default", grace_period_seconds=0)

        await kube.delete(PODS, "infer-0", namespace="default", grace_period_seconds=0)

        async def gone() -> bool:
            assert (await http.get("/api/v1/workers")).json() == {"data": []}
            return True

        await eventually(gone, 10, retry_on=NOT_YET)
