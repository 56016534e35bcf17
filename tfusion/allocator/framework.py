"""The allocator as scheduler plugins: PreFilter, Filter, Score, Reserve/Unreserve, PreBind, Explain.

Why it exists: the built-in scheduler and the kube-scheduler extender take the same GPU decisions,
and every "no" must say why in numbers. Both call these extension points, in kube-scheduler's order:

    fw = Framework(allocator)                        # cheap; holds no state of its own
    status = fw.pre_filter(req)                      # quota, pool has GPUs        -> Status
    nodes = fw.feasible(req, candidates)             # Filter's Success set only (the built-in scheduler)
    feasible, failed = fw.split(req, candidates)     # or fw.filter(req, candidates): node -> Status
    scores = fw.score(req, feasible)                 # node -> 0..100 (extender: score * 10 // 100)
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

from collections.abc import Container, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from enum import StrEnum

from tfusion.allocator import filters
from tfusion.allocator.allocator import NODE_INDEX_LOCK, GpuAllocator, Placement
from tfusion.allocator.errors import AllocatorError, InvalidAllocation, QuotaExceeded, Unschedulable
from tfusion.allocator.request import AllocRequest
from tfusion.allocator.units import amount, percent_str, tflops_str, vram_str

# extension points, the values of Status.stage
PRE_FILTER = "PreFilter"
FILTER = "Filter"
SCORE = "Score"
RESERVE = "Reserve"
PRE_BIND = "PreBind"

# number-free reason texts (Reason.message): equal across nodes, so a kube-style message can count them
NO_POOL_GPUS = "pool has no GPUs"
NO_GROUP_GPUS = "node has no GPU of the requested pool"
NO_MODEL_GPUS = "node has no GPU of the requested model"
NO_FIT = "no GPU on the node fits the request"
QUOTA_EXCEEDED = "GPU quota exceeded"
TOO_MANY_WORKERS = "too many GPU workers on the node"
TOO_FEW_GPUS = "too few fitting GPUs on the node"
VRAM_TOO_SMALL = "GPU VRAM too small"
TFLOPS_TOO_SMALL = "GPU TFLOPS too small"
HELD_WHOLE = "GPU held whole by a shared pod"
NOT_IDLE = "GPU not idle for shared isolation"
NOT_RUNNING = "GPU not Running"
OTHER_USER = "GPU used by another device plugin"
POLICY = "GPU isolation policy not supported"
MODE_MISMATCH = "GPU isolation mode mismatch"
INDEX_MISMATCH = "GPU index not requested"
NO_MODE_SUPPORT = "GPU does not support the isolation mode"
PARTITIONED = "partitioned isolation not supported"
MODEL_MISMATCH = "GPU model mismatch"
VENDOR_MISMATCH = "GPU vendor mismatch"
INDEX_BUSY = "pod index held by another pod on the node"
MAX_WORKERS_DETAIL = "node {node} has {workers} workers, limit {limit}"

#: per-GPU reasons that a change of load (a pod leaving) can cure; the others are static mismatches
RESOLVABLE = frozenset({VRAM_TOO_SMALL, TFLOPS_TOO_SMALL, HELD_WHOLE, NOT_IDLE})


class Code(StrEnum):
    """kube-scheduler's status codes. UNRESOLVABLE: no eviction or load change on that node can help."""

    SUCCESS = "Success"
    UNSCHEDULABLE = "Unschedulable"
    UNRESOLVABLE = "UnschedulableAndUnresolvable"
    ERROR = "Error"


