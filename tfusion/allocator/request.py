"""What a pod asks of the allocator, parsed once from its annotations.

`request_from_pod` is the one parser of the GPU annotations (`tflops-request`, `vram-limit`,
`gpu-count`, `isolation`, ...): the scheduler, the extender, simulate-schedule, leader recovery and
the webhook all call it, so a pod means the same thing everywhere. The result is an immutable
`AllocRequest` in allocator units (milli-TFLOPS, bytes, milli-percent) so that no filter ever
parses a string. Rules (reference §2.1, §3.1):
- a missing request defaults to its limit; a missing limit stays 0, which means "no limit" (the
  original's rule: a pod with requests only may burst up to the whole GPU, and its limits count
  nothing against a quota's limit totals);
- TFLOPS and compute percent are alternatives: given both for the request (or both for the limit) is
  an error; compute percent is 0..100;
- a request above its limit (TFLOPS, VRAM or compute percent, in the same unit) is refused by
  `check_within_limits`, which the webhook and simulate-schedule call; `request_from_pod` itself
  does not, so a pod admitted before that rule still parses (its running worker keeps its numbers);
- TFLOPS and VRAM fit in 64 bits in allocator units (as the original's int64 does);
- gpu-count is 1..128 (default 1; `gpu-indices` sets it to their number);
- qos defaults to medium, isolation to soft; the workload is the `workload` label, else the pod;
- topology overrides (`require-gpu-topology`, `gpu-topology-max-tier` 0..3, `gpu-topology-source`)
  are kept as given, None / "" when absent (topology.py merges them with the scheduler config);
- the pod index (the device-plugin handshake, 1..128) is read from the pod's containers: the first
  `<domain>/index_<k>` resource limit (n = 8k + count); 0 when there is none or it is unreadable.
Errors are `RequestError` naming the annotation, the value and what is allowed.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from tfusion.allocator.units import PERCENT_SCALE
from tfusion.api import annotations as tfa
from tfusion.api import podindex
from tfusion.api.accessors import Pod, section
from tfusion.api.annotations import AnnotationError
from tfusion.api.quantity import INT64_MAX, Quantity

MAX_GPU_COUNT = 128
QOS_LEVELS = ("low", "medium", "high", "critical")
#: a pod's priority when it has no spec.priority: the value of the PriorityClass we ship for its QoS
#: (deploy/base/priorityclasses.yaml); `low` has none, so it is kube's default 0 like `medium`
QOS_PRIORITY: Mapping[str, int] = {"low": 0, "medium": 0, "high": 10_000, "critical": 100_000}
ISOLATION_MODES = tfa.ISOLATION_MODES


class RequestError(AnnotationError):
    """A pod annotation cannot be turned into an allocation request (a ValueError).

    `key` is the annotation, `value` what the pod holds and `allowed` what would be accepted.
    """


class RequestOverLimit(RequestError):
    """A request annotation asks for more than its limit annotation allows.

    Kubernetes refuses `requests > limits` for CPU and memory at admission; a GPU pod asking for
    more than its own limit could never be honoured either, so it is refused instead of waiting.
    """

    def __init__(self, key: str, value: str, limit_key: str, limit_value: str) -> None:
        super().__init__(key, value, f"at most {limit_key} ({orjson.dumps(limit_value).decode()})",
                         detail="a request may not exceed its limit")
        self.limit_key = limit_key
        self.limit_value = limit_value
        shown, limit_shown = orjson.dumps(value).decode(), orjson.dumps(limit_value).decode()
        self.args = (f"{key} {shown} is greater than {limit_key} {limit_shown}; a request may not exceed its limit",)


#: each request annotation and the limit annotation it may not exceed
LIMIT_OF: dict[str, str] = {tfa.TFLOPS_REQUEST: tfa.TFLOPS_LIMIT, tfa.VRAM_REQUEST: tfa.VRAM_LIMIT,
                            tfa.COMPUTE_PERCENT_REQUEST: tfa.COMPUTE_PERCENT_LIMIT}


def check_within_limits(amounts: Mapping[str, Quantity], notes: Mapping[str, str]) -> None:
    """Raise `RequestOverLimit` for the first request above its (non-zero) limit.

    `amounts` maps request and limit annotation keys to the values the pod itself states (its
    annotations over its WorkloadProfile; a missing request is its limit); a missing or zero limit
    means "no limit". The namespace quota's defaults are not judged: the original admits a pod
    whose request is above a default limit, and so does tfusion. The message quotes the pod's own
    annotation text where it has one, else the amount and that it comes from the WorkloadProfile.
    """
    for req_key, lim_key in LIMIT_OF.items():
        request, limit = amounts.get(req_key), amounts.get(lim_key)
        if request is not None and limit and request > limit:
            raise RequestOverLimit(req_key, _text(notes, req_key, request), lim_key, _text(notes, lim_key, limit))


def _text(notes: Mapping[str, str], key: str, amount: Quantity) -> str:
    """The pod's own text for `key`, else the amount and where it comes from."""
    return notes.get(key) or f"{amount}, from the WorkloadProfile"


