"""/api/allocation and /api/simulate-schedule bodies built from the allocator."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tfusion.allocator import GpuAllocator, GpuInfo, QuotaSpec, gpu_from_object, request_from_pod
from tfusion.api.accessors import Gpu, Pod
from tfusion.controller import views
from tfusion.controller.defaults import Sources
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


def pod(name: str, vram: str = "4Gi", tflops: str = "10", count: int = 1,
        extra: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                         "labels": {P + "workload": "trainer"},
                         "annotations": {P + "gpupool": "pool", P + "tflops-request": tflops,
                                         P + "vram-request": vram, P + "gpu-count": str(count), **(extra or {})}},
            "spec": {"schedulerName": "tensor-fusion-scheduler", "containers": [{"name": "c", "image": "x"}]}}


POOLS: list[dict[str, Any]] = [
    {"metadata": {"name": "pool", "annotations": {P + "is-default-pool": "true"}}, "spec": {}},
    {"metadata": {"name": "other"}, "spec": {"qosConfig": {"defaultQoS": "low"}}},
]


def simulate(a: GpuAllocator, manifest: dict[str, Any],
             pools: list[dict[str, Any]] | None = None) -> tuple[int, Any]:  # the answer's JSON, read by key
    return simulate_schedule(a, manifest, sources=Sources(pools=POOLS if pools is None else pools))


def no_gpu(name: str) -> dict[str, Any] | None:
    return None


def no_pod(namespace: str, name: str) -> dict[str, Any] | None:
    return None


def cached_gpu(name: str) -> dict[str, Any]:
    """A GPU object as the hypervisor reports it (what the controller's informer cache holds)."""
    return {
        "apiVersion": "tensor-fusion.ai/v1", "kind": "GPU",
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "7",
                     "labels": {P + "gpupool": "pool", P + "managed-by": name.rsplit("-", 1)[0]},
                     "annotations": {P + "last-sync": "2026-01-01T00:00:00Z"}},
        "status": {"uuid": name, "message": "managed", "isolationPolicy": "Static", "gpuModel": "H100",
                   "model": "H100-SXM", "phase": "Running", "capacity": {"tflops": "100", "vram": "16Gi"},
                   "available": {"tflops": "100", "vram": "16Gi"}, "runningApps": [],
                   "nvLink": {"peerCount": 1, "peers": [{"peerUUID": "x", "linkCount": 18}]},
                   "topology": {"peers": [{"peerGPUUUID": "x", "tier": 1}]}},
    }


def test_allocation_view_shape_and_plain_gpu_keys() -> None:
    a = cluster()
    placement = a.allocate(request_from_pod(Pod(pod("p1", count=2))))
    a.assume(request_from_pod(Pod(pod("assumed"))), [f"{placement.node}-gpu0"])  # not shown: not committed
    view: Any = views.build(a, gpu_object=no_gpu, pod_object=no_pod)  # JSON dug into below
    json.dumps(view)  # serialisable as is
    assert set(view) == {"gpuStore", "nodeWorkerStore", "allocation", "gpuToWorkerMap"}
    assert sorted(view["gpuStore"]) == ["node-a-gpu0", "node-a-gpu1", "node-b-gpu0", "node-b-gpu1"]
    assert not any(k.startswith("/") for k in view["gpuStore"])
    gpu0 = view["gpuStore"][f"{placement.node}-gpu0"]  # not cached: described from the allocator
    assert gpu0["status"]["capacity"] == {"tflops": "100", "vram": "16Gi"}
    assert gpu0["status"]["available"] == {"tflops": "90", "vram": "12Gi"}
    assert gpu0["status"]["runningApps"][0]["name"] == "trainer"
    assert view["nodeWorkerStore"] == {placement.node: {"ml/p1": True}}
    alloc = view["allocation"]["uid-p1"]
    assert alloc["GPUNames"] == list(placement.gpu_names) and alloc["Count"] == 2
    assert alloc["Request"] == {"tflops": "10", "compute": "0", "vram": "4Gi"} and alloc["PoolName"] == "pool"
    assert alloc["Limit"] == {"tflops": "0", "compute": "0", "vram": "0"}  # no limit annotations: none
    assert alloc["PodMeta"] == {"name": "p1", "namespace": "ml", "uid": "uid-p1"}
    assert view["gpuToWorkerMap"][placement.gpu_names[0]] == [
        {"request": {"tflops": "10", "compute": "0", "vram": "4Gi"}, "limit": {"tflops": "0", "compute": "0",
                                                                              "vram": "0"},
         "podName": "p1", "podUID": "uid-p1", "namespace": "ml"}]


