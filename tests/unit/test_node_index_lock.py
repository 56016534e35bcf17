"""The node-level pod index lock (tfusion/allocator/indexlock.py and its use by the allocator, the
framework and the binder): no two pods holding GPUs on one node share an index, under concurrent
binds too; the lock is rebuilt from bound pods (leader recovery) and freed by rollback, expiry,
release (pod deleted or finished)."""

from __future__ import annotations

import random
from typing import Any

import anyio
import pytest

from tfusion.allocator import AllocRequest, Framework, GpuAllocator, GpuInfo, Unschedulable, request_from_pod
from tfusion.allocator import framework as fwk
from tfusion.allocator.allocator import NODE_INDEX_LOCK
from tfusion.allocator.indexlock import NodeIndexLock
from tfusion.allocator.request import pod_index_of
from tfusion.api import annotations as tfa
from tfusion.api import podindex
from tfusion.api.accessors import Pod
from tfusion.controller.scheduling.binder import bind_annotations, index_conflict
from tfusion.controller.scheduling.indexes import pod_index

GIB = 1 << 30


def cluster(nodes: tuple[str, ...] = ("node-a", "node-b"), gpus_per_node: int = 2) -> GpuAllocator:
    alloc = GpuAllocator()
    for node in nodes:
        for i in range(gpus_per_node):
            alloc.upsert_gpu(GpuInfo(name=f"{node}-g{i}", node=node, pool="pool", model="A100", index=i,
                                     capacity_tflops=100_000, capacity_vram=40 * GIB))
    return alloc


def req(uid: str, index: int, **extra: Any) -> AllocRequest:
    return AllocRequest(pod_uid=uid, pod_name=uid, namespace="ml", pool="pool", workload=("ml", uid),
                        tflops_request=10_000, vram_request=4 * GIB, pod_index=index, **extra)


def worker_pod(name: str, index: int, *, node: str = "", gpus: str = "") -> dict[str, Any]:
    resource, count = podindex.encode_pod_index(index)
    notes = {tfa.GPU_POOL: "pool", tfa.TFLOPS_REQUEST: "10", tfa.VRAM_REQUEST: "4Gi"}
    if gpus:
        notes[tfa.GPU_IDS] = gpus
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "annotations": notes,
                         "labels": {tfa.COMPONENT: "worker"}},
            "spec": {"nodeName": node, "containers": [
                {"name": "main", "resources": {"limits": {resource: str(count), "cpu": "1"}}}]}}


def test_the_lock_bookkeeping() -> None:
    lock = NodeIndexLock()
    lock.occupy("n1", 5, "a")
    lock.occupy("n1", 5, "b")  # restored from the cluster: both recorded
    lock.occupy("n2", 5, "c")
    lock.occupy("n1", 0, "none")  # no index: nothing held
    assert lock.holders("n1", 5) == {"a", "b"} and lock.holders("n1", 5, besides="a") == {"b"}
    assert set(lock.nodes_holding(5)) == {"n1", "n2"} and not lock.nodes_holding(0)
    assert lock.conflicts() == [("n1", 5, ("a", "b"))]
    lock.release("n1", 5, "a")
    lock.release("n1", 5, "a")  # idempotent
    assert lock.holders("n1", 5) == {"b"} and lock.conflicts() == []
    lock.release("n1", 5, "b")
    lock.release("n2", 5, "c")
    assert lock.snapshot() == {} and not lock.nodes_holding(5)


def test_the_pod_index_is_read_from_the_index_limit() -> None:
    assert pod_index_of(Pod(worker_pod("p", 9))) == 9 == pod_index(Pod(worker_pod("p", 9)))
    assert request_from_pod(Pod(worker_pod("p", 128))).pod_index == 128
    bad = worker_pod("p", 1)
    bad["spec"]["containers"][0]["resources"]["limits"] = {podindex.index_resource(0): "9"}  # beyond 8 per resource
    assert pod_index_of(Pod(bad)) == 0 and pod_index(Pod(bad)) is None
    assert request_from_pod(Pod({"metadata": {"annotations": {tfa.GPU_POOL: "pool"}}})).pod_index == 0