def check_pod_within_limits(pod: Pod) -> None:
    """`check_within_limits` on the request and limit annotations `pod` carries (simulate-schedule)."""
    notes = pod.meta.annotations
    check_within_limits(annotated_amounts(notes), notes)


def annotated_amounts(notes: Mapping[str, str]) -> dict[str, Quantity]:
    """The request and limit annotations a pod carries, parsed, as `check_within_limits` takes them.

    On a side (requests or limits) that gives TFLOPS, compute percent is dropped, as the webhook and
    `request_from_pod` drop it (TFLOPS wins). A missing request is its limit, so it is left out.
    """
    amounts: dict[str, Quantity] = {}
    for key in (*LIMIT_OF, *LIMIT_OF.values()):
        raw = notes.get(key)
        if raw:
            is_percent = key in (tfa.COMPUTE_PERCENT_REQUEST, tfa.COMPUTE_PERCENT_LIMIT)
            amounts[key] = (tfa.parse_compute_percent(raw, key=key) if is_percent
                            else tfa.parse_quantity_annotation(raw, key=key))
    for tflops, percent in ((tfa.TFLOPS_REQUEST, tfa.COMPUTE_PERCENT_REQUEST),
                            (tfa.TFLOPS_LIMIT, tfa.COMPUTE_PERCENT_LIMIT)):
        if amounts.get(tflops):
            amounts.pop(percent, None)
    return amounts


def effective_priority(spec_priority: object, qos: str) -> int:
    """spec.priority when it is an integer, else the priority of the QoS level's PriorityClass."""
    if isinstance(spec_priority, int) and not isinstance(spec_priority, bool):
        return spec_priority
    return QOS_PRIORITY.get(qos, 0)


def tflops_of(tflops: int, percent: int, capacity_milli: int) -> int:
    """milli-TFLOPS of an amount given as TFLOPS or as a compute percent, on a GPU of `capacity_milli`."""
    if tflops or not percent:
        return tflops
    return percent * capacity_milli // PERCENT_SCALE


@dataclass(frozen=True, slots=True)
class Resources:
    """A per-GPU amount: TFLOPS (milli) or compute percent (milli-percent), and VRAM (bytes)."""

    tflops: int = 0
    percent: int = 0
    vram: int = 0

    def tflops_on(self, capacity_milli: int) -> int:
        """milli-TFLOPS of this amount on a GPU of `capacity_milli` (percent converted)."""
        return tflops_of(self.tflops, self.percent, capacity_milli)


@dataclass(frozen=True, slots=True)
class AllocRequest:
    """One pod's GPU request, per GPU, in allocator units.

    `tflops_*` are milli-TFLOPS, `percent_*` milli-percent of a GPU's TFLOPS (used only when the
    TFLOPS value is 0), `vram_*` bytes; a limit of 0 is "no limit". `workload` is (namespace,
    name). `gpu_names` are the GPUs an existing worker already holds (leader recovery).
    `pod_index` is the pod's device-plugin index (1..128; 0 = none): no two pods holding GPUs on
    one node may have the same one (the allocator's node-level index lock).
    `node_affinity` is kept for the deprecated NodeAffinity filter slot and is not evaluated.
    """

    pod_uid: str
    pod_name: str
    namespace: str
    pool: str
    workload: tuple[str, str]
    tflops_request: int = 0
    tflops_limit: int = 0
    percent_request: int = 0
    percent_limit: int = 0
    vram_request: int = 0
    vram_limit: int = 0
    count: int = 1
    gpu_model: str = ""
    vendor: str = ""
    indices: tuple[int, ...] = ()
    qos: str = "medium"
    isolation: str = tfa.DEFAULT_ISOLATION
    partition_template: str = ""
    gpu_names: tuple[str, ...] = ()
    pod_index: int = 0
    node_affinity: Any = field(default=None, compare=False)
    #: the pod's topology overrides (None / "" = the scheduler config's): require-gpu-topology,
    #: gpu-topology-max-tier (0..3), gpu-topology-source (auto|numa|vendor); see topology.py
    topology_required: bool | None = None
    topology_max_tier: int | None = None
    topology_source: str = ""
    #: the pod's scheduling priority (spec.priority, else its QoS's PriorityClass value): preemption
    priority: int = 0

    @property
    def request(self) -> Resources:
        return Resources(self.tflops_request, self.percent_request, self.vram_request)

    @property
    def limit(self) -> Resources:
        return Resources(self.tflops_limit, self.percent_limit, self.vram_limit)

    def with_resources(self, request: Resources, limit: Resources) -> AllocRequest:
        """A copy with a new per-GPU request and limit (vertical resize)."""
        return replace(self, tflops_request=request.tflops, percent_request=request.percent,
                       vram_request=request.vram, tflops_limit=limit.tflops, percent_limit=limit.percent,
                       vram_limit=limit.vram)

    def tflops_need(self, capacity_milli: int) -> int:
        """milli-TFLOPS this request takes from a GPU of `capacity_milli` (percent converted)."""
        return tflops_of(self.tflops_request, self.percent_request, capacity_milli)

    def tflops_limit_on(self, capacity_milli: int) -> int:
        """milli-TFLOPS of the limit on a GPU of `capacity_milli` (percent converted)."""
        return tflops_of(self.tflops_limit, self.percent_limit, capacity_milli)


