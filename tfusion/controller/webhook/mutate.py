"""What the pod webhook does to a pod, as pure functions: pod + cached context in, plan or Denial out.

Why pure: every rule of local GPU mode (reference §2.1-2.3) lives here or in the modules it calls
without I/O, so it is tested on plain dicts, and the HTTP edge (service.py) only gathers the
context, asks for an index or a host port, writes the workload and diffs the result. Two steps:

- `analyse(pod, context, owner)` decides whether the pod is a TensorFusion pod (the enabled label,
  or auto-migration of a native-GPU pod), resolves its request with the resolver simulate-schedule
  shares (tfusion/controller/defaults.py: WorkloadProfile, pool, local/sidecar/isolation, vendor,
  amounts, quota defaults, GPU count, model, dedicated GPU, QoS), then checks what only the webhook
  writes (containers, gang, the annotations read later, host port) and returns a `Plan` (None: not a
  TensorFusion pod, leave it alone). A value that cannot be honoured raises `Denial` (code 400)
  naming the annotation, its value and what is allowed.
- `render.render(pod, plan, index=, host_port=)` (render.py) returns the mutated copy: normalized
  annotations, labels, scheduler, toleration, priority class, index resource, soft-limiter or
  sidecar wiring, host port.

`plan.workload` is the TensorFusionWorkload the pod belongs to (name, labels, annotations, owner,
spec; built by build.py); workloads.py creates or patches it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, GpuPool, Pod, items, section, text
from tfusion.api.annotations import AnnotationError
from tfusion.api.hashing import content_hash
from tfusion.api.jsontypes import JsonMapping, JsonObject, json_copy, json_object
from tfusion.api.quantity import Quantity
from tfusion.api.selectors import SelectorError, label_selector_from_dict
from tfusion.controller.defaults import Denial as Denial  # the webhook's refusal, named where callers look
from tfusion.controller.defaults import (
    Sources,
    annotation_bool,
    deny,
    native_gpu_counts,
    resolve,
    stale_annotations,
)
from tfusion.controller.limiter_source import TFUSION_IMAGE, limiter_source
from tfusion.controller.webhook import build
from tfusion.controller.webhook.build import DEFAULT_HYPERVISOR_PORT, Gang
from tfusion.controller.worker_shape import DATA_HOST_PATH as DATA_HOST_PATH
from tfusion.controller.worker_shape import DATA_VOLUME as DATA_VOLUME
from tfusion.controller.worker_shape import SHM_MOUNT as SHM_MOUNT
from tfusion.controller.worker_shape import SHM_SUBPATH_EXPR as SHM_SUBPATH_EXPR
from tfusion.controller.worker_shape import TRANSPORT_SEGMENT_MIB, WORKER_CONTAINER

if TYPE_CHECKING:
    from tfusion.controller.webhook.remote import RemoteClient

#: vendors whose soft limiter library exists (lowercase -> library); unknown vendors are allowed
LIMITER_LIBRARIES = {"nvidia": "libcuda_limiter.so", "ascend": "libascend_limiter.so",
                     "moorethreads": "libmusa_limiter.so", "ppu": "libppu_limiter.so"}

SOFT_LIMITER_INIT = "init-soft-limiter"
SOFT_LIMITER_VOLUME = "tf-soft-limiter"
SOFT_LIMITER_DIR = "/tensor-fusion-limiter"
NVIDIA_SMI = "/usr/local/bin/nvidia-smi"
TRANSPORT_VOLUME = "tf-transport-shm"
INJECT_LIB_INIT = "inject-lib"
LIBS_VOLUME = "tf-libs"
LIBS_DIR = "/tensor-fusion"
LIBS_CONF_DIR = "/tensor-fusion-conf"
SIDECAR_NAME = WORKER_CONTAINER
SHM_SEGMENT_MIB = TRANSPORT_SEGMENT_MIB


@dataclass(frozen=True)
class Owner:
    """Who the pod's workload belongs to, resolved (with I/O) from the pod's controller chain."""

    #: the TensorFusionWorkload's name: the top owner (Deployment, CronJob, other), else the pod's name
    workload_name: str
    #: the ownerReference the workload gets (controller=true); None: the pod has no controller
    reference: JsonMapping | None = None
    #: replicas the owner asks for (gang size); None when unknown
    replicas: int | None = None
    #: the pod's direct controller (ReplicaSet, Job, …): the grey-release counter lives on it
    counter_owner: JsonMapping | None = None


@dataclass(frozen=True)
class Context(Sources):
    """What the webhook reads from the caches for the pods of one namespace (no I/O once built; the
    webhook keeps one while the cluster does not change, service.py `context`): the resolver's
    sources (pools, provider configs, quotas, profiles, GPU capacities) and the webhook's own."""

    templates: Sequence[JsonMapping] = ()
    #: the dynamic config's `autoMigration` ({enable, scope: {includes, excludes}})
    auto_migration: JsonMapping | None = None
    namespace_labels: Mapping[str, str] = field(default_factory=dict)
    #: base URL of the controller's HTTP API that remote client pods ask for their worker
    operator_endpoint: str = ""
    #: NVIDIA_OPERATOR_PROGRESSIVE_MIGRATION: native-GPU pods not migrated go to our scheduler
    progressive: bool = False
    #: the tfusion image, whose limiter soft pods get unless the ProviderConfig names a middleware image
    limiter_image: str = TFUSION_IMAGE

    def template_hash(self, pool_name: str, pool: GpuPool) -> str:
        """`pool_template_hash` of a pool of these sources, worked out once per Context (hashing
        cost as much as the rest of a pod's labels)."""
        found = self._template_hashes.get(pool_name)
        if found is None:
            found = self._template_hashes[pool_name] = pool_template_hash(pool)
        return found

    @functools.cached_property
    def _template_hashes(self) -> dict[str, str]:
        return {}