class Reason:
    """One "no", with numbers.

    `message` is short and number-free (e.g. "GPU VRAM too small"; the constants of this module), so
    equal reasons on many nodes can be counted. `stage` is the filter stage that said no
    (ResourceFilter, QuotaCheck, SameNodeFilter, MaxWorkerPerNode, GPUModelFilter, NodeIndexLock,
    ...); `node` and `gpu` where it applies (for a per-GPU reason: the GPU closest to fitting, and
    `gpus` says how many GPUs of the node share the reason); `resource` what was short ("vram" bytes,
    "tflops" milli-TFLOPS, "gpus", "workers", "index", or a quota limit such as
    "total.max.vram.request") with `requested` vs `available` in those units (for "vram"/"tflops":
    what is free on `gpu`, the GPU with this reason closest to fitting; for "gpus": how many GPUs
    fit). `detail` is the human sentence with the numbers; never empty: when none was given it is
    built from the fields on first read (`text()`), because building it for every failing node of
    a large cluster would cost more than judging the nodes.

    Compared and hashed by value. Treat it as immutable: it is a plain slotted class rather than a
    frozen dataclass because an explanation builds one per failing node, and a frozen dataclass
    costs several times as much to construct.
    """

    __slots__ = ("_detail", "available", "gpu", "gpus", "message", "node", "requested", "resource", "stage")

    message: str
    stage: str
    node: str | None
    gpu: str | None
    resource: str | None
    requested: int | None
    available: int | None
    gpus: int
    _detail: str

    def __init__(self, message: str, stage: str, node: str | None = None, gpu: str | None = None,
                 resource: str | None = None, requested: int | None = None, available: int | None = None,
                 detail: str = "", gpus: int = 1) -> None:
        self.message = message
        self.stage = stage
        self.node = node
        self.gpu = gpu
        self.resource = resource
        self.requested = requested
        self.available = available
        self._detail = detail
        self.gpus = gpus

    def _key(self) -> tuple[object, ...]:
        return (self.message, self.stage, self.node, self.gpu, self.resource, self.requested, self.available,
                self._detail, self.gpus)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Reason) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in zip(
            ("message", "stage", "node", "gpu", "resource", "requested", "available", "detail", "gpus"),
            self._key(), strict=True))
        return f"Reason({fields})"

    @property
    def detail(self) -> str:
        """The sentence with the numbers: the one given, else `text()`."""
        return self._detail or self.text()

    def replace(self, **changes: object) -> Reason:
        """A copy with some fields changed (`dataclasses.replace` for this class)."""
        values: dict[str, object] = dict(zip(
            ("message", "stage", "node", "gpu", "resource", "requested", "available", "detail", "gpus"),
            self._key(), strict=True))
        values.update(changes)
        return Reason(**values)  # type: ignore[arg-type]

    def text(self) -> str:
        """The human sentence: the given detail when set, else built from the numbers."""
        if self._detail:
            return self._detail
        where = self.node or self.gpu or ""
        if self.resource in ("vram", "tflops") and self.requested is not None and self.available is not None:
            fmt = vram_str if self.resource == "vram" else tflops_str
            name = "VRAM" if self.resource == "vram" else "TFLOPS"
            lead = self.gpu or where
            more = f" (the most free of the node's {self.gpus} GPUs short of {name})" if self.gpus > 1 else ""
            return (f"{lead}: {name} available {fmt(max(0, self.available))} < requested "
                    f"{fmt(self.requested)}{more}")
        if self.resource and self.requested is not None and self.available is not None:
            lead = f"{where}: " if where else ""
            return (f"{lead}{self.message}: {self.resource} requested {amount(self.resource, self.requested)}, "
                    f"available {amount(self.resource, self.available)}")
        return f"{where}: {self.message}" if where else self.message


class Status:
    """The answer of one extension point: a code, the extension point (`stage`) and the reasons.

    `ok` (code is Success) is a plain attribute, cheap to test for hundreds of nodes. Compared and
    hashed by (code, stage, reasons); treat it as immutable (a plain slotted class for the same
    reason as Reason).
    """

    __slots__ = ("code", "ok", "reasons", "stage")

    def __init__(self, code: Code, stage: str = "", reasons: tuple[Reason, ...] = ()) -> None:
        self.code = code
        self.stage = stage
        self.reasons = reasons
        self.ok = code is Code.SUCCESS

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Status) and (self.code, self.stage, self.reasons) == \
            (other.code, other.stage, other.reasons)

    def __hash__(self) -> int:
        return hash((self.code, self.stage, self.reasons))

    def __repr__(self) -> str:
        return f"Status(code={self.code!r}, stage={self.stage!r}, reasons={self.reasons!r})"

    def with_stage(self, stage: str) -> Status:
        """The same answer from another extension point."""
        return Status(self.code, stage, self.reasons)

    @property
    def resolvable(self) -> bool:
        """False for UnschedulableAndUnresolvable (the extender's FailedAndUnresolvableNodes)."""
        return self.code is not Code.UNRESOLVABLE

    def messages(self) -> tuple[str, ...]:
        """The distinct reason messages, in order (what a kube-style summary counts once per node)."""
        return tuple(dict.fromkeys(r.message for r in self.reasons))

    def summary(self) -> str:
        """kube-style one line: the distinct reason messages joined by ", " (e.g. "GPU VRAM too small");
        the code when there are no reasons."""
        return ", ".join(self.messages()) or str(self.code)

    def details(self) -> str:
        """Every reason's sentence with its numbers (`Reason.text`), joined by "; "."""
        return "; ".join(r.text() for r in self.reasons)


