"""What the pod webhook does to a pod, as pure functions: pod + cached context in, plan or Denial out.

Why pure: every rule of local GPU mode (reference §2.1-2.3) lives here without I/O, so it is
tested on plain dicts, and the HTTP edge (server.py) only gathers the context, asks for an index
or a host port, writes the workload and diffs the result. Two steps:

- `analyse(pod, context, owner)` reads and checks every annotation in the original's order
  (WorkloadProfile, pool, local/sidecar/isolation, annotations, quota defaults, GPU count, QoS,
  vendor, dedicated GPU, containers, gang, host port) and returns a `Plan` (None: not a
  TensorFusion pod, leave it alone). A value that cannot be honoured raises `Denial` (code 400)
  naming the annotation, its value and what is allowed.
- `render.render(pod, plan, index=, host_port=)` (render.py) returns the mutated copy: normalized
  annotations, labels, scheduler, toleration, priority class, index resource, soft-limiter or
  sidecar wiring, host port.

`plan.workload` is the TensorFusionWorkload the pod belongs to (name, labels, annotations, owner,
spec); workloads.py creates or patches it.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from tfusion.allocator.request import check_within_limits
from tfusion.api import annotations as tfa
from tfusion.api.annotations import AnnotationError
from tfusion.api.hashing import content_hash
from tfusion.api.quantity import Quantity, QuantityError
from tfusion.api.selectors import SelectorError, label_selector_from_dict
from tfusion.controller.scheduling.defaults import DEFAULT_QOS, EQUAL_LIMITS_QOS, default_pool_name

if TYPE_CHECKING:
    from tfusion.controller.webhook.remote import RemoteClient

Obj = dict[str, Any]

DEFAULT_VENDOR = "NVIDIA"
#: what a pool without a ProviderConfig takes over (the chart's NVIDIA list starts with it)
DEFAULT_IN_USE_RESOURCES = ("nvidia.com/gpu",)
DEFAULT_MIDDLEWARE_IMAGES = {"nvidia": "tensorfusion/vgpu-provider-nvidia:latest"}
DEFAULT_WORKER_IMAGE = "tensorfusion/tensor-fusion-worker:latest"
DEFAULT_CLIENT_IMAGE = "tensorfusion/tensor-fusion-client:latest"
DEFAULT_HYPERVISOR_PORT = 8001
#: vendors whose soft limiter library exists (lowercase -> library); unknown vendors are allowed
LIMITER_LIBRARIES = {"nvidia": "libcuda_limiter.so", "ascend": "libascend_limiter.so",
                     "moorethreads": "libmusa_limiter.so", "ppu": "libppu_limiter.so"}
NO_SOFT_LIMITER_VENDORS = frozenset({"amd", "hygon", "metax"})

SOFT_LIMITER_INIT = "init-soft-limiter"
SOFT_LIMITER_VOLUME = "tf-soft-limiter"
SOFT_LIMITER_DIR = "/tensor-fusion-limiter"
DATA_VOLUME = "tf-data"
DATA_HOST_PATH = "/run/tensor-fusion"
SHM_MOUNT = "/run/tensor-fusion/shm"
SHM_SUBPATH_EXPR = "shm/$(POD_NAMESPACE)/$(POD_NAME)"
NVIDIA_SMI = "/usr/local/bin/nvidia-smi"
SIDECAR_NAME = "tensorfusion-worker"
TRANSPORT_VOLUME = "tf-transport-shm"
INJECT_LIB_INIT = "inject-lib"
LIBS_VOLUME = "tf-libs"
LIBS_DIR = "/tensor-fusion"
SHM_SEGMENT_MIB = 1024

SIDES = ("requests", "limits")
_FIELDS = ("tflops", "compute", "vram")
_ANNOTATION_OF = {
    ("requests", "tflops"): "TFLOPS_REQUEST", ("limits", "tflops"): "TFLOPS_LIMIT",
    ("requests", "compute"): "COMPUTE_PERCENT_REQUEST", ("limits", "compute"): "COMPUTE_PERCENT_LIMIT",
    ("requests", "vram"): "VRAM_REQUEST", ("limits", "vram"): "VRAM_LIMIT",
}


class Denial(Exception):
    """The pod cannot be admitted as written: `code` (400 for the pod's fault) and the message
    kubectl shows after `admission webhook "…" denied the request: `."""

    def __init__(self, message: str, code: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    @classmethod
    def of(cls, exc: AnnotationError) -> Denial:
        return cls(str(exc))


def _deny(key: str, value: str, allowed: str, *, detail: str = "", kind: str = "annotation") -> Denial:
    return Denial.of(AnnotationError(key, value, allowed, detail=detail, kind=kind))


@dataclass(frozen=True)
class Owner:
    """Who the pod's workload belongs to, resolved (with I/O) from the pod's controller chain."""

    #: the TensorFusionWorkload's name: the top owner (Deployment, CronJob, other), else the pod's name
    workload_name: str
    #: the ownerReference the workload gets (controller=true); None: the pod has no controller
    reference: Obj | None = None
    #: replicas the owner asks for (gang size); None when unknown
    replicas: int | None = None
    #: the pod's direct controller (ReplicaSet, Job, …): the grey-release counter lives on it
    counter_owner: Obj | None = None


@dataclass(frozen=True)
class Context:
    """What the webhook reads from the caches for one pod (no I/O once built)."""

    pools: Sequence[Obj]
    provider_configs: Sequence[Obj] = ()
    #: the GPUResourceQuotas of the pod's namespace (the last by name wins, as in the original)
    quotas: Sequence[Obj] = ()
    #: WorkloadProfile of the pod's namespace by name
    profile: Callable[[str], Obj | None] = field(default=lambda name: None)
    #: capacity ({tflops, vram}) of a GPU of this model, from the GPU objects
    gpu_capacity: Callable[[str], Mapping[str, Any] | None] = field(default=lambda model: None)
    templates: Sequence[Obj] = ()
    #: the dynamic config's `autoMigration` ({enable, scope: {includes, excludes}})
    auto_migration: Mapping[str, Any] | None = None
    namespace_labels: Mapping[str, str] = field(default_factory=dict)
    #: base URL of the controller's HTTP API that remote client pods ask for their worker
    operator_endpoint: str = ""
    #: NVIDIA_OPERATOR_PROGRESSIVE_MIGRATION: native-GPU pods not migrated go to our scheduler
    progressive: bool = False


@dataclass
class HostPortSlot:
    container: int
    port: int


@dataclass
class Plan:
    """Everything `render` writes, decided by `analyse`."""

    pool: Obj
    pool_name: str
    vendor: str
    isolation: str
    qos: str
    sidecar: bool
    gpu_count: int
    inject: list[str]
    amounts: dict[tuple[str, str], Quantity]
    annotations: dict[str, str]
    remove_annotations: list[str]
    labels: dict[str, str]
    workload: Obj
    native_resources: tuple[str, ...]
    enabled_replicas: int | None = None
    host_port: HostPortSlot | None = None
    disabled_features: tuple[str, ...] = ()
    middleware_image: str = ""
    client_image: str = ""
    worker_image: str = ""
    hypervisor_port: int = DEFAULT_HYPERVISOR_PORT
    migrated: bool = False
    #: remote vGPU mode: what the client pod gets (remote.py); None in local GPU mode
    remote: RemoteClient | None = None


# --- small readers -------------------------------------------------------------------------------


# JSON documents are plain dicts: `isinstance(x, dict)` here, as the ABC check costs more per pod


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    value = obj.get("metadata")
    return value if isinstance(value, dict) else {}


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    value = obj.get("spec")
    return value if isinstance(value, dict) else {}


def dig(obj: Mapping[str, Any], *path: str) -> Any:
    current: Any = obj
    for key in path:
        if not isinstance(current, dict):
            return None
        current = current.get(key)
    return current


def _name(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj).get("name") or "")


def pod_containers(pod: Mapping[str, Any]) -> list[Obj]:
    containers = _spec(pod).get("containers")
    return [c for c in containers if isinstance(c, dict)] if isinstance(containers, list) else []


def provider_config_for(configs: Sequence[Obj], vendor: str) -> Obj | None:
    for config in sorted(configs, key=_name):
        if str(_spec(config).get("vendor") or "").lower() == vendor.lower():
            return config
    return None


def in_use_resource_names(configs: Sequence[Obj], vendor: str | None = None) -> tuple[str, ...]:
    """The native GPU resource names taken over: of `vendor`'s ProviderConfig, or of every one."""
    chosen = [provider_config_for(configs, vendor)] if vendor else list(configs)
    names = [str(n) for c in chosen if c for n in (_spec(c).get("inUseResourceNames") or [])]
    return tuple(dict.fromkeys(names)) or DEFAULT_IN_USE_RESOURCES


def native_gpu_counts(pod: Mapping[str, Any], names: Sequence[str]) -> dict[str, int]:
    """container name -> native GPUs it asks for (the larger of its limit and request)."""
    counts: dict[str, int] = {}
    for container in pod_containers(pod):
        resources = container.get("resources") or {}
        total = 0
        for name in names:
            amounts = [(resources.get(side) or {}).get(name) for side in SIDES]
            total += max((_resource_int(a) for a in amounts if a is not None), default=0)
        if total:
            counts[str(container.get("name") or "")] = total
    return counts


@functools.lru_cache(maxsize=1024)
def _parse_text(text: str) -> Quantity:
    """Quantities repeat across pods (quota defaults, profiles): parse each spelling once."""
    return Quantity.parse(text)


def parse_quantity(value: Any) -> Quantity:
    return _parse_text(value) if isinstance(value, str) else Quantity.parse(value)


def json_copy(value: Any) -> Any:
    """A deep copy of a JSON document (several times faster than copy.deepcopy)."""
    return orjson.loads(orjson.dumps(value))


def _resource_int(value: Any) -> int:
    try:
        return parse_quantity(value).value()
    except (QuantityError, TypeError, ValueError):
        return 0


def pool_template_hash(pool: Mapping[str, Any]) -> str:
    """A short hash of the pool's client component config: pods injected under one config share it."""
    client = dig(pool, "spec", "componentConfig", "client") or {}
    return content_hash(client, 10)


# --- auto-migration ----------------------------------------------------------------------------------


def _rules_match(rules: Any, pod: Mapping[str, Any], namespace: str, ns_labels: Mapping[str, str]) -> bool:
    """Whether an includes/excludes block names this pod (any of its rules)."""
    if not isinstance(rules, Mapping):
        return False
    if namespace in (rules.get("namespaceNames") or []):
        return True
    labels = _meta(pod).get("labels") or {}
    for key, subject in (("namespaceSelector", ns_labels), ("podSelector", labels)):
        selector = rules.get(key)
        if isinstance(selector, Mapping):
            try:
                if label_selector_from_dict(selector, field=f"autoMigration {key}").matches(subject):
                    return True
            except SelectorError:
                continue
    return False


def auto_migration_applies(config: Mapping[str, Any] | None, pod: Mapping[str, Any], namespace: str,
                           ns_labels: Mapping[str, str]) -> bool:
    """The dynamic config's autoMigration: enabled, not excluded, and included (no includes: all)."""
    if not isinstance(config, Mapping) or config.get("enable") is not True:
        return False
    scope = config.get("scope") or {}
    if not isinstance(scope, Mapping):
        return True
    if _rules_match(scope.get("excludes"), pod, namespace, ns_labels):
        return False
    includes = scope.get("includes")
    return includes is None or _rules_match(includes, pod, namespace, ns_labels)


def auto_migration_enabled(config: Mapping[str, Any] | None) -> bool:
    return isinstance(config, Mapping) and config.get("enable") is True


#: schedulers a progressive-migration pod may be taken from (another named scheduler is the user's choice)
DEFAULT_SCHEDULERS = ("", "default-scheduler")


def progressive_only(pod: Mapping[str, Any], context: Context) -> bool:
    """Progressive migration: a native-GPU pod without the enabled label, not taken by
    auto-migration, left to the default scheduler; it only changes scheduler (`progressive_pod`)."""
    if not context.progressive:
        return False
    try:
        if _label_enabled(_meta(pod).get("labels") or {}) is not None:
            return False
    except AnnotationError:
        return False  # analyse denies it
    if str(_spec(pod).get("schedulerName") or "") not in DEFAULT_SCHEDULERS:
        return False
    if not native_gpu_counts(pod, in_use_resource_names(context.provider_configs)):
        return False
    namespace = str(_meta(pod).get("namespace") or "default")
    return not auto_migration_applies(context.auto_migration, pod, namespace, context.namespace_labels)


def progressive_pod(pod: Mapping[str, Any]) -> Obj:
    """The pod as progressive migration sends it: to tensor-fusion-scheduler, nothing else changed."""
    return {**pod, "spec": {**_spec(pod), "schedulerName": tfa.SCHEDULER_NAME}}


# --- analysis ----------------------------------------------------------------------------------------


def _annotation_bool(notes: Mapping[str, str], key: str) -> bool | None:
    value = notes.get(key)
    return None if value in (None, "") else tfa.parse_bool(str(value), key=key)


def _label_enabled(labels: Mapping[str, str]) -> bool | None:
    value = labels.get(tfa.ENABLED)
    return None if value in (None, "") else tfa.parse_bool(str(value), key=tfa.ENABLED, kind="label")


def selects(pod: Mapping[str, Any], context: Context) -> bool:
    """Whether `analyse` may have work for this pod (cheap: no owner lookup for other pods). A
    malformed enabled label counts, so that `analyse` denies it."""
    labels = _meta(pod).get("labels") or {}
    try:
        enabled = _label_enabled(labels)
    except AnnotationError:
        return True
    if enabled is not None:
        return enabled
    return (auto_migration_enabled(context.auto_migration) or context.progressive) and bool(
        native_gpu_counts(pod, in_use_resource_names(context.provider_configs)))


def analyse(pod: Mapping[str, Any], context: Context, owner: Owner) -> Plan | None:
    """The plan for `pod`, None when it is not a TensorFusion pod; raises Denial."""
    try:
        return _analyse(pod, context, owner)
    except AnnotationError as exc:
        raise Denial.of(exc) from None


def _analyse(pod: Mapping[str, Any], ctx: Context, owner: Owner) -> Plan | None:
    meta = _meta(pod)
    namespace = str(meta.get("namespace") or "default")
    notes: dict[str, str] = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
    labels: dict[str, str] = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    migrated = False
    enabled = _label_enabled(labels)
    if not enabled:
        natives = native_gpu_counts(pod, in_use_resource_names(ctx.provider_configs))
        if enabled is False or not natives:
            return None
        if not auto_migration_applies(ctx.auto_migration, pod, namespace, ctx.namespace_labels):
            return None
        migrated = True
        labels[tfa.ENABLED] = "true"
        notes.setdefault(tfa.ISOLATION, tfa.ISOLATION_SHARED)
    profile = _profile_spec(notes, ctx, namespace)
    pool_name, pool = _pool(notes, profile, ctx)
    local = _check_local(notes, profile, pool)
    if local and notes.get(tfa.WORKER_POD_TEMPLATE):
        raise _deny(tfa.WORKER_POD_TEMPLATE, notes[tfa.WORKER_POD_TEMPLATE][:40], "no value in local GPU mode",
                    detail="a worker pod template is for remote vGPU mode")
    sidecar = _first_bool(_annotation_bool(notes, tfa.SIDECAR_WORKER), profile.get("sidecarWorker"), False)
    isolation = _isolation(notes, profile, sidecar or not local)  # a remote worker can isolate hard
    vendor = str(notes.get(tfa.VENDOR) or profile.get("vendor")
                 or dig(pool, "spec", "nodeManagerConfig", "defaultVendor") or DEFAULT_VENDOR)
    provider = provider_config_for(ctx.provider_configs, vendor)
    natives = native_gpu_counts(pod, in_use_resource_names(ctx.provider_configs, vendor))
    amounts = _amounts(notes, profile)
    gpu_count, indices = _gpu_count(notes, profile, natives)
    container_counts: dict[str, int] = {}
    if natives and isolation != tfa.ISOLATION_SHARED:
        container_counts = dict(natives)
        if not amounts.get(("limits", "tflops")) and not amounts.get(("limits", "compute")):
            amounts[("limits", "compute")] = Quantity.from_int(100)
    _default_requests_to_limits(amounts)
    check_within_limits({getattr(tfa, _ANNOTATION_OF[k]): v for k, v in amounts.items()}, notes)
    _apply_quota_defaults(amounts, ctx.quotas)
    _default_requests_to_limits(amounts)
    model = str(notes.get(tfa.GPU_MODEL) or profile.get("gpuModel") or "")
    if _annotation_bool(notes, tfa.DEDICATED_GPU):
        _dedicate(amounts, model, ctx)
    partition = str(notes.get(tfa.PARTITION_ID) or profile.get("partitionTemplateId") or "")
    _check_requested(amounts, isolation, partition, notes)
    qos = _qos(notes, profile, amounts, pool)
    _check_vendor(vendor, isolation)
    inject = _inject_containers(pod, notes, natives)
    gang = _gang(notes, owner)
    _check_misc(notes)
    host_port = _host_port_slot(pod, labels)
    workload_name = owner.workload_name
    spec = _workload_spec(profile, pool_name, amounts, qos, sidecar, isolation, gpu_count, indices, model,
                          vendor, partition, notes, gang)
    _merge_vertical_scaling(spec, pool, ctx.templates, labels)
    disabled = tfa.parse_disable_features(notes[tfa.DISABLE_FEATURES]) if notes.get(tfa.DISABLE_FEATURES) else ()
    enabled_replicas = (tfa.parse_int(notes[tfa.ENABLED_REPLICAS], key=tfa.ENABLED_REPLICAS, minimum=0)
                        if notes.get(tfa.ENABLED_REPLICAS) else None)
    new_notes = _normalized_annotations(amounts, qos, gpu_count, pool_name, model, vendor, sidecar, inject,
                                        isolation, partition, container_counts, gang, namespace, workload_name)
    if owner.reference is None:
        new_notes[tfa.PENDING_OWNED_WORKLOAD] = workload_name
    if not sidecar:
        new_notes[tfa.EMBEDDED_WORKER] = "true"
    new_labels = {tfa.ENABLED: labels[tfa.ENABLED], tfa.COMPONENT: tfa.COMPONENT_WORKER,
                  tfa.GPU_POOL: pool_name, tfa.WORKLOAD: workload_name,
                  tfa.POD_TEMPLATE_HASH: pool_template_hash(pool)}
    if migrated and not (meta.get("annotations") or {}).get(tfa.ISOLATION):
        new_notes[tfa.ISOLATION] = isolation
    workload = _workload_object(workload_name, namespace, pool_name, owner, spec, notes, container_counts)
    images = _images(pool, provider, vendor)
    plan = Plan(pool=pool, pool_name=pool_name, vendor=vendor, isolation=isolation, qos=qos, sidecar=sidecar,
                gpu_count=gpu_count, inject=inject, amounts=amounts, annotations=new_notes,
                remove_annotations=_stale_annotations(amounts), labels=new_labels, workload=workload,
                native_resources=in_use_resource_names(ctx.provider_configs, vendor),
                enabled_replicas=enabled_replicas, host_port=host_port, disabled_features=disabled,
                middleware_image=images[0], client_image=images[1], worker_image=images[2],
                hypervisor_port=_hypervisor_port(pool), migrated=migrated)
    if local:
        return plan
    from tfusion.controller.webhook.remote import remote_plan  # remote.py imports this module

    return remote_plan(plan, pod, notes, profile, ctx.operator_endpoint)


def _first_bool(*values: Any) -> bool:
    for value in values:
        if isinstance(value, bool):
            return value
    return False


def _profile_spec(notes: Mapping[str, str], ctx: Context, namespace: str) -> Obj:
    name = notes.get(tfa.WORKLOAD_PROFILE)
    if not name:
        return {}
    profile = ctx.profile(name)
    if profile is None:
        raise _deny(tfa.WORKLOAD_PROFILE, name, f"the name of a WorkloadProfile in namespace {namespace}",
                    detail="no such WorkloadProfile")
    return dict(json_copy(_spec(profile)))


def _pool(notes: Mapping[str, str], profile: Mapping[str, Any], ctx: Context) -> tuple[str, Obj]:
    name = notes.get(tfa.GPU_POOL) or str(profile.get("poolName") or "") or default_pool_name(ctx.pools)
    if not name:
        raise _deny(tfa.GPU_POOL, "", "the name of a GPUPool",
                    detail=f'the pod names no pool and no GPUPool is annotated {tfa.IS_DEFAULT_POOL}: "true"')
    for pool in ctx.pools:
        if _name(pool) == name:
            return name, pool
    known = ", ".join(sorted(_name(p) for p in ctx.pools)) or "none exists"
    raise _deny(tfa.GPU_POOL, name, f"the name of a GPUPool ({known})", detail="no such GPUPool")


def _check_local(notes: Mapping[str, str], profile: Mapping[str, Any], pool: Mapping[str, Any]) -> bool:
    """Local GPU mode (True) or remote vGPU mode: the annotation, the profile, the pool, else local."""
    local = _annotation_bool(notes, tfa.IS_LOCAL_GPU)
    if local is None and isinstance(profile.get("isLocalGPU"), bool):
        local = profile["isLocalGPU"]
    if local is None and isinstance(dig(pool, "spec", "defaultUsingLocalGPU"), bool):
        local = dig(pool, "spec", "defaultUsingLocalGPU")
    return local is not False


def _isolation(notes: Mapping[str, str], profile: Mapping[str, Any], sidecar: bool) -> str:
    if notes.get(tfa.ISOLATION):
        isolation = tfa.parse_isolation(notes[tfa.ISOLATION])
    else:
        isolation = str(profile.get("isolation") or tfa.DEFAULT_ISOLATION)
    if isolation == tfa.ISOLATION_HARD and not sidecar:
        raise _deny(tfa.ISOLATION, isolation, f'shared, soft or partitioned; hard isolation needs '
                                              f'{tfa.SIDECAR_WORKER}: "true" in local GPU mode')
    return isolation


def _profile_amounts(profile: Mapping[str, Any]) -> dict[tuple[str, str], Quantity]:
    amounts: dict[tuple[str, str], Quantity] = {}
    for side in SIDES:
        for name in _FIELDS:
            raw = dig(profile, "resources", side, name)
            if raw in (None, ""):
                continue
            try:
                value = parse_quantity(raw)
            except QuantityError as exc:
                raise _deny(tfa.WORKLOAD_PROFILE, str(raw), "a non-negative quantity",
                            detail=f"resources.{side}.{name}: {exc.reason}") from None
            if value:
                amounts[(side, name)] = value
    return amounts


def _amounts(notes: Mapping[str, str], profile: Mapping[str, Any]) -> dict[tuple[str, str], Quantity]:
    """Per-GPU requests and limits: the profile's, overridden by annotations (TFLOPS beats percent)."""
    amounts = _profile_amounts(profile)
    for side in SIDES:
        given: dict[str, Quantity] = {}
        for name in _FIELDS:
            key = getattr(tfa, _ANNOTATION_OF[(side, name)])
            raw = notes.get(key)
            if raw in (None, ""):
                continue
            given[name] = (tfa.parse_compute_percent(raw, key=key) if name == "compute"
                           else tfa.parse_quantity_annotation(raw, key=key))
        if given.get("tflops") and given.get("compute"):
            t_key, p_key = (getattr(tfa, _ANNOTATION_OF[(side, n)]) for n in ("tflops", "compute"))
            raise _deny(p_key, notes[p_key], f"either {t_key} or {p_key}, not both", detail=f"{t_key} is also set")
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


def _default_requests_to_limits(amounts: dict[tuple[str, str], Quantity]) -> None:
    """A missing request is its limit (TFLOPS and compute percent count as one value)."""
    if not amounts.get(("requests", "tflops")) and not amounts.get(("requests", "compute")):
        for name in ("tflops", "compute"):
            if amounts.get(("limits", name)):
                amounts[("requests", name)] = amounts[("limits", name)]
    if not amounts.get(("requests", "vram")) and amounts.get(("limits", "vram")):
        amounts[("requests", "vram")] = amounts[("limits", "vram")]


def _quota(quotas: Sequence[Obj]) -> Obj | None:
    return sorted(quotas, key=_name)[-1] if quotas else None


def _apply_quota_defaults(amounts: dict[tuple[str, str], Quantity], quotas: Sequence[Obj]) -> None:
    """Fill what is still missing from the namespace quota's single.defaultRequests/defaultLimits."""
    quota = _quota(quotas)
    if quota is None:
        return
    for side, source in (("requests", "defaultRequests"), ("limits", "defaultLimits")):
        defaults = dig(quota, "spec", "single", source)
        if not isinstance(defaults, Mapping):
            continue
        compute_missing = not amounts.get((side, "tflops")) and not amounts.get((side, "compute"))
        for name in _FIELDS:
            if name != "vram" and not compute_missing:
                continue
            if name == "vram" and amounts.get((side, "vram")):
                continue
            value = _quota_quantity(defaults.get(name), quota, f"spec.single.{source}.{name}")
            if value and not (name == "compute" and amounts.get((side, "tflops"))):
                amounts[(side, name)] = value


def _quota_quantity(raw: Any, quota: Mapping[str, Any], where: str) -> Quantity | None:
    if raw in (None, ""):
        return None
    try:
        return parse_quantity(raw)
    except QuantityError:
        namespace = _meta(quota).get("namespace")
        raise Denial(f"GPUResourceQuota {namespace}/{_name(quota)}: {where}: {orjson.dumps(str(raw)).decode()} is not "
                     f"a quantity; fix the quota") from None


def _gpu_count(notes: Mapping[str, str], profile: Mapping[str, Any],
               natives: Mapping[str, int]) -> tuple[int, tuple[int, ...]]:
    indices: tuple[int, ...] = ()
    if notes.get(tfa.GPU_INDICES):
        indices = tfa.parse_gpu_indices(notes[tfa.GPU_INDICES])
    elif isinstance(profile.get("gpuIndices"), list):
        indices = tuple(int(i) for i in profile["gpuIndices"] if isinstance(i, int))
    if notes.get(tfa.GPU_COUNT):
        count = tfa.parse_gpu_count(notes[tfa.GPU_COUNT])
    elif indices:
        count = len(indices)
    elif isinstance(profile.get("gpuCount"), int) and profile["gpuCount"]:
        count = int(profile["gpuCount"])
    elif natives:
        count = sum(natives.values())
    else:
        count = 1
    if not tfa.GPU_COUNT_MIN <= count <= tfa.GPU_COUNT_MAX:
        raise _deny(tfa.GPU_COUNT, str(count), f"an integer from {tfa.GPU_COUNT_MIN} to {tfa.GPU_COUNT_MAX}",
                    detail="counted from the pod's native GPU resources")
    if indices and len(indices) != count:
        raise _deny(tfa.GPU_INDICES, notes.get(tfa.GPU_INDICES, ""), f"exactly {count} indices, as "
                    f"{tfa.GPU_COUNT} says")
    return count, indices


def _dedicate(amounts: dict[tuple[str, str], Quantity], model: str, ctx: Context) -> None:
    """dedicated-gpu: request = limit = one whole GPU of the named model."""
    if not model:
        raise _deny(tfa.DEDICATED_GPU, "true", f'"false", or "true" together with {tfa.GPU_MODEL}',
                    detail="a dedicated GPU needs a model")
    capacity = ctx.gpu_capacity(model)
    if not capacity:
        raise _deny(tfa.GPU_MODEL, model, "the model of a GPU in the cluster (status.gpuModel)",
                    detail="no GPU of this model is known, so a dedicated one has no size")
    for side in SIDES:
        amounts.pop((side, "compute"), None)
        amounts[(side, "tflops")] = Quantity.parse(capacity.get("tflops") or 0)
        amounts[(side, "vram")] = Quantity.parse(capacity.get("vram") or 0)


def _check_requested(amounts: Mapping[tuple[str, str], Quantity], isolation: str, partition: str,
                     notes: Mapping[str, str]) -> None:
    if any(amounts.get(("requests", n)) for n in _FIELDS):
        return
    if partition or isolation == tfa.ISOLATION_SHARED:
        return
    raise _deny(tfa.TFLOPS_REQUEST, notes.get(tfa.TFLOPS_REQUEST, ""),
                f"a TFLOPS (or {tfa.COMPUTE_PERCENT_REQUEST}) and a {tfa.VRAM_REQUEST} request, or their "
                f"limits, a WorkloadProfile or the namespace quota's single.defaultRequests",
                detail="the pod asks for no GPU resources")


def _qos(notes: Mapping[str, str], profile: Mapping[str, Any], amounts: Mapping[tuple[str, str], Quantity],
         pool: Mapping[str, Any]) -> str:
    if notes.get(tfa.QOS):
        return tfa.parse_qos(notes[tfa.QOS])
    if profile.get("qos") in tfa.QOS_LEVELS:
        return str(profile["qos"])
    t_req, t_lim = amounts.get(("requests", "tflops")), amounts.get(("limits", "tflops"))
    v_req, v_lim = amounts.get(("requests", "vram")), amounts.get(("limits", "vram"))
    if t_lim and v_lim and t_req == t_lim and v_req == v_lim:
        return EQUAL_LIMITS_QOS
    default = dig(pool, "spec", "qosConfig", "defaultQoS")
    return str(default) if default in tfa.QOS_LEVELS else DEFAULT_QOS


def _check_vendor(vendor: str, isolation: str) -> None:
    if isolation == tfa.ISOLATION_SOFT and vendor.lower() in NO_SOFT_LIMITER_VENDORS:
        raise _deny(tfa.ISOLATION, isolation, "shared, hard (with a sidecar worker) or partitioned",
                    detail=f"vendor {vendor} has no soft limiter")


def _inject_containers(pod: Mapping[str, Any], notes: Mapping[str, str], natives: Mapping[str, int]) -> list[str]:
    names = [str(c.get("name") or "") for c in pod_containers(pod)]
    if not names:
        raise Denial("the pod has no containers")
    if notes.get(tfa.INJECT_CONTAINER):
        chosen = list(tfa.parse_csv(notes[tfa.INJECT_CONTAINER], key=tfa.INJECT_CONTAINER))
        for name in chosen:
            if name not in names:
                raise _deny(tfa.INJECT_CONTAINER, notes[tfa.INJECT_CONTAINER],
                            "a comma list of the pod's containers (" + ", ".join(names) + ")",
                            detail=f"there is no container {name!r}")
        return chosen
    if natives:
        return [n for n in names if n in natives]
    if len(names) == 1:
        return names
    raise _deny(tfa.INJECT_CONTAINER, "", "a comma list of the pod's containers that use the GPU ("
                + ", ".join(names) + ")", detail=f"the pod has {len(names)} containers")


@dataclass(frozen=True)
class Gang:
    desired: int
    required: int
    min_members: int
    timeout: str


def _gang(notes: Mapping[str, str], owner: Owner) -> Gang | None:
    min_members = (tfa.parse_gang_min_members(notes[tfa.GANG_MIN_MEMBERS])
                   if notes.get(tfa.GANG_MIN_MEMBERS) else 0)
    timeout = notes.get(tfa.GANG_TIMEOUT, "")
    if timeout:
        tfa.parse_gang_timeout(timeout)
    if not _annotation_bool(notes, tfa.GANG_ENABLED):
        return None
    desired = owner.replicas
    if desired is None or desired < 2:
        raise _deny(tfa.GANG_ENABLED, notes[tfa.GANG_ENABLED], '"false" for this pod',
                    detail="gang scheduling needs a controller with at least 2 replicas (Deployment, "
                           f"ReplicaSet, StatefulSet or Job); this pod's has {desired if desired else 'none'}")
    if min_members > desired:
        raise _deny(tfa.GANG_MIN_MEMBERS, notes[tfa.GANG_MIN_MEMBERS],
                    f"0 (all replicas) or an integer from 2 to {desired} (the replicas)")
    required = min_members if min_members >= 2 else desired
    return Gang(desired=desired, required=required, min_members=min_members, timeout=timeout)


def _check_misc(notes: Mapping[str, str]) -> None:
    """Annotations read later (scheduler, autoscaler): checked now, so a typo is refused at once."""
    if notes.get(tfa.EVICTION_PROTECTION):
        tfa.parse_duration(notes[tfa.EVICTION_PROTECTION], key=tfa.EVICTION_PROTECTION)
    if notes.get(tfa.REQUIRE_GPU_TOPOLOGY):
        tfa.parse_bool(notes[tfa.REQUIRE_GPU_TOPOLOGY], key=tfa.REQUIRE_GPU_TOPOLOGY)
    if notes.get(tfa.GPU_TOPOLOGY_MAX_TIER):
        tfa.parse_int(notes[tfa.GPU_TOPOLOGY_MAX_TIER], key=tfa.GPU_TOPOLOGY_MAX_TIER, minimum=0)
    if notes.get(tfa.AUTOSCALE):
        tfa.parse_bool(notes[tfa.AUTOSCALE], key=tfa.AUTOSCALE)
    if notes.get(tfa.AUTOSCALE_TARGET):
        tfa.parse_autoscale_target(notes[tfa.AUTOSCALE_TARGET])


def _host_port_slot(pod: Mapping[str, Any], labels: Mapping[str, str]) -> HostPortSlot | None:
    mode = labels.get(tfa.HOST_PORT)
    if not mode:
        return None
    if mode != tfa.HOST_PORT_AUTO:
        raise _deny(tfa.HOST_PORT, mode, f'"{tfa.HOST_PORT_AUTO}"', kind="label")
    wanted = labels.get(tfa.PORT_NAME, "")
    named: list[str] = []
    for ci, container in enumerate(pod_containers(pod)):
        for pi, port in enumerate(container.get("ports") or []):
            if isinstance(port, Mapping) and port.get("name"):
                named.append(str(port["name"]))
                if port["name"] == wanted:
                    return HostPortSlot(ci, pi)
    raise _deny(tfa.PORT_NAME, wanted, "the name of one of the pod's container ports ("
                + (", ".join(named) or "it has no named ports") + ")", kind="label")


def _quantity_map(amounts: Mapping[tuple[str, str], Quantity], side: str) -> Obj:
    # the CRD requires tflops and vram in every Resource; "0" means none
    result: Obj = {"tflops": str(amounts.get((side, "tflops")) or "0"),
                   "vram": str(amounts.get((side, "vram")) or "0")}
    if amounts.get((side, "compute")):
        result["compute"] = str(amounts[(side, "compute")])
    return result


def _workload_spec(profile: Obj, pool_name: str, amounts: Mapping[tuple[str, str], Quantity], qos: str,
                   sidecar: bool, isolation: str, gpu_count: int, indices: tuple[int, ...], model: str,
                   vendor: str, partition: str, notes: Mapping[str, str], gang: Gang | None) -> Obj:
    spec: Obj = json_copy(profile)
    spec.pop("workerPodTemplate", None)
    spec.update({"poolName": pool_name, "qos": qos, "isLocalGPU": True, "sidecarWorker": sidecar,
                 "isolation": isolation, "gpuCount": gpu_count, "vendor": vendor,
                 "resources": {"requests": _quantity_map(amounts, "requests"),
                               "limits": _quantity_map(amounts, "limits")}})
    for key, value in (("gpuModel", model), ("partitionTemplateId", partition)):
        if value:
            spec[key] = value
    if indices:
        spec["gpuIndices"] = list(indices)
    if _annotation_bool(notes, tfa.AUTOSCALE):
        auto = spec.setdefault("autoScalingConfig", {}).setdefault("autoSetResources", {})
        auto["enable"] = True
        auto["targetResource"] = tfa.parse_autoscale_target(notes[tfa.AUTOSCALE_TARGET]) \
            if notes.get(tfa.AUTOSCALE_TARGET) else "all"
    if gang is not None:
        gang_spec: Obj = {"minMembers": gang.min_members}
        if gang.timeout:
            gang_spec["timeout"] = gang.timeout
        spec["gangScheduling"] = gang_spec
    return spec


def _merge_vertical_scaling(spec: Obj, pool: Mapping[str, Any], templates: Sequence[Obj],
                            labels: Mapping[str, str]) -> None:
    """The first verticalScalingRule of the pool's SchedulingConfigTemplate that selects the pod adds
    its autoScalingConfig (what the pod or profile set wins)."""
    name = dig(pool, "spec", "schedulingConfigTemplate")
    template = next((t for t in templates if _name(t) == name), None)
    for rule in (_spec(template).get("verticalScalingRules") or []) if template else []:
        if not isinstance(rule, Mapping):
            continue
        try:
            if not label_selector_from_dict(rule.get("selector") or {}).matches(labels):
                continue
        except SelectorError:
            continue
        config = rule.get("autoScalingConfig")
        if isinstance(config, Mapping):
            spec["autoScalingConfig"] = _merge_missing(dict(config), spec.get("autoScalingConfig") or {})
        return


def _merge_missing(base: Obj, winner: Mapping[str, Any]) -> Obj:
    for key, value in winner.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), Mapping):
            base[key] = _merge_missing(dict(base[key]), value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def _normalized_annotations(amounts: Mapping[tuple[str, str], Quantity], qos: str, gpu_count: int,
                            pool_name: str, model: str, vendor: str, sidecar: bool, inject: list[str],
                            isolation: str, partition: str, container_counts: Mapping[str, int],
                            gang: Gang | None, namespace: str, workload: str) -> dict[str, str]:
    notes: dict[str, str] = {}
    for (side, name), value in amounts.items():
        notes[getattr(tfa, _ANNOTATION_OF[(side, name)])] = str(value)
    notes.update({tfa.QOS: qos, tfa.GPU_COUNT: str(gpu_count), tfa.GPU_POOL: pool_name, tfa.VENDOR: vendor,
                  tfa.IS_LOCAL_GPU: "true", tfa.SIDECAR_WORKER: "true" if sidecar else "false",
                  tfa.INJECT_CONTAINER: ",".join(inject), tfa.ISOLATION: isolation})
    if model:
        notes[tfa.GPU_MODEL] = model
    if partition:
        notes[tfa.PARTITION_ID] = partition
    if container_counts:
        notes[tfa.CONTAINER_GPU_COUNT] = orjson.dumps(dict(sorted(container_counts.items()))).decode()
    if gang is not None:
        notes[tfa.GANG_DESIRED_MEMBERS] = str(gang.desired)
        notes[tfa.GANG_REQUIRED_MEMBERS] = str(gang.required)
        notes[tfa.GANG_GROUP_KEY] = f"{namespace}/{workload}"
    return notes


def _stale_annotations(amounts: Mapping[tuple[str, str], Quantity]) -> list[str]:
    """Resource annotations that the normalized set does not carry (e.g. a percent beaten by TFLOPS),
    and the index, which the scheduler writes."""
    stale = [getattr(tfa, key) for pair, key in _ANNOTATION_OF.items() if not amounts.get(pair)]
    return [*stale, tfa.INDEX]


def _workload_object(name: str, namespace: str, pool_name: str, owner: Owner, spec: Obj,
                     notes: Mapping[str, str], container_counts: Mapping[str, int]) -> Obj:
    annotations = {tfa.WORKLOAD_MODE: tfa.WORKLOAD_MODE_DYNAMIC}
    if notes.get(tfa.DISABLE_FEATURES):
        annotations[tfa.DISABLE_FEATURES] = ",".join(tfa.parse_disable_features(notes[tfa.DISABLE_FEATURES]))
    if container_counts:
        annotations[tfa.CONTAINER_GPU_COUNT] = orjson.dumps(dict(sorted(container_counts.items()))).decode()
    meta: Obj = {"name": name, "namespace": namespace, "labels": {tfa.GPU_POOL: pool_name},
                 "annotations": annotations}
    if owner.reference is not None:
        meta["ownerReferences"] = [dict(owner.reference)]
    return {"apiVersion": "tensor-fusion.ai/v1", "kind": "TensorFusionWorkload", "metadata": meta, "spec": spec}


def _images(pool: Mapping[str, Any], provider: Mapping[str, Any] | None, vendor: str) -> tuple[str, str, str]:
    images = dig(provider or {}, "spec", "images") or {}
    middleware = str(images.get("middleware") or DEFAULT_MIDDLEWARE_IMAGES.get(vendor.lower(), ""))
    client = str(images.get("remoteClient") or dig(pool, "spec", "componentConfig", "client", "image")
                 or DEFAULT_CLIENT_IMAGE)
    worker = str(dig(pool, "spec", "componentConfig", "worker", "image") or images.get("remoteWorker")
                 or DEFAULT_WORKER_IMAGE)
    return middleware, client, worker


def _hypervisor_port(pool: Mapping[str, Any]) -> int:
    port = dig(pool, "spec", "componentConfig", "hypervisor", "portNumber")
    return port if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536 \
        else DEFAULT_HYPERVISOR_PORT
