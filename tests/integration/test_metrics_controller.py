"""The controller's metrics recorder in-process against the embedded API server: the six tables with
their tags and fields in the metrics file, raw_cost of a worker with known pricing over known
intervals (the recorder's wall clock is set by the test) against a hand computation, a worker
deleted mid-interval billed once, up to its deletion, and the Prometheus families on /metrics."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.apiserver_fixture import apply_crds
from tests.helpers import Clock, eventually
from tests.helpers.controller import POOL, controllers, create_gpu, kube_client, settings_for, start_controller, worker
from tfusion.api import annotations as tfa
from tfusion.controller.metrics import TABLES, ControllerRecorder
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient
from tfusion.metrics.points import Point
from tfusion.metrics.prometheus import Snapshot

pytestmark = pytest.mark.anyio

GIB = 1024 ** 3
#: medium QoS: $0.36 per TFLOPS-hour = 0.0001/s, $0.72 per GiB-hour = 0.0002/s, limits over requests at half price
PRICING = {"evictionProtectionPriceRatio": "1.5", "pricing": [
    {"qos": "medium", "requests": {"perFP16TFlopsPerHour": "$0.36", "perGBOfVRAMPerHour": "$0.72"},
     "limitsOverRequests": "0.5"}]}
#: per GPU per second: 10 TFLOPS * 0.0001 + 4 GiB * 0.0002 + 10 TFLOPS over * 0.00005 + 4 GiB over * 0.0001
WORKER_RATE_PER_GPU = 0.001 + 0.0008 + 0.0005 + 0.0004
A100_PER_HOUR = 1.8


async def _cluster(kube: KubeClient) -> None:
    await kube.create(r.GPUPOOLS, {"metadata": {"name": POOL}, "spec": {"nodeManagerConfig": {},
                                                                         "qosConfig": PRICING}})
    await kube.create(r.PROVIDERCONFIGS, {"metadata": {"name": "nvidia"}, "spec": {
        "vendor": "NVIDIA", "images": {"middleware": "m"},
        "hardwareMetadata": [{"model": "A100_SXM_40G", "fullModelName": "NVIDIA A100-SXM4-40GB",
                              "fp16TFlops": "100", "costPerHour": f"${A100_PER_HOUR}"}]}})
    await kube.create(r.GPUNODES, {"metadata": {"name": "node-a", "labels": {tfa.MANAGED_BY: POOL}}, "spec": {}})
    await create_gpu(kube, "gpu-a1", "node-a", index=0)
    await create_gpu(kube, "gpu-a2", "node-a", index=1)


def _trainer() -> dict[str, Any]:
    pod = worker("trainer", "node-a", ["gpu-a1", "gpu-a2"], tflops="10", vram="4Gi")
    pod["metadata"]["annotations"].update({tfa.TFLOPS_LIMIT: "20", tfa.VRAM_LIMIT: "8Gi"})
    pod["metadata"]["labels"]["team"] = "vision"
    return pod


def _rows(points: list[Point], measure: str) -> list[Point]:
    return [p for p in points if p.measure == measure]


def _check_tables(points: list[Point], uid: str) -> None:
    """Every table, with the original's tags and fields."""
    assert {p.measure for p in points} == set(TABLES)
    (row,) = _rows(points, "tf_worker_resources")
    assert dict(row.tags) == {"namespace": "default", "pool": POOL, "qos": "medium", "worker": "trainer",
                              "workload": "trainer", "team_tag": "vision"}
    assert {k: row.fields[k] for k in row.fields if k != "raw_cost"} == {
        "gpu_count": 2, "tflops_request": 10.0, "tflops_limit": 20.0, "vram_bytes_request": 4 * GIB,
        "vram_bytes_limit": 8 * GIB, "ready": False}
    (node,) = _rows(points, "tf_node_metrics")
    assert node.tags["node"] == "node-a" and node.tags["pool"] == POOL and "phase" in node.tags
    assert set(node.fields) == {"allocated_tflops", "allocated_tflops_percent", "allocated_tflops_percent_virtual",
                                "allocated_vram_bytes", "allocated_vram_percent", "allocated_vram_percent_virtual",
                                "gpu_count", "raw_cost"}
    assert node.fields["allocated_tflops"] == 20.0 and node.fields["gpu_count"] == 2
    assert node.fields["allocated_tflops_percent"] == pytest.approx(10.0)  # 20 of 200 TFLOPS
    assert node.fields["allocated_vram_bytes"] == 8 * GIB
    (pool,) = _rows(points, "tf_pool_metrics")
    assert pool.tags["pool"] == POOL and "phase" in pool.tags
    assert pool.fields["limited_tflops"] == 40.0 and pool.fields["limited_vram_bytes"] == 16 * GIB
    assert set(pool.fields) == {"allocated_tflops", "allocated_tflops_percent", "allocated_tflops_percent_virtual",
                                "allocated_vram_bytes", "allocated_vram_percent", "allocated_vram_percent_virtual",
                                "limited_tflops", "limited_vram_bytes", "limited_tflops_percent_virtual",
                                "limited_vram_percent_virtual", "gpu_count"}
    gpus = {p.tags["gpu"]: p for p in _rows(points, "tf_gpu_metrics")}
    assert sorted(gpus) == ["gpu-a1", "gpu-a2"]
    a1 = gpus["gpu-a1"]
    assert dict(a1.tags) == {"gpu": "gpu-a1", "node": "node-a", "pool": POOL, "gpu_model": "A100_SXM_40G",
                             "phase": "Running"}
    assert a1.fields == {"capacity_tflops": 100.0, "capacity_vram_bytes": 40 * GIB, "available_tflops": 90.0,
                         "available_vram_bytes": 36 * GIB, "allocated_tflops": 10.0, "allocated_vram_bytes": 4 * GIB,
                         "allocated_tflops_percent": 10.0, "allocated_vram_percent": 10.0}
    (allocation,) = _rows(points, "tf_gpu_allocation")
    assert dict(allocation.tags) == {"pod": "trainer", "namespace": "default", "pod_uuid": uid, "node": "node-a",
                                     "gpu_model_index": "A100_SXM_40G:0,A100_SXM_40G:1",
                                     "gpu_name": "gpu-a1,gpu-a2", "team_tag": "vision"}
    assert allocation.fields == {"gpu_count": 2}
    (system,) = _rows(points, "tf_system_metrics")
    assert system.tags == {"pool": POOL}
    assert system.fields["total_workers_cnt"] == 1 and system.fields["total_nodes_cnt"] == 1
    assert {"total_allocation_fail_cnt", "total_allocation_success_cnt", "total_scale_up_cnt",
            "total_scale_down_cnt", "total_topo_satisfied_cnt"} <= set(system.fields)


