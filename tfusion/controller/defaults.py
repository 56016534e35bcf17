"""The one place a GPU pod's defaults are decided: what the pod webhook writes and simulate-schedule judges.

Why it exists: a pod as the user writes it often names no pool, isolation, QoS, vendor or amounts;
the webhook fills them in when the pod is created, from the pod's annotations, its WorkloadProfile,
the pool and the namespace's GPUResourceQuota. `POST /api/simulate-schedule` takes a raw manifest
and must judge it as the pod the webhook would admit. The two used to have a copy each, and the
copies disagreed (simulate ignored WorkloadProfiles and quota defaults, so a profile's pool lost to
the default pool). Now both call `resolve`, which is pure: the pod's view, its annotations and the
cached objects it reads (`Sources`) in, a `Resolved` out, or a `Denial` naming what cannot be
honoured. `request_annotations` writes a `Resolved` as the annotations the scheduler reads.

The rules, in the original webhook's order (reference §2.1-2.3): WorkloadProfile (named by the
annotation, it must exist); pool (annotation, profile, else the GPUPool annotated
`is-default-pool`, which must exist); local or remote mode (annotation, profile, the pool's
`defaultUsingLocalGPU`, else local); sidecar; isolation (annotation, profile, else `soft`; `hard`
needs a sidecar in local mode); vendor (annotation, profile, the pool's
`nodeManagerConfig.defaultVendor`, else NVIDIA); per-GPU amounts (the profile's, overridden by the
annotations, TFLOPS beating a percent; a missing request is its limit; a request above its limit is
refused; then the quota's `single.defaultRequests`/`defaultLimits` fill what is still missing); GPU
count (annotation, indices, profile, the pod's native GPUs, else 1); model; dedicated GPU (request =
limit = one whole GPU of the model); partition; some request must be given unless isolation is
shared or partitioned; QoS (annotation, profile, `high` when limits equal requests for TFLOPS and
VRAM, the pool's `qosConfig.defaultQoS`, else `medium`); a vendor without a soft limiter refuses
soft isolation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tfusion.allocator.partitions import catalog_from_providers
from tfusion.allocator.request import check_within_limits, fitting_amount
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, Gpu, GpuPool, Pod, Workload, items, section, text
from tfusion.api.annotations import AnnotationError
from tfusion.api.jsontypes import JsonMapping
from tfusion.api.quantity import Quantity, QuantityError

DEFAULT_ISOLATION = tfa.DEFAULT_ISOLATION
DEFAULT_QOS = "medium"
EQUAL_LIMITS_QOS = "high"
DEFAULT_VENDOR = "NVIDIA"
#: the remote vGPU worker's image when neither the pool nor the vendor's ProviderConfig names one
DEFAULT_WORKER_IMAGE = "tensorfusion/tensor-fusion-worker:latest"
#: what a pool without a ProviderConfig takes over (the chart's NVIDIA list starts with it)
DEFAULT_IN_USE_RESOURCES = ("nvidia.com/gpu",)
NO_SOFT_LIMITER_VENDORS = frozenset({"amd", "hygon", "metax"})

SIDES = ("requests", "limits")
FIELDS = ("tflops", "compute", "vram")
#: (side, field) -> the annotation that carries it
ANNOTATION_OF = {
    ("requests", "tflops"): tfa.TFLOPS_REQUEST, ("limits", "tflops"): tfa.TFLOPS_LIMIT,
    ("requests", "compute"): tfa.COMPUTE_PERCENT_REQUEST, ("limits", "compute"): tfa.COMPUTE_PERCENT_LIMIT,
    ("requests", "vram"): tfa.VRAM_REQUEST, ("limits", "vram"): tfa.VRAM_LIMIT,
}

Amounts = dict[tuple[str, str], Quantity]


class Denial(Exception):
    """The pod cannot be admitted as written: `code` (400 for the pod's fault) and the message
    kubectl shows after `admission webhook "…" denied the request: ` (simulate-schedule answers
    it as its 400 error)."""

    def __init__(self, message: str, code: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    @classmethod
    def of(cls, exc: AnnotationError) -> Denial:
        return cls(str(exc))


def deny(key: str, value: str, allowed: str, *, detail: str = "", kind: str = "annotation") -> Denial:
    return Denial.of(AnnotationError(key, value, allowed, detail=detail, kind=kind))


@dataclass(frozen=True)
class Sources:
    """The cached objects `resolve` reads (no I/O once built), for one pod or for every pod while
    the objects stay the same."""

    pools: Sequence[JsonMapping]
    provider_configs: Sequence[JsonMapping] = ()
    #: the GPUResourceQuotas of the pod's namespace (the last by name wins, as in the original)
    quotas: Sequence[JsonMapping] = ()
    #: WorkloadProfile of the pod's namespace by name
    profile: Callable[[str], JsonMapping | None] = field(default=lambda name: None)
    #: capacity ({tflops, vram}) of a GPU of this model, from the GPU objects
    gpu_capacity: Callable[[str], JsonMapping | None] = field(default=lambda model: None)

    # What is derived from the objects alone, worked out once per Sources: the webhook keeps one
    # Sources (its Context) while none of the informers it reads has changed, so each is worked out
    # once per change of the cluster, not once per pod.

    @functools.cached_property
    def default_pool(self) -> str | None:
        """`default_pool_name` of the pools."""
        return default_pool_name(self.pools)

    @functools.cached_property
    def pools_by_name(self) -> dict[str, JsonMapping]:
        """Each pool by its name (the first, should two share one)."""
        named: dict[str, JsonMapping] = {}
        for pool in self.pools:
            named.setdefault(GpuPool(pool).name, pool)
        return named

    @functools.cached_property
    def providers_by_name(self) -> list[JsonMapping]:
        """The ProviderConfigs, sorted by name."""
        return sorted(self.provider_configs, key=lambda c: Body(c).name)

    @functools.cached_property
    def in_use_resource_names(self) -> tuple[str, ...]:
        """`in_use_resource_names` of every ProviderConfig."""
        return _resource_names(self.provider_configs)

    def provider_for(self, vendor: str) -> JsonMapping | None:
        """`provider_config_for` the vendor."""
        return self._providers_by_vendor.get(vendor.lower())

    @functools.cached_property
    def _providers_by_vendor(self) -> dict[str, JsonMapping]:
        return providers_by_vendor(self.provider_configs)

    @functools.cached_property
    def quota(self) -> Body | None:
        """The namespace's GPUResourceQuota whose defaults apply: the last by name."""
        return max((Body(q) for q in self.quotas), key=lambda q: q.name, default=None)


@dataclass
class Resolved:
    """What `resolve` decided for one pod."""

    #: the WorkloadProfile (empty without one); read only
    profile: Workload
    pool_name: str
    pool: GpuPool
    local: bool
    sidecar: bool
    isolation: str
    vendor: str
    #: the vendor's ProviderConfig, if any
    provider: JsonMapping | None
    #: the native GPU resources the vendor's ProviderConfig takes over
    native_resources: tuple[str, ...]
    #: container name -> native GPUs it asks for (of `native_resources`)
    natives: dict[str, int]
    amounts: Amounts
    gpu_count: int
    indices: tuple[int, ...]
    #: the native GPU counts written as `container-gpu-count` ({} when the pod has none or is shared)
    container_counts: dict[str, int]
    model: str
    partition: str
    qos: str
    #: the vendor the pod named (annotation, profile or native GPU resource; "" when `vendor` is only
    #: the pool's default): only a named vendor is written, as the original writes it
    named_vendor: str = ""
    #: the GPU model whose capacity the amounts are (a dedicated GPU; "" when no capacity was read)
    capacity_model: str = ""


# --- pools, vendors and native GPU resources -------------------------------------------------------------


def is_default_pool(pool: GpuPool) -> bool:
    """Whether a GPUPool is annotated `is-default-pool` true (any spelling Go's ParseBool reads)."""
    value = pool.meta.annotation(tfa.IS_DEFAULT_POOL)
    if value is None:
        return False
    try:
        return tfa.parse_bool(value, key=tfa.IS_DEFAULT_POOL)
    except AnnotationError:
        return False


def pool_vendor(pool: GpuPool) -> str:
    """The vendor of a pool's GPUs when nothing more specific names one (`defaultVendor`, else NVIDIA)."""
    return text(pool.node_manager_config, "defaultVendor") or DEFAULT_VENDOR


def worker_image(pool: GpuPool | None, provider: JsonMapping | None) -> str:
    """The remote vGPU worker's image: the pool's `componentConfig.worker.image`, else the vendor's
    ProviderConfig `spec.images.remoteWorker`, else the default."""
    pool_image = text(pool.component_config, "worker", "image") if pool is not None else ""
    return pool_image or text(provider, "spec", "images", "remoteWorker") or DEFAULT_WORKER_IMAGE


def default_pool_name(pools: Iterable[JsonMapping]) -> str | None:
    """The name of the default GPUPool (first by name when several are marked), or None."""
    names = sorted(pool.name for pool in map(GpuPool, pools) if is_default_pool(pool) and pool.name)
    return names[0] if names else None


def provider_config_for(configs: Sequence[JsonMapping], vendor: str) -> JsonMapping | None:
    """The ProviderConfig of `vendor` (case-insensitive; the first by name)."""
    return providers_by_vendor(configs).get(vendor.lower())


def providers_by_vendor(configs: Iterable[JsonMapping]) -> dict[str, JsonMapping]:
    """Each vendor's ProviderConfig (the vendor lowercased; of several, the first by name)."""
    found: dict[str, JsonMapping] = {}
    for config in sorted(configs, key=lambda c: Body(c).name):
        found.setdefault(text(config, "spec", "vendor").lower(), config)
    return found


def in_use_resource_names(configs: Sequence[JsonMapping], vendor: str | None = None) -> tuple[str, ...]:
    """The native GPU resource names taken over: of `vendor`'s ProviderConfig, or of every one."""
    return _resource_names([provider_config_for(configs, vendor)] if vendor else configs)


def _resource_names(configs: Iterable[JsonMapping | None]) -> tuple[str, ...]:
    names = [str(n) for c in configs if c for n in items(c, "spec", "inUseResourceNames")]
    return tuple(dict.fromkeys(names)) or DEFAULT_IN_USE_RESOURCES


def native_vendor(pod: Pod, configs: Sequence[JsonMapping]) -> str:
    """The vendor of the first ProviderConfig of `configs` (sorted by name, `Sources.providers_by_name`)
    whose native GPU resources the pod asks for."""
    for config in configs:
        names = [str(n) for n in items(config, "spec", "inUseResourceNames")]
        if names and text(config, "spec", "vendor") and native_gpu_counts(pod, names):
            return text(config, "spec", "vendor")
    return ""


def native_gpu_counts(pod: Pod, names: Sequence[str]) -> dict[str, int]:
    """container name -> native GPUs it asks for (the larger of its limit and request)."""
    counts: dict[str, int] = {}
    for container in pod.containers:
        total = 0
        for name in names:
            amounts = [section(container, "resources", side).get(name) for side in SIDES]
            total += max((_resource_int(a) for a in amounts if a is not None), default=0)
        if total:
            counts[text(container, "name")] = total
    return counts


@functools.lru_cache(maxsize=1024)
def _parse_text(value: str) -> Quantity:
    """Quantities repeat across pods (quota defaults, profiles): parse each spelling once."""
    return Quantity.parse(value)


def capacity_of_model(gpus: Iterable[JsonMapping], model: str) -> JsonMapping | None:
    """The capacity ({tflops, vram}) of the first GPU object of `model` that reports one (what a
    dedicated GPU of that model asks for)."""
    for gpu in gpus:
        view = Gpu(gpu)
        if view.gpu_model == model and view.capacity.get("tflops"):
            return view.capacity
    return None


def parse_quantity(value: Any) -> Quantity:
    """Any decoded JSON value as a quantity (Any: Quantity.parse itself refuses, with a QuantityError
    naming it, a value of a type it cannot read, such as a list or a boolean)."""
    return _parse_text(value) if isinstance(value, str) else Quantity.parse(value)


def _resource_int(value: object) -> int:
    try:
        return parse_quantity(value).value()
    except (QuantityError, TypeError, ValueError):
        return 0


def annotation_bool(notes: Mapping[str, str], key: str) -> bool | None:
    value = notes.get(key)
    return None if value in (None, "") else tfa.parse_bool(str(value), key=key)


# --- the resolution ------------------------------------------------------------------------------------


def resolve(pod: Pod, notes: Mapping[str, str], sources: Sources) -> Resolved:
    """The defaults of `pod` whose annotations are `notes` (the caller's, possibly amended); raises
    Denial (an unreadable annotation is a Denial naming it)."""
    try:
        return _resolve(pod, notes, sources)
    except AnnotationError as exc:
        raise Denial.of(exc) from None


def _resolve(pod: Pod, notes: Mapping[str, str], sources: Sources) -> Resolved:
    profile = _profile(notes, sources, pod.namespace or "default")
    pool_name, pool = _pool(notes, profile, sources)
    local = _check_local(notes, profile, pool)
    if local and notes.get(tfa.WORKER_POD_TEMPLATE):
        raise deny(tfa.WORKER_POD_TEMPLATE, notes[tfa.WORKER_POD_TEMPLATE][:40], "no value in local GPU mode",
                   detail="a worker pod template is for remote vGPU mode")
    wanted = profile.spec  # read once: each view property walks the object again
    sidecar = _first_bool(annotation_bool(notes, tfa.SIDECAR_WORKER), wanted.get("sidecarWorker"))
    isolation = _isolation(notes, profile, sidecar or not local)  # a remote worker can isolate hard
    named_vendor = notes.get(tfa.VENDOR) or text(wanted, "vendor") or native_vendor(pod, sources.providers_by_name)
    vendor = named_vendor or pool_vendor(pool)
    provider = sources.provider_for(vendor)
    native_resources = _resource_names([provider])
    natives = native_gpu_counts(pod, native_resources)
    amounts = _amounts(notes, profile)
    gpu_count, indices = _gpu_count(notes, profile, natives)
    container_counts: dict[str, int] = {}
    if natives and isolation != tfa.ISOLATION_SHARED:
        container_counts = dict(natives)
        if not amounts.get(("limits", "tflops")) and not amounts.get(("limits", "compute")):
            amounts[("limits", "compute")] = Quantity.from_int(100)
    _default_requests_to_limits(amounts)
    check_within_limits({ANNOTATION_OF[k]: v for k, v in amounts.items()}, notes)
    _apply_quota_defaults(amounts, sources.quota)
    _default_requests_to_limits(amounts)
    model = notes.get(tfa.GPU_MODEL) or text(wanted, "gpuModel")
    dedicated = bool(annotation_bool(notes, tfa.DEDICATED_GPU))
    if dedicated:
        _dedicate(amounts, model, sources)
    partition = notes.get(tfa.PARTITION_ID) or text(wanted, "partitionTemplateId")
    _check_requested(amounts, isolation, partition, notes)
    _check_partition_model(isolation, model, sources.provider_configs)
    qos = _qos(notes, profile, amounts, pool)
    _check_vendor(vendor, isolation)
    return Resolved(profile=profile, pool_name=pool_name, pool=pool, local=local, sidecar=sidecar,
                    isolation=isolation, vendor=vendor, provider=provider, native_resources=native_resources,
                    natives=natives, amounts=amounts, gpu_count=gpu_count,
                    indices=indices, container_counts=container_counts, model=model, partition=partition,
                    qos=qos, named_vendor=named_vendor, capacity_model=model if dedicated else "")


def request_annotations(resolved: Resolved) -> dict[str, str]:
    """The annotations that carry `resolved` to the scheduler (the webhook adds its own to these)."""
    notes = {ANNOTATION_OF[key]: tfa.format_quantity(value) for key, value in resolved.amounts.items()}
    notes.update({tfa.QOS: resolved.qos, tfa.GPU_COUNT: tfa.format_gpu_count(resolved.gpu_count),
                  tfa.GPU_POOL: resolved.pool_name,
                  tfa.IS_LOCAL_GPU: tfa.format_bool(True), tfa.SIDECAR_WORKER: tfa.format_bool(resolved.sidecar),
                  tfa.ISOLATION: resolved.isolation})
    if resolved.named_vendor:
        notes[tfa.VENDOR] = resolved.named_vendor
    if resolved.model:
        notes[tfa.GPU_MODEL] = resolved.model
    if resolved.partition:
        notes[tfa.PARTITION_ID] = resolved.partition
    if resolved.container_counts:
        notes[tfa.CONTAINER_GPU_COUNT] = tfa.format_container_gpu_count(resolved.container_counts)
    return notes


def stale_annotations(amounts: Amounts) -> list[str]:
    """Resource annotations that `request_annotations` does not carry (e.g. a percent beaten by
    TFLOPS): the pod must lose them, or the scheduler would read them."""
    return [key for pair, key in ANNOTATION_OF.items() if not amounts.get(pair)]


def _first_bool(*values: object) -> bool:
    return next((value for value in values if isinstance(value, bool)), False)


def _profile(notes: Mapping[str, str], sources: Sources, namespace: str) -> Workload:
    name = notes.get(tfa.WORKLOAD_PROFILE)
    if not name:
        return Workload({})
    profile = sources.profile(name)
    if profile is None:
        raise deny(tfa.WORKLOAD_PROFILE, name, f"the name of a WorkloadProfile in namespace {namespace}",
                   detail="no such WorkloadProfile")
    return Workload(profile)


def _pool(notes: Mapping[str, str], profile: Workload, sources: Sources) -> tuple[str, GpuPool]:
    name = notes.get(tfa.GPU_POOL) or profile.pool_name or sources.default_pool
    if not name:
        raise deny(tfa.GPU_POOL, "", "the name of a GPUPool",
                   detail=f'the pod names no pool and no GPUPool is annotated {tfa.IS_DEFAULT_POOL}: "true"')
    found = sources.pools_by_name.get(name)
    if found is not None:
        return name, GpuPool(found)
    known = ", ".join(sorted(GpuPool(p).name for p in sources.pools)) or "none exists"
    raise deny(tfa.GPU_POOL, name, f"the name of a GPUPool ({known})", detail="no such GPUPool")


def _check_local(notes: Mapping[str, str], profile: Workload, pool: GpuPool) -> bool:
    """Local GPU mode (True) or remote vGPU mode: the annotation, the profile, the pool, else local."""
    local = annotation_bool(notes, tfa.IS_LOCAL_GPU)
    profile_local = profile.spec.get("isLocalGPU")
    if local is None and isinstance(profile_local, bool):
        local = profile_local
    pool_default = pool.spec.get("defaultUsingLocalGPU")
    if local is None and isinstance(pool_default, bool):
        local = pool_default
    return local is not False


def _isolation(notes: Mapping[str, str], profile: Workload, sidecar: bool) -> str:
    if notes.get(tfa.ISOLATION):
        isolation = tfa.parse_isolation(notes[tfa.ISOLATION])
    else:
        isolation = str(profile.spec.get("isolation") or DEFAULT_ISOLATION)
    if isolation == tfa.ISOLATION_HARD and not sidecar:
        raise deny(tfa.ISOLATION, isolation, f'shared, soft or partitioned; hard isolation needs '
                                             f'{tfa.SIDECAR_WORKER}: "true" in local GPU mode')
    return isolation


def _profile_amounts(profile: Workload) -> Amounts:
    amounts: Amounts = {}
    resources = profile.resources
    for side in SIDES if resources else ():
        given = section(resources, side)
        for name in FIELDS:
            raw = given.get(name)
            if raw in (None, ""):
                continue
            try:
                value = parse_quantity(raw)
            except QuantityError as exc:
                raise deny(tfa.WORKLOAD_PROFILE, str(raw), "a non-negative quantity",
                           detail=f"resources.{side}.{name}: {exc.reason}") from None
            if value:
                amounts[(side, name)] = value
    return amounts


def _amounts(notes: Mapping[str, str], profile: Workload) -> Amounts:
    """Per-GPU requests and limits: the profile's, overridden by annotations (TFLOPS beats percent)."""
    amounts = _profile_amounts(profile)
    for side in SIDES:
        given: dict[str, Quantity] = {}
        for name in FIELDS:
            key = ANNOTATION_OF[(side, name)]
            raw = notes.get(key)
            if raw in (None, ""):
                continue
            if name == "compute":
                percent = tfa.parse_compute_percent(raw, key=key)
                if not _tflops_overrides_percent(notes, side):
                    given[name] = percent
                continue
            given[name] = tfa.parse_quantity_annotation(raw, key=key)
            # judged on the pod's own text here: the scheduler reads it back re-formatted ("10e15")
            fitting_amount(given[name], key=key, raw=raw, milli=name == "tflops")
        for name, value in given.items():
            amounts[(side, name)] = value
        if given.get("tflops"):
            amounts.pop((side, "compute"), None)
        elif given.get("compute"):
            amounts.pop((side, "tflops"), None)
    for side in SIDES:
        if amounts.get((side, "tflops")):
            amounts.pop((side, "compute"), None)
    return {k: v for k, v in amounts.items() if v}


def _tflops_overrides_percent(notes: Mapping[str, str], side: str) -> bool:
    """The original's rule: a TFLOPS limit annotation drops both percent annotations, a TFLOPS
    request annotation the percent request; the pod is admitted with TFLOPS alone."""
    sides = SIDES if side == "requests" else ("limits",)
    return any(notes.get(ANNOTATION_OF[(s, "tflops")]) not in (None, "") for s in sides)


def _default_requests_to_limits(amounts: Amounts) -> None:
    """A missing request is its limit (TFLOPS and compute percent count as one value)."""
    if not amounts.get(("requests", "tflops")) and not amounts.get(("requests", "compute")):
        for name in ("tflops", "compute"):
            if amounts.get(("limits", name)):
                amounts[("requests", name)] = amounts[("limits", name)]
    if not amounts.get(("requests", "vram")) and amounts.get(("limits", "vram")):
        amounts[("requests", "vram")] = amounts[("limits", "vram")]


def _apply_quota_defaults(amounts: Amounts, quota: Body | None) -> None:
    """Fill what is still missing from the namespace quota's single.defaultRequests/defaultLimits."""
    if quota is None:
        return
    for side, source in (("requests", "defaultRequests"), ("limits", "defaultLimits")):
        defaults = section(quota.spec, "single", source)
        if not defaults:
            continue
        compute_missing = not amounts.get((side, "tflops")) and not amounts.get((side, "compute"))
        for name in FIELDS:
            if name != "vram" and not compute_missing:
                continue
            if name == "vram" and amounts.get((side, "vram")):
                continue
            value = _quota_quantity(defaults.get(name), quota, f"spec.single.{source}.{name}")
            if value and not (name == "compute" and amounts.get((side, "tflops"))):
                amounts[(side, name)] = value


def _quota_quantity(raw: object, quota: Body, where: str) -> Quantity | None:
    if raw in (None, ""):
        return None
    try:
        return parse_quantity(raw)
    except QuantityError:
        meta = quota.meta
        raise Denial(f"GPUResourceQuota {meta.namespace or None}/{meta.name}: {where}: "
                     f"{orjson.dumps(str(raw)).decode()} is not a quantity; fix the quota") from None


def _gpu_count(notes: Mapping[str, str], profile: Workload,
               natives: Mapping[str, int]) -> tuple[int, tuple[int, ...]]:
    indices: tuple[int, ...] = ()
    wanted = profile.spec
    if notes.get(tfa.GPU_INDICES):
        indices = tfa.parse_gpu_indices(notes[tfa.GPU_INDICES])
    elif isinstance(wanted.get("gpuIndices"), list):
        indices = tuple(int(i) for i in items(wanted, "gpuIndices") if isinstance(i, int))
    profile_count = wanted.get("gpuCount")
    if notes.get(tfa.GPU_COUNT):
        count = tfa.parse_gpu_count(notes[tfa.GPU_COUNT])
    elif indices:
        count = len(indices)
    elif isinstance(profile_count, int) and profile_count:
        count = int(profile_count)
    elif natives:
        count = sum(natives.values())
    else:
        count = 1
    if not tfa.GPU_COUNT_MIN <= count <= tfa.GPU_COUNT_MAX:
        raise deny(tfa.GPU_COUNT, str(count), f"an integer from {tfa.GPU_COUNT_MIN} to {tfa.GPU_COUNT_MAX}",
                   detail="counted from the pod's native GPU resources")
    if indices and len(indices) != count:
        raise deny(tfa.GPU_INDICES, notes.get(tfa.GPU_INDICES, ""), f"exactly {count} indices, as "
                   f"{tfa.GPU_COUNT} says")
    return count, indices


def _dedicate(amounts: Amounts, model: str, sources: Sources) -> None:
    """dedicated-gpu: request = limit = one whole GPU of the named model."""
    if not model:
        raise deny(tfa.DEDICATED_GPU, "true", f'"false", or "true" together with {tfa.GPU_MODEL}',
                   detail="a dedicated GPU needs a model")
    capacity = sources.gpu_capacity(model)
    if not capacity:
        raise deny(tfa.GPU_MODEL, model, "the model of a GPU in the cluster (status.gpuModel)",
                   detail="no GPU of this model is known, so a dedicated one has no size")
    for side in SIDES:
        amounts.pop((side, "compute"), None)
        amounts[(side, "tflops")] = parse_quantity(capacity.get("tflops") or 0)
        amounts[(side, "vram")] = parse_quantity(capacity.get("vram") or 0)


def _check_requested(amounts: Amounts, isolation: str, partition: str, notes: Mapping[str, str]) -> None:
    if any(amounts.get(("requests", n)) for n in FIELDS):
        return
    if partition or isolation == tfa.ISOLATION_SHARED:
        return
    raise deny(tfa.TFLOPS_REQUEST, notes.get(tfa.TFLOPS_REQUEST, ""),
               f"a TFLOPS (or {tfa.COMPUTE_PERCENT_REQUEST}) and a {tfa.VRAM_REQUEST} request, or their "
               f"limits, a WorkloadProfile or the namespace quota's single.defaultRequests",
               detail="the pod asks for no GPU resources")


def _qos(notes: Mapping[str, str], profile: Workload, amounts: Amounts, pool: GpuPool) -> str:
    if notes.get(tfa.QOS):
        return tfa.parse_qos(notes[tfa.QOS])
    if profile.qos in tfa.QOS_LEVELS:
        return profile.qos
    t_req, t_lim = amounts.get(("requests", "tflops")), amounts.get(("limits", "tflops"))
    v_req, v_lim = amounts.get(("requests", "vram")), amounts.get(("limits", "vram"))
    if t_lim and v_lim and t_req == t_lim and v_req == v_lim:
        return EQUAL_LIMITS_QOS
    default = pool.qos_config.get("defaultQoS")
    return str(default) if default in tfa.QOS_LEVELS else DEFAULT_QOS


def _check_partition_model(isolation: str, model: str, providers: Sequence[JsonMapping]) -> None:
    """Partitioned isolation on a named GPU model needs partition templates for it (the allocator's
    lookup: ProviderConfig hardwareMetadata partitionTemplateRefs), or the pod could never run."""
    if isolation != tfa.ISOLATION_PARTITIONED or not model:
        return
    catalog, _ = catalog_from_providers((Body(p).name, Body(p).spec) for p in providers)
    if catalog.for_model(model) is None:
        with_templates = sorted({m.model for m in catalog.models}) or ["none"]
        raise deny(tfa.ISOLATION, isolation, "shared, soft or hard for this GPU model",
                   detail=f"GPU model {model} ({tfa.GPU_MODEL}) has no partition templates in any "
                          f"ProviderConfig (models with templates: {', '.join(with_templates)})")


def _check_vendor(vendor: str, isolation: str) -> None:
    if isolation == tfa.ISOLATION_SOFT and vendor.lower() in NO_SOFT_LIMITER_VENDORS:
        raise deny(tfa.ISOLATION, isolation, "shared, hard (with a sidecar worker) or partitioned",
                   detail=f"vendor {vendor} has no soft limiter")
