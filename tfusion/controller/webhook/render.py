"""Rendering the webhook's plan into the pod: the second, pure half of mutate.py.

`render(pod, plan, index=, host_port=)` returns the mutated copy of the pod as `analyse` planned
it: normalized annotations and labels, the scheduler, the `used-by` toleration, the priority class
for high and critical QoS, native GPU resources replaced by the index resource, the pool's
`patchToContainer`, the soft limiter (init container, volumes, env, mounts) or the sidecar worker,
and the host port. The original pod is never changed.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from tfusion.api import annotations as tfa
from tfusion.api.accessors import section
from tfusion.api.merge import PatchError, strategic_merge_patch
from tfusion.api.quantity import Quantity
from tfusion.controller.defaults import SIDES
from tfusion.controller.webhook.build import json_copy
from tfusion.controller.webhook.mutate import (
    DATA_HOST_PATH,
    DATA_VOLUME,
    INJECT_LIB_INIT,
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


def render(pod: Mapping[str, Any], plan: Plan, *, index: int | None, host_port: int | None) -> dict[str, Any]:
    """The mutated copy of `pod` (the original is not changed)."""
    out: dict[str, Any] = json_copy(pod)
    meta = out.setdefault("metadata", {})
    notes = meta.setdefault("annotations", {})
    for key in plan.remove_annotations:
        notes.pop(key, None)
    notes.update(plan.annotations)
    meta.setdefault("labels", {}).update(plan.labels)
    spec = out.setdefault("spec", {})
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


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The containers of a pod being written (the pod's own dicts, changed in place)."""
    spec = pod.get("spec")
    found = spec.get("containers") if isinstance(spec, dict) else None
    return [c for c in found if isinstance(c, dict)] if isinstance(found, list) else []


def _add_toleration(spec: dict[str, Any]) -> None:
    wanted = {"key": tfa.USED_BY, "operator": "Equal", "value": tfa.USED_BY_TENSOR_FUSION,
              "effect": "PreferNoSchedule"}
    tolerations = spec.setdefault("tolerations", [])
    if not any(isinstance(t, Mapping) and t.get("key") == tfa.USED_BY and t.get("effect") == wanted["effect"]
               for t in tolerations):
        tolerations.append(wanted)


def _strip_native(container: dict[str, Any], names: Sequence[str]) -> None:
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


def _set_index(container: dict[str, Any], index: int) -> None:
    resource, count = tfa.encode_pod_index(index)
    limits = container.setdefault("resources", {}).setdefault("limits", {})
    for name in [n for n in limits if tfa.index_resource_number(n) is not None]:
        del limits[name]
    limits[resource] = str(count)


def _apply_container_patch(pod: dict[str, Any], plan: Plan) -> None:
    """The pool's componentConfig.client.patchToContainer, strategic-merged into each injected container."""
    patch = section(plan.pool.component_config, "client", "patchToContainer")
    if not patch:
        return
    containers = [{**copy.deepcopy(dict(patch)), "name": name} for name in plan.inject]
    try:
        merged = strategic_merge_patch(pod, {"spec": {"containers": containers}}, "Pod")
    except PatchError as exc:
        raise Denial(f"GPUPool {plan.pool_name}: spec.componentConfig.client.patchToContainer cannot be "
                     f"applied: {exc}", code=500) from None
    pod["spec"] = merged["spec"]


def _set_env(container: dict[str, Any], env: Sequence[dict[str, Any]]) -> None:
    current = [e for e in container.get("env") or [] if isinstance(e, Mapping)]
    names = {e["name"] for e in env}
    container["env"] = [e for e in current if e.get("name") not in names] + list(env)


def _add_mounts(container: dict[str, Any], mounts: Sequence[dict[str, Any]]) -> None:
    current = [m for m in container.get("volumeMounts") or [] if isinstance(m, Mapping)]
    paths = {m["mountPath"] for m in mounts}
    container["volumeMounts"] = [m for m in current if m.get("mountPath") not in paths] + list(mounts)


def _add_volumes(pod: dict[str, Any], volumes: Sequence[dict[str, Any]]) -> None:
    current = [v for v in pod["spec"].get("volumes") or [] if isinstance(v, Mapping)]
    names = {v["name"] for v in volumes}
    pod["spec"]["volumes"] = [v for v in current if v.get("name") not in names] + list(volumes)


