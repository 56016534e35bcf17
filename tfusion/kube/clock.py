"""Time, injected: the work queue, the informers and the leader elector read it through a `Clock`.

Why: their behaviour is all about time (backoff, delayed requeue, lease expiry), and tests that
wait on the wall clock are slow and flaky on a loaded machine. With a `ManualClock` a test moves
time forward by hand and the code under test sees exactly that, nothing more.

A clock gives three things: `now()` (monotonic seconds), `sleep(seconds)`, and
`move_on_after(seconds)`, a cancel scope that expires when the clock reaches the deadline.
"""

from __future__ import annotations

import heapq
import itertools
import time
from typing import Protocol

import anyio


class Clock(Protocol):
    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...

    def move_on_after(self, seconds: float) -> anyio.CancelScope: ...


class MonotonicClock:
    """The real clock: `time.monotonic` and anyio's own timers."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(max(0.0, seconds))

    def move_on_after(self, seconds: float) -> anyio.CancelScope:
        return anyio.move_on_after(max(0.0, seconds))


#: the clock everything uses unless a test injects another
REAL_CLOCK = MonotonicClock()


class ManualClock:
    """A clock that moves only when a test calls `advance`; sleepers and scopes whose deadline has
    been reached are woken (or cancelled) then, in deadline order."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, anyio.Event | anyio.CancelScope]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await anyio.lowlevel.checkpoint()
            return
        woken = anyio.Event()
        heapq.heappush(self._timers, (self._now + seconds, next(self._seq), woken))
        await woken.wait()

    def move_on_after(self, seconds: float) -> anyio.CancelScope:
        scope = anyio.CancelScope()
        if seconds == float("inf"):
            return scope
        heapq.heappush(self._timers, (self._now + max(0.0, seconds), next(self._seq), scope))
        return scope

    @property
    def pending(self) -> int:
        """Timers not yet fired (sleepers and scopes)."""
        return len(self._timers)

    async def advance(self, seconds: float) -> None:
        """Move time forward, firing every timer due on the way, and let the woken tasks run."""
        target = self._now + seconds
        while self._timers and self._timers[0][0] <= target:
            deadline, _, timer = heapq.heappop(self._timers)
            self._now = max(self._now, deadline)
            if isinstance(timer, anyio.Event):
                timer.set()
            else:
                timer.cancel()
            await anyio.wait_all_tasks_blocked()
        self._now = target
        await anyio.wait_all_tasks_blocked()
