"""simulate-schedule on a raw pod manifest, and /api/allocation's whole objects, against the embedded
API server over real HTTP: a pod that names no pool is judged in the pool annotated
`is-default-pool: "true"`, with soft isolation, on a GPU whose capabilities annotation is what the
hypervisor writes; /api/allocation shows the GPU object and the pod metadata from the caches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.controller import (
    POOL,
    controllers,
    create_gpu,
    kube_client,
    probe_pod,
    settings_for,
    start_controller,
    worker,
)
from tfusion.api import annotations as tfa
from tfusion.hypervisor.devices.model import VirtualizationCapabilities
from tfusion.kube import resources as r

pytestmark = pytest.mark.anyio


async def test_raw_pod_is_placed_in_the_default_pool(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await kube.create(r.GPUPOOLS, {"metadata": {"name": POOL, "annotations": {tfa.IS_DEFAULT_POOL: "true"}},
                                       "spec": {"nodeManagerConfig": {}}})
        await create_gpu(kube, "gpu-a1", "node-a")
        capabilities = json.dumps(VirtualizationCapabilities().to_wire(), separators=(",", ":"))
        await kube.patch(r.GPUS, "gpu-a1", {"metadata": {"annotations": {
            tfa.VIRTUALIZATION_CAPABILITIES: capabilities}}})
        busy = await kube.create(r.PODS, worker("trainer-0", "node-a", ["gpu-a1"], tflops="10", vram="4Gi"))

        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path))
            http = ctl.http

            async def fed() -> Any:
                body = (await http.get("/api/allocation")).json()
                return body if body["gpuStore"] and body["allocation"] else None

            view = await eventually(fed, what="the GPU and the worker in /api/allocation")
            gpu = view["gpuStore"]["gpu-a1"]
            assert gpu["metadata"]["annotations"][tfa.VIRTUALIZATION_CAPABILITIES] == capabilities
            assert (gpu["status"]["uuid"], gpu["status"]["message"]) == ("GPU-gpu-a1", "managed")
            assert gpu["status"]["available"] == {"tflops": "90", "vram": "36Gi"}
            meta = view["allocation"][busy["metadata"]["uid"]]["PodMeta"]
            assert meta["resourceVersion"] and meta["labels"][tfa.COMPONENT] == "worker"
            assert meta["annotations"][tfa.GPU_IDS] == "gpu-a1"

            raw = probe_pod()
            del raw["metadata"]["annotations"][tfa.GPU_POOL]
            answer = await http.post("/api/simulate-schedule", content=json.dumps(raw))
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["error"] is None, body["error"]
            assert body["scheduleResult"]["SuggestedHost"] == "node-a"
            assert body["gpuSchedulerState"]["FinalGPUs"] == ["gpu-a1"]
            isolation = next(s for s in body["filterDetail"]["FilterStageDetails"]
                             if s["FilterName"] == "GPUIsolationModeFilter")
            assert isolation["After"] == ["gpu-a1"] and isolation["Removed"] == []

            # no default pool any more: the answer names both annotations
            await kube.patch(r.GPUPOOLS, POOL, {"metadata": {"annotations": {tfa.IS_DEFAULT_POOL: "false"}}})

            async def refused() -> Any:
                answer = await http.post("/api/simulate-schedule", content=json.dumps(raw))
                return answer if answer.status_code == 400 else None

            error = (await eventually(refused, what="a 400 without a default pool")).json()["error"]
            assert tfa.GPU_POOL in error and tfa.IS_DEFAULT_POOL in error
