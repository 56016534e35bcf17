"""The allocation ledger: who holds what on which GPU, what each namespace uses, what status is stale.

Why it exists: every number the allocator reports (a GPU's available TFLOPS and VRAM, a namespace's
quota usage, the GPUs whose status must be rewritten) follows from one record per pod, so the
record and the sums it feeds are kept together and changed together. A GPU's used TFLOPS and VRAM
is the sum of the request charges of its live allocations, assumed and committed (a compute-percent
request is charged percent x capacity / 100 on that GPU); available = capacity - used, never below
0, and 0 while a shared allocation holds the GPU whole. Quota usage per namespace is the sum of the
live allocations' request and limit charges and one worker each, kept apart for assumed and
committed ones (status shows committed only). A pod holds at most one allocation, all of its GPUs
on one node. A GPU that leaves keeps its charges aside (`detached`) until it returns. A partitioned
allocation (partitions.py) also records, per GPU, its partition (template, slots, isolation group),
charged at its template's size and freed slot for slot.

The ledger does not decide: the facade (allocator.py) validates a change, then asks the ledger to
record it, and the ledger asks the indexes (indexes.py) to re-rank the node it touched.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from tfusion.allocator import isolation
from tfusion.allocator.indexes import GpuIndexes
from tfusion.allocator.indexlock import NodeIndexLock
from tfusion.allocator.partitions import Partition, template_by_id, usage
from tfusion.allocator.quota import QuotaSpec, Usage, check_single, check_total
from tfusion.allocator.request import AllocRequest
from tfusion.allocator.state import GpuSlot
from tfusion.api import annotations as tfa

RELEASED_MEMORY = 100_000  # released pod UIDs remembered, so a late bind cannot resurrect them

Charges = tuple[tuple[int, int], ...]  # per GPU (milli-TFLOPS, bytes)
Parts = tuple[Partition | None, ...]  # per GPU, the hardware partition held there (partitioned isolation)


@dataclass(frozen=True, slots=True)
class AllocationInfo:
    """A live allocation as readers see it (views, recovery checks, the hypervisor)."""

    request: AllocRequest
    node: str
    gpu_names: tuple[str, ...]
    assumed: bool
    charges: Charges  # per GPU request (milli-TFLOPS, bytes) taken
    limits: Charges  # per GPU limit (milli-TFLOPS, bytes)
    partitions: Parts = ()  # per GPU, the partition (template, slots, group); () when not partitioned


class Allocation:
    """The ledger's mutable record of one pod's allocation; `assumed_at` is None once committed."""

    __slots__ = ("assumed_at", "charges", "gpus", "limits", "node", "parts", "req", "shared", "usage")

    def __init__(self, req: AllocRequest, node: str, gpus: tuple[str, ...], charges: Charges, limits: Charges,
                 assumed_at: float | None, parts: Parts = ()) -> None:
        self.req = req
        self.node = node
        self.gpus = gpus
        self.charges = charges
        self.limits = limits
        self.shared = req.isolation == tfa.ISOLATION_SHARED
        self.assumed_at = assumed_at
        self.usage = usage_of(charges, limits)
        self.parts = parts

    def info(self) -> AllocationInfo:
        return AllocationInfo(self.req, self.node, self.gpus, self.assumed_at is not None, self.charges,
                              self.limits, self.parts)

    def part_on(self, index: int) -> Partition | None:
        return self.parts[index] if self.parts else None


def charge_slot(slot: GpuSlot, uid: str, charge: tuple[int, int], shared: bool) -> None:
    """Record `uid`'s charge on `slot`: a shared (whole-GPU) allocation owns it, others add up."""
    slot.allocs[uid] = charge
    if shared:
        slot.shared_by = uid
    else:
        slot.used_t += charge[0]
        slot.used_v += charge[1]


def usage_of(charges: Sequence[tuple[int, int]], limits: Sequence[tuple[int, int]]) -> Usage:
    return Usage(sum(c[0] for c in charges), sum(c[1] for c in charges),
                 sum(lim[0] for lim in limits), sum(lim[1] for lim in limits), 1)


def charges_on(req: AllocRequest, capacities: Sequence[int]) -> tuple[Charges, Charges]:
    """(request charges, limit charges) of `req` on GPUs of these TFLOPS capacities."""
    charges = tuple((req.tflops_need(c), req.vram_request) for c in capacities)
    limits = tuple((req.tflops_limit_on(c), req.vram_limit) for c in capacities)
    return charges, limits


