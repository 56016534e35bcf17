"""The allocator's scheduler plugins (tfusion/allocator/framework.py): Status, extension points,
explanations, and suggestions that really make a pod fit when applied."""

from __future__ import annotations

import copy
from typing import Any

from tfusion.allocator import (
    AllocRequest,
    Code,
    Framework,
    GpuAllocator,
    GpuInfo,
    QuotaSpec,
    Reason,
    Status,
    quota_from_object,
    request_from_pod,
)
from tfusion.allocator import framework as fwk
from tfusion.allocator.explain import LABEL_STAGES, gpu_label
from tfusion.allocator.filters import STAGES, gpu_fits
from tfusion.api.accessors import Body, Pod
from tfusion.controller.defaults import Sources
from tfusion.controller.scheduling.explain import StatusBody, explanation_json, status_json
from tfusion.controller.scheduling.simulate import simulate_schedule

GIB = 1 << 30
P = "tensor-fusion.ai/"
POOLS: list[dict[str, Any]] = [{"metadata": {"name": "pool", "annotations": {P + "is-default-pool": "true"}},
                                "spec": {}}, {"metadata": {"name": "spare"}, "spec": {}}]


def gpu(name: str, node: str, *, pool: str = "pool", model: str = "H100", tflops: int = 100, vram: int = 16,
        **extra: Any) -> GpuInfo:
    return GpuInfo(name=name, node=node, pool=pool, model=model, capacity_tflops=tflops * 1000,
                   capacity_vram=vram * GIB, **extra)


def cluster(max_workers: int = 256) -> GpuAllocator:
    """node-a: 2 x H100 16Gi; node-b: 2 x H100 8Gi; node-c: 2 x L40S 24Gi / 50 TFLOPS."""
    a = GpuAllocator(max_workers_per_node=max_workers)
    for i in range(2):
        a.upsert_gpu(gpu(f"a{i}", "node-a", index=i))
        a.upsert_gpu(gpu(f"b{i}", "node-b", vram=8, index=i))
        a.upsert_gpu(gpu(f"c{i}", "node-c", model="L40S", tflops=50, vram=24, index=i))
    return a


def req(uid: str, *, vram: int = 4, tflops: int = 10, count: int = 1, **extra: Any) -> AllocRequest:
    fields: dict[str, Any] = dict(pod_uid=uid, pod_name=uid, namespace="ml", pool="pool", workload=("ml", uid),
                                  tflops_request=tflops * 1000, vram_request=vram * GIB, count=count)
    fields.update(extra)
    return AllocRequest(**fields)


NODES = ["node-a", "node-b", "node-c", "node-z"]


# ---------------------------------------------------------------------- Status and the extension points

def test_status_ok_summary_and_message() -> None:
    assert fwk.SUCCESS.ok and not Status(Code.UNSCHEDULABLE).ok
    status = Status(Code.UNSCHEDULABLE, fwk.FILTER, (
        Reason(fwk.VRAM_TOO_SMALL, "ResourceFilter", "n", "g1", "vram", 8 * GIB, 6 * GIB, gpus=2),
        Reason(fwk.VRAM_TOO_SMALL, "ResourceFilter", "n", "g2", "vram", 8 * GIB, 5 * GIB),
        Reason(fwk.TOO_FEW_GPUS, "SameNodeFilter", "n", resource="gpus", requested=2, available=0)))
    assert status.summary() == "GPU VRAM too small, too few fitting GPUs on the node"
    assert status.reasons[0].text() == \
        "g1: VRAM available 6Gi < requested 8Gi (the most free of the node's 2 GPUs short of VRAM)"
    assert Status(Code.ERROR).summary() == "Error"
    expl = fwk.Explanation({"a": status, "b": status, "c": fwk.SUCCESS,
                            "d": Status(Code.UNRESOLVABLE, fwk.FILTER, (Reason(fwk.NO_GROUP_GPUS, fwk.FILTER),))})
    assert expl.message(5) == ("1/5 nodes are available: 1 node has no GPU of the requested pool, "
                               "2 GPU VRAM too small, 2 too few fitting GPUs on the node.")
    quota = Status(Code.UNSCHEDULABLE, fwk.PRE_FILTER, (Reason(fwk.QUOTA_EXCEEDED, "QuotaCheck"),))
    assert fwk.Explanation({}, (), quota).message(3) == "0/3 nodes are available: GPU quota exceeded."


