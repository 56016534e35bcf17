"""The console's view models: what each page shows, computed from the cluster cache, the leader's
current usage and explanations. Pure: no I/O, no HTML (the templates render these).

Why a module of its own: the numbers a user reads (allocated, used, free, cost) must be right and
tested on their own, apart from markup; and one pass over the cache builds a page at 10,000 pods.

Units: TFLOPS as floats, VRAM in bytes, money in the pools' pricing currency per hour.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tfusion.allocator import RequestError, request_from_pod
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, Gpu, GpuPool, Node, Pod, section
from tfusion.api.annotations import AnnotationError
from tfusion.api.quantity import Quantity, QuantityError
from tfusion.console.cache import Cluster
from tfusion.console.explain import annotate_command, node_reasons, suggestion_text
from tfusion.kube import resources as r
from tfusion.metrics import cost as billing

MILLI = 1000
QOS_LEVELS = ("critical", "high", "medium", "low")
#: events whose reporter starts with this are tfusion's
TFUSION_COMPONENT = "tensor-fusion"
EVENTS_SHOWN = 200
GPUS_PER_PAGE = 400


# --- shared pieces --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    """One resource: capacity, what is allocated, what is measured in use (None: not known)."""

    capacity: float
    allocated: float
    used: float | None = None

    @property
    def free(self) -> float:
        return max(0.0, self.capacity - self.allocated)

    def percent(self, part: float | None) -> float:
        if part is None or self.capacity <= 0:
            return 0.0
        return min(100.0, max(0.0, part * 100.0 / self.capacity))

    def __add__(self, other: Bar) -> Bar:
        used = None if self.used is None and other.used is None else (self.used or 0.0) + (other.used or 0.0)
        return Bar(self.capacity + other.capacity, self.allocated + other.allocated, used)


EMPTY_BAR = Bar(0.0, 0.0, None)


@dataclass(frozen=True)
class WorkerUse:
    """One worker's measured use of one GPU (from the leader's `GET /api/usage`)."""

    namespace: str
    pod: str
    workload: str
    gpu_uuid: str
    tflops: float
    vram: int


@dataclass(frozen=True)
class Usage:
    """The leader's usage answer, indexed; `error` says why there is none."""

    rows: tuple[WorkerUse, ...] = ()
    error: str = ""
    known: bool = False

    def by_gpu(self) -> dict[str, tuple[float, int]]:
        out: dict[str, tuple[float, int]] = {}
        for row in self.rows:
            t, v = out.get(row.gpu_uuid.lower(), (0.0, 0))
            out[row.gpu_uuid.lower()] = (t + row.tflops, v + row.vram)
        return out

    def by_workload(self) -> dict[tuple[str, str], tuple[float, int]]:
        out: dict[tuple[str, str], tuple[float, int]] = {}
        for row in self.rows:
            key = (row.namespace, row.workload or row.pod)
            t, v = out.get(key, (0.0, 0))
            out[key] = (t + row.tflops, v + row.vram)
        return out


def usage_from_answer(answer: Mapping[str, Any] | None, error: str = "") -> Usage:
    """The leader's `/api/usage` body as a Usage (rows it cannot read are skipped)."""
    if answer is None:
        return Usage(error=error)
    rows = []
    for row in answer.get("data") or ():
        if not isinstance(row, Mapping):
            continue
        try:
            rows.append(WorkerUse(str(row.get("namespace", "")), str(row.get("pod", "")),
                                  str(row.get("workload", "")), str(row.get("gpu", "")),
                                  float(row.get("compute_tflops") or 0.0), int(row.get("memory_bytes") or 0)))
        except (TypeError, ValueError):
            continue
    return Usage(tuple(rows), error, True)


def quantity(value: object, *, milli: bool = False) -> float:
    """A quantity field as a float (TFLOPS) or bytes; 0 when missing or unreadable."""
    if value in (None, ""):
        return 0.0
    return _parsed(str(value), milli) if isinstance(value, (str, int, float)) else 0.0


@functools.lru_cache(maxsize=8192)
def _parsed(text: str, milli: bool) -> float:
    """Cached: a cluster repeats a handful of capacities and requests thousands of times."""
    try:
        parsed = Quantity.parse(text)
    except (QuantityError, TypeError):
        return 0.0
    return parsed.milli_value() / MILLI if milli else float(parsed.value())


