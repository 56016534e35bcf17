"""Pods that name `default-scheduler` (or no scheduler) on the embedded API server: with
`schedule_default_pods` (what `--role=all` sets) the built-in scheduler binds a plain pod to a Ready
node it fits, with no GPU annotation; a pod that fits nowhere gets PodScheduled=False, a
FailedScheduling event and an answer from `/api/why`, and so does a pod naming a scheduler that
does not run; without the setting (a real cluster, where kube-scheduler owns them) such a pod is
left alone while a GPU pod beside it is bound."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.controller import controllers, kube_client, settings_for, start_controller
from tests.helpers.scheduler import bound, create_node, events_for, gpu_pod, one_gpu_node, scheduled_condition
from tfusion.api import annotations as tfa
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient
from tfusion.settings import Settings

pytestmark = pytest.mark.anyio


def plain_pod(name: str, *, cpu: str = "100m", scheduler: str | None = "default-scheduler",
              node_selector: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod as `kubectl run` makes it: no TensorFusion label or annotation."""
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox",
                                            "resources": {"requests": {"cpu": cpu}}}]}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"metadata": {"name": name, "namespace": "default"}, "spec": spec}


def embedded(apiserver: Any, tmp_path: Path) -> Settings:
    """The controller as roles.py wires it beside the embedded API server."""
    return settings_for(apiserver, tmp_path, schedule_default_pods=True)


async def test_plain_pods_are_bound_to_a_ready_node_that_fits_without_gpus(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await one_gpu_node(kube)  # node-a: Ready, 8 CPUs
        await create_node(kube, "node-small", cpu="1")
        await kube.patch(r.NODES, "node-small", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}},
                         subresource="status")
        async with controllers() as tg:
            await start_controller(tg, embedded(apiserver, tmp_path))
            named = await kube.create(r.PODS, plain_pod("plain", cpu="2"))
            unnamed = await kube.create(r.PODS, plain_pod("unnamed", scheduler=None))
            # the API server fills in the default scheduler, as kube-apiserver does
            assert named["spec"]["schedulerName"] == unnamed["spec"]["schedulerName"] == "default-scheduler"
            for name in ("plain", "unnamed"):
                await placed_on_node_a(kube, name)


async def placed_on_node_a(kube: KubeClient, name: str) -> None:
    pod = await eventually(lambda: bound(kube, name), what=f"{name} bound")
    assert pod["spec"]["nodeName"] == "node-a"  # node-small is not Ready
    assert tfa.GPU_IDS not in (pod["metadata"].get("annotations") or {})
    conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert conditions["PodScheduled"] == "True"
    await eventually(lambda: events_for(kube, name, "Scheduled"), what=f"{name}'s Scheduled event")


async def test_a_plain_pod_that_fits_nowhere_says_why(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await one_gpu_node(kube)
        async with controllers() as tg:
            ctl = await start_controller(tg, embedded(apiserver, tmp_path))
            await kube.create(r.PODS, plain_pod("huge", cpu="64"))
            await kube.create(r.PODS, plain_pod("picky", node_selector={"disk": "ssd"}))
            native = plain_pod("native")
            native["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
            await kube.create(r.PODS, native)
            huge = await eventually(lambda: scheduled_condition(kube, "huge"), what="huge's condition")
            assert huge["reason"] == "Unschedulable"
            assert huge["message"] == "0/1 nodes are available: 1 Insufficient cpu."
            picky = await eventually(lambda: scheduled_condition(kube, "picky"), what="picky's condition")
            assert picky["message"] == "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
            # a resource the node does not list, as kube-scheduler's NodeResourcesFit counts it
            native_condition = await eventually(lambda: scheduled_condition(kube, "native"), what="native's condition")
            assert native_condition["message"] == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
            await kube.create(r.PODS, plain_pod("elsewhere", scheduler="my-scheduler"))
            elsewhere = await eventually(lambda: scheduled_condition(kube, "elsewhere"), what="elsewhere's condition")
            assert elsewhere["message"].startswith("no scheduler named 'my-scheduler' runs here")
            await ctl.runtime.events.drain()
            events = await eventually(lambda: events_for(kube, "huge", "FailedScheduling"), what="the event")
            assert events[0]["message"] == huge["message"]
            why = (await ctl.http.get("/api/why", params={"namespace": "default", "name": "huge"})).json()
            assert why["scheduled"] is False and why["message"] == huge["message"]
            reason = why["nodes"]["node-a"]["reasons"][0]
            assert (reason["resource"], reason["requested"]) == ("cpu", "64")
            # a node that fits arrives: the parked pod is retried and bound there
            await create_node(kube, "node-big", cpu="96")
            pod = await eventually(lambda: bound(kube, "huge"), what="huge bound once a node fits")
            assert pod["spec"]["nodeName"] == "node-big"


async def test_without_the_setting_default_scheduler_pods_are_left_alone(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await one_gpu_node(kube)
        async with controllers() as tg:
            await start_controller(tg, settings_for(apiserver, tmp_path))
            await kube.create(r.PODS, plain_pod("theirs"))
            await kube.create(r.PODS, gpu_pod("ours"))
            await eventually(lambda: bound(kube, "ours"), what="the GPU pod bound")
            pod = await kube.get(r.PODS, "theirs", namespace="default")
            assert not pod["spec"].get("nodeName")
            assert not [c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == "PodScheduled"]
            assert await events_for(kube, "theirs", "FailedScheduling") == []
