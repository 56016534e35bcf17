"""`--role=all` plays the simulated cloud: an instance the simulated provider launches becomes a second
Node with its own simulated GPUs (the controller makes its GPUNode from the GPUNodeClaim it names, and
the farm reports the GPUs), it is served again after a restart, and terminating it removes it.

The test plays the claim reconciler's part itself: the claim belongs to the default pool, which is
AutoSelect, so no reconciler launches an instance for it; the test does, through the provider."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from tests.helpers.role_all import TF, RoleAll
from tfusion.api import annotations as tfa
from tfusion.controller.provisioning import catalog as cat
from tfusion.controller.provisioning.providers.base import Instance, LaunchRequest
from tfusion.controller.provisioning.providers.simulated import SimulatedProvider
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient

T = TypeVar("T")
CLAIM = "tensor-fusion-shared-0a1b2c3d"


def with_provider(run: RoleAll, call: Callable[[SimulatedProvider], Awaitable[T]]) -> T:
    """Run one provider call against the process's API server (the controller's part in the flow)."""
    async def main() -> T:
        client = await KubeClient.connect(str(run.kubeconfig))
        try:
            return await call(SimulatedProvider(client, "tensor-fusion-sys", cat.load(), boot_delay_s=0))
        finally:
            await client.close()

    return anyio.run(main)


async def launch(provider: SimulatedProvider) -> Instance:
    kind = provider.catalog().get("g6.12xlarge")
    assert kind is not None
    await provider.client.create(r.GPUNODECLAIMS, {
        "metadata": {"name": CLAIM, "labels": {tfa.MANAGED_BY: "tensor-fusion-shared"}},
        "spec": {"tflopsOffered": "484", "vramOffered": "92136Mi", "gpuDeviceOffered": 4,
                 "instanceType": "g6.12xlarge", "nodeName": CLAIM}})
    return await provider.create(LaunchRequest(CLAIM, CLAIM, kind, cat.ON_DEMAND, labels={tfa.NODE_PROVISIONER: CLAIM}))


async def terminate_all(provider: SimulatedProvider) -> None:
    for instance in await provider.list_instances():
        await provider.terminate(instance.instance_id)


def gpus_of(run: RoleAll, node: str) -> list[dict[str, Any]] | None:
    items: list[dict[str, Any]] = run.get(f"{TF}/gpus?labelSelector=tensor-fusion.ai/managed-by%3D{node}")["items"]
    running = [g for g in items if (g.get("status") or {}).get("phase") == "Running"]
    return running if len(running) == 4 else None


def with_status(node: dict[str, Any] | None) -> dict[str, Any] | None:
    return node if node and "status" in node else None


def node_gone(run: RoleAll, node: str) -> bool:
    return node not in {n["metadata"]["name"] for n in run.get("/api/v1/nodes")["items"]}


def test_a_simulated_instance_joins_with_its_gpus_survives_a_restart_and_leaves(role_all: RoleAll) -> None:
    role_all.start()
    role_all.wait_for("the controller and hypervisor to be ready", role_all.ready, timeout=60)
    instance = with_provider(role_all, launch)
    assert instance.node_name == CLAIM

    # the kubelet registers the Node first and reports its status right after, as a real one does
    node = role_all.wait_for("the instance's Node with its status",
                             lambda: with_status(role_all.get(f"/api/v1/nodes/{CLAIM}")))
    labels = node["metadata"]["labels"]
    assert labels[tfa.NODE_PROVISIONER] == CLAIM and labels["node.kubernetes.io/instance-type"] == "g6.12xlarge"
    assert node["status"]["allocatable"]["cpu"] == "48"
    gpus = role_all.wait_for("the instance's 4 GPUs Running", lambda: gpus_of(role_all, CLAIM), timeout=60)
    assert {g["status"]["gpuModel"] for g in gpus} == {"NVIDIA L4"}

    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{CLAIM}"
    before = role_all.get(lease_path)["spec"]["renewTime"]
    code, _ = role_all.stop()
    assert code == 0
    role_all.start()
    role_all.wait_for("ready again", role_all.ready, timeout=60)
    role_all.wait_for("the instance's node served again after the restart (its Lease renewed)",
                      lambda: role_all.get(lease_path)["spec"]["renewTime"] != before)
    assert role_all.get(f"/api/v1/nodes/{CLAIM}")["metadata"]["labels"][tfa.NODE_PROVISIONER] == CLAIM

    with_provider(role_all, terminate_all)
    role_all.wait_for("the Node deleted once the instance is terminated", lambda: node_gone(role_all, CLAIM))