def is_pending(pod: Pod) -> bool:
    return not pod.node_name and not pod.finished and not pod.meta.deleting


@dataclass(frozen=True)
class PodShare:
    """What a worker pod asked for, per GPU, and on which GPUs."""

    namespace: str
    name: str
    workload: str
    pool: str
    qos: str
    tflops_request: float
    tflops_limit: float
    vram_request: int
    vram_limit: int
    gpu_count: int
    gpu_names: tuple[str, ...]
    percent_request: float = 0.0


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What the pages read of a pod, worked out once per version of it."""

    raw: Mapping[str, Any]
    node: str
    pending: bool
    finished: bool
    share: PodShare | None


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """What the pages read of a GPU, worked out once per version of it."""

    name: str
    node: str
    pool: str
    model: str
    uuid: str
    phase: str
    isolation: str
    index: int
    capacity_tflops: float
    capacity_vram: float
    free_tflops: float
    free_vram: float
    message: str
    partitions: tuple[str, ...]


#: (kind, uid or name, resourceVersion) -> facts: objects are read once per version, not per page
_FACTS: dict[tuple[str, str, str], Any] = {}
FACTS_KEPT = 200_000


def _memo(kind: str, raw: Mapping[str, Any], build: Any) -> Any:
    meta = raw.get("metadata") or {}
    key = (kind, str(meta.get("uid") or meta.get("name") or ""), str(meta.get("resourceVersion") or ""))
    if not key[2]:
        return build(raw)
    found = _FACTS.get(key)
    if found is None:
        if len(_FACTS) >= FACTS_KEPT:
            _FACTS.clear()
        found = _FACTS[key] = build(raw)
    return found


def pod_facts(raw: Mapping[str, Any]) -> PodFacts:
    return _memo("pod", raw, _pod_facts)  # type: ignore[no-any-return]


def _pod_facts(raw: Mapping[str, Any]) -> PodFacts:
    pod = Pod(raw)
    return PodFacts(raw, pod.node_name, is_pending(pod), pod.finished, pod_share(pod))


def gpu_facts(raw: Mapping[str, Any]) -> GpuFacts:
    return _memo("gpu", raw, _gpu_facts)  # type: ignore[no-any-return]


def _gpu_facts(raw: Mapping[str, Any]) -> GpuFacts:
    gpu = Gpu(raw)
    status = gpu.status
    parts = tuple(sorted(f"{k}: {section(v).get('templateId') or section(v).get('template') or ''}".rstrip(": ")
                         for k, v in section(status, "allocatedPartitions").items()))
    index = status.get("index")
    return GpuFacts(gpu.name, gpu.node_selector.get("kubernetes.io/hostname") or gpu.meta.label(tfa.MANAGED_BY) or "",
                    gpu.meta.label(tfa.GPU_POOL) or "", gpu.gpu_model, gpu.uuid.lower(), gpu.phase or "Pending",
                    str(status.get("isolationMode") or "soft"), index if isinstance(index, int) else 0,
                    quantity(gpu.capacity.get("tflops"), milli=True), quantity(gpu.capacity.get("vram")),
                    quantity(gpu.available.get("tflops"), milli=True), quantity(gpu.available.get("vram")),
                    str(status.get("message") or ""), parts)


def pod_share(pod: Pod) -> PodShare | None:
    """The share a TF pod holds or asks for (None: not a GPU worker, or annotations unreadable)."""
    try:
        req = request_from_pod(pod, default_pool="")
    except (RequestError, AnnotationError, ValueError):
        return None
    names = tuple(n for n in (pod.meta.annotation(tfa.GPU_IDS) or "").split(",") if n)
    return PodShare(pod.namespace or "default", pod.name, req.workload[1] if req.workload else "", req.pool,
                    req.qos or "medium", req.tflops_request / MILLI, req.tflops_limit / MILLI, req.vram_request,
                    req.vram_limit, max(1, req.count), names or req.gpu_names, req.percent_request / MILLI)


def _shares(cluster: Cluster) -> list[PodFacts]:
    """The TF pods holding or asking for a share (finished ones are done with theirs)."""
    return [f for f in map(pod_facts, cluster.list(r.PODS)) if f.share is not None and not f.finished]


def _gpus(cluster: Cluster) -> list[GpuFacts]:
    return [gpu_facts(g) for g in cluster.list(r.GPUS)]


def _pricing(cluster: Cluster) -> dict[str, billing.PoolPricing]:
    out = {}
    for raw in cluster.list(r.GPUPOOLS):
        pool = GpuPool(raw)
        try:
            out[pool.name] = billing.pool_pricing(pool)
        except billing.PriceError:
            continue
    return out


def hourly_cost(share: PodShare, pricing: Mapping[str, billing.PoolPricing]) -> float:
    worker = billing.WorkerShare(share.tflops_request, max(share.tflops_limit, share.tflops_request),
                                 share.vram_request, max(share.vram_limit, share.vram_request), share.gpu_count,
                                 share.qos)
    return billing.worker_cost(worker, pricing.get(share.pool), 3600.0)


# --- overview -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolRow:
    name: str
    phase: str
    gpus: int
    models: tuple[str, ...]
    nodes_ready: int
    nodes_not_ready: int
    tflops: Bar
    vram: Bar
    pending: int
    workers: int
    node_cost_per_hour: float
    billed_per_hour: float


@dataclass(frozen=True)
class Overview:
    pools: tuple[PoolRow, ...]
    tflops: Bar
    vram: Bar
    gpus: int
    nodes_ready: int
    nodes_not_ready: int
    pending: int
    node_cost_per_hour: float
    billed_per_hour: float
    usage_error: str = ""


def overview(cluster: Cluster, usage: Usage) -> Overview:
    """Per pool: capacity, allocated and used TFLOPS and VRAM, nodes, pending pods, cost."""
    used_by_gpu = usage.by_gpu()
    gpus = _gpus(cluster)
    nodes = {Node(n).name: Node(n) for n in cluster.list(r.NODES)}
    prices = billing.hourly_prices(map(Body, cluster.list(r.PROVIDERCONFIGS)))
    gpunodes = {Body(n).name: Body(n) for n in cluster.list(r.GPUNODES)}
    by_pool: dict[str, list[GpuFacts]] = defaultdict(list)
    for gpu in gpus:
        by_pool[gpu.pool].append(gpu)
    pricing = _pricing(cluster)
    pending: dict[str, int] = defaultdict(int)
    workers: dict[str, int] = defaultdict(int)
    billed: dict[str, float] = defaultdict(float)
    for pod in _shares(cluster):
        share = pod.share
        assert share is not None
        if pod.pending:
            pending[share.pool] += 1
        elif pod.node:
            workers[share.pool] += 1
            billed[share.pool] += hourly_cost(share, pricing)
    names = sorted({*by_pool, *(GpuPool(p).name for p in cluster.list(r.GPUPOOLS))} - {""}) + \
        ([""] if "" in by_pool else [])
    rows = []
    for name in names:
        mine = by_pool.get(name, [])
        pool_raw = cluster.get(r.GPUPOOLS, name) if name else None
        models_by_node: dict[str, list[str]] = defaultdict(list)
        for g in mine:
            models_by_node[g.node].append(g.model)
        node_names = set(models_by_node) - {""}
        ready = sum(1 for n in node_names if n in nodes and nodes[n].ready)
        t_bar, v_bar = _gpu_bars(mine, used_by_gpu, usage.known)
        node_cost = sum(billing.node_hourly_price(gpunodes[n], models_by_node[n], prices)
                        for n in node_names if n in gpunodes)
        rows.append(PoolRow(name or "(no pool)", Body(pool_raw).phase if pool_raw else "", len(mine),
                            tuple(sorted({g.model for g in mine if g.model})), ready, len(node_names) - ready,
                            t_bar, v_bar, pending.get(name, 0), workers.get(name, 0), node_cost,
                            billed.get(name, 0.0)))
    total_t = sum((row.tflops for row in rows), EMPTY_BAR)
    total_v = sum((row.vram for row in rows), EMPTY_BAR)
    return Overview(tuple(rows), total_t, total_v, len(gpus), sum(r_.nodes_ready for r_ in rows),
                    sum(r_.nodes_not_ready for r_ in rows), sum(pending.values()),
                    sum(r_.node_cost_per_hour for r_ in rows), sum(billed.values()), usage.error)


def _gpu_bars(gpus: Iterable[GpuFacts], used_by_gpu: Mapping[str, tuple[float, int]], known: bool
              ) -> tuple[Bar, Bar]:
    cap_t = alloc_t = used_t = 0.0
    cap_v = alloc_v = used_v = 0.0
    for gpu in gpus:
        cap_t += gpu.capacity_tflops
        cap_v += gpu.capacity_vram
        alloc_t += max(0.0, gpu.capacity_tflops - gpu.free_tflops)
        alloc_v += max(0.0, gpu.capacity_vram - gpu.free_vram)
        t, v = used_by_gpu.get(gpu.uuid, (0.0, 0))
        used_t += t
        used_v += v
    return Bar(cap_t, alloc_t, used_t if known else None), Bar(cap_v, alloc_v, used_v if known else None)


# --- GPUs -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodOnGpu:
    namespace: str
    name: str
    qos: str
    tflops: float
    vram: int


@dataclass(frozen=True)
class GpuRow:
    name: str
    node: str
    pool: str
    model: str
    phase: str
    healthy: bool
    isolation: str
    tflops: Bar
    vram: Bar
    pods: tuple[PodOnGpu, ...]
    partitions: tuple[str, ...]
    message: str


@dataclass(frozen=True)
class GpuFilters:
    pool: str = ""
    model: str = ""
    node: str = ""
    page: int = 1


@dataclass(frozen=True)
class GpuPage:
    rows: tuple[GpuRow, ...]
    total: int
    matching: int
    page: int
    pages: int
    filters: GpuFilters
    pools: tuple[str, ...]
    models: tuple[str, ...]
    nodes: tuple[str, ...]
    usage_error: str = ""


def gpu_page(cluster: Cluster, usage: Usage, filters: GpuFilters) -> GpuPage:
    """Every GPU matching the filters, a page at a time, each with the pods on it."""
    gpus = _gpus(cluster)
    matching = [g for g in gpus if (not filters.pool or g.pool == filters.pool)
                and (not filters.model or g.model == filters.model)
                and (not filters.node or g.node == filters.node)]
    matching.sort(key=lambda g: (g.pool, g.node, g.index, g.name))
    pages = max(1, math.ceil(len(matching) / GPUS_PER_PAGE))
    page = min(max(1, filters.page), pages)
    shown = matching[(page - 1) * GPUS_PER_PAGE: page * GPUS_PER_PAGE]
    wanted = {g.name for g in shown}
    on_gpu: dict[str, list[PodOnGpu]] = defaultdict(list)
    for pod in _shares(cluster):
        share = pod.share
        assert share is not None
        for name in share.gpu_names:
            if name in wanted and pod.node:
                on_gpu[name].append(PodOnGpu(share.namespace, share.name, share.qos, share.tflops_request,
                                             share.vram_request))
    used_by_gpu = usage.by_gpu()
    rows = []
    for gpu in shown:
        t_bar, v_bar = _gpu_bars([gpu], used_by_gpu, usage.known)
        rows.append(GpuRow(gpu.name, gpu.node, gpu.pool, gpu.model, gpu.phase, gpu.phase == "Running", gpu.isolation,
                           t_bar, v_bar, tuple(sorted(on_gpu.get(gpu.name, ()), key=lambda p: (p.namespace, p.name))),
                           gpu.partitions, gpu.message))
    return GpuPage(tuple(rows), len(gpus), len(matching), page, pages, filters,
                   tuple(sorted({g.pool for g in gpus} - {""})), tuple(sorted({g.model for g in gpus} - {""})),
                   tuple(sorted({g.node for g in gpus} - {""})), usage.error)


# --- workloads ------------------------------------------------------------------------------------

WorkloadSort = Literal["waste", "cost", "name"]


@dataclass(frozen=True)
class WorkloadRow:
    namespace: str
    name: str
    pool: str
    qos: str
    workers: int
    tflops_request: float
    tflops_limit: float
    vram_request: int
    vram_limit: int
    tflops_used: float | None
    vram_used: int | None
    recommended_tflops: float | None
    recommended_vram: int | None
    cost_per_hour: float

    @property
    def unused_tflops(self) -> float:
        """How much more it asks for than it uses (what sorting by waste orders on)."""
        return self.tflops_request - (self.tflops_used or 0.0) if self.tflops_used is not None else 0.0

    @property
    def used_percent(self) -> float | None:
        if self.tflops_used is None or self.tflops_request <= 0:
            return None
        return self.tflops_used * 100.0 / self.tflops_request


@dataclass(frozen=True)
class WorkloadPage:
    rows: tuple[WorkloadRow, ...]
    sort: WorkloadSort
    usage_error: str = ""


def workload_page(cluster: Cluster, usage: Usage, sort: WorkloadSort = "waste") -> WorkloadPage:
    """Each workload's requests and limits (summed over its running workers), measured use, the
    autoscaler's recommendation and the cost per hour."""
    pricing = _pricing(cluster)
    groups: dict[tuple[str, str], list[PodShare]] = defaultdict(list)
    for pod in _shares(cluster):
        share = pod.share
        if pod.node and share is not None:
            groups[(share.namespace, share.workload or share.name)].append(share)
    recommendations = {}
    for raw in cluster.list(r.TENSORFUSIONWORKLOADS):
        body = Body(raw)
        rec = section(body.status, "recommendation")
        groups.setdefault((body.namespace or "default", body.name), [])
        if rec:
            requests = section(rec, "requests")
            recommendations[(body.namespace or "default", body.name)] = (
                quantity(requests.get("tflops"), milli=True), int(quantity(requests.get("vram"))))
    used = usage.by_workload()
    rows = []
    for (namespace, name), shares in groups.items():
        rec_t, rec_v = recommendations.get((namespace, name), (None, None))
        use = used.get((namespace, name))
        rows.append(WorkloadRow(
            namespace, name, shares[0].pool if shares else "", shares[0].qos if shares else "", len(shares),
            sum(s.tflops_request * s.gpu_count for s in shares), sum(s.tflops_limit * s.gpu_count for s in shares),
            sum(s.vram_request * s.gpu_count for s in shares), sum(s.vram_limit * s.gpu_count for s in shares),
            (use[0] if use else 0.0) if usage.known else None, (use[1] if use else 0) if usage.known else None,
            rec_t, rec_v, sum(hourly_cost(s, pricing) for s in shares)))
    keys = {"waste": lambda w: (-w.unused_tflops, -w.cost_per_hour, w.namespace, w.name),
            "cost": lambda w: (-w.cost_per_hour, w.namespace, w.name),
            "name": lambda w: (w.namespace, w.name)}
    rows.sort(key=keys[sort])
    return WorkloadPage(tuple(rows), sort, usage.error)


