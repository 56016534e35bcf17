"""Read-only questions about the allocator's state: the full filter chain, diagnoses, capacity, snapshots.

Why it exists: these answers read the indexes (indexes.py) and the ledger (ledger.py) and change
neither, and most are slow on purpose (the filter chain walks every GPU of a pool, stage by stage,
to explain itself). Keeping them apart from the code that records allocations keeps the hot paths
short and makes it plain which calls can change state: none here does.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from tfusion.allocator import filters, topology
from tfusion.allocator.errors import FilterStage, QuotaExceeded, Removal, Unschedulable
from tfusion.allocator.indexes import GpuIndexes
from tfusion.allocator.ledger import Charges, Ledger, Parts
from tfusion.allocator.request import AllocRequest
from tfusion.allocator.state import GpuSlot
from tfusion.allocator.units import tflops_str, vram_mib_str, vram_str


@dataclass(slots=True)
class FilterResult:
    """Candidate GPUs per node after the whole chain, and the trail when an explanation was asked.

    `error` is set when the chain did not run (quota exceeded, unknown pool); `stage` is the
    stage that removed the last candidates, "" when some remain.
    """

    nodes: dict[str, list[str]] = field(default_factory=dict)
    stages: list[FilterStage] = field(default_factory=list)
    evaluated: int = 0
    error: Unschedulable | None = None
    stage: str = ""


def run_filter(indexes: GpuIndexes, ledger: Ledger, req: AllocRequest, nodes: Collection[str] | None,
               explain: bool) -> FilterResult:
    """See GpuAllocator.filter."""
    result = FilterResult()
    try:
        ledger.quota_precheck(req)
    except QuotaExceeded as exc:
        result.error = exc
        result.stage = filters.QUOTA
        if explain:
            result.stages.append(FilterStage(filters.QUOTA, 0, 0, []))
        return result
    pool = indexes.pools.get(req.pool)
    if not pool:
        result.error = Unschedulable(f"pool {req.pool!r} has no GPUs")
        return result
    wanted = set(nodes) if nodes is not None else None
    slots = sorted((s for s in pool.values() if wanted is None or s.node in wanted), key=lambda s: s.name)
    result.evaluated = len({s.node for s in slots})
    for stage in filters.STAGES:
        if not slots:
            break
        if not stage.applies(req):
            continue
        kept: list[GpuSlot] = []
        removed: list[Removal] = []
        for slot in slots:
            reason = stage.check(slot, req)
            if reason is None:
                kept.append(slot)
            elif explain:
                removed.append(Removal(slot.name, slot.node, reason))
        if explain:
            result.stages.append(FilterStage(stage.name, len(slots), len(kept), removed,
                                             [s.name for s in slots], [s.name for s in kept]))
        if slots and not kept:
            result.stage = stage.name
        slots = kept
    by_node: dict[str, list[GpuSlot]] = {}
    for slot in slots:
        by_node.setdefault(slot.node, []).append(slot)
    if slots and req.count > 1:
        slots = _node_stage(result, filters.SAME_NODE, by_node, explain,
                            lambda n, g: None if len(g) >= req.count else
                            f"node {n} has {len(g)} matching GPU(s), {req.count} requested")
    policy = topology.policy_for(indexes.topology, req)
    if slots and req.count > 1 and policy.gates:
        slots = _node_stage(result, topology.STAGE, by_node, explain,
                            lambda n, g: _topology_refusal(n, g, req, policy))
    if slots:
        limit = indexes.max_workers_per_node
        all_nodes = indexes.nodes
        slots = _node_stage(result, filters.MAX_WORKERS, by_node, explain,
                            lambda n, g: None if len(all_nodes[n].workers) < limit else
                            f"node {n} has {len(all_nodes[n].workers)} workers, limit {limit}")
    result.nodes = {n: [s.name for s in g] for n, g in sorted(by_node.items())}
    return result


def _topology_refusal(node: str, slots: list[GpuSlot], req: AllocRequest, policy: topology.Policy) -> str | None:
    choice = topology.best_set(slots, req.count, policy)
    return topology.refusal_detail(req.count, node, choice, policy) if topology.refusal(choice, policy) else None


def _node_stage(result: FilterResult, name: str, by_node: dict[str, list[GpuSlot]], explain: bool,
                check: Callable[[str, list[GpuSlot]], str | None]) -> list[GpuSlot]:
    before_gpus = sorted(s.name for g in by_node.values() for s in g) if explain else []
    before = sum(len(g) for g in by_node.values())
    removed: list[Removal] = []
    for node in sorted(by_node):
        reason = check(node, by_node[node])
        if reason is not None:
            if explain:
                removed.extend(Removal(s.name, node, reason) for s in by_node[node])
            del by_node[node]
    after = [s for g in by_node.values() for s in g]
    if explain:
        result.stages.append(FilterStage(name, before, len(after), removed, before_gpus,
                                         sorted(s.name for s in after)))
    if before and not after:
        result.stage = name
    return after


def diagnose(indexes: GpuIndexes, ledger: Ledger, req: AllocRequest,
             nodes: Collection[str] | None) -> Unschedulable:
    """Why `req` fits nowhere: the filter trail and each node's reasons, as one Unschedulable."""
    result = run_filter(indexes, ledger, req, nodes, True)
    if result.error is not None:
        return result.error
    pool = indexes.pools.get(req.pool, {})
    wanted = set(nodes) if nodes is not None else None
    per_node: dict[str, list[str]] = {s.node: [] for s in pool.values() if wanted is None or s.node in wanted}
    for stage in result.stages:
        for removal in stage.removed:
            reasons = per_node.setdefault(removal.node, [])
            text = f"{stage.name}: {removal.reason}"
            if text not in reasons:  # node-level stages give one reason per GPU
                reasons.append(text)
    for node in result.nodes:
        per_node.setdefault(node, []).append("rejected by the scheduler's node checks")
    total = len(per_node)
    if result.nodes:
        message = f"0/{total} nodes are available: every GPU-feasible node was rejected by node checks"
    else:
        message = (f"0/{total} nodes are available for {req.count} GPU(s) in pool {req.pool}: "
                   f"{result.stage or 'the filter chain'} removed the last candidates")
    return Unschedulable(message, stage=result.stage, nodes=dict(sorted(per_node.items())),
                         stages=result.stages)