async def test_tables_cost_and_a_deletion_billed_once(apiserver: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    await apply_crds(apiserver)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"metricsExtraPodLabels": {"team": "team_tag"}}))
    metrics_file = tmp_path / "metrics" / "controller.log"
    # the interval is long: the test records each tick itself, at times it chooses
    settings = settings_for(apiserver, tmp_path, metrics_interval=3600.0, metrics_path=str(metrics_file))
    wall = Clock()
    async with kube_client(apiserver) as kube:
        await _cluster(kube)
        created = await kube.create(r.PODS, _trainer(), namespace="default")
        uid = created["metadata"]["uid"]
        async with controllers() as tg:
            ctl = await start_controller(tg, settings)
            recorder = ctl.runtime.metrics
            assert isinstance(recorder, ControllerRecorder)
            recorder.wall = wall
            await eventually(lambda: _async(uid in recorder.ledger and recorder.allocation.live_count() == 1),
                             what="the recorder tracking the adopted worker")

            wall.now = 1060.0
            first = await recorder.record_once()
            _check_tables(first, uid)
            (row,) = _rows(first, "tf_worker_resources")
            # tracked from 1000 (term start): 60 s on 2 GPUs
            assert row.fields["raw_cost"] == pytest.approx(WORKER_RATE_PER_GPU * 2 * 60)
            assert row.ts_ms == 1060_000
            (node,) = _rows(first, "tf_node_metrics")
            # two A100 at $1.8 an hour, billed from the term's start (1000) too
            assert node.fields["raw_cost"] == pytest.approx(2 * A100_PER_HOUR * 60 / 3600)

            lines = metrics_file.read_text().splitlines()
            assert len(lines) == len(first)
            assert any(line.startswith("tf_worker_resources,namespace=default,pool=pool-a,qos=medium,team_tag=vision,"
                                       "worker=trainer,workload=trainer ") and line.endswith(" 1060000")
                       for line in lines), lines

            # the families are made for the first scrape after the tick, in a worker thread
            assert recorder.snapshot.baked is None, "families made at the tick, with nobody scraping"
            baked_on: list[str] = []
            real_bake = Snapshot.bake

            def bake(snapshot: Snapshot) -> Snapshot:
                baked_on.append(threading.current_thread().name)
                return real_bake(snapshot)

            monkeypatch.setattr(Snapshot, "bake", bake)
            metrics = (await ctl.http.get("/metrics")).text
            assert recorder.snapshot.baked is not None and len(baked_on) == 1
            assert baked_on[0] != threading.current_thread().name, "baked on the event loop"
            await ctl.http.get("/metrics")
            assert len(baked_on) == 1, "a second scrape of the same tick made the families again"
            labels = f'namespace="default",pod="trainer",pool="{POOL}",qos="medium",workload="trainer"'
            assert f"tfusion_worker_tflops_limit{{{labels}}} 20.0" in metrics
            assert f"tfusion_worker_cost_total{{{labels}}} " in metrics
            assert 'tfusion_gpu_allocated_vram_ratio{gpu="gpu-a1",model="A100_SXM_40G",node="node-a",' \
                   f'pool="{POOL}"}} 0.1' in metrics
            assert "pod_uuid" not in metrics and uid not in metrics

            # deleted at 1090, mid-interval
            wall.now = 1090.0
            await kube.delete(r.PODS, "trainer", namespace="default")
            await eventually(lambda: _async(recorder.ledger.is_ended(uid)), what="the recorder seeing the deletion")
            wall.now = 1120.0
            second = await recorder.record_once()
            (row,) = _rows(second, "tf_worker_resources")
            assert row.fields["raw_cost"] == pytest.approx(WORKER_RATE_PER_GPU * 2 * 30), "billed up to 1090"
            assert row.fields["ready"] is False
            assert not _rows(second, "tf_gpu_allocation")
            (node,) = _rows(second, "tf_node_metrics")
            assert node.fields["raw_cost"] == pytest.approx(2 * A100_PER_HOUR * 60 / 3600)

            wall.now = 1180.0
            third = await recorder.record_once()
            assert not _rows(third, "tf_worker_resources"), "billed once: no row after its last"
            metrics = (await ctl.http.get("/metrics")).text
            assert 'pod="trainer"' not in metrics


