"""Binding a reserved pod: the annotations and the Binding in one write, then the commit.

Why one write: the Binding subresource carries annotations of its own, which the API server
copies onto the pod in the same update that sets `spec.nodeName` (kube-apiserver does so too).
So a pod is never bound without its `gpu-ids`, nor annotated with GPUs it does not hold; that is
what makes a crash at any moment safe. The allocation goes through three states:

1. reserved (assumed) in the leader's memory by the scheduling cycle;
2. bound: the Binding succeeded. From here on the pod's annotations are the truth: a restarted
   leader rebuilds the allocation from `gpu-ids` (AllocatorService recovery), so nothing leaks
   and nothing is counted twice;
3. committed in memory (PreBind), and the GPU and quota statuses flushed.

A failure before 2 rolls the reservation back (Unreserve). An answer that does not say whether
the Binding happened (a timeout, a 5xx) is settled by reading the pod: bound to our node with
our `gpu-ids` means it happened. A 409 (bound by someone else, deleted, another UID) rolls back;
if another process bound it with GPUs, the AllocatorService adopts that allocation from the
pod's annotations.

Annotations written (reference §2.4): `gpu-ids` (comma list), `container-gpus` (JSON container ->
GPU ids, for the containers in `inject-container`, else the first container, sorted by name, the
GPUs split in order by `container-gpu-count` when given, else every GPU to each container),
`effective-hard-sm-percent` (hard isolation with an absolute TFLOPS limit:
ceil(limit / capacity x 100), 1..100), and `index`: the pod index its containers ask the device
plugin for (`<domain>/index_<k>` limit, written by the webhook), which the device plugin maps an
Allocate back to the pod by.

The node-level index lock: the allocator holds each pod's index on its node for as long as the
allocation lives (tfusion/allocator/indexlock.py) and Reserve refuses a node where another pod
holds it, so the filter steers such a pod elsewhere. Just before the Binding, `index_conflict`
checks the lock once more (a pod bound meanwhile by another process and adopted from its
annotations may hold the index now): a conflict is not bound; the caller rolls the reservation
back and retries the pod later with that reason. So two pods bound to one node never carry the
same index, and `index` is written only when the node-level index is the pod's alone.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tfusion.allocator import AllocRequest, GpuAllocator
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod
from tfusion.api.annotations import AnnotationError
from tfusion.api.jsontypes import JsonObject
from tfusion.kube import resources as r
from tfusion.kube.client import Conflict, KubeClient, KubeError, NotFound

log = logging.getLogger(__name__)


def injected_containers(pod: Pod) -> list[str]:
    """The containers that get GPUs: `inject-container` (comma list), else the first container."""
    named = [c.strip() for c in (pod.meta.annotation(tfa.INJECT_CONTAINER) or "").split(",") if c.strip()]
    if named:
        return sorted(set(named))
    raw = pod.spec.get("containers")
    first = raw[0].get("name") if isinstance(raw, list) and raw and isinstance(raw[0], Mapping) else None
    return [str(first)] if first else []


def container_gpus(pod: Pod, gpus: Sequence[str]) -> dict[str, list[str]]:
    """Container -> GPU ids: split in order by `container-gpu-count`, else every GPU to each."""
    containers = injected_containers(pod)
    counts: dict[str, int] = {}
    raw = pod.meta.annotation(tfa.CONTAINER_GPU_COUNT)
    if raw:
        try:
            counts = tfa.parse_container_gpu_count(raw, key=tfa.CONTAINER_GPU_COUNT)
        except AnnotationError as exc:
            log.warning("pod %s/%s: %s; giving every GPU to each container", pod.namespace, pod.name, exc)
            counts = {}
    if not counts or sum(counts.get(c, 0) for c in containers) != len(gpus):
        return {c: list(gpus) for c in containers}
    out: dict[str, list[str]] = {}
    at = 0
    for container in containers:
        n = counts.get(container, 0)
        out[container] = list(gpus[at:at + n])
        at += n
    return out


def effective_hard_sm_percent(req: AllocRequest, capacity_milli: int) -> int | None:
    """For hard isolation with an absolute TFLOPS limit: the SM share that limit is of the GPU."""
    if req.isolation != tfa.ISOLATION_HARD or not req.tflops_limit or capacity_milli <= 0:
        return None
    return max(1, min(100, math.ceil(req.tflops_limit * 100 / capacity_milli)))


def bind_annotations(pod: Pod, req: AllocRequest | None, gpus: Sequence[str],
                     allocator: GpuAllocator | None) -> dict[str, str]:
    """What the Binding writes on the pod (nothing for a pod without GPUs)."""
    if req is None or not gpus:
        return {}
    notes = {tfa.GPU_IDS: tfa.format_gpu_ids(gpus)}
    per_container = container_gpus(pod, gpus)
    if per_container:
        notes[tfa.CONTAINER_GPUS] = tfa.format_container_gpus(per_container)
    capacity = 0
    if allocator is not None:
        try:
            capacity = allocator.gpu_info(gpus[0]).capacity_tflops
        except KeyError:
            capacity = 0
    percent = effective_hard_sm_percent(req, capacity)
    if percent is not None:
        notes[tfa.EFFECTIVE_HARD_SM_PERCENT] = tfa.format_effective_hard_sm_percent(percent)
    if req.pod_index:
        notes[tfa.INDEX] = tfa.format_pod_index(req.pod_index)
    held = allocator.allocation(req.pod_uid) if allocator is not None else None
    part = held.partitions[0] if held is not None and held.partitions else None
    if part is not None:  # the hypervisor creates the partition of this template when the device is allocated
        notes[tfa.PARTITION_ID] = part.template_id
    return notes


def index_conflict(req: AllocRequest | None, node: str, allocator: GpuAllocator | None) -> str:
    """Why the pod must not be bound to `node` now: another pod holds its pod index there ("" when
    it may be bound: no index, or the node-level lock is the pod's alone)."""
    if req is None or not req.pod_index or allocator is None:
        return ""
    busy = allocator.index_conflict(req, node)
    return f"not bound: {busy}; the reservation is rolled back and the pod retried" if busy else ""


def binding_body(pod: Pod, node: str, annotations: Mapping[str, str]) -> JsonObject:
    meta = pod.meta
    metadata: JsonObject = {"name": meta.name or None, "namespace": meta.namespace or None, "uid": meta.uid or None}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Binding", "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}


