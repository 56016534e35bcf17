"""What the pod webhook writes, built from a decided request: the pod's normalized annotations and
the TensorFusionWorkload the pod belongs to.

Why a module of its own: mutate.py decides (with the shared resolver, tfusion/controller/defaults.py,
and the webhook's own checks); this module only turns the decision into documents, so each of the
two reads as one job. The documents are plain dicts: they are written (the workload is created or
patched by workloads.py, the annotations go into the JSON patch), never read back through here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from tfusion.api import annotations as tfa
from tfusion.api.accessors import GpuPool, section, text
from tfusion.controller.defaults import Amounts, Resolved, annotation_bool, request_annotations, worker_image

DEFAULT_MIDDLEWARE_IMAGES = {"nvidia": "tensorfusion/vgpu-provider-nvidia:latest"}
DEFAULT_CLIENT_IMAGE = "tensorfusion/tensor-fusion-client:latest"
DEFAULT_HYPERVISOR_PORT = 8001


@dataclass(frozen=True)
class Gang:
    """The gang a pod joins: its owner's replicas (`desired`), how many must start together."""

    desired: int
    required: int
    min_members: int
    timeout: str


def json_copy(value: Any) -> Any:
    """A deep copy of a JSON document (several times faster than copy.deepcopy)."""
    return orjson.loads(orjson.dumps(value))


def _quantity_map(amounts: Amounts, side: str) -> dict[str, str]:
    # the CRD requires tflops and vram in every Resource; "0" means none
    result = {"tflops": str(amounts.get((side, "tflops")) or "0"), "vram": str(amounts.get((side, "vram")) or "0")}
    if amounts.get((side, "compute")):
        result["compute"] = str(amounts[(side, "compute")])
    return result


def workload_spec(resolved: Resolved, notes: Mapping[str, str], gang: Gang | None) -> dict[str, Any]:
    """The workload's spec: the profile's, with what was resolved for the pod written over it."""
    r = resolved
    spec: dict[str, Any] = json_copy(r.profile.spec)
    spec.pop("workerPodTemplate", None)
    spec.update({"poolName": r.pool_name, "qos": r.qos, "isLocalGPU": True, "sidecarWorker": r.sidecar,
                 "isolation": r.isolation, "gpuCount": r.gpu_count, "vendor": r.vendor,
                 "resources": {"requests": _quantity_map(r.amounts, "requests"),
                               "limits": _quantity_map(r.amounts, "limits")}})
    for key, value in (("gpuModel", r.model), ("partitionTemplateId", r.partition)):
        if value:
            spec[key] = value
    if r.indices:
        spec["gpuIndices"] = list(r.indices)
    if annotation_bool(notes, tfa.AUTOSCALE):
        auto = spec.setdefault("autoScalingConfig", {}).setdefault("autoSetResources", {})
        auto["enable"] = True
        auto["targetResource"] = tfa.parse_autoscale_target(notes[tfa.AUTOSCALE_TARGET]) \
            if notes.get(tfa.AUTOSCALE_TARGET) else "all"
    if gang is not None:
        gang_spec: dict[str, Any] = {"minMembers": gang.min_members}
        if gang.timeout:
            gang_spec["timeout"] = gang.timeout
        spec["gangScheduling"] = gang_spec
    return spec


def normalized_annotations(resolved: Resolved, inject: list[str], gang: Gang | None, namespace: str,
                           workload: str) -> dict[str, str]:
    """The request's annotations (the resolver's) and the webhook's own: injected containers, gang."""
    notes = request_annotations(resolved)
    notes[tfa.INJECT_CONTAINER] = ",".join(inject)
    if gang is not None:
        notes[tfa.GANG_DESIRED_MEMBERS] = str(gang.desired)
        notes[tfa.GANG_REQUIRED_MEMBERS] = str(gang.required)
        notes[tfa.GANG_GROUP_KEY] = f"{namespace}/{workload}"
    return notes


def workload_object(name: str, namespace: str, pool_name: str, owner_reference: Mapping[str, Any] | None,
                    spec: dict[str, Any], notes: Mapping[str, str],
                    container_counts: Mapping[str, int]) -> dict[str, Any]:
    """The TensorFusionWorkload the pod belongs to, as workloads.py creates it."""
    annotations = {tfa.WORKLOAD_MODE: tfa.WORKLOAD_MODE_DYNAMIC}
    if notes.get(tfa.DISABLE_FEATURES):
        annotations[tfa.DISABLE_FEATURES] = ",".join(tfa.parse_disable_features(notes[tfa.DISABLE_FEATURES]))
    if container_counts:
        annotations[tfa.CONTAINER_GPU_COUNT] = orjson.dumps(dict(sorted(container_counts.items()))).decode()
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": {tfa.GPU_POOL: pool_name},
                            "annotations": annotations}
    if owner_reference is not None:
        meta["ownerReferences"] = [dict(owner_reference)]
    return {"apiVersion": "tensor-fusion.ai/v1", "kind": "TensorFusionWorkload", "metadata": meta, "spec": spec}


def images(pool: GpuPool, provider: Mapping[str, Any] | None, vendor: str) -> tuple[str, str, str]:
    """(middleware, client, worker) images: the ProviderConfig's and the pool's, else the defaults."""
    given = section(provider, "spec", "images")
    middleware = text(given, "middleware") or DEFAULT_MIDDLEWARE_IMAGES.get(vendor.lower(), "")
    client = text(given, "remoteClient") or text(pool.component_config, "client", "image") or DEFAULT_CLIENT_IMAGE
    return middleware, client, worker_image(pool, provider)


def hypervisor_port(pool: GpuPool) -> int:
    port = section(pool.component_config, "hypervisor").get("portNumber")
    return port if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536 \
        else DEFAULT_HYPERVISOR_PORT