class Ledger:
    """Allocations by pod, charges per GPU, usage per namespace, quotas and the status work lists."""

    def __init__(self, indexes: GpuIndexes, index_lock: NodeIndexLock) -> None:
        self.indexes = indexes
        self.index_lock = index_lock
        self.allocs: dict[str, Allocation] = {}
        self.assumed: dict[str, float] = {}  # uid -> assumed at, oldest first
        self.detached: dict[str, dict[str, tuple[int, int]]] = {}  # removed GPU -> its charges
        self.quota: dict[str, QuotaSpec] = {}
        self.used: dict[str, Usage] = {}  # committed, per namespace
        self.assumed_used: dict[str, Usage] = {}
        self.dirty: set[str] = set()  # GPUs whose status must be written
        self.dirty_quota: set[str] = set()  # namespaces whose quota status must be written
        self.released: OrderedDict[str, None] = OrderedDict()
        self.priority_live: dict[int, int] = {}  # live allocations per priority (preemption's quick exit)

    # ------------------------------------------------------------------ quota

    def set_quota(self, namespace: str, spec: QuotaSpec) -> None:
        self.quota[namespace] = spec
        self.dirty_quota.add(namespace)

    def remove_quota(self, namespace: str) -> None:
        self.quota.pop(namespace, None)
        self.dirty_quota.discard(namespace)

    def usage_bucket(self, alloc: Allocation) -> Usage:
        ns = alloc.req.namespace
        store = self.used if alloc.assumed_at is None else self.assumed_used
        bucket = store.get(ns)
        if bucket is None:
            bucket = store[ns] = Usage()
        return bucket

    def effective_usage(self, namespace: str) -> Usage:
        """Committed plus assumed usage of the namespace (a new copy)."""
        return (self.used.get(namespace) or Usage()).plus(self.assumed_used.get(namespace) or Usage())

    def quota_precheck(self, req: AllocRequest) -> None:
        """Raise QuotaExceeded when the namespace quota cannot admit `req` whatever GPUs it gets."""
        spec = self.quota.get(req.namespace)
        if spec is None:
            return
        # compute-percent TFLOPS are known only once GPUs are chosen: checked exactly in assume
        per_gpu = Usage(req.tflops_request, req.vram_request, req.tflops_limit, req.vram_limit, 1)
        check_single(req.namespace, spec, per_gpu, req.count)
        charge = Usage(req.tflops_request * req.count, req.vram_request * req.count,
                       req.tflops_limit * req.count, req.vram_limit * req.count, 1)
        check_total(req.namespace, spec, self.effective_usage(req.namespace), charge)

    def quota_exact(self, req: AllocRequest, charges: Sequence[tuple[int, int]],
                    limits: Sequence[tuple[int, int]], *, replacing: Allocation | None = None) -> None:
        """Raise QuotaExceeded when these exact charges (instead of `replacing`'s) break the quota."""
        spec = self.quota.get(req.namespace)
        if spec is None:
            return
        per_gpu = Usage(max((c[0] for c in charges), default=0), req.vram_request,
                        max((lim[0] for lim in limits), default=0), req.vram_limit, 1)
        check_single(req.namespace, spec, per_gpu, req.count)
        charge = usage_of(charges, limits)
        used = self.effective_usage(req.namespace)
        if replacing is not None:
            charge.add(replacing.usage, -1)
            charge.workers = 0
        check_total(req.namespace, spec, used, charge)

    # ------------------------------------------------------------------ questions the records answer

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
        alloc = self.allocs.get(uid)
        return f"{alloc.req.namespace}/{alloc.req.pod_name}" if alloc is not None else uid

    def restore_problem(self, req: AllocRequest, names: tuple[str, ...], known: Sequence[GpuSlot]) -> str:
        """Why a running pod's allocation on `names` (`known`: those of its GPUs that exist) cannot
        be recorded again, or "": no UID, already held, an empty or repeated list, no known GPU,
        GPUs on several nodes."""
        if not req.pod_uid:
            return "no pod UID"
        if req.pod_uid in self.allocs:
            return "pod already holds an allocation"
        if not names or len(set(names)) != len(names):
            return f"GPU list {list(names)} is empty or repeats a GPU"
        if not known:
            return f"none of the GPUs {list(names)} is known"
        if len({s.node for s in known}) != 1:
            return f"GPUs {list(names)} are on several nodes"
        return ""

    # ------------------------------------------------------------------ recording

    def apply(self, alloc: Allocation, *, rescore: bool = True) -> None:
        """Charge a validated allocation on its GPUs, node, index lock and namespace. Without
        `rescore` the node keeps its old scores and place in the group indexes until the caller
        rescores it (`restore` rescores each node once, after all its allocations)."""
        uid = alloc.req.pod_uid
        gpus = self.indexes.gpus
        for i, (name, charge) in enumerate(zip(alloc.gpus, alloc.charges, strict=True)):
            slot = gpus.get(name)
            if slot is None:
                self.detached.setdefault(name, {})[uid] = charge
                continue
            charge_slot(slot, uid, charge, alloc.shared)
            part = alloc.part_on(i)
            if part is not None:
                slot.parts[uid] = part
            slot.refresh()
        node = self.indexes.node(alloc.node)
        node.workers[uid] = f"{alloc.req.namespace}/{alloc.req.pod_name}"
        if alloc.req.pod_index:
            self.index_lock.occupy(alloc.node, alloc.req.pod_index, uid)
        self.priority_live[alloc.req.priority] = self.priority_live.get(alloc.req.priority, 0) + 1
        self.allocs[uid] = alloc
        if alloc.assumed_at is not None:
            self.assumed[uid] = alloc.assumed_at
        self.usage_bucket(alloc).add(alloc.usage)
        self.settle_modes(alloc)
        self.touch(alloc, rescore=rescore)

    def unapply(self, alloc: Allocation) -> None:
        """Undo `apply` (forget, rollback, release, expiry)."""
        uid = alloc.req.pod_uid
        gpus = self.indexes.gpus
        for name in alloc.gpus:
            slot = gpus.get(name)
            if slot is None:
                detached = self.detached.get(name)
                if detached is not None:
                    detached.pop(uid, None)
                    if not detached:
                        del self.detached[name]
                continue
            charge = slot.allocs.pop(uid)
            slot.parts.pop(uid, None)
            if slot.shared_by == uid:
                slot.shared_by = None
            elif not alloc.shared:
                slot.used_t -= charge[0]
                slot.used_v -= charge[1]
            slot.refresh()
        node = self.indexes.nodes[alloc.node]
        del node.workers[uid]
        if alloc.req.pod_index:
            self.index_lock.release(alloc.node, alloc.req.pod_index, uid)
        left = self.priority_live[alloc.req.priority] - 1
        if left:
            self.priority_live[alloc.req.priority] = left
        else:
            del self.priority_live[alloc.req.priority]
        del self.allocs[uid]
        self.assumed.pop(uid, None)
        self.usage_bucket(alloc).add(alloc.usage, -1)
        self.settle_modes(alloc)
        self.touch(alloc)
        self.indexes.drop_node_if_empty(node)

    def settle_modes(self, alloc: Allocation) -> None:
        """Under the dynamic isolation policy, re-derive the active mode of the allocation's GPUs."""
        gpus = self.indexes.gpus
        for name in alloc.gpus:
            slot = gpus.get(name)
            if slot is not None and slot.dynamic:
                isolation.settle(slot, self.allocs)

    def touch(self, alloc: Allocation, *, rescore: bool = True) -> None:
        """Re-score the allocation's node (with `rescore`) and mark what status must be rewritten."""
        if alloc.assumed_at is None:
            self.dirty.update(n for n in alloc.gpus if n in self.indexes.gpus)
            self.dirty_quota.add(alloc.req.namespace)
        if rescore:
            self.rescore(alloc.node)

    def rescore(self, node_name: str) -> None:
        """Re-score a node and move it in the group indexes (after its GPUs' load changed)."""
        node = self.indexes.nodes.get(node_name)
        if node is not None and node.gpus:
            self.indexes.rescore(node)

    def commit(self, alloc: Allocation) -> None:
        """Make an assumed allocation permanent."""
        self.usage_bucket(alloc).add(alloc.usage, -1)
        alloc.assumed_at = None
        del self.assumed[alloc.req.pod_uid]
        self.usage_bucket(alloc).add(alloc.usage)
        self.dirty.update(n for n in alloc.gpus if n in self.indexes.gpus)
        self.dirty_quota.add(alloc.req.namespace)

    def remember_released(self, pod_uid: str) -> None:
        self.released[pod_uid] = None
        if len(self.released) > RELEASED_MEMORY:
            self.released.popitem(last=False)

    def resize(self, alloc: Allocation, req: AllocRequest, charges: Charges, limits: Charges) -> None:
        """Replace a live allocation's request and charges (checks done by the caller)."""
        uid = alloc.req.pod_uid
        old_usage = alloc.usage
        bucket = self.usage_bucket(alloc)
        gpus = self.indexes.gpus
        for i, name in enumerate(alloc.gpus):
            slot = gpus.get(name)
            if slot is None:
                self.detached[name][uid] = charges[i]
                continue
            old = slot.allocs[uid]
            slot.allocs[uid] = charges[i]
            if not alloc.shared:
                slot.used_t += charges[i][0] - old[0]
                slot.used_v += charges[i][1] - old[1]
            slot.refresh()
        alloc.req = req
        alloc.charges, alloc.limits = charges, limits
        alloc.usage = usage_of(charges, limits)
        bucket.add(old_usage, -1)
        bucket.add(alloc.usage)
        self.touch(alloc)

    # ------------------------------------------------------------------ GPUs coming and going

    def reattach(self, slot: GpuSlot) -> None:
        """Charge a (re)appearing GPU with the allocations that held it while it was gone."""
        charges = self.detached.pop(slot.name, None)
        if not charges:
            return
        for uid, charge in charges.items():
            alloc = self.allocs.get(uid)
            if alloc is not None:
                charge_slot(slot, uid, charge, alloc.shared)
                part = alloc.part_on(alloc.gpus.index(slot.name))
                if part is not None:
                    slot.parts[uid] = part
        if slot.dynamic:
            isolation.settle(slot, self.allocs)
        slot.refresh()
        self.recharge_percent(slot)

    def detach(self, slot: GpuSlot) -> None:
        """Keep a leaving GPU's charges aside: their pods still run, and the GPU may return."""
        if slot.allocs:
            self.detached[slot.name] = dict(slot.allocs)
        self.dirty.discard(slot.name)

    def recharge_percent(self, slot: GpuSlot) -> None:
        """Re-derive compute-percent charges on `slot` from its current capacity."""
        cap = slot.info.capacity_tflops
        for uid in list(slot.allocs):
            alloc = self.allocs.get(uid)
            if alloc is None or not (alloc.parts or alloc.req.percent_request or alloc.req.percent_limit):
                continue
            i = alloc.gpus.index(slot.name)
            part = alloc.part_on(i)
            template = template_by_id(slot.templates, part.template_id) if part is not None else None
            if template is not None:  # a partition takes its template's share of the new capacity
                self._change_charge(alloc, i, slot, usage(template, cap), usage(template, cap))
                continue
            new_charge = (alloc.req.tflops_need(cap), alloc.charges[i][1])
            new_limit = (alloc.req.tflops_limit_on(cap), alloc.limits[i][1])
            self._change_charge(alloc, i, slot, new_charge, new_limit)

    def _change_charge(self, alloc: Allocation, i: int, slot: GpuSlot, charge: tuple[int, int],
                       limit: tuple[int, int]) -> None:
        uid = alloc.req.pod_uid
        old_usage = alloc.usage
        if not alloc.shared:
            old = slot.allocs[uid]
            slot.used_t += charge[0] - old[0]
            slot.used_v += charge[1] - old[1]
            slot.allocs[uid] = charge
            slot.refresh()
        else:
            slot.allocs[uid] = charge
        alloc.charges = (*alloc.charges[:i], charge, *alloc.charges[i + 1:])
        alloc.limits = (*alloc.limits[:i], limit, *alloc.limits[i + 1:])
        alloc.usage = usage_of(alloc.charges, alloc.limits)
        bucket = self.usage_bucket(alloc)
        bucket.add(old_usage, -1)
        bucket.add(alloc.usage)
        if alloc.assumed_at is None:
            self.dirty_quota.add(alloc.req.namespace)
            self.dirty.add(alloc.gpus[i])
