"""Gang scheduling's state (scheduling/gang.py) and the allocator's "could it ever fit"
(allocator/gangfit.py), without a server: who waits at Permit, when a gang is released, timed out,
backing off; required members as the original computes them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tfusion.allocator import AllocRequest, GpuAllocator
from tfusion.allocator.gangfit import gang_never_fits, members_on_node, pool_could_hold, quota_could_hold
from tfusion.allocator.quota import QuotaSpec
from tfusion.allocator.state import GpuInfo
from tfusion.api import annotations as tfa
from tfusion.controller.scheduling.gang import (
    GANG_BACKOFF_S,
    MEMBER_FAILED,
    GangBook,
    GangSpec,
    controller_phase,
    gang_spec,
)
from tfusion.controller.scheduling.gang_runtime import EXTENDER_HTTP_TIMEOUT_S, EXTENDER_WAIT_CAP_S

REPO = Path(__file__).resolve().parents[2]
SCHEDULER_CONFIG = REPO / "deploy" / "overlays" / "kube-scheduler" / "scheduler" / "scheduler-config.yaml"

GIB = 1024**3


def notes(**extra: str) -> dict[str, str]:
    return {tfa.GANG_GROUP_KEY: "default/train", **extra}


# --- required members -----------------------------------------------------------------------------


def test_no_group_key_is_no_gang() -> None:
    assert gang_spec({tfa.GANG_REQUIRED_MEMBERS: "4"}) is None


def test_annotations_give_required_desired_and_timeout() -> None:
    spec = gang_spec(notes(**{tfa.GANG_REQUIRED_MEMBERS: "2", tfa.GANG_DESIRED_MEMBERS: "4",
                              tfa.GANG_TIMEOUT: "5m"}))
    assert spec == GangSpec("default/train", 2, 4, 300.0)


def test_workload_min_members_zero_means_replicas_and_annotations_win() -> None:
    workload = {"replicas": 3, "gangScheduling": {"minMembers": 0, "timeout": "30s"}}
    assert gang_spec(notes(), workload) == GangSpec("default/train", 3, 3, 30.0)
    workload = {"replicas": 4, "gangScheduling": {"minMembers": 2}}
    assert gang_spec(notes(), workload) == GangSpec("default/train", 2, 4, None)
    overridden = gang_spec(notes(**{tfa.GANG_REQUIRED_MEMBERS: "4", tfa.GANG_TIMEOUT: "0s"}), workload)
    assert overridden == GangSpec("default/train", 4, 4, None)  # "0s": wait forever


def test_bad_annotation_names_key_and_value() -> None:
    with pytest.raises(tfa.AnnotationError) as caught:
        gang_spec(notes(**{tfa.GANG_REQUIRED_MEMBERS: "2", tfa.GANG_TIMEOUT: "soon"}))
    assert tfa.GANG_TIMEOUT in str(caught.value) and "soon" in str(caught.value)
    with pytest.raises(tfa.AnnotationError, match="member count"):
        gang_spec(notes())


# --- Permit ---------------------------------------------------------------------------------------


SPEC = GangSpec("default/train", 3, 4, 60.0)


def test_members_wait_until_the_required_count_then_all_are_released() -> None:
    book = GangBook()
    assert book.permit(SPEC, "u1", "default/p1", 0.0, [], "one").waits
    second = book.permit(SPEC, "u2", "default/p2", 1.0, [], "two")
    assert second.waits and book.waiting_uids() == {"u1", "u2"}
    group = book.groups["default/train"]
    assert group.phase == "Waiting"
    assert group.waiting_message() == "waiting for 1 more member(s) of gang default/train (2/3 reserved)"
    third = book.permit(SPEC, "u3", "default/p3", 2.0, [], "three")
    assert [m.payload for m in third.release] == ["one", "two", "three"]
    assert book.waiting_uids() == set() and book.groups["default/train"].phase == "Scheduling" and group.satisfied
    # once satisfied, a later member (a replacement) passes at once
    assert [m.uid for m in book.permit(SPEC, "u4", "default/p4", 3.0, ["u1", "u2", "u3"]).release] == ["u4"]


def test_members_already_bound_count_towards_the_gang() -> None:
    book = GangBook()
    assert book.permit(SPEC, "u3", "default/p3", 0.0, ["u1", "u3"]).waits  # never counts itself bound
    assert len(book.permit(SPEC, "u4", "default/p4", 0.0, ["u1"]).release) == 2


def test_timeout_releases_every_waiting_member_and_backs_off() -> None:
    book = GangBook()
    book.permit(SPEC, "u1", "default/p1", 10.0, [])
    book.permit(SPEC, "u2", "default/p2", 20.0, [])
    assert book.next_deadline() == 70.0  # from the first member's wait
    assert book.expire(69.9) == []
    [(group, released)] = book.expire(70.0)
    assert [m.uid for m in released] == ["u1", "u2"] and book.waiting_uids() == set()
    assert group.phase == "TimedOut" and group.backoff_until == 70.0 + GANG_BACKOFF_S
    assert "backs off" in book.blocked(SPEC, 75.0, peers=4)
    assert book.blocked(SPEC, 80.0, peers=4) == ""
    assert book.next_deadline() is None


def test_no_timeout_waits_forever_unless_capped() -> None:
    forever = GangSpec("default/train", 2, 2, None)
    book = GangBook()
    book.permit(forever, "u1", "default/p1", 0.0, [])
    assert book.next_deadline() is None and book.expire(1e9) == []
    capped = GangBook(wait_cap=25.0)
    capped.permit(forever, "u1", "default/p1", 0.0, [])
    assert capped.next_deadline() == 25.0
    assert capped.effective_timeout(GangSpec("k", 2, 2, 10.0)) == 10.0


def test_too_few_pods_blocks_until_the_peers_exist() -> None:
    book = GangBook()
    assert book.blocked(SPEC, 0.0, peers=2) == ("waiting for 1 more pod(s) of gang default/train to be created "
                                                "(2/3 exist)")
    assert book.blocked(SPEC, 0.0, peers=3) == ""


def test_a_waiting_member_that_leaves_gives_its_place_back() -> None:
    book = GangBook()
    book.permit(SPEC, "u1", "default/p1", 0.0, [], "one")
    book.permit(SPEC, "u2", "default/p2", 0.0, [], "two")
    left = book.unreserve("u1", 1.0)
    assert left is not None and left.payload == "one"
    assert book.unreserve("u1", 1.0) is None
    assert book.permit(SPEC, "u3", "default/p3", 2.0, []).waits  # 2/3 again, not 3/3
    assert book.groups["default/train"].reserved == 2


def test_failed_gang_and_changed_keys() -> None:
    book = GangBook()
    book.fail(SPEC, 0.0, "too big")
    group = book.groups["default/train"]
    assert (group.phase, group.reason, group.message) == ("Failed", "GangUnsatisfiable", "too big")
    assert book.changed == {"default/train"}
    book.forget("default/train")
    assert "default/train" not in book.groups and book.changed == set()


def test_controller_owns_running_and_failed() -> None:
    assert controller_phase("Scheduling", "GangComplete", ready=3, failed=0, required=3) == "Running"
    assert controller_phase("Scheduling", "GangComplete", ready=1, failed=1, required=3) == "Failed"
    assert controller_phase("Waiting", "WaitingForMembers", ready=0, failed=0, required=3) == "Waiting"
    assert controller_phase("Running", "MembersReady", ready=2, failed=0, required=3) == "Pending"
    assert controller_phase("Failed", MEMBER_FAILED, ready=2, failed=0, required=3) == "Pending"
    # the scheduler's Failed (can never fit) is not the controller's to undo
    assert controller_phase("Failed", "GangUnsatisfiable", ready=0, failed=0, required=3) == "Failed"


def test_extender_wait_stays_inside_the_shipped_http_timeout() -> None:
    config = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    [extender] = config["extenders"]
    assert extender["httpTimeout"] == f"{EXTENDER_HTTP_TIMEOUT_S:.0f}s"
    assert 0 < EXTENDER_WAIT_CAP_S < EXTENDER_HTTP_TIMEOUT_S
    assert GangBook(wait_cap=EXTENDER_WAIT_CAP_S).effective_timeout(GangSpec("k", 2, 2, 300.0)) == EXTENDER_WAIT_CAP_S


# --- could it ever fit ----------------------------------------------------------------------------


def allocator_with(gpus_per_node: int, nodes: int = 1, *, tflops: int = 100_000, vram: int = 40 * GIB) -> GpuAllocator:
    alloc = GpuAllocator()
    for n in range(nodes):
        for g in range(gpus_per_node):
            alloc.upsert_gpu(GpuInfo(f"gpu-{n}-{g}", f"node-{n}", "pool", tflops, vram))
    return alloc


def request(tflops: int = 60_000, vram: int = 10 * GIB, count: int = 1) -> AllocRequest:
    return AllocRequest("uid", "p", "default", "pool", ("default", "train"), tflops_request=tflops,
                        vram_request=vram, count=count)


def test_members_on_node_uses_each_gpu_once_per_pod() -> None:
    assert members_on_node([3, 3], count=2, max_workers=100) == 3
    assert members_on_node([5, 1], count=2, max_workers=100) == 1
    assert members_on_node([4, 4, 4], count=1, max_workers=5) == 5
    assert members_on_node([4], count=2, max_workers=100) == 0


def test_pool_could_hold_counts_capacity_not_load() -> None:
    alloc = allocator_with(2, nodes=2)  # 4 GPUs of 100 TFLOPS: one 60-TFLOPS pod each
    assert pool_could_hold(alloc, request()) == 4
    alloc.assume(request(), ["gpu-0-0"])
    assert pool_could_hold(alloc, request()) == 4  # load does not count
    assert pool_could_hold(alloc, request(tflops=30_000)) == 12
    assert pool_could_hold(alloc, request(count=2)) == 2
    assert gang_never_fits(alloc, request(), 4) == ""
    assert gang_never_fits(alloc, request(), 5) == ("the gang needs 5 members but the GPUs of pool pool could hold "
                                                    "at most 4 at this request even when empty")


def test_pool_could_hold_stops_once_it_has_enough() -> None:
    alloc = allocator_with(1, nodes=10)
    assert pool_could_hold(alloc, request()) == 10
    assert pool_could_hold(alloc, request(), enough=3) == 3


def test_pool_could_hold_follows_a_capacity_change() -> None:
    alloc = allocator_with(1)
    assert pool_could_hold(alloc, request()) == 1
    alloc.upsert_gpu(GpuInfo("gpu-0-0", "node-0", "pool", 200_000, 40 * GIB))  # a bigger GPU reported
    assert pool_could_hold(alloc, request()) == 3
    alloc.upsert_gpu(GpuInfo("gpu-0-1", "node-0", "pool", 100_000, 40 * GIB))
    assert pool_could_hold(alloc, request()) == 4


def test_quota_totals_that_cannot_hold_the_gang() -> None:
    spec = QuotaSpec(requests_tflops=100_000, requests_vram=100 * GIB)
    assert quota_could_hold(spec, request(tflops=50_000), 2) == ""
    assert "allows 100 TFLOPS in all, the gang needs 150 (3 x 50)" in quota_could_hold(spec, request(50_000), 3)
    alloc = allocator_with(4)
    alloc.set_quota("default", QuotaSpec(max_workers=2))
    assert gang_never_fits(alloc, request(tflops=10_000), 3) == ("the quota of namespace default allows 2 workers, "
                                                                 "the gang needs 3")
