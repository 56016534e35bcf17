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
finalizer and a controlling ownerReference. Its one container is the original's worker container
(tfusion/controller/worker_shape.py: `tensorfusion-worker`, hypervisor address, shared memory,
limiter and hard-limit env, port 8000 `remote-vgpu`), with the `tf-data` host volume its shared
memory lives in (not for shared isolation) and a 5 s grace period; under soft isolation also the
`init-soft-limiter` that puts tfusion's limiter (from `limiter_image`, or the ProviderConfig's
middleware image: limiter_source.py) over the worker image's own. The pool's
`componentConfig.worker.podTemplate` and then the workload's `spec.workerPodTemplate` are
strategic-merged over it; a template's first container is the worker container, whatever its name,
as in the original.

`template_hash(pool, workload)` hashes the pool's worker config, the hypervisor port and the
workload's spec but its replica count; `connection_url(pod)` is `native+<podIP>+<port>+<pod>-<resourceVersion>`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tfusion.api import annotations as tfa
from tfusion.api import podindex
from tfusion.api.accessors import GpuPool, Pod, Workload, items, section, sequence_of_maps, text
from tfusion.api.annotations import AnnotationError
from tfusion.api.hashing import content_hash
from tfusion.api.jsontypes import JsonMapping, JsonObject, json_copy, json_object
from tfusion.api.merge import PatchError, strategic_merge_patch
from tfusion.api.quantity import Quantity, QuantityError
from tfusion.controller.defaults import (
    DEFAULT_ISOLATION,
    DEFAULT_VENDOR,
    parse_quantity,
    pool_vendor,
    provider_config_for,
    worker_image,
)
from tfusion.controller.limiter_source import TFUSION_IMAGE, limiter_source
from tfusion.controller.reconcilers.common import FINALIZER
from tfusion.controller.webhook.build import DEFAULT_HYPERVISOR_PORT, entries, hypervisor_port
from tfusion.controller.webhook.mutate import LIMITER_LIBRARIES
from tfusion.controller.worker_shape import (
    WORKER_CONTAINER,
    WORKER_GRACE_SECONDS,
    WORKER_PORT,
    WORKER_PORT_NAME,
    WorkerShape,
    data_volume,
    needs_data_volume,
    soft_limiter_parts,
    worker_container,
)
from tfusion.kube.ownership import OwnerReference

#: the label value limit: longer names are not written as labels
MAX_LABEL_VALUE = 63

_RESOURCE_ANNOTATIONS = {
    ("requests", "tflops"): "TFLOPS_REQUEST", ("limits", "tflops"): "TFLOPS_LIMIT",
    ("requests", "compute"): "COMPUTE_PERCENT_REQUEST", ("limits", "compute"): "COMPUTE_PERCENT_LIMIT",
    ("requests", "vram"): "VRAM_REQUEST", ("limits", "vram"): "VRAM_LIMIT",
}


class TemplateError(ValueError):
    """A worker pod template cannot be applied; the message names where it came from."""


def template_hash(pool: GpuPool | None, workload: Workload) -> str:
    """What a worker pod is made of: the pool's worker component, the hypervisor port and the spec."""
    config = pool.component_config if pool is not None else section(None)
    basis = {"worker": section(config, "worker"),
             "hypervisorPort": section(config, "hypervisor").get("portNumber"),
             # the replica count says how many workers, not what one is
             "spec": {k: v for k, v in workload.spec.items() if k != "replicas"}}
    return content_hash(basis, 10)


def label_value(value: str) -> str | None:
    """`value` when Kubernetes takes it as a label value (length only: names are valid values)."""
    return value if len(value) <= MAX_LABEL_VALUE else None


def _annotations(workload: Workload, pool_name: str) -> dict[str, str]:
    """The GPU request of the workload's spec as the annotations the allocator reads."""
    spec = workload.spec
    notes: dict[str, str] = {tfa.GPU_POOL: pool_name}
    for (side, name), key in _RESOURCE_ANNOTATIONS.items():
        value = section(spec, "resources", side).get(name)
        if value not in (None, "", "0", 0):
            notes[getattr(tfa, key)] = str(value)
    indices = items(spec, "gpuIndices")
    if indices:
        notes[tfa.GPU_INDICES] = ",".join(str(i) for i in indices)
    notes[tfa.GPU_COUNT] = str(spec.get("gpuCount") or len(indices) or 1)
    for field_name, key in (("qos", tfa.QOS), ("isolation", tfa.ISOLATION), ("gpuModel", tfa.GPU_MODEL),
                            ("vendor", tfa.VENDOR), ("partitionTemplateId", tfa.PARTITION_ID)):
        if spec.get(field_name):
            notes[key] = str(spec[field_name])
    return notes


