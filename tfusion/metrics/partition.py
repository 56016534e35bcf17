"""The hardware partition (MIG-like slice) a worker holds, as the metrics tables and the cost read it.

Why it exists: a worker holding a partition is billed for its slice and its rows must say which
slice, but the partition is recorded elsewhere (the allocator's partition code writes the GPU's
`status.allocatedPartitions[podUID]` and the pod's `partition-id` annotation); this module only
reads those two places, so the recorder (controller/metrics.py) never learns how partitions are
placed.

What the rows carry when a worker holds a partition: the fields `partition_template` (the
template ID) and `partition_slice` (the placement slots `start-end`, end exclusive, as the GPU
status has them; "" when the vendor has no slots) on `tf_worker_resources` and
`tf_gpu_allocation`. Rows of other workers are unchanged (the original's fields only).

Cost: the original's worker rule (cost.py) with the slice as both request and limit: a partition is
charged what the allocator takes from the GPU for it (the template's compute share of the GPU's
TFLOPS and its memory, reference upstream-controller.md §3.5) and cannot burst beyond it, so the
limits-over-requests terms are 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod
from tfusion.metrics.cost import WorkerShare
from tfusion.metrics.points import FieldValue

#: a GPU object's status by GPU name (the informer cache), None when the GPU is not known
GpuStatusLookup = Callable[[str], Mapping[str, Any] | None]


@dataclass(frozen=True)
class PartitionHeld:
    """The template and placement slots of a worker's partition."""

    template: str
    slot_start: int | None = None
    slot_end: int | None = None

    @property
    def slice(self) -> str:
        """`start-end` (end exclusive), "" when the partition has no slots."""
        if self.slot_start is None or self.slot_end is None:
            return ""
        return f"{self.slot_start}-{self.slot_end}"

    def fields(self) -> dict[str, FieldValue]:
        return {"partition_template": self.template, "partition_slice": self.slice}


def _slot(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def partition_held(pod: Pod, gpus: Iterable[str], gpu_status: GpuStatusLookup) -> PartitionHeld | None:
    """The partition `pod` holds on one of `gpus` (its `allocatedPartitions` entry, the template from
    the entry or else the pod's partition-id annotation); a partitioned pod whose entry is not
    written yet holds its annotation's template without slots; None for any other pod."""
    annotated = (pod.meta.annotation(tfa.PARTITION_ID) or "").strip()
    for name in gpus:
        status = gpu_status(name)
        partitions = status.get("allocatedPartitions") if status is not None else None
        entry = partitions.get(pod.uid) if isinstance(partitions, Mapping) else None
        if isinstance(entry, Mapping):
            template = str(entry.get("templateId") or annotated)
            return PartitionHeld(template, _slot(entry.get("allocatedSlotStart")), _slot(entry.get("allocatedSlotEnd")))
    if annotated and pod.meta.annotation(tfa.ISOLATION) == tfa.ISOLATION_PARTITIONED:
        return PartitionHeld(annotated)
    return None


def partition_share(share: WorkerShare) -> WorkerShare:
    """A partition's billed share: its slice as request and limit (no burst beyond the slice)."""
    return dataclasses.replace(share, tflops_limit=share.tflops_request, vram_limit=share.vram_request)
