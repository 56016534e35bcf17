"""The kube-scheduler extender (`--scheduler=extender`): filter, prioritize and bind for a stock
kube-scheduler whose `tensor-fusion-scheduler` profile calls the controller.

Why: a cluster that wants kube-scheduler's own plugins (volumes, topology spread, preemption of
non-GPU pods …) keeps them, and delegates only the GPU decision. kube-scheduler has already run
its node filters, so the extender judges GPUs only; it answers in the extender v1 wire format
(Go field names, `k8s.io/kube-scheduler/extender/v1`):

- filter: `ExtenderArgs {Pod, Nodes, NodeNames}` -> `ExtenderFilterResult {Nodes, NodeNames,
  FailedNodes, FailedAndUnresolvableNodes, Error}`. With `nodeCacheCapable: true` the candidates
  come (and go back) as `NodeNames`, else as the `Nodes` NodeList (the passing items returned
  unchanged). A failed node's reason is the framework's number-free summary, so kube-scheduler's
  "0/N nodes are available: …" counts equal reasons; the numbers are in the explanation that
  `tfusion why` shows (kept when no node passes);
- prioritize: the same args -> `[{Host, Score}]`, the framework's 0..100 mapped to 0..10;
- bind: `ExtenderBindingArgs {PodName, PodNamespace, PodUID, Node}` -> `ExtenderBindingResult
  {Error}`: Reserve on that node, then the built-in scheduler's binding (annotations and Binding in
  one write, commit), rolled back on any failure. A gang member's bind call waits for the rest of
  its gang (gang_runtime.py: at most the extender's httpTimeout minus a margin) and binds only when
  the gang is complete; otherwise it answers an error and holds nothing.

Filter reserves nothing: the GPUs are chosen and held only in bind, which kube-scheduler calls
for the node it picked; so a filter result that is never bound holds nothing and needs no
expiry, and a reservation lives only within one bind call (the allocator's assume TTL is the
safety net for a crash in between). Pods that ask for no GPUs pass every node with score 0, and
bind plainly.

A native-GPU pod (progressive migration, progressive.py: a limit of a ProviderConfig's
`inUseResourceNames` and no TensorFusion GPU annotation) gets the built-in scheduler's confinement:
filter fails every candidate that runs TensorFusion workers ("node(s) run TensorFusion workers",
resolvable) and passes the others (kube-scheduler has already fitted its nvidia.com/gpu);
prioritize scores 0; bind checks the node once more and posts a plain Binding (no GPU from the
allocator, no annotation). A pod being bound here counts on its node at once, so a filter that
runs while a worker's bind is in flight already sees that worker.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from tfusion.allocator import AllocRequest, RequestError
from tfusion.allocator.framework import Code, Explanation, Framework, Status
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod
from tfusion.controller.scheduling import nodes as nc
from tfusion.controller.scheduling import progressive
from tfusion.controller.scheduling.explain import node_failure_status, why_of, why_text
from tfusion.controller.scheduling.scheduler import (
    WORKER,
    Decision,
    Scheduler,
    asks_for_gpus,
    pod_key,
)
from tfusion.kube import resources as r
from tfusion.kube.client import KubeError, NotFound
from tfusion.web import BodyBuffer

MAX_EXTENDER_PRIORITY = 10


class NodeList(msgspec.Struct, gc=False):
    """The candidate Nodes (nodeCacheCapable false). Each item stays the JSON it arrived as: the
    extender reads only its name, and answers the passing items unchanged, so thousands of Node
    objects are never built as Python objects.

    These wire structs are not tracked by the cyclic collector (they cannot form cycles): a
    request builds thousands of them, enough to set off full collections, which in a process
    with a large heap hold the GIL, and with it the event loop, for hundreds of milliseconds."""

    items: list[msgspec.Raw] = msgspec.field(default_factory=list)
    apiVersion: str = "v1"
    kind: str = "NodeList"
    metadata: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"{}"))


class ExtenderArgs(msgspec.Struct, gc=False):
    """kube-scheduler's filter and prioritize request."""

    Pod: dict[str, Any]
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None


class _NodeMeta(msgspec.Struct, gc=False):
    name: str | None = None


class _NamedNode(msgspec.Struct, gc=False):
    metadata: _NodeMeta | None = None


_named_node = msgspec.json.Decoder(_NamedNode)
extender_args_decoder = msgspec.json.Decoder(ExtenderArgs)


def node_item_names(args: ExtenderArgs) -> list[str | None]:
    """The name of each item of `args.Nodes`, None for an item that names no node (not an object,
    no metadata.name)."""
    names: list[str | None] = []
    for index, item in enumerate(args.Nodes.items if args.Nodes is not None else ()):
        if index % 512 == 511:
            time.sleep(0)  # run in a worker thread: let the event loop have the GIL now and then
        try:
            meta = _named_node.decode(item).metadata
        except msgspec.DecodeError:  # ValidationError included: not a Node-shaped object
            names.append(None)
            continue
        names.append(meta.name if meta is not None else None)
    return names