def test_filter_and_reserve_keep_a_second_pod_with_the_index_off_the_node() -> None:
    alloc = cluster()
    fw = Framework(alloc)
    first, _ = fw.reserve(req("a", 5), "node-a")
    assert first is not None
    second = req("b", 5)
    assert fw.feasible(second, ["node-a", "node-b"]) == ["node-b"]
    assert fw.feasible(second, {"node-a", "node-b"}) == ["node-b"]  # any container of names
    status = fw.filter(second, ["node-a", "node-b"])["node-a"]
    assert status.code is fwk.Code.UNSCHEDULABLE and status.resolvable
    (reason,) = status.reasons
    assert (reason.message, reason.stage, reason.node, reason.resource, reason.requested) == \
        (fwk.INDEX_BUSY, NODE_INDEX_LOCK, "node-a", "index", 5)
    assert "pod index 5 is held on node node-a by pod ml/a" in reason.detail
    feasible, failed = fw.split(second, ["node-a", "node-b"])
    assert feasible == ["node-b"] and failed["node-a"].reasons[0].message == fwk.INDEX_BUSY
    assert fw.explain(second, ["node-a"]).message(1) == f"0/1 nodes are available: 1 {fwk.INDEX_BUSY}."
    placement, refused = fw.reserve(second, "node-a")
    assert placement is None and refused.stage == fwk.RESERVE and refused.reasons[0].message == fwk.INDEX_BUSY
    with pytest.raises(Unschedulable, match="pod index 5 is held on node node-a"):
        alloc.assume(second, ["node-a-g1"])
    assert alloc.select(second).node == "node-b"
    assert fw.reserve(req("c", 6), "node-a")[0] is not None  # another index shares the node
    assert fw.reserve(second, "node-b")[0] is not None
    assert alloc.index_lock.snapshot() == {"node-a": {5: ("a",), 6: ("c",)}, "node-b": {5: ("b",)}}


def test_a_pod_is_no_obstacle_to_itself() -> None:
    """Simulating or re-filtering a pod that already holds its index on a node (simulate-schedule
    of a bound pod) must not find the node busy because of that same pod."""
    alloc = cluster()
    fw = Framework(alloc)
    assert fw.reserve(req("a", 5), "node-a")[0] is not None
    again = req("a", 5)
    assert fw.feasible(again, ["node-a", "node-b"]) == ["node-a", "node-b"]
    assert fw.filter(again, ["node-a"])["node-a"].ok and fw.split(again, ["node-a"]) == (["node-a"], {})
    assert fw.explain(again, ["node-a"]).nodes["node-a"].ok
    assert alloc.index_lock.busy_nodes(5, "a") == set() and alloc.index_lock.busy_nodes(5, "b") == {"node-a"}


def test_rollback_expiry_and_release_free_the_index() -> None:
    now = [0.0]
    alloc = GpuAllocator(assume_ttl=10.0, clock=lambda: now[0])
    alloc.upsert_gpu(GpuInfo(name="g", node="n", pool="pool", capacity_tflops=100_000, capacity_vram=40 * GIB))
    fw = Framework(alloc)
    assert fw.reserve(req("a", 7), "n")[0] is not None
    assert fw.unreserve("a")  # a failed bind
    assert fw.reserve(req("b", 7), "n")[0] is not None
    now[0] = 11.0
    assert alloc.expire_assumed() == ["b"]  # never bound
    assert fw.reserve(req("c", 7), "n")[0] is not None and fw.pre_bind("c").ok
    assert fw.reserve(req("d", 7), "n")[0] is None
    assert alloc.release("c")  # deleted or finished
    assert fw.reserve(req("d", 7), "n")[0] is not None


