"""Topology-aware GPU choice through the built-in scheduler against the embedded API server: the
scheduler config's `GPUNetworkTopologyAware` in hard mode keeps a 2-GPU pod off a node whose free
GPUs are joined only through the PCIe switch, says the tier in PodScheduled and `/api/why`, and
places it on the NVLink pair once one is free; the outcome counters count both."""

from __future__ import annotations

import json
from functools import partial
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

#: NVLink 0-1 and 2-3, every other pair through one PCIe switch (the sim spec nvlink=0-1,2-3;pcie-switch=0-1-2-3)
PAIRS = {(0, 1): (0, "NVLink"), (2, 3): (0, "NVLink")}


async def topology_node(kube: KubeClient) -> None:
    await create_pool(kube)
    await create_node(kube, "node-a")
    for i in range(4):
        await create_gpu(kube, f"gpu-a{i}", "node-a", index=i, vram="40Gi")
    for i in range(4):
        peers = []
        for j in range(4):
            if j != i:
                tier, link = PAIRS.get((min(i, j), max(i, j)), (1, "PCIeSwitch"))
                peers.append({"peerGPUUUID": f"gpu-a{j}", "tier": tier, "linkType": link})
        await kube.patch(r.GPUS, f"gpu-a{i}", {"status": {"numaNode": 0, "topology": {"peers": peers}}},
                         subresource="status")


def hard_config(path: Path) -> str:
    path.write_text(yaml.safe_dump({"kind": "KubeSchedulerConfiguration", "profiles": [{
        "schedulerName": "tensor-fusion-scheduler", "pluginConfig": [{
            "name": "GPUNetworkTopologyAware", "args": {"mode": "hard", "maxAllowedTier": 0}}]}]}))
    return str(path)


async def test_hard_topology_waits_for_an_nvlink_pair_and_says_the_tier(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await topology_node(kube)
        config = hard_config(tmp_path / "scheduler-config.yaml")
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path, scheduler_config=config))
            for index in (0, 2):  # one GPU of each NVLink pair taken
                await kube.create(r.PODS, gpu_pod(f"one-{index}", vram="30Gi",
                                                  extra={tfa.GPU_INDICES: str(index)}))
                name = f"one-{index}"
                await eventually(partial(bound, kube, name), what=f"{name} bound")
            await kube.create(r.PODS, gpu_pod("pair", vram="20Gi", extra={tfa.GPU_COUNT: "2"}))
            condition = await eventually(lambda: scheduled_condition(kube, "pair"), what="pair refused")
            assert condition["message"] == \
                "0/1 nodes are available: 1 best GPU set at topology tier 1, at most 0 allowed."
            why = (await ctl.http.get("/api/why", params={"namespace": "default", "name": "pair"})).json()
            reason = why["nodes"]["node-a"]["reasons"][0]
            assert (reason["stage"], reason["requested"], reason["available"]) == ("GPUNetworkTopologyAware", 0, 1)
            assert reason["detail"] == ("best 2 GPUs on node node-a are joined at tier 1 (PCIe switch or host "
                                        "bridge); at most tier 0 allowed")
            assert {tfa.GPU_TOPOLOGY_MAX_TIER: "1"} in [s["changes"] for s in why["suggestions"]]
            probe = gpu_pod("probe", vram="20Gi", extra={tfa.GPU_COUNT: "2"})
            simulated = (await ctl.http.post("/api/simulate-schedule", content=json.dumps(probe))).json()
            stage = next(s for s in simulated["filterDetail"]["FilterStageDetails"]
                         if s["FilterName"] == "GPUNetworkTopologyAware")
            assert stage["After"] == [] and sorted(stage["Before"]) == ["gpu-a1", "gpu-a3"]
            explained = simulated["error"]["explanation"]["nodes"]["node-a"]["reasons"][0]
            assert explained["detail"] == reason["detail"]

            await kube.delete(r.PODS, "one-2", namespace="default")  # the 2-3 pair frees
            pod = await eventually(lambda: bound(kube, "pair"), what="pair bound on the freed NVLink pair")
            assert tfa.parse_gpu_ids(pod["metadata"]["annotations"][tfa.GPU_IDS]) == ("gpu-a2", "gpu-a3")
            metrics = (await ctl.http.get("/metrics")).text
            assert 'tfusion_allocator_topology_placements_total{outcome="unsatisfied"}' in metrics
            assert 'tfusion_allocator_topology_placements_total{outcome="satisfied"} 1.0' in metrics
