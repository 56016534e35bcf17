"""The console's view models: the numbers each page shows, from a small cluster of known objects."""

from __future__ import annotations

from typing import Any

from tfusion.api import annotations as tfa
from tfusion.console import views
from tfusion.console.cache import StaticCluster
from tfusion.console.explain import annotate_command, suggestion_text
from tfusion.kube import resources as r

GIB = 1 << 30


def gpu(name: str, node: str, pool: str, *, model: str = "NVIDIA A100", tflops: str = "312",
        available: str = "312", vram: str = "80Gi", vram_free: str = "80Gi", phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {tfa.GPU_POOL: pool, tfa.MANAGED_BY: node}},
            "status": {"uuid": f"GPU-{name}", "gpuModel": model, "phase": phase, "isolationMode": "soft",
                       "nodeSelector": {"kubernetes.io/hostname": node},
                       "capacity": {"tflops": tflops, "vram": vram},
                       "available": {"tflops": available, "vram": vram_free}}}


def worker(name: str, gpus: str, *, node: str = "node-a", qos: str = "medium", tflops: str = "100",
           vram: str = "20Gi", workload: str = "train", namespace: str = "team-a") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                         "creationTimestamp": "2026-12-01T10:00:00Z",
                         "labels": {tfa.ENABLED: "true", tfa.COMPONENT: "worker", tfa.WORKLOAD: workload},
                         "annotations": {tfa.GPU_POOL: "shared", tfa.TFLOPS_REQUEST: tflops,
                                         tfa.TFLOPS_LIMIT: tflops, tfa.VRAM_REQUEST: vram, tfa.VRAM_LIMIT: vram,
                                         tfa.QOS: qos, tfa.GPU_IDS: gpus}},
            "spec": {"nodeName": node, "containers": [{"name": "main"}]}, "status": {"phase": "Running"}}


def pending(name: str, *, message: str = "0/1 nodes are available") -> dict[str, Any]:
    pod = worker(name, "", node="")
    pod["metadata"]["annotations"].pop(tfa.GPU_IDS)
    pod["spec"].pop("nodeName")
    pod["status"] = {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}
    return pod


def cluster() -> StaticCluster:
    pricing = [{"qos": "medium", "requests": {"perFP16TFlopsPerHour": "0.01", "perGBOfVRAMPerHour": "0.02"}}]
    return StaticCluster({
        r.NODES: [{"metadata": {"name": "node-a"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}},
                  {"metadata": {"name": "node-b"}, "status": {"conditions": [{"type": "Ready", "status": "False"}]}}],
        r.GPUS: [gpu("a1", "node-a", "shared", available="112", vram_free="40Gi"),
                 gpu("a2", "node-a", "shared"),
                 gpu("b1", "node-b", "shared", model="NVIDIA H100", tflops="989", available="989", phase="Unknown")],
        r.GPUPOOLS: [{"metadata": {"name": "shared"}, "spec": {"qosConfig": {"pricing": pricing}},
                      "status": {"phase": "Running"}}],
        r.GPUNODES: [{"metadata": {"name": "node-a"}, "spec": {"costPerHour": "2.5"}},
                     {"metadata": {"name": "node-b"}, "spec": {}}],
        r.PODS: [worker("w1", "a1"), worker("w2", "a1", qos="medium", tflops="100", vram="20Gi"),
                 worker("lone", "a2", workload="", tflops="10", vram="1Gi", namespace="team-b"),
                 pending("waits")],
        r.TENSORFUSIONWORKLOADS: [{"metadata": {"name": "train", "namespace": "team-a"},
                                   "status": {"recommendation": {"requests": {"tflops": "30", "vram": "8Gi"}}}},
                                  {"metadata": {"name": "idle", "namespace": "team-a"}}],
    })


USAGE = views.usage_from_answer({"data": [
    {"namespace": "team-a", "pod": "w1", "worker": "uid-w1", "workload": "train", "gpu": "gpu-a1",
     "compute_tflops": 12.5, "memory_bytes": 4 * GIB},
    {"namespace": "team-a", "pod": "w2", "worker": "uid-w2", "workload": "train", "gpu": "gpu-a1",
     "compute_tflops": 7.5, "memory_bytes": 2 * GIB},
    {"bad": "row", "compute_tflops": "x"}]})