@dataclass
class HostPortSlot:
    container: int
    port: int


@dataclass
class Plan:
    """Everything `render` writes, decided by `analyse`."""

    pool: GpuPool
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
    workload: JsonObject
    native_resources: tuple[str, ...]
    enabled_replicas: int | None = None
    host_port: HostPortSlot | None = None
    disabled_features: tuple[str, ...] = ()
    middleware_image: str = ""
    #: middleware_image is tfusion's own (its limiter at a fixed path, no nvidia-smi), not a vendor's
    limiter_own: bool = False
    client_image: str = ""
    worker_image: str = ""
    hypervisor_port: int = DEFAULT_HYPERVISOR_PORT
    migrated: bool = False
    #: remote vGPU mode: what the client pod gets (remote.py); None in local GPU mode
    remote: RemoteClient | None = None
    #: the GPU model whose capacity the analysis read (a dedicated GPU; "" when none): the memo
    #: compares that capacity again
    capacity_model: str = ""


def pool_template_hash(pool: GpuPool) -> str:
    """A short hash of the pool's client component config: pods injected under one config share it."""
    return content_hash(section(pool.component_config, "client"), 10)


# --- auto-migration ----------------------------------------------------------------------------------


def _rules_match(rules: object, pod: Pod, namespace: str, ns_labels: Mapping[str, str]) -> bool:
    """Whether an includes/excludes block names this pod (any of its rules)."""
    if not isinstance(rules, Mapping):
        return False
    if namespace in items(rules, "namespaceNames"):
        return True
    for key, subject in (("namespaceSelector", ns_labels), ("podSelector", pod.meta.labels)):
        selector = rules.get(key)
        if isinstance(selector, Mapping):
            try:
                if label_selector_from_dict(selector, field=f"autoMigration {key}").matches(subject):
                    return True
            except SelectorError:
                continue
    return False


