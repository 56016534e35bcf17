"""GpuAllocator: the GPU state and allocation ledger, as a pure synchronous state machine.

Callers feed it events (GPU added, changed or removed; quota and pool settings) and ask it to
decide (`select`, `filter`, `score`) and to record (`assume`, `commit`, `forget`, `rollback`,
`release`, `adjust`, `restore`). It never awaits and never does I/O, so each call is atomic for an
asyncio program; every mutation validates first and then applies, so a failure leaves the state
exactly as it was.

Bookkeeping: each GPU's used TFLOPS and VRAM is the sum of the request charges of its live
allocations, assumed and committed (a compute-percent request is charged percent x capacity / 100 on
that GPU); available = capacity - used, never below 0, and 0 while a shared allocation holds the
GPU whole. What goes to `status.available` and `runningApps` counts committed allocations only.
Quota usage per namespace is the sum of the live allocations' request and limit charges and one
worker each (a pod without limits is unlimited and, as in the original, charges 0 to limit
totals). A pod holds at most one allocation, all of its GPUs on one node.

Speed: placement never scans every GPU. GPUs are grouped per node by (pool, model) (model "" = any),
and each group used by a request gets a `PoolIndex` (nodes ordered by score, with per-node best free
VRAM and TFLOPS, built on first use); a placement walks it best-first and checks only the GPUs of the
nodes it reaches. A change touches one node, which is re-scored and moved in O(GPUs on the node).
Explanations are built only on request (`filter(explain=True)`) or when a placement fails.

Candidate-node filtering (the extender, framework.py) is kept per request shape: `feasible_nodes`
holds the set of nodes where a shape fits and every change of a node marks it stale in each kept
set (and bumps `node_version`, which validates cached per-node explanations), so a filter costs the
changed nodes, not the GPUs.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from tfusion.allocator import filters
from tfusion.allocator.errors import (
    AllocatorError,
    FilterStage,
    InvalidAllocation,
    QuotaExceeded,
    Removal,
    Unschedulable,
)
from tfusion.allocator.index import PoolIndex
from tfusion.allocator.indexlock import NodeIndexLock
from tfusion.allocator.quota import QuotaSpec, Usage, check_single, check_total
from tfusion.allocator.request import AllocRequest, Resources
from tfusion.allocator.scoring import DEFAULT_MODE, FREE, USED, Weights, gpu_score, mode_variants
from tfusion.allocator.state import PHASE_PENDING, GpuInfo, GpuSlot
from tfusion.allocator.units import tflops_str, vram_mib_str, vram_str
from tfusion.api import annotations as tfa

DEFAULT_MAX_WORKERS_PER_NODE = 256
DEFAULT_ASSUME_TTL = 30 * 60.0
#: the filter stage of the node-level pod index lock (indexlock.py)
NODE_INDEX_LOCK = "NodeIndexLock"
RELEASED_MEMORY = 100_000  # released pod UIDs remembered, so a late bind cannot resurrect them


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """Placement mode and oversubscription settings of one pool (GPUPool + its SchedulingConfigTemplate)."""

    placement_mode: str = DEFAULT_MODE
    tflops_oversell_ratio: int = 500  # percent: 500 = 5x
    vram_expand_to_host_mem: int = 50  # percent of host RAM
    vram_expand_to_host_disk: int = 70  # percent of host disk

    def __post_init__(self) -> None:
        mode_variants(self.placement_mode)  # raises PlacementModeError for an unknown mode
        for name, low, high in (("tflops_oversell_ratio", 100, 100_000), ("vram_expand_to_host_mem", 0, 100),
                                ("vram_expand_to_host_disk", 0, 100)):
            value = getattr(self, name)
            if not low <= value <= high:
                raise ValueError(f"{name} must be {low}..{high}, got {value}")


@dataclass(frozen=True, slots=True)
class Placement:
    """A decision: the node, the GPUs (best first) and the node's score."""

    node: str
    gpu_names: tuple[str, ...]
    score: int


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


@dataclass(frozen=True, slots=True)
class AllocationInfo:
    """A live allocation as readers see it (views, recovery checks, the hypervisor)."""

    request: AllocRequest
    node: str
    gpu_names: tuple[str, ...]
    assumed: bool
    charges: tuple[tuple[int, int], ...]  # per GPU request (milli-TFLOPS, bytes) taken
    limits: tuple[tuple[int, int], ...]  # per GPU limit (milli-TFLOPS, bytes)


class _Allocation:
    __slots__ = ("assumed_at", "charges", "gpus", "limits", "node", "req", "shared", "usage")

    def __init__(self, req: AllocRequest, node: str, gpus: tuple[str, ...],
                 charges: tuple[tuple[int, int], ...], limits: tuple[tuple[int, int], ...],
                 assumed_at: float | None) -> None:
        self.req = req
        self.node = node
        self.gpus = gpus
        self.charges = charges
        self.limits = limits
        self.shared = req.isolation == tfa.ISOLATION_SHARED
        self.assumed_at = assumed_at
        self.usage = _usage_of(charges, limits)


def _charge_slot(slot: GpuSlot, uid: str, charge: tuple[int, int], shared: bool) -> None:
    """Record `uid`'s charge on `slot`: a shared (whole-GPU) allocation owns it, others add up."""
    slot.allocs[uid] = charge
    if shared:
        slot.shared_by = uid
    else:
        slot.used_t += charge[0]
        slot.used_v += charge[1]


def _usage_of(charges: Sequence[tuple[int, int]], limits: Sequence[tuple[int, int]]) -> Usage:
    return Usage(sum(c[0] for c in charges), sum(c[1] for c in charges),
                 sum(lim[0] for lim in limits), sum(lim[1] for lim in limits), 1)


GroupKey = tuple[str, str]  # (pool, model); model "" = every model of the pool
#: everything in a request that decides whether one node can take it (see `feasible_nodes`)
ShapeKey = tuple[str, str, int, int, int, int, str, tuple[int, ...], str]
MAX_SHAPES = 32  # request shapes whose feasible-node sets are kept
MAX_EXPLAINED_SHAPES = 8  # request shapes whose per-node explanations are kept (a few hundred bytes per node)


