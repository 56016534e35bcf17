"""Why a request does not fit a node, in numbers, and the smallest changes that would make it fit.

Why it exists: a pending pod must say what is wrong and what to do about it. This is the slow,
thorough half of framework.py, run only for failures and explicit questions: `explain_node` judges
every GPU of one node stage by stage; `suggestions` searches, against the allocator's current state
and without changing it, for
- smaller-request: the largest VRAM, TFLOPS (or compute percent) or GPU count that fits now;
- other-model / other-pool: a GPU model of the pool, or another pool, where the request fits as is;
- quota: the GPUResourceQuota values that would admit it (when the GPUs have room);
- preempt-lower-qos: the fewest lower-QoS pods on one node whose departure frees the room.
Every suggestion is checked with the same rules the placement uses before it is offered.

Speed of the first explanation of a request shape (nothing memoized yet): a node whose GPUs of the
pool are "plain" (`_plain_group`, kept per node until its GPUs' reported facts change) is judged
by load alone, two comparisons per GPU (`_judge_plain`; a test checks it agrees with the stage by
stage `_judge_node_slow` on random clusters); what is the same for every node is worked out once
per call; no GPU list is sorted (heapq picks the k best).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from tfusion.allocator import filters
from tfusion.allocator.errors import QuotaExceeded, Unschedulable
from tfusion.allocator.framework import (
    FILTER,
    HELD_WHOLE,
    INDEX_MISMATCH,
    MAX_WORKERS_DETAIL,
    MODE_MISMATCH,
    MODEL_MISMATCH,
    NO_GROUP_GPUS,
    NO_MODE_SUPPORT,
    NO_MODEL_GPUS,
    NOT_IDLE,
    NOT_RUNNING,
    OTHER_USER,
    PARTITIONED,
    POLICY,
    RESOLVABLE,
    SUCCESS,
    TFLOPS_TOO_SMALL,
    TOO_FEW_GPUS,
    TOO_MANY_WORKERS,
    VENDOR_MISMATCH,
    VRAM_TOO_SMALL,
    Code,
    Reason,
    Status,
    Suggestion,
)
from tfusion.allocator.quota import Usage, check_single, check_total
from tfusion.allocator.request import QOS_LEVELS, AllocRequest
from tfusion.allocator.state import PHASE_RUNNING, USED_BY_TENSOR_FUSION, GpuSlot
from tfusion.allocator.units import PERCENT_SCALE, percent_str, tflops_str, vram_str
from tfusion.api import annotations as tfa

GIB = 1 << 30
MIB = 1 << 20
MAX_ALTERNATIVES = 3  # other models / pools offered at most
SMALLER = "smaller-request"
OTHER_MODEL = "other-model"
OTHER_POOL = "other-pool"
QUOTA = "quota"
PREEMPT = "preempt-lower-qos"

if TYPE_CHECKING:
    from tfusion.allocator.allocator import GpuAllocator, _Node
    from tfusion.allocator.framework import Framework


def gpu_label(g: GpuSlot, req: AllocRequest) -> str | None:
    """The number-free reason of the first per-GPU stage (in `filters.STAGES` order) that rejects `g`
    for `req`; None when it passes them all. Fused like `filters.gpu_fits`: no text is built."""
    info = g.info
    iso = req.isolation
    if info.isolation_policy and info.isolation_policy.lower() not in filters.STATIC_POLICIES:
        return POLICY
    if iso != tfa.ISOLATION_SHARED and info.isolation_mode and info.isolation_mode != iso:
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
        return PARTITIONED
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
    NOT_RUNNING: ("PhaseFilter", None), OTHER_USER: ("PhaseFilter", None),
    INDEX_MISMATCH: ("GPUIndexFilter", None), NO_MODE_SUPPORT: ("GPUIsolationModeFilter", None),
    NOT_IDLE: ("SharedWholeGPUFilter", None), PARTITIONED: ("PartitionTemplateFilter", None),
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
    versions = alloc._versions
    nodes = alloc._nodes
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
        facts.version = version
        memo[name] = facts
        out[name] = facts.status
    return out


def node_facts(alloc: GpuAllocator, req: AllocRequest, name: str,
               memo: dict[str, NodeFacts]) -> NodeFacts:
    """The node's facts for `req`, from `memo` (alloc.explain_cache(req)) while the node is unchanged."""
    version = alloc._versions.get(name, 0)  # node_version(), inlined: this runs for every node
    hit = memo.get(name)
    if hit is not None and hit.version == version:
        return hit
    facts = _judge_node(alloc, req, name)
    facts.version = version
    memo[name] = facts
    return facts


