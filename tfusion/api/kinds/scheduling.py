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
    params: RawExtension | None = None


class PlacementConfig(Model):
    mode: Annotated[PlacementMode, REQUIRED] = "NodeCompactGPULowLoad"
    allow_using_local_gpu: bool = msgspec.field(default=True, name="allowUsingLocalGPU")
    gpu_filters: list[GPUFilter] = msgspec.field(default_factory=list, name="gpuFilters")


class VerticalScalingRule(Model):
    """Merged into the autoscaling config of workloads whose pods match `selector`."""

    name: str = ""
    selector: LabelSelector | None = None
    auto_scaling: AutoScalingConfig | None = None


class ReBalanceThreshold(Model):
    match_any: RawExtension | None = None


class ReBalancerConfig(Model):
    enable: bool | None = None
    interval: str = ""
    re_balance_cool_down_time: str = ""
    threshold: ReBalanceThreshold | None = None


class AutoFreeze(Model):
    qos: QoSLevel | None = None
    freeze_to_mem_ttl: str = msgspec.field(default="", name="freezeToMemTTL")
    freeze_to_disk_ttl: str = msgspec.field(default="", name="freezeToDiskTTL")
    enable: bool | None = None


class SmartSchedulerModelInput(Model):
    enable: bool | None = None
    model: str = ""
    history_data_period: str = ""
    prediction_period: str = ""


class AutoFreezeAndResume(Model):
    auto_freeze: list[AutoFreeze] = msgspec.field(default_factory=list)
    intelligence_warmup: SmartSchedulerModelInput | None = None


class ElasticRateLimitParameters(Model):
    """PID-controlled token bucket of the soft limiter; numbers are decimal strings."""

    max_refill_rate: str = ""
    min_refill_rate: str = ""
    filter_alpha: str = ""
    ki: str = ""
    kd: str = ""
    kp: str = ""
    burst_window: str = ""
    capacity_min: str = ""
    capacity_max: str = ""
    integral_decay_factor: str = ""


class MultiProcessQueuingParameters(Model):
    computing_threshold_for_preempt: str = ""
    trigger_preempt_duration: str = ""
    computing_threshold_for_resume: str = ""
    trigger_resume_duration: str = ""
    coefficient_low: str = ""
    coefficient_medium: str = ""
    coefficient_high: str = ""
    slow_start_ratio: str = ""


class HypervisorScheduling(Model):
    auto_freeze_and_resume: AutoFreezeAndResume | None = None
    elastic_rate_limit_parameters: ElasticRateLimitParameters | None = None
    multi_process_queuing_parameters: MultiProcessQueuingParameters | None = None


class SchedulingConfigTemplateSpec(Model):
    placement: PlacementConfig
    vertical_scaling_rules: list[VerticalScalingRule] = msgspec.field(default_factory=list)
    re_balancer: ReBalancerConfig | None = None
    hypervisor: HypervisorScheduling | None = None


class SchedulingConfigTemplateStatus(Model):
    """Empty: a template has no observed state."""


class SchedulingConfigTemplate(Model):
    KIND: ClassVar[str] = "SchedulingConfigTemplate"
    api_version: str = msgspec.field(default_factory=constant(API_VERSION))
    kind: str = msgspec.field(default_factory=constant("SchedulingConfigTemplate"))
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: SchedulingConfigTemplateSpec | None = None
    status: SchedulingConfigTemplateStatus = msgspec.field(default_factory=SchedulingConfigTemplateStatus)
