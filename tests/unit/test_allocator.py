"""Unit tests of the allocator: filters and their reasons, scoring modes, ledger, quota, status."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.helpers.allocator import GIB, gpu, removed_by, req
from tfusion.allocator import (
    AllocatorError,
    GpuAllocator,
    GpuInfo,
    InvalidAllocation,
    PlacementModeError,
    PoolConfig,
    QuotaExceeded,
    QuotaSpec,
    QuotaSpecError,
    Resources,
    Unschedulable,
    gpu_from_object,
    quota_from_object,
)
from tfusion.allocator.request import request_from_pod
from tfusion.allocator.state import GpuObjectError, parse_virtualization
from tfusion.api.accessors import Body, Gpu, Pod
from tfusion.controller import views
from tfusion.hypervisor.devices.model import VirtualizationCapabilities


def allocator(*gpus: GpuInfo, **kw: Any) -> GpuAllocator:
    a = GpuAllocator(**kw)
    for g in gpus:
        a.upsert_gpu(g)
    return a


# ---------------------------------------------------------------- filters, one by one


def test_resource_filter_reason_names_gpu_and_amounts() -> None:
    a = allocator(gpu("gpu-3f2a", vram=6), gpu("gpu-ok", vram=16))
    stages = removed_by(a, req(vram=8))
    assert stages["ResourceFilter"] == ["gpu-3f2a: VRAM available 6Gi < requested 8Gi"]
    assert removed_by(a, req(tflops=150))["ResourceFilter"] == [
        "gpu-3f2a: TFLOPS available 100 < requested 150", "gpu-ok: TFLOPS available 100 < requested 150"]


def test_percent_request_converted_with_each_gpu_capacity() -> None:
    a = allocator(gpu("small", "n1", tflops=100), gpu("big", "n2", tflops=1000))
    r = req(tflops=0, percent_request=50_000, percent_limit=50_000, tflops_limit=0)
    p = a.allocate(r)
    charged = 50_000 if p.gpu_names == ("small",) else 500_000
    assert a.allocation(r.pod_uid).charges == ((charged, 2 * GIB),)  # type: ignore[union-attr]
    a.allocate(req(tflops=80, vram=1))  # fills "big" partly or "small" is taken
    # a 60 % request no longer fits on a GPU that has less than 60 % free
    a2 = allocator(gpu("g", tflops=100))
    a2.allocate(req(tflops=50))
    reasons = removed_by(a2, req(tflops=0, percent_request=60_000, tflops_limit=0))["ResourceFilter"]
    assert reasons == ["g: TFLOPS available 50 < requested 60 (60% of 100)"]


def test_phase_and_used_by_filter() -> None:
    a = allocator(gpu("pending", phase="Pending"), gpu("plugin", used_by="nvidia-device-plugin"), gpu("ok"))
    stages = removed_by(a, req())
    assert stages["PhaseFilter"] == ["pending: phase Pending, not Running",
                                     "plugin: used by nvidia-device-plugin, not tensor-fusion"]
    assert a.select(req()).gpu_names == ("ok",)


def test_index_model_vendor_filters() -> None:
    a = allocator(gpu("a", index=0, model="H100"), gpu("b", index=1, model="A100", vendor="AMD"))
    assert removed_by(a, req(indices=(1,)))["GPUIndexFilter"] == ["a: index 0 not in requested indices 1"]
    assert a.select(req(indices=(1,))).gpu_names == ("b",)
    assert removed_by(a, req(gpu_model="A100"))["GPUModelFilter"] == ["a: model H100 is not requested A100"]
    assert removed_by(a, req(vendor="NVIDIA"))["GPUVendorFilter"] == ["b: vendor AMD is not requested NVIDIA"]


def test_isolation_policy_and_mode_filters() -> None:
    a = allocator(gpu("hard", isolation_mode="hard"), gpu("dyn", isolation_policy="Dynamic"),
                  gpu("nosoft", virtualization=frozenset({"shared", "hard"})), gpu("ok"))
    stages = removed_by(a, req(isolation="soft"))
    assert stages["IsolationPolicy"] == [
        "dyn: isolation policy Dynamic is not supported (Static only)",
        "hard: isolation mode hard does not match requested soft"]
    assert stages["GPUIsolationModeFilter"] == ["nosoft: device does not support soft isolation"]
    assert a.select(req(isolation="hard")).gpu_names == ("hard",)


def test_shared_takes_whole_idle_gpu_and_zeroes_available() -> None:
    a = allocator(gpu("busy", "n1"), gpu("idle", "n2"))
    a.allocate(req(uid="small"))
    a.select(req())  # sanity
    busy_first = a.allocation("small").gpu_names  # type: ignore[union-attr]
    shared = req(isolation="shared")
    p = a.allocate(shared)
    assert p.gpu_names != busy_first
    assert a.available(p.gpu_names[0]) == (0, 0)
    stages = removed_by(a, req(isolation="shared"))
    assert any("not idle for shared isolation" in r for r in stages["SharedWholeGPUFilter"])
    a.release(shared.pod_uid)
    assert a.available(p.gpu_names[0]) == (100_000, 16 * GIB)


def test_partitioned_is_refused_with_reason() -> None:
    a = allocator(gpu("g"))
    with pytest.raises(Unschedulable) as info:
        a.select(req(isolation="partitioned"))
    assert info.value.stage == "PartitionTemplateFilter"
    assert "no partition templates for this model" in info.value.nodes["n1"][0]


def test_same_node_and_max_workers_filters() -> None:
    a = allocator(gpu("a1", "na"), gpu("b1", "nb"), gpu("b2", "nb"), max_workers_per_node=1)
    r = req(count=2)
    stages = removed_by(a, r)
    assert stages["SameNodeFilter"] == ["node na has 1 matching GPU(s), 2 requested"]
    p = a.allocate(r)
    assert p.node == "nb" and set(p.gpu_names) == {"b1", "b2"}
    with pytest.raises(Unschedulable) as info:  # na lacks a second GPU, nb is at its worker limit
        a.select(req(count=2))
    assert info.value.stage == "MaxWorkerPerNode"
    assert info.value.nodes == {
        "na": ["SameNodeFilter: node na has 1 matching GPU(s), 2 requested"],
        "nb": ["MaxWorkerPerNode: node nb has 1 workers, limit 1"]}
    a.allocate(req(vram=1))  # na takes its single worker
    with pytest.raises(Unschedulable) as info:
        a.select(req(vram=0.5))
    assert info.value.stage == "MaxWorkerPerNode"
    assert info.value.nodes["na"] == ["MaxWorkerPerNode: node na has 1 workers, limit 1"]


def test_unschedulable_diagnosis_per_node() -> None:
    a = allocator(gpu("g1", "n1", vram=4), gpu("g2", "n2", vram=6))
    with pytest.raises(Unschedulable) as info:
        a.select(req(vram=8))
    err = info.value
    assert err.stage == "ResourceFilter"
    assert err.message.startswith("0/2 nodes are available")
    assert err.nodes == {"n1": ["ResourceFilter: g1: VRAM available 4Gi < requested 8Gi"],
                         "n2": ["ResourceFilter: g2: VRAM available 6Gi < requested 8Gi"]}
    with pytest.raises(Unschedulable, match="pool 'nope' has no GPUs"):
        a.select(req(pool="nope"))


def test_node_ok_and_nodes_restrict_the_choice() -> None:
    a = allocator(gpu("g1", "n1"), gpu("g2", "n2"))
    assert a.select(req(), node_ok=lambda n: n != "n1").node == "n2"
    assert a.select(req(), nodes=["n2"]).node == "n2"
    with pytest.raises(Unschedulable, match="rejected by node checks"):
        a.select(req(), node_ok=lambda n: False)


# ---------------------------------------------------------------- scoring


def _two_nodes(mode: str) -> GpuAllocator:
    a = allocator(gpu("a1", "na"), gpu("a2", "na"), gpu("b1", "nb"), gpu("b2", "nb"))
    a.set_pool_config("p", PoolConfig(placement_mode=mode))
    a.allocate(req(tflops=50, vram=8, uid="seed"))  # lands on na (tie -> smaller name), GPU a1
    return a


def test_node_compact_gpu_low_load_packs_nodes_spreads_gpus() -> None:
    a = _two_nodes("NodeCompactGPULowLoad")
    assert a.allocation("seed").gpu_names == ("a1",)  # type: ignore[union-attr]
    p = a.select(req())
    assert (p.node, p.gpu_names) == ("na", ("a2",))  # busiest node, least loaded GPU on it
    # node score: mean of used% per GPU: a1 = round(0.7*50 + 0.3*50) = 50, a2 = 0 -> 25
    assert p.score == 25


def test_compact_first_packs_gpus_too() -> None:
    a = _two_nodes("CompactFirst")
    p = a.select(req())
    assert (p.node, p.gpu_names) == ("na", ("a1",))


def test_low_load_first_spreads() -> None:
    a = _two_nodes("LowLoadFirst")
    p = a.select(req())
    assert p.node == "nb" and p.score == 100


def test_pending_gpu_counts_a_quarter_in_node_score() -> None:
    a = allocator(gpu("a1", "na"), gpu("a2", "na", phase="Pending"), gpu("b1", "nb"))
    a.set_pool_config("p", placement_mode="LowLoadFirst")
    # na: (100 + 100 // 4) // 2 = 62, nb: 100
    assert a.score(req(), ["na", "nb"]) == {"na": 62, "nb": 100}


def test_unknown_placement_mode_is_an_error() -> None:
    a = allocator(gpu("g"))
    with pytest.raises(PlacementModeError, match="'Random' is not supported; allowed: CompactFirst"):
        a.set_pool_config("p", placement_mode="Random")


# ---------------------------------------------------------------- ledger


def test_assume_commit_release_cycle_and_idempotency() -> None:
    a = allocator(gpu("g"))
    r = req(tflops=30, vram=4)
    a.assume(r, ["g"])
    assert a.available("g") == (70_000, 12 * GIB)
    assert a.available("g", committed_only=True) == (100_000, 16 * GIB)
    assert views.gpu_status(a, "g")["runningApps"] == []
    a.commit(r.pod_uid)
    a.commit(r.pod_uid)
    status = views.gpu_status(a, "g")
    assert status["available"] == {"tflops": "70", "vram": "12Gi"}
    assert status["runningApps"] == [{"name": "wl", "namespace": "ns", "count": 1, "pods": [{
        "name": r.pod_name, "namespace": "ns", "uid": r.pod_uid, "requests": {"tflops": "30", "vram": "4Gi"},
        "limits": {"tflops": "60", "vram": "8Gi"}, "qos": "medium"}]}]
    assert a.forget(r.pod_uid) is False  # committed: forget does nothing
    assert a.release(r.pod_uid) is True
    assert a.release(r.pod_uid) is False
    assert a.available("g") == (100_000, 16 * GIB)
    with pytest.raises(InvalidAllocation, match="was released"):
        a.assume(r, ["g"])


def test_assume_rejections_change_nothing() -> None:
    a = allocator(gpu("g1", "n1"), gpu("g2", "n2"), gpu("x", "n1", pool="other"))
    a.allocate(req(uid="held"))
    before = a.snapshot()
    cases = [
        (req(uid="held"), ["g1"], "already holds an allocation"),
        (req(count=2), ["g1"], "2 distinct GPU"),
        (req(count=2), ["g1", "g2"], "several nodes"),
        (req(), ["nope"], "unknown"),
        (req(), ["x"], "pool other"),
        (req(vram=20), ["g2"], "VRAM available 16Gi < requested 20Gi"),
    ]
    for r, names, message in cases:
        with pytest.raises((InvalidAllocation, Unschedulable), match=message):
            a.assume(r, names)
        assert a.snapshot() == before


def test_assumed_allocations_expire_after_ttl() -> None:
    now = [0.0]
    a = allocator(gpu("g"), clock=lambda: now[0])
    r1, r2 = req(), req()
    a.assume(r1, ["g"])
    now[0] = 1000.0
    a.assume(r2, ["g"])
    now[0] = 1800.0
    assert a.expire_assumed() == [r1.pod_uid]
    now[0] = 2800.0
    assert a.expire_assumed() == [r2.pod_uid]
    assert a.available("g") == (100_000, 16 * GIB)
    with pytest.raises(InvalidAllocation):
        a.commit(r1.pod_uid)


def test_adjust_resizes_with_capacity_and_quota_checks() -> None:
    a = allocator(gpu("g"))
    r = req(tflops=10, vram=2)
    a.allocate(r)
    new = a.adjust(r.pod_uid, Resources(tflops=40_000, vram=4 * GIB), Resources(tflops=80_000, vram=8 * GIB))
    assert new.tflops_request == 40_000 and a.available("g") == (60_000, 12 * GIB)
    assert a.quota_usage("ns").as_tuple() == (40_000, 4 * GIB, 80_000, 8 * GIB, 1)
    before = a.snapshot()
    with pytest.raises(Unschedulable, match="cannot resize on g"):
        a.adjust(r.pod_uid, Resources(tflops=200_000, vram=GIB), Resources(tflops=200_000, vram=GIB))
    a.adjust(r.pod_uid, Resources(tflops=1, vram=1), Resources(tflops=1, vram=1), dry_run=True)
    assert a.snapshot() == before
    with pytest.raises(InvalidAllocation):
        a.adjust("nobody", Resources(), Resources())


def test_capacity_change_is_a_delta_and_owned_fields_survive() -> None:
    a = allocator(gpu("g", tflops=100, vram=16))
    a.allocate(req(tflops=30, vram=4))
    a.take_dirty()
    a.upsert_gpu(gpu("g", tflops=120, vram=16, model="H100"))
    assert a.available("g") == (90_000, 12 * GIB)
    assert a.take_dirty() == {"g"}
    a.upsert_gpu(gpu("g", tflops=20, vram=16))  # shrinks below what is allocated: clamps at 0
    assert a.available("g") == (0, 12 * GIB)


def test_removed_gpu_keeps_allocations_and_reattaches() -> None:
    a = allocator(gpu("g"))
    r = req(tflops=30, vram=4)
    a.allocate(r)
    a.remove_gpu("g")
    assert a.has_allocation(r.pod_uid)
    a.upsert_gpu(gpu("g"))
    assert a.available("g") == (70_000, 12 * GIB)
    a.release(r.pod_uid)
    assert a.available("g") == (100_000, 16 * GIB)


def test_restore_reports_what_it_cannot_rebuild() -> None:
    a = allocator(gpu("g1", "n1"), gpu("g2", "n2"))
    good = req(tflops=10)
    skipped = a.restore([(good, ["g1"]), (req(), ["nope"]), (req(count=2), ["g1", "g2"]), (good, ["g2"])])
    assert [s[1] for s in skipped] == ["none of the GPUs ['nope'] is known",
                                       "GPUs ['g1', 'g2'] are on several nodes", "pod already holds an allocation"]
    assert a.available("g1") == (90_000, 14 * GIB)
    assert a.node_workers() == {"n1": {good.pod_uid: f"ns/{good.pod_name}"}}


def test_dirty_tracking_only_for_committed_changes() -> None:
    a = allocator(gpu("g"))
    a.take_dirty()
    r = req()
    a.assume(r, ["g"])
    assert a.take_dirty() == set()
    a.commit(r.pod_uid)
    assert a.take_dirty() == {"g"}
    a.release(r.pod_uid)
    assert a.dirty_gpus() == {"g"}


def test_virtual_capacity_uses_pool_oversubscription() -> None:
    a = allocator(gpu("g1", "n1", tflops=100, vram=16), gpu("g2", "n1", tflops=100, vram=16))
    a.set_pool_config("p", PoolConfig(tflops_oversell_ratio=300, vram_expand_to_host_mem=50,
                                      vram_expand_to_host_disk=0))
    a.allocate(req(tflops=10, vram=2))  # limits 20 TFLOPS, 4Gi
    cap = a.virtual_capacity(node="n1", host_memory=64 * GIB, host_disk=100 * GIB)
    assert cap == {"totalGPUs": 2, "totalTFlops": "200", "totalVRAM": "32Gi", "availableTFlops": "190",
                   "availableVRAM": "30Gi", "virtualTFlops": "600", "virtualVRAM": "64Gi",
                   "virtualAvailableTFlops": "580", "virtualAvailableVRAM": "60Gi"}
    assert a.virtual_capacity(pool="p", host_memory={"n1": 64 * GIB})["virtualVRAM"] == "64Gi"


# ---------------------------------------------------------------- quota


def test_quota_messages_say_which_limit_and_by_how_much() -> None:
    a = allocator(gpu("g1", "n1", vram=80), gpu("g2", "n1", vram=80))
    a.set_quota("ns", QuotaSpec(requests_vram=10 * GIB, single_max_requests_tflops=50_000, max_workers=2,
                                single_max_gpu_count=1))
    a.allocate(req(vram=6))
    with pytest.raises(QuotaExceeded) as info:
        a.select(req(vram=8))
    err = info.value
    assert str(err) == ("namespace ns: total.max.vram.request exceeded: requested 8Gi with 6Gi already used, "
                        "limit 10Gi (short by 4Gi)")
    assert (err.resource, err.shortfall, err.unresolvable) == ("total.max.vram.request", 4 * GIB, False)
    with pytest.raises(QuotaExceeded, match=r"single.max.tflops.request exceeded: requested 60 per GPU, "
                                            r"limit 50 \(over by 10\)") as info:
        a.select(req(tflops=60, vram=1))
    assert info.value.unresolvable
    with pytest.raises(QuotaExceeded, match=r"single\.max\.gpuCount\.limit exceeded: requested 2 GPUs, limit 1"):
        a.select(req(vram=1, count=2))
    a.allocate(req(vram=1))
    with pytest.raises(QuotaExceeded, match=r"total\.max\.workers\.limit exceeded: requested 1 with 2 already used"):
        a.select(req(vram=1))


def test_assumed_usage_counts_and_percent_requests_count_against_quota() -> None:
    a = allocator(gpu("g", tflops=100, vram=80))
    a.set_quota("ns", QuotaSpec(requests_tflops=60_000))
    a.assume(req(tflops=40), ["g"])
    with pytest.raises(QuotaExceeded, match="requested 30 with 40 already used, limit 60"):
        a.select(req(tflops=30))
    # a compute-percent request is checked once its GPU is known: 30 % of 100 TFLOPS = 30
    pct = req(tflops=0, tflops_limit=0, percent_request=30_000)
    placement = a.select(pct)
    with pytest.raises(QuotaExceeded, match=r"total\.max\.tflops\.request"):
        a.assume(pct, placement.gpu_names)


def test_a_pod_without_limits_is_unlimited_and_charges_no_limit_quota() -> None:
    a = allocator(gpu("g", tflops=100, vram=80))
    a.set_quota("ns", QuotaSpec(limits_tflops=5_000, limits_vram=1 * GIB,
                                single_max_limits_tflops=1_000, single_max_limits_vram=GIB))
    unlimited = req(tflops=40, vram=20, tflops_limit=0, vram_limit=0)
    a.allocate(unlimited)  # limit quotas count limits only: a pod without limits charges nothing there
    used = a.quota_usage("ns")
    assert (used.requests_tflops, used.requests_vram, used.limits_tflops, used.limits_vram) == (
        40_000, 20 * GIB, 0, 0)
    assert views.gpu_status(a, "g")["runningApps"][0]["pods"][0]["limits"] == {"tflops": "0", "vram": "0"}
    virtual = a.virtual_capacity(node="n1")
    assert (virtual["virtualAvailableTFlops"], virtual["virtualAvailableVRAM"]) == (
        virtual["virtualTFlops"], virtual["virtualVRAM"])  # nothing subtracted for a missing limit
    with pytest.raises(QuotaExceeded, match=r"single\.max\.vram\.limit"):
        a.select(req(tflops=1, vram=1, tflops_limit=0, vram_limit=2 * GIB))


def test_quota_status_percentages_and_alert_condition() -> None:
    a = allocator(gpu("g", tflops=100, vram=80))
    a.set_quota("ns", QuotaSpec(requests_tflops=100_000, requests_vram=10 * GIB, max_workers=4,
                                alert_threshold_percent=50))
    a.allocate(req(tflops=25, vram=6))
    status = views.quota_status(a, "ns")
    assert status["used"] == {"requests": {"tflops": "25", "vram": "6Gi"},
                              "limits": {"tflops": "50", "vram": "12Gi"}, "workers": 1}
    assert status["availablePercent"] == {"requests.tflops": "75.00", "requests.vram": "40.00",
                                          "limits.tflops": "100", "limits.vram": "100", "workers": "75.00"}
    cond = status["conditions"][0]
    assert (cond["status"], cond["reason"]) == ("False", "AlertThresholdReached")
    assert cond["message"] == ("One of the following resources has reached alert threshold: tflops requests: "
                               "false, vram requests: true, tflops limits: false, vram limits: false, "
                               "workers: false")
    assert a.take_dirty_quotas() == {"ns"}


def test_quota_from_object_validates() -> None:
    obj: dict[str, Any] = {"metadata": {"namespace": "team"}, "spec": {
        "total": {"requests": {"tflops": "100", "vram": "10Gi"}, "limits": {"tflops": "200", "vram": "20Gi"},
                  "maxWorkers": 3, "alertThresholdPercent": 80},
        "single": {"maxRequests": {"tflops": "50", "vram": "4Gi"}, "maxGPUCount": 2}}}
    ns, spec = quota_from_object(Body(obj))
    assert ns == "team"
    assert spec == QuotaSpec(requests_tflops=100_000, requests_vram=10 * GIB, limits_tflops=200_000,
                             limits_vram=20 * GIB, max_workers=3, alert_threshold_percent=80,
                             single_max_requests_tflops=50_000, single_max_requests_vram=4 * GIB,
                             single_max_gpu_count=2)
    bad = json.loads(json.dumps(obj))
    bad["spec"]["total"]["limits"]["vram"] = "5Gi"
    with pytest.raises(QuotaSpecError, match=r"spec.total.limits.vram must be >= spec.total.requests.vram"):
        quota_from_object(Body(bad))
    bad["spec"]["total"]["limits"]["vram"] = "-5Gi"
    with pytest.raises(QuotaSpecError, match="must not be negative"):
        quota_from_object(Body(bad))


# ---------------------------------------------------------------- GPU objects


def test_gpu_from_object_reads_the_crd_fields() -> None:
    obj: dict[str, Any] = {"metadata": {"name": "gpu-abc", "labels": {"tensor-fusion.ai/gpupool": "pool-a",
                                                       "tensor-fusion.ai/managed-by": "node-x"},
                        "annotations": {"tensor-fusion.ai/virtualization-capabilities":
                                        reporter_capabilities(supports_hard_isolation=False)}},
           "status": {"capacity": {"tflops": "989", "vram": "80Gi"}, "available": {"tflops": "1", "vram": "1"},
                      "phase": "Running", "gpuModel": "H100", "vendor": "NVIDIA", "usedBy": "tensor-fusion",
                      "index": 3, "numaNode": 1, "isolationMode": "soft",
                      "nodeSelector": {"kubernetes.io/hostname": "node-y"}}}
    info = gpu_from_object(Gpu(obj))
    assert info == GpuInfo(name="gpu-abc", node="node-y", pool="pool-a", capacity_tflops=989_000,
                           capacity_vram=80 * GIB, model="H100", vendor="NVIDIA", phase="Running",
                           used_by="tensor-fusion", index=3, numa=1, isolation_mode="soft",
                           virtualization=frozenset({"soft", "shared"}))
    del obj["status"]["nodeSelector"]
    assert gpu_from_object(Gpu(obj)).node == "node-x"
    obj["status"]["capacity"] = {"vram": "80Gi"}
    with pytest.raises(GpuObjectError, match=r"gpu-abc: status\.capacity\.tflops is missing"):
        gpu_from_object(Gpu(obj))


def reporter_capabilities(**flags: bool) -> str:
    """The annotation value exactly as the hypervisor's GPU reporter writes it (Go field names)."""
    return json.dumps(VirtualizationCapabilities(**flags).to_wire(), separators=(",", ":"))