@dataclass
class ExtenderCall:
    """A decoded filter or prioritize request with its candidates' names (found once, off the
    event loop when the request is large)."""

    args: ExtenderArgs
    item_names: list[str | None]

    @property
    def names(self) -> list[str]:
        if self.args.NodeNames is not None:
            return list(self.args.NodeNames)
        return [name for name in self.item_names if name is not None]


def decode_extender_call(body: BodyBuffer) -> ExtenderCall:
    args = extender_args_decoder.decode(body)
    return ExtenderCall(args, node_item_names(args) if args.NodeNames is None else [])


class ExtenderFilterResult(msgspec.Struct):
    Nodes: dict[str, Any] | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] = msgspec.field(default_factory=dict)
    FailedAndUnresolvableNodes: dict[str, str] = msgspec.field(default_factory=dict)
    Error: str = ""


class HostPriority(msgspec.Struct, gc=False):
    Host: str
    Score: int


class ExtenderBindingArgs(msgspec.Struct):
    PodName: str
    PodNamespace: str
    PodUID: str
    Node: str


class ExtenderBindingResult(msgspec.Struct):
    Error: str = ""


def _answer(call: ExtenderCall, passed: Sequence[str], failed: Mapping[str, str],
            unresolvable: Mapping[str, str]) -> ExtenderFilterResult:
    args = call.args
    if args.NodeNames is not None:
        return ExtenderFilterResult(None, list(passed), dict(failed), dict(unresolvable))
    keep = set(passed)
    node_list = args.Nodes or NodeList()
    items = [item for item, name in zip(node_list.items, call.item_names, strict=True) if name in keep]
    nodes = {"apiVersion": node_list.apiVersion, "kind": node_list.kind, "metadata": node_list.metadata,
             "items": items}
    return ExtenderFilterResult(nodes, None, dict(failed), dict(unresolvable))