# --- pending --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SuggestionView:
    text: str
    command: str


@dataclass(frozen=True)
class PendingRow:
    namespace: str
    name: str
    pool: str
    ask: str
    since: str
    message: str
    nodes: tuple[tuple[str, str], ...]
    suggestions: tuple[SuggestionView, ...]
    explained_by: str


@dataclass(frozen=True)
class PendingPage:
    rows: tuple[PendingRow, ...]
    total: int
    explain_error: str = ""


def pending_pods(cluster: Cluster) -> list[Pod]:
    """Pending TF pods, oldest first."""
    pods = [Pod(f.raw) for f in map(pod_facts, cluster.list(r.PODS)) if f.pending]
    return sorted(pods, key=lambda p: (p.meta.creation_timestamp, p.namespace, p.name))


def pending_page(pods: Sequence[Pod], explanations: Mapping[str, Mapping[str, Any]], total: int,
                 explain_error: str = "") -> PendingPage:
    """Each pending pod with the controller's explanation (its `/api/why` answer, by "ns/name"),
    falling back to the pod's PodScheduled condition when the controller has none."""
    rows = []
    for pod in pods:
        key = f"{pod.namespace or 'default'}/{pod.name}"
        answer = explanations.get(key) or {}
        condition = pod.condition("PodScheduled") or {}
        message = str(answer.get("message") or condition.get("message") or "")
        share = pod_share(pod)
        ask = "" if share is None else _ask(share)
        nodes = tuple((("(every node)" if n == "*" else n), node_reasons(section(s)))
                      for n, s in sorted(section(answer, "nodes").items()))
        namespace = pod.namespace or "default"
        suggestions = tuple(SuggestionView(suggestion_text(s), annotate_command(namespace, pod.name, s))
                            for s in answer.get("suggestions") or () if isinstance(s, Mapping))
        rows.append(PendingRow(pod.namespace or "default", pod.name, share.pool if share else "", ask,
                               pod.meta.creation_timestamp, message or "no scheduler has reported on it yet", nodes,
                               suggestions, "controller" if answer else ("condition" if condition else "")))
    return PendingPage(tuple(rows), total, explain_error)