def test_pre_filter_quota_and_pool() -> None:
    a = cluster()
    fw = Framework(a)
    assert fw.pre_filter(req("p")).ok
    missing = fw.pre_filter(req("p", pool="nope"))
    assert missing.code is Code.UNRESOLVABLE and missing.reasons[0].message == fwk.NO_POOL_GPUS
    a.set_quota("ml", QuotaSpec(requests_vram=6 * GIB, single_max_requests_tflops=50_000))
    total = fw.pre_filter(req("p", vram=8))
    assert total.code is Code.UNSCHEDULABLE and total.stage == fwk.PRE_FILTER
    reason = total.reasons[0]
    assert (reason.message, reason.stage, reason.resource, reason.requested, reason.available) == (
        fwk.QUOTA_EXCEEDED, "QuotaCheck", "total.max.vram.request", 8 * GIB, 6 * GIB)
    single = fw.pre_filter(req("p", tflops=60))
    assert single.code is Code.UNRESOLVABLE and single.reasons[0].resource == "single.max.tflops.request"


def test_filter_statuses_cheap_and_explained() -> None:
    a = cluster()
    fw = Framework(a)
    big = req("big", vram=12)
    cheap = fw.filter(big, [*NODES, "node-a"])
    assert list(cheap) == NODES  # input order, duplicates once
    assert cheap["node-a"] is fwk.SUCCESS and cheap["node-c"].ok
    assert cheap["node-b"].code is Code.UNSCHEDULABLE and cheap["node-b"].summary() == fwk.NO_FIT
    assert cheap["node-z"].code is Code.UNRESOLVABLE and not cheap["node-z"].resolvable
    explained = fw.filter(big, NODES, explain=True)
    node_b = explained["node-b"]
    assert node_b.code is Code.UNSCHEDULABLE and node_b.summary() == fwk.VRAM_TOO_SMALL
    reason = node_b.reasons[0]
    assert (reason.node, reason.gpu, reason.resource, reason.requested, reason.available, reason.gpus) == (
        "node-b", "b0", "vram", 12 * GIB, 8 * GIB, 2)
    assert explained["node-z"].reasons[0].node == "node-z"
    feasible, failed = fw.split(big, NODES)
    assert feasible == ["node-a", "node-c"] and set(failed) == {"node-b", "node-z"}
    # a model mismatch cannot be cured by load: unresolvable
    h100 = fw.filter(req("m", gpu_model="H100"), ["node-c"], explain=True)["node-c"]
    assert h100.code is Code.UNRESOLVABLE and h100.summary() == fwk.NO_MODEL_GPUS
    vendor = fw.filter(req("v", vendor="AMD"), ["node-a"], explain=True)["node-a"]
    assert vendor.code is Code.UNRESOLVABLE and vendor.summary() == fwk.VENDOR_MISMATCH
    two = fw.filter(req("two", vram=12, count=2), ["node-a"], explain=True)["node-a"]
    assert two.ok
    a.allocate(req("busy", vram=8))
    two = fw.filter(req("two", vram=12, count=2), ["node-a"], explain=True)["node-a"]
    assert two.code is Code.UNSCHEDULABLE
    assert [r.message for r in two.reasons] == [fwk.VRAM_TOO_SMALL, fwk.TOO_FEW_GPUS]
    assert (two.reasons[1].requested, two.reasons[1].available) == (2, 1)


