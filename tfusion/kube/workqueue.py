"""The work queue under every reconcile loop, in the style of client-go's workqueue.

Informer events only say "this key may need work"; the queue turns a burst of them into one
reconcile per key. Guarantees, as in client-go's workqueue:
- a key waiting in the queue is there once, however often it was added;
- a key is processed by one worker at a time; if it is added while being processed it runs again
  after the current run finishes;
- failures requeue with per-key exponential backoff (5 ms doubling to 1000 s) combined with an
  overall token bucket (10 qps, burst 100): the longer of the two delays wins;
- success forgets the key's failure count.
"""

from __future__ import annotations

import heapq
import logging
import weakref
from collections import deque
from collections.abc import Hashable

import anyio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tfusion.kube.backoff import Backoff, Failures
from tfusion.kube.client import TokenBucket
from tfusion.kube.clock import REAL_CLOCK, Clock

log = logging.getLogger(__name__)

Key = Hashable


class ShutDown(Exception):
    """The queue was shut down; workers stop."""


# --- rate limiting ----------------------------------------------------------------------------


#: client-go's ItemExponentialFailureRateLimiter numbers: 5 ms doubling per failure of a key, at most 1000 s
BACKOFF = Backoff(base=0.005, cap=1000.0)


class RateLimiter:
    """The default controller rate limiter: max(per-key exponential backoff, overall bucket)."""

    def __init__(self, *, base: float = BACKOFF.base, cap: float = BACKOFF.cap, qps: float = 10.0,
                 burst: int = 100, clock: Clock = REAL_CLOCK) -> None:
        self.backoff = Failures(Backoff(base=base, cap=cap))
        self.bucket = TokenBucket(qps, burst, clock=clock.now)

    def when(self, key: Key) -> float:
        return max(self.backoff.fail(key), self.bucket.reserve())

    def forget(self, key: Key) -> None:
        self.backoff.reset(key)

    def num_requeues(self, key: Key) -> int:
        return self.backoff.count(key)


# --- metrics ----------------------------------------------------------------------------------


class WorkQueueMetrics:
    """The metric families every queue and controller of one registry shares (label `name`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.depth = Gauge("tfusion_workqueue_depth", "keys waiting to be processed", ["name"],
                           registry=registry)
        self.adds = Counter("tfusion_workqueue_adds_total", "keys added (before de-duplication)", ["name"],
                            registry=registry)
        self.retries = Counter("tfusion_workqueue_retries_total", "rate-limited requeues after a failure",
                               ["name"], registry=registry)
        self.reconcile_time = Histogram(
            "tfusion_reconcile_duration_seconds", "time spent in one reconcile call", ["name"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=registry)
        self.reconciles = Counter("tfusion_reconcile_total", "reconcile calls by result", ["name", "result"],
                                  registry=registry)
        self.errors = Counter("tfusion_reconcile_errors_total", "reconcile calls that raised (requeued with "
                              "backoff)", ["name"], registry=registry)


_METRICS: weakref.WeakKeyDictionary[CollectorRegistry, WorkQueueMetrics] = weakref.WeakKeyDictionary()


def metrics_for(registry: CollectorRegistry | None) -> WorkQueueMetrics:
    """One WorkQueueMetrics per registry (registering the same family twice is an error)."""
    registry = registry if registry is not None else CollectorRegistry()
    found = _METRICS.get(registry)
    if found is None:
        found = _METRICS[registry] = WorkQueueMetrics(registry)
    return found


# --- the queue --------------------------------------------------------------------------------


class WorkQueue:
    """De-duplicating, delaying, rate-limited queue of keys (see the module docstring)."""

    def __init__(self, name: str, *, rate_limiter: RateLimiter | None = None,
                 registry: CollectorRegistry | None = None, clock: Clock = REAL_CLOCK) -> None:
        self.name = name
        self.rate_limiter = rate_limiter or RateLimiter()
        self.clock = clock
        self._queue: deque[Key] = deque()
        self._dirty: set[Key] = set()
        self._processing: set[Key] = set()
        self._waiting: dict[Key, float] = {}  # key -> monotonic time it becomes ready (earliest wins)
        self._heap: list[tuple[float, int, Key]] = []
        self._seq = 0
        self._changed = anyio.Event()
        self._shutting_down = False
        metrics = metrics_for(registry)
        self._depth = metrics.depth.labels(name)
        self._adds = metrics.adds.labels(name)
        self._retries = metrics.retries.labels(name)

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def add(self, key: Key) -> None:
        if self._shutting_down:
            return
        self._adds.inc()
        if key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:
            return  # done() puts it back once the running reconcile finishes
        self._queue.append(key)
        self._depth.set(len(self._queue))
        self._notify()

    def add_after(self, key: Key, delay: float) -> None:
        if self._shutting_down:
            return
        if delay <= 0:
            self.add(key)
            return
        ready_at = self.clock.now() + delay
        current = self._waiting.get(key)
        if current is not None and current <= ready_at:
            return
        self._waiting[key] = ready_at
        self._seq += 1
        heapq.heappush(self._heap, (ready_at, self._seq, key))
        self._notify()

    def add_rate_limited(self, key: Key) -> None:
        self._retries.inc()
        self.add_after(key, self.rate_limiter.when(key))

    def forget(self, key: Key) -> None:
        self.rate_limiter.forget(key)

    def num_requeues(self, key: Key) -> int:
        return self.rate_limiter.num_requeues(key)

    def _promote_due(self) -> float | None:
        """Move delayed keys whose time has come into the queue; return seconds to the next one."""
        now = self.clock.now()
        while self._heap:
            ready_at, _, key = self._heap[0]
            if self._waiting.get(key) != ready_at:
                heapq.heappop(self._heap)  # superseded by an earlier deadline
                continue
            if ready_at > now:
                return ready_at - now
            heapq.heappop(self._heap)
            del self._waiting[key]
            self.add(key)
        return None

    async def get(self) -> Key:
        """The next key to process; the caller must call `done(key)` afterwards."""
        while True:
            if self._shutting_down:
                raise ShutDown(self.name)
            next_due = self._promote_due()
            if self._queue:
                key = self._queue.popleft()
                self._depth.set(len(self._queue))
                self._processing.add(key)
                self._dirty.discard(key)
                return key
            changed = self._changed
            with self.clock.move_on_after(next_due if next_due is not None else float("inf")):
                await changed.wait()

    def done(self, key: Key) -> None:
        self._processing.discard(key)
        if key in self._dirty and not self._shutting_down:
            self._queue.append(key)
            self._depth.set(len(self._queue))
            self._notify()

    def shutdown(self) -> None:
        self._shutting_down = True
        self._notify()
