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
    DEFAULT_EMPTY,
    DEFAULT_FALSE,
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
    """GPU compute in TFLOPS, a Kubernetes quantity such as 2000."""
    vram: Quantity | None = None
    """GPU memory in bytes, a Kubernetes quantity such as 2Ti."""
    cpu: Quantity | None = None
    """CPU cores, a Kubernetes quantity such as 64 or 500m."""
    memory: Quantity | None = None
    """Host memory in bytes, a Kubernetes quantity such as 256Gi."""


class Oversubscription(Model):
    """Virtual capacity: host RAM/disk added to VRAM (percent) and the TFLOPs oversell ratio (percent)."""

    vram_expand_to_host_mem: Percent = msgspec.field(default=50, name="vramExpandToHostMem")
    """Percent of the GPU memory that may spill into host RAM. Default 50."""
    vram_expand_to_host_disk: Percent = msgspec.field(default=70, name="vramExpandToHostDisk")
    """Percent of the GPU memory that may spill to host disk. Default 70."""
    tflops_oversell_ratio: Annotated[int, msgspec.Meta(ge=100, le=100000, extra=I32)] = msgspec.field(
        default=500, name="tflopsOversellRatio")
    """Compute that may be reserved as a percent of the physical compute (100 means no overselling, 500 means 5x).
    Default 500, 100 to 100000."""


class CapacityConfig(Model):
    min_resources: GPUOrCPUResourceUnit | None = None
    """Capacity the pool keeps at least (provisioned pools add nodes to reach it)."""
    max_resources: GPUOrCPUResourceUnit | None = None
    """Capacity the pool never exceeds (provisioned pools stop adding nodes)."""
    warm_resources: GPUOrCPUResourceUnit | None = None
    """Idle capacity kept ready for new workloads (provisioned pools)."""
    oversubscription: Oversubscription | None = None
    """How far compute and memory may be reserved beyond the hardware."""


class IsolationModeRule(Model):
    """Nodes matching `selector` get `mode`; the first matching rule wins."""

    mode: IsolationMode
    """Isolation the matching nodes' GPUs get: shared, soft, hard or partitioned."""
    selector: LabelSelector
    """Nodes (by label) this rule applies to."""


class Requirement(Model):
    key: NodeRequirementKey | None = None
    """Node property: one of the well-known instance-type, arch, os, region, zone, capacity-type or tensor-fusion.ai
    GPU labels."""
    operator: Literal["In", "Exists", "DoesNotExist", "Gt", "Lt"] = "In"
    """How values are matched: In, Exists, DoesNotExist, Gt or Lt. Default In."""
    values: list[str] = msgspec.field(default_factory=list)
    """Values the key is compared against."""


class Taint(Model):
    effect: Literal["NoSchedule", "NoExecute", "PreferNoSchedule"] = "NoSchedule"
    """Taint effect: NoSchedule, NoExecute or PreferNoSchedule. Default NoSchedule."""
    key: str = ""
    """Taint key."""
    value: str = ""
    """Taint value."""


class PeriodicalBudget(Model):
    """Spending limits in dollars for provisioned nodes."""

    budget_per_day: str = "100"
    """Spend limit per day in dollars, a decimal string. Default "100"."""
    budget_per_month: str = "1000"
    """Spend limit per month in dollars, a decimal string. Default "1000"."""
    budget_per_quarter: str = "3000"
    """Spend limit per quarter in dollars, a decimal string. Default "3000"."""
    budget_exceed_strategy: Literal["AlertOnly", "AlertAndTerminateVM"] = "AlertOnly"
    """What happens when a budget is exceeded: AlertOnly or AlertAndTerminateVM. Default AlertOnly."""


class NodeProvisioner(Model):
    node_class: str = ""
    """Name of the GPUNodeClass used to launch VMs."""
    karpenter_node_class_ref: GroupKindName | None = None
    """The Karpenter node class used in Karpenter mode."""
    gpu_requirements: list[Requirement] = msgspec.field(default_factory=list, name="gpuRequirements")
    """Constraints on the GPU VMs to create (instance type, zone, capacity type, GPU vendor, …)."""
    gpu_taints: list[Taint] = msgspec.field(default_factory=list, name="gpuTaints")
    """Taints put on created GPU nodes."""
    gpu_node_labels: dict[str, str] = msgspec.field(default_factory=dict, name="gpuNodeLabels")
    """Labels put on created GPU nodes."""
    cpu_requirements: list[Requirement] = msgspec.field(default_factory=list, name="cpuRequirements")
    """Constraints on CPU-only VMs (for remote-mode clients)."""
    cpu_taints: list[Taint] = msgspec.field(default_factory=list, name="cpuTaints")
    """Taints put on created CPU nodes."""
    cpu_node_labels: dict[str, str] = msgspec.field(default_factory=dict, name="cpuNodeLabels")
    """Labels put on created CPU nodes."""
    gpu_node_annotations: dict[str, str] = msgspec.field(default_factory=dict, name="gpuNodeAnnotations")
    """Annotations put on created GPU nodes."""
    budget: PeriodicalBudget | None = None
    """Spending limits for the VMs this pool creates."""