def test_overview_sums_capacity_allocation_use_nodes_and_cost() -> None:
    view = views.overview(cluster(), USAGE)
    (pool,) = view.pools
    assert (pool.name, pool.phase, pool.gpus, pool.models) == ("shared", "Running", 3, ("NVIDIA A100", "NVIDIA H100"))
    assert (pool.tflops.capacity, pool.tflops.allocated, pool.tflops.used) == (312 * 2 + 989, 200, 20.0)
    assert (pool.vram.capacity, pool.vram.allocated, pool.vram.used) == (240 * GIB, 40 * GIB, 6 * GIB)
    assert (pool.nodes_ready, pool.nodes_not_ready, pool.pending, pool.workers) == (1, 1, 1, 3)
    assert pool.node_cost_per_hour == 2.5  # node-a's own price; node-b has none and no ProviderConfig
    # 100 TFLOPS * 0.01 + 20 GiB * 0.02 per worker per hour, twice, plus 10 * 0.01 + 1 * 0.02
    assert round(pool.billed_per_hour, 6) == round(2 * (1.0 + 0.4) + 0.12, 6)
    assert (view.gpus, view.pending, view.tflops.capacity) == (3, 1, 1613.0)


def test_without_usage_the_bars_say_unknown_not_zero() -> None:
    view = views.overview(cluster(), views.usage_from_answer(None, "the controller did not answer"))
    assert view.pools[0].tflops.used is None and view.usage_error == "the controller did not answer"


def test_gpu_page_filters_and_lists_the_pods_on_each_gpu() -> None:
    page = views.gpu_page(cluster(), USAGE, views.GpuFilters(node="node-a"))
    assert [row.name for row in page.rows] == ["a1", "a2"] and page.matching == 2 and page.total == 3
    a1 = page.rows[0]
    assert [(p.name, p.qos, p.tflops, p.vram) for p in a1.pods] == [("w1", "medium", 100.0, 20 * GIB),
                                                                    ("w2", "medium", 100.0, 20 * GIB)]
    assert (a1.tflops.allocated, a1.tflops.used, a1.vram.used) == (200.0, 20.0, 6 * GIB)
    unhealthy = views.gpu_page(cluster(), USAGE, views.GpuFilters(model="NVIDIA H100")).rows
    assert [(g.name, g.healthy, g.phase) for g in unhealthy] == [("b1", False, "Unknown")]
    assert page.pools == ("shared",) and page.nodes == ("node-a", "node-b")


def test_gpu_page_pages_through_many_gpus() -> None:
    many = StaticCluster({r.GPUS: [gpu(f"g{i:04d}", f"n{i // 4}", "p") for i in range(views.GPUS_PER_PAGE + 5)]})
    last = views.gpu_page(many, views.Usage(), views.GpuFilters(page=99))
    assert (last.page, last.pages, len(last.rows)) == (2, 2, 5)


def test_workloads_sort_by_what_they_ask_for_and_do_not_use() -> None:
    page = views.workload_page(cluster(), USAGE)
    assert [(w.namespace, w.name) for w in page.rows][:2] == [("team-a", "train"), ("team-b", "lone")]
    train = page.rows[0]
    assert (train.workers, train.tflops_request, train.tflops_used, train.vram_used) == (2, 200.0, 20.0, 6 * GIB)
    assert (train.recommended_tflops, train.recommended_vram) == (30.0, 8 * GIB)
    assert train.used_percent == 10.0 and train.unused_tflops == 180.0
    idle = next(w for w in page.rows if w.name == "idle")
    assert (idle.workers, idle.cost_per_hour) == (0, 0.0)
    by_name = views.workload_page(cluster(), USAGE, "name")
    assert [w.name for w in by_name.rows] == ["idle", "train", "lone"]


