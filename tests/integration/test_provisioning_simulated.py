"""The simulated cloud against the embedded API server: the provider's instance records, and the node
farm of --role=all that boots them into Nodes with simulated GPUs after the boot delay (on a wall
clock the test moves) and removes them when they are terminated."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually, no_error_logged_fixture
from tests.helpers.clock import Wall
from tests.helpers.controller import settings_for
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Node
from tfusion.controller.provisioning import catalog as cat
from tfusion.controller.provisioning.providers.base import LaunchRequest, ProviderError
from tfusion.controller.provisioning.providers.simulated import (
    SIMULATED_INSTANCE,
    SimulatedProvider,
    simulated_instance,
)
from tfusion.embedded.kubelet import LEASE_NAMESPACE
from tfusion.embedded.node_farm import SimulatedNodeFarm
from tfusion.hypervisor.devices.gpu_info import GpuInfoTable
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, NotFound
from tfusion.kube.manager import Manager

pytestmark = pytest.mark.anyio
NAMESPACE = "tensor-fusion-sys"
CATALOG = cat.load()
BOOT_DELAY_S = 30.0
no_error_logged = no_error_logged_fixture(autouse=True)


def request(claim: str, type_name: str = "g6.12xlarge", *, capacity_type: str = cat.ON_DEMAND,
            zone: str = "") -> LaunchRequest:
    kind = CATALOG.get(type_name) or cat.InstanceType(type_name, "A100-SXM4-80GB", 1, 312_000, 80 << 30,
                                                      8000, 64 << 30, {cat.ON_DEMAND: 1.0})
    return LaunchRequest(claim=claim, node_name=claim, instance_type=kind, capacity_type=capacity_type, zone=zone,
                         labels={tfa.NODE_PROVISIONER: claim, tfa.MANAGED_BY: "pool-a"})


def provider(kube: KubeClient, wall: Wall) -> SimulatedProvider:
    return SimulatedProvider(kube, NAMESPACE, CATALOG, boot_delay_s=BOOT_DELAY_S, wall=wall)


async def get(kube: KubeClient, resource: r.ApiResource, name: str, namespace: str | None = None) -> Any:
    try:
        return await kube.get(resource, name, namespace=namespace)
    except NotFound:
        return None


async def ready_node(kube: KubeClient, name: str) -> Any:
    found = await get(kube, r.NODES, name)
    return found if found is not None and Node(found).ready else None


async def gone(kube: KubeClient, resource: r.ApiResource, name: str, namespace: str | None = None) -> bool:
    return await get(kube, resource, name, namespace) is None


@contextlib.asynccontextmanager
async def farm_running(apiserver: Any, tmp_path: Path, wall: Wall) -> AsyncIterator[SimulatedNodeFarm]:
    """The farm on an admin Manager of its own (as the stage runs it), until the block ends."""
    manager = await Manager.connect(settings_for(apiserver, tmp_path, roles=("all",)))
    farm = SimulatedNodeFarm(manager, NAMESPACE, table=GpuInfoTable(), isolation_mode="soft",
                             isolation_policy="static", index_devices=36, wall=wall)
    manager.add(farm.run, leader_only=False, name="simulated node farm")
    async with anyio.create_task_group() as tg:
        await tg.start(manager.run)
        yield farm
        tg.cancel_scope.cancel()


async def test_create_is_idempotent_per_claim_and_terminate_deletes_the_record(kube: KubeClient) -> None:
    wall = Wall()
    sim = provider(kube, wall)
    first = await sim.create(request("pool-a-0123abcd", zone="us-east-1b"))
    again = await sim.create(request("pool-a-0123abcd"))
    assert again == first and first.instance_id.startswith("sim-") and len(first.instance_id) == 14
    assert (first.claim, first.node_name, first.instance_type) == ("pool-a-0123abcd",) * 2 + ("g6.12xlarge",)
    assert (first.state, first.zone, first.capacity_type, first.launched_at) == (
        "pending", "us-east-1b", cat.ON_DEMAND, wall.now)
    records = await kube.list(r.CONFIGMAPS, namespace=NAMESPACE, label_selector=f"{SIMULATED_INSTANCE}=true")
    assert len(records) == 1
    record = records.items[0]
    assert record["metadata"]["labels"][tfa.NODE_PROVISIONER] == "pool-a-0123abcd"
    assert record["data"] | {"nodeLabels": ""} == {
        "instanceType": "g6.12xlarge", "nodeName": "pool-a-0123abcd", "gpuModel": "L4-24GB", "gpuCount": "4",
        "cpu": "48", "memory": "192Gi", "capacityType": "OnDemand", "zone": "us-east-1b",
        "launchedAt": repr(wall.now), "bootAt": repr(wall.now + BOOT_DELAY_S), "nodeLabels": ""}
    parsed = simulated_instance(record)
    assert parsed.node_labels == {tfa.NODE_PROVISIONER: "pool-a-0123abcd", tfa.MANAGED_BY: "pool-a"}
    assert parsed.device_spec == "sim:4xL4-24GB"

    spot = await sim.create(request("pool-a-89abcdef", "a2-ultragpu-1g", capacity_type=cat.SPOT))
    assert spot.instance_id != first.instance_id and spot.zone == "simulated-zone-a"
    wall.now += BOOT_DELAY_S
    listed = await sim.list_instances()
    assert [(i.instance_id, i.state) for i in listed] == sorted(
        [(first.instance_id, "running"), (spot.instance_id, "running")])

    await sim.terminate(first.instance_id)
    await sim.terminate(first.instance_id)  # already gone: not an error
    assert [i.instance_id for i in await sim.list_instances()] == [spot.instance_id]


async def test_requests_the_catalog_does_not_sell_are_refused_naming_the_field(kube: KubeClient) -> None:
    sim = provider(kube, Wall())
    with pytest.raises(ProviderError) as unknown:
        await sim.create(request("pool-a-00000001", "x9.huge"))
    assert not unknown.value.retryable
    assert "instanceType 'x9.huge' is not in the simulated provider's catalog" in str(unknown.value)
    assert "allowed: g6.xlarge, g6.12xlarge" in str(unknown.value)
    only_on_demand = SimulatedProvider(kube, NAMESPACE, cat.Catalog((cat.InstanceType(
        "od.1", "L4-24GB", 1, 121_000, 24 << 30, 4000, 16 << 30, {cat.ON_DEMAND: 0.8}, zones=("z-1",)),)),
        boot_delay_s=0)
    kind = only_on_demand.catalog().types[0]
    with pytest.raises(ProviderError, match=r"capacityType 'Spot' is not sold for od\.1; allowed: OnDemand"):
        await only_on_demand.create(LaunchRequest("c1", "c1", kind, cat.SPOT))
    with pytest.raises(ProviderError, match=r"zone 'z-2' does not offer od\.1; allowed: z-1"):
        await only_on_demand.create(LaunchRequest("c1", "c1", kind, cat.ON_DEMAND, zone="z-2"))
    assert len(await kube.list(r.CONFIGMAPS, namespace=NAMESPACE, label_selector=f"{SIMULATED_INSTANCE}=true")) == 0
    with pytest.raises(ValueError, match="simulated boot delay: -1 is not allowed"):
        SimulatedProvider(kube, NAMESPACE, CATALOG, boot_delay_s=-1)


async def test_an_instance_boots_after_its_delay_reports_its_gpus_and_goes_when_terminated(
        apiserver: Any, kube: KubeClient, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    wall = Wall()
    sim = provider(kube, wall)
    claim = "pool-a-0123abcd"
    instance = await sim.create(request(claim))
    async with farm_running(apiserver, tmp_path, wall) as farm:
        await eventually(lambda: farm.pending.get(instance.instance_id), what="the farm waiting for the boot time")
        assert farm.running == {} and await gone(kube, r.NODES, claim), "no Node before the boot delay"

        wall.now += BOOT_DELAY_S
        farm.recheck()
        # the kubelet creates the Node, then reports its status: wait for both
        raw = await eventually(lambda: ready_node(kube, claim), 20, what="the instance's Node, Ready")
        node = Node(raw)
        await eventually(lambda: farm.running == {instance.instance_id: claim}, what="the farm's running nodes")
        assert {k: node.meta.labels.get(k) for k in (
            tfa.NODE_PROVISIONER, tfa.MANAGED_BY, SIMULATED_INSTANCE, "node.kubernetes.io/instance-type",
            "topology.kubernetes.io/zone", "karpenter.sh/capacity-type", "nvidia.com/gpu.count",
            "kubernetes.io/hostname")} == {
            tfa.NODE_PROVISIONER: claim, tfa.MANAGED_BY: "pool-a", SIMULATED_INSTANCE: "true",
            "node.kubernetes.io/instance-type": "g6.12xlarge", "topology.kubernetes.io/zone": "simulated-zone-a",
            "karpenter.sh/capacity-type": "on-demand", "nvidia.com/gpu.count": "4",
            "kubernetes.io/hostname": claim}
        assert {k: node.allocatable.get(k) for k in ("cpu", "memory", "tensor-fusion.ai/index_0")} == {
            "cpu": "48", "memory": "192Gi", "tensor-fusion.ai/index_0": "36"}

        # the controller makes the GPUNode of a provisioned node; here the test does
        await kube.create(r.GPUNODES, {"metadata": {"name": claim, "labels": {tfa.GPU_POOL: "pool-a"}},
                                       "spec": {"manageMode": "Provisioned"}})

        async def four_gpus() -> list[dict[str, Any]] | None:
            found = (await kube.list(r.GPUS, label_selector=f"{tfa.MANAGED_BY}={claim}")).items
            return found if len(found) == 4 and all(g.get("status", {}).get("gpuModel") for g in found) else None

        gpus = await eventually(four_gpus, 20, what="the node's 4 GPU objects")
        assert {g["status"]["gpuModel"] for g in gpus} == {"NVIDIA L4"}
        assert {g["metadata"]["ownerReferences"][0]["name"] for g in gpus} == {claim}
        assert all(g["metadata"]["annotations"].get(tfa.LAST_SYNC) for g in gpus)
        async def counted() -> dict[str, Any] | None:  # the GPUNode is created first, its status written after
            found = await get(kube, r.GPUNODES, claim)
            return found if found and (found.get("status") or {}).get("totalGPUs") == 4 else None

        await eventually(counted, 20, what="the GPUNode counting the 4 GPUs")

        await sim.terminate(instance.instance_id)
        await eventually(lambda: gone(kube, r.NODES, claim), 20, what="the Node deleted once terminated")
        assert await gone(kube, r.LEASES, claim, LEASE_NAMESPACE)
        await eventually(lambda: not farm.running, what="the farm stopping the node")
        assert await gone(kube, r.NODES, claim), "a stopped kubelet does not register the Node again"


async def test_instances_survive_a_restart_and_nodes_of_terminated_ones_go(
        apiserver: Any, kube: KubeClient, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    wall = Wall()
    sim = SimulatedProvider(kube, NAMESPACE, CATALOG, boot_delay_s=0, wall=wall)
    kept = await sim.create(request("pool-a-11111111", "g6.xlarge"))
    dropped = await sim.create(request("pool-a-22222222", "g6.xlarge"))
    async with farm_running(apiserver, tmp_path, wall) as farm:
        await eventually(lambda: len(farm.running) == 2, 20, what="both nodes booted")
    for name in ("pool-a-11111111", "pool-a-22222222"):
        assert not await gone(kube, r.NODES, name), "stopping --role=all leaves the instances' Nodes"

    await sim.terminate(dropped.instance_id)  # while "--role=all" is down
    async with farm_running(apiserver, tmp_path, wall) as farm:
        await eventually(lambda: farm.running == {kept.instance_id: "pool-a-11111111"}, 20,
                         what="the surviving instance booted again")
        await eventually(lambda: gone(kube, r.NODES, "pool-a-22222222"), 20,
                         what="the Node of the instance terminated meanwhile deleted")
        assert not await gone(kube, r.NODES, "pool-a-11111111")


async def test_an_unreadable_record_boots_nothing_and_the_others_still_boot(
        apiserver: Any, kube: KubeClient, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    wall = Wall()
    sim = SimulatedProvider(kube, NAMESPACE, CATALOG, boot_delay_s=0, wall=wall)
    await kube.create(r.CONFIGMAPS, {"metadata": {"name": "sim-broken", "namespace": NAMESPACE,
                                                  "labels": {SIMULATED_INSTANCE: "true"}},
                                     "data": {"nodeName": "broken"}}, namespace=NAMESPACE)
    good = await sim.create(request("pool-a-33333333", "g6.xlarge"))
    assert [i.instance_id for i in await sim.list_instances()] == [good.instance_id]
    async with farm_running(apiserver, tmp_path, wall) as farm:
        await eventually(lambda: farm.running == {good.instance_id: "pool-a-33333333"}, 20, what="the good one")
        assert await gone(kube, r.NODES, "broken")
