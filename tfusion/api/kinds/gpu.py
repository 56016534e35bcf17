"""GPU: one physical device, named by its UUID; status only (the hypervisor reports it).

Why it exists: the allocator's whole view of the hardware is these objects: capacity and what is
still available, which apps run where, partitions and interconnect.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, ClassVar, Literal, TypeAlias

import msgspec

from tfusion.api.kinds.base import API_VERSION, REQUIRED, Int32, Int64, Model, UInt32, constant
from tfusion.api.kinds.common import IsolationMode, QoSLevel, Resource
from tfusion.api.kinds.meta import ObjectMeta

__all__ = [
    "GPU", "AllocatedPartition", "GPUPhase", "GPUStatus", "GPUTopology", "GPUTopologyPeer", "NVLinkInfo",
    "NVLinkPeer", "PodGPUInfo", "RunningAppDetail", "UsedBy",
]

GPUPhase: TypeAlias = Literal["Pending", "Provisioning", "Running", "Unknown", "Destroying", "Migrating"]
#: who hands this GPU to pods: tensor-fusion, or the system name of another device plugin holding it
#: (nvidia-device-plugin, 3rd-party-device-plugin, a ProviderConfig's usedBySystemName); any string,
#: since the original's two-value enum refuses the names its own detector writes
UsedBy: TypeAlias = str


class PodGPUInfo(Model):
    name: str = ""
    """Pod name."""
    namespace: str = ""
    """Pod namespace."""
    uid: str = ""
    """Pod UID."""
    requests: Resource | None = None
    """What the pod reserved on this GPU (TFLOPS, VRAM), written by the controller."""
    limits: Resource | None = None
    """The pod's ceiling on this GPU, written by the controller."""
    qos: QoSLevel | None = None
    """QoS level of the pod: low, medium, high or critical."""
    is_external: bool = False
    """True when the pod got the GPU outside TensorFusion (for example through the device plugin)."""


class RunningAppDetail(Model):
    """A workload using this GPU, with its worker count and pods."""

    count: int
    """Number of this workload's workers on the GPU."""
    name: str = ""
    """Workload name."""
    namespace: str = ""
    """Workload namespace."""
    pods: list[PodGPUInfo] = msgspec.field(default_factory=list)
    """The workload's pods on this GPU with what each reserved."""


class AllocatedPartition(Model):
    """A hardware partition (MIG-like) held by one pod; the map key is the pod UID."""

    template_id: str = msgspec.field(name="templateId")
    """Partition template in use (an id from ProviderConfig virtualizationTemplates)."""
    pod_uid: str = msgspec.field(name="podUid")
    """UID of the pod holding the partition (the same as the map key)."""
    pod_name: str
    """Name of the pod holding the partition."""
    namespace: str
    """Namespace of that pod."""
    allocated_at: datetime
    """When the partition was created (RFC 3339 time)."""
    allocated_slot_start: UInt32 | None = None
    """First placement slot the partition occupies."""
    allocated_slot_end: UInt32 | None = None
    """Placement slot just after the partition (exclusive end)."""
    isolation_group_id: UInt32 | None = msgspec.field(default=None, name="isolationGroupId")
    """Isolation group (for example an Ascend vNPU group) the partition belongs to."""


class NVLinkPeer(Model):
    peer_uuid: str = msgspec.field(name="peerUUID")
    """UUID of the GPU at the other end of the links."""
    link_count: Int32 = 0
    """Number of NVLink links to that peer."""
    link_version: Int32 = 0
    """NVLink generation of those links."""
    bandwidth_m_bps: Int64 = msgspec.field(default=0, name="bandwidthMBps")
    """Bandwidth to that peer in MB/s."""


class NVLinkInfo(Model):
    peer_count: Int32 = 0
    """Number of GPUs this GPU is linked to."""
    total_link_count: Int32 = 0
    """Number of active NVLink links in total."""
    total_bandwidth_m_bps: Int64 = msgspec.field(default=0, name="totalBandwidthMBps")
    """Sum of NVLink bandwidth to all peers in MB/s."""
    peers: list[NVLinkPeer] = msgspec.field(default_factory=list)
    """One entry per linked GPU."""


