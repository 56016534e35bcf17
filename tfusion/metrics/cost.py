"""The original's raw cost, as pure functions: a worker's price for an interval and a node's.

Why pure: billing is money; it must be checkable by hand. Nothing here reads a clock or an object
store: the recorder passes the prices (from the pool's `spec.qosConfig`, the ProviderConfig's
`hardwareMetadata[].costPerHour`), what the worker holds and the seconds since the last record.

Worker cost for `seconds` (reference upstream-controller.md §10), with Pt and Pv the per-second
prices of one TFLOPS and one GiB of VRAM (hourly / 3600) for the pool and QoS, and r the pricing's
`limitsOverRequests`:

    (tflops_req*Pt + vram_req/GiB*Pv + (tflops_lim - tflops_req)*Pt*r + (vram_lim - vram_req)/GiB*Pv*r)
        * seconds * gpu_count

times the pool's `evictionProtectionPriceRatio` (default 1.2; below 1 means 1.2) while the pod's
eviction protection (annotation duration from its creation) lasts and its QoS is not critical.
No pricing for the pool and QoS means 0. Node cost for `seconds` is the sum over its GPUs of
hourly price(model) * seconds / 3600.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tfusion.api.accessors import Body, GpuPool, items, section

GIB = 1024 ** 3
DEFAULT_EVICTION_RATIO = 1.2
DEFAULT_TFLOPS_PRICE = "$0.0069228"
DEFAULT_VRAM_PRICE = "$0.01548"


class PriceError(ValueError):
    """A price or ratio string is not a number; the message names the field and the value."""


def parse_price(text: object, *, field: str) -> float:
    """'$0.0069228' or '0.0069228' (also a bare number) as a non-negative float."""
    raw = str(text).strip().removeprefix("$").strip()
    try:
        value = float(raw)
    except ValueError:
        raise PriceError(f"{field}: {text!r} is not a price (expected e.g. \"$0.0069228\")") from None
    if value < 0 or math.isnan(value) or math.isinf(value):
        raise PriceError(f"{field}: {text!r} is not a price (expected a non-negative number)")
    return value


@dataclass(frozen=True, slots=True)
class Prices:
    """Hourly prices of one QoS level in a pool."""

    tflops_per_hour: float
    vram_gib_per_hour: float
    limits_over_requests: float = 1.0


@dataclass(frozen=True, slots=True)
class PoolPricing:
    """A pool's `spec.qosConfig` pricing: QoS level -> prices, and the eviction-protection ratio."""

    by_qos: Mapping[str, Prices]
    eviction_ratio: float = DEFAULT_EVICTION_RATIO


def pool_pricing(pool: GpuPool) -> PoolPricing:
    """Read a GPUPool object's pricing (raises PriceError naming the bad field)."""
    qos_config = pool.qos_config
    by_qos: dict[str, Prices] = {}
    for i, entry in enumerate(items(qos_config, "pricing")):
        if not isinstance(entry, Mapping) or not entry.get("qos"):
            continue
        base = f"spec.qosConfig.pricing[{i}]"
        requests = section(entry, "requests")
        by_qos[str(entry["qos"])] = Prices(
            tflops_per_hour=parse_price(requests.get("perFP16TFlopsPerHour", DEFAULT_TFLOPS_PRICE),
                                        field=f"{base}.requests.perFP16TFlopsPerHour"),
            vram_gib_per_hour=parse_price(requests.get("perGBOfVRAMPerHour", DEFAULT_VRAM_PRICE),
                                          field=f"{base}.requests.perGBOfVRAMPerHour"),
            limits_over_requests=parse_price(entry.get("limitsOverRequests", "1"),
                                             field=f"{base}.limitsOverRequests"))
    ratio = parse_price(qos_config.get("evictionProtectionPriceRatio", DEFAULT_EVICTION_RATIO),
                        field="spec.qosConfig.evictionProtectionPriceRatio")
    return PoolPricing(by_qos=by_qos, eviction_ratio=ratio if ratio >= 1 else DEFAULT_EVICTION_RATIO)