def _plain_group(alloc: GpuAllocator, node: _Node, key: tuple[str, str]) -> tuple[str, int] | None:
    """(vendor, TFLOPS capacity) when every GPU of the node's group is "plain": schedulable, Static
    isolation policy, no isolation mode, no capability annotation, one vendor and one capacity; else
    None. For such a group only the load decides, so a request is judged with two comparisons per
    GPU (`_judge_plain`). Kept per node until its GPUs' reported facts change (static_version)."""
    cache_key = (node.name, key)
    version = alloc._static_gen.get(node.name, 0)
    hit = alloc.static_facts.get(cache_key)
    if hit is not None and hit[0] == version:
        return hit[1]  # type: ignore[no-any-return]
    members = node.groups[key]
    first = members[0].info
    plain: tuple[str, int] | None = (first.vendor, first.capacity_tflops)
    for slot in members:
        info = slot.info
        if not slot.schedulable or info.isolation_mode or info.virtualization is not None or \
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
    node = alloc._nodes.get(name)
    key = (req.pool, req.gpu_model)
    if node is not None and key in node.groups and req.isolation in _LOAD_ONLY_MODES and not req.indices:
        plain = _plain_group(alloc, node, key)
        if plain is not None and (not req.vendor or req.vendor == plain[0]):
            facts = _judge_plain(alloc, req, node, node.groups[key], plain[1])
            if facts is not None:
                return facts
    return _judge_node_slow(alloc, req, name)


def _judge_plain(alloc: GpuAllocator, req: AllocRequest, node: _Node, members: list[GpuSlot],
                 capacity: int) -> NodeFacts | None:
    """`_judge_node_slow` for a plain group: each GPU is short of TFLOPS, else of VRAM, else fits.
    None when a GPU is held whole by a shared pod (the slow road says so)."""
    need_t = req.tflops_need(capacity)
    need_v = req.vram_request
    t_best: GpuSlot | None = None
    v_best: GpuSlot | None = None
    t_count = v_count = fitting = 0
    vram_first = False
    for slot in members:
        if slot.shared_by is not None:
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
    node = alloc._nodes.get(name)
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


def suggestions(fw: Framework, req: AllocRequest, pre: Status,
                per_node: Mapping[str, Status]) -> tuple[Suggestion, ...]:
    """Changes that would make `req` fit now, the most direct first; () when none is found.

    `pre` is pre_filter's Status for `req` and `per_node` filter's explained statuses (empty when
    PreFilter failed). Nothing in the allocator changes.
    """
    alloc = fw.allocator
    found: list[Suggestion] = []
    quota = next((r for r in pre.reasons if r.stage == filters.QUOTA), None)
    if quota is not None:
        found.extend(_quota_suggestions(alloc, req, quota))
    elif pre.ok:
        found.extend(_smaller_requests(alloc, req, per_node))
        found.extend(_other_models(alloc, req))
    if pre.ok or quota is None:
        found.extend(_other_pools(alloc, req))
    if pre.ok:
        preempt = _preemption(alloc, req, per_node)
        if preempt is not None:
            found.append(preempt)
    return tuple(found)


# ---------------------------------------------------------------------- checking a changed request

def _placed_on(alloc: GpuAllocator, req: AllocRequest) -> str | None:
    """Where the placement path would put `req` now (quota included), or None."""
    try:
        return alloc.select(req, diagnose=False).node
    except Unschedulable:
        return None


