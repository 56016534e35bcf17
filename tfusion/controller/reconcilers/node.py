"""Node reconciler (AutoSelect): a Node that a GPUPool selects has a GPUNode; one no pool selects has none.

A Node without a GPUNode gets one from the first pool by name whose selector matches
(`nodeselector.select_pool`), named like the Node: labels `managed-by=<pool>`,
`pool-<pool>=true`, `hardware-vendor=<vendor>` and `gpupool=<pool>`, the pool as controlling
owner, `spec.manageMode: AutoSelect`, `status.phase: Pending` (the GPUNode reconciler takes it
from there). Membership is stable: a GPUNode stays in its pool while that pool selects the Node,
even when a pool that sorts first appears later. A Node that is deleted, or that its pool no
longer selects, takes its GPUNode with it (and, if another pool selects it, gets a new one there).
With `INITIAL_GPU_NODE_LABEL_SELECTOR` set, only Nodes it matches are GPU nodes: one it does not
match is treated as a Node no pool selects, whatever the pools' selectors say (it keeps clusters
whose pools select broadly off CPU nodes). Unschedulable (cordoned) Nodes are skipped: what they
have is left as it is. Only GPUNodes this
reconciler keeps (AutoSelect, controlled by a pool) are ever deleted or replaced: one of another
manageMode (Manual, Provisioned), or made by hand without a controlling pool, is left alone.

Provisioned nodes: a Node labelled `tensor-fusion.ai/node-provisioner=<claim>` came from a
GPUNodeClaim (provisioning/claims.py). Its GPUNode is made from the claim, whatever the pools'
selectors say: the claim's pool, `spec.manageMode: Provisioned`, the node-provisioner label and
`spec.costPerHour` from the claim's hourly price. The Node gets the claim as an owner (not its
controller), so it goes with the claim. A Node that names a claim that does not exist is
labelled `tensor-fusion.ai/orphan=true` (and loses the label once its claim is there). A
provisioned GPUNode goes with its Node, like an AutoSelect one.

In progressive-migration mode (`NVIDIA_OPERATOR_PROGRESSIVE_MIGRATION=true`) the reconciler also
watches worker pods and keeps the taint `tensor-fusion.ai/used-by=tensor-fusion:PreferNoSchedule`
on every Node that runs TensorFusion workers, and off every Node that runs none (idle), cordoned
or not; its other taints are left as they are (scheduling/progressive.py says why).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, GpuNode, GpuPool, Node, section
from tfusion.api.jsontypes import JsonObject, json_object
from tfusion.api.selectors import parse_label_selector
from tfusion.controller.provisioning.claims import hourly_price
from tfusion.controller.reconcilers.common import PENDING, controller_name
from tfusion.controller.reconcilers.nodeselector import node_vendor, pool_selects, select_pool
from tfusion.controller.runtime import component_selector
from tfusion.controller.scheduling import progressive
from tfusion.kube import resources as r
from tfusion.kube.client import AlreadyExists, NotFound
from tfusion.kube.ownership import controller_reference, owner_reference
from tfusion.kube.reconciler import Predicate, Result, spec_changed

if TYPE_CHECKING:
    from tfusion.controller.runtime import ControllerRuntime

log = logging.getLogger(__name__)

AUTO_SELECT, PROVISIONED = "AutoSelect", "Provisioned"


def gpunode_for(node: Node, pool: GpuPool) -> JsonObject:
    """The GPUNode an AutoSelect pool keeps for a Node."""
    pool_name, vendor = pool.name, node_vendor(node, pool)
    return {
        "apiVersion": r.GPUNODES.api_version, "kind": "GPUNode",
        "metadata": {"name": node.name, "labels": {
            tfa.MANAGED_BY: pool_name, f"{tfa.POOL_LABEL_PREFIX}{pool_name}": "true",
            tfa.HARDWARE_VENDOR: vendor, tfa.GPU_POOL: pool_name},
            "ownerReferences": [json_object(controller_reference(pool, r.GPUPOOLS))]},
        "spec": {"manageMode": AUTO_SELECT},
    }


def provisioned_gpunode_for(node: Node, pool: GpuPool, claim: Body) -> JsonObject:
    """The GPUNode of a Node that a GPUNodeClaim of `pool` brought."""
    labels = {**section(gpunode_for(node, pool), "metadata", "labels"), tfa.NODE_PROVISIONER: claim.name}
    return {**gpunode_for(node, pool), "spec": {"manageMode": PROVISIONED, "costPerHour": f"${hourly_price(claim):g}"},
            "metadata": {**section(gpunode_for(node, pool), "metadata"), "labels": json_object(labels)}}


def _metadata_changed(old: Body, new: Body) -> bool:
    before, after = old.meta, new.meta
    return before.labels != after.labels or before.deletion_timestamp != after.deletion_timestamp


def _spec_or_deletion_changed(old: Body, new: Body) -> bool:
    """A pool's selectors are in its spec; its status changes (often) select no other node."""
    before, after = old.meta, new.meta
    return before.generation != after.generation or before.deletion_timestamp != after.deletion_timestamp


