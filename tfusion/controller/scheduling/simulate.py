"""`POST /api/simulate-schedule`: filter and score a Pod without reserving anything.

Pure: takes the allocator, the Pod manifest and the cached objects the pod webhook reads (`Sources`:
GPUPools, ProviderConfigs, the namespace's GPUResourceQuotas, WorkloadProfiles, GPU capacities),
returns (HTTP status, body). The pod first gets the annotations the pod webhook would give it,
decided by the resolver the webhook uses (tfusion/controller/defaults.py: WorkloadProfile, pool,
isolation, vendor, amounts with quota defaults, GPU count, model, QoS), so a raw manifest from
`kubectl get pod X -o yaml` is judged as the pod the webhook admits, and a manifest the webhook
would refuse for its GPU annotations is refused here with the webhook's words. The body keeps the
original's envelope `{scheduleResult, filterDetail, error, ...}` with its Go field names
(`SuggestedHost`, `FilterStageDetails`, `FilterName`, `Before`, `After`, `Diff`) and adds `Removed`
to each stage: every GPU the stage dropped, its node and why (e.g. `gpu-3f2a: VRAM available 6Gi <
requested 8Gi`). When nothing fits, `error.diagnosis.nodeToStatus.nodes` says per node why, and
`error.explanation` is the framework's structured form: `{message: "0/5 nodes are available: ...",
preFilter, nodes: {node: {code, stage, summary, reasons: [{message, stage, node, gpu, resource,
requested, available, detail}]}}}`. `suggestions` (a top-level key the original lacks; `[]` when the
pod fits) lists the smallest changes that would make it fit now, each checked against the current
state: `{kind, message, target, changes, pods?, node?}` (see tfusion/allocator/explain.py and
tfusion/controller/scheduling/explain.py).
Status codes: 413 a body over 3 MiB, 400 unreadable body (too deep, an alias bomb, a YAML tag
beyond JSON, ...), a field the scheduler reads that it cannot take (podcheck.py: the message names
the field path, the value and what is allowed) or bad annotations (the message names the
annotation) or a spec.schedulerName other than the tfusion scheduler (`foreign_scheduler`: the
message names the field, its value and the accepted name; the original answers that with 500
`scheduler framework not found`, but it is the caller's mistake, not the server's), else 200.
The allocator's state is not changed (only `filter`, `select`, `score` and `Framework.explain` are
called; explain memoizes per-node explanations, which is not state the placement reads).

A native-GPU pod (progressive migration, progressive.py: a limit of a ProviderConfig's
`inUseResourceNames`, no TensorFusion GPU annotation) is judged as the built-in scheduler places
it, from the scheduler's view (read only): `progressiveNodeNames: {count, nodes}` are the nodes
that run no TensorFusion worker (the original's PreFilter answer; null for every other pod);
`scheduleResult` is the node the scheduler would bind it to (`FeasibleNodes`: those where the node
checks and its native GPU resources also pass), and when none, `error` names each node's reason
("node(s) run TensorFusion workers", "Insufficient nvidia.com/gpu", ...). No GPU filter runs for
it, so `FilterStageDetails` and the `gpuSchedulerState` maps are empty.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NotRequired, TypedDict

from tfusion.allocator import Framework, GpuAllocator, QuotaExceeded, RequestError, Unschedulable, request_from_pod
from tfusion.allocator.errors import FilterStage
from tfusion.allocator.framework import Explanation
from tfusion.api.accessors import Body, Pod
from tfusion.api.documents import DocumentError, load_json_or_yaml
from tfusion.api.jsontypes import JsonMapping, JsonObject
from tfusion.controller.defaults import (
    Denial,
    Sources,
    capacity_of_model,
    request_annotations,
    resolve,
    stale_annotations,
)
from tfusion.controller.scheduling import nodes as nc
from tfusion.controller.scheduling.explain import (
    ExplanationBody,
    SuggestionBody,
    explanation_json,
    node_failure_status,
    suggestion_json,
)
from tfusion.controller.scheduling.podcheck import pod_problem, shown
from tfusion.controller.scheduling.scheduler import asks_for_gpus
from tfusion.kube import resources as r

if TYPE_CHECKING:
    from tfusion.controller.scheduling.scheduler import Scheduler
    from tfusion.kube.informer import Informer

SCHEDULER_NAME = "tensor-fusion-scheduler"
PLUGIN = "GPUResourcesFit"
FRAMEWORK_NOT_FOUND = "scheduler framework not found"
#: a Pod manifest may be as large as kube-apiserver accepts a request body (3 MiB)
POD_MANIFEST_MAX_BYTES = 3 * 1024 * 1024


class RemovedGpuBody(TypedDict):
    gpu: str
    node: str
    reason: str


class StageBody(TypedDict):
    """One filter stage, with the original's Go field names (and `Removed`, which it lacks)."""

    FilterName: str
    Before: list[str]
    After: list[str]
    Diff: int
    Removed: list[RemovedGpuBody]


