"""GPUPool reconciler: the Nodes a pool selects are labelled, and the pool's status sums up its GPUNodes.

- Node labels: every Node whose GPUNode is in this pool carries
  `tensor-fusion.ai/node-selector-hash=<hash of the pool's selectors>` and
  `tensor-fusion.ai/hardware-vendor=<vendor>`.
- Status, from the GPUNodes labelled `managed-by=<pool>`: totalNodes, readyNodes (Running),
  notReadyNodes, totalGPUs, total / available / virtual / virtual-available TFLOPS and VRAM (the
  sums of the GPUNodes' statuses, which the GPUNode reconciler rolls up from the allocator, virtual
  capacity after the pool's oversubscription), runningAppsCnt (workloads with workers on the
  pool's GPUs), cluster (the owning TensorFusionCluster); phase Running when every node is Running
  (a pool without nodes is Running too: nothing in it waits), else Updating; condition Ready.
- Component fields tfusion does not honour (controller/component_fields.py): condition
  ComponentConfigHonoured False naming each one set, and a Warning Event per field when it appears.
- Provisioned and Karpenter pools: `provisioning/pools.py` closes the gap to minResources and
  warmResources with GPUNodeClaims on each pass and decides `provisioningPhase`; such a pool with a
  minimum is not Running while it has no node.
- Finalizer: while deleted, phase Destroying, its GPUNodes and GPUNodeClaims are deleted (each
  claim's finalizer terminates its instance), and the finalizer goes once none is left.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, GpuPool, Node, items, section
from tfusion.api.jsontypes import JsonObject, json_object
from tfusion.controller.component_fields import unhonoured_fields
from tfusion.controller.defaults import pool_vendor
from tfusion.controller.reconcilers.common import (
    DESTROYING,
    FINALIZER,
    RUNNING,
    UPDATING,
    Condition,
    condition,
    controller_name,
    merge_conditions,
    sum_capacity,
    write_status,
)
from tfusion.controller.reconcilers.nodeselector import pool_selects, selector_hash
from tfusion.kube import resources as r
from tfusion.kube.client import NotFound
from tfusion.kube.reconciler import Result, ensure_finalizer, spec_changed

if TYPE_CHECKING:
    from tfusion.controller.runtime import ControllerRuntime

log = logging.getLogger(__name__)
#: the condition naming the component fields a pool sets that tfusion does not honour (component_fields.py)
COMPONENTS_HONOURED = "ComponentConfigHonoured"


class PoolReconciler:
    """See the module docstring."""

    def __init__(self, runtime: ControllerRuntime) -> None:
        self.runtime = runtime
        self.pools = runtime.informer(r.GPUPOOLS)
        self.nodes = runtime.informer(r.NODES)
        self.gpunodes = runtime.informer(r.GPUNODES)
        self.gpus = runtime.informer(r.GPUS)
        self._by_pool = self.gpunodes.add_label_index(tfa.MANAGED_BY)
        self._gpus_by_pool = self.gpus.add_label_index(tfa.GPU_POOL)
        self.controller = runtime.manager.controller("gpupool").for_(r.GPUPOOLS) \
            .watches(r.GPUNODES, lambda gpunode: self._pool_of_gpunode(Body(gpunode))) \
            .watches(r.NODES, lambda node: self._pools_selecting(Node(node)), predicates=[spec_changed]) \
            .watches(r.GPUNODECLAIMS, lambda claim: self._pool_of_gpunode(Body(claim))) \
            .complete(self)
        self.claims = runtime.informer(r.GPUNODECLAIMS)
        self._claims_by_pool = self.claims.add_label_index(tfa.MANAGED_BY)
        #: provisioning/pools.PoolProvisioner, set by the provisioning wiring (None: pools are never provisioned)
        self.provisioner: Any = None

    @staticmethod
    def _pool_of_gpunode(gpunode: Body) -> list[str]:
        pool = gpunode.meta.label(tfa.MANAGED_BY)
        return [pool] if pool else []

    def _pools_selecting(self, node: Node) -> list[str]:
        return [pool.name for pool in map(GpuPool, self.pools.list()) if pool_selects(pool, node)]

    def members(self, pool: str) -> list[Body]:
        return [Body(n) for n in self.gpunodes.by_index(self._by_pool, pool)]

    async def reconcile(self, name: str) -> Result | None:
        pool = self.pools.get(name)
        if pool is None:
            return None
        current = await ensure_finalizer(self.runtime.client, r.GPUPOOLS, GpuPool(pool), FINALIZER, self._cleanup)
        if current is None:
            busy = self.members(name) or self.claims.by_index(self._claims_by_pool, name)
            return None if not busy else Result(requeue_after=1.0)
        await self._label_nodes(current)
        provisioning = await self.provisioner.reconcile(current, self.members(name)) \
            if self.provisioner is not None else None
        await self._write_status(current, provisioning.phase if provisioning is not None else None)
        return Result(requeue_after=provisioning.requeue_after) \
            if provisioning is not None and provisioning.requeue_after else None

    async def _cleanup(self, pool: GpuPool) -> bool:
        members = self.members(pool.name)
        claims = [Body(c) for c in self.claims.by_index(self._claims_by_pool, pool.name)]
        await write_status(self.runtime.client, r.GPUPOOLS, pool, {"phase": DESTROYING})
        for resource, owned in ((r.GPUNODES, members), (r.GPUNODECLAIMS, claims)):
            for obj in owned:
                if not obj.meta.deleting:
                    try:
                        await self.runtime.client.delete(resource, obj.name)
                    except NotFound:
                        pass
        return not members and not claims

    async def _label_nodes(self, pool: GpuPool) -> None:
        wanted = {tfa.NODE_SELECTOR_HASH: selector_hash(pool)}
        for gpunode in self.members(pool.name):
            found = self.nodes.get(gpunode.name)
            if found is None:
                continue
            node = Node(found)
            labels = node.meta.labels
            changes = {**wanted, tfa.HARDWARE_VENDOR: labels.get(tfa.HARDWARE_VENDOR) or pool_vendor(pool)}
            changes = {k: v for k, v in changes.items() if labels.get(k) != v}
            if changes:
                try:
                    await self.runtime.client.patch(r.NODES, node.name, {"metadata": {"labels": changes}})
                except NotFound:
                    continue

    def _component_fields(self, pool: GpuPool) -> list[Condition]:
        """ComponentConfigHonoured, False naming each field set that tfusion does not honour, with one
        Warning Event per field when it first appears (a pool that never set one gets no condition)."""
        fields = unhonoured_fields(pool)
        old = pool.condition(COMPONENTS_HONOURED)
        if not fields:
            return [] if old is None else [condition(
                pool.conditions, COMPONENTS_HONOURED, True, "AllFieldsHonoured",
                "every component field this pool sets is honoured", generation=pool.meta.generation)]
        said = str(old.get("message") or "") if old is not None and old.get("status") == "False" else ""
        for field in fields:
            if f"{field.name} " not in said:
                self.runtime.events.warning(pool, "ComponentConfigIgnored",
                                            f"{field.name} is set but tfusion does not honour it: {field.why}")
        message = "; ".join(f"{field.name} is not honoured ({field.why})" for field in fields)
        return [condition(pool.conditions, COMPONENTS_HONOURED, False, "FieldsNotHonoured", message,
                          generation=pool.meta.generation)]

    def _running_apps(self, pool: str) -> int:
        apps = {(app.get("namespace"), app.get("name"))
                for gpu in self.gpus.by_index(self._gpus_by_pool, pool)
                for app in items(gpu, "status", "runningApps") if isinstance(app, Mapping)}
        return len(apps)

    async def _write_status(self, pool: GpuPool, provisioning_phase: str | None) -> None:
        old = pool.status
        statuses = [n.status for n in self.members(pool.name)]
        ready = sum(1 for s in statuses if s.get("phase") == RUNNING)
        phase = RUNNING if ready == len(statuses) else UPDATING
        if provisioning_phase is not None and not statuses and section(pool.capacity_config, "minResources"):
            phase = UPDATING  # a provisioned pool with a minimum and no node yet waits for its nodes
        message = f"{ready} of {len(statuses)} GPUNode(s) Running"
        wanted: JsonObject = {
            "phase": phase, "totalNodes": len(statuses), "readyNodes": ready, "notReadyNodes": len(statuses) - ready,
            "totalGPUs": sum(int(s.get("totalGPUs") or 0) for s in statuses),
            "runningAppsCnt": self._running_apps(pool.name),
            "cluster": controller_name(pool, "TensorFusionCluster"),
            "componentStatus": json_object(section(old, "componentStatus")),
            "conditions": merge_conditions(pool.conditions, [condition(
                pool.conditions, "Ready", phase == RUNNING, "AllNodesRunning" if phase == RUNNING
                else "NodesNotRunning", message, generation=pool.meta.generation),
                *self._component_fields(pool)]),
            **sum_capacity(statuses),
        }
        if provisioning_phase is not None:
            wanted["provisioningPhase"] = provisioning_phase
        if await write_status(self.runtime.client, r.GPUPOOLS, pool, wanted) and phase != old.get("phase"):
            log.info("GPUPool %s is %s (%s)", pool.name, phase, message)
