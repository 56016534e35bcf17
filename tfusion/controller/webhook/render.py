"""Rendering the webhook's plan into the pod: the second, pure half of mutate.py.

`render(pod, plan, index=, host_port=)` returns the mutated copy of the pod as `analyse` planned
it: normalized annotations and labels, the scheduler, the `used-by` toleration, the priority class
for high and critical QoS, native GPU resources replaced by the index resource, the pool's
`patchToContainer`, the soft limiter (init container, volumes, env, mounts) or the sidecar worker,
and the host port. The original pod is never changed.

Types: the pod being written is a `JsonObject` (what it is: decoded JSON, copied as deep as it is
written, `writable_copy`, then diffed into the JSON patch); `build.child` and `build.entries` are
the one way into its nested objects and lists, so a field of the wrong type is replaced rather than
written into. The small fixed shapes the webhook adds (env vars, volume mounts, the toleration) are
TypedDicts, so their keys are checked.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any, Final, NotRequired, TypedDict

import orjson

from tfusion.api import annotations as tfa
from tfusion.api import podindex
from tfusion.api.accessors import Pod, section
from tfusion.api.jsontypes import JsonMapping, JsonObject, JsonValue, json_object
from tfusion.api.merge import PatchError, strategic_merge_patch
from tfusion.controller.defaults import SIDES
from tfusion.controller.limiter_source import LimiterSource
from tfusion.controller.webhook.build import child, entries, json_document
from tfusion.controller.webhook.mutate import (
    DATA_HOST_PATH,
    DATA_VOLUME,
    INJECT_LIB_INIT,
    LIBS_CONF_DIR,
    LIBS_DIR,
    LIBS_VOLUME,
    LIMITER_LIBRARIES,
    NVIDIA_SMI,
    SHM_MOUNT,
    SHM_SEGMENT_MIB,
    SHM_SUBPATH_EXPR,
    SIDECAR_NAME,
    SOFT_LIMITER_DIR,
    SOFT_LIMITER_INIT,
    SOFT_LIMITER_VOLUME,
    TRANSPORT_VOLUME,
    Denial,
    HostPortSlot,
    Plan,
)
from tfusion.controller.worker_shape import (
    WORKER_DEFAULT_REQUESTS,
    WorkerShape,
    data_volume,
    init_resources,
    needs_data_volume,
    worker_container,
)


class EnvVar(TypedDict):
    name: str
    value: NotRequired[str]
    valueFrom: NotRequired[JsonObject]


class VolumeMount(TypedDict):
    name: str
    mountPath: str
    subPath: NotRequired[str]
    subPathExpr: NotRequired[str]
    readOnly: NotRequired[bool]
    mountPropagation: NotRequired[str]


class Toleration(TypedDict):
    key: str
    operator: str
    value: str
    effect: str


def render(pod: Pod, plan: Plan, *, index: int | None, host_port: int | None) -> JsonObject:
    """The mutated copy of `pod` (the original is not changed)."""
    out = writable_copy(pod.raw)
    meta = child(out, "metadata")
    notes = child(meta, "annotations")
    for key in plan.remove_annotations:
        notes.pop(key, None)
    notes.update(plan.annotations)
    child(meta, "labels").update(plan.labels)
    if plan.labels.get(tfa.COMPONENT) == tfa.COMPONENT_WORKER:
        _add_finalizer(meta)
    spec = child(out, "spec")
    if plan.remote is None:  # a remote client holds no GPU: any scheduler, any node
        spec["schedulerName"] = tfa.SCHEDULER_NAME
        _add_toleration(spec)
    if plan.qos in ("high", "critical") and not spec.get("priorityClassName"):
        spec["priorityClassName"] = tfa.priority_class_name(plan.qos)
        spec.pop("priority", None)
    for container in containers(out):
        if container.get("name") in plan.inject:
            _strip_native(container, plan.native_resources)
            if index is not None:
                _set_index(container, index)
    _apply_container_patch(out, plan)
    if plan.remote is not None:
        from tfusion.controller.webhook.remote import wire_client  # remote.py imports this module

        wire_client(out, plan)
    elif plan.sidecar:
        _wire_sidecar(out, plan, index)
    elif plan.isolation == tfa.ISOLATION_SOFT:
        _wire_soft_limiter(out, plan)
    if plan.host_port is not None and host_port is not None:
        _set_host_port(out, plan.host_port, host_port)
        notes[tfa.PORT_NUMBER] = str(host_port)
    return out


def writable_copy(pod: JsonMapping) -> JsonObject:
    """A copy of the pod as deep as rendering writes, and no deeper: new dicts and lists for the
    pod, its metadata and each map in it (labels, annotations; remote.py's `patchToPod` may write
    any), its finalizers, its spec, the spec's tolerations and containers, and in each container
    its resources, their maps and its ports. Everything else (commands, env, volumes as sent,
    managedFields) is the pod's own objects, which rendering never writes into: the lists it
    changes beyond these it replaces whole (`_replace_entries`), and a pool's patchToContainer is
    merged into a deep copy. Why: the JSON diff settles a shared part by identity, where a deep
    copy made it compare every field of the pod and encode the equal parts to confirm them.
    (Typed Any inside: the shared parts are the decoded pod's own, read-only to the view.)"""
    out: dict[str, Any] = dict(pod)
    meta = out.get("metadata")
    if type(meta) is dict:
        out["metadata"] = meta = {key: dict(value) if type(value) is dict else value for key, value in meta.items()}
        if type(finalizers := meta.get("finalizers")) is list:
            meta["finalizers"] = list(finalizers)
    spec = out.get("spec")
    if type(spec) is dict:
        out["spec"] = spec = dict(spec)
        if type(tolerations := spec.get("tolerations")) is list:
            spec["tolerations"] = list(tolerations)
        if type(listed := spec.get("containers")) is list:
            spec["containers"] = [_writable_container(c) if type(c) is dict else c for c in listed]
    return out


def _writable_container(container: JsonMapping) -> JsonObject:
    out: dict[str, Any] = dict(container)
    resources = out.get("resources")
    if type(resources) is dict:
        out["resources"] = {side: dict(value) if type(value) is dict else value for side, value in resources.items()}
    if type(ports := out.get("ports")) is list:
        out["ports"] = [dict(port) if type(port) is dict else port for port in ports]
    return out


def containers(pod: JsonObject) -> list[JsonObject]:
    """The containers of a pod being written (the pod's own dicts, changed in place)."""
    spec = pod.get("spec")
    return entries(spec, "containers") if isinstance(spec, dict) else []


def _add_finalizer(meta: JsonObject) -> None:
    """The worker finalizer, set at admission: the pod reconciler releases what the pod holds
    before letting it go, and adding it here spares one API write per pod after creation (the
    reconciler still adds it to a worker created without the webhook)."""
    finalizers = meta.get("finalizers")
    if not isinstance(finalizers, list):
        meta["finalizers"] = [tfa.FINALIZER]
    elif tfa.FINALIZER not in finalizers:
        finalizers.append(tfa.FINALIZER)


def _add_toleration(spec: JsonObject) -> None:
    wanted = Toleration(key=tfa.USED_BY, operator="Equal", value=tfa.USED_BY_TENSOR_FUSION,
                        effect="PreferNoSchedule")
    tolerations = spec.get("tolerations")
    if not isinstance(tolerations, list):
        tolerations = spec["tolerations"] = []
    if not any(isinstance(t, Mapping) and t.get("key") == tfa.USED_BY and t.get("effect") == wanted["effect"]
               for t in tolerations):
        tolerations.append(json_object(wanted))


def _strip_native(container: JsonObject, names: Sequence[str]) -> None:
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return
    for side in SIDES:
        amounts = resources.get(side)
        if isinstance(amounts, dict):
            for name in names:
                amounts.pop(name, None)
            if not amounts:
                resources.pop(side)


#: `render(index=ANY_INDEX)` writes marks where the index resource's number and count go, so that
#: one rendering, and its JSON patch as text, serves every index: `with_index` writes one in. (No
#: pod index is 0: they run from 1.) The marks are random for each process, so no pod holds them by
#: chance (a pod that does is rendered for its own index).
ANY_INDEX: Final = 0
_INDEX_MARK = secrets.token_hex(8)
_NUMBER_MARK, _COUNT_MARK = f"{_INDEX_MARK}n", f"{_INDEX_MARK}c"
_MARK_BYTES, _INDEX_PREFIX_BYTES = _INDEX_MARK.encode(), tfa.INDEX_RESOURCE_PREFIX.encode()


def renders_any_index(plan: Plan, sent: bytes) -> bool:
    """Whether `with_index` on the rendering for ANY_INDEX gives what rendering the index itself
    gives, for this plan and the pod as `sent`: the index goes nowhere but the limits `_set_index`
    writes (no pool's patchToContainer merged over them), and the pod holds no index resource of its
    own (its patch would remove that one and add the new, which may be the same) and no mark."""
    return (plan.remote is None and not section(plan.pool.component_config, "client", "patchToContainer")
            and _INDEX_PREFIX_BYTES not in sent and _MARK_BYTES not in sent)


def with_index(rendered: str, index: int) -> str:
    """JSON text rendered with ANY_INDEX (a pod, or its patch), with `index` written in."""
    resource, count = podindex.encode_pod_index(index)
    number = resource.removeprefix(tfa.INDEX_RESOURCE_PREFIX)
    return rendered.replace(_NUMBER_MARK, number).replace(_COUNT_MARK, str(count))


def _set_index(container: JsonObject, index: int) -> None:
    if index == ANY_INDEX:
        resource, count = tfa.INDEX_RESOURCE_PREFIX + _NUMBER_MARK, _COUNT_MARK
    else:
        resource, number = podindex.encode_pod_index(index)
        count = str(number)
    limits = child(child(container, "resources"), "limits")
    for name in [n for n in limits if podindex.index_resource_number(n) is not None]:
        del limits[name]
    limits[resource] = count


def _apply_container_patch(pod: JsonObject, plan: Plan) -> None:
    """The pool's componentConfig.client.patchToContainer, strategic-merged into each injected container."""
    patch = section(plan.pool.component_config, "client", "patchToContainer")
    if not patch:
        return
    containers = [{**json_object(patch), "name": name} for name in plan.inject]
    try:
        merged = strategic_merge_patch(pod, {"spec": {"containers": containers}}, "Pod")
    except PatchError as exc:
        raise Denial(f"GPUPool {plan.pool_name}: spec.componentConfig.client.patchToContainer cannot be "
                     f"applied: {exc}", code=500) from None
    pod["spec"] = merged["spec"]


def _replace_entries(doc: JsonObject, key: str, field: str, added: Sequence[Mapping[str, object]]) -> None:
    """The list at `key` with the entries whose `field` an added one has replaced by it, at the end."""
    taken = {entry[field] for entry in added}
    kept: list[JsonValue] = [e for e in entries(doc, key) if e.get(field) not in taken]
    kept += _copied(added)
    doc[key] = kept


def _copied(added: Sequence[Mapping[str, object]]) -> list[JsonValue]:
    """Deep copies of the entries, in one orjson round trip (a copy in Python, entry by entry, cost
    more than the rest of a first pod's rendering); TypeError on what JSON cannot hold."""
    copied = orjson.loads(orjson.dumps(list(added)))
    if not isinstance(copied, list):  # a list encodes and decodes as one
        raise TypeError(f"not a JSON list: {type(added).__name__}")
    return copied


def set_env(container: JsonObject, env: Sequence[EnvVar]) -> None:
    _replace_entries(container, "env", "name", env)


def add_mounts(container: JsonObject, mounts: Sequence[VolumeMount]) -> None:
    _replace_entries(container, "volumeMounts", "mountPath", mounts)


def add_volumes(pod: JsonObject, volumes: Sequence[JsonObject]) -> None:
    _replace_entries(child(pod, "spec"), "volumes", "name", volumes)


def add_init_container(pod: JsonObject, container: JsonObject) -> None:
    _replace_entries(child(pod, "spec"), "initContainers", "name", [container])


def _field_env(name: str, path: str) -> EnvVar:
    return EnvVar(name=name, valueFrom={"fieldRef": {"fieldPath": path}})


def _wire_soft_limiter(pod: JsonObject, plan: Plan) -> None:
    """Local soft isolation: the limiter library copied in by an init container and preloaded."""
    if not plan.middleware_image:
        raise Denial(f"no ProviderConfig for vendor {plan.vendor} names spec.images.middleware, the soft "
                     f"limiter's image (tfusion's own limiter serves NVIDIA only); create one or use "
                     f"isolation shared", code=400)
    source = LimiterSource(image=plan.middleware_image, own=plan.limiter_own)
    add_init_container(pod, {"name": SOFT_LIMITER_INIT, "image": source.image,
                              "command": source.copy_command(SOFT_LIMITER_DIR),
                              "resources": init_resources(),
                              "volumeMounts": [{"name": SOFT_LIMITER_VOLUME, "mountPath": SOFT_LIMITER_DIR}]})
    add_volumes(pod, [{"name": SOFT_LIMITER_VOLUME, "emptyDir": {}},
                       {"name": DATA_VOLUME, "hostPath": {"path": DATA_HOST_PATH, "type": "DirectoryOrCreate"}}])
    library = LIMITER_LIBRARIES.get(plan.vendor.lower(), LIMITER_LIBRARIES["nvidia"])
    for container in containers(pod):
        if container.get("name") not in plan.inject:
            continue
        env: list[EnvVar] = [{"name": "TF_ISOLATION_MODE", "value": tfa.ISOLATION_SOFT},
               {"name": "TF_SHM_PATH", "value": f"{SHM_MOUNT}/shm"},
               _field_env("POD_NAMESPACE", "metadata.namespace"), _field_env("POD_NAME", "metadata.name"),
               {"name": "CONTAINER_NAME", "value": str(container.get("name"))},
               _field_env("HYPERVISOR_IP", "status.hostIP"),
               {"name": "HYPERVISOR_PORT", "value": str(plan.hypervisor_port)}]
        if "gpu-limiter" not in plan.disabled_features:
            env.insert(0, {"name": "LD_PRELOAD", "value": f"{SOFT_LIMITER_DIR}/{library}"})
        set_env(container, env)
        mounts: list[VolumeMount] = [
                  {"name": SOFT_LIMITER_VOLUME, "mountPath": SOFT_LIMITER_DIR, "readOnly": True},
                  {"name": DATA_VOLUME, "mountPath": SHM_MOUNT, "subPathExpr": SHM_SUBPATH_EXPR,
                   "mountPropagation": "HostToContainer"}]
        if plan.vendor.lower() == "nvidia" and source.ships_nvidia_smi:
            mounts.append({"name": SOFT_LIMITER_VOLUME, "mountPath": NVIDIA_SMI, "subPath": "nvidia-smi",
                           "readOnly": True})
        add_mounts(container, mounts)


def _wire_sidecar(pod: JsonObject, plan: Plan, index: int | None) -> None:
    """Local sidecar worker: a worker container sharing memory with the app through /dev/shm, the
    client libraries copied in by an init container."""
    volumes: list[JsonObject] = [{"name": TRANSPORT_VOLUME, "emptyDir": {"medium": "Memory"}},
                                 {"name": LIBS_VOLUME, "emptyDir": {}}]
    if needs_data_volume(plan.isolation):
        volumes.append(data_volume())
    add_volumes(pod, volumes)
    add_init_container(pod, inject_lib_container(plan.client_image, [{"name": "RUN_INSIDE_GPU_NODE",
                                                                      "value": "true"}]))
    for container in containers(pod):
        if container.get("name") not in plan.inject:
            continue
        env: list[EnvVar] = [
               {"name": "TF_PREPEND_PATH", "value": LIBS_DIR}, {"name": "TF_LD_LIBRARY_PATH", "value": LIBS_DIR},
               {"name": "TENSOR_FUSION_OPERATOR_CONNECTION_INFO", "value": f"shmem+tf_shm+{SHM_SEGMENT_MIB}+1"},
               {"name": "TF_USE_IVSHMEM", "value": "0"}]
        if plan.vendor.lower() == "nvidia":
            env.append({"name": "ENABLE_CUDA_HOOKS", "value": "false"})
        set_env(container, env)
        mounts: list[VolumeMount] = [
            {"name": LIBS_VOLUME, "mountPath": "/etc/ld.so.preload", "subPath": "ld.so.preload", "readOnly": True},
            {"name": LIBS_VOLUME, "mountPath": LIBS_DIR}, {"name": TRANSPORT_VOLUME, "mountPath": "/dev/shm"}]
        if plan.vendor.lower() == "nvidia":
            mounts.append({"name": LIBS_VOLUME, "mountPath": NVIDIA_SMI, "subPath": "nvidia-smi"})
        add_mounts(container, mounts)
    kept: list[JsonValue] = [c for c in containers(pod) if c.get("name") != SIDECAR_NAME]
    child(pod, "spec")["containers"] = [*kept, _sidecar_container(plan, index)]


def inject_lib_container(image: str, env: Sequence[EnvVar] = ()) -> JsonObject:
    """The `inject-lib` init container: the client library copied into `tf-libs`, which it also
    sees at /tensor-fusion-conf (where older client images write ld.so.preload)."""
    init: JsonObject = {"name": INJECT_LIB_INIT, "image": image, "resources": init_resources(),
                        "volumeMounts": [{"name": LIBS_VOLUME, "mountPath": LIBS_DIR},
                                         {"name": LIBS_VOLUME, "mountPath": LIBS_CONF_DIR}]}
    if env:
        init["env"] = [json_object(e) for e in env]
    return init


def _sidecar_container(plan: Plan, index: int | None) -> JsonObject:
    shape = WorkerShape(image=plan.worker_image, isolation=plan.isolation, vendor=plan.vendor,
                        hypervisor_port=plan.hypervisor_port, disabled_features=plan.disabled_features,
                        compute_limit=plan.amounts.get(("limits", "compute")),
                        vram_limit=plan.amounts.get(("limits", "vram")))
    container = worker_container(shape, shared_memory=True,
                                 extra_mounts=[{"name": TRANSPORT_VOLUME, "mountPath": "/dev/shm"}])
    _seed_from_pool_template(container, plan)
    if index is not None:
        _set_index(container, index)
    return container


def _seed_from_pool_template(container: JsonObject, plan: Plan) -> None:
    """The pool's worker podTemplate reaches the sidecar as it reaches remote workers: the env and
    resources of its worker container (unnamed or `tensorfusion-worker`), as the original seeds it."""
    template = section(plan.pool.component_config, "worker", "podTemplate")
    spec = section(template, "template", "spec") or section(template, "spec")
    for seed in entries(json_document(spec), "containers"):
        if seed.get("name") not in (None, "", SIDECAR_NAME):
            continue
        env = seed.get("env")
        if isinstance(env, list):
            container["env"] = [*entries(container, "env"), *[e for e in env if isinstance(e, dict)]]
        resources = seed.get("resources")
        if isinstance(resources, dict) and resources:
            if not resources.get("requests"):  # the worker's default requests still apply
                resources["requests"] = dict(WORKER_DEFAULT_REQUESTS)
            container["resources"] = resources
        return


def _set_host_port(pod: JsonObject, slot: HostPortSlot, port: int) -> None:
    """`analyse` found the slot in this pod, so it is there."""
    ports = containers(pod)[slot.container]["ports"]
    entry = ports[slot.port] if isinstance(ports, list) else None
    if isinstance(entry, dict):
        entry["hostPort"] = port
