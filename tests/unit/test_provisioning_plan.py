"""Pool provisioning's arithmetic (tfusion/controller/provisioning/plan.py): the gap to the minimum and
warm targets, the room the maximum leaves, the cheapest claims (checked against a brute force on
small inputs) and the node expander's choice (checked by replaying every placement)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfusion.api.kinds.pool import GPUPool
from tfusion.api.quantity import Quantity
from tfusion.api.types import decode
from tfusion.controller.provisioning import catalog
from tfusion.controller.provisioning import plan as plan_module
from tfusion.controller.provisioning.catalog import ON_DEMAND, SPOT, InstanceType
from tfusion.controller.provisioning.plan import (
    UNBOUNDED,
    Capacity,
    ClaimPlan,
    Expansion,
    FreeGpu,
    InFlight,
    PlannedClaim,
    PodNeed,
    PoolCapacity,
    Targets,
    capacity_text,
    cheapest_claims,
    choose_expansions,
    gap,
    room,
    targets_of,
)

GI = 1 << 30
T = 1000  # one TFLOPS in milli-TFLOPS
CATALOG = catalog.load()


def kind(name: str, count: int, tflops: int, vram_gi: int, on_demand: float | None, spot: float | None = None, *,
         model: str = "X", boot: float = 60.0) -> InstanceType:
    prices = {k: v for k, v in ((ON_DEMAND, on_demand), (SPOT, spot)) if v is not None}
    return InstanceType(name=name, gpu_model=model, gpu_count=count, tflops_per_gpu=tflops * T,
                        vram_per_gpu=vram_gi * GI, cpu_milli=4000, memory_bytes=16 * GI, prices=prices,
                        boot_seconds=boot)


def cap(tflops: int, vram_gi: int) -> Capacity:
    return Capacity(tflops * T, vram_gi * GI)


def names(plan: ClaimPlan) -> list[str]:
    return [c.instance_type.name for c in plan.claims]


def pool_targets(capacity_config: dict[str, Any]) -> Targets:
    doc: dict[str, Any] = {"apiVersion": "tensor-fusion.ai/v1", "kind": "GPUPool", "metadata": {"name": "p"},
                           "spec": {"nodeManagerConfig": {}, "capacityConfig": capacity_config}}
    pool = decode(doc)
    assert isinstance(pool, GPUPool) and pool.spec is not None
    return targets_of(pool.spec.capacity_config)


# --- Capacity, targets, gap, room -------------------------------------------------------------------


def test_capacity_arithmetic() -> None:
    a, b = Capacity(5, 10), Capacity(7, 3)
    assert a + b == Capacity(12, 13)
    assert a - b == Capacity(-2, 7)
    assert (a - b).positive() == Capacity(0, 7)
    assert Capacity(0, 0).is_zero and not Capacity(0, 1).is_zero
    assert Capacity(5, 10).covers(Capacity(5, 10)) and not Capacity(5, 10).covers(Capacity(6, 1))
    assert not Capacity(5, 10).covers(Capacity(1, 11))


def test_capacity_of_quantities() -> None:
    assert Capacity.of(Quantity("1500m"), Quantity("8Gi")) == Capacity(1500, 8 * GI)
    assert Capacity.of(None, Quantity("1Mi")) == Capacity(0, 1 << 20)
    assert Capacity.of(Quantity("20"), None) == Capacity(20 * T, 0)


def test_capacity_text_is_for_people() -> None:
    assert capacity_text(cap(100, 64)) == "100 TFLOPS / 64Gi"
    assert str(Capacity(20_500, 512 << 20)) == "20.5 TFLOPS / 512Mi"
    assert capacity_text(Capacity(UNBOUNDED, 0)) == "unbounded TFLOPS / 0"


def test_targets_of_a_pool_spec() -> None:
    targets = pool_targets({"minResources": {"tflops": "20", "vram": "10Gi"},
                            "warmResources": {"tflops": "10"},
                            "maxResources": {"vram": "100Gi"}})
    assert targets.minimum == cap(20, 10)
    assert targets.warm == cap(10, 0)  # a missing amount keeps nothing
    assert targets.maximum == Capacity(UNBOUNDED, 100 * GI)  # a missing amount limits nothing


def test_absent_targets() -> None:
    assert targets_of(None) == Targets(None, None, None)
    assert pool_targets({}) == Targets(None, None, None)
    # a maximum with only host amounts does not limit GPUs at all
    assert pool_targets({"maxResources": {"cpu": "64"}}).maximum is None


def test_gap_takes_the_larger_of_minimum_and_warm_per_dimension() -> None:
    targets = Targets(minimum=cap(100, 10), warm=cap(10, 50), maximum=None)
    pool = PoolCapacity(total=cap(60, 40), available=cap(30, 20), in_flight=cap(0, 0))
    # tflops: min 100-60=40 vs warm 10-30<0 -> 40; vram: min 10-40<0 vs warm 50-20=30 -> 30
    assert gap(pool, targets) == cap(40, 30)


def test_gap_counts_claims_in_flight_and_is_never_negative() -> None:
    targets = Targets(minimum=cap(100, 100), warm=cap(20, 20), maximum=None)
    assert gap(PoolCapacity(cap(60, 60), cap(0, 0), cap(30, 30)), targets) == cap(10, 10)
    assert gap(PoolCapacity(cap(500, 500), cap(500, 500), cap(0, 0)), targets) == Capacity(0, 0)
    assert gap(PoolCapacity(cap(0, 0), cap(0, 0), cap(0, 0)), Targets(None, None, cap(1, 1))) == Capacity(0, 0)


def test_gap_of_warm_only() -> None:
    pool = PoolCapacity(total=cap(300, 300), available=cap(5, 50), in_flight=cap(2, 0))
    assert gap(pool, Targets(None, cap(10, 40), None)) == cap(3, 0)


def test_room_is_what_the_maximum_leaves() -> None:
    pool = PoolCapacity(total=cap(60, 40), available=cap(0, 0), in_flight=cap(20, 4))
    assert room(pool, Targets(None, None, None)) is None
    assert room(pool, Targets(None, None, cap(100, 64))) == cap(20, 20)
    assert room(pool, Targets(None, None, Capacity(UNBOUNDED, 50 * GI))) == Capacity(UNBOUNDED, 6 * GI)
    assert room(pool, Targets(None, None, cap(50, 100))) == cap(0, 56)  # over the maximum: no room, not less


# --- cheapest_claims: examples -------------------------------------------------------------------------


def test_the_packaged_catalog_closes_a_small_gap_with_the_cheapest_types() -> None:
    plan = cheapest_claims(cap(100, 40), CATALOG.types, max_claims=15)
    # two L4 instances (242 TFLOPS / 45Gi, $1.61) beat one A100 ($5.07) and one 4 x L4 ($4.60)
    assert names(plan) == ["g6.xlarge", "g6.xlarge"]
    assert plan.closed and plan.shortfall == Capacity(0, 0) and plan.reason == ""
    assert plan.price == pytest.approx(1.61)
    assert all(c.capacity_type == ON_DEMAND and c.price == 0.805 for c in plan.claims)
    assert plan.capacity.covers(cap(100, 40))


def test_spot_prices_are_used_for_spot() -> None:
    plan = cheapest_claims(cap(300, 80), CATALOG.types, capacity_type=SPOT, max_claims=15)
    # Spot: 4 x g6.xlarge $1.40 < a2-ultragpu-1g $2.00 < g6.12xlarge $2.00 (fewer: same count, name first)
    assert names(plan) == ["g6.xlarge"] * 4
    assert [c.price for c in plan.claims] == [0.35] * 4 and plan.claims[0].capacity_type == SPOT


def test_a_gap_of_nothing_needs_no_claims() -> None:
    plan = cheapest_claims(Capacity(0, 0), CATALOG.types, max_claims=15)
    assert plan == ClaimPlan((), Capacity(0, 0), "")
    # a negative need (a pool over its targets) is nothing too
    assert cheapest_claims(Capacity(-5, -5), CATALOG.types, max_claims=3).claims == ()


def test_equal_prices_prefer_fewer_instances_then_names() -> None:
    small = kind("small", 1, 10, 10, 1.0)
    big = kind("big", 1, 20, 20, 2.0)
    assert names(cheapest_claims(cap(20, 20), [small, big], max_claims=5)) == ["big"]
    twin_b, twin_a = kind("twin-b", 1, 10, 10, 1.0), kind("twin-a", 1, 10, 10, 1.0)
    assert names(cheapest_claims(cap(20, 20), [twin_b, twin_a], max_claims=5)) == ["twin-a", "twin-a"]


def test_the_plan_does_not_depend_on_the_order_of_types() -> None:
    for order in itertools.islice(itertools.permutations(CATALOG.types), 0, None, 37):
        assert names(cheapest_claims(cap(700, 200), order, max_claims=15)) == \
            names(cheapest_claims(cap(700, 200), CATALOG.types, max_claims=15))


def test_both_dimensions_must_be_covered() -> None:
    lots_of_compute = kind("compute", 1, 100, 8, 1.0)
    lots_of_memory = kind("memory", 1, 10, 80, 1.0)
    plan = cheapest_claims(cap(100, 80), [lots_of_compute, lots_of_memory], max_claims=5)
    assert sorted(names(plan)) == ["compute", "memory"]


def test_room_keeps_the_plan_under_the_maximum() -> None:
    small, big = kind("small", 1, 10, 10, 1.0), kind("big", 1, 40, 40, 1.0)
    plan = cheapest_claims(cap(30, 30), [small, big], room=cap(35, 35), max_claims=5)
    assert names(plan) == ["small"] * 3  # "big" is cheaper but would pass the maximum


def test_room_too_small_for_the_gap_gives_a_partial_plan_and_says_so() -> None:
    small = kind("small", 1, 10, 10, 1.0)
    plan = cheapest_claims(cap(50, 50), [small], room=cap(25, 100), max_claims=10)
    assert names(plan) == ["small", "small"] and plan.shortfall == cap(30, 30) and not plan.closed
    assert plan.reason == "maxResources leaves 25 TFLOPS / 100Gi of room, less than the gap"


def test_room_that_no_type_fits_in() -> None:
    plan = cheapest_claims(cap(50, 70), CATALOG.types, room=cap(100, 64), max_claims=15)
    assert plan.claims == () and plan.shortfall == cap(50, 70)
    assert plan.reason == ("maxResources leaves 100 TFLOPS / 64Gi of room, less than the gap and no type fits in "
                           "it (the smallest, g6.xlarge, offers 121 TFLOPS / 23034Mi)")


def test_room_that_covers_the_gap_but_fits_no_type() -> None:
    plan = cheapest_claims(cap(20, 10), CATALOG.types, room=cap(100, 100), max_claims=15)
    assert plan.claims == () and plan.reason == (
        "maxResources leaves 100 TFLOPS / 100Gi of room, no type fits in it (the smallest, g6.xlarge, offers "
        "121 TFLOPS / 23034Mi)")


def test_room_that_covers_the_gap_but_no_instance_sum() -> None:
    plan = cheapest_claims(cap(20, 10), CATALOG.types, room=cap(150, 30), max_claims=15)
    assert names(plan) == ["g6.xlarge"]  # 121 TFLOPS / 22.5Gi fits the room
    plan = cheapest_claims(cap(130, 10), CATALOG.types, room=cap(150, 30), max_claims=15)
    # 2 x g6.xlarge would pass 150 TFLOPS and every other type is larger: one closes the most
    assert names(plan) == ["g6.xlarge"] and plan.shortfall == cap(9, 0)
    assert plan.reason == ("maxResources leaves 150 TFLOPS / 30Gi of room; the cheapest claims that close "
                           "the gap, 2 x g6.xlarge, offer 242 TFLOPS / 46068Mi")


def test_the_claim_limit() -> None:
    plan = cheapest_claims(cap(30_000, 100), CATALOG.types, max_claims=3)
    assert len(plan.claims) <= 3 and not plan.closed
    # 3 x p5.48xlarge is the most TFLOPS three claims can bring
    assert names(plan) == ["p5.48xlarge"] * 3
    assert plan.reason == ("at most 3 more claims may be in flight and the gap needs at least 4")
    assert plan.shortfall == cap(6264, 0)
    nothing = cheapest_claims(cap(10, 10), CATALOG.types, max_claims=0)
    assert nothing.claims == () and nothing.reason == "no more claims may be in flight now"


def test_no_type_sold_as_the_capacity_type() -> None:
    plan = cheapest_claims(cap(10, 10), [kind("od-only", 1, 100, 100, 1.0)], capacity_type=SPOT, max_claims=5)
    assert plan.claims == () and plan.reason == "no instance type is sold as Spot"
    assert cheapest_claims(cap(1, 1), [], max_claims=5).reason == "the instance catalog has no types"


def test_an_unknown_capacity_type_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="capacity_type 'spot' is not allowed; expected one of OnDemand, Spot"):
        cheapest_claims(cap(1, 1), CATALOG.types, capacity_type="spot", max_claims=1)
    with pytest.raises(ValueError, match="capacity_type 'on-demand' is not allowed"):
        choose_expansions([], [], {}, CATALOG.types, capacity_type="on-demand", now=0.0, max_new=1)


def test_a_large_gap_over_the_whole_catalog_is_planned_exactly() -> None:
    plan = cheapest_claims(cap(50_000, 100), CATALOG.types, max_claims=15)
    assert plan.closed and len(plan.claims) <= 15
    assert plan == brute_force_reference(cap(50_000, 100), CATALOG.types, ON_DEMAND, None, 15, limit=15)


def test_a_catalog_of_many_near_equal_types_still_gets_a_plan_within_the_limits() -> None:
    # thirty types whose prices differ by a little: more plans than the search may visit
    types = [kind(f"t{i:02}", 8, 100 + 7 * (i % 5), 16 + 8 * (i % 4), 8 * (100 + 7 * (i % 5)) * (0.005 + i * 1e-5))
             for i in range(30)]
    for need, limit in [(cap(40_000, 2_900), None), (cap(20_000, 1_500), cap(30_000, 2_000)),
                        (cap(60_000, 3_000), None)]:
        plan = cheapest_claims(need, types, room=limit, max_claims=15)
        assert len(plan.claims) <= 15 and (limit is None or limit.covers(plan.capacity))
        assert plan.shortfall == (need - plan.capacity).positive()
        # whenever one type alone closes the gap within the limits, so does the plan
        if any(one_type_closes(need, t, limit, 15) for t in types):
            assert plan.closed


def one_type_closes(need: Capacity, t: InstanceType, limit: Capacity | None, max_claims: int) -> bool:
    count = max(-(-need.tflops // t.tflops), -(-need.vram // t.vram))
    return count <= max_claims and (limit is None or limit.covers(Capacity(t.tflops * count, t.vram * count)))


# --- cheapest_claims: against a brute force ------------------------------------------------------------


def score(need: Capacity, got: Capacity) -> int:
    """The documented measure of what stays open: each dimension's shortfall by its share of the need."""
    short = (need - got).positive()
    w_t = need.vram if need.vram > 0 else 1
    w_v = need.tflops if need.tflops > 0 else 1
    return short.tflops * w_t + short.vram * w_v