def auto_migration_applies(config: JsonMapping | None, pod: Pod, namespace: str,
                           ns_labels: Mapping[str, str]) -> bool:
    """The dynamic config's autoMigration: enabled, not excluded, and included (no includes: all)."""
    if not isinstance(config, Mapping) or config.get("enable") is not True:
        return False
    scope = config.get("scope")
    if not isinstance(scope, Mapping):
        return True  # no scope (or one that is not a map): every pod
    if _rules_match(scope.get("excludes"), pod, namespace, ns_labels):
        return False
    includes = scope.get("includes")
    return includes is None or _rules_match(includes, pod, namespace, ns_labels)


def auto_migration_enabled(config: object) -> bool:
    """Whether the dynamic config's autoMigration block (any decoded value) is switched on."""
    return isinstance(config, Mapping) and config.get("enable") is True


#: schedulers a progressive-migration pod may be taken from (another named scheduler is the user's choice)
DEFAULT_SCHEDULERS = ("", "default-scheduler")


def progressive_only(view: Pod, context: Context) -> bool:
    """Progressive migration: a native-GPU pod without the enabled label, not taken by
    auto-migration, left to the default scheduler; it only changes scheduler (`progressive_pod`)."""
    if not context.progressive:
        return False
    try:
        if _label_enabled(view.meta.labels) is not None:
            return False
    except AnnotationError:
        return False  # analyse denies it
    if view.scheduler_name not in DEFAULT_SCHEDULERS:
        return False
    if not native_gpu_counts(view, context.in_use_resource_names):
        return False
    namespace = view.namespace or "default"
    return not auto_migration_applies(context.auto_migration, view, namespace, context.namespace_labels)


def progressive_pod(pod: Pod) -> JsonObject:
    """The pod as progressive migration sends it: to tensor-fusion-scheduler, nothing else changed."""
    return {**json_object(pod.raw), "spec": {**json_object(pod.spec), "schedulerName": tfa.SCHEDULER_NAME}}


# --- analysis ----------------------------------------------------------------------------------------


def _label_enabled(labels: Mapping[str, str]) -> bool | None:
    value = labels.get(tfa.ENABLED)
    return None if value in (None, "") else tfa.parse_bool(str(value), key=tfa.ENABLED, kind="label")


def selects(view: Pod, context: Context) -> bool:
    """Whether `analyse` may have work for this pod (cheap: no owner lookup for other pods). A
    malformed enabled label counts, so that `analyse` denies it."""
    try:
        enabled = _label_enabled(view.meta.labels)
    except AnnotationError:
        return True
    if enabled is not None:
        return enabled
    return (auto_migration_enabled(context.auto_migration) or context.progressive) and bool(
        native_gpu_counts(view, context.in_use_resource_names))


def analyse(pod: Pod, context: Context, owner: Owner) -> Plan | None:
    """The plan for `pod`, None when it is not a TensorFusion pod; raises Denial."""
    try:
        return _analyse(pod, context, owner)
    except AnnotationError as exc:
        raise Denial.of(exc) from None


def _migration(pod: Pod, ctx: Context, labels: dict[str, str], notes: dict[str, str]) -> bool | None:
    """None: not a TensorFusion pod; True: a native-GPU pod auto-migration takes (`labels` and
    `notes` amended as the original amends them); False: labelled enabled."""
    enabled = _label_enabled(labels)
    if enabled:
        return False
    if enabled is False or not native_gpu_counts(pod, ctx.in_use_resource_names):
        return None
    if not auto_migration_applies(ctx.auto_migration, pod, pod.namespace or "default", ctx.namespace_labels):
        return None
    labels[tfa.ENABLED] = "true"
    notes.setdefault(tfa.ISOLATION, tfa.ISOLATION_SHARED)
    return True


