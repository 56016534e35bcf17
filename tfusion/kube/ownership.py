"""Owner references: the one way tfusion makes an object the controller of another.

Why it exists: the workload controllers of `--role=all`, the reconcilers, the webhook and the
hypervisor's GPU reporter each wrote the same six-key `ownerReference` by hand. Garbage collection
and adoption read these keys (kube's GC follows `uid`, `blockOwnerDeletion` holds a foreground
delete), so they are written here once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypedDict

from tfusion.api.accessors import Body, text
from tfusion.api.jsontypes import JsonMapping, JsonObject, json_object
from tfusion.kube.resources import ApiResource


class OwnerReference(TypedDict):
    """A metav1.OwnerReference naming the controlling owner."""

    apiVersion: str
    kind: str
    name: str
    uid: str
    controller: bool
    blockOwnerDeletion: bool


def controller_reference(owner: Body, resource: ApiResource) -> OwnerReference:
    """An ownerReference that makes `owner` (an object of `resource`) the controller of its carrier."""
    return {"apiVersion": resource.api_version, "kind": resource.kind, "name": owner.name, "uid": owner.uid,
            "controller": True, "blockOwnerDeletion": True}


def owner_reference(owner: Body, resource: ApiResource) -> OwnerReference:
    """An ownerReference that makes `owner` an owner but not the controller (the carrier may have
    one already, such as a Node Karpenter's NodeClaim controls): garbage collection follows it."""
    return {"apiVersion": resource.api_version, "kind": resource.kind, "name": owner.name, "uid": owner.uid,
            "controller": False, "blockOwnerDeletion": False}


def with_controller(refs: Iterable[JsonMapping], controller: JsonMapping) -> list[JsonObject]:
    """`refs` with `controller` as their one controller: the owners that are not controllers kept,
    another controller (and any other reference to the same object) replaced (adoption)."""
    uid = controller.get("uid")
    kept = [json_object(ref) for ref in refs if not ref.get("controller") and ref.get("uid") != uid]
    return [*kept, json_object(controller)]


def controller_reference_to(ref: JsonMapping) -> OwnerReference:
    """A controlling ownerReference to the object another reference `ref` names (adoption by proxy)."""
    return {"apiVersion": text(ref, "apiVersion"), "kind": text(ref, "kind"), "name": text(ref, "name"),
            "uid": text(ref, "uid"), "controller": True, "blockOwnerDeletion": True}
