"""The node checks the built-in scheduler makes before it looks at GPUs, as pure functions.

Why: a pod that gets GPUs on a node it cannot run on (cordoned, tainted, not matching its
nodeSelector, out of CPU) is no better placed than one that gets none. kube-scheduler makes these
checks for the extender path; the built-in scheduler has to make them itself. Each failure is a
`NodeFailure` whose message is kube-scheduler's own wording, so the pod condition reads as users
know it ("0/5 nodes are available: 2 Insufficient cpu, 3 node(s) had untolerated taint {k: v}."):

- Ready: the node's Ready condition is True ("node(s) were not ready"), unless the pod tolerates
  the `node.kubernetes.io/not-ready` taint;
- `spec.unschedulable` ("node(s) were unschedulable"), unless it tolerates
  `node.kubernetes.io/unschedulable:NoSchedule`;
- taints with effect NoSchedule or NoExecute that no toleration tolerates ("node(s) had
  untolerated taint {key: value}"); PreferNoSchedule only prefers, so it never fails a node;
- `spec.nodeSelector` and required node affinity (`nodeSelectorTerms` ORed; in a term, every
  `matchExpressions` and `matchFields` requirement; operators In, NotIn, Exists, DoesNotExist,
  Gt, Lt; `matchFields` on `metadata.name`; a term with no requirement matches nothing)
  ("node(s) didn't match Pod's node affinity/selector");
- for a pod that asks for a `tensor-fusion.ai/index_<k>` resource (a worker pod), the node's
  allocatable `tensor-fusion.ai/index_0` must not be 0: the kubelet zeroes a device plugin's
  resources when the plugin goes, so 0 means the node's hypervisor is dead (the original's filter).
  A node that does not list the resource at all (no device plugin ever registered: a simulated
  or test node, or a cluster where the hypervisor has not started yet) is not refused, unlike the
  original, which reads a missing resource as 0;
- CPU, memory and pod count against `status.allocatable` minus the requests of the pods already
  on the node ("Insufficient cpu", "Insufficient memory", "Too many pods"). A pod's request is
  max(sum of its containers, largest init container) plus `spec.overhead`, as kube computes it.

Failures of the first four kinds are unresolvable (no other pod's departure fixes them); resource
failures are not. `NodeUsage` keeps the per-node totals of bound pods incrementally (fed from the
pod informer and from the scheduler's own reservations), so a check is O(1) per node.
`StaticVerdicts` caches the first four checks per node and pod shape, keyed by the node's
resourceVersion, because thousands of pods of one Deployment ask the same question.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import orjson

from tfusion.api import annotations as tfa
from tfusion.api import podindex
from tfusion.api.accessors import Node, Pod, items, section, text
from tfusion.api.jsontypes import JsonMapping
from tfusion.api.quantity import Quantity, QuantityError

NOT_READY = "node(s) were not ready"
UNSCHEDULABLE = "node(s) were unschedulable"
AFFINITY = "node(s) didn't match Pod's node affinity/selector"
HYPERVISOR_GONE = "node(s) had no running tensor-fusion hypervisor (allocatable tensor-fusion.ai/index_0 is 0)"
INDEX_PROBE_RESOURCE = podindex.index_resource(0)
TOO_MANY_PODS = "Too many pods"
INSUFFICIENT = "Insufficient {}"

NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True, slots=True)
class NodeFailure:
    """Why one node cannot take the pod: kube's message, the check, and whether retrying can help."""

    message: str
    check: str
    unresolvable: bool
    resource: str = ""
    requested: int = 0
    available: int = 0