def _analyse(pod: Pod, ctx: Context, owner: Owner) -> Plan | None:
    namespace = pod.namespace or "default"
    notes, labels = dict(pod.meta.annotations), dict(pod.meta.labels)
    migrated = _migration(pod, ctx, labels, notes)
    if migrated is None:
        return None
    res = resolve(pod, notes, ctx)
    inject = _inject_containers(pod, notes, res.natives)
    gang = _gang(notes, owner)
    _check_misc(notes)
    host_port = _host_port_slot(pod, labels)
    workload_name = owner.workload_name
    spec = build.workload_spec(res, notes, gang)
    _merge_vertical_scaling(spec, res.pool, ctx.templates, labels)
    disabled = tfa.parse_disable_features(notes[tfa.DISABLE_FEATURES]) if notes.get(tfa.DISABLE_FEATURES) else ()
    enabled_replicas = (tfa.parse_int(notes[tfa.ENABLED_REPLICAS], key=tfa.ENABLED_REPLICAS, minimum=0)
                        if notes.get(tfa.ENABLED_REPLICAS) else None)
    new_notes = build.normalized_annotations(res, inject, gang, namespace, workload_name)
    if owner.reference is None:
        new_notes[tfa.PENDING_OWNED_WORKLOAD] = workload_name
    if not res.sidecar:
        new_notes[tfa.EMBEDDED_WORKER] = "true"
    new_labels = {tfa.ENABLED: labels[tfa.ENABLED], tfa.COMPONENT: tfa.COMPONENT_WORKER,
                  tfa.GPU_POOL: res.pool_name, tfa.WORKLOAD: workload_name,
                  tfa.POD_TEMPLATE_HASH: ctx.template_hash(res.pool_name, res.pool)}
    if migrated and not pod.meta.annotation(tfa.ISOLATION):
        new_notes[tfa.ISOLATION] = res.isolation
    workload = build.workload_object(workload_name, namespace, res.pool_name, owner.reference, spec, notes,
                                     res.container_counts)
    client, worker = build.images(res.pool, res.provider)
    limiter = limiter_source(res.provider, res.vendor, ctx.limiter_image)
    plan = Plan(pool=res.pool, pool_name=res.pool_name, vendor=res.vendor, isolation=res.isolation, qos=res.qos,
                sidecar=res.sidecar, gpu_count=res.gpu_count, inject=inject, amounts=res.amounts,
                annotations=new_notes, remove_annotations=[*stale_annotations(res.amounts), tfa.INDEX,
                                                        tfa.PENDING_OWNED_WORKLOAD_SPEC],
                labels=new_labels, workload=workload,
                native_resources=res.native_resources,
                enabled_replicas=enabled_replicas, host_port=host_port, disabled_features=disabled,
                middleware_image=limiter.image if limiter else "", limiter_own=bool(limiter and limiter.own),
                client_image=client, worker_image=worker,
                hypervisor_port=build.hypervisor_port(res.pool), migrated=migrated,
                capacity_model=res.capacity_model)
    if res.local:
        if owner.reference is None:  # the pod reconciler creates it once the pod exists, owned by it
            plan.annotations[tfa.PENDING_OWNED_WORKLOAD_SPEC] = build.pending_workload(workload)
        return plan
    from tfusion.controller.webhook.remote import remote_plan  # remote.py imports this module

    return remote_plan(plan, pod, notes, res.profile, ctx.operator_endpoint)


def _inject_containers(pod: Pod, notes: Mapping[str, str], natives: Mapping[str, int]) -> list[str]:
    names = [text(c, "name") for c in pod.containers]
    if not names:
        raise Denial("the pod has no containers")
    if notes.get(tfa.INJECT_CONTAINER):
        chosen = list(tfa.parse_csv(notes[tfa.INJECT_CONTAINER], key=tfa.INJECT_CONTAINER))
        for name in chosen:
            if name not in names:
                raise deny(tfa.INJECT_CONTAINER, notes[tfa.INJECT_CONTAINER],
                           "a comma list of the pod's containers (" + ", ".join(names) + ")",
                           detail=f"there is no container {name!r}")
        return chosen
    if natives:
        return [n for n in names if n in natives]
    if len(names) == 1:
        return names
    raise deny(tfa.INJECT_CONTAINER, "", "a comma list of the pod's containers that use the GPU ("
               + ", ".join(names) + ")", detail=f"the pod has {len(names)} containers")


