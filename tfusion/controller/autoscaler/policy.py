"""A workload's `spec.autoScalingConfig`, read once into typed, validated policies with defaults.

Why it exists: the API carries every number as a decimal string and every period as a Go duration
(the original's CRD), and a typo must be refused with a message naming the field, the value and what
is allowed (`PolicyError`) instead of silently falling back, which is what the original does. The
recommender, the cron rules and the external scaler then read plain floats and seconds.

Defaults (`AutoSetPolicy`): target TFLOPS p95 and VRAM p98, bounds p50..p99, margin 0.15, update
threshold 0.1, VRAM ratio 0.2..5 and compute ratio 0.1..10 of the original request, initial delay
30m: the original's defaults. Ranges: percentiles, margin and threshold are 0..1 (a lower bound may
not be above its upper bound); ratios are > 0 with min <= max; durations are Go durations, where
"d" (24h) is also accepted ("7d"), as the original's examples use.

historyDataPeriod (default 24h: one daily cycle of an inference service; at most 30d, the
original's cap) sets the decay: `half_life_s = history_period_s / 4`. A sample one history period
old then weighs 1/16 of a new one and one two periods old 1/256, so the percentiles are essentially
those of the history period while memory stays fixed (nothing is stored per sample).

Cron rules: only enabled rules are kept (a disabled one is not validated). desiredResources gives
requests and limits per GPU: tflops (milli-TFLOPS) or compute (0..100 percent, kept as
milli-percent in `Resources.percent`), and vram (bytes); missing limits mean the requests.
External scaler: kept when present (enabled or not); `url` is required when enabled; the Secret's
namespace defaults to the workload's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from tfusion.allocator.request import Resources
from tfusion.allocator.units import PERCENT_SCALE
from tfusion.api.durations import DurationError, parse_duration
from tfusion.api.quantity import Quantity, QuantityError
from tfusion.controller.autoscaler.cron import CronSchedule

ROOT: Final = "autoScalingConfig"
AUTO_SET: Final = f"{ROOT}.autoSetResources"
TARGET_RESOURCES: Final = ("compute", "vram", "all")
DAY: Final = 86400.0
MAX_HISTORY_S: Final = 30 * DAY
DEFAULT_HISTORY_S: Final = DAY
#: the history period spans this many half-lives (see the module docstring)
HALF_LIVES_PER_HISTORY: Final = 4.0
_DECIMAL: Final = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)


class PolicyError(ValueError):
    """A field of autoScalingConfig that cannot be used: names the field path, the value and what is allowed."""

    def __init__(self, path: str, value: object, allowed: str, *, detail: str = "") -> None:
        shown = f'"{value}"' if isinstance(value, str) else repr(value)
        why = detail or "is not allowed"
        super().__init__(f"{path}: {shown} {why} (allowed: {allowed})")
        self.path, self.value, self.allowed = path, value, allowed


@dataclass(frozen=True)
class AutoSetPolicy:
    enable: bool = False
    target_resource: str = "all"
    target_compute: float = 0.95
    lower_compute: float = 0.50
    upper_compute: float = 0.99
    target_vram: float = 0.98
    lower_vram: float = 0.50
    upper_vram: float = 0.99
    margin: float = 0.15
    update_threshold: float = 0.10
    history_period_s: float = DEFAULT_HISTORY_S
    min_vram_ratio: float = 0.2
    max_vram_ratio: float = 5.0
    min_compute_ratio: float = 0.1
    max_compute_ratio: float = 10.0
    initial_delay_s: float = 1800.0
    interval_s: float | None = None

    @property
    def half_life_s(self) -> float:
        """The histograms' half-life: a quarter of the history period."""
        return self.history_period_s / HALF_LIVES_PER_HISTORY

    @property
    def scales_compute(self) -> bool:
        return self.target_resource in ("compute", "all")

    @property
    def scales_vram(self) -> bool:
        return self.target_resource in ("vram", "all")


@dataclass(frozen=True)
class CronRule:
    name: str
    start: CronSchedule
    end: CronSchedule
    request: Resources
    limit: Resources


@dataclass(frozen=True)
class ExternalScalerPolicy:
    enable: bool
    url: str
    secret_name: str
    secret_namespace: str
    initial_delay_s: float
    interval_s: float | None


@dataclass(frozen=True)
class ScalingPolicy:
    auto_set: AutoSetPolicy
    cron_rules: tuple[CronRule, ...]
    external: ExternalScalerPolicy | None

    @property
    def enabled(self) -> bool:
        """Whether anything recommends resources (the webhook's autoscaling_enabled, read typed)."""
        return self.auto_set.enable or bool(self.cron_rules) or (self.external is not None and self.external.enable)


