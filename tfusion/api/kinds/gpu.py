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
    "NVLinkPeer", "PodGPUInfo", "RunningAppDetail",
]

GPUPhase: TypeAlias = Literal["Pending", "Provisioning", "Running", "Unknown", "Destroying", "Migrating"]


class PodGPUInfo(Model):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    requests: Resource | None = None
    limits: Resource | None = None
    qos: QoSLevel | None = None
    is_external: bool = False


class RunningAppDetail(Model):
    """A workload using this GPU, with its worker count and pods."""

    count: int
    name: str = ""
    namespace: str = ""
    pods: list[PodGPUInfo] = msgspec.field(default_factory=list)


class AllocatedPartition(Model):
    """A hardware partition (MIG-like) held by one pod; the map key is the pod UID."""

    template_id: str = msgspec.field(name="templateId")
    pod_uid: str = msgspec.field(name="podUid")
    pod_name: str
    namespace: str
    allocated_at: datetime
    allocated_slot_start: UInt32 | None = None
    allocated_slot_end: UInt32 | None = None
    isolation_group_id: UInt32 | None = msgspec.field(default=None, name="isolationGroupId")


class NVLinkPeer(Model):
    peer_uuid: str = msgspec.field(default="", name="peerUUID")
    link_count: Int32 = 0
    link_version: Int32 = 0
    bandwidth_m_bps: Int64 = msgspec.field(default=0, name="bandwidthMBps")


class NVLinkInfo(Model):
    peer_count: Int32 = 0
    total_link_count: Int32 = 0
    total_bandwidth_m_bps: Int64 = msgspec.field(default=0, name="totalBandwidthMBps")
    peers: list[NVLinkPeer] = msgspec.field(default_factory=list)


class GPUTopologyPeer(Model):
    peer_gpu_uuid: str = msgspec.field(default="", name="peerGPUUUID")
    tier: Int32 = 0
    link_type: str = ""
    bandwidth: Int64 = 0


class GPUTopology(Model):
    peers: list[GPUTopologyPeer] = msgspec.field(default_factory=list)


class GPUStatus(Model):
    capacity: Resource
    available: Resource
    uuid: str = msgspec.field(name="uuid")
    node_selector: dict[str, str]
    gpu_model: str = msgspec.field(name="gpuModel")
    message: str
    phase: Annotated[GPUPhase, REQUIRED] = "Pending"
    vendor: Annotated[str, REQUIRED] = "NVIDIA"
    model: str = ""
    isolation_mode: IsolationMode = "soft"
    isolation_policy: Literal["Static", "Dynamic"] | None = None
    active_isolation_mode: Literal["shared", "soft", "hard"] | None = None
    dynamic_isolation_conflict: bool = False
    index: Int32 | None = None
    numa_node: Int32 | None = msgspec.field(default=None, name="numaNode")
    used_by: str = ""
    running_apps: list[RunningAppDetail] = msgspec.field(default_factory=list)
    nv_link: NVLinkInfo | None = msgspec.field(default=None, name="nvLink")
    allocated_partitions: dict[str, AllocatedPartition] = msgspec.field(default_factory=dict)
    topology: GPUTopology | None = None


class GPU(Model):
    KIND: ClassVar[str] = "GPU"
    api_version: str = msgspec.field(default_factory=constant(API_VERSION))
    kind: str = msgspec.field(default_factory=constant("GPU"))
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    status: GPUStatus | None = None
