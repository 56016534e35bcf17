"""TensorFusion types shared by several kinds: resources, QoS, isolation, references, autoscaling.

Why it exists: GPUs, workloads, profiles, quotas and scheduling templates all speak in the same
`Resource` (TFLOPs, compute percent, VRAM) and the same enums; one definition keeps them in step.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import msgspec

from tfusion.api.kinds.base import Model, Quantity
from tfusion.api.kinds.meta import SecretReference

__all__ = [
    "AutoScalingConfig", "AutoSetResources", "CronScalingRule", "ExternalScalerConfig", "GroupKindName",
    "IsolationMode", "NameNamespace", "QoSLevel", "Resource", "Resources", "ScalingTargetResource",
]

QoSLevel: TypeAlias = Literal["low", "medium", "high", "critical"]
IsolationMode: TypeAlias = Literal["shared", "soft", "hard", "partitioned"]
ScalingTargetResource: TypeAlias = Literal["compute", "vram", "all"]


class Resource(Model):
    """Per-GPU amounts: TFLOPs (or a 0-100 compute percent instead) and VRAM."""

    tflops: Quantity
    vram: Quantity
    compute: Quantity | None = None


class Resources(Model):
    requests: Resource
    limits: Resource


class GroupKindName(Model):
    group: str
    kind: str
    version: str
    name: str


class NameNamespace(Model):
    name: str = ""
    namespace: str = ""


class AutoSetResources(Model):
    """Percentile-based right-sizing; numbers are decimal strings as in the original API."""

    enable: bool = False
    target_resource: ScalingTargetResource | None = None
    target_compute_percentile: str = ""
    lower_bound_compute_percentile: str = ""
    upper_bound_compute_percentile: str = ""
    target_vram_percentile: str = msgspec.field(default="", name="targetVRAMPercentile")
    lower_bound_vram_percentile: str = msgspec.field(default="", name="lowerBoundVRAMPercentile")
    upper_bound_vram_percentile: str = msgspec.field(default="", name="upperBoundVRAMPercentile")
    margin_fraction: str = ""
    update_threshold: str = ""
    history_data_period: str = ""
    min_vram_resources_ratio: str = msgspec.field(default="", name="minVRAMResourcesRatio")
    max_vram_resources_ratio: str = msgspec.field(default="", name="maxVRAMResourcesRatio")
    min_compute_resources_ratio: str = ""
    max_compute_resources_ratio: str = ""
    initial_delay_period: str = ""
    interval: str = ""


class CronScalingRule(Model):
    enable: bool = False
    name: str = ""
    start: str = ""
    end: str = ""
    desired_resources: Resources | None = None


class ExternalScalerConfig(Model):
    enable: bool = False
    url: str = msgspec.field(default="", name="url")
    api_key_secret_ref: SecretReference | None = None
    initial_delay_period: str = ""
    interval: str = ""


class AutoScalingConfig(Model):
    auto_set_resources: AutoSetResources | None = None
    cron_scaling_rules: list[CronScalingRule] = msgspec.field(default_factory=list)
    external_scaler: ExternalScalerConfig | None = None