@dataclass(frozen=True, slots=True)
class PodDemand:
    """What a pod asks of a node, read once per scheduling cycle."""

    cpu_milli: int = 0
    memory: int = 0
    tolerations: tuple[JsonMapping, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    required_terms: tuple[JsonMapping, ...] | None = None  # None: no required affinity
    #: the static part's identity (tolerations, selector, affinity), for `StaticVerdicts`
    shape: str = ""
    #: asks for a tensor-fusion.ai/index_<k> resource: needs a live hypervisor device plugin
    needs_index_plugin: bool = False


# --- reading a pod ---------------------------------------------------------------------------------


def _quantity(value: object, *, milli: bool) -> int:
    if not isinstance(value, (str, int, float)):
        return 0  # absent, or a JSON value no quantity is written as
    return _parsed_quantity(value, milli)


@functools.lru_cache(maxsize=4096, typed=True)
def _parsed_quantity(value: str | int | float, milli: bool) -> int:
    """Cached: every pod event is counted, and a cluster's pods ask a handful of amounts."""
    try:
        q = Quantity.parse(value)
    except QuantityError:
        return 0  # the API server validated it; an unreadable one counts as nothing
    return max(0, q.milli_value() if milli else q.value())


# The bound pods counted here come from the API server, which checks fewer fields than the
# scheduler reads (`spec.overhead` is not one): the views read a mistyped field as absent, so one
# odd pod does not stop the counting of all the others (pending pods go through podcheck instead).


def _requests(container: JsonMapping) -> tuple[int, int]:
    requests = section(container, "resources", "requests")
    return _quantity(requests.get("cpu"), milli=True), _quantity(requests.get("memory"), milli=False)


def pod_requests(pod: Pod) -> tuple[int, int]:
    """(milli-CPU, memory bytes) a pod needs: max(sum of containers, largest init container) + overhead."""
    cpu = mem = 0
    for container in pod.containers:
        c, m = _requests(container)
        cpu += c
        mem += m
    for container in pod.init_containers:
        c, m = _requests(container)
        cpu, mem = max(cpu, c), max(mem, m)
    overhead = section(pod.spec, "overhead")
    return cpu + _quantity(overhead.get("cpu"), milli=True), mem + _quantity(overhead.get("memory"), milli=False)


def pod_demand(pod: Pod) -> PodDemand:
    cpu, mem = pod_requests(pod)
    tolerations = tuple(t for t in items(pod.spec, "tolerations") if isinstance(t, Mapping))
    selector = {str(k): str(v) for k, v in section(pod.spec, "nodeSelector").items()}
    required = section(pod.spec, "affinity", "nodeAffinity").get("requiredDuringSchedulingIgnoredDuringExecution")
    terms = None
    if isinstance(required, Mapping):
        terms = tuple(t for t in items(required, "nodeSelectorTerms") if isinstance(t, Mapping))
    needs_index = _asks_index_resource(pod)
    shape = orjson.dumps([tolerations, selector, terms, needs_index], option=orjson.OPT_SORT_KEYS, default=str).decode()
    return PodDemand(cpu, mem, tolerations, selector, terms, shape, needs_index)


def _asks_index_resource(pod: Pod) -> bool:
    for container in pod.containers:
        for group in ("limits", "requests"):
            if any(str(name).startswith(tfa.INDEX_RESOURCE_PREFIX) for name in section(container, "resources", group)):
                return True
    return False


def is_pending(pod: Pod) -> bool:
    """Unbound, not being deleted, not finished: a pod a scheduler should place."""
    return not pod.node_name and not pod.meta.deleting and not pod.finished


# --- the checks ----------------------------------------------------------------------------------------


def tolerates(toleration: JsonMapping, taint: JsonMapping) -> bool:
    """kube's ToleratesTaint: effect (empty = any), key (empty with Exists = any), operator/value."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if key and key != taint.get("key"):
        return False
    if operator == "Exists":
        return True
    if operator == "Equal":
        return bool(key) and (toleration.get("value") or "") == (taint.get("value") or "")
    return False


def _tolerated(tolerations: Sequence[JsonMapping], taint: JsonMapping) -> bool:
    return any(tolerates(t, taint) for t in tolerations)


def _requirement_matches(req: JsonMapping, values: Mapping[str, str]) -> bool:
    key = text(req, "key")
    operator = req.get("operator")
    wanted = [str(v) for v in items(req, "values")]
    present = key in values
    value = values.get(key, "")
    if operator == "In":
        return present and value in wanted
    if operator == "NotIn":
        return not present or value not in wanted
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(wanted) == 1:
        try:
            have, bound = int(value), int(wanted[0])
        except ValueError:
            return False
        return bool(have > bound) if operator == "Gt" else bool(have < bound)
    return False


def term_matches(term: JsonMapping, node: Node) -> bool:
    """One nodeSelectorTerm: every requirement holds; a term without requirements matches nothing."""
    expressions = [e for e in items(term, "matchExpressions") if isinstance(e, Mapping)]
    fields = [f for f in items(term, "matchFields") if isinstance(f, Mapping)]
    if not expressions and not fields:
        return False
    labels = node.meta.labels
    if not all(_requirement_matches(e, labels) for e in expressions):
        return False
    field_values = {"metadata.name": node.name}
    return all(f.get("key") == "metadata.name" and _requirement_matches(f, field_values) for f in fields)


def affinity_matches(demand: PodDemand, node: Node) -> bool:
    labels = node.meta.labels
    if any(labels.get(k) != v for k, v in demand.node_selector.items()):
        return False
    if demand.required_terms is None:
        return True
    return any(term_matches(t, node) for t in demand.required_terms)


def _taint_text(taint: JsonMapping) -> str:
    return f"{{{taint.get('key', '')}: {taint.get('value', '')}}}"


def static_check(demand: PodDemand, node: Node) -> NodeFailure | None:
    """Ready, cordon, taints, selector and affinity: what does not change as pods come and go."""
    if not node.ready and not _tolerated(demand.tolerations, {"key": NOT_READY_TAINT, "effect": "NoSchedule"}):
        return NodeFailure(NOT_READY, "NodeReady", True)
    if node.spec.get("unschedulable") and not _tolerated(
            demand.tolerations, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}):
        return NodeFailure(UNSCHEDULABLE, "NodeUnschedulable", True)
    for taint in node.taints:
        if taint.get("effect") in BLOCKING_EFFECTS and not _tolerated(demand.tolerations, taint):
            return NodeFailure(f"node(s) had untolerated taint {_taint_text(taint)}", "TaintToleration", True)
    if not affinity_matches(demand, node):
        return NodeFailure(AFFINITY, "NodeAffinity", True)
    if demand.needs_index_plugin and _hypervisor_gone(node):
        return NodeFailure(HYPERVISOR_GONE, "TensorFusionHypervisor", True)
    return None


def _hypervisor_gone(node: Node) -> bool:
    """The node lists the index resource and has none of it (see the module docstring)."""
    values = node.allocatable
    return INDEX_PROBE_RESOURCE in values and _quantity(values[INDEX_PROBE_RESOURCE], milli=False) <= 0


@dataclass(frozen=True, slots=True)
class Allocatable:
    cpu_milli: int
    memory: int
    pods: int


def allocatable(node: Node) -> Allocatable:
    values = node.allocatable
    return Allocatable(_quantity(values.get("cpu"), milli=True), _quantity(values.get("memory"), milli=False),
                       _quantity(values.get("pods"), milli=False))


@dataclass(slots=True)
class Used:
    cpu_milli: int = 0
    memory: int = 0
    pods: int = 0


def resource_check(demand: PodDemand, capacity: Allocatable, used: Used) -> NodeFailure | None:
    """CPU, memory and pod count ("Too many pods" first, as kube's NodeResourcesFit)."""
    if used.pods + 1 > capacity.pods:
        return NodeFailure(TOO_MANY_PODS, "NodeResourcesFit", False, "pods", 1, max(0, capacity.pods - used.pods))
    free_cpu = capacity.cpu_milli - used.cpu_milli
    if demand.cpu_milli and demand.cpu_milli > free_cpu:
        return NodeFailure(INSUFFICIENT.format("cpu"), "NodeResourcesFit", False, "cpu", demand.cpu_milli,
                           max(0, free_cpu))
    free_mem = capacity.memory - used.memory
    if demand.memory and demand.memory > free_mem:
        return NodeFailure(INSUFFICIENT.format("memory"), "NodeResourcesFit", False, "memory", demand.memory,
                           max(0, free_mem))
    return None


def check_node(demand: PodDemand, node: Node, used: Used) -> NodeFailure | None:
    """Every check, static first; None when the node can take the pod."""
    return static_check(demand, node) or resource_check(demand, allocatable(node), used)


def extended_requests(pod: Pod, names: Iterable[str]) -> dict[str, int]:
    """What a pod asks of the extended resources `names` (e.g. nvidia.com/gpu): per container the
    request, else the limit (kube defaults one to the other for extended resources), summed, or the
    largest init container's when larger. Only the names it asks for are in the result."""
    wanted = tuple(names)
    totals: dict[str, int] = {}

    def amount(container: JsonMapping, name: str) -> int:
        value = section(container, "resources", "requests").get(name)
        if value is None:
            value = section(container, "resources", "limits").get(name)
        return _quantity(value, milli=False)

    for name in wanted:
        total = sum(amount(c, name) for c in pod.containers)
        total = max([total, *(amount(c, name) for c in pod.init_containers)])
        if total > 0:
            totals[name] = total
    return totals


def extended_check(wanted: Mapping[str, int], node: Node, used: Mapping[str, int]) -> NodeFailure | None:
    """The extended resources a pod asks for against the node's allocatable minus what its pods use
    ("Insufficient nvidia.com/gpu", as kube's NodeResourcesFit)."""
    values = node.allocatable
    for name, amount in sorted(wanted.items()):
        free = _quantity(values.get(name), milli=False) - used.get(name, 0)
        if amount > free:
            return NodeFailure(INSUFFICIENT.format(name), "NodeResourcesFit", False, name, amount, max(0, free))
    return None


# --- keeping totals and caching ---------------------------------------------------------------------


class NodeUsage:
    """Requests of the pods on each node, kept incrementally by pod UID.

    `observe(pod)` is fed every pod event (a pod that is bound and not finished counts on its
    node; any other state removes it); `assume(uid, node, cpu, mem)` counts a pod the scheduler
    is binding before the watch shows it; `forget(uid)` drops it (a failed bind)."""

    def __init__(self) -> None:
        self._pods: dict[str, tuple[str, int, int]] = {}
        self._nodes: dict[str, Used] = {}

    def used(self, node: str) -> Used:
        return self._nodes.get(node) or Used()

    def _add(self, uid: str, node: str, cpu: int, mem: int) -> None:
        self.forget(uid)
        self._pods[uid] = (node, cpu, mem)
        used = self._nodes.setdefault(node, Used())
        used.cpu_milli += cpu
        used.memory += mem
        used.pods += 1

    def forget(self, uid: str) -> None:
        old = self._pods.pop(uid, None)
        if old is None:
            return
        node, cpu, mem = old
        used = self._nodes[node]
        used.cpu_milli -= cpu
        used.memory -= mem
        used.pods -= 1
        if used.pods <= 0:
            del self._nodes[node]

    def assume(self, uid: str, node: str, cpu: int, mem: int) -> None:
        self._add(uid, node, cpu, mem)

    def observe(self, pod: Pod) -> None:
        uid = pod.uid
        if not uid:
            return
        if pod.node_name and not pod.finished:
            cpu, mem = pod_requests(pod)
            self._add(uid, pod.node_name, cpu, mem)
        else:
            self.forget(uid)

    def observe_delete(self, pod: Pod) -> None:
        self.forget(pod.uid)

    def clear(self) -> None:
        """Count nothing (a term starts afresh: an earlier term's assumptions go; every pod is
        observed again)."""
        self._pods.clear()
        self._nodes.clear()


class StaticVerdicts:
    """`static_check` results per (pod shape, node), valid while the node's resourceVersion holds."""

    def __init__(self, max_shapes: int = 256) -> None:
        self.max_shapes = max_shapes
        self._by_shape: dict[str, dict[str, tuple[str, NodeFailure | None]]] = {}

    def check(self, demand: PodDemand, node: Node) -> NodeFailure | None:
        meta = node.meta
        name, rv = meta.name, meta.resource_version
        verdicts = self._by_shape.get(demand.shape)
        if verdicts is None:
            if len(self._by_shape) >= self.max_shapes:
                self._by_shape.pop(next(iter(self._by_shape)))
            verdicts = self._by_shape[demand.shape] = {}
        cached = verdicts.get(name)
        if cached is not None and rv and cached[0] == rv:
            return cached[1]
        verdict = static_check(demand, node)
        verdicts[name] = (rv, verdict)
        return verdict


def fit_message(total: int, reasons: Iterable[str]) -> str:
    """kube-scheduler's FitError text: "0/N nodes are available: <count> <reason>, …." with the
    "<count> <reason>" strings sorted, one count per distinct reason."""
    histogram: dict[str, int] = {}
    for reason in reasons:
        histogram[reason] = histogram.get(reason, 0) + 1
    parts = sorted(f"{count} {reason}" for reason, count in histogram.items())
    if not parts:
        return f"0/{total} nodes are available."
    return f"0/{total} nodes are available: {', '.join(parts)}."
