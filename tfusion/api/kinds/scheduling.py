"""SchedulingConfigTemplate: placement strategy, vertical scaling rules and hypervisor tuning.

Why it exists: a pool names one template; its placement mode drives GPU scoring, its scaling
rules are merged into matching workloads, and `.spec.hypervisor` is handed to the node agent.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, TypeAlias

import msgspec

from tfusion.api.kinds.base import API_VERSION, REQUIRED, Model, RawExtension, constant
from tfusion.api.kinds.common import AutoScalingConfig, QoSLevel
from tfusion.api.kinds.meta import LabelSelector, ObjectMeta

__all__ = [
    "AutoFreeze", "AutoFreezeAndResume", "ElasticRateLimitParameters", "GPUFilter", "HypervisorScheduling",
    "MultiProcessQueuingParameters", "PlacementConfig", "PlacementMode", "ReBalanceThreshold",
    "ReBalancerConfig", "SchedulingConfigTemplate", "SchedulingConfigTemplateSpec",
    "SchedulingConfigTemplateStatus", "SmartSchedulerModelInput", "VerticalScalingRule",
]

PlacementMode: TypeAlias = Literal["CompactFirst", "LowLoadFirst", "NodeCompactGPULowLoad"]


class GPUFilter(Model):
    type: str = ""
    """Filter name (for example avoidTooMuchConnectionsOnSameGPU or gpuModel)."""
    params: RawExtension | None = None
    """Filter parameters; their shape depends on the type."""


class PlacementConfig(Model):
    mode: Annotated[PlacementMode, REQUIRED] = "NodeCompactGPULowLoad"
    """How GPUs are picked: CompactFirst (fill busy GPUs first), LowLoadFirst (spread) or NodeCompactGPULowLoad (few
    nodes, low-load GPUs on them). Default NodeCompactGPULowLoad."""
    allow_using_local_gpu: bool = msgspec.field(default=True, name="allowUsingLocalGPU")
    """Whether workloads may use a GPU on their own node (local mode). Default true."""
    gpu_filters: list[GPUFilter] = msgspec.field(default_factory=list, name="gpuFilters")
    """Extra filters GPUs must pass before scoring."""


class VerticalScalingRule(Model):
    """Merged into the autoscaling config of workloads whose pods match `selector`."""

    name: str = ""
    """Name of the rule."""
    selector: LabelSelector | None = None
    """Pods (by label) whose workloads get this rule."""
    auto_scaling: AutoScalingConfig | None = None
    """Autoscaling settings merged into the matching workloads."""


class ReBalanceThreshold(Model):
    match_any: RawExtension | None = None
    """Conditions (any one suffices) that trigger rebalancing."""


class ReBalancerConfig(Model):
    enable: bool | None = None
    """Move workloads between GPUs to even out load."""
    interval: str = ""
    """How often the rebalancer runs, a Go duration."""
    re_balance_cool_down_time: str = ""
    """Least time between two moves of the same workload, a Go duration."""
    threshold: ReBalanceThreshold | None = None
    """When rebalancing is triggered."""


class AutoFreeze(Model):
    qos: QoSLevel | None = None
    """QoS level this rule applies to."""
    freeze_to_mem_ttl: str = msgspec.field(default="", name="freezeToMemTTL")
    """Idle time after which a worker's GPU state moves to host memory, a Go duration."""
    freeze_to_disk_ttl: str = msgspec.field(default="", name="freezeToDiskTTL")
    """Idle time after which a worker's GPU state moves to disk, a Go duration."""
    enable: bool | None = None
    """Whether this rule is active."""


class SmartSchedulerModelInput(Model):
    enable: bool | None = None
    """Predict demand and warm workers up ahead of time."""
    model: str = ""
    """Name of the prediction model."""
    history_data_period: str = ""
    """How much history the model learns from, a Go duration."""
    prediction_period: str = ""
    """How far ahead the model predicts, a Go duration."""


