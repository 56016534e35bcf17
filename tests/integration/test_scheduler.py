"""The built-in scheduler and the extender, in-process controller against the embedded API server
over real HTTP: a worker pod is bound with gpu-ids and shows in /api/allocation; node checks keep a
pod off a tainted node; a pod that cannot fit gets the condition, one FailedScheduling event (not
a storm) and a suggestion that, applied, makes it fit; `/api/why` and `tfusion why`; the extender's
filter, prioritize and bind in the real wire format for both cache modes; a failed Binding rolls
the reservation back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.controller import controllers, create_gpu, create_pool, kube_client, settings_for, start_controller
from tests.helpers.scheduler import (
    bound,
    create_node,
    events_for,
    gpu_pod,
    one_gpu_node,
    scheduled_condition,
    scheduler_of,
)
from tfusion.allocator.scoring import Weights
from tfusion.api import annotations as tfa
from tfusion.controller.reconcilers.common import FINALIZER
from tfusion.errors import RoleError
from tfusion.kube import resources as r

pytestmark = pytest.mark.anyio


async def test_worker_pod_is_bound_with_gpu_ids_and_shows_in_allocation(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await one_gpu_node(kube)
        await kube.patch(r.GPUS, "gpu-a1", {"status": {"isolationMode": "hard"}}, subresource="status")
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path))
            await kube.create(r.PODS, gpu_pod("w1", extra={tfa.ISOLATION: "hard", tfa.TFLOPS_LIMIT: "25"}))
            pod = await eventually(lambda: bound(kube, "w1"), what="w1 bound")
            notes = pod["metadata"]["annotations"]
            assert pod["spec"]["nodeName"] == "node-a"
            assert notes[tfa.GPU_IDS] == "gpu-a1"
            assert json.loads(notes[tfa.CONTAINER_GPUS]) == {"main": ["gpu-a1"]}
            assert notes[tfa.EFFECTIVE_HARD_SM_PERCENT] == "25"  # 25 of 100 TFLOPS
            assert tfa.INDEX not in notes  # the pod asks for no index resource (test_scheduler_index.py)

            async def in_allocation() -> Any:
                view = (await ctl.http.get("/api/allocation")).json()
                return view["nodeWorkerStore"].get("node-a", {}).get("default/w1")

            await eventually(in_allocation, what="w1 in /api/allocation")
            service = ctl.service
            assert service.allocator is not None
            info = service.allocator.allocation(pod["metadata"]["uid"])
            assert info is not None and not info.assumed  # committed
            await eventually(lambda: events_for(kube, "w1", "Scheduled"), what="w1's Scheduled event")
            lean = scheduler_of(ctl).client.lean
            # the controller's requests, the Binding among them, went over the lean transport; none
            # had to go through kr8s (only a 401 hands one back)
            assert lean is not None and lean.sent > 0 and lean.handed_back == 0


async def test_node_checks_keep_a_pod_off_a_tainted_node(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await create_pool(kube)
        await create_node(kube, "node-a", taints=[{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}])
        await create_node(kube, "node-b", cpu="1")
        await create_gpu(kube, "gpu-a1", "node-a", tflops="200")  # the roomier GPU: scored first
        await create_gpu(kube, "gpu-b1", "node-b")
        async with controllers() as tg:
            await start_controller(tg, settings_for(apiserver, tmp_path))
            await kube.create(r.PODS, gpu_pod("w1", cpu="500m"))
            pod = await eventually(lambda: bound(kube, "w1"), what="w1 bound")
            assert pod["spec"]["nodeName"] == "node-b"
            # node-b has 1 CPU, 500m taken: a second such pod is refused there for CPU, on node-a for the taint
            await kube.create(r.PODS, gpu_pod("w2", cpu="600m"))
            condition = await eventually(lambda: scheduled_condition(kube, "w2"), what="w2 condition")
            assert condition["reason"] == "Unschedulable"
            assert condition["message"] == ("0/2 nodes are available: 1 Insufficient cpu, "
                                            "1 node(s) had untolerated taint {dedicated: ml}.")
            toleration = {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
            w3 = gpu_pod("w3", cpu="600m")
            w3["spec"]["tolerations"] = [toleration]
            await kube.create(r.PODS, w3)
            pod = await eventually(lambda: bound(kube, "w3"), what="w3 bound")
            assert pod["spec"]["nodeName"] == "node-a"


async def test_unschedulable_pod_explains_itself_and_the_suggestion_makes_it_fit(
        apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await one_gpu_node(kube, vram="40Gi")
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path))
            await kube.create(r.PODS, gpu_pod("big", vram="48Gi"))
            condition = await eventually(lambda: scheduled_condition(kube, "big"), what="condition")
            assert condition["message"] == "0/1 nodes are available: 1 GPU VRAM too small."

            why = (await ctl.http.get("/api/why", params={"namespace": "default", "name": "big"})).json()
            assert why["scheduled"] is False and why["message"] == condition["message"]
            reason = why["nodes"]["node-a"]["reasons"][0]
            assert (reason["gpu"], reason["resource"], reason["requested"], reason["available"]) == \
                ("gpu-a1", "vram", "48Gi", "40Gi")
            smaller = [s for s in why["suggestions"] if s["kind"] == "smaller-request"]
            assert smaller and smaller[0]["changes"] == {tfa.VRAM_REQUEST: "40Gi"}

            # retried on events and backoff: still one event, not a storm
            scheduler = scheduler_of(ctl)
            for _ in range(5):
                assert scheduler.queue is not None
                scheduler.queue.move_all()
                await anyio.sleep(0.1)
            await ctl.runtime.events.drain()
            events = await events_for(kube, "big", "FailedScheduling")
            assert len(events) == 1 and events[0]["message"] == condition["message"]

            # apply the suggestion: the same pod with the suggested annotation (a new name: the
            # old one keeps its finalizer while it is deleted)
            await kube.delete(r.PODS, "big", namespace="default")
            await kube.create(r.PODS, gpu_pod("big-2", vram=smaller[0]["changes"][tfa.VRAM_REQUEST]))
            pod = await eventually(lambda: bound(kube, "big-2"), what="big-2 bound after the suggestion")
            assert pod["metadata"]["annotations"][tfa.GPU_IDS] == "gpu-a1"


async def test_why_route_answers_404_for_a_missing_pod_and_tfusion_why_prints(
        apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await one_gpu_node(kube, vram="40Gi")
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path))
            assert (await ctl.http.get("/api/why", params={"name": "nope"})).status_code == 404
            await kube.create(r.PODS, gpu_pod("big", vram="48Gi"))
            await eventually(lambda: scheduled_condition(kube, "big"), what="condition")
            assert ctl.runtime.address is not None
            url = f"http://127.0.0.1:{ctl.runtime.address[1]}"

            def why(*args: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run([sys.executable, "-m", "tfusion", "why", "--kube", str(apiserver.kubeconfig),
                                       "--controller", url, *args], capture_output=True, text=True, timeout=60)

            text = await anyio.to_thread.run_sync(lambda: why("-n", "default", "big"))
            assert text.returncode == 0, text.stderr
            assert "Pod default/big is Pending and not scheduled" in text.stdout
            assert "Why: 0/1 nodes are available: 1 GPU VRAM too small." in text.stdout
            node_line = next(line for line in text.stdout.splitlines() if line.startswith("  node-a: "))
            assert "gpu-a1" in node_line and "40Gi" in node_line and "48Gi" in node_line, text.stdout
            assert f"set {tfa.VRAM_REQUEST}=40Gi on the pod" in text.stdout
            as_json = await anyio.to_thread.run_sync(lambda: why("big", "-o", "json"))
            body = json.loads(as_json.stdout)
            assert body["condition"]["reason"] == "Unschedulable"
            assert body["explanation"]["suggestions"][0]["changes"] == {tfa.VRAM_REQUEST: "40Gi"}
            missing = await anyio.to_thread.run_sync(lambda: why("-n", "default", "ghost"))
            assert missing.returncode == 1
            assert missing.stderr.strip() == "tfusion why: pod default/ghost not found"
            await ctl.stop()
            # the controller gone: the condition alone, and a line saying so
            alone = await anyio.to_thread.run_sync(lambda: why("big"))
            assert alone.returncode == 0
            assert "Why: 0/1 nodes are available: 1 GPU VRAM too small." in alone.stdout
            assert "did not answer" in alone.stdout


async def test_failed_binding_rolls_the_reservation_back(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await one_gpu_node(kube)
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path, scheduler="extender"))
            scheduler = scheduler_of(ctl)
            await eventually(lambda: _ready(ctl), what="leader ready")
            created = await kube.create(r.PODS, gpu_pod("w1", scheduler="default-scheduler"))
            await kube.request("POST", r.PODS, path="w1/binding", namespace="default", body={
                "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "w1"},
                "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"}})  # bound by someone else
            body = {"PodName": "w1", "PodNamespace": "default", "PodUID": created["metadata"]["uid"],
                    "Node": "node-a"}
            answer = (await ctl.http.post("/scheduler/bind", json=body)).json()
            assert "bound" in answer["Error"] or "already assigned" in answer["Error"]
            allocator = ctl.service.allocator
            assert allocator is not None and allocator.allocations() == {}

            async def counted_once() -> bool:  # usage is keyed by pod UID, so it never counts w1 twice
                return scheduler.usage.used("node-a").pods == 1

            # the pod someone else bound, once: the pod feed may show the foreign Binding only now
            await eventually(counted_once, what="w1 counted on node-a from the pod feed")


async def _ready(ctl: Any) -> bool:
    return ctl.service.allocator is not None


async def test_extender_wire_format_in_both_cache_modes(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await create_pool(kube)
        for node in ("node-a", "node-b"):
            await create_node(kube, node)
        await create_gpu(kube, "gpu-a1", "node-a", vram="40Gi")
        await create_gpu(kube, "gpu-b1", "node-b", vram="80Gi")
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path, scheduler="extender"))
            await eventually(lambda: _ready(ctl), what="leader ready")
            assert scheduler_of(ctl).queue is None  # the built-in loop does not run
            pod = await kube.create(r.PODS, gpu_pod("w1", vram="48Gi", scheduler="default-scheduler"))
            node_list = {"apiVersion": "v1", "kind": "NodeList", "metadata": {},
                         "items": [await kube.get(r.NODES, n) for n in ("node-a", "node-b", "node-c")
                                   if n != "node-c"] + [{"metadata": {"name": "node-c"}}]}
            names = ["node-a", "node-b", "node-c"]

            cached = (await ctl.http.post("/scheduler/filter", json={"Pod": pod, "Nodes": None,
                                                                      "NodeNames": names})).json()
            assert cached["NodeNames"] == ["node-b"] and cached["Nodes"] is None
            assert cached["FailedNodes"] == {"node-a": "GPU VRAM too small"}
            assert cached["FailedAndUnresolvableNodes"] == {"node-c": "node has no GPU of the requested pool"}
            assert cached["Error"] == ""
            full = (await ctl.http.post("/scheduler/filter", json={"Pod": pod, "Nodes": node_list,
                                                                    "NodeNames": None})).json()
            assert full["NodeNames"] is None
            assert [n["metadata"]["name"] for n in full["Nodes"]["items"]] == ["node-b"]
            assert full["Nodes"]["items"][0]["status"]["allocatable"]["cpu"] == "8"  # items come back whole
            allocator = ctl.service.allocator
            assert allocator is not None and allocator.allocations() == {}  # filter reserves nothing

            scores = (await ctl.http.post("/scheduler/prioritize", json={"Pod": pod, "NodeNames": names})).json()
            assert {s["Host"] for s in scores} == set(names)
            assert all(0 <= s["Score"] <= 10 for s in scores)

            bad = {"PodName": "w1", "PodNamespace": "default", "PodUID": "not-the-uid", "Node": "node-b"}
            assert "UID" in (await ctl.http.post("/scheduler/bind", json=bad)).json()["Error"]
            refused = {**bad, "PodUID": pod["metadata"]["uid"], "Node": "node-a"}
            assert "cannot reserve" in (await ctl.http.post("/scheduler/bind", json=refused)).json()["Error"]
            ok = {**refused, "Node": "node-b"}
            assert (await ctl.http.post("/scheduler/bind", json=ok)).json() == {"Error": ""}
            placed = await kube.get(r.PODS, "w1", namespace="default")
            assert placed["spec"]["nodeName"] == "node-b"
            assert placed["metadata"]["annotations"][tfa.GPU_IDS] == "gpu-b1"
            info = allocator.allocation(pod["metadata"]["uid"])
            assert info is not None and not info.assumed

            # a pod asking for no GPUs passes every node
            plain = {"metadata": {"name": "plain", "namespace": "default", "uid": "u-plain"},
                     "spec": {"containers": [{"name": "c", "image": "x"}]}}
            answer = (await ctl.http.post("/scheduler/filter", json={"Pod": plain, "NodeNames": names})).json()
            assert answer["NodeNames"] == names
            # bad body: 400 naming the field
            response = await ctl.http.post("/scheduler/bind", json={"PodName": "w1"})
            assert response.status_code == 400


async def test_extender_routes_refuse_while_the_builtin_scheduler_binds(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with controllers() as tg:
        ctl = await start_controller(tg, settings_for(apiserver, tmp_path))
        response = await ctl.http.post("/scheduler/filter", json={"Pod": {}, "NodeNames": []})
        assert response.status_code == 409
        assert "--scheduler=extender" in response.json()["error"]


async def test_enable_scheduler_false_attaches_no_scheduler(apiserver: Any, tmp_path: Path) -> None:
    # It hung twice in CI under load (pytest-timeout's dump shows no task): bounded here, a hang
    # fails with the traceback of the await that never returned.
    with anyio.fail_after(60):
        await apply_crds(apiserver)
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path, enable_scheduler=False))
            assert ctl.runtime.scheduler is None
            tasks = ctl.runtime.leader_tasks
            assert not any(getattr(t, "__qualname__", "") == "Scheduler.run_leader" for t in tasks)
            assert (await ctl.http.post("/scheduler/filter", json={"Pod": {}})).status_code == 404
            assert (await ctl.http.get("/api/why", params={"name": "x"})).status_code == 404


async def test_enable_cr_controller_false_runs_no_reconciler_but_still_schedules(apiserver: Any,
                                                                                 tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await one_gpu_node(kube)
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path, enable_cr_controller=False))
            assert ctl.runtime.reconcilers is None
            await kube.create(r.PODS, gpu_pod("w1"))
            pod = await eventually(lambda: bound(kube, "w1"), what="w1 bound by the scheduler")
            assert pod["metadata"]["annotations"][tfa.GPU_IDS] == "gpu-a1"
            # the pod reconciler, which puts the finalizer on worker pods, does not run: the bound
            # pod, written after every informer saw it, has none
            assert FINALIZER not in (pod["metadata"].get("finalizers") or [])
            metrics = (await ctl.http.get("/metrics")).text
            assert 'tfusion_reconcile_total{name="pod"' not in metrics and 'name="node"' not in metrics


async def test_the_scheduler_config_file_sets_the_gpu_plugin_args(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    path = tmp_path / "scheduler-config.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "kubescheduler.config.k8s.io/v1",
                                    "kind": "KubeSchedulerConfiguration", "profiles": [{
                                        "schedulerName": "tensor-fusion-scheduler", "pluginConfig": [{
                                            "name": "GPUResourcesFit", "args": {
                                                "maxWorkerPerNode": 1, "vramWeight": 0.2, "tflopsWeight": 0.8}}]}]}))
    async with kube_client(apiserver) as kube:
        await one_gpu_node(kube)
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path, scheduler_config=str(path)))
            await kube.create(r.PODS, gpu_pod("w1"))
            await eventually(lambda: bound(kube, "w1"), what="w1 bound")
            allocator = ctl.service.allocator
            assert allocator is not None
            assert (allocator.max_workers_per_node, allocator.weights) == (1, Weights(vram=0.2, tflops=0.8))
            # one worker per node, as the file says: the second pod waits, and says why
            await kube.create(r.PODS, gpu_pod("w2"))
            condition = await eventually(lambda: scheduled_condition(kube, "w2"), what="w2 refused")
            assert condition["reason"] == "Unschedulable"
            assert condition["message"] == "0/1 nodes are available: 1 too many GPU workers on the node."
        async with controllers() as tg:  # the flag wins over the file
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path / "again", scheduler_config=str(path),
                                                          max_workers_per_node=5))
            await eventually(lambda: _ready(ctl), what="the allocator ready")
            assert ctl.service.allocator is not None and ctl.service.allocator.max_workers_per_node == 5


async def test_a_bad_scheduler_config_stops_the_start(apiserver: Any, tmp_path: Path) -> None:
    path = tmp_path / "scheduler-config.yaml"
    path.write_text("kind: KubeSchedulerConfiguration\nprofiles: [{pluginConfig: [{name: GPUResourcesFit, "
                    "args: {maxWorkerPerNode: -3}}]}]\n")
    async with controllers() as tg:
        with pytest.raises(RoleError, match=r"controller: .*config.yaml: GPUResourcesFit maxWorkerPerNode -3"):
            await start_controller(tg, settings_for(apiserver, tmp_path, scheduler_config=str(path)))