class DefragConfig(Model):
    """Scheduled defragmentation: evict small workloads from lightly used nodes."""

    timezone: Annotated[str, msgspec.Meta(min_length=1)]
    """IANA time zone the schedule is read in (for example Asia/Shanghai); required, not empty."""
    enabled: Annotated[bool, DEFAULT_FALSE] = False
    """Run scheduled defragmentation. Default false."""
    schedule: Annotated[str, msgspec.Meta(pattern="^[^=]+$")] = "0 3 * * *"
    """Cron expression of when defragmentation starts; must not contain "=". Default "0 3 * * *"."""
    max_duration: str = "2h"
    """Longest time one defragmentation run may take, a Go duration. Default 2h."""
    utilization_threshold_percent: Percent = 40
    """Nodes below this GPU allocation percent are emptied. Default 40."""
    evicted_pod_marker_ttl: str = msgspec.field(default="never", name="evictedPodMarkerTTL")
    """How long evicted pods stay marked, a Go duration or "never". Default never."""
    source_node_marker_ttl: str = msgspec.field(default="30m", name="sourceNodeMarkerTTL")
    """How long an emptied node stays marked as a defrag source, a Go duration. Default 30m."""


class NodeCompaction(Model):
    period: str = "5m"
    """How often idle nodes are looked for and released, a Go duration. Default 5m."""
    defrag: DefragConfig | None = None
    """Scheduled moving of small workloads off lightly used nodes."""


class MaintenanceWindow(Model):
    includes: list[str] = msgspec.field(default_factory=list)
    """Cron expressions of the windows in which rolling updates may run."""


class NodeRollingUpdatePolicy(Model):
    auto_update_hypervisor: bool = False
    """Roll out a new hypervisor image to running nodes automatically. Default false."""
    auto_update_worker: bool = False
    """Roll out a new worker image automatically. Default false."""
    auto_update_client: bool = False
    """Roll out a new client image automatically. Default false."""
    batch_percentage: Percent = 100
    """Percent of nodes updated per batch, 0 to 100. Default 100."""
    batch_interval: str = "1s"
    """Pause between batches, a Go duration. Default 1s."""
    max_duration: str = "10m"
    """Longest time a whole rollout may take, a Go duration. Default 10m."""
    maintenance_window: MaintenanceWindow | None = None
    """When rollouts are allowed; any time when empty."""


class NodeManagerConfig(Model):
    provisioning_mode: ProvisioningMode = "AutoSelect"
    """Where nodes come from: AutoSelect (existing nodes matching nodeSelector), Provisioned (TensorFusion creates
    VMs) or Karpenter. Default AutoSelect."""
    default_isolation_mode: IsolationMode = "soft"
    """Isolation of GPUs no rule matches: shared, soft, hard or partitioned. Default soft."""
    isolation_mode_rules: list[IsolationModeRule] = msgspec.field(default_factory=list)
    """Per-node isolation; the first rule whose selector matches wins."""
    default_vendor: str = "NVIDIA"
    """GPU vendor assumed when a node does not say. Default NVIDIA."""
    node_provisioner: NodeProvisioner | None = None
    """How VMs are created in Provisioned or Karpenter mode."""
    node_selector: NodeSelector | None = None
    """Which existing nodes join the pool in AutoSelect mode."""
    multi_vendor_node_selector: dict[str, NodeSelector] = msgspec.field(default_factory=dict)
    """Per-vendor node selectors (key: vendor such as NVIDIA or AMD) for mixed pools."""
    node_compaction: NodeCompaction | None = None
    """Release idle nodes and defragment the pool."""
    node_pool_rolling_update_policy: NodeRollingUpdatePolicy | None = None
    """How component upgrades roll across the pool's nodes."""


