"""Decaying histograms (tfusion.controller.autoscaler.histogram): percentiles against exact sample
percentiles within the bucket error, decay by half-life, reference moves, checkpoints."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfusion.controller.autoscaler.histogram import (
    TFLOPS_SCALE,
    VRAM_SCALE,
    BucketScale,
    DecayingHistogram,
)

T0 = 1_800_000_000.0
HOUR = 3600.0


def exact_percentile(values: list[float], p: float) -> float:
    """The smallest sample with at least p of the samples at or below it."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p * len(ordered)))
    return ordered[rank - 1]


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.floats(min_value=1.0, max_value=9_000_000.0), min_size=1, max_size=300),
       ps=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=4))
def test_percentiles_are_within_the_bucket_error_of_the_exact_ones(values: list[float], ps: list[float]) -> None:
    histogram = DecayingHistogram(TFLOPS_SCALE, HOUR)
    for value in values:
        histogram.add(value, T0)
    found = histogram.percentiles(*ps)
    for p, estimate in zip(ps, found, strict=True):
        exact = exact_percentile(values, p)
        assert abs(estimate - exact) <= exact * TFLOPS_SCALE.max_error * (1 + 1e-9), (p, exact, estimate)


def test_the_scales_cover_their_ranges_at_five_percent() -> None:
    assert TFLOPS_SCALE.max_error <= 0.05 and VRAM_SCALE.max_error <= 0.05
    for scale, top in ((TFLOPS_SCALE, 10_000_000.0), (VRAM_SCALE, float(2 << 40))):
        near_top = top * 0.999
        assert abs(scale.value(scale.index(near_top)) - near_top) <= near_top * scale.max_error
        assert scale.index(top * 10) == scale.bucket_count - 1


def test_values_below_the_first_bucket_count_as_zero() -> None:
    histogram = DecayingHistogram(VRAM_SCALE, HOUR)
    histogram.add(1000.0, T0)
    assert histogram.percentiles(0.5) == (0.0,)


@settings(max_examples=100, deadline=None)
@given(half_lives=st.floats(min_value=0.0, max_value=40.0), half_life=st.floats(min_value=1.0, max_value=1e6))
def test_a_sample_weighs_half_as_much_per_half_life_of_age(half_lives: float, half_life: float) -> None:
    histogram = DecayingHistogram(TFLOPS_SCALE, half_life)
    histogram.add(1000.0, T0)
    later = T0 + half_lives * half_life
    histogram.add(100_000.0, later)
    (old, _), (new, _) = ((w, i) for i, w in histogram.buckets())
    assert old / new == pytest.approx(2.0 ** -((later - T0) / half_life), rel=1e-9)  # `later` as stored
    assert old / new == pytest.approx(2.0 ** -half_lives, rel=1e-6)


def test_equal_weight_decides_the_median_and_decay_moves_it_to_the_newer_samples() -> None:
    histogram = DecayingHistogram(TFLOPS_SCALE, HOUR)
    for _ in range(10):
        histogram.add(1000.0, T0)
    for _ in range(10):
        histogram.add(50_000.0, T0 + 2 * HOUR)  # each new sample weighs 4 old ones
    median, = histogram.percentiles(0.5)
    assert median == pytest.approx(50_000.0, rel=TFLOPS_SCALE.max_error)
    low, = histogram.percentiles(0.19)  # the old samples hold 10/50 of the weight
    assert low == pytest.approx(1000.0, rel=TFLOPS_SCALE.max_error)


def test_the_reference_moves_and_drops_negligible_buckets_without_changing_percentiles() -> None:
    histogram = DecayingHistogram(TFLOPS_SCALE, 60.0)
    histogram.add(10.0, T0)
    for minute in range(1, 200):
        histogram.add(5000.0, T0 + minute * 60.0)  # 200 half-lives later: the first sample has faded
    assert histogram.reference is not None and histogram.reference > T0
    assert [i for i, _ in histogram.buckets()] == [TFLOPS_SCALE.index(5000.0)]
    assert histogram.percentiles(0.0, 1.0) == pytest.approx((5000.0, 5000.0), rel=TFLOPS_SCALE.max_error)
    assert all(math.isfinite(w) for _, w in histogram.buckets())


def test_percentiles_come_back_in_the_order_asked_and_zero_when_empty() -> None:
    histogram = DecayingHistogram(TFLOPS_SCALE, HOUR)
    assert histogram.empty and histogram.percentiles(0.5, 0.9) == (0.0, 0.0)
    for value in range(1, 101):
        histogram.add(value * 100.0, T0)
    high, low = histogram.percentiles(0.99, 0.1)
    assert high > low


