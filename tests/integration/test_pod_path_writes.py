"""The writes a new bare worker costs the pod reconciler (issue 33: fewer API writes per pod): a bare
local worker's workload created from the webhook's pending-owned-workload-spec, owned by it (one
write); for a workload already there (a remote client's, which the webhook creates), the
workload's new owner and the removal of its awaiting-pod mark in one write, seen on a watch from
the workload's creation (the first change that carries either part carries both); nothing written
to a pod the webhook admitted (it keeps its pending-owned-workload annotation: the owner reference
says the request is met); a worker that came without the finalizer gets it in one write."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from tests.apiserver_fixture import apply_crds
from tests.helpers import eventually
from tests.helpers.controller import controllers, kube_client, settings_for, start_controller
from tfusion.api import annotations as tfa
from tfusion.api.timestamps import rfc3339
from tfusion.controller.webhook.workloads import AWAITING_POD
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient

pytestmark = pytest.mark.anyio

POOL = "gpu-pool"
DEADLINE_S = 30.0


async def first_change(kube: KubeClient, resource: r.ApiResource, name: str, since: str,
                       shows: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The first version of `name` after resourceVersion `since` for which `shows` is true."""
    with anyio.fail_after(DEADLINE_S):
        async for kind, obj in kube.watch(resource, namespace="default", resource_version=since):
            if kind == "MODIFIED" and obj["metadata"]["name"] == name and shows(obj):
                return obj
    raise AssertionError(f"the watch of {resource.plural} ended before {name} changed")


async def cluster(kube: KubeClient) -> None:
    """One pool, one node and its GPU, as the quota test of test_reconcilers.py makes them."""
    await kube.create(r.GPUPOOLS, {"metadata": {"name": POOL}, "spec": {"nodeManagerConfig": {}}})
    await kube.create(r.NODES, {"metadata": {"name": "gpu-1", "labels": {"kubernetes.io/hostname": "gpu-1"}}})
    await kube.create(r.GPUS, {"metadata": {"name": "gpu-1a", "labels": {tfa.GPU_POOL: POOL, tfa.MANAGED_BY: "gpu-1"},
                                            "annotations": {tfa.LAST_SYNC: rfc3339()}}})
    await kube.patch(r.GPUS, "gpu-1a", {"status": {
        "phase": "Running", "vendor": "NVIDIA", "gpuModel": "A100_SXM_40G", "uuid": "GPU-gpu-1a", "index": 0,
        "message": "managed", "usedBy": "tensor-fusion", "isolationMode": "soft",
        "nodeSelector": {"kubernetes.io/hostname": "gpu-1"},
        "capacity": {"tflops": "100", "vram": "40Gi"}, "available": {"tflops": "100", "vram": "40Gi"}}},
        subresource="status")


def bare_worker(name: str, *, finalizer: bool) -> dict[str, Any]:
    """A bound worker as the webhook and the scheduler leave a bare pod (`finalizer=False`: as one
    created past the webhook): its workload still to adopt."""
    notes = {tfa.GPU_POOL: POOL, tfa.TFLOPS_REQUEST: "10", tfa.VRAM_REQUEST: "1Gi", tfa.TFLOPS_LIMIT: "10",
             tfa.VRAM_LIMIT: "1Gi", tfa.GPU_COUNT: "1", tfa.GPU_IDS: "gpu-1a", tfa.PENDING_OWNED_WORKLOAD: name}
    return {"metadata": {"name": name, "namespace": "default", "annotations": notes,
                         "labels": {tfa.COMPONENT: "worker", tfa.WORKLOAD: name},
                         **({"finalizers": [tfa.FINALIZER]} if finalizer else {})},
            "spec": {"nodeName": "gpu-1", "schedulerName": "tensor-fusion-scheduler",
                     "containers": [{"name": "w", "image": "worker"}]}}


async def adopted(kube: KubeClient, workload: dict[str, Any], uid: str) -> dict[str, Any]:
    """The workload's first version owned by the pod `uid`, checked to be the one adoption write."""

    def owned(obj: dict[str, Any]) -> bool:
        return any(o.get("uid") == uid for o in obj["metadata"].get("ownerReferences") or [])

    found = await first_change(kube, r.TENSORFUSIONWORKLOADS, workload["metadata"]["name"],
                               workload["metadata"]["resourceVersion"], owned)
    assert [(o["kind"], o["controller"]) for o in found["metadata"]["ownerReferences"]] == [("Pod", True)]
    assert AWAITING_POD not in (found["metadata"].get("annotations") or {})
    assert found["metadata"]["finalizers"] == [tfa.FINALIZER]
    return found


async def new_workload(kube: KubeClient, name: str) -> dict[str, Any]:
    return await kube.create(r.TENSORFUSIONWORKLOADS, {  # as the webhook creates it
        "metadata": {"name": name, "namespace": "default", "annotations": {AWAITING_POD: rfc3339()},
                     "finalizers": [tfa.FINALIZER]}, "spec": {"poolName": POOL}})