def scaling_policy(config: Mapping[str, object] | None, *, namespace: str) -> ScalingPolicy:
    """The typed policy of a workload's (merged) spec.autoScalingConfig; PolicyError on bad input."""
    if config is None:
        return ScalingPolicy(AutoSetPolicy(), (), None)
    body = _mapping(config, ROOT)
    auto = body.get("autoSetResources")
    rules = body.get("cronScalingRules")
    external = body.get("externalScaler")
    return ScalingPolicy(
        auto_set=auto_set_policy(_mapping(auto, AUTO_SET)) if auto is not None else AutoSetPolicy(),
        cron_rules=_cron_rules(rules),
        external=_external(_mapping(external, f"{ROOT}.externalScaler"), namespace) if external is not None else None,
    )


def auto_set_policy(body: Mapping[str, object]) -> AutoSetPolicy:
    """autoSetResources read with the defaults for what it leaves out."""
    d = AutoSetPolicy()
    fraction = "0 to 1"
    policy = AutoSetPolicy(
        enable=_bool(body, "enable", AUTO_SET),
        target_resource=_choice(body, "targetResource", AUTO_SET, TARGET_RESOURCES, d.target_resource),
        target_compute=_decimal(body, "targetComputePercentile", d.target_compute, 0.0, 1.0, fraction),
        lower_compute=_decimal(body, "lowerBoundComputePercentile", d.lower_compute, 0.0, 1.0, fraction),
        upper_compute=_decimal(body, "upperBoundComputePercentile", d.upper_compute, 0.0, 1.0, fraction),
        target_vram=_decimal(body, "targetVRAMPercentile", d.target_vram, 0.0, 1.0, fraction),
        lower_vram=_decimal(body, "lowerBoundVRAMPercentile", d.lower_vram, 0.0, 1.0, fraction),
        upper_vram=_decimal(body, "upperBoundVRAMPercentile", d.upper_vram, 0.0, 1.0, fraction),
        margin=_decimal(body, "marginFraction", d.margin, 0.0, 1.0, fraction),
        update_threshold=_decimal(body, "updateThreshold", d.update_threshold, 0.0, 1.0, fraction),
        history_period_s=_duration(body, "historyDataPeriod", AUTO_SET, d.history_period_s, positive=True,
                                   at_most=MAX_HISTORY_S),
        min_vram_ratio=_decimal(body, "minVRAMResourcesRatio", d.min_vram_ratio, 0.0, math.inf, "a number > 0",
                                positive=True),
        max_vram_ratio=_decimal(body, "maxVRAMResourcesRatio", d.max_vram_ratio, 0.0, math.inf, "a number > 0",
                                positive=True),
        min_compute_ratio=_decimal(body, "minComputeResourcesRatio", d.min_compute_ratio, 0.0, math.inf,
                                   "a number > 0", positive=True),
        max_compute_ratio=_decimal(body, "maxComputeResourcesRatio", d.max_compute_ratio, 0.0, math.inf,
                                   "a number > 0", positive=True),
        initial_delay_s=_duration(body, "initialDelayPeriod", AUTO_SET, d.initial_delay_s),
        interval_s=_optional_duration(body, "interval", AUTO_SET),
    )
    _check_order(body, "lowerBoundComputePercentile", policy.lower_compute, "upperBoundComputePercentile",
                 policy.upper_compute)
    _check_order(body, "lowerBoundVRAMPercentile", policy.lower_vram, "upperBoundVRAMPercentile", policy.upper_vram)
    _check_order(body, "minVRAMResourcesRatio", policy.min_vram_ratio, "maxVRAMResourcesRatio", policy.max_vram_ratio)
    _check_order(body, "minComputeResourcesRatio", policy.min_compute_ratio, "maxComputeResourcesRatio",
                 policy.max_compute_ratio)
    return policy


def _check_order(body: Mapping[str, object], low_key: str, low: float, high_key: str, high: float) -> None:
    if low > high:
        shown = body.get(low_key, low)
        raise PolicyError(f"{AUTO_SET}.{low_key}", shown if isinstance(shown, str) else low,
                          f"at most {high_key} ({high:g})", detail=f"is above {high_key} ({high:g})")