def to_extender_score(score: int) -> int:
    """The framework's 0..100 as the extender's 0..10."""
    return max(0, min(MAX_EXTENDER_PRIORITY, score * MAX_EXTENDER_PRIORITY // 100))


class Extender:
    """The three verbs over the scheduler's state; `fw` is the leader's framework."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def _refuse_all(self, call: ExtenderCall, names: Sequence[str], message: str,
                    unresolvable: bool) -> ExtenderFilterResult:
        verdicts = dict.fromkeys(names, message)
        return _answer(call, [], {} if unresolvable else verdicts, verdicts if unresolvable else {})

    def native_request(self, pod: Pod) -> dict[str, int]:
        """The native GPU resources of a pod that asks for no TensorFusion GPUs; {} for any other."""
        if asks_for_gpus(pod):
            return {}
        return nc.extended_requests(pod, self.scheduler.native_resource_names())

    def filter(self, call: ExtenderCall, fw: Framework) -> ExtenderFilterResult:
        names = call.names
        pod = Pod(call.args.Pod)
        if not asks_for_gpus(pod):
            native = self.native_request(pod)
            return self._filter_native(call, pod, names, native) if native else _answer(call, names, {}, {})
        if not pod.is_worker:
            return self._refuse_all(call, names, f"the pod asks for GPUs but lacks the label "
                                                 f"{tfa.COMPONENT}={WORKER}", True)
        try:
            req = self.scheduler.request_of(pod)
        except RequestError as exc:
            return self._refuse_all(call, names, str(exc), True)
        refusal = self.scheduler.gangs.refusal(pod)  # PreEnqueue of gang members (gang_runtime.py)
        if refusal:
            self.scheduler.reports.remember(pod_key(pod), why_text(pod, refusal, Code.UNSCHEDULABLE))
            return self._refuse_all(call, names, refusal, False)
        pre = fw.pre_filter(req)
        if not pre.ok:
            self._remember(pod, req, fw, names)
            return self._refuse_all(call, names, pre.summary(), pre.code is Code.UNRESOLVABLE)
        statuses = fw.filter(req, names)
        passed = [n for n, s in statuses.items() if s.ok]
        failing = [n for n, s in statuses.items() if not s.ok]
        if failing:
            statuses.update(fw.filter(req, failing, explain=True))
        failed = {n: statuses[n].summary() for n in failing if statuses[n].code is not Code.UNRESOLVABLE}
        unresolvable = {n: statuses[n].summary() for n in failing if statuses[n].code is Code.UNRESOLVABLE}
        if not passed:
            self._remember(pod, req, fw, names)
        else:
            self.scheduler.reports.forget(pod_key(pod))
        return _answer(call, passed, failed, unresolvable)

    def _filter_native(self, call: ExtenderCall, pod: Pod, names: Sequence[str],
                       native: Mapping[str, int]) -> ExtenderFilterResult:
        busy = self.scheduler.nodes_with_workers()
        failures = {n: f for n in names if (f := progressive.worker_failure(n, busy)) is not None}
        passed = [n for n in names if n not in failures]
        if passed:
            self.scheduler.reports.forget(pod_key(pod))
        else:
            self._remember_native(pod, names, failures, sorted(native), busy)
        return _answer(call, passed, {n: node_failure_status(f, n).summary() for n, f in failures.items()}, {})

    def _remember_native(self, pod: Pod, names: Sequence[str],
                         failures: Mapping[str, nc.NodeFailure], resources: Sequence[str], busy: set[str]) -> None:
        """The built-in scheduler's explanation of a native-GPU pod that no candidate takes, with
        the sentence saying every GPU node runs workers when that is so."""
        statuses = {n: node_failure_status(f, n) for n, f in failures.items()}
        message = Explanation(statuses).message(len(names))
        note = progressive.busy_note(self.scheduler.nodes_by_name(), resources, busy)
        why = why_of(pod, f"{message} {note}" if note else message, statuses, [], Code.UNSCHEDULABLE)
        self.scheduler.reports.remember(pod_key(pod), why)

    def _remember(self, pod: Pod, req: AllocRequest, fw: Framework, names: Sequence[str]) -> None:
        """Keep the explanation for `tfusion why` (kube-scheduler writes the condition and event)."""
        expl = fw.explain(req, names)
        why = why_of(pod, expl.message(len(names)), expl.nodes, expl.suggestions,
                     _overall(expl.pre_filter, expl.nodes), pre_filter=expl.pre_filter)
        self.scheduler.reports.remember(pod_key(pod), why)

    def prioritize(self, call: ExtenderCall, fw: Framework) -> list[HostPriority]:
        names = call.names
        pod = Pod(call.args.Pod)
        if not asks_for_gpus(pod) or not pod.is_worker:
            return [HostPriority(n, 0) for n in names]
        try:
            req = self.scheduler.request_of(pod)
        except RequestError:
            return [HostPriority(n, 0) for n in names]
        scores = fw.score(req, names)
        return [HostPriority(n, to_extender_score(scores.get(n, 0))) for n in names]

    async def bind(self, args: ExtenderBindingArgs, fw: Framework) -> ExtenderBindingResult:
        scheduler = self.scheduler
        key = f"{args.PodNamespace}/{args.PodName}"
        pod = scheduler.pod(key)
        if pod is None or pod.uid != args.PodUID:
            try:
                pod = Pod(await scheduler.client.get(r.PODS, args.PodName, namespace=args.PodNamespace))
            except NotFound:
                return ExtenderBindingResult(f"pod {key} not found")
            except KubeError as exc:
                return ExtenderBindingResult(f"cannot read pod {key}: {exc}")
        if pod.uid != args.PodUID:
            return ExtenderBindingResult(f"pod {key} has UID {pod.uid}, not {args.PodUID}")
        if not nc.is_pending(pod):
            return ExtenderBindingResult(f"pod {key} is bound, finished or being deleted")
        demand = nc.pod_demand(pod)
        decision = Decision(args.Node, demand=demand, native=self.native_request(pod))
        if decision.native:
            refused = progressive.worker_failure(args.Node, scheduler.nodes_with_workers())
            if refused is not None:
                return ExtenderBindingResult(f"not bound to node {args.Node}: it runs TensorFusion workers, and in "
                                             f"progressive migration a native GPU pod goes only to a node without "
                                             f"them")
        elif asks_for_gpus(pod):
            if not pod.is_worker:
                return ExtenderBindingResult(f"pod {key} asks for GPUs but lacks the label {tfa.COMPONENT}={WORKER}")
            try:
                req = scheduler.request_of(pod)
            except RequestError as exc:
                return ExtenderBindingResult(str(exc))
            placement, status = fw.reserve(req, args.Node)
            if placement is None:
                return ExtenderBindingResult(f"cannot reserve GPUs on node {args.Node}: {status.details()}")
            decision = Decision(args.Node, placement, req, demand)
        scheduler.assume(pod, decision)
        not_permitted = await scheduler.gangs.extender_permit(key, pod, decision)  # a gang member waits
        if not_permitted:
            return ExtenderBindingResult(not_permitted)
        result = await scheduler.bind(pod, decision, fw)
        if not result.bound:
            scheduler.gangs.bind_failed(pod)
        return ExtenderBindingResult("" if result.bound else result.error)


def _overall(pre: Status, statuses: Mapping[str, Status]) -> Code:
    if not pre.ok:
        return pre.code
    codes = [s.code for s in statuses.values() if not s.ok]
    return Code.UNRESOLVABLE if codes and all(c is Code.UNRESOLVABLE for c in codes) else Code.UNSCHEDULABLE
