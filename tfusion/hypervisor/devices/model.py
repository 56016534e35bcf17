"""What the device layer reports: devices, their live metrics and the processes on them.

`DeviceInfo.to_wire` gives the JSON shape of the original's `DeviceInfo` (Go field names, PascalCase),
which is what `/api/v1/devices` returns and what the local backend persists in `devices.json`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

NVIDIA = "NVIDIA"


class CapabilitiesWire(TypedDict, total=False):
    """`VirtualizationCapabilities` as the original's JSON spells it (not total: old files may lack keys)."""

    SupportsPartitioning: bool
    SupportsSoftIsolation: bool
    SupportsHardIsolation: bool
    SupportsSnapshot: bool
    SupportsMetrics: bool
    SupportsRemoting: bool
    MaxPartitions: int
    MaxWorkersPerDevice: int


class DeviceWire(TypedDict, total=False):
    """`DeviceInfo` as the original's JSON spells it: `/api/v1/devices` and `devices.json`."""

    UUID: str
    Vendor: str
    Model: str
    Index: int
    NUMANode: int
    Topology: None
    TotalMemoryBytes: int
    MaxTflops: float
    VirtualizationCapabilities: CapabilitiesWire
    Properties: dict[str, str]
    Healthy: bool
    ParentUUID: str
    DeviceNode: dict[str, str]
    DeviceEnv: dict[str, str]
    IsolationMode: str
    IsolationPolicy: str


def wire_map(value: Mapping[str, str] | None) -> dict[str, str]:
    """A copy of a string map read back from a file, or {} where the file holds something else."""
    return dict(value) if isinstance(value, Mapping) else {}


def wire_uuid(native_uuid: str) -> str:
    """Kubernetes object names must be lowercase; the driver's casing is kept for driver calls."""
    return native_uuid.lower()


@dataclass(frozen=True)
class VirtualizationCapabilities:
    supports_partitioning: bool = False
    supports_soft_isolation: bool = True
    supports_hard_isolation: bool = True
    supports_snapshot: bool = False
    supports_metrics: bool = True
    supports_remoting: bool = False
    max_partitions: int = 0
    max_workers_per_device: int = 16

    def to_wire(self) -> CapabilitiesWire:
        return {
            "SupportsPartitioning": self.supports_partitioning,
            "SupportsSoftIsolation": self.supports_soft_isolation,
            "SupportsHardIsolation": self.supports_hard_isolation,
            "SupportsSnapshot": self.supports_snapshot,
            "SupportsMetrics": self.supports_metrics,
            "SupportsRemoting": self.supports_remoting,
            "MaxPartitions": self.max_partitions,
            "MaxWorkersPerDevice": self.max_workers_per_device,
        }

    @classmethod
    def from_wire(cls, raw: CapabilitiesWire | None) -> VirtualizationCapabilities:
        raw = raw or CapabilitiesWire()
        return cls(
            supports_partitioning=bool(raw.get("SupportsPartitioning", False)),
            supports_soft_isolation=bool(raw.get("SupportsSoftIsolation", True)),
            supports_hard_isolation=bool(raw.get("SupportsHardIsolation", True)),
            supports_snapshot=bool(raw.get("SupportsSnapshot", False)),
            supports_metrics=bool(raw.get("SupportsMetrics", True)),
            supports_remoting=bool(raw.get("SupportsRemoting", False)),
            max_partitions=int(raw.get("MaxPartitions", 0)),
            max_workers_per_device=int(raw.get("MaxWorkersPerDevice", 16)))


#: closeness tiers of two GPUs on one node, numbered as the original's topology plugin numbers them
TIER_NVLINK = 0
TIER_SAME_NUMA = 1
TIER_CROSS_NUMA = 2
TIER_UNKNOWN = 3

#: link types written to a GPU's status.topology
LINK_NVLINK = "NVLink"
LINK_INTERNAL = "Internal"
LINK_PCIE_SWITCH = "PCIeSwitch"
LINK_HOST_BRIDGE = "HostBridge"
LINK_NUMA_NODE = "NUMANode"
LINK_SYSTEM = "System"
LINK_UNKNOWN = "Unknown"


@dataclass(frozen=True)
class TopologyLink:
    """How this device reaches one other device of the node: the peer's UUID (lowercase, as GPU objects
    are named), the closeness tier (TIER_*) and the kind of path (LINK_*); bandwidth in MB/s, 0 when unknown."""

    peer_uuid: str
    tier: int
    link_type: str
    bandwidth_mbps: int = 0

    def to_status(self) -> dict[str, Any]:
        """One entry of the GPU's `status.topology.peers`."""
        entry: dict[str, Any] = {"peerGPUUUID": self.peer_uuid, "tier": self.tier, "linkType": self.link_type}
        if self.bandwidth_mbps:
            entry["bandwidth"] = self.bandwidth_mbps
        return entry


