"""The allocator's half of preemption (tfusion/allocator/preemption.py): a fit judged "without" some
allocations agrees with really releasing them and changes nothing; the victim set on a node is
minimal (giving any victim back breaks the fit) and takes the least important pods; the chosen node
is no more damaging than any other candidate; gangs go whole or not at all; budgets, the quota with
the victims' usage subtracted, and the pod index lock are honoured."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tfusion.allocator import AllocRequest, GpuAllocator, GpuInfo, QuotaSpec
from tfusion.allocator.preemption import (
    Candidate,
    PreemptionSearch,
    SearchStats,
    VictimFacts,
    effective_priority,
)
from tfusion.allocator.request import request_from_pod
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod

GIB = 1 << 30
CRITICAL = 100_000


def gpu(name: str, node: str, *, tflops: int = 100, vram: int = 16) -> GpuInfo:
    return GpuInfo(name=name, node=node, pool="p", capacity_tflops=tflops * 1000, capacity_vram=vram * GIB)


def req(uid: str, vram: int, *, priority: int = 0, ns: str = "ns", count: int = 1, **kw: Any) -> AllocRequest:
    return AllocRequest(pod_uid=uid, pod_name=uid, namespace=ns, pool="p", workload=(ns, uid),
                        tflops_request=1000, vram_request=vram * GIB, vram_limit=vram * GIB, count=count,
                        priority=priority, **kw)


def place(a: GpuAllocator, r: AllocRequest, *gpus: str) -> None:
    a.assume(r, gpus)
    a.commit(r.pod_uid)


def everyone(uid: str) -> VictimFacts:
    return VictimFacts()


def full_node(a: GpuAllocator, node: str, gpu_name: str, sizes: list[int], priorities: list[int]) -> list[str]:
    uids = []
    for i, (size, prio) in enumerate(zip(sizes, priorities, strict=True)):
        uid = f"{node}-v{i}"
        place(a, req(uid, size, priority=prio), gpu_name)
        uids.append(uid)
    return uids


def test_effective_priority_takes_spec_priority_else_the_qos_class() -> None:
    assert effective_priority(7, "critical") == 7
    assert effective_priority(None, "critical") == CRITICAL
    assert effective_priority(None, "high") == 10_000
    assert effective_priority(None, "low") == effective_priority(None, "medium") == 0
    assert effective_priority(True, "low") == 0  # a bool is not a priority
    notes = {tfa.GPU_POOL: "p", tfa.QOS: "critical"}
    meta: dict[str, Any] = {"name": "w", "uid": "u", "namespace": "d", "annotations": notes}
    assert request_from_pod(Pod({"metadata": meta, "spec": {}})).priority == CRITICAL
    assert request_from_pod(Pod({"metadata": meta, "spec": {"priority": 5}})).priority == 5


def test_one_low_pod_goes_for_a_critical_pod_and_nothing_changes_meanwhile() -> None:
    a = GpuAllocator()
    a.upsert_gpu(gpu("g1", "n1"))
    full_node(a, "n1", "g1", [4, 4, 4, 4], [0, 0, 0, 0])
    before = a.snapshot()
    versions = dict(a.node_versions())
    preemptor = req("crit", 4, priority=CRITICAL)
    feasible_before = set(a.feasible_nodes(preemptor))
    found = PreemptionSearch(a).best(preemptor, CRITICAL, everyone)
    assert found is not None and found.node == "n1" and len(found.victims) == 1
    assert found.damage.count == 1 and found.damage.top_priority == 0
    assert a.snapshot() == before and dict(a.node_versions()) == versions
    assert set(a.feasible_nodes(preemptor)) == feasible_before == set()


def test_same_or_higher_priority_pods_are_never_victims() -> None:
    a = GpuAllocator()
    a.upsert_gpu(gpu("g1", "n1"))
    full_node(a, "n1", "g1", [8, 8], [CRITICAL, CRITICAL])
    assert PreemptionSearch(a).best(req("crit", 4, priority=CRITICAL), CRITICAL, everyone) is None


def test_the_smallest_priorities_go_and_the_rest_are_reprieved() -> None:
    a = GpuAllocator()
    a.upsert_gpu(gpu("g1", "n1"))
    # 16 GiB full: 8 (prio 5), 4 (prio 1), 4 (prio 2); 8 GiB wanted: the two 4s go, not the 8 of prio 5
    full_node(a, "n1", "g1", [8, 4, 4], [5, 1, 2])
    found = PreemptionSearch(a).victims_on("n1", req("crit", 8, priority=CRITICAL), CRITICAL, everyone)
    assert found is not None and found.victims == ("n1-v1", "n1-v2")
    assert (found.damage.top_priority, found.damage.priority_sum, found.damage.count) == (2, 3, 2)


def test_ineligible_pods_stay_and_their_node_cannot_help() -> None:
    a = GpuAllocator()
    a.upsert_gpu(gpu("g1", "n1"))
    a.upsert_gpu(gpu("g2", "n2"))
    full_node(a, "n1", "g1", [16], [0])
    full_node(a, "n2", "g2", [16], [0])
    protected = {"n1-v0"}
    stats = SearchStats()
    found = PreemptionSearch(a).best(req("crit", 8, priority=CRITICAL), CRITICAL,
                                     lambda uid: None if uid in protected else VictimFacts(), stats=stats)
    assert found is not None and found.node == "n2"
    protected.add("n2-v0")
    stats = SearchStats()
    assert PreemptionSearch(a).best(req("crit2", 8, priority=CRITICAL), CRITICAL,
                                    lambda uid: None if uid in protected else VictimFacts(), stats=stats) is None
    assert sorted(stats.no_eligible) == ["n1", "n2"] and stats.examined == 2


def test_a_gang_goes_whole_and_counts_all_its_members() -> None:
    a = GpuAllocator()
    for node in ("n1", "n2", "n3"):
        a.upsert_gpu(gpu(f"g-{node}", node))
    place(a, req("gang-a", 16), "g-n1")
    place(a, req("gang-b", 16), "g-n2")
    place(a, req("solo", 16), "g-n3")
    gang = ("gang-a", "gang-b")

    def facts(uid: str) -> VictimFacts:
        return VictimFacts(group=gang) if uid in gang else VictimFacts()

    found = PreemptionSearch(a).best(req("crit", 8, priority=CRITICAL), CRITICAL, facts)
    assert found is not None and found.node == "n3" and found.victims == ("solo",)  # 1 victim beats 2
    gang_only = PreemptionSearch(a).victims_on("n1", req("crit", 8, priority=CRITICAL), CRITICAL, facts)
    assert gang_only is not None and gang_only.victims == gang and gang_only.local == ("gang-a",)
    assert gang_only.damage.count == 2
    # a member that may not go keeps the whole gang
    held = PreemptionSearch(a).victims_on("n1", req("crit", 8, priority=CRITICAL), CRITICAL,
                                          lambda uid: None if uid == "gang-b" else facts(uid))
    assert held is None


def test_budgets_make_a_victim_violating_and_violations_weigh_first() -> None:
    a = GpuAllocator()
    a.upsert_gpu(gpu("g1", "n1"))
    a.upsert_gpu(gpu("g2", "n2"))
    full_node(a, "n1", "g1", [16], [0])
    full_node(a, "n2", "g2", [16], [50])
    budgeted = {"n1-v0"}

    def facts(uid: str) -> VictimFacts:
        return VictimFacts(budgets=("ns/pdb",)) if uid in budgeted else VictimFacts()

    found = PreemptionSearch(a).best(req("crit", 8, priority=CRITICAL), CRITICAL, facts, allowed={"ns/pdb": 0})
    # n1's victim has the lower priority, but evicting it breaks its budget: n2 is less damage
    assert found is not None and found.node == "n2" and found.violating == ()
    found = PreemptionSearch(a).best(req("crit", 8, priority=CRITICAL), CRITICAL, facts, allowed={"ns/pdb": 1})
    assert found is not None and found.node == "n1"


def test_quota_is_judged_with_the_victims_usage_subtracted() -> None:
    a = GpuAllocator()
    a.upsert_gpu(gpu("g1", "n1"))
    a.upsert_gpu(gpu("g2", "n2"))
    a.set_quota("ns", QuotaSpec(requests_vram=20 * GIB))
    place(a, req("mine", 12, priority=0), "g1")  # 12 of the namespace's 20 GiB
    place(a, req("other", 16, priority=0, ns="other"), "g2")
    search = PreemptionSearch(a)
    preemptor = req("crit", 10, priority=CRITICAL)
    assert not search.quota_allows(preemptor, [])
    assert not search.quota_allows(preemptor, ["other"])  # another namespace's pod frees no quota
    assert search.quota_allows(preemptor, ["mine"])
    found = search.best(preemptor, CRITICAL, everyone)
    assert found is not None and found.victims == ("mine",)  # n2 frees the GPU but not the quota


def test_the_pod_index_lock_counts_a_victim_holding_the_index_as_freed() -> None:
    a = GpuAllocator()
    a.upsert_gpu(gpu("g1", "n1"))
    place(a, req("holder", 2, pod_index=3), "g1")
    place(a, req("filler", 14), "g1")
    search = PreemptionSearch(a)
    preemptor = req("crit", 2, priority=CRITICAL, pod_index=3)
    assert not search.fits_without("n1", preemptor, {"filler"})
    found = search.victims_on("n1", preemptor, CRITICAL, everyone)
    assert found is not None and found.victims == ("holder",)


def test_a_full_cluster_examines_one_node_and_bounds_are_reused() -> None:
    a = GpuAllocator()
    for i in range(50):
        a.upsert_gpu(gpu(f"g{i:02}", f"n{i:02}"))
        full_node(a, f"n{i:02}", f"g{i:02}", [4, 4, 4, 4], [0, 0, 0, 0])
    search = PreemptionSearch(a)
    stats = SearchStats()
    found = search.best(req("crit", 4, priority=CRITICAL), CRITICAL, everyone, stats=stats)
    assert found is not None and found.node == "n00" and stats.examined == 1 and stats.bounded == 50


# ---------------------------------------------------------------------- properties

SIZES = st.lists(st.integers(min_value=1, max_value=8), min_size=1, max_size=6)
PRIORITIES = st.integers(min_value=-5, max_value=5)


def _really_fits(a: GpuAllocator, preemptor: AllocRequest, gone: tuple[str, ...]) -> bool:
    """The truth the search must agree with: release the allocations, try, then put everything back."""
    saved = {uid: a.allocation(uid) for uid in gone}
    for uid in gone:
        a.rollback(uid)
    fits = a.fitting_gpus("n0", preemptor) is not None
    a.restore([(info.request, info.gpu_names) for info in saved.values() if info is not None])
    return fits


def _cluster(nodes: list[tuple[list[int], list[int]]]) -> GpuAllocator:
    a = GpuAllocator()
    for n, (sizes, prios) in enumerate(nodes):
        a.upsert_gpu(gpu(f"g{n}", f"n{n}"))
        used = 0
        for i, size in enumerate(sizes):
            if used + size > 16:
                break
            used += size
            place(a, req(f"n{n}-p{i}", size, priority=prios[i % len(prios)]), f"g{n}")
    return a


@settings(max_examples=60, deadline=None)
@given(sizes=SIZES, prios=st.lists(PRIORITIES, min_size=1, max_size=6), want=st.integers(1, 16))
def test_the_victim_set_fits_and_is_minimal(sizes: list[int], prios: list[int], want: int) -> None:
    a = _cluster([(sizes, prios)])
    search = PreemptionSearch(a)
    preemptor = req("crit", want, priority=10)
    before = a.snapshot()
    found = search.victims_on("n0", preemptor, 10, everyone)
    assert a.snapshot() == before
    if found is None:
        lower = tuple(uid for uid in a.node_workers().get("n0", {}))
        assert not _really_fits(a, preemptor, lower) or _really_fits(a, preemptor, ())
        return
    assert _really_fits(a, preemptor, found.victims)
    for victim in found.victims:
        kept = tuple(v for v in found.victims if v != victim)
        assert not _really_fits(a, preemptor, kept), f"{victim} was not needed"


def _damage_of(c: Candidate | None) -> tuple[int, int, int, int] | None:
    return None if c is None else (c.damage.violations, c.damage.top_priority, c.damage.priority_sum, c.damage.count)


@settings(max_examples=40, deadline=None)
@given(nodes=st.lists(st.tuples(SIZES, st.lists(PRIORITIES, min_size=1, max_size=4)), min_size=1, max_size=5),
       want=st.integers(1, 16))
def test_the_chosen_node_is_no_more_damaging_than_any_other(nodes: list[tuple[list[int], list[int]]],
                                                           want: int) -> None:
    a = _cluster(nodes)
    search = PreemptionSearch(a)
    preemptor = req("crit", want, priority=10)
    best = search.best(preemptor, 10, everyone)
    each: Mapping[str, Candidate | None] = {f"n{i}": search.victims_on(f"n{i}", preemptor, 10, everyone)
                                            for i in range(len(nodes))}
    possible = [c for c in each.values() if c is not None]
    if best is None:
        assert not possible
        return
    assert all(best.damage <= c.damage for c in possible)
    assert _damage_of(best) == _damage_of(each[best.node])


def test_kept_examinations_last_while_the_node_and_its_generation_do() -> None:
    a = GpuAllocator()
    for node in ("n1", "n2"):
        a.upsert_gpu(gpu(f"g-{node}", node))
        full_node(a, node, f"g-{node}", [16], [0])
    protected = {"n1-v0"}
    generations = {"n1": 0, "n2": 0}
    search = PreemptionSearch(a)

    def best() -> tuple[Candidate | None, SearchStats]:
        stats = SearchStats()
        found = search.best(req("crit", 8, priority=CRITICAL), CRITICAL,
                            lambda uid: None if uid in protected else VictimFacts(), stats=stats,
                            generation=generations.__getitem__)
        return found, stats

    found, stats = best()
    assert found is not None and found.node == "n2" and stats.examined == 2 and stats.no_eligible == ["n1"]
    found, stats = best()
    assert found is not None and found.node == "n2" and stats.examined == 0 and stats.no_eligible == ["n1"]
    protected.clear()  # the controller bumps the node's generation when its pod changes
    generations["n1"] += 1
    found, stats = best()
    assert found is not None and found.node == "n1" and stats.examined == 1


def test_a_node_holding_the_pods_index_is_examined_afresh() -> None:
    a = GpuAllocator()
    a.upsert_gpu(gpu("g1", "n1"))
    place(a, req("holder", 8, pod_index=3, priority=CRITICAL), "g1")
    place(a, req("low", 8), "g1")
    search = PreemptionSearch(a)
    preemptor = req("crit", 8, priority=CRITICAL, pod_index=3)
    # the index is held by a pod that may not go: no candidate, however often asked
    for _ in range(2):
        stats = SearchStats()
        assert search.best(preemptor, CRITICAL, everyone, stats=stats, generation=lambda node: 0) is None
        assert stats.examined == 1
    assert search.best(req("other", 8, priority=CRITICAL, pod_index=4), CRITICAL, everyone,
                       generation=lambda node: 0) is not None
