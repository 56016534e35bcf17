"""The `gpu-status` reconciler: a GPU's status says what the allocator's ledger says.

Why it exists apart from the allocator service (allocation.py): the service feeds the allocator;
this loop writes the allocator's output back. Level-triggered, key = GPU name:

- applies the cached GPU to the allocator (`upsert_gpu`/`remove_gpu`; a capacity change moves
  available by the same delta; `status.available`, `runningApps` and `allocatedPartitions` are the
  allocator's output, read back only by leader recovery for the partitions' slots);
- writes `status.available`/`runningApps`/`allocatedPartitions` (and under the dynamic isolation policy
  `activeIsolationMode`/`dynamicIsolationConflict`) from the ledger when the object says otherwise (a merge
  patch of the status subresource on the cached object's resourceVersion; a 409 re-reads with a GET and
  retries), and stamps the GPUNode's `<domain>/last-sync` (at most every `LAST_SYNC_MIN_INTERVAL_S`).

Most events of a GPU are the echo of this loop's own status write, which changes nothing the
allocator reads: the GPU is fed again only when a digest of what it was fed from (`fed_digest`:
its labels, the annotation read, its status less the allocator's output) differs from the last one
fed to the same allocator, and the GPUNode is stamped only when the cache holds it (a patch of a
missing one would only answer 404).

A hand edit of `status.available` is an update event, so it is rewritten at once; an
`AllocatorError` (a GPU with allocations moved to another node) becomes a Warning event on the GPU
and a retry with backoff.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import orjson

from tfusion.allocator import AllocatorError, GpuAllocator
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Gpu, items
from tfusion.api.jsontypes import JsonMapping
from tfusion.api.merge import merge_patch_from
from tfusion.api.timestamps import rfc3339
from tfusion.controller import views
from tfusion.controller.reconcilers.holdings import knows_gpu
from tfusion.kube import resources as r
from tfusion.kube.client import Conflict, KubeError, NotFound
from tfusion.kube.reconciler import Result

if TYPE_CHECKING:
    from tfusion.controller.allocation import AllocatorService

log = logging.getLogger(__name__)

STATUS_WRITE_ATTEMPTS = 5
#: GPUs reconciled at once
STATUS_WORKERS = 4
#: the status fields the allocator writes (its output, never its input)
ALLOCATOR_OUTPUT = frozenset({"available", "runningApps", "allocatedPartitions", "activeIsolationMode",
                              "dynamicIsolationConflict"})
#: a GPUNode's last-sync annotation is refreshed at most this often
LAST_SYNC_MIN_INTERVAL_S = 5.0


class GpuStatusReconciler:
    """See the module docstring; `controller` is the Manager's `gpu-status` controller."""

    def __init__(self, service: AllocatorService) -> None:
        self.service = service
        self.runtime = service.runtime
        self._last_sync: dict[str, float] = {}  # GPUNode -> when its last-sync was written (clock)
        self._fed: dict[str, bytes] = {}  # GPU -> fed_digest of what the allocator was last fed
        self._fed_to: GpuAllocator | None = None  # the allocator `_fed` speaks of
        # a write is a GET and a PUT (and now and then a GPUNode patch), each waiting on the API
        # server: one worker wrote about 200 GPUs/s, so a new leader of 20,000 GPUs whose statuses
        # changed meanwhile took minutes; GPUs are independent keys
        self.controller = self.runtime.manager.controller("gpu-status").for_(r.GPUS).with_workers(STATUS_WORKERS) \
            .complete(self.reconcile)

    async def reconcile(self, name: str) -> Result | None:
        """Level-triggered: the allocator knows the cached GPU, and the GPU's status says what the
        ledger says."""
        service = self.service
        allocator = await service.wait_ready()
        if allocator is None:
            return None
        cached = self.runtime.informer(r.GPUS).get(name)
        if allocator is not self._fed_to:  # a new leadership term: a new allocator, fed from scratch
            self._fed, self._fed_to = {}, allocator
        if cached is None:
            self._fed.pop(name, None)
            allocator.remove_gpu(name)
            return None
        gpu = Gpu(cached)
        digest = fed_digest(cached)
        if self._fed.get(name) != digest:
            self._fed.pop(name, None)
            try:
                service.apply_gpu(allocator, gpu)
            except AllocatorError as exc:
                self.runtime.events.warning(gpu, "GPUNotApplied", str(exc))
                raise
            self._fed[name] = digest
        service.adopt_waiting_for(allocator, name)
        if not knows_gpu(allocator, name):
            return None
        try:  # compares the cached status with the ledger first: most events are our own write's echo
            node = await self._write(allocator, name, cached)
        except KubeError as exc:
            service.metrics.writes.labels("gpu", "error").inc()
            log.warning("cannot write the status of GPU %s: %s; retrying", name, exc)
            raise
        if node:
            await self._touch_gpu_node(node)
        return None

    async def _write(self, allocator: GpuAllocator, name: str, cached: JsonMapping) -> str | None:
        """A merge patch of the status on the resourceVersion read, when the status differs from the
        ledger: the cached object's first (one round trip per write, not a GET and a PUT), the API
        server's after a 409. Returns the GPU's GPUNode, None if nothing was written."""
        client, writes = self.runtime.client, self.service.metrics.writes
        obj: JsonMapping | None = cached
        for _ in range(STATUS_WRITE_ATTEMPTS):
            if obj is None:
                try:
                    obj = await client.get(r.GPUS, name)
                except NotFound:
                    return None  # deleted: the informer will remove it
            if allocator is not self.service.allocator or not knows_gpu(allocator, name):
                return None
            gpu = Gpu(obj)
            wanted = views.gpu_status(allocator, name, gpu.status.get("allocatedPartitions"), rfc3339())
            if status_matches(gpu, wanted):
                return None
            status = {k: v for k, v in {**gpu.status, **wanted}.items() if v is not None}  # None: remove
            if "allocatedPartitions" not in wanted:
                status.pop("allocatedPartitions", None)
            patch = {"metadata": {"resourceVersion": gpu.meta.resource_version},
                     "status": merge_patch_from(gpu.status, status)}
            try:
                await client.patch(r.GPUS, name, patch, subresource="status")
            except Conflict:
                writes.labels("gpu", "conflict").inc()
                obj = None
                continue
            except NotFound:
                return None
            writes.labels("gpu", "ok").inc()
            return gpu.meta.label(tfa.MANAGED_BY) or allocator.gpu_info(name).node or None
        raise Conflict({"reason": "Conflict", "code": 409,
                        "message": f"GPU {name} changed {STATUS_WRITE_ATTEMPTS} times while its status "
                                   "was being written"})

    async def _touch_gpu_node(self, node: str) -> None:
        clock, writes = self.runtime.manager.clock, self.service.metrics.writes
        if clock.now() - self._last_sync.get(node, float("-inf")) < LAST_SYNC_MIN_INTERVAL_S:
            return
        if self.runtime.informer(r.GPUNODES).get(node) is None:
            return  # GPUs reported before (or without) their GPUNode: a patch would only answer 404
        self._last_sync[node] = clock.now()
        patch = {"metadata": {"annotations": {tfa.LAST_SYNC: tfa.now_rfc3339()}}}
        try:
            await self.runtime.client.patch(r.GPUNODES, node, patch)
            writes.labels("gpunode", "ok").inc()
        except NotFound:
            pass  # GPUs reported before their GPUNode exists
        except KubeError as exc:
            log.warning("cannot annotate GPUNode %s with %s: %s", node, tfa.LAST_SYNC, exc)
            writes.labels("gpunode", "error").inc()