class NodeFitBody(TypedDict):
    code: str
    plugin: str
    reasons: list[str]
    message: str


class NodeToStatusBody(TypedDict):
    nodes: dict[str, NodeFitBody]
    absentNodesStatus: None


class DiagnosisBody(TypedDict):
    preFilterMsg: str
    postFilterMsg: str
    unschedulablePlugins: list[str]
    pendingPlugins: list[str]
    nodeToStatus: NodeToStatusBody


class FitErrorBody(TypedDict):
    """The original's FitError, plus `explanation` (the framework's structured form)."""

    type: str
    message: str
    stage: str
    numAllNodes: int
    diagnosis: DiagnosisBody
    explanation: NotRequired[ExplanationBody]


class ScheduleResultBody(TypedDict):
    SuggestedHost: str
    EvaluatedNodes: int
    FeasibleNodes: int


class SchedulerStateBody(TypedDict):
    NodeGPUs: dict[str, list[str]]
    NodeScores: dict[str, int]
    FinalGPUs: list[str]
    ScoringStrategy: str


class FilterDetailBody(TypedDict):
    FilterStageDetails: list[StageBody]


class ProgressiveNodesBody(TypedDict):
    count: int
    nodes: list[str]


class SimulateBody(TypedDict):
    """The 200 answer: the original's envelope, `suggestions` added."""

    scheduleResult: ScheduleResultBody
    filterDetail: FilterDetailBody
    error: FitErrorBody | None
    cycleState: None
    gpuSchedulerState: SchedulerStateBody
    progressiveNodeNames: ProgressiveNodesBody | None
    suggestions: list[SuggestionBody]


class RefusalBody(TypedDict):
    """A 400 answer: the message, and the field it is about when there is one."""

    error: str
    field: NotRequired[str]


def foreign_scheduler(spec: JsonMapping) -> str:
    """Why this route will not judge a Pod that names another scheduler ("" for ours). The original's
    words stay in the message so that a caller matching them still finds them."""
    name = spec.get("schedulerName")
    if name == SCHEDULER_NAME:
        return ""
    return (f"spec.schedulerName: {shown(name)} is not allowed; expected {SCHEDULER_NAME!r}, the only "
            f"scheduler this route judges Pods for ({FRAMEWORK_NOT_FOUND})")


class ManifestError(ValueError):
    """The request body is not a usable Pod manifest; the message says what is wrong."""


def read_pod_manifest(body: bytes) -> JsonObject:
    """Decode a Pod manifest (JSON first, then YAML) and check the fields the scheduler reads
    (`podcheck.pod_problem`: types, quantities, operators); raises ManifestError.

    Bounded (`tfusion.api.documents`): at most 100 levels deep, YAML aliases expanding to at most
    POD_MANIFEST_MAX_BYTES, only JSON-compatible YAML, integers within 64 bits. CPU-bound for a
    large body: the route calls it through `tfusion.web.decode_body`, in a worker thread."""
    if not body.strip():
        raise ManifestError("the request body is empty; expected a Pod manifest in JSON or YAML")
    try:
        pod = load_json_or_yaml(body, max_bytes=POD_MANIFEST_MAX_BYTES)
    except DocumentError as exc:
        raise ManifestError(f"the request body is not a readable Pod manifest: {exc}") from None
    if not isinstance(pod, dict):
        raise ManifestError(f"the request body must be a Pod manifest (an object), got {type(pod).__name__}")
    kind = pod.get("kind")
    if kind is not None and kind != "Pod":
        raise ManifestError(f"kind: {kind!r} is not allowed; expected a Pod manifest (kind: Pod)")
    if not isinstance(pod.get("spec"), Mapping):
        raise ManifestError("spec is missing or not an object; a Pod manifest needs spec.schedulerName")
    problem = pod_problem(pod)
    if problem:
        raise ManifestError(f"the Pod manifest cannot be used: {problem}")
    return pod