def _ask(share: PodShare) -> str:
    tflops = f"{share.percent_request:g}% compute" if share.percent_request else f"{share.tflops_request:g} TFLOPS"
    return f"{share.gpu_count} x ({tflops}, {format_bytes(share.vram_request)})"


# --- quotas ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuotaLine:
    what: str
    used: float
    total: float | None
    is_bytes: bool

    @property
    def percent(self) -> float | None:
        return None if not self.total else self.used * 100.0 / self.total


@dataclass(frozen=True)
class QuotaRow:
    namespace: str
    name: str
    alert_percent: float
    lines: tuple[QuotaLine, ...]

    @property
    def alerting(self) -> bool:
        return any((line.percent or 0.0) >= self.alert_percent for line in self.lines)


def quota_rows(cluster: Cluster) -> tuple[QuotaRow, ...]:
    rows = []
    for raw in cluster.list(r.GPURESOURCEQUOTAS):
        body = Body(raw)
        total = section(body.spec, "total")
        used = section(body.status, "used")
        lines = []
        for side in ("requests", "limits"):
            for key, is_bytes in (("tflops", False), ("vram", True)):
                cap = section(total, side).get(key)
                lines.append(QuotaLine(f"{side}.{key}", quantity(section(used, side).get(key), milli=not is_bytes),
                                       quantity(cap, milli=not is_bytes) if cap not in (None, "") else None, is_bytes))
        workers = total.get("maxWorkers")
        lines.append(QuotaLine("workers", float(used.get("workers") or 0),
                               float(workers) if isinstance(workers, int) else None, False))
        alert = total.get("alertThresholdPercent")
        rows.append(QuotaRow(body.namespace or "default", body.name,
                             float(alert) if isinstance(alert, (int, float)) else 95.0, tuple(lines)))
    rows.sort(key=lambda q: (not q.alerting, q.namespace, q.name))
    return tuple(rows)


