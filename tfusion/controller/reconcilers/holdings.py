"""What a worker pod holds: the one controller-side reading of "this pod still holds GPUs".

Why one module: recovery, adoption, the drift audit and the pod reconciler must agree on which pods
hold GPUs and on what their annotations say they hold; a second copy of the rule would let one of
them release (or restore) what another keeps. The generic pod predicates (worker, client,
finished) are the `Pod` view's (tfusion/api/accessors.py); this module adds the allocator's side.
"""

from __future__ import annotations

from tfusion.allocator import AllocRequest, GpuAllocator, RequestError, request_from_pod
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod
from tfusion.api.annotations import AnnotationError


def is_live_worker(pod: Pod) -> bool:
    """A worker pod whose GPUs are still held: bound, with gpu-ids, not finished, not being
    deleted after our finalizer has gone (the recovery rule of the original, plus "not finished")."""
    if not pod.is_worker or not pod.node_name or not pod.meta.annotation(tfa.GPU_IDS):
        return False
    if pod.finished:
        return False
    return not (pod.meta.deleting and tfa.FINALIZER not in pod.meta.finalizers)


def gpu_names(pod: Pod) -> tuple[str, ...]:
    """The GPUs a worker's gpu-ids annotation names (raises AnnotationError)."""
    return tfa.parse_gpu_ids(pod.meta.annotation(tfa.GPU_IDS) or "", key=tfa.GPU_IDS)


def worker_request(pod: Pod, allocator: GpuAllocator) -> tuple[AllocRequest, tuple[str, ...]]:
    """The allocation a bound worker pod holds, from its annotations (raises RequestError).

    A pod that names no pool gets the pool of its first GPU."""
    try:
        names = gpu_names(pod)
    except AnnotationError as exc:
        raise RequestError(exc.key, exc.value, exc.allowed, detail=exc.detail) from None
    default_pool = allocator.gpu_info(names[0]).pool if knows_gpu(allocator, names[0]) else None
    req = request_from_pod(pod.raw, default_pool=default_pool)
    return req, names


def knows_gpu(allocator: GpuAllocator, name: str) -> bool:
    try:
        allocator.gpu_info(name)
    except KeyError:
        return False
    return True


def pod_ref(pod: Pod) -> str:
    """namespace/name, for log lines."""
    return f"{pod.namespace}/{pod.name}"
