"""Leader election against the embedded API server: one leader among racing candidates, release
on shutdown, step-down before the renew deadline, a stolen lease, the leader-info ConfigMap."""

from __future__ import annotations

import functools
import re
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry

from tests.helpers import eventually
from tests.helpers.leases import steal_lease
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, NotFound, TokenBucket
from tfusion.kube.leader import LEADER_INFO_CONFIGMAP, LEASE_NAME, LeaderElector, micro_time

pytestmark = pytest.mark.anyio

NS = "tensor-fusion-sys"
FAST = {"lease_duration": 2.0, "renew_deadline": 1.5, "retry_period": 0.2}
MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


@pytest.fixture
async def clients(apiserver: Any) -> AsyncIterator[list[KubeClient]]:
    made = [await KubeClient.connect(str(apiserver.kubeconfig), qps=0) for _ in range(3)]
    yield made
    for client in made:
        await client.close()


class Candidate:
    """An elector plus a record of its leader-only work."""

    def __init__(self, client: KubeClient, name: str, **timing: float) -> None:
        self.registry = CollectorRegistry()
        self.started: list[float] = []
        self.stopped: list[float] = []
        self.work_cancelled: list[float] = []
        self.elector = LeaderElector(client, namespace=NS, identity=name, registry=self.registry,
                                     on_started_leading=self.work, on_stopped_leading=self.stop,
                                     **(timing or FAST))  # type: ignore[arg-type]

    async def work(self) -> None:
        self.started.append(time.monotonic())
        try:
            await anyio.sleep_forever()
        finally:
            self.work_cancelled.append(time.monotonic())

    def stop(self) -> None:
        self.stopped.append(time.monotonic())

    @property
    def gauge(self) -> float | None:
        return self.registry.get_sample_value("tfusion_leader")


async def lease(client: KubeClient) -> dict[str, Any]:
    return await client.get(r.LEASES, LEASE_NAME, namespace=NS)


def test_micro_time_has_six_fractional_digits() -> None:
    assert micro_time(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)) == "2026-01-02T03:04:05.000000Z"
    assert MICRO_TIME.match(micro_time())


async def test_timings_must_be_ordered(clients: list[KubeClient]) -> None:
    with pytest.raises(ValueError, match="lease_duration"):
        LeaderElector(clients[0], lease_duration=5, renew_deadline=10, retry_period=2)


async def test_racing_candidates_elect_exactly_one(clients: list[KubeClient]) -> None:
    candidates = [Candidate(client, f"cand-{i}") for i, client in enumerate(clients)]
    async with anyio.create_task_group() as tg:
        for cand in candidates:
            tg.start_soon(cand.elector.run)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert sum(c.elector.is_leader for c in candidates) <= 1
            await anyio.sleep(0.01)
        await eventually(lambda: any(c.elector.is_leader for c in candidates))
        leaders = [c for c in candidates if c.elector.is_leader]
        assert len(leaders) == 1
        held = await lease(clients[0])
        assert held["spec"]["holderIdentity"] == leaders[0].elector.identity
        assert held["spec"]["leaseDurationSeconds"] == 2
        assert MICRO_TIME.match(held["spec"]["renewTime"]) and MICRO_TIME.match(held["spec"]["acquireTime"])
        assert [c.gauge for c in candidates].count(1.0) == 1
        assert [c.gauge for c in candidates].count(0.0) == 2
        await eventually(lambda: bool(leaders[0].started))  # its work starts a few steps after the win
        assert all(len(c.started) == (1 if c is leaders[0] else 0) for c in candidates)

        async def leader_info() -> dict[str, Any] | None:  # written by its own task once leading
            try:
                return await clients[0].get(r.CONFIGMAPS, LEADER_INFO_CONFIGMAP, namespace=NS)
            except NotFound:
                return None

        with anyio.fail_after(5):
            while (info := await leader_info()) is None:
                await anyio.sleep(0.05)
        assert re.match(r"^\d+\.\d+\.\d+\.\d+$", info["data"]["leader-ip"])
        tg.cancel_scope.cancel()


async def test_release_on_shutdown_hands_over_within_a_retry_period(clients: list[KubeClient]) -> None:
    first = Candidate(clients[0], "first")
    second = Candidate(clients[1], "second", lease_duration=15.0, renew_deadline=10.0, retry_period=0.3)
    async with anyio.create_task_group() as tg:
        first_scope = anyio.CancelScope()
        tg.start_soon(_run_in, first_scope, first)
        await eventually(lambda: first.elector.is_leader)
        tg.start_soon(second.elector.run)
        # it has read the lease and seen who holds it: a try that lost, not one still to come
        await eventually(lambda: second.elector.observed_holder == "first", what="second saw the holder")
        assert not second.elector.is_leader
        first_scope.cancel()
        await eventually(lambda: bool(first.work_cancelled))
        released_at = time.monotonic()
        # the lease is 15 s long, yet a released lease is taken at a retry (0.3 s; the bound leaves
        # room for a loaded machine and is still far from the lease's 15 s)
        await eventually(lambda: second.elector.is_leader, timeout=6.0)
        assert time.monotonic() - released_at < 5.0
        held = await lease(clients[2])
        assert held["spec"]["holderIdentity"] == "second"
        assert held["spec"]["leaseTransitions"] == 1  # created by "first" (0), taken by "second" (1)
        assert first.gauge == 0.0 and first.stopped
        tg.cancel_scope.cancel()
    released = await lease(clients[2])
    assert released["spec"]["holderIdentity"] == "" and released["spec"]["leaseDurationSeconds"] == 1


