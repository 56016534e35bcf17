"""The disruption controller of `--role=all`: a PodDisruptionBudget's status follows its pods.

Why it exists: `kubectl get pdb` shows ALLOWED DISRUPTIONS and drain tools read
`status.disruptionsAllowed` before they evict; kube-controller-manager keeps those numbers. Here a
small level-triggered controller recounts a budget whenever it, a pod it selects, or a Deployment,
ReplicaSet or StatefulSet in its namespace (whose scale a percentage or maxUnavailable budget
counts) changes, with the arithmetic pods/eviction uses at the moment of an eviction
(tfusion/apiserver/budgets.py), so the status and the eviction's 429 never disagree. A budget
whose selected pods have no controller gets kube's UnmanagedPods warning. Leader-only, as in
kube-controller-manager.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from tfusion.api.accessors import Body
from tfusion.api.jsontypes import JsonMapping
from tfusion.apiserver.budgets import budget_numbers, budget_status, scale_from
from tfusion.apiserver.netpolicy import selects
from tfusion.embedded.workloads.statefulset import STATEFULSETS
from tfusion.kube import resources as r
from tfusion.kube.client import NotFound
from tfusion.kube.informer import Informer
from tfusion.kube.manager import Manager
from tfusion.kube.reconciler import Result

PDBS = r.PODDISRUPTIONBUDGETS
UNMANAGED = ("Pods selected by this PodDisruptionBudget (selector: {selector}) were found to be unmanaged. As a "
             "result, the status of the PDB cannot be calculated correctly, which may result in undefined "
             "behavior. To account for these pods please set \".spec.minAvailable\" field of the PDB to an "
             "integer value.")


class DisruptionController:
    """Registers itself with `manager`: budgets drive it; pods and scaled controllers requeue budgets."""

    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        cache = manager.cache
        self.budgets: Informer = cache.informer(PDBS)
        self.pods: Informer = cache.informer(r.PODS)
        self.scaled: dict[str, Informer] = {"Deployment": cache.informer(r.DEPLOYMENTS),
                                             "ReplicaSet": cache.informer(r.REPLICASETS),
                                             "StatefulSet": cache.informer(STATEFULSETS)}
        builder = manager.controller("disruption").for_(PDBS).watches(r.PODS, self._budgets_of)
        for resource in (r.DEPLOYMENTS, r.REPLICASETS, STATEFULSETS):
            builder = builder.watches(resource, self._budgets_in_namespace)
        builder.complete(self.reconcile)

    def _budgets_of(self, pod: JsonMapping) -> Iterator[str]:
        raw = dict(pod)
        namespace = Body(pod).namespace
        for budget in self.budgets.list():
            if Body(budget).namespace == namespace and selects(budget, raw):
                yield f"{namespace}/{Body(budget).name}"

    def _budgets_in_namespace(self, controller: JsonMapping) -> list[str]:
        """A scale that changes may change the count of any budget in its namespace."""
        namespace = Body(controller).namespace
        return [f"{namespace}/{b.name}" for b in map(Body, self.budgets.list()) if b.namespace == namespace]

    def _cached(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        informer = self.scaled.get(kind)
        return informer.get(f"{namespace}/{name}") if informer is not None else None

    async def reconcile(self, key: str) -> Result | None:
        raw = self.budgets.get(key)
        if raw is None:
            return None
        budget = Body(raw)
        pods: list[dict[str, Any]] = [p for p in self.pods.list()
                                      if Body(p).namespace == budget.namespace and selects(raw, p)]
        scale_of = scale_from(self._cached)
        status = budget_status(raw, pods, scale_of)
        current = dict(budget.status)
        if {**current, **status} == current:
            return None
        if budget_numbers(raw, pods, scale_of)[2] and self.manager.events is not None:
            selector = dict(budget.spec.get("selector") or {})
            self.manager.recorder.warning(budget, "UnmanagedPods", UNMANAGED.format(selector=selector))
        try:
            await self.manager.client.patch(PDBS, budget.name, {"status": status}, namespace=budget.namespace,
                                            subresource="status")
        except NotFound:
            pass  # deleted meanwhile
        return None
