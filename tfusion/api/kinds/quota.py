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
    limits: Resource | None = None
    max_workers: Int32 = 32768
    alert_threshold_percent: Percent = 95


class GPUResourceQuotaSingle(Model):
    max_requests: Resource | None = None
    max_limits: Resource | None = None
    max_gpu_count: Int32 | None = msgspec.field(default=None, name="maxGPUCount")
    default_requests: Resource | None = None
    default_limits: Resource | None = None


class GPUResourceQuotaSpec(Model):
    total: GPUResourceQuotaTotal = msgspec.field(default_factory=GPUResourceQuotaTotal)
    single: GPUResourceQuotaSingle = msgspec.field(default_factory=GPUResourceQuotaSingle)


class GPUResourceUsage(Model):
    requests: Resource | None = None
    limits: Resource | None = None
    workers: Int32 = 0


class AvailablePercent(Model):
    """Percent of the quota still free, as strings with two decimals; the keys contain dots."""

    requests_tflops: str = msgspec.field(default="", name="requests.tflops")
    requests_vram: str = msgspec.field(default="", name="requests.vram")
    limits_tflops: str = msgspec.field(default="", name="limits.tflops")
    limits_vram: str = msgspec.field(default="", name="limits.vram")
    workers: str = ""


class GPUResourceQuotaStatus(Model):
    used: GPUResourceUsage | None = None
    available_percent: AvailablePercent | None = None
    conditions: list[Condition] = msgspec.field(default_factory=list)
    last_update_time: datetime | None = None


class GPUResourceQuota(Model):
    KIND: ClassVar[str] = "GPUResourceQuota"
    api_version: str = msgspec.field(default_factory=constant(API_VERSION))
    kind: str = msgspec.field(default_factory=constant("GPUResourceQuota"))
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: GPUResourceQuotaSpec = msgspec.field(default_factory=GPUResourceQuotaSpec)
    status: GPUResourceQuotaStatus = msgspec.field(default_factory=GPUResourceQuotaStatus)
