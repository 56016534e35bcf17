"""The smallest changes that would make a pod fit now, each checked with the placement's own rules.

Why it exists: "0/5 nodes are available" is only half an answer; a pending pod should also say what
to change. `suggestions` searches, against the allocator's current state and without changing it,
for
- smaller-request: the largest VRAM, TFLOPS (or compute percent) or GPU count that fits now;
- other-model / other-pool: a GPU model of the pool, or another pool, where the request fits as is;
- looser-topology: the lowest gpu-topology-max-tier that fits, when a hard topology refused nodes;
- quota: the GPUResourceQuota values that would admit it (when the GPUs have room);
- preempt-lower-qos: the fewest lower-priority pods on one node whose departure frees the room (the
  preemption search, preemption.py).
Every suggestion is checked with the same rules the placement uses (`GpuAllocator.select`) before it
is offered. The per-node numbers come from explain.py's `NodeFacts`; the allocator is read through
its public methods only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from tfusion.allocator import filters, topology
from tfusion.allocator.errors import QuotaExceeded, Unschedulable
from tfusion.allocator.explain import NodeFacts, node_facts
from tfusion.allocator.preemption import VictimFacts
from tfusion.allocator.quota import Usage, check_single, check_total
from tfusion.allocator.reasons import Code, Reason, Status, Suggestion
from tfusion.allocator.request import AllocRequest
from tfusion.allocator.units import percent_str, tflops_str, vram_str
from tfusion.api import annotations as tfa

if TYPE_CHECKING:
    from tfusion.allocator.allocator import GpuAllocator
    from tfusion.allocator.framework import Framework

GIB = 1 << 30
MIB = 1 << 20
MAX_ALTERNATIVES = 3  # other models / pools offered at most
SMALLER = "smaller-request"
OTHER_MODEL = "other-model"
OTHER_POOL = "other-pool"
QUOTA = "quota"
TOPOLOGY = "looser-topology"
PREEMPT = "preempt-lower-qos"


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
        found.extend(_looser_topology(alloc, req, per_node))
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
    index = alloc.group_index(req.pool, req.gpu_model)
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


# ---------------------------------------------------------------------- looser-topology

def _looser_topology(alloc: GpuAllocator, req: AllocRequest, per_node: Mapping[str, Status]) -> list[Suggestion]:
    """The smallest gpu-topology-max-tier that fits now, when nodes refused the pod for its tier only."""
    found = sorted({r.available for status in per_node.values() if not status.ok for r in status.reasons
                    if r.stage == topology.STAGE and r.available is not None})
    for tier in found:
        text = str(tier)
        hit = _offer(alloc, replace(req, topology_max_tier=tier), TOPOLOGY, {tfa.GPU_TOPOLOGY_MAX_TIER: text},
                     f"{_short(tfa.GPU_TOPOLOGY_MAX_TIER)} {text} ({topology.tier_name(tier)})")
        if hit is not None:
            return [hit]
    return []


# ---------------------------------------------------------------------- other-model, other-pool

def _other_models(alloc: GpuAllocator, req: AllocRequest) -> list[Suggestion]:
    if not req.gpu_model:
        return []
    models = [model for model in alloc.pool_models(req.pool) if model != req.gpu_model]
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
    for pool in alloc.pool_names():
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
    spec = alloc.quota_spec(req.namespace)
    if spec is None or not alloc.has_pool(req.pool) or not alloc.feasible_nodes(req):
        return out
    used = alloc.quota_usage(req.namespace, include_assumed=True)
    largest = alloc.largest_gpu(req.pool)
    capacity = largest.tflops if largest is not None else 0
    t_need = req.tflops_request or req.tflops_need(capacity)
    t_limit = req.tflops_limit or req.tflops_limit_on(capacity)
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

def _preemption(alloc: GpuAllocator, req: AllocRequest, per_node: Mapping[str, Status]) -> Suggestion | None:
    """The fewest lower-priority pods on one node whose departure lets `req` fit there: the victims
    the scheduler's preemption (preemption.py, one search) picks when every lower-priority pod may
    go. Eviction protection, namespaces and budgets are the scheduler's to judge; its
    "preemption: ..." note says which of them kept it from acting."""
    nodes = [n for n, status in per_node.items() if not status.ok and status.code is Code.UNSCHEDULABLE]
    if not nodes:
        return None
    found = alloc.preemption.best(req, req.priority, _every_lower, nodes=nodes)
    entry = alloc.node_entry(found.node) if found is not None else None
    if found is None or entry is None:
        return None
    pods = tuple(sorted(entry.workers[uid] for uid in found.local if uid in entry.workers))
    return Suggestion(PREEMPT, f"{len(pods)} lower-priority pod(s) leaving {found.node} would free room: "
                               f"{', '.join(pods)}", {}, target="pods", pods=pods, node=found.node)


def _every_lower(uid: str) -> VictimFacts:
    """Every lower-priority allocation may go, alone (the search compares priorities itself)."""
    return VictimFacts()
