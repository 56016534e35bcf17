"""Reporting this node's devices to the control plane (Kubernetes backend, reference §3.4).

One cluster-scoped GPU object per device (name = lowercase UUID), owned by the node's GPUNode,
labelled with the node and pool, carrying last-sync and virtualization-capabilities annotations
and the hardware facts in its status. The hypervisor sets `status.available` only when the object
is created (or when it is empty and idle, as upstream resets it) and never touches `runningApps`
or `allocatedPartitions`: the controller owns those. A vanished device's GPU is deleted when idle,
else marked `phase: Unknown` with a `gpu-missing-since` annotation. The GPUNode's status totals
follow the devices. Nothing is written until the GPUNode exists (the controller creates it).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from typing import Any, TypedDict

import anyio
import orjson

from tfusion.api import annotations as keys
from tfusion.api.accessors import Gpu, GpuNode
from tfusion.api.jsontypes import JsonMapping, JsonObject, json_object
from tfusion.api.quantity import Quantity
from tfusion.hypervisor.devices.model import DeviceInfo
from tfusion.hypervisor.devices.registry import DeviceChanges, DeviceRegistry
from tfusion.kube.client import Conflict, KubeError, NotFound
from tfusion.kube.manager import Manager
from tfusion.kube.ownership import controller_reference
from tfusion.kube.resources import GPUNODES, GPUS
from tfusion.web import Readiness

log = logging.getLogger(__name__)

RETRY_S = 1.0
#: between reports, last-sync is stamped this often: the controller reads it as "the hypervisor
#: reports" (a GPUNode turns Unknown after --gpu-node-report-grace, default 5 m, without it)
HEARTBEAT_S = 60.0
USED_BY_TENSOR_FUSION = "tensor-fusion"
MIB = 1024 * 1024


def tflops_quantity(tflops: float) -> str:
    """TFLOPS in the canonical form Kubernetes prints (989 -> "989", 19.5 -> "19500m")."""
    return str(Quantity.from_milli(round(tflops * 1000)))


def bytes_quantity(size: int) -> str:
    """Bytes in the canonical binary form Kubernetes prints (85899345920 -> "80Gi")."""
    return str(Quantity.from_int(size, "BinarySI"))


def vram_quantity(total_bytes: int) -> str:
    """A device's VRAM, whole MiB as the original counts it, printed canonically ("80Gi", "81559Mi")."""
    return bytes_quantity(total_bytes // MIB * MIB)


def node_ram_bytes() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def data_disk_bytes() -> int:
    try:
        return shutil.disk_usage(tempfile.gettempdir()).total
    except OSError:
        return 0


class _GpuMetadata(TypedDict):
    """The labels and annotations the reporter owns on each GPU object."""

    labels: dict[str, str]
    annotations: dict[str, str]


def _pool_of(gpunode: GpuNode) -> str:
    owners = gpunode.meta.owner_references
    if owners:
        return str(owners[0].get("name", ""))
    return gpunode.meta.label(keys.GPU_POOL) or ""


def _is_idle(gpu: Gpu) -> bool:
    status = gpu.status
    return not status.get("runningApps") and not status.get("allocatedPartitions")


def _nothing_available(gpu: Gpu) -> bool:
    """Whether the GPU's status.available is empty or all zero (unreadable quantities count as not)."""
    available = gpu.available
    try:
        return all(Quantity.parse(available.get(k) or "0").is_zero() for k in ("tflops", "vram"))
    except ValueError:
        return False


class GpuReporter:
    """Keeps GPU objects and the GPUNode status in step with the device registry."""

    def __init__(self, manager: Manager, registry: DeviceRegistry, readiness: Readiness, *, node: str,
                 isolation_mode: str, isolation_policy: str) -> None:
        self.client = manager.client
        self.clock = manager.clock
        self.registry = registry
        self.readiness = readiness
        self.node = node
        self.isolation_mode = isolation_mode
        self.isolation_policy = isolation_policy.capitalize()
        # read from the shared cache: the GPUNode to wait for, and the GPUs this node reported before
        self.gpunodes = manager.cache.informer(GPUNODES, field_selector=f"metadata.name={node}")
        self.gpus = manager.cache.informer(GPUS, label_selector=f"{keys.MANAGED_BY}={node}")
        self._gpus_by_node = self.gpus.add_label_index(keys.MANAGED_BY)
        self._wake = anyio.Event()
        self._removed: dict[str, DeviceInfo] = {}
        self.syncs = 0
        readiness.set("gpunode", False, f"waiting for GPUNode {node} (the controller creates it)")
        registry.subscribe(self._on_changes)
        self.gpunodes.add_handler(on_add=self._on_gpunode, on_update=self._on_gpunode_update)

    async def _on_changes(self, changes: DeviceChanges) -> None:
        for device in changes.removed:
            self._removed[device.uuid] = device
        self._wake.set()

    def _on_gpunode(self, gpunode: JsonMapping) -> None:
        if GpuNode(gpunode).name == self.node:
            self._wake.set()

    def _on_gpunode_update(self, old: JsonMapping | None, new: JsonMapping) -> None:
        if old is None or GpuNode(old).uid != GpuNode(new).uid:
            self._on_gpunode(new)  # a new GPUNode of that name: report again; status edits are ours

    async def run(self) -> None:
        await self.gpunodes.wait_synced()
        while True:
            self._wake = anyio.Event()
            found = self.gpunodes.get(self.node)
            if found is None:
                self.readiness.set("gpunode", False, f"waiting for GPUNode {self.node} (the controller creates it)")
                await self._wake.wait()
                continue
            self.readiness.set("gpunode", True, f"GPUNode {self.node} found")
            try:
                await self.sync(GpuNode(found))
            except NotFound:
                continue  # deleted meanwhile: the cache says so soon
            except KubeError as exc:
                log.warning("reporting GPUs of node %s failed (%s); retrying", self.node, exc)
                await self.clock.sleep(RETRY_S)
                continue
            await self._wait_beating()

    async def _wait_beating(self) -> None:
        """Wait for the next change, stamping last-sync on this node's GPUs every HEARTBEAT_S meanwhile."""
        while True:
            with anyio.move_on_after(HEARTBEAT_S):
                await self._wake.wait()
                return
            try:
                await self.heartbeat()
            except KubeError as exc:
                log.warning("GPU heartbeat of node %s failed (%s); retrying", self.node, exc)

    async def heartbeat(self) -> None:
        stamp = {"metadata": {"annotations": {keys.LAST_SYNC: keys.now_rfc3339()}}}
        for gpu in map(Gpu, self.gpus.by_index(self._gpus_by_node, self.node)):
            if not gpu.meta.annotation(keys.GPU_MISSING_SINCE):
                try:
                    await self.client.patch(GPUS, gpu.name, stamp, patch_type="merge")
                except NotFound:
                    continue

    async def sync(self, gpunode: GpuNode) -> None:
        devices = self.registry.devices()
        for device in devices:
            await self._upsert_gpu(gpunode, device)
            self._removed.pop(device.uuid, None)
        current = {d.uuid for d in devices}
        for gpu in map(Gpu, self.gpus.by_index(self._gpus_by_node, self.node)):
            if gpu.name not in current:
                await self._retire(gpu)
        self._removed.clear()
        await self._update_gpunode(gpunode, devices)
        self.syncs += 1

    # --- one GPU -----------------------------------------------------------------------------------

    def _status(self, device: DeviceInfo, gpu: Gpu) -> JsonObject:
        """The status to write for `device` over what `gpu` holds now."""
        old = gpu.status
        capacity: JsonObject = {"tflops": tflops_quantity(device.max_tflops),
                                "vram": vram_quantity(device.total_memory_bytes)}
        status: JsonObject = {
            "capacity": capacity, "uuid": device.uuid, "gpuModel": device.model, "index": device.index,
            "vendor": device.vendor, "numaNode": device.numa_node, "isolationMode": self.isolation_mode,
            "isolationPolicy": self.isolation_policy, "nodeSelector": {"kubernetes.io/hostname": self.node},
            "message": "managed" if device.healthy else f"unhealthy: {device.health_message}",
        }
        if device.topology:
            status["topology"] = {"peers": [link.to_status() for link in device.topology]}
        elif old.get("topology") is not None:
            status["topology"] = None  # the backend no longer knows it: a merge patch removes it
        if not old.get("usedBy"):
            status["usedBy"] = USED_BY_TENSOR_FUSION
        if not device.healthy:
            status["phase"] = "Unknown"
        elif not old.get("phase") or old.get("phase") == "Unknown":
            status["phase"] = "Pending"
        if old.get("available") is None or (_nothing_available(gpu) and _is_idle(gpu)):
            status["available"] = dict(capacity)
        return status

    def _metadata(self, gpunode: GpuNode, device: DeviceInfo) -> _GpuMetadata:
        return {
            "labels": {keys.MANAGED_BY: self.node, keys.GPU_POOL: _pool_of(gpunode)},
            "annotations": {keys.LAST_SYNC: keys.now_rfc3339(),
                            keys.VIRTUALIZATION_CAPABILITIES: orjson.dumps(device.capabilities.to_wire()).decode()},
        }

    async def _upsert_gpu(self, gpunode: GpuNode, device: DeviceInfo) -> None:
        meta = self._metadata(gpunode, device)
        owner = json_object(controller_reference(gpunode, GPUNODES))
        for attempt in range(3):
            try:
                try:
                    gpu = await self.client.get(GPUS, device.uuid)
                except NotFound:
                    gpu = await self.client.create(GPUS, {
                        "apiVersion": "tensor-fusion.ai/v1", "kind": "GPU",
                        "metadata": {"name": device.uuid, **meta, "ownerReferences": [owner]}})
                else:
                    patch: dict[str, Any] = {"metadata": {
                        "labels": meta["labels"],
                        "annotations": {**meta["annotations"], keys.GPU_MISSING_SINCE: None}}}
                    owners = Gpu(gpu).meta.owner_references
                    if not any(o.get("uid") == owner["uid"] for o in owners):
                        patch["metadata"]["ownerReferences"] = [*owners, owner]
                    gpu = await self.client.patch(GPUS, device.uuid, patch, patch_type="merge")
                status = self._status(device, Gpu(gpu))
                await self.client.patch(GPUS, device.uuid, {"status": status}, patch_type="merge",
                                        subresource="status")
                return
            except Conflict:
                if attempt == 2:
                    raise
                await self.clock.sleep(RETRY_S)

    async def _retire(self, gpu: Gpu) -> None:
        name = gpu.name
        if _is_idle(gpu):
            log.info("device %s vanished from node %s; deleting its idle GPU object", name, self.node)
            try:
                await self.client.delete(GPUS, name)
            except NotFound:
                pass
            return
        since = gpu.meta.annotation(keys.GPU_MISSING_SINCE) or keys.now_rfc3339()
        log.warning("device %s vanished from node %s but runs workers; marking it Unknown", name, self.node)
        await self.client.patch(GPUS, name, {"metadata": {"annotations": {keys.GPU_MISSING_SINCE: since}}},
                                patch_type="merge")
        status = {"phase": "Unknown", "message": f"device missing since {since}"}
        await self.client.patch(GPUS, name, {"status": status}, patch_type="merge", subresource="status")

    # --- the GPUNode ---------------------------------------------------------------------------------

    async def _update_gpunode(self, gpunode: GpuNode, devices: list[DeviceInfo]) -> None:
        old = gpunode.status
        total_tflops = sum(d.max_tflops for d in devices)
        total_vram = sum(d.total_memory_bytes for d in devices)
        ids = [d.uuid for d in devices]
        status: dict[str, Any] = {
            "totalTFlops": tflops_quantity(total_tflops), "totalVRAM": bytes_quantity(total_vram),
            "totalGPUs": len(ids), "managedGPUs": len(ids), "managedGPUDeviceIDs": ids,
            "nodeInfo": {"ramSize": bytes_quantity(node_ram_bytes()),
                         "dataDiskSize": bytes_quantity(data_disk_bytes())},
        }
        if not old.get("phase"):
            status["phase"] = "Pending"
        if all(old.get(k) == v for k, v in status.items()):
            return
        await self.client.patch(GPUNODES, self.node, {"status": status}, patch_type="merge", subresource="status")

