"""GPUNode: one Kubernetes node with GPUs, named like the node; totals and per-GPU pod placement.

Why it exists: the node is the unit the pool manages (selection, provisioning, hypervisor
lifecycle); its status aggregates the node's GPUs for the pool and for `kubectl get gpunodes`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, ClassVar, Literal, TypeAlias

import msgspec

from tfusion.api.kinds.base import API_VERSION, REQUIRED, Int32, Int64, Model, Quantity, constant
from tfusion.api.kinds.gpu import PodGPUInfo
from tfusion.api.kinds.meta import Condition, ObjectMeta

__all__ = ["GPUNode", "GPUNodeInfo", "GPUNodePhase", "GPUNodeSpec", "GPUNodeStatus", "HypervisorStatus"]

GPUNodePhase: TypeAlias = Literal[
    "Pending", "Provisioning", "Migrating", "Running", "Succeeded", "Failed", "Unknown", "Destroying"]


class GPUNodeSpec(Model):
    manage_mode: Literal["Manual", "AutoSelect", "Provisioned"] = "AutoSelect"
    cost_per_hour: str = ""
    gpu_card_indices: list[int] = msgspec.field(default_factory=list, name="gpuCardIndices")
    cloud_vendor_param: str = ""


class HypervisorStatus(Model):
    hypervisor_state: str = ""
    hypervisor_version: str = ""
    last_heartbeat_time: datetime | None = None


class GPUNodeInfo(Model):
    ram_size: Quantity | None = msgspec.field(default=None, name="ramSize")
    data_disk_size: Quantity | None = None


class GPUNodeStatus(Model):
    total_tflops: Quantity = msgspec.field(name="totalTFlops")
    total_vram: Quantity = msgspec.field(name="totalVRAM")
    total_gpus: Int32 = msgspec.field(name="totalGPUs")
    managed_gpus: Int32 = msgspec.field(name="managedGPUs")
    phase: Annotated[GPUNodePhase, REQUIRED] = "Pending"
    conditions: list[Condition] = msgspec.field(default_factory=list)
    virtual_tflops: Quantity | None = msgspec.field(default=None, name="virtualTFlops")
    virtual_vram: Quantity | None = msgspec.field(default=None, name="virtualVRAM")
    available_tflops: Quantity | None = msgspec.field(default=None, name="availableTFlops")
    available_vram: Quantity | None = msgspec.field(default=None, name="availableVRAM")
    virtual_available_tflops: Quantity | None = msgspec.field(default=None, name="virtualAvailableTFlops")
    virtual_available_vram: Quantity | None = msgspec.field(default=None, name="virtualAvailableVRAM")
    hypervisor_status: HypervisorStatus | None = None
    node_info: GPUNodeInfo | None = None
    loaded_models: list[str] | None = None
    managed_gpu_device_ids: list[str] = msgspec.field(default_factory=list, name="managedGPUDeviceIDs")
    observed_generation: Int64 = 0
    total_gpu_pods: Int32 = msgspec.field(default=0, name="totalGPUPods")
    allocated_pods: dict[str, list[PodGPUInfo]] = msgspec.field(default_factory=dict)


class GPUNode(Model):
    KIND: ClassVar[str] = "GPUNode"
    api_version: str = msgspec.field(default_factory=constant(API_VERSION))
    kind: str = msgspec.field(default_factory=constant("GPUNode"))
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: GPUNodeSpec = msgspec.field(default_factory=GPUNodeSpec)
    status: GPUNodeStatus | None = None
