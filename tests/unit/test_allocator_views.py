"""/api/allocation and /api/simulate-schedule bodies built from the allocator."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tfusion.allocator import GpuAllocator, GpuInfo, QuotaSpec, request_from_pod
from tfusion.controller import allocation_view
from tfusion.controller.scheduling.simulate import ManifestError, read_pod_manifest, simulate_schedule

GIB = 1 << 30
P = "tensor-fusion.ai/"


def cluster() -> GpuAllocator:
    a = GpuAllocator()
    for node, vram in (("node-a", 16), ("node-b", 8)):
        for i in range(2):
            a.upsert_gpu(GpuInfo(name=f"{node}-gpu{i}", node=node, pool="pool", model="H100", index=i,
                                 capacity_tflops=100_000, capacity_vram=vram * GIB))
    return a


def pod(name: str, vram: str = "4Gi", tflops: str = "10", count: int = 1, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                         "labels": {P + "workload": "trainer"},
                         "annotations": {P + "gpupool": "pool", P + "tflops-request": tflops,
                                         P + "vram-request": vram, P + "gpu-count": str(count), **extra}},
            "spec": {"schedulerName": "tensor-fusion-scheduler", "containers": [{"name": "c", "image": "x"}]}}


def test_allocation_view_shape_and_plain_gpu_keys() -> None:
    a = cluster()
    placement = a.allocate(request_from_pod(pod("p1", count=2)))
    a.assume(request_from_pod(pod("assumed")), [f"{placement.node}-gpu0"])  # not shown: not committed
    view = allocation_view.build(a)
    json.dumps(view)  # serialisable as is
    assert set(view) == {"gpuStore", "nodeWorkerStore", "allocation", "gpuToWorkerMap"}
    assert sorted(view["gpuStore"]) == ["node-a-gpu0", "node-a-gpu1", "node-b-gpu0", "node-b-gpu1"]
    assert not any(k.startswith("/") for k in view["gpuStore"])
    gpu0 = view["gpuStore"][f"{placement.node}-gpu0"]
    assert gpu0["status"]["capacity"] == {"tflops": "100", "vram": "16Gi"}
    assert gpu0["status"]["available"] == {"tflops": "90", "vram": "12Gi"}
    assert gpu0["status"]["runningApps"][0]["name"] == "trainer"
    assert view["nodeWorkerStore"] == {placement.node: {"ml/p1": True}}
    alloc = view["allocation"]["uid-p1"]
    assert alloc["GPUNames"] == list(placement.gpu_names) and alloc["Count"] == 2
    assert alloc["Request"] == {"tflops": "10", "vram": "4Gi"} and alloc["PoolName"] == "pool"
    assert alloc["PodMeta"] == {"name": "p1", "namespace": "ml", "uid": "uid-p1"}
    assert view["gpuToWorkerMap"][placement.gpu_names[0]] == [
        {"request": {"tflops": "10", "vram": "4Gi"}, "limit": {"tflops": "10", "vram": "4Gi"},
         "podName": "p1", "podUID": "uid-p1", "namespace": "ml"}]


def test_simulate_success_reports_trail_and_has_no_side_effects() -> None:
    a = cluster()
    a.allocate(request_from_pod(pod("busy", vram="7Gi")))  # lands on node-a-gpu0
    before = a.snapshot()
    dirty = a.dirty_gpus()
    status, body = simulate_schedule(a, pod("new", vram="10Gi"))
    assert a.snapshot() == before and a.dirty_gpus() == dirty
    assert status == 200 and body["error"] is None
    assert body["scheduleResult"] == {"SuggestedHost": "node-a", "EvaluatedNodes": 2, "FeasibleNodes": 1}
    stages = {s["FilterName"]: s for s in body["filterDetail"]["FilterStageDetails"]}
    resource = stages["ResourceFilter"]
    assert resource["Diff"] == 3 and resource["After"] == ["node-a-gpu1"]
    assert len(resource["Before"]) == 4
    assert {r["gpu"]: r["reason"] for r in resource["Removed"]} == {
        "node-a-gpu0": "node-a-gpu0: VRAM available 9Gi < requested 10Gi",
        "node-b-gpu0": "node-b-gpu0: VRAM available 8Gi < requested 10Gi",
        "node-b-gpu1": "node-b-gpu1: VRAM available 8Gi < requested 10Gi",
    }
    assert body["gpuSchedulerState"]["FinalGPUs"] == ["node-a-gpu1"]


def test_simulate_failure_gives_per_node_diagnosis() -> None:
    a = cluster()
    status, body = simulate_schedule(a, pod("huge", vram="20Gi"))
    assert status == 200
    err = body["error"]
    assert err["type"] == "FitError" and err["numAllNodes"] == 2 and err["stage"] == "ResourceFilter"
    nodes = err["diagnosis"]["nodeToStatus"]["nodes"]
    assert nodes["node-b"]["reasons"] == [
        "ResourceFilter: node-b-gpu0: VRAM available 8Gi < requested 20Gi",
        "ResourceFilter: node-b-gpu1: VRAM available 8Gi < requested 20Gi"]
    assert nodes["node-a"]["plugin"] == "GPUResourcesFit"
    assert body["scheduleResult"] == {"SuggestedHost": "", "EvaluatedNodes": 2, "FeasibleNodes": 0}


def test_simulate_quota_failure_is_a_prefilter_message() -> None:
    a = cluster()
    a.set_quota("ml", QuotaSpec(requests_vram=2 * GIB))
    status, body = simulate_schedule(a, pod("q"))
    assert status == 200
    assert "total.max.vram.request exceeded" in body["error"]["diagnosis"]["preFilterMsg"]
    assert body["filterDetail"]["FilterStageDetails"][0]["FilterName"] == "QuotaCheck"


def test_simulate_status_codes() -> None:
    a = cluster()
    other = pod("x")
    other["spec"]["schedulerName"] = "default-scheduler"
    assert simulate_schedule(a, other) == (500, {"error": "scheduler framework not found"})
    status, body = simulate_schedule(a, pod("bad", **{P + "gpu-count": "999"}))
    assert status == 400 and "tensor-fusion.ai/gpu-count" in body["error"] and "999" in body["error"]
    with pytest.raises(ManifestError, match="neither JSON nor YAML"):
        read_pod_manifest(b"{not: [valid")
    with pytest.raises(ManifestError, match="an object"):
        read_pod_manifest(b"- a list")
    status, body = simulate_schedule(a, read_pod_manifest(yaml.safe_dump(pod("y")).encode()))
    assert status == 200 and body["scheduleResult"]["SuggestedHost"] == "node-a"
    status, body = simulate_schedule(a, read_pod_manifest(json.dumps(pod("z")).encode()))
    assert status == 200
