"""GPUNodeClaims: what a claim looks like (`new_claim`, the one place pool provisioning and the
expander build them) and the reconciler that turns one into a cloud instance and follows it until
its Node has joined.

Phases: Pending (no instance yet) -> Creating (`status.instanceID` recorded, event
ManagedNodeCreated) -> Bound (a Node labelled `tensor-fusion.ai/node-provisioner=<claim>` joined and
its GPUNode is Running, event NodeJoined). The finalizer terminates the claim's instance (and any
other instance the provider lists for the claim, such as one launched just before a crash and never
recorded) before the claim goes. Claims of AutoSelect pools are left alone, as the original does.
"""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING

import msgspec

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, GpuNodeClaim, GpuPool, section, text
from tfusion.api.jsontypes import JsonObject, json_object
from tfusion.api.kinds.provisioning import GPUNodeClassSpec
from tfusion.api.quantity import Quantity
from tfusion.api.types import decode_as
from tfusion.controller.provisioning.catalog import InstanceType
from tfusion.controller.provisioning.cloud import AUTO_SELECT, KARPENTER, Providers, ProviderUnavailable
from tfusion.controller.provisioning.providers.base import CloudProvider, LaunchRequest, ProviderError
from tfusion.controller.reconcilers.common import (
    FINALIZER,
    RUNNING,
    byte_count,
    milli_tflops,
    write_status,
)
from tfusion.kube import resources as r
from tfusion.kube.ownership import controller_reference
from tfusion.kube.reconciler import Result, ensure_finalizer
from tfusion.metrics.cost import PriceError, parse_price

if TYPE_CHECKING:
    from tfusion.controller.runtime import ControllerRuntime
    from tfusion.kube.informer import Informer

log = logging.getLogger(__name__)

PENDING, CREATING, BOUND = "Pending", "Creating", "Bound"
#: a provider error the same call may get past later is retried after this long (and backs off)
RETRY_S = 15.0


def claim_name(pool: str) -> str:
    return f"{pool}-{secrets.token_hex(4)}"


def new_claim(pool: GpuPool, instance_type: InstanceType, *, capacity_type: str, price: float, region: str = "",
              zone: str = "", expansion_source: str = "", name: str = "") -> JsonObject:
    """The GPUNodeClaim for one instance of `instance_type` in `pool` (owned by the pool)."""
    name = name or claim_name(pool.name)
    provisioner = section(pool.node_manager_config, "nodeProvisioner")
    node_class = text(provisioner, "nodeClass")
    labels: JsonObject = {tfa.MANAGED_BY: pool.name, f"{tfa.POOL_LABEL_PREFIX}{pool.name}": "true"}
    if node_class:
        labels[tfa.NODE_CLASS] = node_class
    if expansion_source:
        labels[tfa.EXPANSION_SOURCE] = expansion_source
    spec: JsonObject = {
        "tflopsOffered": str(Quantity.from_milli(instance_type.tflops)),
        "vramOffered": str(Quantity.from_int(instance_type.vram, "BinarySI")),
        "gpuDeviceOffered": instance_type.gpu_count, "nodeName": name, "instanceType": instance_type.name,
        "capacityType": capacity_type}
    if region:
        spec["region"] = region
    if zone:
        spec["zone"] = zone
    if node_class:
        spec["nodeClassRef"] = json_object({"group": r.GPUNODECLASSES.group, "kind": "GPUNodeClass",
                                            "version": "v1", "name": node_class})
    return {"apiVersion": r.GPUNODECLAIMS.api_version, "kind": "GPUNodeClaim",
            "metadata": {"name": name, "labels": labels, "annotations": json_object({tfa.HOURLY_PRICING: f"{price:g}"}),
                         "ownerReferences": [json_object(controller_reference(pool, r.GPUPOOLS))]},
            "spec": spec}


def hourly_price(claim: Body) -> float:
    """The claim's price in dollars per hour (its hourly-pricing annotation; 0 when unreadable)."""
    try:
        return parse_price(claim.meta.annotation(tfa.HOURLY_PRICING) or "0", field=tfa.HOURLY_PRICING)
    except PriceError:
        return 0.0


