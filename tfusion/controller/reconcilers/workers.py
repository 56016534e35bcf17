"""Remote vGPU worker pods: what the controller creates for a TensorFusionWorkload, and how it is reached.

Why one module: the connection reconciler (a dedicated worker per connection of a dynamic workload)
and the workload reconciler (a fixed number of workers) create the same pod from the same inputs,
and must agree on the template hash that says when a worker is outdated and on the address a client
is given.

A worker pod is a GPU pod like a local-mode one, so the same scheduler and allocator place it:
`schedulerName: tensor-fusion-scheduler`, the `used-by` toleration, the workload's GPU request as
the annotations the allocator reads (pool, TFLOPS or compute percent, VRAM, GPU count, indices,
model, vendor, QoS, isolation, partition), the workload's node affinity, the priority class of high
and critical QoS, labels `component=worker`, `workload`, `gpupool` and `pod-template-hash`, the
finalizer and a controlling ownerReference. Its one container runs the worker image and listens on
port 8000 (`remote-vgpu`). The pool's `componentConfig.worker.podTemplate` and then the workload's
`spec.workerPodTemplate` are strategic-merged over it.

`template_hash(pool, workload)` hashes the pool's worker config, the hypervisor port and the
workload's spec but its replica count; `connection_url(pod)` is `native+<podIP>+<port>+<pod>-<resourceVersion>`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from tfusion.api import annotations as tfa
from tfusion.api.accessors import section, text
from tfusion.api.hashing import content_hash
from tfusion.api.merge import PatchError, strategic_merge_patch
from tfusion.controller.defaults import provider_config_for
from tfusion.controller.reconcilers.common import FINALIZER, Obj, meta, name_of
from tfusion.controller.webhook.build import DEFAULT_WORKER_IMAGE

WORKER_CONTAINER = "worker"
WORKER_PORT_NAME = "remote-vgpu"
WORKER_PORT = 8000
#: the label value limit: longer names are not written as labels
MAX_LABEL_VALUE = 63

_RESOURCE_ANNOTATIONS = {
    ("requests", "tflops"): "TFLOPS_REQUEST", ("limits", "tflops"): "TFLOPS_LIMIT",
    ("requests", "compute"): "COMPUTE_PERCENT_REQUEST", ("limits", "compute"): "COMPUTE_PERCENT_LIMIT",
    ("requests", "vram"): "VRAM_REQUEST", ("limits", "vram"): "VRAM_LIMIT",
}


class TemplateError(ValueError):
    """A worker pod template cannot be applied; the message names where it came from."""


def template_hash(pool: Mapping[str, Any] | None, workload: Mapping[str, Any]) -> str:
    """What a worker pod is made of: the pool's worker component, the hypervisor port and the spec."""
    basis = {"worker": section(pool, "spec", "componentConfig", "worker"),
             "hypervisorPort": section(pool, "spec", "componentConfig", "hypervisor").get("portNumber"),
             # the replica count says how many workers, not what one is
             "spec": {k: v for k, v in (workload.get("spec") or {}).items() if k != "replicas"}}
    return content_hash(basis, 10)


def label_value(value: str) -> str | None:
    """`value` when Kubernetes takes it as a label value (length only: names are valid values)."""
    return value if len(value) <= MAX_LABEL_VALUE else None


def _annotations(spec: Mapping[str, Any], pool_name: str) -> dict[str, str]:
    notes: dict[str, str] = {tfa.GPU_POOL: pool_name}
    resources = spec.get("resources") or {}
    for (side, name), key in _RESOURCE_ANNOTATIONS.items():
        value = (resources.get(side) or {}).get(name)
        if value not in (None, "", "0", 0):
            notes[getattr(tfa, key)] = str(value)
    indices = spec.get("gpuIndices") or []
    if indices:
        notes[tfa.GPU_INDICES] = ",".join(str(i) for i in indices)
    notes[tfa.GPU_COUNT] = str(spec.get("gpuCount") or len(indices) or 1)
    for field_name, key in (("qos", tfa.QOS), ("isolation", tfa.ISOLATION), ("gpuModel", tfa.GPU_MODEL),
                            ("vendor", tfa.VENDOR), ("partitionTemplateId", tfa.PARTITION_ID)):
        if spec.get(field_name):
            notes[key] = str(spec[field_name])
    return notes


def _image(pool: Mapping[str, Any] | None, providers: list[Obj], vendor: str) -> str:
    provider = provider_config_for(providers, vendor or "NVIDIA")
    return (text(pool, "spec", "componentConfig", "worker", "image")
            or text(provider, "spec", "images", "remoteWorker") or DEFAULT_WORKER_IMAGE)


def _template_spec(template: Any) -> Mapping[str, Any] | None:
    """A PodTemplate ({template: {...}}) or a PodTemplateSpec ({metadata, spec}) as the latter."""
    if not isinstance(template, Mapping):
        return None
    inner = template.get("template")
    return inner if isinstance(inner, Mapping) else template


