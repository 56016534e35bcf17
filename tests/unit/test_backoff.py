"""The one backoff rule (tfusion/kube/backoff.py) and the six retry loops that use it."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from tfusion.controller.reconcilers import cluster
from tfusion.controller.scheduling import queue as scheduling_queue
from tfusion.hypervisor.workers import supervisor
from tfusion.kube import informer, workqueue
from tfusion.kube.backoff import Backoff, Failures
from tfusion.kube.clock import ManualClock
from tfusion.metrics import sinks


def fixed(u: float) -> Backoff:
    """A 1 s → 10 s policy whose jitter sample is always `u`."""
    return Backoff(base=1.0, cap=10.0, jitter=0.5, rng=lambda: u)


def test_delay_doubles_from_base_to_cap() -> None:
    policy = Backoff(base=1.0, cap=10.0)
    assert [policy.delay(n) for n in range(0, 7)] == [0.0, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert policy.delay(10_000) == 10.0, "a huge count neither overflows nor passes the cap"


def test_factor_sets_the_growth() -> None:
    policy = Backoff(base=0.5, cap=100.0, factor=3.0)
    assert [policy.delay(n) for n in range(1, 5)] == [0.5, 1.5, 4.5, 13.5]


def test_jitter_spreads_around_the_envelope_within_base_and_cap() -> None:
    assert fixed(0.0).delay(3) == 2.0, "50 % of the 4 s envelope"
    assert fixed(0.5).delay(3) == 4.0, "the middle sample is the envelope"
    assert fixed(0.999).delay(3) == pytest.approx(5.996)
    assert fixed(0.0).delay(1) == 1.0, "never under base"
    assert fixed(0.999).delay(5) == 10.0, "never over cap"


@pytest.mark.parametrize(("base", "cap", "factor", "jitter"),
                         [(0.0, 1.0, 2.0, 0.0), (2.0, 1.0, 2.0, 0.0), (1.0, 2.0, 0.5, 0.0), (1.0, 2.0, 2.0, 1.5)])
def test_nonsense_numbers_are_refused(base: float, cap: float, factor: float, jitter: float) -> None:
    with pytest.raises(ValueError):
        Backoff(base=base, cap=cap, factor=factor, jitter=jitter)


def test_failures_count_per_key_and_reset() -> None:
    failures = Failures(Backoff(base=1.0, cap=10.0))
    assert [failures.fail("a") for _ in range(3)] == [1.0, 2.0, 4.0]
    assert failures.fail("b") == 1.0, "keys count apart"
    assert failures.count("a") == 3 and failures.count("c") == 0
    failures.reset("a")
    assert failures.count("a") == 0 and failures.fail("a") == 1.0
    assert failures.fail() == 1.0 and failures.fail() == 2.0, "the default key serves a single loop"
    failures.reset("never seen")


# --- one rule, every consumer agrees ----------------------------------------------------------

#: each consumer's numbers, as the code that retries reads them
CONSUMERS = {
    "workqueue": workqueue.BACKOFF,
    "informer": informer.RECONNECT_BACKOFF,
    "scheduling queue": scheduling_queue.BACKOFF_POLICY,
    "worker supervisor": supervisor.BACKOFF,
    "metrics sink": sinks.BACKOFF,
    "cluster reconciler": cluster.RETRY_BACKOFF,
}

#: fail, fail, fail, succeed, fail, fail: the delays each one must wait, from (base, cap, jitter)
SEQUENCE = [False, False, False, True, False, False]


def expected(base: float, cap: float, jitter: float, u: float) -> list[float]:
    out, streak = [], 0
    for ok in SEQUENCE:
        streak = 0 if ok else streak + 1
        if not ok:
            envelope = base * 2 ** (streak - 1) * (1 - jitter + 2 * jitter * u)
            out.append(min(cap, max(base, envelope)))
    return out


@pytest.mark.parametrize("u", [0.0, 0.5, 0.9])
@pytest.mark.parametrize("name", CONSUMERS)
def test_every_consumer_follows_the_one_rule(name: str, u: float) -> None:
    policy = dataclasses.replace(CONSUMERS[name], rng=lambda: u)
    failures = Failures(policy)
    got = []
    for ok in SEQUENCE:
        if ok:
            failures.reset()
        else:
            got.append(failures.fail())
    assert got == pytest.approx(expected(policy.base, policy.cap, policy.jitter, u))


def test_each_consumer_keeps_its_numbers() -> None:
    numbers = {name: (p.base, p.cap, p.factor, p.jitter) for name, p in CONSUMERS.items()}
    assert numbers == {
        "workqueue": (0.005, 1000.0, 2.0, 0.0),
        "informer": (0.2, 30.0, 2.0, 0.5),
        "scheduling queue": (1.0, 10.0, 2.0, 0.0),
        "worker supervisor": (3.0, 60.0, 2.0, 0.0),
        "metrics sink": (0.5, 30.0, 2.0, 0.0),
        "cluster reconciler": (3.0, 60.0, 2.0, 1.0),
    }


def test_the_consumers_own_entry_points_give_the_rules_delays() -> None:
    """What each site calls (not only its constant) answers with the shared rule."""
    limiter = workqueue.RateLimiter(qps=1e9, burst=10**6, clock=ManualClock())
    assert [limiter.when("k") for _ in range(4)] == [workqueue.BACKOFF.delay(n) for n in range(1, 5)]
    limiter.forget("k")
    assert limiter.when("k") == workqueue.BACKOFF.delay(1)
    assert [scheduling_queue.backoff_for(n) for n in range(0, 7)] == \
        [scheduling_queue.BACKOFF_POLICY.delay(n) for n in range(0, 7)]
    assert [supervisor.backoff_delay(n) for n in range(1, 8)] == [supervisor.BACKOFF.delay(n) for n in range(1, 8)]
    for retries in range(1, 10):
        assert cluster.RETRY_BASE_S <= cluster.retry_delay(retries) <= min(
            cluster.RETRY_MAX_S, 2 * cluster.RETRY_BASE_S * 2 ** (retries - 1))
    delays = list(itertools.islice((cluster.retry_delay(6) for _ in itertools.count()), 200))
    assert max(delays) == cluster.RETRY_MAX_S and min(delays) < cluster.RETRY_MAX_S, "jittered, then capped"
