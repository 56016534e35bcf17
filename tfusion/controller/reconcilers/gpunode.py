"""GPUNode reconciler: the node's phase follows its hypervisor's reports, and its capacity is rolled up
from its GPUs and the allocator's ledger.

What "the hypervisor reports" means here: the hypervisor stamps `tensor-fusion.ai/last-sync` on
each of its node's GPU objects every time it reports them and, between reports, as a heartbeat
(tfusion/hypervisor/gpu_report.py, every minute). The newest stamp among the node's GPUs that are
not missing (no `gpu-missing-since`) is the node's last report. The GPUNode's own `last-sync`
annotation is not used: the allocator's gpu-status reconciler writes it after a status write, so
it says the controller works, not that the hypervisor does.

- Phase: Pending until the first report (no GPU object, or none stamped); Running while the last
  report is younger than `--gpu-node-report-grace` (default 5 m); Unknown once it is older, with
  the condition HypervisorReporting=False (reason ReportsStopped) and a Warning event
  HypervisorNotReporting. `status.hypervisorStatus.lastHeartbeatTime` is the last report.
- GPU phases follow: on a Running node its Pending GPUs become Running (schedulable); on a node
  whose reports stopped its Running GPUs go back to Pending. GPUs no hypervisor ever stamped (made
  by hand) keep the phase their writer gave them, and Unknown GPUs (unhealthy or missing: the
  hypervisor's verdict) are left alone.
- Capacity, from the GPUs that are not missing: totalGPUs / managedGPUs / managedGPUDeviceIDs,
  total and available TFLOPS and VRAM (the ledger's available, committed allocations only), virtual
  TFLOPS = total x the pool's tflopsOversellRatio / 100, virtual VRAM = total + host RAM x
  vramExpandToHostMem % + host disk x vramExpandToHostDisk % (`status.nodeInfo`, reported by the
  hypervisor), virtual available = virtual minus the limits of the committed allocations;
  allocatedPods (GPU name -> the pods holding it) and totalGPUPods. The hypervisor writes the totals
  too when it reports (from the devices it sees); these, which leave missing GPUs out, are the ones
  that stay.
- Finalizer: while deleted, phase Destroying; the GPUs it owns are garbage-collected after it.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from tfusion.allocator import GpuAllocator
from tfusion.allocator.units import tflops_str, vram_mib_str, vram_str
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, Gpu, section
from tfusion.api.annotations import AnnotationError
from tfusion.api.jsontypes import JsonObject, json_object
from tfusion.controller import views
from tfusion.controller.reconcilers.common import (
    DESTROYING,
    FINALIZER,
    PENDING,
    RUNNING,
    UNKNOWN,
    byte_count,
    condition,
    merge_conditions,
    write_status,
)
from tfusion.controller.reconcilers.holdings import knows_gpu
from tfusion.kube import resources as r
from tfusion.kube.client import NotFound
from tfusion.kube.reconciler import Result, ensure_finalizer

if TYPE_CHECKING:
    from tfusion.controller.allocation import AllocatorService
    from tfusion.controller.runtime import ControllerRuntime

log = logging.getLogger(__name__)

REPORTING = "HypervisorReporting"


def is_missing(gpu: Gpu) -> bool:
    return bool(gpu.meta.annotation(tfa.GPU_MISSING_SINCE))


def last_report(gpus: list[Gpu]) -> float | None:
    """The newest `last-sync` stamp (epoch seconds) among the GPUs; None when none has one."""
    newest: float | None = None
    for gpu in gpus:
        stamp = gpu.meta.annotation(tfa.LAST_SYNC)
        if not stamp:
            continue
        try:
            when = tfa.parse_timestamp(stamp, key=tfa.LAST_SYNC).timestamp()
        except AnnotationError:
            continue
        newest = when if newest is None else max(newest, when)
    return newest


def rollup(allocator: GpuAllocator, gpunode: Body, gpus: list[Gpu]) -> JsonObject:
    """The capacity part of a GPUNode's status from its GPUs that are not missing (see the module docstring)."""
    names = sorted(g.name for g in gpus if knows_gpu(allocator, g.name))
    total_t = total_v = avail_t = avail_v = 0
    allocated: JsonObject = {}
    pods: set[str] = set()
    for name in names:
        info = allocator.gpu_info(name)
        total_t += info.capacity_tflops
        total_v += info.capacity_vram
        free_t, free_v = allocator.available(name, committed_only=True)
        avail_t += free_t
        avail_v += free_v
        holders = [pod for app in views.gpu_status(allocator, name)["runningApps"] for pod in app["pods"]]
        if holders:
            allocated[name] = [json_object(pod) for pod in holders]
            pods.update(p["uid"] for p in holders)
    limit_t, limit_v = allocator.committed_limits_on(names)
    pool = gpunode.meta.label(tfa.MANAGED_BY) or (allocator.gpu_info(names[0]).pool if names else "")
    config = allocator.pool_config(pool)
    node_info = section(gpunode.status, "nodeInfo")
    virtual_t = total_t * config.tflops_oversell_ratio // 100
    virtual_v = (total_v + byte_count(node_info.get("ramSize")) * config.vram_expand_to_host_mem // 100
                 + byte_count(node_info.get("dataDiskSize")) * config.vram_expand_to_host_disk // 100)
    return {
        "totalGPUs": len(names), "managedGPUs": len(names),
        "managedGPUDeviceIDs": [*sorted(str(g.status.get("uuid") or g.name) for g in gpus if g.name in names)],
        "totalTFlops": tflops_str(total_t), "totalVRAM": vram_str(total_v),
        "availableTFlops": tflops_str(avail_t), "availableVRAM": vram_str(avail_v),
        "virtualTFlops": tflops_str(virtual_t), "virtualVRAM": vram_mib_str(virtual_v),
        "virtualAvailableTFlops": tflops_str(max(0, virtual_t - limit_t)),
        "virtualAvailableVRAM": vram_mib_str(virtual_v - limit_v),
        "allocatedPods": allocated, "totalGPUPods": len(pods),
    }


class GpuNodeReconciler:
    """See the module docstring. Key: the GPUNode's name."""

    def __init__(self, runtime: ControllerRuntime, allocation: AllocatorService) -> None:
        self.runtime = runtime
        self.allocation = allocation
        self.grace = runtime.settings.gpu_node_report_grace
        self.gpunodes = runtime.informer(r.GPUNODES)
        self.gpus = runtime.informer(r.GPUS)
        self._by_node = self.gpus.add_label_index(tfa.MANAGED_BY)
        self.controller = runtime.manager.controller("gpunode").for_(r.GPUNODES) \
            .watches(r.GPUS, lambda gpu: [node] if (node := Gpu(gpu).meta.label(tfa.MANAGED_BY)) else []) \
            .complete(self)

    def gpus_of(self, node: str) -> list[Gpu]:
        return [Gpu(g) for g in self.gpus.by_index(self._by_node, node)]

    async def reconcile(self, name: str) -> Result | None:
        gpunode = self.gpunodes.get(name)
        if gpunode is None:
            return None
        allocator = await self.allocation.wait_ready()
        if allocator is None:
            return None  # not the leader (any more)
        current = await ensure_finalizer(self.runtime.client, r.GPUNODES, Body(gpunode), FINALIZER, self._cleanup)
        if current is None:
            return None
        present = [g for g in self.gpus_of(name) if not is_missing(g)]
        reported = last_report(present)
        age = None if reported is None else max(0.0, time.time() - reported)
        phase, reason, message = self._phase(age)
        old = current.status
        wanted: JsonObject = {"phase": phase, **rollup(allocator, current, present)}
        conditions = [condition(current.conditions, REPORTING, phase == RUNNING, reason, message,
                                generation=current.meta.generation)]
        wanted["conditions"] = merge_conditions(current.conditions, conditions)
        if reported is not None:
            wanted["hypervisorStatus"] = {**section(old, "hypervisorStatus"),
                                          "hypervisorState": "Reporting" if phase == RUNNING else "NotReporting",
                                          "lastHeartbeatTime": tfa.format_timestamp(reported)}
        if await write_status(self.runtime.client, r.GPUNODES, current, wanted):
            self._announce(current, old.get("phase"), phase, message)
        if reported is not None:
            await self._follow_gpu_phases(present, phase)
        if phase == RUNNING and age is not None:
            return Result(requeue_after=max(0.5, self.grace - age + 0.5))
        return None

    def _phase(self, age: float | None) -> tuple[str, str, str]:
        if age is None:
            return PENDING, "WaitingForFirstReport", "the node's hypervisor has not reported its GPUs yet"
        if age <= self.grace:
            return RUNNING, "Reporting", f"the hypervisor last reported {age:.0f} s ago"
        return UNKNOWN, "ReportsStopped", (f"the hypervisor has not reported for {age:.0f} s (more than the "
                                           f"{self.grace:.0f} s grace); its GPUs are not schedulable")

    def _announce(self, gpunode: Body, before: object, phase: str, message: str) -> None:
        if before == phase:
            return
        log.info("GPUNode %s is %s: %s", gpunode.name, phase, message)
        if phase == UNKNOWN:
            self.runtime.events.warning(gpunode, "HypervisorNotReporting", message)
        elif phase == RUNNING and before == UNKNOWN:
            self.runtime.events.normal(gpunode, "HypervisorReporting", message)

    async def _follow_gpu_phases(self, gpus: list[Gpu], phase: str) -> None:
        want, other = (RUNNING, PENDING) if phase == RUNNING else (PENDING, RUNNING)
        for gpu in gpus:
            if gpu.phase != other:
                continue
            try:
                await self.runtime.client.patch(r.GPUS, gpu.name, {"status": {"phase": want}},
                                                subresource="status")
            except NotFound:
                continue

    async def _cleanup(self, gpunode: Body) -> bool:
        await write_status(self.runtime.client, r.GPUNODES, gpunode, {"phase": DESTROYING})
        return True
