"""Which nodes compaction gives back and which workers a defrag may move: the decisions alone, on
plain facts, so that they can be tested and explained without a cluster (the service that gathers
the facts and acts is `compaction.py`).

Compaction gives back an empty node only when the pool still meets its targets without it: its
total stays at or above `minResources` and its available capacity at or above `warmResources`
(the same rule the pool's provisioning closes the gap to, `plan.gap`, so the two never fight:
what provisioning adds to reach warm, compaction does not take away). Nodes go one at a time, so
each removal is judged on the pool as the previous ones left it.

A defrag moves every worker off a lightly used node when all of them are low QoS, unprotected and
fit together on the GPUs the pool's other busy nodes have free; the emptied node is then
compaction's. Placement is simulated on a copy of the free GPUs, so the moves of one plan never
count on the same free room twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tfusion.api import annotations as tfa
from tfusion.controller.provisioning.plan import Capacity, PoolCapacity, Targets, capacity_text, gap

#: hours in the month `potentialSavingsPerMonth` counts (365 x 24 / 12)
HOURS_PER_MONTH = 730
#: the QoS whose workers a defrag may move
MOVABLE_QOS = "low"


@dataclass(frozen=True)
class NodeFacts:
    """One node of a pool as compaction and defrag see it. `claim` is the GPUNodeClaim the node was
    provisioned for ("" for a node the pool selected); `capacity` and `available` are its GPUs'
    (milli-TFLOPS, bytes); `empty` means no GPU worker holds (or is being given) any of its GPUs."""

    name: str
    pool: str
    claim: str
    created_at: float
    running: bool
    empty: bool
    do_not_disrupt: bool
    capacity: Capacity
    available: Capacity
    price_per_hour: float


@dataclass(frozen=True)
class Removal:
    node: str
    claim: str
    reason: str


@dataclass(frozen=True)
class Kept:
    node: str
    reason: str


def compaction(nodes: Sequence[NodeFacts], pool: PoolCapacity, targets: Targets, *, now: float,
               min_age_s: float) -> tuple[list[Removal], list[Kept]]:
    """The empty nodes to give back now and, for every other node, why it stays. Candidates (empty,
    Running, at least `min_age_s` old, not do-not-disrupt) go most expensive first, then largest,
    then by name, each only when the pool as the earlier removals left it still meets `targets`."""
    removals: list[Removal] = []
    kept: dict[str, Kept] = {}
    candidates: list[NodeFacts] = []
    for node in nodes:
        why = _not_candidate(node, now, min_age_s)
        if why:
            kept[node.name] = Kept(node.name, why)
        else:
            candidates.append(node)
    candidates.sort(key=lambda n: (-n.price_per_hour, -n.capacity.tflops, -n.capacity.vram, n.name))
    for node in candidates:
        after = PoolCapacity(total=pool.total - node.capacity, available=pool.available - node.available,
                             in_flight=pool.in_flight)
        short = gap(after, targets)
        if not short.is_zero:
            kept[node.name] = Kept(node.name, f"empty, but without it {_shortfall(after, targets)}")
            continue
        pool = after
        removals.append(Removal(node.name, node.claim, f"empty and {age_text(now - node.created_at)} old; "
                                                       f"without it {_standing(after, targets)}"))
    return removals, [kept[n.name] for n in nodes if n.name in kept]


def _not_candidate(node: NodeFacts, now: float, min_age_s: float) -> str:
    if not node.empty:
        return "GPU workers run on it"
    if not node.running:
        return "its GPUNode is not Running"
    if node.do_not_disrupt:
        return f"it is marked {tfa.DO_NOT_DISRUPT}=true"
    age = now - node.created_at
    if age < min_age_s:
        return f"empty, but only {age_text(age)} old (nodes younger than {age_text(min_age_s)} are kept)"
    return ""


def _shortfall(after: PoolCapacity, targets: Targets) -> str:
    """Which target the pool would miss, with the numbers."""
    parts = []
    if targets.minimum is not None and not (after.total + after.in_flight).covers(targets.minimum):
        parts.append(f"the pool's total would be {capacity_text(after.total + after.in_flight)}, below "
                     f"minResources {capacity_text(targets.minimum)}")
    if targets.warm is not None and not (after.available + after.in_flight).covers(targets.warm):
        parts.append(f"the pool's available capacity would be {capacity_text(after.available + after.in_flight)}, "
                     f"below warmResources {capacity_text(targets.warm)}")
    return " and ".join(parts) or "the pool would fall below its targets"


def _standing(after: PoolCapacity, targets: Targets) -> str:
    """How the pool still meets its targets, with the numbers."""
    total = f"the pool keeps {capacity_text(after.total + after.in_flight)} in total"
    if targets.minimum is not None:
        total += f" (minResources {capacity_text(targets.minimum)})"
    available = f"{capacity_text(after.available + after.in_flight)} available"
    if targets.warm is not None:
        available += f" (warmResources {capacity_text(targets.warm)})"
    return f"{total} and {available}"


def potential_savings_per_month(nodes: Iterable[NodeFacts]) -> float:
    """Dollars a month the empty ones among `nodes` cost (what giving them back would save)."""
    return sum(n.price_per_hour for n in nodes if n.empty) * HOURS_PER_MONTH


def age_text(seconds: float) -> str:
    """A short human age ("45s", "6m", "2h5m"), floored to its coarsest two units."""
    whole = max(0, int(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m{secs}s" if secs and minutes < 10 else f"{minutes}m"
    return f"{secs}s"


# --- defrag --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerFacts:
    """A GPU worker on a node: `key` is "namespace/name"; per GPU it holds `tflops_per_gpu`
    (milli-TFLOPS) and `vram_per_gpu` (bytes) on `gpu_count` GPUs; `model` is the GPU model it asked
    for ("" = any); `protected` means it may not be evicted now (eviction protection, a
    PodDisruptionBudget that allows no disruption, or it is terminating already)."""

    key: str
    node: str
    qos: str
    protected: bool
    gpu_count: int
    tflops_per_gpu: int
    vram_per_gpu: int
    model: str = ""


@dataclass(frozen=True)
class GpuRoom:
    """What one GPU has free (milli-TFLOPS, bytes)."""

    node: str
    gpu: str
    tflops: int
    vram: int
    model: str


@dataclass(frozen=True)
class DefragMove:
    """Evict `workers` (keys) from `node`; the simulation placed them on `destinations` (node names)."""

    node: str
    workers: tuple[str, ...]
    destinations: tuple[str, ...] = ()


def utilization_percent(node: NodeFacts) -> float:
    """The larger of the node's TFLOPS and VRAM allocation percentages (100 for a node without GPUs)."""
    used = node.capacity - node.available
    parts = [100.0 * u / c for u, c in ((used.tflops, node.capacity.tflops), (used.vram, node.capacity.vram)) if c > 0]
    return max(parts) if parts else 100.0


