"""The allocator as scheduler plugins: PreFilter, Filter, Score, Reserve/Unreserve, PreBind, Explain.

Why it exists: the built-in scheduler and the kube-scheduler extender take the same GPU decisions,
and every "no" must say why in numbers. Both call these extension points, in kube-scheduler's order:

    fw = Framework(allocator)                        # cheap; holds no state of its own
    status = fw.pre_filter(req)                      # quota, pool has GPUs        -> Status
    nodes = fw.feasible(req, candidates)             # Filter's Success set only (the built-in scheduler)
    feasible, failed = fw.split(req, candidates)     # or fw.filter(req, candidates): node -> Status
    scores = fw.score(req, feasible)                 # node -> 0..100 (extender: score * 10 // 100)
    for node in fw.ranked(req, candidates): ...      # Filter and Score at once: feasible nodes, best first
    placement, status = fw.reserve(req, best_node)   # assume that node's best GPUs
    ...patch the pod's annotations (placement.gpu_names), POST the Binding...
    fw.pre_bind(req.pod_uid)                         # commit; on any failure: fw.unreserve(uid)
    expl = fw.explain(req, candidates)               # nothing fits: per-node reasons + suggestions
    expl.message(total_nodes)                        # "0/5 nodes are available: 3 GPU VRAM too small."

Pure like the allocator under it: no I/O, no await, no JSON (rendering lives in
tfusion/controller/scheduling/explain.py and tfusion/controller/views.py). Each call is atomic for an
asyncio program. Units everywhere: milli-TFLOPS, bytes, milli-percent, counts. Status, Reason and
Explanation are values, never changed once built (Status and Reason are plain slotted classes,
not frozen dataclasses, because an explanation builds one per failing node); the Success status
is the one `SUCCESS` object. Every Reason has a `detail` sentence with its numbers.

The node-level pod index lock (indexlock.py) is part of Filter and Reserve: a node where another
pod holds the request's `pod_index` is Unschedulable there (reason INDEX_BUSY, stage NodeIndexLock).

Speed: Filter never looks at every GPU. The allocator keeps, per request shape (pool, model,
amounts, count, isolation, indices, vendor; the last 32 shapes), the set of nodes where that shape
fits, and re-judges only the nodes that changed since (GpuAllocator.feasible_nodes); Filter is one
pass of set lookups over the candidate names. Reasons with numbers are built only for failing nodes
and only when asked (`explain=True`, `explain()`), and kept per node and shape (the last 8 shapes)
until the node changes, so a pending pod explained again costs O(changed nodes); otherwise the failing
nodes share one Status per call (NO_FIT, its sentence naming the request's numbers). The first
explanation of a new shape judges a node whose GPUs are "plain" (Running, Static policy, no
isolation mode or capability list, one vendor and capacity) by two comparisons per GPU
(explain.py `_judge_plain`), the others stage by stage.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator
from collections.abc import Set as AbstractSet

from tfusion.allocator import explain as _explain
from tfusion.allocator import suggest as _suggest
from tfusion.allocator import topology
from tfusion.allocator.allocator import NODE_INDEX_LOCK, GpuAllocator, GpuPlacement
from tfusion.allocator.errors import AllocatorError, InvalidAllocation, QuotaExceeded, Unschedulable
from tfusion.allocator.reasons import (
    FILTER,
    HELD_WHOLE,
    INDEX_BUSY,
    INDEX_MISMATCH,
    MAX_WORKERS_DETAIL,
    MODE_MISMATCH,
    MODEL_MISMATCH,
    NO_FIT,
    NO_GROUP_GPUS,
    NO_MODE_SUPPORT,
    NO_MODEL_GPUS,
    NO_POOL_GPUS,
    NOT_IDLE,
    NOT_RUNNING,
    OTHER_USER,
    PARTITIONED,
    POLICY,
    PRE_BIND,
    PRE_FILTER,
    QUOTA_EXCEEDED,
    RESERVE,
    RESOLVABLE,
    SCORE,
    SUCCESS,
    TFLOPS_TOO_SMALL,
    TOO_FEW_GPUS,
    TOO_MANY_WORKERS,
    VENDOR_MISMATCH,
    VRAM_TOO_SMALL,
    Code,
    Explanation,
    Reason,
    Status,
    Suggestion,
    error,
    no_fit,
    no_group,
    quota_status,
)
from tfusion.allocator.request import AllocRequest


class Framework:
    """The extension points over one GpuAllocator (construct freely: it holds no state of its own)."""

    __slots__ = ("allocator",)

    def __init__(self, allocator: GpuAllocator) -> None:
        self.allocator = allocator

    # ------------------------------------------------------------------ PreFilter

    def pre_filter(self, req: AllocRequest) -> Status:
        """The checks that do not depend on a node: the namespace quota (assumed reservations
        included; a single.* limit is Unresolvable, a total is Unschedulable) and that the pool has
        GPUs (Unresolvable). Run it before `filter`, which does not repeat these checks."""
        alloc = self.allocator
        try:
            alloc.check_quota(req)
        except QuotaExceeded as exc:
            return quota_status(exc, PRE_FILTER)
        if not alloc.has_pool(req.pool):
            message = f"pool {req.pool} has no GPUs"
            return Status(Code.UNRESOLVABLE, PRE_FILTER, (Reason(NO_POOL_GPUS, PRE_FILTER, detail=message),))
        return SUCCESS

    # ------------------------------------------------------------------ Filter

    def filter(self, req: AllocRequest, nodes: Iterable[str], *, explain: bool = False) -> dict[str, Status]:
        """A Status per candidate node (in the order given, duplicates once): Success where `req` fits.

        Fits = the node holds at least `req.count` GPUs of the pool (and model) that pass every
        per-GPU stage, and is under the worker limit. Nodes without a GPU of the pool/model are
        Unresolvable. Other failing nodes get, without `explain`, one shared Unschedulable status
        (reason NO_FIT, no numbers: cheap); with `explain`, their real reasons with numbers and the
        right code (Unresolvable when no change of load can help, e.g. every GPU is of another
        vendor). Cost: one pass over the candidates plus O(GPUs of the nodes changed since the last
        call with this request shape); explain adds O(GPUs) per failing node. The quota is not
        checked here (pre_filter). Success statuses are the `SUCCESS` object, so `status.ok` or
        `status is SUCCESS` both work.
        """
        fits, members = self._sets(req)
        unfit, absent = no_fit(req), no_group(req)
        out = {n: SUCCESS if n in fits else unfit if n in members else absent for n in nodes}
        busy = self.allocator.index_lock.busy_nodes(req.pod_index, req.pod_uid)
        if busy:
            for name in busy:
                if out.get(name) is SUCCESS:
                    out[name] = self.index_status(req, name)
        if explain:
            self._explain_failed(req, out)
        return out

    def feasible(self, req: AllocRequest, nodes: Iterable[str] | Container[str]) -> list[str]:
        """The candidate nodes where `req` fits now: Filter's Success set without a Status per node
        (the built-in scheduler's and simulate's question; a Status for each of thousands of nodes
        per pod would cost more than the rest of a cycle). `nodes` is a list or tuple (the answer
        keeps its order), or any container of node names, e.g. the Node informer (the answer is then
        in no particular order). The node-level pod index lock is honoured; the quota is not
        checked (pre_filter)."""
        fits, _members = self._sets(req)
        busy = self.allocator.index_lock.busy_nodes(req.pod_index, req.pod_uid)
        if isinstance(nodes, (list, tuple)):
            if busy:
                return [n for n in nodes if n in fits and n not in busy]
            return [n for n in nodes if n in fits]
        if not isinstance(nodes, Container):
            wanted = set(nodes)
            return [n for n in fits if n in wanted and n not in busy]
        if busy:
            return [n for n in fits if n in nodes and n not in busy]
        return [n for n in fits if n in nodes]

    def index_status(self, req: AllocRequest, node: str, stage: str = FILTER) -> Status:
        """Unschedulable on `node` because another pod holds `req`'s pod index there (resolvable:
        the index frees when that pod leaves)."""
        detail = self.allocator.index_conflict(req, node)
        return Status(Code.UNSCHEDULABLE, stage, (Reason(INDEX_BUSY, NODE_INDEX_LOCK, node, resource="index",
                                                         requested=req.pod_index, detail=detail),))

    def _explain_failed(self, req: AllocRequest, statuses: dict[str, Status]) -> None:
        explain_node = _explain.explain_node
        alloc = self.allocator
        memo = alloc.explain_cache(req)
        for name, status in statuses.items():
            if not status.ok and not (status.reasons and status.reasons[0].message == INDEX_BUSY):
                statuses[name] = explain_node(alloc, req, name, FILTER, memo)

    def split(self, req: AllocRequest, nodes: Iterable[str], *,
              explain: bool = False) -> tuple[list[str], dict[str, Status]]:
        """`filter` in the shape an extender answers: (the nodes where `req` fits, in the order given;
        a Status for each other node). Cheaper than `filter` when most nodes fit: the failing nodes
        are looked at only when there are some."""
        names = nodes if isinstance(nodes, (list, tuple)) else list(nodes)
        fits, members = self._sets(req)
        busy = self.allocator.index_lock.busy_nodes(req.pod_index, req.pod_uid)
        feasible = [n for n in names if n in fits and n not in busy] if busy else [n for n in names if n in fits]
        if len(feasible) == len(names):
            return feasible, {}
        unfit, absent = no_fit(req), no_group(req)
        failed = {n: unfit if n in members else absent for n in names if n not in fits}
        for name in busy:
            if name in fits and name not in failed and name in names:
                failed[name] = self.index_status(req, name)
        if explain:
            self._explain_failed(req, failed)
        return feasible, failed

    def _sets(self, req: AllocRequest) -> tuple[AbstractSet[str], AbstractSet[str]]:
        """(nodes where `req` fits now, nodes holding GPUs of its pool and model)."""
        alloc = self.allocator
        if not alloc.has_pool(req.pool):
            return frozenset(), frozenset()
        members = alloc.group_index(req.pool, req.gpu_model).scores.keys()
        return alloc.feasible_nodes(req), members

    def node_status(self, req: AllocRequest, node: str, *, stage: str = FILTER) -> Status:
        """The full Status of one node for `req` (Success or every reason with numbers)."""
        return _explain.explain_node(self.allocator, req, node, stage)

    # ------------------------------------------------------------------ Score

    def score(self, req: AllocRequest, nodes: Iterable[str]) -> dict[str, int]:
        """Node score 0..100 under the pool's placement mode (higher is better; 0 for a node without
        GPUs of the pool). It does not depend on the request's size, only on the nodes' load, except
        for a multi-GPU request once GPUs report a topology: then the tier of the node's best GPU set
        comes first (topology.band_score: 25 points per tier, the load score within a band). Map it
        to a consumer's range in the caller (the extender: `score * 10 // 100`, 0..10)."""
        alloc = self.allocator
        if not alloc.has_pool(req.pool):
            return dict.fromkeys(nodes, 0)
        get = alloc.group_index(req.pool, req.gpu_model).scores.get
        if req.count > 1 and alloc.topology_reported():  # soft preference for better-joined GPU sets
            band, tier_of, worst = topology.band_score, alloc.best_tier, topology.TIER_UNKNOWN
            return {n: band(get(n, 0), worst if (t := tier_of(n, req)) is None else t) for n in nodes}
        return {n: get(n, 0) for n in nodes}

    def ranked(self, req: AllocRequest, nodes: Container[str]) -> Iterator[str]:
        """The candidate nodes where `req` fits now, best `score` first, ties by name: what sorting
        `score(req, feasible(req, nodes))` by (-score, name) gives, produced lazily. The built-in
        scheduler takes the first that passes its node checks, so this walks the pool's score
        buckets (already ordered, names sorted in each) and stops where the caller stops instead
        of scoring and sorting every feasible node per pod. When the topology bands the score (a
        multi-GPU request once GPUs report a topology) the order is computed in full. Stop
        iterating before changing the allocator (a successful `reserve` moves its node)."""
        fits, _members = self._sets(req)
        if not fits:
            return iter(())
        busy = self.allocator.index_lock.busy_nodes(req.pod_index, req.pod_uid)
        if req.count > 1 and self.allocator.topology_reported():
            feasible = [n for n in fits if n in nodes and n not in busy]
            scores = self.score(req, feasible)
            return iter(sorted(feasible, key=lambda n: (-scores[n], n)))
        return self._walk_buckets(req, fits, busy, nodes)

    def _walk_buckets(self, req: AllocRequest, fits: AbstractSet[str], busy: AbstractSet[str],
                      nodes: Container[str]) -> Iterator[str]:
        index = self.allocator.group_index(req.pool, req.gpu_model)
        for names in index.buckets:
            for name in names:
                if name in fits and name not in busy and name in nodes:
                    yield name

    # ------------------------------------------------------------------ Reserve / Unreserve

    def reserve(self, req: AllocRequest, node: str, *, now: float | None = None) -> tuple[GpuPlacement | None, Status]:
        """Assume `req` on `node`'s best GPUs (by the pool's GPU-level order). On success: the
        Placement (node, GPU names best first, node score) and Success; the reservation counts
        against GPUs and quota at once and expires after the allocator's assume TTL unless
        `pre_bind` commits it. On failure nothing changes: (None, Unschedulable/Unresolvable with
        that node's reasons, or quota's), or Error when the request itself is wrong (no pod UID,
        the pod already holds an allocation, the pod was released)."""
        alloc = self.allocator
        if not req.pod_uid:
            return None, error(RESERVE, "the request has no pod UID")
        held = alloc.allocation(req.pod_uid)
        if held is not None:
            return None, error(RESERVE, f"pod {req.namespace}/{req.pod_name} already holds an allocation on "
                                        f"node {held.node} ({', '.join(held.gpu_names)})", node=held.node)
        if alloc.index_conflict(req, node):
            return None, self.index_status(req, node, RESERVE)
        gpus = alloc.fitting_gpus(node, req)
        if gpus is None:
            return None, self.node_status(req, node, stage=RESERVE)
        try:
            return alloc.assume(req, gpus, now=now), SUCCESS
        except QuotaExceeded as exc:
            return None, quota_status(exc, RESERVE)
        except Unschedulable:
            return None, self.node_status(req, node, stage=RESERVE)
        except InvalidAllocation as exc:
            return None, error(RESERVE, str(exc), node=node)

    def unreserve(self, pod_uid: str) -> bool:
        """Roll back the pod's reservation, assumed or already committed by `pre_bind` (a Binding
        that failed afterwards). False when the pod holds nothing. The pod may be placed again."""
        return self.allocator.rollback(pod_uid)

    # ------------------------------------------------------------------ PreBind

    def pre_bind(self, pod_uid: str) -> Status:
        """Commit the pod's reservation (idempotent): it now shows in GPU and quota status and no
        longer expires. Error when the pod holds no reservation (it expired or was rolled back)."""
        try:
            self.allocator.commit(pod_uid)
        except AllocatorError as exc:
            return error(PRE_BIND, str(exc))
        return SUCCESS

    # ------------------------------------------------------------------ Explain

    def explain(self, req: AllocRequest, nodes: Iterable[str] | None = None) -> Explanation:
        """Why `req` does or does not fit: PreFilter's status, every node's Status with numbers
        (`nodes`, default every node holding GPUs) and the suggestions that would make it fit now
        (empty when it already fits on some node). Costs O(GPUs of the nodes), for failures only."""
        node_statuses, suggestions = _explain.node_statuses, _suggest.suggestions
        alloc = self.allocator
        pre = self.pre_filter(req)
        per_node: dict[str, Status] = {}
        if pre.ok:  # every node judged once (memoized per node version): no separate feasibility pass
            per_node = node_statuses(alloc, req, alloc.nodes() if nodes is None else nodes)
            for name in alloc.index_lock.busy_nodes(req.pod_index, req.pod_uid):
                if name in per_node and per_node[name].ok:
                    per_node[name] = self.index_status(req, name)
        fits = pre.ok and any(s.ok for s in per_node.values())
        return Explanation(per_node, () if fits else suggestions(self, req, pre, per_node), pre)


#: the vocabulary (reasons.py) is re-exported: scheduling code and tests import it from here
__all__ = [
    "FILTER", "HELD_WHOLE", "INDEX_BUSY", "INDEX_MISMATCH", "MAX_WORKERS_DETAIL", "MODEL_MISMATCH", "MODE_MISMATCH",
    "NOT_IDLE", "NOT_RUNNING", "NO_FIT", "NO_GROUP_GPUS", "NO_MODEL_GPUS", "NO_MODE_SUPPORT", "NO_POOL_GPUS",
    "OTHER_USER", "PARTITIONED", "POLICY", "PRE_BIND", "PRE_FILTER", "QUOTA_EXCEEDED", "RESERVE", "RESOLVABLE",
    "SCORE", "SUCCESS", "TFLOPS_TOO_SMALL", "TOO_FEW_GPUS", "TOO_MANY_WORKERS", "VENDOR_MISMATCH", "VRAM_TOO_SMALL",
    "Code", "Explanation", "Framework", "Reason", "Status", "Suggestion", "quota_status",
]