@contextlib.asynccontextmanager
async def a_bare_worker(apiserver: Any, tmp_path: Path, name: str, *,
                        finalizer: bool) -> AsyncIterator[tuple[KubeClient, dict[str, Any], dict[str, Any]]]:
    """A running controller, then a workload as the webhook creates it and its bare worker: (a client,
    the workload, the pod) as created."""
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube, controllers() as tg:
        await cluster(kube)
        await start_controller(tg, settings_for(apiserver, tmp_path))
        workload = await new_workload(kube, name)
        yield kube, workload, await kube.create(r.PODS, bare_worker(name, finalizer=finalizer))


async def test_an_admitted_bare_worker_costs_one_write_its_adoption(apiserver: Any, tmp_path: Path) -> None:
    async with a_bare_worker(apiserver, tmp_path, "solo", finalizer=True) as (kube, workload, pod):
        await adopted(kube, workload, pod["metadata"]["uid"])

        # the workload's status is written after the adoption (its reconciler counts the worker);
        # by then the pod reconciler has seen the adoption, and the pod was never written
        async def counted() -> Any:
            found = await kube.get(r.TENSORFUSIONWORKLOADS, "solo", namespace="default")
            return found if (found.get("status") or {}).get("workerCount") == 1 else None

        await eventually(counted, what="the workload counting its worker")
        now = await kube.get(r.PODS, "solo", namespace="default")
        assert now["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]
        assert now["metadata"]["annotations"][tfa.PENDING_OWNED_WORKLOAD] == "solo"


async def test_a_bare_local_worker_costs_one_write_its_workload_created_owned(apiserver: Any,
                                                                              tmp_path: Path) -> None:
    """A worker carrying the webhook's pending-owned-workload-spec: its workload is created by the
    pod reconciler as that annotation says, owned by the pod and with our finalizer from the start
    (no awaiting mark, no adoption write); after it only its status is written, never the pod."""
    wanted = {"labels": {tfa.GPU_POOL: POOL}, "annotations": {tfa.WORKLOAD_MODE: tfa.WORKLOAD_MODE_DYNAMIC},
              "spec": {"poolName": POOL, "qos": "medium", "isLocalGPU": True, "gpuCount": 1, "isolation": "soft",
                       "resources": {"requests": {"tflops": "10", "vram": "1Gi"},
                                     "limits": {"tflops": "10", "vram": "1Gi"}}}}
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube, controllers() as tg:
        await cluster(kube)
        await start_controller(tg, settings_for(apiserver, tmp_path))
        body = bare_worker("own", finalizer=True)
        body["metadata"]["annotations"][tfa.PENDING_OWNED_WORKLOAD_SPEC] = orjson.dumps(wanted).decode()
        pod = await kube.create(r.PODS, body)
        seen: list[tuple[str, dict[str, Any]]] = []
        with anyio.fail_after(DEADLINE_S):  # resourceVersions are the API server's one sequence
            async for kind, obj in kube.watch(r.TENSORFUSIONWORKLOADS, namespace="default",
                                              resource_version=pod["metadata"]["resourceVersion"]):
                seen.append((kind, obj))
                if (obj.get("status") or {}).get("workerCount") == 1:
                    break
        (kind, created), later = seen[0], seen[1:]
        assert kind == "ADDED"
        meta = created["metadata"]
        assert [(o["kind"], o["uid"], o["controller"]) for o in meta["ownerReferences"]] == [
            ("Pod", pod["metadata"]["uid"], True)]
        assert meta["finalizers"] == [tfa.FINALIZER] and meta["labels"] == wanted["labels"]
        assert meta["annotations"] == wanted["annotations"] and created["spec"] == wanted["spec"]
        for kind, obj in later:  # after the create, only the status is written
            assert kind == "MODIFIED" and obj["spec"] == created["spec"]
            unchanged = {"resourceVersion": "", "managedFields": []}  # these two change with any write
            assert {**obj["metadata"], **unchanged} == {**meta, **unchanged}
        now = await kube.get(r.PODS, "own", namespace="default")
        assert now["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]


async def test_a_worker_without_the_finalizer_gets_it_in_one_write(apiserver: Any, tmp_path: Path) -> None:
    async with a_bare_worker(apiserver, tmp_path, "late", finalizer=False) as (kube, workload, pod):
        marked = await first_change(kube, r.PODS, "late", pod["metadata"]["resourceVersion"], lambda _: True)
        assert marked["metadata"]["finalizers"] == [tfa.FINALIZER]
        assert marked["metadata"]["annotations"] == pod["metadata"]["annotations"]
        await adopted(kube, workload, pod["metadata"]["uid"])
