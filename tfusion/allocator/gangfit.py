"""Could a gang ever fit? How many pods of one request the pool's GPUs could hold, empty.

Why: a gang that needs more members than the pool could hold at that request, even with every
other pod gone, or more than the namespace quota's totals allow, would otherwise wait for its
timeout over and over, holding the GPUs of the members that did fit. The scheduler asks this once
per attempt round and explains such a gang at once. Capacities only, never the current load, so the
answer changes only when GPUs, pools or quotas do. The count stops once it reaches the gang's size,
so a gang that fits costs a few nodes' GPUs. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from tfusion.allocator.allocator import GpuAllocator
from tfusion.allocator.quota import QuotaSpec
from tfusion.allocator.request import AllocRequest
from tfusion.allocator.units import tflops_str, vram_str
from tfusion.api import annotations as tfa


def members_per_gpu(req: AllocRequest, capacity_tflops: int, capacity_vram: int) -> int:
    """How many GPUs' worth of `req` one empty GPU of this capacity holds (shared isolation: one)."""
    if req.isolation == tfa.ISOLATION_SHARED:
        return 1
    need_t, need_v = req.tflops_need(capacity_tflops), req.vram_request
    slots = []
    if need_t > 0:
        slots.append(capacity_tflops // need_t)
    if need_v > 0:
        slots.append(capacity_vram // need_v)
    return min(slots) if slots else 1 << 20


def members_on_node(per_gpu: Sequence[int], count: int, max_workers: int) -> int:
    """The most pods of `count` distinct GPUs each that GPUs holding `per_gpu` shares could take:
    the largest k with sum(min(share, k)) ≥ k x count (a pod uses a GPU once), at most `max_workers`."""
    if count < 1 or len(per_gpu) < count:
        return 0
    if count == 1:
        return min(max_workers, sum(per_gpu))
    low, high = 0, min(max_workers, sum(per_gpu) // count)
    while low < high:
        mid = (low + high + 1) // 2
        if sum(min(share, mid) for share in per_gpu) >= mid * count:
            low = mid
        else:
            high = mid - 1
    return low


def pool_could_hold(allocator: GpuAllocator, req: AllocRequest, enough: int | None = None) -> int:
    """How many pods of `req` the GPUs of its pool (and model) could hold if they were empty. With
    `enough`, the count stops once it reaches that many (a gang that fits is known after a few
    nodes; only one that does not pays for every GPU of the pool)."""
    if not allocator.has_pool(req.pool):
        return 0
    key = (req.pool, req.gpu_model)
    total = 0
    for node in allocator.node_entries().values():
        slots = node.groups.get(key)
        if not slots:
            continue
        shares = [share for s in slots if not req.vendor or s.info.vendor.lower() == req.vendor.lower()
                  if (share := members_per_gpu(req, s.info.capacity_tflops, s.info.capacity_vram)) > 0]
        total += members_on_node(shares, req.count, allocator.max_workers_per_node)
        if enough is not None and total >= enough:
            break
    return total


def quota_could_hold(spec: QuotaSpec | None, req: AllocRequest, members: int) -> str:
    """Why the namespace quota's totals can never admit `members` pods of `req` ("" when they can)."""
    if spec is None:
        return ""
    if spec.max_workers is not None and members > spec.max_workers:
        return f"the quota of namespace {req.namespace} allows {spec.max_workers} workers, the gang needs {members}"
    need_t, need_v = req.tflops_request * req.count * members, req.vram_request * req.count * members
    if spec.requests_tflops is not None and need_t > spec.requests_tflops:
        return (f"the quota of namespace {req.namespace} allows {tflops_str(spec.requests_tflops)} TFLOPS in all, "
                f"the gang needs {tflops_str(need_t)} ({members} x {tflops_str(req.tflops_request * req.count)})")
    if spec.requests_vram is not None and need_v > spec.requests_vram:
        return (f"the quota of namespace {req.namespace} allows {vram_str(spec.requests_vram)} VRAM in all, "
                f"the gang needs {vram_str(need_v)} ({members} x {vram_str(req.vram_request * req.count)})")
    return ""


def gang_never_fits(allocator: GpuAllocator, req: AllocRequest, required: int) -> str:
    """Why `required` pods of `req` can never be placed together ("" when they could)."""
    could = pool_could_hold(allocator, req, enough=required)
    if could < required:
        model = f" {req.gpu_model}" if req.gpu_model else ""
        return (f"the gang needs {required} members but the{model} GPUs of pool {req.pool} could hold at most "
                f"{could} at this request even when empty")
    return quota_could_hold(allocator.ledger.quota.get(req.namespace), req, required)