def _stage_json(stage: FilterStage) -> StageBody:
    return {
        "FilterName": stage.name,
        "Before": stage.before_gpus,
        "After": stage.after_gpus,
        "Diff": stage.before - stage.after,
        "Removed": [{"gpu": r.gpu, "node": r.node, "reason": r.reason} for r in stage.removed],
    }


def _fit_error(exc: Unschedulable, num_nodes: int) -> FitErrorBody:
    prefilter = isinstance(exc, QuotaExceeded) or not exc.nodes
    code = "UnschedulableAndUnresolvable" if exc.unresolvable else "Unschedulable"
    nodes: dict[str, NodeFitBody] = {
        node: {"code": code, "plugin": PLUGIN, "reasons": list(reasons),
               "message": "; ".join(reasons) if reasons else "no candidate GPU"}
        for node, reasons in exc.nodes.items()
    }
    return {
        "type": "FitError",
        "message": exc.message,
        "stage": exc.stage,
        "numAllNodes": num_nodes,
        "diagnosis": {
            "preFilterMsg": exc.message if prefilter else "",
            "postFilterMsg": "",
            "unschedulablePlugins": [PLUGIN],
            "pendingPlugins": [],
            "nodeToStatus": {"nodes": nodes, "absentNodesStatus": None},
        },
    }


def native_request(scheduler: Scheduler, pod: Pod) -> dict[str, int]:
    """The native GPU resources of a pod that asks for no TensorFusion GPUs ({} for any other)."""
    if asks_for_gpus(pod):
        return {}
    return nc.extended_requests(pod, scheduler.native_resource_names())


def _native_fit_error(failures: Mapping[str, nc.NodeFailure], message: str, num_nodes: int) -> FitErrorBody:
    """The GPU path's FitError shape, from the node checks' failures; `message` is the scheduler's."""
    statuses = {n: node_failure_status(f, n) for n, f in sorted(failures.items())}
    nodes: dict[str, NodeFitBody] = {}
    for name, failure in sorted(failures.items()):
        text = statuses[name].reasons[0].text()
        nodes[name] = {"code": "UnschedulableAndUnresolvable" if failure.unresolvable else "Unschedulable",
                       "plugin": failure.check, "reasons": [text], "message": text}
    explanation = explanation_json(Explanation(statuses), num_nodes, suggestions=False)
    explanation["message"] = message
    return {
        "type": "FitError",
        "message": message,
        "stage": "Filter",
        "numAllNodes": num_nodes,
        "diagnosis": {
            "preFilterMsg": "",
            "postFilterMsg": "",
            "unschedulablePlugins": sorted({f.check for f in failures.values()}),
            "pendingPlugins": [],
            "nodeToStatus": {"nodes": nodes, "absentNodesStatus": None},
        },
        "explanation": explanation,
    }


def simulate_native(scheduler: Scheduler, allocator: GpuAllocator, pod: Pod,
                    native: Mapping[str, int]) -> SimulateBody:
    """The built-in scheduler's decision for a native-GPU pod, with every node's verdict."""
    by_name = scheduler.nodes_by_name()
    busy = scheduler.nodes_with_workers()
    check = scheduler.native_check(nc.pod_demand(pod), native, busy)
    failures = {n: f for n, node in by_name.items() if (f := check(n, node)) is not None}
    decision = scheduler.decide(pod, Framework(allocator))
    error = None
    if decision.why is not None:
        error = _native_fit_error(failures, decision.why.message, len(by_name))
    without_workers = sorted(n for n in by_name if n not in busy)
    return {
        "scheduleResult": {"SuggestedHost": decision.node, "EvaluatedNodes": len(by_name),
                           "FeasibleNodes": len(by_name) - len(failures)},
        "filterDetail": {"FilterStageDetails": []},
        "error": error,
        "cycleState": None,
        "gpuSchedulerState": {"NodeGPUs": {}, "NodeScores": {}, "FinalGPUs": [], "ScoringStrategy": ""},
        "progressiveNodeNames": {"count": len(without_workers), "nodes": without_workers},
        "suggestions": [],
    }