def committed_available(ledger: Ledger, slot: GpuSlot) -> tuple[int, int]:
    """(milli-TFLOPS, bytes) free on `slot` counting committed allocations only."""
    assumed = ledger.assumed
    if slot.shared_by is not None and slot.shared_by not in assumed:
        return 0, 0
    used_t = used_v = 0
    if slot.shared_by is None:
        for uid, (t, v) in slot.allocs.items():
            if uid not in assumed:
                used_t += t
                used_v += v
    info = slot.info
    return max(0, info.capacity_tflops - used_t), max(0, info.capacity_vram - used_v)


def node_workers(indexes: GpuIndexes) -> dict[str, dict[str, str]]:
    return {n: dict(sorted(node.workers.items())) for n, node in sorted(indexes.nodes.items()) if node.workers}


def virtual_capacity(indexes: GpuIndexes, ledger: Ledger, node: str | None, pool: str | None,
                     host_memory: Mapping[str, int] | int, host_disk: Mapping[str, int] | int) -> dict[str, Any]:
    """See GpuAllocator.virtual_capacity."""
    if (node is None) == (pool is None):
        raise ValueError("give exactly one of node or pool")
    if node is not None:
        n = indexes.nodes.get(node)
        slots = list(n.gpus.values()) if n else []
        cfg_pool = slots[0].pool if slots else ""
        node_names = [node]
    else:
        assert pool is not None
        slots = list(indexes.pools.get(pool, {}).values())
        cfg_pool = pool
        node_names = sorted({s.node for s in slots})
    cfg = indexes.pool_config(cfg_pool)

    def per_node(value: Mapping[str, int] | int, name: str) -> int:
        return value if isinstance(value, int) else value.get(name, 0)

    total_t = sum(s.info.capacity_tflops for s in slots)
    total_v = sum(s.info.capacity_vram for s in slots)
    avail = [committed_available(ledger, s) for s in slots]
    ram = sum(per_node(host_memory, n) for n in node_names)
    disk = sum(per_node(host_disk, n) for n in node_names)
    virtual_t = total_t * cfg.tflops_oversell_ratio // 100
    virtual_v = total_v + ram * cfg.vram_expand_to_host_mem // 100 + disk * cfg.vram_expand_to_host_disk // 100
    limit_t = limit_v = 0
    names = {s.name for s in slots}
    for alloc in ledger.allocs.values():
        if alloc.assumed_at is not None:
            continue
        for gpu, (t, v) in zip(alloc.gpus, alloc.limits, strict=True):
            if gpu in names:
                limit_t += t
                limit_v += v
    return {
        "totalGPUs": len(slots),
        "totalTFlops": tflops_str(total_t), "totalVRAM": vram_str(total_v),
        "availableTFlops": tflops_str(sum(a[0] for a in avail)),
        "availableVRAM": vram_str(sum(a[1] for a in avail)),
        "virtualTFlops": tflops_str(virtual_t), "virtualVRAM": vram_mib_str(virtual_v),
        "virtualAvailableTFlops": tflops_str(max(0, virtual_t - limit_t)),
        "virtualAvailableVRAM": vram_mib_str(virtual_v - limit_v),
    }


