"""Where every GPU is and how nodes rank: the allocator's indexes of GPUs, nodes and pools.

Why it exists: placement must never scan every GPU. This module keeps the GPU slots by name, by
node and by pool; groups each node's GPUs by (pool, model) (model "" = any); keeps for each group a
request a `PoolIndex` (nodes ordered by score, with per-node best free VRAM and TFLOPS, built on
first use); and keeps, per request shape, the set of nodes where that shape fits (`feasible_nodes`).
A change touches one node, which is re-scored and moved in O(GPUs on the node) and marked stale in
each kept shape set (and gets a new `node_version`, which validates cached per-node explanations).

It records no allocation: the ledger (ledger.py) charges the slots and then asks this module to
re-score the node it touched. Pure like the rest of the package: no I/O, no await.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tfusion.allocator import filters, topology
from tfusion.allocator.index import PoolIndex
from tfusion.allocator.request import AllocRequest
from tfusion.allocator.scoring import DEFAULT_MODE, FREE, USED, Weights, gpu_score, mode_variants
from tfusion.allocator.state import PHASE_PENDING, GpuInfo, GpuSlot

if TYPE_CHECKING:
    from tfusion.allocator.explain import NodeFacts

GroupKey = tuple[str, str]  # (pool, model); model "" = every model of the pool
#: everything in a request that decides whether one node can take it (see `feasible_nodes`)
ShapeKey = tuple[str, str, int, int, int, int, str, tuple[int, ...], str, bool | None, int | None, str, str]
MAX_SHAPES = 32  # request shapes whose feasible-node sets are kept
MAX_EXPLAINED_SHAPES = 8  # request shapes whose per-node explanations are kept (a few hundred bytes per node)


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


def shape_of(req: AllocRequest) -> ShapeKey:
    return (req.pool, req.gpu_model, req.tflops_request, req.percent_request, req.vram_request, req.count,
            req.isolation, req.indices, req.vendor, req.topology_required, req.topology_max_tier,
            req.topology_source, req.partition_template)


def group_keys(info: GpuInfo) -> tuple[GroupKey, ...]:
    return ((info.pool, ""), (info.pool, info.model)) if info.model else ((info.pool, ""),)


class FeasibleSet:
    """The nodes that can take one request shape now; `stale` nodes changed since they were judged."""

    __slots__ = ("nodes", "stale")

    def __init__(self) -> None:
        self.nodes: set[str] = set()
        self.stale: set[str] = set()


class NodeEntry:
    """One node as the allocator sees it: its GPUs, grouped by (pool, model), its workers and scores.

    Readers (explain.py) treat it as read-only; only this module and the ledger change it.
    """

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


class GpuIndexes:
    """The GPU slots by name, node and pool, the score-ordered group indexes and the shape caches."""

    def __init__(self, max_workers_per_node: int, weights: Weights,
                 topology_args: topology.TopologyArgs | None = None) -> None:
        self.max_workers_per_node = max_workers_per_node
        self.weights = weights
        #: GPUNetworkTopologyAware's arguments as a policy; a pod's annotations may override it
        self.topology = (topology_args or topology.TopologyArgs()).policy()
        #: GPUs reporting a topology (peers or NUMA node): while none does, soft mode costs nothing
        self.topology_gpus: set[str] = set()
        #: (shape, node) -> (node version, tier of the best set) for soft mode's node preference
        self.tiers: OrderedDict[ShapeKey, dict[str, tuple[int, int | None]]] = OrderedDict()
        self.gpus: dict[str, GpuSlot] = {}
        self.nodes: dict[str, NodeEntry] = {}
        self.pools: dict[str, dict[str, GpuSlot]] = {}
        self.pool_cfg: dict[str, PoolConfig] = {}
        self.groups: dict[GroupKey, PoolIndex] = {}  # built on first use, then kept up to date
        # feasible nodes per request shape (the extender's candidate filter), least recently used first
        self.shapes: OrderedDict[ShapeKey, FeasibleSet] = OrderedDict()
        self.versions: dict[str, int] = {}  # node -> change counter (explanations cached per version)
        self.static_gen: dict[str, int] = {}  # node -> change counter of its GPUs' reported facts
        #: explain.py's per-node, per-group facts that depend on the GPUs' reported facts only:
        #: (node, group) -> (static version, (vendor, TFLOPS capacity) of a plain group or None)
        self.static_facts: dict[tuple[str, GroupKey], tuple[int, tuple[str, int] | None]] = {}
        self.explained: OrderedDict[ShapeKey, dict[str, NodeFacts]] = OrderedDict()

    # ------------------------------------------------------------------ membership

    def node(self, name: str) -> NodeEntry:
        """The node's entry, made on first use (a pod may hold GPUs on a node whose GPUs are gone)."""
        node = self.nodes.get(name)
        if node is None:
            node = self.nodes[name] = NodeEntry(name)
        return node

    def drop_node_if_empty(self, node: NodeEntry) -> None:
        if not node.gpus and not node.workers:
            del self.nodes[node.name]

    def add(self, slot: GpuSlot) -> None:
        """Register a new slot under its name, pool and node, and rank its node again."""
        self.gpus[slot.name] = slot
        self.pools.setdefault(slot.pool, {})[slot.name] = slot
        self.note_topology(slot)
        node = self.node(slot.node)
        node.gpus[slot.name] = slot
        self.group(node, slot)
        self.rescore(node)

    def drop(self, slot: GpuSlot) -> None:
        """Forget a slot; a node left without GPUs and workers goes too."""
        node = self.nodes[slot.node]
        del node.gpus[slot.name]
        self.ungroup(node, slot, slot.info)
        pool = self.pools[slot.pool]
        del pool[slot.name]
        if not pool:
            del self.pools[slot.pool]
            self.drop_indexes(slot.pool)
        del self.gpus[slot.name]
        self.topology_gpus.discard(slot.name)
        if not node.gpus and not node.workers:
            del self.nodes[node.name]
        else:
            self.rescore(node)

    def regroup(self, slot: GpuSlot, info: GpuInfo) -> None:
        """Move `slot` to the groups of its new reported model."""
        node = self.nodes[slot.node]
        self.ungroup(node, slot, slot.info)
        slot.info = info
        self.group(node, slot)

    def note_topology(self, slot: GpuSlot) -> None:
        """Keep `topology_gpus` right after `slot` was added or its reported facts changed."""
        if slot.info.peer_tiers or slot.info.numa is not None:
            self.topology_gpus.add(slot.name)
        else:
            self.topology_gpus.discard(slot.name)

    def bump_static(self, node: str) -> None:
        self.static_gen[node] = self.static_gen.get(node, 0) + 1

    def group(self, node: NodeEntry, slot: GpuSlot) -> None:
        self.bump_static(node.name)
        for key in group_keys(slot.info):
            members = node.groups.setdefault(key, [])
            members.append(slot)
            members.sort(key=lambda s: s.name)

    def ungroup(self, node: NodeEntry, slot: GpuSlot, info: GpuInfo) -> None:
        self.mark_stale(node.name)
        self.bump_static(node.name)
        for key in group_keys(info):
            members = node.groups[key]
            members.remove(slot)
            if not members:
                del node.groups[key]
                index = self.groups.get(key)
                if index is not None:
                    index.remove(node.name)

    def drop_indexes(self, pool: str) -> None:
        for key in [k for k in self.groups if k[0] == pool]:
            del self.groups[key]

    def pool_config(self, pool: str) -> PoolConfig:
        return self.pool_cfg.get(pool) or PoolConfig()

    def set_pool_config(self, pool: str, cfg: PoolConfig) -> None:
        old = self.pool_cfg.get(pool)
        self.pool_cfg[pool] = cfg
        if old is None or mode_variants(old.placement_mode)[0] != mode_variants(cfg.placement_mode)[0]:
            self.drop_indexes(pool)  # rebuilt, ordered by the new node score, on next use

    # ------------------------------------------------------------------ scores and group indexes

    def _node_part(self, slot: GpuSlot, variant: str) -> int:
        info = slot.info
        score = gpu_score(slot.avail_t, info.capacity_tflops, slot.avail_v, info.capacity_vram, variant,
                          self.weights)
        return score // 4 if info.phase == PHASE_PENDING else score

    def rescore(self, node: NodeEntry) -> None:
        """Re-score `node` and move it in every group index (after a change of its GPUs or load)."""
        self.update_node_scores(node)
        self.reindex(node)

    def update_node_scores(self, node: NodeEntry) -> None:
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

    def group_index(self, key: GroupKey) -> PoolIndex:
        """The score-ordered index of the nodes holding GPUs of `key`, built on first use."""
        index = self.groups.get(key)
        if index is None:
            variant = mode_variants(self.pool_config(key[0]).placement_mode)[0]
            index = self.groups[key] = PoolIndex(variant)
            for node in self.nodes.values():
                if key in node.groups:
                    self._place(index, node, key)
        return index

    def reindex(self, node: NodeEntry) -> None:
        self.mark_stale(node.name)
        for key in node.groups:
            index = self.groups.get(key)
            if index is not None:
                self._place(index, node, key)

    def _place(self, index: PoolIndex, node: NodeEntry, key: GroupKey) -> None:
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
        n = self.nodes[node]
        return n.score_used if mode_variants(self.pool_config(pool).placement_mode)[0] == USED \
            else n.score_free

    def gpu_order(self, slots: Iterable[GpuSlot], pool: str) -> list[GpuSlot]:
        variant = mode_variants(self.pool_config(pool).placement_mode)[1]
        w = self.weights
        return sorted(slots, key=lambda s: (-gpu_score(s.avail_t, s.info.capacity_tflops, s.avail_v,
                                                       s.info.capacity_vram, variant, w), s.name))

    # ------------------------------------------------------------------ fitting

    def node_fit(self, node: NodeEntry, key: GroupKey, req: AllocRequest) -> list[GpuSlot] | None:
        """The GPUs of `node`'s group `key` that pass every per-GPU stage, None when too few (or the
        node is at its worker limit)."""
        if len(node.workers) >= self.max_workers_per_node:
            return None
        members = node.groups.get(key)
        if not members:
            return None
        fits = filters.gpu_fits
        found = [slot for slot in members if fits(slot, req)]
        if len(found) < req.count:
            return None
        if req.count > 1:
            policy = topology.policy_for(self.topology, req)
            if policy.gates and topology.refusal(topology.best_set(found, req.count, policy), policy):
                return None
        return found

    def choose(self, slots: list[GpuSlot], req: AllocRequest) -> list[GpuSlot]:
        """The `req.count` GPUs of `slots` (a node's fitting ones) that `req` gets, best first: by the
        pool's GPU-level load order, or for a multi-GPU request whose topology is in play the best
        set of topology.py (in that order)."""
        ordered = self.gpu_order(slots, req.pool)
        if req.count > 1 and (self.topology_gpus or self.topology.gates or req.topology_required is not None
                              or req.topology_max_tier is not None):
            policy = topology.policy_for(self.topology, req)
            if topology.in_play(ordered, req, policy):
                choice = topology.best_set(ordered, req.count, policy)
                if choice.tier is not None:
                    return [ordered[i] for i in choice.picks]
        return ordered[: req.count]

    def best_tier(self, node: str, req: AllocRequest) -> int | None:
        """The tier of the best set `req` would get on `node` now (None: the topology is not in play
        there, or no set fits), memoized per request shape until the node changes."""
        key = shape_of(req)
        memo = self.tiers.get(key)
        if memo is None:
            memo = self.tiers[key] = {}
            if len(self.tiers) > MAX_SHAPES:
                self.tiers.popitem(last=False)
        version = self.versions.get(node, 0)
        hit = memo.get(node)
        if hit is not None and hit[0] == version:
            return hit[1]
        entry = self.nodes.get(node)
        slots = None if entry is None else self.node_fit(entry, (req.pool, req.gpu_model), req)
        tier = None
        if slots is not None:
            policy = topology.policy_for(self.topology, req)
            if topology.in_play(slots, req, policy):
                tier = topology.best_set(slots, req.count, policy).tier
        memo[node] = (version, tier)
        return tier

    def mark_stale(self, node: str) -> None:
        self.versions[node] = self.versions.get(node, 0) + 1
        for cached in self.shapes.values():
            cached.stale.add(node)

    def explain_cache(self, req: AllocRequest) -> dict[str, NodeFacts]:
        key = shape_of(req)
        memo = self.explained.get(key)
        if memo is None:
            memo = self.explained[key] = {}
            if len(self.explained) > MAX_EXPLAINED_SHAPES:
                self.explained.popitem(last=False)
        else:
            self.explained.move_to_end(key)
        return memo

    def feasible_nodes(self, req: AllocRequest) -> AbstractSet[str]:
        """See GpuAllocator.feasible_nodes."""
        key = shape_of(req)
        cached = self.shapes.get(key)
        group = (req.pool, req.gpu_model)
        if cached is None:
            cached = self.shapes[key] = FeasibleSet()
            if len(self.shapes) > MAX_SHAPES:
                self.shapes.popitem(last=False)
            cached.stale = {name for name, node in self.nodes.items() if group in node.groups}
        else:
            self.shapes.move_to_end(key)
        if cached.stale:
            nodes = self.nodes
            feasible = cached.nodes
            # the group index's per-node maxima (best free VRAM and TFLOPS of a schedulable GPU, how
            # many schedulable GPUs; -1/0 at the worker limit) rule most nodes out without looking
            # at their GPUs: a new shape costs O(nodes), not O(GPUs), when few nodes can take it
            index = self.group_index(group)
            agg_v, agg_t, agg_n = index.agg_v, index.agg_t, index.agg_n
            need_v, need_t, need_n = req.vram_request, req.tflops_request, req.count  # percent: VRAM only
            for name in cached.stale:
                if agg_v.get(name, -1) < need_v or agg_t.get(name, -1) < need_t or agg_n.get(name, 0) < need_n:
                    feasible.discard(name)
                    continue
                node = nodes.get(name)
                if node is not None and self.node_fit(node, group, req) is not None:
                    feasible.add(name)
                else:
                    feasible.discard(name)
            cached.stale = set()
        return cached.nodes

    def fitting_gpus(self, node: str, req: AllocRequest) -> tuple[str, ...] | None:
        found = self.nodes.get(node)
        slots = None if found is None else self.node_fit(found, (req.pool, req.gpu_model), req)
        if slots is None:
            return None
        return tuple(s.name for s in self.choose(slots, req))
