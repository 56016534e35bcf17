"""The work queue and reconcile loop: de-duplication, one worker per key, backoff, requeue_after."""

from __future__ import annotations

import itertools
import time

import anyio
import pytest
from prometheus_client import CollectorRegistry

from tfusion.kube.client import TokenBucket
from tfusion.kube.workqueue import Controller, ExponentialBackoff, RateLimiter, Result, WorkQueue

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
    queue = WorkQueue("delay")
    queue.add_after("a", 5.0)
    queue.add_after("a", 0.02)
    queue.add_after("a", 3.0)
    started = time.monotonic()
    with anyio.fail_after(2):
        assert await queue.get() == "a"
    assert 0.015 <= time.monotonic() - started < 1.0


def test_exponential_backoff_doubles_from_5ms_to_1000s_and_forgets() -> None:
    backoff = ExponentialBackoff()
    delays = [backoff.when("k") for _ in range(20)]
    assert delays[:4] == [0.005, 0.01, 0.02, 0.04]
    assert delays[-1] == 1000.0
    assert all(b >= a for a, b in itertools.pairwise(delays))
    assert backoff.when("other") == 0.005, "backoff is per key"
    backoff.forget("k")
    assert backoff.when("k") == 0.005
    for _ in range(200):
        assert backoff.when("huge") <= 1000.0


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
    times: list[float] = []
    registry = CollectorRegistry()

    async def reconcile(key: str) -> Result | None:
        times.append(time.monotonic())
        if len(times) <= 5:
            raise RuntimeError("not yet")
        return None

    controller = Controller("backoff", reconcile, registry=registry)
    async with anyio.create_task_group() as tg:
        await tg.start(controller.run)
        controller.enqueue("k")
        with anyio.fail_after(5):
            while len(times) < 6:
                await anyio.sleep(0.005)
        await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # 5 ms, 10, 20, 40, 80: each wait at least its backoff, and growing overall
    for gap, expected in zip(gaps, (0.005, 0.01, 0.02, 0.04, 0.08), strict=True):
        assert gap >= expected * 0.9, (gaps, expected)
    assert gaps[-1] > gaps[0]
    assert controller.queue.num_requeues("k") == 0, "success forgets the failures"
    assert registry.get_sample_value("tfusion_workqueue_retries_total", {"name": "backoff"}) == 5
    assert registry.get_sample_value("tfusion_reconcile_total", {"name": "backoff", "result": "error"}) == 5
    assert registry.get_sample_value("tfusion_reconcile_total", {"name": "backoff", "result": "success"}) == 1
    assert registry.get_sample_value("tfusion_reconcile_duration_seconds_count", {"name": "backoff"}) == 6
    assert registry.get_sample_value("tfusion_workqueue_adds_total", {"name": "backoff"}) == 6


async def test_requeue_after_runs_again_later() -> None:
    times: list[float] = []

    async def reconcile(key: str) -> Result:
        times.append(time.monotonic())
        return Result(requeue_after=0.1) if len(times) == 1 else Result()

    controller = Controller("after", reconcile)
    async with anyio.create_task_group() as tg:
        await tg.start(controller.run)
        controller.enqueue("k")
        with anyio.fail_after(3):
            while len(times) < 2:
                await anyio.sleep(0.005)
        await anyio.sleep(0.15)
        tg.cancel_scope.cancel()
    assert len(times) == 2
    assert times[1] - times[0] >= 0.095


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