def defrag_moves(nodes: Sequence[NodeFacts], gpus: Sequence[GpuRoom], workers: Sequence[WorkerFacts], *,
                 utilization_threshold_percent: int) -> list[DefragMove]:
    """Which nodes to empty now, least used first. A node qualifies when it is Running, not
    do-not-disrupt, holds workers, is used below `utilization_threshold_percent` (both TFLOPS and
    VRAM), all its workers are low QoS and unprotected, and all of them fit together on the free
    GPUs of the pool's other Running nodes that hold workers (an empty node takes none: moving work
    onto it frees nothing). A node that receives workers in this plan is not emptied in it, and an
    emptied node receives none."""
    facts = {n.name: n for n in nodes}
    on_node: dict[str, list[WorkerFacts]] = {}
    for worker in workers:
        on_node.setdefault(worker.node, []).append(worker)
    room: dict[str, list[GpuRoom]] = {}
    for gpu in gpus:
        room.setdefault(gpu.node, []).append(gpu)
    candidates = sorted((n for n in nodes if _may_empty(n, on_node.get(n.name, []), utilization_threshold_percent)),
                        key=lambda n: (utilization_percent(n), n.name))
    moves: list[DefragMove] = []
    drained: set[str] = set()
    received: set[str] = set()
    for source in candidates:
        if source.name in received:
            continue
        targets = {name: gpus_free for name, gpus_free in room.items()
                   if name != source.name and name not in drained and _may_receive(facts.get(name), source.pool)}
        placed = _place_all(on_node[source.name], targets)
        if placed is None:
            continue
        trial, used = placed
        room.update(trial)
        drained.add(source.name)
        received.update(used)
        keys = tuple(sorted(w.key for w in on_node[source.name]))
        moves.append(DefragMove(source.name, keys, tuple(sorted(used))))
    return moves


def _may_empty(node: NodeFacts, workers: list[WorkerFacts], threshold: int) -> bool:
    return (node.running and not node.do_not_disrupt and bool(workers)
            and utilization_percent(node) < threshold
            and all(w.qos == MOVABLE_QOS and not w.protected for w in workers))


def _may_receive(node: NodeFacts | None, pool: str) -> bool:
    return node is not None and node.pool == pool and node.running and not node.empty


def _place_all(workers: list[WorkerFacts], targets: dict[str, list[GpuRoom]]
               ) -> tuple[dict[str, list[GpuRoom]], set[str]] | None:
    """Place every worker (largest first) on a copy of `targets`; the changed copy and the nodes
    used, or None when one does not fit."""
    trial = {name: list(gpus) for name, gpus in targets.items()}
    used: set[str] = set()
    order = sorted(workers, key=lambda w: (-w.gpu_count * w.tflops_per_gpu, -w.gpu_count * w.vram_per_gpu, w.key))
    for worker in order:
        node = _fullest_fitting(worker, trial)
        if node is None:
            return None
        trial[node] = _take(worker, trial[node])
        used.add(node)
    return trial, used


def _fitting(worker: WorkerFacts, gpus: list[GpuRoom]) -> list[GpuRoom]:
    fits = [g for g in gpus if g.tflops >= worker.tflops_per_gpu and g.vram >= worker.vram_per_gpu
            and (not worker.model or g.model == worker.model)]
    # the tightest GPUs first, so the roomy ones stay whole for larger workers
    return sorted(fits, key=lambda g: (g.tflops, g.vram, g.gpu))


def _fullest_fitting(worker: WorkerFacts, trial: dict[str, list[GpuRoom]]) -> str | None:
    """The node with the least free room that has `gpu_count` GPUs fitting the worker (packing the
    busiest nodes first keeps the others emptiable)."""
    fitting = [name for name, gpus in trial.items() if len(_fitting(worker, gpus)) >= worker.gpu_count]
    return min(fitting, key=lambda name: (sum(g.tflops for g in trial[name]), sum(g.vram for g in trial[name]), name),
               default=None)


def _take(worker: WorkerFacts, gpus: list[GpuRoom]) -> list[GpuRoom]:
    chosen = {g.gpu for g in _fitting(worker, gpus)[:worker.gpu_count]}
    return [GpuRoom(g.node, g.gpu, g.tflops - worker.tflops_per_gpu, g.vram - worker.vram_per_gpu, g.model)
            if g.gpu in chosen else g for g in gpus]