def _vendor(pool: GpuPool | None, spec: JsonMapping) -> str:
    return text(spec, "vendor") or (pool_vendor(pool) if pool is not None else DEFAULT_VENDOR)


def _limit(spec: JsonMapping, name: str) -> Quantity | None:
    """A limit of the workload's spec (the CRD checked its syntax; an unreadable one is no limit)."""
    raw = section(spec, "resources", "limits").get(name)
    if raw in (None, ""):
        return None
    try:
        return parse_quantity(raw) or None
    except (QuantityError, TypeError, ValueError):
        return None


def _disabled_features(workload: Workload) -> tuple[str, ...]:
    raw = workload.meta.annotation(tfa.DISABLE_FEATURES) or workload.meta.label(tfa.DISABLE_FEATURES)
    try:
        return tfa.parse_disable_features(raw) if raw else ()
    except AnnotationError:
        return ()  # the webhook refused it on the pod; one written by hand disables nothing


def _add_soft_limiter(pod_spec: JsonObject, container: JsonObject, shape: WorkerShape,
                      providers: Sequence[JsonMapping], limiter_image: str) -> None:
    """Our limiter (or the ProviderConfig's middleware image's) over the worker's own (skipped for a
    vendor with neither)."""
    source = limiter_source(provider_config_for(providers, shape.vendor), shape.vendor, limiter_image)
    library = LIMITER_LIBRARIES.get(shape.vendor.lower() or "nvidia")
    if source is None or not library:
        return
    parts = soft_limiter_parts(source, library)
    pod_spec["initContainers"] = [parts.init]
    pod_spec["volumes"] = [*entries(pod_spec, "volumes"), parts.volume]
    container["volumeMounts"] = [*entries(container, "volumeMounts"), *parts.mounts]
    container["env"] = [*entries(container, "env"), *parts.env]


def shape_of(workload: Workload, pool: GpuPool | None, providers: Sequence[JsonMapping]) -> WorkerShape:
    """What the workload's worker container is made of (worker_shape.py)."""
    spec = workload.spec
    vendor = _vendor(pool, spec)
    return WorkerShape(image=worker_image(pool, provider_config_for(providers, vendor)),
                       isolation=text(spec, "isolation") or DEFAULT_ISOLATION, vendor=vendor,
                       hypervisor_port=hypervisor_port(pool) if pool is not None else DEFAULT_HYPERVISOR_PORT,
                       disabled_features=_disabled_features(workload), compute_limit=_limit(spec, "compute"),
                       vram_limit=_limit(spec, "vram"))


def _template_spec(template: object) -> JsonMapping | None:
    """A PodTemplate ({template: {...}}) or a PodTemplateSpec ({metadata, spec}) as the latter."""
    if not isinstance(template, Mapping):
        return None
    inner = template.get("template")
    return inner if isinstance(inner, Mapping) else template


def _as_worker_template(patch: JsonObject) -> None:
    """A template's first container is the worker container (the original's rule), whatever its name."""
    spec = patch.get("spec")
    found = spec.get("containers") if isinstance(spec, dict) else None
    if isinstance(found, list) and found and isinstance(found[0], dict):
        found[0]["name"] = WORKER_CONTAINER


def _merge_template(pod: JsonObject, template: object, source: str) -> JsonObject:
    found = _template_spec(template)
    if not found:
        return pod
    patch = {key: json_copy(found[key]) for key in ("metadata", "spec") if isinstance(found.get(key), Mapping)}
    _as_worker_template(patch)
    try:
        merged: JsonObject = strategic_merge_patch(pod, patch, "Pod")
    except PatchError as exc:
        raise TemplateError(f"{source} cannot be applied to the worker pod: {exc}") from None
    return merged