def test_pending_uses_the_controllers_explanation_and_offers_the_annotate_command() -> None:
    pods = views.pending_pods(cluster())
    answer: dict[str, Any] = {
              "message": "0/2 nodes have room", "nodes": {"node-a": {"reasons": [{"detail": "VRAM short by 4Gi"}]}},
              "suggestions": [{"kind": "smaller-request", "message": "ask for at most 16Gi", "target": "annotations",
                               "changes": {tfa.VRAM_REQUEST: "16Gi", tfa.VRAM_LIMIT: "16Gi"}},
                              {"kind": "quota", "message": "raise the quota", "target": "quota",
                               "changes": {"spec.total.requests.vram": "100Gi"}}]}
    page = views.pending_page(pods, {"team-a/waits": answer}, total=1)
    (row,) = page.rows
    assert (row.name, row.message, row.explained_by) == ("waits", "0/2 nodes have room", "controller")
    assert row.nodes == (("node-a", "VRAM short by 4Gi"),)
    first, second = row.suggestions
    assert first.command == ("kubectl annotate pod -n team-a waits tensor-fusion.ai/vram-limit=16Gi "
                             "tensor-fusion.ai/vram-request=16Gi --overwrite")
    assert first.text == suggestion_text(answer["suggestions"][0])  # the words tfusion why prints
    assert second.command == "" and "on the quota" in second.text


def test_pending_falls_back_to_the_pods_condition() -> None:
    page = views.pending_page(views.pending_pods(cluster()), {}, total=1, explain_error="no controller")
    assert page.rows[0].message == "0/1 nodes are available" and page.rows[0].explained_by == "condition"


def test_annotate_command_quotes_values_and_removes_empty_ones() -> None:
    command = annotate_command("ns", "p", {"target": "annotations", "changes": {"a/b": "x y", "c/d": ""}})
    assert command == "kubectl annotate pod -n ns p 'a/b=x y' c/d- --overwrite"


def test_quotas_flag_those_over_their_alert_threshold() -> None:
    quotas = StaticCluster({r.GPURESOURCEQUOTAS: [
        {"metadata": {"name": "q", "namespace": "calm"},
         "spec": {"total": {"requests": {"tflops": "100", "vram": "100Gi"}, "alertThresholdPercent": 90}},
         "status": {"used": {"requests": {"tflops": "50", "vram": "10Gi"}, "workers": 2}}},
        {"metadata": {"name": "q", "namespace": "busy"},
         "spec": {"total": {"requests": {"tflops": "100"}, "maxWorkers": 4}},
         "status": {"used": {"requests": {"tflops": "96"}, "workers": 1}}}]})
    busy, calm = views.quota_rows(quotas)
    assert (busy.namespace, busy.alerting, busy.alert_percent) == ("busy", True, 95.0)
    assert (calm.namespace, calm.alerting) == ("calm", False)
    tflops = next(line for line in busy.lines if line.what == "requests.tflops")
    assert (tflops.used, tflops.total, tflops.percent) == (96.0, 100.0, 96.0)
    assert next(line for line in busy.lines if line.what == "requests.vram").total is None


def test_events_keep_tfusions_and_filter() -> None:
    def event(name: str, reason: str, kind: str, component: str, when: str, type_: str = "Normal") -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "default"}, "type": type_, "reason": reason,
                "message": f"{reason} happened", "lastTimestamp": when, "reportingComponent": component,
                "involvedObject": {"kind": kind, "name": "x", "namespace": "default", "apiVersion": "v1"}}

    tf = "tensor-fusion-operator"
    events = StaticCluster({r.EVENTS: [event("e1", "Scheduled", "Pod", tf, "2026-12-01T10:00:00Z"),
                                       event("e2", "Pulled", "Pod", "kubelet", "2026-12-01T10:01:00Z"),
                                       event("e3", "GPUUnhealthy", "GPU", "tensor-fusion-operator",
                                             "2026-12-01T10:02:00Z", "Warning")]})
    page = views.event_page(events, views.EventFilters())
    assert [e.reason for e in page.rows] == ["GPUUnhealthy", "Scheduled"] and page.kinds == ("GPU", "Pod")
    assert [e.reason for e in views.event_page(events, views.EventFilters(type="Warning")).rows] == ["GPUUnhealthy"]
    assert [e.reason for e in views.event_page(events, views.EventFilters(text="schedul")).rows] == ["Scheduled"]


def test_formats() -> None:
    assert (views.format_bytes(8 * GIB), views.format_bytes(1536 * 1024 * 1024), views.format_bytes(None)) == \
        ("8 GiB", "1.5 GiB", "-")
    assert (views.format_tflops(1613.0), views.format_tflops(12.25), views.format_money(0.004)) == \
        ("1,613", "12.2", "0.0040")