def test_virtualization_keys_are_read_ignoring_case() -> None:
    written = reporter_capabilities()
    assert '"SupportsSoftIsolation":true' in written  # the PascalCase form the original writes too
    assert parse_virtualization(written) == frozenset({"shared", "soft", "hard"})
    assert parse_virtualization(reporter_capabilities(supports_partitioning=True,
                                                      supports_soft_isolation=False)) == frozenset({
        "shared", "hard", "partitioned"})
    assert parse_virtualization('{"supportsSoftIsolation": true}') == frozenset({"shared", "soft"})
    assert parse_virtualization('{"SUPPORTSHARDISOLATION": true, "supportsSoftIsolation": "yes"}') == frozenset({
        "shared", "hard"})
    assert parse_virtualization("not json") is None and parse_virtualization(None) is None


def test_default_soft_pod_is_placed_on_a_gpu_reported_by_the_hypervisor() -> None:
    obj: dict[str, Any] = {
        "metadata": {"name": "gpu-1", "labels": {"tensor-fusion.ai/gpupool": "p"},
                     "annotations": {"tensor-fusion.ai/virtualization-capabilities": reporter_capabilities()}},
        "status": {"capacity": {"tflops": "989", "vram": "80Gi"}, "phase": "Running", "usedBy": "tensor-fusion",
                   "nodeSelector": {"kubernetes.io/hostname": "n1"}}}
    a = allocator(gpu_from_object(Gpu(obj)))
    pod: dict[str, Any] = {"metadata": {"name": "w", "namespace": "ns", "uid": "u1",
                                        "annotations": {"tensor-fusion.ai/gpupool": "p",
                                                        "tensor-fusion.ai/tflops-request": "10",
                                                        "tensor-fusion.ai/vram-request": "1Gi"}}}
    soft = request_from_pod(Pod(pod))
    assert soft.isolation == "soft"
    assert a.select(soft).gpu_names == ("gpu-1",)
    no_soft = dict(obj, metadata={**obj["metadata"], "annotations": {
        "tensor-fusion.ai/virtualization-capabilities": reporter_capabilities(supports_soft_isolation=False)}})
    a.upsert_gpu(gpu_from_object(Gpu(no_soft)))
    with pytest.raises(Unschedulable, match="GPUIsolationModeFilter"):
        a.select(soft)
    assert removed_by(a, soft)["GPUIsolationModeFilter"] == ["gpu-1: device does not support soft isolation"]