class GPUTopologyPeer(Model):
    peer_gpu_uuid: str = msgspec.field(name="peerGPUUUID")
    """UUID of the other GPU (the name of its GPU object)."""
    tier: Int32
    """How close the two GPUs are, lower is closer: 0 a direct interconnect (NVLink), 1 the same NUMA node (PCIe
    switch, host bridge), 2 across NUMA nodes, 3 unknown. Multi-GPU placement by topology compares these."""
    link_type: str = ""
    """The path between the two GPUs as the hypervisor found it: NVLink, Internal (one board), PCIeSwitch,
    HostBridge, NUMANode, System, or Unknown."""
    bandwidth: Int64 = 0
    """Bandwidth between the two GPUs in MB/s; 0 when unknown."""


class GPUTopology(Model):
    """The GPU's paths to the other GPUs of its node; its NUMA node is status.numaNode."""

    peers: list[GPUTopologyPeer] = msgspec.field(default_factory=list)
    """Every other GPU on the node with its connection."""


class GPUStatus(Model):
    capacity: Resource
    """Physical capacity (TFLOPS, VRAM), reported by the hypervisor."""
    available: Resource
    """What is not yet reserved (TFLOPS, VRAM), kept by the controller's allocator."""
    uuid: str = msgspec.field(name="uuid")
    """Device UUID as the driver reports it (the object is named after it, lowercase)."""
    node_selector: dict[str, str]
    """Labels pinning pods to this GPU's node; kubernetes.io/hostname holds the node name."""
    gpu_model: str = msgspec.field(name="gpuModel")
    """Model name as in ProviderConfig hardwareMetadata (for example A100)."""
    message: str
    """Human-readable note on the current phase."""
    phase: Annotated[GPUPhase, REQUIRED] = "Pending"
    """Lifecycle phase: Pending, Provisioning, Running, Unknown, Destroying or Migrating. Default Pending."""
    vendor: Annotated[str, REQUIRED] = "NVIDIA"
    """Hardware vendor (for example NVIDIA). Default NVIDIA."""
    model: str = ""
    """Full model string from the driver."""
    isolation_mode: IsolationMode = "soft"
    """Isolation this GPU offers: shared, soft, hard or partitioned. Default soft; set from the pool's rules."""
    isolation_policy: Literal["Static", "Dynamic"] | None = None
    """Static (one isolation mode for good) or Dynamic (the first allocation locks the mode)."""
    active_isolation_mode: Literal["shared", "soft", "hard"] | None = None
    """For a Dynamic GPU, the mode locked by its current allocations (shared, soft or hard); empty when idle."""
    dynamic_isolation_conflict: bool = False
    """True when a Dynamic GPU holds allocations of more than one isolation mode."""
    index: Int32 | None = None
    """Device index on the node (as nvidia-smi numbers it)."""
    numa_node: Int32 | None = msgspec.field(default=None, name="numaNode")
    """NUMA node the GPU is attached to."""
    used_by: UsedBy | None = None
    """Who hands this GPU to pods: tensor-fusion, or the device plugin holding it (nvidia-device-plugin,
    3rd-party-device-plugin, a ProviderConfig's usedBySystemName), which TensorFusion then leaves alone. Written by
    the hypervisor."""
    running_apps: list[RunningAppDetail] = msgspec.field(default_factory=list)
    """Workloads with workers on this GPU, kept by the controller."""
    nv_link: NVLinkInfo | None = msgspec.field(default=None, name="nvLink")
    """NVLink connections of this GPU, reported by the hypervisor."""
    allocated_partitions: dict[str, AllocatedPartition] = msgspec.field(default_factory=dict)
    """Hardware partitions in use, keyed by pod UID."""
    topology: GPUTopology | None = None
    """How this GPU connects to the node's other GPUs, reported by the hypervisor."""


class GPU(Model):
    KIND: ClassVar[str] = "GPU"
    api_version: str = msgspec.field(default_factory=constant(API_VERSION))
    kind: str = msgspec.field(default_factory=constant("GPU"))
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    status: GPUStatus | None = None
    """Everything about the device; written by the hypervisor and the controller (a GPU has no spec)."""
