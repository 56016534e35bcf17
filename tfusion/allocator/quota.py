"""GPUResourceQuota in allocator units: the spec, the usage and the checks (status JSON: controller/views.py).

One quota per namespace. Usage is tracked for every namespace (so a quota created later starts
from the truth) in two parts: committed (what status reports) and assumed (reserved by the
scheduler, not yet bound); checks use the sum. Fixes against upstream, on purpose:
- checks are exact (milli-TFLOPS, bytes) instead of rounding both sides up to integers;
- compute-percent requests count against TFLOPS quota, converted with the chosen GPUs' capacity
  (upstream counted them as 0 TFLOPS);
- the alert condition message pairs each resource with its own flag (upstream swapped them);
- a missing total (None) is unlimited, a zero total allows nothing; a zero single limit is unlimited.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tfusion.allocator.errors import QuotaExceeded
from tfusion.allocator.units import tflops_str, vram_str
from tfusion.api.accessors import Body, section
from tfusion.api.quantity import Quantity, QuantityError

DEFAULT_MAX_WORKERS = 32768
DEFAULT_ALERT_THRESHOLD = 95
READY_MESSAGE = "GPUResourceQuota is ready and capacity is sufficient"


class QuotaSpecError(ValueError):
    """A GPUResourceQuota spec is invalid; the message names the field and the value."""


@dataclass(frozen=True, slots=True)
class QuotaSpec:
    """spec.total and spec.single of a GPUResourceQuota (milli-TFLOPS, bytes, counts)."""

    requests_tflops: int | None = None
    requests_vram: int | None = None
    limits_tflops: int | None = None
    limits_vram: int | None = None
    max_workers: int | None = DEFAULT_MAX_WORKERS
    alert_threshold_percent: int = DEFAULT_ALERT_THRESHOLD
    single_max_requests_tflops: int = 0
    single_max_requests_vram: int = 0
    single_max_limits_tflops: int = 0
    single_max_limits_vram: int = 0
    single_max_gpu_count: int | None = None


@dataclass(slots=True)
class Usage:
    """Quota usage: request and limit totals over every GPU of every live allocation, and workers."""

    requests_tflops: int = 0
    requests_vram: int = 0
    limits_tflops: int = 0
    limits_vram: int = 0
    workers: int = 0

    def add(self, other: Usage, sign: int = 1) -> None:
        self.requests_tflops += sign * other.requests_tflops
        self.requests_vram += sign * other.requests_vram
        self.limits_tflops += sign * other.limits_tflops
        self.limits_vram += sign * other.limits_vram
        self.workers += sign * other.workers

    def plus(self, other: Usage) -> Usage:
        total = Usage(self.requests_tflops, self.requests_vram, self.limits_tflops, self.limits_vram,
                      self.workers)
        total.add(other)
        return total

    def as_tuple(self) -> tuple[int, int, int, int, int]:
        return (self.requests_tflops, self.requests_vram, self.limits_tflops, self.limits_vram, self.workers)


def _resource(obj: Mapping[str, Any], path: str) -> tuple[int | None, int | None]:
    out: list[int | None] = []
    for key, milli in (("tflops", True), ("vram", False)):
        raw = obj.get(key)
        if raw is None:
            out.append(None)
            continue
        try:
            q = Quantity.parse(raw)
        except QuantityError as exc:
            raise QuotaSpecError(f"{path}.{key}: {exc}") from exc
        if q.sign() < 0:
            raise QuotaSpecError(f"{path}.{key} must not be negative, got {raw!r}")
        out.append(q.milli_value() if milli else q.value())
    return out[0], out[1]


def _count(raw: Any, path: str, default: int | None) -> int | None:
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise QuotaSpecError(f"{path} must be a non-negative integer, got {raw!r}")
    return raw


def quota_from_object(quota: Body) -> tuple[str, QuotaSpec]:
    """(namespace, QuotaSpec) from a GPUResourceQuota; invalid specs raise `QuotaSpecError`."""
    namespace = quota.namespace
    if not namespace:
        raise QuotaSpecError("GPUResourceQuota has no metadata.namespace")
    total, single = section(quota.spec, "total"), section(quota.spec, "single")
    req_t, req_v = _resource(section(total, "requests"), "spec.total.requests")
    lim_t, lim_v = _resource(section(total, "limits"), "spec.total.limits")
    for name, req, lim in (("tflops", req_t, lim_t), ("vram", req_v, lim_v)):
        if req is not None and lim is not None and lim < req:
            raise QuotaSpecError(f"spec.total.limits.{name} must be >= spec.total.requests.{name}")
    threshold = _count(total.get("alertThresholdPercent"), "spec.total.alertThresholdPercent",
                       DEFAULT_ALERT_THRESHOLD)
    assert threshold is not None
    if threshold > 100:
        raise QuotaSpecError(f"spec.total.alertThresholdPercent must be 0..100, got {threshold}")
    s_req_t, s_req_v = _resource(section(single, "maxRequests"), "spec.single.maxRequests")
    s_lim_t, s_lim_v = _resource(section(single, "maxLimits"), "spec.single.maxLimits")
    return namespace, QuotaSpec(
        requests_tflops=req_t, requests_vram=req_v, limits_tflops=lim_t, limits_vram=lim_v,
        max_workers=_count(total.get("maxWorkers"), "spec.total.maxWorkers", DEFAULT_MAX_WORKERS),
        alert_threshold_percent=threshold,
        single_max_requests_tflops=s_req_t or 0, single_max_requests_vram=s_req_v or 0,
        single_max_limits_tflops=s_lim_t or 0, single_max_limits_vram=s_lim_v or 0,
        single_max_gpu_count=_count(single.get("maxGPUCount"), "spec.single.maxGPUCount", None),
    )


def _fmt(kind: str, value: int) -> str:
    if kind == "tflops":
        return tflops_str(value)
    if kind == "vram":
        return vram_str(value)
    return str(value)


def check_single(namespace: str, spec: QuotaSpec, per_gpu: Usage, count: int) -> None:
    """Per-workload limits (per GPU values); exceeding one is unresolvable."""
    checks = (
        ("single.max.tflops.request", "tflops", per_gpu.requests_tflops, spec.single_max_requests_tflops),
        ("single.max.vram.request", "vram", per_gpu.requests_vram, spec.single_max_requests_vram),
        ("single.max.tflops.limit", "tflops", per_gpu.limits_tflops, spec.single_max_limits_tflops),
        ("single.max.vram.limit", "vram", per_gpu.limits_vram, spec.single_max_limits_vram),
    )
    for resource, kind, value, limit in checks:
        if limit and value > limit:
            raise QuotaExceeded(
                f"namespace {namespace}: {resource} exceeded: requested {_fmt(kind, value)} per GPU, "
                f"limit {_fmt(kind, limit)} (over by {_fmt(kind, value - limit)})",
                namespace=namespace, resource=resource, requested=value, used=0, limit=limit,
                unresolvable=True)
    if spec.single_max_gpu_count is not None and count > spec.single_max_gpu_count:
        raise QuotaExceeded(
            f"namespace {namespace}: single.max.gpuCount.limit exceeded: requested {count} GPUs, "
            f"limit {spec.single_max_gpu_count}",
            namespace=namespace, resource="single.max.gpuCount.limit", requested=count, used=0,
            limit=spec.single_max_gpu_count, unresolvable=True)


def check_total(namespace: str, spec: QuotaSpec, used: Usage, charge: Usage) -> None:
    """Namespace totals: `used` (committed + assumed) plus `charge` must stay within each total."""
    checks = (
        ("total.max.tflops.request", "tflops", used.requests_tflops, charge.requests_tflops,
         spec.requests_tflops),
        ("total.max.vram.request", "vram", used.requests_vram, charge.requests_vram, spec.requests_vram),
        ("total.max.tflops.limit", "tflops", used.limits_tflops, charge.limits_tflops, spec.limits_tflops),
        ("total.max.vram.limit", "vram", used.limits_vram, charge.limits_vram, spec.limits_vram),
        ("total.max.workers.limit", "workers", used.workers, charge.workers, spec.max_workers),
    )
    for resource, kind, in_use, wanted, limit in checks:
        if limit is not None and wanted > 0 and in_use + wanted > limit:
            raise QuotaExceeded(
                f"namespace {namespace}: {resource} exceeded: requested {_fmt(kind, wanted)} with "
                f"{_fmt(kind, in_use)} already used, limit {_fmt(kind, limit)} "
                f"(short by {_fmt(kind, in_use + wanted - limit)})",
                namespace=namespace, resource=resource, requested=wanted, used=in_use, limit=limit,
                unresolvable=False)