@dataclass(frozen=True, slots=True)
class BindResult:
    """`bound`: the pod is on the node with our annotations; `error`: why not (empty when bound)."""

    bound: bool
    error: str = ""
    #: a 409: the pod was bound elsewhere, deleted or replaced; retrying this pod is pointless
    conflict: bool = False


async def post_binding(client: KubeClient, pod: Pod, node: str, annotations: Mapping[str, str]) -> BindResult:
    """POST pods/<name>/binding; an ambiguous failure is settled by reading the pod back."""
    name, namespace = pod.name, pod.namespace or "default"
    try:
        await client.request("POST", r.PODS, path=f"{name}/binding", namespace=namespace,
                             body=binding_body(pod, node, annotations))
        return BindResult(True)
    except Conflict as exc:
        return BindResult(False, f"binding refused: {exc}", conflict=True)
    except NotFound:
        return BindResult(False, "the pod was deleted before it could be bound", conflict=True)
    except KubeError as exc:
        failure = str(exc)
    try:
        current = await client.get(r.PODS, name, namespace=namespace)
    except KubeError as exc:
        return BindResult(False, f"binding failed ({failure}) and the pod cannot be read back: {exc}")
    if _bound_as_asked(Pod(current), pod, node, annotations):
        return BindResult(True)
    return BindResult(False, f"binding failed: {failure}")


def _bound_as_asked(current: Pod, pod: Pod, node: str, annotations: Mapping[str, str]) -> bool:
    if current.uid != pod.uid or current.node_name != node:
        return False
    return all(current.meta.annotation(k) == v for k, v in annotations.items())
