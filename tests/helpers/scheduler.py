"""Nodes and GPU pods for scheduler tests, and reads of what the scheduler did
(binding, PodScheduled condition, events)."""

from __future__ import annotations

from typing import Any

from tests.helpers.controller import POOL, create_gpu, create_pool
from tfusion.api import annotations as tfa
from tfusion.controller.scheduling.scheduler import Scheduler
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient

SCHEDULER = "tensor-fusion-scheduler"


async def create_node(kube: KubeClient, name: str, *, taints: list[dict[str, str]] | None = None,
                      cpu: str = "8", allocatable: dict[str, str] | None = None) -> None:
    """A Ready node; `allocatable` adds resources (e.g. the device plugin's index resources)."""
    spec: dict[str, Any] = {"taints": taints} if taints else {}
    await kube.create(r.NODES, {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                                "spec": spec})
    resources = {"cpu": cpu, "memory": "32Gi", "pods": "110", **(allocatable or {})}
    await kube.patch(r.NODES, name, {"status": {"allocatable": resources,
                                                "conditions": [{"type": "Ready", "status": "True"}]}},
                     subresource="status")


async def one_gpu_node(kube: KubeClient, *, vram: str = "40Gi") -> None:
    """The pool, node-a and its one GPU gpu-a1 that most tests here start from."""
    await create_pool(kube)
    await create_node(kube, "node-a")
    await create_gpu(kube, "gpu-a1", "node-a", vram=vram)


def gpu_pod(name: str, *, vram: str = "4Gi", tflops: str = "10", extra: dict[str, str] | None = None,
            scheduler: str = SCHEDULER, cpu: str | None = None) -> dict[str, Any]:
    notes = {tfa.GPU_POOL: POOL, tfa.TFLOPS_REQUEST: tflops, tfa.VRAM_REQUEST: vram, **(extra or {})}
    container: dict[str, Any] = {"name": "main", "image": "app"}
    if cpu:
        container["resources"] = {"requests": {"cpu": cpu}}
    return {"metadata": {"name": name, "namespace": "default", "labels": {tfa.COMPONENT: "worker"},
                         "annotations": notes},
            "spec": {"schedulerName": scheduler, "containers": [container]}}


async def bound(kube: KubeClient, name: str) -> dict[str, Any] | None:
    pod = await kube.get(r.PODS, name, namespace="default")
    return pod if pod["spec"].get("nodeName") else None


async def scheduled_condition(kube: KubeClient, name: str) -> dict[str, Any] | None:
    pod = await kube.get(r.PODS, name, namespace="default")
    found = [c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == "PodScheduled"]
    return found[0] if found and found[0]["status"] == "False" else None


async def events_for(kube: KubeClient, name: str, reason: str) -> list[dict[str, Any]]:
    items = await kube.list(r.EVENTS, namespace="default")
    return [e for e in items if e["involvedObject"].get("name") == name and e.get("reason") == reason]


def scheduler_of(ctl: Any) -> Scheduler:
    found = ctl.runtime.scheduler
    assert isinstance(found, Scheduler)
    return found