def fed_digest(gpu: JsonMapping) -> bytes:
    """What the allocator is fed from a GPU object (allocation.py `apply_gpu`), as bytes to compare:
    its name, labels and annotations, and its status less the allocator's own output."""
    meta = gpu.get("metadata")
    status = gpu.get("status")
    fed = {k: v for k, v in status.items() if k not in ALLOCATOR_OUTPUT} if isinstance(status, dict) else status
    if isinstance(meta, dict):
        meta = {k: meta.get(k) for k in ("name", "labels", "annotations")}
    return orjson.dumps([meta, fed], option=orjson.OPT_SORT_KEYS)


def status_matches(gpu: Gpu, wanted: views.GpuLiveStatus) -> bool:
    """The GPU's status already says the ledger's `available`, `runningApps` and `allocatedPartitions`
    (and, under the dynamic isolation policy, `activeIsolationMode` and `dynamicIsolationConflict`)."""
    if "activeIsolationMode" in wanted and (
            gpu.status.get("activeIsolationMode") != wanted["activeIsolationMode"]
            or bool(gpu.status.get("dynamicIsolationConflict")) != wanted.get("dynamicIsolationConflict")):
        return False
    return bool(gpu.available == wanted["available"]
                and items(gpu.status, "runningApps") == wanted["runningApps"]
                and views.partitions_match(gpu.status, wanted))