def cached_sources(informer: Callable[[r.ApiResource], Informer], namespace: str) -> Sources:
    """What the webhook would read for a pod of `namespace`, from the controller's informers."""
    profiles, gpus = informer(r.WORKLOADPROFILES), informer(r.GPUS)
    quotas = [q for q in informer(r.GPURESOURCEQUOTAS).list() if Body(q).namespace == namespace]
    return Sources(pools=informer(r.GPUPOOLS).list(), provider_configs=informer(r.PROVIDERCONFIGS).list(),
                   quotas=quotas, profile=lambda name: profiles.get(f"{namespace}/{name}"),
                   gpu_capacity=lambda model: capacity_of_model(gpus.list(), model))


def defaulted_pod(pod: Pod, sources: Sources) -> Pod:
    """`pod` with the request annotations the webhook would write (and without those it would
    drop); raises Denial as the webhook refuses the pod."""
    notes = dict(pod.meta.annotations)
    resolved = resolve(pod, notes, sources)
    for key in stale_annotations(resolved.amounts):
        notes.pop(key, None)
    notes.update(request_annotations(resolved))
    return Pod({**pod.raw, "metadata": {**pod.meta.raw, "annotations": notes}})


def simulate_schedule(allocator: GpuAllocator, pod: JsonMapping, *, sources: Sources,
                      scheduler: Scheduler | None = None) -> tuple[int, SimulateBody | RefusalBody]:
    """Run the GPU filter chain and scoring for `pod` (defaulted as the webhook would, from
    `sources`) and explain the outcome; a native-GPU pod is judged by `scheduler`'s node view
    instead (see the module docstring). No side effects."""
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    if not isinstance(spec, Mapping):
        return 400, {"error": "the Pod manifest has no spec"}
    if foreign := foreign_scheduler(spec):
        return 400, {"error": foreign, "field": "spec.schedulerName"}
    view = Pod(pod)
    native = native_request(scheduler, view) if scheduler is not None else {}
    if scheduler is not None and native:
        return 200, simulate_native(scheduler, allocator, view, native)
    try:
        req = request_from_pod(defaulted_pod(view, sources))
    except Denial as exc:  # the webhook's refusal, in its words (a request above its limit among them)
        return 400, {"error": exc.message}
    except RequestError as exc:
        return 400, {"error": str(exc)}

    result = allocator.filter(req, explain=True)
    num_nodes = len(allocator.nodes())
    feasible = sorted(result.nodes)
    mode = allocator.pool_config(req.pool).placement_mode
    scores = allocator.score(req, feasible)
    error: FitErrorBody | None = None
    suggested = ""
    final: list[str] = []
    suggestions: list[SuggestionBody] = []
    try:
        placement = allocator.select(req)
        suggested, final = placement.node, list(placement.gpu_names)
    except Unschedulable as exc:
        error = _fit_error(exc, num_nodes)
        feasible = [] if not exc.nodes or isinstance(exc, QuotaExceeded) else feasible
        explanation = Framework(allocator).explain(req)
        error["explanation"] = explanation_json(explanation, num_nodes, suggestions=False)
        suggestions = [suggestion_json(s) for s in explanation.suggestions]
    return 200, {
        "scheduleResult": {"SuggestedHost": suggested, "EvaluatedNodes": result.evaluated,
                           "FeasibleNodes": len(feasible)},
        "filterDetail": {"FilterStageDetails": [_stage_json(s) for s in result.stages]},
        "error": error,
        "cycleState": None,
        "gpuSchedulerState": {
            "NodeGPUs": result.nodes,
            "NodeScores": scores,
            "FinalGPUs": final,
            "ScoringStrategy": mode,
        },
        "progressiveNodeNames": None,
        "suggestions": suggestions,
    }
