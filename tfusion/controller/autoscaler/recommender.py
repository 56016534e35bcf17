"""Per-workload usage history and the percentile recommendation made from it.

Why it exists: this is the decision at the heart of vertical autoscaling, kept pure (no I/O, no
await, no clock) so that it is tested exhaustively and benchmarked on its own; the autoscaler
service feeds it samples and applies what it decides.

How a recommendation is made (`recommend`), per GPU, for the resources `targetResource` selects:
1. nothing before `started_at + initialDelayPeriod`, nothing without samples;
2. estimates: target, lower and upper = the configured percentiles of the decaying histogram times
   (1 + marginFraction); TFLOPS rounded up to a milli-TFLOPS, VRAM up to a MiB;
3. a resource whose current request is 0 (none asked) or lies inside [lower, upper] stays; otherwise its request moves
   to the target and its limit keeps the current limit/request proportion (a limit of 0, "no
   limit", stays 0);
4. the new request is clamped to [min ratio, max ratio] x the original request (spec.resources;
   skipped when that is 0) and to the pool GPU's capacity; the limit is capped by the capacity and
   never below the request;
5. a relative change of the request below updateThreshold is not applied.

Compute given as a percent of the GPU (Resources.percent, milli-percent) rather than TFLOPS: when
the pool GPU's TFLOPS capacity is known, the percent is converted to TFLOPS through it, decided on
as TFLOPS, and converted back, so the workload keeps its unit; when the capacity is unknown compute
is left unchanged (the message says so) and VRAM is still decided.

Reasons (Decision.reason):
- Recommended: at least one resource changes; `changed` is True.
- WithinBounds: every selected resource's current request lies within its [lower, upper].
- BelowUpdateThreshold: a request lies outside its bounds, but the change is below updateThreshold.
- HeldByClamp: a request lies outside its bounds, but the ratio or capacity clamp keeps it where it is.
- NoRequest: no selected resource has a request (0): a workload that asks for no TFLOPS (or no VRAM)
  is not given one, since that would start reserving what it never asked for.
- ComputeUnconvertible: only compute is selected, it is a percent, and the GPU capacity is unknown.
- NoSamples: no usage sample has been recorded yet.
- InitialDelay: the workload started less than initialDelayPeriod ago.
- Disabled: autoSetResources is not enabled.
- CronRule: a cron scaling rule is in force and sets the resources (`rule_decision`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, TypeAlias

from tfusion.allocator.request import Resources
from tfusion.allocator.units import MIB, PERCENT_SCALE, percent_str, tflops_str, vram_str
from tfusion.controller.autoscaler.histogram import TFLOPS_SCALE, VRAM_SCALE, DecayingHistogram
from tfusion.controller.autoscaler.policy import AutoSetPolicy, CronRule, resources_of

CHECKPOINT_VERSION: Final = 1
#: formats one unit's amounts for a message (tflops_str, vram_str)
_Show: TypeAlias = Callable[[int], str]
RECOMMENDED: Final = "Recommended"
WITHIN_BOUNDS: Final = "WithinBounds"
BELOW_UPDATE_THRESHOLD: Final = "BelowUpdateThreshold"
HELD_BY_CLAMP: Final = "HeldByClamp"
COMPUTE_UNCONVERTIBLE: Final = "ComputeUnconvertible"
NO_REQUEST: Final = "NoRequest"
NO_SAMPLES: Final = "NoSamples"
INITIAL_DELAY: Final = "InitialDelay"
DISABLED: Final = "Disabled"
CRON_RULE: Final = "CronRule"


@dataclass(frozen=True)
class Share:
    """Per-GPU requests and limits."""

    request: Resources
    limit: Resources

    def to_status(self) -> dict[str, dict[str, str]]:
        """status.recommendation: quantity text per side; compute percent as `compute` when set."""
        return {"requests": _resource_status(self.request), "limits": _resource_status(self.limit)}


def share_of(block: Mapping[str, object], path: str) -> Share | None:
    """The Share a Resources pair (`requests`, `limits`) says: None without any request, limits
    defaulting to the requests; PolicyError names a bad field."""
    requests = block.get("requests")
    if not isinstance(requests, Mapping):
        return None
    request = resources_of(requests, f"{path}.requests")
    if request == Resources():
        return None
    limits = block.get("limits")
    limit = resources_of(limits, f"{path}.limits") if isinstance(limits, Mapping) and limits else request
    return Share(request, limit)


def _resource_status(amounts: Resources) -> dict[str, str]:
    body = {"tflops": tflops_str(amounts.tflops), "vram": vram_str(amounts.vram)}
    if amounts.percent and not amounts.tflops:
        body["compute"] = percent_str(amounts.percent)
    return body


class WorkloadUsage:
    """The TFLOPS (milli) and VRAM (bytes) histograms of one workload, and sample counters."""

    __slots__ = ("first_at", "last_at", "samples", "tflops", "vram")

    def __init__(self, half_life_s: float) -> None:
        self.tflops = DecayingHistogram(TFLOPS_SCALE, half_life_s)
        self.vram = DecayingHistogram(VRAM_SCALE, half_life_s)
        self.samples = 0
        self.first_at: float | None = None
        self.last_at: float | None = None

    def add(self, at: float, tflops_milli: float, vram_bytes: float) -> None:
        """One worker's usage on one GPU at `at` (unix seconds)."""
        self.tflops.add(tflops_milli, at)
        self.vram.add(vram_bytes, at)
        self.samples += 1
        if self.first_at is None or at < self.first_at:
            self.first_at = at
        if self.last_at is None or at > self.last_at:
            self.last_at = at

    def to_checkpoint(self) -> dict[str, object]:
        return {"version": CHECKPOINT_VERSION, "samples": self.samples, "firstAt": self.first_at,
                "lastAt": self.last_at, "tflops": self.tflops.to_checkpoint(), "vram": self.vram.to_checkpoint()}

    @classmethod
    def from_checkpoint(cls, half_life_s: float, data: object) -> WorkloadUsage:
        """The usage `to_checkpoint` described; ValueError naming the part that is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"usage checkpoint: expected an object, got {type(data).__name__}")
        if data.get("version") != CHECKPOINT_VERSION:
            raise ValueError(f"usage checkpoint.version: {data.get('version')!r} is not {CHECKPOINT_VERSION}")
        usage = cls(half_life_s)
        samples = data.get("samples")
        if not (isinstance(samples, int) and not isinstance(samples, bool) and samples >= 0):
            raise ValueError(f"usage checkpoint.samples: {samples!r} is not a count >= 0")
        usage.samples = samples
        usage.first_at = _optional_time(data, "firstAt")
        usage.last_at = _optional_time(data, "lastAt")
        usage.tflops = DecayingHistogram.from_checkpoint(TFLOPS_SCALE, half_life_s, data.get("tflops"))
        usage.vram = DecayingHistogram.from_checkpoint(VRAM_SCALE, half_life_s, data.get("vram"))
        return usage


def _optional_time(data: dict[str, object], key: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"usage checkpoint.{key}: {value!r} is not a unix time")
    return float(value)


@dataclass(frozen=True)
class Estimate:
    """Percentiles times (1 + margin): milli-TFLOPS and bytes per GPU."""

    tflops_target: int
    tflops_lower: int
    tflops_upper: int
    vram_target: int
    vram_lower: int
    vram_upper: int


@dataclass(frozen=True)
class Decision:
    share: Share
    changed: bool
    reason: str
    message: str
    estimate: Estimate | None


def estimate(usage: WorkloadUsage, policy: AutoSetPolicy) -> Estimate:
    """The bounds and target of both resources, margin included."""
    grow = 1.0 + policy.margin
    t_target, t_lower, t_upper = usage.tflops.percentiles(policy.target_compute, policy.lower_compute,
                                                          policy.upper_compute)
    v_target, v_lower, v_upper = usage.vram.percentiles(policy.target_vram, policy.lower_vram, policy.upper_vram)
    return Estimate(math.ceil(t_target * grow), math.ceil(t_lower * grow), math.ceil(t_upper * grow),
                    _mib_up(v_target * grow), _mib_up(v_lower * grow), _mib_up(v_upper * grow))


def _mib_up(size: float) -> int:
    return math.ceil(size / MIB) * MIB


@dataclass(frozen=True)
class _Move:
    """What happens to one resource: its new request and limit and why."""

    request: int
    limit: int
    outcome: str  # one of the reasons NoRequest, WithinBounds, BelowUpdateThreshold, HeldByClamp, Recommended
    text: str


@dataclass(frozen=True)
class _Rules:
    """The numbers one resource is decided with (all in one unit)."""

    name: str
    target: int
    lower: int
    upper: int
    target_p: float
    lower_p: float
    upper_p: float
    min_ratio: float
    max_ratio: float
    original: int
    capacity: int  # 0: unknown


def recommend(usage: WorkloadUsage, policy: AutoSetPolicy, *, original: Share, current: Share,
              capacity: Resources | None, started_at: float, now: float) -> Decision:
    """The share the workload should run with now, and why (see the module docstring)."""
    if not policy.enable:
        return _unchanged(current, DISABLED, "autoSetResources is not enabled, so the resources stay as they are.")
    ready_at = started_at + policy.initial_delay_s
    if now < ready_at:
        return _unchanged(current, INITIAL_DELAY, f"No recommendation during the initial delay of "
                          f"{span(policy.initial_delay_s)} after the workload started "
                          f"({span(math.ceil(ready_at - now))} left).")
    if usage.samples == 0 or usage.tflops.empty:
        return _unchanged(current, NO_SAMPLES, "No usage sample has been recorded for this workload yet.")
    found = estimate(usage, policy)
    moves: list[_Move] = []
    request, limit, notes = current.request, current.limit, []
    if policy.scales_compute:
        compute = _compute_move(found, policy, original, current, capacity)
        if compute is None:
            notes.append("compute is a percent of the GPU and the GPU's capacity is unknown, so it stays")
        else:
            moves.append(compute[0])
            request, limit = compute[1], compute[2]
            if current.request.percent and not current.request.tflops and capacity:
                notes.append(f"compute percent read through the GPU's {tflops_str(capacity.tflops)} TFLOPS")
    if policy.scales_vram:
        rules = _Rules("VRAM", found.vram_target, found.vram_lower, found.vram_upper, policy.target_vram,
                       policy.lower_vram, policy.upper_vram, policy.min_vram_ratio, policy.max_vram_ratio,
                       original.request.vram, capacity.vram if capacity else 0)
        vram = _move(rules, current.request.vram, current.limit.vram, policy.update_threshold, vram_str)
        moves.append(vram)
        request = Resources(request.tflops, request.percent, vram.request)
        limit = Resources(limit.tflops, limit.percent, vram.limit)
    reason = _overall(moves)
    share = Share(request, limit) if reason == RECOMMENDED else current
    parts = [move.text for move in moves] + notes
    message = (f"From {usage.samples} samples (half-life {span(policy.half_life_s)}, margin {_pct(policy.margin)}%): "
               f"{'; '.join(parts)}.")
    return Decision(share, reason == RECOMMENDED, reason, message, found)


def _overall(moves: list[_Move]) -> str:
    if not moves:
        return COMPUTE_UNCONVERTIBLE
    outcomes = {move.outcome for move in moves}
    for reason in (RECOMMENDED, BELOW_UPDATE_THRESHOLD, HELD_BY_CLAMP, WITHIN_BOUNDS):
        if reason in outcomes:
            return reason
    return NO_REQUEST


def _compute_move(found: Estimate, policy: AutoSetPolicy, original: Share, current: Share,
                  capacity: Resources | None) -> tuple[_Move, Resources, Resources] | None:
    """The compute move in TFLOPS, with the new request and limit in the workload's own units;
    None when compute is a percent that cannot be converted."""
    cap = capacity.tflops if capacity else 0
    req, lim, base = (_as_tflops(r, cap) for r in (current.request, current.limit, original.request))
    if req is None or lim is None or base is None:
        return None
    rules = _Rules("TFLOPS", found.tflops_target, found.tflops_lower, found.tflops_upper, policy.target_compute,
                   policy.lower_compute, policy.upper_compute, policy.min_compute_ratio, policy.max_compute_ratio,
                   base, cap)
    move = _move(rules, req, lim, policy.update_threshold, tflops_str)
    if move.outcome != RECOMMENDED:  # no round trip through the capacity for what stays
        return move, current.request, current.limit
    return move, _in_unit_of(current.request, move.request, cap), _in_unit_of(current.limit, move.limit, cap)


def _as_tflops(amounts: Resources, capacity: int) -> int | None:
    """milli-TFLOPS; None for a compute percent on a GPU of unknown capacity."""
    if amounts.percent and not amounts.tflops and capacity <= 0:
        return None
    return amounts.tflops_on(capacity)


def _in_unit_of(like: Resources, tflops: int, capacity: int) -> Resources:
    """`tflops` in the unit `like` uses for compute (TFLOPS, or percent of the capacity)."""
    if like.tflops or not like.percent:
        return Resources(tflops, 0, like.vram)
    return Resources(0, min(PERCENT_SCALE, math.ceil(tflops * PERCENT_SCALE / capacity)), like.vram)


def _move(rules: _Rules, request: int, limit: int, threshold: float, show: _Show) -> _Move:
    bounds = (f"target p{_pct(rules.target_p)} {show(rules.target)}, bounds p{_pct(rules.lower_p)} "
              f"{show(rules.lower)}..p{_pct(rules.upper_p)} {show(rules.upper)}")
    if request <= 0:
        return _Move(request, limit, NO_REQUEST, f"{rules.name} has no request, so it is left alone ({bounds})")
    if rules.lower <= request <= rules.upper:
        return _Move(request, limit, WITHIN_BOUNDS, f"{rules.name} request {show(request)} kept, within {bounds}")
    wanted, clamps = _clamped(rules, rules.target, show)
    how = f"{bounds}{'; ' if clamps else ''}{', '.join(clamps)}"
    if wanted == request:
        return _Move(request, limit, HELD_BY_CLAMP, f"{rules.name} request {show(request)} kept ({how})")
    if request > 0 and abs(wanted - request) / request < threshold:
        return _Move(request, limit, BELOW_UPDATE_THRESHOLD,
                     f"{rules.name} request {show(request)} kept, the change to {show(wanted)} being below the "
                     f"update threshold {_pct(threshold)}% ({how})")
    new_limit = _scaled_limit(limit, request, wanted, rules)
    limit_text = f" and limit {show(limit)} -> {show(new_limit)}" if new_limit != limit else ""
    return _Move(wanted, new_limit, RECOMMENDED,
                 f"{rules.name} request {show(request)} -> {show(wanted)}{limit_text} ({how})")


def _clamped(rules: _Rules, wanted: int, show: _Show) -> tuple[int, list[str]]:
    clamps: list[str] = []
    if rules.original > 0:
        low, high = math.ceil(rules.min_ratio * rules.original), math.floor(rules.max_ratio * rules.original)
        if rules.name == "VRAM":  # whole MiB, as the estimates are: 0.2 x 8Gi is 1639Mi, not 1717986919 bytes
            low, high = _mib_up(low), max(MIB, high // MIB * MIB)
        if wanted < low:
            wanted = low
            clamps.append(f"raised to {rules.min_ratio:g}x the original request {show(rules.original)}")
        elif wanted > high:
            wanted = high
            clamps.append(f"lowered to {rules.max_ratio:g}x the original request {show(rules.original)}")
    if rules.capacity and wanted > rules.capacity:
        wanted = rules.capacity
        clamps.append(f"lowered to the GPU capacity {show(rules.capacity)}")
    return wanted, clamps


def _scaled_limit(limit: int, request: int, wanted: int, rules: _Rules) -> int:
    """The limit keeping its proportion to the request; 0 (no limit) stays 0."""
    if limit <= 0:
        return 0
    scaled = limit * wanted // request if request > 0 else limit
    if rules.name == "VRAM":
        scaled = _mib_up(scaled)
    if rules.capacity:
        scaled = min(scaled, rules.capacity)
    return max(scaled, wanted)


def span(seconds: float) -> str:
    """A duration as Go writes short ones: "6h", "1h30m", "45s", "2.5s"."""
    if not float(seconds).is_integer():
        return f"{seconds:g}s"
    whole, text = int(seconds), ""
    for unit, size in (("h", 3600), ("m", 60)):
        if whole >= size:
            text += f"{whole // size}{unit}"
            whole %= size
    return text + (f"{whole}s" if whole or not text else "")


def _pct(fraction: float) -> str:
    return f"{fraction * 100:g}"


def _unchanged(current: Share, reason: str, message: str) -> Decision:
    return Decision(current, False, reason, message, None)


def rule_decision(rule: CronRule, current: Share) -> Decision:
    """The decision while cron rule `rule` is in force: its desired resources."""
    share = Share(rule.request, rule.limit)
    status = share.to_status()
    return Decision(share, share != current, CRON_RULE,
                    f"Cron rule {rule.name!r} is in force (start {rule.start}, end {rule.end}): requests "
                    f"{_side_text(status['requests'])}, limits {_side_text(status['limits'])}.", None)


def _side_text(side: dict[str, str]) -> str:
    return ", ".join(f"{key} {value}" for key, value in side.items())
