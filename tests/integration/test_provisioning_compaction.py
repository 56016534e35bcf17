"""Compaction and defrag (tfusion/controller/provisioning/compaction.py) in-process against the
embedded API server, with the controller's reconcilers and allocator and a wall clock the test
moves: empty nodes of a pool are given back once old enough, as far as warmResources allows;
do-not-disrupt keeps a node; manual-compaction starts a pass at once; a provisioned node goes by
deleting its GPUNodeClaim, but not while another claim is in flight; a scheduled defrag evicts the
low-QoS worker of a lightly used node whose placement fits elsewhere and leaves protected ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.clock import Wall
from tests.helpers.controller import Controller, controllers, kube_client, settings_for, start_controller
from tfusion.api import annotations as tfa
from tfusion.api import cron
from tfusion.api.timestamps import rfc3339
from tfusion.controller.provisioning.compaction import Compaction
from tfusion.controller.role import ControllerRole, configure
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, NotFound

pytestmark = pytest.mark.anyio

POOL = "pool-c"
OLD_ENOUGH = 6 * 60.0  # past the 5-minute minimum age
#: a finalizer of the test's, so that an evicted pod stays (terminating) to be looked at
HOLD = "example.com/hold"


async def start(tg: Any, apiserver: Any, tmp_path: Path, wall: Wall) -> tuple[Controller, Compaction]:
    made: list[Compaction] = []

    def prepare(runtime: ControllerRole) -> None:
        configure(runtime)
        assert runtime.provisioning is not None
        runtime.provisioning.compaction.wall = wall  # the one configure() registered
        made.append(runtime.provisioning.compaction)

    controller = await start_controller(tg, settings_for(apiserver, tmp_path), prepare=prepare)
    return controller, made[0]


async def create_pool(kube: KubeClient, **spec: Any) -> None:
    await kube.create(r.GPUPOOLS, {"metadata": {"name": POOL}, "spec": {"nodeManagerConfig": {}, **spec}})


async def create_node(kube: KubeClient, name: str, *, price: str = "$1", claim: str = "", tflops: str = "100",
                      vram: str = "40Gi", labels: dict[str, str] | None = None) -> None:
    """A Node, its GPUNode in the pool and one GPU the 'hypervisor' just reported (so it runs)."""
    provisioner = {tfa.NODE_PROVISIONER: claim} if claim else {}
    await kube.create(r.NODES, {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                                      **provisioner, **(labels or {})}}})
    await kube.create(r.GPUNODES, {"metadata": {"name": name, "labels": {tfa.MANAGED_BY: POOL, **provisioner}},
                                   "spec": {"manageMode": "Provisioned" if claim else "AutoSelect",
                                            "costPerHour": price}})
    gpu = f"{name}-gpu"
    await kube.create(r.GPUS, {"metadata": {"name": gpu, "labels": {tfa.GPU_POOL: POOL, tfa.MANAGED_BY: name},
                                            "annotations": {tfa.LAST_SYNC: rfc3339()}}})
    await kube.patch(r.GPUS, gpu, {"status": {
        "phase": "Pending", "vendor": "NVIDIA", "gpuModel": "A100_SXM_40G", "uuid": f"GPU-{gpu}", "index": 0,
        "message": "managed", "usedBy": "tensor-fusion", "isolationMode": "soft",
        "nodeSelector": {"kubernetes.io/hostname": name},
        "capacity": {"tflops": tflops, "vram": vram}, "available": {"tflops": tflops, "vram": vram}}},
        subresource="status")


async def create_claim(kube: KubeClient, name: str, *, phase: str = "Bound", price: str = "5.07") -> None:
    await kube.create(r.GPUNODECLAIMS, {
        "metadata": {"name": name, "labels": {tfa.MANAGED_BY: POOL, f"{tfa.POOL_LABEL_PREFIX}{POOL}": "true"},
                     "annotations": {tfa.HOURLY_PRICING: price}},
        "spec": {"tflopsOffered": "100", "vramOffered": "40Gi", "gpuDeviceOffered": 1, "nodeName": name,
                 "instanceType": "sim.a100.1", "capacityType": "OnDemand"}})
    await kube.patch(r.GPUNODECLAIMS, name, {"status": {"phase": phase}}, subresource="status")


async def create_worker(kube: KubeClient, name: str, node: str, *, tflops: str, vram: str, qos: str = "low",
                        notes: dict[str, str] | None = None, labels: dict[str, str] | None = None,
                        finalizers: list[str] | None = None) -> None:
    annotations = {tfa.GPU_POOL: POOL, tfa.TFLOPS_REQUEST: tflops, tfa.VRAM_REQUEST: vram, tfa.TFLOPS_LIMIT: tflops,
                   tfa.VRAM_LIMIT: vram, tfa.GPU_COUNT: "1", tfa.GPU_IDS: f"{node}-gpu", tfa.QOS: qos,
                   **(notes or {})}
    await kube.create(r.PODS, {
        "metadata": {"name": name, "namespace": "default", "annotations": annotations,
                     "labels": {tfa.COMPONENT: "worker", tfa.WORKLOAD: name, **(labels or {})},
                     "finalizers": finalizers or []},
        "spec": {"nodeName": node, "schedulerName": "tensor-fusion-scheduler",
                 "containers": [{"name": "w", "image": "worker"}]}})


async def running(kube: KubeClient, *names: str) -> bool:
    found = [(await kube.get(r.GPUNODES, n)).get("status", {}) for n in names]
    return all(s.get("phase") == "Running" and s.get("totalTFlops") not in (None, "0") for s in found)


async def should_delete(kube: KubeClient, name: str) -> bool:
    labels = (await kube.get(r.NODES, name))["metadata"].get("labels", {})
    return bool(labels.get(tfa.SHOULD_DELETE) == "true")


async def pool_status(kube: KubeClient) -> dict[str, Any]:
    return dict((await kube.get(r.GPUPOOLS, POOL)).get("status") or {})


async def events(kube: KubeClient, name: str, reason: str, namespace: str = "default") -> list[str]:
    return [e.get("message", "") for e in await kube.list(r.EVENTS, namespace=namespace)
            if e["involvedObject"].get("name") == name and e.get("reason") == reason]


async def passes_after(compaction: Compaction, wall: Wall, seconds: float) -> None:
    """Move the wall clock and wait for the loop to have looked at the pools since."""
    wall.now += seconds
    seen = compaction.passes
    compaction.poke()
    await eventually(lambda: compaction.passes > seen, what="a compaction pass after the clock moved")


async def gone(kube: KubeClient, resource: r.ApiResource, name: str, namespace: str | None = None) -> bool:
    try:
        await kube.get(resource, name, namespace=namespace)
    except NotFound:
        return True
    return False


async def test_empty_nodes_go_once_old_enough_while_warm_resources_stay(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    wall = Wall()
    async with kube_client(apiserver) as kube, controllers() as tg:
        await create_pool(kube, capacityConfig={"warmResources": {"tflops": "100", "vram": "40Gi"}})
        await create_node(kube, "node-a", price="$1")
        await create_node(kube, "node-b", price="$5.07")
        _, compaction = await start(tg, apiserver, tmp_path, wall)
        await eventually(lambda: running(kube, "node-a", "node-b"), what="both GPUNodes Running")
        # young nodes stay; the pass still writes the status
        await passes_after(compaction, wall, 61)
        assert not await should_delete(kube, "node-a") and not await should_delete(kube, "node-b")

        async def compacted() -> dict[str, Any] | None:
            found = await pool_status(kube)
            return found if found.get("lastCompactionTime") == rfc3339(wall.now) else None

        status = await eventually(compacted, what="lastCompactionTime of the pass")
        assert status["potentialSavingsPerMonth"] == f"{(1 + 5.07) * 730:.2f}"

        await passes_after(compaction, wall, OLD_ENOUGH)
        await eventually(lambda: should_delete(kube, "node-b"), what="the dearer empty node marked should-delete")
        assert not await should_delete(kube, "node-a")  # kept: without it nothing would be warm
        message = (await eventually(lambda: events(kube, POOL, "Compaction"), what="the Compaction event"))[0]
        assert message.startswith("marked empty node node-b tensor-fusion.ai/should-delete=true ($5.07/h): "
                                  "empty and ")
        assert "100 TFLOPS / 40Gi available (warmResources 100 TFLOPS / 40Gi)" in message
        status = await eventually(compacted, what="the status of the pass that removed node-b")
        assert status["potentialSavingsPerMonth"] == "730.00"
        kept = await eventually(lambda: events(kube, POOL, "CompactionKept"), what="why node-a stays")
        assert kept == ["kept empty node node-a: empty, but without it the pool's available capacity would be "
                        "0 TFLOPS / 0, below warmResources 100 TFLOPS / 40Gi"]

        # node-b no longer counts; node-a stays however often the loop looks
        await passes_after(compaction, wall, 120)
        await eventually(compacted, what="a later pass")
        assert not await should_delete(kube, "node-a")
        assert len(await events(kube, POOL, "CompactionKept")) == 1  # said once, not every pass


async def test_do_not_disrupt_keeps_a_node_and_manual_compaction_starts_a_pass(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    wall = Wall()
    async with kube_client(apiserver) as kube, controllers() as tg:
        await create_pool(kube, nodeManagerConfig={"nodeCompaction": {"period": "1h"}})
        await create_node(kube, "node-a")
        await create_node(kube, "node-b", labels={tfa.DO_NOT_DISRUPT: "true"})
        _, compaction = await start(tg, apiserver, tmp_path, wall)
        await eventually(lambda: running(kube, "node-a", "node-b"), what="both GPUNodes Running")
        first = (await eventually(lambda: _field(kube, "lastCompactionTime"), what="the first pass"))
        # old enough now, but the hour is not over: no pass
        await passes_after(compaction, wall, OLD_ENOUGH)
        assert await _field(kube, "lastCompactionTime") == first
        assert not await should_delete(kube, "node-a")

        await kube.patch(r.GPUPOOLS, POOL, {"metadata": {"annotations": {tfa.MANUAL_COMPACTION: rfc3339(wall.now)}}})
        await eventually(lambda: should_delete(kube, "node-a"), what="node-a given back by the manual compaction")
        # the pass marks the node before it records its time in the pool's status
        manual = rfc3339(wall.now)
        await eventually(lambda: _is_field(kube, "lastCompactionTime", manual), what="the manual pass's time")
        assert not await should_delete(kube, "node-b")  # do-not-disrupt
        # the same annotation does not start another pass
        await passes_after(compaction, wall, 60)
        assert await _field(kube, "lastCompactionTime") != rfc3339(wall.now)

        await kube.patch(r.GPUPOOLS, POOL, {"metadata": {"annotations": {tfa.MANUAL_COMPACTION: "yesterday"}}})
        warning = await eventually(lambda: events(kube, POOL, "CompactionConfigInvalid"), what="a warning")
        assert tfa.MANUAL_COMPACTION in warning[0] and "yesterday" in warning[0]


async def _field(kube: KubeClient, name: str) -> Any:
    return (await pool_status(kube)).get(name)


async def _is_field(kube: KubeClient, name: str, value: object) -> bool:
    return bool(await _field(kube, name) == value)


async def test_a_provisioned_node_goes_by_its_claim_once_no_claim_is_in_flight(apiserver: Any,
                                                                                tmp_path: Path) -> None:
    await apply_crds(apiserver)
    wall = Wall()
    async with kube_client(apiserver) as kube, controllers() as tg:
        await create_pool(kube, nodeManagerConfig={"provisioningMode": "Provisioned"})
        await create_claim(kube, f"{POOL}-0000aaaa")
        await create_claim(kube, f"{POOL}-0000bbbb", phase="Creating")
        # the GPUNode carries its claim's price, as the node reconciler writes it
        await create_node(kube, f"{POOL}-0000aaaa", price="$5.07", claim=f"{POOL}-0000aaaa")
        _, compaction = await start(tg, apiserver, tmp_path, wall)
        await eventually(lambda: running(kube, f"{POOL}-0000aaaa"), what="the provisioned GPUNode Running")
        await passes_after(compaction, wall, OLD_ENOUGH)
        assert not await gone(kube, r.GPUNODECLAIMS, f"{POOL}-0000aaaa")  # a claim is still Creating
        assert await _field(kube, "lastCompactionTime") is None

        await kube.patch(r.GPUNODECLAIMS, f"{POOL}-0000bbbb", {"status": {"phase": "Bound"}}, subresource="status")
        await eventually(lambda: gone(kube, r.GPUNODECLAIMS, f"{POOL}-0000aaaa"), what="the empty node's claim deleted")
        message = (await eventually(lambda: events(kube, POOL, "Compaction"), what="the Compaction event"))[0]
        assert message.startswith(f"removed empty node {POOL}-0000aaaa (claim {POOL}-0000aaaa, $5.07/h): ")
        assert not await gone(kube, r.GPUNODECLAIMS, f"{POOL}-0000bbbb")  # its node has not joined


async def test_defrag_moves_a_low_qos_worker_that_fits_elsewhere_and_leaves_protected_ones(
        apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    wall = Wall()
    async with kube_client(apiserver) as kube, controllers() as tg:
        defrag = {"enabled": True, "schedule": "0 3 * * *", "timezone": "UTC", "utilizationThresholdPercent": 40}
        await create_pool(kube, nodeManagerConfig={"nodeCompaction": {"period": "1h", "defrag": defrag}})
        for name in ("light", "busy", "kept", "budgeted", "paired"):
            await create_node(kube, name)
        await create_worker(kube, "small", "light", tflops="10", vram="4Gi", finalizers=[HOLD])
        await create_worker(kube, "big", "busy", tflops="50", vram="20Gi", qos="medium")
        await create_worker(kube, "guarded", "kept", tflops="10", vram="4Gi",
                            notes={tfa.EVICTION_PROTECTION: "24h"})
        await create_worker(kube, "counted", "budgeted", tflops="10", vram="4Gi", labels={"app": "counted"})
        await kube.create(r.PODDISRUPTIONBUDGETS, {"metadata": {"name": "counted", "namespace": "default"},
                                                   "spec": {"minAvailable": 1,
                                                            "selector": {"matchLabels": {"app": "counted"}}}},
                          namespace="default")
        # one eviction allowed, two workers on the node: the node is left whole
        for name in ("pair-1", "pair-2"):
            await create_worker(kube, name, "paired", tflops="5", vram="2Gi", labels={"app": "paired"})
        await kube.create(r.PODDISRUPTIONBUDGETS, {"metadata": {"name": "paired", "namespace": "default"},
                                                   "spec": {"maxUnavailable": 1,
                                                            "selector": {"matchLabels": {"app": "paired"}}}},
                          namespace="default")
        await kube.patch(r.PODDISRUPTIONBUDGETS, "paired", {"status": {"disruptionsAllowed": 1}},
                         namespace="default", subresource="status")
        _, compaction = await start(tg, apiserver, tmp_path, wall)
        await eventually(lambda: running(kube, "light", "busy", "kept", "budgeted", "paired"),
                         what="the GPUNodes Running")

        async def allocated() -> bool:
            wanted = {"light": "90", "busy": "50", "kept": "90", "budgeted": "90", "paired": "90"}
            found = {n: (await kube.get(r.GPUNODES, n)).get("status", {}).get("availableTFlops") for n in wanted}
            return found == wanted

        await eventually(allocated, what="the workers' allocations adopted")
        await passes_after(compaction, wall, 0)
        assert await _field(kube, "lastDefragTime") is None  # not 03:00 yet
        at = cron.parse("0 3 * * *").next_after(wall.now)
        await passes_after(compaction, wall, at - wall.now + 60)

        async def defragged() -> Any:
            return await _field(kube, "lastDefragTime") == rfc3339(wall.now)

        await eventually(defragged, what="lastDefragTime of the defrag")
        moved = await kube.get(r.PODS, "small", namespace="default")  # the test's finalizer holds it
        assert moved["metadata"].get("deletionTimestamp")
        assert moved["metadata"]["annotations"][tfa.DEFRAG_EVICTED] == rfc3339(wall.now)
        evicted = await events(kube, "small", "DefragEvicted")
        assert evicted and f"defrag of pool {POOL}: node light is 10% used" in evicted[0]
        announced = await events(kube, POOL, "Defrag")
        assert len(announced) == 1 and "off node light" in announced[0] and "default/small" in announced[0]
        for name in ("guarded", "counted", "big", "pair-1", "pair-2"):
            pod = await kube.get(r.PODS, name, namespace="default")
            assert tfa.DEFRAG_EVICTED not in pod["metadata"].get("annotations", {}), name
            assert not pod["metadata"].get("deletionTimestamp"), name

        # once the worker is gone, compaction gives the emptied node back
        await kube.patch(r.PODS, "small", {"metadata": {"finalizers": None}}, namespace="default")
        await eventually(lambda: gone(kube, r.PODS, "small", "default"), what="the evicted pod gone")
        wall.now += 1  # newer than the pass that ran with the defrag
        await kube.patch(r.GPUPOOLS, POOL, {"metadata": {"annotations": {tfa.MANUAL_COMPACTION: rfc3339(wall.now)}}})
        await eventually(lambda: should_delete(kube, "light"), what="the emptied node given back")
        assert not any([await should_delete(kube, n) for n in ("busy", "kept", "budgeted", "paired")])


async def test_the_controller_registers_compaction_with_the_minimum_age_of_its_settings(
        apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with controllers() as tg:
        controller = await start_controller(tg, settings_for(apiserver, tmp_path, compaction_min_node_age=42.0))
        assert controller.runtime.provisioning is not None
        compaction = controller.runtime.provisioning.compaction
        assert compaction.min_age_s == 42.0
        assert compaction.run_leader in controller.runtime.leader_tasks
        # it runs as the leader's (and stopping the controller before it started can hang the harness)
        await eventually(lambda: compaction.passes > 0, what="the registered loop's first pass")