@dataclass(frozen=True)
class DeviceInfo:
    """One accelerator as discovered. `uuid` is lowercase; `native_uuid` keeps the driver's casing."""

    native_uuid: str
    vendor: str
    model: str
    index: int
    numa_node: int = -1
    total_memory_bytes: int = 0
    max_tflops: float = 0.0
    pci_bus_id: str = ""
    compute_capability: str = ""
    sm_count: int = 0
    driver_version: str = ""
    healthy: bool = True
    health_message: str = ""
    capabilities: VirtualizationCapabilities = field(default_factory=VirtualizationCapabilities)
    extra_properties: tuple[tuple[str, str], ...] = ()
    device_nodes: tuple[str, ...] = ()
    topology: tuple[TopologyLink, ...] = ()
    """Paths to the node's other devices; empty when the backend does not know them."""
    parent_uuid: str = ""
    """Set on a partition (MIG) device only: its GPU's lowercase UUID."""

    @property
    def uuid(self) -> str:
        """Lowercase, as GPU objects are named; a partition keeps the driver's UUID as it is."""
        return self.native_uuid if self.parent_uuid else wire_uuid(self.native_uuid)

    def replace(self, **changes: Any) -> DeviceInfo:
        return dataclasses.replace(self, **changes)

    def properties(self) -> dict[str, str]:
        props = dict(self.extra_properties)
        for key, value in (("driverVersion", self.driver_version), ("computeCapability", self.compute_capability),
                           ("pciBusId", self.pci_bus_id),
                           ("totalComputeUnits", str(self.sm_count) if self.sm_count else ""),
                           ("healthMessage", self.health_message),
                           ("nativeUUID", self.native_uuid if self.native_uuid != self.uuid else "")):
            if value:
                props[key] = value
        return props

    def to_wire(self, isolation_mode: str = "", isolation_policy: str = "") -> DeviceWire:
        """The original's DeviceInfo JSON (Go field names)."""
        return {
            "UUID": self.uuid,
            "Vendor": self.vendor,
            "Model": self.model,
            "Index": self.index,
            "NUMANode": self.numa_node,
            "Topology": None,
            "TotalMemoryBytes": self.total_memory_bytes,
            "MaxTflops": self.max_tflops,
            "VirtualizationCapabilities": self.capabilities.to_wire(),
            "Properties": self.properties(),
            "Healthy": self.healthy,
            "ParentUUID": self.parent_uuid,
            "DeviceNode": {node: node for node in self.device_nodes},
            "DeviceEnv": {},
            "IsolationMode": isolation_mode,
            "IsolationPolicy": isolation_policy.capitalize() if isolation_policy else "",
        }

    @classmethod
    def from_wire(cls, raw: DeviceWire) -> DeviceInfo:
        """Inverse of `to_wire` (for devices.json); unknown properties are kept."""
        props = wire_map(raw.get("Properties"))
        known = {"driverVersion", "computeCapability", "pciBusId", "totalComputeUnits", "healthMessage",
                 "nativeUUID"}
        return cls(
            native_uuid=str(props.get("nativeUUID") or raw["UUID"]),
            vendor=str(raw.get("Vendor", "")), model=str(raw.get("Model", "")), index=int(raw.get("Index", 0)),
            numa_node=int(raw.get("NUMANode", -1)), total_memory_bytes=int(raw.get("TotalMemoryBytes", 0)),
            max_tflops=float(raw.get("MaxTflops", 0.0)), pci_bus_id=str(props.get("pciBusId", "")),
            compute_capability=str(props.get("computeCapability", "")),
            sm_count=int(props.get("totalComputeUnits") or 0), driver_version=str(props.get("driverVersion", "")),
            healthy=bool(raw.get("Healthy", True)), health_message=str(props.get("healthMessage", "")),
            capabilities=VirtualizationCapabilities.from_wire(raw.get("VirtualizationCapabilities")),
            extra_properties=tuple(sorted((k, str(v)) for k, v in props.items() if k not in known)),
            device_nodes=tuple(sorted(wire_map(raw.get("DeviceNode")).keys())),
            parent_uuid=str(raw.get("ParentUUID") or ""))


@dataclass(frozen=True)
class DeviceMetrics:
    """One sample of a device's load. PCIe throughput is bytes per second."""

    uuid: str
    utilization_percent: float = 0.0
    memory_used_bytes: int = 0
    power_watts: float = 0.0
    temperature_celsius: float = 0.0
    pcie_rx_bytes: int = 0
    pcie_tx_bytes: int = 0


@dataclass(frozen=True)
class GpuProcess:
    """A process using a device: host PID and what it holds."""

    pid: int
    device_uuid: str
    used_memory_bytes: int = 0
    compute_percent: float = 0.0
