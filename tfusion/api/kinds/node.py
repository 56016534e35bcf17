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
    """How the node came to the pool: Manual, AutoSelect (matched by the pool's nodeSelector) or Provisioned (created
    by TensorFusion). Default AutoSelect."""
    cost_per_hour: str = ""
    """Hourly price of the node, a dollar string such as "$2.5"; for cost reports."""
    gpu_card_indices: list[int] = msgspec.field(default_factory=list, name="gpuCardIndices")
    """For a provisioned node, the indices of the GPUs TensorFusion manages."""
    cloud_vendor_param: str = ""
    """Opaque vendor parameters for a provisioned node."""


class HypervisorStatus(Model):
    hypervisor_state: str = ""
    """State of the node's hypervisor as last reported."""
    hypervisor_version: str = ""
    """Version of the node's hypervisor."""
    last_heartbeat_time: datetime | None = None
    """When the hypervisor last reported (RFC 3339 time)."""


class GPUNodeInfo(Model):
    ram_size: Quantity | None = msgspec.field(default=None, name="ramSize")
    """Host memory in bytes, a Kubernetes quantity such as 512Gi."""
    data_disk_size: Quantity | None = None
    """Data disk size in bytes, a Kubernetes quantity such as 1Ti."""


class GPUNodeStatus(Model):
    total_tflops: Quantity = msgspec.field(name="totalTFlops")
    """Sum of the node's GPU compute in TFLOPS, a Kubernetes quantity such as 624."""
    total_vram: Quantity = msgspec.field(name="totalVRAM")
    """Sum of the node's GPU memory in bytes, a Kubernetes quantity such as 320Gi."""
    total_gpus: Int32 = msgspec.field(name="totalGPUs")
    """Number of GPUs on the node."""
    managed_gpus: Int32 = msgspec.field(name="managedGPUs")
    """Number of those GPUs TensorFusion manages."""
    phase: Annotated[GPUNodePhase, REQUIRED] = "Pending"
    """Node phase: Pending, Provisioning, Migrating, Running, Succeeded, Failed, Unknown or Destroying. Default
    Pending. Written by the controller."""
    conditions: list[Condition] = msgspec.field(default_factory=list)
    """Latest observations of the node's state."""
    virtual_tflops: Quantity | None = msgspec.field(default=None, name="virtualTFlops")
    """Compute after oversubscription (total times the pool's oversell ratio), a Kubernetes quantity."""
    virtual_vram: Quantity | None = msgspec.field(default=None, name="virtualVRAM")
    """Memory after expansion into host RAM and disk, bytes as a Kubernetes quantity."""
    available_tflops: Quantity | None = msgspec.field(default=None, name="availableTFlops")
    """Compute not yet reserved, in TFLOPS, a Kubernetes quantity."""
    available_vram: Quantity | None = msgspec.field(default=None, name="availableVRAM")
    """GPU memory not yet reserved, bytes as a Kubernetes quantity."""
    virtual_available_tflops: Quantity | None = msgspec.field(default=None, name="virtualAvailableTFlops")
    """Oversubscribed compute not yet reserved, a Kubernetes quantity."""
    virtual_available_vram: Quantity | None = msgspec.field(default=None, name="virtualAvailableVRAM")
    """Expanded memory not yet reserved, bytes as a Kubernetes quantity."""
    hypervisor_status: HypervisorStatus | None = None
    """What the node's hypervisor last reported."""
    node_info: GPUNodeInfo | None = None
    """Host facts: RAM and data disk."""
    loaded_models: list[str] | None = None
    """Models cached on the node (used by warm-up features)."""
    managed_gpu_device_ids: list[str] = msgspec.field(default_factory=list, name="managedGPUDeviceIDs")
    """UUIDs of the GPUs TensorFusion manages on this node."""
    observed_generation: Int64 = 0
    """The metadata.generation the controller last acted on."""
    total_gpu_pods: Int32 = msgspec.field(default=0, name="totalGPUPods")
    """Number of pods on the node that hold TensorFusion GPUs."""
    allocated_pods: dict[str, list[PodGPUInfo]] = msgspec.field(default_factory=dict)
    """Pods holding each GPU, keyed by GPU name."""


class GPUNode(Model):
    KIND: ClassVar[str] = "GPUNode"
    api_version: str = msgspec.field(default_factory=constant(API_VERSION))
    kind: str = msgspec.field(default_factory=constant("GPUNode"))
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: GPUNodeSpec = msgspec.field(default_factory=GPUNodeSpec)
    """How the node is managed; written by the controller."""
    status: GPUNodeStatus | None = None
    """Capacity, allocation and phase of the node; written by the controller."""