def brute_force_reference(need: Capacity, types: Sequence[InstanceType], capacity_type: str,
                          limit_room: Capacity | None, max_claims: int, *, limit: int) -> ClaimPlan:
    """Every multiset of at most `max_claims` sellable types; the best by (what stays open, price,
    instances, sorted names). Returns the plan with the reason left out."""
    need = need.positive()
    sellable = sorted({t.name: t for t in reversed(types) if t.price(capacity_type) is not None}.values(),
                      key=lambda t: t.name)
    best: tuple[Any, ...] | None = None
    best_combo: tuple[InstanceType, ...] = ()
    for count in range(min(max_claims, limit) + 1):
        for combo in itertools.combinations_with_replacement(sellable, count):
            got = Capacity(sum(t.tflops for t in combo), sum(t.vram for t in combo))
            if limit_room is not None and not limit_room.covers(got):
                continue
            price = sum(round(t.prices[capacity_type] * 1_000_000) for t in combo)
            key = (score(need, got), price, count, tuple(sorted(t.name for t in combo)))
            if best is None or key < best:
                best, best_combo = key, combo
    got = Capacity(sum(t.tflops for t in best_combo), sum(t.vram for t in best_combo))
    claims = tuple(PlannedClaim(t, capacity_type, t.prices[capacity_type]) for t in best_combo)
    return ClaimPlan(claims, (need - got).positive(), "")


