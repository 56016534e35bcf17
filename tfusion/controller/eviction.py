"""Evicting a pod the way kube does (the Eviction API, so PodDisruptionBudgets are checked once more
by the API server) and the rules that say beforehand whether a pod may go: its eviction protection
and the budgets that select it. Preemption (scheduling/preemption.py) and defrag
(provisioning/compaction.py) both evict; the rules live here once.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, Pod
from tfusion.api.selectors import SelectorError, label_selector_from_dict
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient

#: the end of a protection that never ends (tfa.protection_end's infinity)
FOREVER = datetime.max.replace(tzinfo=UTC)


async def evict(client: KubeClient, pod: Pod) -> None:
    """POST the pod's eviction (policy/v1). A budget that forbids it answers 429 (KubeError with
    code 429); a pod already gone, 404 (NotFound)."""
    name, namespace = pod.name, pod.namespace or "default"
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
    await client.request("POST", r.PODS, path=f"{name}/eviction", namespace=namespace, body=body)


def protected_until(pod: Pod) -> datetime | None:
    """When the pod's eviction protection ends (tfa.protection_end); None when it has none."""
    end = tfa.protection_end(pod.meta.annotations, pod.meta.creation_timestamp)
    if end is None:
        return None
    if end >= FOREVER.timestamp():
        return FOREVER
    return datetime.fromtimestamp(end, UTC)


def selects(budget: Mapping[str, Any], pod: Pod) -> bool:
    """A PodDisruptionBudget of the pod's namespace whose selector matches it (policy/v1: an empty
    selector matches every pod of the namespace)."""
    if Body(budget).namespace != (pod.namespace or "default"):
        return False
    try:
        selector = label_selector_from_dict((budget.get("spec") or {}).get("selector"), field="spec.selector")
    except SelectorError:
        return False
    return selector.matches(pod.meta.labels)


def disruptions_allowed(budget: Mapping[str, Any]) -> int:
    value = (budget.get("status") or {}).get("disruptionsAllowed")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
