"""Leader recovery (`GpuAllocator.restore`) rebuilds many allocations and scores each node once at
the end; the state it leaves is the state that reserving them one by one (the scheduler's assume and
commit, which score the node on each) leaves: scores, the group indexes' order and what the next
placement picks included. Entries it must skip are skipped as restoring them one at a time would."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tfusion.allocator import AllocRequest, GpuAllocator, GpuInfo, Unschedulable
from tfusion.allocator.errors import AllocatorError

GIB = 1 << 30
NODES, GPUS_PER_NODE = 4, 3


def cluster() -> GpuAllocator:
    allocator = GpuAllocator()
    for n in range(NODES):
        for i in range(GPUS_PER_NODE):
            allocator.upsert_gpu(GpuInfo(name=f"gpu-{n}-{i}", node=f"node-{n}", pool="pool", model="H100",
                                         vendor="NVIDIA", index=i, phase="Running", used_by="tensor-fusion",
                                         capacity_tflops=100_000, capacity_vram=80 * GIB))
    return allocator


def request(i: int, tflops: int, vram: int, pod_index: int, namespace: str, count: int = 1) -> AllocRequest:
    return AllocRequest(pod_uid=f"uid-{i}", pod_name=f"pod-{i}", namespace=namespace, pool="pool",
                        workload=(namespace, f"w-{i % 3}"), tflops_request=tflops * 1000,
                        tflops_limit=tflops * 1000, vram_request=vram * GIB, vram_limit=vram * GIB,
                        pod_index=pod_index, count=max(1, count))


#: a running pod as recovery reads it: its request and the GPUs its annotation names (some of them
#: unknown GPUs, GPUs on two nodes, repeated GPUs or a repeated pod: entries restore must skip)
entries = st.lists(st.tuples(
    st.integers(0, 40),  # pod number (repeats: the same pod twice)
    st.integers(1, 60), st.integers(1, 40), st.integers(0, 4), st.sampled_from(("ns-a", "ns-b")),
    st.lists(st.tuples(st.integers(0, NODES), st.integers(0, GPUS_PER_NODE - 1)), min_size=0, max_size=2),
), max_size=30)


def as_restorable(drawn: list[tuple[int, int, int, int, str, list[tuple[int, int]]]],
                  ) -> list[tuple[AllocRequest, tuple[str, ...]]]:
    return [(request(i, t, v, index, ns, len(gpus)), tuple(f"gpu-{n}-{g}" for n, g in gpus))
            for i, t, v, index, ns, gpus in drawn]


def order(allocator: GpuAllocator) -> list[str]:
    return list(allocator.group_index("pool").ordered())


def placed_next(allocator: GpuAllocator) -> tuple[str, ...]:
    try:
        return allocator.allocate(request(99, 30, 10, 0, "ns-a")).gpu_names
    except Unschedulable:
        return ()


@settings(max_examples=150, deadline=None)
@given(entries)
def test_restoring_all_at_once_equals_reserving_one_by_one(drawn: list[tuple[int, int, int, int, str,
                                                                             list[tuple[int, int]]]]) -> None:
    reserved, restored = cluster(), cluster()
    for allocator in (reserved, restored):
        order(allocator)  # the group index exists before recovery, as the scheduler's first query builds it
    running = []  # what the reserve path accepts is what runs; recovery then finds exactly that
    for req, names in as_restorable(drawn):
        try:
            reserved.assume(req, names)
        except AllocatorError:
            continue
        reserved.commit(req.pod_uid)
        running.append((req, names))
    assert restored.restore(running) == []
    assert restored.snapshot() == reserved.snapshot()
    assert order(restored) == order(reserved)
    assert placed_next(restored) == placed_next(reserved)


@settings(max_examples=100, deadline=None)
@given(entries)
def test_restore_skips_what_restoring_one_at_a_time_skips(drawn: list[tuple[int, int, int, int, str,
                                                                         list[tuple[int, int]]]]) -> None:
    restorable = as_restorable(drawn)
    together, one_by_one = cluster(), cluster()
    skipped = together.restore(restorable)
    assert skipped == [reason for entry in restorable for reason in one_by_one.restore([entry])]
    assert together.snapshot() == one_by_one.snapshot()


def test_restore_scores_the_node_of_what_it_restored() -> None:
    allocator = cluster()
    before = allocator.snapshot()["node_scores"]["node-1"]
    assert allocator.restore([(request(1, 50, 40, 1, "ns-a"), ("gpu-1-0",))]) == []
    assert allocator.snapshot()["node_scores"]["node-1"] != before
    assert allocator.snapshot()["node_scores"]["node-2"] == before
