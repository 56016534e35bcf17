"""GpuAllocator: the GPU state and allocation ledger, as a pure synchronous state machine.

Callers feed it events (GPU added, changed or removed; quota and pool settings) and ask it to
decide (`select`, `filter`, `score`) and to record (`assume`, `commit`, `forget`, `rollback`,
`release`, `adjust`, `restore`). It never awaits and never does I/O, so each call is atomic for an
asyncio program; every mutation validates first and then applies, so a failure leaves the state
exactly as it was.

This module is the facade and the decisions; the state lives in three parts with one job each:
- indexes.py: where every GPU is (by name, node, pool and (pool, model) group), the score-ordered
  group indexes placement walks best-first, and the feasible-node set kept per request shape;
- ledger.py: the allocations, the charges they put on GPUs, quota usage per namespace and the
  status work lists (what `status.available`, `runningApps` and quota status must show);
- queries.py: read-only answers (the full filter chain with its trail, diagnoses, virtual
  capacity, snapshots).
explain.py and framework.py read the state through this class's public methods only.

Speed: placement never scans every GPU (indexes.py); a change touches one node, re-scored in
O(GPUs on the node). Explanations are built only on request (`filter(explain=True)`) or when a
placement fails.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Container, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tfusion.allocator import filters, isolation, partitions, queries
from tfusion.allocator.errors import AllocatorError, InvalidAllocation, Unschedulable
from tfusion.allocator.index import PoolIndex
from tfusion.allocator.indexes import (
    MAX_EXPLAINED_SHAPES,
    MAX_SHAPES,
    GpuIndexes,
    GroupKey,
    NodeEntry,
    PoolConfig,
    ShapeKey,
    shape_of,
)
from tfusion.allocator.indexlock import NodeIndexLock
from tfusion.allocator.ledger import RELEASED_MEMORY, Allocation, AllocationInfo, Ledger, charges_on
from tfusion.allocator.preemption import PreemptionSearch
from tfusion.allocator.queries import FilterResult
from tfusion.allocator.quota import QuotaSpec, Usage
from tfusion.allocator.request import AllocRequest, Resources
from tfusion.allocator.scoring import DEFAULT_MODE, Weights
from tfusion.allocator.state import GpuInfo, GpuSlot
from tfusion.allocator.topology import Policy, TopologyArgs, best_set, in_play, outcome, policy_for
from tfusion.allocator.units import tflops_str, vram_str
from tfusion.api import annotations as tfa

if TYPE_CHECKING:
    from tfusion.allocator.explain import NodeFacts

DEFAULT_MAX_WORKERS_PER_NODE = 256
DEFAULT_ASSUME_TTL = 30 * 60.0
#: the filter stage of the node-level pod index lock (indexlock.py)
NODE_INDEX_LOCK = "NodeIndexLock"

__all__ = [
    "DEFAULT_ASSUME_TTL", "DEFAULT_MAX_WORKERS_PER_NODE", "MAX_EXPLAINED_SHAPES", "MAX_SHAPES", "NODE_INDEX_LOCK",
    "RELEASED_MEMORY", "AllocationInfo", "FilterResult", "GpuAllocator", "GpuPlacement", "GroupKey", "NodeEntry",
    "PoolConfig", "ShapeKey", "shape_of",
]


@dataclass(frozen=True, slots=True)
class GpuPlacement:
    """Where a pod's GPUs go: the node, the GPU names (best first) and the node's score there."""

    node: str
    gpu_names: tuple[str, ...]
    score: int


class GpuAllocator:
    """The allocator. Construct once per leader term; feed GPUs, quotas and pool configs, then place.

    `clock` gives the time used for the assume TTL (injectable for tests); `weights` are
    GPUResourcesFit's vramWeight/tflopsWeight; `max_workers_per_node` caps pods per node; `topology`
    is GPUNetworkTopologyAware's arguments (topology.py); `isolation_policy` is static or dynamic
    (isolation.py).
    `indexes` and `ledger` are the state's parts (see the module docstring): the package's own
    modules and its tests may read them; everyone else uses the methods.
    """

    def __init__(
        self,
        *,
        max_workers_per_node: int = DEFAULT_MAX_WORKERS_PER_NODE,
        weights: Weights | None = None,
        assume_ttl: float = DEFAULT_ASSUME_TTL,
        topology: TopologyArgs | None = None,
        clock: Callable[[], float] = time.monotonic,
        isolation_policy: str = isolation.STATIC,
    ) -> None:
        if max_workers_per_node < 1:
            raise ValueError(f"max_workers_per_node must be at least 1, got {max_workers_per_node}")
        #: TF_ISOLATION_MODE_POLICY: static (modes as reported) or dynamic (isolation.py)
        self.isolation_policy = isolation.parse_policy(isolation_policy)
        self.max_workers_per_node = max_workers_per_node
        self.weights = weights or Weights()
        self.assume_ttl = assume_ttl
        self._clock = clock
        self._preemption: PreemptionSearch | None = None
        #: which pod holds which device-plugin index on which node, for as long as its allocation lives
        self.index_lock = NodeIndexLock()
        self.indexes = GpuIndexes(max_workers_per_node, self.weights, topology)
        self.ledger = Ledger(self.indexes, self.index_lock)
        #: explain.py's per-node, per-group facts that depend on the GPUs' reported facts only
        self.static_facts = self.indexes.static_facts
        #: partition templates per GPU model, from the ProviderConfigs (partitions.py)
        self.partition_catalog = partitions.PartitionCatalog()
        self._min_capacities: dict[str, int] = {}  # pool -> smallest GPU TFLOPS (partition floors)
        self._part_misses: OrderedDict[ShapeKey, dict[str, int | None]] = OrderedDict()

    # ------------------------------------------------------------------ GPUs, pools, quotas

    def upsert_gpu(self, info: GpuInfo) -> None:
        """Add a GPU or apply a change of it.

        Capacity changes move available by the same delta (available is capacity - used);
        compute-percent charges on the GPU are re-derived from the new capacity. A GPU holding
        allocations cannot move to another node or pool (raises AllocatorError, nothing changes).
        Nothing the allocator owns (available, running apps) is taken from `info`.
        """
        indexes = self.indexes
        slot = indexes.gpus.get(info.name)
        self._min_capacities.pop(info.pool, None)
        if slot is None:
            self._add_gpu(info)
            return
        old = slot.info
        if (old.node, old.pool) != (info.node, info.pool):
            if slot.allocs:
                raise AllocatorError(
                    f"GPU {info.name} holds {len(slot.allocs)} allocation(s) and cannot move from "
                    f"{old.node}/{old.pool} to {info.node}/{info.pool}")
            indexes.drop(slot)
            self._add_gpu(info)
            return
        if old.model != info.model:
            indexes.regroup(slot, info)
            slot.templates = self.partition_catalog.for_model(info.model)
        slot.info = info
        indexes.note_topology(slot)
        indexes.bump_static(info.node)
        if old.capacity_tflops != info.capacity_tflops:
            self.ledger.recharge_percent(slot)
        slot.refresh()
        if (old.capacity_tflops, old.capacity_vram) != (info.capacity_tflops, info.capacity_vram):
            self.ledger.dirty.add(info.name)
        indexes.rescore(indexes.nodes[info.node])

    def remove_gpu(self, name: str) -> None:
        """Forget a GPU. Allocations on it stay (their pods still run) and re-attach if it returns."""
        slot = self.indexes.gpus.get(name)
        if slot is None:
            return
        self._min_capacities.pop(slot.pool, None)
        self.ledger.detach(slot)
        self.indexes.drop(slot)

    def _add_gpu(self, info: GpuInfo) -> None:
        slot = GpuSlot(info)
        slot.dynamic = self.isolation_policy == isolation.DYNAMIC
        slot.templates = self.partition_catalog.for_model(info.model)
        self.ledger.reattach(slot)
        self.ledger.dirty.add(info.name)
        self.indexes.add(slot)

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
        self.indexes.set_pool_config(pool, cfg)

    def pool_config(self, pool: str) -> PoolConfig:
        return self.indexes.pool_config(pool)

    def set_partition_catalog(self, catalog: partitions.PartitionCatalog) -> None:
        """Set the partition templates per GPU model (from the ProviderConfigs). Live partitions keep
        their charges; every node is judged again for the next placement."""
        if catalog == self.partition_catalog:
            return
        self.partition_catalog = catalog
        for slot in self.indexes.gpus.values():
            slot.templates = catalog.for_model(slot.info.model)
            slot.part_memo = None
        for node in self.indexes.nodes:
            self.indexes.mark_stale(node)
        self.indexes.explained.clear()

    def partition_templates(self, model: str) -> partitions.ModelPartitions | None:
        """The partition templates of GPU model `model`; None when no ProviderConfig lists any."""
        return self.partition_catalog.for_model(model)

    def set_quota(self, namespace: str, spec: QuotaSpec) -> None:
        self.ledger.set_quota(namespace, spec)

    def remove_quota(self, namespace: str) -> None:
        self.ledger.remove_quota(namespace)

    # ------------------------------------------------------------------ reading the indexes

    def static_version(self, node: str) -> int:
        """A counter that changes whenever the node's GPUs or their reported facts (not their load) change."""
        return self.indexes.static_gen.get(node, 0)

    def node_version(self, node: str) -> int:
        """A counter that changes whenever anything about `node` that placement reads changes."""
        return self.indexes.versions.get(node, 0)

    def node_versions(self) -> Mapping[str, int]:
        """node -> `node_version`, the allocator's own map (for a loop over many nodes; read only)."""
        return self.indexes.versions

    def node_entry(self, node: str) -> NodeEntry | None:
        """The node's GPUs (grouped by pool and model), workers and scores; None for an unknown node.
        The allocator's own record: read it, do not keep it across a change, never modify it."""
        return self.indexes.nodes.get(node)

    def node_entries(self) -> Mapping[str, NodeEntry]:
        """Every node's `node_entry` (read only)."""
        return self.indexes.nodes

    def node_score(self, node: str, pool: str) -> int:
        """The node's score under `pool`'s placement mode (0..100)."""
        return self.indexes.node_score(node, pool)

    def has_pool(self, pool: str) -> bool:
        """Whether any GPU of `pool` is known."""
        return pool in self.indexes.pools

    def pool_names(self) -> list[str]:
        """The pools holding GPUs, sorted."""
        return sorted(self.indexes.pools)

    def pool_models(self, pool: str) -> list[str]:
        """The GPU models reported in `pool`, sorted."""
        return sorted({key[1] for node in self.indexes.nodes.values() for key in node.groups
                       if key[0] == pool and key[1]})

    def largest_gpu(self, pool: str) -> Resources | None:
        """The most TFLOPS and the most VRAM (milli-TFLOPS, bytes) a GPU of `pool` has; None when it has none."""
        slots = self.indexes.pools.get(pool, {}).values()
        if not slots:
            return None
        return Resources(tflops=max(s.info.capacity_tflops for s in slots),
                         vram=max(s.info.capacity_vram for s in slots))

    def group_index(self, pool: str, model: str = "") -> PoolIndex:
        """The score-ordered index of the nodes holding GPUs of `pool` (and `model`); read only."""
        return self.indexes.group_index((pool, model))

    def explain_cache(self, req: AllocRequest) -> dict[str, NodeFacts]:
        """Per-node memo for explanations of `req`'s shape: node -> value (explain.py's NodeFacts,
        which carry the node_version they were judged at); valid while the node's version matches.
        Kept for the last MAX_EXPLAINED_SHAPES shapes."""
        return self.indexes.explain_cache(req)

    def feasible_nodes(self, req: AllocRequest) -> AbstractSet[str]:
        """Nodes where `req` fits now (enough GPUs pass every per-GPU stage, worker limit not reached).

        Quota is not checked (that is PreFilter). Kept per request shape (pool, model, amounts,
        count, isolation, indices, vendor) for the last MAX_SHAPES shapes: every change of a node marks
        it stale in each kept set and only stale nodes are judged again, so a call costs O(changed
        nodes x their GPUs); a shape not kept is judged on every node of its group once. The set is
        the allocator's own: read it, do not keep it across a change, never modify it.
        """
        return self.indexes.feasible_nodes(req)

    def fitting_gpus(self, node: str, req: AllocRequest) -> tuple[str, ...] | None:
        """The GPUs of `node` that `req` would get, best first (`req.count` of them); None when it does not fit."""
        return self.indexes.fitting_gpus(node, req)

    @property
    def preemption(self) -> PreemptionSearch:
        """The one preemption search over this allocator (preemption.py): the scheduler's PostFilter
        and the preempt-lower-qos suggestion share its per-node bounds, kept between calls."""
        if self._preemption is None:
            self._preemption = PreemptionSearch(self)
        return self._preemption

    def topology_policy(self, req: AllocRequest) -> Policy:
        """GPUNetworkTopologyAware's arguments with `req`'s annotations over them (topology.py)."""
        return policy_for(self.indexes.topology, req)

    def topology_reported(self) -> bool:
        """Whether any GPU reports a topology (peers or a NUMA node)."""
        return bool(self.indexes.topology_gpus)

    def best_tier(self, node: str, req: AllocRequest) -> int | None:
        """The tier of the GPU set `req` would get on `node` now; None where `req` does not fit there
        or the topology is not in play (one GPU, nothing reported). Memoized per shape and node version."""
        return self.indexes.best_tier(node, req)

    def topology_outcome(self, req: AllocRequest, gpu_names: Sequence[str] = (), *, refused: bool = False) -> str:
        """How a multi-GPU pod fared (topology.OUTCOMES): "unsatisfied" when `refused` for its
        topology, else by the tier of `gpu_names`; "" when the topology was not in play."""
        if refused:
            return "unsatisfied"
        policy = self.topology_policy(req)
        slots = [self.indexes.gpus[n] for n in gpu_names if n in self.indexes.gpus]
        if len(slots) < 2 or not in_play(slots, req, policy):
            return ""
        return outcome(best_set(slots, len(slots), policy).tier, policy)

    def holds_below(self, priority: int) -> bool:
        """Whether any live allocation (assumed or committed) has a priority below `priority`."""
        return any(p < priority for p in self.ledger.priority_live)

    def index_conflict(self, req: AllocRequest, node: str) -> str:
        """Why `req` cannot hold its pod index on `node` (another pod holds it there), or ""."""
        return self.ledger.index_conflict(req, node)

    # ------------------------------------------------------------------ deciding

    def check_quota(self, req: AllocRequest) -> None:
        """Raise QuotaExceeded when the namespace quota (assumed reservations included) cannot admit
        `req` whatever GPUs it gets (compute-percent requests are checked exactly at `assume`)."""
        self.ledger.quota_precheck(req)

    def select(
        self,
        req: AllocRequest,
        *,
        nodes: Collection[str] | None = None,
        node_ok: Callable[[str], bool] | None = None,
        diagnose: bool = True,
    ) -> GpuPlacement:
        """Pick the best node and GPUs for `req` without changing anything.

        `nodes` restricts the choice (the extender's candidate list); `node_ok` rejects nodes for
        reasons outside the allocator (the built-in scheduler's taints, CPU, memory ...).
        Raises QuotaExceeded or Unschedulable (with the filter trail and per-node reasons; with
        `diagnose=False` a bare Unschedulable, for callers that explain with the Framework).
        """
        self.ledger.quota_precheck(req)
        indexes = self.indexes
        if req.pool not in indexes.pools:
            raise Unschedulable(f"pool {req.pool!r} has no GPUs", stage="")
        key = (req.pool, req.gpu_model)  # a model filter walks only the nodes holding that model
        index = indexes.group_index(key)
        busy = self.index_lock.busy_nodes(req.pod_index, req.pod_uid)
        if nodes is None:
            found = self._search(index, key, req, busy, node_ok)
        else:
            found = None
            for name in sorted((n for n in set(nodes) if n in index and n not in busy),
                               key=lambda n: (-index.score(n), n)):
                slots = indexes.node_fit(indexes.nodes[name], key, req)
                if slots is not None and (node_ok is None or node_ok(name)):
                    found = (indexes.nodes[name], slots)
                    break
        if found is None:
            if not diagnose:
                raise Unschedulable(f"0/{len(index)} nodes of pool {req.pool} can take the request")
            raise queries.diagnose(indexes, self.ledger, req, nodes)
        node, slots = found
        chosen = indexes.choose(slots, req)
        return GpuPlacement(node.name, tuple(s.name for s in chosen), index.score(node.name))

    def _search(self, index: PoolIndex, key: GroupKey, req: AllocRequest, busy: Collection[str],
                node_ok: Callable[[str], bool] | None) -> tuple[NodeEntry, list[GpuSlot]] | None:
        """The best node of the group index where `req` fits, walked best-first."""
        all_nodes = self.indexes.nodes
        node_fit = self._remembering_misses(req) if req.isolation == tfa.ISOLATION_PARTITIONED \
            else self.indexes.node_fit

        def fits(name: str) -> tuple[NodeEntry, list[GpuSlot]] | None:
            node = all_nodes[name]
            slots = node_fit(node, key, req)
            if slots is None or name in busy or (node_ok is not None and not node_ok(name)):
                return None
            return node, slots

        # percent requests: TFLOPS needed depends on the GPU, so only VRAM prunes
        need_v, need_t = req.vram_request, req.tflops_request
        if req.isolation == tfa.ISOLATION_PARTITIONED:  # no partition takes less than its template
            need_v, need_t = self.partition_catalog.floors(req, self._min_capacity(req.pool))
        return index.search(need_v, need_t, fits,  # type: ignore[return-value]
                            need_gpus=req.count)

    def _remembering_misses(self, req: AllocRequest) -> Callable[[NodeEntry, GroupKey, AllocRequest],
                                                                 list[GpuSlot] | None]:
        """`node_fit` that remembers, per node version, the nodes where no GPU can take a partition of
        `req`'s shape: a partition's slots and counts are not in the group index's per-node maxima,
        so without this a full node is judged GPU by GPU on every placement (the last MAX_SHAPES
        shapes are kept)."""
        shape = shape_of(req)
        misses = self._part_misses.get(shape)
        if misses is None:
            misses = self._part_misses[shape] = {}
            if len(self._part_misses) > MAX_SHAPES:
                self._part_misses.popitem(last=False)
        else:
            self._part_misses.move_to_end(shape)
        versions, node_fit = self.indexes.versions, self.indexes.node_fit

        def remembered(node: NodeEntry, key: GroupKey, req: AllocRequest) -> list[GpuSlot] | None:
            version = versions.get(node.name)
            if misses.get(node.name, -1) == version:
                return None
            slots = node_fit(node, key, req)
            if slots is None:
                misses[node.name] = version
            return slots
        return remembered

    def _min_capacity(self, pool: str) -> int:
        """The smallest TFLOPS capacity of a GPU of `pool` (kept until a GPU of the pool changes)."""
        found = self._min_capacities.get(pool)
        if found is None:
            found = self._min_capacities[pool] = min(
                (s.info.capacity_tflops for s in self.indexes.pools.get(pool, {}).values()), default=0)
        return found

    def filter(self, req: AllocRequest, *, nodes: Collection[str] | None = None,
               explain: bool = False) -> FilterResult:
        """Run the whole filter chain over every GPU of the pool (or of `nodes`).

        This is the slow, complete form used for explanations and for the extender's filter;
        with `explain` each stage records what it removed and why.
        """
        return queries.run_filter(self.indexes, self.ledger, req, nodes, explain)

    def score(self, req: AllocRequest, nodes: Iterable[str]) -> dict[str, int]:
        """Node scores (0..100) under `req`'s pool mode, for the nodes given (the extender's prioritize)."""
        index = self.indexes.group_index((req.pool, "")) if req.pool in self.indexes.pools else None
        return {n: index.score(n) if index is not None and n in index else 0 for n in nodes}

    # ------------------------------------------------------------------ recording

    def allocate(self, req: AllocRequest) -> GpuPlacement:
        """select + assume + commit in one step (the built-in scheduler and single-node mode)."""
        placement = self.select(req)
        self.assume(req, placement.gpu_names)
        self.commit(req.pod_uid)
        return placement

    def assume(self, req: AllocRequest, gpu_names: Sequence[str], *, now: float | None = None) -> GpuPlacement:
        """Reserve `gpu_names` for `req` (the scheduler's Reserve). Expires after the assume TTL.

        Checks: the pod holds nothing and was not released, the GPUs exist, are distinct, number
        `req.count`, sit on one node of the pool, the node is under its worker limit, each GPU has
        room (shared: is idle) and the namespace quota allows it. On failure nothing changes.
        """
        slots = self._assumable(req, tuple(gpu_names))
        node = self.indexes.nodes[slots[0].node]
        if len(node.workers) >= self.max_workers_per_node:
            raise Unschedulable(f"node {node.name} has {len(node.workers)} workers, limit "
                                f"{self.max_workers_per_node}", stage=filters.MAX_WORKERS,
                                nodes={node.name: ["max workers reached"]})
        busy = self.index_conflict(req, node.name) if req.pod_index else ""
        if busy:
            raise Unschedulable(busy, stage=NODE_INDEX_LOCK, nodes={node.name: [busy]})
        charges, limits = charges_on(req, [s.info.capacity_tflops for s in slots])
        parts: tuple[partitions.Partition | None, ...] = ()
        if req.isolation == tfa.ISOLATION_PARTITIONED:
            planned = partitions.plan(slots, req)
            if isinstance(planned, partitions.Refusal):
                raise Unschedulable(f"cannot assume: {planned}", stage="PartitionTemplateFilter",
                                    nodes={node.name: [str(planned)]})
            parts, charges = planned
            limits = charges
        for slot, (need_t, need_v) in zip(slots, charges, strict=True):
            if slot.dynamic and not isolation.fits(slot, req):
                why = isolation.refusal(slot, req) or ""
                raise Unschedulable(f"cannot assume: {why}", stage="IsolationPolicy", nodes={node.name: [why]})
            reason = filters.shared_whole(slot, req) if req.isolation == tfa.ISOLATION_SHARED else None
            if reason is None and (slot.shared_by is not None or slot.avail_t < need_t or slot.avail_v < need_v):
                reason = filters.resource(slot, req)
            if reason is not None:
                raise Unschedulable(f"cannot assume: {reason}", stage="ResourceFilter",
                                    nodes={node.name: [reason]})
        self.ledger.quota_exact(req, charges, limits)
        names = tuple(s.name for s in slots)
        self.ledger.apply(Allocation(req, node.name, names, charges, limits, self._clock() if now is None else now,
                                     parts))
        return GpuPlacement(node.name, names, self.node_score(node.name, req.pool))

    def _assumable(self, req: AllocRequest, names: tuple[str, ...]) -> list[GpuSlot]:
        """The slots of `names` after the request checks of `assume` that need no arithmetic."""
        uid = req.pod_uid
        if not uid:
            raise InvalidAllocation("the request has no pod UID")
        if uid in self.ledger.allocs:
            raise InvalidAllocation(f"pod {req.namespace}/{req.pod_name} ({uid}) already holds an allocation")
        if uid in self.ledger.released:
            raise InvalidAllocation(f"pod {req.namespace}/{req.pod_name} ({uid}) was released")
        if len(names) != req.count or len(set(names)) != len(names):
            raise InvalidAllocation(f"{req.count} distinct GPU(s) required, got {list(names)}")
        slots = []
        for name in names:
            slot = self.indexes.gpus.get(name)
            if slot is None:
                raise InvalidAllocation(f"GPU {name} is unknown")
            if slot.pool != req.pool:
                raise InvalidAllocation(f"GPU {name} is in pool {slot.pool}, not {req.pool}")
            slots.append(slot)
        if any(s.node != slots[0].node for s in slots):
            raise InvalidAllocation(f"GPUs {list(names)} are on several nodes; all must be on one node")
        return slots

    def commit(self, pod_uid: str) -> None:
        """Make an assumed allocation permanent (the scheduler's PreBind). Idempotent."""
        alloc = self.ledger.allocs.get(pod_uid)
        if alloc is None:
            raise InvalidAllocation(f"pod {pod_uid} has no assumed allocation to commit")
        if alloc.assumed_at is not None:
            self.ledger.commit(alloc)

    def forget(self, pod_uid: str) -> bool:
        """Drop an assumed (not committed) allocation; False when there is none."""
        alloc = self.ledger.allocs.get(pod_uid)
        if alloc is None or alloc.assumed_at is None:
            return False
        self.ledger.unapply(alloc)
        return True

    def rollback(self, pod_uid: str) -> bool:
        """Undo an assumed or committed allocation after a failed bind; the pod may be placed again."""
        alloc = self.ledger.allocs.get(pod_uid)
        if alloc is None:
            return False
        self.ledger.unapply(alloc)
        return True

    def release(self, pod_uid: str) -> bool:
        """Free a pod's allocation for good (pod deleted or finished). Idempotent."""
        alloc = self.ledger.allocs.get(pod_uid)
        self.ledger.remember_released(pod_uid)
        if alloc is None:
            return False
        self.ledger.unapply(alloc)
        return True

    def was_released(self, pod_uid: str) -> bool:
        """Whether `release` freed this pod's allocation (recently): it must not be adopted again."""
        return pod_uid in self.ledger.released

    def expire_assumed(self, now: float | None = None, keep: Container[str] = ()) -> list[str]:
        """Forget assumed allocations older than the TTL, except those of `keep` (gang members
        waiting at Permit); returns their pod UIDs."""
        now = self._clock() if now is None else now
        ledger = self.ledger
        expired = [uid for uid, at in ledger.assumed.items() if now - at >= self.assume_ttl and uid not in keep]
        for uid in expired:
            ledger.unapply(ledger.allocs[uid])
        return expired

    def adjust(self, pod_uid: str, new_request: Resources, new_limit: Resources,
               dry_run: bool = False) -> AllocRequest:
        """Resize a live allocation in place (vertical scaling); returns the new request.

        Every GPU must have room for the increase and the quota must allow it; with `dry_run`
        only the checks run. On failure nothing changes.
        """
        alloc = self.ledger.allocs.get(pod_uid)
        if alloc is None:
            raise InvalidAllocation(f"pod {pod_uid} has no allocation to adjust")
        if alloc.parts:
            raise InvalidAllocation(f"pod {pod_uid} holds hardware partitions, whose size is their template's; "
                                    "it cannot be resized in place")
        req = alloc.req.with_resources(new_request, new_limit)
        slots = [self.indexes.gpus.get(n) for n in alloc.gpus]
        charges, limits = charges_on(req, [s.info.capacity_tflops if s is not None else 0 for s in slots])
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
        self.ledger.quota_exact(req, charges, limits, replacing=alloc)
        if not dry_run:
            self.ledger.resize(alloc, req, charges, limits)
        return req

    def restore(self, allocations: Iterable[tuple[AllocRequest, Sequence[str]]],
                reported: Mapping[tuple[str, str], partitions.Partition] | None = None) -> list[tuple[str, str]]:
        """Rebuild committed allocations (leader recovery from worker pods' gpu-ids annotations).

        No capacity, quota or worker checks: these pods already run. A GPU that is not known (yet)
        is charged when it appears, like a GPU removed and re-added (a compute-percent charge on it
        is 0 until its capacity is known). Returns (pod uid, reason) for each entry that could not
        be restored: duplicate pod, empty or repeated GPU list, no known GPU, GPUs on several nodes.
        A partitioned pod gets back its partition: `reported` (pod uid, GPU) -> the partition the GPU's
        status.allocatedPartitions records, else its partition-id placed anew (partitions.recovered).
        """
        skipped: list[tuple[str, str]] = []
        gpus = self.indexes.gpus
        # a node's score is a function of its GPUs' load alone: scored once after all its pods,
        # not once per pod (a recovery of 100,000 pods on 5,000 nodes)
        touched: dict[str, None] = {}
        for req, gpu_names in allocations:
            names = tuple(gpu_names)
            known = [gpus[n] for n in names if n in gpus]
            reason = self.ledger.restore_problem(req, names, known)
            if reason:
                skipped.append((req.pod_uid, reason))
                continue
            charges, limits = charges_on(req, [gpus[n].info.capacity_tflops if n in gpus else 0 for n in names])
            parts: tuple[partitions.Partition | None, ...] = ()
            if req.isolation == tfa.ISOLATION_PARTITIONED:
                parts, charges, limits = self._recovered_parts(req, names, charges, limits, reported or {})
            node = known[0].node
            self.ledger.apply(Allocation(req, node, names, charges, limits, None, parts), rescore=False)
            touched[node] = None
        for node in touched:
            self.ledger.rescore(node)
        return skipped

    def _recovered_parts(self, req: AllocRequest, names: tuple[str, ...], charges: tuple[tuple[int, int], ...],
                         limits: tuple[tuple[int, int], ...], reported: Mapping[tuple[str, str], partitions.Partition],
                         ) -> tuple[tuple[partitions.Partition | None, ...], tuple[tuple[int, int], ...],
                                    tuple[tuple[int, int], ...]]:
        parts: list[partitions.Partition | None] = []
        new_charges, new_limits = list(charges), list(limits)
        for i, name in enumerate(names):
            found = partitions.recovered(self.indexes.gpus.get(name), req, reported.get((req.pod_uid, name)))
            parts.append(None if found is None else found[0])
            if found is not None:
                new_charges[i] = new_limits[i] = found[1]
        return tuple(parts), tuple(new_charges), tuple(new_limits)

    # ------------------------------------------------------------------ reading

    def dirty_gpus(self) -> set[str]:
        return set(self.ledger.dirty)

    def take_dirty(self) -> set[str]:
        """GPU names whose status changed since the last call (the status sync loop's work list)."""
        dirty, self.ledger.dirty = self.ledger.dirty, set()
        return dirty

    def mark_dirty(self, names: Iterable[str]) -> None:
        """Put GPUs back on the work list (a status write failed)."""
        self.ledger.dirty.update(n for n in names if n in self.indexes.gpus)

    def take_dirty_quotas(self) -> set[str]:
        """Namespaces whose quota status changed since the last call."""
        dirty, self.ledger.dirty_quota = self.ledger.dirty_quota, set()
        return {ns for ns in dirty if ns in self.ledger.quota}

    def mode_conflicts(self) -> dict[str, list[str]]:
        """GPU -> the isolation modes its pods hold, for each GPU flagged dynamicIsolationConflict."""
        allocs = self.ledger.allocs
        return {name: sorted({allocs[uid].req.isolation for uid in slot.allocs if uid in allocs})
                for name, slot in sorted(self.indexes.gpus.items()) if slot.mode_conflict}

    def gpu_names(self) -> list[str]:
        return sorted(self.indexes.gpus)

    def gpu_info(self, name: str) -> GpuInfo:
        return self.indexes.gpus[name].info

    def has_allocation(self, pod_uid: str) -> bool:
        return pod_uid in self.ledger.allocs

    def allocation(self, pod_uid: str) -> AllocationInfo | None:
        alloc = self.ledger.allocs.get(pod_uid)
        return None if alloc is None else alloc.info()

    def committed_uids(self) -> list[str]:
        """The pods whose allocation is committed (not only assumed), in no order: for a pass over
        all of them that looks each one up when its turn comes (`allocation`), rather than an
        AllocationInfo of every one at once (0.7 s of the event loop at 100,000 pods)."""
        return [uid for uid, alloc in self.ledger.allocs.items() if alloc.assumed_at is None]

    def allocations(self, *, committed_only: bool = False) -> dict[str, AllocationInfo]:
        allocs = self.ledger.allocs
        return {uid: allocs[uid].info() for uid in sorted(allocs)
                if not (committed_only and allocs[uid].assumed_at is not None)}

    def committed_limits(self) -> Iterator[tuple[tuple[str, ...], tuple[tuple[int, int], ...]]]:
        """(GPU names, per-GPU limits) of each committed allocation, in no order: for sums over all
        of them without an AllocationInfo each."""
        return ((alloc.gpus, alloc.limits) for alloc in self.ledger.allocs.values() if alloc.assumed_at is None)

    def committed_limits_on(self, names: Iterable[str]) -> tuple[int, int]:
        """The limits (milli-TFLOPS, bytes) that committed allocations hold on the GPUs `names`,
        summed: read from each GPU's own allocations, not from every allocation in the cluster."""
        allocs = self.ledger.allocs
        total_t = total_v = 0
        for name in names:
            slot = self.indexes.gpus.get(name)
            for uid in slot.allocs if slot is not None else ():
                alloc = allocs.get(uid)
                if alloc is None or alloc.assumed_at is not None:
                    continue
                for gpu, (t, v) in zip(alloc.gpus, alloc.limits, strict=True):
                    if gpu == name:
                        total_t += t
                        total_v += v
        return total_t, total_v

    def node_workers(self) -> dict[str, dict[str, str]]:
        """node -> {pod uid: "namespace/name"} of the pods holding GPUs there (assumed included)."""
        return queries.node_workers(self.indexes)

    def nodes(self) -> list[str]:
        return sorted(n for n, node in self.indexes.nodes.items() if node.gpus)

    def available(self, name: str, *, committed_only: bool = False) -> tuple[int, int]:
        """(milli-TFLOPS, bytes) free on a GPU; committed_only ignores assumed reservations."""
        slot = self.indexes.gpus[name]
        if not committed_only:
            return slot.avail_t, slot.avail_v
        return queries.committed_available(self.ledger, slot)

    def gpu_allocations(self, name: str, *, committed_only: bool = True) -> list[AllocationInfo]:
        """The allocations holding GPU `name`, by pod UID (committed only unless asked otherwise)."""
        out = []
        for uid in sorted(self.indexes.gpus[name].allocs):
            info = self.allocation(uid)
            if info is not None and not (committed_only and info.assumed):
                out.append(info)
        return out

    def quota_usage(self, namespace: str, *, include_assumed: bool = False) -> Usage:
        if include_assumed:
            return self.ledger.effective_usage(namespace)
        used = self.ledger.used.get(namespace) or Usage()
        return Usage(*used.as_tuple())

    def quota_spec(self, namespace: str) -> QuotaSpec | None:
        """The namespace's GPUResourceQuota spec, None when it has none."""
        return self.ledger.quota.get(namespace)

    def virtual_capacity(self, *, node: str | None = None, pool: str | None = None,
                         host_memory: Mapping[str, int] | int = 0, host_disk: Mapping[str, int] | int = 0,
                         ) -> dict[str, Any]:
        """Physical and virtual (oversubscribed) capacity of a node or a pool, for their status.

        virtualTFlops = total x tflopsOversellRatio / 100; virtualVRAM = total VRAM + host RAM x
        vramExpandToHostMem% + host disk x vramExpandToHostDisk%; virtual available = virtual minus
        the limits of committed allocations. `host_memory`/`host_disk` are bytes, one number for a
        node or a node -> bytes map for a pool (GPUNode status.nodeInfo ramSize / dataDiskSize).
        """
        return queries.virtual_capacity(self.indexes, self.ledger, node, pool, host_memory, host_disk)

    def snapshot(self) -> queries.Snapshot:
        """The whole state as plain, sorted data (tests compare snapshots; debugging)."""
        return queries.snapshot(self.indexes, self.ledger)
