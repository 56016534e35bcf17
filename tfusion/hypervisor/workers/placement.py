"""Placing local workers with the controller's allocator (default placement mode).

The node's devices become allocator GPUs (name = lowercase UUID, capacity = fp16 TFLOPS and
memory; an unhealthy device is not Running, so the allocator's phase filter skips it). A worker
spec becomes pod annotations, parsed by the allocator's own `request_from_pod`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tfusion.allocator.allocator import GpuAllocator
from tfusion.allocator.errors import AllocatorError, Unschedulable
from tfusion.allocator.request import AllocRequest, RequestError, request_from_pod
from tfusion.allocator.state import GpuInfo
from tfusion.allocator.units import tflops_str, vram_str
from tfusion.api.accessors import Pod
from tfusion.api.jsontypes import JsonObject
from tfusion.hypervisor.devices.model import DeviceInfo
from tfusion.hypervisor.workers.model import WorkerInfo
from tfusion.hypervisor.workers.spec import SpecError, WorkerSpec, annotation_field


class PlacementError(Exception):
    """The worker does not fit; `reasons` lists why, per device."""

    def __init__(self, message: str, reasons: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.reasons = list(reasons)


class NodePlacer:
    """Places local workers: one node's devices in a GpuAllocator, and the workers' allocations in
    its ledger. (Not the allocator's `GpuPlacement`, which is one pod's answer.)"""

    def __init__(self, *, node_name: str, pool: str, max_workers: int = 256) -> None:
        self.node_name = node_name
        self.pool = pool
        self.allocator = GpuAllocator(max_workers_per_node=max_workers)

    def _gpu(self, device: DeviceInfo) -> GpuInfo:
        return GpuInfo(name=device.uuid, node=self.node_name, pool=self.pool,
                       capacity_tflops=round(device.max_tflops * 1000),
                       capacity_vram=device.total_memory_bytes, model=device.model, vendor=device.vendor,
                       phase="Running" if device.healthy else "Unknown", index=device.index,
                       numa=device.numa_node if device.numa_node >= 0 else None)

    def sync_devices(self, devices: Iterable[DeviceInfo]) -> None:
        current = {d.uuid: d for d in devices}
        for name in self.allocator.gpu_names():
            if name not in current:
                self.allocator.remove_gpu(name)
        for device in current.values():
            self.allocator.upsert_gpu(self._gpu(device))

    def _request(self, uid: str, name: str, namespace: str, notes: dict[str, str],
                 labels: dict[str, str]) -> AllocRequest:
        pod = Pod({"metadata": {"uid": uid, "name": name, "namespace": namespace, "annotations": notes,
                                "labels": labels}})
        try:
            return request_from_pod(pod, default_pool=self.pool)
        except RequestError as exc:
            raise SpecError(annotation_field(exc.key), exc.value, exc.allowed) from None

    def allocate(self, uid: str, spec: WorkerSpec) -> tuple[AllocRequest, tuple[str, ...]]:
        request = self._request(uid, spec.name, spec.namespace, spec.annotations, spec.labels)
        if not self.allocator.gpu_names():
            raise PlacementError("this node has no devices to allocate")
        try:
            placement = self.allocator.allocate(request)
        except Unschedulable as exc:
            reasons = [reason for reasons in exc.nodes.values() for reason in reasons]
            raise PlacementError(f"worker {spec.namespace}/{spec.name} does not fit: {exc.message}",
                                 reasons) from None
        except AllocatorError as exc:
            raise PlacementError(f"worker {spec.namespace}/{spec.name} cannot be placed: {exc}") from None
        return request, placement.gpu_names

    def restore(self, worker: WorkerInfo, gpu_names: Sequence[str]) -> None:
        if not gpu_names:
            return
        request = self._request(worker.uid, worker.name, worker.namespace, dict(worker.annotations),
                                dict(worker.labels))
        skipped = self.allocator.restore([(request, tuple(gpu_names))])
        if skipped:
            raise PlacementError("; ".join(reason for _, reason in skipped))

    def release(self, uid: str) -> None:
        self.allocator.release(uid)

    def free_summary(self) -> list[JsonObject]:
        """What is free per device, for the 409 answer."""
        result: list[JsonObject] = []
        for name in sorted(self.allocator.gpu_names()):
            avail_t, avail_v = self.allocator.available(name)
            info = self.allocator.gpu_info(name)
            result.append({"uuid": name, "index": info.index, "model": info.model, "phase": info.phase,
                           "availableTflops": tflops_str(avail_t), "availableVram": vram_str(avail_v),
                           "capacityTflops": tflops_str(info.capacity_tflops),
                           "capacityVram": vram_str(info.capacity_vram)})
        return result
