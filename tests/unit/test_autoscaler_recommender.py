"""The percentile recommendation (tfusion.controller.autoscaler.recommender): estimates with margin,
bounds, proportional limits, ratio and capacity clamps, the update threshold, target resources,
compute percent, the gates before any estimate, messages, status text and checkpoints."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfusion.allocator.request import Resources
from tfusion.controller.autoscaler.cron import CronSchedule
from tfusion.controller.autoscaler.histogram import TFLOPS_SCALE, VRAM_SCALE
from tfusion.controller.autoscaler.policy import AutoSetPolicy, CronRule
from tfusion.controller.autoscaler.recommender import (
    Decision,
    Share,
    WorkloadUsage,
    recommend,
    rule_decision,
    span,
)

GIB, MIB = 1 << 30, 1 << 20
T0 = 1_800_000_000.0
ON = AutoSetPolicy(enable=True, initial_delay_s=0.0)
H100 = Resources(tflops=989_000, vram=80 * GIB)


def share(tflops: float, vram_gib: float, limit_tflops: float | None = None, limit_gib: float | None = None) -> Share:
    return Share(Resources(tflops=round(tflops * 1000), vram=round(vram_gib * GIB)),
                 Resources(tflops=round((limit_tflops if limit_tflops is not None else tflops) * 1000),
                           vram=round((limit_gib if limit_gib is not None else vram_gib) * GIB)))


def usage_around(tflops: float, vram_gib: float, *, samples: int = 1000, spread: float = 0.05,
                 seed: int = 7) -> WorkloadUsage:
    draw = random.Random(seed)
    usage = WorkloadUsage(ON.half_life_s)
    for n in range(samples):
        usage.add(T0 + n * 30.0, tflops * 1000 * draw.uniform(1 - spread, 1 + spread),
                  vram_gib * GIB * draw.uniform(1 - spread, 1 + spread))
    return usage


def decide(usage: WorkloadUsage, current: Share, *, policy: AutoSetPolicy = ON, original: Share | None = None,
           capacity: Resources | None = H100, now: float = T0 + 86400) -> Decision:
    return recommend(usage, policy, original=original or current, current=current, capacity=capacity,
                     started_at=T0, now=now)


def test_a_workload_using_a_quarter_gets_its_percentiles_plus_margin() -> None:
    usage = usage_around(10, 2)
    decision = decide(usage, share(40, 8, limit_tflops=80, limit_gib=8))
    assert decision.changed and decision.reason == "Recommended" and decision.estimate is not None
    p95, = usage.tflops.percentiles(0.95)
    p98, = usage.vram.percentiles(0.98)
    assert decision.share.request.tflops == math.ceil(p95 * 1.15)
    assert decision.share.request.vram == math.ceil(p98 * 1.15 / MIB) * MIB
    assert 10_000 * 1.15 <= decision.share.request.tflops <= 10_500 * 1.15 * (1 + TFLOPS_SCALE.max_error)
    assert decision.share.limit.tflops == 2 * decision.share.request.tflops  # limit/request kept
    assert decision.share.limit.vram == decision.share.request.vram
    for words in ("From 1000 samples", "margin 15%", "target p95", "bounds p50", "..p99", "target p98",
                  "TFLOPS request 40 -> ", "VRAM request 8Gi -> "):
        assert words in decision.message


def test_a_request_within_the_bounds_stays() -> None:
    first = decide(usage_around(10, 2), share(40, 8))
    again = decide(usage_around(10, 2), first.share, original=share(40, 8))
    assert (again.reason, again.changed, again.share) == ("WithinBounds", False, first.share)
    assert "kept, within" in again.message


def test_a_small_change_is_not_applied() -> None:
    usage = usage_around(10, 2)
    estimate = decide(usage, share(40, 8)).estimate
    assert estimate is not None
    just_above = Share(Resources(tflops=round(estimate.tflops_upper * 1.05), vram=estimate.vram_target),
                       Resources(tflops=round(estimate.tflops_upper * 1.05), vram=estimate.vram_target))
    decision = decide(usage, just_above, original=share(40, 8), policy=AutoSetPolicy(
        enable=True, initial_delay_s=0, update_threshold=0.5))
    assert (decision.reason, decision.changed, decision.share) == ("BelowUpdateThreshold", False, just_above)
    assert "below the update threshold 50%" in decision.message


def test_the_minimum_ratio_of_the_original_request_holds() -> None:
    decision = decide(usage_around(1, 2), share(100, 8))
    assert decision.share.request.tflops == 10_000  # 0.1 x 100 TFLOPS, not 1.15
    assert "raised to 0.1x the original request 100" in decision.message
    held = decide(usage_around(1, 2), decision.share, original=share(100, 8))
    assert held.reason in ("HeldByClamp", "WithinBounds") and not held.changed
    assert "raised to 0.1x" in held.message or "within" in held.message


def test_the_maximum_ratio_and_the_gpu_capacity_hold() -> None:
    grown = decide(usage_around(50, 2), share(2, 2, limit_tflops=4, limit_gib=2))
    assert grown.share.request.tflops == 20_000  # 10 x 2 TFLOPS
    assert "lowered to 10x the original request 2" in grown.message
    full = decide(usage_around(950, 70), share(400, 40, limit_tflops=800, limit_gib=60))
    assert full.share.request.tflops == 989_000 and full.share.limit.tflops == 989_000
    assert full.share.request.vram == 80 * GIB and full.share.limit.vram == 80 * GIB
    assert "lowered to the GPU capacity 989" in full.message and "lowered to the GPU capacity 80Gi" in full.message


def test_no_limit_stays_no_limit() -> None:
    decision = decide(usage_around(10, 2), Share(Resources(tflops=40_000, vram=8 * GIB), Resources()))
    assert decision.changed and decision.share.limit == Resources()


@pytest.mark.parametrize(("target", "tflops_moves", "vram_moves"), [
    ("compute", True, False), ("vram", False, True), ("all", True, True)])
def test_the_target_resource_chooses_what_moves(target: str, tflops_moves: bool, vram_moves: bool) -> None:
    current = share(40, 8)
    decision = decide(usage_around(10, 2), current, policy=AutoSetPolicy(enable=True, initial_delay_s=0,
                                                                           target_resource=target))
    assert (decision.share.request.tflops != current.request.tflops) is tflops_moves
    assert (decision.share.request.vram != current.request.vram) is vram_moves
    assert ("TFLOPS" in decision.message) is tflops_moves and ("VRAM" in decision.message) is vram_moves


def test_compute_percent_is_decided_through_the_capacity_and_kept_as_percent() -> None:
    current = Share(Resources(percent=50_000, vram=8 * GIB), Resources(percent=100_000, vram=8 * GIB))
    decision = decide(usage_around(10, 2), current, capacity=Resources(tflops=100_000, vram=80 * GIB))
    request, limit = decision.share.request, decision.share.limit
    assert request.tflops == 0 and limit.tflops == 0
    assert 11_500 <= request.percent <= 13_000 and limit.percent == pytest.approx(2 * request.percent, abs=2)
    assert decision.share.to_status()["requests"]["compute"].endswith("m")
    assert "compute percent read through the GPU's 100 TFLOPS" in decision.message


def test_compute_percent_stays_when_the_capacity_is_unknown() -> None:
    current = Share(Resources(percent=50_000, vram=8 * GIB), Resources(percent=50_000, vram=8 * GIB))
    decision = decide(usage_around(10, 2), current, capacity=None)
    assert decision.changed and decision.share.request.percent == 50_000 and decision.share.request.vram < 8 * GIB
    assert "capacity is unknown" in decision.message
    only_compute = decide(usage_around(10, 2), current, capacity=None,
                          policy=AutoSetPolicy(enable=True, initial_delay_s=0, target_resource="compute"))
    assert (only_compute.reason, only_compute.changed) == ("ComputeUnconvertible", False)


def test_nothing_is_decided_when_disabled_early_or_without_samples() -> None:
    current = share(40, 8)
    disabled = decide(usage_around(10, 2), current, policy=AutoSetPolicy())
    early = decide(usage_around(10, 2), current, policy=AutoSetPolicy(enable=True), now=T0 + 600)
    empty = decide(WorkloadUsage(3600), current)
    assert [d.reason for d in (disabled, early, empty)] == ["Disabled", "InitialDelay", "NoSamples"]
    assert all(d.share == current and not d.changed and d.estimate is None for d in (disabled, early, empty))
    assert "initial delay of 30m after the workload started (20m left)" in early.message


def test_the_status_text_is_canonical_quantities() -> None:
    status = Share(Resources(tflops=11_500, vram=2 * GIB), Resources(tflops=23_000, vram=3 * GIB)).to_status()
    assert status == {"requests": {"tflops": "11500m", "vram": "2Gi"}, "limits": {"tflops": "23", "vram": "3Gi"}}


def test_a_cron_rule_decides_its_resources() -> None:
    amounts = Resources(tflops=5000, vram=GIB)
    rule = CronRule("night", CronSchedule.parse("0 22 * * *"), CronSchedule.parse("0 6 * * *"), amounts, amounts)
    decision = rule_decision(rule, share(40, 8))
    assert (decision.reason, decision.changed, decision.share) == ("CronRule", True, Share(amounts, amounts))
    assert "Cron rule 'night' is in force (start 0 22 * * *, end 0 6 * * *)" in decision.message
    assert not rule_decision(rule, Share(amounts, amounts)).changed


def test_usage_checkpoints_round_trip_and_refuse_garbage() -> None:
    usage = usage_around(10, 2, samples=50)
    restored = WorkloadUsage.from_checkpoint(ON.half_life_s, json.loads(json.dumps(usage.to_checkpoint())))
    assert (restored.samples, restored.first_at, restored.last_at) == (50, T0, T0 + 49 * 30.0)
    assert restored.tflops.buckets() == usage.tflops.buckets() and restored.vram.buckets() == usage.vram.buckets()
    assert decide(restored, share(40, 8)) == decide(usage, share(40, 8))
    for bad, named in (({"version": 1, "samples": -1}, "samples"), ({"version": 1, "samples": 1, "firstAt": "x"},
                                                                     "firstAt"), ("[]", "expected an object")):
        with pytest.raises(ValueError, match=named):
            WorkloadUsage.from_checkpoint(3600.0, bad)


def test_durations_read_as_go_writes_them() -> None:
    assert [span(s) for s in (21600, 5400, 45, 0, 2.5, 3661)] == ["6h", "1h30m", "45s", "0s", "2.5s", "1h1m1s"]


@settings(max_examples=150, deadline=None)
@given(use_t=st.floats(0, 2_000), use_v=st.floats(0, 100), req_t=st.integers(1, 1_000), req_v=st.integers(1, 80),
       orig_t=st.integers(1, 1_000), orig_v=st.integers(1, 80), limit_factor=st.sampled_from([0.0, 1.0, 1.5, 3.0]),
       threshold=st.sampled_from([0.0, 0.1, 0.3]))
def test_any_decision_respects_clamps_threshold_and_limits(use_t: float, use_v: float, req_t: int, req_v: int,
                                                           orig_t: int, orig_v: int, limit_factor: float,
                                                           threshold: float) -> None:
    policy = AutoSetPolicy(enable=True, initial_delay_s=0, update_threshold=threshold)
    usage = WorkloadUsage(policy.half_life_s)
    for n in range(20):
        usage.add(T0 + n, use_t * 1000 * (1 + n % 3 / 10), use_v * GIB * (1 + n % 4 / 10))
    current = share(req_t, req_v, req_t * limit_factor, req_v * limit_factor)
    original = share(orig_t, orig_v)
    decision = decide(usage, current, policy=policy, original=original)
    assert decision.changed == (decision.share != current) == (decision.reason == "Recommended")
    for kind, cap, low, high in (("tflops", H100.tflops, 0.1, 10.0), ("vram", H100.vram, 0.2, 5.0)):
        before = getattr(current.request, kind)
        after, limit = getattr(decision.share.request, kind), getattr(decision.share.limit, kind)
        base = getattr(original.request, kind)
        if after != before:
            assert math.ceil(low * base) <= after <= min(cap, math.floor(high * base))
            assert abs(after - before) / before >= threshold
            assert limit == 0 if limit_factor == 0 else after <= limit <= max(cap, after)
    assert decision.message.endswith(".") and decision.message.count("From ") == 1


def test_the_scales_keep_vram_and_tflops_units_apart() -> None:
    usage = usage_around(10, 2, samples=10)
    assert usage.tflops.scale is TFLOPS_SCALE and usage.vram.scale is VRAM_SCALE


def test_a_resource_without_a_request_is_not_given_one() -> None:
    vram_only = Share(Resources(vram=8 * GIB), Resources(vram=8 * GIB))
    decision = decide(usage_around(10, 2), vram_only)
    assert decision.changed and decision.share.request.tflops == 0 and decision.share.request.vram < 8 * GIB
    assert "TFLOPS has no request, so it is left alone" in decision.message
    nothing = decide(usage_around(10, 2), Share(Resources(), Resources()))
    assert (nothing.reason, nothing.changed) == ("NoRequest", False)


def test_a_compute_percent_that_stays_is_not_rounded_through_a_small_gpu() -> None:
    t4 = Resources(tflops=65_000, vram=16 * GIB)
    usage = usage_around(18, 2, spread=0.3)  # bounds about 18..23 TFLOPS: 33.335 % of 65 (21.67) lies within
    current = Share(Resources(percent=33_335, vram=8 * GIB), Resources(percent=33_335, vram=8 * GIB))
    decision = decide(usage, current, capacity=t4, policy=AutoSetPolicy(enable=True, initial_delay_s=0,
                                                                          margin=0.0))
    assert decision.changed and decision.share.request.vram < 8 * GIB  # VRAM moves
    assert "TFLOPS request 21667m kept, within" in decision.message
    assert decision.share.request.percent == 33_335 and decision.share.limit.percent == 33_335


def test_old_usage_fades_so_the_recommendation_follows_the_recent_one() -> None:
    usage = WorkloadUsage(ON.half_life_s)
    for n in range(500):
        usage.add(T0 + n * 30.0, 40_000.0, 8.0 * GIB)  # busy once
    later = T0 + 10 * ON.half_life_s  # ten half-lives on: those samples weigh 1/1024 each
    for n in range(100):
        usage.add(later + n * 30.0, 10_000.0, 2.0 * GIB)
    decision = decide(usage, share(40, 8), now=later + 3000)
    assert decision.estimate is not None
    assert decision.estimate.tflops_upper <= 10_000 * 1.15 * (1 + TFLOPS_SCALE.max_error) + 1
    assert decision.share.request.vram <= math.ceil(2 * GIB * 1.15 * (1 + VRAM_SCALE.max_error) / MIB) * MIB
    assert "From 600 samples" in decision.message


def test_a_ratio_clamp_keeps_vram_in_whole_mib() -> None:
    """0.2 x 8Gi is not a whole number of MiB; the request written is the next whole MiB, as the
    estimates are (a pod annotation and a GPU status then read as "1639Mi", not a bare byte count)."""
    usage = WorkloadUsage(ON.half_life_s)
    for i in range(20):
        usage.add(T0 + i, 1000, 0)
    ask = share(40, 8)
    decision = recommend(usage, ON, original=ask, current=ask, capacity=None, started_at=T0, now=T0 + 30)
    assert decision.share.request.vram == 1639 * MIB
    assert decision.share.to_status()["requests"]["vram"] == "1639Mi"