def _gang(notes: Mapping[str, str], owner: Owner) -> Gang | None:
    min_members = (tfa.parse_gang_min_members(notes[tfa.GANG_MIN_MEMBERS])
                   if notes.get(tfa.GANG_MIN_MEMBERS) else 0)
    timeout = notes.get(tfa.GANG_TIMEOUT, "")
    if timeout:
        tfa.parse_gang_timeout(timeout)
    if not annotation_bool(notes, tfa.GANG_ENABLED):
        return None
    desired = owner.replicas
    if desired is None or desired < 2:
        raise deny(tfa.GANG_ENABLED, notes[tfa.GANG_ENABLED], '"false" for this pod',
                   detail="gang scheduling needs a controller with at least 2 replicas (Deployment, "
                          f"ReplicaSet, StatefulSet or Job); this pod's has {desired if desired else 'none'}")
    if min_members > desired:
        raise deny(tfa.GANG_MIN_MEMBERS, notes[tfa.GANG_MIN_MEMBERS],
                   f"0 (all replicas) or an integer from 2 to {desired} (the replicas)")
    required = min_members if min_members >= 2 else desired
    return Gang(desired=desired, required=required, min_members=min_members, timeout=timeout)


def _check_misc(notes: Mapping[str, str]) -> None:
    """Annotations read later (scheduler, autoscaler): checked now, so a typo is refused at once."""
    if notes.get(tfa.EVICTION_PROTECTION):
        tfa.parse_duration(notes[tfa.EVICTION_PROTECTION], key=tfa.EVICTION_PROTECTION)
    tfa.parse_topology_overrides(notes)
    if notes.get(tfa.AUTOSCALE):
        tfa.parse_bool(notes[tfa.AUTOSCALE], key=tfa.AUTOSCALE)
    if notes.get(tfa.AUTOSCALE_TARGET):
        tfa.parse_autoscale_target(notes[tfa.AUTOSCALE_TARGET])


def _host_port_slot(pod: Pod, labels: Mapping[str, str]) -> HostPortSlot | None:
    mode = labels.get(tfa.HOST_PORT)
    if not mode:
        return None
    if mode != tfa.HOST_PORT_AUTO:
        raise deny(tfa.HOST_PORT, mode, f'"{tfa.HOST_PORT_AUTO}"', kind="label")
    wanted = labels.get(tfa.PORT_NAME, "")
    named: list[str] = []
    for ci, container in enumerate(pod.containers):
        for pi, port in enumerate(items(container, "ports")):
            if isinstance(port, Mapping) and port.get("name"):
                named.append(str(port["name"]))
                if port["name"] == wanted:
                    return HostPortSlot(ci, pi)
    raise deny(tfa.PORT_NAME, wanted, "the name of one of the pod's container ports ("
               + (", ".join(named) or "it has no named ports") + ")", kind="label")


def _merge_vertical_scaling(spec: JsonObject, pool: GpuPool, templates: Sequence[JsonMapping],
                            labels: Mapping[str, str]) -> None:
    """The first verticalScalingRule of the pool's SchedulingConfigTemplate that selects the pod adds
    its autoScalingConfig (what the pod or profile set wins)."""
    name = text(pool.spec, "schedulingConfigTemplate")
    template = next((t for t in templates if Body(t).name == name), None) if name else None
    for rule in items(template, "spec", "verticalScalingRules"):
        if not isinstance(rule, Mapping):
            continue
        try:
            if not label_selector_from_dict(section(rule, "selector")).matches(labels):
                continue
        except SelectorError:
            continue
        config = rule.get("autoScalingConfig")
        if isinstance(config, Mapping):
            spec["autoScalingConfig"] = _merge_missing(json_object(config), section(spec, "autoScalingConfig"))
        return


def _merge_missing(base: JsonObject, winner: JsonMapping) -> JsonObject:
    for key, value in winner.items():
        kept = base.get(key)
        if isinstance(value, Mapping) and isinstance(kept, dict):
            base[key] = _merge_missing(dict(kept), value)
        else:
            base[key] = json_copy(value)
    return base
