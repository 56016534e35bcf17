"""The allocator's parsers take the typed view of the object they parse (`Pod`, `Gpu`, `Body`).

A caller wraps the dict the API server sent once, where it reads it; the parsers read every field
through the view, so a field of the wrong JSON type reads as absent (as the views promise) rather
than crash the parser.
"""

from __future__ import annotations

from typing import Any

from tfusion.allocator import gpu_from_object, quota_from_object, request_from_pod
from tfusion.allocator.request import pod_index_of
from tfusion.api.accessors import Body, Gpu, Pod

P = "tensor-fusion.ai/"
GIB = 1 << 30


def pod_object() -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ml", "uid": "u1", "labels": {P + "workload": "trainer"},
                         "annotations": {P + "gpupool": "pool", P + "tflops-request": "10",
                                         P + "vram-request": "4Gi", P + "gpu-count": "2"}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {P + "index_1": "2"}}}]}}


def gpu_object() -> dict[str, Any]:
    return {"metadata": {"name": "g0", "labels": {P + "gpupool": "pool"},
                         "annotations": {P + "virtualization-capabilities": '{"SupportsHardIsolation": true}'}},
            "status": {"nodeSelector": {"kubernetes.io/hostname": "n1"}, "gpuModel": "H100", "phase": "Running",
                       "capacity": {"tflops": "989", "vram": "80Gi"}, "index": 3}}


def quota_object() -> dict[str, Any]:
    return {"metadata": {"name": "q", "namespace": "ml"},
            "spec": {"total": {"requests": {"tflops": "100", "vram": "10Gi"}, "maxWorkers": 4},
                     "single": {"maxRequests": {"vram": "2Gi"}, "maxGPUCount": 2}}}


def test_a_pod_view_parses_to_its_request() -> None:
    req = request_from_pod(Pod(pod_object()))
    assert (req.pod_uid, req.workload, req.count, req.tflops_request, req.vram_request) == \
        ("u1", ("ml", "trainer"), 2, 10_000, 4 * GIB)
    assert req.pod_index == pod_index_of(Pod(pod_object())) == 8 * 1 + 2


def test_a_gpu_view_parses_to_its_info() -> None:
    info = gpu_from_object(Gpu(gpu_object()))
    assert (info.node, info.pool, info.model, info.index, info.capacity_tflops, info.capacity_vram) == \
        ("n1", "pool", "H100", 3, 989_000, 80 * GIB)
    assert info.virtualization is not None and "hard" in info.virtualization
    assert info.peer_tiers == ()  # no status.topology: unknown


def test_a_gpu_view_parses_its_topology() -> None:
    raw = gpu_object()
    raw["status"]["topology"] = {"peers": [
        {"peerGPUUUID": "GPU-B", "tier": 1, "linkType": "PCIeSwitch"},
        {"peerGPUUUID": "gpu-a", "tier": 0, "linkType": "NVLink"},
        {"peerGPUUUID": "gpu-c", "tier": "0"}, {"tier": 2}, "junk"]}
    assert gpu_from_object(Gpu(raw)).peer_tiers == (("gpu-a", 0), ("gpu-b", 1))


def test_a_quota_view_parses_to_its_spec() -> None:
    namespace, spec = quota_from_object(Body(quota_object()))
    assert namespace == "ml"
    assert (spec.requests_tflops, spec.requests_vram, spec.max_workers, spec.single_max_requests_vram,
            spec.single_max_gpu_count) == (100_000, 10 * GIB, 4, 2 * GIB, 2)


def test_fields_of_the_wrong_type_read_as_absent() -> None:
    raw = pod_object()
    raw["metadata"]["labels"] = ["not", "a", "map"]
    raw["spec"]["containers"] = [None, {"name": "c", "resources": "none"}]
    req = request_from_pod(Pod(raw))
    assert (req.workload, req.pod_index) == (("ml", "p"), 0)
    gpu = gpu_object()
    gpu["status"]["nodeSelector"] = "n1"
    gpu["metadata"]["labels"][P + "managed-by"] = "n2"
    assert gpu_from_object(Gpu(gpu)).node == "n2"
    quota = quota_object()
    quota["spec"]["single"] = "none"
    assert quota_from_object(Body(quota))[1].single_max_gpu_count is None