SMALL_TYPES = st.lists(
    st.builds(kind, name=st.sampled_from(["a", "b", "c", "d", "e"]), count=st.integers(1, 4),
              tflops=st.integers(1, 9), vram_gi=st.integers(1, 9),
              on_demand=st.sampled_from([0.0, 0.5, 1.0, 1.25, 2.0, 3.5]),
              spot=st.none() | st.sampled_from([0.25, 0.5, 1.0])),
    min_size=0, max_size=5)


@settings(max_examples=400, deadline=None)
@given(types=SMALL_TYPES, need=st.builds(cap, st.integers(-2, 60), st.integers(-2, 60)),
       room_=st.none() | st.builds(cap, st.integers(0, 80), st.integers(0, 80)),
       max_claims=st.integers(0, 6), capacity_type=st.sampled_from([ON_DEMAND, SPOT]))
def test_cheapest_claims_matches_a_brute_force(types: list[InstanceType], need: Capacity, room_: Capacity | None,
                                               max_claims: int, capacity_type: str) -> None:
    plan = cheapest_claims(need, types, capacity_type=capacity_type, room=room_, max_claims=max_claims)
    got = plan.capacity
    # the limits hold
    assert len(plan.claims) <= max_claims
    if room_ is not None:
        assert room_.covers(got)
    # shortfall and `closed` say what the claims leave open; a reason exactly when something is open
    assert plan.shortfall == (need - got).positive()
    assert plan.closed == got.covers(need)
    assert (plan.reason == "") == plan.closed
    assert all(c.price == c.instance_type.prices[capacity_type] and c.capacity_type == capacity_type
               for c in plan.claims)
    # and no plan is better: not in what it closes, nor in price, nor in the tie-breaks
    reference = brute_force_reference(need, types, capacity_type, room_, max_claims, limit=6)
    assert (score(need, got), round(plan.price * 1e6), len(plan.claims), sorted(names(plan))) == \
        (score(need, reference.capacity), round(reference.price * 1e6), len(reference.claims),
         sorted(names(reference)))


