"""TensorFusionWorkload, WorkloadProfile and TensorFusionConnection: what apps ask for.

Why it exists: a workload (created by the webhook for each app, or by hand) carries the GPU
request of its pods; a profile is a reusable base spec of the same shape; a connection links a
remote-mode client pod to the worker that serves it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, ClassVar, Literal, TypeAlias

import msgspec

from tfusion.api.kinds.base import API_VERSION, I32, Int32, Model, RawExtension, constant
from tfusion.api.kinds.common import AutoScalingConfig, CronScalingRule, IsolationMode, QoSLevel, Resources
from tfusion.api.kinds.meta import Condition, NodeAffinity, ObjectMeta

__all__ = [
    "GangPhase", "GangSchedulingConfig", "GangStatus", "TensorFusionConnection", "TensorFusionConnectionSpec",
    "TensorFusionConnectionStatus", "TensorFusionWorkload", "TensorFusionWorkloadStatus", "WorkerPhase",
    "WorkloadPhase", "WorkloadProfile", "WorkloadProfileSpec", "WorkloadProfileStatus",
]

WorkerPhase: TypeAlias = Literal["Pending", "Running", "Failed"]
WorkloadPhase: TypeAlias = Literal["Pending", "Running", "Failed", "Unknown"]
GangPhase: TypeAlias = Literal["Pending", "Waiting", "Scheduling", "Running", "TimedOut", "Failed"]

#: the cross-field rule of `.spec` (the same check `WorkloadProfileSpec.__post_init__` makes)
_SPEC_RULES = msgspec.Meta(extra_json_schema={"x-kubernetes-validations": [
    {"rule": "!has(self.gangScheduling) || self.gangScheduling.minMembers == 0 || !has(self.replicas) || "
             "self.gangScheduling.minMembers <= self.replicas",
     "message": "gangScheduling.minMembers must not exceed replicas"}]})

_GANG_RULES = msgspec.Meta(extra_json_schema={"x-kubernetes-validations": [
    {"rule": "self.minMembers == 0 || self.minMembers >= 2",
     "message": "minMembers must be 0 (all replicas) or at least 2"}]})


class GangSchedulingConfig(Model):
    """All-or-nothing scheduling of a workload's pods."""

    min_members: Annotated[int, msgspec.Meta(ge=0, extra=I32)] = 0
    """Pods that must be placeable together before any is placed; 0 (the default) means all replicas, otherwise at
    least 2 and at most replicas."""
    timeout: str | None = None
    """How long to wait for the whole gang, a Go duration such as 5m; wait forever when unset or 0s."""
    mode: Literal["Strict"] = "Strict"
    """What happens when the gang cannot be placed; only Strict. Default Strict."""

    def __post_init__(self) -> None:
        if self.min_members == 1:
            raise ValueError("minMembers must be 0 (all replicas) or at least 2, got 1")


class WorkloadProfileSpec(Model):
    """The GPU request of a workload; shared by TensorFusionWorkload and WorkloadProfile."""

    replicas: Int32 | None = None
    """Number of workers (remote mode) or pods; the webhook sets it from the owning Deployment."""
    pool_name: str = ""
    """GPUPool to allocate from; the default pool when empty."""
    resources: Resources | None = None
    """Compute (TFLOPS or percent) and VRAM per GPU: requests are reserved, limits are enforced."""
    qos: QoSLevel | None = None
    """Priority class of the workload: low, medium, high or critical; the pool's default when unset."""
    is_local_gpu: bool = msgspec.field(default=False, name="isLocalGPU")
    """Use a GPU on the pod's own node (local mode) instead of a remote worker. Default false."""
    sidecar_worker: bool = False
    """In local mode, run the worker as a sidecar in the application pod. Default false."""
    isolation: IsolationMode = "soft"
    """How the GPU is shared: shared (no limits), soft (limits enforced by time slicing), hard (limits enforced by
    the driver) or partitioned (a hardware partition). Default soft."""
    partition_template_id: str = msgspec.field(default="", name="partitionTemplateId")
    """For partitioned isolation, the ProviderConfig virtualizationTemplates ID to use."""
    gpu_model: str = msgspec.field(default="", name="gpuModel")
    """Only use GPUs of this model (for example A100)."""
    gpu_count: Annotated[int, msgspec.Meta(ge=1, le=128, extra=I32)] | None = msgspec.field(
        default=None, name="gpuCount")
    """GPUs per worker, 1 to 128. Default 1."""
    gpu_indices: list[Int32] = msgspec.field(default_factory=list, name="gpuIndices")
    """Only use GPUs with these device indices on the node."""
    vendor: str = ""
    """Only use GPUs of this vendor (for example NVIDIA)."""
    auto_scaling_config: AutoScalingConfig | None = None
    """Automatic changes to requests and limits."""
    node_affinity: NodeAffinity | None = None
    """Restricts the nodes (and so the GPUs) workers may use."""
    worker_pod_template: RawExtension | None = None
    """Pod template merged into worker pods (remote mode only)."""
    gang_scheduling: Annotated[GangSchedulingConfig, _GANG_RULES] | None = None
    """Place the workload's pods all together or not at all; normal scheduling when omitted."""

    def __post_init__(self) -> None:
        gang = self.gang_scheduling
        if gang is None or gang.min_members == 0 or self.replicas is None:
            return
        if gang.min_members > self.replicas:
            raise ValueError(
                f"gangScheduling.minMembers ({gang.min_members}) must not exceed replicas ({self.replicas})")


