"""The work queue and reconcile loop: de-duplication, one worker per key, backoff, requeue_after.

Time is a `ManualClock` wherever it matters, so no test depends on how fast the machine is."""

from __future__ import annotations

import itertools

import anyio
import pytest
from prometheus_client import CollectorRegistry

from tfusion.kube.backoff import Failures
from tfusion.kube.client import TokenBucket
from tfusion.kube.clock import ManualClock
from tfusion.kube.reconciler import Controller, Result
from tfusion.kube.workqueue import BACKOFF, RateLimiter, WorkQueue

pytestmark = pytest.mark.anyio


async def test_a_key_added_many_times_waits_once() -> None:
    queue = WorkQueue("dedup")
    for _ in range(5):
        queue.add("a")
    queue.add("b")
    assert len(queue) == 2
    assert await queue.get() == "a"
    assert await queue.get() == "b"
    with anyio.move_on_after(0.05) as scope:
        await queue.get()
    assert scope.cancelled_caught, "nothing else should be queued"


async def test_key_added_while_processing_runs_again_after_done() -> None:
    queue = WorkQueue("reprocess")
    queue.add("a")
    key = await queue.get()
    queue.add("a")  # arrives while "a" is being processed
    assert len(queue) == 0, "must not be handed to a second worker while the first holds it"
    queue.done(key)
    assert len(queue) == 1
    assert await queue.get() == "a"


async def test_add_after_keeps_the_earliest_deadline() -> None:
    clock = ManualClock()
    queue = WorkQueue("delay", clock=clock)
    queue.add_after("a", 5.0)
    queue.add_after("a", 0.02)
    queue.add_after("a", 3.0)
    got: list[str] = []

    async def take() -> None:
        got.append(str(await queue.get()))

    async with anyio.create_task_group() as tg:
        tg.start_soon(take)
        await clock.advance(0.019)
        assert got == [], "not before its time"
        await clock.advance(0.001)
        assert got == ["a"]
    assert len(queue) == 0, "the later deadlines were superseded, not queued again"
    await clock.advance(10)
    assert len(queue) == 0


def test_exponential_backoff_doubles_from_5ms_to_1000s_and_forgets() -> None:
    backoff = Failures(BACKOFF)
    delays = [backoff.fail("k") for _ in range(20)]
    assert delays[:4] == [0.005, 0.01, 0.02, 0.04]
    assert delays[-1] == 1000.0
    assert all(b >= a for a, b in itertools.pairwise(delays))
    assert backoff.fail("other") == 0.005, "backoff is per key"
    backoff.reset("k")
    assert backoff.fail("k") == 0.005
    for _ in range(200):
        assert backoff.fail("huge") <= 1000.0


def test_overall_bucket_limits_after_burst() -> None:
    now = [0.0]
    bucket = TokenBucket(10, 3, clock=lambda: now[0])
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.reserve() == pytest.approx(0.1)
    assert bucket.reserve() == pytest.approx(0.2)
    now[0] = 10.0  # refilled, but never above the burst
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.reserve() > 0
    limiter = RateLimiter(qps=10, burst=1)
    assert limiter.when("a") == 0.005
    assert limiter.when("b") >= 0.09, "the bucket delay wins over a short per-key backoff"


async def test_controller_never_runs_one_key_twice_at_once() -> None:
    running: dict[str, int] = {}
    max_seen: dict[str, int] = {}
    calls: dict[str, int] = {}

    async def reconcile(key: str) -> None:
        running[key] = running.get(key, 0) + 1
        max_seen[key] = max(max_seen.get(key, 0), running[key])
        calls[key] = calls.get(key, 0) + 1
        await anyio.sleep(0.01)
        running[key] -= 1

    controller = Controller("exclusive", reconcile, workers=8)
    async with anyio.create_task_group() as tg:
        await tg.start(controller.run)
        for _ in range(30):
            for key in ("a", "b", "c"):
                controller.enqueue(key)
            await anyio.sleep(0.003)
        with anyio.fail_after(5):
            while len(controller.queue) or any(running.values()):
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert max_seen == {"a": 1, "b": 1, "c": 1}
    # keys re-added while running are processed again, but bursts collapse
    assert all(2 <= n < 30 for n in calls.values()), calls


