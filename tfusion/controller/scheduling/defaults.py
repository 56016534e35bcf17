"""The defaults the pod webhook gives a GPU pod before anything schedules it, as one pure function.

Why it exists: a pod as the user wrote it (`kubectl get pod X -o yaml`) often names no pool, no
isolation and no QoS; the webhook fills them in when the pod is created. Anything that reasons
about such a raw pod (simulate-schedule now, the webhook later) must fill them in the same way, so
the rules live here once. In the original webhook's order:
1. pool: the `gpupool` annotation, else the GPUPool annotated `is-default-pool: "true"` (the first
   by name when several are; none is an error naming the annotation);
2. isolation: `soft`;
3. QoS: `high` when the pod's limits equal its requests for both TFLOPS and VRAM (and are not
   zero; a missing request counts as its limit), else the pool's `spec.qosConfig.defaultQoS`, else
   `medium`.
A value the pod already has is kept (and checked later by `request_from_pod`). Not applied here:
the namespace quota's `single.defaultRequests`/`defaultLimits` and WorkloadProfiles.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tfusion.allocator.request import RequestError, request_from_pod
from tfusion.api import annotations as tfa
from tfusion.api.annotations import AnnotationError

DEFAULT_ISOLATION = tfa.DEFAULT_ISOLATION
DEFAULT_QOS = "medium"
EQUAL_LIMITS_QOS = "high"


def _field(obj: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = obj.get(name)
    return value if isinstance(value, Mapping) else {}


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _field(obj, "metadata")


def _name(pool: Mapping[str, Any]) -> str:
    return str(_metadata(pool).get("name") or "")


def is_default_pool(pool: Mapping[str, Any]) -> bool:
    """Whether a GPUPool is annotated `is-default-pool` true (any spelling Go's ParseBool reads)."""
    value = (_metadata(pool).get("annotations") or {}).get(tfa.IS_DEFAULT_POOL)
    if not isinstance(value, str):
        return False
    try:
        return tfa.parse_bool(value, key=tfa.IS_DEFAULT_POOL)
    except AnnotationError:
        return False


def default_pool_name(pools: Sequence[Mapping[str, Any]]) -> str | None:
    """The name of the default GPUPool (first by name when several are marked), or None."""
    names = sorted(_name(p) for p in pools if is_default_pool(p) and _name(p))
    return names[0] if names else None


def _pool_default_qos(pools: Sequence[Mapping[str, Any]], pool_name: str) -> str | None:
    for pool in pools:
        if _name(pool) == pool_name:
            value = _field(_field(pool, "spec"), "qosConfig").get("defaultQoS")
            return value if isinstance(value, str) and value else None
    return None


def _limits_equal_requests(pod: Mapping[str, Any]) -> bool:
    req = request_from_pod(pod)
    return (req.tflops_limit > 0 and req.vram_limit > 0
            and req.tflops_request == req.tflops_limit and req.vram_request == req.vram_limit)


def default_pod_request(pod: Mapping[str, Any], pools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A copy of `pod` whose annotations carry the pool, isolation and QoS the webhook would give it.

    `pools` are GPUPool objects (as the API server returns them). Raises `RequestError` naming the
    `gpupool` annotation when the pod names no pool and no pool is the default, and for any
    unreadable resource annotation (through `request_from_pod`).
    """
    meta = dict(_metadata(pod))
    notes: dict[str, str] = dict(meta.get("annotations") or {})
    if not notes.get(tfa.GPU_POOL):
        pool = default_pool_name(pools)
        if pool is None:
            raise RequestError(tfa.GPU_POOL, "", "the name of a GPUPool",
                               detail=f"the pod names no pool and no GPUPool is annotated "
                                      f'{tfa.IS_DEFAULT_POOL}: "true"')
        notes[tfa.GPU_POOL] = pool
    if not notes.get(tfa.ISOLATION):
        notes[tfa.ISOLATION] = DEFAULT_ISOLATION
    meta["annotations"] = notes
    defaulted = {**pod, "metadata": meta}
    if not notes.get(tfa.QOS):
        if _limits_equal_requests(defaulted):
            notes[tfa.QOS] = EQUAL_LIMITS_QOS
        else:
            notes[tfa.QOS] = _pool_default_qos(pools, notes[tfa.GPU_POOL]) or DEFAULT_QOS
    return defaulted
