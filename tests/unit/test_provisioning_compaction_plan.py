"""Which empty nodes compaction gives back and which workers a defrag moves
(tfusion/controller/provisioning/compaction_plan.py), on plain facts."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tfusion.controller.provisioning.compaction_plan import (
    HOURS_PER_MONTH,
    DefragMove,
    GpuRoom,
    NodeFacts,
    WorkerFacts,
    age_text,
    compaction,
    defrag_moves,
    potential_savings_per_month,
    utilization_percent,
)
from tfusion.controller.provisioning.plan import Capacity, PoolCapacity, Targets, gap

GI = 1 << 30
NOW = 10_000.0
MIN_AGE = 300.0
ZERO = Capacity(0, 0)


def tf(tflops: int, vram_gi: int) -> Capacity:
    return Capacity(tflops * 1000, vram_gi * GI)


def node(name: str, *, size: Capacity = tf(100, 40), free: Capacity | None = None, age: float = 600.0,
         claim: str = "", running: bool = True, do_not_disrupt: bool = False, price: float = 1.0,
         pool: str = "p") -> NodeFacts:
    available = size if free is None else free
    return NodeFacts(name=name, pool=pool, claim=claim, created_at=NOW - age, running=running,
                     empty=available == size, do_not_disrupt=do_not_disrupt, capacity=size, available=available,
                     price_per_hour=price)


def pool_of(nodes: list[NodeFacts]) -> PoolCapacity:
    running = [n for n in nodes if n.running]
    total = sum((n.capacity for n in running), ZERO)
    available = sum((n.available for n in running), ZERO)
    return PoolCapacity(total, available, ZERO)


def run(nodes: list[NodeFacts], targets: Targets = Targets(None, None, None)) -> tuple[list[str], dict[str, str]]:
    removals, kept = compaction(nodes, pool_of(nodes), targets, now=NOW, min_age_s=MIN_AGE)
    return [r.node for r in removals], {k.node: k.reason for k in kept}


def test_without_targets_every_old_empty_running_node_goes() -> None:
    removed, kept = run([node("a"), node("b", claim="p-1234abcd")])
    assert removed == ["a", "b"]
    assert kept == {}


def test_warm_keeps_as_many_empty_nodes_as_it_needs() -> None:
    nodes = [node("a"), node("b"), node("c")]
    removed, kept = run(nodes, Targets(None, tf(150, 0), None))
    assert removed == ["a"]  # 300 available; 200 after a, 100 after b would be below 150
    assert kept["b"] == ("empty, but without it the pool's available capacity would be 100 TFLOPS / 40Gi, "
                         "below warmResources 150 TFLOPS / 0")
    assert set(kept) == {"b", "c"}


def test_minimum_counts_the_total_including_busy_nodes() -> None:
    busy = node("busy", free=tf(0, 0))
    removed, kept = run([busy, node("a"), node("b")], Targets(tf(200, 80), None, None))
    assert removed == ["a"]
    assert "below minResources 200 TFLOPS / 80Gi" in kept["b"]
    assert kept["busy"] == "GPU workers run on it"


def test_a_node_goes_only_while_both_dimensions_stay_covered() -> None:
    removed, kept = run([node("a"), node("b")], Targets(None, tf(10, 50), None))
    assert removed == []  # 80Gi free in all; 40Gi without either, below 50Gi
    assert set(kept) == {"a", "b"}


def test_young_not_running_and_do_not_disrupt_nodes_stay_with_their_reason() -> None:
    removed, kept = run([node("young", age=120), node("starting", running=False),
                         node("pinned", do_not_disrupt=True), node("old")])
    assert removed == ["old"]
    assert kept["young"] == "empty, but only 2m old (nodes younger than 5m are kept)"
    assert kept["starting"] == "its GPUNode is not Running"
    assert kept["pinned"] == "it is marked tensor-fusion.ai/do-not-disrupt=true"


def test_the_most_expensive_node_goes_first_and_the_reason_has_the_numbers() -> None:
    nodes = [node("cheap", price=1.0), node("dear", price=5.07)]
    removals, _ = compaction(nodes, pool_of(nodes), Targets(tf(50, 10), tf(100, 40), None), now=NOW,
                             min_age_s=MIN_AGE)
    assert [(r.node, r.claim) for r in removals] == [("dear", "")]
    assert removals[0].reason == ("empty and 10m old; without it the pool keeps 100 TFLOPS / 40Gi in total "
                                  "(minResources 50 TFLOPS / 10Gi) and 100 TFLOPS / 40Gi available "
                                  "(warmResources 100 TFLOPS / 40Gi)")


def test_a_smaller_node_may_go_when_a_larger_one_may_not() -> None:
    nodes = [node("big", size=tf(300, 80)), node("small", size=tf(50, 20)), node("busy", size=tf(100, 40),
                                                                                  free=tf(0, 0))]
    removed, kept = run(nodes, Targets(None, tf(250, 60), None))
    assert removed == ["small"]
    assert "big" in kept


def test_a_pool_already_below_its_target_gives_nothing_back() -> None:
    removed, _ = run([node("a")], Targets(tf(500, 0), None, None))
    assert removed == []


def test_claims_in_flight_count_toward_the_targets() -> None:
    nodes = [node("a"), node("b")]
    pool = replace(pool_of(nodes), in_flight=tf(100, 40))
    removals, _ = compaction(nodes, pool, Targets(None, tf(200, 80), None), now=NOW, min_age_s=MIN_AGE)
    assert [r.node for r in removals] == ["a"]


def test_potential_savings_count_the_empty_nodes_for_730_hours() -> None:
    nodes = [node("a", price=5.07), node("busy", price=3.0, free=tf(10, 0)), node("b", price=1.0)]
    assert HOURS_PER_MONTH == 730
    assert potential_savings_per_month(nodes) == (5.07 + 1.0) * 730
    assert potential_savings_per_month([]) == 0


def test_ages_read_as_people_write_them() -> None:
    assert [age_text(s) for s in (0, 45, 60, 150, 360, 3600, 3900, -5)] == [
        "0s", "45s", "1m", "2m30s", "6m", "1h", "1h5m", "0s"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4), st.booleans(), st.booleans(), st.booleans()),
                min_size=1, max_size=8),
       st.one_of(st.none(), st.tuples(st.integers(0, 12), st.integers(0, 12))),
       st.one_of(st.none(), st.tuples(st.integers(0, 12), st.integers(0, 12))))
def test_removals_never_leave_the_pool_below_its_targets(
        shapes: list[tuple[int, int, bool, bool, bool]], minimum: tuple[int, int] | None,
        warm: tuple[int, int] | None) -> None:
    nodes = [node(f"n{i}", size=tf(100 * t + 1, 10 * v + 1), free=None if empty else tf(0, 0), running=running,
                  age=600 if old else 60) for i, (t, v, empty, running, old) in enumerate(shapes)]
    targets = Targets(tf(100 * minimum[0], 10 * minimum[1]) if minimum else None,
                      tf(100 * warm[0], 10 * warm[1]) if warm else None, None)
    pool = pool_of(nodes)
    removals, kept = compaction(nodes, pool, targets, now=NOW, min_age_s=MIN_AGE)
    assert sorted([r.node for r in removals] + [k.node for k in kept]) == sorted(n.name for n in nodes)
    by_name = {n.name: n for n in nodes}
    for removal in removals:
        gone = by_name[removal.node]
        assert gone.empty and gone.running and NOW - gone.created_at >= MIN_AGE
        pool = PoolCapacity(pool.total - gone.capacity, pool.available - gone.available, pool.in_flight)
        assert gap(pool, targets).is_zero
    # nothing more could go: every kept candidate would break a target
    for k in kept:
        n = by_name[k.node]
        if n.empty and n.running and NOW - n.created_at >= MIN_AGE:
            after = PoolCapacity(pool.total - n.capacity, pool.available - n.available, pool.in_flight)
            assert not gap(after, targets).is_zero


# --- defrag ----------------------------------------------------------------------------------------


def gpus(name: str, *free: tuple[int, int], model: str = "A100") -> list[GpuRoom]:
    return [GpuRoom(name, f"{name}-g{i}", t * 1000, v * GI, model) for i, (t, v) in enumerate(free)]


def worker(key: str, where: str, *, tflops: int = 10, vram: int = 4, count: int = 1, qos: str = "low",
           protected: bool = False, model: str = "") -> WorkerFacts:
    return WorkerFacts(key=key, node=where, qos=qos, protected=protected, gpu_count=count,
                       tflops_per_gpu=tflops * 1000, vram_per_gpu=vram * GI, model=model)


def cluster() -> tuple[list[NodeFacts], list[GpuRoom]]:
    """light: 10% used (one 10 TFLOPS worker on a 100 TFLOPS GPU); busy: 60% used, 40 free."""
    nodes = [node("light", free=tf(90, 36)), node("busy", free=tf(40, 16))]
    return nodes, gpus("light", (90, 36)) + gpus("busy", (40, 16))


def test_a_light_nodes_low_workers_move_when_they_fit_on_a_busy_node() -> None:
    nodes, rooms = cluster()
    moves = defrag_moves(nodes, rooms, [worker("ns/w", "light"), worker("ns/big", "busy", tflops=60, vram=24)],
                         utilization_threshold_percent=40)
    assert moves == [DefragMove("light", ("ns/w",), ("busy",))]


def test_a_node_at_or_above_the_threshold_stays() -> None:
    nodes, rooms = cluster()
    assert utilization_percent(nodes[0]) == 10.0
    assert defrag_moves(nodes, rooms, [worker("ns/w", "light")], utilization_threshold_percent=10) == []


def test_one_higher_qos_or_protected_worker_keeps_the_whole_node() -> None:
    nodes, rooms = cluster()
    for other in (worker("ns/m", "light", qos="medium"), worker("ns/p", "light", protected=True)):
        assert defrag_moves(nodes, rooms, [worker("ns/w", "light"), other], utilization_threshold_percent=40) == []


def test_all_workers_must_fit_together() -> None:
    nodes = [node("light", free=tf(70, 32)), node("busy", free=tf(40, 16))]
    rooms = gpus("light", (70, 32)) + gpus("busy", (40, 16))
    one, two = worker("ns/a", "light", tflops=15), worker("ns/b", "light", tflops=15)
    assert defrag_moves(nodes, rooms, [one, two], utilization_threshold_percent=40) == [
        DefragMove("light", ("ns/a", "ns/b"), ("busy",))]
    three = worker("ns/c", "light", tflops=15)  # 45 > the 40 free on busy
    assert defrag_moves(nodes, rooms, [one, two, three], utilization_threshold_percent=40) == []


def test_multi_gpu_workers_need_distinct_gpus_of_one_node_and_their_model() -> None:
    nodes = [node("light", size=tf(200, 80), free=tf(180, 72)), node("busy", size=tf(200, 80), free=tf(60, 20))]
    rooms = gpus("light", (90, 36), (90, 36)) + gpus("busy", (30, 10), (30, 10))
    pair = worker("ns/pair", "light", tflops=10, vram=4, count=2)
    assert defrag_moves(nodes, rooms, [pair], utilization_threshold_percent=40) == [
        DefragMove("light", ("ns/pair",), ("busy",))]
    too_big = worker("ns/pair", "light", tflops=31, vram=4, count=2)
    assert defrag_moves(nodes, rooms, [too_big], utilization_threshold_percent=40) == []
    other_model = worker("ns/pair", "light", count=2, model="H100")
    assert defrag_moves(nodes, rooms, [other_model], utilization_threshold_percent=40) == []


def test_empty_nodes_other_pools_and_not_running_nodes_take_nothing() -> None:
    nodes = [node("light", free=tf(90, 36)), node("empty"), node("elsewhere", free=tf(40, 16), pool="q"),
             node("starting", free=tf(40, 16), running=False)]
    rooms = gpus("light", (90, 36)) + gpus("empty", (100, 40)) + gpus("elsewhere", (40, 16)) \
        + gpus("starting", (40, 16))
    assert defrag_moves(nodes, rooms, [worker("ns/w", "light")], utilization_threshold_percent=40) == []


def test_do_not_disrupt_and_not_running_nodes_are_not_emptied() -> None:
    nodes, rooms = cluster()
    for change in ({"do_not_disrupt": True}, {"running": False}):
        light = replace(nodes[0], **change)  # type: ignore[arg-type]
        assert defrag_moves([light, nodes[1]], rooms, [worker("ns/w", "light")],
                            utilization_threshold_percent=40) == []


def test_free_room_is_not_counted_twice_and_receivers_are_not_emptied() -> None:
    # two light nodes whose workers each fit on busy alone, but not both; and each could take the other's
    nodes = [node("a", free=tf(75, 30)), node("b", free=tf(80, 32)), node("busy", free=tf(30, 12))]
    rooms = gpus("a", (75, 30)) + gpus("b", (80, 32)) + gpus("busy", (30, 12))
    workers = [worker("ns/a1", "a", tflops=25), worker("ns/b1", "b", tflops=20)]
    moves = defrag_moves(nodes, rooms, workers, utilization_threshold_percent=40)
    # b (20% used) goes first, onto the fullest node that fits: busy; a's 25 no longer fits there,
    # and b (drained) takes nothing; so a stays
    assert moves == [DefragMove("b", ("ns/b1",), ("busy",))]


def test_a_receiving_node_is_not_emptied_later_in_the_same_plan() -> None:
    nodes = [node("a", free=tf(90, 36)), node("b", free=tf(70, 28))]
    rooms = gpus("a", (90, 36)) + gpus("b", (70, 28))
    workers = [worker("ns/a1", "a"), worker("ns/b1", "b", tflops=30)]
    assert defrag_moves(nodes, rooms, workers, utilization_threshold_percent=40) == [
        DefragMove("a", ("ns/a1",), ("b",))]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(1, 60), st.integers(1, 3), st.booleans()), max_size=3),
                min_size=2, max_size=5))
def test_every_planned_move_fits_and_no_node_both_gives_and_takes(layout: list[list[tuple[int, int, bool]]]) -> None:
    """Nodes of two 100-TFLOPS GPUs; each worker takes `tflops` on `count` (1-2) GPUs when it fits."""
    nodes: list[NodeFacts] = []
    rooms: list[GpuRoom] = []
    workers: list[WorkerFacts] = []
    for i, wanted in enumerate(layout):
        name = f"n{i}"
        free = {f"{name}-g0": 100, f"{name}-g1": 100}
        for j, (tflops, count, low) in enumerate(wanted):
            count = min(count, 2)
            chosen = [g for g in sorted(free, key=lambda g: -free[g]) if free[g] >= tflops][:count]
            if len(chosen) < count:
                continue
            for g in chosen:
                free[g] -= tflops
            workers.append(WorkerFacts(f"ns/{name}-w{j}", name, "low" if low else "high", False, count,
                                       tflops * 1000, 0, ""))
        nodes.append(node(name, size=tf(200, 0), free=tf(sum(free.values()), 0)))
        rooms += [GpuRoom(name, g, t * 1000, 0, "A100") for g, t in free.items()]
    moves = defrag_moves(nodes, rooms, workers, utilization_threshold_percent=50)
    sources = {m.node for m in moves}
    receivers = {d for m in moves for d in m.destinations}
    assert not sources & receivers
    by_key = {w.key: w for w in workers}
    left = {n.name: n.available.tflops for n in nodes}
    for move in moves:
        moved = [by_key[k] for k in move.workers]
        assert {w.key for w in workers if w.node == move.node} == set(move.workers)
        assert all(w.qos == "low" for w in moved)
        assert utilization_percent(next(n for n in nodes if n.name == move.node)) < 50
        for w in moved:  # each has gpu_count GPUs with room for it on one destination
            assert any(sum(g.tflops >= w.tflops_per_gpu for g in rooms if g.node == d) >= w.gpu_count
                       for d in move.destinations)
        # and the free room of the destinations, less earlier moves' share, holds them all
        need = sum(w.gpu_count * w.tflops_per_gpu for w in moved)
        assert need <= sum(left[d] for d in move.destinations)
        for d in move.destinations:
            take = min(need, left[d])
            left[d] -= take
            need -= take