def test_filter_follows_every_change_of_a_node() -> None:
    a = cluster(max_workers=2)
    fw = Framework(a)
    probe = req("probe", vram=10)
    assert [n for n, s in fw.filter(probe, NODES).items() if s.ok] == ["node-a", "node-c"]
    a.allocate(req("x1", vram=10))  # node-a (packs): one 16Gi GPU left with room
    a.allocate(req("x2", vram=10))  # node-a: both GPUs now hold 10Gi; workers at the limit
    assert [n for n, s in fw.filter(probe, NODES).items() if s.ok] == ["node-c"]
    workers = fw.filter(req("small", vram=1), ["node-a"], explain=True)["node-a"]
    assert workers.summary() == fwk.TOO_MANY_WORKERS and workers.code is Code.UNSCHEDULABLE
    a.release("x1")
    assert fw.filter(probe, ["node-a"])["node-a"].ok
    a.upsert_gpu(gpu("c0", "node-c", model="L40S", tflops=50, vram=24, phase="Pending"))
    a.upsert_gpu(gpu("c1", "node-c", model="L40S", tflops=50, vram=24, phase="Pending"))
    node_c = fw.filter(probe, ["node-c"], explain=True)["node-c"]
    assert node_c.code is Code.UNRESOLVABLE and node_c.summary() == fwk.NOT_RUNNING
    a.remove_gpu("c0")
    a.remove_gpu("c1")
    assert fw.filter(probe, ["node-c"])["node-c"].code is Code.UNRESOLVABLE
    a.upsert_gpu(gpu("c0", "node-c", vram=80))
    assert fw.filter(probe, ["node-c"])["node-c"].ok


def test_score_range_and_consumers_mapping() -> None:
    a = cluster()
    fw = Framework(a)
    a.allocate(req("x", vram=8))
    scores = fw.score(req("p"), NODES)
    assert set(scores) == set(NODES) and scores["node-z"] == 0
    assert all(0 <= s <= 100 for s in scores.values())
    assert scores["node-a"] == a.node_score("node-a", "pool") > scores["node-b"]
    assert fw.score(req("p", pool="nope"), ["node-a"]) == {"node-a": 0}


def test_reserve_pre_bind_unreserve_lifecycle() -> None:
    a = cluster()
    fw = Framework(a)
    r = req("p", vram=12)
    placement, status = fw.reserve(r, "node-b")
    assert placement is None and status.code is Code.UNSCHEDULABLE and status.stage == fwk.RESERVE
    assert status.summary() == fwk.VRAM_TOO_SMALL
    placement, status = fw.reserve(r, "node-a")
    assert status.ok and placement is not None and placement.node == "node-a" and len(placement.gpu_names) == 1
    info = a.allocation("p")
    assert info is not None and info.assumed
    again, status = fw.reserve(r, "node-c")
    assert again is None and status.code is Code.ERROR and "already holds" in status.details()
    assert fw.pre_bind("p").ok and fw.pre_bind("p").ok  # idempotent
    info = a.allocation("p")
    assert info is not None and not info.assumed
    assert fw.unreserve("p") and not a.has_allocation("p") and not fw.unreserve("p")
    assert fw.pre_bind("p").code is Code.ERROR
    assert fw.reserve(req(""), "node-a")[1].code is Code.ERROR
    a.set_quota("ml", QuotaSpec(requests_vram=4 * GIB))
    placement, status = fw.reserve(req("q", vram=8), "node-a")
    assert placement is None and status.reasons[0].message == fwk.QUOTA_EXCEEDED


