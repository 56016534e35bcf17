"""Every quantity tfusion writes is in the canonical form Kubernetes itself prints.

A writer that prints "81920Mi" where Kubernetes prints "80Gi" makes the same GPU show two spellings
(capacity vs. available) and breaks string comparisons in scripts; each writer is checked here.
"""

from __future__ import annotations

import pytest

from tfusion.allocator.units import percent_str, tflops_str, vram_str
from tfusion.api.quantity import Quantity
from tfusion.embedded import kubelet
from tfusion.hypervisor import gpu_report

MIB = 1024 * 1024
GIB = 1024 * MIB


def canonical(quantity: str) -> bool:
    return str(Quantity(quantity)) == quantity


@pytest.mark.parametrize(("size", "text"), [
    (80 * GIB, "80Gi"), (81559 * MIB, "81559Mi"), (81559 * MIB + 12345, "81559Mi"), (24 * GIB + MIB, "24577Mi"),
    (0, "0"),
])
def test_gpu_vram_capacity_is_canonical(size: int, text: str) -> None:
    assert gpu_report.vram_quantity(size) == text
    assert canonical(text)


@pytest.mark.parametrize(("tflops", "text"), [(989.0, "989"), (312.0, "312"), (19.5, "19500m"), (0.0, "0")])
def test_gpu_tflops_capacity_is_canonical(tflops: float, text: str) -> None:
    assert gpu_report.tflops_quantity(tflops) == text
    assert canonical(text)


@pytest.mark.parametrize("size", [2 * 80 * GIB + 81559 * MIB, 25276502016, 64 * GIB, 1023, 0])
def test_gpunode_totals_and_node_info_are_canonical(size: int) -> None:
    text = gpu_report.bytes_quantity(size)
    assert canonical(text) and Quantity(text).value() == size


def test_gpunode_node_info_of_this_machine_is_canonical() -> None:
    for size in (gpu_report.node_ram_bytes(), gpu_report.data_disk_bytes()):
        assert canonical(gpu_report.bytes_quantity(size))


def test_kubelet_node_capacity_is_canonical() -> None:
    capacity = kubelet.node_status("node-1")["capacity"]
    for resource in ("cpu", "memory", "ephemeral-storage", "pods"):
        assert canonical(capacity[resource]), (resource, capacity[resource])


@pytest.mark.parametrize("text", ["16Gi", "1Gi", "1536Mi", "1024Mi"])
def test_allocator_statuses_are_canonical(text: str) -> None:
    q = Quantity(text)
    assert canonical(vram_str(q.value())) and canonical(tflops_str(q.milli_value()))
    assert canonical(percent_str(12_500))
