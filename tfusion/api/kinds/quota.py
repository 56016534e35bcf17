"""GPUResourceQuota: per-namespace GPU budget (totals, per-workload bounds and defaults).

Why it exists: the allocator checks every request against the namespace's quota before it
touches a GPU, and the webhook fills missing requests from `single.defaultRequests`.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

import msgspec

from tfusion.api.kinds.base import API_VERSION, Int32, Model, Percent, constant
from tfusion.api.kinds.common import Resource
from tfusion.api.kinds.meta import Condition, ObjectMeta

__all__ = [
    "AvailablePercent", "GPUResourceQuota", "GPUResourceQuotaSingle", "GPUResourceQuotaSpec",
    "GPUResourceQuotaStatus", "GPUResourceQuotaTotal", "GPUResourceUsage",
]


class GPUResourceQuotaTotal(Model):
    requests: Resource | None = None
    """Most compute and memory all workloads of the namespace may request together."""
    limits: Resource | None = None
    """Most compute and memory all workloads of the namespace may have as limits together."""
    max_workers: Int32 = 32768
    """Most workers in the namespace. Default 32768."""
    alert_threshold_percent: Percent = 95
    """Usage percent (0 to 100) at which an alert condition is raised. Default 95."""


class GPUResourceQuotaSingle(Model):
    max_requests: Resource | None = None
    """Most one workload may request per GPU."""
    max_limits: Resource | None = None
    """Highest limits one workload may set per GPU."""
    max_gpu_count: Int32 | None = msgspec.field(default=None, name="maxGPUCount")
    """Most GPUs one workload may ask for."""
    default_requests: Resource | None = None
    """Requests given to workloads that set none."""
    default_limits: Resource | None = None
    """Limits given to workloads that set none."""


class GPUResourceQuotaSpec(Model):
    total: GPUResourceQuotaTotal = msgspec.field(default_factory=GPUResourceQuotaTotal)
    """Namespace-wide totals."""
    single: GPUResourceQuotaSingle = msgspec.field(default_factory=GPUResourceQuotaSingle)
    """Bounds and defaults for each workload."""


class GPUResourceUsage(Model):
    requests: Resource | None = None
    """Compute and memory requested by the namespace's workloads now."""
    limits: Resource | None = None
    """Sum of the limits of the namespace's workloads now."""
    workers: Int32 = 0
    """Workers running in the namespace now."""


class AvailablePercent(Model):
    """Percent of the quota still free, as strings with two decimals; the keys contain dots."""

    requests_tflops: str = msgspec.field(default="", name="requests.tflops")
    """Percent of the requests.tflops quota still free, a decimal string."""
    requests_vram: str = msgspec.field(default="", name="requests.vram")
    """Percent of the requests.vram quota still free, a decimal string."""
    limits_tflops: str = msgspec.field(default="", name="limits.tflops")
    """Percent of the limits.tflops quota still free, a decimal string."""
    limits_vram: str = msgspec.field(default="", name="limits.vram")
    """Percent of the limits.vram quota still free, a decimal string."""
    workers: str = ""
    """Percent of the worker quota still free, a decimal string."""


class GPUResourceQuotaStatus(Model):
    used: GPUResourceUsage | None = None
    """What the namespace uses now."""
    available_percent: AvailablePercent | None = None
    """What is still free, in percent."""
    conditions: list[Condition] = msgspec.field(default_factory=list)
    """Latest observations (for example an alert when the threshold is crossed)."""
    last_update_time: datetime | None = None
    """When usage was last recomputed (RFC 3339 time)."""


class GPUResourceQuota(Model):
    KIND: ClassVar[str] = "GPUResourceQuota"
    api_version: str = msgspec.field(default_factory=constant(API_VERSION))
    kind: str = msgspec.field(default_factory=constant("GPUResourceQuota"))
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: GPUResourceQuotaSpec = msgspec.field(default_factory=GPUResourceQuotaSpec)
    """The namespace's GPU budget; written by an administrator."""
    status: GPUResourceQuotaStatus = msgspec.field(default_factory=GPUResourceQuotaStatus)
    """Current usage against the budget; written by the controller."""
