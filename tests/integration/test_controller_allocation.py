"""The controller's AllocatorService and its HTTP routes, in-process against the embedded API server
over real HTTP: feeding from the informers, /api/allocation, /api/simulate-schedule (fit, no fit,
bad bodies, no side effects), leader recovery from worker pods' gpu-ids annotations, status
write-back of GPUs, GPUNodes and quotas, release on pod deletion and completion, capacity changes
applied as deltas, retry on a real 409 Conflict, leader hand-over, and the orphan sweep."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.controller import (
    POOL,
    controllers,
    create_gpu,
    create_pool,
    gpu_available,
    kube_client,
    probe_pod,
    settings_for,
    start_controller,
    worker,
)
from tests.helpers.leases import steal_lease
from tfusion.allocator import request_from_pod
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod
from tfusion.controller.allocation import AllocatorService
from tfusion.controller.role import ControllerRole, configure
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient
from tfusion.kube.leader import LEASE_NAME

pytestmark = pytest.mark.anyio


# --- objects -------------------------------------------------------------------------------------


async def create_quota(kube: KubeClient, namespace: str = "default") -> None:
    await kube.create(r.GPURESOURCEQUOTAS, {"metadata": {"name": "budget", "namespace": namespace}, "spec": {
        "total": {"requests": {"tflops": "400", "vram": "100Gi"}, "limits": {"tflops": "800", "vram": "200Gi"},
                  "maxWorkers": 10}}})


async def readiness(http: httpx.AsyncClient) -> dict[str, tuple[bool, str]]:
    body = (await http.get("/readyz")).json()
    return {c["name"]: (c["ready"], c["message"]) for c in body["conditions"]}


# --- tests ---------------------------------------------------------------------------------------


async def test_allocation_view_and_simulate_schedule(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await create_pool(kube, mode="CompactFirst", oversubscription={"tflopsOversellRatio": 300})
        await create_gpu(kube, "gpu-a1", "node-a", index=0)
        await create_gpu(kube, "gpu-a2", "node-a", index=1)
        await create_gpu(kube, "gpu-b1", "node-b", tflops="200", vram="80Gi", model="H100_SXM")
        await create_quota(kube)

        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path))
            service, http = ctl.service, ctl.http

            async def fed() -> Any:
                body = (await http.get("/api/allocation")).json()
                return body if len(body["gpuStore"]) == 3 else None

            view = await eventually(fed, what="three GPUs in /api/allocation")
            assert set(view) == {"gpuStore", "nodeWorkerStore", "allocation", "gpuToWorkerMap"}
            assert sorted(view["gpuStore"]) == ["gpu-a1", "gpu-a2", "gpu-b1"], "plain names, no '/' prefix"
            b1 = view["gpuStore"]["gpu-b1"]["status"]
            assert b1["capacity"] == {"tflops": "200", "vram": "80Gi"} and b1["available"] == b1["capacity"]
            assert b1["nodeSelector"] == {"kubernetes.io/hostname": "node-b"}
            assert view["allocation"] == {} and view["nodeWorkerStore"] == {} and view["gpuToWorkerMap"] == {}
            assert (await readiness(http))["allocator"][0] is True
            allocator = service.allocator
            assert allocator is not None
            assert allocator.pool_config(POOL).placement_mode == "CompactFirst", "mode from the template"
            assert allocator.pool_config(POOL).tflops_oversell_ratio == 300, "oversubscription from the pool"
            before = allocator.snapshot()

            # a pod that fits: JSON body, with a Content-Type that is not JSON
            fit = await http.post("/api/simulate-schedule", content=json.dumps(probe_pod()),
                                  headers={"Content-Type": "text/plain"})
            assert fit.status_code == 200, fit.text
            body = fit.json()
            assert body["error"] is None
            result = body["scheduleResult"]
            assert result["SuggestedHost"] in ("node-a", "node-b")
            assert result["EvaluatedNodes"] == 2 and result["FeasibleNodes"] == 2
            stages = body["filterDetail"]["FilterStageDetails"]
            resource = next(s for s in stages if s["FilterName"] == "ResourceFilter")
            assert sorted(resource["After"]) == ["gpu-a1", "gpu-a2", "gpu-b1"] and resource["Diff"] == 0
            assert body["gpuSchedulerState"]["ScoringStrategy"] == "CompactFirst"
            assert len(body["gpuSchedulerState"]["FinalGPUs"]) == 1

            # a pod that fits only the big GPU: YAML body, the trail says who was removed and why
            big = await http.post("/api/simulate-schedule", content=yaml.safe_dump(probe_pod(vram="60Gi")),
                                  headers={"Content-Type": "application/yaml"})
            assert big.status_code == 200, big.text
            body = big.json()
            assert body["scheduleResult"]["SuggestedHost"] == "node-b" and body["error"] is None
            resource = next(s for s in body["filterDetail"]["FilterStageDetails"]
                            if s["FilterName"] == "ResourceFilter")
            assert resource["After"] == ["gpu-b1"] and resource["Diff"] == 2
            removed = {x["gpu"]: x["reason"] for x in resource["Removed"]}
            assert removed["gpu-a1"] == "gpu-a1: VRAM available 40Gi < requested 60Gi"

            # a pod that fits nowhere: per-node reasons
            none = await http.post("/api/simulate-schedule", content=yaml.safe_dump(probe_pod(vram="100Gi")))
            assert none.status_code == 200, none.text
            body = none.json()
            assert body["scheduleResult"]["SuggestedHost"] == "" and body["scheduleResult"]["FeasibleNodes"] == 0
            error = body["error"]
            assert error["type"] == "FitError" and error["numAllNodes"] == 2
            nodes = error["diagnosis"]["nodeToStatus"]["nodes"]
            assert sorted(nodes) == ["node-a", "node-b"]
            assert any("VRAM available 80Gi < requested 100Gi" in reason for reason in nodes["node-b"]["reasons"])
            assert all(n["code"] == "Unschedulable" for n in nodes.values())

            # over the namespace quota (requests.vram 100Gi total): the quota says so
            quota = await http.post("/api/simulate-schedule", content=json.dumps(probe_pod(vram="101Gi")))
            assert quota.status_code == 200
            assert "total.max.vram.request" in quota.json()["error"]["message"]

            # the caller's mistakes
            for content, needle in ((b"", "empty"), (b"{not json: [", "neither JSON nor YAML"),
                                    (b"- just\n- a list\n", "must be a Pod manifest"),
                                    (json.dumps({"kind": "Deployment", "spec": {}}).encode(), "kind"),
                                    (json.dumps({"kind": "Pod", "metadata": {"name": "x"}}).encode(), "spec"),
                                    (b"\xff\xfe\x00garbage", "UTF-8")):
                bad = await http.post("/api/simulate-schedule", content=content)
                assert bad.status_code == 400, (content, bad.text)
                assert needle in bad.json()["error"], (content, bad.json())
            no_pool = probe_pod()
            del no_pool["metadata"]["annotations"][tfa.GPU_POOL]
            bad = await http.post("/api/simulate-schedule", content=json.dumps(no_pool))
            assert bad.status_code == 400 and tfa.GPU_POOL in bad.json()["error"]
            bad_vram = probe_pod(vram="lots")
            bad = await http.post("/api/simulate-schedule", content=json.dumps(bad_vram))
            assert bad.status_code == 400 and tfa.VRAM_REQUEST in bad.json()["error"]
            wrong = await http.post("/api/simulate-schedule",
                                    content=json.dumps(probe_pod(scheduler="default-scheduler")))
            assert wrong.status_code == 400 and wrong.json()["field"] == "spec.schedulerName", wrong.text
            assert "'default-scheduler' is not allowed; expected 'tensor-fusion-scheduler'" in wrong.json()["error"]

            # no side effects
            assert service.allocator is allocator and allocator.snapshot() == before
            assert (await http.get("/api/allocation")).json() == view

            metrics = (await http.get("/metrics")).text
            assert "tfusion_allocator_live_allocations 0.0" in metrics
            assert "tfusion_allocator_dirty_gpus 0.0" in metrics

            async def gpu_status_reconciled() -> bool:  # the reconciler's own task, after recovery
                text = (await http.get("/metrics")).text
                return 'tfusion_reconcile_total{name="gpu-status",result="success"}' in text

            await eventually(gpu_status_reconciled, what="a successful gpu-status reconcile in /metrics")

            # changes flow in from the informers: template mode, quota spec, GPU deletion
            template = await kube.get(r.SCHEDULINGCONFIGTEMPLATES, "placement")
            template["spec"]["placement"]["mode"] = "LowLoadFirst"
            await kube.replace(r.SCHEDULINGCONFIGTEMPLATES, template)
            await kube.patch(r.GPURESOURCEQUOTAS, "budget", {"spec": {"total": {"requests": {"vram": "1000Gi"},
                                                                                "limits": {"vram": "2000Gi"}}}},
                             namespace="default")
            await kube.delete(r.GPUS, "gpu-a2")

            async def changed() -> Any:
                body = (await http.post("/api/simulate-schedule", content=json.dumps(probe_pod(vram="101Gi")))).json()
                return body if body["gpuSchedulerState"]["ScoringStrategy"] == "LowLoadFirst" and \
                    "ResourceFilter" in body["error"]["message"] and \
                    len((await http.get("/api/allocation")).json()["gpuStore"]) == 2 else None

            body = await eventually(changed, what="template, quota and GPU changes applied")
            assert sorted(body["error"]["diagnosis"]["nodeToStatus"]["nodes"]) == ["node-a", "node-b"]


class RacingClient(KubeClient):
    """A real client that, on its first GPU status patch, lets another writer change the GPU first,
    so that the patch (on the resourceVersion the controller read) meets a genuine 409 Conflict from
    the API server."""

    def __init__(self, api: Any, rival: KubeClient) -> None:
        super().__init__(api)
        self.rival = rival
        self.raced: list[str] = []

    async def patch(self, resource: r.ApiResource, name: str, patch: Any, *, namespace: str | None = None,
                    patch_type: str = "merge", subresource: str | None = None,
                    field_manager: str | None = None, force: bool = False) -> dict[str, Any]:
        if resource == r.GPUS and subresource == "status" and not self.raced:
            self.raced.append(name)
            await self.rival.patch(r.GPUS, name, {"metadata": {"labels": {"touched-by": "rival"}}})
        return await super().patch(resource, name, patch, namespace=namespace, patch_type=patch_type,
                                   subresource=subresource, field_manager=field_manager, force=force)


async def test_recovery_status_writeback_release_and_handover(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await create_pool(kube)
        await kube.create(r.GPUNODES, {"metadata": {"name": "node-a"}, "spec": {"manageMode": "AutoSelect"}})
        await create_gpu(kube, "gpu-a1", "node-a", index=0)
        await create_gpu(kube, "gpu-a2", "node-a", index=1)
        await create_gpu(kube, "gpu-b1", "node-b")
        await create_quota(kube)
        # worker pods as the scheduler leaves them: bound, with gpu-ids and the request annotations
        p1 = await kube.create(r.PODS, worker("p1", "node-a", ["gpu-a1"], tflops="20", vram="4Gi"))
        p2 = await kube.create(r.PODS, worker("p2", "node-a", ["gpu-a1", "gpu-a2"], tflops="10", vram="2Gi"))
        p3 = await kube.create(r.PODS, worker("p3", "node-b", ["gpu-b1"], tflops="30", vram="8Gi"))
        await kube.create(r.PODS, worker("done", "node-b", ["gpu-b1"], tflops="50", vram="10Gi"))
        await kube.patch(r.PODS, "done", {"status": {"phase": "Succeeded"}}, subresource="status")
        await kube.create(r.PODS, worker("unbound", None, ["gpu-b1"], tflops="50", vram="10Gi"))
        await kube.create(r.PODS, worker("client", "node-b", ["gpu-b1"], tflops="50", vram="10Gi",
                                         component="client"))

        def racing(runtime: ControllerRole) -> None:
            runtime.client = RacingClient(runtime.client.api, kube)
            configure(runtime)

        settings = settings_for(apiserver, tmp_path, leader_elect=True, pod_name="leader-1")
        async with controllers() as tg:
            leader = await start_controller(tg, settings, prepare=racing)
            service, http = leader.service, leader.http

            async def recovered() -> Any:
                body = (await http.get("/api/allocation")).json()
                return body if len(body["allocation"]) == 3 else None

            view = await eventually(recovered, what="three recovered allocations")
            assert leader.runtime.is_leader
            assert sorted(service.recovered) == sorted(p["metadata"]["uid"] for p in (p1, p2, p3))
            assert view["nodeWorkerStore"] == {"node-a": {"default/p1": True, "default/p2": True},
                                               "node-b": {"default/p3": True}}
            assert sorted(w["podName"] for w in view["gpuToWorkerMap"]["gpu-a1"]) == ["p1", "p2"]
            assert view["allocation"][p2["metadata"]["uid"]]["GPUNames"] == ["gpu-a1", "gpu-a2"]
            assert (await readiness(http))["allocator"] == (True, "leader: recovered 3 allocation(s) on 3 GPU(s)")

            # written back: capacity minus the requests of the live workers
            expected = {"gpu-a1": {"tflops": "70", "vram": "34Gi"}, "gpu-a2": {"tflops": "90", "vram": "38Gi"},
                        "gpu-b1": {"tflops": "70", "vram": "32Gi"}}

            async def written() -> bool:
                return all([await gpu_available(kube, n) == v for n, v in expected.items()])

            await eventually(written, what="GPU status.available written back")
            a1 = await kube.get(r.GPUS, "gpu-a1")
            apps = {app["name"]: app for app in a1["status"]["runningApps"]}
            assert sorted(apps) == ["p1", "p2"] and apps["p1"]["pods"][0]["uid"] == p1["metadata"]["uid"]
            assert apps["p1"]["pods"][0]["requests"] == {"tflops": "20", "vram": "4Gi"}
            assert a1["status"]["capacity"] == {"tflops": "100", "vram": "40Gi"}, "hypervisor fields kept"
            # the first status patch met a real 409 (another writer got in between) and was retried
            # on the object read again: both the rival's change and our status are there
            client = leader.runtime.client
            assert isinstance(client, RacingClient) and len(client.raced) == 1
            raced = await kube.get(r.GPUS, client.raced[0])
            assert raced["metadata"]["labels"]["touched-by"] == "rival"
            assert raced["status"]["available"] == expected[client.raced[0]]
            metrics = (await http.get("/metrics")).text
            assert 'tfusion_allocator_status_writes_total{kind="gpu",result="conflict"} 1.0' in metrics

            async def node_stamped() -> bool:  # a separate write, made after the GPU status patch
                node = await kube.get(r.GPUNODES, "node-a")
                return tfa.LAST_SYNC in node["metadata"].get("annotations", {})

            await eventually(node_stamped, what="the GPUNode's last-sync annotation")

            async def quota_used() -> Any:
                status = (await kube.get(r.GPURESOURCEQUOTAS, "budget", namespace="default")).get("status") or {}
                return status if status.get("used", {}).get("workers") == 3 else None

            quota = await eventually(quota_used, what="quota status.used")
            assert quota["used"]["requests"] == {"tflops": "70", "vram": "16Gi"}  # 20 + 2x10 + 30, 4 + 2x2 + 8
            assert quota["availablePercent"]["workers"] == "70.00"
            assert quota["conditions"][0]["type"] == "Ready" and quota["conditions"][0]["status"] == "True"
            assert quota["lastUpdateTime"]

            # deletion releases; the API shows the freed capacity after a sync
            await kube.delete(r.PODS, "p1", namespace="default", grace_period_seconds=0)

            async def p1_released() -> bool:
                return await gpu_available(kube, "gpu-a1") == {"tflops": "90", "vram": "38Gi"}

            await eventually(p1_released, what="gpu-a1 freed after p1 was deleted")
            # a finished worker releases too
            await kube.patch(r.PODS, "p2", {"status": {"phase": "Failed"}}, subresource="status")

            async def p2_released() -> bool:
                return (await gpu_available(kube, "gpu-a1") == {"tflops": "100", "vram": "40Gi"}
                        and await gpu_available(kube, "gpu-a2") == {"tflops": "100", "vram": "40Gi"})

            await eventually(p2_released, what="gpu-a1 and gpu-a2 freed after p2 failed")
            await eventually(lambda: quota_workers(kube, 1), what="quota workers back to 1")
            again = (await kube.get(r.GPURESOURCEQUOTAS, "budget", namespace="default"))["status"]
            assert again["used"]["requests"] == {"tflops": "30", "vram": "8Gi"}
            assert again["conditions"][0]["lastTransitionTime"] == quota["conditions"][0]["lastTransitionTime"], \
                "the Ready condition did not change, so neither does its transition time"

            # the hypervisor reports a new capacity (and, wrongly, available = capacity): the change
            # is applied as a delta, and available stays capacity minus requests
            await kube.patch(r.GPUS, "gpu-b1", {"status": {"capacity": {"tflops": "150", "vram": "48Gi"},
                                                           "available": {"tflops": "150", "vram": "48Gi"}}},
                             subresource="status")

            async def resized() -> bool:
                return await gpu_available(kube, "gpu-b1") == {"tflops": "120", "vram": "40Gi"}

            await eventually(resized, what="gpu-b1 available after the capacity change")

            # a worker bound after recovery (by another process) is adopted from its annotations
            await kube.create(r.PODS, worker("late", "node-a", ["gpu-a2"], tflops="5", vram="1Gi"))

            async def adopted() -> bool:
                return await gpu_available(kube, "gpu-a2") == {"tflops": "95", "vram": "39Gi"}

            await eventually(adopted, what="the late worker adopted")

            async def leader_caught_up() -> Any:
                """The leader's view once its cache holds its own last GPU status writes (the
                follower, listing later, sees those resourceVersions)."""
                body = (await http.get("/api/allocation")).json()
                for name, gpu in body["gpuStore"].items():
                    stored = await kube.get(r.GPUS, name)
                    if gpu["metadata"]["resourceVersion"] != stored["metadata"]["resourceVersion"]:
                        return None
                return body

            leader_view = await eventually(leader_caught_up, what="the leader's cache caught up with its writes")
            assert sorted(leader_view["nodeWorkerStore"]["node-a"]) == ["default/late"]

            # a second replica waits as a follower: empty stores, simulate refused, ready as standby
            follower = await start_controller(
                tg, settings_for(apiserver, tmp_path, leader_elect=True, pod_name="follower-1"))
            fhttp = follower.http

            def saw_the_leader() -> bool:
                elector = follower.runtime.manager.elector
                return elector is not None and elector.observed_holder == "leader-1"

            await eventually(saw_the_leader, what="the follower read the Lease the leader holds")
            assert not follower.runtime.is_leader
            assert (await fhttp.get("/api/allocation")).json() == {
                "gpuStore": {}, "nodeWorkerStore": {}, "allocation": {}, "gpuToWorkerMap": {}}
            refused = await fhttp.post("/api/simulate-schedule", content=json.dumps(probe_pod()))
            assert refused.status_code == 503 and "not the leader" in refused.json()["error"]
            assert (await readiness(fhttp))["allocator"] == (True, "standby: not the leader")

            # the leader stops (releasing the Lease); the follower takes over and rebuilds the same state
            await leader.stop()

            async def took_over() -> Any:
                body = (await fhttp.get("/api/allocation")).json()
                return body if body["allocation"] else None

            assert await eventually(took_over, what="the follower's recovered view") == leader_view
            assert follower.runtime.is_leader and follower.service.allocator is not None
            assert follower.service.allocator.dirty_gpus() == set(), "nothing to rewrite after a clean hand-over"

            # another holder takes the Lease: the replica stops leading and drops its state
            await steal_lease(kube, LEASE_NAME, "intruder", namespace="tf-ops", duration_s=60)

            async def dropped() -> bool:
                return follower.service.allocator is None and not follower.runtime.is_leader

            await eventually(dropped, what="state dropped after losing the Lease")
            assert (await fhttp.get("/api/allocation")).json()["allocation"] == {}
            assert (await readiness(fhttp))["allocator"] == (True, "standby: not the leader")


async def test_requests_wait_for_recovery_and_late_gpus_are_adopted(apiserver: Any, tmp_path: Path) -> None:
    """No CRDs yet: the GPU informer cannot sync, so the leader has not recovered and allocation
    requests wait; once the kinds exist the answer comes. A worker whose GPU object appears only
    after recovery is adopted when it does."""
    async with kube_client(apiserver) as kube, controllers() as tg:
        await kube.create(r.PODS, worker("early", "node-a", ["gpu-a1"], tflops="25", vram="5Gi"))
        ctl = await start_controller(tg, settings_for(apiserver, tmp_path))
        answers: list[httpx.Response] = []

        async def ask() -> None:
            answers.append(await ctl.http.get("/api/allocation"))

        tg.start_soon(ask)
        # a later request's answer says recovery is still waiting; the earlier one has none yet
        ready, message = (await readiness(ctl.http))["allocator"]
        assert not ready and "waiting for the informers" in message
        assert answers == [], "answered before the allocations were recovered"
        assert (await ctl.http.post("/api/simulate-schedule", content=b"")).status_code == 400, \
            "bad bodies are refused at once"

        await apply_crds(apiserver)
        async def answered() -> bool:
            return bool(answers)

        await eventually(answered, what="the waiting request answered")
        assert answers[0].status_code == 200 and answers[0].json()["gpuStore"] == {}
        assert (await readiness(ctl.http))["allocator"][0] is True

        await create_pool(kube)
        await create_gpu(kube, "gpu-a1", "node-a")

        async def adopted() -> bool:
            return await gpu_available(kube, "gpu-a1") == {"tflops": "75", "vram": "35Gi"}

        await eventually(adopted, what="the early worker adopted once its GPU appeared")
        view = (await ctl.http.get("/api/allocation")).json()
        assert view["nodeWorkerStore"] == {"node-a": {"default/early": True}}


async def test_orphan_sweep_and_assumed_expiry(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube, controllers() as tg:
        await create_pool(kube)
        await create_gpu(kube, "gpu-a1", "node-a")

        def prepare(runtime: ControllerRole) -> None:
            AllocatorService(runtime, orphan_sweep_interval=0.2, assume_ttl=0.6).attach()

        ctl = await start_controller(tg, settings_for(apiserver, tmp_path), prepare=prepare)
        service = ctl.service

        async def recovered() -> Any:
            return service.allocator

        allocator = await eventually(recovered, what="recovery")
        await kube.create(r.PODS, worker("live", "node-a", ["gpu-a1"], tflops="10", vram="2Gi"))
        await eventually(lambda: gpu_is(kube, "gpu-a1", "90", "38Gi"), what="the live worker adopted")

        # a committed allocation whose pod the API never had (its deletion event was missed)
        ghost = request_from_pod(Pod({"metadata": {"name": "ghost", "namespace": "default", "uid": "ghost-uid",
                                               "annotations": {tfa.GPU_POOL: POOL, tfa.TFLOPS_REQUEST: "30",
                                                               tfa.VRAM_REQUEST: "10Gi"}}}))
        allocator.assume(ghost, ["gpu-a1"])
        allocator.commit("ghost-uid")
        # and an assumed one that is never committed
        pending = request_from_pod(Pod({"metadata": {"name": "pending", "namespace": "default",
                                                 "uid": "pending-uid", "annotations": {
                                                     tfa.GPU_POOL: POOL, tfa.TFLOPS_REQUEST: "5"}}}))
        allocator.assume(pending, ["gpu-a1"])
        # checked before any await: the sweep (every 0.2 s) may release the ghost during a request
        ghost_info, pending_info = allocator.allocation("ghost-uid"), allocator.allocation("pending-uid")
        assert ghost_info is not None and not ghost_info.assumed, "the ghost is committed"
        assert pending_info is not None and pending_info.assumed

        async def swept() -> bool:
            return not allocator.has_allocation("ghost-uid") and not allocator.has_allocation("pending-uid")

        await eventually(swept, what="ghost released and pending expired")
        assert [a.request.pod_name for a in allocator.allocations().values()] == ["live"], "the live one stays"
        await eventually(lambda: gpu_is(kube, "gpu-a1", "90", "38Gi"), what="the API back to the live worker")
        metrics = (await ctl.http.get("/metrics")).text
        assert 'tfusion_allocator_releases_total{reason="orphan"} 1.0' in metrics
        assert 'tfusion_allocator_releases_total{reason="expired"} 1.0' in metrics


async def gpu_is(kube: KubeClient, name: str, tflops: str, vram: str) -> bool:
    return await gpu_available(kube, name) == {"tflops": tflops, "vram": vram}


async def quota_workers(kube: KubeClient, workers: int) -> bool:
    status = (await kube.get(r.GPURESOURCEQUOTAS, "budget", namespace="default")).get("status") or {}
    return bool(status.get("used", {}).get("workers") == workers)