@settings(max_examples=60, deadline=None)
@given(need=st.builds(cap, st.integers(0, 6000), st.integers(0, 1200)),
       room_=st.none() | st.builds(cap, st.integers(0, 8000), st.integers(0, 1500)),
       max_claims=st.integers(0, 8), capacity_type=st.sampled_from([ON_DEMAND, SPOT]))
def test_the_packaged_catalog_matches_a_brute_force(need: Capacity, room_: Capacity | None, max_claims: int,
                                                    capacity_type: str) -> None:
    plan = cheapest_claims(need, CATALOG.types, capacity_type=capacity_type, room=room_, max_claims=max_claims)
    reference = brute_force_reference(need, CATALOG.types, capacity_type, room_, max_claims, limit=8)
    assert (score(need, plan.capacity), round(plan.price * 1e6), sorted(names(plan))) == \
        (score(need, reference.capacity), round(reference.price * 1e6), sorted(names(reference)))


@settings(max_examples=300, deadline=None)
@given(types=SMALL_TYPES, need=st.builds(cap, st.integers(0, 60), st.integers(0, 60)),
       room_=st.none() | st.builds(cap, st.integers(0, 80), st.integers(0, 80)), max_claims=st.integers(0, 6),
       seeds=st.booleans())
def test_the_search_alone_and_the_seeds_alone_are_each_sound(types: list[InstanceType], need: Capacity,
                                                             room_: Capacity | None, max_claims: int,
                                                             seeds: bool) -> None:
    """The search without its starting plans finds the best plan by itself; with no budget, the
    starting plans alone still give a plan within the limits."""
    sellable = list({t.name: t for t in reversed(types) if t.price(ON_DEMAND) is not None}.values())
    budget = plan_module.SEARCH_BUDGET if not seeds else 0
    found = plan_module._search(need, sellable, ON_DEMAND, room_, max_claims, budget=budget, seeds=seeds)
    got = Capacity(sum(t.tflops for t in found), sum(t.vram for t in found))
    assert len(found) <= max_claims and (room_ is None or room_.covers(got))
    if not seeds:
        reference = brute_force_reference(need, types, ON_DEMAND, room_, max_claims, limit=6)
        assert (score(need, got), sum(round(t.prices[ON_DEMAND] * 1e6) for t in found), len(found),
                sorted(t.name for t in found)) == \
            (score(need, reference.capacity), round(reference.price * 1e6), len(reference.claims),
             sorted(names(reference)))


