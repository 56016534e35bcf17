"""simulate-schedule's `suggestions` over real HTTP, applied through the API server: the pod's
annotation changed as said, the GPUResourceQuota patched as said, the lower-QoS worker pods deleted
as said; after each, simulate-schedule places the pod."""

from __future__ import annotations

import copy
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
    probe_pod,
    settings_for,
    start_controller,
    worker,
)
from tfusion.api import annotations as tfa
from tfusion.kube import resources as r

pytestmark = pytest.mark.anyio


def quota_patch(changes: dict[str, str]) -> dict[str, Any]:
    """A merge patch setting each "spec.x.y" path to its value (counts as integers)."""
    patch: dict[str, Any] = {}
    for path, value in changes.items():
        node = patch
        *parents, last = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = int(value) if last in ("maxWorkers", "maxGPUCount") else value
    return patch


async def test_each_suggestion_applied_makes_the_pod_fit(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await create_pool(kube)
        await create_gpu(kube, "gpu-a1", "node-a", vram="40Gi")
        await create_gpu(kube, "gpu-b1", "node-b", vram="40Gi")
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path))
            http = ctl.http

            async def simulate(pod: dict[str, Any]) -> dict[str, Any]:
                answer = await http.post("/api/simulate-schedule", content=json.dumps(pod))
                assert answer.status_code == 200, answer.text
                body: dict[str, Any] = answer.json()
                return body

            async def fed() -> bool:
                return len((await http.get("/api/allocation")).json()["gpuStore"]) == 2

            await eventually(fed, what="both GPUs known")

            # too big for any GPU: the largest VRAM that fits, applied as the annotation says
            big = probe_pod(vram="48Gi")
            body = await simulate(big)
            assert body["error"] is not None
            smaller = next(s for s in body["suggestions"] if s["kind"] == "smaller-request")
            assert smaller["target"] == "annotations" and smaller["changes"] == {tfa.VRAM_REQUEST: "40Gi"}
            changed = copy.deepcopy(big)
            changed["metadata"]["annotations"].update(smaller["changes"])
            after = await simulate(changed)
            assert after["error"] is None and after["scheduleResult"]["SuggestedHost"] == smaller["node"]
            assert after["suggestions"] == []

            # over the quota: patch the GPUResourceQuota as said, and it fits once the controller sees it
            await kube.create(r.GPURESOURCEQUOTAS, {"metadata": {"name": "budget", "namespace": "default"},
                                                    "spec": {"total": {"requests": {"tflops": "1000", "vram": "8Gi"},
                                                                       "limits": {"tflops": "2000", "vram": "100Gi"}}}})
            over = probe_pod(vram="10Gi")

            async def refused() -> Any:
                found = await simulate(over)
                return found if any(s["kind"] == "quota" for s in found["suggestions"]) else None

            body = await eventually(refused, what="the quota refuses the pod")
            quota = next(s for s in body["suggestions"] if s["kind"] == "quota")
            assert quota["target"] == "quota" and quota["changes"] == {"spec.total.requests.vram": "10Gi"}
            await kube.patch(r.GPURESOURCEQUOTAS, "budget", quota_patch(quota["changes"]), namespace="default")

            async def admitted() -> bool:
                return (await simulate(over))["error"] is None

            await eventually(admitted, what="the raised quota admits the pod")
            await kube.delete(r.GPURESOURCEQUOTAS, "budget", namespace="default")

            # both GPUs held by low-QoS workers: delete the pods it names
            for name, gpu, node in (("low-a", "gpu-a1", "node-a"), ("low-b", "gpu-b1", "node-b")):
                pod = worker(name, node, [gpu], tflops="50", vram="30Gi")
                pod["metadata"]["annotations"][tfa.QOS] = "low"
                await kube.create(r.PODS, pod, namespace="default")
            urgent = probe_pod(vram="20Gi")
            urgent["metadata"]["annotations"][tfa.QOS] = "high"

            async def crowded() -> Any:
                found = await simulate(urgent)
                return found if any(s["kind"] == "preempt-lower-qos" for s in found["suggestions"]) else None

            body = await eventually(crowded, what="the low-QoS workers hold both GPUs")
            preempt = next(s for s in body["suggestions"] if s["kind"] == "preempt-lower-qos")
            assert preempt["target"] == "pods" and len(preempt["pods"]) == 1
            for ref in preempt["pods"]:
                namespace, name = ref.split("/")
                await kube.delete(r.PODS, name, namespace=namespace)

            async def placed() -> Any:
                found = await simulate(urgent)
                return found if found["error"] is None else None

            body = await eventually(placed, what="the freed GPU takes the pod")
            assert body["scheduleResult"]["SuggestedHost"] == preempt["node"]