def _short(key: str) -> str:
    return key.rsplit("/", 1)[-1]


def _offer(alloc: GpuAllocator, req: AllocRequest, kind: str, changes: dict[str, str],
           what: str) -> Suggestion | None:
    node = _placed_on(alloc, req)
    if node is None:
        return None
    return Suggestion(kind, f"{what} fits on {node}", changes, node=node)


def _floor_vram(size: int) -> int:
    unit = GIB if size >= GIB else MIB
    return size // unit * unit


def _floor_milli(value: int) -> int:
    return value // 1000 * 1000 if value >= 1000 else value


def _ceil_vram(size: int) -> int:
    unit = GIB if size >= GIB else MIB
    return -(-size // unit) * unit


def _ceil_milli(value: int) -> int:
    return -(-value // 1000) * 1000


def _kth_largest(values: list[int], k: int) -> int:
    """The k-th largest value (1-based); -1 when there are fewer than k. (No full sort.)"""
    if len(values) < k:
        return -1
    return max(values) if k == 1 else heapq.nlargest(k, values)[-1]


# ---------------------------------------------------------------------- smaller-request

def _failing_facts(alloc: GpuAllocator, req: AllocRequest,
                   per_node: Mapping[str, Status]) -> dict[str, NodeFacts]:
    """The facts of the failing nodes that could give `req.count` GPUs if the request were smaller."""
    memo = alloc.explain_cache(req)
    out = {}
    for name, status in per_node.items():
        if not status.ok:
            facts = node_facts(alloc, req, name, memo)
            if facts.loaded is not None:
                out[name] = facts
    return out


def _largest_cap(req: AllocRequest, facts: Mapping[str, NodeFacts], which: int,
                 bound: Mapping[str, int] | None, other: Mapping[str, int], other_need: int) -> int:
    """The largest caps()[which] (0: VRAM, 1: TFLOPS/percent) over the nodes, -1 if none. `bound`
    (node -> an upper bound of it: the node's best free VRAM or TFLOPS) lets the search visit nodes
    best-bound first and stop early; nodes whose best free amount of the other resource (`other`)
    is below what the request keeps asking of it (`other_need`) cannot have a cap and are skipped.
    So few nodes compute their caps."""
    names = [n for n in facts if other[n] >= other_need]
    if bound is not None:
        names.sort(key=bound.__getitem__, reverse=True)
    best = -1
    for name in names:
        if bound is not None and bound[name] <= best:
            break
        value = facts[name].caps(req)[which]
        if isinstance(value, int) and value > best:
            best = value
    return best


def _largest_pair(req: AllocRequest, facts: Mapping[str, NodeFacts],
                  bound: Mapping[str, int]) -> tuple[int, int] | None:
    names = sorted(facts, key=bound.__getitem__, reverse=True)
    best: tuple[int, int] | None = None
    for name in names:
        if best is not None and bound[name] < best[0]:
            break
        pair = facts[name].caps(req)[2]
        if pair is not None and (best is None or pair > best):
            best = pair
    return best


def _smaller_requests(alloc: GpuAllocator, req: AllocRequest, per_node: Mapping[str, Status]) -> list[Suggestion]:
    """The largest VRAM, TFLOPS (or percent), both, or GPU count that some node can take now."""
    every = _failing_facts(alloc, req, per_node)
    k = req.count
    facts = {n: f for n, f in every.items() if f.loaded is not None and len(f.loaded) >= k}  # may get k GPUs
    index = alloc._group_index((req.pool, req.gpu_model))
    out: list[Suggestion] = []
    percent = not req.tflops_request and bool(req.percent_request)
    t_key = tfa.COMPUTE_PERCENT_REQUEST if percent else tfa.TFLOPS_REQUEST

    def with_t(value: int) -> AllocRequest:
        return replace(req, percent_request=value) if percent else replace(req, tflops_request=value)

    def t_text(value: int) -> str:
        return percent_str(value) if percent else tflops_str(value)

    def t_floor(value: int) -> int:
        return value // 1000 * 1000 if percent else _floor_milli(value)

    if req.vram_request:
        value = _floor_vram(_largest_cap(req, facts, 0, index.agg_v, index.agg_t, req.tflops_request))
        if 0 < value < req.vram_request:
            text = vram_str(value)
            hit = _offer(alloc, replace(req, vram_request=value), SMALLER, {tfa.VRAM_REQUEST: text},
                         f"{_short(tfa.VRAM_REQUEST)} <= {text}")
            if hit is not None:
                out.append(hit)
    if req.tflops_request or req.percent_request:
        value = t_floor(_largest_cap(req, facts, 1, None if percent else index.agg_t, index.agg_v,
                                     req.vram_request))
        current = req.percent_request if percent else req.tflops_request
        if 0 < value < current:
            hit = _offer(alloc, with_t(value), SMALLER, {t_key: t_text(value)}, f"{_short(t_key)} <= {t_text(value)}")
            if hit is not None:
                out.append(hit)
    if not out and req.vram_request and (req.tflops_request or req.percent_request):
        both = _largest_pair(req, facts, index.agg_v)
        if both is not None:
            v, t = _floor_vram(both[0]), t_floor(both[1])
            if v > 0 and t > 0:
                changes = {tfa.VRAM_REQUEST: vram_str(v), t_key: t_text(t)}
                hit = _offer(alloc, replace(with_t(t), vram_request=v), SMALLER, changes,
                             f"{_short(tfa.VRAM_REQUEST)} <= {vram_str(v)} and {_short(t_key)} <= {t_text(t)}")
                if hit is not None:
                    out.append(hit)
    if k > 1 and not req.indices:
        most = max((f.fitting for f in every.values()), default=0)
        if 0 < most < k:
            hit = _offer(alloc, replace(req, count=most), SMALLER, {tfa.GPU_COUNT: str(most)},
                         f"{_short(tfa.GPU_COUNT)} <= {most}")
            if hit is not None:
                out.append(hit)
    return out


# ---------------------------------------------------------------------- other-model, other-pool

def _other_models(alloc: GpuAllocator, req: AllocRequest) -> list[Suggestion]:
    if not req.gpu_model:
        return []
    models = sorted({key[1] for node in alloc._nodes.values() for key in node.groups
                     if key[0] == req.pool and key[1] and key[1] != req.gpu_model})
    out = []
    for model in models:
        hit = _offer(alloc, replace(req, gpu_model=model), OTHER_MODEL, {tfa.GPU_MODEL: model},
                     f"{_short(tfa.GPU_MODEL)} {model}")
        if hit is not None:
            out.append(hit)
            if len(out) == MAX_ALTERNATIVES:
                break
    return out


def _other_pools(alloc: GpuAllocator, req: AllocRequest) -> list[Suggestion]:
    out = []
    for pool in sorted(alloc._pools):
        if pool == req.pool:
            continue
        hit = _offer(alloc, replace(req, pool=pool), OTHER_POOL, {tfa.GPU_POOL: pool},
                     f"{_short(tfa.GPU_POOL)} {pool}")
        if hit is not None:
            out.append(hit)
            if len(out) == MAX_ALTERNATIVES:
                break
    return out


# ---------------------------------------------------------------------- quota

#: quota limit name -> (QuotaSpec attribute, GPUResourceQuota field path, unit kind)
QUOTA_FIELDS = {
    "total.max.tflops.request": ("requests_tflops", "spec.total.requests.tflops", "tflops"),
    "total.max.vram.request": ("requests_vram", "spec.total.requests.vram", "vram"),
    "total.max.tflops.limit": ("limits_tflops", "spec.total.limits.tflops", "tflops"),
    "total.max.vram.limit": ("limits_vram", "spec.total.limits.vram", "vram"),
    "total.max.workers.limit": ("max_workers", "spec.total.maxWorkers", "count"),
    "single.max.tflops.request": ("single_max_requests_tflops", "spec.single.maxRequests.tflops", "tflops"),
    "single.max.vram.request": ("single_max_requests_vram", "spec.single.maxRequests.vram", "vram"),
    "single.max.tflops.limit": ("single_max_limits_tflops", "spec.single.maxLimits.tflops", "tflops"),
    "single.max.vram.limit": ("single_max_limits_vram", "spec.single.maxLimits.vram", "vram"),
    "single.max.gpuCount.limit": ("single_max_gpu_count", "spec.single.maxGPUCount", "count"),
}


def _ceil(kind: str, value: int) -> int:
    return _ceil_vram(value) if kind == "vram" else _ceil_milli(value) if kind == "tflops" else value


def _text(kind: str, value: int) -> str:
    return vram_str(value) if kind == "vram" else tflops_str(value) if kind == "tflops" else str(value)


def _quota_suggestions(alloc: GpuAllocator, req: AllocRequest, reason: Reason) -> list[Suggestion]:
    """The quota values that admit `req` (when its GPUs have room) and a request within the headroom."""
    out: list[Suggestion] = []
    headroom = _within_quota(alloc, req, reason)
    if headroom is not None:
        out.append(headroom)
    spec = alloc._quota.get(req.namespace)
    if spec is None or req.pool not in alloc._pools or not alloc.feasible_nodes(req):
        return out
    used = alloc._effective_usage(req.namespace)
    t_need = req.tflops_request or req.tflops_need(_largest_capacity(alloc, req.pool))
    t_limit = req.tflops_limit or req.tflops_limit_on(_largest_capacity(alloc, req.pool))
    per_gpu = Usage(t_need, req.vram_request, t_limit, req.vram_limit, 1)
    charge = Usage(t_need * req.count, req.vram_request * req.count, t_limit * req.count,
                   req.vram_limit * req.count, 1)
    changes: dict[str, str] = {}
    for _ in QUOTA_FIELDS:
        try:
            check_single(req.namespace, spec, per_gpu, req.count)
            check_total(req.namespace, spec, used, charge)
            break
        except QuotaExceeded as exc:
            attr, path, kind = QUOTA_FIELDS[exc.resource]
            needed = exc.requested if exc.resource.startswith("single.") else exc.used + exc.requested
            spec = replace(spec, **{attr: _ceil(kind, needed)})
            changes[path] = _text(kind, getattr(spec, attr))
    else:
        return out
    for kind in ("tflops", "vram"):  # a quota's limits may not be below its requests
        requests, limits = getattr(spec, f"requests_{kind}"), getattr(spec, f"limits_{kind}")
        if requests is not None and limits is not None and limits < requests:
            spec = replace(spec, **{f"limits_{kind}": requests})
            changes[f"spec.total.limits.{kind}"] = _text(kind, requests)
    listed = ", ".join(f"{path} to {value}" for path, value in changes.items())
    out.append(Suggestion(QUOTA, f"raise the GPUResourceQuota of namespace {req.namespace}: {listed}",
                          changes, target="quota"))
    return out


def _largest_capacity(alloc: GpuAllocator, pool: str) -> int:
    return max((s.info.capacity_tflops for s in alloc._pools.get(pool, {}).values()), default=0)


def _within_quota(alloc: GpuAllocator, req: AllocRequest, reason: Reason) -> Suggestion | None:
    """A per-GPU request small enough for the quota limit that refused it (request limits only)."""
    resource = reason.resource or ""
    if resource not in QUOTA_FIELDS or not resource.endswith(".request") or reason.available is None:
        return None
    kind = QUOTA_FIELDS[resource][2]
    per_gpu = reason.available if resource.startswith("single.") else reason.available // req.count
    if kind == "vram":
        value = _floor_vram(per_gpu)
        if not 0 < value < req.vram_request:
            return None
        return _offer(alloc, replace(req, vram_request=value), SMALLER, {tfa.VRAM_REQUEST: vram_str(value)},
                      f"{_short(tfa.VRAM_REQUEST)} <= {vram_str(value)}")
    value = _floor_milli(per_gpu)
    if not req.tflops_request or not 0 < value < req.tflops_request:
        return None
    return _offer(alloc, replace(req, tflops_request=value), SMALLER, {tfa.TFLOPS_REQUEST: tflops_str(value)},
                  f"{_short(tfa.TFLOPS_REQUEST)} <= {tflops_str(value)}")


# ---------------------------------------------------------------------- preempt-lower-qos

def _qos_rank(qos: str) -> int:
    return QOS_LEVELS.index(qos) if qos in QOS_LEVELS else 1


def _preemption(alloc: GpuAllocator, req: AllocRequest, per_node: Mapping[str, Status]) -> Suggestion | None:
    """The fewest lower-QoS pods on one node whose departure lets `req` fit there."""
    rank = _qos_rank(req.qos)
    if not any(n for qos, n in alloc.live_by_qos().items() if _qos_rank(qos) < rank):
        return None
    key = (req.pool, req.gpu_model)
    best: tuple[int, int, str, list[str]] | None = None
    for name, status in per_node.items():
        node = alloc._nodes.get(name)
        if status.ok or status.code is not Code.UNSCHEDULABLE or node is None or key not in node.groups:
            continue
        lower = [uid for uid in node.workers if _qos_rank(alloc._allocs[uid].req.qos) < rank]
        if not lower:
            continue
        lower.sort(key=lambda uid: (_qos_rank(alloc._allocs[uid].req.qos),
                                    -sum(c[1] for c in alloc._allocs[uid].charges), uid))
        victims = _fewest_victims(alloc, node, key, req, lower)
        if victims is None:
            continue
        freed = sum(c[1] for uid in victims for c in alloc._allocs[uid].charges)
        candidate = (len(victims), freed, name, victims)
        if best is None or candidate[:3] < best[:3]:
            best = candidate
    if best is None:
        return None
    count, _, name, victims = best
    pods = tuple(sorted(alloc._nodes[name].workers[uid] for uid in victims))
    return Suggestion(PREEMPT, f"{count} lower-QoS pod(s) leaving {name} would free room: {', '.join(pods)}",
                      {}, target="pods", pods=pods, node=name)


def _fewest_victims(alloc: GpuAllocator, node: _Node, key: tuple[str, str], req: AllocRequest,
                    ordered: list[str]) -> list[str] | None:
    """Add victims in order until `req` fits, then drop the ones it fits without."""
    chosen: list[str] = []
    for uid in ordered:
        chosen.append(uid)
        if _fits_without(alloc, node, key, req, set(chosen)):
            break
    else:
        return None
    for uid in reversed(chosen[:-1]):
        trial = set(chosen) - {uid}
        if _fits_without(alloc, node, key, req, trial):
            chosen.remove(uid)
    return chosen


_AMOUNT_STAGES = ("SharedWholeGPUFilter", "ResourceFilter")


def _fits_without(alloc: GpuAllocator, node: _Node, key: tuple[str, str], req: AllocRequest,
                  gone: set[str]) -> bool:
    """Whether `req` would fit on `node` if the pods `gone` released their GPUs."""
    if len(node.workers) - len(gone & node.workers.keys()) >= alloc.max_workers_per_node:
        return False
    fitting = 0
    for slot in node.groups[key]:
        if slot.shared_by is not None and slot.shared_by not in gone:
            continue
        staying = [uid for uid in slot.allocs if uid not in gone]
        if req.isolation == tfa.ISOLATION_SHARED and staying:
            continue
        if req.isolation == tfa.ISOLATION_PARTITIONED:
            return False
        if any(stage.name not in _AMOUNT_STAGES and stage.applies(req) and stage.check(slot, req) is not None
               for stage in filters.STAGES):
            continue
        info = slot.info
        shared_left = slot.shared_by is not None
        used_t = 0 if shared_left else sum(slot.allocs[uid][0] for uid in staying)
        used_v = 0 if shared_left else sum(slot.allocs[uid][1] for uid in staying)
        if info.capacity_tflops - used_t >= req.tflops_need(info.capacity_tflops) and \
                info.capacity_vram - used_v >= req.vram_request:
            fitting += 1
    return fitting >= req.count
