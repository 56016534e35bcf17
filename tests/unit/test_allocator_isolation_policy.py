"""Unit tests of the dynamic isolation-mode policy in the allocator (isolation.py): the first pod sets
a GPU's active mode, a pod asking another mode is filtered with a reason naming both, release
clears the mode, restore rebuilds it, disagreeing recovered pods flag the GPU; static is unchanged."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.allocator import gpu, removed_by, req
from tfusion.allocator import GpuAllocator, GpuInfo, Unschedulable
from tfusion.allocator.framework import Framework
from tfusion.allocator.reasons import ACTIVE_MODE_MISMATCH, DYNAMIC_PARTITIONED, MODE_CONFLICT, POLICY
from tfusion.api import annotations as tfa


def dynamic_gpu(name: str, node: str = "n1", **kw: Any) -> GpuInfo:
    return gpu(name, node, isolation_policy="Dynamic", **kw)


def dynamic(*gpus: GpuInfo) -> GpuAllocator:
    a = GpuAllocator(isolation_policy="dynamic")
    for g in gpus:
        a.upsert_gpu(g)
    return a


def slot_mode(a: GpuAllocator, name: str) -> tuple[str, bool]:
    slot = a.indexes.gpus[name]
    return slot.active_mode, slot.mode_conflict


def test_policy_is_parsed_case_insensitively_and_bad_values_are_refused() -> None:
    assert GpuAllocator(isolation_policy="DYNAMIC").isolation_policy == "dynamic"
    assert GpuAllocator().isolation_policy == "static"
    with pytest.raises(ValueError, match=r"static or dynamic.*'both'"):
        GpuAllocator(isolation_policy="both")


def test_first_allocation_sets_the_mode_and_another_mode_is_filtered_with_both_named() -> None:
    a = dynamic(dynamic_gpu("gpu-x"))
    a.allocate(req(isolation=tfa.ISOLATION_SOFT))
    assert slot_mode(a, "gpu-x") == ("soft", False)
    shared = req(tflops=0, vram=0, isolation=tfa.ISOLATION_SHARED)
    assert removed_by(a, shared)["IsolationPolicy"] == [
        "gpu-x: active isolation mode soft (dynamic policy); the pod asks shared"]
    with pytest.raises(Unschedulable):
        a.select(shared)
    a.allocate(req(isolation=tfa.ISOLATION_SOFT))  # the same mode still fits


def test_the_reason_shows_in_the_framework_explanation() -> None:
    a = dynamic(dynamic_gpu("gpu-x"))
    a.allocate(req(isolation=tfa.ISOLATION_HARD))
    expl = Framework(a).explain(req(isolation=tfa.ISOLATION_SOFT), ["n1"])
    status = expl.nodes["n1"]
    assert [r.message for r in status.reasons] == [ACTIVE_MODE_MISMATCH]
    assert "active isolation mode hard (dynamic policy); the pod asks soft" in status.reasons[0].detail
    assert ACTIVE_MODE_MISMATCH in expl.message(1)


def test_two_modes_go_to_different_gpus() -> None:
    a = dynamic(dynamic_gpu("gpu-a"), dynamic_gpu("gpu-b"))
    soft = a.allocate(req(isolation=tfa.ISOLATION_SOFT))
    shared = a.allocate(req(tflops=0, vram=0, isolation=tfa.ISOLATION_SHARED))
    assert soft.gpu_names != shared.gpu_names
    assert {slot_mode(a, n)[0] for n in ("gpu-a", "gpu-b")} == {"soft", "shared"}


def test_release_of_the_last_pod_clears_the_mode() -> None:
    a = dynamic(dynamic_gpu("gpu-x"))
    first, second = req(isolation=tfa.ISOLATION_SOFT), req(isolation=tfa.ISOLATION_SOFT)
    a.allocate(first)
    a.allocate(second)
    a.release(first.pod_uid)
    assert slot_mode(a, "gpu-x") == ("soft", False)
    a.release(second.pod_uid)
    assert slot_mode(a, "gpu-x") == ("", False)
    assert a.allocate(req(isolation=tfa.ISOLATION_HARD)).gpu_names == ("gpu-x",)


def test_an_assumed_pod_holds_the_mode_until_forgotten() -> None:
    a = dynamic(dynamic_gpu("gpu-x"))
    held = req(isolation=tfa.ISOLATION_SOFT)
    a.assume(held, ["gpu-x"])
    with pytest.raises(Unschedulable, match="active isolation mode soft"):
        a.assume(req(isolation=tfa.ISOLATION_HARD), ["gpu-x"])
    a.forget(held.pod_uid)
    a.assume(req(isolation=tfa.ISOLATION_HARD), ["gpu-x"])


def test_restore_rebuilds_the_mode_from_the_pods() -> None:
    a = dynamic(dynamic_gpu("gpu-x"), dynamic_gpu("gpu-y"))
    assert a.restore([(req(isolation=tfa.ISOLATION_HARD), ["gpu-x"])]) == []
    assert slot_mode(a, "gpu-x") == ("hard", False)
    assert slot_mode(a, "gpu-y") == ("", False)
    assert a.allocate(req(isolation=tfa.ISOLATION_SOFT)).gpu_names == ("gpu-y",)


def test_disagreeing_recovered_pods_flag_the_gpu_until_they_agree() -> None:
    a = dynamic(dynamic_gpu("gpu-x"))
    soft, hard, soft2 = (req(isolation=tfa.ISOLATION_SOFT), req(isolation=tfa.ISOLATION_HARD),
                         req(isolation=tfa.ISOLATION_SOFT))
    a.restore([(soft, ["gpu-x"]), (hard, ["gpu-x"]), (soft2, ["gpu-x"])])
    assert slot_mode(a, "gpu-x") == ("soft", True)
    reasons = removed_by(a, req(isolation=tfa.ISOLATION_SOFT))["IsolationPolicy"]
    assert reasons == ["gpu-x: its pods disagree on the isolation mode (dynamicIsolationConflict, dynamic "
                       "policy); no new pod until they agree; the pod asks soft"]
    assert Framework(a).explain(req(isolation=tfa.ISOLATION_SOFT), ["n1"]).nodes["n1"].reasons[0].message \
        == MODE_CONFLICT
    a.release(hard.pod_uid)
    assert slot_mode(a, "gpu-x") == ("soft", False)
    a.allocate(req(isolation=tfa.ISOLATION_SOFT))


def test_partitioned_is_refused_under_dynamic_naming_the_rule() -> None:
    a = dynamic(dynamic_gpu("gpu-x"))
    r = req(isolation=tfa.ISOLATION_PARTITIONED)
    assert removed_by(a, r)["IsolationPolicy"] == [
        "gpu-x: partitioned isolation is not allowed under the dynamic isolation policy; the pod asks partitioned"]
    status = Framework(a).explain(r, ["n1"]).nodes["n1"]
    assert status.reasons[0].message == DYNAMIC_PARTITIONED
    assert status.code.name == "UNRESOLVABLE"


def test_a_gpu_whose_hypervisor_runs_static_is_refused_under_dynamic() -> None:
    a = dynamic(gpu("gpu-static", isolation_policy="Static"))
    assert removed_by(a, req())["IsolationPolicy"] == [
        "gpu-static: isolation policy Static reported by the hypervisor, the controller runs the dynamic "
        "policy (the hypervisor must run with --isolation-policy=dynamic)"]
    assert Framework(a).explain(req(), ["n1"]).nodes["n1"].reasons[0].message == POLICY


def test_under_dynamic_the_reported_mode_does_not_restrict_the_request() -> None:
    a = dynamic(dynamic_gpu("gpu-x", isolation_mode="soft"))
    assert a.allocate(req(isolation=tfa.ISOLATION_HARD)).gpu_names == ("gpu-x",)


def test_static_policy_keeps_modes_untracked_and_mixes_modes_as_before() -> None:
    a = GpuAllocator()
    a.upsert_gpu(gpu("gpu-x"))
    a.allocate(req(isolation=tfa.ISOLATION_SOFT))
    a.allocate(req(isolation=tfa.ISOLATION_HARD))
    assert slot_mode(a, "gpu-x") == ("", False)
    a.upsert_gpu(gpu("gpu-d", "n2", isolation_policy="Dynamic"))
    assert "isolation policy Dynamic is not supported" in removed_by(a, req())["IsolationPolicy"][0]


def test_preemption_sees_the_mode_cleared_when_every_pod_on_the_gpu_goes() -> None:
    a = dynamic(dynamic_gpu("gpu-x"))
    low = req(isolation=tfa.ISOLATION_SOFT, priority=0)
    a.allocate(low)
    high = req(isolation=tfa.ISOLATION_HARD, priority=100)
    assert not a.preemption.fits_without("n1", high, frozenset())
    assert a.preemption.fits_without("n1", high, frozenset({low.pod_uid}))