def test_pool_config_validation_and_positional_mode() -> None:
    a = allocator(gpu("a1", "na"), gpu("b1", "nb"))
    a.allocate(req(tflops=50, vram=8))
    a.set_pool_config("p", "LowLoadFirst")
    assert a.select(req()).node == "nb"  # index rebuilt with the new ordering
    a.set_pool_config("p", "CompactFirst")
    assert a.select(req()).node == "na"
    with pytest.raises(ValueError, match=r"tflops_oversell_ratio must be 100\.\.100000, got 50"):
        a.set_pool_config("p", "CompactFirst", tflops_oversell_ratio=50)
    assert a.pool_config("p").placement_mode == "CompactFirst"


def test_gpu_holding_allocations_cannot_move() -> None:
    a = allocator(gpu("g", "n1"))
    a.allocate(req())
    before = a.snapshot()
    with pytest.raises(AllocatorError, match="cannot move from n1/p to n2/p"):
        a.upsert_gpu(gpu("g", "n2"))
    assert a.snapshot() == before
    a.upsert_gpu(gpu("idle", "n1"))
    a.upsert_gpu(gpu("idle", "n3"))  # an idle GPU may move
    assert a.gpu_info("idle").node == "n3" and a.nodes() == ["n1", "n3"]


def test_model_filter_uses_its_own_index_and_follows_model_changes() -> None:
    a = allocator(gpu("h", "n1", model="H100"), gpu("a", "n2", model="A100"))
    assert a.select(req(gpu_model="A100")).gpu_names == ("a",)
    a.upsert_gpu(gpu("a", "n2", model="L40S"))
    with pytest.raises(Unschedulable) as info:
        a.select(req(gpu_model="A100"))
    assert info.value.stage == "GPUModelFilter"
    a.upsert_gpu(gpu("h", "n1", model="A100"))
    assert a.select(req(gpu_model="A100")).gpu_names == ("h",)