async def test_controller_backs_off_on_errors_then_forgets() -> None:
    clock = ManualClock()
    times: list[float] = []
    registry = CollectorRegistry()

    async def reconcile(key: str) -> Result | None:
        times.append(clock.now())
        if len(times) <= 5:
            raise RuntimeError("not yet")
        return None

    controller = Controller("backoff", reconcile, registry=registry, clock=clock)
    async with anyio.create_task_group() as tg:
        await tg.start(controller.run)
        controller.enqueue("k")
        await anyio.wait_all_tasks_blocked()
        for _ in range(200):  # 1 ms steps: each retry fires exactly when its backoff has passed
            if len(times) >= 6:
                break
            await clock.advance(0.001)
        tg.cancel_scope.cancel()
    gaps = [round(b - a, 6) for a, b in itertools.pairwise(times)]
    assert gaps == [0.005, 0.01, 0.02, 0.04, 0.08], "5 ms doubling per failure"
    assert controller.queue.num_requeues("k") == 0, "success forgets the failures"
    assert registry.get_sample_value("tfusion_workqueue_retries_total", {"name": "backoff"}) == 5
    assert registry.get_sample_value("tfusion_reconcile_total", {"name": "backoff", "result": "error"}) == 5
    assert registry.get_sample_value("tfusion_reconcile_errors_total", {"name": "backoff"}) == 5
    assert registry.get_sample_value("tfusion_reconcile_total", {"name": "backoff", "result": "success"}) == 1
    assert registry.get_sample_value("tfusion_reconcile_duration_seconds_count", {"name": "backoff"}) == 6
    assert registry.get_sample_value("tfusion_workqueue_adds_total", {"name": "backoff"}) == 6


async def test_requeue_after_runs_again_later() -> None:
    clock = ManualClock()
    times: list[float] = []

    async def reconcile(key: str) -> Result:
        times.append(clock.now())
        return Result(requeue_after=30) if len(times) == 1 else Result()

    controller = Controller("after", reconcile, clock=clock)
    async with anyio.create_task_group() as tg:
        await tg.start(controller.run)
        controller.enqueue("k")
        await anyio.wait_all_tasks_blocked()
        await clock.advance(29.9)
        assert len(times) == 1
        await clock.advance(0.1)
        assert len(times) == 2 and times[1] - times[0] == pytest.approx(30)
        await clock.advance(100)
        tg.cancel_scope.cancel()
    assert len(times) == 2


async def test_a_stopped_controller_runs_again_with_a_fresh_queue() -> None:
    """A leader-only controller is cancelled when its replica stops leading and run again when it
    leads again: the second run must work (the first run's queue is shut down for good)."""
    seen: list[str] = []

    async def reconcile(key: str) -> None:
        seen.append(key)

    controller = Controller("again", reconcile)
    for term in range(3):
        async with anyio.create_task_group() as tg:
            await tg.start(controller.run)
            assert controller.running
            controller.enqueue(f"term-{term}")
            with anyio.fail_after(5):
                while f"term-{term}" not in seen:
                    await anyio.sleep(0)
            tg.cancel_scope.cancel()
        assert not controller.running and controller.queue.shutting_down
    assert seen == ["term-0", "term-1", "term-2"]


async def test_cancelled_controller_shuts_its_queue() -> None:
    async def reconcile(key: str) -> None:
        return None

    controller = Controller("stop", reconcile, workers=3)
    async with anyio.create_task_group() as tg:
        await tg.start(controller.run)
        tg.cancel_scope.cancel()
    assert controller.queue.shutting_down
    controller.enqueue("x")
    assert len(controller.queue) == 0


def test_workers_must_be_positive() -> None:
    async def reconcile(key: str) -> None:
        return None

    with pytest.raises(ValueError, match="workers=0"):
        Controller("bad", reconcile, workers=0)
