"""The simulated kubelet against the embedded API server over HTTP (its GPUNode is the controller's
Node reconciler's: tests/integration/test_reconcilers.py)."""

from __future__ import annotations

from typing import Any, TypeVar

import anyio
import pytest

from tests.helpers import eventually
from tfusion.api.accessors import text
from tfusion.api.quantity import Quantity
from tfusion.embedded.devices import DevicePlan, plan_devices
from tfusion.embedded.kubelet import LEASE_NAMESPACE, SimulatedKubelet
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, NotFound
from tfusion.kube.manager import Manager
from tfusion.settings import Settings

pytestmark = pytest.mark.anyio
T = TypeVar("T")
NODE = "n1"


def settings(**changes: Any) -> Settings:
    return Settings.load({}, env={}, roles=("all",)).replace(node_name=NODE, **changes)


def manager_of(kube: KubeClient) -> Manager:
    """A Manager on the test's client, as roles.py gives the stage one."""
    return Manager(settings(), kube)


async def plan(devices: str) -> DevicePlan:
    return await plan_devices(settings(devices=devices, sim_devices_fallback="off"))


def pod(name: str, node: str | None = NODE, **meta: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}],
                            "initContainers": [{"name": "setup", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", **meta},
            "spec": spec}


async def test_node_registration_keeps_user_changes(kube: KubeClient) -> None:
    kubelet = SimulatedKubelet(manager_of(kube), NODE, await plan("sim:2xA100-SXM4-80GB"))
    node = await kubelet.register()
    labels = node.meta.labels
    assert labels["nvidia.com/gpu.present"] == "true" and labels["nvidia.com/gpu.count"] == "2"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert labels["kubernetes.io/hostname"] == NODE
    assert {c["type"]: c["status"] for c in node.conditions}["Ready"] == "True" and node.ready
    assert int(text(node.raw, "status", "capacity", "cpu")) >= 1
    for resource in ("memory", "ephemeral-storage"):  # the canonical form Kubernetes prints
        quantity = text(node.raw, "status", "capacity", resource)
        assert str(Quantity(quantity)) == quantity and Quantity(quantity).value() > 0
    await kubelet.renew_lease()
    lease = await kube.get(r.LEASES, NODE, namespace=LEASE_NAMESPACE)
    assert lease["spec"]["holderIdentity"] == NODE and lease["spec"]["leaseDurationSeconds"] == 40

    await kube.patch(r.NODES, NODE, {"metadata": {"labels": {"zone": "a"}}, "spec": {"unschedulable": True}})
    no_gpus = SimulatedKubelet(manager_of(kube), NODE, DevicePlan("auto", (), "none", "no driver"))
    node = await no_gpus.register()
    assert node.unschedulable and node.meta.labels["zone"] == "a"
    assert not any(k.startswith("nvidia.com/") for k in node.meta.labels)


async def test_pods_run_and_deletions_finish(kube: KubeClient) -> None:
    manager = manager_of(kube)
    kubelet = SimulatedKubelet(manager, NODE, await plan("sim:1xH100-SXM5-80GB"))
    async with anyio.create_task_group() as tg:
        await tg.start(kubelet.run)
        await tg.start(manager.run)
        await kube.create(r.PODS, pod("plain"))
        await kube.create(r.PODS, pod("guarded", finalizers=["example.com/keep"]))
        await kube.create(r.PODS, pod("elsewhere", node="other"))
        await kube.create(r.PODS, pod("unbound", node=None))

        async def running(name: str) -> dict[str, Any] | None:
            found = await kube.get(r.PODS, name, namespace="default")
            return found if found["status"].get("phase") == "Running" else None

        plain = await eventually(lambda: running("plain"), 5, what="pod plain Running", retry_on=(NotFound,))
        status = plain["status"]
        assert status["podIP"] == "127.0.0.1" and status["hostIP"] == "127.0.0.1" and status["startTime"]
        assert status["containerStatuses"][0]["ready"] is True
        assert "terminated" in status["initContainerStatuses"][0]["state"]
        assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
        await eventually(lambda: running("guarded"), 5, what="pod guarded Running", retry_on=(NotFound,))
        for name in ("elsewhere", "unbound"):
            untouched = await kube.get(r.PODS, name, namespace="default")
            assert untouched["status"].get("phase", "Pending") == "Pending", untouched["status"]

        await kube.delete(r.PODS, "guarded", namespace="default")

        async def stopped() -> dict[str, Any] | None:
            found = await kube.get(r.PODS, "guarded", namespace="default")
            return found if found["status"].get("phase") == "Succeeded" else None

        guarded = await eventually(stopped, 5, what="pod guarded stopped", retry_on=(NotFound,))
        assert "terminated" in guarded["status"]["containerStatuses"][0]["state"]
        await kube.patch(r.PODS, "guarded", {"metadata": {"finalizers": None}}, namespace="default")

        async def gone() -> bool:
            try:
                await kube.get(r.PODS, "guarded", namespace="default")
            except NotFound:
                return True
            return False

        await eventually(gone, 5, what="pod guarded gone once its finalizer went", retry_on=(NotFound,))
        tg.cancel_scope.cancel()
