"""Topology-aware choice of GPUs (tfusion/allocator/topology.py) and how the allocator uses it."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfusion.allocator import AllocRequest, Framework, GpuAllocator, GpuInfo
from tfusion.allocator import topology as topo
from tfusion.allocator.reasons import Code
from tfusion.allocator.state import GpuSlot
from tfusion.allocator.topology import Policy, TopologyArgs

GIB = 1 << 30
POOL = "pool"
SOFT = TopologyArgs().policy()
HARD0 = TopologyArgs(mode="hard", max_tier=0).policy()


def slot(name: str, peers: dict[str, int] | None = None, numa: int | None = None, node: str = "n1") -> GpuSlot:
    return GpuSlot(GpuInfo(name=name, node=node, pool=POOL, capacity_tflops=100_000, capacity_vram=80 * GIB,
                           numa=numa, peer_tiers=tuple(sorted((peers or {}).items()))))


def matrix_node(tiers: Sequence[Sequence[int]], node: str = "n1", prefix: str = "g") -> list[GpuInfo]:
    """GPUs `{prefix}0..` on `node` whose peers have the tiers of the symmetric matrix `tiers`."""
    n = len(tiers)
    return [GpuInfo(name=f"{prefix}{i}", node=node, pool=POOL, capacity_tflops=100_000, capacity_vram=80 * GIB,
                    index=i, peer_tiers=tuple(sorted((f"{prefix}{j}", tiers[i][j]) for j in range(n) if j != i)))
            for i in range(n)]


#: two NVLink pairs (0-1, 2-3) on one PCIe switch: the sim spec nvlink=0-1,2-3;pcie-switch=0-1-2-3
PAIRS = [[0, 0, 1, 1], [0, 0, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]]


def req(uid: str, count: int = 2, vram: int = 10 * GIB, *, topology_required: bool | None = None,
        topology_max_tier: int | None = None, topology_source: str = "") -> AllocRequest:
    return AllocRequest(pod_uid=uid, pod_name=uid, namespace="ns", pool=POOL, workload=("ns", uid),
                        tflops_request=1000, vram_request=vram, count=count, topology_required=topology_required,
                        topology_max_tier=topology_max_tier, topology_source=topology_source)


def cluster(*nodes: list[GpuInfo], args: TopologyArgs | None = None) -> GpuAllocator:
    alloc = GpuAllocator(topology=args)
    for infos in nodes:
        for info in infos:
            alloc.upsert_gpu(info)
    return alloc


def occupy(alloc: GpuAllocator, uid: str, gpu: str, vram: int = 75 * GIB) -> None:
    alloc.assume(req(uid, count=1, vram=vram), [gpu])
    alloc.commit(uid)


# ---------------------------------------------------------------------- pairs and sets

def test_a_pair_tier_comes_from_the_peers_then_the_numa_nodes_else_it_is_unknown() -> None:
    a, b = slot("a", {"b": 0}, numa=0), slot("b", {"a": 0}, numa=1)
    c, d = slot("c", numa=0), slot("d", numa=1)
    bare = slot("e")
    assert topo.pair_tier(a, b, "auto") == 0 and topo.pair_tier(a, b, "numa") == 2
    assert topo.pair_tier(a, c, "auto") == 1  # no peer entry: NUMA decides under auto
    assert topo.pair_tier(a, c, "vendor") == 3  # ... but not under vendor
    assert topo.pair_tier(c, d, "auto") == 2 and topo.pair_tier(c, bare, "auto") == 3
    assert topo.pair_tier(slot("x", {"y": 1}), slot("y"), "vendor") == 1  # one side's report is enough


def test_the_best_pair_is_an_nvlink_pair_and_a_busy_gpu_leaves_a_pcie_one() -> None:
    gpus = [slot(f"g{i}", {f"g{j}": PAIRS[i][j] for j in range(4) if j != i}) for i in range(4)]
    choice = topo.best_set(gpus, 2, SOFT)
    assert choice.tier == 0 and {gpus[i].name for i in choice.picks} in ({"g0", "g1"}, {"g2", "g3"})
    one_per_pair = [gpus[0], gpus[2]]
    assert topo.best_set(one_per_pair, 2, SOFT).tier == 1
    assert topo.refusal(topo.best_set(one_per_pair, 2, HARD0), HARD0)
    assert topo.refusal_detail(2, "vm", topo.best_set(one_per_pair, 2, HARD0), HARD0) == \
        "best 2 GPUs on node vm are joined at tier 1 (PCIe switch or host bridge); at most tier 0 allowed"


def test_least_damage_takes_the_pair_that_leaves_the_other_pair_whole() -> None:
    # NVLink chain 0-1-2-3; in load order 1, 2, 0, 3 the first NVLink pair (1, 2) would break both ends
    chain = [[0, 0, 1, 1], [0, 0, 0, 1], [1, 0, 0, 0], [1, 1, 0, 0]]
    gpus = [slot(f"g{i}", {f"g{j}": chain[i][j] for j in range(4) if j != i}) for i in range(4)]
    ordered = [gpus[1], gpus[2], gpus[0], gpus[3]]
    careful = topo.best_set(ordered, 2, SOFT)
    careless = topo.best_set(ordered, 2, replace(SOFT, least_damage=False))
    assert {ordered[i].name for i in careless.picks} == {"g1", "g2"}
    assert {ordered[i].name for i in careful.picks} in ({"g0", "g1"}, {"g2", "g3"})
    assert careful.tier == careless.tier == 0


def test_many_gpus_are_searched_greedily_and_still_find_an_nvlink_quad() -> None:
    quads = [[0 if i // 4 == j // 4 else 2 for j in range(16)] for i in range(16)]
    gpus = [slot(f"g{i}", {f"g{j}": quads[i][j] for j in range(16) if j != i}) for i in range(16)]
    choice = topo.best_set(gpus, 4, SOFT)
    assert not choice.exhaustive  # C(16, 4) = 1820 > 256
    assert choice.tier == 0 and len({int(gpus[i].name[1:]) // 4 for i in choice.picks}) == 1


def test_reject_never_uses_a_set_with_an_unknown_pair() -> None:
    reject = TopologyArgs(unknown_policy="reject").policy()
    known = [slot("a", {"b": 1}), slot("b", {"a": 1}), slot("c")]
    assert topo.best_set(known, 2, reject).tier == 1
    choice = topo.best_set([slot("x"), slot("y")], 2, reject)
    assert choice.tier is None and topo.refusal(choice, reject)
    assert "unknown and unknownTopologyPolicy is reject" in topo.refusal_detail(2, "vm", choice, reject)
    assert topo.best_set([slot("x"), slot("y")], 2, SOFT).tier == 3  # treat-as-worst: usable, tier 3


tiers = st.integers(min_value=0, max_value=3)


@st.composite
def tier_matrices(draw: st.DrawFn) -> list[list[int]]:
    n = draw(st.integers(min_value=2, max_value=7))
    m = [[0] * n for _ in range(n)]
    for i, j in itertools.combinations(range(n), 2):
        m[i][j] = m[j][i] = draw(tiers)
    return m


@settings(max_examples=150, deadline=None)
@given(tier_matrices(), st.integers(min_value=2, max_value=4), st.booleans())
def test_an_exhaustive_choice_is_never_worse_than_any_other_set(m: list[list[int]], count: int, careful: bool) -> None:
    n = len(m)
    count = min(count, n)
    gpus = [slot(f"g{i}", {f"g{j}": m[i][j] for j in range(n) if j != i}) for i in range(n)]
    policy = replace(SOFT, least_damage=careful)
    choice = topo.best_set(gpus, count, policy)
    assert choice.exhaustive and choice.tier is not None and len(set(choice.picks)) == count

    def worst(picks: Sequence[int]) -> int:
        return max(m[i][j] for i, j in itertools.combinations(picks, 2))

    def damage(picks: Sequence[int]) -> int:
        left = [i for i in range(n) if i not in picks]
        return sum(min((m[i][j] for j in left if j != i), default=3) for i in left)

    assert choice.tier == worst(choice.picks)
    for other in itertools.combinations(range(n), count):
        assert choice.tier <= worst(other)
        if careful and worst(other) == choice.tier:
            assert damage(choice.picks) <= damage(other)


def test_pod_overrides_fold_over_the_config() -> None:
    assert topo.policy_for(SOFT, req("a")) is SOFT
    hard = topo.policy_for(SOFT, req("a", topology_required=True))
    assert (hard.hard, hard.max_tier) == (True, 1)
    tier0 = topo.policy_for(SOFT, req("a", topology_max_tier=0))  # a tier of its own is a requirement
    assert (tier0.hard, tier0.max_tier) == (True, 0)
    relaxed = topo.policy_for(HARD0, req("a", topology_required=False, topology_source="numa"))
    assert (relaxed.hard, relaxed.source, relaxed.max_tier) == (False, "numa", 0)
    assert topo.outcome(0, tier0) == "satisfied" and topo.outcome(1, SOFT) == "satisfied"
    assert topo.outcome(2, SOFT) == "fallback" and topo.outcome(2, hard) == "unsatisfied"


# ---------------------------------------------------------------------- through the allocator

def test_select_and_reserve_take_an_nvlink_pair() -> None:
    alloc = cluster(matrix_node(PAIRS))
    occupy(alloc, "busy", "g0", vram=5 * GIB)  # g0 a little loaded: the load order alone puts it last
    placement = alloc.select(req("p"))
    assert set(placement.gpu_names) in ({"g2", "g3"}, {"g0", "g1"})
    fw = Framework(alloc)
    reserved, status = fw.reserve(req("q"), "n1")
    assert status.ok and reserved is not None and set(reserved.gpu_names) in ({"g2", "g3"}, {"g0", "g1"})
    assert alloc.topology_outcome(req("q"), reserved.gpu_names) == "satisfied"


def test_hard_mode_refuses_a_node_without_a_free_nvlink_pair_and_says_the_tier() -> None:
    alloc = cluster(matrix_node(PAIRS))
    occupy(alloc, "a", "g0")
    occupy(alloc, "b", "g2")
    fw = Framework(alloc)
    soft = req("p")
    assert fw.feasible(soft, ["n1"]) == ["n1"]  # soft: placed on g1 + g3 at tier 1
    placed = alloc.select(soft)
    assert set(placed.gpu_names) == {"g1", "g3"} and alloc.topology_outcome(soft, placed.gpu_names) == "satisfied"
    wanted_nvlink = req("s", topology_required=False, topology_max_tier=0)  # soft, but hoping for tier 0
    assert alloc.topology_outcome(wanted_nvlink, placed.gpu_names) == "fallback"
    hard = req("h", topology_max_tier=0)
    assert fw.feasible(hard, ["n1"]) == []
    expl = fw.explain(hard)
    status = expl.nodes["n1"]
    assert status.code is Code.UNSCHEDULABLE  # the pair frees when a pod leaves
    reason = status.reasons[0]
    assert (reason.stage, reason.requested, reason.available) == (topo.STAGE, 0, 1)
    assert reason.detail == "best 2 GPUs on node n1 are joined at tier 1 (PCIe switch or host bridge); " \
                            "at most tier 0 allowed"
    assert expl.message(1) == "0/1 nodes are available: 1 best GPU set at topology tier 1, at most 0 allowed."
    placement, refused = fw.reserve(hard, "n1")
    assert placement is None and refused.reasons[0].stage == topo.STAGE
    looser = [s for s in expl.suggestions if s.kind == "looser-topology"]
    assert [dict(s.changes) for s in looser] == [{"tensor-fusion.ai/gpu-topology-max-tier": "1"}]
    # freeing GPUs by preemption is offered only when it would give an NVLink pair
    assert all(s.kind != "preempt-lower-qos" for s in expl.suggestions)


def test_preemption_suggestion_frees_a_whole_nvlink_pair() -> None:
    alloc = cluster(matrix_node(PAIRS))
    alloc.assume(replace(req("low", count=1, vram=75 * GIB), qos="low", priority=-1), ["g0"])
    alloc.commit("low")
    occupy(alloc, "b", "g2")
    expl = Framework(alloc).explain(replace(req("h", topology_max_tier=0), qos="high"))
    preempt = [s for s in expl.suggestions if s.kind == "preempt-lower-qos"]
    assert [s.pods for s in preempt] == [("ns/low",)]


def test_a_node_that_could_never_give_the_tier_is_unresolvable() -> None:
    switch_only = [[0, 1, 1], [1, 0, 1], [1, 1, 0]]
    alloc = cluster(matrix_node(switch_only))
    status = Framework(alloc).explain(req("h", topology_max_tier=0)).nodes["n1"]
    assert status.code is Code.UNRESOLVABLE


def test_hard_mode_from_the_config_and_a_pod_that_opts_out() -> None:
    alloc = cluster(matrix_node(PAIRS), args=TopologyArgs(mode="hard", max_tier=0))
    occupy(alloc, "a", "g0")
    occupy(alloc, "b", "g2")
    fw = Framework(alloc)
    assert fw.feasible(req("p"), ["n1"]) == []
    assert fw.feasible(req("p", topology_required=False), ["n1"]) == ["n1"]  # same amounts, another shape
    assert fw.feasible(req("p"), ["n1"]) == []
    assert fw.feasible(req("one", count=1), ["n1"]) == ["n1"]  # one GPU: no topology


def test_unknown_topology_with_reject_is_refused_saying_so() -> None:
    bare = [GpuInfo(name=f"u{i}", node="n1", pool=POOL, capacity_tflops=100_000, capacity_vram=80 * GIB)
            for i in range(2)]
    alloc = cluster(bare, args=TopologyArgs(unknown_policy="reject"))
    fw = Framework(alloc)
    assert fw.feasible(req("p"), ["n1"]) == []
    status = fw.explain(req("p")).nodes["n1"]
    assert status.code is Code.UNRESOLVABLE and status.reasons[0].message == "GPU topology unknown"
    assert cluster(bare).select(req("p")).node == "n1"  # treat-as-worst: placed


def test_soft_mode_prefers_the_node_whose_best_set_is_better_joined() -> None:
    alloc = cluster(matrix_node(PAIRS, "a-node", "a"), matrix_node(PAIRS, "b-node", "b"))
    for gpu in ("a0", "a2"):
        occupy(alloc, f"on-{gpu}", gpu)  # a-node: both pairs broken, the more used (packing prefers it)
    occupy(alloc, "on-b0", "b0")  # b-node: one pair whole
    fw = Framework(alloc)
    request = req("p")
    plain = {n: alloc.node_score(n, POOL) for n in ("a-node", "b-node")}
    assert plain["a-node"] > plain["b-node"]
    scores = fw.score(request, ["a-node", "b-node"])
    assert scores["b-node"] > scores["a-node"]
    assert alloc.best_tier("b-node", request) == 0 and alloc.best_tier("a-node", request) == 1
    assert fw.score(req("one", count=1), ["a-node", "b-node"]) == plain  # one GPU: the load score alone


def test_without_reported_topology_nothing_changes() -> None:
    bare = [GpuInfo(name=f"u{i}", node="n1", pool=POOL, capacity_tflops=100_000, capacity_vram=80 * GIB)
            for i in range(4)]
    alloc = cluster(bare)
    assert not alloc.topology_reported()
    fw = Framework(alloc)
    assert fw.score(req("p"), ["n1"]) == {"n1": alloc.node_score("n1", POOL)}
    assert alloc.topology_outcome(req("p"), ["u0", "u1"]) == ""


@pytest.mark.parametrize("policy", [SOFT, HARD0, Policy(True, "numa", 1, True, False)])
def test_in_play_only_for_several_gpus(policy: Policy) -> None:
    gpus = [slot("a", numa=0), slot("b", numa=0)]
    assert not topo.in_play(gpus, req("one", count=1), policy)
    assert topo.in_play(gpus, req("two"), policy)
