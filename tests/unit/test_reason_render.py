"""The one renderer of the framework's answers (tfusion/controller/scheduling/explain.py) and the
amount rule it shares with `Reason.text()`: amounts leave as canonical quantities in their
resource's unit, counts stay integers, and the sentence uses the same text as the JSON fields."""

from __future__ import annotations

from tfusion.allocator import GpuAllocator, GpuInfo, PoolConfig
from tfusion.allocator.framework import Code, Reason, Status
from tfusion.allocator.units import amount, vram_mib_str
from tfusion.controller.scheduling import nodes as nc
from tfusion.controller.scheduling.explain import node_failure_status, reason_json, status_json

GIB = 1 << 30


def test_amounts_are_canonical_quantities_and_counts_stay_integers() -> None:
    assert amount("tflops", 5_000_000) == "5k"
    assert amount("tflops", 20_500) == "20500m"
    assert amount("vram", 80 * GIB) == "80Gi"
    assert amount("total.max.vram.request", 8 * GIB) == "8Gi"
    assert amount("single.max.tflops.limit", 40_000) == "40"
    assert amount("cpu", 600) == "600m" and amount("cpu", 2000) == "2"
    assert amount("memory", 512 << 20) == "512Mi"
    assert amount("gpus", 3) == 3 and amount("nvidia.com/gpu", 2) == 2 and amount(None, 7) == 7


def test_a_tflops_reason_renders_its_numbers_once() -> None:
    reason = Reason("GPU TFLOPS too small", "ResourceFilter", "node-a", "gpu-a1", "tflops", 5_000_000, 100_000)
    body = reason_json(reason)
    assert body == {"message": "GPU TFLOPS too small", "stage": "ResourceFilter", "node": "node-a",
                    "gpu": "gpu-a1", "resource": "tflops", "requested": "5k", "available": "100",
                    "detail": "gpu-a1: TFLOPS available 100 < requested 5k"}
    status = Status(Code.UNSCHEDULABLE, "Filter", (reason,))
    assert status_json(status) == {"code": "Unschedulable", "stage": "Filter", "summary": "GPU TFLOPS too small",
                                   "reasons": [body]}


def test_a_node_check_renders_with_the_same_rule() -> None:
    failure = nc.NodeFailure("Insufficient memory", "NodeResourcesFit", False, "memory", 5 * GIB, 4 * GIB)
    body = reason_json(node_failure_status(failure, "node-b").reasons[0])
    assert (body["requested"], body["available"]) == ("5Gi", "4Gi")
    assert body["detail"] == "Insufficient memory: requested 5Gi, available 4Gi"
    extended = nc.NodeFailure("Insufficient nvidia.com/gpu", "NodeResourcesFit", False, "nvidia.com/gpu", 3, 2)
    assert node_failure_status(extended, "node-b").reasons[0].text() == \
        "Insufficient nvidia.com/gpu: requested 3, available 2"


def test_a_reason_without_a_given_detail_builds_it_with_quantities() -> None:
    reason = Reason("Insufficient cpu", "NodeResourcesFit", "node-b", resource="cpu", requested=600, available=400)
    assert reason.text() == "node-b: Insufficient cpu: cpu requested 600m, available 400m"


def test_virtual_vram_is_whole_mib() -> None:
    assert vram_mib_str(432289438105) == "412263Mi"
    assert vram_mib_str(80 * GIB) == "80Gi" and vram_mib_str(-1) == "0"


def test_virtual_vram_from_host_percentages_is_written_whole_mib() -> None:
    """An odd host RAM size times a percentage gave a bare byte count beside the MiB totals."""
    a = GpuAllocator()
    a.upsert_gpu(GpuInfo(name="g1", node="n1", pool="p", capacity_tflops=100_000, capacity_vram=80 * GIB))
    a.set_pool_config("p", PoolConfig(vram_expand_to_host_mem=70, vram_expand_to_host_disk=0))
    cap = a.virtual_capacity(node="n1", host_memory=503 * GIB + 123_457)
    assert cap["totalVRAM"] == "80Gi"
    assert cap["virtualVRAM"] == vram_mib_str(80 * GIB + (503 * GIB + 123_457) * 70 // 100) == "442470Mi"
    assert cap["virtualAvailableVRAM"] == cap["virtualVRAM"]