def _add_init_container(pod: dict[str, Any], container: dict[str, Any]) -> None:
    current = [c for c in pod["spec"].get("initContainers") or [] if isinstance(c, Mapping)]
    pod["spec"]["initContainers"] = [c for c in current if c.get("name") != container["name"]] + [container]


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _wire_soft_limiter(pod: dict[str, Any], plan: Plan) -> None:
    """Local soft isolation: the limiter library copied in by an init container and preloaded."""
    if not plan.middleware_image:
        raise Denial(f"no ProviderConfig for vendor {plan.vendor} names spec.images.middleware, the soft "
                     f"limiter's image; create one or use isolation shared", code=400)
    _add_init_container(pod, {"name": SOFT_LIMITER_INIT, "image": plan.middleware_image,
                              "command": ["sh", "-c", f"cp /build/* {SOFT_LIMITER_DIR}/"],
                              "volumeMounts": [{"name": SOFT_LIMITER_VOLUME, "mountPath": SOFT_LIMITER_DIR}]})
    _add_volumes(pod, [{"name": SOFT_LIMITER_VOLUME, "emptyDir": {}},
                       {"name": DATA_VOLUME, "hostPath": {"path": DATA_HOST_PATH, "type": "DirectoryOrCreate"}}])
    library = LIMITER_LIBRARIES.get(plan.vendor.lower(), LIMITER_LIBRARIES["nvidia"])
    for container in containers(pod):
        if container.get("name") not in plan.inject:
            continue
        env = [{"name": "TF_ISOLATION_MODE", "value": tfa.ISOLATION_SOFT},
               {"name": "TF_SHM_PATH", "value": f"{SHM_MOUNT}/shm"},
               _field_env("POD_NAMESPACE", "metadata.namespace"), _field_env("POD_NAME", "metadata.name"),
               {"name": "CONTAINER_NAME", "value": str(container.get("name"))},
               _field_env("HYPERVISOR_IP", "status.hostIP"),
               {"name": "HYPERVISOR_PORT", "value": str(plan.hypervisor_port)}]
        if "gpu-limiter" not in plan.disabled_features:
            env.insert(0, {"name": "LD_PRELOAD", "value": f"{SOFT_LIMITER_DIR}/{library}"})
        _set_env(container, env)
        mounts: list[dict[str, Any]] = [
                  {"name": SOFT_LIMITER_VOLUME, "mountPath": SOFT_LIMITER_DIR, "readOnly": True},
                  {"name": DATA_VOLUME, "mountPath": SHM_MOUNT, "subPathExpr": SHM_SUBPATH_EXPR,
                   "mountPropagation": "HostToContainer"}]
        if plan.vendor.lower() == "nvidia":
            mounts.append({"name": SOFT_LIMITER_VOLUME, "mountPath": NVIDIA_SMI, "subPath": "nvidia-smi",
                           "readOnly": True})
        _add_mounts(container, mounts)


def _mib(value: Quantity | None) -> int:
    return value.value() // (1024 * 1024) if value else 0


def _wire_sidecar(pod: dict[str, Any], plan: Plan, index: int | None) -> None:
    """Local sidecar worker: a worker container sharing memory with the app through /dev/shm, the
    client libraries copied in by an init container."""
    _add_volumes(pod, [{"name": TRANSPORT_VOLUME, "emptyDir": {"medium": "Memory"}},
                       {"name": LIBS_VOLUME, "emptyDir": {}}])
    _add_init_container(pod, {
        "name": INJECT_LIB_INIT, "image": plan.client_image,
        "env": [{"name": "RUN_INSIDE_GPU_NODE", "value": "true"}],
        "resources": {"requests": {"cpu": "20m", "memory": "256Mi"}, "limits": {"cpu": "20m", "memory": "256Mi"}},
        "volumeMounts": [{"name": LIBS_VOLUME, "mountPath": LIBS_DIR}]})
    for container in containers(pod):
        if container.get("name") not in plan.inject:
            continue
        env = [{"name": "TF_PREPEND_PATH", "value": LIBS_DIR}, {"name": "TF_LD_LIBRARY_PATH", "value": LIBS_DIR},
               {"name": "TENSOR_FUSION_OPERATOR_CONNECTION_INFO", "value": f"shmem+tf_shm+{SHM_SEGMENT_MIB}+1"},
               {"name": "TF_USE_IVSHMEM", "value": "0"}]
        if plan.vendor.lower() == "nvidia":
            env.append({"name": "ENABLE_CUDA_HOOKS", "value": "false"})
        _set_env(container, env)
        mounts: list[dict[str, Any]] = [
            {"name": LIBS_VOLUME, "mountPath": "/etc/ld.so.preload", "subPath": "ld.so.preload", "readOnly": True},
            {"name": LIBS_VOLUME, "mountPath": LIBS_DIR}, {"name": TRANSPORT_VOLUME, "mountPath": "/dev/shm"}]
        if plan.vendor.lower() == "nvidia":
            mounts.append({"name": LIBS_VOLUME, "mountPath": NVIDIA_SMI, "subPath": "nvidia-smi"})
        _add_mounts(container, mounts)
    pod["spec"]["containers"] = [c for c in containers(pod) if c.get("name") != SIDECAR_NAME] \
        + [_sidecar_container(plan, index)]


def _sidecar_container(plan: Plan, index: int | None) -> dict[str, Any]:
    env: list[dict[str, Any]] = []
    if plan.isolation == tfa.ISOLATION_HARD:
        compute = plan.amounts.get(("limits", "compute"))
        if compute:
            env.append({"name": "TF_CUDA_SM_PERCENT_LIMIT", "value": str(compute)})
        memory = _mib(plan.amounts.get(("limits", "vram")))
        if memory:
            env += [{"name": "TF_GPU_MEMORY_LIMIT", "value": str(memory)},
                    {"name": "TF_CUDA_MEMORY_LIMIT", "value": str(memory)}]
    container: dict[str, Any] = {
        "name": SIDECAR_NAME, "image": plan.worker_image,
        "command": ["sh", "-c", f"touch /dev/shm/tf_shm && exec ./tensor-fusion-worker -n shmem -m tf_shm "
                                f"-M {SHM_SEGMENT_MIB}"],
        "volumeMounts": [{"name": TRANSPORT_VOLUME, "mountPath": "/dev/shm"}]}
    if env:
        container["env"] = env
    if index is not None:
        _set_index(container, index)
    return container


def _set_host_port(pod: dict[str, Any], slot: HostPortSlot, port: int) -> None:
    container = containers(pod)[slot.container]
    container["ports"][slot.port]["hostPort"] = port