# --- events ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EventRow:
    time: str
    type: str
    reason: str
    kind: str
    namespace: str
    name: str
    message: str
    count: int


@dataclass(frozen=True)
class EventFilters:
    type: str = ""
    kind: str = ""
    text: str = ""


@dataclass(frozen=True)
class EventPage:
    rows: tuple[EventRow, ...]
    filters: EventFilters
    kinds: tuple[str, ...] = field(default_factory=tuple)


def event_page(cluster: Cluster, filters: EventFilters) -> EventPage:
    """The latest tfusion events (reported by tfusion, or about a tensor-fusion.ai object)."""
    rows = []
    kinds = set()
    text = filters.text.lower()
    for raw in cluster.list(r.EVENTS):
        body = Body(raw)
        involved = section(raw, "involvedObject")
        reporter = str(raw.get("reportingComponent") or section(raw, "source").get("component") or "")
        if not (reporter.startswith(TFUSION_COMPONENT) or str(involved.get("apiVersion", "")).startswith(tfa.DOMAIN)):
            continue
        kind = str(involved.get("kind") or "")
        kinds.add(kind)
        row = EventRow(str(raw.get("lastTimestamp") or raw.get("eventTime") or body.meta.creation_timestamp or ""),
                       str(raw.get("type") or "Normal"), str(raw.get("reason") or ""), kind,
                       str(involved.get("namespace") or ""), str(involved.get("name") or ""),
                       str(raw.get("message") or ""), int(raw.get("count") or 1))
        if (filters.type and row.type != filters.type) or (filters.kind and row.kind != filters.kind):
            continue
        if text and text not in f"{row.reason} {row.name} {row.namespace} {row.message}".lower():
            continue
        rows.append(row)
    rows.sort(key=lambda e: e.time, reverse=True)
    return EventPage(tuple(rows[:EVENTS_SHOWN]), filters, tuple(sorted(kinds - {""})))


# --- formatting shared by the templates -----------------------------------------------------------


def format_bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= size:
            return f"{value / size:.1f} {unit}".replace(".0 ", " ")
    return f"{value:.0f} B"


def format_tflops(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}".removesuffix(".0")


def format_money(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.2f}" if value >= 0.01 or value == 0 else f"{value:.4f}"