class ClaimReconciler:
    """See the module docstring. Key: the claim's name."""

    def __init__(self, runtime: ControllerRuntime, providers: Providers) -> None:
        self.runtime = runtime
        self.providers = providers
        self.claims = runtime.informer(r.GPUNODECLAIMS)
        self.pools = runtime.informer(r.GPUPOOLS)
        self.nodes = runtime.informer(r.NODES)
        self.gpunodes = runtime.informer(r.GPUNODES)
        self.classes = runtime.informer(r.GPUNODECLASSES)
        self._nodes_by_claim = self.nodes.add_label_index(tfa.NODE_PROVISIONER)
        #: claim UID -> the instance just launched for it, until the cache shows it in the status (a
        #: quick requeue must not launch again: providers are idempotent, but events would double)
        self._launched: dict[str, str] = {}
        self.controller = runtime.manager.controller("gpunodeclaim").for_(r.GPUNODECLAIMS) \
            .watches(r.NODES, lambda node: _claim_label(Body(node))) \
            .watches(r.GPUNODES, lambda gpunode: _claim_label(Body(gpunode))) \
            .complete(self)

    def _pool(self, claim: GpuNodeClaim) -> GpuPool | None:
        found = self.pools.get(claim.pool) if claim.pool else None
        return GpuPool(found) if found is not None else None

    async def reconcile(self, name: str) -> Result | None:
        found = self.claims.get(name)
        if found is None:
            return None
        claim = GpuNodeClaim(found)
        pool = self._pool(claim)
        if pool is not None and pool.provisioning_mode == AUTO_SELECT:
            return None
        current = await ensure_finalizer(self.runtime.client, r.GPUNODECLAIMS, claim, FINALIZER, self._terminate)
        if current is None:
            return Result(requeue_after=RETRY_S) if claim.meta.deleting else None
        if pool is None:
            self.runtime.events.warning(current, "PoolNotFound", f"GPUPool {claim.pool or '(none)'} does not exist: "
                                                                  "no instance is launched for this claim")
            return None
        if not current.instance_id:
            if current.uid in self._launched:
                return Result(requeue_after=1.0)  # launched; the cache has not seen the status yet
            return await self._launch(current, pool)
        self._launched.pop(current.uid, None)
        node = joined_node(self.nodes, self._nodes_by_claim, current)
        gpunode = self.gpunodes.get(node) if node else None
        if current.phase != BOUND and gpunode is not None and Body(gpunode).phase == RUNNING:
            await write_status(self.runtime.client, r.GPUNODECLAIMS, current, {"phase": BOUND})
            self.runtime.events.normal(current, "NodeJoined", f"node {node} joined and its GPUs are "
                                                              f"reported (instance {current.instance_id})")
        return None

    async def _provider(self, claim: GpuNodeClaim, pool: GpuPool | None) -> CloudProvider | None:
        if pool is None:
            return None
        try:
            return await self.providers.for_pool(pool)
        except ProviderUnavailable as exc:
            self.runtime.events.warning(claim, "ProviderUnavailable", str(exc))
            return None

    async def _launch(self, claim: GpuNodeClaim, pool: GpuPool) -> Result | None:
        provider = await self._provider(claim, pool)
        if provider is None:
            return Result(requeue_after=RETRY_S)
        try:
            request = self._request(claim, pool, provider)
            instance = await provider.create(request)
        except ProviderError as exc:
            self.runtime.events.warning(claim, "LaunchFailed", str(exc))
            log.warning("GPUNodeClaim %s: launch failed: %s", claim.name, exc)
            return Result(requeue_after=RETRY_S) if exc.retryable else None
        await write_status(self.runtime.client, r.GPUNODECLAIMS, claim,
                           {"phase": CREATING, "instanceID": instance.instance_id})
        self._launched[claim.uid] = instance.instance_id
        self.runtime.events.normal(claim, "ManagedNodeCreated",
                                   f"{provider.name} instance {instance.instance_id} ({request.instance_type.name}, "
                                   f"{request.capacity_type}) launched for node {request.node_name}")
        log.info("GPUNodeClaim %s: %s instance %s launched", claim.name, provider.name, instance.instance_id)
        return None

    def _request(self, claim: GpuNodeClaim, pool: GpuPool, provider: CloudProvider) -> LaunchRequest:
        instance_type = provider.catalog().get(claim.instance_type)
        if instance_type is None:
            raise ProviderError(f"spec.instanceType: {claim.instance_type!r} is not in the {provider.name} "
                                f"provider's catalog; known: {', '.join(provider.catalog().names())}",
                                retryable=False)
        provisioner = section(pool.node_manager_config, "nodeProvisioner")
        class_name = text(claim.spec, "nodeClassRef", "name")
        # in Karpenter mode the class is Karpenter's (an EC2NodeClass), not a GPUNodeClass of ours
        node_class = None if pool.provisioning_mode == KARPENTER else self._node_class(class_name)
        labels = {k: v for k, v in section(provisioner, "gpuNodeLabels").items() if isinstance(v, str)}
        labels[tfa.NODE_PROVISIONER] = claim.name
        return LaunchRequest(
            claim=claim.name, node_name=claim.node_name, instance_type=instance_type,
            capacity_type=claim.capacity_type or "OnDemand", region=text(claim.spec, "region"),
            zone=text(claim.spec, "zone"), node_class=node_class, node_class_name=class_name,
            labels=labels, tags={tfa.MANAGED_BY: pool.name, tfa.NODE_PROVISIONER: claim.name})

    def _node_class(self, name: str) -> GPUNodeClassSpec | None:
        found = self.classes.get(name) if name else None
        if name and found is None:
            raise ProviderError(f"spec.nodeClassRef: GPUNodeClass {name!r} does not exist", retryable=True)
        if found is None:
            return None
        from tfusion.api.kinds.provisioning import GPUNodeClass

        try:
            return decode_as(GPUNodeClass, found).spec
        except (msgspec.ValidationError, ValueError) as exc:
            raise ProviderError(f"GPUNodeClass {name}: {exc}", retryable=False) from None

    async def _terminate(self, claim: GpuNodeClaim) -> bool:
        """The finalizer's work: every instance of this claim terminated. False keeps the finalizer
        (the claim is requeued and tried again)."""
        provider = await self._provider(claim, self._pool(claim))
        if provider is None:
            return not claim.instance_id  # an instance we cannot reach must not be forgotten
        try:
            ids = {i.instance_id for i in await provider.list_instances() if i.claim == claim.name}
            if claim.instance_id:
                ids.add(claim.instance_id)
            for instance_id in sorted(ids):
                await provider.terminate(instance_id)
        except ProviderError as exc:
            self.runtime.events.warning(claim, "TerminateFailed", str(exc))
            return False
        if ids:
            self.runtime.events.normal(claim, "ManagedNodeTerminated",
                                       f"{provider.name} instance(s) {', '.join(sorted(ids))} terminated")
        return True


def joined_node(nodes: Informer, by_claim: str, claim: GpuNodeClaim) -> str:
    """The Node that joined for `claim` ("" before one has): the Node labelled with the claim (its
    name need not be the claim's: Karpenter names its Nodes itself). `by_claim`: the informer's
    label index on tfa.NODE_PROVISIONER."""
    found = nodes.by_index(by_claim, claim.name)
    return Body(found[0]).name if found else ""


def _claim_label(obj: Body) -> list[str]:
    claim = obj.meta.label(tfa.NODE_PROVISIONER)
    return [claim] if claim else []


def offered(claim: Body) -> tuple[int, int]:
    """(milli-TFLOPS, bytes) a claim brings."""
    return milli_tflops(claim.spec.get("tflopsOffered")), byte_count(claim.spec.get("vramOffered"))
