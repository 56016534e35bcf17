"""The vocabulary of the scheduler plugins' answers: Status, Reason, Suggestion, Explanation, codes.

Why it exists: the extension points (framework.py), the per-node judgement (explain.py), the
suggestions (suggest.py) and every renderer outside the allocator speak in these values, so they
live below all of them. Status, Reason and Explanation are values, never changed once built (Status
and Reason are plain slotted classes, not frozen dataclasses, because an explanation builds one per
failing node); the Success status is the one `SUCCESS` object. Every Reason has a `detail` sentence
with its numbers. Units everywhere: milli-TFLOPS, bytes, milli-percent, counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from tfusion.allocator.errors import QuotaExceeded
from tfusion.allocator.isolation import ACTIVE_MODE_MISMATCH as ACTIVE_MODE_MISMATCH
from tfusion.allocator.isolation import DYNAMIC_PARTITIONED as DYNAMIC_PARTITIONED
from tfusion.allocator.isolation import MODE_CONFLICT as MODE_CONFLICT
from tfusion.allocator.isolation import POLICY as POLICY
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
MODE_MISMATCH = "GPU isolation mode mismatch"
INDEX_MISMATCH = "GPU index not requested"
NO_MODE_SUPPORT = "GPU does not support the isolation mode"
PARTITIONED = "vendor cannot partition GPUs"
NO_TEMPLATES = "GPU model has no partition templates"
UNKNOWN_TEMPLATE = "unknown partition-id for the GPU model"
NO_TEMPLATE_FITS = "no partition template fits the request"
PARTITIONS_FULL = "GPU at its maxPartitions"
TEMPLATE_FULL = "partition template at its maxInstances"
NO_SLOT = "no free partition slot"
NO_GROUP = "no free isolation group"
PARTITION_SHORT = "too little free on the GPU for the partition"
NOT_PARTITIONED = "GPU holds non-partitioned allocations"
HOLDS_PARTITIONS = "GPU holds partitions"
MODEL_MISMATCH = "GPU model mismatch"
VENDOR_MISMATCH = "GPU vendor mismatch"
INDEX_BUSY = "pod index held by another pod on the node"
MAX_WORKERS_DETAIL = "node {node} has {workers} workers, limit {limit}"
#: GPUNetworkTopologyAware (hard mode): the tiers stay in the short text, so the pod's message shows them
TOPOLOGY_TIER = "best GPU set at topology tier {found}, at most {allowed} allowed"
TOPOLOGY_UNKNOWN = "GPU topology unknown"

#: per-GPU reasons that a change of load (a pod leaving) can cure; the others are static mismatches
RESOLVABLE = frozenset({VRAM_TOO_SMALL, TFLOPS_TOO_SMALL, HELD_WHOLE, NOT_IDLE, PARTITIONS_FULL, TEMPLATE_FULL,
                        NO_SLOT, NO_GROUP, PARTITION_SHORT, NOT_PARTITIONED,
                        HOLDS_PARTITIONS})


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
    departure frees the room), "looser-topology" (a gpu-topology-max-tier that fits). `target` says
    what `changes` applies to: "annotations" (pod annotation
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


class NoFitReason(Reason):
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


def no_fit(req: AllocRequest) -> Status:
    return Status(Code.UNSCHEDULABLE, FILTER, (NoFitReason(req),))


def no_group(req: AllocRequest) -> Status:
    if req.gpu_model:
        return Status(Code.UNRESOLVABLE, FILTER, (Reason(
            NO_MODEL_GPUS, "GPUModelFilter", detail=f"no {req.gpu_model} GPU of pool {req.pool}"),))
    return Status(Code.UNRESOLVABLE, FILTER, (Reason(NO_GROUP_GPUS, FILTER, detail=f"no GPU of pool {req.pool}"),))


def quota_status(exc: QuotaExceeded, stage: str) -> Status:
    """A quota refusal as a Status: single.* limits Unresolvable, totals Unschedulable."""
    from tfusion.allocator import filters  # at call time: filters -> partitions -> reasons at import

    code = Code.UNRESOLVABLE if exc.unresolvable else Code.UNSCHEDULABLE
    return Status(code, stage, (Reason(QUOTA_EXCEEDED, filters.QUOTA, resource=exc.resource,
                                       requested=exc.requested, available=max(0, exc.limit - exc.used),
                                       detail=exc.message),))
