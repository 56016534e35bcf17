"""Why a request does not fit a node, in numbers: each node's Status and the facts suggestions need.

Why it exists: a pending pod must say what is wrong. This is the slow, thorough half of
framework.py, run only for failures and explicit questions: `explain_node` judges every GPU of one
node stage by stage and keeps, per node and request shape, the numbers (`NodeFacts`) that
suggest.py searches for the smallest change that would make the pod fit. It reads the allocator
through its public methods only and changes nothing but the allocator's explanation memo.

Speed of the first explanation of a request shape (nothing memoized yet): a node whose GPUs of the
pool are "plain" (`_plain_group`, kept per node until its GPUs' reported facts change) is judged
by load alone, two comparisons per GPU (`_judge_plain`; a test checks it agrees with the stage by
stage `_judge_node_slow` on random clusters); what is the same for every node is worked out once
per call; no GPU list is sorted (heapq picks the k best).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import TYPE_CHECKING

from tfusion.allocator import filters, isolation, partitions, topology
from tfusion.allocator.indexes import NodeEntry
from tfusion.allocator.reasons import (
    ACTIVE_MODE_MISMATCH,
    DYNAMIC_PARTITIONED,
    FILTER,
    HELD_WHOLE,
    HOLDS_PARTITIONS,
    INDEX_MISMATCH,
    MAX_WORKERS_DETAIL,
    MODE_CONFLICT,
    MODE_MISMATCH,
    MODEL_MISMATCH,
    NO_GROUP_GPUS,
    NO_MODE_SUPPORT,
    NO_MODEL_GPUS,
    NOT_IDLE,
    NOT_RUNNING,
    OTHER_USER,
    POLICY,
    RESOLVABLE,
    SUCCESS,
    TFLOPS_TOO_SMALL,
    TOO_FEW_GPUS,
    TOO_MANY_WORKERS,
    TOPOLOGY_TIER,
    TOPOLOGY_UNKNOWN,
    VENDOR_MISMATCH,
    VRAM_TOO_SMALL,
    Code,
    Reason,
    Status,
)
from tfusion.allocator.request import AllocRequest
from tfusion.allocator.state import PHASE_RUNNING, USED_BY_TENSOR_FUSION, GpuSlot
from tfusion.allocator.units import PERCENT_SCALE
from tfusion.api import annotations as tfa

if TYPE_CHECKING:
    from tfusion.allocator.allocator import GpuAllocator


def gpu_label(g: GpuSlot, req: AllocRequest) -> str | None:
    """The number-free reason of the first per-GPU stage (in `filters.STAGES` order) that rejects `g`
    for `req`; None when it passes them all. Fused like `filters.gpu_fits`: no text is built."""
    info = g.info
    iso = req.isolation
    if g.dynamic:
        dynamic = isolation.label(g, req)
        if dynamic is not None:
            return dynamic
    elif info.isolation_policy and info.isolation_policy.lower() not in filters.STATIC_POLICIES:
        return POLICY
    elif iso != tfa.ISOLATION_SHARED and info.isolation_mode and info.isolation_mode != iso:
        return MODE_MISMATCH
    if info.phase != PHASE_RUNNING:
        return NOT_RUNNING
    if info.used_by not in ("", USED_BY_TENSOR_FUSION):
        return OTHER_USER
    if req.indices and info.index not in req.indices:
        return INDEX_MISMATCH
    if info.virtualization is not None and iso not in info.virtualization:
        return NO_MODE_SUPPORT
    if iso == tfa.ISOLATION_SHARED and (g.allocs or g.shared_by is not None):
        return NOT_IDLE
    if iso == tfa.ISOLATION_PARTITIONED:
        label = partitions.gpu_label(g, req)
        if label is not None:
            return label
    elif g.parts:
        return HOLDS_PARTITIONS
    if g.shared_by is not None:
        return HELD_WHOLE
    if g.avail_t < req.tflops_need(info.capacity_tflops):
        return TFLOPS_TOO_SMALL
    if g.avail_v < req.vram_request:
        return VRAM_TOO_SMALL
    if req.gpu_model and info.model != req.gpu_model:
        return MODEL_MISMATCH
    if req.vendor and info.vendor != req.vendor:
        return VENDOR_MISMATCH
    return None


#: reason message -> (filter stage, resource whose free amount picks the GPU closest to fitting)
LABEL_STAGES: dict[str, tuple[str, str | None]] = {
    POLICY: ("IsolationPolicy", None), MODE_MISMATCH: ("IsolationPolicy", None),
    ACTIVE_MODE_MISMATCH: ("IsolationPolicy", None), MODE_CONFLICT: ("IsolationPolicy", None),
    DYNAMIC_PARTITIONED: ("IsolationPolicy", None),
    NOT_RUNNING: ("PhaseFilter", None), OTHER_USER: ("PhaseFilter", None),
    INDEX_MISMATCH: ("GPUIndexFilter", None), NO_MODE_SUPPORT: ("GPUIsolationModeFilter", None),
    NOT_IDLE: ("SharedWholeGPUFilter", None),
    **{label: ("PartitionTemplateFilter", None) for label in partitions.LABELS},
    HELD_WHOLE: ("ResourceFilter", None), TFLOPS_TOO_SMALL: ("ResourceFilter", "tflops"),
    VRAM_TOO_SMALL: ("ResourceFilter", "vram"), MODEL_MISMATCH: ("GPUModelFilter", None),
    VENDOR_MISMATCH: ("GPUVendorFilter", None),
}
_STAGE_CHECKS = {stage.name: stage.check for stage in filters.STAGES}


class NodeFacts(Status):
    """What one node can do for one request shape: its Status (Filter stage; the object itself
    when it fails, `SUCCESS` when it fits: see `status`), and on demand the numbers that
    suggestions need (valid while the node is unchanged: `version` is the node's version it was
    judged at, which the memo checks). One object, not a Status beside the facts: an explanation
    builds one per node, and what it keeps is kept for the next explanation of the shape.

    `fitting`: GPUs that fit as asked (0 at the worker limit); `loaded`: the GPUs past every static
    stage, whose load alone decides (None at the worker limit). `caps()`: (the largest VRAM request
    `count` of them could take now with the TFLOPS request unchanged; likewise TFLOPS, milli-percent
    for a compute-percent request, with VRAM unchanged; (VRAM, TFLOPS-or-percent) that the `count`
    GPUs with the most free VRAM all have), -1 / None when the node cannot give `count` GPUs.
    """

    __slots__ = ("_caps", "fitting", "loaded", "version")

    def __init__(self, code: Code, reasons: tuple[Reason, ...] = (), fitting: int = 0,
                 loaded: list[GpuSlot] | None = None) -> None:
        self.code = code
        self.stage = FILTER
        self.reasons = reasons
        self.ok = code is Code.SUCCESS
        self.fitting = fitting
        self.loaded = loaded
        self.version = -1
        self._caps: tuple[int, int, tuple[int, int] | None] | None = None

    @property
    def status(self) -> Status:
        return SUCCESS if self.ok else self

    def caps(self, req: AllocRequest) -> tuple[int, int, tuple[int, int] | None]:
        if self._caps is None:
            loaded = self.loaded
            self._caps = _caps(loaded, req) if loaded is not None and len(loaded) >= req.count else (-1, -1, None)
        return self._caps


def explain_node(alloc: GpuAllocator, req: AllocRequest, name: str, stage: str,
                 memo: dict[str, NodeFacts] | None = None) -> Status:
    """Success, or why `name` cannot take `req` (see `node_facts`), with `stage` as the Status' stage.
    `memo` is alloc.explain_cache(req), fetched once by a caller explaining many nodes."""
    status = node_facts(alloc, req, name, alloc.explain_cache(req) if memo is None else memo).status
    if status.ok or status.stage == stage:
        return status
    return status.with_stage(stage)


def node_statuses(alloc: GpuAllocator, req: AllocRequest, names: Iterable[str]) -> dict[str, Status]:
    """Each node's Status for `req` (stage Filter), from the memo where the node is unchanged.

    This is the first explanation's cost, so what is the same for every node is worked out once and
    `_judge_node`'s dispatch is inlined."""
    memo = alloc.explain_cache(req)
    versions = alloc.node_versions()
    nodes = alloc.node_entries()
    key = (req.pool, req.gpu_model)
    short = req.isolation in _LOAD_ONLY_MODES and not req.indices
    vendor = req.vendor
    out: dict[str, Status] = {}
    for name in names:
        version = versions.get(name, 0)
        hit = memo.get(name)
        if hit is not None and hit.version == version:
            out[name] = hit.status
            continue
        facts = None
        if short:
            node = nodes.get(name)
            members = node.groups.get(key) if node is not None else None
            if node is not None and members is not None:
                plain = _plain_group(alloc, node, key)
                if plain is not None and (not vendor or vendor == plain[0]):
                    facts = _judge_plain(alloc, req, node, members, plain[1])
        if facts is None:
            facts = _judge_node_slow(alloc, req, name)
        if facts.ok and req.count > 1:
            facts = _topology_gate(alloc, req, name, facts)
        facts.version = version
        memo[name] = facts
        out[name] = facts.status
    return out


