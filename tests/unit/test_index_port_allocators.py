"""The leader's pure index and host-port allocators (tfusion/controller/scheduling/indexes.py, ports.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfusion.api.accessors import Pod
from tfusion.api.jsontypes import JsonMapping
from tfusion.controller.scheduling.indexes import IndexAllocator, pod_index
from tfusion.controller.scheduling.ports import NoFreePort, PortAllocator, PortPool


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_indices_move_on_and_skip_held_ones() -> None:
    clock = Clock()
    alloc = IndexAllocator(reservation_ttl=10, now=clock)
    assert [alloc.assign(f"ns/p{i}") for i in range(3)] == [1, 2, 3]
    assert alloc.assign("ns/p1") == 2, "the same pod asking again gets the same index"
    alloc.occupy("uid-5", 5)
    assert alloc.assign("ns/p3") == 4 and alloc.assign("ns/p4") == 6, "a held index is skipped"


def test_indices_wrap_at_128_and_reuse_released_ones() -> None:
    clock = Clock()
    alloc = IndexAllocator(reservation_ttl=10, now=clock)
    for i in range(128):
        alloc.occupy(f"uid-{i}", i + 1)
    assert alloc.assign("ns/full") == 1, "all held: the counter repeats rather than failing"
    alloc.release("uid-40")
    clock.t = 11  # the reservation above lapses
    assert alloc.assign("ns/next") == 41


def test_a_reservation_ends_when_its_pod_is_seen() -> None:
    alloc = IndexAllocator(reservation_ttl=100, now=Clock())
    assert alloc.assign("ns/a") == 1
    alloc.occupy("uid-a", 1, "ns/a")
    alloc.release("uid-a")
    assert alloc.assign("ns/b") == 2, "the cursor moves on"
    for i in range(3, 129):
        alloc.occupy(f"u{i}", i)
    assert alloc.assign("ns/c") == 1, "index 1 is free again: neither held nor reserved"


def test_pod_index_decodes_the_resource() -> None:
    pod = {"spec": {"containers": [{"resources": {"limits": {"cpu": "1", "tensor-fusion.ai/index_1": "3"}}}]}}
    assert pod_index(Pod(pod)) == 11
    assert pod_index(Pod({"spec": {"containers": [{}]}})) is None


def test_ports_are_the_lowest_free_and_released() -> None:
    clock = Clock()
    pool = PortPool(42000, 42003, reservation_ttl=5, now=clock)
    assert [pool.assign(k) for k in ("a", "b", "c")] == [42000, 42001, 42002]
    with pytest.raises(NoFreePort, match="no available port in 42000-42003"):
        pool.assign("d")
    clock.t = 6
    pool.occupy("uid-b", 42001, "b")
    assert pool.assign("d") == 42000
    pool.release("uid-b")
    assert pool.assign("e") == 42001


def test_the_range_is_checked() -> None:
    with pytest.raises(ValueError, match="expected 0 < start < end"):
        PortPool(5, 5)


def test_observe_sorts_cluster_and_node_ports() -> None:
    alloc = PortAllocator((42000, 42010), (40000, 40010), now=Clock())
    cluster_pod: JsonMapping = {"metadata": {"name": "a", "namespace": "ns",
                                             "labels": {"tensor-fusion.ai/host-port": "auto"},
                                             "annotations": {"tensor-fusion.ai/port-number": "42000"}}}
    worker: JsonMapping = {"metadata": {"name": "w", "namespace": "ns",
                                        "annotations": {"tensor-fusion.ai/port-number": "40000"}},
                           "spec": {"nodeName": "n1"}}
    alloc.observe("u1", Pod(cluster_pod))
    alloc.observe("u2", Pod(worker))
    assert alloc.cluster.assign("x") == 42001
    assert alloc.node("n1").assign("y") == 40001 and alloc.node("n2").assign("y") == 40000
    assert alloc.release("u2") and alloc.node("n1").held() == {}


class ScanningIndexAllocator:
    """The plain reading of the index rules, for comparison: every assignment scans every holder
    and reservation (what IndexAllocator did before it kept counts)."""

    def __init__(self, ttl: float, clock: Clock) -> None:
        self.ttl, self.clock = ttl, clock
        self.held: dict[str, int] = {}
        self.reserved: dict[str, tuple[int, float]] = {}
        self.next = 1

    def assign(self, key: str) -> int:
        now = self.clock()
        if key in self.reserved and self.reserved[key][1] > now:
            return self.reserved[key][0]
        self.reserved = {k: v for k, v in self.reserved.items() if v[1] > now}
        in_use = set(self.held.values()) | {index for index, _ in self.reserved.values()}
        chosen = self.next
        for step in range(128):
            candidate = (self.next - 1 + step) % 128 + 1
            if candidate not in in_use:
                chosen = candidate
                break
        self.next = chosen % 128 + 1
        self.reserved[key] = (chosen, now + self.ttl)
        return chosen

    def occupy(self, holder: str, index: int, key: str = "") -> None:
        self.held[holder] = index
        if key and self.reserved.get(key, (None,))[0] == index:
            del self.reserved[key]

    def release(self, holder: str) -> None:
        self.held.pop(holder, None)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["assign", "occupy", "release", "tick"]), st.integers(0, 40),
                          st.integers(1, 8)), max_size=300))
def test_the_counting_allocator_assigns_what_a_full_scan_assigns(ops: list[tuple[str, int, int]]) -> None:
    clock = Clock()
    fast, plain = IndexAllocator(reservation_ttl=5, now=clock), ScanningIndexAllocator(5, clock)
    for op, n, index in ops:
        if op == "assign":
            assert fast.assign(f"ns/p{n}") == plain.assign(f"ns/p{n}")
        elif op == "occupy":
            fast.occupy(f"uid-{n % 6}", index, f"ns/p{n}")
            plain.occupy(f"uid-{n % 6}", index, f"ns/p{n}")
        elif op == "release":
            fast.release(f"uid-{n % 6}")
            plain.release(f"uid-{n % 6}")
        else:
            clock.t += n / 10
    assert fast.held() == plain.held
    # a burst of new pods reads every index's state
    assert [fast.assign(f"ns/burst{i}") for i in range(130)] == [plain.assign(f"ns/burst{i}") for i in range(130)]