# --- choose_expansions: examples -----------------------------------------------------------------------


def pod(key: str, tflops: int, vram_gi: int, gpus: int = 1, model: str = "") -> PodNeed:
    return PodNeed(key=key, pool="p", tflops_per_gpu=tflops * T, vram_per_gpu=vram_gi * GI, gpu_count=gpus,
                   gpu_model=model)


def in_flight(claim: str, t: InstanceType, ready_at: float, gpus: Sequence[tuple[int, int]] | None = None) -> InFlight:
    free = tuple(FreeGpu(tf * T, v * GI, t.gpu_model) for tf, v in gpus) if gpus is not None else \
        tuple(FreeGpu(t.tflops_per_gpu, t.vram_per_gpu, t.gpu_model) for _ in range(t.gpu_count))
    return InFlight(claim, t, ready_at, free)


L4 = kind("l4", 1, 121, 22, 0.8, model="L4", boot=90)
L4X4 = kind("l4x4", 4, 121, 22, 4.6, model="L4", boot=90)
A100 = kind("a100", 1, 312, 80, 5.0, model="A100", boot=150)
A100X8 = kind("a100x8", 8, 312, 80, 41.0, model="A100", boot=180)
TYPES = [L4, L4X4, A100, A100X8]


def test_pods_wait_for_a_claim_in_flight_that_holds_them() -> None:
    flight = [in_flight("p-late", A100, 500.0), in_flight("p-soon", A100, 200.0)]
    out = choose_expansions([pod("ns/a", 100, 40), pod("ns/b", 100, 30)], flight, {}, TYPES, now=0.0, max_new=5)
    # the earliest ready claim first; both fit on its one GPU (200 TFLOPS / 70Gi of 312 / 80)
    assert out == [Expansion(("ns/a", "ns/b"), claim="p-soon", ready_at=200.0)]