SUCCESS = Status(Code.SUCCESS)


def error(stage: str, message: str, **fields: str | int | None) -> Status:
    """An Error status with one reason (a caller's mistake or a broken invariant, not a "no")."""
    return Status(Code.ERROR, stage, (Reason(message, stage, detail=message, **fields),))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Suggestion:
    """A change that would make the pod fit now (each one checked against the current state).

    kind: "smaller-request" (the largest amount or GPU count that fits now), "other-model",
    "other-pool", "quota" (the headroom that is missing), "preempt-lower-qos" (lower-QoS pods whose
    departure frees the room). `target` says what `changes` applies to: "annotations" (pod annotation
    key -> new value; "" means remove the annotation), "quota" (the namespace's GPUResourceQuota:
    spec field path such as "spec.total.requests.vram" -> new value) or "pods" (no changes: delete
    the pods in `pods`, "namespace/name"). `node` is where it would then go, when known.
    """

    kind: str
    message: str
    changes: Mapping[str, str] = field(default_factory=dict)
    target: str = "annotations"
    pods: tuple[str, ...] = ()
    node: str | None = None


@dataclass(frozen=True)
class Explanation:
    """Why a pod fits nowhere: the PreFilter status, each node's Status and what would make it fit.

    `nodes` holds a Status per node looked at (Success for nodes where it fits). A caller with its own
    node checks (taints, CPU, ...) merges them with `dataclasses.replace(expl, nodes=merged)` before
    calling `message`.
    """

    nodes: Mapping[str, Status]
    suggestions: tuple[Suggestion, ...] = ()
    pre_filter: Status = SUCCESS

    @property
    def feasible(self) -> list[str]:
        return [n for n, s in self.nodes.items() if s.ok]

    def message(self, total_nodes: int) -> str:
        """kube-style: "0/5 nodes are available: 2 GPU TFLOPS too small, 3 GPU VRAM too small."

        Each failing node counts once per distinct reason message; the counted reasons are sorted as
        text, as kube-scheduler's FitError does. A PreFilter failure is the whole message.
        """
        if not self.pre_filter.ok:
            return f"0/{total_nodes} nodes are available: {self.pre_filter.summary()}."
        counts: dict[str, int] = {}
        ok = 0
        for status in self.nodes.values():
            if status.ok:
                ok += 1
                continue
            for text in status.messages() or (str(status.code),):
                counts[text] = counts.get(text, 0) + 1
        if not counts:
            return f"{ok}/{total_nodes} nodes are available."
        histogram = sorted(f"{n} {text}" for text, n in counts.items())
        return f"{ok}/{total_nodes} nodes are available: {', '.join(histogram)}."


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
            alloc._quota_precheck(req)
        except QuotaExceeded as exc:
            return quota_status(exc, PRE_FILTER)
        if req.pool not in alloc._pools:
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
        no_fit, no_group = _no_fit(req), _no_group(req)
        out = {n: SUCCESS if n in fits else no_fit if n in members else no_group for n in nodes}
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
        no_fit, no_group = _no_fit(req), _no_group(req)
        failed = {n: no_fit if n in members else no_group for n in names if n not in fits}
        for name in busy:
            if name in fits and name not in failed and name in names:
                failed[name] = self.index_status(req, name)
        if explain:
            self._explain_failed(req, failed)
        return feasible, failed

    def _sets(self, req: AllocRequest) -> tuple[AbstractSet[str], AbstractSet[str]]:
        """(nodes where `req` fits now, nodes holding GPUs of its pool and model)."""
        alloc = self.allocator
        if req.pool not in alloc._pools:
            return frozenset(), frozenset()
        members = alloc._group_index((req.pool, req.gpu_model)).scores.keys()
        return alloc.feasible_nodes(req), members

    def node_status(self, req: AllocRequest, node: str, *, stage: str = FILTER) -> Status:
        """The full Status of one node for `req` (Success or every reason with numbers)."""
        return _explain.explain_node(self.allocator, req, node, stage)

    # ------------------------------------------------------------------ Score

    def score(self, req: AllocRequest, nodes: Iterable[str]) -> dict[str, int]:
        """Node score 0..100 under the pool's placement mode (higher is better; 0 for a node without
        GPUs of the pool). It does not depend on the request's size, only on the nodes' load. Map it
        to a consumer's range in the caller (the extender: `score * 10 // 100`, 0..10)."""
        alloc = self.allocator
        if req.pool not in alloc._pools:
            return dict.fromkeys(nodes, 0)
        get = alloc._group_index((req.pool, req.gpu_model)).scores.get
        return {n: get(n, 0) for n in nodes}

    # ------------------------------------------------------------------ Reserve / Unreserve

    def reserve(self, req: AllocRequest, node: str, *, now: float | None = None) -> tuple[Placement | None, Status]:
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
        node_statuses, suggestions = _explain.node_statuses, _explain.suggestions
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


