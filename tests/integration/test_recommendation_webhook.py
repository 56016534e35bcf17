"""The autoscaler's recommendation reaches new pods through the webhook: the test writes
`status.recommendation` of a workload with autoscaling on through the status subresource (as an
autoscaler would), and the next pod of that workload comes back with the recommended requests and
limits, without an API call for the workload or its owner; a workload without autoscaling keeps
the pod's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import eventually
from tests.helpers.controller import Controller, controllers
from tests.helpers.webhook import (
    kube_with_webhook_objects,  # noqa: F401  (the `kube` fixture of these tests)
    pod,
    serve_webhook,
    webhook_settings,
)
from tfusion.api import annotations as tfa
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient

pytestmark = pytest.mark.anyio

ASKED = {tfa.TFLOPS_REQUEST: "20", tfa.TFLOPS_LIMIT: "40", tfa.VRAM_REQUEST: "8Gi", tfa.VRAM_LIMIT: "8Gi"}
RECOMMENDED = {"requests": {"tflops": "12", "vram": "6Gi"}, "limits": {"tflops": "30", "vram": "10Gi"}}


async def recommend(client: KubeClient, ctl: Controller, name: str) -> None:
    """Write the recommendation and wait until the controller's cache has it."""
    await client.patch(r.TENSORFUSIONWORKLOADS, name, {"status": {"workerCount": 0, "recommendation": RECOMMENDED}},
                     namespace="default", subresource="status")
    workloads = ctl.runtime.informer(r.TENSORFUSIONWORKLOADS)

    async def cached() -> bool:
        found = workloads.get(f"default/{name}")
        return bool(found and (found.get("status") or {}).get("recommendation"))

    await eventually(cached, what=f"workload {name}'s recommendation in the cache")


def replicaset(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {"metadata": {"name": name}, "spec": {
        "replicas": 2, "selector": {"matchLabels": labels},
        "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "app", "image": "python"}]}}}}


async def replica_pod(client: KubeClient, name: str, owner: dict[str, Any], notes: dict[str, str]) -> dict[str, Any]:
    """A pod of `owner` (a ReplicaSet): its workload is named after the ReplicaSet."""
    body = pod(name, notes, labels={"app": owner["metadata"]["name"]})
    body["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "controller": True,
                                            "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]}]
    return await client.create(r.PODS, body, namespace="default")


async def test_the_recommendation_overrides_the_pods_requests(apiserver: Any, kube: KubeClient,
                                                              tmp_path: Path) -> None:
    # pods of one ReplicaSet share the workload "trainer", owned by the ReplicaSet (no pod owns
    # it, so none of them takes it along when deleted)
    owner = await kube.create(r.REPLICASETS, replicaset("trainer"), namespace="default")
    notes = {**ASKED, tfa.AUTOSCALE: "true"}
    async with controllers() as tg:
        ctl = await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path))
        webhook = ctl.runtime.webhook
        assert webhook is not None
        first = await replica_pod(kube, "trainer-1", owner, notes)
        assert first["metadata"]["annotations"][tfa.TFLOPS_REQUEST] == "20"
        workload = await kube.get(r.TENSORFUSIONWORKLOADS, "trainer", namespace="default")
        assert workload["spec"]["autoScalingConfig"]["autoSetResources"]["enable"] is True
        await recommend(kube, ctl, "trainer")
        writes, lookups = webhook.workloads.writes, webhook.owners.lookups
        again = await replica_pod(kube, "trainer-2", owner, notes)
        notes_out = again["metadata"]["annotations"]
        assert (notes_out[tfa.TFLOPS_REQUEST], notes_out[tfa.VRAM_REQUEST]) == ("12", "6Gi")
        assert (notes_out[tfa.TFLOPS_LIMIT], notes_out[tfa.VRAM_LIMIT]) == ("30", "10Gi")
        # the cached workload matched and the owner was known: no API call for either
        assert (webhook.workloads.writes, webhook.owners.lookups) == (writes, lookups)
        # the workload keeps what the pods asked for: the autoscaler's base
        workload = await kube.get(r.TENSORFUSIONWORKLOADS, "trainer", namespace="default")
        assert workload["spec"]["resources"]["requests"] == {"tflops": "20", "vram": "8Gi"}


async def test_without_autoscaling_the_recommendation_is_not_used(apiserver: Any, kube: KubeClient,
                                                                  tmp_path: Path) -> None:
    owner = await kube.create(r.REPLICASETS, replicaset("plain"), namespace="default")
    async with controllers() as tg:
        ctl = await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path))
        await replica_pod(kube, "plain-1", owner, ASKED)
        await recommend(kube, ctl, "plain")
        again = await replica_pod(kube, "plain-2", owner, ASKED)
        notes = again["metadata"]["annotations"]
        assert (notes[tfa.TFLOPS_REQUEST], notes[tfa.VRAM_LIMIT]) == ("20", "8Gi")
