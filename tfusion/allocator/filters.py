"""The GPU filter chain, in the original's order, each stage able to say why it dropped a GPU.

Per-GPU stages (a GPU passes or not on its own): IsolationPolicy, PhaseFilter, GPUIndexFilter,
GPUIsolationModeFilter, SharedWholeGPUFilter, PartitionTemplateFilter, ResourceFilter,
GPUModelFilter, GPUVendorFilter. Node stages follow: SameNodeFilter (count > 1) and
MaxWorkerPerNode. The quota check runs before all of them (allocator.py). The deprecated
NodeAffinityFilter slot is not evaluated.

Two forms of the same rules: `gpu_fits` is the fused yes/no the fast path calls for a handful of
GPUs per placement; `STAGES` are the per-stage checks that return a reason, used only when an
explanation is asked for (simulate-schedule, a failed placement). Tests check that both agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tfusion.allocator import isolation, partitions
from tfusion.allocator.request import AllocRequest
from tfusion.allocator.state import PHASE_RUNNING, USED_BY_TENSOR_FUSION, GpuSlot
from tfusion.allocator.units import tflops_str, vram_str
from tfusion.api import annotations as tfa

STATIC_POLICIES = ("", "static")


def gpu_fits(g: GpuSlot, req: AllocRequest) -> bool:
    """Whether one GPU passes every per-GPU stage for `req` (the fast path)."""
    if not g.schedulable:
        return False
    info = g.info
    iso = req.isolation
    if g.dynamic:
        if not isolation.fits(g, req):
            return False
    elif (info.isolation_policy and info.isolation_policy.lower() not in STATIC_POLICIES) or \
            (iso != tfa.ISOLATION_SHARED and info.isolation_mode and info.isolation_mode != iso):
        return False
    if req.indices and info.index not in req.indices:
        return False
    if info.virtualization is not None and iso not in info.virtualization:
        return False
    if g.shared_by is not None:  # held whole by a shared allocation: nobody else, even at size 0
        return False
    if iso == tfa.ISOLATION_SHARED:
        if g.allocs:
            return False
    elif iso == tfa.ISOLATION_PARTITIONED:
        if not partitions.fits(g, req):
            return False
    elif g.parts:  # a GPU sliced into partitions takes only partitions
        return False
    need_t = req.tflops_request
    if not need_t and req.percent_request:
        need_t = req.percent_request * info.capacity_tflops // 100_000
    if g.avail_t < need_t or g.avail_v < req.vram_request:
        return False
    if req.gpu_model and info.model != req.gpu_model:
        return False
    return not (req.vendor and info.vendor != req.vendor)


def _isolation_policy(g: GpuSlot, req: AllocRequest) -> str | None:
    if g.dynamic:
        return isolation.refusal(g, req)
    info = g.info
    if info.isolation_policy and info.isolation_policy.lower() not in STATIC_POLICIES:
        return f"{g.name}: isolation policy {info.isolation_policy} is not supported (Static only)"
    if req.isolation != tfa.ISOLATION_SHARED and info.isolation_mode and info.isolation_mode != req.isolation:
        return f"{g.name}: isolation mode {info.isolation_mode} does not match requested {req.isolation}"
    return None


def _phase(g: GpuSlot, req: AllocRequest) -> str | None:
    info = g.info
    if info.phase != PHASE_RUNNING:
        return f"{g.name}: phase {info.phase or 'unset'}, not Running"
    if info.used_by not in ("", USED_BY_TENSOR_FUSION):
        return f"{g.name}: used by {info.used_by}, not {USED_BY_TENSOR_FUSION}"
    return None


def _index(g: GpuSlot, req: AllocRequest) -> str | None:
    if g.info.index not in req.indices:
        wanted = ",".join(str(i) for i in req.indices)
        return f"{g.name}: index {g.info.index} not in requested indices {wanted}"
    return None


def _isolation_mode(g: GpuSlot, req: AllocRequest) -> str | None:
    caps = g.info.virtualization
    if caps is not None and req.isolation not in caps:
        return f"{g.name}: device does not support {req.isolation} isolation"
    return None


def shared_whole(g: GpuSlot, req: AllocRequest) -> str | None:
    if g.allocs or g.shared_by is not None:
        return (f"{g.name}: not idle for shared isolation ({len(g.allocs)} allocation(s); "
                f"available {tflops_str(g.avail_t)}/{tflops_str(g.info.capacity_tflops)} TFLOPS, "
                f"{vram_str(g.avail_v)}/{vram_str(g.info.capacity_vram)} VRAM)")
    return None


def _partition(g: GpuSlot, req: AllocRequest) -> str | None:
    if req.isolation == tfa.ISOLATION_PARTITIONED:
        return partitions.gpu_reason(g, req)
    if g.parts and req.isolation != tfa.ISOLATION_SHARED:  # shared: SharedWholeGPUFilter says it
        return f"{g.name}: holds {len(g.parts)} partition(s); only partitioned pods may share it"
    return None


def resource(g: GpuSlot, req: AllocRequest) -> str | None:
    if g.shared_by is not None:
        return f"{g.name}: held whole by a shared allocation"
    need_t = req.tflops_need(g.info.capacity_tflops)
    if g.avail_t < need_t:
        how = f" ({req.percent_request / 1000:g}% of {tflops_str(g.info.capacity_tflops)})" \
            if not req.tflops_request and req.percent_request else ""
        return f"{g.name}: TFLOPS available {tflops_str(g.avail_t)} < requested {tflops_str(need_t)}{how}"
    if g.avail_v < req.vram_request:
        return f"{g.name}: VRAM available {vram_str(g.avail_v)} < requested {vram_str(req.vram_request)}"
    return None


def _model(g: GpuSlot, req: AllocRequest) -> str | None:
    if g.info.model != req.gpu_model:
        return f"{g.name}: model {g.info.model or 'unknown'} is not requested {req.gpu_model}"
    return None


def _vendor(g: GpuSlot, req: AllocRequest) -> str | None:
    if g.info.vendor != req.vendor:
        return f"{g.name}: vendor {g.info.vendor or 'unknown'} is not requested {req.vendor}"
    return None


@dataclass(frozen=True, slots=True)
class Stage:
    """A per-GPU stage: its name, when it applies, and the check returning a reason or None."""

    name: str
    applies: Callable[[AllocRequest], bool]
    check: Callable[[GpuSlot, AllocRequest], str | None]


def _always(req: AllocRequest) -> bool:
    return True


STAGES: tuple[Stage, ...] = (
    Stage("IsolationPolicy", _always, _isolation_policy),
    Stage("PhaseFilter", _always, _phase),
    Stage("GPUIndexFilter", lambda r: bool(r.indices), _index),
    Stage("GPUIsolationModeFilter", _always, _isolation_mode),
    Stage("SharedWholeGPUFilter", lambda r: r.isolation == tfa.ISOLATION_SHARED, shared_whole),
    Stage("PartitionTemplateFilter", _always, _partition),
    Stage("ResourceFilter", _always, resource),
    Stage("GPUModelFilter", lambda r: bool(r.gpu_model), _model),
    Stage("GPUVendorFilter", lambda r: bool(r.vendor), _vendor),
)
SAME_NODE = "SameNodeFilter"
MAX_WORKERS = "MaxWorkerPerNode"
QUOTA = "QuotaCheck"