def node_facts(alloc: GpuAllocator, req: AllocRequest, name: str,
               memo: dict[str, NodeFacts]) -> NodeFacts:
    """The node's facts for `req`, from `memo` (alloc.explain_cache(req)) while the node is unchanged."""
    version = alloc.node_version(name)
    hit = memo.get(name)
    if hit is not None and hit.version == version:
        return hit
    facts = _judge_node(alloc, req, name)
    if facts.ok and req.count > 1:
        facts = _topology_gate(alloc, req, name, facts)
    facts.version = version
    memo[name] = facts
    return facts


def _topology_gate(alloc: GpuAllocator, req: AllocRequest, name: str, facts: NodeFacts) -> NodeFacts:
    """`facts` of a node whose GPUs fit, or its refusal when hard topology (or reject of unknown
    topology) rules out every set of them: Unresolvable when even its idle GPUs could not do
    better (a pod leaving cannot help), else Unschedulable."""
    policy = alloc.topology_policy(req)
    node = alloc.node_entry(name)
    if not policy.gates or node is None:
        return facts
    members = node.groups[(req.pool, req.gpu_model)]
    fitting = [s for s in members if filters.gpu_fits(s, req)]
    choice = topology.best_set(fitting, req.count, policy)
    if not topology.refusal(choice, policy):
        return facts
    usable = [s for s in members if s.schedulable]
    whole = topology.best_set(usable, req.count, policy) if len(usable) >= req.count else choice
    code = Code.UNRESOLVABLE if topology.refusal(whole, policy) else Code.UNSCHEDULABLE
    detail = topology.refusal_detail(req.count, name, choice, policy)
    if choice.tier is None:
        reason = Reason(TOPOLOGY_UNKNOWN, topology.STAGE, name, detail=detail)
    else:
        reason = Reason(TOPOLOGY_TIER.format(found=choice.tier, allowed=policy.max_tier), topology.STAGE, name,
                        resource="tier", requested=policy.max_tier, available=choice.tier, detail=detail)
    return NodeFacts(code, (reason,), facts.fitting, facts.loaded)


