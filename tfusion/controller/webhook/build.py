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

import orjson

from tfusion.api import annotations as tfa
from tfusion.api.accessors import GpuPool, section, text
from tfusion.api.jsontypes import JsonMapping, JsonObject
from tfusion.controller.defaults import Amounts, Resolved, annotation_bool, request_annotations, worker_image

DEFAULT_CLIENT_IMAGE = "tensorfusion/tensor-fusion-client:latest"
DEFAULT_HYPERVISOR_PORT = 8001


@dataclass(frozen=True)
class Gang:
    """The gang a pod joins: its owner's replicas (`desired`), how many must start together."""

    desired: int
    required: int
    min_members: int
    timeout: str


def json_document(value: JsonMapping) -> JsonObject:
    """A deep copy of a JSON object to write into (orjson's round trip: several times faster than
    a copy in Python, which the pod being rendered would pay on every review)."""
    copied = orjson.loads(orjson.dumps(value))
    if not isinstance(copied, dict):  # an object encodes and decodes as one
        raise TypeError(f"not a JSON object: {type(value).__name__}")
    return copied


def _quantity_map(amounts: Amounts, side: str) -> JsonObject:
    # the CRD requires tflops and vram in every Resource; "0" means none
    result: JsonObject = {"tflops": str(amounts.get((side, "tflops")) or "0"),
                          "vram": str(amounts.get((side, "vram")) or "0")}
    if amounts.get((side, "compute")):
        result["compute"] = str(amounts[(side, "compute")])
    return result


def child(doc: JsonObject, key: str) -> JsonObject:
    """The object at `key` of a document being written; made first when absent or not an object."""
    found = doc.get(key)
    if isinstance(found, dict):
        return found
    made: JsonObject = {}
    doc[key] = made
    return made


def entries(doc: JsonObject, key: str) -> list[JsonObject]:
    """The objects in the list at `key` (the document's own, changed in place); others are skipped."""
    found = doc.get(key)
    return [e for e in found if isinstance(e, dict)] if isinstance(found, list) else []


def workload_spec(resolved: Resolved, notes: Mapping[str, str], gang: Gang | None) -> JsonObject:
    """The workload's spec: the profile's, with what was resolved for the pod written over it."""
    r = resolved
    spec = json_document(r.profile.spec)
    spec.pop("workerPodTemplate", None)
    spec.update({"poolName": r.pool_name, "qos": r.qos, "isLocalGPU": True, "sidecarWorker": r.sidecar,
                 "isolation": r.isolation, "gpuCount": r.gpu_count,
                 "resources": {"requests": _quantity_map(r.amounts, "requests"),
                               "limits": _quantity_map(r.amounts, "limits")}})
    for key, value in (("vendor", r.named_vendor), ("gpuModel", r.model), ("partitionTemplateId", r.partition)):
        if value:
            spec[key] = value
    if r.indices:
        spec["gpuIndices"] = list(r.indices)
    if annotation_bool(notes, tfa.AUTOSCALE):
        auto = child(child(spec, "autoScalingConfig"), "autoSetResources")
        auto["enable"] = True
        auto["targetResource"] = tfa.parse_autoscale_target(notes[tfa.AUTOSCALE_TARGET]) \
            if notes.get(tfa.AUTOSCALE_TARGET) else "all"
    if gang is not None:
        gang_spec: JsonObject = {"minMembers": gang.min_members}
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


def workload_object(name: str, namespace: str, pool_name: str, owner_reference: JsonMapping | None,
                    spec: JsonObject, notes: Mapping[str, str],
                    container_counts: Mapping[str, int]) -> JsonObject:
    """The TensorFusionWorkload the pod belongs to, as workloads.py creates it."""
    annotations: JsonObject = {tfa.WORKLOAD_MODE: tfa.WORKLOAD_MODE_DYNAMIC}
    if notes.get(tfa.DISABLE_FEATURES):
        annotations[tfa.DISABLE_FEATURES] = ",".join(tfa.parse_disable_features(notes[tfa.DISABLE_FEATURES]))
    if container_counts:
        annotations[tfa.CONTAINER_GPU_COUNT] = orjson.dumps(dict(sorted(container_counts.items()))).decode()
    meta: JsonObject = {"name": name, "namespace": namespace, "labels": {tfa.GPU_POOL: pool_name},
                            "annotations": annotations}
    if owner_reference is not None:
        meta["ownerReferences"] = [json_document(owner_reference)]
    return {"apiVersion": "tensor-fusion.ai/v1", "kind": "TensorFusionWorkload", "metadata": meta, "spec": spec}


def pending_workload(workload: JsonMapping) -> str:
    """The PENDING_OWNED_WORKLOAD_SPEC annotation of a bare local pod: what of `workload` is not
    its name, namespace or owner (those the pod reconciler writes), as compact JSON."""
    meta = section(workload, "metadata")
    return orjson.dumps({"labels": section(meta, "labels"), "annotations": section(meta, "annotations"),
                         "spec": section(workload, "spec")}, option=orjson.OPT_SORT_KEYS).decode()


def images(pool: GpuPool, provider: JsonMapping | None) -> tuple[str, str]:
    """(client, worker) images: the ProviderConfig's and the pool's, else the defaults (the soft
    limiter's image is limiter_source.py's)."""
    given = section(provider, "spec", "images")
    client = text(given, "remoteClient") or text(pool.component_config, "client", "image") or DEFAULT_CLIENT_IMAGE
    return client, worker_image(pool, provider)


def hypervisor_port(pool: GpuPool) -> int:
    port = section(pool.component_config, "hypervisor").get("portNumber")
    return port if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536 \
        else DEFAULT_HYPERVISOR_PORT
