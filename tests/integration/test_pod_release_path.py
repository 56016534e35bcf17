"""The one release path: a worker's GPUs, pod index and host port are released by the pod
reconciler's finalizer, once, and by nothing else.

Against the embedded API server over HTTP with an in-process controller: a deleted worker frees all
three exactly once (the allocator's ledger and counters, the index and port allocators); a worker
whose component label is removed leaves the controller's pod informer but keeps what it holds while
it runs, and is still released when it is deleted later; a controller that restarts while a worker
waits on our finalizer releases it in its new term; a pod that never carries our finalizer (a remote
client holding a host port) is released from the UID its deletion left.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.controller import (
    Controller,
    controllers,
    create_gpu,
    create_pool,
    kube_client,
    settings_for,
    start_controller,
    worker,
)
from tests.helpers.scheduler_index import gone
from tfusion.allocator import GpuAllocator
from tfusion.api import annotations as tfa
from tfusion.api import podindex
from tfusion.controller.scheduling.assignments import Assignments
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient

pytestmark = pytest.mark.anyio

NODE = "node-1"
GPU = "gpu-a1"
PORT = 40007
INDEX = 5


def held_worker(name: str) -> dict[str, Any]:
    """A bound worker holding GPU `GPU` (30 TFLOPS, 8Gi), pod index `INDEX` and host port `PORT`."""
    pod = worker(name, NODE, [GPU], tflops="30", vram="8Gi")
    resource, count = podindex.encode_pod_index(INDEX)
    pod["metadata"]["annotations"][tfa.PORT_NUMBER] = str(PORT)
    pod["spec"]["containers"][0]["resources"] = {"limits": {resource: str(count)}}
    return pod


def allocator_of(ctl: Controller) -> GpuAllocator:
    allocator = ctl.service.allocator
    assert allocator is not None
    return allocator


def assignments_of(ctl: Controller) -> Assignments:
    assignments = ctl.runtime.assignments
    assert assignments is not None
    return assignments


def holds(ctl: Controller, uid: str) -> tuple[bool, bool, bool]:
    """(GPUs in the ledger, pod index, host port) held by pod `uid` on the leader."""
    allocator, assignments = ctl.service.allocator, assignments_of(ctl)
    indexes, ports = assignments.indexes, assignments.ports
    return (allocator is not None and allocator.has_allocation(uid),
            indexes is not None and indexes.held().get(uid) == INDEX,
            ports is not None and ports.node(NODE).held().get(uid) == PORT)


async def releases(ctl: Controller, reason: str) -> float:
    text = (await ctl.http.get("/metrics")).text
    found = re.search(rf'^tfusion_allocator_releases_total{{reason="{reason}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


async def start(tg: Any, apiserver: Any, tmp_path: Path) -> Controller:
    return await start_controller(tg, settings_for(apiserver, tmp_path))


async def create_held(kube: KubeClient, ctl: Controller, name: str) -> str:
    """Create a held worker and wait until the leader holds all three and the pod has our finalizer."""
    uid = str((await kube.create(r.PODS, held_worker(name)))["metadata"]["uid"])

    async def all_held() -> bool:
        pod = await kube.get(r.PODS, name, namespace="default")
        return holds(ctl, uid) == (True, True, True) and tfa.FINALIZER in pod["metadata"].get("finalizers", [])

    await eventually(all_held, what=f"{name}'s GPUs, index and port held, and our finalizer on it")
    return uid


async def setup(kube: KubeClient) -> None:
    await create_pool(kube)
    await create_gpu(kube, GPU, NODE)


async def test_a_deleted_worker_releases_its_gpus_index_and_port_exactly_once(apiserver: Any,
                                                                              tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube, controllers() as tg:
        await setup(kube)
        ctl = await start(tg, apiserver, tmp_path)
        uid = await create_held(kube, ctl, "w1")
        assert allocator_of(ctl).available(GPU) == (70_000, 32 * 2**30)

        await kube.delete(r.PODS, "w1", namespace="default")
        await eventually(lambda: gone(kube, "w1"), what="the pod gone once its finalizer went")
        assert holds(ctl, uid) == (False, False, False)
        assert allocator_of(ctl).available(GPU) == (100_000, 40 * 2**30)

        # a pod of the same name: the old UID's tombstone is let go without touching the new pod
        new_uid = await create_held(kube, ctl, "w1")
        assert new_uid != uid and not allocator_of(ctl).has_allocation(uid)
        assert await releases(ctl, "deleted") == 1.0
        assert await releases(ctl, "replaced") == 0.0 and await releases(ctl, "vanished") == 0.0
        reconcilers = ctl.runtime.reconcilers
        assert reconcilers is not None and reconcilers.pod.releases == 1


async def test_a_worker_that_loses_its_label_keeps_what_it_holds_until_deleted(apiserver: Any,
                                                                               tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube, controllers() as tg:
        await setup(kube)
        ctl = await start(tg, apiserver, tmp_path)
        reconcilers = ctl.runtime.reconcilers
        assert reconcilers is not None
        reconcilers.pod.label_recheck_s = 0.2
        uid = await create_held(kube, ctl, "w1")

        # out of the controller's pod informer (its selector is the component label), still running
        await kube.patch(r.PODS, "w1", {"metadata": {"labels": {tfa.COMPONENT: None}}}, namespace="default")

        async def warned() -> bool:
            return any(e["involvedObject"].get("name") == "w1" and e.get("reason") == "WorkerLabelRemoved"
                       for e in await kube.list(r.EVENTS, namespace="default"))

        await eventually(warned, what="the WorkerLabelRemoved event")
        assert "default/w1" not in reconcilers.pod.pods
        assert holds(ctl, uid) == (True, True, True), "a running worker keeps its GPUs, index and port"

        # deleted later, out of the informer: the recheck releases it and lets its finalizer go
        await kube.delete(r.PODS, "w1", namespace="default")
        await eventually(lambda: gone(kube, "w1"), what="the unlabelled pod gone once released")
        assert holds(ctl, uid) == (False, False, False)
        assert await releases(ctl, "vanished") == 1.0


async def test_a_restart_releases_a_worker_left_waiting_on_its_finalizer(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube, controllers() as tg:
        await setup(kube)
        ctl = await start(tg, apiserver, tmp_path)
        uid = await create_held(kube, ctl, "w1")
        await ctl.stop()

        # deleted while no controller runs: the pod waits on our finalizer
        await kube.delete(r.PODS, "w1", namespace="default")
        pod = await kube.get(r.PODS, "w1", namespace="default")
        assert pod["metadata"].get("deletionTimestamp") and tfa.FINALIZER in pod["metadata"]["finalizers"]

        ctl = await start(tg, apiserver, tmp_path / "again")
        await eventually(lambda: gone(kube, "w1"), what="the pod released by the new term")
        assert holds(ctl, uid) == (False, False, False)
        assert allocator_of(ctl).available(GPU) == (100_000, 40 * 2**30)
        assert await releases(ctl, "deleted") == 1.0


async def test_a_pod_that_never_carries_our_finalizer_is_released_from_its_tombstone(apiserver: Any,
                                                                                     tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube, controllers() as tg:
        ctl = await start(tg, apiserver, tmp_path)
        # a remote client holds no GPU, so it never gets our finalizer; it may hold a cluster host port
        client = {"metadata": {"name": "c1", "namespace": "default",
                               "labels": {tfa.COMPONENT: tfa.COMPONENT_CLIENT, tfa.HOST_PORT: tfa.HOST_PORT_AUTO},
                               "annotations": {tfa.PORT_NUMBER: "42005"}},
                  "spec": {"containers": [{"name": "app", "image": "app"}]}}
        uid = str((await kube.create(r.PODS, client))["metadata"]["uid"])

        def port_held() -> bool:
            ports = assignments_of(ctl).ports
            return ports is not None and ports.cluster.held().get(uid) == 42005

        await eventually(port_held, what="the client's cluster host port held")
        pod = await kube.get(r.PODS, "c1", namespace="default")
        assert tfa.FINALIZER not in (pod["metadata"].get("finalizers") or [])

        await kube.delete(r.PODS, "c1", namespace="default")  # gone at once: nothing holds it back
        await eventually(lambda: not port_held(), what="the port released by the pod reconciler")