def _worker_placement_changed(old: Body, new: Body) -> bool:
    return progressive.worker_node_index(old.raw) != progressive.worker_node_index(new.raw)


def _viewed(changed: Callable[[Body, Body], bool]) -> Predicate:
    """A watch predicate (given the raw old and new objects) that reads them through the view."""
    return lambda old, new: changed(Body(old), Body(new))


def _auto_selected(gpunode: GpuNode) -> bool:
    """A GPUNode this reconciler keeps: AutoSelect and controlled by a pool (one made by hand is not)."""
    return (gpunode.manage_mode or AUTO_SELECT) == AUTO_SELECT and bool(controller_name(gpunode, "GPUPool"))


def _kept(gpunode: GpuNode) -> bool:
    """A GPUNode this reconciler made: AutoSelect or Provisioned, controlled by a pool."""
    return gpunode.manage_mode in ("", AUTO_SELECT, PROVISIONED) and bool(controller_name(gpunode, "GPUPool"))


class NodeReconciler:
    """See the module docstring. Key: the Node's (and GPUNode's) name."""

    def __init__(self, runtime: ControllerRuntime) -> None:
        self.runtime = runtime
        self.nodes = runtime.informer(r.NODES)
        self.pools = runtime.informer(r.GPUPOOLS)
        self.gpunodes = runtime.informer(r.GPUNODES)
        self.claims = runtime.informer(r.GPUNODECLAIMS)
        self._nodes_by_claim = self.nodes.add_label_index(tfa.NODE_PROVISIONER)
        self.progressive = bool(runtime.settings.progressive_migration)
        self.gpu_node_selector = runtime.settings.initial_gpu_node_label_selector
        self.gpu_nodes = parse_label_selector(self.gpu_node_selector)
        builder = runtime.manager.controller("node").for_(r.NODES, predicates=[spec_changed]) \
            .watches(r.GPUNODES, lambda gpunode: [Body(gpunode).name], predicates=[_viewed(_metadata_changed)]) \
            .watches(r.GPUPOOLS, lambda _pool: self.nodes.keys(), predicates=[_viewed(_spec_or_deletion_changed)]) \
            .watches(r.GPUNODECLAIMS, lambda claim: [Body(n).name for n in self.nodes.by_index(
                self._nodes_by_claim, Body(claim).name)])
        self.pods = runtime.informer(r.PODS)
        if self.progressive:
            self.pods.add_index(progressive.WORKER_NODE_INDEX, progressive.worker_node_index)
            builder = builder.watches(r.PODS, progressive.worker_node_index,
                                      predicates=[_viewed(_worker_placement_changed)],
                                      label_selector=component_selector(runtime.settings))
        self.controller = builder.complete(self)

    def _pool(self, name: str) -> GpuPool | None:
        found = self.pools.get(name)
        return GpuPool(found) if found is not None else None

    async def reconcile(self, name: str) -> Result | None:
        found, found_gpunode = self.nodes.get(name), self.gpunodes.get(name)
        gpunode = GpuNode(found_gpunode) if found_gpunode is not None else None
        if found is None or Node(found).meta.deleting:
            if gpunode is not None:
                await self._delete(gpunode, "its Node is gone")
            return None
        node = Node(found)
        if self.progressive:
            await self._keep_taint(node)
        if node.unschedulable:
            return None
        claim_name = node.meta.label(tfa.NODE_PROVISIONER)
        if claim_name:
            await self._provisioned(node, claim_name, gpunode)
            return None
        if gpunode is not None and not _auto_selected(gpunode):
            return None
        if not self.gpu_nodes.matches(node.meta.labels):
            if gpunode is not None:
                await self._delete(gpunode, f"its Node does not match INITIAL_GPU_NODE_LABEL_SELECTOR "
                                            f"{self.gpu_node_selector}")
            return None
        if gpunode is None:
            pool_name = select_pool(map(GpuPool, self.pools.list()), node)
            chosen = self._pool(pool_name) if pool_name is not None else None
            if chosen is not None:
                await self._create(node, chosen)
            return None
        pool = self._pool(gpunode.meta.label(tfa.MANAGED_BY) or "")
        if pool is None or not pool_selects(pool, node):
            await self._delete(gpunode, "its GPUPool no longer selects its Node")
            return None
        vendor = node_vendor(node, pool)
        if gpunode.meta.label(tfa.HARDWARE_VENDOR) != vendor:
            await self.runtime.client.patch(r.GPUNODES, name, {"metadata": {"labels": {tfa.HARDWARE_VENDOR: vendor}}})
        return None

    async def _keep_taint(self, node: Node) -> None:
        """Progressive mode: the used-by taint while the node runs workers, none while it is idle.
        The write carries the resourceVersion read, so a taint someone adds meanwhile is not lost
        (a Conflict requeues)."""
        busy = self.pods.count_by_index(progressive.WORKER_NODE_INDEX, node.name) > 0
        taints = progressive.taints_for(node, busy)
        if taints is None:
            return
        await self.runtime.client.patch(r.NODES, node.name, {
            "metadata": {"resourceVersion": node.meta.resource_version or None}, "spec": {"taints": taints}})
        log.info("%s taint %s on node %s", "added" if busy else "removed", progressive.used_by_taint(), node.name)

    async def _provisioned(self, node: Node, claim_name: str, gpunode: GpuNode | None) -> None:
        found = self.claims.get(claim_name)
        claim = Body(found) if found is not None else None
        orphan = claim is None or claim.meta.deleting
        if (node.meta.label(tfa.ORPHAN) == "true") != orphan:
            await self.runtime.client.patch(r.NODES, node.name, {"metadata": {"labels": {
                tfa.ORPHAN: "true" if orphan else None}}})
            if orphan:
                self.runtime.events.warning(node, "OrphanNode", f"this node names GPUNodeClaim {claim_name}, "
                                                                "which does not exist")
        if claim is None or orphan:
            return
        if not any(ref.get("uid") == claim.uid for ref in node.meta.owner_references):
            # the Node goes with its claim (after the claim's finalizer has terminated the instance)
            owners = [json_object(o) for o in (*node.meta.owner_references, owner_reference(claim, r.GPUNODECLAIMS))]
            await self.runtime.client.patch(r.NODES, node.name, {"metadata": {
                "resourceVersion": node.meta.resource_version or None, "ownerReferences": owners}})
        if gpunode is not None:
            return
        pool = self._pool(claim.meta.label(tfa.MANAGED_BY) or "")
        if pool is not None:
            await self._create(node, pool, provisioned_gpunode_for(node, pool, claim))

    async def _create(self, node: Node, pool: GpuPool, wanted: JsonObject | None = None) -> None:
        client = self.runtime.client
        try:
            created = await client.create(r.GPUNODES, wanted or gpunode_for(node, pool))
        except AlreadyExists:
            return  # the cache is behind; the GPUNode's event brings us back
        if not Body(created).phase:
            await client.patch(r.GPUNODES, node.name, {"status": {
                "phase": PENDING, "totalTFlops": "0", "totalVRAM": "0", "totalGPUs": 0, "managedGPUs": 0}},
                subresource="status")
        log.info("created GPUNode %s in GPUPool %s", node.name, pool.name)
        self.runtime.events.normal(node, "GPUNodeCreated", f"GPUPool {pool.name} selects this node")

    async def _delete(self, gpunode: GpuNode, why: str) -> None:
        if gpunode.meta.deleting or not _kept(gpunode):
            return
        try:
            await self.runtime.client.delete(r.GPUNODES, gpunode.name)
        except NotFound:
            return
        log.info("deleted GPUNode %s: %s", gpunode.name, why)
