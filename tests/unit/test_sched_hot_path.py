"""The per-pod shortcuts of scheduling through the webhook (issue 33, item 3): each must give the
answer the long way gives.

- `Framework.ranked` walks the score buckets lazily: the same nodes, in the same order, as sorting
  `score(feasible)` by (-score, name), on random clusters with random load and index holders;
- the cluster-level index allocator and the node-level index lock answer at once when every index
  is held / when the asking pod holds none, and their counts stay those a full scan gives;
- the webhook sets the worker finalizer at admission (no later API write for it);
- the GPU status loop feeds a GPU to the allocator again only when what it is fed from changed;
- a workload's status counts its workers from index entries that follow each worker's state.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.mutate_inputs import BARE, OWNER, ctx, tf_pod
from tfusion.allocator import AllocRequest, Framework, GpuAllocator, GpuInfo
from tfusion.allocator.indexlock import NodeIndexLock
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod
from tfusion.controller.reconcilers.gpu_status import fed_digest
from tfusion.controller.reconcilers.workload import Tally, tally_key
from tfusion.controller.scheduling.claims import Claims
from tfusion.controller.scheduling.indexes import POD_INDEX_MAX, IndexAllocator
from tfusion.controller.webhook.mutate import analyse
from tfusion.controller.webhook.render import render
from tfusion.controller.webhook.workloads import SHORT_ID_ALPHABET, short_id

GIB = 1 << 30


def request(uid: str, *, vram: int, tflops: int, count: int = 1, index: int = 0) -> AllocRequest:
    return AllocRequest(pod_uid=uid, pod_name=uid, namespace="ml", pool="pool", workload=("ml", uid),
                        tflops_request=tflops * 1000, vram_request=vram * GIB, count=count, pod_index=index)


def build_cluster(nodes: int, gpus_per_node: list[int], loads: list[tuple[int, int, int]]) -> GpuAllocator:
    """`nodes` nodes of 16Gi / 100 TFLOPS GPUs; each load (node, vram GiB, index) placed where it fits."""
    alloc = GpuAllocator()
    for n in range(nodes):
        for g in range(gpus_per_node[n % len(gpus_per_node)]):
            alloc.upsert_gpu(GpuInfo(name=f"n{n}-g{g}", node=f"n{n}", pool="pool", model="H100",
                                     capacity_tflops=100_000, capacity_vram=16 * GIB, index=g))
    fw = Framework(alloc)
    for i, (node, vram, index) in enumerate(loads):
        placement, _ = fw.reserve(request(f"load-{i}", vram=vram, tflops=vram * 5, index=index), f"n{node % nodes}")
        if placement is not None:
            assert fw.pre_bind(f"load-{i}").ok
    return alloc


def the_long_way(fw: Framework, req: AllocRequest, candidates: list[str]) -> list[str]:
    feasible = fw.feasible(req, candidates)
    scores = fw.score(req, feasible)
    return sorted(feasible, key=lambda n: (-scores[n], n))


@settings(max_examples=60, deadline=None)
@given(nodes=st.integers(1, 12), gpus_per_node=st.lists(st.integers(1, 4), min_size=1, max_size=3),
       loads=st.lists(st.tuples(st.integers(0, 11), st.integers(1, 16), st.integers(0, 4)), max_size=40),
       vram=st.integers(1, 16), count=st.integers(1, 2), index=st.integers(0, 4),
       dropped=st.sets(st.integers(0, 11), max_size=4))
def test_ranked_is_the_full_sort_of_the_feasible_nodes(nodes: int, gpus_per_node: list[int],
                                                       loads: list[tuple[int, int, int]], vram: int, count: int,
                                                       index: int, dropped: set[int]) -> None:
    fw = Framework(build_cluster(nodes, gpus_per_node, loads))
    candidates = [f"n{n}" for n in range(nodes) if n not in dropped]
    req = request("new", vram=vram, tflops=vram * 5, count=count, index=index)
    assert list(fw.ranked(req, set(candidates))) == the_long_way(fw, req, candidates)


def test_ranked_skips_nodes_busy_with_the_pods_index_and_stops_where_the_caller_stops() -> None:
    alloc = build_cluster(3, [1], [(0, 2, 7)])  # n0 holds index 7 (and scores first: it is packed)
    fw = Framework(alloc)
    assert list(fw.ranked(request("x", vram=1, tflops=1), {"n0", "n1", "n2"})) == ["n0", "n1", "n2"]
    assert list(fw.ranked(request("y", vram=1, tflops=1, index=7), {"n0", "n1", "n2"})) == ["n1", "n2"]
    elsewhere = AllocRequest(pod_uid="z", pod_name="z", namespace="ml", pool="other", workload=("ml", "z"))
    assert list(fw.ranked(elsewhere, {"n0"})) == [], "a pool without GPUs"
    ranked = fw.ranked(request("w", vram=1, tflops=1), {"n0", "n1", "n2"})
    assert next(ranked) == "n0"
    placement, status = fw.reserve(request("w", vram=1, tflops=1), "n0")
    assert status.ok and placement is not None and placement.node == "n0"


def test_every_index_held_hands_out_the_counter_at_once() -> None:
    clock = [0.0]
    indexes = IndexAllocator(reservation_ttl=10.0, now=lambda: clock[0])
    handed = [indexes.assign(f"ns/p{i}") for i in range(POD_INDEX_MAX)]
    assert sorted(handed) == list(range(1, POD_INDEX_MAX + 1)), "the first 128 are distinct"
    assert indexes.claims.in_use() == POD_INDEX_MAX
    assert [indexes.assign(f"ns/q{i}") for i in range(3)] == [1, 2, 3], "all held: the counter repeats one"
    assert indexes.assign("ns/q0") == 1, "the same key keeps its index"
    indexes.occupy("uid-5", 5, "ns/p4")  # p4's reservation of 5 ends; the pod holds it
    clock[0] = 11.0  # every reservation expires; only uid-5's hold is left
    assert indexes.claims.in_use() == 1
    assert indexes.assign("ns/r") == 4 and indexes.assign("ns/s") == 6, "the scan is back: 5 is held"


@given(st.lists(st.tuples(st.sampled_from(["reserve", "occupy", "release", "tick"]), st.integers(0, 5),
                          st.integers(1, 4)), max_size=60))
def test_the_count_of_values_in_use_is_the_one_a_scan_gives(steps: list[tuple[str, int, int]]) -> None:
    clock = [0.0]
    claims = Claims(ttl=3.0, now=lambda: clock[0])
    for verb, who, value in steps:
        if verb == "reserve":
            claims.reserve(f"key-{who}", value)
        elif verb == "occupy":
            claims.occupy(f"uid-{who}", value, f"key-{who}")
        elif verb == "release":
            claims.release(f"uid-{who}")
        else:
            clock[0] += 1.0
        in_use = claims.in_use()
        scanned = {v for v in range(1, 5) if claims.first_free([v]) is None}
        assert in_use == len(scanned), (verb, who, value)


def test_a_pod_holding_no_index_finds_every_holder_busy() -> None:
    lock = NodeIndexLock()
    lock.occupy("a", 3, "p1")
    lock.occupy("b", 3, "p2")
    lock.occupy("b", 3, "p3")
    assert set(lock.busy_nodes(3, "new")) == {"a", "b"}, "a pod holding nothing: every holder is another"
    assert set(lock.busy_nodes(3, "p1")) == {"b"}, "the pod itself is no obstacle to itself"
    assert set(lock.busy_nodes(3, "p2")) == {"a", "b"}, "p3 holds it on b as well"
    lock.release("b", 3, "p3")
    assert set(lock.busy_nodes(3, "p2")) == {"a"}
    lock.release("b", 3, "p2")
    lock.release("b", 3, "p2")  # twice: nothing more happens
    assert set(lock.busy_nodes(3, "p2")) == {"a"} and set(lock.busy_nodes(3, "p1")) == set()
    lock.release("a", 3, "p1")
    assert not lock.busy_nodes(3, "p1") and not lock.busy_nodes(3)


def test_the_webhook_sets_the_worker_finalizer_at_admission() -> None:
    pod = tf_pod(BARE)
    plan = analyse(Pod(pod), ctx(), OWNER)
    assert plan is not None and plan.labels[tfa.COMPONENT] == tfa.COMPONENT_WORKER
    out: dict[str, Any] = render(Pod(pod), plan, index=1, host_port=None)
    assert out["metadata"]["finalizers"] == [tfa.FINALIZER]
    assert "finalizers" not in pod["metadata"], "the pod as sent is not changed"
    pod["metadata"]["finalizers"] = ["other/keep", tfa.FINALIZER]
    again: dict[str, Any] = render(Pod(pod), plan, index=1, host_port=None)
    assert again["metadata"]["finalizers"] == ["other/keep", tfa.FINALIZER], "kept once, others untouched"


def test_the_fed_digest_ignores_the_allocators_own_output_only() -> None:
    gpu: dict[str, Any] = {"metadata": {"name": "g", "resourceVersion": "1", "labels": {tfa.GPU_POOL: "pool"}},
                           "status": {"phase": "Running", "capacity": {"tflops": "100", "vram": "80Gi"},
                                      "available": {"tflops": "100", "vram": "80Gi"}, "runningApps": []}}
    echoed = copy.deepcopy(gpu)
    echoed["metadata"]["resourceVersion"] = "2"
    echoed["status"]["available"] = {"tflops": "80", "vram": "64Gi"}
    echoed["status"]["runningApps"] = [{"name": "w", "namespace": "ml", "count": 1}]
    assert fed_digest(echoed) == fed_digest(gpu), "the echo of a status write feeds nothing new"
    for path, value in ((("status", "capacity"), {"tflops": "90", "vram": "80Gi"}), (("status", "phase"), "Pending"),
                        (("metadata", "labels"), {tfa.GPU_POOL: "other"}),
                        (("metadata", "annotations"), {tfa.VIRTUALIZATION_CAPABILITIES: "{}"})):
        changed = copy.deepcopy(gpu)
        changed[path[0]][path[1]] = value
        assert fed_digest(changed) != fed_digest(gpu), path


def test_short_ids_are_of_the_alphabet_and_differ() -> None:
    ids = {short_id() for _ in range(200)} | {short_id(5) for _ in range(200)}
    assert len(ids) == 400, "two ids alike in 400 draws from 33^5 or more would be a broken source"
    assert {len(i) for i in ids} == {5, 8} and set("".join(ids)) <= set(SHORT_ID_ALPHABET)
    assert len(set("".join(ids))) == len(SHORT_ID_ALPHABET), "every character is drawn"


def test_a_workers_tally_entry_follows_its_state() -> None:
    def worker(phase: str = "Pending", *, ready: bool = False, deleting: bool = False) -> Pod:
        meta: dict[str, Any] = {"name": "w", "namespace": "ml",
                                "labels": {tfa.COMPONENT: tfa.COMPONENT_WORKER, tfa.WORKLOAD: "train"}}
        if deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        status: dict[str, Any] = {"phase": phase,
                                  "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
        return Pod({"metadata": meta, "status": status})

    assert tally_key(worker()) == [], "a pod being scheduled costs the index nothing"
    assert tally_key(worker("Running")) == [], "running, not ready"
    assert tally_key(worker("Running", ready=True)) == ["ml/train\tready"]
    assert tally_key(worker("Failed")) == ["ml/train\tfailed"]
    assert tally_key(worker("Running", ready=True, deleting=True)) == ["ml/train\tdeleting"], "deleting comes first"
    assert tally_key(Pod({"metadata": {"name": "c", "namespace": "ml", "labels": {tfa.WORKLOAD: "train"}}})) == [], \
        "not a worker"
    workers = [worker("Running", ready=True), worker("Failed"), worker()]
    assert Tally.of(workers) == Tally(3, 1, 1)
