"""Partitioned isolation through the built-in scheduler against the embedded API server: the shipped
NVIDIA ProviderConfig's MIG templates, one A100-80GB GPU. Three `1g.10gb` pods share it on distinct
slots (GPU status.allocatedPartitions, the pods' partition-id, the GPU table's Partitions column), a
larger slice goes where its slots are free and the next one is explained (why, simulate-schedule),
a deleted pod's slot goes to the next pod, and a new controller rebuilds the same partitions from
the pods and the GPU's status."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.controller import controllers, create_gpu, create_pool, kube_client, settings_for, start_controller
from tests.helpers.scheduler import bound, create_node, gpu_pod, scheduled_condition
from tfusion.api import annotations as tfa
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient

pytestmark = pytest.mark.anyio

SHIPPED = Path(__file__).resolve().parents[2] / "deploy/overlays/defaults/providerconfig.yaml"
ONE_G = "nv-80g-1g-10gb"
THREE_G = "nv-80g-3g-40gb"
TABLE = {"accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}


def part_pod(name: str, template: str) -> dict[str, Any]:
    return gpu_pod(name, tflops="1", vram="1Gi",
                   extra={tfa.ISOLATION: tfa.ISOLATION_PARTITIONED, tfa.PARTITION_ID: template})


async def slots(kube: KubeClient) -> dict[str, tuple[str, int, int]]:
    """pod name -> (template, slot start, slot end) from the GPU's status.allocatedPartitions."""
    gpu = await kube.get(r.GPUS, "gpu-a1")
    entries = (gpu.get("status") or {}).get("allocatedPartitions") or {}
    return {e["podName"]: (e["templateId"], e["allocatedSlotStart"], e["allocatedSlotEnd"]) for e in entries.values()}


async def slots_become(kube: KubeClient, wanted: dict[str, tuple[str, int, int]]) -> None:
    async def check() -> bool:
        return await slots(kube) == wanted
    await eventually(check, what=f"allocatedPartitions == {wanted}")


async def test_partitions_share_a_gpu_on_distinct_slots_and_survive_a_restart(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await kube.create(r.PROVIDERCONFIGS, yaml.safe_load(SHIPPED.read_text()))
        await create_pool(kube)
        await create_node(kube, "node-a")
        await create_gpu(kube, "gpu-a1", "node-a", tflops="312", vram="80Gi", model="A100-SXM4-80GB")
        await kube.patch(r.GPUS, "gpu-a1", {"status": {"isolationMode": "partitioned"}}, subresource="status")
        async with controllers() as tg:
            settings = settings_for(apiserver, tmp_path)
            ctl = await start_controller(tg, settings)
            for name in ("p1", "p2", "p3"):
                await kube.create(r.PODS, part_pod(name, "1g.10gb"))
            for name in ("p1", "p2", "p3"):
                pod = await eventually(lambda n=name: bound(kube, n), what=f"{name} bound")  # type: ignore[misc]
                notes = pod["metadata"]["annotations"]
                assert notes[tfa.GPU_IDS] == "gpu-a1" and notes[tfa.PARTITION_ID] == ONE_G
            await slots_become(kube, {"p1": (ONE_G, 0, 1), "p2": (ONE_G, 1, 2), "p3": (ONE_G, 2, 3)})

            # a 3g.40gb slice may start at slot 0 or 4: 0 is taken, so 4..7
            await kube.create(r.PODS, part_pod("big1", "3g.40gb"))
            await eventually(lambda: bound(kube, "big1"), what="big1 bound")
            await slots_become(kube, {"p1": (ONE_G, 0, 1), "p2": (ONE_G, 1, 2), "p3": (ONE_G, 2, 3),
                                      "big1": (THREE_G, 4, 8)})
            gpu = await kube.get(r.GPUS, "gpu-a1")
            assert gpu["status"]["available"]["vram"] == "10Gi"  # 80 - 3 x 10 - 40
            async with apiserver.http() as http:  # what `kubectl get gpus -o wide` prints
                table = (await http.get("/apis/tensor-fusion.ai/v1/gpus", headers=TABLE)).json()
            column = [c["name"] for c in table["columnDefinitions"]].index("Partitions")
            assert json.dumps(table["rows"][0]["cells"][column]).count(ONE_G) == 3

            # another one has no free start: refused, and explained
            await kube.create(r.PODS, part_pod("big2", "3g.40gb"))
            condition = await eventually(lambda: scheduled_condition(kube, "big2"), what="big2 refused")
            assert "no free partition slot" in condition["message"]
            why = (await ctl.http.get("/api/why", params={"namespace": "default", "name": "big2"})).json()
            reason = why["nodes"]["node-a"]["reasons"][0]
            assert (reason["stage"], reason["gpu"], reason["message"]) == \
                ("PartitionTemplateFilter", "gpu-a1", "no free partition slot")
            assert reason["detail"] == "gpu-a1 (A100-SXM4-80GB): no free slot for 3g.40gb; free slots 3"

            simulated = (await ctl.http.post("/api/simulate-schedule",
                                             content=json.dumps(part_pod("probe", "3g.40gb")))).json()
            stage = next(s for s in simulated["filterDetail"]["FilterStageDetails"]
                         if s["FilterName"] == "PartitionTemplateFilter")
            assert stage["Removed"] == [{"gpu": "gpu-a1", "node": "node-a", "reason": reason["detail"]}], stage

            # deleting p2 frees exactly slot 1, which the next small pod takes
            await kube.delete(r.PODS, "p2", namespace="default")
            await slots_become(kube, {"p1": (ONE_G, 0, 1), "p3": (ONE_G, 2, 3), "big1": (THREE_G, 4, 8)})
            await kube.create(r.PODS, part_pod("p4", "mig-1g.10gb"))
            await eventually(lambda: bound(kube, "p4"), what="p4 bound")
            before = {"p1": (ONE_G, 0, 1), "p4": (ONE_G, 1, 2), "p3": (ONE_G, 2, 3), "big1": (THREE_G, 4, 8)}
            await slots_become(kube, before)
            view = (await ctl.http.get("/api/allocation")).json()["gpuStore"]["gpu-a1"]["status"]
            assert sorted(e["podName"] for e in view["allocatedPartitions"].values()) == ["big1", "p1", "p3", "p4"]
            old = ctl.service.allocator
            assert old is not None
            held = {uid: info.partitions for uid, info in old.allocations().items()}
            await ctl.stop()

            # a new controller rebuilds the same partitions from the pods and the GPU's status
            ctl = await start_controller(tg, settings)
            allocator = await ctl.service.wait_ready(10)
            assert allocator is not None and allocator is not old
            assert {uid: info.partitions for uid, info in allocator.allocations().items()} == held
            assert await slots(kube) == before
            await ctl.stop()
