"""The pod index at bind, in-process controller against the embedded API server over real HTTP:
two pods bound to one node carry distinct `tensor-fusion.ai/index` annotations and index limits;
a pod whose index another pod holds on the only node waits with the reason, survives a leader
restart (the lock is rebuilt from the bound pods), and is bound once the holder is deleted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.controller import controllers, create_gpu, create_pool, kube_client, settings_for, start_controller
from tests.helpers.scheduler import bound, create_node, gpu_pod, scheduled_condition
from tests.helpers.scheduler_index import gone
from tfusion.allocator.framework import INDEX_BUSY
from tfusion.api import annotations as tfa
from tfusion.api import podindex
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient

pytestmark = pytest.mark.anyio


async def create_index_node(kube: KubeClient, name: str) -> None:
    """A Ready node whose device plugin advertises the index resources (as the hypervisor's does)."""
    await create_node(kube, name, allocatable=dict.fromkeys(podindex.index_resource_names(), "64"))


def indexed_pod(name: str, index: int) -> dict[str, Any]:
    """A worker pod as the webhook leaves it: GPU annotations and the index resource limit."""
    pod = gpu_pod(name, vram="4Gi", tflops="10")
    resource, count = podindex.encode_pod_index(index)
    pod["spec"]["containers"][0]["resources"] = {"limits": {resource: str(count)}}
    return pod


def index_limits(pod: dict[str, Any]) -> dict[str, str]:
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    return {k: v for k, v in limits.items() if k.startswith(tfa.INDEX_RESOURCE_PREFIX)}


async def test_two_pods_on_one_node_carry_distinct_index_annotations_and_limits(
        apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await create_pool(kube)
        await create_index_node(kube, "node-a")
        await create_gpu(kube, "gpu-a1", "node-a")
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path))
            await kube.create(r.PODS, indexed_pod("w3", 3))
            await kube.create(r.PODS, indexed_pod("w9", 9))
            first = await eventually(lambda: bound(kube, "w3"), what="w3 bound")
            second = await eventually(lambda: bound(kube, "w9"), what="w9 bound")
            assert first["spec"]["nodeName"] == second["spec"]["nodeName"] == "node-a"
            notes = [p["metadata"]["annotations"] for p in (first, second)]
            assert [n[tfa.INDEX] for n in notes] == ["3", "9"]
            assert [n[tfa.GPU_IDS] for n in notes] == ["gpu-a1", "gpu-a1"]  # one GPU, shared
            assert index_limits(first) == {podindex.index_resource(0): "3"}
            assert index_limits(second) == {podindex.index_resource(1): "1"}
            allocator = ctl.service.allocator
            assert allocator is not None
            uids = (first["metadata"]["uid"], second["metadata"]["uid"])
            assert allocator.index_lock.snapshot() == {"node-a": {3: (uids[0],), 9: (uids[1],)}}


async def test_an_index_held_on_the_node_waits_survives_a_restart_and_binds_when_freed(
        apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube:
        await create_pool(kube)
        await create_index_node(kube, "node-a")
        await create_gpu(kube, "gpu-a1", "node-a")
        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path))
            await kube.create(r.PODS, indexed_pod("holder", 5))
            holder = await eventually(lambda: bound(kube, "holder"), what="holder bound")
            assert holder["metadata"]["annotations"][tfa.INDEX] == "5"
            await kube.create(r.PODS, indexed_pod("waiter", 5))
            condition = await eventually(lambda: scheduled_condition(kube, "waiter"), what="waiter condition")
            assert condition["message"] == f"0/1 nodes are available: 1 {INDEX_BUSY}."
            why = (await ctl.http.get("/api/why", params={"namespace": "default", "name": "waiter"})).json()
            detail = why["nodes"]["node-a"]["reasons"][0]["detail"]
            assert "pod index 5 is held on node node-a by pod default/holder" in detail
            await ctl.stop()

        async with controllers() as tg:  # a new leader term: the lock comes back from the bound pod
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path))
            allocator = await ctl.service.wait_ready()
            assert allocator is not None
            assert allocator.index_lock.snapshot() == {"node-a": {5: (holder["metadata"]["uid"],)}}
            await eventually(lambda: scheduled_condition(kube, "waiter"), what="waiter still refused")
            assert await bound(kube, "waiter") is None

            await kube.delete(r.PODS, "holder", namespace="default", grace_period_seconds=0)
            await eventually(lambda: gone(kube, "holder"), what="holder deleted (finalizer removed)")
            waiter = await eventually(lambda: bound(kube, "waiter"), timeout=20.0, what="waiter bound once freed")
            assert waiter["metadata"]["annotations"][tfa.INDEX] == "5"
            assert allocator.index_lock.snapshot() == {"node-a": {5: (waiter["metadata"]["uid"],)}}