def test_gpu_label_agrees_with_the_filter_stages() -> None:
    """The fused per-GPU reason is the first failing stage of filters.STAGES, None exactly when it fits."""
    a = GpuAllocator()
    variants: list[dict[str, Any]] = [
        {}, {"phase": "Pending"}, {"used_by": "nvidia-device-plugin"}, {"isolation_policy": "Dynamic"},
        {"isolation_mode": "hard"}, {"virtualization": frozenset({"shared"})}, {"vendor": "AMD"},
        {"model": "L40S"}, {"index": 3}]
    for i, extra in enumerate(variants):
        a.upsert_gpu(gpu(f"g{i}", f"n{i}", **{"index": 0, **extra}))
    a.allocate(req("busy", vram=10, gpu_names=()))
    requests = [req("r1"), req("r2", vram=12), req("r3", tflops=95), req("r4", isolation="shared"),
                req("r5", isolation="hard"), req("r6", indices=(0,)), req("r7", gpu_model="H100"),
                req("r8", vendor="NVIDIA"), req("r9", isolation="partitioned"),
                req("r10", tflops=0, percent_request=95_000)]
    for r in requests:
        for slot in a.indexes.gpus.values():
            first = next((stage.name for stage in STAGES if stage.applies(r) and stage.check(slot, r) is not None),
                         None)
            label = gpu_label(slot, r)
            assert (label is None) == (first is None) == gpu_fits(slot, r), (slot.name, r.pod_uid)
            if label is not None:
                assert LABEL_STAGES[label][0] == first, (slot.name, r.pod_uid, label, first)


def test_explanation_and_its_json() -> None:
    a = cluster()
    fw = Framework(a)
    expl = fw.explain(req("huge", vram=30))
    assert expl.pre_filter.ok and not expl.feasible
    assert expl.message(3) == "0/3 nodes are available: 3 GPU VRAM too small."
    body = explanation_json(expl, 4)
    assert body["message"] == "0/4 nodes are available: 3 GPU VRAM too small."
    node_a = body["nodes"]["node-a"]
    assert node_a["code"] == "Unschedulable" and node_a["summary"] == fwk.VRAM_TOO_SMALL
    assert node_a["reasons"][0]["requested"] == "30Gi" and node_a["reasons"][0]["available"] == "16Gi"
    assert node_a["reasons"][0]["detail"] == \
        "a0: VRAM available 16Gi < requested 30Gi (the most free of the node's 2 GPUs short of VRAM)"
    assert body["suggestions"][0]["kind"] == "smaller-request"
    success: StatusBody = {"code": "Success", "stage": "", "summary": "Success", "reasons": []}
    assert status_json(fwk.SUCCESS) == success
    fits = fw.explain(req("small"))
    assert fits.suggestions == () and fits.feasible == ["node-a", "node-b", "node-c"]


# ---------------------------------------------------------------------- suggestions, applied for real

def manifest(name: str, **notes: str) -> dict[str, Any]:
    annotations = {P + "gpupool": "pool", P + "tflops-request": "10", P + "vram-request": "4Gi"}
    annotations.update({P + k.replace("_", "-"): v for k, v in notes.items()})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "annotations": annotations},
            "spec": {"schedulerName": "tensor-fusion-scheduler", "containers": [{"name": "c", "image": "x"}]}}


def simulate(a: GpuAllocator, pod: dict[str, Any]) -> Any:  # the answer's JSON, read by key
    status, body = simulate_schedule(a, pod, sources=Sources(pools=POOLS))
    assert status == 200, body
    return body


def set_path(obj: dict[str, Any], path: str, value: str) -> None:
    *parents, last = path.split(".")
    for key in parents:
        obj = obj.setdefault(key, {})
    obj[last] = int(value) if last in ("maxWorkers", "maxGPUCount") else value


def apply(a: GpuAllocator, pod: dict[str, Any], suggestion: dict[str, Any],
          quota: dict[str, Any] | None) -> dict[str, Any]:
    """Do what the suggestion says; return the (possibly changed) pod manifest."""
    pod = copy.deepcopy(pod)
    if suggestion["target"] == "annotations":
        for key, value in suggestion["changes"].items():
            pod["metadata"]["annotations"][key] = value
    elif suggestion["target"] == "quota":
        assert quota is not None
        for path, value in suggestion["changes"].items():
            set_path(quota, path, value)
        a.set_quota(*quota_from_object(Body(quota)))  # the changed object must still be a valid quota
    else:
        assert suggestion["target"] == "pods" and suggestion["pods"] and not suggestion["changes"]
        by_name = {f"{i.request.namespace}/{i.request.pod_name}": uid for uid, i in a.allocations().items()}
        for ref in suggestion["pods"]:
            a.release(by_name[ref])
    return pod