class QosDefinition(Model):
    name: QoSLevel | None = None
    """QoS level being described: low, medium, high or critical."""
    description: str = ""
    """Free text explaining the level to users."""
    priority: int = 0
    """Relative priority; higher wins when GPUs are contended."""


class GPUResourcePricingUnit(Model):
    """Hourly prices, as "$<amount>" strings."""

    per_fp16_tflops_per_hour: str = msgspec.field(default="$0.0069228", name="perFP16TFlopsPerHour")
    """Price of one FP16 TFLOPS for one hour, a dollar string. Default "$0.0069228"."""
    per_gb_of_vram_per_hour: str = msgspec.field(default="$0.01548", name="perGBOfVRAMPerHour")
    """Price of one GB of VRAM for one hour, a dollar string. Default "$0.01548"."""


class QosPricing(Model):
    qos: QoSLevel | None = None
    """QoS level this price applies to."""
    requests: GPUResourcePricingUnit = msgspec.field(default_factory=GPUResourcePricingUnit)
    """Hourly prices of requested compute and memory."""
    limits_over_requests: str = "1"
    """Price multiplier for the part of the limits above the requests, a decimal string. Default "1"."""


class QosConfig(Model):
    definitions: list[QosDefinition] = msgspec.field(default_factory=list)
    """The QoS levels offered by this pool."""
    default_qos: QoSLevel | None = msgspec.field(default=None, name="defaultQoS")
    """QoS of workloads that do not ask for one."""
    pricing: list[QosPricing] = msgspec.field(default_factory=list)
    """Prices per QoS level, used for cost reports."""
    eviction_protection_price_ratio: str = "1.2"
    """Price multiplier for workloads protected from eviction, a decimal string. Default "1.2"."""


class WorkerConfig(Model):
    image: str = ""
    """Container image of remote vGPU workers."""
    pod_template: RawExtension | None = None
    """Pod template merged into every worker pod."""


class HypervisorConfig(Model):
    image: str = ""
    """Container image of the per-node hypervisor."""
    vector_image: str = ""
    """Container image of the metrics/log shipping sidecar."""
    port_number: Annotated[int, msgspec.Meta(ge=0, le=65535, extra=I32)] = 8000
    """Port the hypervisor's HTTP API listens on. Default 8000."""
    pod_template: RawExtension | None = None
    """Pod template merged into the hypervisor pod."""
    enable_vector: bool = False
    """Run the metrics/log shipping sidecar. Default false."""


class NodeDiscoveryConfig(Model):
    image: str = ""
    """Container image of the job that discovers a node's GPUs."""
    pod_template: RawExtension | None = None
    """Pod template merged into the discovery pod."""


class ClientConfig(Model):
    image: str = ""
    """Default image of the client injected into application pods."""
    remote_mode_image: str = ""
    """Client image for remote vGPU mode."""
    embedded_mode_image: str = ""
    """Client image for local (embedded worker) mode."""
    operator_endpoint: str = ""
    """URL through which clients reach the controller."""
    patch_to_pod: RawExtension | None = None
    """Strategic merge patch applied to application pods."""
    patch_to_container: RawExtension | None = None
    """Strategic merge patch applied to the application containers."""
    patch_to_embedded_worker_container: RawExtension | None = None
    """Patch applied to the embedded worker container in local mode."""
    patch_embedded_worker_to_pod: RawExtension | None = None
    """Patch that adds the embedded worker to the application pod in local mode."""


class ComponentConfig(Model):
    worker: WorkerConfig | None = None
    """Remote worker settings."""
    hypervisor: HypervisorConfig | None = None
    """Per-node hypervisor settings."""
    node_discovery: NodeDiscoveryConfig | None = None
    """GPU discovery job settings."""
    client: ClientConfig | None = None
    """Settings of the client injected into application pods."""


class GPUPoolSpec(Model):
    node_manager_config: NodeManagerConfig
    """How nodes join the pool, their isolation, compaction and upgrades."""
    default_using_local_gpu: bool | None = msgspec.field(default=None, name="defaultUsingLocalGPU")
    """Whether workloads in this pool use a local GPU (not a remote worker) unless they say otherwise."""
    capacity_config: CapacityConfig | None = None
    """Capacity bounds, warm capacity and oversubscription."""
    qos_config: QosConfig | None = None
    """QoS levels and their prices."""
    component_config: ComponentConfig | None = None
    """Images and pod templates of the hypervisor, workers, clients and discovery."""
    scheduling_config_template: str | None = None
    """Name of the SchedulingConfigTemplate (placement strategy) the pool uses."""


