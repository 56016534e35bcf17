"""Turns a worker and its devices into an allocation: the env that pins the devices per vendor, the
hard-mode SM percentage, the limits env and the device nodes (reference §4.2-4.3, §8.3)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from tfusion.api import annotations as keys
from tfusion.hypervisor.devices.model import DeviceInfo
from tfusion.hypervisor.workers.model import WorkerAllocation, WorkerInfo


class AllocationError(ValueError):
    """A worker names devices this node does not have; the message lists them."""


def compute_up_limit(worker: WorkerInfo, device: DeviceInfo) -> int:
    """The compute percentage a worker may use on a device (soft limiter, ERL, hard SM limit)."""
    if worker.limits.compute_percent > 0:
        return max(1, min(100, math.ceil(worker.limits.compute_percent)))
    if worker.limits.tflops_milli > 0 and device.max_tflops > 0:
        return max(1, min(100, math.ceil(worker.limits.tflops / device.max_tflops * 100)))
    return 100


def vram_limit(worker: WorkerInfo, device: DeviceInfo) -> int:
    return worker.limits.vram_bytes if worker.limits.vram_bytes > 0 else device.total_memory_bytes


def _native_ids(devices: Sequence[DeviceInfo]) -> str:
    ordered = sorted({d.uuid: d for d in devices}.values(), key=lambda d: (d.index, d.uuid))
    return ",".join(d.native_uuid for d in ordered)


def _indices(devices: Sequence[DeviceInfo]) -> str:
    return ",".join(str(i) for i in sorted({d.index for d in devices}))


def visible_devices_env(vendor: str, devices: Sequence[DeviceInfo], *, bare_process: bool = False) -> dict[str, str]:
    """The env that limits a container (or, with `bare_process`, a plain process) to `devices`."""
    if not devices:
        return {}
    key = vendor.strip().lower()
    if key == "nvidia":
        env = {"NVIDIA_VISIBLE_DEVICES": _native_ids(devices)}
        if bare_process:  # no container runtime to translate NVIDIA_VISIBLE_DEVICES; CUDA takes UUIDs
            env["CUDA_VISIBLE_DEVICES"] = _native_ids(devices)
        return env
    if key in ("moorethreads", "mthreads"):
        return {"MTHREADS_VISIBLE_DEVICES": _indices(devices), "MUSA_VISIBLE_DEVICES": _indices(devices)}
    if key == "ascend":
        return {"ASCEND_VISIBLE_DEVICES": _indices(devices)}
    if key == "ppu":
        return {"PPU_VISIBLE_DEVICES": _indices(devices), "CUDA_VISIBLE_DEVICES": _indices(devices)}
    return {}


def hard_sm_percent(worker: WorkerInfo, first_device: DeviceInfo) -> int:
    pinned = worker.effective_hard_sm_percent
    if pinned is not None and 1 <= pinned <= 100:
        return pinned
    return compute_up_limit(worker, first_device)


def build_allocation(worker: WorkerInfo, known: Mapping[str, DeviceInfo], *,
                     bare_process: bool = False, extra_env: Mapping[str, str] | None = None,
                     partitions: Sequence[DeviceInfo] = ()) -> WorkerAllocation:
    """The allocation for `worker.allocated_devices` (lowercase UUIDs) on this node's devices. A
    partitioned worker whose `partitions` (MIG devices) were made gets those instead of their GPUs,
    pinned by their own UUIDs (`NVIDIA_VISIBLE_DEVICES=MIG-...`, as the original's partitioned rule)."""
    missing = [u for u in worker.allocated_devices if u.lower() not in known]
    if missing:
        raise AllocationError(f"worker {worker.namespace}/{worker.name}: devices not on this node: "
                              f"{', '.join(missing)}")
    devices = tuple(sorted((known[u.lower()] for u in dict.fromkeys(worker.allocated_devices)),
                           key=lambda d: (d.index, d.uuid)))
    if partitions:
        devices = tuple(partitions)
    vendor = devices[0].vendor if devices else ""
    envs: dict[str, str] = {}
    if worker.isolation != keys.ISOLATION_PARTITIONED or partitions:
        envs.update(visible_devices_env(vendor, devices, bare_process=bare_process))
    if devices and worker.isolation == keys.ISOLATION_HARD:
        envs["TF_CUDA_SM_PERCENT_LIMIT"] = str(hard_sm_percent(worker, devices[0]))
    if bare_process and devices:
        envs.update(_process_limits_env(worker, devices[0]))
    if extra_env:
        envs.update(extra_env)
    specs: dict[str, dict[str, str]] = {}
    for device in devices:
        for node in device.device_nodes:
            specs.setdefault(node, {"guestPath": node, "hostPath": node, "permissions": "rwm"})
    return WorkerAllocation(worker=worker, devices=devices, envs=envs, device_specs=tuple(specs.values()))


def _process_limits_env(worker: WorkerInfo, device: DeviceInfo) -> dict[str, str]:
    """What the operator would inject into a worker container, for a process started directly."""
    env = {"TF_ISOLATION_MODE": worker.isolation}
    if worker.isolation in (keys.ISOLATION_SOFT, keys.ISOLATION_HARD):
        limit = str(vram_limit(worker, device))
        env["TF_GPU_MEMORY_LIMIT"] = limit
        env["TF_CUDA_MEMORY_LIMIT"] = limit
        env["TF_CUDA_SM_PERCENT_LIMIT"] = str(hard_sm_percent(worker, device))
    return env