class GpuSnapshot(TypedDict):
    """One GPU in a snapshot: (milli-TFLOPS, bytes) pairs and the request charge of each pod on it."""

    node: str
    pool: str
    capacity: tuple[int, int]
    available: tuple[int, int]
    used: tuple[int, int]
    shared_by: str | None
    allocs: dict[str, tuple[int, int]]


class AllocationSnapshot(TypedDict):
    """One pod's allocation in a snapshot."""

    node: str
    gpus: tuple[str, ...]
    charges: Charges
    limits: Charges
    assumed: bool
    request: AllocRequest
    partitions: Parts  # per GPU, the partition held there; () when not partitioned


class Snapshot(TypedDict):
    """The whole allocator state as plain, sorted data (`GpuAllocator.snapshot`)."""

    gpus: dict[str, GpuSnapshot]
    allocations: dict[str, AllocationSnapshot]
    workers: dict[str, dict[str, str]]
    pod_indexes: dict[str, dict[int, tuple[str, ...]]]
    quota_used: dict[str, tuple[int, int, int, int, int]]
    quota_assumed: dict[str, tuple[int, int, int, int, int]]
    detached: dict[str, dict[str, tuple[int, int]]]
    node_scores: dict[str, tuple[float, float]]


def snapshot(indexes: GpuIndexes, ledger: Ledger) -> Snapshot:
    """See GpuAllocator.snapshot."""
    return {
        "gpus": {name: {"node": s.node, "pool": s.pool, "capacity": (s.info.capacity_tflops,
                                                                     s.info.capacity_vram),
                        "available": (s.avail_t, s.avail_v), "used": (s.used_t, s.used_v),
                        "shared_by": s.shared_by, "allocs": dict(sorted(s.allocs.items()))}
                 for name, s in sorted(indexes.gpus.items())},
        "allocations": {uid: {"node": a.node, "gpus": a.gpus, "charges": a.charges, "limits": a.limits,
                              "assumed": a.assumed_at is not None, "request": a.req, "partitions": a.parts}
                        for uid, a in sorted(ledger.allocs.items())},
        "workers": node_workers(indexes),
        "pod_indexes": ledger.index_lock.snapshot(),
        "quota_used": {ns: u.as_tuple() for ns, u in sorted(ledger.used.items()) if any(u.as_tuple())},
        "quota_assumed": {ns: u.as_tuple() for ns, u in sorted(ledger.assumed_used.items())
                          if any(u.as_tuple())},
        "detached": {n: dict(sorted(c.items())) for n, c in sorted(ledger.detached.items())},
        "node_scores": {n: (node.score_used, node.score_free) for n, node in sorted(indexes.nodes.items())
                        if node.gpus},
    }
