"""The volume binder of `--role=all`: every PersistentVolumeClaim is Bound at once on the simulated node.

Why it exists: StatefulSets with `volumeClaimTemplates` and charts that ship claims wait for their
claims to be Bound (`kubectl get pvc`, `kubectl wait --for=jsonpath='{.status.phase}'=Bound`). The
one-box cluster has no storage, PersistentVolumes or StorageClasses to provision from, and the
simulated node runs no containers that could write to a volume, so this controller plays kube's
volume controller with an unlimited provisioner: a Pending claim gets `status.phase: Bound`, its
access modes and a capacity equal to its storage request. No PersistentVolume is created, so
`spec.volumeName` stays empty. Leader-only, as in kube-controller-manager.
"""

from __future__ import annotations

from tfusion.api.accessors import Body, section
from tfusion.api.jsontypes import JsonObject, json_copy
from tfusion.kube.client import NotFound
from tfusion.kube.informer import Informer
from tfusion.kube.manager import Manager
from tfusion.kube.reconciler import Result
from tfusion.kube.resources import ApiResource

PVCS = ApiResource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True)


def bound_status(claim: Body) -> JsonObject:
    """What a claim's status says once bound: the modes and the capacity it asked for."""
    storage = section(claim.spec, "resources", "requests").get("storage")
    status: JsonObject = {"phase": "Bound", "accessModes": json_copy(claim.spec.get("accessModes") or [])}
    if storage is not None:
        status["capacity"] = {"storage": json_copy(storage)}
    return status


class VolumeBinder:
    """Registers itself with `manager`: each claim that is not Bound gets bound."""

    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        self.claims: Informer = manager.cache.informer(PVCS)
        manager.controller("volume-binder").for_(PVCS).complete(self.reconcile)

    async def reconcile(self, key: str) -> Result | None:
        raw = self.claims.get(key)
        if raw is None:
            return None
        claim = Body(raw)
        if claim.meta.deleting or claim.status.get("phase") == "Bound":
            return None
        try:
            await self.manager.client.patch(PVCS, claim.name, {"status": bound_status(claim)},
                                            namespace=claim.namespace, subresource="status")
        except NotFound:
            pass  # deleted meanwhile
        return None


__all__ = ["PVCS", "VolumeBinder", "bound_status"]