class AutoFreezeAndResume(Model):
    auto_freeze: list[AutoFreeze] = msgspec.field(default_factory=list)
    """Freeze idle workers, per QoS level."""
    intelligence_warmup: SmartSchedulerModelInput | None = None
    """Predictive warm-up of frozen workers."""


class ElasticRateLimitParameters(Model):
    """PID-controlled token bucket of the soft limiter; numbers are decimal strings."""

    max_refill_rate: str = ""
    """Highest token refill rate of the compute limiter, a decimal string."""
    min_refill_rate: str = ""
    """Lowest token refill rate of the compute limiter, a decimal string."""
    filter_alpha: str = ""
    """Smoothing factor of the utilisation filter (0 to 1), a decimal string."""
    ki: str = ""
    """Integral gain of the limiter's PID controller, a decimal string."""
    kd: str = ""
    """Derivative gain of the limiter's PID controller, a decimal string."""
    kp: str = ""
    """Proportional gain of the limiter's PID controller, a decimal string."""
    burst_window: str = ""
    """Time over which bursts above the limit are allowed, a decimal string in seconds."""
    capacity_min: str = ""
    """Smallest token bucket size, a decimal string."""
    capacity_max: str = ""
    """Largest token bucket size, a decimal string."""
    integral_decay_factor: str = ""
    """How fast the PID integral term decays (0 to 1), a decimal string."""


class MultiProcessQueuingParameters(Model):
    computing_threshold_for_preempt: str = ""
    """GPU utilisation above which lower-QoS work is paused, a decimal string."""
    trigger_preempt_duration: str = ""
    """How long utilisation must stay above that threshold, a Go duration."""
    computing_threshold_for_resume: str = ""
    """GPU utilisation below which paused work resumes, a decimal string."""
    trigger_resume_duration: str = ""
    """How long utilisation must stay below that threshold, a Go duration."""
    coefficient_low: str = ""
    """Share weight of low-QoS work, a decimal string."""
    coefficient_medium: str = ""
    """Share weight of medium-QoS work, a decimal string."""
    coefficient_high: str = ""
    """Share weight of high-QoS work, a decimal string."""
    slow_start_ratio: str = ""
    """Fraction of its share a resumed worker starts with, a decimal string."""


class HypervisorScheduling(Model):
    auto_freeze_and_resume: AutoFreezeAndResume | None = None
    """Freezing idle workers and resuming them."""
    elastic_rate_limit_parameters: ElasticRateLimitParameters | None = None
    """Tuning of the soft-isolation compute limiter."""
    multi_process_queuing_parameters: MultiProcessQueuingParameters | None = None
    """Tuning of QoS-based pausing and resuming on a shared GPU."""


class SchedulingConfigTemplateSpec(Model):
    placement: PlacementConfig
    """How GPUs are chosen for new workers."""
    vertical_scaling_rules: list[VerticalScalingRule] = msgspec.field(default_factory=list)
    """Autoscaling rules given to workloads by pod label."""
    re_balancer: ReBalancerConfig | None = None
    """Moving workloads to even out load."""
    hypervisor: HypervisorScheduling | None = None
    """Settings handed to every node's hypervisor."""


class SchedulingConfigTemplateStatus(Model):
    """Empty: a template has no observed state."""


class SchedulingConfigTemplate(Model):
    KIND: ClassVar[str] = "SchedulingConfigTemplate"
    api_version: str = msgspec.field(default_factory=constant(API_VERSION))
    kind: str = msgspec.field(default_factory=constant("SchedulingConfigTemplate"))
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: SchedulingConfigTemplateSpec | None = None
    """The placement strategy and tuning; written by an administrator and named by pools."""
    status: SchedulingConfigTemplateStatus = msgspec.field(default_factory=SchedulingConfigTemplateStatus)
    """Empty; a template has no observed state."""
