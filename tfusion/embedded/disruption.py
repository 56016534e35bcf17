"""The disruption controller of `--role=all`: a PodDisruptionBudget's status follows its pods.

Why it exists: `kubectl get pdb` shows ALLOWED DISRUPTIONS and drain tools read
`status.disruptionsAllowed` before they evict; kube-controller-manager keeps those numbers. Here a
small level-triggered controller recounts a budget whenever it or a pod it selects changes, with
the same arithmetic pods/eviction uses at the moment of an eviction (tfusion/apiserver/netpolicy.py),
so the status and the eviction's 429 never disagree. Leader-only, as in kube-controller-manager.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tfusion.api.accessors import Body
from tfusion.api.jsontypes import JsonMapping
from tfusion.apiserver.netpolicy import budget_status, selects
from tfusion.kube import resources as r
from tfusion.kube.client import NotFound
from tfusion.kube.informer import Informer
from tfusion.kube.manager import Manager
from tfusion.kube.reconciler import Result
from tfusion.kube.resources import ApiResource

PDBS = ApiResource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True)


class DisruptionController:
    """Registers itself with `manager`: budgets drive it, pod changes requeue the budgets selecting them."""

    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        self.budgets: Informer = manager.cache.informer(PDBS)
        self.pods: Informer = manager.cache.informer(r.PODS)
        manager.controller("disruption").for_(PDBS).watches(r.PODS, self._budgets_of).complete(self.reconcile)

    def _budgets_of(self, pod: JsonMapping) -> Iterator[str]:
        raw = dict(pod)
        namespace = Body(pod).namespace
        for budget in self.budgets.list():
            if Body(budget).namespace == namespace and selects(budget, raw):
                yield f"{namespace}/{Body(budget).name}"

    async def reconcile(self, key: str) -> Result | None:
        raw = self.budgets.get(key)
        if raw is None:
            return None
        budget = Body(raw)
        pods: list[dict[str, Any]] = [p for p in self.pods.list()
                                      if Body(p).namespace == budget.namespace and selects(raw, p)]
        status = budget_status(raw, pods)
        current = dict(budget.status)
        if {**current, **status} == current:
            return None
        try:
            await self.manager.client.patch(PDBS, budget.name, {"status": status}, namespace=budget.namespace,
                                            subresource="status")
        except NotFound:
            pass  # deleted meanwhile
        return None