def shape_of(req: AllocRequest) -> ShapeKey:
    return (req.pool, req.gpu_model, req.tflops_request, req.percent_request, req.vram_request, req.count,
            req.isolation, req.indices, req.vendor)


class _FeasibleSet:
    """The nodes that can take one request shape now; `stale` nodes changed since they were judged."""

    __slots__ = ("nodes", "stale")

    def __init__(self) -> None:
        self.nodes: set[str] = set()
        self.stale: set[str] = set()


def _group_keys(info: GpuInfo) -> tuple[GroupKey, ...]:
    return ((info.pool, ""), (info.pool, info.model)) if info.model else ((info.pool, ""),)


class _Node:
    __slots__ = ("gpus", "groups", "name", "score_free", "score_used", "sum_free", "sum_used", "workers")

    def __init__(self, name: str) -> None:
        self.name = name
        self.gpus: dict[str, GpuSlot] = {}
        self.groups: dict[GroupKey, list[GpuSlot]] = {}  # GPUs by (pool, model), sorted by name
        self.workers: dict[str, str] = {}  # pod uid -> "namespace/name"
        self.sum_used = 0
        self.sum_free = 0
        self.score_used = 0
        self.score_free = 0


class GpuAllocator:
    """The allocator. Construct once per leader term; feed GPUs, quotas and pool configs, then place.

    `clock` gives the time used for the assume TTL (injectable for tests); `weights` are
    GPUResourcesFit's vramWeight/tflopsWeight; `max_workers_per_node` caps pods per node.
    """

    def __init__(
        self,
        *,
        max_workers_per_node: int = DEFAULT_MAX_WORKERS_PER_NODE,
        weights: Weights | None = None,
        assume_ttl: float = DEFAULT_ASSUME_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_workers_per_node < 1:
            raise ValueError(f"max_workers_per_node must be at least 1, got {max_workers_per_node}")
        self.max_workers_per_node = max_workers_per_node
        self.weights = weights or Weights()
        self.assume_ttl = assume_ttl
        self._clock = clock
        self._gpus: dict[str, GpuSlot] = {}
        self._nodes: dict[str, _Node] = {}
        self._pools: dict[str, dict[str, GpuSlot]] = {}
        self._pool_cfg: dict[str, PoolConfig] = {}
        self._index: dict[GroupKey, PoolIndex] = {}  # built on first use, then kept up to date
        self._allocs: dict[str, _Allocation] = {}
        self._assumed: dict[str, float] = {}  # uid -> assumed at, oldest first
        self._detached: dict[str, dict[str, tuple[int, int]]] = {}  # removed GPU -> its charges
        self._quota: dict[str, QuotaSpec] = {}
        self._used: dict[str, Usage] = {}  # committed, per namespace
        self._assumed_used: dict[str, Usage] = {}
        self._dirty: set[str] = set()
        self._dirty_quota: set[str] = set()
        self._released: OrderedDict[str, None] = OrderedDict()
        # feasible nodes per request shape (the extender's candidate filter), least recently used first
        self._shapes: OrderedDict[ShapeKey, _FeasibleSet] = OrderedDict()
        self._qos_live: dict[str, int] = {}  # live allocations per QoS level (preemption hints)
        self._versions: dict[str, int] = {}  # node -> change counter (explanations cached per version)
        self._static_gen: dict[str, int] = {}  # node -> change counter of its GPUs' reported facts
        #: explain.py's per-node, per-group facts that depend on the GPUs' reported facts only
        self.static_facts: dict[tuple[str, GroupKey], tuple[int, Any]] = {}
        self._explained: OrderedDict[ShapeKey, dict[str, Any]] = OrderedDict()
        #: which pod holds which device-plugin index on which node, for as long as its allocation lives
        self.index_lock = NodeIndexLock()

    # ------------------------------------------------------------------ GPUs, pools, quotas

    def upsert_gpu(self, info: GpuInfo) -> None:
        """Add a GPU or apply a change of it.

        Capacity changes move available by the same delta (available is capacity - used);
        compute-percent charges on the GPU are re-derived from the new capacity. A GPU holding
        allocations cannot move to another node or pool (raises AllocatorError, nothing changes).
        Nothing the allocator owns (available, running apps) is taken from `info`.
        """
        slot = self._gpus.get(info.name)
        if slot is None:
            self._add_gpu(info)
            return
        old = slot.info
        if (old.node, old.pool) != (info.node, info.pool):
            if slot.allocs:
                raise AllocatorError(
                    f"GPU {info.name} holds {len(slot.allocs)} allocation(s) and cannot move from "
                    f"{old.node}/{old.pool} to {info.node}/{info.pool}")
            self._drop_gpu(slot)
            self._add_gpu(info)
            return
        node = self._nodes[info.node]
        if old.model != info.model:
            self._ungroup(node, slot, old)
            slot.info = info
            self._group(node, slot)
        slot.info = info
        self._bump_static(info.node)
        if old.capacity_tflops != info.capacity_tflops:
            self._recharge_percent(slot)
        slot.refresh()
        if (old.capacity_tflops, old.capacity_vram) != (info.capacity_tflops, info.capacity_vram):
            self._dirty.add(info.name)
        self._update_node_scores(node)
        self._reindex(node)

    def remove_gpu(self, name: str) -> None:
        """Forget a GPU. Allocations on it stay (their pods still run) and re-attach if it returns."""
        slot = self._gpus.get(name)
        if slot is None:
            return
        if slot.allocs:
            self._detached[name] = dict(slot.allocs)
        self._drop_gpu(slot)
        self._dirty.discard(name)

    def _add_gpu(self, info: GpuInfo) -> None:
        slot = GpuSlot(info)
        charges = self._detached.pop(info.name, None)
        if charges:
            for uid, charge in charges.items():
                alloc = self._allocs.get(uid)
                if alloc is None:
                    continue
                _charge_slot(slot, uid, charge, alloc.shared)
            slot.refresh()
            self._recharge_percent(slot)
        self._gpus[info.name] = slot
        self._pools.setdefault(info.pool, {})[info.name] = slot
        node = self._nodes.get(info.node)
        if node is None:
            node = self._nodes[info.node] = _Node(info.node)
        node.gpus[info.name] = slot
        self._group(node, slot)
        self._dirty.add(info.name)
        self._update_node_scores(node)
        self._reindex(node)

    def _drop_gpu(self, slot: GpuSlot) -> None:
        node = self._nodes[slot.node]
        del node.gpus[slot.name]
        self._ungroup(node, slot, slot.info)
        pool = self._pools[slot.pool]
        del pool[slot.name]
        if not pool:
            del self._pools[slot.pool]
            self._drop_indexes(slot.pool)
        del self._gpus[slot.name]
        if not node.gpus and not node.workers:
            del self._nodes[node.name]
        else:
            self._update_node_scores(node)
            self._reindex(node)

    def _bump_static(self, node: str) -> None:
        self._static_gen[node] = self._static_gen.get(node, 0) + 1

    def static_version(self, node: str) -> int:
        """A counter that changes whenever the node's GPUs or their reported facts (not their load) change."""
        return self._static_gen.get(node, 0)

    def _group(self, node: _Node, slot: GpuSlot) -> None:
        self._bump_static(node.name)
        for key in _group_keys(slot.info):
            members = node.groups.setdefault(key, [])
            members.append(slot)
            members.sort(key=lambda s: s.name)

    def _ungroup(self, node: _Node, slot: GpuSlot, info: GpuInfo) -> None:
        self._mark_stale(node.name)
        self._bump_static(node.name)
        for key in _group_keys(info):
            members = node.groups[key]
            members.remove(slot)
            if not members:
                del node.groups[key]
                index = self._index.get(key)
                if index is not None:
                    index.remove(node.name)

    def _drop_indexes(self, pool: str) -> None:
        for key in [k for k in self._index if k[0] == pool]:
            del self._index[key]

    def _recharge_percent(self, slot: GpuSlot) -> None:
        """Re-derive compute-percent charges on `slot` from its current capacity."""
        cap = slot.info.capacity_tflops
        for uid in list(slot.allocs):
            alloc = self._allocs.get(uid)
            if alloc is None or not (alloc.req.percent_request or alloc.req.percent_limit):
                continue
            i = alloc.gpus.index(slot.name)
            new_charge = (alloc.req.tflops_need(cap), alloc.charges[i][1])
            new_limit = (alloc.req.tflops_limit_on(cap), alloc.limits[i][1])
            self._change_charge(alloc, i, slot, new_charge, new_limit)

    def _change_charge(self, alloc: _Allocation, i: int, slot: GpuSlot | None,
                       charge: tuple[int, int], limit: tuple[int, int]) -> None:
        uid = alloc.req.pod_uid
        old_usage = alloc.usage
        if slot is not None and not alloc.shared:
            old = slot.allocs[uid]
            slot.used_t += charge[0] - old[0]
            slot.used_v += charge[1] - old[1]
            slot.allocs[uid] = charge
            slot.refresh()
        elif slot is not None:
            slot.allocs[uid] = charge
        alloc.charges = (*alloc.charges[:i], charge, *alloc.charges[i + 1:])
        alloc.limits = (*alloc.limits[:i], limit, *alloc.limits[i + 1:])
        alloc.usage = _usage_of(alloc.charges, alloc.limits)
        bucket = self._usage_bucket(alloc)
        bucket.add(old_usage, -1)
        bucket.add(alloc.usage)
        if alloc.assumed_at is None:
            self._dirty_quota.add(alloc.req.namespace)
            self._dirty.add(alloc.gpus[i])

    def set_pool_config(self, pool: str, placement_mode: str | PoolConfig = DEFAULT_MODE,
                        **oversubscription: int) -> None:
        """Set a pool's placement mode (from its SchedulingConfigTemplate) and oversubscription.

        Pass a mode name and the oversubscription fields of `PoolConfig`, or a `PoolConfig`.
        An unknown mode raises PlacementModeError and changes nothing.
        """
        if isinstance(placement_mode, PoolConfig):
            cfg = placement_mode
        else:
            cfg = PoolConfig(placement_mode, **oversubscription)
        old = self._pool_cfg.get(pool)
        self._pool_cfg[pool] = cfg
        if old is None or mode_variants(old.placement_mode)[0] != mode_variants(cfg.placement_mode)[0]:
            self._drop_indexes(pool)  # rebuilt, ordered by the new node score, on next use

    def pool_config(self, pool: str) -> PoolConfig:
        return self._pool_cfg.get(pool) or PoolConfig()

    def set_quota(self, namespace: str, spec: QuotaSpec) -> None:
        self._quota[namespace] = spec
        self._dirty_quota.add(namespace)

    def remove_quota(self, namespace: str) -> None:
        self._quota.pop(namespace, None)
        self._dirty_quota.discard(namespace)

    # ------------------------------------------------------------------ scoring bookkeeping

    def _node_part(self, slot: GpuSlot, variant: str) -> int:
        info = slot.info
        score = gpu_score(slot.avail_t, info.capacity_tflops, slot.avail_v, info.capacity_vram, variant,
                          self.weights)
        return score // 4 if info.phase == PHASE_PENDING else score

    def _update_node_scores(self, node: _Node) -> None:
        n = len(node.gpus)
        if not n:
            node.sum_used = node.sum_free = node.score_used = node.score_free = 0
            return
        su = sf = 0
        for slot in node.gpus.values():
            su += self._node_part(slot, USED)
            sf += self._node_part(slot, FREE)
        node.sum_used, node.sum_free = su, sf
        node.score_used, node.score_free = su // n, sf // n

    def _group_index(self, key: GroupKey) -> PoolIndex:
        """The score-ordered index of the nodes holding GPUs of `key`, built on first use."""
        index = self._index.get(key)
        if index is None:
            variant = mode_variants(self.pool_config(key[0]).placement_mode)[0]
            index = self._index[key] = PoolIndex(variant)
            for node in self._nodes.values():
                if key in node.groups:
                    self._place(index, node, key)
        return index

    def _reindex(self, node: _Node) -> None:
        self._mark_stale(node.name)
        for key in node.groups:
            index = self._index.get(key)
            if index is not None:
                self._place(index, node, key)

    def _place(self, index: PoolIndex, node: _Node, key: GroupKey) -> None:
        best_v = best_t = -1
        usable = 0
        if len(node.workers) < self.max_workers_per_node:
            for slot in node.groups[key]:
                if slot.schedulable:
                    usable += 1
                    if slot.avail_v > best_v:
                        best_v = slot.avail_v
                    if slot.avail_t > best_t:
                        best_t = slot.avail_t
        score = node.score_used if index.variant == USED else node.score_free
        index.place(node.name, score, best_v, best_t, usable)

    def node_score(self, node: str, pool: str) -> int:
        """The node's score under `pool`'s placement mode (0..100)."""
        n = self._nodes[node]
        return n.score_used if mode_variants(self.pool_config(pool).placement_mode)[0] == USED \
            else n.score_free

    def _gpu_order(self, slots: Iterable[GpuSlot], pool: str) -> list[GpuSlot]:
        variant = mode_variants(self.pool_config(pool).placement_mode)[1]
        w = self.weights
        return sorted(slots, key=lambda s: (-gpu_score(s.avail_t, s.info.capacity_tflops, s.avail_v,
                                                       s.info.capacity_vram, variant, w), s.name))

    # ------------------------------------------------------------------ deciding

    def _quota_precheck(self, req: AllocRequest) -> None:
        spec = self._quota.get(req.namespace)
        if spec is None:
            return
        # compute-percent TFLOPS are known only once GPUs are chosen: checked exactly in assume
        per_gpu = Usage(req.tflops_request, req.vram_request, req.tflops_limit, req.vram_limit, 1)
        check_single(req.namespace, spec, per_gpu, req.count)
        charge = Usage(req.tflops_request * req.count, req.vram_request * req.count,
                       req.tflops_limit * req.count, req.vram_limit * req.count, 1)
        check_total(req.namespace, spec, self._effective_usage(req.namespace), charge)

    def _node_fit(self, node: _Node, key: GroupKey, req: AllocRequest) -> list[GpuSlot] | None:
        if len(node.workers) >= self.max_workers_per_node:
            return None
        members = node.groups.get(key)
        if not members:
            return None
        fits = filters.gpu_fits
        found = [slot for slot in members if fits(slot, req)]
        return found if len(found) >= req.count else None

    def _mark_stale(self, node: str) -> None:
        self._versions[node] = self._versions.get(node, 0) + 1
        for cached in self._shapes.values():
            cached.stale.add(node)

    def live_by_qos(self) -> Mapping[str, int]:
        """How many live allocations (assumed or committed) there are of each QoS level."""
        return self._qos_live

    def node_version(self, node: str) -> int:
        """A counter that changes whenever anything about `node` that placement reads changes."""
        return self._versions.get(node, 0)

    def index_conflict(self, req: AllocRequest, node: str) -> str:
        """Why `req` cannot hold its pod index on `node` (another pod holds it there), or ""."""
        if not req.pod_index:
            return ""
        others = self.index_lock.holders(node, req.pod_index, besides=req.pod_uid)
        if not others:
            return ""
        names = sorted(self._pod_name(uid) for uid in others)
        return (f"pod index {req.pod_index} is held on node {node} by pod {', '.join(names)} (the device "
                f"plugin tells pods apart by index, so two pods on one node cannot share one)")

    def _pod_name(self, uid: str) -> str:
        alloc = self._allocs.get(uid)
        return f"{alloc.req.namespace}/{alloc.req.pod_name}" if alloc is not None else uid

    def explain_cache(self, req: AllocRequest) -> dict[str, Any]:
        """Per-node memo for explanations of `req`'s shape: node -> value (explain.py's NodeFacts,
        which carry the node_version they were judged at); valid while the node's version matches.
        Kept for the last MAX_EXPLAINED_SHAPES shapes."""
        key = shape_of(req)
        memo = self._explained.get(key)
        if memo is None:
            memo = self._explained[key] = {}
            if len(self._explained) > MAX_EXPLAINED_SHAPES:
                self._explained.popitem(last=False)
        else:
            self._explained.move_to_end(key)
        return memo

    def feasible_nodes(self, req: AllocRequest) -> AbstractSet[str]:
        """Nodes where `req` fits now (enough GPUs pass every per-GPU stage, worker limit not reached).

        Quota is not checked (that is PreFilter). Kept per request shape (pool, model, amounts,
        count, isolation, indices, vendor) for the last MAX_SHAPES shapes: every change of a node marks
        it stale in each kept set and only stale nodes are judged again, so a call costs O(changed
        nodes x their GPUs); a shape not kept is judged on every node of its group once. The set is
        the allocator's own: read it, do not keep it across a change, never modify it.
        """
        key = shape_of(req)
        cached = self._shapes.get(key)
        group = (req.pool, req.gpu_model)
        if cached is None:
            cached = self._shapes[key] = _FeasibleSet()
            if len(self._shapes) > MAX_SHAPES:
                self._shapes.popitem(last=False)
            cached.stale = {name for name, node in self._nodes.items() if group in node.groups}
        else:
            self._shapes.move_to_end(key)
        if cached.stale:
            nodes = self._nodes
            feasible = cached.nodes
            # the group index's per-node maxima (best free VRAM and TFLOPS of a schedulable GPU, how
            # many schedulable GPUs; -1/0 at the worker limit) rule most nodes out without looking
            # at their GPUs: a new shape costs O(nodes), not O(GPUs), when few nodes can take it
            index = self._group_index(group)
            agg_v, agg_t, agg_n = index.agg_v, index.agg_t, index.agg_n
            need_v, need_t, need_n = req.vram_request, req.tflops_request, req.count  # percent: VRAM only
            for name in cached.stale:
                if agg_v.get(name, -1) < need_v or agg_t.get(name, -1) < need_t or agg_n.get(name, 0) < need_n:
                    feasible.discard(name)
                    continue
                node = nodes.get(name)
                if node is not None and self._node_fit(node, group, req) is not None:
                    feasible.add(name)
                else:
                    feasible.discard(name)
            cached.stale = set()
        return cached.nodes

    def fitting_gpus(self, node: str, req: AllocRequest) -> tuple[str, ...] | None:
        """The GPUs of `node` that `req` would get, best first (`req.count` of them); None when it does not fit."""
        found = self._nodes.get(node)
        slots = None if found is None else self._node_fit(found, (req.pool, req.gpu_model), req)
        if slots is None:
            return None
        return tuple(s.name for s in self._gpu_order(slots, req.pool)[: req.count])

    def select(
        self,
        req: AllocRequest,
        *,
        nodes: Collection[str] | None = None,
        node_ok: Callable[[str], bool] | None = None,
        diagnose: bool = True,
    ) -> Placement:
        """Pick the best node and GPUs for `req` without changing anything.

        `nodes` restricts the choice (the extender's candidate list); `node_ok` rejects nodes for
        reasons outside the allocator (the built-in scheduler's taints, CPU, memory ...).
        Raises QuotaExceeded or Unschedulable (with the filter trail and per-node reasons; with
        `diagnose=False` a bare Unschedulable, for callers that explain with the Framework).
        """
        self._quota_precheck(req)
        if req.pool not in self._pools:
            raise Unschedulable(f"pool {req.pool!r} has no GPUs", stage="")
        pool = req.pool
        key = (pool, req.gpu_model)  # a model filter walks only the nodes holding that model
        index = self._group_index(key)
        found: tuple[_Node, list[GpuSlot]] | None = None
        if nodes is None:
            all_nodes = self._nodes

            busy = self.index_lock.busy_nodes(req.pod_index, req.pod_uid)

            def fits(name: str) -> tuple[_Node, list[GpuSlot]] | None:
                node = all_nodes[name]
                slots = self._node_fit(node, key, req)
                if slots is None or name in busy or (node_ok is not None and not node_ok(name)):
                    return None
                return node, slots

            # percent requests: TFLOPS needed depends on the GPU, so only VRAM prunes
            found = index.search(req.vram_request, req.tflops_request, fits,  # type: ignore[assignment]
                                 need_gpus=req.count)
        else:
            busy = self.index_lock.busy_nodes(req.pod_index, req.pod_uid)
            for name in sorted((n for n in set(nodes) if n in index and n not in busy),
                               key=lambda n: (-index.score(n), n)):
                slots = self._node_fit(self._nodes[name], key, req)
                if slots is not None and (node_ok is None or node_ok(name)):
                    found = (self._nodes[name], slots)
                    break
        if found is None:
            if not diagnose:
                raise Unschedulable(f"0/{len(index)} nodes of pool {req.pool} can take the request")
            raise self._diagnose(req, nodes)
        node, slots = found
        chosen = self._gpu_order(slots, pool)[: req.count]
        return Placement(node.name, tuple(s.name for s in chosen), index.score(node.name))

    def filter(self, req: AllocRequest, *, nodes: Collection[str] | None = None,
               explain: bool = False) -> FilterResult:
        """Run the whole filter chain over every GPU of the pool (or of `nodes`).

        This is the slow, complete form used for explanations and for the extender's filter;
        with `explain` each stage records what it removed and why.
        """
        result = FilterResult()
        try:
            self._quota_precheck(req)
        except QuotaExceeded as exc:
            result.error = exc
            result.stage = filters.QUOTA
            if explain:
                result.stages.append(FilterStage(filters.QUOTA, 0, 0, []))
            return result
        pool = self._pools.get(req.pool)
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
            slots = self._node_stage(result, filters.SAME_NODE, by_node, explain,
                                     lambda n, g: None if len(g) >= req.count else
                                     f"node {n} has {len(g)} matching GPU(s), {req.count} requested")
        if slots:
            limit = self.max_workers_per_node
            slots = self._node_stage(result, filters.MAX_WORKERS, by_node, explain,
                                     lambda n, g: None if len(self._nodes[n].workers) < limit else
                                     f"node {n} has {len(self._nodes[n].workers)} workers, limit {limit}")
        result.nodes = {n: [s.name for s in g] for n, g in sorted(by_node.items())}
        return result

    def _node_stage(self, result: FilterResult, name: str, by_node: dict[str, list[GpuSlot]], explain: bool,
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

    def _diagnose(self, req: AllocRequest, nodes: Collection[str] | None) -> Unschedulable:
        result = self.filter(req, nodes=nodes, explain=True)
        if result.error is not None:
            return result.error
        pool = self._pools.get(req.pool, {})
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

    def score(self, req: AllocRequest, nodes: Iterable[str]) -> dict[str, int]:
        """Node scores (0..100) under `req`'s pool mode, for the nodes given (the extender's prioritize)."""
        index = self._group_index((req.pool, "")) if req.pool in self._pools else None
        return {n: index.score(n) if index is not None and n in index else 0 for n in nodes}

    # ------------------------------------------------------------------ recording

    def allocate(self, req: AllocRequest) -> Placement:
        """select + assume + commit in one step (the built-in scheduler and single-node mode)."""
        placement = self.select(req)
        self.assume(req, placement.gpu_names)
        self.commit(req.pod_uid)
        return placement

    def _charges(self, req: AllocRequest, slots: Sequence[GpuSlot]) -> tuple[tuple[tuple[int, int], ...],
                                                                            tuple[tuple[int, int], ...]]:
        charges = tuple((req.tflops_need(s.info.capacity_tflops), req.vram_request) for s in slots)
        limits = tuple((req.tflops_limit_on(s.info.capacity_tflops), req.vram_limit) for s in slots)
        return charges, limits

    def assume(self, req: AllocRequest, gpu_names: Sequence[str], *, now: float | None = None) -> Placement:
        """Reserve `gpu_names` for `req` (the scheduler's Reserve). Expires after the assume TTL.

        Checks: the pod holds nothing and was not released, the GPUs exist, are distinct, number
        `req.count`, sit on one node of the pool, the node is under its worker limit, each GPU has
        room (shared: is idle) and the namespace quota allows it. On failure nothing changes.
        """
        uid = req.pod_uid
        if not uid:
            raise InvalidAllocation("the request has no pod UID")
        if uid in self._allocs:
            raise InvalidAllocation(f"pod {req.namespace}/{req.pod_name} ({uid}) already holds an allocation")
        if uid in self._released:
            raise InvalidAllocation(f"pod {req.namespace}/{req.pod_name} ({uid}) was released")
        names = tuple(gpu_names)
        if len(names) != req.count or len(set(names)) != len(names):
            raise InvalidAllocation(f"{req.count} distinct GPU(s) required, got {list(names)}")
        slots = []
        for name in names:
            slot = self._gpus.get(name)
            if slot is None:
                raise InvalidAllocation(f"GPU {name} is unknown")
            if slot.pool != req.pool:
                raise InvalidAllocation(f"GPU {name} is in pool {slot.pool}, not {req.pool}")
            slots.append(slot)
        node = self._nodes[slots[0].node]
        if any(s.node != node.name for s in slots):
            raise InvalidAllocation(f"GPUs {list(names)} are on several nodes; all must be on one node")
        if len(node.workers) >= self.max_workers_per_node:
            raise Unschedulable(f"node {node.name} has {len(node.workers)} workers, limit "
                                f"{self.max_workers_per_node}", stage=filters.MAX_WORKERS,
                                nodes={node.name: ["max workers reached"]})
        busy = self.index_conflict(req, node.name) if req.pod_index else ""
        if busy:
            raise Unschedulable(busy, stage=NODE_INDEX_LOCK, nodes={node.name: [busy]})
        charges, limits = self._charges(req, slots)
        for slot, (need_t, need_v) in zip(slots, charges, strict=True):
            reason = filters.shared_whole(slot, req) if req.isolation == tfa.ISOLATION_SHARED else None
            if reason is None and (slot.shared_by is not None or slot.avail_t < need_t or slot.avail_v < need_v):
                reason = filters.resource(slot, req)
            if reason is not None:
                raise Unschedulable(f"cannot assume: {reason}", stage="ResourceFilter",
                                    nodes={node.name: [reason]})
        self._quota_exact(req, charges, limits)
        alloc = _Allocation(req, node.name, names, charges, limits,
                            self._clock() if now is None else now)
        self._apply(alloc)
        self._assumed[uid] = alloc.assumed_at  # type: ignore[assignment]
        return Placement(node.name, names, self.node_score(node.name, req.pool))

    def _quota_exact(self, req: AllocRequest, charges: Sequence[tuple[int, int]],
                     limits: Sequence[tuple[int, int]], *, replacing: _Allocation | None = None) -> None:
        spec = self._quota.get(req.namespace)
        if spec is None:
            return
        per_gpu = Usage(max((c[0] for c in charges), default=0), req.vram_request,
                        max((lim[0] for lim in limits), default=0), req.vram_limit, 1)
        check_single(req.namespace, spec, per_gpu, req.count)
        charge = _usage_of(charges, limits)
        used = self._effective_usage(req.namespace)
        if replacing is not None:
            charge.add(replacing.usage, -1)
            charge.workers = 0
        check_total(req.namespace, spec, used, charge)

    def _usage_bucket(self, alloc: _Allocation) -> Usage:
        ns = alloc.req.namespace
        store = self._used if alloc.assumed_at is None else self._assumed_used
        bucket = store.get(ns)
        if bucket is None:
            bucket = store[ns] = Usage()
        return bucket

    def _effective_usage(self, namespace: str) -> Usage:
        return (self._used.get(namespace) or Usage()).plus(self._assumed_used.get(namespace) or Usage())

    def _apply(self, alloc: _Allocation) -> None:
        uid = alloc.req.pod_uid
        for name, charge in zip(alloc.gpus, alloc.charges, strict=True):
            slot = self._gpus.get(name)
            if slot is None:
                self._detached.setdefault(name, {})[uid] = charge
                continue
            _charge_slot(slot, uid, charge, alloc.shared)
            slot.refresh()
        node = self._nodes.get(alloc.node)
        if node is None:
            node = self._nodes[alloc.node] = _Node(alloc.node)
        node.workers[uid] = f"{alloc.req.namespace}/{alloc.req.pod_name}"
        if alloc.req.pod_index:
            self.index_lock.occupy(alloc.node, alloc.req.pod_index, uid)
        self._qos_live[alloc.req.qos] = self._qos_live.get(alloc.req.qos, 0) + 1
        self._allocs[uid] = alloc
        self._usage_bucket(alloc).add(alloc.usage)
        self._touch(alloc)

    def _unapply(self, alloc: _Allocation) -> None:
        uid = alloc.req.pod_uid
        for name in alloc.gpus:
            slot = self._gpus.get(name)
            if slot is None:
                detached = self._detached.get(name)
                if detached is not None:
                    detached.pop(uid, None)
                    if not detached:
                        del self._detached[name]
                continue
            charge = slot.allocs.pop(uid)
            if slot.shared_by == uid:
                slot.shared_by = None
            elif not alloc.shared:
                slot.used_t -= charge[0]
                slot.used_v -= charge[1]
            slot.refresh()
        node = self._nodes[alloc.node]
        del node.workers[uid]
        if alloc.req.pod_index:
            self.index_lock.release(alloc.node, alloc.req.pod_index, uid)
        self._qos_live[alloc.req.qos] -= 1
        del self._allocs[uid]
        self._assumed.pop(uid, None)
        self._usage_bucket(alloc).add(alloc.usage, -1)
        self._touch(alloc)
        if not node.gpus and not node.workers:
            del self._nodes[node.name]

    def _touch(self, alloc: _Allocation) -> None:
        """Re-score the allocation's node and mark what status must be rewritten."""
        if alloc.assumed_at is None:
            self._dirty.update(n for n in alloc.gpus if n in self._gpus)
            self._dirty_quota.add(alloc.req.namespace)
        node = self._nodes.get(alloc.node)
        if node is not None and node.gpus:
            self._update_node_scores(node)
            self._reindex(node)

    def commit(self, pod_uid: str) -> None:
        """Make an assumed allocation permanent (the scheduler's PreBind). Idempotent."""
        alloc = self._allocs.get(pod_uid)
        if alloc is None:
            raise InvalidAllocation(f"pod {pod_uid} has no assumed allocation to commit")
        if alloc.assumed_at is None:
            return
        self._usage_bucket(alloc).add(alloc.usage, -1)
        alloc.assumed_at = None
        del self._assumed[pod_uid]
        self._usage_bucket(alloc).add(alloc.usage)
        self._dirty.update(n for n in alloc.gpus if n in self._gpus)
        self._dirty_quota.add(alloc.req.namespace)

    def forget(self, pod_uid: str) -> bool:
        """Drop an assumed (not committed) allocation; False when there is none."""
        alloc = self._allocs.get(pod_uid)
        if alloc is None or alloc.assumed_at is None:
            return False
        self._unapply(alloc)
        return True

    def rollback(self, pod_uid: str) -> bool:
        """Undo an assumed or committed allocation after a failed bind; the pod may be placed again."""
        alloc = self._allocs.get(pod_uid)
        if alloc is None:
            return False
        self._unapply(alloc)
        return True

    def release(self, pod_uid: str) -> bool:
        """Free a pod's allocation for good (pod deleted or finished). Idempotent."""
        alloc = self._allocs.get(pod_uid)
        self._released[pod_uid] = None
        if len(self._released) > RELEASED_MEMORY:
            self._released.popitem(last=False)
        if alloc is None:
            return False
        self._unapply(alloc)
        return True

    def expire_assumed(self, now: float | None = None) -> list[str]:
        """Forget assumed allocations older than the TTL; returns their pod UIDs."""
        now = self._clock() if now is None else now
        expired = [uid for uid, at in self._assumed.items() if now - at >= self.assume_ttl]
        for uid in expired:
            self._unapply(self._allocs[uid])
        return expired

    def adjust(self, pod_uid: str, new_request: Resources, new_limit: Resources,
               dry_run: bool = False) -> AllocRequest:
        """Resize a live allocation in place (vertical scaling); returns the new request.

        Every GPU must have room for the increase and the quota must allow it; with `dry_run`
        only the checks run. On failure nothing changes.
        """
        alloc = self._allocs.get(pod_uid)
        if alloc is None:
            raise InvalidAllocation(f"pod {pod_uid} has no allocation to adjust")
        req = alloc.req.with_resources(new_request, new_limit)
        slots = [self._gpus.get(n) for n in alloc.gpus]
        caps = [s.info.capacity_tflops if s is not None else 0 for s in slots]
        charges = tuple((req.tflops_need(c), req.vram_request) for c in caps)
        limits = tuple((req.tflops_limit_on(c), req.vram_limit) for c in caps)
        if not alloc.shared:
            for slot, old, new in zip(slots, alloc.charges, charges, strict=True):
                if slot is None:
                    continue
                cap = slot.info
                if (new[0] > old[0] and slot.used_t - old[0] + new[0] > cap.capacity_tflops) or \
                        (new[1] > old[1] and slot.used_v - old[1] + new[1] > cap.capacity_vram):
                    raise Unschedulable(
                        f"cannot resize on {slot.name}: TFLOPS available {tflops_str(slot.avail_t)}, "
                        f"VRAM available {vram_str(slot.avail_v)}; the increase needs "
                        f"{tflops_str(max(0, new[0] - old[0]))} TFLOPS and {vram_str(max(0, new[1] - old[1]))}",
                        stage="ResourceFilter", nodes={alloc.node: [slot.name]})
        self._quota_exact(req, charges, limits, replacing=alloc)
        if dry_run:
            return req
        old_usage = alloc.usage
        bucket = self._usage_bucket(alloc)
        for i, name in enumerate(alloc.gpus):
            slot = self._gpus.get(name)
            if slot is None:
                self._detached[name][pod_uid] = charges[i]
                continue
            old = slot.allocs[pod_uid]
            slot.allocs[pod_uid] = charges[i]
            if not alloc.shared:
                slot.used_t += charges[i][0] - old[0]
                slot.used_v += charges[i][1] - old[1]
            slot.refresh()
        alloc.req = req
        alloc.charges, alloc.limits = charges, limits
        alloc.usage = _usage_of(charges, limits)
        bucket.add(old_usage, -1)
        bucket.add(alloc.usage)
        self._touch(alloc)
        return req

    def restore(self, allocations: Iterable[tuple[AllocRequest, Sequence[str]]]) -> list[tuple[str, str]]:
        """Rebuild committed allocations (leader recovery from worker pods' gpu-ids annotations).

        No capacity, quota or worker checks: these pods already run. A GPU that is not known (yet)
        is charged when it appears, like a GPU removed and re-added (a compute-percent charge on it
        is 0 until its capacity is known). Returns (pod uid, reason) for each entry that could not
        be restored: duplicate pod, empty or repeated GPU list, no known GPU, GPUs on several nodes.
        """
        skipped: list[tuple[str, str]] = []
        for req, gpu_names in allocations:
            names = tuple(gpu_names)
            uid = req.pod_uid
            known = [self._gpus[n] for n in names if n in self._gpus]
            reason = ""
            if not uid:
                reason = "no pod UID"
            elif uid in self._allocs:
                reason = "pod already holds an allocation"
            elif not names or len(set(names)) != len(names):
                reason = f"GPU list {list(names)} is empty or repeats a GPU"
            elif not known:
                reason = f"none of the GPUs {list(names)} is known"
            elif len({s.node for s in known}) != 1:
                reason = f"GPUs {list(names)} are on several nodes"
            if reason:
                skipped.append((uid, reason))
                continue
            caps = [self._gpus[n].info.capacity_tflops if n in self._gpus else 0 for n in names]
            charges = tuple((req.tflops_need(c), req.vram_request) for c in caps)
            limits = tuple((req.tflops_limit_on(c), req.vram_limit) for c in caps)
            self._apply(_Allocation(req, known[0].node, names, charges, limits, None))
        return skipped

    # ------------------------------------------------------------------ reading

    def dirty_gpus(self) -> set[str]:
        return set(self._dirty)

    def take_dirty(self) -> set[str]:
        """GPU names whose status changed since the last call (the status sync loop's work list)."""
        dirty, self._dirty = self._dirty, set()
        return dirty

    def mark_dirty(self, names: Iterable[str]) -> None:
        """Put GPUs back on the work list (a status write failed)."""
        self._dirty.update(n for n in names if n in self._gpus)

    def take_dirty_quotas(self) -> set[str]:
        """Namespaces whose quota status changed since the last call."""
        dirty, self._dirty_quota = self._dirty_quota, set()
        return {ns for ns in dirty if ns in self._quota}

    def gpu_names(self) -> list[str]:
        return sorted(self._gpus)

    def gpu_info(self, name: str) -> GpuInfo:
        return self._gpus[name].info

    def has_allocation(self, pod_uid: str) -> bool:
        return pod_uid in self._allocs

    def allocation(self, pod_uid: str) -> AllocationInfo | None:
        alloc = self._allocs.get(pod_uid)
        if alloc is None:
            return None
        return AllocationInfo(alloc.req, alloc.node, alloc.gpus, alloc.assumed_at is not None,
                              alloc.charges, alloc.limits)

    def allocations(self, *, committed_only: bool = False) -> dict[str, AllocationInfo]:
        out = {}
        for uid in sorted(self._allocs):
            info = self.allocation(uid)
            assert info is not None
            if not (committed_only and info.assumed):
                out[uid] = info
        return out

    def node_workers(self) -> dict[str, dict[str, str]]:
        """node -> {pod uid: "namespace/name"} of the pods holding GPUs there (assumed included)."""
        return {n: dict(sorted(node.workers.items())) for n, node in sorted(self._nodes.items()) if node.workers}

    def nodes(self) -> list[str]:
        return sorted(n for n, node in self._nodes.items() if node.gpus)

    def available(self, name: str, *, committed_only: bool = False) -> tuple[int, int]:
        """(milli-TFLOPS, bytes) free on a GPU; committed_only ignores assumed reservations."""
        slot = self._gpus[name]
        if not committed_only:
            return slot.avail_t, slot.avail_v
        if slot.shared_by is not None and slot.shared_by not in self._assumed:
            return 0, 0
        used_t = used_v = 0
        if slot.shared_by is None:
            for uid, (t, v) in slot.allocs.items():
                if uid not in self._assumed:
                    used_t += t
                    used_v += v
        info = slot.info
        return max(0, info.capacity_tflops - used_t), max(0, info.capacity_vram - used_v)

    def gpu_allocations(self, name: str, *, committed_only: bool = True) -> list[AllocationInfo]:
        """The allocations holding GPU `name`, by pod UID (committed only unless asked otherwise)."""
        out = []
        for uid in sorted(self._gpus[name].allocs):
            info = self.allocation(uid)
            if info is not None and not (committed_only and info.assumed):
                out.append(info)
        return out

    def quota_usage(self, namespace: str, *, include_assumed: bool = False) -> Usage:
        if include_assumed:
            return self._effective_usage(namespace)
        used = self._used.get(namespace) or Usage()
        return Usage(*used.as_tuple())

    def quota_spec(self, namespace: str) -> QuotaSpec | None:
        """The namespace's GPUResourceQuota spec, None when it has none."""
        return self._quota.get(namespace)

    def virtual_capacity(self, *, node: str | None = None, pool: str | None = None,
                         host_memory: Mapping[str, int] | int = 0, host_disk: Mapping[str, int] | int = 0,
                         ) -> dict[str, Any]:
        """Physical and virtual (oversubscribed) capacity of a node or a pool, for their status.

        virtualTFlops = total x tflopsOversellRatio / 100; virtualVRAM = total VRAM + host RAM x
        vramExpandToHostMem% + host disk x vramExpandToHostDisk%; virtual available = virtual minus
        the limits of committed allocations. `host_memory`/`host_disk` are bytes, one number for a
        node or a node -> bytes map for a pool (GPUNode status.nodeInfo ramSize / dataDiskSize).
        """
        if (node is None) == (pool is None):
            raise ValueError("give exactly one of node or pool")
        if node is not None:
            n = self._nodes.get(node)
            slots = list(n.gpus.values()) if n else []
            cfg_pool = slots[0].pool if slots else ""
            node_names = [node]
        else:
            assert pool is not None
            slots = list(self._pools.get(pool, {}).values())
            cfg_pool = pool
            node_names = sorted({s.node for s in slots})
        cfg = self.pool_config(cfg_pool)

        def per_node(value: Mapping[str, int] | int, name: str) -> int:
            return value if isinstance(value, int) else value.get(name, 0)

        total_t = sum(s.info.capacity_tflops for s in slots)
        total_v = sum(s.info.capacity_vram for s in slots)
        avail = [self.available(s.name, committed_only=True) for s in slots]
        ram = sum(per_node(host_memory, n) for n in node_names)
        disk = sum(per_node(host_disk, n) for n in node_names)
        virtual_t = total_t * cfg.tflops_oversell_ratio // 100
        virtual_v = total_v + ram * cfg.vram_expand_to_host_mem // 100 + disk * cfg.vram_expand_to_host_disk // 100
        limit_t = limit_v = 0
        names = {s.name for s in slots}
        for alloc in self._allocs.values():
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

    def snapshot(self) -> dict[str, Any]:
        """The whole state as plain, sorted data (tests compare snapshots; debugging)."""
        return {
            "gpus": {name: {"node": s.node, "pool": s.pool, "capacity": (s.info.capacity_tflops,
                                                                         s.info.capacity_vram),
                            "available": (s.avail_t, s.avail_v), "used": (s.used_t, s.used_v),
                            "shared_by": s.shared_by, "allocs": dict(sorted(s.allocs.items()))}
                     for name, s in sorted(self._gpus.items())},
            "allocations": {uid: {"node": a.node, "gpus": a.gpus, "charges": a.charges, "limits": a.limits,
                                  "assumed": a.assumed_at is not None, "request": a.req}
                            for uid, a in sorted(self._allocs.items())},
            "workers": self.node_workers(),
            "pod_indexes": self.index_lock.snapshot(),
            "quota_used": {ns: u.as_tuple() for ns, u in sorted(self._used.items()) if any(u.as_tuple())},
            "quota_assumed": {ns: u.as_tuple() for ns, u in sorted(self._assumed_used.items())
                              if any(u.as_tuple())},
            "detached": {n: dict(sorted(c.items())) for n, c in sorted(self._detached.items())},
            "node_scores": {n: (node.score_used, node.score_free) for n, node in sorted(self._nodes.items())
                            if node.gpus},
        }

