"""The writes a new bare worker costs the pod reconciler: its finalizer and the removal of its
pending-owned-workload annotation arrive on the pod in one write, and the workload's new owner and
the removal of its awaiting-pod mark in one write (issue 33: fewer API writes per pod). Seen on a
watch from the objects' creation: the first change that carries either part carries both."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.apiserver_fixture import apply_crds
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


def bare_worker(name: str) -> dict[str, Any]:
    """A bound worker as the webhook and the scheduler leave a bare pod: its workload still to adopt."""
    notes = {tfa.GPU_POOL: POOL, tfa.TFLOPS_REQUEST: "10", tfa.VRAM_REQUEST: "1Gi", tfa.TFLOPS_LIMIT: "10",
             tfa.VRAM_LIMIT: "1Gi", tfa.GPU_COUNT: "1", tfa.GPU_IDS: "gpu-1a", tfa.PENDING_OWNED_WORKLOAD: name}
    return {"metadata": {"name": name, "namespace": "default", "annotations": notes,
                         "labels": {tfa.COMPONENT: "worker", tfa.WORKLOAD: name}},
            "spec": {"nodeName": "gpu-1", "schedulerName": "tensor-fusion-scheduler",
                     "containers": [{"name": "w", "image": "worker"}]}}


async def test_a_bare_worker_is_marked_and_adopted_in_one_write_each(apiserver: Any, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube, controllers() as tg:
        await cluster(kube)
        await start_controller(tg, settings_for(apiserver, tmp_path))
        workload = await kube.create(r.TENSORFUSIONWORKLOADS, {  # as the webhook creates it
            "metadata": {"name": "solo", "namespace": "default", "annotations": {AWAITING_POD: rfc3339()},
                         "finalizers": [tfa.FINALIZER]}, "spec": {"poolName": POOL}})
        pod = await kube.create(r.PODS, bare_worker("solo"))
        uid = pod["metadata"]["uid"]

        def pod_marked(obj: dict[str, Any]) -> bool:
            meta = obj["metadata"]
            return tfa.FINALIZER in (meta.get("finalizers") or []) or \
                tfa.PENDING_OWNED_WORKLOAD not in (meta.get("annotations") or {})

        marked = await first_change(kube, r.PODS, "solo", pod["metadata"]["resourceVersion"], pod_marked)
        assert tfa.FINALIZER in marked["metadata"]["finalizers"]
        assert tfa.PENDING_OWNED_WORKLOAD not in marked["metadata"]["annotations"]

        def owned(obj: dict[str, Any]) -> bool:
            return any(o.get("uid") == uid for o in obj["metadata"].get("ownerReferences") or [])

        adopted = await first_change(kube, r.TENSORFUSIONWORKLOADS, "solo", workload["metadata"]["resourceVersion"],
                                     owned)
        assert [(o["kind"], o["controller"]) for o in adopted["metadata"]["ownerReferences"]] == [("Pod", True)]
        assert AWAITING_POD not in (adopted["metadata"].get("annotations") or {})
        assert adopted["metadata"]["finalizers"] == [tfa.FINALIZER]