class _NoFitReason(Reason):
    """NO_FIT for one request, shared by every failing node of a cheap filter: its sentence names
    the request's numbers (built on first read, so a filter that is not explained pays nothing)."""

    __slots__ = ("_req",)

    _req: AllocRequest

    def __init__(self, req: AllocRequest) -> None:
        super().__init__(NO_FIT, FILTER)
        self._req = req

    def _key(self) -> tuple[object, ...]:
        return (*super()._key(), self._req)

    def text(self) -> str:
        if self._detail:
            return self._detail
        req = self._req
        if req.tflops_request or not req.percent_request:
            compute = f"{tflops_str(req.tflops_request)} TFLOPS"
        else:
            compute = f"{percent_str(req.percent_request)}% compute"
        return (f"no {req.count} GPU(s) on the node have {compute} and {vram_str(req.vram_request)} VRAM free "
                f"each (pool {req.pool}{', model ' + req.gpu_model if req.gpu_model else ''})")


def _no_fit(req: AllocRequest) -> Status:
    return Status(Code.UNSCHEDULABLE, FILTER, (_NoFitReason(req),))


def _no_group(req: AllocRequest) -> Status:
    if req.gpu_model:
        return Status(Code.UNRESOLVABLE, FILTER, (Reason(
            NO_MODEL_GPUS, "GPUModelFilter", detail=f"no {req.gpu_model} GPU of pool {req.pool}"),))
    return Status(Code.UNRESOLVABLE, FILTER, (Reason(NO_GROUP_GPUS, FILTER, detail=f"no GPU of pool {req.pool}"),))


def quota_status(exc: QuotaExceeded, stage: str) -> Status:
    """A quota refusal as a Status: single.* limits Unresolvable, totals Unschedulable."""
    code = Code.UNRESOLVABLE if exc.unresolvable else Code.UNSCHEDULABLE
    return Status(code, stage, (Reason(QUOTA_EXCEEDED, filters.QUOTA, resource=exc.resource,
                                       requested=exc.requested, available=max(0, exc.limit - exc.used),
                                       detail=exc.message),))


# explain.py builds on this module's names; imported here, at the end, so that the first explanation
# does not pay for importing it (it is compiled afresh where no bytecode is written)
from tfusion.allocator import explain as _explain  # noqa: E402

__all__ = [
    "FILTER", "PRE_BIND", "PRE_FILTER", "RESERVE", "SCORE", "SUCCESS", "Code", "Explanation", "Framework",
    "Reason", "Status", "Suggestion", "quota_status",
]