def assert_every_suggestion_works(build: Any, pod: dict[str, Any], kinds: set[str],
                                  quota: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    a = build()
    if quota is not None:
        a.set_quota(*quota_from_object(Body(quota)))
    body = simulate(a, pod)
    assert body["error"] is not None and body["scheduleResult"]["SuggestedHost"] == ""
    suggestions: list[dict[str, Any]] = body["suggestions"]
    assert kinds <= {s["kind"] for s in suggestions}, suggestions
    for suggestion in suggestions:
        fresh = build()  # each suggestion alone, on the state it was made for
        fresh_quota = copy.deepcopy(quota)
        if fresh_quota is not None:
            fresh.set_quota(*quota_from_object(Body(fresh_quota)))
        changed = apply(fresh, pod, suggestion, fresh_quota)
        after = simulate(fresh, changed)
        assert after["error"] is None, (suggestion, after["error"])
        if suggestion.get("node"):
            assert after["scheduleResult"]["SuggestedHost"] == suggestion["node"], suggestion
    return suggestions


def test_suggest_the_largest_vram_that_fits_now() -> None:
    def build() -> GpuAllocator:
        a = cluster()
        a.allocate(req("x", vram=5))  # node-a: 11Gi and 16Gi free
        return a

    found = assert_every_suggestion_works(build, manifest("p", vram_request="30Gi"), {"smaller-request"})
    assert found[0]["changes"] == {P + "vram-request": "24Gi"} and found[0]["node"] == "node-c"
    assert found[0]["message"] == "vram-request <= 24Gi fits on node-c"
    two = assert_every_suggestion_works(build, manifest("p2", vram_request="25Gi", gpu_count="2"),
                                        {"smaller-request"})
    assert two[0]["changes"] == {P + "vram-request": "24Gi"} and two[0]["node"] == "node-c"
    three = assert_every_suggestion_works(build, manifest("p3", vram_request="4Gi", gpu_count="3"),
                                          {"smaller-request"})
    assert three[0]["changes"] == {P + "gpu-count": "2"}


def test_suggest_tflops_percent_and_both() -> None:
    assert_every_suggestion_works(cluster, manifest("t", tflops_request="150"), {"smaller-request"})
    pct = manifest("pct", compute_percent_request="100")
    del pct["metadata"]["annotations"][P + "tflops-request"]

    def busy() -> GpuAllocator:
        a = cluster()
        for name in ("a0", "a1", "b0", "b1", "c0", "c1"):  # 10 TFLOPS and 1Gi taken on every GPU
            a.assume(req(f"w-{name}", vram=1, tflops=10), [name])
            a.commit(f"w-{name}")
        return a

    found = assert_every_suggestion_works(busy, pct, {"smaller-request"})
    assert any(P + "compute-percent-request" in s["changes"] for s in found)
    assert_every_suggestion_works(busy, manifest("both", tflops_request="99", vram_request="30Gi"),
                                  {"smaller-request"})


def test_suggest_other_model_and_other_pool() -> None:
    def build() -> GpuAllocator:
        a = cluster()
        a.upsert_gpu(gpu("s0", "node-s", pool="spare", model="H100", tflops=989, vram=80))
        return a

    found = assert_every_suggestion_works(build, manifest("m", gpu_model="H100", vram_request="20Gi"),
                                          {"other-model", "other-pool"})
    by_kind = {s["kind"]: s for s in found}
    assert by_kind["other-model"]["changes"] == {P + "gpu-model": "L40S"}
    assert by_kind["other-pool"]["changes"] == {P + "gpupool": "spare"}
    # a pool that is no GPUPool: refused as the webhook refuses it, naming the pools there are
    status, missing = simulate_schedule(build(), manifest("nowhere", gpupool="nope"), sources=Sources(pools=POOLS))
    assert status == 400 and "(no such GPUPool); expected the name of a GPUPool (pool, spare)" in str(missing["error"])


def test_suggest_the_missing_quota() -> None:
    quota = {"metadata": {"name": "q", "namespace": "ml"},
             "spec": {"total": {"requests": {"vram": "10Gi", "tflops": "100"},
                                "limits": {"vram": "12Gi"}, "maxWorkers": 1},
                      "single": {"maxRequests": {"vram": "8Gi"}}}}

    def build() -> GpuAllocator:
        a = cluster()
        a.allocate(req("x", vram=6))
        return a

    found = assert_every_suggestion_works(build, manifest("p", vram_request="12Gi"), {"quota"}, quota)
    raise_quota = next(s for s in found if s["kind"] == "quota")
    assert raise_quota["changes"] == {"spec.single.maxRequests.vram": "12Gi", "spec.total.requests.vram": "18Gi",
                                      "spec.total.maxWorkers": "2", "spec.total.limits.vram": "18Gi"}
    assert_every_suggestion_works(build, manifest("small", vram_request="5Gi"), {"quota", "smaller-request"},
                                  {**quota, "spec": {"total": {"requests": {"vram": "10Gi"}}}})


def test_suggest_lower_qos_pods_to_preempt() -> None:
    def build() -> GpuAllocator:
        a = cluster()
        for i, (vram, qos) in enumerate(((12, "low"), (12, "low"), (6, "medium"), (6, "low"), (20, "low"),
                                         (20, "high"))):
            a.allocate(req(f"w{i}", vram=vram, qos=qos))
        return a

    a = build()
    assert {i.node for i in a.allocations().values()} == {"node-a", "node-b", "node-c"}
    found = assert_every_suggestion_works(build, manifest("vip", vram_request="14Gi", qos="high"),
                                          {"preempt-lower-qos"})
    preempt = next(s for s in found if s["kind"] == "preempt-lower-qos")
    assert len(preempt["pods"]) == 1 and preempt["changes"] == {}
    low = simulate(build(), manifest("low", vram_request="14Gi", qos="low"))
    assert "preempt-lower-qos" not in {s["kind"] for s in low["suggestions"]}


def test_no_suggestion_is_made_that_does_not_work() -> None:
    a = cluster()
    body = simulate(a, manifest("impossible", vram_request="100Gi", gpu_count="4"))
    assert body["error"] is not None
    for suggestion in body["suggestions"]:
        after = simulate(cluster(), apply(cluster(), manifest("impossible", vram_request="100Gi", gpu_count="4"),
                                          suggestion, None))
        assert after["error"] is None
    assert simulate(a, manifest("fits"))["suggestions"] == []  # a pod that fits gets none


def test_request_from_pod_round_trips_the_suggested_values() -> None:
    """The suggested annotation values parse back to what was checked."""
    pod = manifest("p", vram_request="1Gi")
    pod["metadata"]["annotations"][P + "vram-request"] = "24Gi"
    assert request_from_pod(Pod(pod)).vram_request == 24 * GIB


def test_simulate_failure_carries_the_structured_explanation() -> None:
    body = simulate(cluster(), manifest("huge", vram_request="30Gi"))
    explanation = body["error"]["explanation"]
    assert explanation["message"] == "0/3 nodes are available: 3 GPU VRAM too small."
    assert explanation["preFilter"]["code"] == "Success" and "suggestions" not in explanation
    reason = explanation["nodes"]["node-c"]["reasons"][0]
    assert (reason["gpu"], reason["resource"], reason["requested"], reason["available"]) == (
        "c0", "vram", "30Gi", "24Gi")
    assert simulate(cluster(), manifest("ok"))["error"] is None