def test_in_flight_gpus_are_distinct_per_pod_and_shrink_as_pods_are_promised() -> None:
    flight = [in_flight("c1", A100X8, 100.0, [(300, 70), (300, 70), (10, 10)])]
    out = choose_expansions([pod("ns/two", 200, 50, gpus=2), pod("ns/one", 200, 50)], flight, {}, TYPES,
                            now=0.0, max_new=5)
    # "two" takes GPUs 0 and 1; "one" would need a third GPU with 200 TFLOPS: a new claim
    assert out[0] == Expansion(("ns/two",), claim="c1", ready_at=100.0)
    assert out[1].pods == ("ns/one",) and out[1].instance_type == A100 and out[1].ready_at == 150.0


def test_a_model_named_by_the_pod_must_match() -> None:
    flight = [in_flight("c-l4", L4, 10.0)]
    out = choose_expansions([pod("ns/a", 10, 1, model="A100")], flight, {}, TYPES, now=1000.0, max_new=5)
    assert out == [Expansion(("ns/a",), instance_type=A100, ready_at=1150.0)]


def test_new_claims_go_to_the_lowest_price_per_pod() -> None:
    # five pods of 20 TFLOPS / 5Gi: l4 holds 4 of them ($0.20 a pod), l4x4 holds 5 ($0.92), a100 5 ($1)
    pods = [pod(f"ns/p{i}", 20, 5) for i in range(5)]
    out = choose_expansions(pods, [], {}, TYPES, now=0.0, max_new=5)
    assert [(e.pods, e.instance_type) for e in out] == [(("ns/p0", "ns/p1", "ns/p2", "ns/p3"), L4), (("ns/p4",), L4)]
    assert all(e.ready_at == 90.0 and e.claim == "" and e.cloned_from == "" for e in out)


