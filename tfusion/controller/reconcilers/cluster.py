"""TensorFusionCluster reconciler: the cluster's GPUPools exist as its spec says, and its status
sums them up.

- Pools: `spec.gpuPools[i]` becomes the GPUPool `<cluster>-<name>`, labelled with the cluster's
  labels plus `tensor-fusion.ai/managed-by=<cluster>`, annotated `is-default-pool`, controlled by
  the cluster (ownerReference), spec = `specTemplate`. A pool that drifts from that is put back
  (labels and annotations are merged, so a label a user adds stays); a pool the cluster controls
  but no longer lists is deleted. `pools_of_cluster` is the one derivation (the embedded bootstrap
  uses it too for a fresh install).
- Status: phase Pending until its pools have reported, Running when every pool is Running, else
  Updating with `retryCount` counting the attempts and the next look after
  min(max(rand x 3 s x 2^n, 3 s), 60 s); totals, virtual and available capacity summed from the
  pools; readyGPUPools / notReadyGPUPools; conditions Ready and GPUPoolReady.
- Finalizer: while deleted, phase Destroying until every pool it controls is gone.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, GpuPool, section, sequence_of_maps, text
from tfusion.api.jsontypes import JsonObject, json_object
from tfusion.controller.reconcilers.common import (
    DESTROYING,
    FINALIZER,
    PENDING,
    RUNNING,
    UPDATING,
    condition,
    controlled_by,
    merge_conditions,
    sum_capacity,
    write_status,
)
from tfusion.kube import resources as r
from tfusion.kube.backoff import Backoff
from tfusion.kube.client import AlreadyExists, KubeError, NotFound
from tfusion.kube.ownership import controller_reference, with_controller
from tfusion.kube.reconciler import Result, ensure_finalizer, generation_changed

if TYPE_CHECKING:
    from tfusion.controller.runtime import ControllerRuntime

log = logging.getLogger(__name__)

RETRY_BASE_S = 3.0
RETRY_MAX_S = 60.0
#: jittered 0-200 % around 3 s doubling per retry, so clusters created together do not poll in step
RETRY_BACKOFF = Backoff(base=RETRY_BASE_S, cap=RETRY_MAX_S, jitter=1.0)


def pools_of_cluster(cluster: Body) -> list[JsonObject]:
    """The GPUPools a TensorFusionCluster asks for, named, labelled and owned as this reconciler keeps them."""
    owner = json_object(controller_reference(cluster, r.TENSORFUSIONCLUSTERS))
    labels: JsonObject = {**cluster.meta.labels, tfa.MANAGED_BY: cluster.name}
    pools: list[JsonObject] = []
    for entry in sequence_of_maps(cluster.spec.get("gpuPools")):
        pools.append({
            "apiVersion": r.GPUPOOLS.api_version, "kind": "GPUPool",
            "metadata": {
                "name": f"{cluster.name}-{entry['name']}",
                "labels": labels,
                "annotations": {tfa.IS_DEFAULT_POOL: "true" if entry.get("isDefault") else "false"},
                "ownerReferences": [owner],
            },
            "spec": json_object(section(entry, "specTemplate")),
        })
    return pools


def retry_delay(retries: int) -> float:
    """The next look at a cluster whose pools are not all Running yet."""
    return RETRY_BACKOFF.delay(max(1, retries))


def _needs_update(existing: GpuPool, desired: GpuPool) -> bool:
    have, want = existing.meta, desired.meta
    return (existing.raw.get("spec") != desired.raw.get("spec")
            or any(have.label(k) != v for k, v in want.labels.items())
            or any(have.annotation(k) != v for k, v in want.annotations.items())
            or not controlled_by(existing, text(want.controller_ref(), "uid")))


def _updated(existing: GpuPool, desired: GpuPool) -> JsonObject:
    have, want = existing.meta, desired.meta
    (owner,) = want.owner_references  # desired_pool's: the cluster, as controller
    return {**json_object(existing.raw), "spec": json_object(desired.spec), "metadata": {
        **json_object(have.raw), "labels": {**have.labels, **want.labels},
        "annotations": {**have.annotations, **want.annotations},
        "ownerReferences": [*with_controller(have.owner_references, owner)]}}


class ClusterReconciler:
    """See the module docstring."""

    def __init__(self, runtime: ControllerRuntime) -> None:
        self.runtime = runtime
        self.clusters = runtime.informer(r.TENSORFUSIONCLUSTERS)
        self.pools = runtime.informer(r.GPUPOOLS)
        self.controller = runtime.manager.controller("tensorfusioncluster") \
            .for_(r.TENSORFUSIONCLUSTERS, predicates=[generation_changed]).owns(r.GPUPOOLS).complete(self)

    def _owned_pools(self, cluster: Body) -> list[GpuPool]:
        return [pool for pool in map(GpuPool, self.pools.list()) if controlled_by(pool, cluster.uid)]

    async def reconcile(self, name: str) -> Result | None:
        cluster = self.clusters.get(name)
        if cluster is None:
            return None
        current = await ensure_finalizer(self.runtime.client, r.TENSORFUSIONCLUSTERS, Body(cluster), FINALIZER,
                                         self._cleanup)
        if current is None:
            return None if not self._owned_pools(Body(cluster)) else Result(requeue_after=1.0)
        await self._sync_pools(current)
        return await self._write_status(current)

    async def _cleanup(self, cluster: Body) -> bool:
        owned = self._owned_pools(cluster)
        await write_status(self.runtime.client, r.TENSORFUSIONCLUSTERS, cluster, {"phase": DESTROYING})
        for pool in owned:
            if not pool.meta.deleting:
                try:
                    await self.runtime.client.delete(r.GPUPOOLS, pool.name)
                except NotFound:
                    pass
        return not owned

    async def _sync_pools(self, cluster: Body) -> None:
        client, events = self.runtime.client, self.runtime.events
        desired = pools_of_cluster(cluster)
        for pool in map(GpuPool, desired):
            existing = self.pools.get(pool.name)
            try:
                if existing is None:
                    await client.create(r.GPUPOOLS, pool.raw)
                    events.normal(cluster, "GPUPoolCreated", f"created GPUPool {pool.name}")
                elif _needs_update(GpuPool(existing), pool):
                    await client.replace(r.GPUPOOLS, _updated(GpuPool(existing), pool))
            except AlreadyExists:
                continue  # the cache is behind; the pool's event brings us back
            except KubeError as exc:
                if exc.code == 409:
                    raise
                events.warning(cluster, "GPUPoolNotApplied", f"GPUPool {pool.name}: {exc}")
                raise
        wanted = {GpuPool(p).name for p in desired}
        for owned in self._owned_pools(cluster):
            if owned.name not in wanted and not owned.meta.deleting:
                try:
                    await client.delete(r.GPUPOOLS, owned.name)
                    events.normal(cluster, "GPUPoolDeleted", f"deleted GPUPool {owned.name}: no longer listed")
                except NotFound:
                    pass

    async def _write_status(self, cluster: Body) -> Result | None:
        old = cluster.status
        names = [GpuPool(p).name for p in pools_of_cluster(cluster)]
        pools = [GpuPool(p) for p in (self.pools.get(n) for n in names) if p is not None]
        statuses = [p.status for p in pools]
        ready = sorted(p.name for p in pools if p.phase == RUNNING)
        not_ready = sorted(set(names) - set(ready))
        retries = int(old.get("retryCount") or 0)
        if not not_ready:
            phase, retries = RUNNING, 0
        elif len(pools) < len(names) or not any(statuses):
            phase = PENDING
        else:
            phase, retries = UPDATING, retries + 1
        generation = cluster.meta.generation
        message = "every GPUPool is Running" if not not_ready else f"GPUPool(s) not Running yet: {', '.join(not_ready)}"
        conditions = merge_conditions(cluster.conditions, [
            condition(cluster.conditions, "Ready", not not_ready, "CheckPassed" if not not_ready else
                      "GPUPoolsNotReady", message, generation=generation),
            condition(cluster.conditions, "GPUPoolReady", not not_ready, "AllPoolsRunning" if not not_ready
                      else "PoolsNotRunning", message, generation=generation),
        ])
        totals = sum_capacity(statuses)
        wanted: JsonObject = {
            "phase": phase, "totalPools": len(names), "readyGPUPools": [*ready], "notReadyGPUPools": [*not_ready],
            "totalNodes": sum(int(s.get("totalNodes") or 0) for s in statuses),
            "totalGPUs": sum(int(s.get("totalGPUs") or 0) for s in statuses),
            "retryCount": retries, "conditions": conditions, **totals,
        }
        if await write_status(self.runtime.client, r.TENSORFUSIONCLUSTERS, cluster, wanted) and \
                phase != old.get("phase"):
            log.info("TensorFusionCluster %s is %s (%d pool(s), %d ready)", cluster.name, phase,
                     len(names), len(ready))
        if phase == UPDATING:
            return Result(requeue_after=retry_delay(retries))
        return None
