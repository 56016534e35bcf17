"""A PodDisruptionBudget's numbers, counted as kube's disruption controller counts them.

Why it exists: drain tools read `status.disruptionsAllowed` and pods/eviction answers 429 from the
same numbers, so the disruption controller (tfusion/embedded/disruption.py) and the eviction
(services.py) share this one arithmetic and never disagree. As in kube:

- `currentHealthy` counts the selected pods that are Running, Ready and not being deleted;
- an integer `minAvailable` is `desiredHealthy` itself and `expectedPods` is the selected pods;
- a percentage `minAvailable`, or any `maxUnavailable`, is taken of the scale of the pods'
  controllers: each distinct controller counted once, a ReplicaSet that a Deployment controls by the
  Deployment's `spec.replicas`, a StatefulSet by its own, a lone ReplicaSet by its own. Selected pods
  with no controller are left out of `expectedPods` (kube warns with an UnmanagedPods event); a
  controller of another kind (a Job, a DaemonSet) or one that is gone makes the budget allow no
  disruption, with the condition `DisruptionAllowed=False`, reason `SyncFailed`, saying why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from tfusion.api.timestamps import rfc3339
from tfusion.apiserver.netpolicy import healthy

#: the scale of the controller an ownerReference names, in the namespace given; None when it is
#: not a kind with a scale or is gone
ScaleOf = Callable[[Mapping[str, Any], str], tuple[str, int] | None]
SCALED_KINDS = (("apps", "ReplicaSet"), ("apps", "StatefulSet"))
CONDITION = "DisruptionAllowed"


def controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((ref for ref in refs if isinstance(ref, dict) and ref.get("controller")), None)


def replicas(obj: Mapping[str, Any]) -> int:
    value = (obj.get("spec") or {}).get("replicas")
    return value if isinstance(value, int) else 1


def scale_from(lookup: Callable[[str, str, str], Mapping[str, Any] | None]) -> ScaleOf:
    """A ScaleOf over `lookup(kind, namespace, name)`, which reads the apps/v1 Deployments,
    ReplicaSets and StatefulSets from wherever the caller keeps them (the store, an informer)."""
    def scale_of(ref: Mapping[str, Any], namespace: str) -> tuple[str, int] | None:
        group = str(ref.get("apiVersion", "")).partition("/")[0]
        if (group, ref.get("kind")) not in SCALED_KINDS:
            return None
        found = lookup(str(ref["kind"]), namespace, str(ref.get("name", "")))
        if found is None or (found.get("metadata") or {}).get("uid") != ref.get("uid"):
            return None
        parent = controller_of(found)
        if ref.get("kind") == "ReplicaSet" and parent is not None and parent.get("kind") == "Deployment":
            deployment = lookup("Deployment", namespace, str(parent.get("name", "")))
            if deployment is None or (deployment.get("metadata") or {}).get("uid") != parent.get("uid"):
                return None
            return str(parent["uid"]), replicas(deployment)
        return str(ref["uid"]), replicas(found)
    return scale_of


def expected_scale(pods: list[dict[str, Any]], scale_of: ScaleOf) -> tuple[int, list[str], str | None]:
    """(the sum of the pods' controllers' scales, the unmanaged pods' names, why it cannot be counted)."""
    scales: dict[str, int] = {}
    unmanaged: list[str] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        ref = controller_of(pod)
        if ref is None:
            unmanaged.append(str(meta.get("name", "")))
            continue
        if ref.get("uid") in scales:
            continue
        found = scale_of(ref, str(meta.get("namespace", "")))
        if found is None:
            return 0, unmanaged, f'found no controllers for pod "{meta.get("name", "")}"'
        scales[found[0]] = found[1]
        scales.setdefault(str(ref.get("uid")), 0)  # the ReplicaSet itself: seen, counted through its Deployment
    return sum(scales.values()), unmanaged, None


def _scaled(value: Any, expected: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * expected / 100)
    return int(value)


def budget_numbers(pdb: Mapping[str, Any], pods: list[dict[str, Any]],
                   scale_of: ScaleOf) -> tuple[int, int, list[str], str | None]:
    """(expectedPods, desiredHealthy, unmanaged pods, the sync failure) of `pdb` over its selected pods."""
    spec = pdb.get("spec") or {}
    minimum, maximum = spec.get("minAvailable"), spec.get("maxUnavailable")
    if maximum is None and not isinstance(minimum, str):
        return len(pods), int(minimum or 0), [], None
    expected, unmanaged, failure = expected_scale(pods, scale_of)
    if failure is not None:
        return expected, 0, unmanaged, failure
    if maximum is not None:
        return expected, max(0, expected - _scaled(maximum, expected)), unmanaged, None
    return expected, _scaled(minimum, expected), unmanaged, None


def budget_status(pdb: Mapping[str, Any], pods: list[dict[str, Any]], scale_of: ScaleOf) -> dict[str, Any]:
    """The status fields kube's disruption controller keeps, with the DisruptionAllowed condition."""
    expected, desired, _, failure = budget_numbers(pdb, pods, scale_of)
    current = sum(1 for p in pods if healthy(p))
    allowed = 0 if failure is not None else max(0, current - desired)
    generation = (pdb.get("metadata") or {}).get("generation", 1)
    if failure is not None:
        reason, message = "SyncFailed", failure
    else:
        reason, message = ("SufficientPods", "") if allowed > 0 else ("InsufficientPods", "")
    condition = _condition(pdb, "True" if allowed > 0 else "False", reason, message, generation)
    return {"currentHealthy": current, "desiredHealthy": desired, "expectedPods": expected,
            "disruptionsAllowed": allowed, "observedGeneration": generation, "conditions": [condition]}


def _condition(pdb: Mapping[str, Any], status: str, reason: str, message: str, generation: Any) -> dict[str, Any]:
    """The DisruptionAllowed condition; its lastTransitionTime moves only when its status does."""
    old = next((c for c in ((pdb.get("status") or {}).get("conditions") or [])
                if isinstance(c, dict) and c.get("type") == CONDITION), None)
    since = old.get("lastTransitionTime") if old is not None and old.get("status") == status else None
    return {"type": CONDITION, "status": status, "reason": reason, "message": message,
            "observedGeneration": generation, "lastTransitionTime": since or rfc3339()}


__all__ = ["ScaleOf", "budget_numbers", "budget_status", "controller_of", "expected_scale", "scale_from"]