class GangStatus(Model):
    phase: GangPhase = "Pending"
    """Gang progress: Pending, Waiting, Scheduling, Running, TimedOut or Failed. Default Pending."""
    group_key: str = ""
    """Gang identity, <namespace>/<workload>."""
    desired_members: Int32 = 0
    """Pods the gang needs."""
    waiting_members: Int32 = 0
    """Pods waiting for the rest of the gang."""
    scheduled_members: Int32 = 0
    """Pods given GPUs."""
    ready_members: Int32 = 0
    """Pods running and ready."""
    last_transition_time: datetime | None = None
    """When the gang phase last changed (RFC 3339 time)."""
    reason: str = ""
    """Machine-readable reason of the phase."""
    message: str = ""
    """Human-readable details of the phase."""
    backoff_until: str = ""
    """RFC 3339 time before which the gang is not retried."""


class TensorFusionWorkloadStatus(Model):
    worker_count: Int32
    """Workers that exist."""
    phase: WorkloadPhase = "Pending"
    """Workload phase: Pending, Running, Failed or Unknown. Default Pending."""
    conditions: list[Condition] = msgspec.field(default_factory=list)
    """Latest observations of the workload's state."""
    ready_workers: Int32 = 0
    """Workers that are ready."""
    pod_template_hash: str = ""
    """Hash of the worker pod template in effect."""
    recommendation: Resources | None = None
    """Requests and limits the autoscaler recommends."""
    applied_recommended_replicas: Int32 = 0
    """Workers already running with the recommendation."""
    active_cron_scaling_rule: CronScalingRule | None = None
    """The cron rule in effect now, if any."""
    gang: GangStatus | None = None
    """Gang scheduling progress, when gangScheduling is set."""


class TensorFusionWorkload(Model):
    KIND: ClassVar[str] = "TensorFusionWorkload"
    api_version: str = msgspec.field(default_factory=constant(API_VERSION))
    kind: str = msgspec.field(default_factory=constant("TensorFusionWorkload"))
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: Annotated[WorkloadProfileSpec, _SPEC_RULES] = msgspec.field(default_factory=WorkloadProfileSpec)
    """The GPU request; written by a user or by the webhook from pod annotations."""
    status: TensorFusionWorkloadStatus | None = None
    """Worker state; written by the controller."""


class WorkloadProfileStatus(Model):
    """Empty: a profile has no observed state."""


class WorkloadProfile(Model):
    KIND: ClassVar[str] = "WorkloadProfile"
    api_version: str = msgspec.field(default_factory=constant(API_VERSION))
    kind: str = msgspec.field(default_factory=constant("WorkloadProfile"))
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: Annotated[WorkloadProfileSpec, _SPEC_RULES] = msgspec.field(default_factory=WorkloadProfileSpec)
    """Reusable defaults for workloads that name this profile; written by a user or administrator."""
    status: WorkloadProfileStatus = msgspec.field(default_factory=WorkloadProfileStatus)
    """Empty; a profile has no observed state."""


class TensorFusionConnectionSpec(Model):
    workload_name: str
    """The TensorFusionWorkload whose worker serves the client."""
    client_pod: str
    """Name of the client pod."""


class TensorFusionConnectionStatus(Model):
    phase: str
    """Connection phase, for example Pending, Running or Failed."""
    connection_url: str = msgspec.field(name="connectionURL")
    """Address the client uses to reach its worker."""
    worker_name: str
    """Name of the worker serving the client."""


class TensorFusionConnection(Model):
    KIND: ClassVar[str] = "TensorFusionConnection"
    api_version: str = msgspec.field(default_factory=constant(API_VERSION))
    kind: str = msgspec.field(default_factory=constant("TensorFusionConnection"))
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: TensorFusionConnectionSpec | None = None
    """Which workload and client pod are linked; written by the controller."""
    status: TensorFusionConnectionStatus | None = None
    """The worker assigned and how to reach it; written by the controller."""
