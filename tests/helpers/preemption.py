"""Pods of a priority and the shipped PriorityClasses, for the preemption tests (integration and e2e)."""

from __future__ import annotations

from typing import Any

from tests.helpers.scheduler import gpu_pod
from tfusion.api import annotations as tfa
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient

PRIORITYCLASSES = r.ApiResource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False)
#: the values deploy/base/priorityclasses.yaml ships
CLASS_VALUES = {"critical": 100_000, "high": 10_000}


async def priority_classes(kube: KubeClient) -> None:
    """tensor-fusion-critical and -high, as deploy/ ships them (the test API server seeds only kube's)."""
    for qos, value in CLASS_VALUES.items():
        await kube.create(PRIORITYCLASSES, {"metadata": {"name": tfa.priority_class_name(qos)}, "value": value,
                                            "preemptionPolicy": "PreemptLowerPriority"})


def qos_pod(name: str, qos: str, *, vram: str, namespace: str = "default", extra: dict[str, str] | None = None,
            labels: dict[str, str] | None = None, policy: str | None = None) -> dict[str, Any]:
    """A worker pod of QoS `qos`; high and critical name their PriorityClass, as the webhook sets it."""
    pod = gpu_pod(name, vram=vram, tflops="1", extra={tfa.QOS: qos, **(extra or {})})
    pod["metadata"]["namespace"] = namespace
    pod["metadata"]["labels"].update(labels or {})
    if qos in CLASS_VALUES:
        pod["spec"]["priorityClassName"] = tfa.priority_class_name(qos)
    if policy is not None:
        pod["spec"]["preemptionPolicy"] = policy
    return pod


async def node_of(kube: KubeClient, name: str, namespace: str = "default") -> str | None:
    pod = await kube.get(r.PODS, name, namespace=namespace)
    return pod["spec"].get("nodeName") or None


async def pod_names(kube: KubeClient, namespace: str = "default") -> set[str]:
    return {p["metadata"]["name"] for p in await kube.list(r.PODS, namespace=namespace)}


async def events_with(kube: KubeClient, reason: str, namespace: str = "default") -> list[dict[str, Any]]:
    return [e for e in await kube.list(r.EVENTS, namespace=namespace) if e.get("reason") == reason]