def _plain_group(alloc: GpuAllocator, node: NodeEntry, key: tuple[str, str]) -> tuple[str, int] | None:
    """(vendor, TFLOPS capacity) when every GPU of the node's group is "plain": schedulable, Static
    isolation policy, no isolation mode, no capability annotation, one vendor and one capacity; else
    None. For such a group only the load decides, so a request is judged with two comparisons per
    GPU (`_judge_plain`). Kept per node until its GPUs' reported facts change (static_version)."""
    cache_key = (node.name, key)
    version = alloc.static_version(node.name)
    hit = alloc.static_facts.get(cache_key)
    if hit is not None and hit[0] == version:
        return hit[1]
    members = node.groups[key]
    first = members[0].info
    plain: tuple[str, int] | None = (first.vendor, first.capacity_tflops)
    for slot in members:
        info = slot.info
        if not slot.schedulable or slot.dynamic or info.isolation_mode or info.virtualization is not None or \
                (info.isolation_policy and info.isolation_policy.lower() not in filters.STATIC_POLICIES) or \
                info.vendor != first.vendor or info.capacity_tflops != first.capacity_tflops:
            plain = None
            break
    alloc.static_facts[cache_key] = (version, plain)
    return plain


#: isolation modes a plain group is judged by load alone for (shared needs idle GPUs, partitioned is refused)
_LOAD_ONLY_MODES = frozenset({tfa.ISOLATION_SOFT, tfa.ISOLATION_HARD})