def test_the_lock_is_rebuilt_from_bound_pods_at_recovery() -> None:
    alloc = cluster()
    pods = [worker_pod("p1", 5, node="node-a", gpus="node-a-g0"), worker_pod("p2", 6, node="node-a", gpus="node-a-g1"),
            worker_pod("p3", 5, node="node-b", gpus="node-b-g0"),
            worker_pod("dup", 5, node="node-a", gpus="node-a-g1")]  # bound elsewhere with a clashing index
    assert alloc.restore([(request_from_pod(Pod(p)), tuple(p["metadata"]["annotations"][tfa.GPU_IDS].split(",")))
                          for p in pods]) == []
    assert alloc.index_lock.snapshot() == {"node-a": {5: ("uid-dup", "uid-p1"), 6: ("uid-p2",)},
                                           "node-b": {5: ("uid-p3",)}}
    assert alloc.index_lock.conflicts() == [("node-a", 5, ("uid-dup", "uid-p1"))]
    fw = Framework(alloc)
    alloc.release("uid-p1")
    assert fw.reserve(req("new", 5), "node-a")[0] is None  # still held by the other one
    alloc.release("uid-dup")
    assert fw.reserve(req("new", 5), "node-a")[0] is not None


def test_the_binding_writes_the_index_and_refuses_a_node_whose_index_was_taken_meanwhile() -> None:
    alloc = cluster()
    fw = Framework(alloc)
    pod = worker_pod("w", 12)
    request = request_from_pod(Pod(pod))
    placement, _ = fw.reserve(request, "node-a")
    assert placement is not None
    notes = bind_annotations(Pod(pod), request, placement.gpu_names, alloc)
    assert notes[tfa.INDEX] == "12" and notes[tfa.GPU_IDS] == placement.gpu_names[0]
    assert index_conflict(request, "node-a", alloc) == ""
    # another process bound a pod with the same index there; the allocator adopted it from its annotations
    other = worker_pod("other", 12, node="node-a", gpus="node-a-g1")
    assert alloc.restore([(request_from_pod(Pod(other)), ("node-a-g1",))]) == []
    conflict = index_conflict(request, "node-a", alloc)
    assert conflict.startswith("not bound: pod index 12 is held on node node-a by pod ml/other")
    no_index = request_from_pod(Pod(worker_pod("plain", 1) | {"spec": {"containers": [{"name": "main"}]}}))
    assert tfa.INDEX not in bind_annotations(Pod(pod), no_index, ("node-b-g0",), alloc)


def test_no_double_use_under_concurrent_binds() -> None:
    """The scheduler's shape: one decision at a time (feasible -> reserve), the bindings in the
    background, each checking the lock before it commits; a pod that fits nowhere retries later.
    Pods holding GPUs on one node never share an index, and every pod is bound in the end
    (holders finish and free their index)."""
    rng = random.Random(7)
    alloc = cluster(("node-a", "node-b", "node-c"), gpus_per_node=4)
    fw = Framework(alloc)
    waiting = [req(f"p{i}", rng.choice((1, 2, 3))) for i in range(30)]
    bound: list[str] = []
    refused_for_index = 0

    def check_distinct() -> None:
        for node, held in alloc.index_lock.snapshot().items():
            assert all(len(uids) == 1 for uids in held.values()), (node, held)

    async def bind(request: AllocRequest, node: str) -> None:
        await anyio.sleep(rng.random() / 1000)  # the Binding's round trip
        assert index_conflict(request, node, alloc) == ""
        assert fw.pre_bind(request.pod_uid).ok
        bound.append(request.pod_uid)
        check_distinct()
        await anyio.sleep(rng.random() / 200)  # runs a while, then finishes
        alloc.release(request.pod_uid)

    async def main() -> None:
        nonlocal refused_for_index
        async with anyio.create_task_group() as tg:
            while waiting or len(bound) < 30:
                if not waiting:
                    await anyio.sleep(0.001)
                    continue
                request = waiting.pop(0)
                nodes = fw.feasible(request, ["node-a", "node-b", "node-c"])
                for node in ["node-a", "node-b", "node-c"]:
                    if node not in nodes:
                        refused_for_index += fw.reserve(request, node)[1].reasons[0].message == fwk.INDEX_BUSY
                if not nodes:
                    waiting.append(request)  # unschedulable now: back to the queue
                    await anyio.sleep(0.001)
                    continue
                placement, status = fw.reserve(request, nodes[0])
                assert placement is not None, status.details()
                check_distinct()
                tg.start_soon(bind, request, nodes[0])
                await anyio.sleep(0)

    anyio.run(main)
    assert sorted(bound) == sorted(f"p{i}" for i in range(30))
    assert refused_for_index > 0  # the lock did turn pods away
    assert alloc.index_lock.snapshot() == {}
