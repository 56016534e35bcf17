"""The GPUNode of the simulated node: an embedded stand-in for the controller's Node and GPUNode reconcilers.

STAND-IN, to be removed when those reconcilers land (reference/upstream-controller.md §6). Until
then nothing in the controller creates GPUNodes, and the hypervisor reports no GPU before its
node's GPUNode exists. For the one node of `--role=all` this module does the two parts of their
work a single machine needs, and nothing more:

- Node reconciler: the first GPUPool (by name) whose node selector (`multiVendorNodeSelector[vendor]`,
  else `nodeSelector`) selects the Node gets a GPUNode of the node's name, labelled
  `<domain>/managed-by=<pool>`, `<domain>/pool-<pool>=true`, `<domain>/hardware-vendor=<vendor>`
  and `<domain>/gpupool=<pool>` (the hypervisor reads the pool from that label when the GPUNode has
  no owner), with `spec.manageMode: AutoSelect` and no owner reference. An existing GPUNode is
  never changed; none is deleted.
- GPUNode reconciler: while the node's hypervisor answers /readyz with 200 and has reported its
  GPUs, the GPUNode and its GPUs in phase Pending become Running (schedulable); when it has not
  answered for NOT_READY_GRACE_S they go back to Pending (the grace keeps a restart of
  `--role=all`, where this starts before the hypervisor, from flapping them). GPUs in phase
  Unknown (unhealthy, missing) are left alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import anyio
import httpx

from tfusion.api import annotations as ann
from tfusion.embedded.nodeselector import node_selector_matches
from tfusion.kube import resources as r
from tfusion.kube.client import AlreadyExists, KubeClient, KubeError, NotFound

log = logging.getLogger(__name__)

#: how often the phases are checked: quickly while something is not settled, then slowly
FAST_S = 1.0
SLOW_S = 5.0
#: how long the hypervisor may be unready before its GPUs stop being schedulable
NOT_READY_GRACE_S = 10.0
PENDING, RUNNING = "Pending", "Running"


def selector_for(pool: dict[str, Any], vendor: str) -> dict[str, Any] | None:
    config = (pool.get("spec") or {}).get("nodeManagerConfig") or {}
    by_vendor = config.get("multiVendorNodeSelector") or {}
    selector: dict[str, Any] | None = by_vendor.get(vendor) or config.get("nodeSelector")
    return selector


def select_pool(pools: list[dict[str, Any]], node: dict[str, Any], vendor: str) -> str | None:
    """The name of the first pool (by name) that selects the node; None when none does."""
    for pool in sorted(pools, key=lambda p: p["metadata"]["name"]):
        if pool["metadata"].get("deletionTimestamp"):
            continue
        if node_selector_matches(selector_for(pool, vendor), node):
            return str(pool["metadata"]["name"])
    return None


def gpunode_for(node_name: str, pool: str, vendor: str) -> dict[str, Any]:
    return {
        "apiVersion": "tensor-fusion.ai/v1", "kind": "GPUNode",
        "metadata": {"name": node_name, "labels": {
            ann.MANAGED_BY: pool, f"{ann.POOL_LABEL_PREFIX}{pool}": "true", ann.HARDWARE_VENDOR: vendor,
            ann.GPU_POOL: pool}},
        "spec": {"manageMode": "AutoSelect"},
    }


class GpuNodeStandIn:
    """Creates the node's GPUNode and keeps its phase (and its GPUs' phases) in step with the hypervisor."""

    def __init__(self, client: KubeClient, node_name: str, *, vendor: str, hypervisor_url: str | None) -> None:
        self.client = client
        self.node_name = node_name
        self.vendor = vendor
        self.hypervisor_url = hypervisor_url
        self.pool: str | None = None
        self._warned_no_pool = False
        self._unready_since: float | None = None

    async def ensure(self, node: dict[str, Any]) -> str | None:
        """Create the GPUNode when a pool selects the Node; returns its pool (None: not selected)."""
        try:
            existing = await self.client.get(r.GPUNODES, self.node_name)
        except NotFound:
            existing = None
        if existing is not None:
            self.pool = (existing["metadata"].get("labels") or {}).get(ann.MANAGED_BY) or None
            return self.pool
        if (node.get("spec") or {}).get("unschedulable"):
            return None
        pool = select_pool(list(await self.client.list(r.GPUPOOLS)), node, self.vendor)
        if pool is None:
            if not self._warned_no_pool:
                log.warning("no GPUPool selects node %s (labels %s): no GPUNode, so its GPUs are not reported",
                            self.node_name, (node.get("metadata") or {}).get("labels"))
                self._warned_no_pool = True
            return None
        try:
            await self.client.create(r.GPUNODES, gpunode_for(self.node_name, pool, self.vendor))
            log.info("created GPUNode %s in pool %s (embedded stand-in for the Node reconciler)",
                     self.node_name, pool)
        except AlreadyExists:
            pass
        self.pool = pool
        return pool

    async def run(self, current_node: Callable[[], dict[str, Any]]) -> None:
        """Until cancelled: create the GPUNode when a pool selects the node (as `current_node()`
        returns it now), and keep the phases."""
        while True:
            settled = False
            try:
                if self.pool is None:
                    await self.ensure(current_node())
                if self.pool is not None:
                    settled = await self.sync_phases()
            except KubeError as exc:
                log.warning("GPUNode %s: %s; retrying", self.node_name, exc)
            await anyio.sleep(SLOW_S if settled else FAST_S)

    async def hypervisor_ready(self) -> bool:
        if not self.hypervisor_url:
            return True  # no probe configured: its reports are the sign of life
        try:
            async with httpx.AsyncClient(timeout=2.0) as http:
                response = await http.get(f"{self.hypervisor_url}/readyz")
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def sync_phases(self) -> bool:
        """One pass; True when nothing is left to change."""
        try:
            gpunode = await self.client.get(r.GPUNODES, self.node_name)
        except NotFound:
            self.pool = None
            return False
        gpus = list(await self.client.list(r.GPUS, label_selector=f"{ann.MANAGED_BY}={self.node_name}"))
        reported = int((gpunode.get("status") or {}).get("totalGPUs") or 0) > 0 and bool(gpus)
        ready = reported and await self.hypervisor_ready()
        if ready:
            self._unready_since = None
        else:
            now = time.monotonic()
            self._unready_since = self._unready_since or now
            if now - self._unready_since < NOT_READY_GRACE_S:
                return False
        want, other = (RUNNING, PENDING) if ready else (PENDING, RUNNING)
        for gpu in gpus:
            if (gpu.get("status") or {}).get("phase") == other:
                await self._set_phase(r.GPUS, gpu["metadata"]["name"], want)
        status = gpunode.get("status") or {}
        if "totalGPUs" in status and status.get("phase") in (other, None, ""):  # reported by the hypervisor
            await self._set_phase(r.GPUNODES, self.node_name, want)
        return ready

    async def _set_phase(self, resource: r.Resource, name: str, phase: str) -> None:
        try:
            await self.client.patch(resource, name, {"status": {"phase": phase}}, subresource="status")
        except NotFound:
            return
        log.info("%s %s is now %s", resource.kind, name, phase)
