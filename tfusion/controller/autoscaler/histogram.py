"""Decaying usage histograms: bounded memory per workload, however long its history.

Why it exists: the recommender needs percentiles of a workload's TFLOPS and VRAM use over its
history period, for thousands of workloads, without keeping the samples. This is the VPA's
approach (our own code): values fall into exponential buckets, and a sample's weight grows
exponentially with its time, `2 ** ((at - reference) / half_life)`, so a sample one half-life older
than another counts half as much; old samples fade without being stored or removed. When the
exponent grows large the reference moves forward and every weight is scaled down by the same factor
(percentiles depend only on the ratios of weights, so nothing changes but the numbers' size).

Buckets (`BucketScale`): bucket 0 holds values below `first`; bucket i >= 1 holds
[first * ratio**(i-1), first * ratio**i); values at or above `max_value` land in the last bucket. A
percentile is reported as its bucket's geometric middle, so for values in [first, max_value) it is
within `sqrt(ratio) - 1` (4.9 % at ratio 1.1) of the exact sample percentile; bucket 0 reports 0.

Storage: a workload's usage spans few buckets, so a histogram keeps one `array('d')` over the window
of buckets between the lowest and highest it has seen (plus that window's first index): about
200 bytes for a typical workload, never more than the scale's bucket count of doubles. When the
reference moves, edge buckets whose weight fell below 1e-12 of the total are dropped (they could
only decide a percentile below 1e-12).
"""

from __future__ import annotations

import math
import sys
from array import array
from typing import Final

MIB: Final = 1 << 20
#: the exponent at which the reference time moves forward (2**64 keeps sums far from overflow)
MAX_EXPONENT: Final = 64.0
#: edge buckets lighter than this fraction of the total are dropped when the reference moves
NEGLIGIBLE: Final = 1e-12
CHECKPOINT_VERSION: Final = 1


class BucketScale:
    """Exponential bucket boundaries: `first` (the lower edge of bucket 1), `ratio` between
    consecutive edges (> 1), and `max_value` from which on every value shares the last bucket."""

    __slots__ = ("_inv_log_ratio", "_last", "bucket_count", "first", "max_value", "ratio")

    def __init__(self, first: float, ratio: float, max_value: float) -> None:
        if not (first > 0 and math.isfinite(first)):
            raise ValueError(f"BucketScale.first: {first!r} is not a positive finite number")
        if not (ratio > 1 and math.isfinite(ratio)):
            raise ValueError(f"BucketScale.ratio: {ratio!r} is not a finite number above 1")
        if not (max_value > first and math.isfinite(max_value)):
            raise ValueError(f"BucketScale.max_value: {max_value!r} is not a finite number above first ({first})")
        self.first = float(first)
        self.ratio = float(ratio)
        self.max_value = float(max_value)
        self._inv_log_ratio = 1.0 / math.log(ratio)
        # bucket 0, then enough buckets to reach max_value; the last one is open-ended
        self._last = 1 + math.ceil(math.log(max_value / first) * self._inv_log_ratio)
        self.bucket_count = self._last + 1

    @property
    def max_error(self) -> float:
        """The largest relative error of a reported percentile for values in [first, max_value)."""
        return math.sqrt(self.ratio) - 1.0

    def index(self, value: float) -> int:
        """The bucket of `value` (>= 0)."""
        if value < self.first:
            return 0
        return min(1 + int(math.log(value / self.first) * self._inv_log_ratio), self._last)

    def value(self, index: int) -> float:
        """The value a percentile falling in bucket `index` reports: its geometric middle (0 for bucket 0)."""
        if index <= 0:
            return 0.0
        return float(self.first * self.ratio ** (index - 0.5))

    def __repr__(self) -> str:
        return f"BucketScale(first={self.first}, ratio={self.ratio}, max_value={self.max_value})"


#: milli-TFLOPS: 1 milli-TFLOPS to 10 PFLOPS at <= 4.9 % error
TFLOPS_SCALE: Final = BucketScale(1.0, 1.1, 10_000_000.0)
#: bytes: 1 MiB to 2 TiB at <= 4.9 % error
VRAM_SCALE: Final = BucketScale(float(MIB), 1.1, float(2 << 40))