@dataclass(frozen=True, slots=True)
class WorkerShare:
    """What one worker holds per GPU (TFLOPS, bytes) and on how many GPUs, at which QoS."""

    tflops_request: float
    tflops_limit: float
    vram_request: int
    vram_limit: int
    gpu_count: int
    qos: str = "medium"


def worker_cost(share: WorkerShare, pricing: PoolPricing | None, seconds: float, *,
                eviction_protected: bool = False) -> float:
    """The worker's cost for `seconds` (0 without pricing for its QoS, or for a negative interval)."""
    prices = pricing.by_qos.get(share.qos) if pricing is not None else None
    if prices is None or seconds <= 0:
        return 0.0
    per_tflops = prices.tflops_per_hour / 3600
    per_gib = prices.vram_gib_per_hour / 3600
    over = prices.limits_over_requests
    per_second = (share.tflops_request * per_tflops
                  + share.vram_request / GIB * per_gib
                  + max(0.0, share.tflops_limit - share.tflops_request) * per_tflops * over
                  + max(0, share.vram_limit - share.vram_request) / GIB * per_gib * over)
    cost = per_second * seconds * share.gpu_count
    if eviction_protected and share.qos != "critical" and pricing is not None:
        cost *= pricing.eviction_ratio
    return cost


def node_hourly_price(gpunode: Body, gpu_models: Iterable[str], hourly_by_model: Mapping[str, float]) -> float:
    """A node's price per hour: the GPUNode's own `spec.costPerHour` when it has a readable one (a
    provisioned node carries its instance's price), else its GPUs' model prices."""
    own = gpunode.spec.get("costPerHour")
    if own:
        try:
            return parse_price(own, field="spec.costPerHour")
        except PriceError:
            pass
    return sum(hourly_by_model.get(model, 0.0) for model in gpu_models)


def hourly_prices(provider_configs: Iterable[Body]) -> dict[str, float]:
    """GPU model -> hourly price from ProviderConfigs' `hardwareMetadata[].costPerHour`, under both the
    short `model` and the `fullModelName` (GPU objects report either). Unreadable prices are skipped."""
    prices: dict[str, float] = {}
    for config in provider_configs:
        for entry in items(config.spec, "hardwareMetadata"):
            if not isinstance(entry, Mapping) or not entry.get("costPerHour"):
                continue
            try:
                price = parse_price(entry["costPerHour"], field="hardwareMetadata.costPerHour")
            except PriceError:
                continue
            for name in (entry.get("model"), entry.get("fullModelName")):
                if name:
                    prices[str(name)] = price
    return prices


class BillingLedger:
    """When each worker was last billed and when it ended: the exact interval of every row.

    `seen(uid, at)` starts billing a worker (the first call wins); `ended(uid, at)` marks when it went
    (the first call wins: a later event about the same pod does not move it); `bill(uid, now)` returns
    the seconds to charge since the last bill, up to `now` or its end, and moves the mark. A worker
    that ended is billed once more, up to its end, and then `finished(uid)` is True (the recorder
    forgets it after writing that row).
    """

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._end: dict[str, float] = {}

    def __contains__(self, uid: str) -> bool:
        return uid in self._last

    def uids(self) -> list[str]:
        return sorted(self._last)

    def seen(self, uid: str, at: float) -> None:
        self._last.setdefault(uid, at)

    def ended(self, uid: str, at: float) -> None:
        if uid in self._last:
            self._end.setdefault(uid, max(at, self._last[uid]))

    def is_ended(self, uid: str) -> bool:
        return uid in self._end

    def bill(self, uid: str, now: float) -> float:
        last = self._last[uid]
        upto = min(now, self._end.get(uid, now))
        if upto <= last:
            return 0.0
        self._last[uid] = upto
        return upto - last

    def finished(self, uid: str) -> bool:
        return uid in self._end and self._last[uid] >= self._end[uid]

    def forget(self, uid: str) -> None:
        self._last.pop(uid, None)
        self._end.pop(uid, None)

    def clear(self) -> None:
        self._last.clear()
        self._end.clear()