def test_the_readme_example_with_the_packaged_catalog() -> None:
    pods = [pod(f"ns/p{i}", 20, 5) for i in range(5)]
    out = choose_expansions(pods, [], {}, CATALOG.types, now=1000.0, max_new=15)
    g6 = CATALOG.get("g6.xlarge")
    assert out == [Expansion(("ns/p0", "ns/p1", "ns/p2", "ns/p3"), instance_type=g6, ready_at=1090.0),
                   Expansion(("ns/p4",), instance_type=g6, ready_at=1090.0)]


def test_the_largest_pod_picks_first() -> None:
    out = choose_expansions([pod("ns/small", 10, 1), pod("ns/big", 100, 60)], [], {}, TYPES, now=0.0, max_new=5)
    # "big" fits only an A100; "small" rides along on the same GPU
    assert [(e.pods, e.instance_type) for e in out] == [(("ns/big", "ns/small"), A100)]


def test_an_existing_nodes_type_is_cloned_when_it_fits() -> None:
    out = choose_expansions([pod("ns/a", 10, 1)], [], {"node-7": A100X8, "node-2": L4X4}, TYPES, now=0.0,
                            max_new=5)
    # cloning beats the cheaper plain l4; of the clonable types, the cheaper per pod
    assert out == [Expansion(("ns/a",), instance_type=L4X4, cloned_from="node-2", ready_at=90.0)]
    out = choose_expansions([pod("ns/a", 200, 1)], [], {"node-2": L4X4}, TYPES, now=0.0, max_new=5)
    assert out == [Expansion(("ns/a",), instance_type=A100, ready_at=150.0)]  # l4x4 does not fit it


def test_at_most_max_new_claims_and_the_rest_are_told_why() -> None:
    pods = [pod(f"ns/p{i}", 100, 20) for i in range(3)]
    out = choose_expansions(pods, [], {}, [L4], now=0.0, max_new=2)
    assert [e.pods for e in out] == [("ns/p0",), ("ns/p1",), ("ns/p2",)]
    assert out[2] == Expansion(("ns/p2",), reason="at most 2 new claims may be made now and 2 were; "
                                                  "this pod waits for a later round")
    assert choose_expansions(pods, [], {}, [L4], now=0.0, max_new=0) == [Expansion(
        ("ns/p0", "ns/p1", "ns/p2"),
        reason="at most 0 new claims may be made now and 0 were; these 3 pods wait for a later round")]


def test_a_clonable_type_missing_from_the_types_still_holds_pods() -> None:
    out = choose_expansions([pod("ns/a", 200, 60)], [], {"node-1": A100}, [L4], now=0.0, max_new=1)
    assert out == [Expansion(("ns/a",), instance_type=A100, cloned_from="node-1", ready_at=150.0)]


def test_a_pod_no_type_holds_gets_the_reason_with_numbers() -> None:
    out = choose_expansions([pod("ns/huge", 400, 90, gpus=2)], [], {}, TYPES, now=0.0, max_new=5)
    assert out == [Expansion(("ns/huge",), reason=(
        "no instance type sold as OnDemand has 2 GPUs with at least 400 TFLOPS and 90Gi each "
        "(the largest, a100x8, has 8 x A100 with 312 TFLOPS and 80Gi)"))]
    out = choose_expansions([pod("ns/a", 1, 1)], [], {}, TYPES, capacity_type=SPOT, now=0.0, max_new=5)
    assert out == [Expansion(("ns/a",), reason="no instance type is sold as Spot")]


def test_a_pod_listed_twice_is_placed_once() -> None:
    out = choose_expansions([pod("ns/a", 10, 1), pod("ns/a", 10, 1)], [], {}, TYPES, now=0.0, max_new=5)
    assert [e.pods for e in out] == [("ns/a",)]