def _judge_node(alloc: GpuAllocator, req: AllocRequest, name: str) -> NodeFacts:
    """One pass over the node's GPUs: one Reason per distinct per-GPU reason (numbers from the GPU
    closest to fitting), the worker limit, the GPU count; Unresolvable when fewer than `req.count`
    GPUs could ever fit (load aside); and the caps for suggestions. A plain group (`_plain_group`)
    takes the short road (`_judge_plain`), with the same answer."""
    node = alloc.node_entry(name)
    key = (req.pool, req.gpu_model)
    if node is not None and key in node.groups and req.isolation in _LOAD_ONLY_MODES and not req.indices:
        plain = _plain_group(alloc, node, key)
        if plain is not None and (not req.vendor or req.vendor == plain[0]):
            facts = _judge_plain(alloc, req, node, node.groups[key], plain[1])
            if facts is not None:
                return facts
    return _judge_node_slow(alloc, req, name)


def _judge_plain(alloc: GpuAllocator, req: AllocRequest, node: NodeEntry, members: list[GpuSlot],
                 capacity: int) -> NodeFacts | None:
    """`_judge_node_slow` for a plain group: each GPU is short of TFLOPS, else of VRAM, else fits.
    None when a GPU is held whole by a shared pod or holds partitions (the slow road says so)."""
    need_t = req.tflops_need(capacity)
    need_v = req.vram_request
    t_best: GpuSlot | None = None
    v_best: GpuSlot | None = None
    t_count = v_count = fitting = 0
    vram_first = False
    for slot in members:
        if slot.shared_by is not None or slot.parts:
            return None
        if slot.avail_t < need_t:
            t_count += 1
            if t_best is None or slot.avail_t > t_best.avail_t:
                t_best = slot
        elif slot.avail_v < need_v:
            if v_best is None:
                vram_first = t_best is None
                v_best = slot
            elif slot.avail_v > v_best.avail_v:
                v_best = slot
            v_count += 1
        else:
            fitting += 1
    workers, limit = len(node.workers), alloc.max_workers_per_node
    k = req.count
    if fitting >= k and workers < limit:
        return NodeFacts(Code.SUCCESS, (), fitting)
    name = node.name
    t_reason = None if t_best is None else Reason(TFLOPS_TOO_SMALL, "ResourceFilter", name, t_best.name, "tflops",
                                                  need_t, t_best.avail_t, gpus=t_count)
    v_reason = None if v_best is None else Reason(VRAM_TOO_SMALL, "ResourceFilter", name, v_best.name, "vram",
                                                  need_v, v_best.avail_v, gpus=v_count)
    reasons: tuple[Reason, ...] = ()
    if t_reason is not None and v_reason is not None:
        reasons = (v_reason, t_reason) if vram_first else (t_reason, v_reason)
    elif t_reason is not None:
        reasons = (t_reason,)
    elif v_reason is not None:
        reasons = (v_reason,)
    open_node = workers < limit
    if not open_node:
        reasons += (Reason(TOO_MANY_WORKERS, filters.MAX_WORKERS, name, resource="workers", requested=1,
                           available=0, detail=MAX_WORKERS_DETAIL.format(node=name, workers=workers, limit=limit)),)
    if fitting < k and k > 1:
        reasons += (Reason(TOO_FEW_GPUS, filters.SAME_NODE, name, resource="gpus", requested=k, available=fitting,
                           detail=f"node {name} has {fitting} fitting GPU(s), {k} requested"),)
    code = Code.UNRESOLVABLE if len(members) < k else Code.UNSCHEDULABLE
    # `members` itself, not a copy: the facts are valid only while the node's version is unchanged
    return NodeFacts(code, reasons, fitting if open_node else 0, members if open_node else None)


