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
    """Compute per GPU in TFLOPS (FP16), a Kubernetes quantity such as 20 or 1500m (1.5 TFLOPS)."""
    vram: Quantity
    """GPU memory per GPU in bytes, a Kubernetes quantity such as 8Gi or 512Mi."""
    compute: Quantity | None = None
    """Compute as a percent of one GPU (0-100), a Kubernetes quantity such as 50; an alternative to tflops."""


class Resources(Model):
    requests: Resource
    """Guaranteed amounts per GPU: what the scheduler reserves."""
    limits: Resource
    """Ceiling per GPU the hypervisor enforces; limits above the requests let the worker burst into idle capacity."""


class GroupKindName(Model):
    group: str
    """API group of the referenced object (for example karpenter.k8s.aws)."""
    kind: str
    """Kind of the referenced object."""
    version: str
    """API version of the referenced object (for example v1)."""
    name: str
    """Name of the referenced object."""


class NameNamespace(Model):
    name: str = ""
    """Object name."""
    namespace: str = ""
    """Object namespace."""


class AutoSetResources(Model):
    """Percentile-based right-sizing; numbers are decimal strings as in the original API."""

    enable: bool = False
    """Turn percentile-based right-sizing of requests and limits on. Default false."""
    target_resource: str = ""
    """Which resource to right-size: compute, vram or all (all when empty)."""
    target_compute_percentile: str = ""
    """Percentile of observed compute usage used as the recommended target, a decimal string such as "0.95"."""
    lower_bound_compute_percentile: str = ""
    """Percentile of compute usage below which the current request counts as too large, a decimal string such as
    "0.5"."""
    upper_bound_compute_percentile: str = ""
    """Percentile of compute usage above which the current request counts as too small, a decimal string such as
    "0.99"."""
    target_vram_percentile: str = msgspec.field(default="", name="targetVRAMPercentile")
    """Percentile of observed VRAM usage used as the recommended target, a decimal string such as "0.95"."""
    lower_bound_vram_percentile: str = msgspec.field(default="", name="lowerBoundVRAMPercentile")
    """Percentile of VRAM usage below which the current request counts as too large, a decimal string."""
    upper_bound_vram_percentile: str = msgspec.field(default="", name="upperBoundVRAMPercentile")
    """Percentile of VRAM usage above which the current request counts as too small, a decimal string."""
    margin_fraction: str = ""
    """Safety margin added on top of the recommendation, a fraction as a decimal string such as "0.15"."""
    update_threshold: str = ""
    """Minimum relative change before a new recommendation is applied, a decimal string such as "0.1"."""
    history_data_period: str = ""
    """How much usage history the recommender looks at, a Go duration such as 2h or 7d."""
    min_vram_resources_ratio: str = msgspec.field(default="", name="minVRAMResourcesRatio")
    """Lower bound of the recommended VRAM as a ratio of the original request, a decimal string."""
    max_vram_resources_ratio: str = msgspec.field(default="", name="maxVRAMResourcesRatio")
    """Upper bound of the recommended VRAM as a ratio of the original request, a decimal string."""
    min_compute_resources_ratio: str = ""
    """Lower bound of the recommended compute as a ratio of the original request, a decimal string."""
    max_compute_resources_ratio: str = ""
    """Upper bound of the recommended compute as a ratio of the original request, a decimal string."""
    initial_delay_period: str = ""
    """Wait after a workload starts before the first recommendation, a Go duration such as 30m."""
    interval: str = ""
    """How often recommendations are recomputed, a Go duration such as 1m."""


class CronScalingRule(Model):
    enable: bool = False
    """Whether this rule is active. Default false."""
    name: str = ""
    """Name of the rule, shown in status.activeCronScalingRule."""
    start: str = ""
    """Cron expression for when the rule's resources start to apply."""
    end: str = ""
    """Cron expression for when the workload returns to its normal resources."""
    desired_resources: Resources | None = None
    """Requests and limits the workload gets while the rule is in effect."""


class ExternalScalerConfig(Model):
    enable: bool = False
    """Ask an external HTTP service for resource recommendations. Default false."""
    url: str = msgspec.field(default="", name="url")
    """Address of the external scaler's HTTP endpoint."""
    api_key_secret_ref: SecretReference | None = None
    """Secret holding the API key sent to the external scaler."""
    initial_delay_period: str = ""
    """Wait after a workload starts before the first call, a Go duration."""
    interval: str = ""
    """How often the external scaler is called, a Go duration such as 1m."""


class AutoScalingConfig(Model):
    auto_set_resources: AutoSetResources | None = None
    """Right-size requests and limits from observed usage percentiles."""
    cron_scaling_rules: list[CronScalingRule] = msgspec.field(default_factory=list)
    """Time-based resource changes; the first active rule wins."""
    external_scaler: ExternalScalerConfig | None = None
    """Take recommendations from an external HTTP service."""