# --- choose_expansions: properties ---------------------------------------------------------------------

EXPANDER_TYPES = st.lists(
    st.builds(kind, name=st.sampled_from(["a", "b", "c", "d"]), count=st.integers(1, 4),
              tflops=st.integers(1, 8), vram_gi=st.integers(1, 8), on_demand=st.sampled_from([0.5, 1.0, 2.0]),
              model=st.sampled_from(["L4", "A100"])),
    max_size=4, unique_by=lambda t: t.name)
PODS = st.lists(st.builds(pod, key=st.sampled_from([f"ns/p{i}" for i in range(12)]), tflops=st.integers(0, 6),
                          vram_gi=st.integers(0, 6), gpus=st.integers(1, 3),
                          model=st.sampled_from(["", "L4", "A100"])),
                max_size=10)


def replay(pods: Sequence[PodNeed], gpus: list[FreeGpu]) -> bool:
    """Places the pods in order on `gpus` the way a scheduler would: each on distinct GPUs with room."""
    for p in pods:
        picks = [i for i, g in enumerate(gpus) if g.tflops >= p.tflops_per_gpu and g.vram >= p.vram_per_gpu
                 and (not p.gpu_model or g.model == p.gpu_model)][:p.gpu_count]
        if len(picks) < p.gpu_count:
            return False
        for i in picks:
            gpus[i] = FreeGpu(gpus[i].tflops - p.tflops_per_gpu, gpus[i].vram - p.vram_per_gpu, gpus[i].model)
    return True


@settings(max_examples=300, deadline=None)
@given(types=EXPANDER_TYPES, pods=PODS, flight_types=st.lists(st.sampled_from(TYPES), max_size=3),
       clone=st.none() | st.integers(0, 3), max_new=st.integers(0, 4))
def test_expansions_place_every_pod_once_and_only_where_it_fits(
        types: list[InstanceType], pods: list[PodNeed], flight_types: list[InstanceType], clone: int | None,
        max_new: int) -> None:
    flight = [in_flight(f"claim-{i}", t, 100.0 + i) for i, t in enumerate(flight_types)]
    clonable = {"node-x": types[clone]} if clone is not None and clone < len(types) else {}
    out = choose_expansions(pods, flight, clonable, types, now=50.0, max_new=max_new)
    by_key = {p.key: p for p in reversed(pods)}
    placed = [k for e in out for k in e.pods]
    assert sorted(placed) == sorted(by_key)  # every pod once
    assert sum(1 for e in out if e.instance_type is not None) <= max(max_new, 0)
    claims = {c.claim: c for c in flight}
    for e in out:
        assert e.pods and not (e.claim and e.instance_type is not None)
        if e.claim:
            claim = claims.pop(e.claim)  # one Expansion per claim in flight
            assert e.ready_at == claim.ready_at and e.instance_type is None
            assert replay([by_key[k] for k in e.pods], list(claim.gpus))
        elif e.instance_type is not None:
            t = e.instance_type
            assert t.price(ON_DEMAND) is not None and e.ready_at == 50.0 + t.boot_seconds and e.reason == ""
            assert replay([by_key[k] for k in e.pods], [FreeGpu(t.tflops_per_gpu, t.vram_per_gpu, t.gpu_model)]
                          * t.gpu_count)
            assert e.cloned_from in ("", "node-x") and (not e.cloned_from or clonable[e.cloned_from] == t)
            if not e.cloned_from:  # a copy of an existing node's type is preferred whenever it holds the pod
                head = by_key[e.pods[0]]
                assert not any(replay([head], [FreeGpu(c.tflops_per_gpu, c.vram_per_gpu, c.gpu_model)] * c.gpu_count)
                               for c in clonable.values())
        else:
            assert e.reason
            if not e.reason.startswith("at most"):
                (key,) = e.pods
                assert not any(replay([by_key[key]], [FreeGpu(t.tflops_per_gpu, t.vram_per_gpu, t.gpu_model)]
                                      * t.gpu_count) for t in [*types, *clonable.values()])