def _judge_node_slow(alloc: GpuAllocator, req: AllocRequest, name: str) -> NodeFacts:
    """`_judge_node` GPU by GPU, every stage in order (any group, any request)."""
    node = alloc.node_entry(name)
    key = (req.pool, req.gpu_model)
    if node is None or key not in node.groups:
        if node is not None and req.gpu_model and (req.pool, "") in node.groups:
            return NodeFacts(Code.UNRESOLVABLE, (Reason(
                NO_MODEL_GPUS, "GPUModelFilter", name, detail=f"node {name} has no {req.gpu_model} GPU of pool "
                                                               f"{req.pool}"),))
        return NodeFacts(Code.UNRESOLVABLE, (Reason(
            NO_GROUP_GPUS, FILTER, name, detail=f"node {name} has no GPU of pool {req.pool}"),))
    closest: dict[str, GpuSlot] = {}
    counts: dict[str, int] = {}
    loaded: list[GpuSlot] = []  # past every static stage: only their load decides
    fitting = curable = 0
    for slot in node.groups[key]:
        label = gpu_label(slot, req)
        if label is None:
            fitting += 1
            curable += 1
            loaded.append(slot)
            continue
        if label in RESOLVABLE:
            curable += 1
            if label is not HELD_WHOLE and label is not NOT_IDLE:
                loaded.append(slot)
        seen = closest.get(label)
        if seen is None:
            closest[label] = slot
            counts[label] = 1
            continue
        counts[label] += 1
        if (label is VRAM_TOO_SMALL and slot.avail_v > seen.avail_v) or \
                (label is TFLOPS_TOO_SMALL and slot.avail_t > seen.avail_t):
            closest[label] = slot
    workers, limit = len(node.workers), alloc.max_workers_per_node
    if fitting >= req.count and workers < limit:
        return NodeFacts(Code.SUCCESS, (), fitting)
    k = req.count
    open_node = workers < limit
    reasons = [_gpu_reason(label, slot, req, counts[label]) for label, slot in closest.items()]
    if not open_node:
        reasons.append(Reason(TOO_MANY_WORKERS, filters.MAX_WORKERS, name, resource="workers", requested=1,
                              available=0, detail=MAX_WORKERS_DETAIL.format(node=name, workers=workers,
                                                                            limit=limit)))
    if fitting < k and k > 1:
        reasons.append(Reason(TOO_FEW_GPUS, filters.SAME_NODE, name, resource="gpus", requested=k,
                              available=fitting,
                              detail=f"node {name} has {fitting} fitting GPU(s), {k} requested"))
    code = Code.UNRESOLVABLE if curable < k else Code.UNSCHEDULABLE
    return NodeFacts(code, tuple(reasons), fitting if open_node else 0,
                     loaded if open_node else None)


def _percent_free(slot: GpuSlot) -> int:
    cap = slot.info.capacity_tflops
    return slot.avail_t * PERCENT_SCALE // cap if cap > 0 else 0


def _caps(loaded: list[GpuSlot], req: AllocRequest) -> tuple[int, int, tuple[int, int] | None]:
    k = req.count
    percent = not req.tflops_request and bool(req.percent_request)
    free_t = _percent_free if percent else _avail_t
    vram = _kth_largest([s.avail_v for s in loaded if s.avail_t >= req.tflops_need(s.info.capacity_tflops)], k)
    tflops = _kth_largest([free_t(s) for s in loaded if s.avail_v >= req.vram_request], k)
    top = heapq.nsmallest(k, loaded, key=lambda s: (-s.avail_v, -free_t(s)))
    return vram, tflops, (min(s.avail_v for s in top), min(free_t(s) for s in top))


def _avail_t(slot: GpuSlot) -> int:
    return slot.avail_t


def _gpu_reason(label: str, slot: GpuSlot, req: AllocRequest, count: int) -> Reason:
    """The Reason for `count` GPUs of a node sharing `label`; `slot` is the one closest to fitting."""
    stage, resource = LABEL_STAGES[label]
    if resource == "vram":
        return Reason(label, stage, slot.node, slot.name, resource, req.vram_request, slot.avail_v, gpus=count)
    if resource == "tflops":
        return Reason(label, stage, slot.node, slot.name, resource, req.tflops_need(slot.info.capacity_tflops),
                      slot.avail_t, gpus=count)
    detail = _STAGE_CHECKS[stage](slot, req) or label
    if count > 1:
        detail += f" (and {count - 1} more GPU(s) of the node)"
    return Reason(label, stage, slot.node, slot.name, detail=detail, gpus=count)


def _kth_largest(values: list[int], k: int) -> int:
    """The k-th largest value (1-based); -1 when there are fewer than k. (No full sort.)"""
    if len(values) < k:
        return -1
    return max(values) if k == 1 else heapq.nlargest(k, values)[-1]
