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

import json
import logging
import shutil
import tempfile
from typing import Any

import anyio

from tfusion.api import annotations as keys
from tfusion.api.quantity import Quantity
from tfusion.hypervisor.devices.model import DeviceInfo
from tfusion.hypervisor.devices.registry import DeviceChanges, DeviceRegistry
from tfusion.kube.client import Conflict, KubeClient, KubeError, NotFound
from tfusion.kube.resources import GPUNODES, GPUS
from tfusion.web import Readiness

log = logging.getLogger(__name__)

GPUNODE_POLL_S = 2.0
RETRY_S = 1.0
USED_BY_TENSOR_FUSION = "tensor-fusion"


def tflops_quantity(tflops: float) -> str:
    return str(Quantity.from_milli(round(tflops * 1000)))


def vram_quantity(total_bytes: int) -> str:
    return f"{total_bytes // (1024 * 1024)}Mi"


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


def _owner_reference(gpunode: dict[str, Any]) -> dict[str, Any]:
    meta = gpunode["metadata"]
    return {"apiVersion": gpunode.get("apiVersion", "tensor-fusion.ai/v1"), "kind": "GPUNode",
            "name": meta["name"], "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}


def _pool_of(gpunode: dict[str, Any]) -> str:
    owners = gpunode["metadata"].get("ownerReferences") or []
    if owners:
        return str(owners[0].get("name", ""))
    return str((gpunode["metadata"].get("labels") or {}).get(keys.GPU_POOL, ""))


def _is_idle(gpu: dict[str, Any]) -> bool:
    status = gpu.get("status") or {}
    return not status.get("runningApps") and not status.get("allocatedPartitions")


def _is_zero(resource: dict[str, Any] | None) -> bool:
    if not resource:
        return True
    try:
        return all(Quantity.parse(resource.get(k) or "0").is_zero() for k in ("tflops", "vram"))
    except ValueError:
        return False


class GpuReporter:
    """Keeps GPU objects and the GPUNode status in step with the device registry."""

    def __init__(self, client: KubeClient, registry: DeviceRegistry, readiness: Readiness, *, node: str,
                 isolation_mode: str, isolation_policy: str) -> None:
        self.client = client
        self.registry = registry
        self.readiness = readiness
        self.node = node
        self.isolation_mode = isolation_mode
        self.isolation_policy = isolation_policy.capitalize()
        self._wake = anyio.Event()
        self._removed: dict[str, DeviceInfo] = {}
        self.syncs = 0
        readiness.set("gpunode", False, f"waiting for GPUNode {node} (the controller creates it)")
        registry.subscribe(self._on_changes)

    async def _on_changes(self, changes: DeviceChanges) -> None:
        for device in changes.removed:
            self._removed[device.uuid] = device
        self._wake.set()

    async def run(self) -> None:
        gpunode = await self._wait_for_gpunode()
        self.readiness.set("gpunode", True, f"GPUNode {self.node} found")
        while True:
            self._wake = anyio.Event()
            try:
                gpunode = await self.client.get(GPUNODES, self.node)
                await self.sync(gpunode)
            except NotFound:
                self.readiness.set("gpunode", False, f"GPUNode {self.node} disappeared; waiting for it")
                gpunode = await self._wait_for_gpunode()
                self.readiness.set("gpunode", True, f"GPUNode {self.node} found")
                continue
            except KubeError as exc:
                log.warning("reporting GPUs of node %s failed (%s); retrying", self.node, exc)
                await anyio.sleep(RETRY_S)
                continue
            await self._wake.wait()

    async def _wait_for_gpunode(self) -> dict[str, Any]:
        logged = False
        while True:
            try:
                return await self.client.get(GPUNODES, self.node)
            except NotFound:
                if not logged:
                    log.info("GPUNode %s does not exist yet; waiting for the controller to create it", self.node)
                    logged = True
            except KubeError as exc:
                log.warning("cannot read GPUNode %s: %s", self.node, exc)
            await anyio.sleep(GPUNODE_POLL_S)

    async def sync(self, gpunode: dict[str, Any]) -> None:
        devices = self.registry.devices()
        for device in devices:
            await self._upsert_gpu(gpunode, device)
            self._removed.pop(device.uuid, None)
        current = {d.uuid for d in devices}
        stale = await self.client.list(GPUS, label_selector=f"{keys.MANAGED_BY}={self.node}")
        for gpu in stale:
            if gpu["metadata"]["name"] not in current:
                await self._retire(gpu)
        self._removed.clear()
        await self._update_gpunode(gpunode, devices)
        self.syncs += 1

    # --- one GPU -----------------------------------------------------------------------------------

    def _status(self, device: DeviceInfo, old: dict[str, Any] | None) -> dict[str, Any]:
        old = old or {}
        capacity = {"tflops": tflops_quantity(device.max_tflops), "vram": vram_quantity(device.total_memory_bytes)}
        status: dict[str, Any] = {
            "capacity": capacity, "uuid": device.uuid, "gpuModel": device.model, "index": device.index,
            "vendor": device.vendor, "numaNode": device.numa_node, "isolationMode": self.isolation_mode,
            "isolationPolicy": self.isolation_policy, "nodeSelector": {"kubernetes.io/hostname": self.node},
            "message": "managed" if device.healthy else f"unhealthy: {device.health_message}",
        }
        if not old.get("usedBy"):
            status["usedBy"] = USED_BY_TENSOR_FUSION
        if not device.healthy:
            status["phase"] = "Unknown"
        elif not old.get("phase") or old.get("phase") == "Unknown":
            status["phase"] = "Pending"
        if old.get("available") is None or (_is_zero(old.get("available")) and not old.get("runningApps")
                                            and not old.get("allocatedPartitions")):
            status["available"] = dict(capacity)
        return status

    def _metadata(self, gpunode: dict[str, Any], device: DeviceInfo) -> dict[str, Any]:
        return {
            "labels": {keys.MANAGED_BY: self.node, keys.GPU_POOL: _pool_of(gpunode)},
            "annotations": {keys.LAST_SYNC: keys.now_rfc3339(),
                            keys.VIRTUALIZATION_CAPABILITIES: json.dumps(device.capabilities.to_wire(),
                                                                                separators=(",", ":"))},
        }

    async def _upsert_gpu(self, gpunode: dict[str, Any], device: DeviceInfo) -> None:
        meta = self._metadata(gpunode, device)
        owner = _owner_reference(gpunode)
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
                    owners = gpu["metadata"].get("ownerReferences") or []
                    if not any(o.get("uid") == owner["uid"] for o in owners):
                        patch["metadata"]["ownerReferences"] = [*owners, owner]
                    gpu = await self.client.patch(GPUS, device.uuid, patch, patch_type="merge")
                status = self._status(device, gpu.get("status"))
                await self.client.patch(GPUS, device.uuid, {"status": status}, patch_type="merge",
                                        subresource="status")
                return
            except Conflict:
                if attempt == 2:
                    raise
                await anyio.sleep(RETRY_S)

    async def _retire(self, gpu: dict[str, Any]) -> None:
        name = gpu["metadata"]["name"]
        if _is_idle(gpu):
            log.info("device %s vanished from node %s; deleting its idle GPU object", name, self.node)
            try:
                await self.client.delete(GPUS, name)
            except NotFound:
                pass
            return
        notes = gpu["metadata"].get("annotations") or {}
        since = notes.get(keys.GPU_MISSING_SINCE) or keys.now_rfc3339()
        log.warning("device %s vanished from node %s but runs workers; marking it Unknown", name, self.node)
        await self.client.patch(GPUS, name, {"metadata": {"annotations": {keys.GPU_MISSING_SINCE: since}}},
                                patch_type="merge")
        status = {"phase": "Unknown", "message": f"device missing since {since}"}
        await self.client.patch(GPUS, name, {"status": status}, patch_type="merge", subresource="status")

    # --- the GPUNode ---------------------------------------------------------------------------------

    async def _update_gpunode(self, gpunode: dict[str, Any], devices: list[DeviceInfo]) -> None:
        old = gpunode.get("status") or {}
        total_tflops = sum(d.max_tflops for d in devices)
        total_vram = sum(d.total_memory_bytes for d in devices)
        ids = [d.uuid for d in devices]
        status: dict[str, Any] = {
            "totalTFlops": tflops_quantity(total_tflops), "totalVRAM": str(Quantity.from_int(total_vram, "BinarySI")),
            "totalGPUs": len(ids), "managedGPUs": len(ids), "managedGPUDeviceIDs": ids,
            "nodeInfo": {"ramSize": str(Quantity.from_int(node_ram_bytes(), "BinarySI")),
                         "dataDiskSize": str(Quantity.from_int(data_disk_bytes(), "BinarySI"))},
        }
        if not old.get("phase"):
            status["phase"] = "Pending"
        if all(old.get(k) == v for k, v in status.items()):
            return
        await self.client.patch(GPUNODES, self.node, {"status": status}, patch_type="merge", subresource="status")

