"""The partition a worker holds, as the metrics tables and the cost read it (metrics/partition.py):
from the GPU's status.allocatedPartitions[podUID] and the pod's partition-id annotation, and the
original's raw-cost rule applied to the slice (request = limit: no over-request terms)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.metrics import POOL, worker_pod
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod
from tfusion.controller.metrics import worker_row
from tfusion.metrics import cost
from tfusion.metrics.partition import PartitionHeld, partition_held, partition_share

GIB = 1024 ** 3


def _statuses(**by_gpu: dict[str, Any]) -> Any:
    return lambda name: by_gpu.get(name)


def _entry(template: str = "1g.10gb", start: int | None = 3, end: int | None = 4) -> dict[str, Any]:
    entry: dict[str, Any] = {"templateId": template, "podUid": "u-1", "podName": "w", "namespace": "ns",
                             "allocatedAt": "2025-01-31T12:00:00Z"}
    if start is not None:
        entry["allocatedSlotStart"] = start
    if end is not None:
        entry["allocatedSlotEnd"] = end
    return entry


def _partitioned(**notes: str) -> Pod:
    return Pod(worker_pod(**{tfa.ISOLATION: tfa.ISOLATION_PARTITIONED, tfa.PARTITION_ID: "1g.10gb", **notes}))


def test_the_gpu_status_entry_gives_template_and_slots() -> None:
    statuses = _statuses(g2={"allocatedPartitions": {"u-1": _entry("2g.20gb", 0, 2)}})
    held = partition_held(_partitioned(), ("g1", "g2"), statuses)
    assert held == PartitionHeld("2g.20gb", 0, 2)
    assert held.fields() == {"partition_template": "2g.20gb", "partition_slice": "0-2"}


def test_an_entry_without_slots_or_template_falls_back_to_the_annotation() -> None:
    statuses = _statuses(g1={"allocatedPartitions": {"u-1": _entry("", None, None)}})
    held = partition_held(_partitioned(), ("g1",), statuses)
    assert held is not None and held.fields() == {"partition_template": "1g.10gb", "partition_slice": ""}


def test_a_partitioned_pod_before_its_entry_is_written_holds_its_annotation() -> None:
    assert partition_held(_partitioned(), ("g1",), _statuses()) == PartitionHeld("1g.10gb")


def test_other_pods_hold_no_partition() -> None:
    others = _statuses(g1={"allocatedPartitions": {"someone-else": _entry()}})
    assert partition_held(Pod(worker_pod()), ("g1",), others) is None
    # a stray partition-id on a soft pod is not a partition
    assert partition_held(Pod(worker_pod(**{tfa.PARTITION_ID: "1g.10gb"})), ("g1",), _statuses()) is None


def test_a_partition_is_billed_for_its_slice_without_over_request_terms() -> None:
    pricing = cost.pool_pricing(POOL)
    share = cost.WorkerShare(tflops_request=14.0, tflops_limit=28.0, vram_request=10 * GIB, vram_limit=20 * GIB,
                             gpu_count=1, qos="medium")
    sliced = partition_share(share)
    assert (sliced.tflops_limit, sliced.vram_limit) == (14.0, 10 * GIB)
    # per second: 14 TFLOPS * 0.0001 + 10 GiB * 0.0002 = 0.0034; 60 s on one GPU
    assert cost.worker_cost(sliced, pricing, 60) == pytest.approx(0.0034 * 60)
    assert cost.worker_cost(share, pricing, 60) > cost.worker_cost(sliced, pricing, 60)


def test_the_worker_row_carries_the_partition_and_its_share() -> None:
    pod = _partitioned(**{tfa.TFLOPS_LIMIT: "20", tfa.VRAM_LIMIT: "8Gi", tfa.GPU_IDS: "g1"})
    statuses = _statuses(g1={"allocatedPartitions": {"u-1": _entry()}})
    row = worker_row(pod, None, statuses)
    assert row is not None and row.partition == PartitionHeld("1g.10gb", 3, 4)
    assert row.share == cost.WorkerShare(10.0, 10.0, 4 * GIB, 4 * GIB, 1, "medium")
    others = _statuses(g1={"allocatedPartitions": {"someone-else": _entry()}})
    plain = worker_row(Pod(worker_pod(**{tfa.TFLOPS_LIMIT: "20", tfa.GPU_IDS: "g1"})), None, others)
    assert plain is not None and plain.partition is None and plain.share.tflops_limit == 20.0