async def _async(value: Any) -> Any:
    return value


async def test_the_recommendation_is_written_beside_the_request_with_its_cost(apiserver: Any, tmp_path: Path) -> None:
    """A workload's status.recommendation (the autoscaler's) goes into each of its workers' rows, with
    what the worker would have cost at it over the same interval, so cost before and after can be compared."""
    await apply_crds(apiserver)
    settings = settings_for(apiserver, tmp_path, metrics_interval=3600.0,
                            metrics_path=str(tmp_path / "metrics" / "controller.log"))
    wall = Clock()
    async with kube_client(apiserver) as kube:
        await _cluster(kube)
        await kube.create(r.TENSORFUSIONWORKLOADS, {"metadata": {"name": "trainer"}, "spec": {}}, namespace="default")
        await kube.patch(r.TENSORFUSIONWORKLOADS, "trainer", {"status": {"workerCount": 1, "recommendation": {
            "requests": {"tflops": "5", "vram": "2Gi"}, "limits": {"tflops": "10", "vram": "4Gi"}}}},
            namespace="default", subresource="status")
        uid = (await kube.create(r.PODS, _trainer(), namespace="default"))["metadata"]["uid"]
        async with controllers() as tg:
            ctl = await start_controller(tg, settings)
            recorder = ctl.runtime.metrics
            assert isinstance(recorder, ControllerRecorder)
            recorder.wall = wall
            workloads = ctl.runtime.informer(r.TENSORFUSIONWORKLOADS)
            await eventually(lambda: _async(uid in recorder.ledger and "recommendation" in
                                            (workloads.get("default/trainer") or {}).get("status", {})),
                             what="the recorder tracking the worker and the workload's recommendation cached")
            wall.now = 1060.0
            (row,) = _rows(await recorder.record_once(), "tf_worker_resources")
            assert row.fields["tflops_request"] == 10.0 and row.fields["tflops_recommended"] == 5.0
            assert row.fields["vram_bytes_recommended"] == 2 * GIB
            # per GPU per second at the recommendation: 5 * 0.0001 + 2 * 0.0002 + 5 over * 0.00005 + 2 over * 0.0001
            assert row.fields["raw_cost_recommended"] == pytest.approx((0.0005 + 0.0004 + 0.00025 + 0.0002) * 2 * 60)
            assert row.fields["raw_cost"] == pytest.approx(WORKER_RATE_PER_GPU * 2 * 60)
            metrics = (await ctl.http.get("/metrics")).text
            assert 'tfusion_worker_tflops_recommended{namespace="default",pod="trainer"' in metrics