def _mapping(value: object, path: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise PolicyError(path, value, "an object")
    return value


def _bool(body: Mapping[str, object], key: str, path: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise PolicyError(f"{path}.{key}", value, "true or false", detail="is not a boolean")
    return value


def _text(body: Mapping[str, object], key: str, path: str) -> str:
    value = body.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise PolicyError(f"{path}.{key}", value, "a string", detail="is not a string")
    return value.strip()


def _choice(body: Mapping[str, object], key: str, path: str, choices: tuple[str, ...], default: str) -> str:
    text = _text(body, key, path)
    if not text:
        return default
    if text not in choices:
        raise PolicyError(f"{path}.{key}", text, " | ".join(choices), detail="is not one of the choices")
    return text


def _decimal(body: Mapping[str, object], key: str, default: float, low: float, high: float, allowed: str,
             *, positive: bool = False) -> float:
    """A decimal string (a JSON number is taken too); "" or absent is the default."""
    path, raw = f"{AUTO_SET}.{key}", body.get(key)
    if raw is None or raw == "":
        return default
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise PolicyError(path, raw, allowed, detail="is not a decimal number")
    if isinstance(raw, str) and not _DECIMAL.fullmatch(raw.strip()):
        raise PolicyError(path, raw, allowed, detail="is not a decimal number")
    value = float(raw)
    if not math.isfinite(value) or value < low or value > high or (positive and value <= 0):
        raise PolicyError(path, raw, allowed, detail="is out of range")
    return value


def _duration(body: Mapping[str, object], key: str, path: str, default: float, *, positive: bool = False,
              at_most: float | None = None) -> float:
    text = _text(body, key, path)
    if not text:
        return default
    allowed = "a Go duration such as 30s, 30m, 2h or 7d" + (", above 0" if positive else "")
    if at_most is not None:
        allowed += f", at most {at_most / DAY:g}d"
    try:
        seconds = parse_duration(text, allow_days=True)
    except DurationError as exc:
        raise PolicyError(f"{path}.{key}", text, allowed, detail="is not a duration") from exc
    if (positive and seconds <= 0) or (at_most is not None and seconds > at_most):
        raise PolicyError(f"{path}.{key}", text, allowed, detail="is out of range")
    return seconds


def _optional_duration(body: Mapping[str, object], key: str, path: str) -> float | None:
    return _duration(body, key, path, 0.0, positive=True) if _text(body, key, path) else None


def _cron_rules(value: object) -> tuple[CronRule, ...]:
    path = f"{ROOT}.cronScalingRules"
    if value is None:
        return ()
    if not isinstance(value, list):
        raise PolicyError(path, value, "a list of rules")
    rules: list[CronRule] = []
    for i, item in enumerate(value):
        where = f"{path}[{i}]"
        body = _mapping(item, where)
        if _bool(body, "enable", where):
            rules.append(_cron_rule(body, where))
    return tuple(rules)


def _cron_rule(body: Mapping[str, object], where: str) -> CronRule:
    name = _text(body, "name", where)
    if not name:
        raise PolicyError(f"{where}.name", body.get("name", ""), "a non-empty name (shown in activeCronScalingRule)",
                          detail="is empty")
    start, end = (_schedule(body, key, where) for key in ("start", "end"))
    desired = _mapping(body.get("desiredResources"), f"{where}.desiredResources")
    request = resources_of(desired.get("requests"), f"{where}.desiredResources.requests")
    limits = desired.get("limits")
    limit = request if limits is None else resources_of(limits, f"{where}.desiredResources.limits")
    return CronRule(name, start, end, request, limit)


def _schedule(body: Mapping[str, object], key: str, where: str) -> CronSchedule:
    text = _text(body, key, where)
    try:
        return CronSchedule.parse(text)
    except ValueError as exc:
        raise PolicyError(f"{where}.{key}", text, 'a 5-field cron expression such as "0 9 * * 1-5", optionally '
                          'with a "CRON_TZ=<zone> " prefix', detail=f"is not a schedule ({exc})") from exc


def resources_of(value: object, path: str) -> Resources:
    """A Resources block (`tflops` or `compute`, and `vram`) per GPU, checked; PolicyError names the field."""
    body = _mapping(value, path)
    tflops, compute, vram = (_quantity(body, key, path) for key in ("tflops", "compute", "vram"))
    if tflops and compute:
        raise PolicyError(f"{path}.compute", str(compute), "tflops or compute, not both", detail="is given with tflops")
    percent = compute.milli_value() if compute is not None else 0
    if percent > PERCENT_SCALE:
        raise PolicyError(f"{path}.compute", str(compute), "0 to 100 (percent of a GPU)", detail="is out of range")
    return Resources(tflops=tflops.milli_value() if tflops is not None else 0, percent=percent,
                     vram=vram.value() if vram is not None else 0)


def _quantity(body: Mapping[str, object], key: str, path: str) -> Quantity | None:
    raw = body.get(key)
    if raw is None or raw == "":
        return None
    allowed = "a non-negative quantity such as 20, 1500m or 8Gi"
    try:
        quantity = Quantity.parse(raw)  # type: ignore[arg-type]
    except QuantityError as exc:
        raise PolicyError(f"{path}.{key}", raw, allowed, detail="is not a quantity") from exc
    if quantity < 0:
        raise PolicyError(f"{path}.{key}", raw, allowed, detail="is negative")
    return quantity


def _external(body: Mapping[str, object], namespace: str) -> ExternalScalerPolicy:
    path = f"{ROOT}.externalScaler"
    enable, url = _bool(body, "enable", path), _text(body, "url", path)
    if enable and not url:
        raise PolicyError(f"{path}.url", url, "an http(s) URL when enable is true", detail="is empty")
    secret = body.get("apiKeySecretRef")
    ref = _mapping(secret, f"{path}.apiKeySecretRef") if secret is not None else {}
    return ExternalScalerPolicy(
        enable=enable, url=url,
        secret_name=_text(ref, "name", f"{path}.apiKeySecretRef"),
        secret_namespace=_text(ref, "namespace", f"{path}.apiKeySecretRef") or namespace,
        initial_delay_s=_duration(body, "initialDelayPeriod", path, 0.0),
        interval_s=_optional_duration(body, "interval", path),
    )