def request_from_pod(pod: Pod, *, default_pool: str | None = None) -> AllocRequest:
    """Parse a pod's metadata (annotations, labels, uid, name, namespace) into an `AllocRequest`.

    `default_pool` is used when the pod names no pool (the webhook resolves the default pool);
    without either the pod is rejected.
    """
    try:
        return _parse_pod(pod, default_pool)
    except RequestError:
        raise
    except AnnotationError as exc:
        raise RequestError(exc.key, exc.value, exc.allowed, kind=exc.kind, detail=exc.detail) from None


def pod_index_of(pod: Pod) -> int:
    """The pod index its containers ask for: the first `<domain>/index_<k>` limit (init containers
    after the others), 8k + count; 0 when there is none or it cannot be read."""
    return _pod_index(pod)


def _pod_index(pod: Pod) -> int:
    for container in (*pod.containers, *pod.init_containers):
        for name, value in section(container, "resources", "limits").items():
            if podindex.index_resource_number(str(name)) is None:
                continue
            try:
                return podindex.decode_pod_index(str(name), int(str(value)))
            except ValueError:
                continue
    return 0


def _quantity(notes: Mapping[str, str], key: str, *, milli: bool) -> int:
    raw = notes.get(key)
    if raw is None or raw == "":
        return 0
    return fitting_amount(tfa.parse_quantity_annotation(raw, key=key), key=key, raw=raw, milli=milli)


def fitting_amount(q: Quantity, *, key: str, raw: str, milli: bool) -> int:
    """`q` in allocator units (milli-TFLOPS when `milli`, else bytes); raises RequestError quoting
    the pod's own text `raw` when it does not fit in 64 bits."""
    amount = q.milli_value() if milli else q.value()
    if amount > INT64_MAX:  # the original's int64 would overflow; our numbers go to Go clients too
        unit = "milli-TFLOPS" if milli else "bytes"
        raise RequestError(key, raw, f"a quantity of at most {INT64_MAX} {unit}", detail="it does not fit in 64 bits")
    return amount


def _percent(notes: Mapping[str, str], key: str) -> int:
    raw = notes.get(key)
    if raw is None or raw == "":
        return 0
    return tfa.parse_compute_percent(raw, key=key).milli_value()


#: the annotations that say how much of which GPUs a pod asks for; the rest of a request is the
#: pod's own (uid, name, workload label, GPU ids, pod index, priority)
_SHAPE_KEYS = (tfa.GPU_POOL, tfa.TFLOPS_REQUEST, tfa.TFLOPS_LIMIT, tfa.COMPUTE_PERCENT_REQUEST,
               tfa.COMPUTE_PERCENT_LIMIT, tfa.VRAM_REQUEST, tfa.VRAM_LIMIT, tfa.GPU_INDICES, tfa.GPU_COUNT,
               tfa.QOS, tfa.ISOLATION, tfa.REQUIRE_GPU_TOPOLOGY, tfa.GPU_TOPOLOGY_MAX_TIER,
               tfa.GPU_TOPOLOGY_SOURCE, tfa.GPU_MODEL, tfa.VENDOR, tfa.PARTITION_ID)


@dataclass(frozen=True, slots=True)
class _Shape:
    pool: str
    tflops_request: int
    tflops_limit: int
    percent_request: int
    percent_limit: int
    vram_request: int
    vram_limit: int
    count: int
    indices: tuple[int, ...]
    qos: str
    isolation: str
    topology_required: bool | None
    topology_max_tier: int | None
    topology_source: str
    gpu_model: str
    vendor: str
    partition_template: str