async def _run_in(scope: anyio.CancelScope, cand: Candidate) -> None:
    with scope:
        await cand.elector.run()


async def test_stalled_leader_steps_down_before_the_renew_deadline(clients: list[KubeClient]) -> None:
    leader = Candidate(clients[0], "stalls", lease_duration=2.0, renew_deadline=1.2, retry_period=0.2)
    standby = Candidate(clients[1], "standby")
    async with anyio.create_task_group() as tg:
        tg.start_soon(leader.elector.run)
        await eventually(lambda: leader.elector.is_leader)
        tg.start_soon(standby.elector.run)
        await eventually(lambda: standby.elector.observed_holder == "stalls", what="the standby saw the holder")
        # every request of the leader now waits ~100 s for the rate limiter: renewals stall
        stalled = TokenBucket(0.01, 1)
        stalled.reserve()
        clients[0].limiter = stalled
        await eventually(lambda: not leader.elector.is_leader, timeout=3)
        stopped_wall = datetime.now(UTC)
        last_renew = datetime.strptime((await lease(clients[2]))["spec"]["renewTime"],
                                       "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
        assert (stopped_wall - last_renew).total_seconds() < 1.2, "must stop before the renew deadline"
        assert leader.work_cancelled and leader.stopped and leader.gauge == 0.0
        # its leader work starts just after the flag turns (a task of its own): wait for the work
        await eventually(lambda: standby.elector.is_leader and bool(standby.started), timeout=4)
        assert leader.work_cancelled[0] < standby.started[0], "the old leader stops before the new starts"
        clients[0].limiter = TokenBucket(0, 1)  # unstall, so shutdown need not wait out the release timeout
        tg.cancel_scope.cancel()


async def test_stolen_lease_stops_leading_at_once(clients: list[KubeClient]) -> None:
    leader = Candidate(clients[0], "victim", lease_duration=10.0, renew_deadline=8.0, retry_period=0.2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(leader.elector.run)
        await eventually(lambda: leader.elector.is_leader)
        await steal_lease(clients[1], LEASE_NAME, "intruder", namespace=NS)
        stolen_at = time.monotonic()
        # at its next retry (0.2 s), long before its renew deadline (8 s) would have stopped it
        await eventually(lambda: not leader.elector.is_leader, timeout=5)
        assert time.monotonic() - stolen_at < 4.0
        assert leader.work_cancelled and leader.stopped
        assert leader.elector.observed_holder == "intruder"
        tg.cancel_scope.cancel()
    # it never held the lease at shutdown, so it must not have released (overwritten) it
    assert (await lease(clients[1]))["spec"]["holderIdentity"] == "intruder"


async def test_lease_expiry_is_measured_on_the_injected_clock(clients: list[KubeClient]) -> None:
    """With the default 15 s lease, a standby takes over from a holder that stopped renewing when
    ITS clock says 15 s have passed since the record last changed — no wall-clock wait: the test
    moves a ManualClock by hand, and nothing happens before the lease has run out."""
    from tfusion.kube.clock import ManualClock

    clock = ManualClock()
    elector = functools.partial(LeaderElector, namespace=NS, clock=clock, lease_duration=15.0, renew_deadline=10.0,
                               retry_period=2.0)
    holder = elector(clients[0], identity="holder")
    standby = elector(clients[1], identity="standby")

    async def settle() -> None:  # let HTTP round trips finish between clock steps
        for _ in range(5):
            await anyio.sleep(0.01)

    async def advance(seconds: float, step: float = 1.0) -> None:
        for _ in range(int(seconds / step)):
            await clock.advance(step)
            await settle()

    async with anyio.create_task_group() as tg:
        holder_scope = anyio.CancelScope()

        async def run_holder() -> None:
            with holder_scope:
                await holder.run()

        tg.start_soon(run_holder)
        with anyio.fail_after(10):
            while not holder.is_leader:
                await settle()
        # the holder dies without releasing (kill -9): its task stops, the Lease still names it
        holder._lease = None  # no release on the way out
        holder_scope.cancel()
        await settle()
        tg.start_soon(standby.run)
        await settle()
        await advance(12)
        assert not standby.is_leader, "12 s after the last renewal the lease is still the holder's"
        await advance(6)
        with anyio.fail_after(10):
            while not standby.is_leader:
                await advance(1.0)
        assert standby.observed_holder == "standby"
        tg.cancel_scope.cancel()
