"""GPUPool: a set of GPU nodes with shared capacity, isolation, QoS pricing and component images.

Why it exists: the pool spec is the largest part of the API (TensorFusionCluster embeds it as
each pool's template); it has its own module so the cluster module stays small.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, ClassVar, Literal, TypeAlias

import msgspec

from tfusion.api.kinds.base import (
    API_VERSION,
    I32,
    REQUIRED,
    Int32,
    Model,
    Percent,
    Quantity,
    RawExtension,
    constant,
)
from tfusion.api.kinds.common import GroupKindName, IsolationMode, QoSLevel
from tfusion.api.kinds.meta import Condition, LabelSelector, NodeSelector, ObjectMeta

__all__ = [
    "CapacityConfig", "ClientConfig", "ComponentConfig", "DefragConfig", "GPUOrCPUResourceUnit", "GPUPool",
    "GPUPoolSpec", "GPUPoolStatus", "GPUResourcePricingUnit", "HypervisorConfig", "IsolationModeRule",
    "MaintenanceWindow", "NodeCompaction", "NodeDiscoveryConfig", "NodeManagerConfig", "NodeProvisioner",
    "NodeRequirementKey", "NodeRollingUpdatePolicy", "Oversubscription", "PeriodicalBudget",
    "PoolComponentStatus",
    "PoolPhase", "ProvisioningMode", "ProvisioningPhase", "QosConfig", "QosDefinition", "QosPricing",
    "Requirement", "Taint", "WorkerConfig",
]

ProvisioningMode: TypeAlias = Literal["Provisioned", "AutoSelect", "Karpenter"]
PoolPhase: TypeAlias = Literal["Pending", "Running", "Updating", "Destroying", "Unknown"]
ProvisioningPhase: TypeAlias = Literal["None", "Initializing", "Provisioning", "Completed"]
NodeRequirementKey: TypeAlias = Literal[
    "node.kubernetes.io/instance-type", "kubernetes.io/arch", "kubernetes.io/os",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone", "karpenter.sh/capacity-type", "tensor-fusion.ai/gpu-vendor",
    "tensor-fusion.ai/gpu-instance-family", "tensor-fusion.ai/gpu-instance-size",
]


class GPUOrCPUResourceUnit(Model):
    tflops: Quantity | None = None
    vram: Quantity | None = None
    cpu: Quantity | None = None
    memory: Quantity | None = None


class Oversubscription(Model):
    """Virtual capacity: host RAM/disk added to VRAM (percent) and the TFLOPs oversell ratio (percent)."""

    vram_expand_to_host_mem: Percent = msgspec.field(default=50, name="vramExpandToHostMem")
    vram_expand_to_host_disk: Percent = msgspec.field(default=70, name="vramExpandToHostDisk")
    tflops_oversell_ratio: Annotated[int, msgspec.Meta(ge=100, le=100000, extra=I32)] = msgspec.field(
        default=500, name="tflopsOversellRatio")


class CapacityConfig(Model):
    min_resources: GPUOrCPUResourceUnit | None = None
    max_resources: GPUOrCPUResourceUnit | None = None
    warm_resources: GPUOrCPUResourceUnit | None = None
    oversubscription: Oversubscription | None = None


class IsolationModeRule(Model):
    """Nodes matching `selector` get `mode`; the first matching rule wins."""

    mode: IsolationMode
    selector: LabelSelector | None = None


class Requirement(Model):
    key: NodeRequirementKey | None = None
    operator: Literal["In", "Exists", "DoesNotExist", "Gt", "Lt"] = "In"
    values: list[str] = msgspec.field(default_factory=list)


class Taint(Model):
    effect: Literal["NoSchedule", "NoExecute", "PreferNoSchedule"] = "NoSchedule"
    key: str = ""
    value: str = ""


class PeriodicalBudget(Model):
    """Spending limits in dollars for provisioned nodes."""

    budget_per_day: str = "100"
    budget_per_month: str = "1000"
    budget_per_quarter: str = "3000"
    budget_exceed_strategy: Literal["AlertOnly", "AlertAndTerminateVM"] = "AlertOnly"


class NodeProvisioner(Model):
    node_class: str = ""
    karpenter_node_class_ref: GroupKindName | None = None
    gpu_requirements: list[Requirement] = msgspec.field(default_factory=list, name="gpuRequirements")
    gpu_taints: list[Taint] = msgspec.field(default_factory=list, name="gpuTaints")
    gpu_node_labels: dict[str, str] = msgspec.field(default_factory=dict, name="gpuNodeLabels")
    cpu_requirements: list[Requirement] = msgspec.field(default_factory=list, name="cpuRequirements")
    cpu_taints: list[Taint] = msgspec.field(default_factory=list, name="cpuTaints")
    cpu_node_labels: dict[str, str] = msgspec.field(default_factory=dict, name="cpuNodeLabels")
    gpu_node_annotations: dict[str, str] = msgspec.field(default_factory=dict, name="gpuNodeAnnotations")
    budget: PeriodicalBudget | None = None


class DefragConfig(Model):
    """Scheduled defragmentation: evict small workloads from lightly used nodes."""

    timezone: str
    enabled: bool = False
    schedule: str = "0 3 * * *"
    max_duration: str = "2h"
    utilization_threshold_percent: Percent = 40
    evicted_pod_marker_ttl: str = msgspec.field(default="never", name="evictedPodMarkerTTL")
    source_node_marker_ttl: str = msgspec.field(default="30m", name="sourceNodeMarkerTTL")


class NodeCompaction(Model):
    period: str = "5m"
    defrag: DefragConfig | None = None


class MaintenanceWindow(Model):
    includes: list[str] = msgspec.field(default_factory=list)


class NodeRollingUpdatePolicy(Model):
    auto_update_hypervisor: bool = False
    auto_update_worker: bool = False
    auto_update_client: bool = False
    batch_percentage: Percent = 100
    batch_interval: str = "1s"
    max_duration: str = "10m"
    maintenance_window: MaintenanceWindow | None = None


class NodeManagerConfig(Model):
    provisioning_mode: ProvisioningMode = "AutoSelect"
    default_isolation_mode: IsolationMode = "soft"
    isolation_mode_rules: list[IsolationModeRule] = msgspec.field(default_factory=list)
    default_vendor: str = "NVIDIA"
    node_provisioner: NodeProvisioner | None = None
    node_selector: NodeSelector | None = None
    multi_vendor_node_selector: dict[str, NodeSelector] = msgspec.field(default_factory=dict)
    node_compaction: NodeCompaction | None = None
    node_pool_rolling_update_policy: NodeRollingUpdatePolicy | None = None


class QosDefinition(Model):
    name: QoSLevel | None = None
    description: str = ""
    priority: int = 0


class GPUResourcePricingUnit(Model):
    """Hourly prices, as "$<amount>" strings."""

    per_fp16_tflops_per_hour: str = msgspec.field(default="$0.0069228", name="perFP16TFlopsPerHour")
    per_gb_of_vram_per_hour: str = msgspec.field(default="$0.01548", name="perGBOfVRAMPerHour")


class QosPricing(Model):
    qos: QoSLevel | None = None
    requests: GPUResourcePricingUnit = msgspec.field(default_factory=GPUResourcePricingUnit)
    limits_over_requests: str = "1"


class QosConfig(Model):
    definitions: list[QosDefinition] = msgspec.field(default_factory=list)
    default_qos: QoSLevel | None = msgspec.field(default=None, name="defaultQoS")
    pricing: list[QosPricing] = msgspec.field(default_factory=list)
    eviction_protection_price_ratio: str = "1.2"


class WorkerConfig(Model):
    image: str = ""
    pod_template: RawExtension | None = None


class HypervisorConfig(Model):
    image: str = ""
    vector_image: str = ""
    port_number: Annotated[int, msgspec.Meta(ge=0, le=65535, extra=I32)] = 8000
    pod_template: RawExtension | None = None
    enable_vector: bool = False


class NodeDiscoveryConfig(Model):
    image: str = ""
    pod_template: RawExtension | None = None


class ClientConfig(Model):
    image: str = ""
    remote_mode_image: str = ""
    embedded_mode_image: str = ""
    operator_endpoint: str = ""
    patch_to_pod: RawExtension | None = None
    patch_to_container: RawExtension | None = None
    patch_to_embedded_worker_container: RawExtension | None = None
    patch_embedded_worker_to_pod: RawExtension | None = None


class ComponentConfig(Model):
    worker: WorkerConfig | None = None
    hypervisor: HypervisorConfig | None = None
    node_discovery: NodeDiscoveryConfig | None = None
    client: ClientConfig | None = None


class GPUPoolSpec(Model):
    node_manager_config: NodeManagerConfig
    default_using_local_gpu: bool | None = msgspec.field(default=None, name="defaultUsingLocalGPU")
    capacity_config: CapacityConfig | None = None
    qos_config: QosConfig | None = None
    component_config: ComponentConfig | None = None
    scheduling_config_template: str | None = None


class PoolComponentStatus(Model):
    worker: str = ""
    worker_config_synced: bool = False
    worker_update_progress: Int32 = 0
    hypervisor: str = ""
    hypervisor_config_synced: bool = False
    hypervisor_update_progress: Int32 = 0
    client: str = ""
    client_config_synced: bool = False
    client_update_progress: Int32 = 0


class GPUPoolStatus(Model):
    ready_nodes: Int32
    not_ready_nodes: Int32
    total_tflops: Quantity = msgspec.field(name="totalTFlops")
    total_vram: Quantity = msgspec.field(name="totalVRAM")
    available_tflops: Quantity = msgspec.field(name="availableTFlops")
    available_vram: Quantity = msgspec.field(name="availableVRAM")
    phase: Annotated[PoolPhase, REQUIRED] = "Pending"
    component_status: Annotated[PoolComponentStatus, REQUIRED] = msgspec.field(
        default_factory=PoolComponentStatus)
    cluster: str = ""
    conditions: list[Condition] = msgspec.field(default_factory=list)
    total_nodes: Int32 = 0
    total_gpus: Int32 = msgspec.field(default=0, name="totalGPUs")
    virtual_tflops: Quantity | None = msgspec.field(default=None, name="virtualTFlops")
    virtual_vram: Quantity | None = msgspec.field(default=None, name="virtualVRAM")
    virtual_available_tflops: Quantity | None = msgspec.field(default=None, name="virtualAvailableTFlops")
    virtual_available_vram: Quantity | None = msgspec.field(default=None, name="virtualAvailableVRAM")
    running_apps_cnt: Int32 = 0
    saved_costs_per_month: str = ""
    potential_savings_per_month: str = ""
    budget_exceeded: str = ""
    provisioning_phase: ProvisioningPhase = "None"
    last_compaction_time: datetime | None = None
    last_defrag_time: datetime | None = None


class GPUPool(Model):
    KIND: ClassVar[str] = "GPUPool"
    api_version: str = msgspec.field(default_factory=constant(API_VERSION))
    kind: str = msgspec.field(default_factory=constant("GPUPool"))
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: GPUPoolSpec | None = None
    status: GPUPoolStatus | None = None