class PoolComponentStatus(Model):
    worker: str = ""
    """Version (image hash) of the worker configuration in effect."""
    worker_config_synced: bool = False
    """Whether every worker runs the current configuration."""
    worker_update_progress: Int32 = 0
    """Percent of workers already updated, 0 to 100."""
    hypervisor: str = ""
    """Version (image hash) of the hypervisor configuration in effect."""
    hypervisor_config_synced: bool = False
    """Whether every node's hypervisor runs the current configuration."""
    hypervisor_update_progress: Int32 = 0
    """Percent of hypervisors already updated, 0 to 100."""
    client: str = ""
    """Version (image hash) of the client configuration in effect."""
    client_config_synced: bool = False
    """Whether every client runs the current configuration."""
    client_update_progress: Int32 = 0
    """Percent of clients already updated, 0 to 100."""


class GPUPoolStatus(Model):
    ready_nodes: Int32
    """Number of nodes in the Running phase."""
    not_ready_nodes: Int32
    """Number of nodes in any other phase."""
    total_tflops: Quantity = msgspec.field(name="totalTFlops")
    """Physical compute of the pool in TFLOPS, a Kubernetes quantity."""
    total_vram: Quantity = msgspec.field(name="totalVRAM")
    """Physical GPU memory of the pool in bytes, a Kubernetes quantity."""
    available_tflops: Quantity = msgspec.field(name="availableTFlops")
    """Compute not yet reserved in TFLOPS, a Kubernetes quantity."""
    available_vram: Quantity = msgspec.field(name="availableVRAM")
    """GPU memory not yet reserved in bytes, a Kubernetes quantity."""
    virtual_tflops: Quantity = msgspec.field(name="virtualTFlops")
    """Compute after oversubscription in TFLOPS, a Kubernetes quantity."""
    virtual_vram: Quantity = msgspec.field(name="virtualVRAM")
    """Memory after expansion into host RAM and disk, bytes as a Kubernetes quantity."""
    phase: Annotated[PoolPhase, REQUIRED] = "Pending"
    """Pool phase: Pending, Running, Updating, Destroying or Unknown. Default Pending."""
    component_status: Annotated[PoolComponentStatus, REQUIRED] = msgspec.field(
        default_factory=PoolComponentStatus)
    """Rollout state of the pool's components."""
    cluster: str = ""
    """Name of the TensorFusionCluster the pool belongs to."""
    conditions: list[Condition] = msgspec.field(default_factory=list)
    """Latest observations of the pool's state."""
    total_nodes: Int32 = 0
    """Number of nodes in the pool."""
    total_gpus: Int32 = msgspec.field(default=0, name="totalGPUs")
    """Number of GPUs in the pool."""
    virtual_available_tflops: Quantity | None = msgspec.field(default=None, name="virtualAvailableTFlops")
    """Oversubscribed compute not yet reserved, a Kubernetes quantity."""
    virtual_available_vram: Quantity | None = msgspec.field(default=None, name="virtualAvailableVRAM")
    """Expanded memory not yet reserved, bytes as a Kubernetes quantity."""
    running_apps_cnt: Int32 = 0
    """Number of workloads running in the pool."""
    saved_costs_per_month: str = ""
    """Estimated monthly saving from sharing GPUs, a dollar string."""
    potential_savings_per_month: str = ""
    """Estimated further monthly saving, a dollar string."""
    budget_exceeded: Annotated[str, DEFAULT_EMPTY] = ""
    """Which budget (day, month, quarter) was exceeded; empty when none."""
    provisioning_phase: ProvisioningPhase = "None"
    """Progress of node provisioning: None, Initializing, Provisioning or Completed. Default None."""
    last_compaction_time: datetime | None = None
    """When idle nodes were last compacted (RFC 3339 time)."""
    last_defrag_time: datetime | None = None
    """When the pool was last defragmented (RFC 3339 time)."""


class GPUPool(Model):
    KIND: ClassVar[str] = "GPUPool"
    api_version: str = msgspec.field(default_factory=constant(API_VERSION))
    kind: str = msgspec.field(default_factory=constant("GPUPool"))
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: GPUPoolSpec | None = None
    """Desired configuration of the pool, written by an administrator or generated from a TensorFusionCluster."""
    status: GPUPoolStatus | None = None
    """Capacity and state of the pool; written by the controller."""
