"""The elastic rate limiter (ERL): a feedback controller that sets a soft worker's token refill rate
so that the device's utilisation follows the worker's share (reference hypervisor §5.4).

Why pure functions: the control law is the part worth testing hard, and it needs no GPU and no
clock — `step` takes the previous state, the measured utilisation and the time and returns the
next state; `rebalance_tokens` takes the bucket's numbers and returns the new token count. The loop
in `soft.py` does the I/O (metrics in, shm out).

Per (worker, device), every 500 ms:
1. `target = up_limit / 100`; `u` = the worker's utilisation of the device (0..1): its own processes'
   SM utilisation when the backend reports per-process figures, else the whole device's as upstream
   (`soft.pod_utilisation`);
   the first sample sets the smoothed value `s = u`, later ones `s = alpha·u + (1-alpha)·s`.
2. `s <= 0.01` (idle): ramp up, `rate = min(rate·1.35, rate_max)`. Else `e = target - s`; inside
   the deadband `|e| < 0.03` the integral decays and the rate stays. Otherwise
   `I = clamp(I·decay + e·dt, +/-1.5)`, `D = (e - e_prev)/dt`, feed-forward `ff = rate·target/max(s, 0.05)`,
   factor `f = clamp(1 + kp·e + ki·I + kd·D, 0.5, 1.5)`, `desired = clamp(ff·f, rate_min, rate_max)`,
   and a slew limit of +35 % / -25 % per step.
3. `capacity = clamp(rate·burst_window, cap_min, cap_max)`.
4. Tokens: refill `rate·elapsed` when `0 < elapsed < 5 s` (capped at capacity); above capacity,
   drain to it; above the target with more than the 35 % reserve, drain towards the reserve
   (`drain = max(25, 0.8·capacity)·dt`).

Defaults below; overrides (`config.py`: TF_HYPERVISOR_SCHEDULING_CONFIG over the pool's
SchedulingConfigTemplate `spec.hypervisor`) are `elasticRateLimitParameters`, values as decimal
strings; only positive numbers count; afterwards rate_min <= rate_max, cap_min <= cap_max, alpha in
0.01..0.95, decay in 0.01..0.999.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tfusion.api.jsontypes import JsonMapping

DT_S = 0.5
INITIAL_RATE = 100.0
IDLE_UTILISATION = 0.01
IDLE_RAMP = 1.35
DEADBAND = 0.03
INTEGRAL_LIMIT = 1.5
MIN_SMOOTHED_FOR_FF = 0.05
FACTOR_MIN, FACTOR_MAX = 0.5, 1.5
SLEW_UP, SLEW_DOWN = 1.35, 0.75
RESERVE_FRACTION = 0.35
DRAIN_FLOOR = 25.0
DRAIN_FRACTION = 0.8
MAX_REFILL_GAP_S = 5.0


@dataclass(frozen=True)
class ErlParams:
    rate_min: float = 10.0
    rate_max: float = 200000.0
    cap_min: float = 200.0
    cap_max: float = 200000.0
    burst_window: float = 0.5
    alpha: float = 0.25
    kp: float = 0.9
    ki: float = 0.35
    kd: float = 0.10
    decay: float = 0.85


#: the config keys of `elasticRateLimitParameters` and the parameter each sets
CONFIG_KEYS = {"maxRefillRate": "rate_max", "minRefillRate": "rate_min", "filterAlpha": "alpha", "kp": "kp",
               "ki": "ki", "kd": "kd", "burstWindow": "burst_window", "capacityMin": "cap_min",
               "capacityMax": "cap_max", "integralDecayFactor": "decay"}


def params_from_overrides(raw: JsonMapping | None, base: ErlParams | None = None) -> ErlParams:
    """`elasticRateLimitParameters` applied to `base` (the defaults): strings (or numbers) that are
    positive finite decimals override; anything else is ignored, as upstream does."""
    params = base or ErlParams()
    changes: dict[str, float] = {}
    for key, attr in CONFIG_KEYS.items():
        value = (raw or {}).get(key)
        if isinstance(value, bool) or value is None:
            continue
        try:
            number = float(str(value).strip())
        except ValueError:
            continue
        if math.isfinite(number) and number > 0:
            changes[attr] = number
    params = replace(params, **changes)
    return replace(params, rate_max=max(params.rate_max, params.rate_min),
                   cap_max=max(params.cap_max, params.cap_min),
                   alpha=min(max(params.alpha, 0.01), 0.95), decay=min(max(params.decay, 0.01), 0.999))


@dataclass(frozen=True)
class ErlState:
    """The controller's memory for one (worker, device)."""

    rate: float = INITIAL_RATE
    smoothed: float = 0.0
    sampled: bool = False  # whether `smoothed` holds a sample yet
    integral: float = 0.0
    last_error: float = 0.0


def clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


def smooth(state: ErlState, utilisation: float, params: ErlParams) -> ErlState:
    if not state.sampled:
        return replace(state, smoothed=utilisation, sampled=True)
    return replace(state, smoothed=params.alpha * utilisation + (1 - params.alpha) * state.smoothed)


def desired_rate(state: ErlState, target: float, params: ErlParams, dt: float = DT_S) -> ErlState:
    """The next rate from the smoothed utilisation already in `state` (step 2 of the docstring)."""
    rate, s = state.rate, state.smoothed
    if s <= IDLE_UTILISATION:
        return replace(state, rate=min(rate * IDLE_RAMP, params.rate_max))
    error = target - s
    if abs(error) < DEADBAND:
        return replace(state, integral=state.integral * params.decay)
    integral = clamp(state.integral * params.decay + error * dt, -INTEGRAL_LIMIT, INTEGRAL_LIMIT)
    derivative = (error - state.last_error) / dt
    feed_forward = rate * target / max(s, MIN_SMOOTHED_FOR_FF)
    factor = clamp(1 + params.kp * error + params.ki * integral + params.kd * derivative, FACTOR_MIN, FACTOR_MAX)
    desired = clamp(feed_forward * factor, params.rate_min, params.rate_max)
    desired = clamp(desired, rate * SLEW_DOWN, rate * SLEW_UP)
    return replace(state, rate=desired, integral=integral, last_error=error)


def capacity_for(rate: float, params: ErlParams) -> float:
    return clamp(rate * params.burst_window, params.cap_min, params.cap_max)


def step(state: ErlState, *, target: float, utilisation: float, params: ErlParams,
         dt: float = DT_S) -> tuple[ErlState, float]:
    """One control step: (next state, bucket capacity). `utilisation` is 0..1."""
    smoothed = smooth(state, clamp(utilisation, 0.0, 1.0), params)
    updated = desired_rate(smoothed, target, params, dt)
    return updated, capacity_for(updated.rate, params)


def rebalance_tokens(tokens: float, *, capacity: float, last_update: float, now: float, rate: float,
                     target: float, smoothed: float, dt: float = DT_S) -> float:
    """The token count after refill and drain (step 4 of the docstring)."""
    elapsed = now - last_update
    if last_update > 0 and 0 < elapsed < MAX_REFILL_GAP_S:
        tokens = clamp(tokens + rate * elapsed, 0.0, capacity)
    reserve = RESERVE_FRACTION * capacity
    drain = max(DRAIN_FLOOR, DRAIN_FRACTION * capacity) * dt
    if tokens > capacity:
        return max(capacity, tokens - drain)
    if smoothed > target + DEADBAND and tokens > reserve:
        return max(reserve, tokens - drain)
    return tokens
