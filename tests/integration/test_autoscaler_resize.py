"""Resizing running workers (tfusion/controller/autoscaler/resize.py) against the embedded API server
with a real controller: pods placed by the built-in scheduler, resized down in place (annotations,
ledger and GPU status follow, a Resized event), refused when the GPU or the quota cannot hold the
increase (a ResizeRefused event naming what is short, nothing changed), never shrunk below the VRAM
in use; the drift audit and a new leader's recovery agree with the resized share; hard isolation
recreated only when a controller owns the pod; partitions refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.controller import (
    POOL,
    Controller,
    controllers,
    create_gpu,
    create_pool,
    gpu_available,
    kube_client,
    settings_for,
    start_controller,
)
from tests.helpers.scheduler import bound, create_node, events_for, gpu_pod
from tfusion.allocator.request import Resources, request_from_pod
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod
from tfusion.controller.autoscaler.resize import ResizeOutcome, WorkerResizer
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, NotFound

pytestmark = pytest.mark.anyio

GI = 1 << 30
SHIPPED = Path(__file__).resolve().parents[2] / "deploy/overlays/defaults/providerconfig.yaml"


def share(tflops: int, vram_gi: float) -> Resources:
    return Resources(tflops=tflops * 1000, vram=int(vram_gi * GI))


async def placed(kube: KubeClient, ctl: Controller, name: str, *, tflops: str = "40", vram: str = "8Gi",
                 **notes: str) -> Pod:
    """Pod `name` (40 TFLOPS / 8Gi, limits 80 / 16Gi unless told otherwise) bound by the scheduler,
    its allocation committed."""
    extra = {tfa.TFLOPS_LIMIT: "80", tfa.VRAM_LIMIT: "16Gi", **notes}
    await kube.create(r.PODS, gpu_pod(name, tflops=tflops, vram=vram,
                                      extra={k: v for k, v in extra.items() if v}))
    raw = await eventually(lambda: bound(kube, name), what=f"{name} bound")
    pod = Pod(raw)

    def committed() -> bool:
        allocator = ctl.service.allocator
        return allocator is not None and pod.uid in allocator.allocations(committed_only=True)

    await eventually(committed, what=f"{name}'s allocation committed")
    return pod


def ledger_share(ctl: Controller, uid: str) -> tuple[int, int, int, int]:
    allocator = ctl.service.allocator
    assert allocator is not None
    req = allocator.allocations()[uid].request
    return req.tflops_request, req.vram_request, req.tflops_limit, req.vram_limit


async def share_notes(kube: KubeClient, name: str) -> dict[str, str]:
    notes = (await kube.get(r.PODS, name, namespace="default"))["metadata"].get("annotations") or {}
    keys = (tfa.TFLOPS_REQUEST, tfa.TFLOPS_LIMIT, tfa.VRAM_REQUEST, tfa.VRAM_LIMIT,
            tfa.COMPUTE_PERCENT_REQUEST, tfa.COMPUTE_PERCENT_LIMIT)
    return {k: notes[k] for k in keys if k in notes}


async def event_saying(kube: KubeClient, pod: str, reason: str, *parts: str) -> dict[str, Any]:
    async def found() -> dict[str, Any] | None:
        for event in await events_for(kube, pod, reason):
            if all(p in event["message"] for p in parts):
                return event
        return None

    return await eventually(found, what=f"a {reason} event on {pod} saying {parts}")


async def test_resize_down_in_place_refuse_up_floor_at_use_and_quota(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await create_pool(kube)
        await create_node(kube, "node-a")
        await create_gpu(kube, "gpu-a1", "node-a", tflops="100", vram="40Gi")
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path, drift_check_interval=3600.0))
            resizer = WorkerResizer(ctl.runtime, ctl.service)
            pod = await placed(kube, ctl, "w1")
            assert ledger_share(ctl, pod.uid) == (40_000, 8 * GI, 80_000, 16 * GI)
            await eventually(lambda: _available_is(kube, "60", "32Gi"), what="gpu-a1 charged 40 / 8Gi")

            # down, in place: annotations, ledger and the GPU status all follow
            down = await resizer.resize(pod, share(10, 2), share(20, 4), reason="p95 usage")
            assert (down.applied, down.reason) == (True, "Resized"), down
            assert await share_notes(kube, "w1") == {tfa.TFLOPS_REQUEST: "10", tfa.TFLOPS_LIMIT: "20",
                                                     tfa.VRAM_REQUEST: "2Gi", tfa.VRAM_LIMIT: "4Gi"}
            assert ledger_share(ctl, pod.uid) == (10_000, 2 * GI, 20_000, 4 * GI)
            await eventually(lambda: _available_is(kube, "90", "38Gi"), what="gpu-a1 shows the freed share")
            await event_saying(kube, "w1", "Resized", "40 TFLOPS/8Gi", "10 TFLOPS/2Gi", "p95 usage")

            # asking the same again changes nothing
            same = await resizer.resize(pod, share(10, 2), share(20, 4))
            assert (same.applied, same.reason) == (False, "Unchanged"), same

            # up past what the GPU holds: refused, naming the GPU and what is short; nothing changes
            up = await resizer.resize(pod, share(95, 45), share(100, 45))
            assert (up.applied, up.reason) == (False, "InsufficientCapacity"), up
            event = await event_saying(kube, "w1", "ResizeRefused", "gpu-a1", "VRAM available 38Gi")
            assert event["type"] == "Warning"
            assert "the increase needs 85 TFLOPS and 43Gi" in event["message"], event["message"]
            assert await share_notes(kube, "w1") == {tfa.TFLOPS_REQUEST: "10", tfa.TFLOPS_LIMIT: "20",
                                                     tfa.VRAM_REQUEST: "2Gi", tfa.VRAM_LIMIT: "4Gi"}
            assert ledger_share(ctl, pod.uid) == (10_000, 2 * GI, 20_000, 4 * GI)
            assert await gpu_available(kube, "gpu-a1") == {"tflops": "90", "vram": "38Gi"}

            # never below the VRAM in use: 1Gi asked, 3Gi used -> 3Gi; compute percent replaces TFLOPS
            floor = await resizer.resize(pod, Resources(percent=5_000, vram=GI), Resources(percent=10_000, vram=GI),
                                         vram_in_use=3 * GI)
            assert (floor.applied, floor.reason) == (True, "Resized"), floor
            assert "VRAM floored at the 3Gi in use" in floor.message
            assert await share_notes(kube, "w1") == {tfa.COMPUTE_PERCENT_REQUEST: "5",
                                                     tfa.COMPUTE_PERCENT_LIMIT: "10",
                                                     tfa.VRAM_REQUEST: "3Gi", tfa.VRAM_LIMIT: "3Gi"}
            await eventually(lambda: _available_is(kube, "95", "37Gi"), what="gpu-a1 charged 5 % / 3Gi")

            # the quota: the GPU could hold 60 TFLOPS, the namespace may not
            await kube.create(r.GPURESOURCEQUOTAS, {"metadata": {"name": "budget", "namespace": "default"},
                                                    "spec": {"total": {"requests": {"tflops": "50", "vram": "100Gi"}}}})

            def quota_known() -> bool:
                return ctl.service.quota_name("default") == "budget"

            await eventually(quota_known, what="the quota fed to the allocator")
            over = await resizer.resize(pod, share(60, 3), share(60, 3))
            assert (over.applied, over.reason) == (False, "QuotaExceeded"), over
            await event_saying(kube, "w1", "ResizeRefused", "QuotaExceeded", "tflops")
            assert (await share_notes(kube, "w1"))[tfa.COMPUTE_PERCENT_REQUEST] == "5"

            # the drift audit finds nothing wrong with a resized worker, and re-adopts nothing
            drift = ctl.runtime.reconcilers.drift if ctl.runtime.reconcilers is not None else None
            assert drift is not None
            for _ in range(2):  # twice, further apart than a pending status write may take
                report = await drift.audit_once()
                assert report is not None and report["findings"] == [], report
                await anyio.sleep(drift.settle + 0.2)
            assert _percent_share(ctl, pod.uid) == (5_000, 3 * GI, 10_000, 3 * GI)

            # a new leader rebuilds the ledger from the annotations: the resized share, not the first one
            await ctl.stop()
            successor = await start_controller(tg, settings_for(apiserver, tmp_path, drift_check_interval=3600.0))

            def recovered() -> bool:
                allocator = successor.service.allocator
                return allocator is not None and allocator.has_allocation(pod.uid)

            await eventually(recovered, what="the successor recovered w1")
            assert _percent_share(successor, pod.uid) == (5_000, 3 * GI, 10_000, 3 * GI)

            # the room is taken between the dry run and the ledger: the annotations are patched back
            raced = await RacingResizer(successor.runtime, successor.service).resize(
                pod, share(30, 3), share(30, 3))
            assert (raced.applied, raced.reason) == (False, "InsufficientCapacity"), raced
            assert "the annotations were patched back" in raced.message
            assert (await share_notes(kube, "w1"))[tfa.COMPUTE_PERCENT_REQUEST] == "5"
            assert tfa.TFLOPS_REQUEST not in await share_notes(kube, "w1")
            assert _percent_share(successor, pod.uid) == (5_000, 3 * GI, 10_000, 3 * GI)


class RacingResizer(WorkerResizer):
    """Another pod takes 80 TFLOPS of gpu-a1 right after the annotations are patched."""

    async def _patch(self, pod: Pod, notes: dict[str, str | None]) -> None:
        await super()._patch(pod, notes)
        allocator = self.service.allocator
        if allocator is not None and not allocator.has_allocation("ghost-uid"):
            ghost = Pod({"metadata": {"name": "ghost", "namespace": "other", "uid": "ghost-uid", "annotations": {
                tfa.GPU_POOL: POOL, tfa.TFLOPS_REQUEST: "80", tfa.VRAM_REQUEST: "1Gi"}}})
            assert allocator.restore([(request_from_pod(ghost), ("gpu-a1",))]) == []


def _percent_share(ctl: Controller, uid: str) -> tuple[int, int, int, int]:
    allocator = ctl.service.allocator
    assert allocator is not None
    req = allocator.allocations()[uid].request
    return req.percent_request, req.vram_request, req.percent_limit, req.vram_limit


async def _available_is(kube: KubeClient, tflops: str, vram: str) -> bool:
    return await gpu_available(kube, "gpu-a1") == {"tflops": tflops, "vram": vram}


async def test_hard_isolation_recreates_owned_workers_only_and_partitions_are_refused(apiserver: Any,
                                                                                      tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await kube.create(r.PROVIDERCONFIGS, yaml.safe_load(SHIPPED.read_text()))
        await create_pool(kube)
        await create_node(kube, "node-a")
        await create_gpu(kube, "gpu-a1", "node-a", tflops="100", vram="40Gi")
        await kube.patch(r.GPUS, "gpu-a1", {"status": {"isolationMode": "hard"}}, subresource="status")
        await create_node(kube, "node-p")
        await create_gpu(kube, "gpu-p1", "node-p", tflops="312", vram="80Gi", model="A100-SXM4-80GB")
        await kube.patch(r.GPUS, "gpu-p1", {"status": {"isolationMode": "partitioned"}}, subresource="status")
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path))
            resizer = WorkerResizer(ctl.runtime, ctl.service)
            # first, so that the partitioned GPU holds a partition and the hard workers go elsewhere
            part = await placed(kube, ctl, "part", tflops="1", vram="1Gi",
                                **{tfa.ISOLATION: tfa.ISOLATION_PARTITIONED, tfa.PARTITION_ID: "1g.10gb",
                                   tfa.TFLOPS_LIMIT: "", tfa.VRAM_LIMIT: ""})
            before = await share_notes(kube, "part")
            no: ResizeOutcome = await resizer.resize(part, share(2, 2), share(2, 2))
            assert (no.applied, no.reason) == (False, "Partitioned"), no
            await event_saying(kube, "part", "ResizeRefused", "partition")
            assert await share_notes(kube, "part") == before

            lone = await placed(kube, ctl, "hard-lone", **{tfa.ISOLATION: tfa.ISOLATION_HARD})
            refused = await resizer.resize(lone, share(10, 2), share(20, 4))
            assert (refused.applied, refused.reason) == (False, "NotRecreatable"), refused
            await event_saying(kube, "hard-lone", "ResizeRefused", "no controller owns the pod")
            assert (await share_notes(kube, "hard-lone"))[tfa.TFLOPS_REQUEST] == "40"

            owner = await kube.create(r.REPLICASETS, {
                "metadata": {"name": "hard-rs", "namespace": "default"},
                "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "hard"}},
                         "template": {"metadata": {"labels": {"app": "hard"}},
                                      "spec": {"containers": [{"name": "main", "image": "app"}]}}}})
            ref = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "hard-rs",
                   "uid": owner["metadata"]["uid"], "controller": True}
            owned = await placed(kube, ctl, "hard-owned", **{tfa.ISOLATION: tfa.ISOLATION_HARD})
            await kube.patch(r.PODS, "hard-owned", {"metadata": {"ownerReferences": [ref]}}, namespace="default")
            outcome = await resizer.resize(owned, share(10, 2), share(20, 4), reason="cron rule night")
            assert (outcome.applied, outcome.reason) == (True, "Recreated"), outcome
            assert "ReplicaSet/hard-rs" in outcome.message

            async def deleting() -> bool:
                try:
                    found = await kube.get(r.PODS, "hard-owned", namespace="default")
                except NotFound:
                    return True
                return bool(found["metadata"].get("deletionTimestamp"))

            await eventually(deleting, what="the owned hard worker deleted for its controller to recreate")
            await event_saying(kube, "hard-owned", "ResizeRecreate", "ReplicaSet/hard-rs", "cron rule night")