@settings(max_examples=100, deadline=None)
@given(samples=st.lists(st.tuples(st.floats(min_value=0.0, max_value=3e12), st.floats(min_value=0, max_value=1e7)),
                        min_size=0, max_size=60))
def test_a_checkpoint_round_trips_through_json(samples: list[tuple[float, float]]) -> None:
    histogram = DecayingHistogram(VRAM_SCALE, HOUR)
    for value, offset in samples:
        histogram.add(value, T0 + offset)
    data = json.loads(json.dumps(histogram.to_checkpoint()))
    restored = DecayingHistogram.from_checkpoint(VRAM_SCALE, HOUR, data)
    assert restored.buckets() == histogram.buckets()
    assert restored.reference == histogram.reference
    ps = (0.0, 0.5, 0.98, 1.0)
    assert restored.percentiles(*ps) == histogram.percentiles(*ps)


@pytest.mark.parametrize(("data", "named"), [
    ([], "expected an object"),
    ({"version": 2, "reference": T0, "buckets": []}, "version"),
    ({"version": 1, "reference": "x", "buckets": [[3, 1.0]]}, "reference"),
    ({"version": 1, "reference": T0, "buckets": [[3, -1.0]]}, "buckets[0]: weight"),
    ({"version": 1, "reference": T0, "buckets": [[999, 1.0]]}, "buckets[0]: index"),
    ({"version": 1, "reference": T0, "buckets": [[4, 1.0], [3, 1.0]]}, "buckets[1]: index 3 is not above"),
    ({"version": 1, "reference": T0, "buckets": "no"}, "buckets: expected a list"),
])
def test_a_bad_checkpoint_is_refused_naming_the_part(data: object, named: str) -> None:
    with pytest.raises(ValueError, match="histogram checkpoint") as caught:
        DecayingHistogram.from_checkpoint(TFLOPS_SCALE, HOUR, data)
    assert named in str(caught.value)


@pytest.mark.parametrize(("value", "weight", "at"), [(-1.0, 1.0, T0), (math.nan, 1.0, T0), (math.inf, 1.0, T0),
                                                     (1.0, 0.0, T0), (1.0, 1.0, math.nan)])
def test_bad_samples_are_refused(value: float, weight: float, at: float) -> None:
    with pytest.raises(ValueError, match="is not a finite"):
        DecayingHistogram(TFLOPS_SCALE, HOUR).add(value, at, weight)


def test_bad_scales_and_half_lives_are_refused() -> None:
    with pytest.raises(ValueError, match="ratio"):
        BucketScale(1.0, 1.0, 10.0)
    with pytest.raises(ValueError, match="max_value"):
        BucketScale(10.0, 1.1, 5.0)
    with pytest.raises(ValueError, match="half_life_s"):
        DecayingHistogram(TFLOPS_SCALE, 0.0)


def test_memory_is_bounded_by_the_bucket_count_not_the_samples() -> None:
    histogram = DecayingHistogram(TFLOPS_SCALE, HOUR)
    for n in range(20_000):
        histogram.add(float(1 + n % 50_000) * 200, T0 + n)
    assert len(histogram.buckets()) <= TFLOPS_SCALE.bucket_count


def exact_weighted(pairs: list[tuple[float, float]], p: float) -> float:
    """The smallest value whose cumulative weight (values in order) reaches p of the total."""
    ordered = sorted(pairs)
    total = sum(w for _, w in ordered)
    running = 0.0
    for value, weight in ordered:
        running += weight
        if running >= p * total:
            return value
    return ordered[-1][0]


@settings(max_examples=150, deadline=None)
@given(pairs=st.lists(st.tuples(st.floats(min_value=1.0, max_value=9_000_000.0),
                                st.floats(min_value=1e-3, max_value=1e3)), min_size=1, max_size=200),
       p=st.floats(min_value=0.0, max_value=1.0))
def test_weighted_percentiles_are_within_the_bucket_error(pairs: list[tuple[float, float]], p: float) -> None:
    histogram = DecayingHistogram(TFLOPS_SCALE, HOUR)
    for value, weight in pairs:
        histogram.add(value, T0, weight)
    estimate, = histogram.percentiles(p)
    # sums in another order may round across the threshold: the answer lies between p's neighbours
    low, high = exact_weighted(pairs, max(0.0, p - 1e-9)), exact_weighted(pairs, min(1.0, p + 1e-9))
    error = TFLOPS_SCALE.max_error * (1 + 1e-9)
    assert low * (1 - error) <= estimate <= high * (1 + error)
