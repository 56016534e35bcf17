"""The elastic rate limiter: the original's three test vectors, the parameter overrides, and the
closed loop against the simulated device, whose utilisation follows the tokens the limiter gets."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from tfusion.hypervisor.devices.registry import DeviceRegistry
from tfusion.hypervisor.devices.sim import LimitedLoad, SimBackend
from tfusion.hypervisor.limiter import erl
from tfusion.hypervisor.limiter.config import SchedulingConfig
from tfusion.hypervisor.limiter.soft import SoftIsolation
from tfusion.hypervisor.shm.store import ShmStore
from tfusion.hypervisor.workers.local import LocalWorkers

PARAMS = erl.ErlParams()


def test_a_worker_below_its_share_gets_a_higher_rate() -> None:
    state = erl.ErlState(rate=100.0, smoothed=0.35, sampled=True)
    assert erl.desired_rate(state, 0.7, PARAMS).rate > 100.0


def test_a_worker_above_its_share_gets_a_lower_rate() -> None:
    state = erl.ErlState(rate=1000.0, smoothed=0.9, sampled=True)
    assert erl.desired_rate(state, 0.5, PARAMS).rate < 1000.0


def test_tokens_above_capacity_and_above_target_are_drained() -> None:
    tokens = erl.rebalance_tokens(200.0, capacity=100.0, last_update=10.0, now=10.5, rate=50.0, target=0.5,
                                  smoothed=0.8)
    assert 35.0 < tokens < 100.0


def test_idle_ramps_up_deadband_holds_and_slew_is_limited() -> None:
    idle = erl.desired_rate(erl.ErlState(rate=100.0, smoothed=0.0, sampled=True), 0.3, PARAMS)
    assert idle.rate == pytest.approx(135.0)
    held = erl.desired_rate(erl.ErlState(rate=80.0, smoothed=0.31, sampled=True, integral=1.0), 0.3, PARAMS)
    assert held.rate == 80.0 and held.integral == pytest.approx(0.85)
    far_below = erl.desired_rate(erl.ErlState(rate=100.0, smoothed=0.06, sampled=True), 1.0, PARAMS)
    assert far_below.rate == pytest.approx(135.0)  # +35 % at most per step
    far_above = erl.desired_rate(erl.ErlState(rate=1000.0, smoothed=1.0, sampled=True), 0.1, PARAMS)
    assert far_above.rate == pytest.approx(750.0)  # -25 % at most per step
    floor = erl.desired_rate(erl.ErlState(rate=11.0, smoothed=1.0, sampled=True), 0.1, PARAMS)
    assert floor.rate >= PARAMS.rate_min


def test_first_sample_sets_the_smoothed_value_then_it_filters() -> None:
    first, capacity = erl.step(erl.ErlState(), target=0.5, utilisation=0.8, params=PARAMS)
    assert first.smoothed == 0.8 and capacity == PARAMS.cap_min
    second, _ = erl.step(first, target=0.5, utilisation=0.0, params=PARAMS)
    assert second.smoothed == pytest.approx(0.6)


def test_refill_needs_a_recent_previous_update() -> None:
    kwargs = {"capacity": 1000.0, "rate": 100.0, "target": 0.5, "smoothed": 0.5}
    assert erl.rebalance_tokens(0.0, last_update=10.0, now=11.0, **kwargs) == 100.0
    assert erl.rebalance_tokens(0.0, last_update=10.0, now=16.0, **kwargs) == 0.0  # a 6 s gap: no refill
    assert erl.rebalance_tokens(0.0, last_update=0.0, now=11.0, **kwargs) == 0.0


def test_overrides_from_the_scheduling_config() -> None:
    doc = {"elasticRateLimitParameters": {"maxRefillRate": "5000", "minRefillRate": "20", "filterAlpha": "2",
                                          "kp": "1.2", "ki": "-1", "kd": "abc", "burstWindow": "1.5",
                                          "capacityMin": "300", "capacityMax": "100", "integralDecayFactor": "0.5"}}
    params = SchedulingConfig(json.dumps(doc)).erl_params()
    assert (params.rate_max, params.rate_min, params.kp, params.burst_window) == (5000.0, 20.0, 1.2, 1.5)
    assert params.ki == PARAMS.ki and params.kd == PARAMS.kd  # negative and non-numbers are ignored
    assert params.alpha == 0.95  # clamped
    assert (params.cap_min, params.cap_max) == (300.0, 300.0)  # cap_max raised to cap_min
    assert params.decay == 0.5
    assert SchedulingConfig("").erl_params() == PARAMS
    with pytest.raises(ValueError, match="not valid JSON"):
        SchedulingConfig("{")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.anyio
async def test_closed_loop_settles_a_30_percent_worker_within_5_points(tmp_path: Path) -> None:
    """A worker that would use the whole GPU, behind a 30 % share: the sim device runs it only on the
    tokens it gets, so its utilisation must come to 30 % +/- 5 and stay there."""
    clock = FakeClock()
    sim = SimBackend("sim:1xA100-SXM4-80GB", "node-a", clock=clock)
    registry = DeviceRegistry(sim)
    await registry.discover()
    workers = LocalWorkers(tmp_path / "state", registry, node_name="node-a", pool="local",
                           process_env={})
    async with anyio.create_task_group() as tg:
        await tg.start(workers.run)
        allocation = await workers.create({"name": "train", "isolation": "soft", "limits": {"computePercent": 30},
                                           "requests": {"computePercent": 30}})
        soft = SoftIsolation(ShmStore(tmp_path / "shm"), registry, workers, clock=clock)
        await soft.tick()
        state = soft.state(allocation.worker.uid)
        assert state is not None and state.device(0).up_limit == 30
        sim.attach_limited_load(0, LimitedLoad(100.0, lambda want: state.drain_tokens(0, want)))
        uuid = registry.devices()[0].uuid
        seen = []
        for _ in range(240):  # two simulated minutes of 500 ms ticks
            clock.now += 0.5
            await soft.tick()
            seen.append(registry.metrics()[uuid].utilization_percent)
        tg.cancel_scope.cancel()
    assert max(seen[:4]) > 50  # it starts unthrottled (the initial bucket), so the loop had work to do
    settled = seen[60:]  # after 30 s
    assert all(25.0 <= u <= 35.0 for u in settled), settled
    controller = soft.erl_state(allocation.worker.uid, uuid)
    assert controller is not None and 25.0 <= controller.rate <= 35.0