def _merge_template(pod: Obj, template: Any, source: str) -> Obj:
    found = _template_spec(template)
    if not found:
        return pod
    patch = {key: copy.deepcopy(found[key]) for key in ("metadata", "spec") if isinstance(found.get(key), Mapping)}
    try:
        merged: Obj = strategic_merge_patch(pod, patch, "Pod")
    except PatchError as exc:
        raise TemplateError(f"{source} cannot be applied to the worker pod: {exc}") from None
    return merged


def worker_pod(workload: Obj, pool: Mapping[str, Any] | None, providers: list[Obj], *, owner: Obj,
               name: str = "", generate_name: str = "", template: str, dedicated: bool = False,
               index: int | None = None) -> Obj:
    """The worker pod of `workload` (see the module docstring); `owner` is its controlling
    ownerReference (the workload, or the connection of a dedicated worker)."""
    spec = workload.get("spec") or {}
    pool_name = str(spec.get("poolName") or (meta(workload).get("labels") or {}).get(tfa.GPU_POOL)
                    or name_of(pool or {}))
    workload_name = name_of(workload)
    labels = {tfa.COMPONENT: tfa.COMPONENT_WORKER, tfa.POD_TEMPLATE_HASH: template}
    for key, value in ((tfa.WORKLOAD, workload_name), (tfa.GPU_POOL, pool_name)):
        if label_value(value):
            labels[key] = value
    notes = _annotations(spec, pool_name)
    if dedicated:
        notes[tfa.DEDICATED_WORKER] = "true"
    metadata: Obj = {"namespace": meta(workload).get("namespace"), "labels": labels, "annotations": notes,
                     "finalizers": [FINALIZER], "ownerReferences": [owner]}
    if name:
        metadata["name"] = name
    else:
        metadata["generateName"] = generate_name
    container: Obj = {"name": WORKER_CONTAINER, "image": _image(pool, providers, str(spec.get("vendor") or "")),
                      "ports": [{"name": WORKER_PORT_NAME, "containerPort": WORKER_PORT, "protocol": "TCP"}]}
    if index is not None:
        resource, count = tfa.encode_pod_index(index)
        container["resources"] = {"limits": {resource: str(count)}}
    pod_spec: Obj = {"schedulerName": tfa.SCHEDULER_NAME, "containers": [container],
                     "tolerations": [{"key": tfa.USED_BY, "operator": "Equal", "value": tfa.USED_BY_TENSOR_FUSION,
                                      "effect": "PreferNoSchedule"}]}
    qos = str(spec.get("qos") or "")
    if qos in ("high", "critical"):
        pod_spec["priorityClassName"] = tfa.priority_class_name(qos)
    if isinstance(spec.get("nodeAffinity"), Mapping):
        pod_spec["affinity"] = {"nodeAffinity": copy.deepcopy(spec["nodeAffinity"])}
    pod: Obj = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}
    pod = _merge_template(pod, section(pool, "spec", "componentConfig", "worker").get("podTemplate"),
                          f"GPUPool {name_of(pool or {})}: spec.componentConfig.worker.podTemplate")
    pod = _merge_template(pod, spec.get("workerPodTemplate"),
                          f"TensorFusionWorkload {workload_name}: spec.workerPodTemplate")
    # what the template may not change: who the pod is and what it belongs to
    pod["metadata"].update({key: metadata[key] for key in ("namespace", "finalizers", "ownerReferences")})
    pod["metadata"]["labels"] = {**(pod["metadata"].get("labels") or {}), **labels}
    pod["metadata"]["annotations"] = {**(pod["metadata"].get("annotations") or {}), **notes}
    return pod


def worker_port(pod: Mapping[str, Any]) -> int:
    """The port the worker listens on: its `remote-vgpu` container port, else 8000."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == WORKER_PORT_NAME and isinstance(port.get("containerPort"), int):
                return int(port["containerPort"])
    return WORKER_PORT


def serving(pod: Mapping[str, Any] | None) -> bool:
    """Running, with an address, and not on its way out."""
    status = (pod or {}).get("status") or {}
    return (pod is not None and status.get("phase") == "Running" and bool(status.get("podIP"))
            and not (pod.get("metadata") or {}).get("deletionTimestamp"))


def connection_url(pod: Mapping[str, Any]) -> str:
    """`native+<podIP>+<port>+<pod>-<resourceVersion>`: where the client reaches this worker."""
    status = pod.get("status") or {}
    metadata = pod.get("metadata") or {}
    return f"native+{status.get('podIP')}+{worker_port(pod)}+{metadata.get('name')}-{metadata.get('resourceVersion')}"


def url_of_same_worker(url: str, pod: Mapping[str, Any]) -> bool:
    """Whether `url` was given for this pod at its current address (its resourceVersion moves on)."""
    status = pod.get("status") or {}
    name = (pod.get("metadata") or {}).get("name")
    return url.startswith(f"native+{status.get('podIP')}+{worker_port(pod)}+{name}-")
