"""The one rule for "how long to wait after the n-th failure in a row", used by every retry loop.

Why it exists: the work queue, the informer's reconnects, the scheduling queue, the local-worker
supervisor, the metrics push and the cluster reconciler each grew their own doubling loop, and
they disagreed on small things (where the count starts, whether jitter may exceed the cap). Each
now keeps only its numbers (a `Backoff`) and asks this module for the delay.

The rule, for `n` consecutive failures (n >= 1):

    envelope = base * factor ** (n - 1)
    delay    = clamp(envelope * (1 - jitter + 2 * jitter * u), base, cap)     u uniform in [0, 1)

so the mean delay follows the envelope, `jitter` (0 to 1) is how far either side of it a delay may
land, the first wait is never under `base` and no wait is ever over `cap`. No failure, no wait:
`delay(0) == 0`.

Nothing here sleeps or reads a clock: callers sleep, schedule or requeue with the number they get,
so the same rule serves async loops, heaps of due times and requeue-after results alike.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

#: exponents past this are far beyond any cap; stopping there keeps the float finite
_MAX_EXPONENT = 64


@dataclass(frozen=True)
class Backoff:
    """One retry loop's numbers: the first wait, the growth per failure, the cap and the jitter."""

    base: float
    cap: float
    factor: float = 2.0
    #: 0: exact delays; 0.5: each delay lands in 50-150 % of the envelope; 1: 0-200 %
    jitter: float = 0.0
    #: the source of `u`; tests give a fixed one
    rng: Callable[[], float] = field(default=random.random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.base <= self.cap:
            raise ValueError(f"backoff needs 0 < base <= cap, got base={self.base} cap={self.cap}")
        if self.factor < 1:
            raise ValueError(f"backoff factor must be at least 1, got {self.factor}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"backoff jitter must be within 0..1, got {self.jitter}")

    def delay(self, failures: int) -> float:
        """Seconds to wait after `failures` failures in a row (see the module docstring)."""
        if failures <= 0:
            return 0.0
        envelope = self.base * self.factor ** min(failures - 1, _MAX_EXPONENT)
        if self.jitter:
            envelope *= 1.0 - self.jitter + 2.0 * self.jitter * self.rng()
        return float(min(self.cap, max(self.base, envelope)))


class Failures:
    """Consecutive-failure counts under one `Backoff`, per key (`None` for a loop with one stream).

    `fail(key)` counts a failure and returns the wait before the next try; `reset(key)` after a
    success starts the key over at `base`."""

    __slots__ = ("_counts", "policy")

    def __init__(self, policy: Backoff) -> None:
        self.policy = policy
        self._counts: dict[Hashable, int] = {}

    def fail(self, key: Hashable = None) -> float:
        count = self._counts.get(key, 0) + 1
        self._counts[key] = count
        return self.policy.delay(count)

    def reset(self, key: Hashable = None) -> None:
        self._counts.pop(key, None)

    def count(self, key: Hashable = None) -> int:
        """Failures in a row so far (0 after a reset or for a key never seen)."""
        return self._counts.get(key, 0)
