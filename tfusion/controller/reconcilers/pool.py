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
- Finalizer: while deleted, phase Destroying, its GPUNodes are deleted, and the finalizer goes once
  none is left.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from tfusion.api import annotations as tfa
from tfusion.controller.reconcilers.common import (
    DESTROYING,
    FINALIZER,
    RUNNING,
    UPDATING,
    Obj,
    condition,
    controller_name,
    labels_of,
    merge_conditions,
    meta,
    name_of,
    status_of,
    sum_capacity,
    write_status,
)
from tfusion.controller.reconcilers.nodeselector import pool_selects, pool_vendor, selector_hash
from tfusion.kube import resources as r
from tfusion.kube.client import NotFound
from tfusion.kube.reconciler import Result, ensure_finalizer, spec_changed

if TYPE_CHECKING:
    from tfusion.controller.runtime import ControllerRuntime

log = logging.getLogger(__name__)


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
            .watches(r.GPUNODES, self._pool_of_gpunode) \
            .watches(r.NODES, self._pools_selecting, predicates=[spec_changed]) \
            .complete(self)

    @staticmethod
    def _pool_of_gpunode(gpunode: Obj) -> list[str]:
        pool = labels_of(gpunode).get(tfa.MANAGED_BY)
        return [pool] if pool else []

    def _pools_selecting(self, node: Obj) -> list[str]:
        return [name_of(p) for p in self.pools.list() if pool_selects(p, node)]

    def members(self, pool: str) -> list[Obj]:
        return self.gpunodes.by_index(self._by_pool, pool)

    async def reconcile(self, name: str) -> Result | None:
        pool = self.pools.get(name)
        if pool is None:
            return None
        current = await ensure_finalizer(self.runtime.client, r.GPUPOOLS, pool, FINALIZER, self._cleanup)
        if current is None:
            return None if not self.members(name) else Result(requeue_after=1.0)
        await self._label_nodes(current)
        await self._write_status(current)
        return None

    async def _cleanup(self, pool: Obj) -> bool:
        members = self.members(name_of(pool))
        await write_status(self.runtime.client, r.GPUPOOLS, pool, {"phase": DESTROYING})
        for gpunode in members:
            if not meta(gpunode).get("deletionTimestamp"):
                try:
                    await self.runtime.client.delete(r.GPUNODES, name_of(gpunode))
                except NotFound:
                    pass
        return not members

    async def _label_nodes(self, pool: Obj) -> None:
        wanted = {tfa.NODE_SELECTOR_HASH: selector_hash(pool)}
        for gpunode in self.members(name_of(pool)):
            node = self.nodes.get(name_of(gpunode))
            if node is None:
                continue
            labels = labels_of(node)
            changes = {**wanted, tfa.HARDWARE_VENDOR: labels.get(tfa.HARDWARE_VENDOR) or pool_vendor(pool)}
            changes = {k: v for k, v in changes.items() if labels.get(k) != v}
            if changes:
                try:
                    await self.runtime.client.patch(r.NODES, name_of(node), {"metadata": {"labels": changes}})
                except NotFound:
                    continue

    def _running_apps(self, pool: str) -> int:
        apps = {(app.get("namespace"), app.get("name"))
                for gpu in self.gpus.by_index(self._gpus_by_pool, pool)
                for app in status_of(gpu).get("runningApps") or []}
        return len(apps)

    async def _write_status(self, pool: Obj) -> None:
        name = name_of(pool)
        old = status_of(pool)
        statuses = [status_of(n) for n in self.members(name)]
        ready = sum(1 for s in statuses if s.get("phase") == RUNNING)
        phase = RUNNING if ready == len(statuses) else UPDATING
        message = f"{ready} of {len(statuses)} GPUNode(s) Running"
        wanted: dict[str, Any] = {
            "phase": phase, "totalNodes": len(statuses), "readyNodes": ready, "notReadyNodes": len(statuses) - ready,
            "totalGPUs": sum(int(s.get("totalGPUs") or 0) for s in statuses),
            "runningAppsCnt": self._running_apps(name),
            "cluster": controller_name(pool, "TensorFusionCluster"),
            "componentStatus": old.get("componentStatus") or {},
            "conditions": merge_conditions(old.get("conditions"), [condition(
                old.get("conditions"), "Ready", phase == RUNNING, "AllNodesRunning" if phase == RUNNING
                else "NodesNotRunning", message, generation=int(meta(pool).get("generation") or 0))]),
            **sum_capacity(statuses),
        }
        if await write_status(self.runtime.client, r.GPUPOOLS, pool, wanted) and phase != old.get("phase"):
            log.info("GPUPool %s is %s (%s)", name, phase, message)