class DecayingHistogram:
    """Weighted samples of one quantity in exponential buckets, older samples weighing less.

    `half_life_s`: after this many seconds a sample counts half as much as a new one.
    """

    __slots__ = ("_low", "_reference", "_weights", "half_life_s", "scale")

    def __init__(self, scale: BucketScale, half_life_s: float) -> None:
        if not (half_life_s > 0 and math.isfinite(half_life_s)):
            raise ValueError(f"half_life_s: {half_life_s!r} is not a positive finite number of seconds")
        self.scale = scale
        self.half_life_s = float(half_life_s)
        self._reference: float | None = None
        self._low = 0  # the bucket index of _weights[0]
        self._weights = array("d")

    @property
    def empty(self) -> bool:
        return not self._weights

    @property
    def reference(self) -> float | None:
        """The time at which a sample weighs exactly its own weight (None before the first sample)."""
        return self._reference

    def add(self, value: float, at: float, weight: float = 1.0) -> None:
        """Count `value` (>= 0; above the scale's maximum counts as the maximum) observed at `at`
        (unix seconds) with `weight` (> 0). Samples may arrive in any order."""
        if not (0.0 <= value < math.inf):
            raise ValueError(f"histogram value: {value!r} is not a finite number >= 0")
        if not (0.0 < weight < math.inf):
            raise ValueError(f"histogram weight: {weight!r} is not a finite number > 0")
        if not math.isfinite(at):
            raise ValueError(f"sample time: {at!r} is not a finite unix time")
        if self._reference is None:
            self._reference = at
        exponent = (at - self._reference) / self.half_life_s
        if exponent > MAX_EXPONENT:
            self._move_reference(at)
            exponent = 0.0
        decayed = weight * 2.0 ** exponent
        if decayed == 0.0:
            return  # so much older than the reference that it no longer counts
        self._add_to_bucket(self.scale.index(value), decayed)

    def _add_to_bucket(self, index: int, weight: float) -> None:
        weights = self._weights
        if not weights:
            self._low = index
            weights.append(weight)
            return
        offset = index - self._low
        if offset < 0:
            weights[0:0] = array("d", bytes(8 * -offset))
            self._low = index
            offset = 0
        elif offset >= len(weights):
            weights.extend(array("d", bytes(8 * (offset - len(weights) + 1))))
        weights[offset] += weight

    def _move_reference(self, to: float) -> None:
        """Make `to` the reference: every weight scaled by 2 ** ((old - to) / half_life)."""
        assert self._reference is not None
        factor = 2.0 ** ((self._reference - to) / self.half_life_s)
        self._reference = to
        weights = self._weights
        for i, weight in enumerate(weights):
            weights[i] = weight * factor
        self._trim()

    def _trim(self) -> None:
        weights = self._weights
        floor = sum(weights) * NEGLIGIBLE
        start, end = 0, len(weights)
        while start < end and weights[start] <= floor:
            start += 1
        while end > start and weights[end - 1] <= floor:
            end -= 1
        if (start, end) != (0, len(weights)):
            self._weights = weights[start:end]
            self._low += start

    def footprint(self) -> int:
        """Bytes this histogram holds (the object and its bucket array, as sys.getsizeof counts them)."""
        return sys.getsizeof(self) + sys.getsizeof(self._weights)

    def total_weight(self) -> float:
        """The sum of the (decayed) weights, relative to the reference time."""
        return math.fsum(self._weights)

    def percentiles(self, *ps: float) -> tuple[float, ...]:
        """The value at each fraction p (0..1) of the total weight, in one scan: the middle of the
        lowest bucket whose cumulative weight reaches p of the total. 0.0 each when empty."""
        for p in ps:
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"percentile: {p!r} is not a fraction between 0 and 1")
        weights = self._weights
        if not weights:
            return tuple(0.0 for _ in ps)
        total = sum(weights)
        order = sorted(range(len(ps)), key=ps.__getitem__)
        found = [0.0] * len(ps)
        position, cumulative, last = 0, 0.0, len(weights) - 1
        value_of, low = self.scale.value, self._low
        for slot in order:
            threshold = ps[slot] * total
            while position < last and cumulative + weights[position] < threshold:
                cumulative += weights[position]
                position += 1
            found[slot] = value_of(low + position)
        return tuple(found)

    def buckets(self) -> list[tuple[int, float]]:
        """The non-empty buckets as (index, weight relative to the reference), lowest first."""
        low = self._low
        return [(low + i, w) for i, w in enumerate(self._weights) if w > 0.0]

    def to_checkpoint(self) -> dict[str, object]:
        """A JSON-able, compact form: the reference time and the non-empty buckets."""
        return {"version": CHECKPOINT_VERSION, "reference": self._reference,
                "buckets": [[i, w] for i, w in self.buckets()]}

    @classmethod
    def from_checkpoint(cls, scale: BucketScale, half_life_s: float, data: object) -> DecayingHistogram:
        """The histogram `to_checkpoint` described; ValueError naming the part that is wrong."""
        histogram = cls(scale, half_life_s)
        if not isinstance(data, dict):
            raise ValueError(f"histogram checkpoint: expected an object, got {type(data).__name__}")
        if data.get("version") != CHECKPOINT_VERSION:
            raise ValueError(f"histogram checkpoint.version: {data.get('version')!r} is not {CHECKPOINT_VERSION}")
        reference, buckets = data.get("reference"), data.get("buckets")
        if not isinstance(buckets, list):
            raise ValueError(f"histogram checkpoint.buckets: expected a list, got {type(buckets).__name__}")
        if buckets and not _is_finite_number(reference):
            raise ValueError(f"histogram checkpoint.reference: {reference!r} is not a finite unix time")
        previous = -1
        for n, item in enumerate(buckets):
            index, weight = _bucket_entry(item, n, scale.bucket_count)
            if index <= previous:
                raise ValueError(f"histogram checkpoint.buckets[{n}]: index {index} is not above the one before")
            previous = index
            histogram._add_to_bucket(index, weight)
        if buckets:
            assert isinstance(reference, (int, float))
            histogram._reference = float(reference)
        return histogram


def _is_finite_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _bucket_entry(item: object, n: int, count: int) -> tuple[int, float]:
    where = f"histogram checkpoint.buckets[{n}]"
    if not (isinstance(item, list) and len(item) == 2):
        raise ValueError(f"{where}: {item!r} is not an [index, weight] pair")
    index, weight = item
    if not (isinstance(index, int) and not isinstance(index, bool) and 0 <= index < count):
        raise ValueError(f"{where}: index {index!r} is not an integer in 0..{count - 1}")
    if not (_is_finite_number(weight) and weight > 0):
        raise ValueError(f"{where}: weight {weight!r} is not a finite number > 0")
    return index, float(weight)
