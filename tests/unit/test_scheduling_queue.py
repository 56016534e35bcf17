"""The built-in scheduler's queue on a ManualClock: priority order, backoff 1 s -> 10 s, parked pods
moved back by events (and not lost when the event comes during an attempt), the 60 s safety flush,
deletion, and pop waking on the clock."""

from __future__ import annotations

import anyio
import pytest

from tfusion.controller.scheduling.queue import (
    ACTIVE,
    BACKOFF,
    IN_FLIGHT,
    UNSCHEDULABLE,
    UNSCHEDULABLE_FLUSH_S,
    QueueClosed,
    SchedulingQueue,
    backoff_for,
)
from tfusion.kube.clock import ManualClock

pytestmark = pytest.mark.anyio


def test_backoff_doubles_from_one_second_to_ten() -> None:
    assert [backoff_for(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


async def test_pop_takes_higher_priority_first_then_oldest() -> None:
    clock = ManualClock()
    queue = SchedulingQueue(clock=clock)
    queue.add("ns/low", priority=0)
    await clock.advance(1)
    queue.add("ns/high", priority=100)
    queue.add("ns/low2", priority=0)
    assert [await queue.pop(), await queue.pop(), await queue.pop()] == ["ns/high", "ns/low", "ns/low2"]
    assert queue.where("ns/high") == IN_FLIGHT


async def test_unschedulable_pod_stays_parked_until_an_event_moves_it() -> None:
    clock = ManualClock()
    queue = SchedulingQueue(clock=clock)
    queue.add("ns/a")
    assert await queue.pop() == "ns/a"
    queue.unschedulable("ns/a")
    assert queue.where("ns/a") == UNSCHEDULABLE
    await clock.advance(30)  # long past its 1 s backoff: still parked, nothing happened
    assert queue.where("ns/a") == UNSCHEDULABLE
    assert queue.move_all() == 1
    assert queue.where("ns/a") == ACTIVE
    assert await queue.pop() == "ns/a"


async def test_moved_pod_waits_out_its_backoff() -> None:
    clock = ManualClock()
    queue = SchedulingQueue(clock=clock)
    queue.add("ns/a")
    await queue.pop()
    queue.unschedulable("ns/a")
    queue.move_all()  # at once: its 1 s backoff has not run out
    assert queue.where("ns/a") == BACKOFF
    popped: list[str] = []

    async def take() -> None:
        popped.append(await queue.pop())

    async with anyio.create_task_group() as tg:
        tg.start_soon(take)
        await clock.advance(0.5)
        assert popped == []
        await clock.advance(0.6)
    assert popped == ["ns/a"]


async def test_event_during_an_attempt_is_not_lost() -> None:
    clock = ManualClock()
    queue = SchedulingQueue(clock=clock)
    queue.add("ns/a")
    await queue.pop()
    queue.move_all()  # e.g. a GPU freed while the cycle ran on an older view
    queue.unschedulable("ns/a")
    assert queue.where("ns/a") == BACKOFF


async def test_errors_back_off_longer_each_time_up_to_ten_seconds() -> None:
    clock = ManualClock()
    queue = SchedulingQueue(clock=clock)
    queue.add("ns/a")
    waits = []
    for _ in range(6):
        await queue.pop()
        queue.error("ns/a")
        assert queue.where("ns/a") == BACKOFF
        start = clock.now()
        while queue.where("ns/a") != ACTIVE:
            await clock.advance(0.5)
            queue.flush()
        waits.append(clock.now() - start)
    assert waits == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


async def test_parked_pods_are_flushed_after_a_minute_without_events() -> None:
    clock = ManualClock()
    queue = SchedulingQueue(clock=clock)
    queue.add("ns/a")
    await queue.pop()
    queue.unschedulable("ns/a")
    await clock.advance(UNSCHEDULABLE_FLUSH_S - 1)
    queue.flush()
    assert queue.where("ns/a") == UNSCHEDULABLE
    await clock.advance(1)
    queue.flush()
    assert queue.where("ns/a") == ACTIVE


async def test_update_of_a_parked_pod_retries_it_and_delete_forgets_it() -> None:
    clock = ManualClock()
    queue = SchedulingQueue(clock=clock)
    queue.add("ns/a")
    await queue.pop()
    queue.unschedulable("ns/a")
    await clock.advance(2)
    queue.add("ns/a")  # its annotations changed: try again
    assert queue.where("ns/a") == ACTIVE
    queue.delete("ns/a")
    assert "ns/a" not in queue
    queue.add("ns/b")
    assert await queue.pop() == "ns/b"  # the stale heap entry of ns/a is skipped


async def test_add_does_not_disturb_a_pod_in_flight_or_backing_off() -> None:
    clock = ManualClock()
    queue = SchedulingQueue(clock=clock)
    queue.add("ns/a")
    await queue.pop()
    queue.add("ns/a")
    assert queue.where("ns/a") == IN_FLIGHT
    queue.error("ns/a")
    queue.add("ns/a")
    assert queue.where("ns/a") == BACKOFF
    assert queue.counts() == {ACTIVE: 0, BACKOFF: 1, UNSCHEDULABLE: 0, IN_FLIGHT: 0}


async def test_close_wakes_a_waiting_pop() -> None:
    queue = SchedulingQueue(clock=ManualClock())
    raised: list[BaseException] = []

    async def waiter() -> None:
        try:
            await queue.pop()
        except QueueClosed as exc:
            raised.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        queue.close()
    assert len(raised) == 1


async def test_park_counts_no_attempt_and_hold_until_ignores_attempts() -> None:
    clock = ManualClock()
    queue = SchedulingQueue(clock=clock)
    queue.add("ns/member")
    for _ in range(5):  # a gang member whose peers are still being created, parked again and again
        assert await queue.pop() == "ns/member"
        queue.park("ns/member")
        assert queue.where("ns/member") == UNSCHEDULABLE
        queue.add("ns/member")  # a peer appeared: tried at once, no backoff grew
        assert queue.where("ns/member") == ACTIVE
    assert queue.attempts("ns/member") == 0
    assert await queue.pop() == "ns/member"
    queue.hold_until("ns/member", clock.now() + 10)  # its gang backs off 10 s after a timeout
    assert queue.where("ns/member") == BACKOFF
    await clock.advance(9.5)
    queue.flush()
    assert queue.where("ns/member") == BACKOFF
    await clock.advance(0.5)
    queue.flush()
    assert queue.where("ns/member") == ACTIVE
