"""What a worker pod holds, read for the allocator: its gpu-ids as an allocation request.

Why one module: recovery, adoption and the drift audit must read a worker's annotations into the
same request, or one of them would restore what another refuses. Which pods hold GPUs at all is
the `Pod` view's rule (`Pod.holds_gpus`, with `is_worker`, `is_client` and `finished`, in
tfusion/api/accessors.py), shared with the billing and the hypervisor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tfusion.allocator import AllocRequest, GpuAllocator, RequestError, request_from_pod
from tfusion.allocator.partitions import Partition, PartitionCatalog, catalog_from_providers
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, Gpu, Pod
from tfusion.api.annotations import AnnotationError


def gpu_names(pod: Pod) -> tuple[str, ...]:
    """The GPUs a worker's gpu-ids annotation names (raises AnnotationError)."""
    return tfa.parse_gpu_ids(pod.meta.annotation(tfa.GPU_IDS) or "", key=tfa.GPU_IDS)


def worker_request(pod: Pod, allocator: GpuAllocator) -> tuple[AllocRequest, tuple[str, ...]]:
    """The allocation a bound worker pod holds, from its annotations (raises RequestError).

    A pod that names no pool gets the pool of its first GPU."""
    try:
        names = gpu_names(pod)
    except AnnotationError as exc:
        raise RequestError(exc.key, exc.value, exc.allowed, detail=exc.detail) from None
    default_pool = allocator.gpu_info(names[0]).pool if knows_gpu(allocator, names[0]) else None
    req = request_from_pod(pod, default_pool=default_pool)
    return req, names


def knows_gpu(allocator: GpuAllocator, name: str) -> bool:
    try:
        allocator.gpu_info(name)
    except KeyError:
        return False
    return True


def pod_ref(pod: Pod) -> str:
    """namespace/name, for log lines."""
    return f"{pod.namespace}/{pod.name}"


def reported_partitions(gpus: Iterable[Gpu]) -> dict[tuple[str, str], Partition]:
    """(pod uid, GPU name) -> the partition each GPU's `status.allocatedPartitions` records, for
    leader recovery: where a running partition sits is known only to the GPU's status (and the
    hardware), not to the pod. Entries without a template are left out."""
    found: dict[tuple[str, str], Partition] = {}
    for gpu in gpus:
        entries = gpu.status.get("allocatedPartitions")
        if not isinstance(entries, Mapping):
            continue
        for uid, entry in entries.items():
            if not isinstance(entry, Mapping) or not isinstance(entry.get("templateId"), str):
                continue
            found[(str(uid), gpu.name)] = Partition(entry["templateId"], _slot(entry.get("allocatedSlotStart")),
                                                    _slot(entry.get("allocatedSlotEnd")),
                                                    _slot(entry.get("isolationGroupId")))
    return found


def _slot(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def partition_catalog(providers: Iterable[Body]) -> tuple[PartitionCatalog, list[str]]:
    """The partition templates per GPU model of every ProviderConfig, and what could not be read."""
    return catalog_from_providers((p.name, p.spec) for p in providers)
