"""The dynamic isolation-mode policy through the built-in scheduler, in-process controller against the
embedded API server over real HTTP: a soft pod and a shared pod never share a GPU; a pod asking
another mode than the GPU's active one is refused with the reason on PodScheduled and `/api/why`;
`status.activeIsolationMode` is written and cleared; a controller restart keeps the mode (recovered
from the worker pods); recovered pods that disagree flag the GPU (`dynamicIsolationConflict`, an
event) and it takes no new pod until they agree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.controller import (
    controllers,
    create_gpu,
    create_pool,
    kube_client,
    settings_for,
    start_controller,
    worker,
)
from tests.helpers.scheduler import bound, create_node, gpu_pod, scheduled_condition
from tfusion.allocator.reasons import ACTIVE_MODE_MISMATCH, MODE_CONFLICT
from tfusion.api import annotations as tfa
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, NotFound

pytestmark = pytest.mark.anyio


async def dynamic_gpu(kube: KubeClient, name: str, node: str) -> None:
    await create_gpu(kube, name, node)
    await kube.patch(r.GPUS, name, {"status": {"isolationPolicy": "Dynamic"}}, subresource="status")


def mode_pod(name: str, mode: str) -> dict[str, Any]:
    return gpu_pod(name, extra={tfa.ISOLATION: mode})


async def gpu_status(kube: KubeClient, name: str) -> dict[str, Any]:
    return dict((await kube.get(r.GPUS, name)).get("status") or {})


async def active_mode(kube: KubeClient, name: str, mode: str | None) -> bool:
    return (await gpu_status(kube, name)).get("activeIsolationMode") == mode


async def gone(kube: KubeClient, name: str) -> bool:
    try:
        await kube.get(r.PODS, name, namespace="default")
    except NotFound:
        return True
    return False


async def conflict_flagged(kube: KubeClient, gpu: str) -> bool:
    return (await gpu_status(kube, gpu)).get("dynamicIsolationConflict") is True


async def conflict_events(kube: KubeClient, gpu: str) -> list[dict[str, Any]]:
    events = await kube.list(r.EVENTS, namespace="default")
    return [e for e in events
            if e["involvedObject"].get("name") == gpu and e.get("reason") == "DynamicIsolationConflict"]


async def test_soft_and_shared_pods_never_share_a_gpu(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await create_pool(kube)
        await create_node(kube, "node-a")
        await dynamic_gpu(kube, "gpu-a1", "node-a")
        await dynamic_gpu(kube, "gpu-a2", "node-a")
        async with controllers() as tg:
            await start_controller(tg, settings_for(apiserver, tmp_path, isolation_mode_policy="dynamic"))
            await kube.create(r.PODS, mode_pod("soft-1", tfa.ISOLATION_SOFT))
            soft = await eventually(lambda: bound(kube, "soft-1"), what="soft-1 bound")
            await kube.create(r.PODS, mode_pod("shared-1", tfa.ISOLATION_SHARED))
            shared = await eventually(lambda: bound(kube, "shared-1"), what="shared-1 bound")
            soft_gpu = soft["metadata"]["annotations"][tfa.GPU_IDS]
            shared_gpu = shared["metadata"]["annotations"][tfa.GPU_IDS]
            assert {soft_gpu, shared_gpu} == {"gpu-a1", "gpu-a2"}
            await eventually(lambda: active_mode(kube, soft_gpu, "soft"), what="soft GPU's active mode")
            await eventually(lambda: active_mode(kube, shared_gpu, "shared"), what="shared GPU's active mode")
            await kube.create(r.PODS, mode_pod("soft-2", tfa.ISOLATION_SOFT))
            second = await eventually(lambda: bound(kube, "soft-2"), what="soft-2 bound")
            assert second["metadata"]["annotations"][tfa.GPU_IDS] == soft_gpu


async def test_mode_refused_with_reason_kept_across_a_restart_and_cleared_when_empty(
        apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await create_pool(kube)
        await create_node(kube, "node-a")
        await dynamic_gpu(kube, "gpu-a1", "node-a")
        settings = settings_for(apiserver, tmp_path, isolation_mode_policy="dynamic")
        async with controllers() as tg:
            ctl = await start_controller(tg, settings)
            await kube.create(r.PODS, mode_pod("soft-1", tfa.ISOLATION_SOFT))
            await eventually(lambda: bound(kube, "soft-1"), what="soft-1 bound")
            await eventually(lambda: active_mode(kube, "gpu-a1", "soft"), what="active mode soft")
            await kube.create(r.PODS, mode_pod("shared-1", tfa.ISOLATION_SHARED))
            condition = await eventually(lambda: scheduled_condition(kube, "shared-1"), what="shared-1 refused")
            assert condition["message"] == f"0/1 nodes are available: 1 {ACTIVE_MODE_MISMATCH}."
            why = (await ctl.http.get("/api/why", params={"namespace": "default", "name": "shared-1"})).json()
            detail = why["nodes"]["node-a"]["reasons"][0]["detail"]
            assert "gpu-a1: active isolation mode soft (dynamic policy); the pod asks shared" in detail
            probe = mode_pod("probe", tfa.ISOLATION_SHARED)
            answer = await ctl.http.post("/api/simulate-schedule", content=json.dumps(probe))
            assert answer.status_code == 200, answer.text
            simulated = answer.json()
            assert simulated["error"]["stage"] == "IsolationPolicy"
            assert "active isolation mode soft (dynamic policy); the pod asks shared" in json.dumps(simulated)
            await ctl.stop()

        async with controllers() as tg:  # a new leader term: the mode comes back from the bound pod
            ctl = await start_controller(tg, settings)
            allocator = await ctl.service.wait_ready()
            assert allocator is not None
            assert allocator.indexes.gpus["gpu-a1"].active_mode == "soft"
            assert (await gpu_status(kube, "gpu-a1"))["activeIsolationMode"] == "soft"
            await eventually(lambda: scheduled_condition(kube, "shared-1"), what="shared-1 still refused")
            assert await bound(kube, "shared-1") is None

            await kube.delete(r.PODS, "soft-1", namespace="default", grace_period_seconds=0)
            await eventually(lambda: gone(kube, "soft-1"), what="soft-1 deleted")
            shared = await eventually(lambda: bound(kube, "shared-1"), timeout=20.0, what="shared-1 bound once freed")
            assert shared["metadata"]["annotations"][tfa.GPU_IDS] == "gpu-a1"
            await eventually(lambda: active_mode(kube, "gpu-a1", "shared"), what="active mode shared")
            await kube.delete(r.PODS, "shared-1", namespace="default", grace_period_seconds=0)
            await eventually(lambda: gone(kube, "shared-1"), what="shared-1 deleted")
            status = await eventually(lambda: _cleared(kube), what="active mode cleared")
            assert status.get("dynamicIsolationConflict") is False


async def _cleared(kube: KubeClient) -> dict[str, Any] | None:
    status = await gpu_status(kube, "gpu-a1")
    return status if "activeIsolationMode" not in status else None


async def test_recovered_pods_that_disagree_flag_the_gpu_until_they_agree(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await create_pool(kube)
        await create_node(kube, "node-a")
        await dynamic_gpu(kube, "gpu-a1", "node-a")
        for name, mode in (("old-soft", tfa.ISOLATION_SOFT), ("old-hard", tfa.ISOLATION_HARD)):
            pod = worker(name, "node-a", ["gpu-a1"], tflops="10", vram="4Gi")
            pod["metadata"]["annotations"][tfa.ISOLATION] = mode
            await kube.create(r.PODS, pod)
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path, isolation_mode_policy="dynamic"))
            await ctl.service.wait_ready()

            await eventually(lambda: conflict_flagged(kube, "gpu-a1"), what="conflict flag written")

            event = (await eventually(lambda: conflict_events(kube, "gpu-a1"), what="conflict event on the GPU"))[0]
            assert "hard, soft" in event["message"]
            await kube.create(r.PODS, mode_pod("new-soft", tfa.ISOLATION_SOFT))
            condition = await eventually(lambda: scheduled_condition(kube, "new-soft"), what="new-soft refused")
            assert condition["message"] == f"0/1 nodes are available: 1 {MODE_CONFLICT}."

            await kube.delete(r.PODS, "old-hard", namespace="default", grace_period_seconds=0)
            await eventually(lambda: gone(kube, "old-hard"), what="old-hard deleted")
            pod = await eventually(lambda: bound(kube, "new-soft"), timeout=20.0, what="new-soft bound once agreed")
            assert pod["metadata"]["annotations"][tfa.GPU_IDS] == "gpu-a1"

            async def agreed() -> bool:
                status = await gpu_status(kube, "gpu-a1")
                return status.get("dynamicIsolationConflict") is False and status.get("activeIsolationMode") == "soft"

            await eventually(agreed, what="conflict flag cleared")


async def test_an_adopted_pod_of_another_mode_flags_the_gpu(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await create_pool(kube)
        await create_node(kube, "node-a")
        await dynamic_gpu(kube, "gpu-a1", "node-a")
        async with controllers() as tg:
            await start_controller(tg, settings_for(apiserver, tmp_path, isolation_mode_policy="dynamic"))
            await kube.create(r.PODS, mode_pod("soft-1", tfa.ISOLATION_SOFT))
            await eventually(lambda: bound(kube, "soft-1"), what="soft-1 bound")
            stray = worker("stray-hard", "node-a", ["gpu-a1"], tflops="10", vram="4Gi")  # bound by someone else
            stray["metadata"]["annotations"][tfa.ISOLATION] = tfa.ISOLATION_HARD
            await kube.create(r.PODS, stray)

            await eventually(lambda: conflict_flagged(kube, "gpu-a1"), what="conflict flag written after adoption")

            await eventually(lambda: conflict_events(kube, "gpu-a1"), what="conflict event after adoption")
