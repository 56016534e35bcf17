"""Karpenter mode: tfusion decides which node a pool needs, Karpenter launches it.

Each GPUNodeClaim becomes one karpenter.sh/v1 NodeClaim of the same name that pins the instance type,
the capacity type and (when the claim names one) the zone, and asks for the type's GPUs. Karpenter
launches the instance with the node class the pool names (`karpenterNodeClassRef`) and copies the
NodeClaim's labels to the Node, so the Node carries `tensor-fusion.ai/node-provisioner=<claim>` like a
node of any other provider. Deleting the NodeClaim is how the instance goes: Karpenter drains the
Node and terminates it.

The NodeClaims carry no `karpenter.sh/nodepool` label: no NodePool's limits or disruption rules
apply to them; tfusion's compaction decides when they go.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, items, text
from tfusion.api.jsontypes import JsonObject
from tfusion.api.kinds.common import GroupKindName
from tfusion.api.timestamps import parse_rfc3339
from tfusion.controller.provisioning.catalog import ON_DEMAND, SPOT, Catalog
from tfusion.controller.provisioning.providers.base import Instance, LaunchRequest, ProviderError, managed_by
from tfusion.kube.client import AlreadyExists, BadRequest, Forbidden, Invalid, KubeClient, KubeError, NotFound
from tfusion.kube.resources import KARPENTER_NODECLAIMS

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
ZONE_LABEL = "topology.kubernetes.io/zone"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
GPU_RESOURCE = "nvidia.com/gpu"
#: the node class a claim's bare `node_class_name` means when the pool names no karpenterNodeClassRef
DEFAULT_NODE_CLASS_GROUP, DEFAULT_NODE_CLASS_KIND = "karpenter.k8s.aws", "EC2NodeClass"
#: GPUNodeClaim capacity types <-> Karpenter's values of karpenter.sh/capacity-type
KARPENTER_CAPACITY = {ON_DEMAND: "on-demand", SPOT: "spot"}
_CAPACITY_OF = {v: k for k, v in KARPENTER_CAPACITY.items()}


class KarpenterProvider:
    """`CloudProvider` over Karpenter: create, delete and list NodeClaims through the API server."""

    name = "karpenter"

    def __init__(self, client: KubeClient, catalog: Catalog, *, node_class_ref: GroupKindName | None) -> None:
        self._client = client
        self._catalog = catalog
        self._node_class_ref = node_class_ref

    def catalog(self) -> Catalog:
        return self._catalog

    async def create(self, request: LaunchRequest) -> Instance:
        existing = await self._get(request.claim)
        if existing is None:
            body = nodeclaim_for(request, self._node_class_ref)
            try:
                existing = await self._client.create(KARPENTER_NODECLAIMS, body)
            except AlreadyExists:  # created meanwhile (a retry of ours, or someone else's object)
                existing = await self._get(request.claim)
            except KubeError as exc:
                raise _provider_error("create", exc) from exc
            if existing is None:
                raise ProviderError(f"NodeClaim {request.claim} was created and is gone already")
        if Body(existing).meta.label(tfa.NODE_PROVISIONER) != request.claim:
            raise ProviderError(f"NodeClaim {request.claim} exists but is not tfusion's: its label "
                                f"{tfa.NODE_PROVISIONER} is not {request.claim!r}; rename or delete it",
                                retryable=False)
        return nodeclaim_instance(existing)

    async def terminate(self, instance_id: str) -> None:
        existing = await self._get(instance_id)
        if existing is None:
            return
        body = Body(existing)
        if not body.meta.label(tfa.NODE_PROVISIONER):
            raise ProviderError(f"NodeClaim {instance_id} has no label {tfa.NODE_PROVISIONER}: tfusion did not "
                                "create it and does not delete it", retryable=False)
        try:  # the uid: a NodeClaim made again under the name since the read is not this one
            await self._client.delete(KARPENTER_NODECLAIMS, instance_id, preconditions={"uid": body.uid})
        except NotFound:
            pass
        except KubeError as exc:
            raise _provider_error("delete", exc) from exc

    async def list_instances(self) -> list[Instance]:
        try:
            listed = await self._client.list(KARPENTER_NODECLAIMS, label_selector=tfa.NODE_PROVISIONER)
        except KubeError as exc:
            raise _provider_error("list", exc) from exc
        return [nodeclaim_instance(obj) for obj in listed.items]

    async def _get(self, name: str) -> dict[str, Any] | None:
        try:
            return await self._client.get(KARPENTER_NODECLAIMS, name)
        except NotFound as exc:
            if _resource_missing(exc):
                raise _provider_error("get", exc) from exc
            return None
        except KubeError as exc:
            raise _provider_error("get", exc) from exc


def nodeclaim_for(request: LaunchRequest, node_class_ref: GroupKindName | None) -> JsonObject:
    """The NodeClaim that launches `request`'s instance (named after the claim)."""
    capacity = KARPENTER_CAPACITY.get(request.capacity_type)
    if capacity is None:
        raise ProviderError(f"capacityType {request.capacity_type!r} is not allowed for Karpenter; expected "
                            f"{' or '.join(KARPENTER_CAPACITY)}", retryable=False)
    labels: JsonObject = {**request.labels, tfa.NODE_PROVISIONER: request.claim, tfa.MANAGED_BY: managed_by(request)}
    requirements: list[Any] = [
        {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": [request.instance_type.name]},
        {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": [capacity]},
    ]
    if request.zone:
        requirements.append({"key": ZONE_LABEL, "operator": "In", "values": [request.zone]})
    return {
        "apiVersion": KARPENTER_NODECLAIMS.api_version, "kind": KARPENTER_NODECLAIMS.kind,
        "metadata": {"name": request.claim, "labels": labels},
        "spec": {
            "nodeClassRef": _node_class_ref(request, node_class_ref),
            "requirements": requirements,
            "resources": {"requests": {GPU_RESOURCE: str(request.instance_type.gpu_count)}},
            # Karpenter's CRD defaults it to 720h and then replaces the node; when a node goes is
            # tfusion's decision (compaction), so never
            "expireAfter": "Never",
        },
    }


def _node_class_ref(request: LaunchRequest, ref: GroupKindName | None) -> JsonObject:
    if ref is not None:
        return {"group": ref.group, "kind": ref.kind, "name": ref.name}
    if request.node_class_name:
        return {"group": DEFAULT_NODE_CLASS_GROUP, "kind": DEFAULT_NODE_CLASS_KIND, "name": request.node_class_name}
    raise ProviderError(f"GPUNodeClaim {request.claim}: Karpenter needs a node class: set the pool's "
                        "nodeManagerConfig.nodeProvisioner.karpenterNodeClassRef (or nodeClass, taken as an "
                        f"{DEFAULT_NODE_CLASS_KIND} of {DEFAULT_NODE_CLASS_GROUP})", retryable=False)


def nodeclaim_instance(obj: Mapping[str, Any]) -> Instance:
    """What a NodeClaim says about its instance. Karpenter fills the labels and status as the instance
    launches (providerID) and its Node registers (nodeName); before that the requirements tell."""
    body = Body(obj)
    labels = body.meta.labels
    wanted = {r.get("key"): (r.get("values") or [""])[0] for r in items(obj, "spec", "requirements")
              if r.get("operator") == "In"}
    node_name = text(obj, "status", "nodeName")
    state = "terminating" if body.meta.deleting else "running" if node_name else "pending"
    capacity = labels.get(CAPACITY_TYPE_LABEL) or wanted.get(CAPACITY_TYPE_LABEL, "")
    created = body.meta.creation_timestamp
    return Instance(
        instance_id=body.name, claim=labels.get(tfa.NODE_PROVISIONER, ""),
        instance_type=labels.get(INSTANCE_TYPE_LABEL) or wanted.get(INSTANCE_TYPE_LABEL, ""),
        node_name=node_name, state=state, capacity_type=_CAPACITY_OF.get(capacity, capacity),
        zone=labels.get(ZONE_LABEL) or _zone_of(text(obj, "status", "providerID")) or wanted.get(ZONE_LABEL, ""),
        launched_at=parse_rfc3339(created).timestamp() if created else 0.0,
    )


def _zone_of(provider_id: str) -> str:
    """The zone in an AWS-style provider ID ("aws:///us-east-1a/i-0abc"); "" for other shapes."""
    parts = provider_id.split("://", 1)[-1].strip("/").split("/")
    return parts[0] if len(parts) == 2 else ""


def _resource_missing(exc: NotFound) -> bool:
    """A 404 about the resource (Karpenter's CRD is not installed) rather than about one object."""
    return not (exc.status.get("details") or {}).get("name")


def _provider_error(verb: str, exc: KubeError) -> ProviderError:
    if isinstance(exc, NotFound) and _resource_missing(exc):
        return ProviderError(f"{verb} NodeClaim: {KARPENTER_NODECLAIMS.name} is not served by the API server; "
                             f"is Karpenter (v1) installed? ({exc.message})")
    if isinstance(exc, Forbidden):
        return ProviderError(f"{verb} NodeClaim: forbidden; the controller's role needs {verb} on "
                             f"{KARPENTER_NODECLAIMS.name} ({exc.message})")
    return ProviderError(f"{verb} NodeClaim: {exc}", retryable=not isinstance(exc, Invalid | BadRequest))