def _parse_pod(pod: Pod, default_pool: str | None) -> AllocRequest:
    meta = pod.meta
    notes = meta.annotations
    name = meta.name
    namespace = sys.intern(meta.namespace or "default")
    shape = _shape(tuple(map(notes.get, _SHAPE_KEYS)), default_pool)
    gpu_names: tuple[str, ...] = ()
    if notes.get(tfa.GPU_IDS):
        # interned: the allocator keeps them for as long as the pod runs, many pods to a GPU
        gpu_names = tuple(map(sys.intern, tfa.parse_gpu_ids(notes[tfa.GPU_IDS], key=tfa.GPU_IDS)))
    return AllocRequest(
        pod_uid=meta.uid, pod_name=name, namespace=namespace, pool=shape.pool,
        workload=(namespace, sys.intern(meta.label(tfa.WORKLOAD) or name)),
        tflops_request=shape.tflops_request, tflops_limit=shape.tflops_limit,
        percent_request=shape.percent_request, percent_limit=shape.percent_limit,
        vram_request=shape.vram_request, vram_limit=shape.vram_limit, count=shape.count,
        gpu_model=shape.gpu_model, vendor=shape.vendor, indices=shape.indices, qos=shape.qos,
        isolation=shape.isolation, partition_template=shape.partition_template, gpu_names=gpu_names,
        pod_index=_pod_index(pod), topology_required=shape.topology_required,
        topology_max_tier=shape.topology_max_tier, topology_source=shape.topology_source,
        priority=effective_priority(pod.spec.get("priority"), shape.qos),
    )


@functools.lru_cache(maxsize=4096)
def _shape(values: tuple[str | None, ...], default_pool: str | None) -> _Shape:
    """The annotations of `_SHAPE_KEYS` (their values in that order) read. Cached: a recovery reads
    100,000 pods that ask in a few ways (a refused one raises and is not cached)."""
    notes = {key: value for key, value in zip(_SHAPE_KEYS, values, strict=True) if value is not None}
    pool = sys.intern(notes.get(tfa.GPU_POOL) or default_pool or "")
    if not pool:
        raise RequestError(tfa.GPU_POOL, "", "the name of a GPUPool", detail="no pool given")

    t_req = _quantity(notes, tfa.TFLOPS_REQUEST, milli=True)
    t_lim = _quantity(notes, tfa.TFLOPS_LIMIT, milli=True)
    p_req = _percent(notes, tfa.COMPUTE_PERCENT_REQUEST)
    p_lim = _percent(notes, tfa.COMPUTE_PERCENT_LIMIT)
    for t_key, p_key, t_val, p_val in (
        (tfa.TFLOPS_REQUEST, tfa.COMPUTE_PERCENT_REQUEST, t_req, p_req),
        (tfa.TFLOPS_LIMIT, tfa.COMPUTE_PERCENT_LIMIT, t_lim, p_lim),
    ):
        if t_val and p_val:
            raise RequestError(p_key, notes.get(p_key, ""), f"either {t_key} or {p_key}, not both",
                               detail=f"{t_key} is also set")
    if t_req or t_lim:  # TFLOPS wins over compute percent
        p_req = p_lim = 0
    t_req, p_req = t_req or t_lim, p_req or p_lim
    v_req = _quantity(notes, tfa.VRAM_REQUEST, milli=False)
    v_lim = _quantity(notes, tfa.VRAM_LIMIT, milli=False)
    v_req = v_req or v_lim

    indices: tuple[int, ...] = ()
    if notes.get(tfa.GPU_INDICES):
        indices = tfa.parse_gpu_indices(notes[tfa.GPU_INDICES], key=tfa.GPU_INDICES)
    count = 1
    if indices:
        count = len(indices)
    elif notes.get(tfa.GPU_COUNT):
        count = tfa.parse_gpu_count(notes[tfa.GPU_COUNT], key=tfa.GPU_COUNT)
    if not 1 <= count <= MAX_GPU_COUNT:
        raise RequestError(tfa.GPU_INDICES, notes.get(tfa.GPU_INDICES, ""),
                           f"1 to {MAX_GPU_COUNT} indices")

    qos = "medium"
    if notes.get(tfa.QOS):
        qos = tfa.parse_qos(notes[tfa.QOS], key=tfa.QOS)
    isolation = tfa.DEFAULT_ISOLATION
    if notes.get(tfa.ISOLATION):
        isolation = tfa.parse_isolation(notes[tfa.ISOLATION], key=tfa.ISOLATION)
    required, max_tier, source = tfa.parse_topology_overrides(notes)
    return _Shape(pool, t_req, t_lim, p_req, p_lim, v_req, v_lim, count, indices, qos, isolation, required,
                  max_tier, source, notes.get(tfa.GPU_MODEL, ""), notes.get(tfa.VENDOR, ""),
                  notes.get(tfa.PARTITION_ID, ""))