def test_allocation_view_returns_whole_cached_objects_with_live_state() -> None:
    a = cluster()
    p1 = pod("p1", extra={P + "compute-percent-request": "25", P + "tflops-request": "",
                             P + "vram-limit": "6Gi"})
    placement = a.allocate(request_from_pod(Pod(p1)))
    gpu_name = placement.gpu_names[0]
    cached = {name: cached_gpu(name) for name in a.gpu_names()}
    before = json.dumps(cached, sort_keys=True)
    p1_cached = {**p1, "metadata": {**p1["metadata"], "resourceVersion": "42", "generation": 3,
                                    "creationTimestamp": "2026-01-01T00:00:00Z",
                                    "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "uid": "rs-1"}],
                                    "managedFields": [{"manager": "kubectl"}]}}
    pods = {("ml", "p1"): p1_cached}
    view: Any = views.build(a, gpu_object=cached.get, pod_object=lambda ns, name: pods.get((ns, name)))
    assert json.dumps(cached, sort_keys=True) == before  # the cache is never modified
    gpu = view["gpuStore"][gpu_name]
    assert gpu["metadata"] == cached[gpu_name]["metadata"]
    status = gpu["status"]
    for field in ("uuid", "message", "isolationPolicy", "model", "nvLink", "topology", "capacity", "phase"):
        assert status[field] == cached[gpu_name]["status"][field], field
    assert status["available"] == {"tflops": "75", "vram": "12Gi"}  # live, not the cached 100 / 16Gi
    assert [p["uid"] for app in status["runningApps"] for p in app["pods"]] == ["uid-p1"]
    alloc = view["allocation"]["uid-p1"]
    assert alloc["Request"] == {"tflops": "0", "compute": "25", "vram": "4Gi"}
    assert alloc["Limit"] == {"tflops": "0", "compute": "0", "vram": "6Gi"}
    assert alloc["PodMeta"] == {
        "name": "p1", "namespace": "ml", "uid": "uid-p1", "resourceVersion": "42", "generation": 3,
        "labels": {P + "workload": "trainer"}, "annotations": p1["metadata"]["annotations"],
        "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "uid": "rs-1"}]}
    # a newer pod of the same name is not the allocated one: only what the allocator knows
    pods[("ml", "p1")] = {**p1_cached, "metadata": {**p1_cached["metadata"], "uid": "uid-other"}}
    view = views.build(a, gpu_object=cached.get, pod_object=lambda ns, name: pods.get((ns, name)))
    assert view["allocation"]["uid-p1"]["PodMeta"] == {"name": "p1", "namespace": "ml", "uid": "uid-p1"}


def test_simulate_success_reports_trail_and_has_no_side_effects() -> None:
    a = cluster()
    a.allocate(request_from_pod(Pod(pod("busy", vram="7Gi"))))  # lands on node-a-gpu0
    before = a.snapshot()
    dirty = a.dirty_gpus()
    status, body = simulate(a, pod("new", vram="10Gi"))
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
    status, body = simulate(a, pod("huge", vram="20Gi"))
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
    status, body = simulate(a, pod("q"))
    assert status == 200
    assert "total.max.vram.request exceeded" in body["error"]["diagnosis"]["preFilterMsg"]
    assert body["filterDetail"]["FilterStageDetails"][0]["FilterName"] == "QuotaCheck"


def test_simulate_status_codes() -> None:
    a = cluster()
    other = pod("x")
    other["spec"]["schedulerName"] = "default-scheduler"
    status, body = simulate(a, other)
    assert (status, body["field"]) == (400, "spec.schedulerName"), body
    assert "'default-scheduler' is not allowed; expected 'tensor-fusion-scheduler'" in body["error"], body
    status, body = simulate(a, pod("bad", extra={P + "gpu-count": "999"}))
    assert status == 400 and "tensor-fusion.ai/gpu-count" in body["error"] and "999" in body["error"]
    with pytest.raises(ManifestError, match="neither JSON nor YAML"):
        read_pod_manifest(b"{not: [valid")
    with pytest.raises(ManifestError, match="an object"):
        read_pod_manifest(b"- a list")
    status, body = simulate(a, read_pod_manifest(yaml.safe_dump(pod("y")).encode()))
    assert status == 200 and body["scheduleResult"]["SuggestedHost"] == "node-a"
    status, body = simulate(a, read_pod_manifest(json.dumps(pod("z")).encode()))
    assert status == 200


def test_simulate_defaults_a_raw_pod_to_the_default_pool() -> None:
    a = cluster()
    raw = pod("raw")
    del raw["metadata"]["annotations"][P + "gpupool"]
    status, body = simulate(a, raw)
    assert status == 200 and body["error"] is None
    assert body["scheduleResult"]["SuggestedHost"] == "node-a" and body["gpuSchedulerState"]["FinalGPUs"]
    status, body = simulate(a, raw, pools=[POOLS[1]])  # no pool is the default
    assert status == 400
    assert P + "gpupool" in body["error"] and P + "is-default-pool" in body["error"]


def test_simulate_places_a_default_soft_pod_on_gpus_that_support_soft_isolation() -> None:
    caps = '{"SupportsPartitioning":false,"SupportsSoftIsolation":true,"SupportsHardIsolation":true}'
    a = GpuAllocator()
    a.upsert_gpu(gpu_from_object(Gpu({
        "metadata": {"name": "gpu-1", "labels": {P + "gpupool": "pool"},
                     "annotations": {P + "virtualization-capabilities": caps}},
        "status": {"capacity": {"tflops": "989", "vram": "80Gi"}, "phase": "Running", "usedBy": "tensor-fusion",
                   "nodeSelector": {"kubernetes.io/hostname": "node-a"}}})))
    raw = pod("raw")
    del raw["metadata"]["annotations"][P + "gpupool"]
    status, body = simulate(a, raw)
    assert status == 200 and body["error"] is None, body
    assert body["gpuSchedulerState"]["FinalGPUs"] == ["gpu-1"]
