"""Waiting for a pod to be gone, as the scheduler's index tests do."""

from __future__ import annotations

from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, NotFound


async def gone(kube: KubeClient, name: str) -> bool:
    try:
        await kube.get(r.PODS, name, namespace="default")
    except NotFound:
        return True
    return False