def worker_pod(workload: Workload, pool: GpuPool | None, providers: Sequence[JsonMapping], *, owner: OwnerReference,
               name: str = "", generate_name: str = "", template: str, dedicated: bool = False,
               index: int | None = None, limiter_image: str = TFUSION_IMAGE) -> JsonObject:
    """The worker pod of `workload` (see the module docstring); `owner` is its controlling
    ownerReference (the workload, or the connection of a dedicated worker); `limiter_image` is the
    tfusion image (--limiter-image)."""
    spec = workload.spec
    pool_name = workload.pool_name or workload.meta.label(tfa.GPU_POOL) or (pool.name if pool is not None else "")
    labels = {tfa.COMPONENT: tfa.COMPONENT_WORKER, tfa.POD_TEMPLATE_HASH: template}
    for key, value in ((tfa.WORKLOAD, workload.name), (tfa.GPU_POOL, pool_name)):
        if label_value(value):
            labels[key] = value
    notes = _annotations(workload, pool_name)
    if dedicated:
        notes[tfa.DEDICATED_WORKER] = "true"
    metadata: JsonObject = {"namespace": workload.namespace or None, "labels": {**labels}, "annotations": {**notes},
                            "finalizers": [FINALIZER], "ownerReferences": [json_object(owner)]}
    if name:
        metadata["name"] = name
    else:
        metadata["generateName"] = generate_name
    shape = shape_of(workload, pool, providers)
    container = worker_container(shape)
    if index is not None:
        resource, count = podindex.encode_pod_index(index)
        resources = container["resources"]
        assert isinstance(resources, dict)  # worker_container wrote it
        resources["limits"] = {resource: str(count)}
    pod_spec: JsonObject = {"schedulerName": tfa.SCHEDULER_NAME, "containers": [container],
                            "terminationGracePeriodSeconds": WORKER_GRACE_SECONDS,
                            "tolerations": [{"key": tfa.USED_BY, "operator": "Equal",
                                             "value": tfa.USED_BY_TENSOR_FUSION, "effect": "PreferNoSchedule"}]}
    if needs_data_volume(shape.isolation):
        pod_spec["volumes"] = [data_volume()]
    if shape.isolation == tfa.ISOLATION_SOFT:
        _add_soft_limiter(pod_spec, container, shape, providers, limiter_image)
    if workload.qos in ("high", "critical"):
        pod_spec["priorityClassName"] = tfa.priority_class_name(workload.qos)
    if isinstance(spec.get("nodeAffinity"), Mapping):
        pod_spec["affinity"] = {"nodeAffinity": json_copy(spec["nodeAffinity"])}
    pod: JsonObject = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}
    if pool is not None:
        pod = _merge_template(pod, section(pool.component_config, "worker").get("podTemplate"),
                              f"GPUPool {pool.name}: spec.componentConfig.worker.podTemplate")
    pod = _merge_template(pod, spec.get("workerPodTemplate"),
                          f"TensorFusionWorkload {workload.name}: spec.workerPodTemplate")
    # what the template may not change: who the pod is and what it belongs to
    merged = Pod(pod).meta
    pod["metadata"] = {**json_object(merged.raw),
                       **{key: metadata[key] for key in ("namespace", "finalizers", "ownerReferences")},
                       "labels": {**merged.labels, **labels}, "annotations": {**merged.annotations, **notes}}
    return pod


def worker_port(pod: Pod) -> int:
    """The port the worker listens on: its `remote-vgpu` container port, else 8000."""
    for container in pod.containers:
        for port in sequence_of_maps(container.get("ports")):
            number = port.get("containerPort")
            if port.get("name") == WORKER_PORT_NAME and isinstance(number, int):
                return int(number)
    return WORKER_PORT


def serving(pod: Pod | None) -> bool:
    """Running, with an address, and not on its way out."""
    return pod is not None and pod.phase == "Running" and bool(pod.pod_ip) and not pod.meta.deleting


def connection_url(pod: Pod) -> str:
    """`native+<podIP>+<port>+<pod>-<resourceVersion>`: where the client reaches this worker."""
    return f"native+{pod.pod_ip}+{worker_port(pod)}+{pod.name}-{pod.meta.resource_version}"


def url_of_same_worker(url: str, pod: Pod) -> bool:
    """Whether `url` was given for this pod at its current address (its resourceVersion moves on)."""
    return url.startswith(f"native+{pod.pod_ip}+{worker_port(pod)}+{pod.name}-")
