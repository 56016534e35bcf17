"""The soft workers' limiter families on /metrics: read from the worker's real shared-memory file
(written here through a second mapping of it, as the in-container limiter holds one), frozen on a
stale heartbeat and on a bucket that is never refilled, and the throttled-seconds counter sampled
per sync tick."""

from __future__ import annotations

import mmap
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from prometheus_client import CollectorRegistry

from tfusion.hypervisor.devices.registry import DeviceRegistry
from tfusion.hypervisor.devices.sim import SimBackend
from tfusion.hypervisor.limiter.soft import LIMITER_HEARTBEAT_GRACE_S, SoftIsolation, limiter_frozen
from tfusion.hypervisor.metrics import UsageSource, register_usage_metrics
from tfusion.hypervisor.shm import layout
from tfusion.hypervisor.shm.state import SharedState
from tfusion.hypervisor.shm.store import ShmStore
from tfusion.hypervisor.workers.local import LocalWorkers
from tfusion.hypervisor.workers.model import WorkerAllocation

NODE = "node-a"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.25

    def __call__(self) -> float:
        return self.now


@dataclass
class Box:
    clock: FakeClock
    soft: SoftIsolation
    allocation: WorkerAllocation
    prom: CollectorRegistry

    def value(self, name: str) -> float:
        device = self.allocation.devices[0]
        labels = {"gpu": device.uuid, "node": NODE, "pool": "local", "namespace": self.allocation.worker.namespace,
                  "pod": self.allocation.worker.name, "workload": self.allocation.worker.workload_name or "unknown"}
        found = self.prom.get_sample_value(name, labels)
        assert found is not None, f"{name}{labels} not exported"
        return found


@contextmanager
def limiter_side(path: Path) -> Iterator[SharedState]:
    """The file mapped a second time, as the limiter in the worker's container maps it."""
    fd = os.open(path, os.O_RDWR)
    try:
        mapping = mmap.mmap(fd, layout.FILE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    state = SharedState(path, mapping)
    try:
        yield state
    finally:
        state.close()


@pytest.fixture
async def box(tmp_path: Path) -> AsyncIterator[Box]:
    clock = FakeClock()
    sim = SimBackend("sim:1xA100-SXM4-80GB", NODE, clock=clock)
    registry = DeviceRegistry(sim)
    await registry.discover()
    workers = LocalWorkers(tmp_path / "state", registry, node_name=NODE, pool="local", process_env={})
    async with anyio.create_task_group() as tg:
        await tg.start(workers.run)
        allocation = await workers.create({"name": "train", "isolation": "soft", "limits": {"computePercent": 30},
                                           "requests": {"computePercent": 30}})
        soft = SoftIsolation(ShmStore(tmp_path / "shm"), registry, workers, clock=clock)
        await soft.tick()
        prom = CollectorRegistry()
        register_usage_metrics(prom, UsageSource(registry, workers, node=NODE, pool_of=lambda _uuid: "local"), soft)
        yield Box(clock, soft, allocation, prom)
        soft.close()
        tg.cancel_scope.cancel()


def _file(box: Box) -> Path:
    state = box.soft.state(box.allocation.worker.uid)
    assert state is not None
    return state.path


@pytest.mark.anyio
async def test_the_families_read_the_bucket_and_heartbeat_in_the_file(box: Box) -> None:
    slot = box.allocation.devices[0].index
    with limiter_side(_file(box)) as limiter:
        limiter.set_bucket(slot, 123.5, 456.0)
        limiter.update_tokens(slot, lambda _current: 42.25)
        limiter.heartbeat(box.clock.now - 3)
    assert box.value("tfusion_worker_limiter_tokens") == 42.25
    assert box.value("tfusion_worker_limiter_capacity_tokens") == 456.0
    assert box.value("tfusion_worker_limiter_refill_tokens_per_second") == 123.5
    assert box.value("tfusion_worker_limiter_heartbeat_age_seconds") == pytest.approx(3.25)
    assert box.value("tfusion_worker_frozen") == 0.0
    assert box.value("tfusion_worker_throttled_seconds_total") == 0.0


@pytest.mark.anyio
async def test_frozen_once_the_heartbeat_is_older_than_the_limiters_grace(box: Box) -> None:
    beat = int(box.clock.now)
    box.clock.now = beat + LIMITER_HEARTBEAT_GRACE_S + 0.9  # the limiter still calls this fresh (whole seconds)
    assert box.value("tfusion_worker_frozen") == 0.0
    box.clock.now = beat + LIMITER_HEARTBEAT_GRACE_S + 1
    assert box.value("tfusion_worker_frozen") == 1.0
    assert box.value("tfusion_worker_limiter_heartbeat_age_seconds") == LIMITER_HEARTBEAT_GRACE_S + 1
    await box.soft.tick()  # the hypervisor beats again
    assert box.value("tfusion_worker_frozen") == 0.0


@pytest.mark.anyio
async def test_frozen_when_the_bucket_is_never_refilled_and_holds_less_than_a_launch(box: Box) -> None:
    slot = box.allocation.devices[0].index
    with limiter_side(_file(box)) as limiter:
        limiter.set_bucket(slot, 0.0, 200.0)
        limiter.update_tokens(slot, lambda _current: 0.5)
        assert box.value("tfusion_worker_frozen") == 1.0
        limiter.update_tokens(slot, lambda _current: 1.0)  # one more launch can go
        assert box.value("tfusion_worker_frozen") == 0.0
        limiter.set_bucket(slot, 10.0, 200.0)
        limiter.update_tokens(slot, lambda _current: 0.0)  # empty, but refilled: throttled, not frozen
        assert box.value("tfusion_worker_frozen") == 0.0


@pytest.mark.anyio
async def test_each_tick_that_finds_the_bucket_empty_counts_its_interval(box: Box) -> None:
    slot = box.allocation.devices[0].index
    with limiter_side(_file(box)) as limiter:
        for _ in range(3):  # a limiter that takes every token it is given
            limiter.drain_tokens(slot, 1e9)
            box.clock.now += 0.5
            await box.soft.tick()
        assert box.value("tfusion_worker_throttled_seconds_total") == 1.5
        assert limiter.device(slot).tokens >= 1  # each tick refilled the bucket after sampling it
        box.clock.now += 0.5
        await box.soft.tick()  # nothing was taken since the last refill
    assert box.value("tfusion_worker_throttled_seconds_total") == 1.5
    assert box.value("tfusion_worker_frozen") == 0.0


def test_the_limiters_rule_for_a_stale_heartbeat() -> None:
    assert not limiter_frozen(100, 110.99, 10.0, 50.0)
    assert limiter_frozen(100, 111.0, 10.0, 50.0)
    assert limiter_frozen(0, 111.0, 10.0, 50.0)  # a file never beaten
    assert limiter_frozen(100, 100.0, 0.0, 0.99) and not limiter_frozen(100, 100.0, 0.0, 1.0)
