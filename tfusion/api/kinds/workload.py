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

_GANG_RULES = msgspec.Meta(extra_json_schema={"x-kubernetes-validations": [
    {"rule": "self.minMembers == 0 || self.minMembers >= 2",
     "message": "minMembers must be 0 (all replicas) or at least 2"}]})


class GangSchedulingConfig(Model):
    """All-or-nothing scheduling of a workload's pods."""

    min_members: Annotated[int, msgspec.Meta(ge=0, extra=I32)] = 0
    timeout: str | None = None
    mode: Literal["Strict"] = "Strict"

    def __post_init__(self) -> None:
        if self.min_members == 1:
            raise ValueError("minMembers must be 0 (all replicas) or at least 2, got 1")


class WorkloadProfileSpec(Model):
    """The GPU request of a workload; shared by TensorFusionWorkload and WorkloadProfile."""

    replicas: Int32 | None = None
    pool_name: str = ""
    resources: Resources | None = None
    qos: QoSLevel | None = None
    is_local_gpu: bool = msgspec.field(default=False, name="isLocalGPU")
    sidecar_worker: bool = False
    isolation: IsolationMode = "soft"
    partition_template_id: str = msgspec.field(default="", name="partitionTemplateId")
    gpu_model: str = msgspec.field(default="", name="gpuModel")
    gpu_count: Annotated[int, msgspec.Meta(ge=1, le=128, extra=I32)] | None = msgspec.field(
        default=None, name="gpuCount")
    gpu_indices: list[Int32] = msgspec.field(default_factory=list, name="gpuIndices")
    vendor: str = ""
    auto_scaling_config: AutoScalingConfig | None = None
    node_affinity: NodeAffinity | None = None
    worker_pod_template: RawExtension | None = None
    gang_scheduling: Annotated[GangSchedulingConfig, _GANG_RULES] | None = None

    def __post_init__(self) -> None:
        gang = self.gang_scheduling
        if gang is not None and self.replicas is not None and gang.min_members > self.replicas:
            raise ValueError(
                f"gangScheduling.minMembers ({gang.min_members}) must not exceed replicas ({self.replicas})")


class GangStatus(Model):
    phase: GangPhase | None = None
    group_key: str = ""
    desired_members: Int32 = 0
    waiting_members: Int32 = 0
    scheduled_members: Int32 = 0
    ready_members: Int32 = 0
    last_transition_time: datetime | None = None
    reason: str = ""
    message: str = ""
    backoff_until: datetime | None = None


class TensorFusionWorkloadStatus(Model):
    worker_count: Int32
    phase: WorkloadPhase = "Pending"
    conditions: list[Condition] = msgspec.field(default_factory=list)
    ready_workers: Int32 = 0
    pod_template_hash: str = ""
    recommendation: Resources | None = None
    applied_recommended_replicas: Int32 = 0
    active_cron_scaling_rule: CronScalingRule | None = None
    gang: GangStatus | None = None


class TensorFusionWorkload(Model):
    KIND: ClassVar[str] = "TensorFusionWorkload"
    api_version: str = msgspec.field(default_factory=constant(API_VERSION))
    kind: str = msgspec.field(default_factory=constant("TensorFusionWorkload"))
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: WorkloadProfileSpec = msgspec.field(default_factory=WorkloadProfileSpec)
    status: TensorFusionWorkloadStatus | None = None


class WorkloadProfileStatus(Model):
    """Empty: a profile has no observed state."""


class WorkloadProfile(Model):
    KIND: ClassVar[str] = "WorkloadProfile"
    api_version: str = msgspec.field(default_factory=constant(API_VERSION))
    kind: str = msgspec.field(default_factory=constant("WorkloadProfile"))
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: WorkloadProfileSpec = msgspec.field(default_factory=WorkloadProfileSpec)
    status: WorkloadProfileStatus = msgspec.field(default_factory=WorkloadProfileStatus)


class TensorFusionConnectionSpec(Model):
    workload_name: str
    client_pod: str


class TensorFusionConnectionStatus(Model):
    phase: WorkerPhase
    connection_url: str = msgspec.field(name="connectionURL")
    worker_name: str


class TensorFusionConnection(Model):
    KIND: ClassVar[str] = "TensorFusionConnection"
    api_version: str = msgspec.field(default_factory=constant(API_VERSION))
    kind: str = msgspec.field(default_factory=constant("TensorFusionConnection"))
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: TensorFusionConnectionSpec | None = None
    status: TensorFusionConnectionStatus | None = None
